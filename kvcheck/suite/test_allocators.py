"""A target's token-to-KV allocators against the reference, call by call.

One state machine per allocator kind the target declares (:mod:`kvcheck.allocator_machine`):
prefill, decode and speculative-decoding batches, frees alone and in groups, sliding-window
frees, drains and (with ``input_validation``) bad calls. After every call: no slot handed
out twice, page-aligned answers, a refusal exactly when the pages do not cover the call and
changing nothing (on either side of a sliding-window allocator), ``available_size()`` and
the sliding-window mapping equal to the truth, and bad input refused with ``ValueError``.
A target whose surface declares no allocator of a kind skips that kind, saying so.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.allocator_machine import allocator_machine
from kvcheck.targets.tier_support import allocator_skip_reason
from kvcheck.tiers import ALLOCATOR_KINDS


@pytest.mark.parametrize("kind", ALLOCATOR_KINDS)
def test_allocator_matches_reference_after_every_call(
    kvcheck_target: Any, kvcheck_device: str, kind: str
) -> None:
    """Every allocation's answer is fresh and page-aligned, and the sizes equal the truth."""
    reason = allocator_skip_reason(kvcheck_target, kind)
    if reason is not None:
        pytest.skip(reason)
    machine = allocator_machine(kvcheck_target, device=kvcheck_device, kind=kind)
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.kind == kind
