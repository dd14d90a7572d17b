#!/usr/bin/env python3
"""Run the shipped suite N times with different seeds and fresh databases: is it flaky?

Each run is ``pytest --pyargs kvcheck.suite -n 2`` on the built-in target with the
``kvcheck-ci`` profile, its own empty example database (``KVCHECK_DB``) and its own
``--hypothesis-seed``, so no run can replay another's examples. Per run it prints the exit
status and wall time; then the count of failed runs (goal: 0) and the min/median/max wall
time. Exit status: 0 when every run passed, 1 when any failed (pytest's "no tests
collected" counts as failed), 2 for bad usage.

    python scripts/flake_check.py              # 20 runs (docs/development.md: "Flakiness")
    python scripts/flake_check.py --runs 3 --seed 100

``--suite`` replaces the pytest target (default ``--pyargs kvcheck.suite``), for a test
of this script on a small suite.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SUITE = "--pyargs kvcheck.suite"


@dataclass(frozen=True)
class RunResult:
    """One run of the suite."""

    index: int
    seed: int
    exit_code: int
    seconds: float
    output_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


def pytest_command(
    *, suite: str, workers: int, seed: int, python: str = sys.executable
) -> list[str]:
    """The pytest command line of one run.

    Example:
        >>> pytest_command(suite="--pyargs kvcheck.suite", workers=2, seed=7, python="py")
        ... # doctest: +NORMALIZE_WHITESPACE
        ['py', '-m', 'pytest', '--pyargs', 'kvcheck.suite', '-n', '2', '-q',
         '-p', 'no:cacheprovider', '--kvcheck-target', 'kvcheck',
         '--kvcheck-profile', 'kvcheck-ci', '--hypothesis-seed', '7']
    """
    workers_args = ["-n", str(workers)] if workers > 0 else []
    return [
        python,
        "-m",
        "pytest",
        *shlex.split(suite),
        *workers_args,
        "-q",
        "-p",
        "no:cacheprovider",
        "--kvcheck-target",
        "kvcheck",
        "--kvcheck-profile",
        "kvcheck-ci",
        "--hypothesis-seed",
        str(seed),
    ]


def run_once(index: int, seed: int, *, suite: str, workers: int, quiet: bool) -> RunResult:
    """Run the suite once with ``seed`` and a fresh, empty example database."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-flake-") as scratch:
        env = {**os.environ, "KVCHECK_DB": str(Path(scratch) / "examples")}
        started = time.monotonic()
        # Quiet runs keep their output so that a failure can still be shown.
        completed = subprocess.run(
            pytest_command(suite=suite, workers=workers, seed=seed),
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE if quiet else None,
            stderr=subprocess.STDOUT if quiet else None,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
    tail = "\n".join((completed.stdout or "").splitlines()[-40:])
    return RunResult(index, seed, completed.returncode, seconds, output_tail=tail)


def summarize(results: Sequence[RunResult]) -> str:
    """The closing summary: failed runs, then min/median/max wall time.

    Example:
        >>> summarize([RunResult(1, 0, 0, 10.0), RunResult(2, 1, 1, 14.0),
        ...            RunResult(3, 2, 0, 12.0)])
        '1 of 3 runs failed (seeds 1); wall time min 10.0 s, median 12.0 s, max 14.0 s'
    """
    if not results:
        raise ValueError("results=[] must hold at least one run")
    failed = [r for r in results if not r.passed]
    times = [r.seconds for r in results]
    seeds = f" (seeds {', '.join(str(r.seed) for r in failed)})" if failed else ""
    return (
        f"{len(failed)} of {len(results)} runs failed{seeds}; wall time "
        f"min {min(times):.1f} s, median {statistics.median(times):.1f} s, max {max(times):.1f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="how many runs (default 20)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the first run; run i uses seed+i"
    )
    parser.add_argument("--workers", type=int, default=2, help="xdist workers (default 2)")
    parser.add_argument(
        "--suite", default=DEFAULT_SUITE, help=f"what pytest runs (default {DEFAULT_SUITE!r})"
    )
    parser.add_argument(
        "--show-output", action="store_true", help="show pytest's output of each run"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs={args.runs} must be >= 1")
    if args.workers < 0:
        parser.error(f"--workers={args.workers} must be >= 0 (0: no xdist)")
    if args.seed < 0:
        parser.error(f"--seed={args.seed} must be >= 0")

    results = []
    for index in range(1, args.runs + 1):
        seed = args.seed + index - 1
        result = run_once(
            index, seed, suite=args.suite, workers=args.workers, quiet=not args.show_output
        )
        status = "passed" if result.passed else f"FAILED (exit {result.exit_code})"
        print(
            f"run {index}/{args.runs} seed {seed}: {status} in {result.seconds:.1f} s",
            flush=True,
        )
        if not result.passed and result.output_tail:
            print(result.output_tail, flush=True)
        results.append(result)
    print(summarize(results))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
