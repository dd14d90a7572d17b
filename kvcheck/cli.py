"""The ``kvcheck`` command.

``kvcheck verify``
    Run the property suite shipped in the package (``kvcheck.suite``) against a target and
    device in a pytest subprocess, streaming pytest's progress, then print a summary: per
    property its result, examples and time; per failure the minimal reproduction.
``kvcheck replay``
    Run only the examples stored in the database (``KVCHECK_DB``) and say, per test that had
    some, whether it is still failing or fixed.
``kvcheck memory-report``
    Cell sizes, token capacities and pool bytes (built on ``meta``) for real model configs.

Exit status: 0 all passed; 1 a property failed (replay: still failing); 2 usage or target
error. Arguments after ``--`` go to pytest unchanged.

Example:
    >>> main(["verify", "--target", "no_such_target"])  # doctest: +SKIP
    kvcheck: error: unknown target 'no_such_target'; valid targets: ...
    2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kvcheck

__all__ = ["build_parser", "main", "pytest_command"]

DEFAULT_SUITE = "kvcheck.suite"
_DEFAULT_BUDGET_GIB = 64.0
_DEFAULT_PAGE_SIZE = 64
_DEFAULT_DTYPE = "bfloat16"


class UsageProblem(Exception):
    """A command-line or environment setting that stops the command before it runs."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcheck`` command with ``argv`` (default ``sys.argv[1:]``); return the status.

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        kvcheck 0.1.0
        0
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    pytest_extra: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, pytest_extra = arguments[:split], arguments[split + 1 :]
    parser = build_parser()
    try:
        options = parser.parse_args(arguments)
    except SystemExit as exit_request:  # argparse: --help (0) or a usage error (2)
        return int(exit_request.code or 0)
    if options.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(options.handler(options, pytest_extra))
    except UsageProblem as problem:
        print(f"kvcheck: error: {problem}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kvcheck`` command."""
    parser = argparse.ArgumentParser(
        prog="kvcheck",
        description="Property-based verification of LLM-serving KV-cache memory pools.",
        epilog="Exit status: 0 all passed, 1 a property failed, 2 usage or target error. "
        "Arguments after -- are passed to pytest.",
    )
    parser.add_argument("--version", action="version", version=f"kvcheck {kvcheck.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    verify = commands.add_parser(
        "verify", help="run the property suite against a target and summarize it"
    )
    _add_run_arguments(verify)
    verify.add_argument(
        "--profile",
        default=None,
        help="Hypothesis profile: kvcheck-dev, kvcheck-ci, kvcheck-thorough (default: "
        "KVCHECK_PROFILE, else kvcheck-ci when CI is set, else kvcheck-dev)",
    )
    verify.set_defaults(handler=_verify)

    replay = commands.add_parser(
        "replay", help="rerun only the stored (previously failing) examples"
    )
    _add_run_arguments(replay)
    replay.set_defaults(handler=_replay)

    memory = commands.add_parser(
        "memory-report", help="KV pool bytes and token capacity for real model configs"
    )
    memory.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help="a model from kvcheck.serving.MODELS (repeatable; default: all)",
    )
    memory.add_argument(
        "--budget-gib",
        type=float,
        default=_DEFAULT_BUDGET_GIB,
        help=f"KV memory budget in GiB (default {_DEFAULT_BUDGET_GIB:g})",
    )
    memory.add_argument(
        "--dtype", default=_DEFAULT_DTYPE, help=f"KV dtype (default {_DEFAULT_DTYPE})"
    )
    memory.add_argument(
        "--page-size",
        type=int,
        default=_DEFAULT_PAGE_SIZE,
        help=f"tokens per page (default {_DEFAULT_PAGE_SIZE})",
    )
    memory.set_defaults(handler=_memory_report)
    return parser


