"""Pinned reproductions of what the suite finds in sglang (docs/sglang-findings.md, the
appendix docs/sglang-findings-appendix.md says which test pins which finding).

Each test runs kvcheck's own check on the minimal example Hypothesis gave for one finding,
against the active target. On the kvcheck target they pass, which shows the check and the
example are sound. The sglang target's findings (``kvcheck/targets/sglang/findings.py``)
name these tests as the ones that pin them, so the plugin runs them as strict xfails that
must fail with exactly that finding's failure: the day sglang changes, the matching test
passes (or fails differently) and the run fails until the finding is updated. The
finding ids (``V2``, ``C3``, ...) are the index's ids and the appendix's anchors. The
target declares only the findings of the installed release (``RELEASES`` in the
findings module): on a release where a finding is fixed, or never was, its tests run as
plain tests and must pass.

Run against sglang with ``KVCHECK_TARGET=sglang python -m pytest tests/targets``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import find, settings
from hypothesis import strategies as st

from kvcheck.calls import PoolCall, describe_op, op_method
from kvcheck.census import KNOWN_ROLES, take_census
from kvcheck.linear_hybrid_machine import (
    assert_alloc_refusal_changes_nothing,
    linear_hybrid_skip_reason,
)
from kvcheck.properties.accounting import (
    assert_accounting,
    assert_contiguous_buf_infos,
    assert_scale_buf_infos,
)
from kvcheck.properties.allocators import allocator_sizes, assert_allocator_state, assert_refusal
from kvcheck.properties.apply import apply_op_like_reference
from kvcheck.properties.census import (
    assert_descriptions_cover_census,
    assert_hicache_assembly_whole,
    assert_host_copy_restores_census,
    assert_registration_covers_census,
)
from kvcheck.properties.host_pools import assert_host_buffer_infos
from kvcheck.properties.inputs import assert_rejected_call_changes_nothing
from kvcheck.properties.noop import assert_noop_write_raises
from kvcheck.properties.pool_state import (
    assert_compress_tails_match_reference,
    assert_pool_matches_reference,
    assert_read_api_matches_reference,
)
from kvcheck.properties.serving import (
    check_capacity_fits_budget,
    check_cell_size,
    check_skip_rule,
)
from kvcheck.reference import ReferencePool
from kvcheck.reference.allocators import ReferenceAllocator, Request
from kvcheck.reference.host_pools import ReferenceHostPool
from kvcheck.specs import (
    HostCopy,
    HostReload,
    LinearHybridSpec,
    Move,
    Op,
    Payload,
    PoolSpec,
    SWAPoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.steering import Steer
from kvcheck.strategies.limits import fit_spec, pool_spec_limits_of, within_target_limits
from kvcheck.strategies.malformed_calls import BadCall
from kvcheck.strategies.ops import value_bytes
from kvcheck.surface import surface_of
from kvcheck.swa_machine import swa_skip_reason
from kvcheck.targets.tier_support import (
    allocator_page_sizes,
    allocator_skip_reason,
    build_allocator,
    build_host_pool,
    host_pool_skip_reason,
)
from kvcheck.tiers import AllocatorSpec, HostPoolSpec
from kvcheck.vocabulary import ModelConfig

#: The smallest DSA model Hypothesis draws (one layer, DeepSeek's latent geometry).
DSA_1L = ModelConfig(
    name="generated-dsa-1l",
    attention_arch="dsa",
    num_hidden_layers=1,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,
    index_topk=2048,
)


# --- K1: the skip rule ----------------------------------------------------------------------


def _dsa_namespace(**fields: int) -> SimpleNamespace:
    """A one-layer DSA config as Hypothesis draws invalid ones (read with getattr)."""
    return SimpleNamespace(
        name="generated-dsa-1l",
        attention_arch="dsa",
        num_hidden_layers=1,
        num_attention_heads=1,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_head_dim=128,
        index_topk=2048,
        **fields,
    )


@pytest.mark.kvcheck_needs("skip_rule")
@pytest.mark.parametrize(
    "fields",
    [
        {"cli_factor": 0},
        {"index_topk_freq": 0},
        {"index_topk_freq": 1, "index_skip_topk_offset": 0},
    ],
    ids=["cli_factor-0", "index_topk_freq-0", "index_skip_topk_offset-0"],
)
def test_k1_invalid_skip_fields_raise_value_error(
    kvcheck_target: Any, fields: dict[str, int]
) -> None:
    """K1: a skip-topk field <= 0 that decides a layer is a ValueError, not an assertion."""
    assert check_skip_rule(kvcheck_target, _dsa_namespace(**fields)) is None


# --- C3, C4: the configurator --------------------------------------------------------------


@pytest.mark.kvcheck_needs("configurator")
def test_c3_capacity_leaves_room_for_the_padding_page(kvcheck_target: Any) -> None:
    """C3: a budget of two MLA tokens' bytes holds one token plus the padding page."""
    model = ModelConfig(
        name="generated-mla-1l",
        attention_arch="mla",
        num_hidden_layers=1,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
    )
    found = check_capacity_fits_budget(kvcheck_target, model, 2304, dtype="bfloat16", page_size=1)
    assert found.max_total_num_tokens == 1


@pytest.mark.kvcheck_needs("configurator")
def test_c4_fp8_dsa_with_a_narrow_latent_is_refused_with_value_error(kvcheck_target: Any) -> None:
    """C4: an fp8 DSA model whose kv_lora_rank is not a multiple of 128 has no scaled latent
    row; sizing it raises ValueError (as sglang's own quantizer does), not an assertion."""
    model = replace(DSA_1L, kv_lora_rank=64)
    assert check_cell_size(kvcheck_target, model, dtype="float8_e4m3fn", is_draft=False) is None


# --- N1-N3: the no-op pool ------------------------------------------------------------------

NOOP_1 = PoolSpec(family="noop", size=1, page_size=1, layer_num=1, dtype="bfloat16", head_dim=1)
#: One DSA layer with index-K, two pages of two tokens (moved to the target's page size).
DSA_1 = PoolSpec(
    family="dsa",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=1,
    qk_rope_head_dim=1,
)


