"""The campaign's loop: keep every worker busy with a shard until the budget is spent.

The driver asks the :class:`~kvcheck.runner.campaign.plan.Planner` for shards while an
:class:`Executor` (Ray, :mod:`kvcheck.runner.campaign.ray_executor`) has a free worker,
collects each finished shard's results, and tells the planner what they say. When a shard
fails a test, the tests that every other running shard still searches are checked: a
running shard all of whose tests have failed elsewhere is stopped, so one bug is not
shrunk twice, and no later shard searches a failed test again (its minimal example is in
the shared database).

It stops starting shards when the planner has none left (every test failed, was
exhausted, or the example budget is handed out) or the time budget is spent; at the time
limit, and on SIGINT or SIGTERM, it stops the running shards (each pytest is interrupted,
records what it ran and returns it) and waits for them. A second interrupt cancels them
without waiting.

Example (a stand-in executor that runs each shard at once):
    >>> from kvcheck.runner.campaign.plan import Planner, Property
    >>> class Now:
    ...     capacity = 1
    ...     def submit(self, shard): return shard
    ...     def wait(self, handles, timeout): return list(handles)
    ...     def result(self, shard):
    ...         tests = [{"nodeid": n, "outcome": "failed", "statistics": {"runs": 1}}
    ...                  for n in shard.nodeids]
    ...         return {"shard": shard.number, "seed": shard.seed, "nodeids": shard.nodeids,
    ...                 "exit_status": 1, "stopped": False, "results": {"tests": tests}}
    ...     def examples_running(self, shards): return 0
    ...     def stop(self, nodeids): pass
    ...     def stop_all(self): pass
    ...     def cancel(self, handles): pass
    >>> run = drive(Planner([Property("t", "m", "t")], seed=5), Now(), time_budget_s=None,
    ...             progress=None)
    >>> [outcome["seed"] for outcome in run.outcomes], run.failed
    ([5], ['t'])
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvcheck.runner.campaign.plan import Planner, Shard
from kvcheck.runner.campaign.progress import Progress, Status

__all__ = ["CampaignRun", "Executor", "ShardLost", "drive", "outcome_examples"]

_FAILING = ("failed", "error", "xpassed")
#: How often the loop wakes up (progress line, time budget, interrupts) while shards run.
_TICK_S = 1.0
#: Hypothesis's reason for stopping when it has tried every example there is.
_EXHAUSTED = "nothing left to do"


class ShardLost(Exception):
    """A shard's task ended without results (its worker or machine died)."""


class Executor(Protocol):
    """Runs shards on workers; ``capacity`` of them at once."""

    capacity: int

    def submit(self, shard: Shard) -> Any:
        """Start ``shard``; a handle to wait on."""

    def wait(self, handles: Sequence[Any], timeout: float) -> list[Any]:
        """The handles among ``handles`` whose shard finished, waiting up to ``timeout`` s."""

    def result(self, handle: Any) -> dict[str, Any]:
        """A finished shard's outcome (:func:`kvcheck.runner.campaign.shard.run_shard`);
        :class:`ShardLost` if its task died."""

    def examples_running(self, shards: Sequence[Shard]) -> int:
        """Test cases the running ``shards`` have run so far, as they last reported."""

    def stop(self, nodeids: Sequence[str]) -> None:
        """Stop the running shards all of whose tests are among ``nodeids``."""

    def stop_all(self) -> None:
        """Stop every running shard (each returns what it ran)."""

    def cancel(self, handles: Sequence[Any]) -> None:
        """Cancel these shards without waiting for their results."""


