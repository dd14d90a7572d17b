"""NoOpMHATokenToKVPool: placeholders, zero accounting, writes refused, moves ignored."""

from __future__ import annotations

import re

import pytest
import torch
from _pools_support import layer, locs, make_noop, snapshot

from kvcheck.pools import NoOpMHATokenToKVPool


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_placeholders_are_one_page_per_layer(device, dtype):
    """K/V placeholders are [page_size, head_num, head_dim] and [.., v_head_dim] per layer."""
    pool = make_noop(
        size=1 << 20,
        page_size=16,
        head_num=2,
        head_dim=8,
        v_head_dim=4,
        layer_num=3,
        dtype=dtype,
        device=device,
    )
    store = torch.uint8 if dtype == torch.float8_e4m3fn else dtype
    assert [tuple(k.shape) for k in pool.k_buffer] == [(16, 2, 8)] * 3
    assert [tuple(v.shape) for v in pool.v_buffer] == [(16, 2, 4)] * 3
    assert all(t.dtype == store for t in pool.k_buffer + pool.v_buffer)
    assert pool.size == 1 << 20
    pool.check_valid()


def test_accounting_reports_nothing():
    """get_kv_size_bytes is (0, 0) and mem_usage is 0.0 although placeholders exist."""
    pool = make_noop()
    assert pool.get_kv_size_bytes() == (0, 0)
    assert pool.mem_usage == 0.0
    assert sum(t.nbytes for t in pool.k_buffer) > 0


def test_reads_return_the_placeholders():
    """get_key_buffer/get_value_buffer/get_kv_buffer return the placeholder tensors."""
    pool = make_noop(start_layer=2)
    assert pool.get_key_buffer(3) is pool.k_buffer[1]
    assert pool.get_value_buffer(2) is pool.v_buffer[0]
    k, v = pool.get_kv_buffer(3)
    assert k is pool.k_buffer[1] and v is pool.v_buffer[1]
    assert k.view(-1, pool.page_size, pool.head_num, pool.head_dim).shape[0] == 1


WRITES = {
    "set_kv_buffer-valid": lambda p: p.set_kv_buffer(
        layer(0), locs(1), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)
    ),
    "set_kv_buffer-garbage": lambda p: p.set_kv_buffer(None, None, None, None),
    "load_cpu_copy": lambda p: p.load_cpu_copy(p.get_cpu_copy(locs(1)), locs(1)),
    "load_cpu_copy-garbage": lambda p: p.load_cpu_copy(None, "x"),
    "prefix-valid": lambda p: p.set_kv_buffer_prefix_valid(
        layer(0), torch.tensor([[1]]), locs(1), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)
    ),
    "prefix-valid-garbage": lambda p: p.set_kv_buffer_prefix_valid(),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_raises_runtime_error_naming_pool_and_configuration(write):
    """Writes raise RuntimeError naming the pool and the configuration it requires."""
    pool = make_noop()
    before = snapshot(pool)
    with pytest.raises(RuntimeError) as info:
        WRITES[write](pool)
    message = str(info.value)
    assert "NoOpMHATokenToKVPool" in message
    for flag in (
        "--prefill-only-disable-kv-cache",
        "--is-embedding",
        "--chunked-prefill-size -1",
        "--disable-radix-cache",
        "fa3",
    ):
        assert flag in message
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


def test_move_validates_then_does_nothing():
    """A valid move (within the scheduler's slots, not the placeholder's rows) changes
    nothing."""
    pool = make_noop()
    before = snapshot(pool)
    assert pool.move_kv_cache(locs(1, 11), locs(10, 10)) is None
    assert pool.move_kv_cache(tgt_loc=locs(3), src_loc=locs(4)) is None
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


BAD_MOVES = {
    "garbage": (("x", 3.5), "tgt_loc must be a torch.Tensor, got str"),
    "none": ((None, locs(1)), "tgt_loc must be a torch.Tensor, got NoneType"),
    "out-of-range": ((locs(10**6), locs(1)), "tgt_loc[0]=1000000 not in [0, 12)"),
    "negative-src": ((locs(1), locs(-5)), "src_loc[0]=-5 not in [0, 12)"),
    "float": ((locs(1), torch.tensor([1.0])), "src_loc must have dtype int32 or int64"),
    "duplicate-targets": ((locs(2, 2), locs(1, 3)), "tgt_loc has value 2 at positions 0 and 1"),
    "lengths": ((locs(1, 2), locs(3)), "len(tgt_loc)=2 and len(src_loc)=1"),
}


@pytest.mark.parametrize("case", list(BAD_MOVES))
def test_bad_move_arguments_are_refused(case):
    """move_kv_cache checks its arguments like the MHA pool's move before doing nothing."""
    (tgt, src), fragment = BAD_MOVES[case]
    pool = make_noop()
    with pytest.raises(ValueError, match=re.escape(fragment)):
        pool.move_kv_cache(tgt, src)


def test_move_takes_exactly_sglangs_two_arguments():
    """Extra or missing arguments are a TypeError, as for any Python method."""
    pool = make_noop()
    with pytest.raises(TypeError):
        pool.move_kv_cache(locs(1), locs(2), locs(3))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        pool.move_kv_cache(locs(1))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("indices", "fragment"),
    [(locs(12), "indices[0]=12 not in [0, 12)"), ("x", "indices must be a torch.Tensor")],
    ids=["out-of-range", "garbage"],
)
def test_cpu_copy_validates_indices(indices, fragment):
    """get_cpu_copy checks indices like the MHA pool before returning its empty copy."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_noop().get_cpu_copy(indices)


def test_cpu_copy_is_empty():
    """get_cpu_copy returns an empty copy: no tokens, no layers."""
    copy = make_noop().get_cpu_copy(locs(1, 2))
    assert copy.num_tokens == 0 and dict(copy.parts) == {}
    assert copy.source == NoOpMHATokenToKVPool.__name__
