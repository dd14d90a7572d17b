"""Findings across releases: the same seeds against several installed releases of a target.

Each ``--python`` names an interpreter whose environment has kvcheck and one release of
the target's implementation (one environment per release). The command runs the shipped
suite (and any test paths given after ``--``) in each, with the same Hypothesis seed and
profile, and compares the findings the target reports: the ones it declares for the
release it finds (``findings`` in the results), the tests that pin each (they must fail
with it there), and how often the suite steered around each. It prints one table, a
finding per row and a release per column::

    python tools/across.py --target sglang --seed 0 \\
        --python .venv-0.5.21/bin/python --python .venv-0.5.22/bin/python \\
        --python .venv-0.5.23/bin/python -- tests/targets

A cell reads ``holds`` (declared, and every pin that ran failed with it), ``holds
(steered)`` (declared, no pin ran, the suite met it), ``not checked`` (declared, nothing
ran for it), ``fixed`` (not declared, and its pins, named in another release's run,
passed), ``n/a`` (not declared, its pins skipped), ``-`` (nothing ran for it) or
``FAILED`` (a pin failed otherwise, or passed while declared). The last column says
what changed from one release to the next, in the order given: where a finding was fixed,
where it regressed. Nothing here knows a target: each environment's own kvcheck resolves it.

Exit status: 0 every run passed; 1 some run failed a test; 2 a run could not run or left
no results.

Example:
    >>> cell({"declared": True, "pins": ["xfailed"], "steered": 3})
    'holds'
    >>> cell({"declared": False, "pins": ["passed"], "steered": 0})
    'fixed'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Run", "cell", "changes", "main", "render_table", "tabulate"]

#: What a pinned test's outcome says about its finding.
_PIN_HOLDS = "xfailed"


@dataclass
class Run:
    """One environment's run: its interpreter, the release it found, its results."""

    python: str
    release: str = "?"
    exit_status: int | None = None
    declared: list[str] = field(default_factory=list)
    #: finding id -> outcomes of the tests that pinned it here
    pins: dict[str, list[str]] = field(default_factory=dict)
    #: test node id -> outcome
    outcomes: dict[str, str] = field(default_factory=dict)
    #: test node id -> the finding it pinned here
    pinned_by: dict[str, str] = field(default_factory=dict)
    steered: dict[str, int] = field(default_factory=dict)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/across.py",
        description="Run the same seeds against several installed releases of a target "
        "(one environment each) and tabulate the findings each release shows.",
        epilog="Arguments after `--` go to pytest in every environment (test paths, -k).",
    )
    parser.add_argument(
        "--python",
        action="append",
        required=True,
        help="an interpreter of an environment with kvcheck and one release (repeat; "
        "oldest release first)",
    )
    parser.add_argument("--target", required=True, help="the kvcheck target, as for verify")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    parser.add_argument("--device", default="cpu", help="kvcheck device (default cpu)")
    parser.add_argument("-n", "--workers", default="2", help="pytest-xdist workers (default 2)")
    parser.add_argument(
        "--out",
        default=".kvcheck/across",
        help="where each run's results and log go (default .kvcheck/across)",
    )
    parser.add_argument("--markdown", help="also write the table to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command (see the module docstring); return its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in arguments:
        at = arguments.index("--")
        arguments, extra = arguments[:at], arguments[at + 1 :]
    options = _parser().parse_args(arguments)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for number, python in enumerate(options.python):
        print(f"across: run {number + 1} of {len(options.python)}: {python}", flush=True)
        runs.append(_run(python, options, extra, out / f"run-{number + 1}"))
    table = render_table(tabulate(runs), runs)
    print("\n" + table, flush=True)
    if options.markdown:
        Path(options.markdown).write_text(table + "\n", encoding="utf-8")
    statuses = [run.exit_status for run in runs]
    if any(status is None or status > 1 for status in statuses):
        return 2
    return 1 if any(status == 1 for status in statuses) else 0


def _run(python: str, options: argparse.Namespace, extra: Sequence[str], stem: Path) -> Run:
    """Run the suite (and ``extra``) with ``python``; read its results into a :class:`Run`."""
    results, log = stem.with_suffix(".json"), stem.with_suffix(".log")
    results.unlink(missing_ok=True)
    command = [
        python,
        "-m",
        "pytest",
        "--pyargs",
        "kvcheck.suite",
        *extra,
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        str(options.workers),
        f"--kvcheck-target={options.target}",
        f"--kvcheck-device={options.device}",
        f"--hypothesis-seed={options.seed}",
        f"--kvcheck-results={results}",
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("KVCHECK_TARGET", None)
    with log.open("w", encoding="utf-8") as stream:
        status = subprocess.run(
            command, stdout=stream, stderr=subprocess.STDOUT, env=env
        ).returncode
    run = Run(python=python, exit_status=status)
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        print(f"across: {python} left no results (exit {status}); see {log}", file=sys.stderr)
        run.exit_status = None
        return run
    read_results(run, data)
    print(f"across: {python}: {run.release}, pytest exit {status} (log: {log})", flush=True)
    return run


def read_results(run: Run, data: Mapping[str, Any]) -> None:
    """Fill ``run`` from a results file's contents (``--kvcheck-results``).

    Example:
        >>> run = Run("python")
        >>> read_results(run, {"target": {"version": "1.0", "findings": ["A"]}, "tests": [
        ...     {"nodeid": "t::a", "outcome": "xfailed", "pins": "A",
        ...      "statistics": {"steered": {"A": 2}}}]})
        >>> run.release, run.pins, run.steered
        ('1.0', {'A': ['xfailed']}, {'A': 2})
    """
    target = data.get("target") or {}
    run.release = str(target.get("version", "?"))
    run.declared = list(target.get("findings") or ())
    for test in data.get("tests", ()):
        nodeid, outcome = test["nodeid"], test.get("outcome", "?")
        run.outcomes[nodeid] = outcome
        if test.get("pins"):
            run.pinned_by[nodeid] = test["pins"]
            run.pins.setdefault(test["pins"], []).append(outcome)
        for finding, count in ((test.get("statistics") or {}).get("steered") or {}).items():
            run.steered[finding] = run.steered.get(finding, 0) + int(count)


def tabulate(runs: Sequence[Run]) -> dict[str, list[dict[str, Any]]]:
    """Finding id -> per run: declared there, outcomes of its pins there, times steered.

    A finding's pins in a run where it is not declared are the tests that pinned it in any
    run (the target names them only where it declares the finding).
    """
    tests_of: dict[str, set[str]] = {}
    for run in runs:
        for nodeid, finding in run.pinned_by.items():
            tests_of.setdefault(finding, set()).add(nodeid)
    findings = list(dict.fromkeys(f for run in runs for f in (*run.declared, *run.pins)))
    table: dict[str, list[dict[str, Any]]] = {}
    for finding in findings:
        row = []
        for run in runs:
            declared = finding in run.declared
            if declared:
                pins = run.pins.get(finding, [])
            else:
                pins = [
                    run.outcomes[n] for n in sorted(tests_of.get(finding, ())) if n in run.outcomes
                ]
            row.append({"declared": declared, "pins": pins, "steered": run.steered.get(finding, 0)})
        table[finding] = row
    return table


def cell(entry: Mapping[str, Any]) -> str:
    """What one finding's entry in one run says (see the module docstring)."""
    pins = [outcome for outcome in entry["pins"] if outcome != "skipped"]
    if entry["declared"]:
        if any(outcome != _PIN_HOLDS for outcome in pins):
            return "FAILED"
        if pins:
            return "holds"
        return "holds (steered)" if entry["steered"] else "not checked"
    if any(outcome not in ("passed",) for outcome in pins):
        return "FAILED"
    if pins:
        return "fixed"
    return "n/a" if entry["pins"] else "-"


def changes(cells: Sequence[str], releases: Sequence[str]) -> str:
    """Where a finding appeared, was fixed or regressed, reading the runs in order.

    Example:
        >>> changes(["holds", "holds", "fixed"], ["1", "2", "3"])
        'fixed in 3'
        >>> changes(["n/a", "fixed", "holds"], ["1", "2", "3"])
        'regressed in 3'
    """
    notes: list[str] = []
    states: list[bool] = []
    for text, release in zip(cells, releases, strict=True):
        if not text.startswith("holds") and text != "fixed":
            continue  # nothing this run can say
        present = text.startswith("holds")
        if states and present != states[-1]:
            notes.append(f"{'regressed' if present else 'fixed'} in {release}")
        states.append(present)
    if not notes and states and all(states):
        return "in every release that shows it"
    return "; ".join(notes) or "-"


def render_table(table: Mapping[str, Sequence[Mapping[str, Any]]], runs: Sequence[Run]) -> str:
    """The release x finding table as Markdown (a row per finding, a column per release).

    Example:
        >>> runs = [Run("a", release="1"), Run("b", release="2")]
        >>> print(render_table({"X": [{"declared": True, "pins": ["xfailed"], "steered": 0},
        ...                           {"declared": False, "pins": ["passed"], "steered": 0}]},
        ...                    runs))
        | finding | 1 | 2 | across releases |
        |---|---|---|---|
        | X | holds | fixed | fixed in 2 |
    """
    releases = [run.release for run in runs]
    lines = [
        "| finding | " + " | ".join(releases) + " | across releases |",
        "|---|" + "---|" * len(runs) + "---|",
    ]
    for finding, entries in table.items():
        cells = [cell(entry) for entry in entries]
        lines.append(f"| {finding} | " + " | ".join(cells) + f" | {changes(cells, releases)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