def pytest_command(
    *,
    suite: str,
    target: str,
    device: str | None,
    profile: str | None,
    workers: str | None,
    junit_xml: str | None,
    keyword: str | None,
    results_path: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line that runs ``suite`` for the kvcheck command.

    ``suite`` is a path, or a dotted module run with ``--pyargs``. With
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, the plugins the suite needs are named with ``-p``.

    Example:
        >>> cmd = pytest_command(suite="kvcheck.suite", target="kvcheck", device=None,
        ...                      profile=None, workers="2", junit_xml=None, keyword=None,
        ...                      results_path=Path("r.json"))
        >>> cmd[3:6]
        ['--pyargs', 'kvcheck.suite', '-p']
    """
    command = [sys.executable, "-m", "pytest"]
    command += [suite] if Path(suite).exists() else ["--pyargs", suite]
    # No .pytest_cache inside an installed package; verbose lines are the live progress.
    command += ["-p", "no:cacheprovider", "-v", "--tb=short"]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        # Without entry-point plugins, name the ones the suite needs.
        command += ["-p", "kvcheck.plugin", "-p", "_hypothesis_pytestplugin"]
        if workers is not None:
            command += ["-p", "xdist.plugin"]
    command += [f"--kvcheck-target={target}", f"--kvcheck-results={results_path}"]
    if device is not None:
        command.append(f"--kvcheck-device={device}")
    if profile is not None:
        command.append(f"--kvcheck-profile={profile}")
    if workers is not None:
        command += ["-n", workers]
    if junit_xml is not None:
        command.append(f"--junit-xml={junit_xml}")
    if keyword is not None:
        command += ["-k", keyword]
    return [*command, *extra]


# --- commands ---------------------------------------------------------------------------------


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=None,
        help="kvcheck (default), sglang, or module:attr (default: KVCHECK_TARGET, else kvcheck)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="auto, cpu, cuda or cuda:N (default: KVCHECK_DEVICE, else auto)",
    )
    parser.add_argument(
        "-n",
        dest="workers",
        default=None,
        metavar="N",
        help="pytest-xdist workers: a number or auto (default: run in one process)",
    )
    parser.add_argument("--junit-xml", default=None, metavar="FILE", help="write junit XML")
    parser.add_argument(
        "--json", dest="json_path", default=None, metavar="FILE", help="write the summary as JSON"
    )
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR", help="pytest -k")
    parser.add_argument(
        "--suite",
        default=DEFAULT_SUITE,
        help=f"tests to run: a path, or a dotted module (default: {DEFAULT_SUITE}, "
        "the suite shipped with kvcheck)",
    )


def _verify(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.profiles import PROFILE_NAMES, REPLAY

    # Replaying only stored examples is the replay command's job (it reports fixed/failing).
    choices = tuple(name for name in PROFILE_NAMES if name != REPLAY)
    if options.profile is not None and options.profile not in choices:
        raise UsageProblem(
            f"--profile={options.profile!r} is not a kvcheck profile for verify; "
            f"choose one of {', '.join(choices)} (kvcheck replay runs {REPLAY})"
        )
    return _run_suite(options, extra, command="verify", profile=options.profile)


def _replay(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.profiles import REPLAY

    return _run_suite(options, extra, command="replay", profile=REPLAY)


def _run_suite(
    options: argparse.Namespace, extra: Sequence[str], *, command: str, profile: str | None
) -> int:
    """Check the settings here (fast, clear errors), then run pytest and summarize."""
    from kvcheck.results import load_results
    from kvcheck.summary import exit_code_for, render_replay, render_verify

    target = _checked_target(options.target)
    device = _checked_device(options.device)
    _check_database()
    _check_workers(options.workers)
    with tempfile.TemporaryDirectory(prefix="kvcheck-") as scratch:
        results_path = Path(scratch) / "results.json"
        argv = pytest_command(
            suite=options.suite,
            target=target,
            device=device,
            profile=profile,
            workers=options.workers,
            junit_xml=options.junit_xml,
            keyword=options.keyword,
            results_path=results_path,
            extra=extra,
        )
        print(f"kvcheck {command}: {shlex.join(argv)}", flush=True)
        status = subprocess.call(argv)
        try:
            results: dict[str, Any] | None = load_results(results_path)
        except ValueError:
            results = None
    exit_code = exit_code_for(status)
    if results is None:
        print(
            f"\nkvcheck {command}: pytest stopped before running the suite (exit {status}); "
            "see its message above",
            file=sys.stderr,
        )
        return 2
    if command == "replay":
        print("\n" + render_replay(results, exit_code=exit_code))
    else:
        print("\n" + render_verify(results, exit_code=exit_code))
    if options.json_path:
        _write_json(Path(options.json_path), results, command=command, exit_code=exit_code)
    return exit_code


def _memory_report(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.memory_report import memory_rows, render_memory_report

    if extra:
        raise UsageProblem(f"memory-report takes no pytest arguments, got {list(extra)}")
    if not options.budget_gib > 0:
        raise UsageProblem(f"--budget-gib={options.budget_gib} must be positive")
    if options.page_size < 1:
        raise UsageProblem(f"--page-size={options.page_size} must be at least 1")
    budget_bytes = int(options.budget_gib * (1 << 30))
    try:
        rows = memory_rows(
            options.model,
            budget_bytes=budget_bytes,
            dtype=options.dtype,
            page_size=options.page_size,
        )
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    print(
        render_memory_report(
            rows, budget_bytes=budget_bytes, dtype=options.dtype, page_size=options.page_size
        )
    )
    return 0


# --- checks -----------------------------------------------------------------------------------


def _checked_target(name: str | None) -> str:
    from kvcheck.targets import TargetError, resolve_target, target_spec

    try:
        resolve_target(name)
    except TargetError as exc:
        raise UsageProblem(str(exc)) from exc
    return target_spec(name)


def _checked_device(spec: str | None) -> str | None:
    from kvcheck.devices import DEVICE_ENV_VAR, parse_device_spec

    if spec is None and not os.environ.get(DEVICE_ENV_VAR, "").strip():
        return None
    try:
        return parse_device_spec(spec if spec is not None else os.environ[DEVICE_ENV_VAR])
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc


def _check_database() -> None:
    from kvcheck.db import DATABASE_ENV_VAR, DatabaseSpecError, database_from_spec

    try:
        database_from_spec(os.environ.get(DATABASE_ENV_VAR))
    except DatabaseSpecError as exc:
        raise UsageProblem(str(exc)) from exc


def _check_workers(workers: str | None) -> None:
    if workers is None or workers in ("auto", "logical") or workers.isdigit():
        return
    raise UsageProblem(f"-n {workers!r}: expected a number of workers, auto or logical")


def _write_json(path: Path, results: dict[str, Any], *, command: str, exit_code: int) -> None:
    from kvcheck.summary import replay_verdicts

    payload = {**results, "command": command, "exit_code": exit_code}
    if command == "replay":
        payload["verdicts"] = [
            {"nodeid": test["nodeid"], "verdict": verdict}
            for verdict, test in replay_verdicts(results.get("tests", ()))
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