@dataclass
class CampaignRun:
    """What the loop did: the finished shards' outcomes, the shards that were lost
    (``(shard, why)``), the tests that failed (in the order found), whether it was
    interrupted or ran out of time, and how long it ran."""

    outcomes: list[dict[str, Any]] = field(default_factory=list)
    lost: list[tuple[Shard, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False
    out_of_time: bool = False
    duration_s: float = 0.0

    def examples(self) -> int:
        """Examples run by the finished shards, all tests together: for each test a shard
        finished, its results' count; for one it was stopped in, the test cases it was
        counted running (a stopped test's results count none).

        Example:
            >>> run = CampaignRun(outcomes=[{"results": {"tests": [
            ...     {"nodeid": "a", "outcome": "passed", "statistics": {"examples": 10}},
            ...     {"nodeid": "b", "outcome": "interrupted"}]},
            ...     "examples_seen": {"a": 11, "b": 4}}])
            >>> run.examples()
            14
        """
        return sum(outcome_examples(outcome) for outcome in self.outcomes)

    def searched(self) -> set[str]:
        """The tests some shard ran to their end (passed, failed, ... but not stopped)."""
        return {
            str(test["nodeid"])
            for outcome in self.outcomes
            for test in (outcome.get("results") or {}).get("tests") or ()
            if test.get("outcome") != "interrupted"
        }


def outcome_examples(outcome: Mapping[str, Any]) -> int:
    """The examples one finished shard ran (see :meth:`CampaignRun.examples`)."""
    records = {
        str(test["nodeid"]): test for test in (outcome.get("results") or {}).get("tests") or ()
    }
    seen: Mapping[str, int] = outcome.get("examples_seen") or {}
    total = sum(_examples(r) for r in records.values() if r.get("outcome") != "interrupted")
    return total + sum(
        count
        for nodeid, count in seen.items()
        if nodeid not in records or records[nodeid].get("outcome") == "interrupted"
    )


def drive(
    planner: Planner,
    executor: Executor,
    *,
    time_budget_s: float | None,
    progress: Progress | None,
) -> CampaignRun:
    """Run the campaign's shards on ``executor`` until the plan or ``time_budget_s`` ends."""
    run = CampaignRun()
    started = time.monotonic()
    deadline = None if time_budget_s is None else started + time_budget_s
    running: dict[Any, Shard] = {}
    stopping = False
    with _interrupts() as interrupts:
        while True:
            now = time.monotonic()
            if interrupts.count and not run.interrupted:
                run.interrupted = stopping = True
                executor.stop_all()
                _event(progress, f"interrupted: stopping {len(running)} running shard(s)")
            if interrupts.count > 1 and running:
                executor.cancel(list(running))
                run.lost += [
                    (shard, "cancelled by a second interrupt") for shard in running.values()
                ]
                running.clear()
            if not stopping and deadline is not None and now >= deadline:
                run.out_of_time = stopping = True
                executor.stop_all()
                _event(progress, f"time budget spent: stopping {len(running)} running shard(s)")
            while not stopping and len(running) < executor.capacity:
                shard = planner.next_shard()
                if shard is None:
                    break
                running[executor.submit(shard)] = shard
            if not running:
                break
            timeout = _TICK_S if deadline is None else max(0.0, min(_TICK_S, deadline - now))
            for handle in executor.wait(list(running), timeout):
                _finished(run, planner, executor, running.pop(handle), handle, progress)
            if progress is not None:
                progress.update(_status(run, started, executor, list(running.values())))
    run.duration_s = time.monotonic() - started
    if progress is not None:
        progress.update(_status(run, started, executor, []))
        progress.close()
    return run


def _finished(
    run: CampaignRun,
    planner: Planner,
    executor: Executor,
    shard: Shard,
    handle: Any,
    progress: Progress | None,
) -> None:
    try:
        outcome = executor.result(handle)
    except ShardLost as lost:
        planner.shard_done(shard, examples=0)
        run.lost.append((shard, str(lost)))
        for nodeid in shard.nodeids:  # searching it again would most likely fail again
            planner.record(nodeid, outcome="error", searched=True, exhausted=False)
        _event(progress, f"shard {shard.number} lost: {lost}")
        return
    run.outcomes.append(outcome)
    records = {t["nodeid"]: t for t in (outcome.get("results") or {}).get("tests") or ()}
    planner.shard_done(shard, examples=outcome_examples(outcome))
    broken = outcome.get("exit_status") not in (0, 1) and not outcome.get("stopped")
    newly_failed = []
    for nodeid in shard.nodeids:
        record = records.get(nodeid)
        if record is None or record.get("outcome") == "interrupted":
            if broken:  # pytest could not run it here: do not plan it again
                planner.record(nodeid, outcome="error", searched=True, exhausted=False)
            continue
        statistics = record.get("statistics") or {}
        planner.record(
            nodeid,
            outcome=str(record.get("outcome")),
            searched=int(statistics.get("runs") or 0) > 0,
            exhausted=any(_EXHAUSTED in str(r) for r in statistics.get("stopped_because") or ()),
        )
        if record.get("outcome") in _FAILING and nodeid not in run.failed:
            run.failed.append(nodeid)
            newly_failed.append(nodeid)
    if broken:
        _event(
            progress,
            f"shard {shard.number} (seed {shard.seed}) ended with pytest exit "
            f"{outcome.get('exit_status')}; it is reported as an error",
        )
    for nodeid in newly_failed:
        _event(progress, f"FAILED {nodeid} (shard {shard.number}, seed {shard.seed})")
    if newly_failed:
        executor.stop(list(run.failed))


def _examples(record: Mapping[str, Any]) -> int:
    """The examples one shard's record of a test ran (0 for a test without Hypothesis)."""
    return int((record.get("statistics") or {}).get("examples") or 0)


def _status(
    run: CampaignRun, started: float, executor: Executor, running: Sequence[Shard]
) -> Status:
    return Status(
        elapsed_s=time.monotonic() - started,
        examples=run.examples() + (executor.examples_running(running) if running else 0),
        shards_done=len(run.outcomes),
        running=len(running),
        failures=len(run.failed),
    )


def _event(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress.event(text)


class _Interrupts:
    """Counts SIGINT and SIGTERM while the loop runs (the loop looks every tick)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1


@contextlib.contextmanager
def _interrupts() -> Iterator[_Interrupts]:
    """SIGINT and SIGTERM counted instead of raised, then the previous handlers back."""
    interrupts = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts  # signals go to the main thread only: nothing to catch here
        return
    previous: Mapping[int, Any] = {
        signum: signal.signal(signum, interrupts) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield interrupts
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
