"""Decode context parallel in kvcheck's MLA and DSA pools: widened ids, this rank's latent
rows, replicated index keys, and the refusals that leave a pool unchanged.

Most tests compare the ``D`` ranks of a DCP group against one plain pool (``D == 1``) of
``token_slots`` rows, driven with the same widened ids: rank ``r``'s latent row ``p`` must
hold the plain pool's row ``p * D + r`` and every rank's index keys (and compress tails)
must equal the plain pool's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _pools_support import (
    all_buffers,
    assert_unchanged,
    layer,
    locs,
    make_dsa,
    make_mla,
    random_bytes,
    same_bytes,
    snapshot,
)

from kvcheck.pools import DSATokenToKVPool, MLATokenToKVPool
from kvcheck.pools._scaled_latent import scaled_row_width

SIZE, PAGE = 8, 4

#: Pool variants: the overrides of ``make_mla`` / ``make_dsa``.
VARIANTS: dict[str, tuple[Callable[..., MLATokenToKVPool], dict[str, Any]]] = {
    "mla": (make_mla, {}),
    "dsa": (make_dsa, {}),
    "dsa:kpool": (
        make_dsa,
        dict(
            index_kpool=2,
            index_kpool_compress=True,
            tail_extra_slots=1,
            max_running_requests=2,
        ),
    ),
    "dsa:scaled": (
        make_dsa,
        dict(
            dtype=torch.float8_e4m3fn,
            kv_lora_rank=128,
            kv_cache_dim=scaled_row_width(128, 2),
        ),
    ),
}
DSA_VARIANTS = [name for name in VARIANTS if name.startswith("dsa")]
GROUPS = [(name, d) for name in VARIANTS for d in (2, 4)]


def build(variant: str, dcp_size: int, rank: int, **extra: Any) -> MLATokenToKVPool:
    factory, overrides = VARIANTS[variant]
    kwargs = {"size": SIZE, "page_size": PAGE, **overrides, **extra}
    return factory(dcp_size=dcp_size, dcp_rank=rank, **kwargs)


def group(variant: str, dcp_size: int) -> tuple[list[MLATokenToKVPool], MLATokenToKVPool]:
    """The ``dcp_size`` ranks and the plain pool that holds all their widened ids."""
    ranks = [build(variant, dcp_size, r) for r in range(dcp_size)]
    plain = build(variant, 1, 0, size=(SIZE + PAGE) * dcp_size - PAGE)
    assert plain.num_slots == ranks[0].token_slots
    return ranks, plain


def latent_parts(pool: MLATokenToKVPool, ids: torch.Tensor, *, seed: int) -> tuple[Any, Any]:
    n = ids.numel()
    dtype = torch.bfloat16 if getattr(pool, "latent_layout", "raw") == "scaled" else pool.dtype
    gen = torch.Generator().manual_seed(seed)
    nope = (torch.randn((n, 1, pool.kv_lora_rank), generator=gen) * 4).to(dtype)
    rope = (torch.randn((n, 1, pool.qk_rope_head_dim), generator=gen) * 4).to(dtype)
    return nope, rope


def write_latent(pools: list[MLATokenToKVPool], ids: torch.Tensor, *, seed: int) -> None:
    """The same widened write on every pool."""
    for pool in pools:
        for i, layer_id in enumerate(pool.layer_ids):
            nope, rope = latent_parts(pool, ids, seed=seed + i)
            pool.set_mla_kv_buffer(layer(layer_id), ids, nope, rope)


def write_index(pools: list[MLATokenToKVPool], *, seed: int) -> None:
    """Distinct bytes in every index slot of every non-skip layer, alike on every pool."""
    for pool in pools:
        assert isinstance(pool, DSATokenToKVPool)
        slots = torch.arange(-(-pool.token_slots // pool.index_kpool))
        n = slots.numel()
        for i, layer_id in enumerate(pool.layer_ids):
            if pool.skip_topk_layers[i]:
                continue
            key = random_bytes((n, pool.index_head_dim), seed=seed + i)
            scale = random_bytes((n, pool.index_layout.scale_bytes), seed=seed + 50 + i)
            pool.set_index_k_scale_buffer(layer_id, slots, key, scale)
        if pool.kpool_use_compress:
            for i, layer_id in enumerate(pool.layer_ids):
                if pool.skip_topk_layers[i]:
                    continue
                gen = torch.Generator().manual_seed(seed + 200 + i)
                rows = torch.randn((pool.tail_width, pool.index_head_dim), generator=gen)
                rows = rows.to(torch.bfloat16)
                pool.set_compress_tail_for_request(layer_id, 1, rows, -rows, pool.tail_width, 0)


def fill_group(pools: list[MLATokenToKVPool], *, seed: int = 0) -> None:
    """Every widened id written (in a shuffled order) and every index slot filled."""
    tokens = pools[0].token_slots
    order = torch.randperm(tokens, generator=torch.Generator().manual_seed(seed))
    write_latent(pools, order, seed=seed)
    if isinstance(pools[0], DSATokenToKVPool):
        write_index(pools, seed=seed + 1000)


def assert_sharded(ranks: list[MLATokenToKVPool], plain: MLATokenToKVPool) -> None:
    """Rank ``r``'s latent row ``p`` is the plain pool's row ``p * D + r``; index keys and
    tails are the plain pool's."""
    d = len(ranks)
    for r, pool in enumerate(ranks):
        for i, (mine, whole) in enumerate(zip(pool.kv_buffer, plain.kv_buffer, strict=True)):
            assert same_bytes(mine, whole[r::d].contiguous()), f"rank {r} latent layer {i}"
        if isinstance(pool, DSATokenToKVPool):
            assert isinstance(plain, DSATokenToKVPool)
            for i, (mine, whole) in enumerate(
                zip(pool.index_k_with_scale_buffer, plain.index_k_with_scale_buffer, strict=True)
            ):
                assert same_bytes(mine, whole), f"rank {r} index layer {i}"
            for name in ("_compress_tail_k", "_compress_tail_score"):
                for mine, whole in zip(
                    getattr(pool, name) or [], getattr(plain, name) or [], strict=True
                ):
                    assert same_bytes(mine, whole), f"rank {r} {name}"


