"""Data operations shared by MHA, MLA and DSA: writes, reads, moves and host copies."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _pools_support import (
    FACTORIES,
    fill,
    layer,
    locs,
    make_dsa,
    make_mha,
    make_mla,
    payload,
    same_bytes,
    token_index_bytes,
    token_rows,
    token_state,
)

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, *FP8]


# --- writes and reads -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mha_set_then_get_round_trips(dtype):
    """set_kv_buffer stores K and V at the given slots; getters read them back in dtype."""
    pool = make_mha(dtype=dtype, v_head_dim=3)
    k = payload((2, 2, 4), dtype, seed=1)
    v = payload((2, 2, 3), dtype, seed=2)
    pool.set_kv_buffer(layer(1), locs(7, 2), k, v)
    key, value = pool.get_kv_buffer(1)
    assert key.dtype == value.dtype == dtype
    assert same_bytes(key[7], k[0]) and same_bytes(key[2], k[1])
    assert same_bytes(value[7], v[0]) and same_bytes(value[2], v[1])
    assert not pool.k_buffer[0].any()


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_is_stored_as_uint8_and_read_back_as_fp8(dtype):
    """fp8 pools hold uint8 bytes and hand out fp8 views of the same memory."""
    pool = make_mha(dtype=dtype)
    k = payload((1, 2, 4), dtype, seed=3)
    pool.set_kv_buffer(layer(0), locs(5), k, k)
    assert pool.k_buffer[0].dtype == torch.uint8
    assert torch.equal(pool.k_buffer[0][5], k[0].view(torch.uint8))
    read = pool.get_key_buffer(0)
    assert read.dtype == dtype and read.data_ptr() == pool.k_buffer[0].data_ptr()
    assert torch.equal(read[5].float(), k[0].float())


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_pools_accept_raw_uint8_payloads(dtype):
    """An fp8 pool also takes payloads as raw uint8 bytes."""
    pool = make_mla(dtype=dtype)
    raw = torch.arange(6, dtype=torch.uint8).view(1, 1, 6)
    pool.set_kv_buffer(layer(0), locs(1), raw, None)
    assert torch.equal(pool.kv_buffer[0][1], raw[0])
    assert pool.get_key_buffer(0).dtype == dtype


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64], ids=str)
def test_int32_and_int64_locations_are_accepted(loc_dtype):
    """Locations may be int32 or int64."""
    pool = make_mla()
    rows = payload((2, 1, 6), torch.float32, seed=4)
    pool.set_kv_buffer(layer(0), locs(0, 11, dtype=loc_dtype), rows, None)
    assert torch.equal(pool.kv_buffer[0][11], rows[1])


def test_write_keeps_no_reference_to_the_callers_tensor():
    """After a write, changing the caller's payload does not change the pool."""
    pool = make_mha()
    k = payload((1, 2, 4), torch.float32, seed=5)
    pool.set_kv_buffer(layer(0), locs(3), k, k.clone())
    stored = pool.k_buffer[0][3].clone()
    k.add_(1.0)
    assert torch.equal(pool.k_buffer[0][3], stored)


def test_payload_that_is_a_view_of_the_pool_is_read_before_writing():
    """Writing rows taken as a view of the same buffer behaves like writing a copy."""
    pool = make_mla()
    fill(pool, seed=6)
    before = pool.kv_buffer[0].clone()
    view = pool.kv_buffer[0][2:5]  # slots 2, 3, 4
    pool.set_kv_buffer(layer(0), locs(3, 4, 5), view, None)
    assert torch.equal(pool.kv_buffer[0][3:6], before[2:5])


def test_mha_scales_are_ignored_for_a_payload_in_the_pools_dtype():
    """k_scale/v_scale apply only to payloads converted from another dtype (as SGLang)."""
    pool = make_mha()
    k = payload((1, 2, 4), torch.float32, seed=7)
    pool.set_kv_buffer(layer(0), locs(1), k, k, k_scale=2.0, v_scale=0.5)
    assert torch.equal(pool.k_buffer[0][1], k[0]) and torch.equal(pool.v_buffer[0][1], k[0])


def test_layer_is_any_object_with_a_layer_id():
    """set_kv_buffer reads only layer.layer_id."""
    pool = make_mla(start_layer=3)
    rows = payload((1, 1, 6), torch.float32, seed=8)
    pool.set_kv_buffer(SimpleNamespace(layer_id=4, name="attn"), locs(0), rows, None)
    assert torch.equal(pool.kv_buffer[1][0], rows[0])


@pytest.mark.parametrize("family", list(FACTORIES))
def test_empty_write_is_a_no_op(family):
    """Writing zero tokens changes nothing."""
    pool = FACTORIES[family]()
    empty = torch.empty(0, dtype=torch.int64)
    if family == "mha":
        pool.set_kv_buffer(layer(0), empty, torch.empty(0, 2, 4), torch.empty(0, 2, 4))
    else:
        pool.set_kv_buffer(layer(0), empty, torch.empty(0, 1, 6), None)
    assert pool.get_kv_size_bytes() == FACTORIES[family]().get_kv_size_bytes()
    assert all(not t.any() for t in getattr(pool, "k_buffer", getattr(pool, "kv_buffer", [])))


