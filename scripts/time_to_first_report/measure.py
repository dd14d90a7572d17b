#!/usr/bin/env python
"""Time from launching ``kvcheck verify`` on a user's pool to its first failure report.

Runs ``kvcheck verify --target user_pools:<name> --device cpu`` (single process: no
``-n``) the way a user would, from a folder of its own outside kvcheck's checkout that
holds a copy of ``user_pools.py``, with stdout a pipe, and stamps every line it prints
with the seconds since launch. Per run it records when the first failure report began
(the first line that heads one: ``kvcheck: FAILED ...`` printed during the run, or, from a
kvcheck that reports only at the end, the summary's ``Failures (...)`` heading or a
``FAILED ...`` line), when the command ended, the failing tests (from ``--json``) and the
load average before and after. Each run gets a fresh example database and results folder,
so every run finds its bug from scratch. Bytecode caches are warm (one collection first),
as on any run after the first on a user's machine; ``PYTHONDONTWRITEBYTECODE`` is dropped.

Usage::

    python scripts/time_to_first_report/measure.py --runs 3            # both pools
    python scripts/time_to_first_report/measure.py --pools k_only_move --json out.json
    python scripts/time_to_first_report/measure.py --keep-output DIR   # every run's stdout
    python scripts/time_to_first_report/measure.py --kvcheck /tmp/old --kvcheck .  # A/B

Prints one line per run and, per pool, the median and range of both times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POOLS = ("k_only_move", "last_layer_write")
#: The first line of a failure report: an early one, or the summary's.
_REPORT = re.compile(r"^(kvcheck: (FAILED|ERROR|XPASS)|Failures \(|(FAILED|ERROR|XPASS)\S* \S)")


def _command() -> list[str]:
    script = Path(sys.executable).parent / "kvcheck"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "kvcheck.runner.cli"]
    return [*head, "verify", "--device", "cpu"]


def _env(tmp: Path, kvcheck: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVCHECK_", "PYTEST_"))}
    if kvcheck:  # this checkout of kvcheck first on the path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [kvcheck, env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("CI", None)  # a user's machine: kvcheck-dev, kvcheck's default profile there
    env["KVCHECK_DB"] = str(tmp / "examples")
    return env


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def run_once(pool: str, keep: Path | None, index: int, kvcheck: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvcheck-ttfr-") as name:
        tmp = Path(name)
        summary = tmp / "summary.json"
        # The user's project: a folder of its own, outside kvcheck's checkout (whose pytest
        # settings would otherwise apply).
        project = tmp / "project"
        project.mkdir()
        (project / "user_pools.py").write_text((HERE / "user_pools.py").read_text())
        command = [
            *_command(),
            "--target",
            f"user_pools:{pool}",
            "--results-dir",
            str(tmp / "results"),
            "--json",
            str(summary),
        ]
        load_before = _load()
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=project,
            env=_env(tmp, kvcheck),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert process.stdout is not None
        stamped: list[tuple[float, str]] = []
        for line in process.stdout:
            stamped.append((time.monotonic() - started, line.rstrip("\n")))
        status = process.wait()
        ended = time.monotonic() - started
        report = next((at for at, line in stamped if _REPORT.match(line)), None)
        collected = next((at for at, line in stamped if " tests (full pytest log" in line), None)
        tests = json.loads(summary.read_text()).get("tests", []) if summary.exists() else []
        failing = [
            t["nodeid"].split("::", 1)[-1]
            for t in tests
            if t["outcome"] in ("failed", "error", "xpassed")
        ]
        label = f"{pool}-{Path(kvcheck).name}" if kvcheck else pool
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"{label}-{index}.txt").write_text(
                "".join(f"{at:7.1f}  {line}\n" for at, line in stamped)
            )
            if summary.exists():
                (keep / f"{label}-{index}.json").write_text(summary.read_text())
        return {
            "pool": label,
            "exit": status,
            "report_s": None if report is None else round(report, 1),
            "end_s": round(ended, 1),
            "collected_s": None if collected is None else round(collected, 1),
            **_first_failure(tests),
            "failing": failing,
            "load_before": load_before,
            "load_after": _load(),
        }


def _first_failure(tests: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the first failing test sits in pytest's own time (the sum of the test times
    before it), how long it took, and its shrink phase's share: what the report waited on."""
    before = 0.0
    for test in tests:
        took = float(test.get("duration_s") or 0.0)
        if test["outcome"] in ("failed", "error", "xpassed"):
            phases = (test.get("statistics") or {}).get("phases", {})
            return {
                "first_failing": test["nodeid"].split("::", 1)[-1],
                "tests_before_s": round(before, 1),
                "failing_test_s": round(took, 1),
                "shrink_s": round(float(phases.get("shrink", {}).get("seconds", 0.0)), 1),
                "pytest_total_s": round(sum(float(t.get("duration_s") or 0) for t in tests), 1),
            }
        before += took
    return {}


def _warm_caches(kvcheck: str = "") -> None:
    with tempfile.TemporaryDirectory(prefix="kvcheck-ttfr-") as name:
        subprocess.run(  # from a folder outside kvcheck's checkout, as the runs are
            [
                sys.executable,
                "-m",
                "pytest",
                "--pyargs",
                "kvcheck.suite",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
            ],
            cwd=name,
            env=_env(Path(name), kvcheck),
            capture_output=True,
            check=False,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default=",".join(POOLS), help="comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep-output", type=Path, default=None)
    parser.add_argument(
        "--kvcheck",
        action="append",
        default=None,
        metavar="DIR",
        help="a kvcheck checkout to put first on PYTHONPATH (repeatable: the checkouts take "
        "turns, run by run; default: the kvcheck this Python imports)",
    )
    args = parser.parse_args(argv)
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    checkouts = [str(Path(path).resolve()) for path in args.kvcheck or [""] if path] or [""]
    for kvcheck in checkouts:
        _warm_caches(kvcheck)
    runs = []
    for index in range(args.runs):
        for pool in pools:  # interleaved, so load drift reaches every pool and checkout alike
            for kvcheck in checkouts:
                run = run_once(pool, args.keep_output, index, kvcheck)
                runs.append(run)
                print(json.dumps(run), flush=True)
    for label in dict.fromkeys(str(r["pool"]) for r in runs):
        mine = [r for r in runs if r["pool"] == label]
        reports = [r["report_s"] for r in mine if r["report_s"] is not None]
        ends = [r["end_s"] for r in mine]
        text = (
            f"report median {statistics.median(reports):.1f} s "
            f"({min(reports):.1f}-{max(reports):.1f})"
            if reports
            else "no report"
        )
        print(
            f"{label}: {len(mine)} runs; {text}; end median {statistics.median(ends):.1f} s "
            f"({min(ends):.1f}-{max(ends):.1f})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
