"""Differential state machines: each pool family against the reference, step by step.

One test per family runs :func:`kvcheck.machines.pool_machine`: random writes, index-K
writes (DSA), moves with overlapping and repeated sources, host copies and reloads to
other slots, and invalid operations, with every buffer compared byte for byte, the
accounting checked and ``check_valid()`` called after every step. The MHA machine draws
pools with a V head dim of their own and pools starting at a global layer above 0; the
DSA machine draws every kind of skip mask. Rules for capabilities the target declares
unsupported (host copies, index-K writes, input validation, ...) are left out.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.machines import pool_machine

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
