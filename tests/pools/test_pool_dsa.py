"""DSA index-K: page byte layout, token-granular moves and host copies, skip layers."""

from __future__ import annotations

import pytest
import torch
from _pools_support import (
    fill,
    index_tokens,
    layer,
    locs,
    make_dsa,
    payload,
    random_bytes,
    snapshot,
    token_index_bytes,
    token_state,
)


def scale_values(n: int, blocks: int, *, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, blocks, generator=gen) + 0.5


# --- byte layout ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page_size", "index_head_dim"),
    [(4, 128), (3, 256), (1, 128)],
    ids=["page4-d128", "page3-d256", "page1-d128"],
)
def test_index_write_places_each_tokens_key_and_scale_bytes(page_size, index_head_dim):
    """Token t's key bytes sit at columns [o*D, (o+1)*D) and its scales at
    [P*D + o*S, P*D + (o+1)*S) of page t // P, checked token by token."""
    pool = make_dsa(page_size=page_size, index_head_dim=index_head_dim, size=8)
    tokens = torch.randperm(index_tokens(pool), generator=torch.Generator().manual_seed(0))
    n, blocks = tokens.numel(), index_head_dim // 128
    keys = payload((n, index_head_dim), torch.float32, seed=1).to(torch.float8_e4m3fn)
    scales = scale_values(n, blocks, seed=2)
    pool.set_index_k_scale_buffer(0, tokens, keys, scales)
    for i, token in enumerate(tokens.tolist()):
        key_bytes, scale_bytes = token_index_bytes(pool, 0, token)
        assert key_bytes == bytes(keys[i].view(torch.uint8).tolist())
        assert scale_bytes == bytes(scales[i].view(torch.uint8).tolist())
        assert torch.equal(torch.frombuffer(bytearray(scale_bytes), dtype=torch.float32), scales[i])


def test_index_write_leaves_neighbours_in_the_page_untouched():
    """Writing one token changes only that token's key and scale columns."""
    pool = make_dsa(page_size=4)
    fill(pool, seed=3)
    before = {t: token_index_bytes(pool, 0, t) for t in range(12)}
    pool.set_index_k_scale_buffer(
        0, locs(6), random_bytes((1, 128), seed=4), scale_values(1, 1, seed=5)
    )
    after = {t: token_index_bytes(pool, 0, t) for t in range(12)}
    assert {t for t in before if before[t] != after[t]} == {6}


def test_index_write_accepts_sglangs_1d_scale_and_raw_scale_bytes():
    """index_k_scale may be [n] float32 (one block) or its raw [n, S] uint8 bytes."""
    pool = make_dsa()
    key = random_bytes((2, 128), seed=6)
    scale = scale_values(2, 1, seed=7)
    pool.set_index_k_scale_buffer(0, locs(1, 2), key, scale.view(-1))
    pool.set_index_k_scale_buffer(2, locs(1, 2), key, scale.view(torch.uint8))
    for token in (1, 2):
        assert token_index_bytes(pool, 0, token) == token_index_bytes(pool, 2, token)


def test_index_write_does_not_modify_the_callers_tensors():
    """set_index_k_scale_buffer only reads loc, index_k and a non-contiguous scale."""
    pool = make_dsa(index_head_dim=256)
    loc = locs(3, 1)
    key = random_bytes((2, 256), seed=8).view(torch.float8_e4m3fn)
    scale = scale_values(2, 4, seed=9)[:, ::2]  # non-contiguous [2, 2]
    copies = [loc.clone(), key.view(torch.uint8).clone(), scale.clone()]
    pool.set_index_k_scale_buffer(0, loc, key, scale)
    assert torch.equal(loc, copies[0]) and torch.equal(key.view(torch.uint8), copies[1])
    assert torch.equal(scale, copies[2])
    assert token_index_bytes(pool, 0, 1)[1] == bytes(
        scale[1].contiguous().view(torch.uint8).tolist()
    )


# --- moves ------------------------------------------------------------------------------


def test_move_copies_one_tokens_bytes_not_the_whole_page_row():
    """Moving token 1 to token 2 changes only token 2's bytes. Both whole-row readings give
    a different buffer: page rows indexed by token ids (the upstream bug) and copying the
    token's whole page (which would also overwrite token 3)."""
    pool = make_dsa(page_size=2, size=8)  # pages 0:{0,1} 1:{2,3} ...
    fill(pool, seed=10)
    buffer = pool.index_k_with_scale_buffer[0]
    rows_by_token_id = buffer.clone()
    rows_by_token_id[2] = rows_by_token_id[1]
    whole_page = buffer.clone()
    whole_page[1] = whole_page[0]
    expected = {t: token_state(pool, t) for t in range(pool.num_slots)}
    expected[2] = token_state(pool, 1)
    pool.move_kv_cache(locs(2), locs(1))
    assert {t: token_state(pool, t) for t in range(pool.num_slots)} == expected
    assert not torch.equal(buffer, rows_by_token_id)
    assert not torch.equal(buffer, whole_page)


