#!/usr/bin/env python3
"""One-shot GPU check: the attention properties and every ``gpu``-marked kvcheck test on CUDA.

Run from the repository root on a machine with a CUDA GPU::

    python scripts/gpu_check.py --json gpu_check.json
    python scripts/gpu_check.py --install-flash-attn --json gpu_check.json

It runs, each in its own pytest process with a time limit:

1. ``attention``: all of ``tests/attention`` (the ``gpu``-marked properties run on CUDA,
   with flash-attn where it is importable; the CPU properties run too);
2. ``gpu-marked``: ``pytest -m gpu`` over the rest of ``tests/`` and the shipped suite
   ``kvcheck/suite`` (the CUDA memory-allocator properties and any other GPU check);
3. ``suite-on-cuda``: the rest of the shipped suite with ``--kvcheck-device cuda``.
Absent or empty paths are reported as such.

It prints one line per test (passed/failed/skipped, Hypothesis examples, seconds) and a
verdict, and writes the same as JSON to ``--json``. The exit status is 0 when nothing
failed (skips are not failures), 1 otherwise, 2 for bad usage.

flash-attn is used only if already installed; ``--install-flash-attn`` tries
``pip install flash-attn`` first (it needs network access and a matching wheel, or a
long source build, so it has its own time limit). The whole run is meant to finish in
under 5 minutes on one GPU; ``--budget`` sets the limit the suites share.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ATTENTION_TESTS = "tests/attention"
SUITE_ROOT = "tests"
SHIPPED_SUITE = "kvcheck/suite"
#: pytest's exit status when it collected no test (an empty or absent suite)
NO_TESTS_COLLECTED = 5
#: seconds a suite gets after SIGINT to write its report before it is killed
INTERRUPT_GRACE_S = 20


@dataclass
class CaseResult:
    """One test's outcome as read from kvcheck's results file."""

    suite: str
    nodeid: str
    outcome: str  # passed | failed | error | skipped
    time_s: float
    examples: int | None = None
    message: str | None = None


@dataclass
class SuiteResult:
    """One pytest run."""

    name: str
    command: list[str]
    status: str  # passed | failed | absent | timed_out | crashed
    exit_code: int | None
    duration_s: float
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[CaseResult] = field(default_factory=list)
    note: str | None = None


# --- environment ------------------------------------------------------------------------


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_environment() -> dict[str, object]:
    """Python, torch, CUDA, GPU and flash-attn as this process sees them.

    Example:
        >>> "python" in describe_environment()
        True
    """
    info: dict[str, object] = {
        "python": sys.version.split()[0],
        "hypothesis": _package_version("hypothesis"),
        "pytest": _package_version("pytest"),
        "flash_attn": _flash_attn_status(),
    }
    try:
        import torch
    except Exception as exc:
        info["torch"] = f"not importable: {exc}"
        return info
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
    return info


def _flash_attn_status() -> str:
    """The importable flash-attn's version, or why it is not importable (in a subprocess,
    so a broken CUDA extension cannot take this script down)."""
    probe = "import flash_attn; print(getattr(flash_attn, '__version__', 'unknown'))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    if result.returncode == 0:
        return result.stdout.strip()
    last_line = (result.stderr.strip().splitlines() or ["unknown error"])[-1]
    return f"not importable ({last_line})"


def install_flash_attn(timeout_s: float) -> dict[str, object]:
    """Try ``pip install flash-attn`` within ``timeout_s``; report what happened."""
    command = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "flash-attn"]
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"attempted": True, "ok": False, "detail": f"timed out after {timeout_s:.0f} s"}
    tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
    return {
        "attempted": True,
        "ok": result.returncode == 0,
        "seconds": round(time.monotonic() - started, 1),
        "detail": " | ".join(tail),
    }


# --- running pytest ---------------------------------------------------------------------


def _plugin_registered() -> bool:
    return any(
        ep.value.startswith("kvcheck.plugin")
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def plugin_arguments(device: str) -> list[str]:
    """pytest arguments that run kvcheck's plugin on ``device``; the plugin is loaded
    explicitly when kvcheck is not installed (a bare checkout on a GPU machine)."""
    load = [] if _plugin_registered() else ["-p", "kvcheck.plugin"]
    return [*load, "--kvcheck-device", device]


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return str(REPO_ROOT) if not existing else f"{REPO_ROOT}{os.pathsep}{existing}"


def run_suite(
    name: str, pytest_args: list[str], *, timeout_s: float, plugin_args: list[str]
) -> SuiteResult:
    """Run pytest with ``pytest_args`` in a subprocess and read kvcheck's results file."""
    from kvcheck.results import load_results

    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "results.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            *pytest_args,
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            f"--kvcheck-results={results}",
            *plugin_args,
        ]
        env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env)
        timed_out = False
        try:
            exit_code: int | None = process.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGINT lets pytest stop cleanly and still write the results file.
            process.send_signal(signal.SIGINT)
            try:
                exit_code = process.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                exit_code = process.wait()
        duration = time.monotonic() - started
        try:
            tests = cases_from_results(load_results(results), suite=name)
        except ValueError:  # pytest stopped before the plugin wrote the file
            tests = []
    counts = {
        o: sum(t.outcome == o for t in tests) for o in ("passed", "failed", "error", "skipped")
    }
    if timed_out:
        status = "timed_out"
    elif exit_code == NO_TESTS_COLLECTED:
        status = "absent"
    elif exit_code == 0:
        status = "passed"
    elif counts["failed"] or counts["error"]:
        status = "failed"
    else:
        status = "crashed"
    display = [Path(command[0]).name, *command[1:]]
    display = [
        "--kvcheck-results=<tmp>" if a.startswith("--kvcheck-results=") else a for a in display
    ]
    return SuiteResult(name, display, status, exit_code, round(duration, 1), counts, tests)


