"""Proof that the pool-side properties can fail: each catches its broken twin, shrunk small.

Every property of :mod:`kvcheck.properties` (pool side) and every family's state machine
runs here against a pool from ``broken_pools.py`` with one deliberate bug. Each test
requires the property to fail and Hypothesis to shrink the failure to a small example
(few steps, one or two layers), with bounded, derandomized settings and no database.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from broken_pools import (
    AliasedTailCopyDSA,
    AllocatingSkipDSA,
    BrokenTarget,
    DecimalGigabytesMLA,
    EndLayerFromZeroMLA,
    FullSizeNoOp,
    HalfApplyingMHA,
    HalfMoveKpoolDSA,
    HostCopyDropsIndexK,
    LocSortingMHA,
    MoveIgnoresV,
    NarrowIndexDcpDSA,
    OverrideBlindMHA,
    OwnedIndexMoveDcpDSA,
    OwnerBlindDcpMLA,
    PageGranularReloadMHA,
    PageRowMoveDSA,
    PageTableBlindReadDSA,
    PayloadOnlyPrefixValidFP4,
    PayloadOnlyReloadFP4,
    RareCombinationWriteMHA,
    RawWidthScaledDSA,
    RingStartTailDSA,
    RopeDroppingMLA,
    ScaleDividingMHA,
    ScaleLeavingMoveFP4,
    ScaleLeavingMoveMLAFP4,
    ScaleUncountingMLAFP4,
    ScaleUndescribingFP4,
    SequentialMoveMLA,
    ShiftedRowsReadDSA,
    SilentNoOp,
    SilentReloadMovingNoOp,
    SilentReloadNoOp,
    SkipCountingDSA,
    SkipDescribingDSA,
    StaleViewMLA,
    StartLayerBlindReadMHA,
    SwappedBlockScalesDSA,
    SwappedInterleaveMXFP8,
    SwappedScaleReadFP4,
    TokenMajorMoveMHA,
    TokenPageIndexKpoolDSA,
    UncollapsedCopyDcpDSA,
    UncommittedWritingMHA,
    UncountedTailsDSA,
    UnpaddedReportMHA,
    UnrefusedKVWriteDcpMLA,
    UnscaledCastCPUFP8,
    ValidatingMoveNoOp,
    VShapedByKFP4,
    WholeTailItemDSA,
)
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.failures import PropertyFailure
from kvcheck.geometry import latent_row_bytes
from kvcheck.machines import MACHINE_CAPABILITIES, pool_machine
from kvcheck.properties.accounting import (
    assert_accounting,
    assert_compress_tail_buf_infos,
    assert_held_bytes,
    assert_kv_size_bytes,
    assert_mem_usage,
    assert_state_buf_infos,
)
from kvcheck.properties.apply import apply_op, apply_op_like_reference
from kvcheck.properties.inputs import assert_rejected_call_changes_nothing, check_sequence_inputs
from kvcheck.properties.noop import (
    assert_noop_holds_only_placeholders,
    assert_noop_move_changes_nothing,
    assert_noop_write_raises,
)
from kvcheck.properties.pool_state import (
    assert_compress_tails_match_reference,
    assert_pool_matches_reference,
)
from kvcheck.properties.skip_layers import (
    assert_cuda_allocation_matches,
    assert_meta_pool_bytes,
    assert_skip_layers_hold_no_storage,
)
from kvcheck.reference import ReferencePool
from kvcheck.specs import (
    HostCopy,
    HostReload,
    Move,
    Op,
    OpSequence,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
)
from kvcheck.steering import Steer
from kvcheck.strategies import (
    bad_calls,
    noop_move_arguments,
    noop_write_calls,
    op_sequences,
    pool_specs,
)
from kvcheck.suite.test_skip_layers import PRODUCTION_SPECS, dsa_specs
from kvcheck.targets import resolve_target
from kvcheck.targets.findings import Finding, active_findings

#: Bounded and deterministic: find the bug, shrink it, no database, no explanation phase.
TWIN_SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow],
)
MACHINE_SETTINGS = settings(TWIN_SETTINGS, max_examples=300, stateful_step_count=10)
# Hypothesis also draws values from constants found in loaded modules, so the exact
# example depends on what the session imported: the tests bound the shrunk example (the
# minimal one plus one step of slack) rather than pin it.
CPU = "cpu"


def failing(check: Callable[[Any], None]) -> Callable[[Any], bool]:
    """A ``find`` condition: true when ``check`` raises the property's failure."""

    def condition(example: Any) -> bool:
        try:
            check(example)
        except PropertyFailure:
            return True
        return False

    return condition


def shrunk(strategy: st.SearchStrategy[Any], check: Callable[[Any], None]) -> Any:
    """The minimal example on which ``check`` fails (``find`` raises if there is none)."""
    return find(strategy, failing(check), settings=TWIN_SETTINGS)


#: Capabilities the pre-existing machine twins exercise (the rest stay out of their way).
BASIC = frozenset({"move", "host_copy", "index_k_write", "input_validation", "state_buf_infos"})