# --- moves ----------------------------------------------------------------------------


def expected_after_move(pool, tgt: list[int], src: list[int]) -> dict[int, list[bytes]]:
    """Every token's bytes after a gather-then-scatter move, from the state before it."""
    tokens = range(pool.num_slots)
    before = {t: token_state(pool, t) for t in tokens}
    after = dict(before)
    for t, s in zip(tgt, src, strict=True):
        after[t] = before[s]
    return after


MOVES = {
    "disjoint": ([9, 10], [1, 2]),
    "overlap-chain": ([2, 3, 4], [1, 2, 3]),
    "swap": ([5, 6], [6, 5]),
    "repeated-sources": ([1, 2, 3], [7, 7, 7]),
    "self": ([4], [4]),
}


@pytest.mark.parametrize("family", list(FACTORIES))
@pytest.mark.parametrize("move", list(MOVES))
def test_move_reads_every_source_before_writing(family, move):
    """move_kv_cache gathers all sources first: overlaps, swaps and repeated sources work."""
    pool = FACTORIES[family]()
    fill(pool, seed=11)
    tgt, src = MOVES[move]
    expected = expected_after_move(pool, tgt, src)
    pool.move_kv_cache(locs(*tgt), locs(*src, dtype=torch.int32))
    assert {t: token_state(pool, t) for t in range(pool.num_slots)} == expected


@pytest.mark.parametrize("family", list(FACTORIES))
def test_empty_move_is_a_no_op(family):
    """Moving zero tokens changes nothing."""
    pool = FACTORIES[family]()
    fill(pool, seed=12)
    before = {t: token_state(pool, t) for t in range(pool.num_slots)}
    pool.move_kv_cache(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))
    assert {t: token_state(pool, t) for t in range(pool.num_slots)} == before


@pytest.mark.parametrize("family", list(FACTORIES))
def test_move_does_not_modify_the_location_tensors(family):
    """move_kv_cache only reads tgt_loc and src_loc."""
    pool = FACTORIES[family]()
    tgt, src = locs(2, 3, dtype=torch.int32), locs(3, 2, dtype=torch.int32)
    pool.move_kv_cache(tgt, src)
    assert tgt.tolist() == [2, 3] and src.tolist() == [3, 2] and tgt.dtype == torch.int32


# --- host copies ----------------------------------------------------------------------


@pytest.mark.parametrize("family", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_host_copy_round_trips_to_other_slots(family, dtype):
    """get_cpu_copy then load_cpu_copy writes copied token i to indices[i], byte-exact."""
    pool = FACTORIES[family](dtype=dtype)
    fill(pool, seed=13)
    copied = [5, 1, 5]  # copies may repeat a slot
    rows = [token_rows(pool, t) for t in copied]
    copy = pool.get_cpu_copy(locs(*copied))
    fill(pool, seed=14)  # the copy must not alias the pool
    target = [9, 10, 2]
    untouched = {t: token_rows(pool, t) for t in range(pool.num_slots) if t not in target}
    pool.load_cpu_copy(copy, locs(*target, dtype=torch.int32))
    assert [token_rows(pool, t) for t in target] == rows
    assert {t: token_rows(pool, t) for t in untouched} == untouched


@pytest.mark.parametrize("family", list(FACTORIES))
def test_host_copy_tensors_are_on_the_cpu(family):
    """Every tensor of a host copy lives on the CPU."""
    pool = FACTORIES[family]()
    copy = pool.get_cpu_copy(torch.arange(4))
    tensors = [t for part in copy.parts.values() for t in part]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


def test_dsa_host_copy_round_trips_latent_and_index_k():
    """A DSA host copy carries latent rows and index-K pages to the reload pages."""
    pool = make_dsa(size=12, page_size=4)
    fill(pool, seed=15)
    copied = list(range(4, 12))  # pages 1 and 2
    rows = [token_rows(pool, t) for t in copied]
    index = [[token_index_bytes(pool, i, t) for t in copied] for i in (0, 2)]
    copy = pool.get_cpu_copy(locs(*copied))
    fill(pool, seed=16)
    target = [12, 13, 14, 15, 0, 1, 2, 3]  # pages 3 and 0, in that order
    pool.load_cpu_copy(copy, locs(*target))
    assert [token_rows(pool, t) for t in target] == rows
    assert [[token_index_bytes(pool, i, t) for t in target] for i in (0, 2)] == index
    assert pool.index_k_with_scale_buffer[1].numel() == 0


def test_dsa_host_copy_has_empty_index_entries_for_skip_layers():
    """Skip layers keep a zero-row entry in the copy so layers stay aligned."""
    pool = make_dsa(skip_topk_layers=[False, True, False])
    copy = pool.get_cpu_copy(torch.arange(4, 8))
    assert [tuple(t.shape) for t in copy.parts["index_k"]] == [(4, 132), (0, 132), (4, 132)]
