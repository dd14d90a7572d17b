#!/usr/bin/env python
"""Benchmark the shipped property suite: wall time, examples per property, machine speed.

1. Runs ``pytest -n auto --pyargs kvcheck.suite`` once (a fresh example database in a
   temporary directory, so stored failures do not add replays) and prints its wall time.
2. Prints, per test, how many Hypothesis examples it ran (from the plugin's
   ``--kvcheck-results`` file) and flags properties under ``--min-examples``.
3. Runs each pool family's state machine in this process with the profile's settings
   (derandomized, so runs compare) and prints steps per second (rule executions,
   invariants included) over wall time and over the process's CPU time.

Nothing here asserts on time: the figures are for the person reading them.

Usage::

    python scripts/bench_suite.py                  # suite + machines, kvcheck-dev profile
    python scripts/bench_suite.py --skip-suite     # machines only
    python scripts/bench_suite.py --profile kvcheck-ci --target kvcheck --workers auto
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Run the suite under xdist; return the results file's payload plus the wall time."""
    from kvcheck.runner.results import load_results

    with tempfile.TemporaryDirectory(prefix="kvcheck-bench-") as tmp:
        results_path = Path(tmp) / "results.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            args.workers,
            "-p",
            "no:randomly",
            "-q",
            *(["--pyargs"] if not (REPO_ROOT / args.suite).exists() else []),
            args.suite,
            "--kvcheck-target",
            args.target,
            "--kvcheck-profile",
            args.profile,
            "--kvcheck-results",
            str(results_path),
        ]
        if args.device:
            command += ["--kvcheck-device", args.device]
        env = {**os.environ, "KVCHECK_DB": str(Path(tmp) / "examples")}
        started = time.perf_counter()
        finished = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - started
        tail = (finished.stdout + finished.stderr).strip().splitlines()[-3:]
        payload = load_results(results_path) if results_path.exists() else {"tests": []}
    payload["wall_seconds"] = wall
    payload["exit_status"] = finished.returncode
    payload["pytest_tail"] = tail
    return payload


def print_suite(payload: dict[str, Any], *, min_examples: int) -> None:
    print(
        f"suite wall time: {payload['wall_seconds']:.1f} s (pytest exit {payload['exit_status']})"
    )
    for line in payload["pytest_tail"]:
        print(f"  pytest: {line}")
    rows = []
    for test in payload.get("tests", []):
        statistics = test.get("statistics") or {}
        examples = statistics.get("examples")
        rows.append((test["nodeid"], test["outcome"], examples, test.get("duration_s", 0.0)))
    width = max((len(row[0]) for row in rows), default=10)
    print(f"\n{'test':<{width}}  outcome   examples  seconds")
    few = 0
    for nodeid, outcome, examples, seconds in sorted(rows):
        shown = "-" if examples is None else str(examples)
        flag = ""
        if outcome == "passed" and examples is not None and examples < min_examples:
            flag = f"  < {min_examples}"
            few += 1
        print(f"{nodeid:<{width}}  {outcome:<8}  {shown:>8}  {seconds:7.2f}{flag}")
    with_examples = [row for row in rows if row[2] is not None and row[1] == "passed"]
    print(
        f"\n{len(with_examples)} Hypothesis tests passed; {few} ran fewer than "
        f"{min_examples} examples"
    )


MachineFigures = tuple[str, int, int, int, float, float]


def bench_machines(args: argparse.Namespace) -> tuple[int, list[MachineFigures]]:
    """The profile's step count and (family, examples, steps, ops, seconds, CPU seconds) per
    machine. The machines run derandomized, so every run of the script takes the same steps."""
    from hypothesis import settings
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.stateful import run_state_machine_as_test

    from kvcheck.machines import MACHINE_FAMILIES, pool_machine
    from kvcheck.runner.profiles import register_profiles
    from kvcheck.targets import resolve_target

    register_profiles(InMemoryExampleDatabase())
    profile = settings.get_profile(args.profile)
    target = resolve_target(args.target)
    device = args.device or "cpu"
    figures = []
    for family in MACHINE_FAMILIES:
        if f"{family}_pool" in target.unsupported:
            continue
        chosen = settings(
            profile, database=None, max_examples=args.machine_examples, derandomize=True
        )
        machine = pool_machine(target, device=device, family=family, settings=chosen)
        counts = {"examples": 0, "steps": 0, "ops": 0}
        started, cpu_started = time.perf_counter(), time.process_time()
        run_state_machine_as_test(_counting(machine, counts), settings=chosen)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        figures.append((family, counts["examples"], counts["steps"], counts["ops"], seconds, cpu))
    return profile.stateful_step_count, figures


