"""The server's path for a request's KV memory, in miniature, on every family with a host tier.

:mod:`kvcheck.lifecycle`: slots from the target's allocator; writes; speculative tokens
moved; whole pages backed up to the target's host pools; requests freed and their slots
handed out again; host copies loaded back into fresh slots, layer by layer, and read back
through the pool's read API; host copies evicted. Device bytes, allocator sizes and host
slots are checked against the references after every step, host bytes after every backup.
A target that builds no host pool for a family (or no token or paged allocator) skips it.
Quantized pools (their scales backed up and loaded with the payload) have a run of their own.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.lifecycle import lifecycle_machine, lifecycle_specs
from kvcheck.specs import MHA_KV_QUANTS, MLA_KV_QUANTS
from kvcheck.strategies.limits import pool_spec_limits_of
from kvcheck.targets.tier_support import (
    allocator_skip_reason,
    host_pool_skip_reason,
    host_variant_skip_reason,
)
from kvcheck.tiers import HOST_FAMILIES
from kvcheck.variants import variants_of


def lifecycle_settings() -> settings:
    """The current profile with a quarter of its examples, each twice as long: one request's
    path through the tiers takes several steps."""
    current = settings()
    return settings(
        current,
        max_examples=max(10, current.max_examples // 4),
        stateful_step_count=2 * current.stateful_step_count,
    )


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f) for f in HOST_FAMILIES],
)
def test_request_lifecycle_matches_reference(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """allocate, write, move, back up, free, allocate, load, read: every step exact."""
    for reason in (
        host_pool_skip_reason(kvcheck_target, family),
        allocator_skip_reason(kvcheck_target, "token"),
        allocator_skip_reason(kvcheck_target, "paged"),
    ):
        if reason is not None:
            pytest.skip(reason)
    machine = lifecycle_machine(
        kvcheck_target, device=kvcheck_device, family=family, settings=lifecycle_settings()
    )
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.family == family


#: The quantized variants of each family with a host tier (:data:`kvcheck.specs.KV_QUANTS`).
QUANTIZED_FAMILIES = {"mha": MHA_KV_QUANTS[1:], "mla": MLA_KV_QUANTS[1:]}


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f)
        for f in QUANTIZED_FAMILIES
    ],
)
def test_quantized_request_lifecycle_matches_reference(
    kvcheck_target: Any, kvcheck_device: str, family: str
) -> None:
    """The lifecycle on quantized pools only (every quantized variant of the family the
    target builds a host tier for): scales backed up, loaded and read back with their
    payload. Skipped where the target builds none."""
    for reason in (
        host_pool_skip_reason(kvcheck_target, family),
        allocator_skip_reason(kvcheck_target, "token"),
        allocator_skip_reason(kvcheck_target, "paged"),
    ):
        if reason is not None:
            pytest.skip(reason)
    declared = pool_spec_limits_of(kvcheck_target).get(family, {}).get("kv_quant")
    quants = tuple(
        quant for quant in QUANTIZED_FAMILIES[family] if declared is None or quant in declared
    )
    variants = [v.name for v in variants_of(family) if v.kv_quant in quants]
    if not quants or all(host_variant_skip_reason(kvcheck_target, v) for v in variants):
        pytest.skip(
            f"target {kvcheck_target.name!r} builds no host tier for a quantized {family} pool"
        )
    specs = lifecycle_specs(kvcheck_target, family, kv_quants=quants)
    machine = lifecycle_machine(
        kvcheck_target,
        device=kvcheck_device,
        family=family,
        specs=specs,
        settings=lifecycle_settings(),
    )
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.family == family