def small_machine(
    family: str,
    pool_class: type,
    *,
    keep: frozenset[str] = BASIC,
    findings: tuple = (),
    dtype_names: tuple[str, ...] | None = None,
    kv_quants: tuple[str, ...] = ("none",),
    variant: str | None = None,
) -> type:
    """``family``'s machine on the broken pool, checking only the ``keep`` capabilities
    (on pools of ``dtype_names``, default any, of the quantized variants ``kv_quants``, and
    of ``variant`` only when given)."""
    # Pools of at most two layers and two pages keep each shrink step cheap; every bug
    # below shows on such a pool.
    specs = pool_specs(
        families=(family,),
        dtype_names=dtype_names,
        max_layers=2,
        max_size=8,
        max_page_size=4,
        kv_quants=kv_quants,
    )
    if variant is not None:
        specs = specs.filter(lambda spec: spec.variant == variant)
    return pool_machine(
        BrokenTarget(family, pool_class, findings),
        device=CPU,
        family=family,
        specs=specs,
        skip=frozenset(MACHINE_CAPABILITIES) - keep,
        settings=MACHINE_SETTINGS,
    )


def machine_failure(
    family: str,
    pool_class: type,
    *,
    keep: frozenset[str] = BASIC,
    findings: tuple = (),
    dtype_names: tuple[str, ...] | None = None,
    kv_quants: tuple[str, ...] = ("none",),
    variant: str | None = None,
) -> tuple[str, list[str], int]:
    """Run ``family``'s machine on the broken pool; return the failure message, the shrunk
    steps (one line per operation drawn) and the layer count of the shrunk pool."""
    message, notes = machine_report(
        family,
        pool_class,
        keep=keep,
        findings=findings,
        dtype_names=dtype_names,
        kv_quants=kv_quants,
        variant=variant,
    )
    steps = [line for line in notes.splitlines() if line.startswith("Draw ") and "(op)" in line]
    layers = re.search(r"layer_num=(\d+)", notes)
    assert layers is not None, notes
    return message, steps, int(layers.group(1))


def machine_report(
    family: str,
    pool_class: type,
    *,
    keep: frozenset[str] = BASIC,
    findings: tuple = (),
    dtype_names: tuple[str, ...] | None = None,
    kv_quants: tuple[str, ...] = ("none",),
    variant: str | None = None,
) -> tuple[str, str]:
    """Run ``family``'s machine on the broken pool; return the failure message and the notes
    Hypothesis attached (the shrunk example as it is printed)."""
    machine = small_machine(
        family,
        pool_class,
        keep=keep,
        findings=findings,
        dtype_names=dtype_names,
        kv_quants=kv_quants,
        variant=variant,
    )
    with pytest.raises(PropertyFailure) as caught, active_findings(findings):
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
    return str(caught.value), "\n".join(getattr(caught.value, "__notes__", ()))


# --- state machines --------------------------------------------------------------------------


def test_dsa_machine_catches_a_move_that_copies_whole_page_rows() -> None:
    """The seed's bug (index-K rows indexed by token) fails the DSA machine within two ops."""
    message, steps, layers = machine_failure("dsa", PageRowMoveDSA)
    assert "move_kv_cache" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_dsa_machine_catches_a_host_copy_that_drops_index_k() -> None:
    """A reload that restores only the latent rows fails on the index-K buffer."""
    message, steps, layers = machine_failure("dsa", HostCopyDropsIndexK)
    assert "index_k_with_scale_buffer" in message and "load_cpu_copy" in message
    assert len(steps) <= 4 and layers <= 2, steps


def test_mha_machine_catches_a_move_that_ignores_v() -> None:
    """A move of K alone fails on the V buffer, shrunk to about one write and one move; the
    example shows the MHA pool's spec fields only (no latent, DSA or DCP field) and no
    empty rule-flags draw."""
    message, notes = machine_report("mha", MoveIgnoresV)
    assert "v_buffer" in message and "move_kv_cache" in message
    steps = [line for line in notes.splitlines() if line.startswith("Draw ") and "(op)" in line]
    layers = re.search(r"layer_num=(\d+)", notes)
    assert len(steps) <= 3 and layers is not None and int(layers.group(1)) <= 2, notes
    assert "head_dim=" in notes
    for field in ("kv_lora_rank", "index_head_dim", "index_kpool", "dcp_size"):
        assert f"{field}=" not in notes, notes
    assert "FeatureFlags" not in notes and "rule flags" not in notes, notes


def test_mla_machine_catches_a_move_that_scatters_before_it_gathers() -> None:
    """A token-by-token move reads an overwritten source when sources overlap targets."""
    message, steps, layers = machine_failure("mla", SequentialMoveMLA)
    assert "kv_buffer" in message and "move_kv_cache" in message
    assert len(steps) <= 3 and layers <= 2, steps


def test_noop_machine_catches_a_write_that_returns_silently() -> None:
    """A no-op pool accepting a write fails the machine on about that single write."""
    message, steps, layers = machine_failure("noop", SilentNoOp)
    assert "should be RuntimeError" in message
    assert len(steps) <= 2 and layers <= 2, steps


# --- the read path, layer ranges, token-granular host copies, caller tensors ----------------

READS = frozenset({"read_api", "index_k_write"})


def test_machine_catches_a_move_that_ignores_the_head_major_layout() -> None:
    """Moving page rows as token rows fails on a head-major (HND) pool within two ops."""
    message, steps, _ = machine_failure("mha", TokenMajorMoveMHA, variant="mha:hnd")
    assert "move_kv_cache" in message
    assert len(steps) <= 2, steps


