"""``python tools/across.py``: one release x finding table from several runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.across import Run, read_results, render_table, tabulate

#: The command runs as printed in its docstring: by its path, not as a module.
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _run(release: str, declared: list[str], tests: list[dict[str, object]]) -> Run:
    run = Run(python=f"env-{release}/bin/python")
    read_results(run, {"target": {"version": release, "findings": declared}, "tests": tests})
    return run


def test_the_table_says_what_each_release_shows_and_what_changed() -> None:
    """A finding pinned where declared and passing where not reads holds, then fixed; one
    that passes first and is pinned later reads regressed; skipped pins read n/a; a
    declared finding met only by steering reads holds (steered)."""
    pin_x = {"nodeid": "t.py::test_x", "pins": "X", "outcome": "xfailed"}
    pin_y = {"nodeid": "t.py::test_y", "pins": "Y", "outcome": "xfailed"}
    steered = {"nodeid": "s.py::test_m", "outcome": "passed", "statistics": {"steered": {"Z": 4}}}
    runs = [
        _run("1", ["X", "Z"], [pin_x, {"nodeid": "t.py::test_y", "outcome": "skipped"}, steered]),
        _run("2", ["Z"], [{**pin_x, "pins": None, "outcome": "passed"}, steered]),
        _run("3", ["Y"], [{**pin_x, "pins": None, "outcome": "passed"}, pin_y]),
    ]
    assert render_table(tabulate(runs), runs).splitlines()[2:] == [
        "| X | holds | fixed | fixed | fixed in 2 |",
        "| Z | holds (steered) | holds (steered) | - | in every release that shows it |",
        "| Y | n/a | - | holds | in every release that shows it |",
    ]
    runs[1] = _run("2", ["Z"], [{**pin_y, "pins": None, "outcome": "passed"}])
    assert render_table(tabulate(runs), runs).splitlines()[4] == (
        "| Y | n/a | fixed | holds | regressed in 3 |"
    )


def test_a_pin_that_fails_otherwise_is_reported() -> None:
    """A pinned test that passes while declared, or fails where the finding is not declared,
    reads FAILED."""
    runs = [
        _run("1", ["X"], [{"nodeid": "t::x", "pins": "X", "outcome": "xpassed"}]),
        _run("2", [], [{"nodeid": "t::x", "outcome": "failed"}]),
    ]
    assert render_table(tabulate(runs), runs).splitlines()[2] == "| X | FAILED | FAILED | - |"


def test_the_command_runs_each_environment_and_prints_the_table(tmp_path: Path) -> None:
    """Two runs of this interpreter on two tests of the shipped suite: each leaves its
    results and log, and the table has a column per run (kvcheck declares no findings)."""
    out = tmp_path / "across"
    completed = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "across.py"),
            "--python",
            sys.executable,
            "--python",
            sys.executable,
            "--target",
            "kvcheck",
            "--workers",
            "0",
            "--out",
            str(out),
            "--markdown",
            str(tmp_path / "table.md"),
            "--",
            "-k",
            "test_empty_move_changes_nothing and mla",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert sorted(path.name for path in out.iterdir()) == [
        "run-1.json",
        "run-1.log",
        "run-2.json",
        "run-2.log",
    ]
    table = (tmp_path / "table.md").read_text(encoding="utf-8").splitlines()
    version = table[0].split("|")[2].strip()
    assert table[0] == f"| finding | {version} | {version} | across releases |"
    assert len(table) == 2
