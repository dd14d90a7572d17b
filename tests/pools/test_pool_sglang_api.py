"""The SGLang 0.5.23 entry points beyond the basics: payloads in another dtype with scales,
``layer_id_override``, prefix-valid writes, ``set/get_mla_kv_buffer``, transfer
descriptors, paged index-K reads, ``end_layer`` and host-copy token counts."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _pools_support import (
    FACTORIES,
    assert_unchanged,
    fill,
    layer,
    locs,
    make_dsa,
    make_mha,
    make_mla,
    make_noop,
    payload,
    random_bytes,
    same_bytes,
    snapshot,
    token_index_bytes,
)

from kvcheck.pools._dtypes import FP8_DTYPES, SUPPORTED_DTYPES

POOL_DTYPES = list(SUPPORTED_DTYPES)
IDS = [str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES]

# Values every supported dtype holds exactly, before and after dividing by 2 or 0.5.
EXACT = [1.0, -2.0, 0.5, 4.0, -0.25, 8.0, 2.0, -1.0]


def exact(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = math.prod(shape)
    values = torch.tensor((EXACT * (n // len(EXACT) + 1))[:n]).view(shape)
    return values.to(dtype)


def expected_rows(value: torch.Tensor, dtype: torch.dtype, scale: float | None) -> torch.Tensor:
    """The documented conversion, written out independently of the pool's helper."""
    if scale is not None:
        value = (value.to(torch.float32) / torch.tensor(scale, dtype=torch.float32)).to(value.dtype)
    return value.to(dtype)


