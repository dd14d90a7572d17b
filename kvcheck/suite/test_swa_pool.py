"""A target's sliding-window hybrid pool against the reference, step by step.

One state machine (:mod:`kvcheck.swa_machine`) over every sub-pool family the target builds
hybrids of: prefills, writes through the layer mapping at the full location or its SWA
translation, speculative moves, window eviction, retraction offload and reload, frees and
flushes. After every step each layer's buffers equal the reference's rows. A target without
``make_swa_pool``, declaring ``swa_pool`` unsupported, or building no SWA allocator (the
machine's id translation) skips it, saying so.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.swa_machine import swa_families, swa_pool_machine, swa_skip_reason
from kvcheck.targets.tier_support import allocator_skip_reason


def swa_settings() -> settings:
    """The current profile with a quarter of its examples, each twice as long: eviction,
    offload and reload need a request to have lived a few steps."""
    current = settings()
    return settings(
        current,
        max_examples=max(10, current.max_examples // 4),
        stateful_step_count=2 * current.stateful_step_count,
    )


def test_swa_pool_matches_reference_after_every_step(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Every layer of the hybrid holds what the reference says, on both sides."""
    if not swa_families(kvcheck_target):
        pytest.skip(swa_skip_reason(kvcheck_target) or "no hybrid family is built")
    # The machine translates ids through the target's own SWA allocator.
    no_allocator = allocator_skip_reason(kvcheck_target, "swa")
    if no_allocator is not None:
        pytest.skip(no_allocator)
    machine = swa_pool_machine(kvcheck_target, device=kvcheck_device, settings=swa_settings())
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.target is kvcheck_target
