"""kvcheck campaign without Ray: the plan, the merge, the JUnit file, the progress line, the
driver's loop on a stand-in executor, one shard's pytest run, and the command's checks.

The campaign on a real Ray cluster and Redis server is ``test_campaign_ray.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import textwrap
import threading
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvcheck.runner import cli
from kvcheck.runner.campaign import command, ray_executor
from kvcheck.runner.campaign.driver import ShardLost, drive
from kvcheck.runner.campaign.junit import junit_xml
from kvcheck.runner.campaign.merge import merge_results
from kvcheck.runner.campaign.plan import Planner, Property, Shard
from kvcheck.runner.campaign.progress import Progress, Status, status_line
from kvcheck.runner.campaign.shard import ShardContext, run_shard

# --- the plan ----------------------------------------------------------------------------------


def _machines_and_serving() -> list[Property]:
    return [
        Property("s/test_serving.py::test_rules", "test_serving", "test_rules"),
        Property("s/test_pool_machines.py::test_m[mha]", "test_pool_machines", "test_m"),
        Property("s/test_pool_machines.py::test_m[dsa]", "test_pool_machines", "test_m"),
        Property("s/test_serving.py::test_named[a]", "test_serving", "test_named"),
        Property("s/test_serving.py::test_named[b]", "test_serving", "test_named"),
        Property("s/test_gpu.py::test_cuda", "test_gpu", "test_cuda", skip="needs CUDA"),
    ]


def _take(planner: Planner, count: int) -> list[Shard]:
    shards = []
    for _ in range(count):
        shard = planner.next_shard()
        if shard is None:
            break
        shards.append(shard)
    return shards


def test_planner_interleaves_weighted_tests_and_groups_a_property_s_parameters() -> None:
    """Heavy modules first and once per pass of their weight, each parameter on its own; a
    light property's parameters share one shard; every shard has the next seed."""
    planner = Planner(_machines_and_serving(), seed=10, weights={"test_pool_machines": 2})
    shards = _take(planner, 5)
    assert [shard.nodeids for shard in shards] == [
        ("s/test_pool_machines.py::test_m[mha]",),
        ("s/test_pool_machines.py::test_m[dsa]",),
        ("s/test_serving.py::test_rules",),
        ("s/test_serving.py::test_named[a]", "s/test_serving.py::test_named[b]"),
        ("s/test_pool_machines.py::test_m[mha]",),
    ]
    assert [shard.seed for shard in shards] == [10, 11, 12, 13, 14]
    assert planner.finished == {"s/test_gpu.py::test_cuda": "skipped"}


def test_a_failed_exhausted_or_plain_test_leaves_the_plan() -> None:
    """A failure (stored, not searched again), an exhausted search space and a test without
    Hypothesis are not planned again; the plan ends when nothing is left."""
    planner = Planner(_machines_and_serving(), seed=0, weights={"test_pool_machines": 2})
    planner.record(
        "s/test_pool_machines.py::test_m[mha]", outcome="failed", searched=True, exhausted=False
    )
    planner.record(
        "s/test_pool_machines.py::test_m[dsa]", outcome="passed", searched=True, exhausted=True
    )
    planner.record(
        "s/test_serving.py::test_named[a]", outcome="passed", searched=False, exhausted=False
    )
    planner.record(
        "s/test_serving.py::test_named[b]", outcome="skipped", searched=False, exhausted=False
    )
    assert [shard.nodeids for shard in _take(planner, 3)] == [
        ("s/test_serving.py::test_rules",)
    ] * 3
    planner.record("s/test_serving.py::test_rules", outcome="passed", searched=True, exhausted=True)
    assert planner.next_shard() is None
    assert planner.searching() == []