def test_machine_catches_a_read_that_ignores_start_layer() -> None:
    """A get_key_buffer that ignores start_layer fails on a pool starting above layer 0."""
    message, steps, layers = machine_failure("mha", StartLayerBlindReadMHA, keep=READS)
    assert "get_key_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_read_that_returns_a_stale_copy() -> None:
    """A read API that hands out a copy made earlier misses the next write."""
    message, steps, layers = machine_failure("mla", StaleViewMLA, keep=READS)
    assert "get_key_buffer" in message and "set_kv_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_index_k_reads_of_the_wrong_rows() -> None:
    """get_index_k_with_scale_buffer with its page rows rolled fails after one index write."""
    message, steps, layers = machine_failure("dsa", ShiftedRowsReadDSA, keep=READS)
    assert "get_index_k_with_scale_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_write_that_ignores_layer_id_override() -> None:
    """A write by layer_id_override that lands on the first layer fails on a two-layer pool."""
    message, steps, layers = machine_failure("mha", OverrideBlindMHA, keep=frozenset())
    assert "layer_id_override=" in message
    assert len(steps) <= 2 and layers == 2, steps


def test_machine_catches_paged_index_reads_that_ignore_the_page_table() -> None:
    """get_index_k_scale_buffer reading pages in order instead of through the page table
    fails once an index key sits on a page the table visits out of order."""
    message, steps, layers = machine_failure("dsa", PageTableBlindReadDSA, keep=READS)
    assert "get_index_k_scale_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_wrong_end_layer() -> None:
    """end_layer counted from layer 0 fails on a pool that starts higher."""
    message, steps, _ = machine_failure("mla", EndLayerFromZeroMLA, keep=frozenset())
    assert "end_layer" in message and not steps


def test_machine_catches_a_reload_that_overwrites_unlisted_tokens() -> None:
    """A page-granular reload of a partial page overwrites a token nobody listed."""
    message, steps, layers = machine_failure(
        "mha", PageGranularReloadMHA, keep=frozenset({"host_copy"})
    )
    assert "load_cpu_copy" in message
    assert len(steps) <= 4 and layers <= 2, steps


def test_machine_catches_a_write_dropped_only_in_a_rare_pool() -> None:
    """kvcheck campaign's twin: a write dropped only by head-major fp8 pools with a V head dim
    of their own above layer 0 fails the MHA machine once it draws such a pool (fp8 here)."""
    message, steps, layers = machine_failure(
        "mha",
        RareCombinationWriteMHA,
        keep=frozenset(),
        dtype_names=("float8_e4m3fn", "float8_e5m2"),
    )
    assert "set_kv_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_write_that_changes_the_callers_tensor() -> None:
    """Sorting the caller's loc in place is caught on valid writes alone."""
    message, steps, layers = machine_failure("mha", LocSortingMHA, keep=frozenset())
    assert "the caller's tensor" in message and "set_kv_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_an_mla_write_that_drops_the_rope_part() -> None:
    """set_mla_kv_buffer that stores only nope fails where set_kv_buffer would not."""
    message, steps, layers = machine_failure("mla", RopeDroppingMLA, keep=frozenset({"mla_write"}))
    assert "set_mla_kv_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


#: The scaled fp8 latent layout is drawn for float8_e4m3fn DSA pools only.
FP8_E4M3 = ("float8_e4m3fn",)


def test_dsa_machine_catches_scaled_rows_with_swapped_block_scales() -> None:
    """A scaled fp8 latent write that stores each block's scale in another block's place
    fails on a two-block row (kv_lora_rank=256) within one write."""
    message, steps, layers = machine_failure(
        "dsa", SwappedBlockScalesDSA, keep=frozenset({"mla_write"}), dtype_names=FP8_E4M3
    )
    assert "set_mla_kv_buffer" in message and "kv_buffer" in message
    # Bytes 256.. of a 256-value row are its scales, where the first difference is.
    assert "rows of [512] bytes" in message and "byte 256 is 0x" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_dsa_machine_catches_scaled_rows_allocated_at_the_raw_width() -> None:
    """A pool asked for scaled fp8 latent rows that allocates the raw width fails the
    accounting of a freshly built pool (scaled rows are 4 bytes per 128 values and one
    more byte per rope value wider)."""
    message, steps, layers = machine_failure(
        "dsa", RawWidthScaledDSA, keep=frozenset(), dtype_names=FP8_E4M3
    )
    # A 128 + 64 raw row where the scaled one is 128 + 4 + 2 * 64 bytes (two slots).
    assert "pool construction" in message and "(2, 260)" in message
    assert not steps and layers == 1, steps


def test_accounting_catches_scaled_rows_allocated_at_the_raw_width() -> None:
    """get_kv_size_bytes of a pool holding raw-width rows where scaled ones were asked for
    fails accounting, shrunk to one scaled layer of one 128-value block."""
    target = BrokenTarget("dsa", RawWidthScaledDSA)

    def check(spec: PoolSpec) -> None:
        assert_kv_size_bytes(target.make_pool(spec, device=CPU), spec)

    specs = pool_specs(families=("dsa",), dtype_names=FP8_E4M3, max_layers=2, max_size=8)
    spec = shrunk(specs, check)
    assert spec.latent_layout == "scaled" and spec.kv_lora_rank == 128
    assert spec.layer_num == 1 and spec.variant == "dsa:scaled"


