"""The shipped suite's run order (kvcheck.runner.order): cheapest properties first, and a
project's own tests keep their places."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvcheck.suite
from kvcheck.runner.order import REPORT_ORDER, report_rank

pytest_plugins = ["pytester"]


def _collected_files(pytester: pytest.Pytester, *args: str) -> list[str]:
    """The test files of the collected items, in run order, one entry per run of items."""
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    files: list[str] = []
    for line in result.outlines:
        if "::" in line:
            name = Path(line.split("::", 1)[0]).stem
            if not files or files[-1] != name:
                files.append(name)
    return files


def test_every_suite_module_has_a_place() -> None:
    """A new suite module must be ranked, or it would silently run last."""
    suite_dir = Path(kvcheck.suite.__file__).parent
    modules = {path.stem for path in suite_dir.glob("test_*.py")}
    assert modules == {entry.partition("::")[0] for entry in REPORT_ORDER}


def test_unlisted_suite_module_runs_last_and_others_are_not_ranked() -> None:
    assert report_rank("kvcheck.suite.test_not_yet_ranked") == len(REPORT_ORDER)
    assert report_rank("kvcheck.suite") is None
    assert report_rank("tests.suite.test_noop") is None


#: The files of the suite in run order, one entry per run of items (an entry that names a
#: test function is a run of its module's items of its own).
_RUNS = [entry.partition("::")[0] for entry in REPORT_ORDER]


def test_suite_runs_in_report_order(pytester: pytest.Pytester) -> None:
    files = _collected_files(pytester, "--pyargs", "kvcheck.suite")
    assert files == _RUNS


def test_the_family_machines_run_before_the_tiers(pytester: pytest.Pytester) -> None:
    """The four family state machines, which catch most bugs of a user's own pool, run
    right after the no-op pool's tests, before the allocators; the module's other machine
    runs keep their place after the host pools."""
    result = pytester.runpytest(
        "--collect-only", "-q", "-p", "no:cacheprovider", "--pyargs", "kvcheck.suite"
    )
    names = [line.split("::", 1)[1] for line in result.outlines if "::" in line]
    machines = [i for i, name in enumerate(names) if name.startswith("test_pool_matches_")]
    assert [names[i].split("[")[1] for i in machines] == ["mha]", "mla]", "dsa]", "noop]"]
    assert machines == list(range(machines[0], machines[0] + 4))
    assert names[machines[0] - 1].startswith("test_noop")
    assert names[machines[-1] + 1].startswith("test_allocator")


def test_project_tests_keep_their_places(pytester: pytest.Pytester) -> None:
    """Project tests collected before and after the suite stay before and after it."""
    pytester.makepyfile(
        test_first="def test_one():\n    pass\n", test_last="def test_two():\n    pass\n"
    )
    files = _collected_files(pytester, "test_first.py", "--pyargs", "kvcheck.suite", "test_last.py")
    assert files == ["test_first", *_RUNS, "test_last"]