def test_the_example_budget_ends_the_plan() -> None:
    """Shards are handed out until the examples run and promised reach the budget; a shard
    that ran fewer than it might have (a plain test: none) leaves room for more."""
    planner = Planner(_machines_and_serving(), seed=0, examples_per_test=100, max_examples=250)
    shards = _take(planner, 10)
    assert [shard.planned_examples() for shard in shards] == [100, 100, 100]
    planner.shard_done(shards[0], examples=100)
    assert planner.next_shard() is None
    planner.shard_done(shards[1], examples=0)
    assert planner.next_shard() is not None
    assert planner.next_shard() is None


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("seed", -1, "seed=-1"),
        ("examples_per_test", 0, "examples_per_test=0"),
        ("max_examples", 0, "max_examples=0"),
        ("weights", {"m": 0}, "weights="),
    ],
)
def test_planner_arguments_are_validated(keyword: str, value: Any, message: str) -> None:
    """Bad planner arguments raise ValueError naming the argument and its value."""
    arguments: dict[str, Any] = {"seed": 0, keyword: value}
    with pytest.raises(ValueError, match=message):
        Planner([], **arguments)


# --- merged results, JUnit, progress ----------------------------------------------------------


def _outcome(number: int, seed: int, *tests: dict[str, Any], **extra: Any) -> dict[str, Any]:
    results = {
        "format": 1,
        "target": {"name": "kvcheck", "version": "0"},
        "device": {"requested": "auto", "resolved": "cpu"},
        "database": "directory db",
        "env": {},
        "collection_errors": [],
        "tests": list(tests),
    }
    return {
        "shard": number,
        "seed": seed,
        "exit_status": 0,
        "stopped": False,
        "results": results,
        **extra,
    }


def _test(nodeid: str, outcome: str, examples: int, **extra: Any) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "outcome": outcome,
        "duration_s": 1.0,
        "device": "cpu",
        "statistics": {
            "runs": 1,
            "examples": examples,
            "shrinks": 0,
            "phases": {"generate": {"valid": examples}},
        },
        **extra,
    }


def test_merge_adds_up_each_test_over_its_shards() -> None:
    """One record per test: failing wins, examples and phases add up, each distinct failure
    once with the seed that found it, skips at collection listed with their reason."""
    failure = {"error": "PropertyFailure: boom", "example": "state.step()", "blob": "@r(b'x')"}
    outcomes = [
        _outcome(1, 7, _test("a", "passed", 1000), _test("b", "passed", 1000)),
        _outcome(2, 8, _test("a", "failed", 30, failures=[failure]), _test("b", "passed", 500)),
        _outcome(3, 9, _test("a", "failed", 12, failures=[failure])),
    ]
    properties = [
        Property("a", "m", "a"),
        Property("b", "m", "b"),
        Property("c", "m", "c", skip="needs CUDA"),
    ]
    results = merge_results(outcomes, properties=properties, duration_s=5.0, campaign={"x": 1})
    a, b, c = results["tests"]
    assert (a["outcome"], a["statistics"]["examples"], a["seeds"]) == ("failed", 1042, [7, 8, 9])
    assert a["statistics"]["phases"]["generate"]["valid"] == 1042
    assert a["failures"] == [{**failure, "seed": 8}] and a["failing_seeds"] == [8, 9]
    assert (b["outcome"], b["statistics"]["examples"], b["shards"]) == ("passed", 1500, [1, 2])
    assert (c["outcome"], c["skip_reason"]) == ("skipped", "needs CUDA")
    assert results["target"]["name"] == "kvcheck" and results["campaign"] == {"x": 1}


def test_a_test_only_ever_stopped_stays_interrupted_else_its_runs_count() -> None:
    """A shard stopped mid-test does not turn a pass into anything else; a test no shard
    finished is 'interrupted'."""
    outcomes = [
        _outcome(1, 1, _test("a", "passed", 1000), {"nodeid": "b", "outcome": "interrupted"}),
        _outcome(2, 2, {"nodeid": "a", "outcome": "interrupted"}, stopped=True),
    ]
    properties = [Property("a", "m", "a"), Property("b", "m", "b")]
    a, b = merge_results(outcomes, properties=properties, duration_s=1.0, campaign={})["tests"]
    assert (a["outcome"], b["outcome"]) == ("passed", "interrupted")


