"""DSA index kpool (SGLang 0.5.23): slot layout, refused moves, host copies by slot with
the later reload token winning, per-request compress tails and their accounting."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from _pools_support import layer, locs, random_bytes, same_bytes

from kvcheck.pools import DSATokenToKVPool
from kvcheck.pools._host_copy import KVHostCopy

D = 128  # index_head_dim
S = 4  # scale bytes per slot (one fp32 per 128 channels)
BF16 = torch.bfloat16


def make(**overrides: Any) -> DSATokenToKVPool:
    """page_size 4, kpool 2: three rows of two index slots; tails for 3 + 1 requests of
    width 3 when ``compress`` is left on."""
    kwargs: dict[str, Any] = dict(
        size=8,
        page_size=4,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=2,
        layer_num=2,
        device="cpu",
        index_head_dim=D,
        index_kpool=2,
        index_kpool_compress=True,
        tail_extra_slots=1,
        max_running_requests=3,
    )
    kwargs.update(overrides)
    return DSATokenToKVPool(**kwargs)


def slot_bytes(pool: DSATokenToKVPool, local: int, slot: int) -> tuple[bytes, bytes]:
    """(key, scale) bytes of index ``slot``, by the documented column formulas: row
    ``slot // P``, offset ``o = slot % P``, key ``[o*D, (o+1)*D)``, scale ``[P*D + o*S, ...)``
    with ``P = page_size // index_kpool``."""
    p = pool.page_size // pool.index_kpool
    row, o = pool.index_k_with_scale_buffer[local][slot // p], slot % p
    return bytes(row[o * D : (o + 1) * D].tolist()), bytes(
        row[p * D + o * S : p * D + (o + 1) * S].tolist()
    )


def write_slots(pool: DSATokenToKVPool, layer_id: int, slots: list[int], *, seed: int) -> None:
    n = len(slots)
    key = random_bytes((n, D), seed=seed)
    scale = random_bytes((n, S), seed=seed + 1)
    pool.set_index_k_scale_buffer(layer_id, locs(*slots), key, scale)


def fill_all(pool: DSATokenToKVPool, *, seed: int = 0) -> None:
    """Distinct latent rows, index slots and tail rows everywhere the pool has them."""
    slots = torch.arange(pool.num_slots)
    gen = torch.Generator().manual_seed(seed)
    for i, layer_id in enumerate(pool.layer_ids):
        rows = torch.randn((pool.num_slots, 1, pool.kv_cache_dim), generator=gen).to(pool.dtype)
        pool.set_kv_buffer(layer(layer_id), slots, rows, None)
        if not pool.skip_topk_layers[i]:
            limit = pool.num_index_pages * pool.index_page_size
            write_slots(pool, layer_id, list(range(limit)), seed=seed + 10 + i)
    for tails in (pool._compress_tail_k or [], pool._compress_tail_score or []):
        for tail in tails:
            tail.copy_(torch.randn(tail.shape, generator=gen).to(BF16))


def everything(pool: DSATokenToKVPool) -> list[torch.Tensor]:
    tails = [*(pool._compress_tail_k or []), *(pool._compress_tail_score or [])]
    return [t.clone() for t in (*pool.kv_buffer, *pool.index_k_with_scale_buffer, *tails)]


def assert_same(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
    assert len(before) == len(after)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        assert same_bytes(a, b), f"buffer {i} changed"


def tail_rows(n: int, *, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n, D), generator=gen).to(BF16)


# --- construction and layout ----------------------------------------------------------------


@pytest.mark.parametrize(("kpool", "row_bytes"), [(1, 528), (2, 264), (4, 132)])
def test_rows_are_token_pages_of_index_page_size_slots(kpool, row_bytes):
    """Rows stay (index_buf_size + page_size + 1) // page_size; each holds
    page_size // index_kpool slots of D + S bytes."""
    pool = make(index_kpool=kpool, index_kpool_compress=False, skip_topk_layers=[False, True])
    assert pool.index_page_size == 4 // kpool and pool.index_layout.page_size == 4 // kpool
    assert [tuple(b.shape) for b in pool.index_k_with_scale_buffer] == [
        (3, row_bytes),
        (0, row_bytes),
    ]
    assert pool.get_state_buf_infos()[1:] == ([3 * row_bytes, 0], [row_bytes, 0])
    assert pool.kpool_use_compress is False
    assert pool._compress_tail_k is None and pool._compress_tail_score is None
    pool.check_valid()


def test_slot_s_sits_in_row_s_over_index_page_size():
    """Slot s: row s // 2, offset s % 2; every other slot keeps its bytes."""
    pool = make()
    for slot in range(6):
        before = [slot_bytes(pool, 0, s) for s in range(6)]
        key, scale = random_bytes((1, D), seed=slot), random_bytes((1, S), seed=100 + slot)
        pool.set_index_k_scale_buffer(0, locs(slot), key, scale)
        after = [slot_bytes(pool, 0, s) for s in range(6)]
        assert after[slot] == (bytes(key[0].tolist()), bytes(scale[0].tolist()))
        assert [s for s in range(6) if before[s] != after[s]] in ([slot], [])


def test_index_slots_are_bounded_by_tokens_and_by_rows():
    """Slots lie in [0, min(ceil(num_slots / kpool), rows * index_page_size))."""
    # num_slots 10 -> 5 slots; index_buf_size 12 -> 4 rows, 8 slots: bound 5.
    pool = make(size=6, index_buf_size=12)
    write_slots(pool, 0, [4], seed=0)
    with pytest.raises(ValueError, match=re.escape("loc[0]=5 not in [0, 5)")):
        write_slots(pool, 0, [5], seed=0)
    # num_slots 12 -> 6 slots; index_buf_size 4 -> 2 rows, 4 slots: bound 4.
    pool = make(index_buf_size=4)
    write_slots(pool, 0, [3], seed=0)
    with pytest.raises(ValueError, match=re.escape("loc[0]=4 not in [0, 4)")):
        write_slots(pool, 0, [4], seed=0)


def test_paged_read_counts_slots_in_rows_of_index_page_size():
    """get_index_k_scale_buffer: seq lens count slots, page ids are rows of 2 slots."""
    pool = make()
    keys = torch.arange(6, dtype=torch.uint8)[:, None].expand(6, D)
    pool.set_index_k_scale_buffer(0, torch.arange(6), keys, torch.ones(6, 1))
    k, s = pool.get_index_k_scale_buffer(0, locs(3, 1), torch.tensor([[2, 0], [1, 2]]), 4, 3)
    assert k[:, 0].tolist() == [4, 5, 0, 2]
    assert s.shape == (4, S)
    with pytest.raises(ValueError, match="page_indices"):
        pool.get_index_k_scale_buffer(0, locs(3), torch.tensor([[2]]), 3, 3)


BAD_KPOOL = [
    ({"index_kpool": 0}, "index_kpool=0"),
    ({"index_kpool": True}, "index_kpool=True"),
    ({"index_kpool": 3}, "page_size=4 must be a multiple of index_kpool=3"),
    ({"tail_extra_slots": -1}, "tail_extra_slots=-1"),
    ({"tail_extra_slots": 1.5}, "tail_extra_slots=1.5"),
    ({"index_kpool_compress": 1}, "index_kpool_compress=1"),
    ({"max_running_requests": None}, "max_running_requests=None"),
    ({"max_running_requests": -1}, "max_running_requests=-1"),
]


@pytest.mark.parametrize(("kwargs", "fragment"), BAD_KPOOL, ids=[f for _, f in BAD_KPOOL])
def test_bad_kpool_arguments_are_refused_by_name(kwargs, fragment):
    """Each bad kpool argument is refused with a message naming it and its value."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make(**kwargs)


def test_compress_without_a_kpool_is_accepted_and_ignored():
    """As SGLang: index_kpool_compress with index_kpool 1 allocates no tails and needs no
    max_running_requests; max_running_requests 0 still gives one request slot."""
    pool = make(index_kpool=1, max_running_requests=None)
    assert pool.kpool_use_compress is False and pool._compress_tail_k is None
    assert pool.get_compress_tail_buf_infos() == ([], [], [])
    pool = make(max_running_requests=0)
    assert tuple(pool._compress_tail_k[0].shape) == (1, 3, D)


# --- moves -----------------------------------------------------------------------------------


def test_non_empty_move_is_refused_before_anything_changes():
    """A kpool move raises after the location checks and before any byte moves; an
    empty one is a no-op."""
    pool = make()
    fill_all(pool)
    before = everything(pool)
    with pytest.raises(
        ValueError, match="index_kpool=2: moving pooled index keys needs regrouping"
    ):
        pool.move_kv_cache(locs(1), locs(5))
    assert_same(before, everything(pool))
    with pytest.raises(ValueError, match=re.escape("tgt_loc[0]=12 not in [0, 12)")):
        pool.move_kv_cache(locs(12), locs(5))
    pool.move_kv_cache(locs(), locs())
    assert_same(before, everything(pool))


def test_meta_pool_refuses_the_move_too():
    """The refusal needs no data: a meta pool refuses as well."""
    pool = make(device="meta")
    with pytest.raises(ValueError, match="index_kpool=2"):
        pool.move_kv_cache(locs(1), locs(5))


# --- host copies -----------------------------------------------------------------------------


def test_host_copy_carries_each_tokens_slot_and_reload_writes_it_back():
    """Token t's copy holds slot t // 2's bytes; reloading to other tokens writes those
    tokens' slots and nothing else."""
    pool = make()
    fill_all(pool)
    copy = pool.get_cpu_copy(locs(5, 2, 3))
    expected = [slot_bytes(pool, 0, s) for s in (2, 1, 1)]
    rows = copy.parts["index_k"][0]
    assert [(bytes(r[:D].tolist()), bytes(r[D:].tolist())) for r in rows] == expected
    untouched = {s: slot_bytes(pool, 0, s) for s in (0, 2, 3, 4)}
    pool.load_cpu_copy(copy, locs(8, 10, 3))  # slots 4, 5, 1
    assert slot_bytes(pool, 0, 4) == expected[0] and slot_bytes(pool, 0, 5) == expected[1]
    assert slot_bytes(pool, 0, 1) == expected[2]
    assert {s: slot_bytes(pool, 0, s) for s in (0, 2, 3)} == {s: untouched[s] for s in (0, 2, 3)}


@pytest.mark.parametrize("order", [(4, 5), (5, 4)])
def test_reload_of_two_tokens_sharing_a_slot_keeps_the_later(order):
    """Tokens 4 and 5 share slot 2: the copy row reloaded last (by position) stays."""
    pool = make(index_kpool_compress=False)
    write_slots(pool, 0, [0, 1], seed=3)
    copy = pool.get_cpu_copy(locs(0, 2))  # rows of slots 0 and 1
    pool.load_cpu_copy(copy, locs(*order))
    assert slot_bytes(pool, 0, 2) == slot_bytes(pool, 0, 1)
    assert slot_bytes(pool, 0, 2) != slot_bytes(pool, 0, 0)


def test_host_copy_of_tails_is_a_copy_and_reloads_to_another_request():
    """Tails copied with a request are copies (a later write does not show) and reload
    to the named request; skip layers hold None."""
    pool = make(skip_topk_layers=[False, True])
    fill_all(pool)
    keys, scores = pool.get_compress_tail_buffers(0)
    saved_k, saved_s = keys[1].clone(), scores[1].clone()
    copy = pool.get_cpu_copy(locs(0), req_pool_index=1)
    assert copy.tails["tail_k"][1] is None and copy.tails["tail_score"][1] is None
    pool.set_compress_tail_for_request(0, 1, tail_rows(3, seed=7), tail_rows(3, seed=8), 3, 0)
    assert same_bytes(copy.tails["tail_k"][0], saved_k)
    assert same_bytes(copy.tails["tail_score"][0], saved_s)
    pool.load_cpu_copy(copy, locs(0), req_pool_index=3)
    assert same_bytes(keys[3], saved_k) and same_bytes(scores[3], saved_s)
    assert not same_bytes(keys[1], saved_k)


def test_request_index_is_checked_on_tail_pools_and_ignored_elsewhere():
    """req_pool_index must be a request slot on a tail pool (before any write); a pool
    without tails ignores it."""
    pool = make()
    for bad in (4, -1, torch.tensor([1, 2]), torch.tensor(1.0), True):
        with pytest.raises(ValueError, match="req_pool_index"):
            pool.get_cpu_copy(locs(0), req_pool_index=bad)
    copy = pool.get_cpu_copy(locs(0), req_pool_index=torch.tensor([2]))
    before = everything(pool)
    with pytest.raises(ValueError, match=re.escape("req_pool_index=4 not in [0, 4)")):
        pool.load_cpu_copy(copy, locs(0), req_pool_index=4)
    assert_same(before, everything(pool))
    plain = make(index_kpool_compress=False)
    copy = plain.get_cpu_copy(locs(0), req_pool_index=99)
    assert not copy.tails
    plain.load_cpu_copy(copy, locs(1), req_pool_index=99)


def test_copy_without_tails_leaves_the_requests_tails_alone():
    """Reloading a copy taken without a request leaves every tail as it was."""
    pool = make()
    fill_all(pool)
    copy = pool.get_cpu_copy(locs(0, 1))
    tails = [t.clone() for t in (*pool._compress_tail_k, *pool._compress_tail_score)]
    pool.load_cpu_copy(copy, locs(6, 7), req_pool_index=2)
    assert_same(tails, [*pool._compress_tail_k, *pool._compress_tail_score])


def test_a_copy_with_tails_of_the_wrong_shape_is_refused_before_writing():
    """Tails of the wrong shape are refused before the latent or index bytes are written."""
    pool = make()
    fill_all(pool)
    copy = pool.get_cpu_copy(locs(0), req_pool_index=0)
    bad_k = (torch.zeros(2, D, dtype=BF16), copy.tails["tail_k"][1])
    bad = KVHostCopy(
        source=copy.source,
        num_tokens=copy.num_tokens,
        parts=copy.parts,
        tails={"tail_k": bad_k, "tail_score": copy.tails["tail_score"]},
    )
    before = everything(pool)
    with pytest.raises(ValueError, match="tail 'tail_k' layer 0"):
        pool.load_cpu_copy(bad, locs(5), req_pool_index=1)
    assert_same(before, everything(pool))


# --- compress tails --------------------------------------------------------------------------


def test_tail_buffers_are_bf16_zeros_per_request_and_layer():
    """Keys and scores: bf16 zeros [requests + 1, width, D], zero rows for skip layers;
    the getter returns the pool's tensors."""
    pool = make(skip_topk_layers=[True, False], start_layer=2)
    shapes = [tuple(t.shape) for t in (*pool._compress_tail_k, *pool._compress_tail_score)]
    assert shapes == [(0, 3, D), (4, 3, D)] * 2
    keys, scores = pool.get_compress_tail_buffers(3)
    assert keys is pool._compress_tail_k[1] and scores is pool._compress_tail_score[1]
    assert keys.dtype == BF16 and not keys.any()
    pool.check_valid()


def test_tail_write_fills_the_ring_from_the_logical_start():
    """Row i goes to slot (start + i) % 3; other slots and requests keep their bytes."""
    pool = make()
    key, score = tail_rows(2, seed=1), tail_rows(2, seed=2)
    key_before, score_before = key.clone(), score.clone()
    pool.set_compress_tail_for_request(1, torch.tensor([2]), key, score, 2, 5)
    keys, scores = pool.get_compress_tail_buffers(1)
    assert same_bytes(keys[2, 2], key[0]) and same_bytes(keys[2, 0], key[1])
    assert same_bytes(scores[2, 2], score[0]) and same_bytes(scores[2, 0], score[1])
    assert not keys[2, 1].any() and not keys[[0, 1, 3]].any() and not scores[[0, 1, 3]].any()
    assert same_bytes(key, key_before) and same_bytes(score, score_before)
    assert not pool._compress_tail_k[0].any()


def test_tail_write_of_no_rows_does_nothing():
    """n_remain 0 writes nothing, whatever the start."""
    pool = make()
    empty = torch.zeros(0, D, dtype=BF16)
    pool.set_compress_tail_for_request(0, 0, empty, empty, 0, 7)
    assert not pool._compress_tail_k[0].any()


ROWS = tail_rows(2, seed=0)
BAD_TAIL_WRITES: list[tuple[str, dict[str, Any], str]] = [
    ("layer", {"layer_id": 2}, "layer_id=2 not in [0, 2)"),
    ("skip", {"layer_id": 1}, "skip-topk layer"),
    ("request-high", {"req_pool_idx": 4}, "req_pool_idx=4 not in [0, 4)"),
    ("request-negative", {"req_pool_idx": -1}, "req_pool_idx=-1"),
    ("request-two", {"req_pool_idx": torch.tensor([0, 1])}, "req_pool_idx must be"),
    ("request-float", {"req_pool_idx": 1.0}, "req_pool_idx=1.0"),
    ("key-dtype", {"key_tail": ROWS.float()}, "key_tail"),
    ("score-shape", {"score_tail": ROWS[:1]}, "score_tail"),
    ("n-above-width", {"n_remain": 4}, "n_remain=4 must be in [0, 3]"),
    ("n-negative", {"n_remain": -1}, "n_remain=-1"),
    ("start-negative", {"dst_logical_start": -1}, "dst_logical_start=-1"),
    ("start-float", {"dst_logical_start": 0.5}, "dst_logical_start=0.5"),
]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [case[1:] for case in BAD_TAIL_WRITES],
    ids=[case[0] for case in BAD_TAIL_WRITES],
)
def test_bad_tail_writes_are_refused_before_writing(overrides, fragment):
    """Every bad argument raises ValueError naming it, and the pool keeps its bytes."""
    pool = make(skip_topk_layers=[False, True])
    fill_all(pool)
    before = everything(pool)
    args: dict[str, Any] = dict(
        layer_id=0,
        req_pool_idx=1,
        key_tail=ROWS,
        score_tail=ROWS,
        n_remain=2,
        dst_logical_start=0,
    )
    args.update(overrides)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        pool.set_compress_tail_for_request(**args)
    assert_same(before, everything(pool))


