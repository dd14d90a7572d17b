"""The ``kvcheck`` command.

``kvcheck verify``
    Run the property suite shipped in the package (``kvcheck.suite``) against a target and
    device in a pytest subprocess, streaming pytest's progress, then print a summary: per
    property its result, examples and time; per failure the minimal reproduction.
``kvcheck replay``
    Run only the examples stored in the database (``KVCHECK_DB``) and say, per test that had
    some, whether it is still failing or fixed. Examples are stored per target: ``--target``
    chooses whose; without it, each target that has stored examples is replayed in turn.
``kvcheck memory-report``
    Cell sizes, token capacities and pool bytes (built on ``meta``) for real model configs.
``kvcheck campaign``
    The suite in shards on a Ray cluster until a time or example budget is spent, sharing one
    example database (:mod:`kvcheck.runner.campaign`; ``pip install 'kvcheck[campaign]'``).

Output: a progress line (rewritten in place on a terminal, a few lines otherwise), then each
failure once (property, error with the first differing byte, minimal example, reproduction
script) and a summary with passes collapsed and skips grouped by reason. ``--verbose``
streams pytest's ``-v`` log and adds a row per test; ``--quiet`` prints only the summary.
pytest's full log, ``results.json`` and the reproduction scripts (``repros/``) are kept in
``--results-dir`` (default ``.kvcheck`` under the current directory).

Exit status: 0 all passed; 1 a property failed (replay: still failing); 2 usage, target or
setup error, or the example database failed (a failing example could not be saved; replay:
the database is missing, empty, holds examples that cannot be decoded, or none of them
belongs to the selected tests); 130 interrupted by Ctrl-C (pytest stops, and the summary of
what ran is printed first). Arguments after ``--`` go to pytest unchanged.

Example (the error goes to stderr):
    >>> main(["verify", "--target", "no_such_target"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import kvcheck
from kvcheck.specs import POOL_FAMILIES

__all__ = ["build_parser", "main", "pytest_command"]

DEFAULT_SUITE = "kvcheck.suite"
DEFAULT_RESULTS_DIR = ".kvcheck"
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: How long pytest gets to stop by itself after a Ctrl-C before it is sent one.
_INTERRUPT_GRACE_S = 10.0
_EXIT_STATUS_TEXT = (
    "Exit status: 0 all passed; 1 a property failed (replay: still failing); 2 usage, target "
    "or setup error, or the example database failed (a failing example could not be saved; "
    "replay: the database is missing, empty, holds examples that cannot be decoded, or none "
    "of them belongs to the selected tests); 130 interrupted (Ctrl-C), after the summary "
    "of what ran."
)
_DEFAULT_BUDGET_GIB = 64.0
_DEFAULT_PAGE_SIZE = 64
_DEFAULT_DTYPE = "bfloat16"


class UsageProblem(Exception):
    """A command-line or environment setting that stops the command before it runs."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcheck`` command with ``argv`` (default ``sys.argv[1:]``); return the status.

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        kvcheck ...
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
        epilog=f"{_EXIT_STATUS_TEXT} Arguments after -- are passed to pytest.",
    )
    parser.add_argument("--version", action="version", version=f"kvcheck {kvcheck.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    verify = commands.add_parser(
        "verify",
        help="run the property suite against a target and summarize it",
        epilog=_EXIT_STATUS_TEXT,
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
        "replay",
        help="rerun only the stored (previously failing) examples",
        epilog=_EXIT_STATUS_TEXT,
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

    from kvcheck.runner.campaign import add_campaign_parser

    add_campaign_parser(commands)
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
        command += ["-p", "kvcheck.runner.plugin", "-p", "_hypothesis_pytestplugin"]
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
        "--family",
        dest="families",
        action="append",
        default=None,
        choices=POOL_FAMILIES,
        help="only this pool family's tests (repeatable): pytest -k FAMILY, which selects "
        "the tests whose id contains the name, i.e. the [FAMILY] parameter of per-family "
        "properties and tests or modules named after the family (test_noop.py); several "
        "--family are or-ed, and and-ed with -k",
    )
    output = parser.add_mutually_exclusive_group()
    for flags, verbosity, does in (
        (("-v", "--verbose"), 1, "stream pytest's -v log and add a row per test to the summary"),
        (("-q", "--quiet"), -1, "print only the summary (no progress, no failure details)"),
    ):
        output.add_argument(
            *flags, dest="verbosity", action="store_const", const=verbosity, default=0, help=does
        )
    parser.add_argument(
        "--results-dir",
        default=DEFAULT_RESULTS_DIR,
        metavar="DIR",
        help=f"where results.json, pytest.log and repros/ are kept (default: "
        f"{DEFAULT_RESULTS_DIR} under the current directory)",
    )
    parser.add_argument(
        "--repro-dir",
        default=None,
        metavar="DIR",
        help="where a standalone reproduction script is written per failure "
        "(default: repros/ in --results-dir)",
    )
    parser.add_argument(
        "--suite",
        default=DEFAULT_SUITE,
        help=f"tests to run: a path, or a dotted module (default: {DEFAULT_SUITE}, "
        "the suite shipped with kvcheck)",
    )