def test_junit_lists_each_test_with_its_failures_and_skips() -> None:
    """The JUnit file has a test case per test: failure with reproduction and seed, skipped
    with its reason, examples and seeds as properties; the counts add up."""
    failure = {
        "error": "PropertyFailure: boom\nmore",
        "reproduction": "Minimal example: f()",
        "blob": "@reproduce_failure('6', b'x')",
        "seed": 8,
    }
    results = {
        "target": {"name": "kvcheck"},
        "tests": [
            {
                "nodeid": "s/test_a.py::test_x[dsa]",
                "outcome": "failed",
                "duration_s": 2.0,
                "statistics": {"examples": 42},
                "failures": [failure],
                "seeds": [7, 8],
            },
            {"nodeid": "s/test_a.py::test_y", "outcome": "skipped", "skip_reason": "no GPU"},
            {"nodeid": "s/test_b.py::test_z", "outcome": "passed", "duration_s": 1.5},
        ],
    }
    root = ET.fromstring(junit_xml(results))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    cases = root.findall("testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("s.test_a", "test_x[dsa]"),
        ("s.test_a", "test_y"),
        ("s.test_b", "test_z"),
    ]
    found = cases[0].find("failure")
    assert found is not None and found.get("message") == "PropertyFailure: boom"
    assert "found with --hypothesis-seed=8" in (found.text or "")
    values = {p.get("name"): p.get("value") for p in cases[0].iter("property")}
    assert values == {"examples": "42", "shards": "2", "seeds": "7 8"}
    skipped = cases[1].find("skipped")
    assert skipped is not None and skipped.get("message") == "no GPU"