# --- reading the report -----------------------------------------------------------------


def cases_from_results(payload: dict, *, suite: str) -> list[CaseResult]:
    """Each test of a kvcheck results file (``--kvcheck-results``), with its example count.

    Example:
        >>> cases_from_results({"tests": [{"nodeid": "t.py::x", "outcome": "passed",
        ...     "duration_s": 0.5, "statistics": {"examples": 40}}]}, suite="s")[0].examples
        40
    """
    return [
        CaseResult(
            suite=suite,
            nodeid=test["nodeid"],
            outcome=test["outcome"],
            time_s=round(float(test.get("duration_s", 0.0)), 2),
            examples=(test.get("statistics") or {}).get("examples"),
            message=(test.get("message") or test.get("skip_reason") or "")[:300] or None,
        )
        for test in payload.get("tests", [])
    ]


# --- reporting --------------------------------------------------------------------------


def print_summary(environment: dict, install: dict, suites: list[SuiteResult]) -> None:
    """A short report: environment, then per suite its counts, every property (test with
    Hypothesis examples), every failure, and skips grouped by reason. The JSON has all."""
    print("\n=== kvcheck GPU check ===")
    for key, value in environment.items():
        print(f"  {key}: {value}")
    if install.get("attempted"):
        print(f"  flash-attn install: {'ok' if install['ok'] else 'failed'} ({install['detail']})")
    for suite in suites:
        counts = ", ".join(f"{n} {o}" for o, n in suite.counts.items() if n)
        print(f"\n[{suite.name}] {suite.status} in {suite.duration_s} s ({counts or 'no tests'})")
        if suite.note:
            print(f"  note: {suite.note}")
        skip_reasons: dict[str, int] = {}
        for test in suite.tests:
            if test.outcome == "skipped":
                reason = (test.message or "").splitlines()[0] if test.message else "no reason"
                skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
                continue
            if test.examples is None and test.outcome == "passed":
                continue  # plain example tests are in the counts above
            examples = "" if test.examples is None else f", {test.examples} examples"
            print(f"  {test.outcome:8} {test.nodeid} ({test.time_s} s{examples})")
            if test.message and test.outcome != "passed":
                print(f"           {test.message.splitlines()[0][:160]}")
        for reason, count in skip_reasons.items():
            print(f"  skipped  {count} test(s): {reason[:160]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the JSON summary to this path")
    parser.add_argument(
        "--install-flash-attn",
        action="store_true",
        help="try `pip install flash-attn` first (default: use what is installed)",
    )
    parser.add_argument(
        "--install-timeout", type=float, default=120.0, help="seconds for that install"
    )
    parser.add_argument(
        "--device", default="cuda", help="device for kvcheck's plugin (default cuda)"
    )
    parser.add_argument(
        "--budget", type=float, default=240.0, help="seconds the pytest runs share (default 240)"
    )
    args = parser.parse_args(argv)
    if args.budget <= 0 or args.install_timeout <= 0:
        parser.error(
            f"--budget={args.budget} and --install-timeout={args.install_timeout} must be > 0"
        )

    started = time.monotonic()
    install: dict[str, object] = {"attempted": False}
    if args.install_flash_attn:
        install = install_flash_attn(args.install_timeout)
    environment = describe_environment()
    plugin_args = plugin_arguments(args.device)

    def run(name: str, pytest_args: list[str], timeout_s: float) -> SuiteResult:
        return run_suite(name, pytest_args, timeout_s=timeout_s, plugin_args=plugin_args)

    suites = [run("attention", [ATTENTION_TESTS], args.budget * 0.6)]
    if (REPO_ROOT / SUITE_ROOT).is_dir():
        remaining = args.budget - (time.monotonic() - started)
        gpu_args = [SUITE_ROOT, SHIPPED_SUITE, f"--ignore={ATTENTION_TESTS}", "-m", "gpu"]
        suites.append(run("gpu-marked", gpu_args, remaining * 0.4))
        # The whole shipped suite on the GPU: the same properties, with cuda tensors.
        remaining = args.budget - (time.monotonic() - started)
        cuda_args = [SHIPPED_SUITE, "--kvcheck-device", "cuda", "-m", "not gpu"]
        suites.append(run("suite-on-cuda", cuda_args, remaining))
    else:
        note = f"no {SUITE_ROOT}/ folder"
        suites.append(SuiteResult("gpu-marked", [], "absent", None, 0.0, note=note))

    ok = all(s.status in ("passed", "absent") for s in suites)
    print_summary(environment, install, suites)
    print(f"\nverdict: {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    if args.json:
        summary = {
            "ok": ok,
            "seconds": round(time.monotonic() - started, 1),
            "environment": environment,
            "flash_attn_install": install,
            "suites": [asdict(s) for s in suites],
        }
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