def test_machine_catches_a_prefix_valid_write_of_uncommitted_cells() -> None:
    """A prefix-valid write that also writes the uncommitted cells is caught."""
    message, steps, layers = machine_failure(
        "mha", UncommittedWritingMHA, keep=frozenset({"prefix_valid_write"})
    )
    assert "set_kv_buffer_prefix_valid" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_scaled_write_that_divides_the_callers_tensor() -> None:
    """SGLang's W1: dividing the caller's payload in place is caught on valid writes."""
    message, steps, layers = machine_failure(
        "mha", ScaleDividingMHA, keep=frozenset({"cast_write"})
    )
    assert "the caller's tensor" in message and "set_kv_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


# --- quantized pools: scales are state -------------------------------------------------------

FP4 = ("fp4_mx_block16",)


def test_machine_catches_a_move_that_leaves_the_scales_behind() -> None:
    """An FP4 MHA move of the payload alone fails on the target's scale buffer, shrunk to a
    write and a move."""
    message, steps, layers = machine_failure("mha", ScaleLeavingMoveFP4, kv_quants=FP4)
    assert "move_kv_cache" in message and "_scale_buffer" in message
    assert len(steps) <= 3 and layers <= 2, steps


def test_mla_machine_catches_a_move_that_leaves_the_scales_behind() -> None:
    """SGLang's Q2 shape: the MLA FP4 move of latent rows without kv_scale_buffer."""
    message, steps, layers = machine_failure("mla", ScaleLeavingMoveMLAFP4, kv_quants=("fp4",))
    assert "move_kv_cache" in message and "kv_scale_buffer" in message
    assert len(steps) <= 3 and layers <= 2, steps


def test_machine_catches_a_reload_that_leaves_the_scales_behind() -> None:
    """SGLang's Q6 shape: a reload of the copied payload without its scales."""
    message, steps, layers = machine_failure("mha", PayloadOnlyReloadFP4, kv_quants=FP4)
    assert "load_cpu_copy" in message and "_scale_buffer" in message
    assert len(steps) <= 4 and layers <= 2, steps


def test_accounting_catches_scales_left_uncounted() -> None:
    """SGLang's Q3 shape: get_kv_size_bytes without the scale buffers fails on a freshly
    built MLA FP4 pool, named as such."""
    message, steps, layers = machine_failure(
        "mla", ScaleUncountingMLAFP4, keep=frozenset(), kv_quants=("fp4",)
    )
    assert "get_kv_size_bytes" in message and "pool construction" in message
    assert not steps and layers == 1, steps
    spec = PoolSpec(family="mla", size=2, page_size=2, layer_num=1, dtype="float4_e2m1fn_x2",
                    kv_quant="fp4", kv_lora_rank=16, qk_rope_head_dim=16)  # fmt: skip
    pool = BrokenTarget("mla", ScaleUncountingMLAFP4).make_pool(spec, device=CPU)
    with pytest.raises(PropertyFailure) as caught:
        assert_kv_size_bytes(pool, spec)
    assert caught.value.signature.kind == "scale buffers unreported"
    assert_kv_size_bytes(pool, spec, scales_counted=False)  # the rest still adds up


def test_machine_catches_scale_buffers_left_undescribed() -> None:
    """SGLang's Q4 shape: transfer descriptors of the payload and none of the scales."""
    message, steps, layers = machine_failure(
        "mha", ScaleUndescribingFP4, keep=frozenset({"contiguous_buf_infos"}), kv_quants=FP4
    )
    assert "get_kv_scale_buf_infos" in message and "pool construction" in message
    assert not steps and layers == 1, steps


def test_machine_catches_interleaved_scales_at_the_wrong_place() -> None:
    """MXFP8 scales written (and read back) at the wrong place of FA4's interleaved page
    fail on the first write of a token whose offset the two layouts map apart."""
    message, steps, layers = machine_failure("mha", SwappedInterleaveMXFP8, kv_quants=("mxfp8",))
    assert "k_scale_buffer" in message or "v_scale_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_quantized_geometry_that_ignores_v_head_dim() -> None:
    """SGLang's Q5 shape: V and its scales shaped by head_dim fail a pool whose V head dim
    differs, at construction."""
    message, steps, layers = machine_failure("mha", VShapedByKFP4, keep=frozenset(), kv_quants=FP4)
    assert "pool construction" in message
    assert not steps and layers == 1, steps


def test_machine_catches_a_cast_write_that_ignores_the_scales() -> None:
    """The CPU fp8 method storing the caller's values undivided fails on a cast write
    that carries a scale."""
    message, steps, layers = machine_failure(
        "mha", UnscaledCastCPUFP8, keep=frozenset({"cast_write"}), kv_quants=("cpu_fp8",)
    )
    assert "set_kv_buffer" in message and "_scale=" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_prefix_valid_write_without_its_scales() -> None:
    """A prefix-valid write that stores the payload and not its scales is caught."""
    message, steps, layers = machine_failure(
        "mha", PayloadOnlyPrefixValidFP4, keep=frozenset({"prefix_valid_write"}), kv_quants=FP4
    )
    assert "set_kv_buffer_prefix_valid" in message and "_scale_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


def test_machine_catches_a_read_dequantized_with_the_wrong_scales() -> None:
    """get_key_buffer dequantizing K with V's scales fails the read-API check."""
    message, steps, layers = machine_failure(
        "mha", SwappedScaleReadFP4, keep=frozenset({"read_api"}), kv_quants=FP4
    )
    assert "get_key_buffer" in message
    assert len(steps) <= 2 and layers <= 2, steps