def test_move_with_overlap_in_one_page_reads_sources_first():
    """Shifting tokens within a page reads all sources before writing any target."""
    pool = make_dsa(page_size=4)
    fill(pool, seed=11)
    before = {t: token_index_bytes(pool, 2, t) for t in range(12)}
    pool.move_kv_cache(locs(5, 6, 7), locs(4, 5, 6))
    assert [token_index_bytes(pool, 2, t) for t in (4, 5, 6, 7)] == [
        before[4],
        before[4],
        before[5],
        before[6],
    ]


def test_move_skips_skip_layers():
    """A move leaves skip layers' zero-row index buffers empty."""
    pool = make_dsa(skip_topk_layers=[True, True, False])
    fill(pool, seed=12)
    pool.move_kv_cache(locs(0, 1), locs(9, 9))
    assert [b.shape[0] for b in pool.index_k_with_scale_buffer] == [0, 0, 3]
    assert token_index_bytes(pool, 2, 0) == token_index_bytes(pool, 2, 9)


# --- token-granular host copies ---------------------------------------------------------

INDEX_SETS = {
    "partial-last-page": [4, 5, 6],
    "misaligned-run": [5, 6, 7, 8],
    "out-of-order": [4, 6, 5, 7],
    "two-requests": [4, 5, 10, 11, 1],
    "single-token": [9],
}


@pytest.mark.parametrize("name", list(INDEX_SETS))
def test_host_copy_round_trips_any_token_set(name):
    """get_cpu_copy takes any token ids; load_cpu_copy writes copied token i to
    indices[i] (latent row, key and scale bytes) and leaves every other token alone,
    the other tokens of the same pages included."""
    pool = make_dsa(page_size=4)
    fill(pool, seed=13)
    source = INDEX_SETS[name]
    targets = [11 - t for t in source]  # distinct, crossing pages, partly overlapping
    before = {t: token_state(pool, t) for t in range(12)}
    copy = pool.get_cpu_copy(locs(*source))
    assert copy.num_tokens == len(source)
    pool.load_cpu_copy(copy, locs(*targets))
    expected = dict(before)
    for s_tok, t_tok in zip(source, targets, strict=True):
        expected[t_tok] = before[s_tok]
    assert {t: token_state(pool, t) for t in range(12)} == expected


def test_host_copy_index_rows_are_key_then_scale_bytes():
    """Each copied index row is the token's D key bytes followed by its S scale bytes."""
    pool = make_dsa(page_size=2, size=8)
    fill(pool, seed=14)
    copy = pool.get_cpu_copy(locs(7, 2, 2))
    for i, token in enumerate([7, 2, 2]):
        key, scale = token_index_bytes(pool, 0, token)
        assert bytes(copy.parts["index_k"][0][i].tolist()) == key + scale
    assert copy.parts["index_k"][1].shape == (0, 132)


def test_reload_after_the_slots_were_reused_restores_the_request():
    """Retraction: copy a request's tokens, let another request overwrite them and their
    page neighbours, reload; the request's tokens come back, the neighbours keep the new
    data."""
    pool = make_dsa(page_size=4)
    fill(pool, seed=15)
    request = locs(4, 5, 6, 7, 8, 9)  # a whole page plus a partial one
    saved = {t: token_state(pool, t) for t in request.tolist()}
    copy = pool.get_cpu_copy(request)
    fill(pool, seed=16)
    neighbours = {t: token_state(pool, t) for t in (10, 11)}
    pool.load_cpu_copy(copy, request)
    assert {t: token_state(pool, t) for t in request.tolist()} == saved
    assert {t: token_state(pool, t) for t in (10, 11)} == neighbours


def test_host_copy_keeps_the_index_token_bound():
    """Host copies still refuse tokens beyond the index pages while a layer has index keys."""
    pool = make_dsa(size=6, page_size=4)  # 10 slots, 8 index tokens
    with pytest.raises(ValueError, match=r"indices\[1\]=9 not in \[0, 8\).*index-K"):
        pool.get_cpu_copy(locs(1, 9))
    copy = pool.get_cpu_copy(locs(1, 2))
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"indices\[0\]=8 not in \[0, 8\)"):
        pool.load_cpu_copy(copy, locs(8, 3))
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