def test_progress_prints_a_line_per_tenth_of_the_budget_off_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off a terminal the status line comes about every tenth of the budget; events always."""
    progress = Progress(budget_s=100.0, tty=False)
    for second in (0.0, 3.0, 9.0, 10.5):
        progress.update(
            Status(second, examples=int(second * 10), shards_done=1, running=2, failures=0)
        )
    progress.event("FAILED t (shard 3, seed 9)")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        status_line(Status(0.0, 0, 1, 2, 0), budget_s=100.0),
        status_line(Status(10.5, 105, 1, 2, 0), budget_s=100.0),
        "FAILED t (shard 3, seed 9)",
    ]
    assert (
        lines[1]
        == "campaign 00:10/01:40  105 examples (10.0/s)  shards 1 done, 2 running  failures 0"
    )


# --- the driver's loop --------------------------------------------------------------------------


class _Executor:
    """Runs shards in the order submitted; each result is ``results_for(shard)``."""

    def __init__(self, results_for: Any, *, capacity: int = 2, on_wait: Any = None) -> None:
        self.capacity = capacity
        self.results_for = results_for
        self.on_wait = on_wait
        self.submitted: list[Shard] = []
        self.stopped: list[list[str]] = []
        self.stopped_all = 0
        #: What the running shards report having run so far.
        self.running_examples = 0

    def submit(self, shard: Shard) -> Shard:
        self.submitted.append(shard)
        return shard

    def wait(self, handles: Sequence[Shard], timeout: float) -> list[Shard]:
        if self.on_wait is not None:
            self.on_wait(self)
        return [handles[0]]

    def result(self, shard: Shard) -> dict[str, Any]:
        return self.results_for(self, shard)

    def examples_running(self, shards: Sequence[Shard]) -> int:
        return self.running_examples

    def stop(self, nodeids: Sequence[str]) -> None:
        self.stopped.append(list(nodeids))

    def stop_all(self) -> None:
        self.stopped_all += 1

    def cancel(self, handles: Sequence[Shard]) -> None:
        raise AssertionError("not cancelled in these tests")


def _ran(shard: Shard, outcome: str, *, stopped: bool = False) -> dict[str, Any]:
    tests = [_test(nodeid, outcome, 10) for nodeid in shard.nodeids]
    return _outcome(shard.number, shard.seed, *tests, stopped=stopped)


def test_driver_stops_shards_of_a_failed_test_and_plans_no_more_of_it() -> None:
    """Once a shard fails a test, the running shards of that test are told to stop and no
    later shard searches it; the loop ends when the plan does."""

    def results_for(executor: _Executor, shard: Shard) -> dict[str, Any]:
        return _ran(shard, "failed" if shard.seed == 1 else "passed")

    planner = Planner([Property("t", "m", "t")], seed=0, max_examples=3000)
    executor = _Executor(results_for)
    run = drive(planner, executor, time_budget_s=None, progress=None)
    assert [shard.seed for shard in executor.submitted] == [0, 1, 2]
    assert run.failed == ["t"] and executor.stopped == [["t"]]
    assert not run.interrupted and not run.out_of_time and run.examples() == 30


def test_driver_counts_a_lost_shard_and_does_not_plan_its_tests_again() -> None:
    """A shard whose task died is listed as lost and its tests leave the plan."""

    def results_for(executor: _Executor, shard: Shard) -> dict[str, Any]:
        raise ShardLost("WorkerCrashedError: the worker died")

    run = drive(
        Planner([Property("t", "m", "t")], seed=0),
        _Executor(results_for, capacity=1),
        time_budget_s=None,
        progress=None,
    )
    assert [(shard.seed, why) for shard, why in run.lost] == [
        (0, "WorkerCrashedError: the worker died")
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_stops_every_shard_and_keeps_what_they_ran(
    signum: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGINT or SIGTERM during the campaign: every shard is told to stop, no shard starts
    after it, and the stopped shards' results are kept; the previous handler is restored."""

    def interrupt_once(executor: _Executor) -> None:
        if executor.stopped_all == 0 and len(executor.submitted) == 2:
            os.kill(os.getpid(), signum)

    def results_for(executor: _Executor, shard: Shard) -> dict[str, Any]:
        return _ran(shard, "passed", stopped=executor.stopped_all > 0)

    before = signal.getsignal(signum)
    executor = _Executor(results_for, on_wait=interrupt_once)
    run = drive(
        Planner([Property("t", "m", "t")], seed=0),
        executor,
        time_budget_s=None,
        progress=Progress(budget_s=None, tty=False),
    )
    assert run.interrupted and executor.stopped_all == 1
    assert len(executor.submitted) == 2 and len(run.outcomes) == 2
    assert signal.getsignal(signum) is before
    assert "interrupted: stopping 1 running shard(s)" in capsys.readouterr().out