#: A declared finding for the silent no-op reload (sglang's N1, matched by its failure).
SILENT_RELOAD = Finding(
    "T1",
    "no-op load_cpu_copy returns silently",
    check="raises",
    call="load_cpu_copy",
    family="noop",
)


def test_a_declared_finding_does_not_hide_a_second_bug() -> None:
    """With the silent reload declared, the same machine still fails on the move bug."""
    message, _, _ = machine_failure(
        "noop",
        SilentReloadMovingNoOp,
        keep=frozenset({"host_copy", "move"}),
        findings=(SILENT_RELOAD,),
    )
    assert "move_kv_cache" in message


@pytest.mark.parametrize(
    "steer",
    [frozenset(), frozenset({Steer.step("host_reload", "noop")})],
    ids=["rejected", "steered"],
)
def test_a_declared_finding_alone_passes(steer: frozenset[Steer]) -> None:
    """With only the declared bug the machine passes, whether generation steers around
    the finding or rejects the examples that hit it."""
    finding = dataclasses.replace(SILENT_RELOAD, steer=steer)
    machine = small_machine(
        "noop", SilentReloadNoOp, keep=frozenset({"host_copy", "move"}), findings=(finding,)
    )
    with active_findings((finding,)):
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
    assert machine.steer == steer


# --- skip layers -----------------------------------------------------------------------------


def test_storage_property_catches_skip_layers_that_allocate_anyway() -> None:
    """A zero-row view of a full buffer is caught by storage, shrunk to one skip layer."""
    target = BrokenTarget("dsa", AllocatingSkipDSA)
    spec = shrunk(
        dsa_specs(None),
        lambda s: assert_skip_layers_hold_no_storage(target.make_pool(s, device=CPU), s),
    )
    assert spec.layer_num == 1 and spec.skip_mask == (True,)


def test_meta_property_catches_skip_layers_that_allocate_anyway() -> None:
    """At production scale on meta the pinned storage shows; the shrunk model has skips."""
    target = BrokenTarget("dsa", AllocatingSkipDSA)
    spec = shrunk(PRODUCTION_SPECS, lambda s: assert_meta_pool_bytes(target, s))
    assert any(spec.skip_mask) and spec.size == 1


@pytest.mark.gpu
def test_cuda_property_catches_skip_layers_that_allocate_anyway(kvcheck_device: str) -> None:
    """On CUDA the allocator's delta exceeds the expected blocks by the hidden buffers."""
    target = BrokenTarget("dsa", AllocatingSkipDSA)
    spec = shrunk(
        dsa_specs(None), lambda s: assert_cuda_allocation_matches(target, s, device=kvcheck_device)
    )
    assert spec.layer_num == 1 and spec.skip_mask == (True,)


# --- the no-op pool --------------------------------------------------------------------------

NOOP_SPECS = pool_specs(families=("noop",), max_size=64)


def test_noop_write_property_catches_a_write_that_returns_silently() -> None:
    """A silent set_kv_buffer is caught; the shrunk call is a valid one-layer write."""
    target = BrokenTarget("noop", SilentNoOp)
    calls = NOOP_SPECS.flatmap(
        lambda spec: st.tuples(st.just(spec), noop_write_calls(spec, device=CPU))
    )

    def check(example: tuple[PoolSpec, Any]) -> None:
        spec, call = example
        assert_noop_write_raises(
            target.make_pool(spec, device=CPU), call.method, call.args, call.kwargs
        )

    spec, call = shrunk(calls, check)
    assert call.method == "set_kv_buffer" and spec.layer_num == 1


def test_placeholder_property_catches_full_size_buffers() -> None:
    """A no-op pool holding full buffers is caught at the smallest pool bigger than a page."""
    target = BrokenTarget("noop", FullSizeNoOp)
    spec = shrunk(
        NOOP_SPECS,
        lambda s: assert_noop_holds_only_placeholders(target.make_pool(s, device=CPU), s),
    )
    assert spec.layer_num == 1 and spec.size == spec.page_size == 1


def test_noop_move_property_catches_a_move_that_does_something() -> None:
    """A validating, writing move is caught by arguments it refuses or bytes it changes."""
    target = BrokenTarget("noop", ValidatingMoveNoOp)
    moves = NOOP_SPECS.flatmap(
        lambda spec: st.tuples(st.just(spec), noop_move_arguments(spec, device=CPU))
    )

    def check(example: tuple[PoolSpec, Any]) -> None:
        spec, (args, kwargs) = example
        assert_noop_move_changes_nothing(target.make_pool(spec, device=CPU), args, kwargs)

    spec, _ = shrunk(moves, check)
    assert spec.layer_num == 1


# --- accounting ------------------------------------------------------------------------------

DSA_POOLS = pool_specs(families=("dsa",))


def test_kv_size_property_catches_skip_layers_counted_as_full() -> None:
    """get_kv_size_bytes counting skip layers fails on a one-layer all-skip pool."""
    target = BrokenTarget("dsa", SkipCountingDSA)
    spec = shrunk(DSA_POOLS, lambda s: assert_kv_size_bytes(target.make_pool(s, device=CPU), s))
    assert spec.layer_num == 1 and spec.skip_mask == (True,)