def test_host_copy_layout_is_checked_before_writing():
    """A copy whose index rows have the wrong width is refused and nothing is written."""
    pool = make_dsa()
    fill(pool, seed=17)
    copy = pool.get_cpu_copy(locs(1, 2))
    bad_parts = dict(copy.parts)
    bad_parts["index_k"] = tuple(t[:, :-1] for t in copy.parts["index_k"])
    bad = type(copy)(source=copy.source, num_tokens=2, parts=bad_parts)
    before = snapshot(pool)
    with pytest.raises(ValueError, match="part 'index_k' layer 0 must have shape"):
        pool.load_cpu_copy(bad, locs(5, 6))
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


# --- index capacity ---------------------------------------------------------------------


def test_tokens_beyond_the_index_pages_are_refused_for_index_operations():
    """With fewer index pages than slots, index writes and moves past them raise."""
    pool = make_dsa(size=6, page_size=4)  # 10 slots, (6+4+1)//4 = 2 index pages = 8 tokens
    assert pool.num_index_pages * pool.page_size == 8
    rows = payload((1, 1, 6), torch.float32, seed=14)
    pool.set_kv_buffer(layer(0), locs(9), rows, None)  # the latent buffer has the slot
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"tgt_loc\[0\]=9 not in \[0, 8\).*index-K"):
        pool.move_kv_cache(locs(9), locs(1))
    with pytest.raises(ValueError, match=r"loc\[0\]=8 not in \[0, 8\)"):
        pool.set_index_k_scale_buffer(
            0, locs(8), random_bytes((1, 128), seed=1), scale_values(1, 1, seed=1)
        )
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


def test_all_skip_pool_moves_any_slot():
    """Without index buffers, moves are bounded only by the latent slots."""
    pool = make_dsa(size=6, page_size=4, skip_topk_layers=[True, True, True])
    pool.move_kv_cache(locs(9), locs(1))
    assert pool.get_kv_size_bytes() == 3 * 10 * 6 * 4


# --- skip layers and transfer descriptors -------------------------------------------------


def test_skip_layers_hold_zero_bytes():
    """A skip layer's index buffer has zero rows and adds nothing to the byte count."""
    with_skips = make_dsa(skip_topk_layers=[False, True, True])
    without = make_dsa(skip_topk_layers=[False, False, False])
    assert [b.nbytes for b in with_skips.index_k_with_scale_buffer][1:] == [0, 0]
    row_pages = without.index_k_with_scale_buffer[0].nbytes
    assert without.get_kv_size_bytes() - with_skips.get_kv_size_bytes() == 2 * row_pages


@pytest.mark.parametrize("start_layer", [0, 10])
def test_index_write_to_a_skip_layer_names_the_layer(start_layer):
    """Writing index keys to a skip layer raises ValueError naming the (global) layer."""
    pool = make_dsa(start_layer=start_layer)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=rf"layer_id={start_layer + 1} is a skip-topk layer"):
        pool.set_index_k_scale_buffer(
            start_layer + 1, locs(0), random_bytes((1, 128), seed=0), scale_values(1, 1, seed=0)
        )
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool), strict=True))


def test_get_index_buffer_returns_the_page_buffer():
    """get_index_k_with_scale_buffer maps a global id to its page buffer (empty for skips)."""
    pool = make_dsa(start_layer=4)
    assert pool.get_index_k_with_scale_buffer(4) is pool.index_k_with_scale_buffer[0]
    assert pool.get_index_k_with_scale_buffer(5).shape == (0, 528)


def test_state_buf_infos_describe_index_buffers_with_zeros_for_skip_layers():
    """get_state_buf_infos: (data_ptr, nbytes, page-row bytes) per layer; skips give zeros."""
    pool = make_dsa(skip_topk_layers=[False, True, False])
    ptrs, lens, item_lens = pool.get_state_buf_infos()
    buffers = pool.index_k_with_scale_buffer
    assert ptrs == [buffers[0].data_ptr(), 0, buffers[2].data_ptr()]
    assert lens == [3 * 528, 0, 3 * 528]
    assert item_lens == [528, 0, 528]


# --- meta ---------------------------------------------------------------------------------