def test_the_progress_line_counts_examples_while_the_shards_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before any shard finishes, the progress line counts the examples the running shards
    report, not 0; a shard stopped mid-test still counts what it was seen running."""
    ticks = []

    class Running(_Executor):
        def wait(self, handles: Sequence[Shard], timeout: float) -> list[Shard]:
            ticks.append(timeout)
            self.running_examples = 40 * len(ticks)
            return [] if len(ticks) < 3 else list(handles)

    def results_for(executor: _Executor, shard: Shard) -> dict[str, Any]:
        stopped = {"nodeid": shard.nodeids[0], "outcome": "interrupted"}
        return _outcome(shard.number, shard.seed, stopped, examples_seen={shard.nodeids[0]: 60})

    # Stopped shards count what they were seen running, against the budget too: 60 + 60.
    planner = Planner([Property("t", "m", "t")], seed=0, examples_per_test=100, max_examples=100)
    run = drive(
        planner,
        Running(results_for, capacity=1),
        time_budget_s=None,
        progress=Progress(budget_s=None, tty=False),
    )
    first = capsys.readouterr().out.splitlines()[0]
    assert " 40 examples " in first and "0 done, 1 running" in first
    assert run.examples() == 120 and run.searched() == set()


@pytest.mark.parametrize("searched", [1, 3], ids=["budget-ended-early", "every-test"])
def test_the_summary_says_first_how_much_was_searched_and_exit_3_if_not_all(
    searched: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's first line gives the planned tests searched, the examples per test and
    how long one round of the plan takes at the measured rate; a budget that ended before
    every planned test had a shard run to its end exits 3 (incomplete), not 0."""
    from kvcheck.runner.campaign.driver import CampaignRun

    properties = [Property(n, "m", n) for n in "abc"] + [Property("d", "m", "d", skip="GPU")]
    planner = Planner(properties, seed=0, examples_per_test=50)
    finished = [_test(nodeid, "passed", 50) for nodeid in "abc"[:searched]]
    stopped = [{"nodeid": nodeid, "outcome": "interrupted"} for nodeid in "abc"[searched:]]
    run = CampaignRun(
        outcomes=[_outcome(1, 0, *finished, *stopped)], out_of_time=True, duration_s=10.0
    )
    status, lines = _report(tmp_path, run, planner, capsys)
    results = json.loads((tmp_path / "results.json").read_text())
    # 50 examples per searched test in 10 s; a round is 3 tests x 50 examples.
    rate = 5.0 * searched
    if searched == 3:
        assert status == 0
        assert lines[0] == (
            "kvcheck campaign: searched all 3 planned tests, 50 examples per searched test "
            f"(up to 50 per shard); one round of the plan (150 examples) takes about "
            f"{150 / rate:.0f}s at the measured {rate} examples/s"
        )
    else:
        assert status == command.EXIT_INCOMPLETE == 3 and results["exit_status"] == 3
        assert lines[0].startswith(
            "kvcheck campaign: INCOMPLETE: searched 1 of 3 planned tests (2 never ran to the "
            "end of a shard: 'unsearched' in results.json), 50 examples per searched test"
        )
        assert lines[0].endswith("would take about 30s at the measured 5.0 examples/s")
        assert results["campaign"]["unsearched"] == ["b", "c"]


