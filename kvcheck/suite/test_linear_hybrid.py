"""A target's linear-attention hybrid pool against the reference, call by call.

One state machine (:mod:`kvcheck.linear_hybrid_machine`) drives the target's
``HybridLinearKVPool`` and ``HybridReqToTokenPool`` the way sglang's callers do: admission
with a mamba slot, K/V and mamba state writes, forks, speculative verify, commit and moves,
retraction to the host and reload, finish and flush. After every call: rows and mamba slots
owned once and counted right, and every live token's K/V and request's mamba state equal to
the reference. A target without ``make_linear_hybrid`` skips, saying so.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.linear_hybrid_machine import linear_hybrid_machine, linear_hybrid_skip_reason


def test_linear_hybrid_matches_reference_after_every_call(
    kvcheck_target: Any, kvcheck_device: str
) -> None:
    """Every sub-pool of the linear-attention hybrid holds what the reference holds."""
    reason = linear_hybrid_skip_reason(kvcheck_target)
    if reason is not None:
        pytest.skip(reason)
    machine = linear_hybrid_machine(kvcheck_target, device=kvcheck_device)
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.target is kvcheck_target
