"""The -k pre-check (kvcheck.runner.selection): its table of the shipped suite is current, and
it refuses only expressions that pytest would also select nothing with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvcheck
from kvcheck.runner.selection import keyword_verdict, selection_problem, suite_tests

#: Where the kvcheck under test is imported from: first on the subprocesses' path.
_KVCHECK_ROOT = str(Path(kvcheck.__file__).resolve().parents[1])


def _python(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``python ARGUMENTS`` in a fresh interpreter (this kvcheck first on its path), so that
    nothing imported or configured by earlier tests in this process changes what it sees."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([_KVCHECK_ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        cwd=_KVCHECK_ROOT,
        env=env,
        check=False,
        timeout=600,
    )


def _pytest_selects(expression: str) -> set[str]:
    """The test ids (module.py::name[params]) that pytest's own -k selects from the suite,
    collected by a pytest of its own (in-process, it would depend on what earlier tests
    imported: pytest cannot rewrite an imported kvcheck, and warns, an error here)."""
    arguments = ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    arguments += ["-p", "no:randomly"]
    done = _python("-m", "pytest", *arguments, "-k", expression, "--pyargs", "kvcheck.suite")
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.strip().rpartition("/")[2] for line in done.stdout.splitlines() if "::" in line}


def test_the_table_of_the_suite_is_current() -> None:
    """kvcheck/runner/_suite_keywords.py lists every test of the suite with its marks; when
    the suite changes, regenerate it: python -m kvcheck.runner.selection && ruff format.
    (Checked in a fresh interpreter, as _pytest_selects collects.)"""
    done = _python("-m", "kvcheck.runner.selection", "--check")
    last = (done.stdout.strip().splitlines() or [""])[-1]
    assert (done.returncode, last) == (0, "up to date"), done.stdout[-3000:] + done.stderr


@pytest.mark.parametrize(
    "expression",
    [
        "(dsa or mla) and not accounting",
        "kvcheck_needs and not parametrize",
    ],
)
def test_the_verdicts_agree_with_pytest(expression: str) -> None:
    """A test the pre-check says is selected is one pytest selects, and a test it says is
    not is one pytest does not (unsure verdicts aside)."""
    selected = _pytest_selects(expression)
    verdicts = {
        test: keyword_verdict(expression, known=(*test.split("::"), *marks), maybe=attributes)
        for test, (marks, attributes) in suite_tests().items()
    }
    assert {test for test, verdict in verdicts.items() if verdict} <= selected
    assert not {test for test, verdict in verdicts.items() if verdict is False} & selected
    assert selected


@pytest.mark.parametrize(
    ("expression", "verdict"),
    [
        ("move", True),
        ("MOVE and mha", True),
        ("move and not mha", False),
        ("not (move or mha)", False),
        ("suite", None),  # a directory name: depends on where pytest runs
        ("not suite", None),
        ("move and (", None),  # not an expression: pytest's to refuse
        ("move(x=1)", None),
    ],
)
def test_keyword_verdicts_are_three_valued(expression: str, verdict: bool | None) -> None:
    """Each name is a case-insensitive substring of a known name (True), of a name that may
    be there (None) or of neither (False); and, or and not follow Kleene's logic."""
    got = keyword_verdict(expression, known=("test_move[mha]",), maybe=("suite",))
    assert got is verdict


@pytest.mark.parametrize(
    ("expression", "refused"),
    [
        ("no_test_is_called_this", True),
        ("hnd and test_noop", True),
        ("hypothesis", False),  # a function attribute, whose presence varies
        ("suite and noop", False),  # a directory above the tests
        ("skip", False),  # a mark the plugin may add
        ("", False),
    ],
)
def test_only_an_expression_that_surely_selects_nothing_is_refused(
    expression: str, refused: bool
) -> None:
    """selection_problem refuses an expression only when no test can match it."""
    assert (selection_problem(expression) is not None) is refused
