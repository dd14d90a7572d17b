"""The scheduler's conservation law over a request's life (:mod:`kvcheck.scheduler`).

New requests sharing prefixes, chunked prefill, decode with speculative drafts, finish,
abort, retraction and restore, eviction and flush, driven through the target's scheduler
memory (kvcheck's reference on the built-in target, sglang's own ``mem_cache`` functions
on the sglang target); sglang's law ``available + evictable + protected + session_held +
uncached == total``, ownership, bookkeeping and bytes are checked after every step.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.scheduler.drivers import (
    PAGINGS,
    memory_eviction_policies,
    memory_factory,
    memory_prefix_caches,
    memory_skip_reason,
)
from kvcheck.scheduler.machine import scheduler_machine


def scheduler_settings() -> settings:
    """The current profile with a fifth of its examples (each is a whole request life)."""
    current = settings()
    return settings(current, max_examples=max(5, current.max_examples // 5), stateful_step_count=30)


@pytest.mark.parametrize("paging", PAGINGS)
def test_scheduler_memory_keeps_its_laws(kvcheck_target: Any, paging: str) -> None:
    """conservation, ownership, bookkeeping and bytes hold after every scheduler step, with
    the token allocator (page size 1) and with a paged one, on every prefix cache the
    target's memory builds under every eviction policy it takes."""
    reason = memory_skip_reason(kvcheck_target, paging=paging)
    if reason is not None:
        pytest.skip(reason)
    machine = scheduler_machine(
        memory_factory(kvcheck_target),
        settings=scheduler_settings(),
        page_sizes=PAGINGS[paging],
        eviction_policies=memory_eviction_policies(kvcheck_target),
        prefix_caches=memory_prefix_caches(kvcheck_target),
    )
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.TestCase.settings.stateful_step_count == 30