def test_tail_calls_on_a_pool_without_tails_are_refused():
    """Tail calls on a pool without tails say so."""
    pool = make(index_kpool_compress=False)
    with pytest.raises(ValueError, match="keeps no compress tails"):
        pool.get_compress_tail_buffers(0)
    with pytest.raises(ValueError, match="keeps no compress tails"):
        pool.set_compress_tail_for_request(0, 0, ROWS, ROWS, 2, 0)


# --- accounting and descriptors --------------------------------------------------------------


def test_kv_size_bytes_counts_latent_index_and_every_tail_byte():
    """Latent plus index-K plus both tail buffers of every layer."""
    pool = make(skip_topk_layers=[False, True])
    latent = 2 * 12 * 6 * 2  # layers * slots * (rank + rope) * bf16
    index = 3 * 264  # one non-skip layer
    tails = 2 * (4 * 3 * D * 2)  # keys and scores of the non-skip layer
    assert pool.get_kv_size_bytes() == latent + index + tails
    assert make(index_kpool_compress=False, skip_topk_layers=[False, True]).get_kv_size_bytes() == (
        latent + index
    )


def test_tail_buf_infos_list_keys_then_scores_with_zeros_for_skip_layers():
    """Keys of every layer, then scores; a skip layer is (0, 0, 0); item_len is one request."""
    pool = make(skip_topk_layers=[True, False])
    ptrs, lens, item_lens = pool.get_compress_tail_buf_infos()
    assert lens == [0, 4 * 3 * D * 2] * 2 and item_lens == [0, 3 * D * 2] * 2
    assert ptrs == [
        0,
        pool._compress_tail_k[1].data_ptr(),
        0,
        pool._compress_tail_score[1].data_ptr(),
    ]


def test_meta_kpool_pool_checks_and_does_nothing():
    """On meta the tail, copy and reload calls check shapes and touch no data."""
    pool = make(device="meta")
    assert pool._compress_tail_k[0].device.type == "meta"
    pool.set_compress_tail_for_request(0, 1, ROWS.to("meta"), ROWS.to("meta"), 2, 0)
    copy = pool.get_cpu_copy(locs(0, 1), req_pool_index=1)
    pool.load_cpu_copy(copy, locs(2, 3), req_pool_index=2)
    pool.check_valid()