def test_accounting_property_catches_skip_layers_counted_as_full() -> None:
    """The combined accounting check fails on the same miscount."""
    target = BrokenTarget("dsa", SkipCountingDSA)
    spec = shrunk(DSA_POOLS, lambda s: assert_accounting(target.make_pool(s, device=CPU), s))
    assert spec.layer_num == 1


def test_mem_usage_property_catches_decimal_gigabytes() -> None:
    """mem_usage in 10**9 bytes is caught on the smallest MLA pool."""
    target = BrokenTarget("mla", DecimalGigabytesMLA)
    spec = shrunk(
        pool_specs(families=("mla",)),
        lambda s: assert_mem_usage(target.make_pool(s, device=CPU), s),
    )
    assert spec.layer_num == 1


def test_state_buf_infos_property_catches_skip_layers_described_as_full() -> None:
    """Descriptors of skip layers with a full length fail on one skip layer."""
    target = BrokenTarget("dsa", SkipDescribingDSA)
    spec = shrunk(DSA_POOLS, lambda s: assert_state_buf_infos(target.make_pool(s, device=CPU), s))
    assert spec.layer_num == 1 and spec.skip_mask == (True,)


def test_held_bytes_property_catches_hidden_skip_allocations() -> None:
    """Bytes held beyond the spec's need are caught through the storages."""
    target = BrokenTarget("dsa", AllocatingSkipDSA)
    spec = shrunk(DSA_POOLS, lambda s: assert_held_bytes(target.make_pool(s, device=CPU), s))
    assert spec.layer_num == 1 and spec.skip_mask == (True,)


def test_accounting_property_catches_unreported_fused_padding() -> None:
    """Reporting a fused K/V pool's views instead of its allocation fails on one layer of a
    size that is not whole pages."""
    target = BrokenTarget("mha", UnpaddedReportMHA)
    specs = st.builds(
        PoolSpec,
        family=st.just("mha"),
        size=st.integers(1, 9),
        page_size=st.sampled_from((1, 2, 4)),
        layer_num=st.integers(1, 3),
        dtype=st.just("bfloat16"),
        head_dim=st.integers(1, 4),
    )
    spec = shrunk(specs, lambda s: assert_accounting(target.make_pool(s, device=CPU), s))
    assert spec.layer_num == 1 and spec.size % spec.page_size


# --- inputs ----------------------------------------------------------------------------------


def test_input_property_catches_a_pool_that_sorts_the_callers_loc() -> None:
    """Sorting loc in place is caught on one write of two tokens out of order."""
    target = BrokenTarget("mha", LocSortingMHA)
    sequence = shrunk(
        op_sequences(pool_specs(families=("mha",)), max_ops=6, include_invalid=True),
        lambda seq: check_sequence_inputs(target, seq, device=CPU),
    )
    assert len(sequence.ops) == 1
    (write,) = sequence.ops
    assert list(write.locs) != sorted(write.locs)


def test_rejection_property_catches_a_write_that_half_applies() -> None:
    """A write rejected for its V after writing its K is caught with no setup at all."""
    target = BrokenTarget("mha", HalfApplyingMHA)

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[PoolSpec, OpSequence, Any]:
        spec = draw(pool_specs(families=("mha",)))
        # The twin rewrites set_kv_buffer for payloads in the pool's dtype only.
        setup = draw(op_sequences(spec, max_ops=3, kinds=("write_kv", "move")))
        return spec, setup, draw(bad_calls(spec, device=CPU))

    def check(case: tuple[PoolSpec, OpSequence, Any]) -> None:
        spec, setup, bad = case
        pool = target.make_pool(spec, device=CPU)
        copies: dict[str, Any] = {}
        for op in setup.ops:
            apply_op(target, pool, op, spec=spec, device=CPU, copies=copies)
        assert_rejected_call_changes_nothing(target, pool, bad)

    _, setup, bad = shrunk(cases(), check)
    assert setup.ops == () and bad.kind.startswith("cache_v")


# --- the DSA index kpool and compress tails (SGLang 0.5.23) ----------------------------------

#: kpool 2 on pages of 4 (rows of two index slots), one layer, compress tails for two
#: requests (max_running_requests 1) of width 3.
KPOOL_SPEC = PoolSpec(
    family="dsa",
    size=8,
    page_size=4,
    layer_num=1,
    dtype="bfloat16",
    index_kpool=2,
    index_kpool_compress=True,
    tail_extra_slots=1,
    max_running_requests=1,
)


def _bf16_row(value: float) -> bytes:
    return (
        torch.full((KPOOL_SPEC.index_head_dim,), value, dtype=torch.bfloat16)
        .view(torch.uint8)
        .numpy()
        .tobytes()
    )


def _tail_write(value: float, *, start: int = 0) -> WriteCompressTail:
    return WriteCompressTail(
        layer_id=0,
        req_pool_idx=0,
        key_rows=(_bf16_row(value),),
        score_rows=(_bf16_row(-value),),
        start=start,
    )


