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
    assert modules == set(REPORT_ORDER)


def test_unlisted_suite_module_runs_last_and_others_are_not_ranked() -> None:
    assert report_rank("kvcheck.suite.test_not_yet_ranked") == len(REPORT_ORDER)
    assert report_rank("kvcheck.suite") is None
    assert report_rank("tests.suite.test_noop") is None


def test_suite_runs_in_report_order(pytester: pytest.Pytester) -> None:
    files = _collected_files(pytester, "--pyargs", "kvcheck.suite")
    assert files == list(REPORT_ORDER)


def test_project_tests_keep_their_places(pytester: pytest.Pytester) -> None:
    """Project tests collected before and after the suite stay before and after it."""
    pytester.makepyfile(
        test_first="def test_one():\n    pass\n", test_last="def test_two():\n    pass\n"
    )
    files = _collected_files(pytester, "test_first.py", "--pyargs", "kvcheck.suite", "test_last.py")
    assert files == ["test_first", *REPORT_ORDER, "test_last"]
