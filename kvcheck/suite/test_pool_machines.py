"""Differential state machines: each pool family against the reference, step by step.

One test per family runs :func:`kvcheck.machines.pool_machine`: random writes, index-K
writes (DSA), moves with overlapping and repeated sources, host copies and reloads to
other slots, and invalid operations, with every buffer compared byte for byte, the
accounting checked and ``check_valid()`` called after every step. The MHA machine draws
pools with a V head dim of their own and pools starting at a global layer above 0; the
DSA machine draws every kind of skip mask and index kpool, and a second DSA run draws
pooled index keys (kpool 2 or 4, most with compress tails) only, and a third MLA and DSA
run one decode-context-parallel rank only. Each quantized variant, MHA's head-major layout
and each scaled DSA latent variant get a run of their own, so that each variant gets its
share of the calls (``python tools/call_counts.py`` counts them). Rules for capabilities
the target declares unsupported (host copies, index-K writes, input validation, ...) are
left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.calls import describe_op, op_method
from kvcheck.geometry import row_bytes
from kvcheck.machines import default_machine_specs, pool_machine
from kvcheck.properties.ops import apply_op_like_reference
from kvcheck.properties.pool_state import assert_pool_matches_reference
from kvcheck.reference import ReferencePool
from kvcheck.specs import SCALED_LATENT_DTYPE, Move, Op, PoolSpec, WriteKV
from kvcheck.strategies.limits import fit_spec, pool_spec_limits_of
from kvcheck.strategies.ops import pattern_row
from kvcheck.strategies.pools import pool_specs
from kvcheck.surface import surface_of

FAMILIES = ("mha", "mla", "dsa", "noop")


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.kvcheck_needs(f"{family}_pool"), id=family)
        for family in FAMILIES
    ],
)
def test_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """After every step of a random op sequence each buffer equals the reference byte for byte."""
    machine = pool_machine(kvcheck_target, device=kvcheck_device, family=family)
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.__name__.lower().startswith(family)


@pytest.mark.kvcheck_needs("dsa_pool")
def test_kpool_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """The DSA machine on pools with an index kpool only (most with compress tails): in
    the machine above they are one pool in three, too few for a tail bug to show reliably.
    Skipped for a target that declares no kpool above 1 (``index_kpools``)."""
    if pool_spec_limits_of(kvcheck_target).get("dsa", {}).get("index_kpool") == (1,):
        why = surface_of(kvcheck_target).note("dsa", "index_kpool") or "it declares none"
        pytest.skip(f"target {kvcheck_target.name!r} builds no DSA index kpool above 1 ({why})")
    specs = default_machine_specs("dsa", index_kpools=(2, 4))
    machine = pool_machine(kvcheck_target, device=kvcheck_device, family="dsa", specs=specs)
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.__name__ == "DSAPoolMachine"


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.kvcheck_needs(f"{family}_pool"))
        for family in ("mla", "dsa")
    ],
)
def test_dcp_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """The MLA and DSA machines on one rank of a decode-context-parallel pool only (width
    2 or 4, widened ids): in the machines above they are one pool in four. Skipped for a
    target that declares no width above 1 (``dcp_sizes``)."""
    if pool_spec_limits_of(kvcheck_target).get(family, {}).get("dcp_size") == (1,):
        why = surface_of(kvcheck_target).note(family, "dcp_size") or "it declares no dcp_sizes"
        pytest.skip(
            f"target {kvcheck_target.name!r} builds no decode-context-parallel {family} pool "
            f"({why})"
        )
    specs = default_machine_specs(family, dcp_sizes=(2, 4))
    machine = pool_machine(kvcheck_target, device=kvcheck_device, family=family, specs=specs)
    run_state_machine_as_test(machine, settings=_dcp_run_settings(machine, family))
    assert machine.__name__.lower().startswith(family)


def _dcp_run_settings(machine: Any, family: str) -> settings:
    """The profile's settings; a fifth more examples for DSA, whose run shares them between
    two variants (``dsa:dcp`` and ``dsa:kpool:dcp``, with compress tails): at seed 0 each of
    their cells is then called 20 times or more (``python tools/call_counts.py``)."""
    return _run_settings(machine, fifths=6 if family == "dsa" else 5)


def _run_settings(machine: Any, *, fifths: int, filtered: bool = False) -> settings:
    """The machine's profile settings with ``fifths`` fifths of its examples (at least one);
    ``filtered``: the run filters its specs, so many rejected draws are no health problem."""
    profile = machine.TestCase.settings
    suppressed = [*profile.suppress_health_check]
    if filtered:
        suppressed.append(HealthCheck.filter_too_much)
    return settings(
        profile,
        max_examples=max(1, profile.max_examples * fifths // 5),
        suppress_health_check=suppressed,
    )


#: Every quantized variant (``kvcheck.specs.KV_QUANTS``, and within one the layouts that
#: make a variant of their own: :attr:`kvcheck.specs.PoolSpec.variant`) gets a machine run
#: of its own: the family machines above draw unquantized pools only, and two variants
#: sharing a run split its calls (``python tools/call_counts.py`` shows each one's share).
QUANTIZED = (
    ("mha", "fp8_scaled", "mha:fp8_scaled"),
    ("mha", "fp8_scaled", "mha:fp8_scaled:hnd"),
    ("mha", "cpu_fp8", "mha:cpu_fp8"),
    ("mha", "mxfp8", "mha:mxfp8"),
    ("mha", "mxfp8", "mha:mxfp8:flat"),
    ("mha", "fp4_mx_block16", "mha:fp4_mx_block16"),
    ("mha", "nvfp4", "mha:nvfp4"),
    ("mha", "nvfp4", "mha:nvfp4:native"),
    ("mla", "fp4", "mla:fp4"),
)


def _unbuilt_variant(target: Any, family: str, variant: str) -> str | None:
    """Why ``target`` builds no ``variant`` pool (a quantization or layout its surface does
    not take), or None."""
    limits = pool_spec_limits_of(target).get(family, {})
    quant, *layouts = variant.split(":")[1:]
    takes: dict[str, Callable[[Any], bool]] = {"kv_quant": lambda value: value == quant}
    if "hnd" in layouts:
        takes["kv_layout"] = lambda value: value == "hnd"
    if "native" in layouts:  # "native" or "both+dq": TRT-LLM's native scales among them
        takes["nvfp4_layout"] = lambda value: str(value).startswith(("native", "both"))
    for field, takes_value in takes.items():
        if field in limits and not any(takes_value(value) for value in limits[field]):
            why = surface_of(target).note(family, field) or f"its surface lists no such {field}"
            return f"target {target.name!r} builds no {variant} pool ({why})"
    return None


@pytest.mark.parametrize(
    ("family", "quant", "variant"),
    [
        pytest.param(
            family,
            quant,
            variant,
            marks=pytest.mark.kvcheck_needs(f"{family}_pool"),
            id=variant.split(":", 1)[1].replace(":", "-"),
        )
        for family, quant, variant in QUANTIZED
    ],
)
def test_quantized_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str, family: str, quant: str, variant: str
) -> None:
    """A quantized pool's payload and every scale buffer equal the reference after every
    step (writes, moves, host copies and their reloads, reads, accounting and scale
    descriptors). Skipped for a target that does not build the variant (``kv_quants``)."""
    why = _unbuilt_variant(kvcheck_target, family, variant)
    if why is not None:
        pytest.skip(why)
    specs = default_machine_specs(family, kv_quants=(quant,)).filter(
        lambda spec: spec.variant == variant
    )
    machine = pool_machine(kvcheck_target, device=kvcheck_device, family=family, specs=specs)
    run_state_machine_as_test(machine, settings=_variant_run_settings(machine))
    assert machine.__name__.lower().startswith(family)


def _variant_run_settings(machine: Any) -> settings:
    """Three fifths of the profile's examples (60 in the default profile) for each variant
    run: at seed 0 each cell of each variant is called 20 times or more, and the default
    run stays under a minute (``python tools/call_counts.py`` shows both; a pause step is
    not checked again, which paid for the examples). The spec filter may reject most draws
    on a target whose limits narrow the spec (one in four or five takes the layout):
    expected, not a health problem."""
    return _run_settings(machine, fifths=3, filtered=True)


#: The variants a family machine draws too rarely to call each method often: each gets a
#: run of its own (MHA's head-major layout; DSA's scaled latent rows, an fp8 pool in two,
#: with and without a kpool and DCP).
RARE_VARIANTS = (
    ("mha", "mha:hnd", "kv_layout", "hnd"),
    ("dsa", "dsa:scaled", "latent_layout", "scaled"),
    ("dsa", "dsa:scaled:kpool", "latent_layout", "scaled"),
    ("dsa", "dsa:scaled:dcp", "latent_layout", "scaled"),
    ("dsa", "dsa:scaled:kpool:dcp", "latent_layout", "scaled"),
)


@pytest.mark.parametrize(
    ("family", "variant", "field", "value"),
    [
        pytest.param(
            *row, marks=pytest.mark.kvcheck_needs(f"{row[0]}_pool"), id=row[1].replace(":", "-")
        )
        for row in RARE_VARIANTS
    ],
)
def test_rare_variant_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str, family: str, variant: str, field: str, value: str
) -> None:
    """The family machine on one variant only, with three fifths of the profile's examples.
    Skipped for a target that does not build it."""
    parts = variant.split(":")
    kpools, dcp_sizes = ((2, 4) if "kpool" in parts else (1,)), ((2, 4) if "dcp" in parts else (1,))
    needed = {field: (value,), "index_kpool": kpools, "dcp_size": dcp_sizes}
    limits = pool_spec_limits_of(kvcheck_target).get(family, {})
    for name, values in needed.items():
        if name in limits and not set(limits[name]) & set(values):
            why = surface_of(kvcheck_target).note(family, name) or f"it declares no such {name}"
            pytest.skip(f"target {kvcheck_target.name!r} builds no {variant} pool ({why})")
    specs = pool_specs(
        families=(family,),
        dtype_names=(SCALED_LATENT_DTYPE,) if value == "scaled" else None,
        max_layers=3,
        max_size=32,
        max_page_size=4,
        index_kpools=kpools,
        dcp_sizes=dcp_sizes,
    ).filter(lambda spec: spec.variant == variant)
    machine = pool_machine(kvcheck_target, device=kvcheck_device, family=family, specs=specs)
    run_state_machine_as_test(machine, settings=_variant_run_settings(machine))
    assert machine.__name__.lower().startswith(family)


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.kvcheck_needs(f"{family}_pool", "move"), id=family)
        for family in FAMILIES
    ],
)
def test_empty_move_changes_nothing(kvcheck_target: Any, kvcheck_device: str, family: str) -> None:
    """A move of no tokens (a batch with nothing to relocate) is accepted and changes no
    byte, on a pool already holding data: the machines draw it only by chance."""
    spec = fit_spec(
        PoolSpec(family=family, size=4, page_size=2, layer_num=2, dtype="bfloat16", head_dim=2),  # type: ignore[arg-type]
        **{
            name: values[0]
            for name, values in pool_spec_limits_of(kvcheck_target).get(family, {}).items()
        },
    )
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    reference = ReferencePool(spec)
    copies: dict[str, Any] = {}
    ops: list[Op] = [Move(tgt=(), src=())]
    if family != "noop":
        ops.insert(0, draw_first_write(spec))
    for op in ops:
        apply_op_like_reference(
            kvcheck_target, pool, reference, op, device=kvcheck_device, copies=copies
        )
        assert_pool_matches_reference(pool, reference, call=describe_op(op), method=op_method(op))
    assert len(ops) == (1 if family == "noop" else 2)


def draw_first_write(spec: PoolSpec) -> Op:
    """A valid write of ``spec``'s family: slot 1 of its first layer, non-zero rows."""
    k_bytes, v_bytes = row_bytes(spec)
    return WriteKV(
        layer_id=spec.start_layer,
        locs=(1,),
        k_rows=(pattern_row(1, 1, spec.dtype, k_bytes),),
        v_rows=(pattern_row(2, 1, spec.dtype, v_bytes),) if v_bytes else (),
    )
