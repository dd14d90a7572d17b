#!/usr/bin/env python
"""Campaign throughput: examples per second with 1 and 2 workers (and more), in one run.

Runs the same campaign once per worker count, one after the other, each in a fresh
temporary directory with an empty directory database::

    kvcheck campaign --target kvcheck --workers W --seed 0 --examples-per-test 200 \\
        --examples 4000 -q

on a local Ray cluster of W CPUs. The example budget (not a time budget) makes every run
do the same work: the same shards, seeds and examples, in the same order (give or take the
last shard), so the runs differ only in how many shards run at once. A time budget would
not: shards still running at the deadline are stopped, and their examples are not counted.

Per worker count it prints the shards, the examples, the campaign's own time (from its
first shard to its last: ``examples/s``) and the command's wall time (collection and the
Ray cluster's start included), then each count's speed-up over the first. Needs
``pip install 'kvcheck[campaign]'``. Nothing is asserted on time.

Usage::

    python scripts/bench_campaign.py                        # 1 and 2 workers
    python scripts/bench_campaign.py --workers 1,2,4 --examples 20000
    python scripts/bench_campaign.py --json out.json -- -k machines
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Measurement:
    """One campaign: its worker count, what it ran and how long it took."""

    workers: int
    exit_status: int
    shards: int
    examples: int
    campaign_s: float
    wall_s: float

    @property
    def per_second(self) -> float:
        """Examples per second of the campaign's own time.

        Example:
            >>> Measurement(2, 0, 10, 5000, 50.0, 70.0).per_second
            100.0
        """
        return self.examples / self.campaign_s if self.campaign_s else 0.0


def run_campaign(workers: int, args: argparse.Namespace) -> Measurement:
    """One campaign with ``workers`` workers, in a fresh directory and database."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-bench-campaign-") as scratch:
        command = [
            sys.executable, "-m", "kvcheck.runner.cli", "campaign",
            "--target", args.target, "--workers", str(workers), "--seed", str(args.seed),
            "--examples-per-test", str(args.examples_per_test),
            "--examples", str(args.examples), "-q", *args.campaign_args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVCHECK_")}
        env["KVCHECK_DB"] = str(Path(scratch) / "examples")
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        started = time.monotonic()
        finished = subprocess.run(
            command, cwd=scratch, env=env, capture_output=True, text=True, check=False
        )
        wall = time.monotonic() - started
        try:
            results = json.loads((Path(scratch) / ".kvcheck/campaign/results.json").read_text())
        except (OSError, json.JSONDecodeError):
            tail = (finished.stdout + finished.stderr).strip().splitlines()[-15:]
            raise SystemExit(
                f"the campaign with {workers} workers wrote no results (exit "
                f"{finished.returncode}):\n" + "\n".join(tail)
            ) from None
    campaign = results["campaign"]
    return Measurement(
        workers=workers,
        exit_status=finished.returncode,
        shards=int(campaign["shards"]),
        examples=int(campaign["examples"]),
        campaign_s=float(results["duration_s"]),
        wall_s=round(wall, 1),
    )


def table(measurements: Sequence[Measurement]) -> list[str]:
    """The printed lines: one per worker count, speed-up over the first.

    Example:
        >>> print("\\n".join(table([Measurement(1, 0, 8, 4000, 100.0, 130.0),
        ...                         Measurement(2, 0, 8, 4000, 55.0, 80.0)])))
        workers  exit  shards  examples  campaign s  examples/s  speed-up  wall s
              1     0       8      4000       100.0        40.0      1.00   130.0
              2     0       8      4000        55.0        72.7      1.82    80.0
    """
    lines = ["workers  exit  shards  examples  campaign s  examples/s  speed-up  wall s"]
    base = measurements[0].per_second if measurements else 0.0
    for m in measurements:
        speedup = m.per_second / base if base else 0.0
        lines.append(
            f"{m.workers:>7} {m.exit_status:>5} {m.shards:>7} {m.examples:>9} "
            f"{m.campaign_s:>11.1f} {m.per_second:>11.1f} {speedup:>9.2f} {m.wall_s:>7.1f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--target", default="kvcheck")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=4000, help="each campaign's budget")
    parser.add_argument("--examples-per-test", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "campaign_args", nargs="*", help="after --: more kvcheck campaign arguments (-k ...)"
    )
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.workers.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        parser.error(f"--workers={args.workers!r}: give worker counts of at least 1")
    print(
        f"kvcheck campaign throughput: target {args.target}, seed {args.seed}, "
        f"{args.examples} examples ({args.examples_per_test} per test per shard), "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    measurements = []
    for workers in counts:
        measurements.append(run_campaign(workers, args))
        print(f"  {workers} worker(s): done in {measurements[-1].wall_s:.0f} s", flush=True)
    print("\n".join(table(measurements)))
    if args.json is not None:
        rows = [{**asdict(m), "examples_per_second": round(m.per_second, 2)} for m in measurements]
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