def same_owner_pairs(tokens: int, d: int, n: int, *, seed: int) -> tuple[Any, Any]:
    """``n`` moves with distinct targets, each source of its target's owner."""
    gen = torch.Generator().manual_seed(seed)
    tgt = torch.randperm(tokens, generator=gen)[:n]
    src = torch.randint(0, tokens // d, (n,), generator=gen) * d + tgt % d
    return tgt, src


# --- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["mla", "dsa"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_bad_dcp_size_is_refused_by_name(variant, value):
    """dcp_size must be an int >= 1; the message names dcp_size."""
    with pytest.raises(ValueError, match="dcp_size"):
        build(variant, value, 0)


@pytest.mark.parametrize("variant", ["mla", "dsa"])
@pytest.mark.parametrize(("dcp_size", "value"), [(2, -1), (2, 2), (4, 7), (1, 1), (2, True)])
def test_bad_dcp_rank_is_refused_by_name(variant, dcp_size, value):
    """dcp_rank must be an int in [0, dcp_size); the message names dcp_rank."""
    with pytest.raises(ValueError, match="dcp_rank"):
        build(variant, dcp_size, value)


@pytest.mark.parametrize("variant", ["mla", "dsa"])
def test_dcp_needs_whole_pages(variant):
    """With dcp_size > 1, size must be a multiple of page_size (plain pools need not)."""
    with pytest.raises(ValueError, match="page_size") as info:
        build(variant, 2, 1, size=6)
    assert "size=6" in str(info.value)
    assert build(variant, 1, 0, size=6).num_slots == 10


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_geometry_per_rank(variant, d):
    """Latent buffers keep size + page_size rows per rank; ids widen by dcp_size."""
    for r in range(d):
        pool = build(variant, d, r)
        assert (pool.dcp_size, pool.dcp_rank) == (d, r)
        assert pool.token_slots == (SIZE + PAGE) * d
        assert pool.token_page_size == PAGE * d
        assert all(buffer.shape[0] == SIZE + PAGE for buffer in pool.kv_buffer)
        pool.check_valid()


@pytest.mark.parametrize(("variant", "d"), [(v, d) for v in DSA_VARIANTS for d in (2, 4)])
def test_dsa_index_buffer_is_widened_and_counted(variant, d):
    """The default index_buf_size is SGLang's (size + page_size) * D - page_size; the
    index buffers (and their bytes) grow, the latent bytes do not."""
    pool, plain = build(variant, d, d - 1), build(variant, 1, 0)
    assert isinstance(pool, DSATokenToKVPool) and isinstance(plain, DSATokenToKVPool)
    assert pool.index_buf_size == (SIZE + PAGE) * d - PAGE
    assert pool.num_index_pages == (pool.index_buf_size + PAGE + 1) // PAGE
    latent = sum(b.nbytes for b in pool.kv_buffer)
    assert latent == sum(b.nbytes for b in plain.kv_buffer)
    index = sum(b.nbytes for b in pool.index_k_with_scale_buffer)
    assert index > sum(b.nbytes for b in plain.index_k_with_scale_buffer)
    tail_buffers = [*(pool._compress_tail_k or []), *(pool._compress_tail_score or [])]
    tails = sum(b.nbytes for b in tail_buffers)
    assert pool.get_kv_size_bytes() == latent + index + tails
    assert pool.mem_usage == pool.get_kv_size_bytes() / 2**30
    lens = pool.get_state_buf_infos()[1]
    index_buffers = zip(pool.index_k_with_scale_buffer, pool.skip_topk_layers, strict=True)
    assert lens == [0 if skip else b.nbytes for b, skip in index_buffers]
    assert build(variant, d, 0, index_buf_size=5).index_buf_size == 5


# --- set_mla_kv_buffer -------------------------------------------------------------------


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_set_mla_kv_buffer_keeps_this_ranks_ids(variant, d):
    """Each rank keeps row w // D of the ids w it owns and drops the rest."""
    ranks, plain = group(variant, d)
    fill_group([*ranks, plain])
    assert_sharded(ranks, plain)
    # A later partial write (a page and a half, not page-aligned) changes only owned rows.
    ids = torch.arange(3, 3 + PAGE * d + PAGE * d // 2)
    write_latent([*ranks, plain], ids, seed=77)
    assert_sharded(ranks, plain)


def test_set_mla_kv_buffer_example_rank_one_of_two():
    """Rank 1 of 2 writing ids (2, 3): only id 3 lands, in row 1."""
    pool = build("mla", 2, 1)
    before = snapshot(pool)
    nope, rope = latent_parts(pool, locs(2, 3), seed=0)
    pool.set_mla_kv_buffer(layer(0), locs(2, 3), nope, rope)
    row = torch.cat([nope[1], rope[1]], dim=-1)
    assert same_bytes(pool.kv_buffer[0][1], row)
    pool.kv_buffer[0][1] = before[0][1]
    assert_unchanged(pool, before)


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_set_mla_kv_buffer_bounds_are_widened(variant, d):
    """Ids up to token_slots - 1 are accepted; token_slots, negatives and repeats are
    refused (ValueError) and leave every rank unchanged."""
    for r in range(d):
        pool = build(variant, d, r)
        fill_group([pool])
        before = snapshot(pool)
        for bad in (locs(0, pool.token_slots), locs(-1), locs(5, 5)):
            nope, rope = latent_parts(pool, bad, seed=1)
            with pytest.raises(ValueError, match="loc"):
                pool.set_mla_kv_buffer(layer(0), bad, nope, rope)
            assert_unchanged(pool, before)
        last = locs(pool.token_slots - 1)
        nope, rope = latent_parts(pool, last, seed=2)
        pool.set_mla_kv_buffer(layer(0), last, nope, rope)


# --- set_kv_buffer -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["mla", "dsa", "dsa:kpool"])
@pytest.mark.parametrize("d", [2, 4])
def test_set_kv_buffer_is_refused_under_dcp(variant, d):
    """set_kv_buffer raises RuntimeError (no DCP-aware path) and writes nothing; argument
    errors are still ValueError, checked first."""
    for r in range(d):
        pool = build(variant, d, r)
        fill_group([pool])
        before = snapshot(pool)
        rows = torch.ones((2, 1, pool.kv_cache_dim), dtype=pool.dtype)
        with pytest.raises(RuntimeError, match="set_mla_kv_buffer"):
            pool.set_kv_buffer(layer(0), locs(0, 1), rows, None)
        assert_unchanged(pool, before)
        with pytest.raises(ValueError, match="cache_k"):
            pool.set_kv_buffer(layer(0), locs(0, 1), rows[:1], None)
        with pytest.raises(ValueError, match="loc"):
            pool.set_kv_buffer(layer(0), locs(0, pool.num_slots), rows, None)
        assert_unchanged(pool, before)


def test_set_kv_buffer_scaled_pool_still_refuses_by_layout_first():
    """A scaled DSA pool under DCP keeps its ValueError (its own refusal comes first)."""
    pool = build("dsa:scaled", 2, 0)
    rows = torch.zeros((1, 1, pool.kv_cache_dim), dtype=torch.uint8)
    with pytest.raises(ValueError, match="set_mla_kv_buffer"):
        pool.set_kv_buffer(layer(0), locs(0), rows, None)


# --- move_kv_cache -----------------------------------------------------------------------


@pytest.mark.parametrize(("variant", "d"), [g for g in GROUPS if g[0] != "dsa:kpool"])
def test_move_moves_this_ranks_rows_and_every_index_key(variant, d):
    """Owned pairs move latent rows (gathered first); every pair moves index keys."""
    ranks, plain = group(variant, d)
    fill_group([*ranks, plain])
    tgt, src = same_owner_pairs(ranks[0].token_slots, d, 9, seed=3)
    # A swap of ids 0 and D (both rank 0's) checks gather-before-scatter.
    keep = ~torch.isin(tgt, locs(0, d))
    tgt, src = torch.cat([tgt[keep], locs(0, d)]), torch.cat([src[keep], locs(d, 0)])
    for pool in [*ranks, plain]:
        pool.move_kv_cache(tgt, src)
    assert_sharded(ranks, plain)


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_move_across_owners_is_refused(variant, d):
    """A pair whose ids have different owners raises ValueError; nothing moves."""
    for r in range(d):
        pool = build(variant, d, r)
        fill_group([pool])
        before = snapshot(pool)
        with pytest.raises(ValueError, match="tgt_loc"):
            pool.move_kv_cache(locs(0, d + 1), locs(d, 2 * d))
        assert_unchanged(pool, before)


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_move_bounds_are_widened(variant, d):
    """Move ids live in [0, token_slots): token_slots is refused, nothing moves."""
    pool = build(variant, d, 0)
    fill_group([pool])
    before = snapshot(pool)
    with pytest.raises(ValueError, match="src_loc"):
        pool.move_kv_cache(locs(0), locs(pool.token_slots))
    assert_unchanged(pool, before)
    pool.move_kv_cache(locs(), locs())
    assert_unchanged(pool, before)


@pytest.mark.parametrize("d", [2, 4])
def test_kpool_move_is_still_refused(d):
    """With index_kpool 2 a non-empty same-owner move is refused and changes nothing."""
    pool = build("dsa:kpool", d, 1)
    fill_group([pool])
    before = snapshot(pool)
    with pytest.raises(ValueError, match="index_kpool"):
        pool.move_kv_cache(locs(1), locs(1 + d))
    assert_unchanged(pool, before)


# --- host copies -------------------------------------------------------------------------


def runs(d: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(copied run, reload run) pairs that start page-aligned (pages of ``PAGE * d``
    widened ids): a page and a bit, two runs concatenated, a whole page."""
    page = PAGE * d
    half = page // 2 + 1
    return [
        (torch.arange(page, page + half), torch.arange(2 * page, 2 * page + half)),
        (
            torch.cat([torch.arange(page, page + d), torch.arange(2 * page, 2 * page + d + 1)]),
            torch.cat([torch.arange(0, 2 * d), torch.arange(2 * page, 2 * page + 1)]),
        ),
        (torch.arange(2 * page, 3 * page), torch.arange(0, page)),
    ]


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_host_copy_round_trip(variant, d):
    """A copy carries this rank's latent rows and every position's index keys; a reload
    writes them back to another page-aligned run."""
    ranks, plain = group(variant, d)
    fill_group([*ranks, plain])
    request = {"req_pool_index": 1} if variant == "dsa:kpool" else {}
    for src, dst in runs(d):
        copies = [pool.get_cpu_copy(src, **request) for pool in [*ranks, plain]]
        for r, copy in enumerate(copies[:-1]):
            assert copy.num_tokens == src.numel()
            assert copy.parts["kv"][0].shape[0] == len(range(r, src.numel(), d))
        write_latent([*ranks, plain], torch.arange(ranks[0].token_slots), seed=99)
        reload = {"req_pool_index": 0} if request else {}
        for pool, copy in zip([*ranks, plain], copies, strict=True):
            pool.load_cpu_copy(copy, dst, **reload)
        assert_sharded(ranks, plain)


@pytest.mark.parametrize(("variant", "d"), GROUPS)
def test_host_copy_of_a_misaligned_run_is_refused(variant, d):
    """indices[j] % D must equal j % D: a run starting off its owner is ValueError, and a
    refused reload changes nothing."""
    for r in range(d):
        pool = build(variant, d, r)
        fill_group([pool])
        before = snapshot(pool)
        bad = torch.arange(1, 1 + d)
        with pytest.raises(ValueError, match="indices"):
            pool.get_cpu_copy(bad)
        copy = pool.get_cpu_copy(torch.arange(0, d))
        with pytest.raises(ValueError, match="indices"):
            pool.load_cpu_copy(copy, bad)
        with pytest.raises(ValueError, match="indices"):
            pool.load_cpu_copy(copy, torch.arange(d, 2 * d + 1))  # one token too many
        with pytest.raises(ValueError, match="indices"):
            pool.get_cpu_copy(locs(pool.token_slots))
        assert_unchanged(pool, before)


# --- index writes and reads --------------------------------------------------------------


@pytest.mark.parametrize(("variant", "d"), [(v, d) for v in DSA_VARIANTS for d in (2, 4)])
def test_index_writes_take_widened_slots(variant, d):
    """Index slots lie in [0, ceil(token_slots / index_kpool)); paged reads take the
    widened buffer's pages."""
    pool = build(variant, d, d - 1)
    assert isinstance(pool, DSATokenToKVPool)
    slots = -(-pool.token_slots // pool.index_kpool)
    key = torch.full((1, 128), 9, dtype=torch.uint8)
    pool.set_index_k_scale_buffer(0, locs(slots - 1), key, torch.ones(1, 1))
    before = snapshot(pool)
    with pytest.raises(ValueError, match="loc"):
        pool.set_index_k_scale_buffer(0, locs(slots), key, torch.ones(1, 1))
    assert_unchanged(pool, before)
    last_page = (slots - 1) // pool.index_page_size
    offset = (slots - 1) % pool.index_page_size
    k, _ = pool.get_index_k_scale_buffer(
        0, locs(offset + 1), locs(last_page)[None], offset + 1, offset + 1
    )
    assert k[offset].unique().tolist() == [9]


# --- reads stay physical, D == 1 unchanged, meta -----------------------------------------


@pytest.mark.parametrize("variant", ["mla", "dsa"])
def test_reads_take_physical_rows(variant):
    """get_mla_kv_buffer and the buffer getters read this rank's rows, bound num_slots."""
    pool = build(variant, 2, 1)
    fill_group([pool])
    assert pool.get_key_buffer(0).shape[0] == pool.num_slots
    assert pool.get_value_buffer(0).shape[0] == pool.num_slots
    assert pool.get_kv_buffer(0)[0].shape[0] == pool.num_slots
    nope, _ = pool.get_mla_kv_buffer(layer(0), locs(pool.num_slots - 1))
    assert same_bytes(nope[0], pool.kv_buffer[0][-1][..., : pool.kv_lora_rank])
    with pytest.raises(ValueError, match="loc"):
        pool.get_mla_kv_buffer(layer(0), locs(pool.num_slots))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dcp_size_one_is_the_plain_pool(variant):
    """dcp_size=1 (explicit) builds and behaves as a pool without the arguments."""
    explicit, default = (
        build(variant, 1, 0),
        VARIANTS[variant][0](size=SIZE, page_size=PAGE, **VARIANTS[variant][1]),
    )
    assert explicit.token_slots == explicit.num_slots
    for pool in (explicit, default):
        fill_group([pool])
        ids = locs(1, 2, 5)
        pool.get_cpu_copy(ids)
        with pytest.raises(ValueError, match=r"not in \[0, 12\)$"):
            pool.get_cpu_copy(locs(12))
    for a, b in zip(all_buffers(explicit), all_buffers(default), strict=True):
        assert same_bytes(a, b)
    if isinstance(explicit, DSATokenToKVPool):
        assert explicit.index_buf_size == SIZE


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_meta_pool_under_dcp(variant):
    """A meta pool takes the DCP operations on shapes alone; a copy has this rank's rows."""
    pool = build(variant, 2, 1, device="meta")
    ids = torch.arange(5)
    nope, rope = latent_parts(build(variant, 2, 1), ids, seed=0)
    pool.set_mla_kv_buffer(layer(0), ids, nope.to("meta"), rope.to("meta"))
    copy = pool.get_cpu_copy(ids)
    assert copy.parts["kv"][0].shape[0] == 2
    pool.load_cpu_copy(copy, ids)
    if variant != "dsa:kpool":
        pool.move_kv_cache(locs(0), locs(2))