@pytest.mark.kvcheck_needs("noop_pool")
def test_n1_noop_load_cpu_copy_raises(kvcheck_target: Any, kvcheck_device: str) -> None:
    """N1: reloading a host copy into the no-op pool is a write, so it raises RuntimeError."""
    pool = kvcheck_target.make_pool(NOOP_1, device=kvcheck_device)
    empty = torch.tensor([], dtype=torch.int64, device=kvcheck_device)
    assert_noop_write_raises(pool, "load_cpu_copy", (None, empty), {})
    assert pool.size == NOOP_1.size


@pytest.mark.kvcheck_needs("noop_pool", "host_copy")
def test_n3_noop_host_copy_of_any_slot_succeeds(kvcheck_target: Any, kvcheck_device: str) -> None:
    """N3: a host copy of a slot beyond the placeholder page is not an error on a no-op pool."""
    pool = kvcheck_target.make_pool(NOOP_1, device=kvcheck_device)
    accepted = apply_op_like_reference(
        kvcheck_target,
        pool,
        ReferencePool(NOOP_1),
        HostCopy(name="copy0", indices=(0, 1)),
        device=kvcheck_device,
        copies={},
    )
    assert accepted


def within_surface(target: Any, spec: PoolSpec) -> PoolSpec:
    """``spec`` with each field the target's surface narrows set to its first accepted value
    (layout facts of the installed release, such as ``kv_page_padding``)."""
    limits = pool_spec_limits_of(target).get(spec.family, {})
    outside = {
        name: values[0] for name, values in limits.items() if getattr(spec, name) not in values
    }
    return fit_spec(spec, **outside) if outside else spec


@pytest.mark.kvcheck_needs("mha_pool")
def test_a1_reported_bytes_include_the_fused_padding(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """A1: an MHA pool of 3 tokens in 2-token pages (K and V heads alike, so fused where the
    release fuses them) holds 3 pages per K and V half; get_kv_size_bytes and mem_usage must
    report all of them (a release that allocates K and V unpadded reports what it holds)."""
    spec = PoolSpec(family="mha", size=3, page_size=2, layer_num=1, dtype="bfloat16", head_dim=4)
    spec = within_surface(kvcheck_target, spec)
    assert_accounting(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)


HND = PoolSpec(
    family="mha",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="bfloat16",
    head_num=2,
    head_dim=1,
    kv_layout="hnd",
)


@pytest.mark.kvcheck_needs("mha_pool", "host_copy")
def test_l1_hnd_host_copy_round_trips(kvcheck_target: Any, kvcheck_device: str) -> None:
    """L1: a head-major pool copies one written slot to the host and reloads it elsewhere."""
    rows = (bytes([1, 2, 3, 4]),)
    ops: tuple[Op, ...] = (
        WriteKV(layer_id=0, locs=(3,), k_rows=rows, v_rows=rows),
        HostCopy(name="request", indices=(3,)),
        HostReload(name="request", indices=(4,)),
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, HND, ops)
    assert pool.size == HND.size


@pytest.mark.kvcheck_needs("mha_pool", "contiguous_buf_infos")
def test_l2_hnd_describes_its_pages(kvcheck_target: Any, kvcheck_device: str) -> None:
    """L2: a head-major pool's transfer descriptors describe its page rows."""
    pool = kvcheck_target.make_pool(HND, device=kvcheck_device)
    assert_contiguous_buf_infos(pool, HND)
    assert pool.size == HND.size


@pytest.mark.kvcheck_needs("noop_pool", "contiguous_buf_infos")
def test_n4_noop_describes_its_placeholders(kvcheck_target: Any, kvcheck_device: str) -> None:
    """N4: the no-op pool's transfer descriptors describe the placeholders it holds."""
    pool = kvcheck_target.make_pool(NOOP_1, device=kvcheck_device)
    assert_contiguous_buf_infos(pool, NOOP_1)
    assert pool.size == NOOP_1.size


@pytest.mark.kvcheck_needs("noop_pool", "prefix_valid_write")
def test_n5_noop_prefix_valid_write_raises(kvcheck_target: Any, kvcheck_device: str) -> None:
    """N5: a prefix-valid write to the no-op pool raises, even one that commits nothing."""
    pool = kvcheck_target.make_pool(NOOP_1, device=kvcheck_device)
    grid = torch.tensor([[0]], device=kvcheck_device)
    commits = torch.tensor([0], dtype=torch.int32, device=kvcheck_device)
    rows = torch.zeros((1, 1, 1), dtype=torch.bfloat16, device=kvcheck_device)
    assert_noop_write_raises(
        pool,
        "set_kv_buffer_prefix_valid",
        (SimpleNamespace(layer_id=0), grid, commits, rows, rows),
        {},
    )
    assert pool.size == NOOP_1.size


def _run_ops(target: Any, device: str, spec: PoolSpec, ops: tuple[Op, ...]) -> Any:
    """Apply ``ops`` as the state machine does and check the state after each one."""
    pool = target.make_pool(spec, device=device)
    reference = ReferencePool(spec)
    copies: dict[str, Any] = {}
    for op in ops:
        apply_op_like_reference(target, pool, reference, op, device=device, copies=copies)
        assert_pool_matches_reference(pool, reference, call=describe_op(op), method=op_method(op))
    return pool


@pytest.mark.kvcheck_needs("mha_pool", "cast_write")
def test_w1_scaled_write_leaves_the_callers_tensor(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """W1: a bf16 write into an fp8 pool with k_scale=2 stores the halved values and does
    not change the caller's tensor (sglang divides it in place)."""
    spec = PoolSpec(
        family="mha", size=2, page_size=1, layer_num=1, dtype="float8_e4m3fn", head_dim=1
    )
    one, half = value_bytes(1.0, "bfloat16"), value_bytes(0.5, "float8_e4m3fn")
    payload = Payload(dtype="bfloat16", k_rows=(one,), v_rows=(one,), k_scale=2.0, v_scale=2.0)
    write = WriteKV(layer_id=0, locs=(1,), k_rows=(half,), v_rows=(half,), payload=payload)
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, (write,))
    assert pool.size == spec.size


@pytest.mark.kvcheck_needs("mla_pool", "mla_write")
def test_m1_mla_write_to_the_padding_slot_lands(kvcheck_target: Any, kvcheck_device: str) -> None:
    """M1: set_mla_kv_buffer to slot 0 writes it, as set_kv_buffer does."""
    spec = PoolSpec(
        family="mla",
        size=2,
        page_size=1,
        layer_num=1,
        dtype="bfloat16",
        kv_lora_rank=1,
        qk_rope_head_dim=1,
    )
    write = WriteMLA(layer_id=0, locs=(0,), nope_rows=(b"\x80?",), rope_rows=(b"\x80?",))
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, (write,))
    assert pool.size == spec.size