def stored(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return buffer.view(dtype) if buffer.dtype != dtype else buffer


def foreign_pairs() -> list[tuple[torch.dtype, torch.dtype]]:
    return [(p, q) for p in SUPPORTED_DTYPES for q in SUPPORTED_DTYPES if p != q]


PAIR_IDS = [f"{p}<-{q}".replace("torch.", "") for p, q in foreign_pairs()]


# --- set_kv_buffer: payloads of another dtype ---------------------------------------------


@pytest.mark.parametrize(("pool_dtype", "payload_dtype"), foreign_pairs(), ids=PAIR_IDS)
@pytest.mark.parametrize("scales", [(None, None), (2.0, 0.5)], ids=["no-scale", "scaled"])
def test_mha_converts_another_dtype_after_dividing_by_the_scales(pool_dtype, payload_dtype, scales):
    """A payload of another floating dtype is divided by its scale and converted with
    .to(dtype); the stored values are the exact quotients and the caller's tensors keep
    their bytes."""
    pool = make_mha(dtype=pool_dtype)
    k, v = exact((2, 2, 4), payload_dtype), exact((2, 2, 4), torch.float32).neg().to(payload_dtype)
    k_before, v_before = k.clone(), v.clone()
    pool.set_kv_buffer(layer(1), locs(3, 7), k, v, k_scale=scales[0], v_scale=scales[1])
    assert same_bytes(k, k_before) and same_bytes(v, v_before)
    for buffer, value, scale in (
        (pool.k_buffer[1], k, scales[0]),
        (pool.v_buffer[1], v, scales[1]),
    ):
        got = stored(buffer, pool_dtype)[torch.tensor([3, 7])]
        assert same_bytes(got, expected_rows(value, pool_dtype, scale))
        quotient = value.float() / (1.0 if scale is None else scale)
        assert torch.equal(got.float(), quotient)


@pytest.mark.parametrize(("pool_dtype", "payload_dtype"), foreign_pairs(), ids=PAIR_IDS)
def test_latent_writes_convert_another_dtype(pool_dtype, payload_dtype):
    """MLA/DSA set_kv_buffer and set_mla_kv_buffer convert with .to(dtype) (no scales)."""
    for make in (make_mla, make_dsa):
        pool = make(dtype=pool_dtype)
        row = exact((2, 1, 6), payload_dtype)
        before = row.clone()
        pool.set_kv_buffer(layer(0), locs(2, 9), row, None)
        pool.set_mla_kv_buffer(layer(1), locs(4, 1), row[..., :4], row[..., 4:])
        assert same_bytes(row, before)
        want = row.to(pool_dtype)
        assert same_bytes(stored(pool.kv_buffer[0], pool_dtype)[torch.tensor([2, 9])], want)
        assert same_bytes(stored(pool.kv_buffer[1], pool_dtype)[torch.tensor([4, 1])], want)


def test_scaled_write_of_random_values_matches_the_documented_formula():
    """With values that round, the stored bytes are (x.float() / scale) rounded to x's
    dtype, then .to(pool dtype): SGLang's in-place div_ followed by .to."""
    pool = make_mha(dtype=torch.float8_e4m3fn)
    k = payload((5, 2, 4), torch.bfloat16, seed=1)
    v = payload((5, 2, 4), torch.bfloat16, seed=2)
    pool.set_kv_buffer(layer(0), torch.arange(5), k, v, k_scale=0.37, v_scale=torch.tensor([3.1]))
    assert same_bytes(
        pool.k_buffer[0][:5], expected_rows(k, torch.float8_e4m3fn, 0.37).view(torch.uint8)
    )
    v_want = expected_rows(v, torch.float8_e4m3fn, float(torch.tensor(3.1)))
    assert same_bytes(pool.v_buffer[0][:5], v_want.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_pools_still_store_raw_bytes_and_ignore_scales(dtype):
    """uint8 payloads into an fp8 pool are bytes, stored as given; scales do not apply."""
    pool = make_mha(dtype=dtype)
    k = random_bytes((1, 2, 4), seed=3)
    pool.set_kv_buffer(layer(0), locs(2), k, k, k_scale=4.0, v_scale=4.0)
    assert torch.equal(pool.k_buffer[0][2], k[0]) and torch.equal(pool.v_buffer[0][2], k[0])


BAD_SCALES = {
    "zero": (0, "k_scale=0 must be a finite number > 0"),
    "negative": (-1.5, "k_scale=-1.5 must be a finite number > 0"),
    "nan": (float("nan"), "k_scale=nan must be a finite number > 0"),
    "inf": (float("inf"), "k_scale=inf must be a finite number > 0"),
    "bool": (True, "k_scale=True must be a number"),
    "string": ("2", "k_scale='2' must be a number"),
    "two-elements": (torch.tensor([1.0, 2.0]), "k_scale must be a number or a one-element"),
    "int-tensor": (torch.tensor([2]), "k_scale must be a number or a one-element"),
    "zero-tensor": (torch.tensor(0.0), "must be a finite number > 0"),
    "meta-tensor": (torch.tensor([2.0], device="meta"), "k_scale must be on the pool's device"),
}


@pytest.mark.parametrize("native", [True, False], ids=["native-payload", "bf16-payload"])
@pytest.mark.parametrize("case", list(BAD_SCALES))
def test_bad_scales_are_refused_even_when_unused(case, native):
    """Scales are validated on every call (also when the payload needs none); the pool and
    the payload are unchanged."""
    value, fragment = BAD_SCALES[case]
    pool = make_mha()
    fill(pool, seed=4)
    before = snapshot(pool)
    k = exact((1, 2, 4), torch.float32 if native else torch.bfloat16)
    k_before = k.clone()
    with pytest.raises(ValueError, match=re.escape(fragment)):
        pool.set_kv_buffer(layer(0), locs(1), k, k, k_scale=value)
    assert_unchanged(pool, before)
    assert same_bytes(k, k_before)


def test_conversion_happens_only_after_every_check():
    """A bad v_scale after a convertible K leaves K unwritten."""
    pool = make_mha()
    before = snapshot(pool)
    k = exact((1, 2, 4), torch.float16)
    with pytest.raises(ValueError, match="v_scale"):
        pool.set_kv_buffer(layer(0), locs(1), k, k, k_scale=2.0, v_scale=-1.0)
    assert_unchanged(pool, before)


# --- layer_id_override --------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FACTORIES))
def test_layer_id_override_replaces_the_layers_id(family):
    """layer_id_override (a global id) picks the layer; layer may then be None."""
    pool = FACTORIES[family](start_layer=5)
    if family == "mha":
        k = exact((1, 2, 4), torch.float32)
        pool.set_kv_buffer(layer(5), locs(3), k, k, layer_id_override=6)
        pool.set_kv_buffer(None, locs(4), k, k, None, None, 6)
        target = pool.k_buffer
    else:
        k = exact((1, 1, 6), torch.float32)
        pool.set_kv_buffer(layer(5), locs(3), k, None, layer_id_override=6)
        pool.set_mla_kv_buffer(None, locs(4), k[..., :4], k[..., 4:], layer_id_override=6)
        target = pool.kv_buffer
    assert torch.equal(target[1][3], k[0]) and torch.equal(target[1][4], k[0])
    assert not target[0].any()


BAD_OVERRIDES = {
    "out-of-range": (7, "layer_id_override=7 not in [5, 7)"),
    "below": (4, "layer_id_override=4 not in [5, 7)"),
    "string": ("6", "layer_id_override='6' must be an integer layer id"),
    "bool": (True, "layer_id_override=True must be an integer layer id"),
}


@pytest.mark.parametrize("family", list(FACTORIES))
@pytest.mark.parametrize("case", list(BAD_OVERRIDES))
def test_bad_layer_id_override_is_refused(family, case):
    """An override is validated like layer.layer_id, by name; the pool is unchanged."""
    value, fragment = BAD_OVERRIDES[case]
    extra = {"layer_num": 2, "skip_topk_layers": [False, True]} if family == "dsa" else {}
    pool = FACTORIES[family](start_layer=5, **extra)
    fill(pool, seed=5)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        if family == "mha":
            k = exact((1, 2, 4), torch.float32)
            pool.set_kv_buffer(layer(5), locs(1), k, k, layer_id_override=value)
        else:
            k = exact((1, 1, 6), torch.float32)
            pool.set_kv_buffer(layer(5), locs(1), k, None, layer_id_override=value)
    assert_unchanged(pool, before)


def test_mha_override_still_needs_a_layer_sglang_can_read():
    """SGLang's MHA write reads layer.layer_id unless layer is None: other objects are
    refused; the latent pools never read layer under an override."""
    k = exact((1, 2, 4), torch.float32)
    with pytest.raises(ValueError, match=re.escape("layer must be None or have a .layer_id")):
        make_mha().set_kv_buffer(object(), locs(1), k, k, layer_id_override=0)
    make_mla().set_kv_buffer(object(), locs(1), exact((1, 1, 6), torch.float32), None, 0)


# --- set_kv_buffer_prefix_valid -----------------------------------------------------------


def test_prefix_valid_writes_only_committed_cells():
    """Row b writes its first commit_lens[b] cells (row-major payload rows); uncommitted
    cells hold any values, out-of-range and repeated ones included, and are not written."""
    pool = make_mha()
    fill(pool, seed=6)
    before = snapshot(pool)
    grid = torch.tensor([[3, 4, -7], [9, 99, 3], [0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([2, 1, 0])
    k = payload((9, 2, 4), torch.float32, seed=7)
    v = payload((9, 2, 4), torch.float32, seed=8)
    pool.set_kv_buffer_prefix_valid(layer(1), grid, lens, k, v)
    written = {3: 0, 4: 1, 9: 3}
    for slot in range(pool.num_slots):
        if slot in written:
            assert torch.equal(pool.k_buffer[1][slot], k[written[slot]])
            assert torch.equal(pool.v_buffer[1][slot], v[written[slot]])
        else:
            assert torch.equal(pool.k_buffer[1][slot], before[1][slot])
            assert torch.equal(pool.v_buffer[1][slot], before[3][slot])
    assert torch.equal(pool.k_buffer[0], before[0])


def test_prefix_valid_converts_and_scales_like_set_kv_buffer():
    """Payloads of another dtype follow set_kv_buffer's rule; caller tensors keep their
    bytes; layer_id_override is honoured."""
    pool = make_mha(dtype=torch.float8_e5m2, start_layer=2)
    k, v = exact((4, 2, 4), torch.bfloat16), exact((4, 2, 4), torch.bfloat16)
    k_before, v_before = k.clone(), v.clone()
    pool.set_kv_buffer_prefix_valid(
        None,
        torch.tensor([[5, 6], [1, 2]]),
        torch.tensor([1, 2]),
        k,
        v,
        k_scale=2.0,
        v_scale=0.5,
        layer_id_override=3,
    )
    assert same_bytes(k, k_before) and same_bytes(v, v_before)
    cells = torch.tensor([0, 2, 3])
    got_k = pool.k_buffer[1][torch.tensor([5, 1, 2])].view(torch.float8_e5m2)
    assert same_bytes(got_k, expected_rows(k[cells], torch.float8_e5m2, 2.0))
    got_v = pool.v_buffer[1][torch.tensor([5, 1, 2])].view(torch.float8_e5m2)
    assert same_bytes(got_v, expected_rows(v[cells], torch.float8_e5m2, 0.5))
    assert not pool.k_buffer[1][6].any()


def prefix_call(
    grid: Any = None, lens: Any = None, rows: int = 4, v_rows: int | None = None, **kw: Any
) -> Any:
    grid = torch.tensor([[1, 2], [3, 4]]) if grid is None else grid
    lens = torch.tensor([2, 1]) if lens is None else lens
    k = exact((rows, 2, 4), torch.float32)
    v = exact((rows if v_rows is None else v_rows, 2, 4), torch.float32)
    return lambda p: p.set_kv_buffer_prefix_valid(layer(0), grid, lens, k, v, **kw)


BAD_PREFIX = {
    "commit-too-long": (prefix_call(lens=torch.tensor([3, 1])), "commit_lens[0]=3 not in [0, 2]"),
    "commit-negative": (prefix_call(lens=torch.tensor([2, -1])), "commit_lens[1]=-1 not in [0, 2]"),
    "commit-length": (prefix_call(lens=torch.tensor([2])), "len(commit_lens)=1 but loc_2d has"),
    "commit-float": (prefix_call(lens=torch.tensor([2.0, 1.0])), "commit_lens must have dtype"),
    "commit-2d": (prefix_call(lens=torch.tensor([[2, 1]])), "commit_lens must be 1-D"),
    "grid-1d": (prefix_call(grid=torch.tensor([1, 2, 3, 4])), "loc_2d must be 2-D"),
    "grid-float": (prefix_call(grid=torch.ones(2, 2)), "loc_2d must have dtype int32 or int64"),
    "grid-list": (prefix_call(grid=[[1, 2], [3, 4]]), "loc_2d must be a torch.Tensor"),
    "committed-out-of-range": (
        prefix_call(grid=torch.tensor([[1, 12], [3, 4]])),
        "committed loc_2d[0, 1]=12 not in [0, 12)",
    ),
    "committed-negative": (
        prefix_call(grid=torch.tensor([[1, 2], [-1, 4]])),
        "committed loc_2d[1, 0]=-1 not in [0, 12)",
    ),
    "committed-duplicate": (
        prefix_call(grid=torch.tensor([[1, 2], [2, 4]])),
        "committed cells loc_2d[0, 1] and loc_2d[1, 0] both hold slot 2",
    ),
    "rows-too-few": (prefix_call(rows=3), "cache_k must have shape (4, 2, 4)"),
    "v-rows-too-many": (prefix_call(v_rows=5), "cache_v must have shape (4, 2, 4)"),
    "bad-scale": (prefix_call(v_scale=0.0), "v_scale=0.0 must be a finite number > 0"),
    "bad-override": (prefix_call(layer_id_override=2), "layer_id_override=2 not in [0, 2)"),
}


@pytest.mark.parametrize("case", list(BAD_PREFIX))
def test_bad_prefix_valid_calls_are_refused(case):
    """Each bad argument raises ValueError naming it; the pool is unchanged."""
    op, fragment = BAD_PREFIX[case]
    pool = make_mha()
    fill(pool, seed=9)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        op(pool)
    assert_unchanged(pool, before)


def test_prefix_valid_on_meta_checks_shapes_only():
    """On meta the grid's values are unread; shapes and dtypes are still checked."""
    pool = make_mha(device="meta")
    grid = torch.empty(2, 3, dtype=torch.int64, device="meta")
    lens = torch.empty(2, dtype=torch.int64, device="meta")
    k = torch.empty(6, 2, 4, device="meta")
    pool.set_kv_buffer_prefix_valid(layer(0), grid, lens, k, k)
    with pytest.raises(ValueError, match=re.escape("cache_k must have shape (6, 2, 4)")):
        pool.set_kv_buffer_prefix_valid(layer(0), grid, lens, k[:5], k)


# --- get_contiguous_buf_infos -------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_mha_buf_infos_are_k_then_v_with_sglangs_spans(device, dtype):
    """ptrs/lens/item_lens list K buffers then V buffers: (size + page_size) rows and one
    page of rows each; pointers are the buffers' (0 on meta)."""
    pool = make_mha(dtype=dtype, device=device, v_head_dim=3, size=10, page_size=4)
    ptrs, lens, item_lens = pool.get_contiguous_buf_infos()
    itemsize = 1 if dtype in FP8_DTYPES else 2
    k_row, v_row = 2 * 4 * itemsize, 2 * 3 * itemsize
    assert lens == [14 * k_row] * 2 + [14 * v_row] * 2
    assert item_lens == [4 * k_row] * 2 + [4 * v_row] * 2
    buffers = pool.k_buffer + pool.v_buffer
    assert ptrs == ([0] * 4 if device == "meta" else [b.data_ptr() for b in buffers])
    assert lens == [b.nbytes for b in buffers]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("make", [make_mla, make_dsa], ids=["mla", "dsa"])
def test_latent_buf_infos_describe_the_latent_buffers(make, device):
    """MLA and DSA describe their latent buffers: whole buffer bytes, one page per item."""
    pool = make(device=device, dtype=torch.float16)
    ptrs, lens, item_lens = pool.get_contiguous_buf_infos()
    row = pool.kv_cache_dim * 2
    assert lens == [pool.num_slots * row] * pool.layer_num
    assert item_lens == [pool.page_size * row] * pool.layer_num
    expected = [0 if device == "meta" else b.data_ptr() for b in pool.kv_buffer]
    assert ptrs == expected


def test_noop_buf_infos_describe_only_the_placeholders():
    """The no-op pool advertises its one-page placeholders, never (size + page_size) rows."""
    pool = make_noop(size=1000, page_size=4)
    ptrs, lens, item_lens = pool.get_contiguous_buf_infos()
    buffers = pool.k_buffer + pool.v_buffer
    assert ptrs == [b.data_ptr() for b in buffers]
    assert lens == [b.nbytes for b in buffers] == item_lens
    assert lens == [4 * 2 * 4 * 4] * 2 + [4 * 2 * 3 * 4] * 2


# --- set_mla_kv_buffer / get_mla_kv_buffer ------------------------------------------------


@pytest.mark.parametrize("make", [make_mla, make_dsa], ids=["mla", "dsa"])
@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=IDS)
def test_mla_parts_round_trip(make, dtype):
    """set_mla_kv_buffer stores nope then rope; get_mla_kv_buffer returns them, fresh."""
    pool = make(dtype=dtype)
    row = payload((3, 1, 6), dtype, seed=10)
    pool.set_mla_kv_buffer(layer(0), locs(8, 1, 5), row[..., :4], row[..., 4:])
    assert same_bytes(stored(pool.kv_buffer[0], dtype)[torch.tensor([8, 1, 5])], row)
    nope, rope = pool.get_mla_kv_buffer(layer(0), locs(5, 5, 1))
    assert nope.dtype == rope.dtype == dtype
    assert same_bytes(nope, row[torch.tensor([2, 2, 1])][..., :4])
    assert same_bytes(rope, row[torch.tensor([2, 2, 1])][..., 4:])
    before = snapshot(pool)
    nope.view(torch.uint8).fill_(0)
    rope.view(torch.uint8).fill_(0)
    assert_unchanged(pool, before)


def test_get_mla_kv_buffer_converts_to_dst_dtype():
    """dst_dtype converts the stored values with .to(dst_dtype)."""
    pool = make_mla(dtype=torch.float8_e4m3fn)
    row = exact((1, 1, 6), torch.float8_e4m3fn)
    pool.set_kv_buffer(layer(1), locs(4), row, None)
    nope, rope = pool.get_mla_kv_buffer(layer(1), locs(4), dst_dtype=torch.bfloat16)
    assert nope.dtype == torch.bfloat16
    assert torch.equal(torch.cat([nope, rope], -1), row.to(torch.bfloat16))


def test_zero_rope_width_takes_none_and_returns_none():
    """With qk_rope_head_dim == 0 the rope part may be None or zero-width; reads return
    None for it."""
    pool = make_mla(qk_rope_head_dim=0)
    nope = exact((2, 1, 4), torch.float32)
    pool.set_mla_kv_buffer(layer(0), locs(1, 2), nope, None)
    pool.set_mla_kv_buffer(layer(1), locs(1, 2), nope, torch.empty(2, 1, 0))
    got, rope = pool.get_mla_kv_buffer(layer(1), locs(2, 1))
    assert rope is None and torch.equal(got, nope.flip(0))
    assert torch.equal(pool.kv_buffer[0][1:3], nope)


def mla_write(nope: Any = None, rope: Any = None, loc: Any = None, **kw: Any) -> Any:
    nope = exact((2, 1, 4), torch.float32) if nope is None else nope
    rope = exact((2, 1, 2), torch.float32) if rope is None else rope
    loc = locs(1, 2) if loc is None else loc
    return lambda p: p.set_mla_kv_buffer(layer(0), loc, nope, rope, **kw)


BAD_MLA = {
    "nope-shape": (mla_write(nope=torch.ones(2, 1, 5)), "cache_k_nope must have shape (2, 1, 4)"),
    "rope-shape": (mla_write(rope=torch.ones(2, 1, 3)), "cache_k_rope must have shape (2, 1, 2)"),
    "rope-scalar": (mla_write(rope=torch.tensor(0)), "cache_k_rope must have shape"),
    "rope-dtype-mismatch": (
        mla_write(rope=exact((2, 1, 2), torch.float16)),
        "cache_k_rope has dtype torch.float16 but cache_k_nope has the pool's dtype",
    ),
    "nope-dtype": (mla_write(nope=torch.ones(2, 1, 4, dtype=torch.int32)), "cache_k_nope must"),
    "loc-duplicate": (mla_write(loc=locs(3, 3)), "loc has value 3 at positions 0 and 1"),
    "loc-range": (mla_write(loc=locs(3, 12)), "loc[1]=12 not in [0, 12)"),
    "override": (mla_write(layer_id_override=-1), "layer_id_override=-1 not in [0, "),
}


@pytest.mark.parametrize("family", ["mla", "dsa"])
@pytest.mark.parametrize("case", list(BAD_MLA))
def test_bad_set_mla_kv_buffer_calls_are_refused(family, case):
    """Each bad argument raises ValueError naming it; the pool is unchanged."""
    op, fragment = BAD_MLA[case]
    pool = FACTORIES[family]()
    fill(pool, seed=11)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        op(pool)
    assert_unchanged(pool, before)


def test_missing_rope_is_refused_when_the_pool_has_a_rope_part():
    """cache_k_rope=None is allowed only with qk_rope_head_dim == 0."""
    pool = make_mla()
    with pytest.raises(ValueError, match=re.escape("qk_rope_head_dim=2")):
        pool.set_mla_kv_buffer(layer(0), locs(1), exact((1, 1, 4), torch.float32), None)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((layer(0), locs(12)), "loc[0]=12 not in [0, 12)"),
        ((layer(2), locs(1)), "layer.layer_id=2 not in [0, 2)"),
        ((layer(0), locs(1), torch.int32), "dst_dtype=torch.int32 must be None or one of"),
        ((layer(0), locs(1), "bfloat16"), "dst_dtype='bfloat16'"),
        ((None, locs(1)), "layer must have a .layer_id"),
    ],
    ids=["loc", "layer", "dst-int", "dst-str", "no-layer"],
)
def test_bad_get_mla_kv_buffer_calls_are_refused(args, fragment):
    """get_mla_kv_buffer validates layer, loc and dst_dtype by name."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_mla().get_mla_kv_buffer(*args)


def test_mla_parts_on_meta():
    """On meta the writes check shapes and reads return meta tensors of the right shapes."""
    pool = make_mla(device="meta")
    loc = torch.tensor([1, 2], device="meta")
    pool.set_mla_kv_buffer(
        layer(0), loc, torch.empty(2, 1, 4, device="meta"), torch.empty(2, 1, 2, device="meta")
    )
    nope, rope = pool.get_mla_kv_buffer(layer(0), loc, torch.bfloat16)
    assert nope.is_meta and nope.shape == (2, 1, 4) and rope.shape == (2, 1, 2)
    assert rope.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="cache_k_nope must have shape"):
        pool.set_mla_kv_buffer(
            layer(0), loc, torch.empty(3, 1, 4, device="meta"), torch.empty(2, 1, 2, device="meta")
        )


# --- get_index_k_scale_buffer -------------------------------------------------------------


def test_index_k_scale_reads_follow_each_page_table():
    """Sequence b's token j is read from page page_indices[b, j // page_size], offset
    j % page_size; rows are concatenated in sequence order; unused columns are not read."""
    pool = make_dsa(page_size=2, size=10)  # 12 slots, (10+2+1)//2 = 6 index pages
    fill(pool, seed=12)
    lens = torch.tensor([3, 0, 4, 1])
    table = torch.tensor([[4, 0, -1], [-5, -5, -5], [2, 5, 99], [1, 1, 1]], dtype=torch.int32)
    k, s = pool.get_index_k_scale_buffer(2, lens, table, 8, 4)
    tokens = [8, 9, 0, 4, 5, 10, 11, 2]  # sequence 1 reads nothing
    assert k.shape == (8, 128) and s.shape == (8, 4)
    for i, token in enumerate(tokens):
        key, scale = token_index_bytes(pool, 2, token)
        assert bytes(k[i].tolist()) == key and bytes(s[i].tolist()) == scale
    before = snapshot(pool)
    k.fill_(0)
    assert_unchanged(pool, before)


def test_index_k_scale_read_with_wide_scales():
    """index_head_dim 256 gives two fp32 scales (8 bytes) per token."""
    pool = make_dsa(index_head_dim=256, skip_topk_layers=None)
    fill(pool, seed=13)
    k, s = pool.get_index_k_scale_buffer(0, locs(5), torch.tensor([[2, 0]]), 5, 5)
    assert k.shape == (5, 256) and s.shape == (5, 8)
    assert (bytes(k[4].tolist()), bytes(s[4].tolist())) == token_index_bytes(pool, 0, 0)


BAD_PAGED = {
    "sum": ((locs(2, 3), torch.zeros(2, 2, dtype=torch.int64), 4, 3), "seq_len_sum=4 but sum"),
    "max": ((locs(2, 3), torch.zeros(2, 2, dtype=torch.int64), 5, 2), "max_seq_len=2 but max"),
    "columns": (
        (locs(5), torch.zeros(1, 1, dtype=torch.int64), 5, 5),
        "seq_len_tensor[0]=5 needs 2 pages of page_size=4 but page_indices has 1 columns",
    ),
    "page-range": ((locs(2), torch.tensor([[3]]), 2, 2), "page_indices[0, 0]=3 not in [0, 3)"),
    "negative-len": ((locs(-1), torch.tensor([[0]]), 0, 0), "seq_len_tensor[0]=-1 must be >= 0"),
    "rows": ((locs(1, 1), torch.tensor([[0]]), 2, 1), "len(seq_len_tensor)=2 but page_indices"),
    "table-1d": ((locs(1), torch.tensor([0]), 1, 1), "page_indices must be 2-D"),
    "len-float": ((torch.tensor([1.0]), torch.tensor([[0]]), 1, 1), "seq_len_tensor must have"),
    "sum-negative": ((locs(1), torch.tensor([[0]]), -1, 1), "seq_len_sum=-1"),
    "max-str": ((locs(1), torch.tensor([[0]]), 1, "1"), "max_seq_len='1'"),
}


@pytest.mark.parametrize("case", list(BAD_PAGED))
def test_bad_paged_index_reads_are_refused(case):
    """Each inconsistent argument raises ValueError naming it."""
    args, fragment = BAD_PAGED[case]
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_dsa().get_index_k_scale_buffer(0, *args)


def test_paged_index_read_of_a_skip_layer_is_refused():
    """A skip layer has no index keys to read."""
    with pytest.raises(ValueError, match="layer_id=1 is a skip-topk layer"):
        make_dsa().get_index_k_scale_buffer(1, locs(1), torch.tensor([[0]]), 1, 1)


def test_paged_index_read_on_meta_returns_meta_shapes():
    """On meta the read returns meta tensors of [seq_len_sum, D] and [seq_len_sum, S]."""
    pool = make_dsa(device="meta")
    lens = torch.empty(2, dtype=torch.int64, device="meta")
    k, s = pool.get_index_k_scale_buffer(0, lens, torch.empty(2, 3, dtype=torch.int64), 7, 4)
    assert k.is_meta and k.shape == (7, 128) and s.shape == (7, 4)


# --- end_layer and host-copy counts -------------------------------------------------------


@pytest.mark.parametrize("family", ["mha", "noop", "mla", "dsa"])
def test_end_layer_takes_the_inclusive_or_the_exclusive_value(family):
    """end_layer may be start + layer_num - 1 or start + layer_num; anything else names
    both accepted values."""
    make = {"mha": make_mha, "noop": make_noop, "mla": make_mla, "dsa": make_dsa}[family]
    layer_num = 3 if family == "dsa" else 2
    assert make(start_layer=4, end_layer=3 + layer_num).end_layer == 3 + layer_num
    assert make(start_layer=4, end_layer=4 + layer_num).end_layer == 4 + layer_num
    with pytest.raises(ValueError) as info:
        make(start_layer=4, end_layer=99)
    message = str(info.value)
    assert "end_layer=99" in message
    assert (
        f"= {3 + layer_num} (inclusive)" in message and f"= {4 + layer_num} (exclusive)" in message
    )


@pytest.mark.parametrize("family", list(FACTORIES))
def test_reload_with_another_token_count_says_so(family):
    """len(indices) != tokens in the copy is refused with a message that says exactly that."""
    pool = FACTORIES[family]()
    fill(pool, seed=14)
    copy = pool.get_cpu_copy(locs(1, 2))
    before = snapshot(pool)
    with pytest.raises(ValueError) as info:
        pool.load_cpu_copy(copy, locs(3, 4, 5))
    assert str(info.value) == "load_cpu_copy: len(indices)=3 but kv_cache_cpu holds 2 tokens"
    assert_unchanged(pool, before)


def test_layer_object_may_carry_more_than_layer_id():
    """A RadixAttention stand-in with extra attributes (k_scale, ...) is fine."""
    pool = make_mha()
    k = exact((1, 2, 4), torch.float16)
    attn = SimpleNamespace(layer_id=1, k_scale=2.0, v_scale=None)
    pool.set_kv_buffer(attn, locs(0), k, k, attn.k_scale, attn.v_scale)
    assert torch.equal(pool.k_buffer[1][0], k[0].float() / 2)