def sequence_failure(spec: PoolSpec, pool_class: type, ops: tuple[Op, ...]) -> str:
    """Run ``ops`` on ``pool_class`` (a pool of ``spec``'s family) and on the reference,
    comparing the buffers (and compress tails) after each; return the failure message.
    The same ops pass on kvcheck's own pool (the control)."""
    for target in (resolve_target("kvcheck"), BrokenTarget(spec.family, pool_class)):
        pool, reference = target.make_pool(spec, device=CPU), ReferencePool(spec)
        copies: dict[str, Any] = {}
        try:
            for op in ops:
                apply_op_like_reference(target, pool, reference, op, device=CPU, copies=copies)
                assert_pool_matches_reference(pool, reference, call=type(op).__name__)
                if spec.compress_tails:
                    assert_compress_tails_match_reference(pool, reference, call=type(op).__name__)
        except PropertyFailure as caught:
            assert isinstance(target, BrokenTarget), caught
            return str(caught)
    raise AssertionError(f"{pool_class.__name__} passed {ops}")


def kpool_failure(pool_class: type, ops: tuple[Op, ...]) -> str:
    """:func:`sequence_failure` on :data:`KPOOL_SPEC`."""
    return sequence_failure(KPOOL_SPEC, pool_class, ops)


def test_kpool_pool_catches_slots_paged_by_the_token_page_size() -> None:
    """Slot 4 (row 2 of two-slot rows) written where page_size 4 puts it (row 1)."""
    write = WriteIndexK(
        layer_id=0,
        locs=(4,),
        key_rows=(bytes(range(128)),),
        scale_rows=(np.float32(0.5).tobytes(),),
    )
    message = kpool_failure(TokenPageIndexKpoolDSA, (write,))
    assert "index_k_with_scale_buffer" in message


def test_kpool_pool_catches_a_move_that_refuses_after_moving_latent_rows() -> None:
    """SGLang 0.5.23's move: the latent row moves, then the index keys are refused."""
    row = bytes(i % 64 for i in range(latent_row_bytes(KPOOL_SPEC)))
    ops = (WriteKV(layer_id=0, locs=(1,), k_rows=(row,)), Move(tgt=(0,), src=(1,)))
    message = kpool_failure(HalfMoveKpoolDSA, ops)
    assert "kv_buffer" in message and "Move" in message


def test_kpool_pool_catches_a_host_copy_that_aliases_the_tails() -> None:
    """The copy's tail rows are views of the pool's: caught as the copy is taken."""
    ops = (
        _tail_write(1.0),
        HostCopy(name="a", indices=(0,), req_pool_index=0),
        _tail_write(2.0),
        HostReload(name="a", indices=(0,), req_pool_index=0),
    )
    message = kpool_failure(AliasedTailCopyDSA, ops)
    assert "shares memory with the pool" in message and "_compress_tail_k" in message


def test_kpool_pool_catches_a_tail_write_that_ignores_the_ring_start() -> None:
    """One row written from logical start 1 lands in ring slot 0."""
    assert "WriteCompressTail" in kpool_failure(RingStartTailDSA, (_tail_write(1.0, start=1),))


def test_kv_size_property_catches_uncounted_compress_tails() -> None:
    """get_kv_size_bytes without the tails fails on the smallest pool that keeps them."""
    target = BrokenTarget("dsa", UncountedTailsDSA)
    specs = st.builds(
        PoolSpec,
        family=st.just("dsa"),
        size=st.sampled_from((2, 4)),
        page_size=st.sampled_from((2, 4)),
        layer_num=st.integers(1, 2),
        dtype=st.just("bfloat16"),
        index_kpool=st.just(2),
        index_kpool_compress=st.booleans(),
        tail_extra_slots=st.integers(0, 2),
        max_running_requests=st.integers(0, 2),
    )
    spec = shrunk(specs, lambda s: assert_kv_size_bytes(target.make_pool(s, device=CPU), s))
    assert spec.compress_tails and spec.layer_num == 1 and spec.max_running_requests == 0


def test_kv_size_property_without_the_tails_still_checks_every_other_byte() -> None:
    """With ``tails_counted=False`` (a target's declared finding) a report that leaves out
    exactly the tails passes, and one that counts them, or leaves out more, fails."""
    uncounted = BrokenTarget("dsa", UncountedTailsDSA).make_pool(KPOOL_SPEC, device=CPU)
    assert_kv_size_bytes(uncounted, KPOOL_SPEC, tails_counted=False)
    counted = resolve_target("kvcheck").make_pool(KPOOL_SPEC, device=CPU)
    with pytest.raises(PropertyFailure, match="get_kv_size_bytes"):
        assert_kv_size_bytes(counted, KPOOL_SPEC, tails_counted=False)
    skip_counting = BrokenTarget("dsa", SkipCountingDSA)
    spec = dataclasses.replace(KPOOL_SPEC, layer_num=2, skip_topk_layers=(False, True))
    with pytest.raises(PropertyFailure, match="get_kv_size_bytes"):
        assert_kv_size_bytes(skip_counting.make_pool(spec, device=CPU), spec, tails_counted=False)


def test_tail_descriptor_property_catches_whole_tails_as_items() -> None:
    """get_compress_tail_buf_infos must give one request's ring as the item: a pool that
    gives the whole tail fails, kvcheck's own passes."""
    assert_compress_tail_buf_infos(
        resolve_target("kvcheck").make_pool(KPOOL_SPEC, device=CPU), KPOOL_SPEC
    )
    broken = BrokenTarget("dsa", WholeTailItemDSA).make_pool(KPOOL_SPEC, device=CPU)
    with pytest.raises(PropertyFailure, match="item_lens"):
        assert_compress_tail_buf_infos(broken, KPOOL_SPEC)