def _report(
    tmp_path: Path, run: Any, planner: Planner, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    """The command's report of ``run``: its exit status and the summary's lines."""
    options = argparse.Namespace(verbosity=0, json_path=None, junit_xml=None)
    status = command._report(
        options,
        planner=planner,
        run=run,
        workers=2,
        context=ShardContext(suite="kvcheck.suite", target="kvcheck"),
        seed=0,
        results_dir=tmp_path,
        repro_dir=tmp_path / "repros",
        import_root=None,
    )
    return status, [line for line in capsys.readouterr().out.splitlines() if line.strip()]


# --- one shard's pytest run (no Ray) -----------------------------------------------------------

_SHARD_SUITE = """
    import os
    import signal

    import time

    from hypothesis import given, settings, strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

    @given(st.integers())
    def test_counts(x):
        pass

    @given(st.integers(0, 10**6))
    def test_fails_above(x):
        assert x < 1000

    def test_plain():
        pass

    class Steps(RuleBasedStateMachine):
        @rule(x=st.integers())
        def step(self, x):
            pass

    def test_machine():
        run_state_machine_as_test(Steps)

    @settings(deadline=None)
    @given(st.integers())
    def test_slow(x):
        time.sleep(0.02)

    def test_waits_for_the_stop():
        started = os.environ.get("SHARD_BLOCKS")
        if started:
            open(started, "w").close()
            signal.pause()  # until the shard is stopped
"""


@pytest.fixture
def shard_suite(tmp_path: Path) -> ShardContext:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_shard.py").write_text(textwrap.dedent(_SHARD_SUITE))
    return ShardContext(
        suite=str(suite),
        target="kvcheck",
        device="cpu",
        cwd=str(tmp_path),
        env={"KVCHECK_DB": str(tmp_path / "db")},
        pytest_args=("-p", "no:randomly"),
    )


def test_a_shard_runs_only_its_tests_with_its_seed_and_examples(shard_suite: ShardContext) -> None:
    """A shard runs exactly its tests, each Hypothesis test with the shard's example count,
    and returns the results file's records."""
    nodeids = ("suite/test_shard.py::test_counts", "suite/test_shard.py::test_fails_above")
    outcome = run_shard(Shard(1, nodeids, seed=3, examples=7), shard_suite)
    records = {t["nodeid"]: t for t in outcome["results"]["tests"]}
    assert set(records) == set(nodeids)
    assert records[nodeids[0]]["statistics"]["examples"] == 7
    assert records[nodeids[1]]["outcome"] == "failed"
    assert (outcome["exit_status"], outcome["stopped"], outcome["seed"]) == (1, False, 3)
    assert outcome["results"]["profile"] == "kvcheck-campaign"


def test_a_shard_reports_its_test_cases_while_they_run(shard_suite: ShardContext) -> None:
    """While pytest runs, on_examples gets the test cases run so far per test (a @given
    test's calls and a state machine's runs), and the outcome keeps the last count."""
    nodeids = tuple(f"suite/test_shard.py::{name}" for name in ("test_machine", "test_slow"))
    reports: list[dict[str, int]] = []
    outcome = run_shard(
        Shard(5, nodeids, seed=0, examples=60), shard_suite, on_examples=reports.append, poll_s=0.2
    )
    assert outcome["exit_status"] == 0, outcome["log_tail"]
    seen = outcome["examples_seen"]
    assert seen[nodeids[0]] >= 60 and seen[nodeids[1]] >= 60, seen
    partial = [sum(report.values()) for report in reports]
    assert any(0 < count < sum(seen.values()) for count in partial), partial


def test_a_seeded_shard_stores_its_failure_for_the_next_one(shard_suite: ShardContext) -> None:
    """A shard's seed keeps the example database on (--hypothesis-seed would turn it off):
    the next shard of the same failing test replays the stored example first."""
    nodeids = ("suite/test_shard.py::test_fails_above",)
    first = run_shard(Shard(1, nodeids, seed=5, examples=50), shard_suite)
    second = run_shard(Shard(2, nodeids, seed=6, examples=50), shard_suite)
    (found,) = first["results"]["tests"]
    (replayed,) = second["results"]["tests"]
    assert found["outcome"] == replayed["outcome"] == "failed"
    assert found["stored_examples"] == 0 and replayed["stored_examples"] > 0
    assert replayed["statistics"]["phases"]["reuse"]["failing"] == 1


def test_a_shard_asked_to_stop_interrupts_pytest_and_returns_what_ran(
    shard_suite: ShardContext,
) -> None:
    """should_stop() interrupts pytest as a Ctrl-C would: the finished test is kept, the
    running one is 'interrupted'."""
    started = Path(str(shard_suite.cwd)) / "started"
    env = {**shard_suite.env, "SHARD_BLOCKS": str(started)}
    context = ShardContext(**{**vars(shard_suite), "env": env})
    nodeids = ("suite/test_shard.py::test_plain", "suite/test_shard.py::test_waits_for_the_stop")
    outcome = run_shard(
        Shard(2, nodeids, seed=0, examples=5), context, should_stop=started.exists, poll_s=0.2
    )
    # Once (CI, heavy load) pytest wrote no results here: the end of its log says why.
    assert outcome["results"] is not None, (outcome["exit_status"], outcome["log_tail"])
    outcomes = {t["nodeid"]: t["outcome"] for t in outcome["results"]["tests"]}
    assert outcomes == {nodeids[0]: "passed", nodeids[1]: "interrupted"}
    assert outcome["stopped"] and outcome["exit_status"] == 2


def test_a_shard_started_with_sigint_ignored_still_stops(shard_suite: ShardContext) -> None:
    """A driver started in the background of a script (``cmd &`` without job control: CI
    runners, nohup jobs) has SIGINT ignored, and its children inherit that across exec:
    pytest must still stop on the one SIGINT it is sent, not be killed after the grace."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal dispositions can be set from the main thread only")
    started = Path(str(shard_suite.cwd)) / "started"
    env = {**shard_suite.env, "SHARD_BLOCKS": str(started)}
    context = ShardContext(**{**vars(shard_suite), "env": env})
    nodeids = ("suite/test_shard.py::test_waits_for_the_stop",)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcome = run_shard(
            Shard(4, nodeids, seed=0, examples=5), context, should_stop=started.exists, poll_s=0.2
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome["exit_status"] == 2, (outcome["exit_status"], outcome["log_tail"])
    assert outcome["results"] is not None
    assert [t["outcome"] for t in outcome["results"]["tests"]] == ["interrupted"]


def test_a_shard_naming_a_test_not_collected_is_a_usage_error(shard_suite: ShardContext) -> None:
    """A node id the worker does not collect (another layout) fails the shard, saying so."""
    outcome = run_shard(
        Shard(3, ("suite/test_shard.py::test_gone",), seed=0, examples=5), shard_suite
    )
    assert outcome["exit_status"] == 4
    assert "1 test(s) not collected here: suite/test_shard.py::test_gone" in outcome["log_tail"]


# --- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--minutes", "0"], "--minutes=0.0 must be positive"),
        (["--examples", "0"], "--examples=0 must be at least 1"),
        (["--examples-per-test", "0"], "--examples-per-test=0 must be at least 1"),
        (["--workers", "0"], "--workers=0 must be at least 1"),
        (["--seed", "-3"], "--seed=-3 must be at least 0"),
    ],
)
def test_bad_budgets_exit_2_naming_the_option(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad number is a usage error (exit 2) that names the option and its value."""
    assert cli.main(["campaign", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_without_ray_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray is the campaign extra: without it, exit 2 with the install command."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_executor, "ray_available", lambda: False)
    assert cli.main(["campaign", "--minutes", "1"]) == 2
    assert "pip install 'kvcheck[campaign]'" in capsys.readouterr().err


def test_neither_budget_means_the_default_minutes() -> None:
    """No --minutes and no --examples: the default time budget; --examples alone: no time
    limit."""
    parser = argparse.ArgumentParser()
    command.add_campaign_parser(parser.add_subparsers())
    assert command._budgets(parser.parse_args(["campaign"])) == (
        command.DEFAULT_MINUTES * 60,
        None,
    )
    assert command._budgets(parser.parse_args(["campaign", "--examples", "5"])) == (None, 5)


def test_campaign_exit_codes_follow_verify() -> None:
    """130 interrupted; 2 lost save, shard error or lost shard; 1 failing test; else 0."""
    failing = {"tests": [{"outcome": "failed"}], "campaign": {}}
    assert command._exit_code(failing, interrupted=True) == 130
    assert command._exit_code(failing, interrupted=False) == 1
    lost = {"tests": [{"outcome": "failed", "save_errors": ["OSError"]}], "campaign": {}}
    assert command._exit_code(lost, interrupted=False) == 2
    broken = {"tests": [{"outcome": "passed"}], "campaign": {"shard_errors": [{"shard": 1}]}}
    assert command._exit_code(broken, interrupted=False) == 2
    assert (
        command._exit_code({"tests": [{"outcome": "passed"}], "campaign": {}}, interrupted=False)
        == 0
    )


def test_shards_log_is_one_json_line_per_shard(tmp_path: Path) -> None:
    """shards.jsonl keeps each finished shard's outcome."""

    run = argparse.Namespace(outcomes=[{"shard": 1, "seed": 4}, {"shard": 2, "seed": 5}])
    command._keep_shard_log(tmp_path / "shards.jsonl", run)
    lines = (tmp_path / "shards.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == [4, 5]
