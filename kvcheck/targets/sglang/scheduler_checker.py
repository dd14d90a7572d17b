"""sglang's own scheduler invariant checker, run on the memory the scheduler-memory driver
builds (`kvcheck.targets.sglang.scheduler_memory`), so that sglang's verdict stands beside
kvcheck's laws after every step.

sglang's ``managers/scheduler_components/invariant_checker.py`` (0.5.21 to 0.5.23) checks
a running scheduler's memory; the driver hands it the real ``RadixCache``, allocator and
``ReqToTokenPool``, and a real ``SchedulerPoolStatsObserver`` over them. Its three checks,
each reported as a verdict on the kvcheck law it checks (`verdicts`):

- ``self_check_during_busy()`` (the scheduler calls it after every batch under
  ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY``): ``available + evictable + protected +
  session_held + uncached == total``, kvcheck's **conservation** law term for term
  (``exact``: each must fail exactly when the other does). An ``AssertionError`` is its
  failure (the leak assert, and its assert that a protected prefix is page-aligned).
- ``_check_kv_page_invariants()`` (the same busy check runs it under
  ``SGLANG_CHECK_KV_PAGE_INVARIANTS``): no page a request holds is on the free list, no
  page is free twice. Part of kvcheck's **ownership** law (not ``exact``: a page cached
  and held privately at once, or lost, passes it).
- ``_check_req_pool()`` (the scheduler's idle check): every req-to-token row is free once
  no request runs. Part of kvcheck's **bookkeeping** law, asked only when the driver
  holds no live request (a live one holds a row, as in the scheduler).

With ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE`` on (its default) the last two raise
``ValueError`` instead of logging; the flags are set for each call only.

Stand-ins for what the checker reads off the ``Scheduler`` (each declared, none computing
anything sglang computes):

- ``get_last_batch`` returns `_LiveRequests`, holding every request the driver keeps live
  (the scheduler's last batch, running batch and parked chunked request together: the
  checker takes their union, so one batch holding all of them is the same set);
  ``get_running_batch`` and ``get_chunked_req`` return ``None``.
- ``session_controller`` has no sessions (the driver opens no streaming session);
  ``hisparse_coordinator`` and ``scheduler_stage_metrics`` are ``None`` (sglang's stage
  decorator records nothing without a recorder); not disaggregated, neither hybrid SWA
  nor hybrid SSM; ``max_total_num_tokens`` is the pool's size.

The checker's and the observer's fields are read off the installed release's dataclasses:
a field a release does not define is not passed.

Example, where sglang is installed::

    checker = SglangInvariantChecker(memory)
    checker.verdicts(live=list(memory.requests.values()))  # [{'law': 'conservation', ...}]
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from kvcheck.targets.sglang import env

__all__ = ["CHECKER_MODULE", "SglangInvariantChecker", "why_not_checked"]

#: Where sglang keeps its scheduler invariant checker and the pool statistics it reads.
CHECKER_MODULE = "sglang.srt.managers.scheduler_components.invariant_checker"
OBSERVER_MODULE = "sglang.srt.managers.scheduler_components.pool_stats_observer"

#: The checker's names each verdict comes from (the name a failure quotes).
BUSY_CHECK = "SchedulerInvariantChecker.self_check_during_busy"
PAGE_CHECK = "SchedulerInvariantChecker._check_kv_page_invariants"
ROW_CHECK = "SchedulerInvariantChecker._check_req_pool"


def _modules() -> SimpleNamespace:
    with env.torchvision_stand_in():
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components import (
            invariant_checker,
            pool_stats_observer,
        )
    return SimpleNamespace(
        Checker=invariant_checker.SchedulerInvariantChecker,
        Observer=pool_stats_observer.SchedulerPoolStatsObserver,
        not_disaggregated=DisaggregationMode.NULL,
    )


def why_not_checked() -> str | None:
    """Why sglang's invariant checker cannot run beside the driver here, or ``None``.

    Example, where sglang is installed::

        why_not_checked()  # None on every release in releases.txt
    """
    try:
        found = _modules()
    except ImportError as error:
        return f"sglang's scheduler invariant checker does not import here: {error}"
    lacking = [
        name
        for name in (BUSY_CHECK, PAGE_CHECK, ROW_CHECK)
        if not hasattr(found.Checker, name.rpartition(".")[2])
    ]
    if lacking:
        return "this sglang's scheduler invariant checker has no " + ", ".join(lacking)
    return None


class _LiveRequests:
    """Stands in for the scheduler's batches: the requests the driver keeps live."""

    def __init__(self, reqs: list[Any]) -> None:
        self.reqs = reqs

    def is_empty(self) -> bool:
        return not self.reqs


def _fields_of(cls: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """``offered`` narrowed to the fields ``cls`` (a dataclass) defines in this release."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: value for name, value in offered.items() if name in names}


class SglangInvariantChecker:
    """sglang's ``SchedulerInvariantChecker`` over ``memory``'s tree cache, allocator and
    req-to-token pool (a `SglangSchedulerMemory`; see the module docstring)."""

    def __init__(self, memory: Any) -> None:
        found = _modules()
        self._live: list[Any] = []
        common = dict(
            tree_cache=memory.tree,
            token_to_kv_pool_allocator=memory.allocator,
            req_to_token_pool=memory.req_to_token_pool,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=memory.total,
            get_last_batch=lambda: _LiveRequests(self._live),
            get_running_batch=lambda: None,
        )
        observer = found.Observer(
            **_fields_of(
                found.Observer,
                {
                    **common,
                    "session_controller": SimpleNamespace(sessions={}),
                    "hisparse_coordinator": None,
                    "enable_hisparse": False,
                },
            )
        )
        self.checker = found.Checker(
            **_fields_of(
                found.Checker,
                {
                    **common,
                    "disaggregation_mode": found.not_disaggregated,
                    "page_size": memory.page_size,
                    "pool_stats_observer": observer,
                    "scheduler_stage_metrics": None,
                    "get_chunked_req": lambda: None,
                },
            )
        )

    def verdicts(self, *, live: list[Any]) -> list[dict[str, Any]]:
        """Each check's verdict on the memory with ``live`` requests running: the kvcheck
        law it checks, whether it checks all of it, and its message (``None``: it found
        nothing). The row check is asked only when nothing is live."""
        self._live = list(live)
        with env.scoped_environ(
            SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY="0",
            SGLANG_CHECK_KV_PAGE_INVARIANTS="0",
            SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1",
        ):
            found = [
                _verdict(BUSY_CHECK, "conservation", True, self.checker.self_check_during_busy),
                _verdict(PAGE_CHECK, "ownership", False, self.checker._check_kv_page_invariants),
            ]
            if not live:
                found.append(
                    _verdict(ROW_CHECK, "bookkeeping", False, self.checker._check_req_pool)
                )
        return found


def _verdict(name: str, law: str, exact: bool, check: Any) -> dict[str, Any]:
    try:
        check()
    except (AssertionError, ValueError) as failed:
        failure: str | None = f"{type(failed).__name__}: {failed}"
    else:
        failure = None
    return dict(name=f"sglang's {name}", law=law, exact=exact, failure=failure)