def _counting(machine: type, counts: dict[str, int]) -> type:
    """``machine`` counting in ``counts`` the examples it builds, the steps it takes and the
    pool operations it runs (a ``pause`` step runs none)."""

    class Counting(machine):  # type: ignore[valid-type, misc]
        def _build(self, spec: Any) -> None:
            counts["examples"] += 1
            super()._build(spec)

        def _kinds(self) -> tuple[str, ...]:
            counts["steps"] += 1  # drawn once per step
            return tuple(super()._kinds())

        def _run(self, op: Any) -> bool:
            counts["ops"] += 1
            return bool(super()._run(op))

    Counting.__name__ = Counting.__qualname__ = machine.__name__
    return Counting


def print_machines(figures: list[MachineFigures], *, step_count: int) -> None:
    print(f"\nstate machines (in-process, derandomized, stateful_step_count={step_count}; every")
    print("step ends with the invariant: all buffers byte for byte, accounting, check_valid).")
    print("steps/s is over wall time; steps/cpu-s over this process's CPU time, which other")
    print("work on shared cores disturbs far less: compare runs by it.")
    print("family  examples  steps    ops  seconds  cpu-s  steps/s  steps/cpu-s  ops/s")
    for family, examples, steps, ops, seconds, cpu in figures:
        print(
            f"{family:<6}  {examples:>8}  {steps:>5}  {ops:>5}  {seconds:7.2f}  {cpu:5.2f}"
            f"  {steps / seconds:7.0f}  {steps / max(cpu, 1e-9):11.0f}  {ops / seconds:5.0f}"
        )
    steps = sum(figure[2] for figure in figures)
    seconds = sum(figure[4] for figure in figures)
    cpu = sum(figure[5] for figure in figures)
    if figures:
        print(
            f"{'all':<6}  {'':>8}  {steps:>5}  {'':>5}  {seconds:7.2f}  {cpu:5.2f}"
            f"  {steps / seconds:7.0f}  {steps / max(cpu, 1e-9):11.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        default="kvcheck.suite",
        help="dotted suite package, or a path relative to the repository (e.g. tests)",
    )
    parser.add_argument("--target", default="kvcheck")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: auto)")
    parser.add_argument("--profile", default="kvcheck-dev")
    parser.add_argument("--workers", default="auto", help="pytest-xdist -n value")
    parser.add_argument("--min-examples", type=int, default=100)
    parser.add_argument("--machine-examples", type=int, default=100)
    parser.add_argument("--skip-suite", action="store_true")
    parser.add_argument("--skip-machines", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {}
    if not args.skip_suite:
        payload = run_suite(args)
        print_suite(payload, min_examples=args.min_examples)
        report["suite"] = {
            "wall_seconds": payload["wall_seconds"],
            "exit_status": payload["exit_status"],
            "examples": {
                test["nodeid"]: (test.get("statistics") or {}).get("examples")
                for test in payload.get("tests", [])
            },
        }
    if not args.skip_machines:
        step_count, figures = bench_machines(args)
        print_machines(figures, step_count=step_count)
        report["machines"] = [
            {
                "family": family,
                "examples": examples,
                "steps": steps,
                "ops": ops,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "steps_per_second": steps / seconds,
                "steps_per_cpu_second": steps / max(cpu, 1e-9),
            }
            for family, examples, steps, ops, seconds, cpu in figures
        ]
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