# --- the failure messages --------------------------------------------------------------------


def test_mismatch_names_buffer_layer_token_and_part() -> None:
    """A poked index-K scale byte is reported by layer, page row, token and key/scale part."""
    spec = PoolSpec(
        family="dsa",
        size=4,
        page_size=2,
        layer_num=2,
        dtype="bfloat16",
        start_layer=3,
        skip_topk_layers=(True, False),
    )
    pool = resolve_target("kvcheck").make_pool(spec, device=CPU)
    pool.index_k_with_scale_buffer[1][2, 2 * 128 + 4 + 1] = 9  # token 5, scale byte 1
    with pytest.raises(PropertyFailure) as caught:
        assert_pool_matches_reference(pool, ReferencePool(spec), call="poke")
    message = str(caught.value)
    assert "is 0x09 but should be 0x00 [poke]" in message
    assert "index_k_with_scale_buffer[1] (global layer 4)" in message
    assert "token 5 scale byte 1" in message and "row 2 byte" in message


def test_matching_pool_passes_after_the_same_writes() -> None:
    """The same index-K write applied to pool and reference compares equal."""
    spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=1, dtype="float8_e5m2")
    target = resolve_target("kvcheck")
    pool, reference = target.make_pool(spec, device=CPU), ReferencePool(spec)
    op = WriteIndexK(
        layer_id=0,
        locs=(3,),
        key_rows=(bytes(range(128)),),
        scale_rows=(np.float32(0.5).tobytes(),),
    )
    apply_op(target, pool, op, spec=spec, device=CPU, copies={})
    reference.apply(op)
    assert_pool_matches_reference(pool, reference, call="write")
    assert int(pool.index_k_with_scale_buffer[0][1, 128 + 5]) == 5
    assert torch.equal(
        pool.index_k_with_scale_buffer[0][1, 2 * 128 + 4 :].view(torch.float32),
        torch.tensor([0.5]),
    )


# --- decode context parallel --------------------------------------------------------------

#: Rank 1 of 2: widened ids 0..11, of which the odd ones are this rank's rows 0..5.
DCP_MLA_SPEC = PoolSpec(
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
DCP_DSA_SPEC = dataclasses.replace(DCP_MLA_SPEC, family="dsa")


def _latent_write(*locs: int) -> WriteMLA:
    return WriteMLA(
        layer_id=0,
        locs=locs,
        nope_rows=tuple(bytes([loc + 1, 0, loc + 2, 0]) for loc in locs),
        rope_rows=tuple(bytes([loc + 3, 0]) for loc in locs),
    )


def test_dcp_pool_catches_a_write_that_keeps_other_ranks_ids() -> None:
    """Widened id 2 is rank 0's: rank 1 must drop it, not keep it at row 1."""
    message = sequence_failure(DCP_MLA_SPEC, OwnerBlindDcpMLA, (_latent_write(2),))
    assert "kv_buffer" in message and "WriteMLA" in message


def test_dcp_pool_catches_set_kv_buffer_that_is_not_refused() -> None:
    """set_kv_buffer has no DCP path: a pool that writes instead fails the raises check."""
    row = bytes(range(latent_row_bytes(DCP_MLA_SPEC)))
    write = WriteKV(layer_id=0, locs=(1,), k_rows=(row,))
    assert "RuntimeError" in sequence_failure(DCP_MLA_SPEC, UnrefusedKVWriteDcpMLA, (write,))


def test_dcp_pool_catches_a_host_copy_that_does_not_collapse_ids() -> None:
    """A copy of widened ids 0..3 holds rank 1's rows 0 and 1, and reloads to rows 2, 3."""
    ops = (
        _latent_write(1, 3),
        HostCopy(name="a", indices=(0, 1, 2, 3)),
        HostReload(name="a", indices=(4, 5, 6, 7)),
    )
    # The copy reads rows 1 and 3 (widened ids as rows) and the reload reaches past row 5.
    assert "load_cpu_copy" in sequence_failure(DCP_DSA_SPEC, UncollapsedCopyDcpDSA, ops)


def test_dcp_pool_catches_a_move_that_keeps_other_ranks_index_keys_in_place() -> None:
    """Index keys are kept for every widened id: moving rank 0's ids 2 -> 4 moves the key
    on rank 1 too, although no latent row of rank 1 moves."""
    key = WriteIndexK(
        layer_id=0,
        locs=(2,),
        key_rows=(bytes(range(128)),),
        scale_rows=(np.float32(0.5).tobytes(),),
    )
    message = sequence_failure(DCP_DSA_SPEC, OwnedIndexMoveDcpDSA, (key, Move(tgt=(4,), src=(2,))))
    assert "index_k_with_scale_buffer" in message and "Move" in message


def test_kv_size_property_catches_index_keys_sized_for_one_rank() -> None:
    """Index keys for this rank's rows only: the accounting and index-K size checks fail."""
    assert_kv_size_bytes(
        resolve_target("kvcheck").make_pool(DCP_DSA_SPEC, device=CPU), DCP_DSA_SPEC
    )
    broken = BrokenTarget("dsa", NarrowIndexDcpDSA).make_pool(DCP_DSA_SPEC, device=CPU)
    with pytest.raises(PropertyFailure, match="get_kv_size_bytes"):
        assert_kv_size_bytes(broken, DCP_DSA_SPEC)