@pytest.mark.kvcheck_needs("dsa_pool", "host_copy", "index_k_write")
def test_h1_partial_page_reload_leaves_the_pages_other_tokens(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """H1: a request of one token (a partial page) copied and reloaded into another page
    writes that token's index key only; the page's other tokens keep theirs."""
    spec = fit_spec(DSA_1, page_size=kvcheck_target_dsa_page(kvcheck_target))
    page = spec.page_size
    keys = (bytes([7]) * 128,)
    scales = (bytes([1, 2, 3, 4]),)
    ops: tuple[Op, ...] = (
        WriteIndexK(layer_id=0, locs=(0,), key_rows=keys, scale_rows=scales),
        WriteIndexK(layer_id=0, locs=(page + 1,), key_rows=keys, scale_rows=scales),
        HostCopy(name="request", indices=(0,)),
        HostReload(name="request", indices=(page,)),
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, ops)
    assert pool.size == spec.size


# --- T1-T3: the DSA index kpool and its compress tails ----------------------------------------

KPOOL = PoolSpec(
    family="dsa",
    size=4,
    page_size=4,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=1,
    qk_rope_head_dim=1,
    index_kpool=2,
    index_kpool_compress=True,
    max_running_requests=1,
)
TAIL_ROWS = (bytes([1, 63]) * 128,)


def kpool_spec(target: Any) -> PoolSpec:
    """:data:`KPOOL` with the index page size the target accepts (sglang: 64, so 128-token
    pages), else 2; skips, saying why, where the target builds no kpool (sglang 0.5.21)."""
    limits = pool_spec_limits_of(target).get("dsa", {})
    if KPOOL.index_kpool not in limits.get("index_kpool", (KPOOL.index_kpool,)):
        why = surface_of(target).note("dsa", "index_kpool") or "its surface declares none"
        pytest.skip(f"the target builds no DSA index kpool above 1 ({why})")
    page = limits.get("index_page_size", (2,))[0]
    return fit_spec(KPOOL, index_page_size=page)


@pytest.mark.kvcheck_needs("dsa_pool", "move")
def test_t1_kpool_move_is_refused_whole(kvcheck_target: Any, kvcheck_device: str) -> None:
    """T1: a move on a kpool pool (pooled index keys cannot follow single tokens) is refused
    with ValueError before anything changes: the written latent row stays where it was."""
    spec = kpool_spec(kvcheck_target)
    ops: tuple[Op, ...] = (
        WriteKV(layer_id=0, locs=(1,), k_rows=(bytes([1, 2, 3, 4]),)),
        Move(tgt=(2,), src=(1,)),
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, ops)
    assert pool.size == spec.size


@pytest.mark.kvcheck_needs("dsa_pool", "compress_tail")
def test_t2_reported_bytes_include_the_compress_tails(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """T2: get_kv_size_bytes and mem_usage of a pool with compress tails count them."""
    spec = kpool_spec(kvcheck_target)
    assert_accounting(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)


@pytest.mark.kvcheck_needs("dsa_pool", "compress_tail", "host_copy")
def test_t3_tail_host_copy_survives_later_tail_writes(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """T3: a request's tails copied to the host, overwritten in the pool and reloaded come
    back as they were copied (the copy holds no view of the pool)."""
    spec = kpool_spec(kvcheck_target)
    later = (bytes([2, 64]) * 128,)
    ops: tuple[Op, ...] = (
        WriteCompressTail(layer_id=0, req_pool_idx=1, key_rows=TAIL_ROWS, score_rows=TAIL_ROWS),
        HostCopy(name="request", indices=(0, 1), req_pool_index=1),
        WriteCompressTail(layer_id=0, req_pool_idx=1, key_rows=later, score_rows=later),
        HostReload(name="request", indices=(0, 1), req_pool_index=1),
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, ops)
    reference = ReferencePool(spec)
    for op in ops:
        reference.apply(op)
    assert_compress_tails_match_reference(pool, reference, call="the reload")


# --- X1, D21: DSA index keys before sglang 0.5.23 ---------------------------------------------

#: Three 64-token pages of one DSA layer with index keys (64: the page sglang asserts).
DSA_64 = PoolSpec(
    family="dsa",
    size=128,
    page_size=64,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=1,
    qk_rope_head_dim=1,
)
KEY_1 = WriteIndexK(layer_id=0, locs=(1,), key_rows=(bytes(range(128)),), scale_rows=(bytes(4),))


@pytest.mark.kvcheck_needs("dsa_pool", "index_k_write", "move")
def test_x1_dsa_move_carries_one_tokens_index_key(kvcheck_target: Any, kvcheck_device: str) -> None:
    """X1: moving token 1 to token 2 (both in page 0) carries token 1's index key to token
    2 and leaves every other page's keys alone."""
    ops = (KEY_1, Move(tgt=(2,), src=(1,)))
    pool = _run_ops(kvcheck_target, kvcheck_device, DSA_64, ops)
    assert pool.size == DSA_64.size


@pytest.mark.kvcheck_needs("dsa_pool", "index_k_write")
def test_d21_dcp_index_buffer_holds_every_widened_id(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """D21: rank 0 of --dcp-size 2 with the default index-K buffer keeps a key for each of
    the (64 + 64) * 2 widened ids writes carry (the index keys are not split by rank)."""
    spec = replace(DSA_64, size=64, dcp_size=2, dcp_rank=0)
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_pool_matches_reference(pool, ReferencePool(spec), call="pool construction")


# --- PV1: prefix-valid writes on a platform without CUDA --------------------------------------


@pytest.mark.kvcheck_needs("mha_pool", "prefix_valid_write")
def test_pv1_fp8_prefix_valid_write_stores_the_rows(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """PV1: an fp8 pool's prefix-valid write stores the fp8 rows it is given, byte for byte
    (converted once, not twice: 0.5 stays 0.5)."""
    spec = within_surface(
        kvcheck_target,
        PoolSpec(family="mha", size=4, page_size=1, layer_num=1, dtype="float8_e4m3fn", head_dim=2),
    )
    row = value_bytes(0.5, "float8_e4m3fn") + value_bytes(-2.0, "float8_e4m3fn")
    write = WritePrefixValid(
        layer_id=0, loc_grid=((1,),), commit_lens=(1,), k_rows=(row,), v_rows=(row,)
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, spec, (write,))
    assert pool.size == spec.size


@pytest.mark.kvcheck_needs("mha_pool", "prefix_valid_write")
@pytest.mark.parametrize(
    ("kv_quant", "dtype"),
    [("cpu_fp8", "float8_e4m3fn"), ("fp4_mx_block16", "float4_e2m1fn_x2")],
    ids=["cpu_fp8", "fp4_mx_block16"],
)
def test_pv1_quantized_prefix_valid_write_stores_the_rows(
    kvcheck_target: Any, kvcheck_device: str, kv_quant: str, dtype: str
) -> None:
    """PV1: a quant-method MHA pool's prefix-valid write of bf16 rows stores them
    quantized, as set_kv_buffer does (no early conversion to the pool dtype)."""
    spec = PoolSpec(family="mha", size=4, page_size=1, layer_num=1, dtype=dtype,
                    kv_quant=kv_quant, head_dim=16)  # fmt: skip
    taken = pool_spec_limits_of(kvcheck_target).get("mha", {}).get("kv_quant")
    if taken is not None and kv_quant not in taken:
        pytest.skip(f"the target builds no {spec.variant} pool")
    row = value_bytes(1.0, "bfloat16") * 16
    write = WritePrefixValid(
        layer_id=0,
        loc_grid=((1,),),
        commit_lens=(1,),
        k_rows=(row,),
        v_rows=(row,),
        dtype="bfloat16",
    )
    _run_ops(kvcheck_target, kvcheck_device, spec, (write,))


# --- R1-R2: decode context parallel --------------------------------------------------------

#: Rank 1 of --dcp-size 2: widened ids 0..11; the odd ones are this rank's rows 0..5.
DCP_MLA = PoolSpec(
    family="mla",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
    dcp_size=2,
    dcp_rank=1,
)


@pytest.mark.kvcheck_needs("mla_pool")
def test_r1_set_kv_buffer_under_dcp_is_refused_with_an_error(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """R1: set_kv_buffer, which has no DCP-aware path, raises RuntimeError (an error that
    ``python -O`` keeps), and the pool is unchanged."""
    write = WriteKV(layer_id=0, locs=(1,), k_rows=(bytes(range(6)),))
    pool = _run_ops(kvcheck_target, kvcheck_device, DCP_MLA, (write,))
    assert pool.size == DCP_MLA.size


@pytest.mark.kvcheck_needs("mla_pool", "mla_write", "move")
def test_r2_move_under_dcp_takes_widened_ids(kvcheck_target: Any, kvcheck_device: str) -> None:
    """R2: widened id 3 written by set_mla_kv_buffer lands in rank 1's row 1; a move of
    widened id 3 to widened id 5 (both rank 1's) carries it to row 2, as the write and
    the host copies would address it."""
    write = WriteMLA(
        layer_id=0, locs=(3,), nope_rows=(bytes([1, 2, 3, 4]),), rope_rows=(bytes([5, 6]),)
    )
    pool = _run_ops(kvcheck_target, kvcheck_device, DCP_MLA, (write, Move(tgt=(5,), src=(3,))))
    assert pool.size == DCP_MLA.size


# --- I1-I10: bad input gets a ValueError, never silent corruption --------------------------

SPECS = {
    "mha": PoolSpec(family="mha", size=1, page_size=1, layer_num=1, dtype="bfloat16", head_dim=1),
    "mla": PoolSpec(
        family="mla",
        size=1,
        page_size=1,
        layer_num=1,
        dtype="bfloat16",
        kv_lora_rank=1,
        qk_rope_head_dim=1,
    ),
    # 64-token pages: the only DSA page size the checked sglang releases build.
    "dsa": PoolSpec(
        family="dsa",
        size=64,
        page_size=64,
        layer_num=1,
        dtype="bfloat16",
        kv_lora_rank=1,
        qk_rope_head_dim=1,
    ),
}
ROW = {"mha": b"\x00\x3c", "mla": b"\x00\x3c\x00\x40", "dsa": b"\x00\x3c\x00\x40"}


@dataclass(frozen=True)
class BadOp:
    """Setup operations that succeed, then one the reference rejects with ValueError."""

    family: str
    setup: tuple[Op, ...]
    op: Op
    spec_changes: tuple[tuple[str, Any], ...] = ()


def _write(family: str, locs: tuple[int, ...], layer_id: int = 0, k_row: bytes = b"") -> WriteKV:
    row = k_row or ROW[family]
    v_rows = (ROW["mha"],) * len(locs) if family == "mha" else ()
    return WriteKV(layer_id=layer_id, locs=locs, k_rows=(row,) * len(locs), v_rows=v_rows)


def _bad_ops() -> dict[str, BadOp]:
    cases: dict[str, BadOp] = {}
    for family in ("mha", "mla", "dsa"):
        slots = SPECS[family].num_slots
        cases |= {
            f"i1-repeated-write-loc-{family}": BadOp(family, (), _write(family, (0, 0))),
            f"i2-repeated-move-target-{family}": BadOp(family, (), Move(tgt=(0, 0), src=(0, 0))),
            f"i3-negative-write-loc-{family}": BadOp(family, (), _write(family, (-1,))),
            f"i4-write-loc-past-the-end-{family}": BadOp(family, (), _write(family, (slots,))),
            f"i4-move-target-past-the-end-{family}": BadOp(
                family, (), Move(tgt=(slots,), src=(0,))
            ),
            f"i5-layer-past-the-end-{family}": BadOp(family, (), _write(family, (0,), 1)),
            f"i6-row-of-the-wrong-width-{family}": BadOp(
                family, (), _write(family, (0,), k_row=ROW[family] * 2)
            ),
            f"i7-move-lengths-differ-{family}": BadOp(family, (), Move(tgt=(0,), src=(0, 0))),
        }
    for family in ("mha", "mla"):
        cases[f"i8-reload-more-than-copied-{family}"] = BadOp(
            family,
            (HostCopy(name="copy1", indices=(0,)),),
            HostReload(name="copy1", indices=(0, 1)),
        )
    cases["i10-index-k-write-to-a-skip-layer-dsa"] = BadOp(
        "dsa",
        (),
        WriteIndexK(layer_id=0, locs=(0,), key_rows=(b"\x01" * 128,), scale_rows=(b"\x00" * 4,)),
        spec_changes=(("skip_topk_layers", (True,)),),
    )
    return cases


BAD_OPS = _bad_ops()


def _needs(case: BadOp) -> list[str]:
    # Not "input_validation": these cases pin that very capability's absence (I1-I10), so
    # they must run, as strict expected failures, on a target that declares it missing.
    needs = [f"{case.family}_pool"]
    ops = (*case.setup, case.op)
    if any(isinstance(op, Move) for op in ops):
        needs.append("move")
    if any(isinstance(op, HostCopy | HostReload) for op in ops):
        needs.append("host_copy")
    if any(isinstance(op, WriteIndexK) for op in ops):
        needs.append("index_k_write")
    return needs


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=name, marks=pytest.mark.kvcheck_needs(*_needs(case)))
        for name, case in BAD_OPS.items()
    ],
)
def test_i_bad_operation_is_rejected(kvcheck_target: Any, kvcheck_device: str, case: BadOp) -> None:
    """I1-I8, I10: each malformed operation raises ValueError, as the reference does."""
    spec = replace(SPECS[case.family], **dict(case.spec_changes))
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    reference = ReferencePool(spec)
    copies: dict[str, Any] = {}
    for op in case.setup:
        assert apply_op_like_reference(
            kvcheck_target, pool, reference, op, device=kvcheck_device, copies=copies
        )
    assert reference.expected_error(case.op) is ValueError
    accepted = apply_op_like_reference(
        kvcheck_target, pool, reference, case.op, device=kvcheck_device, copies=copies
    )
    assert not accepted


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.kvcheck_needs(f"{family}_pool"))
        for family in ("mha", "mla", "dsa")
    ],
)
def test_i9_float_location_is_rejected(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """I9: a float location tensor raises ValueError and leaves the pool unchanged."""
    spec = SPECS[family]
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    width = (1, 2) if family != "mha" else (1, 1)
    k = torch.ones((1, *width), dtype=torch.bfloat16, device=kvcheck_device)
    v = (
        torch.ones((1, 1, 1), dtype=torch.bfloat16, device=kvcheck_device)
        if family == "mha"
        else None
    )
    loc = torch.tensor([0.0], device=kvcheck_device)
    call = PoolCall("set_kv_buffer", (SimpleNamespace(layer_id=0), loc, k, v))
    assert_rejected_call_changes_nothing(kvcheck_target, pool, BadCall("loc_float", call))


def kvcheck_target_dsa_page(target: Any) -> int:
    """The DSA page size (of index kpool 1) the target accepts (sglang: 64), else 2."""
    limits = pool_spec_limits_of(target).get("dsa", {})
    return int(limits.get("page_size", limits.get("index_page_size", (2,)))[0])


# --- S1, S2: the sliding-window allocator ---------------------------------------------------


def _allocator(target: Any, device: str, spec: AllocatorSpec) -> Any:
    """The target's allocator of ``spec`` (the test skips, saying why, where the target builds
    no such allocator, or none at its page size)."""
    reason = allocator_skip_reason(target, spec.kind)
    if reason is not None:
        pytest.skip(reason)
    page_sizes = allocator_page_sizes(target, spec.kind)
    if page_sizes is not None and spec.page_size not in page_sizes:
        pytest.skip(
            f"target {target.name!r} builds {spec.kind} allocators at page_size in "
            f"{page_sizes} only"
        )
    return build_allocator(target, spec, device=device)


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_s1_refused_swa_decode_changes_nothing(kvcheck_target: Any, kvcheck_device: str) -> None:
    """S1: a decode the sliding-window side cannot serve is refused and takes no full-side page."""
    spec = AllocatorSpec(kind="swa", size=16, page_size=4, size_swa=8)
    allocator = _allocator(kvcheck_target, kvcheck_device, spec)
    reference = ReferenceAllocator(spec)
    request = Request(0, 8, -1)
    out = allocator.alloc_extend(_ids(0), _ids(0), _ids(8), _ids(8), _ids(-1), 8)
    slots = [int(x) for x in out.tolist()]
    peers = [int(x) for x in allocator.translate_loc_from_full_to_swa(out).tolist()]
    assert not reference.grow("alloc_extend", [request], slots, peers)
    decode = Request(8, 9, slots[-1])
    before = allocator_sizes(allocator, spec)
    refused = allocator.alloc_decode(_ids(9), _ids(9), _ids(slots[-1])) is None
    assert_refusal(
        refused,
        reference.refuses_pages(reference.new_pages([decode])),
        before=before,
        allocator=allocator,
        call="alloc_decode(seq_lens=[9])",
        spec=spec,
    )


def test_s2_page1_swa_free_after_window_free_keeps_the_padding_slot(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """S2: free() of a request whose window was freed releases no sliding-window slot twice."""
    spec = AllocatorSpec(kind="swa", size=16, page_size=1, size_swa=16)
    allocator = _allocator(kvcheck_target, kvcheck_device, spec)
    reference = ReferenceAllocator(spec)
    for need in (12, 2):
        out = allocator.alloc(need)
        peers = [int(x) for x in allocator.translate_loc_from_full_to_swa(out).tolist()]
        assert not reference.alloc(need, [int(x) for x in out.tolist()], peers)
    row = [int(x) for x in out.tolist()]
    allocator.free_swa(torch.tensor(row))
    reference.free_swa(row)
    allocator.free(torch.tensor(row))
    reference.free(row)
    assert_allocator_state(allocator, reference, call=f"free({row})")


# --- M2: the linear-attention hybrid's request pool -----------------------------------------


def test_m2_alloc_refused_for_a_mamba_slot_takes_no_row(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """M2: with its only mamba slot held, the request pool refuses a request and takes no row."""
    reason = linear_hybrid_skip_reason(kvcheck_target)
    if reason is not None:
        pytest.skip(reason)
    spec = LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0,), rows=3, mamba_size=1)
    _kv_pool, req_pool = kvcheck_target.make_linear_hybrid(spec, device=kvcheck_device)
    held = SimpleNamespace(
        rid="held",
        kv=SimpleNamespace(
            req_pool_idx=None,
            mamba_pool_idx=None,
            kv_allocated_len=0,
            holds_kv=False,
            holds_mamba=False,
            mamba_ping_pong_track_buffer=None,
        ),
    )
    assert req_pool.alloc([held]) is not None
    assert_alloc_refusal_changes_nothing(req_pool)


# --- PD1: a DSA model's sliding-window hybrid ----------------------------------------------


def _dsa_swa_hybrid(target: Any, device: str) -> Any:
    """A DSA model's sliding-window hybrid, a full layer then a window layer, inside the
    target's surface (sglang's DSA pools: 64-token index pages)."""
    return _mla_swa_hybrid(target, device, "dsa")


def _mla_swa_hybrid(target: Any, device: str, family: str) -> Any:
    """An MLA (``family="mla"``) or DSA model's sliding-window hybrid, a full layer then a
    window layer, inside the target's surface."""
    reason = swa_skip_reason(target, family)
    if reason is not None:
        pytest.skip(reason)
    plain = PoolSpec(
        family=family,
        size=2,
        page_size=1,
        layer_num=2,
        dtype="bfloat16",
        kv_lora_rank=4,
        qk_rope_head_dim=2,
    )
    sub = find(within_target_limits(target, st.just(plain)), bool, settings=settings(database=None))
    spec = SWAPoolSpec(sub, size_swa=sub.size, swa_layers=(False, True))
    return target.make_swa_pool(spec, device=device)


def test_pd1_registration_covers_the_index_keys(kvcheck_target: Any, kvcheck_device: str) -> None:
    """PD1: what PD registers for a DSA model's sliding-window hybrid covers the full side's
    index keys."""
    pool = _dsa_swa_hybrid(kvcheck_target, kvcheck_device)
    register = getattr(kvcheck_target, "pd_registration", None)
    if register is None:
        pytest.skip(f"target {kvcheck_target.name!r} declares no pd_registration")
    census = take_census(pool, declared=KNOWN_ROLES)
    assert_registration_covers_census(register(pool), census=census, family="swa:dsa")


def test_pd1_descriptions_cover_the_index_keys(kvcheck_target: Any, kvcheck_device: str) -> None:
    """PD1 in the hybrid's own transfer descriptions: its get_*buf_infos cover the full
    side's index keys."""
    pool = _dsa_swa_hybrid(kvcheck_target, kvcheck_device)
    census = take_census(pool, declared=KNOWN_ROLES)
    assert_descriptions_cover_census(pool, census=census, family="swa:dsa")


# --- HS1: HiCache for an MLA model's sliding-window hybrid ----------------------------------


@pytest.mark.parametrize("family", ["mla", "dsa"])
def test_hs1_hicache_assembles_an_mla_sliding_window_hybrid(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """HS1: the HiCache host pool group for a sliding-window hybrid with MLA (or DSA) sides
    is built and leaves out no host pool its sides declare."""
    assemble = getattr(kvcheck_target, "hicache_assembly", None)
    if assemble is None:
        pytest.skip(f"target {kvcheck_target.name!r} declares no hicache_assembly")
    pool = _mla_swa_hybrid(kvcheck_target, kvcheck_device, family)
    assert_hicache_assembly_whole(assemble, pool, family=f"swa:{family}")


# --- QS1: QSA's hybrid pool ------------------------------------------------------------------


def test_qs1_a_request_copy_restores_the_qsa_index_state(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """QS1: a request copy of a QSA hybrid's page restores its compressed keys and the
    request's pending ring, as it restores the page's KV."""
    make = getattr(kvcheck_target, "make_qsa_hybrid", None)
    if make is None:
        pytest.skip(f"target {kvcheck_target.name!r} builds no QSA hybrid (make_qsa_hybrid)")
    spec = LinearHybridSpec(
        full_layer_ids=(1,), mamba_layer_ids=(0,), size=16, page_size=4, rows=4, mamba_size=4
    )
    kv_pool, _req_pool = make(spec, device=kvcheck_device)
    census = take_census(kv_pool, declared=KNOWN_ROLES)
    assert_host_copy_restores_census(kv_pool, [1], census=census, req_pool_index=1, family="qsa")


# --- B1-B4: host pools --------------------------------------------------------------------


def _host_parts(target: Any, device: str, spec: HostPoolSpec) -> tuple[Any, ...]:
    reason = host_pool_skip_reason(target, spec.kind, spec.layout)
    if reason is not None:
        pytest.skip(reason)
    pool = target.make_pool(spec.device, device=device)
    return build_host_pool(target, spec, pool, device=device)


#: The smallest DSA pool sglang builds (64-token index pages) with a 4-byte latent row.
DSA_HOST_DEVICE = PoolSpec(
    family="dsa",
    size=64,
    page_size=64,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=1,
    qk_rope_head_dim=1,
    index_head_dim=128,
)


@pytest.mark.kvcheck_needs("dsa_pool")
def test_b1_dsa_index_host_holds_what_it_declares(kvcheck_target: Any, kvcheck_device: str) -> None:
    """B1: the index-K host pool holds host size * get_size_per_token() bytes, no more."""
    spec = HostPoolSpec(
        device=DSA_HOST_DEVICE, layout="layer_first", io_backend="direct", host_pages=1
    )
    parts = _host_parts(kvcheck_target, kvcheck_device, spec)
    assert_host_buffer_infos(parts, ReferenceHostPool(spec), spec=spec)


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f) for f in ("mla", "dsa")],
)
def test_b2_latent_host_page_first_describes_its_layers(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """B2: a page_first latent host pool's transfer descriptors tile its buffer, layer by layer."""
    if family == "mla":
        device = PoolSpec(
            family="mla",
            size=8,
            page_size=4,
            layer_num=2,
            dtype="bfloat16",
            kv_lora_rank=2,
            qk_rope_head_dim=2,
        )
    else:
        device = replace(DSA_HOST_DEVICE, layer_num=2, kv_lora_rank=2, qk_rope_head_dim=2)
    spec = HostPoolSpec(device=device, layout="page_first", io_backend="kernel", host_pages=2)
    parts = _host_parts(kvcheck_target, kvcheck_device, spec)
    assert_host_buffer_infos(parts[:1], ReferenceHostPool(spec), spec=spec)


@pytest.mark.kvcheck_needs("dsa_pool")
def test_b3_dsa_index_host_layer_first_describes_its_pages(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """B3: the index-K host pool in layer_first answers get_page_buffer_meta for its pages."""
    spec = HostPoolSpec(
        device=DSA_HOST_DEVICE, layout="layer_first", io_backend="direct", host_pages=1
    )
    parts = _host_parts(kvcheck_target, kvcheck_device, spec)
    steer = {Steer("host:indexer_bytes_held", "dsa")}  # B1 shows first otherwise
    assert_host_buffer_infos(parts, ReferenceHostPool(spec), spec=spec, steer=steer)


@pytest.mark.kvcheck_needs("dsa_pool")
def test_b4_dsa_index_host_keeps_only_the_top_k_layers(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """B4: under a pool whose second layer reuses the first's top-k (a zero-row index
    buffer), the index-K host pool keeps and counts the first layer's keys only."""
    device = replace(DSA_HOST_DEVICE, layer_num=2, skip_topk_layers=(False, True))
    spec = HostPoolSpec(device=device, layout="layer_first", io_backend="direct", host_pages=1)
    parts = _host_parts(kvcheck_target, kvcheck_device, spec)
    # B1 and B3 show in layer_first otherwise.
    steer = {
        Steer("host:indexer_bytes_held", "dsa"),
        Steer("host:indexer_layer_first_page_meta", "dsa"),
    }
    assert_host_buffer_infos(parts, ReferenceHostPool(spec), spec=spec, steer=steer)


# --- Q2-Q11: quantized pools ---------------------------------------------------------------

MLA_FP4 = PoolSpec(
    family="mla",
    size=2,
    page_size=1,
    layer_num=1,
    dtype="float4_e2m1fn_x2",
    kv_quant="fp4",
    kv_lora_rank=16,
    qk_rope_head_dim=16,
)
#: One bf16 latent row of 1.0s: block scale byte 125 (2^-2) on every block, never 0.
ONES_ROW = value_bytes(1.0, "bfloat16") * 32
WRITE_FP4 = WriteKV(
    layer_id=0,
    locs=(1,),
    k_rows=(),
    v_rows=(),
    payload=Payload(dtype="bfloat16", k_rows=(ONES_ROW,)),
)


def _built_variant(target: Any, spec: PoolSpec) -> PoolSpec:
    """``spec``, skipping the test for a target whose surface leaves its variant out."""
    taken = pool_spec_limits_of(target).get(spec.family, {}).get("kv_quant")
    if taken is not None and spec.kv_quant not in taken:
        pytest.skip(f"the target builds no {spec.variant} pool")
    return spec


@pytest.mark.kvcheck_needs("mla_pool", "move")
def test_q2_mla_fp4_move_carries_the_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q2: a written MLA FP4 token moved to another slot arrives with its block scales."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    _run_ops(kvcheck_target, kvcheck_device, spec, (WRITE_FP4, Move(tgt=(2,), src=(1,))))


@pytest.mark.kvcheck_needs("mla_pool", "host_copy")
def test_q2_mla_fp4_reload_carries_the_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q2: a written MLA FP4 token copied to the host and reloaded to another slot arrives
    with its block scales."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    ops: tuple[Op, ...] = (
        WRITE_FP4,
        HostCopy(name="token", indices=(1,)),
        HostReload(name="token", indices=(2,)),
    )
    _run_ops(kvcheck_target, kvcheck_device, spec, ops)


@pytest.mark.kvcheck_needs("mla_pool")
def test_q3_mla_fp4_reported_bytes_include_the_scales(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Q3: get_kv_size_bytes and mem_usage of an MLA FP4 pool count kv_scale_buffer."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    assert_accounting(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)


@pytest.mark.kvcheck_needs("mla_pool", "contiguous_buf_infos")
def test_q4_mla_fp4_describes_its_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q4: an MLA FP4 pool describes its scale buffers for transfer (get_kv_scale_buf_infos)."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    assert_scale_buf_infos(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)


#: A one-layer MHA pool of sglang's fp4_mx_block16 quant method: one head of 16 values.
MHA_FP4 = PoolSpec(
    family="mha",
    size=2,
    page_size=1,
    layer_num=1,
    dtype="float4_e2m1fn_x2",
    kv_quant="fp4_mx_block16",
    head_num=1,
    head_dim=16,
)
#: One bf16 K and V row of 1.0s: block scale byte 125 (2^-2), never 0.
WRITE_MHA_FP4 = WriteKV(
    layer_id=0,
    locs=(1,),
    k_rows=(),
    v_rows=(),
    payload=Payload(dtype="bfloat16", k_rows=(ONES_ROW[: 16 * 2],), v_rows=(ONES_ROW[: 16 * 2],)),
)


@pytest.mark.kvcheck_needs("mha_pool", "contiguous_buf_infos")
def test_q4_mha_fp4_describes_its_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q4: an MHA fp4_mx_block16 pool describes its scale buffers for transfer
    (get_kv_scale_buf_infos)."""
    spec = _built_variant(kvcheck_target, MHA_FP4)
    assert_scale_buf_infos(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)


def _assert_pd_registers_census(target: Any, pool: Any, family: str) -> None:
    registration = target.pd_registration(pool)
    assert_registration_covers_census(registration, pool=pool, family=family)


@pytest.mark.kvcheck_needs("mla_pool")
def test_q4_pd_mla_fp4_registers_its_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q4 through PD: setup_state_kv_args registers an MLA FP4 pool's scale buffers."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    _assert_pd_registers_census(kvcheck_target, pool, "mla:fp4")


@pytest.mark.kvcheck_needs("mha_pool")
def test_q4_pd_mha_fp4_registers_its_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q4 through PD: setup_state_kv_args registers an MHA fp4_mx_block16 pool's scales."""
    spec = _built_variant(kvcheck_target, MHA_FP4)
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    _assert_pd_registers_census(kvcheck_target, pool, "mha:fp4_mx_block16")


@pytest.mark.kvcheck_needs("mha_pool")
@pytest.mark.parametrize(
    ("kv_quant", "dtype"),
    [("cpu_fp8", "float8_e4m3fn"), ("fp4_mx_block16", "float4_e2m1fn_x2")],
    ids=["cpu_fp8", "fp4_mx_block16"],
)
def test_q5_quantized_v_is_shaped_by_v_head_dim(
    kvcheck_target: Any, kvcheck_device: str, kv_quant: str, dtype: str
) -> None:
    """Q5: a quant-method MHA pool whose V head dim differs from K's holds V rows (and
    their scales) of v_head_dim values."""
    spec = replace(MHA_FP4, dtype=dtype, kv_quant=kv_quant, v_head_dim=32)
    spec = _built_variant(kvcheck_target, spec)
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_pool_matches_reference(pool, ReferencePool(spec), call="pool construction")


@pytest.mark.kvcheck_needs("mha_pool", "host_copy")
def test_q6_mha_fp4_reload_carries_the_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q6: a written MHA fp4_mx_block16 token copied to the host and reloaded to another
    slot arrives with its block scales."""
    spec = _built_variant(kvcheck_target, MHA_FP4)
    ops: tuple[Op, ...] = (
        WRITE_MHA_FP4,
        HostCopy(name="token", indices=(1,)),
        HostReload(name="token", indices=(2,)),
    )
    _run_ops(kvcheck_target, kvcheck_device, spec, ops)


@pytest.mark.kvcheck_needs("mla_pool")
def test_q11_mla_fp4_value_buffer_is_dequantized(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q11: get_value_buffer of an MLA FP4 pool reads the dequantized latent, as
    get_key_buffer does."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    reference = ReferencePool(spec)
    apply_op_like_reference(
        kvcheck_target, pool, reference, WRITE_FP4, device=kvcheck_device, copies={}
    )
    assert_read_api_matches_reference(pool, reference, call=describe_op(WRITE_FP4))


@pytest.mark.kvcheck_needs("mla_pool")
def test_q12_mla_fp4_write_takes_layer_id_override(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Q12: set_kv_buffer of an MLA FP4 pool names its layer by layer_id_override (layer
    None), as SGLang's SWA pool writes every MLA pool."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    _run_ops(kvcheck_target, kvcheck_device, spec, (replace(WRITE_FP4, override=True),))


@pytest.mark.kvcheck_needs("mla_pool", "mla_write")
def test_q12_mla_fp4_split_write_takes_layer_id_override(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Q12: set_mla_kv_buffer of an MLA FP4 pool takes layer_id_override too."""
    spec = _built_variant(kvcheck_target, MLA_FP4)
    half = ONES_ROW[: len(ONES_ROW) // 2]
    write = WriteMLA(
        layer_id=0, locs=(1,), nope_rows=(half,), rope_rows=(half,), dtype="bfloat16", override=True
    )
    _run_ops(kvcheck_target, kvcheck_device, spec, (write,))


#: sglang's MXFP8 MHA pools: one layer, one head of 128 values on one 128-token page (FA4's
#: interleaved scales), and one head of 32 values on 1-token pages (flat scales).
MXFP8 = PoolSpec(
    family="mha",
    size=128,
    page_size=128,
    layer_num=1,
    dtype="float8_e4m3fn",
    kv_quant="mxfp8",
    head_num=1,
    head_dim=128,
)
MXFP8_FLAT = replace(MXFP8, size=4, page_size=1, head_dim=32)


def _write_mxfp8(spec: PoolSpec, slot: int) -> WriteKV:
    """fp8 rows of 1.0 (byte 0x38) at ``slot`` with e8m0 scales of 2 (byte 128)."""
    row, scales = b"\x38" * spec.head_dim, b"\x80" * (spec.head_dim // 32)
    payload = Payload(
        dtype="float8_e4m3fn",
        k_rows=(row,),
        v_rows=(row,),
        k_scale_rows=(scales,),
        v_scale_rows=(scales,),
    )
    return WriteKV(layer_id=0, locs=(slot,), k_rows=(), v_rows=(), payload=payload)


@pytest.mark.kvcheck_needs("mha_pool")
def test_q13_mxfp8_write_to_slot0_lands(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q13: set_kv_buffer to slot 0 of an MXFP8 pool stores the row and its scales, as
    move_kv_cache and load_cpu_copy store slot 0's payload."""
    spec = _built_variant(kvcheck_target, MXFP8)
    _run_ops(kvcheck_target, kvcheck_device, spec, (_write_mxfp8(spec, 0),))


@pytest.mark.kvcheck_needs("mha_pool", "move")
def test_q13_mxfp8_move_into_slot0_carries_the_scales(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Q13: a written MXFP8 token moved into slot 0 arrives with its scales, as its fp8
    payload does."""
    spec = _built_variant(kvcheck_target, MXFP8)
    ops = (_write_mxfp8(spec, 1), Move(tgt=(0,), src=(1,)))
    _run_ops(kvcheck_target, kvcheck_device, spec, ops)


@pytest.mark.kvcheck_needs("mha_pool")
def test_q14_flat_mxfp8_write_lands(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q14: an MXFP8 pool off 128-token pages (flat scales) stores a write with its scales."""
    spec = _built_variant(kvcheck_target, MXFP8_FLAT)
    _run_ops(kvcheck_target, kvcheck_device, spec, (_write_mxfp8(spec, 1),))


@pytest.mark.kvcheck_needs("mha_pool", "move")
def test_q15_flat_mxfp8_move_carries_the_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q15: a move on a flat-scale MXFP8 pool moves the fp8 rows and their scales."""
    spec = _built_variant(kvcheck_target, MXFP8_FLAT)
    _run_ops(kvcheck_target, kvcheck_device, spec, (Move(tgt=(2,), src=(1,)),))


@pytest.mark.kvcheck_needs("mha_pool", "host_copy")
def test_q15_flat_mxfp8_reload_carries_the_scales(kvcheck_target: Any, kvcheck_device: str) -> None:
    """Q15: a host copy of a flat-scale MXFP8 pool reloads into other slots with its scales."""
    spec = _built_variant(kvcheck_target, MXFP8_FLAT)
    ops: tuple[Op, ...] = (
        HostCopy(name="token", indices=(1,)),
        HostReload(name="token", indices=(2,)),
    )
    _run_ops(kvcheck_target, kvcheck_device, spec, ops)
