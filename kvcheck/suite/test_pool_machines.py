"""Differential state machines: each pool family against the reference, step by step.

One test per family runs :func:`kvcheck.machines.pool_machine`: random writes, index-K
writes (DSA), moves with overlapping and repeated sources, host copies and reloads to
other slots, and invalid operations, with every buffer compared byte for byte, the
accounting checked and ``check_valid()`` called after every step. The MHA machine draws
pools with a V head dim of their own and pools starting at a global layer above 0; the
DSA machine draws every kind of skip mask and index kpool. Every other variant (each
quantized one, MHA's head-major layout, DSA's pooled index keys and scaled latent rows, MLA
and DSA decode context parallel: :data:`kvcheck.variants.VARIANTS`, generated from the axes)
gets a run of its own, so that each gets its share of the calls. Rules for capabilities
the target declares unsupported (host copies, index-K writes, input validation, ...) are
left out.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.calls import describe_op, op_method
from kvcheck.geometry import row_bytes
from kvcheck.machines import pool_machine, variant_machine_specs
from kvcheck.properties.apply import apply_op_like_reference
from kvcheck.properties.pool_state import assert_pool_matches_reference
from kvcheck.reference import ReferencePool
from kvcheck.specs import Move, Op, PoolSpec, WriteKV
from kvcheck.strategies.limits import fit_spec, pool_spec_limits_of, unbuilt_variant_reason
from kvcheck.strategies.ops import pattern_row
from kvcheck.variants import VARIANTS, Variant

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


#: Every variant but the family baselines (:data:`kvcheck.variants.VARIANTS`, generated from
#: the variant axes) gets a machine run of its own: in a family machine a quantized, pooled,
#: decode-context-parallel or re-laid-out pool is at most one pool in several, too few for
#: each of its methods to be called often (``python tools/call_counts.py`` counts them).
SEPARATE_RUNS: tuple[Variant, ...] = tuple(v for v in VARIANTS if not v.is_baseline)


def _run_settings(machine: Any, *, fifths: int) -> settings:
    """The machine's profile settings with ``fifths`` fifths of its examples (at least one).
    The spec filter may reject most draws on a target whose limits narrow the spec:
    expected, not a health problem."""
    profile = machine.TestCase.settings
    return settings(
        profile,
        max_examples=max(1, profile.max_examples * fifths // 5),
        suppress_health_check=[*profile.suppress_health_check, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(v, marks=pytest.mark.kvcheck_needs(f"{v.family}_pool"), id=v.test_id)
        for v in SEPARATE_RUNS
    ],
)
def test_variant_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str, variant: Variant
) -> None:
    """The family machine on one variant only (a quantized pool's payload and every scale
    buffer, a kpool's index keys and compress tails, a DCP rank's widened ids), with a fifth
    of the profile's examples: 20 in the default profile (the default run's budget is a
    minute; ``kvcheck-thorough`` runs 400, and ``python tools/call_counts.py`` counts the
    calls each method gets). Skipped for a target that does not build the variant, quoting
    why."""
    why = unbuilt_variant_reason(kvcheck_target, variant)
    if why is not None:
        pytest.skip(why)
    specs = variant_machine_specs(variant)
    machine = pool_machine(
        kvcheck_target, device=kvcheck_device, family=variant.family, specs=specs
    )
    run_state_machine_as_test(machine, settings=_run_settings(machine, fifths=1))
    assert machine.__name__.lower().startswith(variant.family)


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