def _verify(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.runner.profiles import PROFILE_NAMES, REPLAY

    # Replaying only stored examples is the replay command's job (it reports fixed/failing).
    choices = tuple(name for name in PROFILE_NAMES if name != REPLAY)
    if options.profile is not None and options.profile not in choices:
        raise UsageProblem(
            f"--profile={options.profile!r} is not a kvcheck profile for verify; "
            f"choose one of {', '.join(choices)} (kvcheck replay runs {REPLAY})"
        )
    return _run_suite(options, extra, command="verify", profile=options.profile)


def _replay(options: argparse.Namespace, extra: Sequence[str]) -> int:
    """Replay one target's stored examples, or, without ``--target``, each target's in turn.

    A database may hold several targets' examples (kvcheck keys them by target); each is
    replayed against its own target, never another's, and named before its run.
    """
    from kvcheck.runner.profiles import REPLAY

    targets = _targets_to_replay(options.target)
    if len(targets) == 1:
        return _run_suite(options, extra, command="replay", profile=REPLAY, target=targets[0])
    for option, value in (("--json", options.json_path), ("--junit-xml", options.junit_xml)):
        if value is not None:
            raise UsageProblem(
                f"the database holds examples of {len(targets)} targets "
                f"({', '.join(map(repr, targets))}), and {option} takes one target's results: "
                "choose one with --target"
            )
    statuses = []
    for number, name in enumerate(targets, start=1):
        print(f"kvcheck replay: target {number} of {len(targets)}: {name!r}", flush=True)
        statuses.append(
            _run_suite(
                argparse.Namespace(
                    **{
                        **vars(options),
                        "results_dir": _target_results_dir(Path(options.results_dir), name),
                    }
                ),
                extra,
                command="replay",
                profile=REPLAY,
                target=name,
            )
        )
        if statuses[-1] == EXIT_INTERRUPTED:
            return EXIT_INTERRUPTED
    return max(statuses)


def _targets_to_replay(option: str | None) -> list[str]:
    """``--target`` (or ``KVCHECK_TARGET``); else every target with stored examples; else the
    default target, which also reads examples an older kvcheck stored without a target."""
    from kvcheck.runner.db import scan_database
    from kvcheck.targets import DEFAULT_TARGET, TARGET_ENV_VAR, target_spec

    if (option and option.strip()) or os.environ.get(TARGET_ENV_VAR, "").strip():
        return [target_spec(option)]
    scan = scan_database(_check_database(writable=False))
    holding = [held.target for held in scan.targets if held.entries]
    return holding or [DEFAULT_TARGET]


def _target_results_dir(results_dir: Path, target: str) -> str:
    """One target's results under ``results_dir`` when several are replayed in one command.

    Example:
        >>> _target_results_dir(Path(".kvcheck"), "mypkg.pools:buggy")
        '.kvcheck/replay-mypkg.pools-buggy'
    """
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", target).strip("-") or "target"
    return str(results_dir / f"replay-{slug}")


def _run_suite(
    options: argparse.Namespace,
    extra: Sequence[str],
    *,
    command: str,
    profile: str | None,
    target: str | None = None,
) -> int:
    """Check the settings here (fast, clear errors), then run pytest and summarize.

    ``target`` overrides ``options.target`` (replay names each stored target)."""
    from kvcheck.runner.profiles import unknown_env_warnings
    from kvcheck.runner.results import load_results
    from kvcheck.runner.summary import EXIT_USAGE, exit_code_for, render_replay, render_verify

    for warning in unknown_env_warnings():
        print(f"kvcheck: warning: {warning}", file=sys.stderr)
    target = _checked_target(options.target if target is None else target)
    device = _checked_device(options.device)
    # Replay reads first: a mistyped path must not be created (and then found empty).
    database = _check_database(writable=command != "replay")
    _check_workers(options.workers)
    for option, value in (("--json", options.json_path), ("--junit-xml", options.junit_xml)):
        if value is not None:
            _check_output_path(option, Path(value))
    results_dir = _usable_directory("--results-dir", Path(options.results_dir))
    repro_dir = Path(options.repro_dir) if options.repro_dir else results_dir / "repros"
    scan = None
    if command == "replay":
        scan = _scan_for_replay(database, target=target)
        _check_database(writable=True)
    results_path = results_dir / "results.json"
    log_path = results_dir / "pytest.log"
    results_path.unlink(missing_ok=True)  # a stale file must not pass for this run's results
    argv = pytest_command(
        suite=options.suite,
        target=target,
        device=device,
        profile=profile,
        workers=options.workers,
        junit_xml=options.junit_xml,
        keyword=_keyword(options.keyword, options.families),
        results_path=results_path,
        extra=extra,
    )
    verbosity = options.verbosity
    run = _SuiteRun(command=command, verbosity=verbosity, log_path=log_path)
    status = run.run(argv)
    try:
        results = load_results(results_path)
    except ValueError:
        print(
            f"\nkvcheck {command}: pytest stopped before running the suite (exit {status}); "
            + ("see its message above" if verbosity > 0 else run.log_tail()),
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if run.interrupted else EXIT_USAGE
    tests = results.get("tests", ())
    exit_code = exit_code_for(status)
    if any(test.get("save_errors") for test in tests):
        exit_code = EXIT_USAGE  # reproductions were lost: the run cannot be trusted to replay
    if scan is not None and (scan.undecodable or not any(t.get("stored_examples") for t in tests)):
        exit_code = max(exit_code, EXIT_USAGE)  # replay found nothing it could replay
    if run.interrupted:
        exit_code = EXIT_INTERRUPTED
    scripts_note = _write_repro_scripts(results, repro_dir=repro_dir, target=target)
    locations = {
        "results": _shown(results_path),
        "pytest log": "(printed above)" if verbosity > 0 else _shown(log_path),
        "reproduction scripts": _shown(repro_dir) if scripts_note is None else scripts_note,
    }
    if command == "replay":
        text = render_replay(
            results,
            exit_code=exit_code,
            verbosity=verbosity,
            scan=scan,
            target=target,
            locations=locations,
        )
    else:
        text = render_verify(
            results,
            exit_code=exit_code,
            verbosity=verbosity,
            locations=locations,
            interrupted=run.interrupted,
        )
    print("\n" + text, flush=True)
    if options.json_path:
        try:
            _write_json(Path(options.json_path), results, command=command, exit_code=exit_code)
        except OSError as exc:
            print(
                f"kvcheck: error: cannot write --json {options.json_path}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return EXIT_USAGE
    return exit_code


class _SuiteRun:
    """The pytest subprocess: its output (streamed, or to the log file) and our progress line.

    pytest stays in the kvcheck command's process group, so a Ctrl-C in the terminal
    reaches both; pytest then stops, records what ran, and exits. If only the kvcheck
    command got the signal, it is passed on after a grace period.
    """

    def __init__(self, *, command: str, verbosity: int, log_path: Path) -> None:
        self.command = command
        self.verbosity = verbosity
        self.log_path = log_path
        self.interrupted = False
        self.total: int | None = None
        self.counts: Counter[str] = Counter()
        self._tty = sys.stdout.isatty()
        self._next_report = 0

    def run(self, argv: list[str]) -> int:
        read_fd, write_fd = os.pipe()
        argv = [*argv, f"--kvcheck-progress-fd={write_fd}"]
        env = _subprocess_env()
        if self.verbosity > 0:
            print(f"kvcheck {self.command}: {shlex.join(argv)}", flush=True)
        with contextlib.ExitStack() as stack:
            stdout = None if self.verbosity > 0 else stack.enter_context(self.log_path.open("wb"))
            try:
                process = subprocess.Popen(argv, stdout=stdout, env=env, pass_fds=(write_fd,))
            finally:
                os.close(write_fd)
            with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as events:
                try:
                    for line in events:
                        self._event(line)
                except KeyboardInterrupt:
                    self.interrupted = True
            return self._wait(process)

    def log_tail(self, lines: int = 20) -> str:
        """The end of pytest's output (its reason for stopping), indented."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"see {self.log_path}"
        tail = text.strip().splitlines()[-lines:]
        return "its output ends:\n" + "\n".join(f"    {line}" for line in tail)

    def _wait(self, process: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                if not self.interrupted:
                    return process.wait()
                try:
                    return process.wait(timeout=_INTERRUPT_GRACE_S)
                except subprocess.TimeoutExpired:
                    # Only we got the signal (kill -INT, not the terminal): pass it on.
                    process.send_signal(signal.SIGINT)
                    return process.wait()
            except KeyboardInterrupt:
                if self.interrupted:  # a second Ctrl-C: stop waiting for a clean exit
                    process.kill()
                    return process.wait()
                self.interrupted = True
            finally:
                self._end_line()

    def _event(self, line: str) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return
        if event.get("event") == "collected":
            self.total = int(event.get("total", 0))
            if self.verbosity == 0:
                print(
                    f"kvcheck {self.command}: running {self.total} tests "
                    f"(full pytest log: {_shown(self.log_path)})",
                    flush=True,
                )
        elif event.get("event") == "test":
            self.counts[str(event.get("outcome"))] += 1
            if self.verbosity == 0:
                self._progress(str(event.get("nodeid", "")))

    def _progress(self, nodeid: str) -> None:
        from kvcheck.runner.summary import short_name

        done = sum(self.counts.values())
        total = self.total or 0
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts.items()))
        text = f"[{done}/{total or '?'}] {counts}"
        if self._tty:
            width = shutil.get_terminal_size().columns
            line = f"{text}  {short_name(nodeid)}"[: max(width - 1, 20)]
            print(f"\r\x1b[K{line}", end="", flush=True)
        elif done >= self._next_report or done == total:
            # Off a terminal, a few lines: about every quarter of the run.
            print(text, flush=True)
            self._next_report = done + max(1, total // 4)

    def _end_line(self) -> None:
        if self._tty and self.verbosity == 0 and self.counts:
            print(flush=True)
            self._tty = False  # the line is finished; later ends print nothing


def _memory_report(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.runner.memory_report import memory_rows, render_memory_report

    if extra:
        raise UsageProblem(f"memory-report takes no pytest arguments, got {list(extra)}")
    if not options.budget_gib > 0:
        raise UsageProblem(f"--budget-gib={options.budget_gib} must be positive")
    if options.page_size < 1:
        raise UsageProblem(f"--page-size={options.page_size} must be at least 1")
    sizing: dict[str, Any] = {
        "budget_bytes": int(options.budget_gib * (1 << 30)),
        "dtype": options.dtype,
        "page_size": options.page_size,
    }
    try:
        rows = memory_rows(options.model, **sizing)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    print(render_memory_report(rows, **sizing))
    return 0


# --- checks -----------------------------------------------------------------------------------


def _checked_target(name: str | None) -> str:
    """Resolve the target as pytest will: module:attr is imported from the current directory."""
    from kvcheck.targets import TargetError, resolve_target, target_spec

    try:
        with _cwd_on_sys_path():
            resolve_target(name)
    except TargetError as exc:
        raise UsageProblem(str(exc)) from exc
    return target_spec(name)


@contextlib.contextmanager
def _cwd_on_sys_path() -> Iterator[None]:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _subprocess_env() -> dict[str, str]:
    """The environment of pytest: the current directory first on PYTHONPATH, like our import."""
    env = dict(os.environ)
    parts = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _keyword(keyword: str | None, families: Sequence[str] | None) -> str | None:
    """The -k expression: the families or-ed, and-ed with the user's -k.

    Example:
        >>> _keyword("move", ["mha", "dsa"])
        '(mha or dsa) and (move)'
        >>> _keyword(None, ["dsa"])
        'dsa'
    """
    if not families:
        return keyword
    chosen = " or ".join(dict.fromkeys(families))
    return f"({chosen}) and ({keyword})" if keyword else chosen


def _checked_device(spec: str | None) -> str | None:
    from kvcheck.runner.devices import DEVICE_ENV_VAR, parse_device_spec

    if spec is None and not os.environ.get(DEVICE_ENV_VAR, "").strip():
        return None
    try:
        return parse_device_spec(spec if spec is not None else os.environ[DEVICE_ENV_VAR])
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc


def _check_database(*, writable: bool) -> Any:
    """The database KVCHECK_DB names; with ``writable``, checked with a probe file."""
    from kvcheck.runner.db import DatabaseSpecError, database_from_env

    try:
        return database_from_env(writable=writable)
    except DatabaseSpecError as exc:
        raise UsageProblem(str(exc)) from exc


def _scan_for_replay(database: Any, *, target: str) -> Any:
    """What replay of ``target`` will find; nothing (missing, empty, all undecodable, only
    other targets' examples) is a usage error."""
    from kvcheck.runner.db import describe_database, scan_database

    scan = scan_database(database)
    where = describe_database(database)
    held = scan.holdings(target)
    others = [f"{h.target!r} ({h.entries})" for h in scan.targets if h.entries and h is not held]
    if not held.entries and not scan.legacy and others:
        first = next(h.target for h in scan.targets if h.entries and h is not held)
        raise UsageProblem(
            f"nothing to replay for target {target!r}: the example database ({where}) holds "
            f"stored examples of {', '.join(others)} only; replay them with "
            f"`kvcheck replay --target {shlex.quote(first)}`, or without --target for all"
        )
    if not scan.scanned:
        return scan
    if scan.entries == 0:
        missing = f" ({', '.join(scan.missing)} does not exist)" if scan.missing else ""
        raise UsageProblem(
            f"nothing to replay: the example database ({where}) holds no stored examples"
            f"{missing}; check KVCHECK_DB"
        )
    if scan.undecodable == scan.entries:
        raise UsageProblem(
            f"nothing to replay: {scan.undecodable} stored examples could not be decoded "
            f"(of {scan.entries} in {where}); the database is corrupted or from another tool"
        )
    return scan


def _check_output_path(option: str, path: Path) -> None:
    """Refuse before the run a file that could not be written after it."""
    if path.is_dir():
        raise UsageProblem(f"{option} {path}: is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageProblem(f"{option} {path}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageProblem(f"{option} {path}: directory {str(parent)!r} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageProblem(f"{option} {path}: the file exists and is not writable")


def _usable_directory(option: str, path: Path) -> Path:
    """Create ``path`` and a probe file in it; a UsageProblem saying why when that fails."""
    from kvcheck.runner.db import probe_directory

    try:
        probe_directory(path)
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: cannot write there ({exc.strerror or exc})") from exc
    return path.resolve()


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is below it."""
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def _write_repro_scripts(results: dict[str, Any], *, repro_dir: Path, target: str) -> str | None:
    """A standalone script per failure that carries reproduction data; its path goes on the
    failure as ``script``. Returns a note instead of the folder when none could be written."""
    from kvcheck.runner.repro import render_script, script_name
    from kvcheck.runner.summary import FAILING_OUTCOMES

    failures = [
        (test["nodeid"], failure)
        for test in results.get("tests", ())
        if test.get("outcome") in FAILING_OUTCOMES
        for failure in (test.get("failures") or ())
        if failure.get("reproduction_data")
    ]
    if not failures:
        return "none (no failure carried reproduction data)"
    try:
        repro_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"not written: cannot create {repro_dir} ({exc.strerror or exc})"
    used: set[str] = set()
    for nodeid, failure in failures:
        path = repro_dir / script_name(nodeid, used)
        try:
            script = render_script(failure["reproduction_data"], target=target)
            path.write_text(script, encoding="utf-8")
        except Exception as exc:  # one bad script must not hide the others or the summary
            failure["script_error"] = f"{type(exc).__name__}: {exc}"
            continue
        failure["script"] = _shown(path)
    return None


def _check_workers(workers: str | None) -> None:
    if workers is None or workers in ("auto", "logical") or workers.isdigit():
        return
    raise UsageProblem(f"-n {workers!r}: expected a number of workers, auto or logical")


def _write_json(path: Path, results: dict[str, Any], *, command: str, exit_code: int) -> None:
    from kvcheck.runner.summary import replay_verdicts

    payload = {**results, "command": command, "exit_code": exit_code}
    if command == "replay":
        payload["verdicts"] = [
            {"nodeid": test["nodeid"], "verdict": verdict}
            for verdict, test in replay_verdicts(results.get("tests", ()))
        ]
    path.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