def test_meta_dsa_operations_check_shapes_and_do_nothing():
    """On meta, index writes, moves and host copies validate shapes and return quietly."""
    pool = make_dsa(device="meta")
    meta_loc = torch.tensor([1, 2], device="meta")
    pool.set_index_k_scale_buffer(
        0,
        meta_loc,
        torch.empty(2, 128, dtype=torch.uint8, device="meta"),
        torch.empty(2, 1, device="meta"),
    )
    pool.move_kv_cache(meta_loc, meta_loc)
    copy = pool.get_cpu_copy(torch.arange(4, 8))
    assert [tuple(t.shape) for t in copy.parts["index_k"]] == [(4, 132), (0, 132), (4, 132)]
    assert all(t.is_meta for t in copy.parts["kv"])
    pool.load_cpu_copy(copy, torch.arange(8, 12))
    with pytest.raises(ValueError, match="index_k must have shape"):
        pool.set_index_k_scale_buffer(
            0,
            meta_loc,
            torch.empty(3, 128, dtype=torch.uint8, device="meta"),
            torch.empty(2, 1, device="meta"),
        )
    assert pool.get_state_buf_infos() == ([0, 0, 0], [3 * 528, 0, 3 * 528], [528, 0, 528])
    pool.check_valid()


# --- the scaled fp8 latent layout -------------------------------------------------------------


def make_scaled(*, rank: int = 256, rope: int = 64, **kwargs):
    from kvcheck.pools import DSATokenToKVPool

    return DSATokenToKVPool(
        size=4,
        page_size=2,
        kv_lora_rank=rank,
        dtype=torch.float8_e4m3fn,
        qk_rope_head_dim=rope,
        layer_num=1,
        device="cpu",
        index_head_dim=128,
        kv_cache_dim=rank + rank // 128 * 4 + 2 * rope,
        **kwargs,
    )


def test_scaled_rows_are_fp8_values_then_block_scales_then_bf16_rope():
    """A scaled row: each 128-block's fp8 values, its scale max|x|/448 as fp32, the rope
    bytes as given; the block whose max is 448 times its scale stores 0x7e."""
    pool = make_scaled()
    assert pool.latent_layout == "scaled" and pool.kv_buffer[0].shape == (6, 1, 392)
    nope = torch.cat([torch.full((128,), 2.0), torch.full((128,), -0.5)]).to(torch.bfloat16)
    rope = torch.arange(64, dtype=torch.float32).to(torch.bfloat16)
    pool.set_mla_kv_buffer(layer(0), locs(3), nope.view(1, 1, -1), rope.view(1, 1, -1))
    row = pool.kv_buffer[0][3, 0]
    assert set(row[:128].tolist()) == {0x7E} and set(row[128:256].tolist()) == {0xFE}
    scales = row[256:264].view(torch.float32).tolist()
    assert scales == [torch.tensor(2.0 / 448).item(), torch.tensor(0.5 / 448).item()]
    assert torch.equal(row[264:].view(torch.bfloat16), rope)
    assert int(pool.kv_buffer[0][[0, 1, 2, 4, 5]].count_nonzero()) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_cache_dim": 401}, "kv_cache_dim=401 must be 320 .* or 392"),
        ({"kv_cache_dim": 264, "dtype": torch.float8_e5m2}, "only the scaled fp8 layout"),
    ],
    ids=["wrong-width", "wrong-dtype"],
)
def test_kv_cache_dim_takes_the_raw_or_the_scaled_width_only(kwargs, message):
    """Any other kv_cache_dim (or a scaled one for a dtype other than e4m3) is refused."""
    from kvcheck.pools import DSATokenToKVPool

    args = {
        "size": 4,
        "page_size": 2,
        "kv_lora_rank": 256,
        "dtype": torch.float8_e4m3fn,
        "qk_rope_head_dim": 64,
        "layer_num": 1,
        "device": "cpu",
        "index_head_dim": 128,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        DSATokenToKVPool(**args)


def test_scaled_pool_refuses_whole_rows_other_dtypes_and_non_finite_values():
    """set_kv_buffer, get_mla_kv_buffer, non-bf16 parts and inf nope values raise
    ValueError and leave the buffer as it was."""
    pool = make_scaled(rank=128, rope=0)
    before = pool.kv_buffer[0].clone()
    nope = torch.ones(1, 1, 128, dtype=torch.bfloat16)
    calls = [
        lambda: pool.set_kv_buffer(layer(0), locs(1), torch.zeros(1, 1, 132, dtype=torch.uint8)),
        lambda: pool.get_mla_kv_buffer(layer(0), locs(1)),
        lambda: pool.set_mla_kv_buffer(layer(0), locs(1), nope.float(), None),
        lambda: pool.set_mla_kv_buffer(layer(0), locs(1), nope * float("inf"), None),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert torch.equal(pool.kv_buffer[0], before)
    pool.set_mla_kv_buffer(layer(0), locs(1), nope, None)
    assert pool.kv_buffer[0][1, 0, :128].unique().tolist() == [0x7E]
