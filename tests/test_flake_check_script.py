"""scripts/flake_check.py: argument handling, the summary, and one real run of a tiny suite."""

from __future__ import annotations

import sys

import pytest
from script_modules import load_script


@pytest.fixture(scope="module")
def flake_check():
    try:
        yield load_script("flake_check")
    finally:
        sys.modules.pop("flake_check", None)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--runs", "0"], "--runs=0"),
        (["--workers", "-1"], "--workers=-1"),
        (["--seed", "-3"], "--seed=-3"),
    ],
)
def test_bad_arguments_are_usage_errors(flake_check, capsys, argv, named):
    """Zero runs, negative workers or a negative seed exit 2 naming the option."""
    with pytest.raises(SystemExit) as exit_info:
        flake_check.main(argv)
    assert exit_info.value.code == 2 and named in capsys.readouterr().err


def test_each_run_gets_its_own_seed_and_the_ci_profile(flake_check):
    """The command pins the built-in target and kvcheck-ci; the seed is passed through."""
    command = flake_check.pytest_command(suite="--pyargs kvcheck.suite", workers=2, seed=41)
    assert command[command.index("--hypothesis-seed") + 1] == "41"
    assert command[command.index("--kvcheck-profile") + 1] == "kvcheck-ci"
    assert command[command.index("--kvcheck-target") + 1] == "kvcheck"
    assert command[command.index("-n") + 1] == "2"
    assert "-n" not in flake_check.pytest_command(suite="x.py", workers=0, seed=0)


def test_summary_counts_failed_runs_and_wall_times(flake_check):
    """Failed runs are counted with their seeds; min/median/max come from the wall times."""
    run = flake_check.RunResult
    results = [run(1, 5, 0, 3.0), run(2, 6, 5, 9.0), run(3, 7, 0, 4.0), run(4, 8, 1, 1.0)]
    text = flake_check.summarize(results)
    assert text.startswith("2 of 4 runs failed (seeds 6, 8)")
    assert "min 1.0 s, median 3.5 s, max 9.0 s" in text
    assert flake_check.summarize([run(1, 0, 0, 2.0)]).startswith("0 of 1 runs failed;")
    with pytest.raises(ValueError, match=r"results=\[\]"):
        flake_check.summarize([])


def test_one_run_of_a_passing_suite_exits_0(flake_check, tmp_path, capsys):
    """A real run (N=1, no xdist) of a one-test suite passes, with its seed and time shown."""
    suite = tmp_path / "test_tiny.py"
    suite.write_text("def test_ok():\n    assert True\n")
    assert (
        flake_check.main(["--runs", "1", "--workers", "0", "--seed", "9", "--suite", str(suite)])
        == 0
    )
    out = capsys.readouterr().out
    assert "run 1/1 seed 9: passed in " in out
    assert "0 of 1 runs failed" in out


def test_a_run_that_collects_nothing_fails(flake_check, tmp_path, capsys):
    """pytest's "no tests collected" (exit 5) is a failed run, never a silent pass."""
    suite = tmp_path / "test_empty.py"
    suite.write_text("# no tests here\n")
    assert flake_check.main(["--runs", "1", "--workers", "0", "--suite", str(suite)]) == 1
    out = capsys.readouterr().out
    assert "FAILED (exit 5)" in out and "1 of 1 runs failed (seeds 0)" in out
