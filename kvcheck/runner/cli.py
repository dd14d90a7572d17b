"""The ``kvcheck`` command.

``kvcheck verify``
    Run the property suite shipped in the package (``kvcheck.suite``) against a target and
    device in a pytest subprocess, streaming pytest's progress, then print a summary: per
    property its result, examples and time; per failure the minimal reproduction.
``kvcheck replay``
    Run only the examples stored in the database (``KVCHECK_DB``) and say, per test that had
    some, whether it is still failing or fixed; "fixed" only when every stored example of the
    test was decoded, replayed and passed, "unconfirmed" (exit 2) when the test passed
    without that evidence. Examples are stored per target: ``--target`` chooses whose;
    without it, each target that has stored examples is replayed in turn.
``kvcheck memory-report``
    Cell sizes, token capacities and pool bytes (built on ``meta``) for real model configs.
``kvcheck classes``
    Every pool class the target's upstream package defines (sglang's ``srt/mem_cache``), each
    built (how) or not (why; ``new in <release>`` for one its declaration has no row for).
``kvcheck campaign``
    The suite in shards on a Ray cluster until a time or example budget is spent, sharing one
    example database (:mod:`kvcheck.runner.campaign`; ``pip install 'kvcheck[campaign]'``).

Output: a progress line (rewritten in place on a terminal, a few lines otherwise); verify's
first failure in full (property, error with the first differing byte, minimal example,
reproduction script) as soon as its test has finished, shrinking included, while the run
goes on, and each later one in a line; then a summary with the failures (one in full, not
one already printed), passes collapsed and skips grouped by reason. ``--verbose`` streams
pytest's ``-v`` log, prints every failure in full as it comes and adds a row per test;
``--quiet`` prints only the summary.
pytest's full log, ``results.json`` and the reproduction scripts (``repros/``) are kept in
``--results-dir`` (default ``.kvcheck`` under the current directory).

Settings are checked before pytest starts, cheapest first, so a mistake is reported in about
a second: the options (``-n``, the device, CUDA where asked for, every output path by
writing a probe file there), then the target (``sglang`` and ``module:attr`` are imported)
and the example database. A ``-k``/``--family`` that selects no test is pytest's to find
(exit 5): the command then says so in one line and exits 2. A database holding a damaged
entry that the run would read (the target's own or one an older kvcheck stored: empty,
unreadable, or not a serialized example) stops ``verify`` and ``replay`` there, before any
test runs, with one line naming the count and the database: Hypothesis would replay an empty
entry as a fresh random example and silently drop an undecodable one, and either would pass
for a fixed bug. The time in the summary is the command's wall time.

Exit status: 0 all passed; 1 a property failed (replay: still failing); 2 usage, target or
setup error, or the example database failed (it holds damaged entries the run would read; a
failing example could not be saved; replay: the database is missing or empty, none of its
examples belongs to the selected tests, or a test passed without replaying every stored
example: "unconfirmed"); 130 interrupted: SIGINT (Ctrl-C) or SIGTERM, at any moment
(:mod:`kvcheck.runner.launch`), after the summary of what ran. Arguments after ``--`` go
to pytest unchanged.

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
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import kvcheck
from kvcheck.runner.launch import (
    EXIT_INTERRUPTED,
    Interrupts,
    SuiteRun,
    pytest_command,
    shown_path,
)
from kvcheck.runner.preflight import (
    DEFAULT_SUITE,
    UsageProblem,
    check_database,
    check_output_path,
    check_workers,
    checked_device,
    checked_target,
    keyword,
    usable_directory,
)
from kvcheck.runner.repro_scripts import write_repro_scripts
from kvcheck.specs import POOL_FAMILIES

__all__ = ["EXIT_INTERRUPTED", "build_parser", "main", "pytest_command"]

DEFAULT_RESULTS_DIR = ".kvcheck"
_EXIT_STATUS_TEXT = (
    "Exit status: 0 all passed; 1 a property failed (replay: still failing); 2 usage, target "
    "or setup error, or the example database failed (it holds damaged entries the run would "
    "read; a failing example could not be saved; replay: the database is missing or empty, "
    "none of its examples belongs to the selected tests, or a test passed without replaying "
    "every stored example); 130 interrupted (SIGINT or SIGTERM), after the summary of what "
    "ran."
)
#: How a run command passes its own arguments to pytest, in its --help.
_PYTEST_ARGUMENTS_TEXT = (
    "Arguments after -- go to pytest as they are, e.g. kvcheck {command} -- -x --tb=long."
)
#: pytest's exit status when it collected (or, after -k, selected) no test.
_PYTEST_NO_TESTS = 5
_DEFAULT_BUDGET_GIB = 64.0
_DEFAULT_PAGE_SIZE = 64
_DEFAULT_DTYPE = "bfloat16"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcheck`` command with ``argv`` (default ``sys.argv[1:]``); return the status.

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        kvcheck ...
        0
    """
    started = time.monotonic()
    with Interrupts() as interrupts:
        try:
            return _main(argv, started=started, interrupts=interrupts)
        except KeyboardInterrupt:  # raised by Interrupts before pytest starts
            print("\nkvcheck: interrupted before any test ran; exit 130", file=sys.stderr)
            return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, *, started: float, interrupts: Interrupts) -> int:
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
    options.started = started
    options.interrupts = interrupts
    try:
        return int(options.handler(options, pytest_extra))
    except UsageProblem as problem:
        print(f"kvcheck: error: {problem}{_code_traceback(problem, options)}", file=sys.stderr)
        return 2


def _code_traceback(problem: UsageProblem, options: argparse.Namespace) -> str:
    """The traceback of the user's own code behind ``problem`` (a target module that raised
    on import), with ``-v``; without it, a pointer to ``-v``. Nothing for other problems,
    whose one line says it all."""
    import traceback

    from kvcheck.targets import TargetCodeError

    error = problem.__cause__
    if not isinstance(error, TargetCodeError) or error.__cause__ is None:
        return ""
    if getattr(options, "verbosity", 0) <= 0:
        return " (-v shows its traceback)"
    return "\n" + "".join(traceback.format_exception(error.__cause__)).rstrip()


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
        epilog=f"{_PYTEST_ARGUMENTS_TEXT.format(command='verify')} {_EXIT_STATUS_TEXT}",
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
        epilog=f"{_PYTEST_ARGUMENTS_TEXT.format(command='replay')} {_EXIT_STATUS_TEXT}",
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
        help="a model from kvcheck.vocabulary.MODELS, or its short name such as Llama-3.1-8B, "
        "or a Hugging Face model id in the local Hugging Face cache (repeatable; default: "
        "all named models)",
    )
    memory.add_argument(
        "--config",
        action="append",
        default=None,
        metavar="PATH",
        help="a Hugging Face config.json (or its folder, or a model id in the local Hugging "
        "Face cache: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub; never downloaded) "
        "of a plain-attention, MLA or DSA model (repeatable)",
    )
    memory.add_argument(
        "--budget-gib",
        type=float,
        default=_DEFAULT_BUDGET_GIB,
        help=f"KV memory budget in GiB (default {_DEFAULT_BUDGET_GIB:g})",
    )
    memory.add_argument(
        "--dtype",
        default=_DEFAULT_DTYPE,
        help="KV dtype: sglang's --kv-cache-dtype (auto, bf16, bfloat16, fp8_e4m3, "
        "fp8_e5m2; the quantized mxfp8, nvfp4 and fp4_mx_block16, whose cells are split "
        "into payload and scale bytes beside the --prefill-only-disable-kv-cache refusal) "
        "or a torch dtype name (bfloat16, float16, float32, float8_e4m3fn, "
        f"float8_e5m2) (default {_DEFAULT_DTYPE})",
    )
    memory.add_argument(
        "--page-size",
        type=int,
        default=_DEFAULT_PAGE_SIZE,
        help=f"tokens per page (default {_DEFAULT_PAGE_SIZE})",
    )
    memory.set_defaults(handler=_memory_report)

    classes = commands.add_parser(
        "classes",
        help="list every pool class the target's upstream package defines, built or not",
    )
    classes.add_argument(
        "--target",
        default=None,
        help="a target with class discovery, such as sglang (default: KVCHECK_TARGET, else "
        "kvcheck, which has none)",
    )
    classes.set_defaults(handler=_classes)

    from kvcheck.runner.campaign import add_campaign_parser

    add_campaign_parser(commands)
    return parser


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
    replayed against its own target, never another's, and named before its run. Every
    target's share is checked for damage before the first one runs, so that no verdict is
    printed while another target's examples are unreadable. Examples of a target with
    parameters (``pkg:Cls(name='x')``), which no ``--target`` spelling names, are kept, said
    and not replayed, and the exit status is then at least 2.
    """
    from kvcheck.runner.db import describe_database, scan_database
    from kvcheck.runner.profiles import REPLAY
    from kvcheck.runner.summary import EXIT_USAGE

    targets = _targets_to_replay(options.target)
    unnamed = [name for name in targets if _parameterized(name)] if not options.target else []
    for name in unnamed:  # kept, and said: no spelling here builds that very target
        print(
            f"kvcheck replay: stored examples of target {name!r} are kept, not replayed: a "
            "target with parameters is replayed by naming what builds it, with --target "
            "module:attr, or by the pytest run whose tests use it",
            file=sys.stderr,
        )
    targets = [name for name in targets if name not in unnamed]
    if not targets:
        return EXIT_USAGE
    if len(targets) == 1 and not unnamed:  # checked with the other settings, cheap ones first
        return _run_suite(options, extra, command="replay", profile=REPLAY, target=targets[0])
    database = check_database(writable=False)
    scan = scan_database(database)
    for name in targets:
        _refuse_damage(
            scan.as_one(name, _stored_names(name)),
            target=name,
            where=describe_database(database),
            command="replay",
        )
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
    return max(*statuses, EXIT_USAGE if unnamed else 0)


def _targets_to_replay(option: str | None) -> list[str]:
    """``--target`` (or ``KVCHECK_TARGET``); else every target with stored examples; else the
    default target, which also reads examples an older kvcheck stored without a target."""
    from kvcheck.runner.db import scan_database
    from kvcheck.targets import DEFAULT_TARGET, TARGET_ENV_VAR, target_spec

    if (option and option.strip()) or os.environ.get(TARGET_ENV_VAR, "").strip():
        return [target_spec(option)]
    scan = scan_database(check_database(writable=False))
    holding: dict[str, str] = {}  # identity -> the stored name to replay it as
    for held in scan.targets:
        if held.entries:
            holding.setdefault(_stored_names(held.target)[0], held.target)
    return list(holding.values()) or [DEFAULT_TARGET]


def _parameterized(stored_name: str) -> bool:
    """Whether a stored target name is an identity with parameters
    (``pkg.mod:Cls(name='x')``), which no ``--target`` spelling resolves.

    Example:
        >>> _parameterized("pkg.mod:Cls(name='x')"), _parameterized("pkg.mod:target")
        (True, False)
    """
    return stored_name.endswith(")") and "(" in stored_name.partition(":")[2]


def _target_results_dir(results_dir: Path, target: str) -> str:
    """One target's results under ``results_dir`` when several are replayed in one command.

    Example:
        >>> _target_results_dir(Path(".kvcheck"), "mypkg.pools:buggy")
        '.kvcheck/replay-mypkg.pools-buggy'
    """
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", target).strip("-") or "target"
    return str(results_dir / f"replay-{slug}")


class _Settings(NamedTuple):
    """What the checks before the run settled."""

    target: str
    import_root: str | None
    device: str | None
    keyword: str | None
    results_dir: Path
    repro_dir: Path
    scan: Any


def _checked_settings(
    options: argparse.Namespace, *, command: str, target: str | None = None
) -> _Settings:
    """Every setting checked before pytest starts, the cheap ones first (a mistyped option
    is reported in about a second), then the target (``target`` overrides
    ``options.target``) and the database."""
    from kvcheck.runner.profiles import unknown_env_warnings

    for warning in unknown_env_warnings():
        print(f"kvcheck: warning: {warning}", file=sys.stderr)
    check_workers(options.workers)
    device = checked_device(options.device)
    for option, value in (("--json", options.json_path), ("--junit-xml", options.junit_xml)):
        if value is not None:
            check_output_path(option, Path(value))
    directories = [("--results-dir", Path(options.results_dir))]
    if options.repro_dir:
        directories.append(("--repro-dir", Path(options.repro_dir)))
    for option, directory in directories:  # probed now, created once the target is known
        usable_directory(option, directory, keep=False)
    target, import_root = checked_target(options.target if target is None else target)
    made = [usable_directory(option, directory) for option, directory in directories]
    # Replay reads first: a mistyped path must not be created (and then found empty).
    database = check_database(writable=command != "replay")
    scan = None
    if command == "replay":
        scan = _scan_for_replay(database, target=target)
        check_database(writable=True)
    else:  # verify replays the stored examples first, in Hypothesis's reuse phase
        _scan_for_verify(database, target=target)
    return _Settings(
        target=target,
        import_root=import_root,
        device=device,
        keyword=keyword(options.keyword, options.families),
        results_dir=made[0],
        repro_dir=made[1] if len(made) > 1 else made[0] / "repros",
        scan=scan,
    )


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
    from kvcheck.runner.results import load_results
    from kvcheck.runner.summary import EXIT_USAGE, exit_code_for, replay_verdicts

    settings = _checked_settings(options, command=command, target=target)
    results_path = settings.results_dir / "results.json"
    log_path = settings.results_dir / "pytest.log"
    results_path.unlink(missing_ok=True)  # a stale file must not pass for this run's results
    argv = pytest_command(
        suite=options.suite,
        target=settings.target,
        device=settings.device,
        profile=profile,
        workers=options.workers,
        junit_xml=options.junit_xml,
        keyword=settings.keyword,
        results_path=results_path,
        import_dir=os.getcwd(),
        extra=extra,
    )
    interrupts: Interrupts = options.interrupts
    early = None
    if command == "verify" and options.verbosity >= 0:
        where = f"{shown_path(results_path)}, at the end of the run"
        early = _EarlyReports(options, settings, where=where)
    run = SuiteRun(
        command=command, verbosity=options.verbosity, log_path=log_path, on_failure=early
    )
    status = run.run(argv, interrupts)
    try:
        results = load_results(results_path)
    except ValueError:
        if not interrupts.received:
            print(f"\nkvcheck {command}: {_stopped(run, status)}", file=sys.stderr)
            return EXIT_USAGE
        # Stopped before it could write its results: what kvcheck saw finish.
        results = _results_seen(
            run, target=settings.target, device=settings.device, profile=profile
        )
    tests = results.get("tests", ())
    exit_code = exit_code_for(status)
    if any(test.get("save_errors") for test in tests):
        exit_code = EXIT_USAGE  # reproductions were lost: the run cannot be trusted to replay
    scan = settings.scan
    if scan is not None and not any(t.get("stored_examples") for t in tests):
        exit_code = max(exit_code, EXIT_USAGE)  # replay found nothing it could replay
    if scan is not None and any(v == "unconfirmed" for v, _ in replay_verdicts(tests)):
        exit_code = max(exit_code, EXIT_USAGE)  # a pass that replayed less than was stored
    if interrupts.received:
        exit_code = EXIT_INTERRUPTED
    exit_code = _summarize(
        results, options, settings, command=command, exit_code=exit_code, early=early
    )
    if status == _PYTEST_NO_TESTS and settings.keyword is not None and not interrupts.received:
        print(f"kvcheck: error: {_selects_nothing(options)}", file=sys.stderr)
    return exit_code


def _selects_nothing(options: argparse.Namespace) -> str:
    """Why pytest ran nothing (its exit 5) when ``-k``/``--family`` was given: one line.

    Example:
        >>> print(_selects_nothing(argparse.Namespace(
        ...     keyword="move", families=["noop"], suite="kvcheck.suite")))  # doctest: +ELLIPSIS
        --family noop -k 'move' selected no test of kvcheck.suite; ... --pyargs kvcheck.suite
    """
    given = [f"--family {family}" for family in options.families or ()]
    given += [f"-k {options.keyword!r}"] if options.keyword else []
    suite = options.suite
    listed = shlex.join(["pytest", "--collect-only", "-q", suite])
    if not Path(suite).exists():
        listed = shlex.join(["pytest", "--collect-only", "-q", "--pyargs", suite])
    return (
        f"{' '.join(given)} selected no test of {suite}; -k matches parts of test ids "
        f"(pytest -k syntax: and, or, not, parentheses); list them with: {listed}"
    )


class _EarlyReports:
    """``verify`` reports each failing test as soon as pytest has finished it (shrinking
    included), while the run goes on: the first in full with its standalone script (every
    one with ``--verbose``), each later one in a line; the summary then refers to those
    printed in full (:func:`kvcheck.runner.summary.render_verify`'s ``printed``)."""

    def __init__(self, options: argparse.Namespace, settings: _Settings, *, where: str) -> None:
        self.options, self.settings, self.where = options, settings, where
        #: node id -> seconds since the command started, of each failure printed in full.
        self.printed: dict[str, float] = {}
        self.failures: dict[str, list[dict[str, Any]]] = {}  # theirs, with their scripts
        self.used: set[str] = set()  # script names taken

    def __call__(self, record: dict[str, Any]) -> None:
        from kvcheck.runner.summary import render_failure_now

        seconds = time.monotonic() - self.options.started
        in_full = not self.printed or self.options.verbosity > 0
        if in_full:
            write_repro_scripts(
                {"tests": [record]},
                repro_dir=self.settings.repro_dir,
                target=self.settings.target,
                import_root=self.settings.import_root,
                used=self.used,
            )
            self.printed[record["nodeid"]] = seconds
            self.failures[record["nodeid"]] = list(record.get("failures") or ())
        text = render_failure_now(
            record, seconds=seconds, in_full=in_full, where=self.where, command="kvcheck verify"
        )
        # With --verbose, pytest's own line may be unfinished.
        print(("\n" if self.options.verbosity > 0 else "") + text + "\n" * in_full, flush=True)

    def carry_scripts(self, results: dict[str, Any]) -> None:
        """Give the final results the scripts written for the failures printed early."""
        for test in results.get("tests", ()):
            early = self.failures.get(test["nodeid"], ())
            for final, before in zip(test.get("failures") or (), early, strict=False):
                final.update({k: before[k] for k in ("script", "script_command") if k in before})


def _summarize(
    results: dict[str, Any],
    options: argparse.Namespace,
    settings: _Settings,
    *,
    command: str,
    exit_code: int,
    early: _EarlyReports | None = None,
) -> int:
    """Write the scripts, print the summary, write --json; return the exit status."""
    from kvcheck.runner.summary import EXIT_USAGE, render_replay, render_verify

    if early is not None:
        early.carry_scripts(results)
    scripts_note = write_repro_scripts(
        results,
        repro_dir=settings.repro_dir,
        target=settings.target,
        import_root=settings.import_root,
        used=None if early is None else early.used,
    )
    verbosity = options.verbosity
    locations = {
        "results": shown_path(settings.results_dir / "results.json"),
        "pytest log": "(printed above)"
        if verbosity > 0
        else shown_path(settings.results_dir / "pytest.log"),
        "reproduction scripts": shown_path(settings.repro_dir)
        if scripts_note is None
        else scripts_note,
    }
    wall_s = time.monotonic() - options.started
    if command == "replay":
        text = render_replay(
            results,
            exit_code=exit_code,
            verbosity=verbosity,
            scan=settings.scan,
            target=settings.target,
            locations=locations,
        )
    else:
        text = render_verify(
            results,
            exit_code=exit_code,
            verbosity=verbosity,
            locations=locations,
            interrupted=bool(options.interrupts.received),
            wall_s=wall_s,
            printed=None if early is None else early.printed,
        )
    print("\n" + text, flush=True)
    if options.json_path:
        payload = {**results, "wall_s": round(wall_s, 3)}
        try:
            _write_json(Path(options.json_path), payload, command=command, exit_code=exit_code)
        except OSError as exc:
            print(
                f"kvcheck: error: cannot write --json {options.json_path}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return EXIT_USAGE
    return exit_code


def _results_seen(
    run: SuiteRun, *, target: str, device: str | None, profile: str | None
) -> dict[str, Any]:
    """Results as kvcheck saw them (the tests pytest reported finished), for a pytest that
    was interrupted before it wrote its own."""
    from kvcheck.runner.db import database_from_env, describe_database
    from kvcheck.runner.profiles import default_profile_name

    database = "?"
    with contextlib.suppress(Exception):  # only a heading: never fail the summary for it
        database = describe_database(database_from_env(writable=False))
    return {
        "target": {"name": target},
        "device": {"requested": device or "auto"},
        "profile": profile or default_profile_name(),
        "database": database,
        "tests": run.finished,
    }


def _stopped(run: SuiteRun, status: int) -> str:
    """Why there are no results: pytest stopped early, or ended without writing them."""
    tail = "see its message above" if run.verbosity > 0 else run.log_tail()
    if run.finished:
        return (
            f"pytest ended without writing its results (exit {status}) after "
            f"{len(run.finished)} tests had run; {tail}"
        )
    return f"pytest stopped before running the suite (exit {status}); {tail}"


def _classes(options: argparse.Namespace, extra: Sequence[str]) -> int:
    """Print each upstream pool class the target's package defines: built (how) or not
    (why), then the counts. Exit 0; 2 for a target without discovery or not installed."""
    from kvcheck.targets import TargetError, resolve_target
    from kvcheck.targets.discovery import census_line, format_census

    if extra:
        raise UsageProblem(f"classes takes no pytest arguments, got {list(extra)}")
    try:
        target = resolve_target(options.target)
    except TargetError as error:
        raise UsageProblem(str(error)) from error
    discover = getattr(target, "classes", None)
    if not callable(discover):
        raise UsageProblem(
            f"--target={target.name!r} declares no class discovery (a classes() member); "
            "sglang does"
        )
    entries = discover()
    print(format_census(entries))
    print(f"{target.name} {target.version}: {census_line(entries)}")
    return 0


def _memory_report(options: argparse.Namespace, extra: Sequence[str]) -> int:
    from kvcheck.runner.memory_report import memory_rows, pool_dtype, render_memory_report

    if extra:
        raise UsageProblem(f"memory-report takes no pytest arguments, got {list(extra)}")
    if not options.budget_gib > 0:
        raise UsageProblem(f"--budget-gib={options.budget_gib} must be positive")
    if options.page_size < 1:
        raise UsageProblem(f"--page-size={options.page_size} must be at least 1")
    try:
        sizing: dict[str, Any] = {
            "budget_bytes": int(options.budget_gib * (1 << 30)),
            "dtype": pool_dtype(options.dtype),
            "page_size": options.page_size,
        }
        models: list[Any] = list(options.model or [])
        if options.config:
            from kvcheck.vocabulary import load_model_config

            models += [load_model_config(source) for source in options.config]
        rows = memory_rows(models, **sizing)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    print(render_memory_report(rows, **sizing, spelled=options.dtype.strip()))
    return 0


# --- replay's database check -------------------------------------------------------------


def _scan_for_replay(database: Any, *, target: str) -> Any:
    """What replay of ``target`` will find; nothing (missing, empty, only other targets'
    examples) or any damaged entry it would read is a usage error."""
    from kvcheck.runner.db import describe_database, scan_database

    scan = scan_database(database).as_one(target, _stored_names(target))
    where = describe_database(database)
    _refuse_damage(scan, target=target, where=where, command="replay")
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
    return scan


def _stored_names(spelling: str) -> tuple[str, ...]:
    """The names ``spelling``'s examples may be stored under: the target's identity
    (:func:`kvcheck.targets.target_identity`, what kvcheck keys by) and the spelling itself
    (what an older kvcheck keyed by). A target that cannot be resolved here is only its
    spelling: it is refused later, with the reason, where it is resolved for the run.

    Example:
        >>> _stored_names("kvcheck")
        ('kvcheck',)
    """
    from kvcheck.runner.preflight import resolved_quietly
    from kvcheck.targets import target_identity

    target = resolved_quietly(spelling)
    identity = spelling if target is None else target_identity(target)
    return tuple(dict.fromkeys((identity, spelling)))


def _scan_for_verify(database: Any, *, target: str) -> None:
    """Refuse a verify run whose reuse phase would read a damaged entry."""
    from kvcheck.runner.db import describe_database, scan_database

    scan = scan_database(database).as_one(target, _stored_names(target))
    _refuse_damage(scan, target=target, where=describe_database(database), command="verify")


def _refuse_damage(scan: Any, *, target: str, where: str, command: str) -> None:
    """A :class:`~kvcheck.runner.UsageProblem` when ``target``'s run would read an entry that
    is empty, unreadable or not a serialized example (:meth:`DatabaseScan.damaged`).

    Raised before any test runs: Hypothesis replays an empty entry as a fresh random example
    and drops an undecodable one (kvcheck archives it), so the run would print verdicts
    ("fixed") and examples that no stored failure supports, and would move the user's data.

    Example:
        >>> from kvcheck.runner.db import DatabaseScan
        >>> _refuse_damage(DatabaseScan(legacy=3, legacy_undecodable=3), target="t",
        ...                where="directory /db", command="replay")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kvcheck.runner.preflight.UsageProblem: the example database (directory /db) holds 3 ...
    """
    damaged = scan.damaged(target)
    if not damaged:
        return
    legacy = scan.legacy_undecodable
    whose = f"of target {target!r}" + (
        f" ({legacy} of them stored by an older kvcheck or no longer indexed by target)"
        if legacy
        else ""
    )
    raise UsageProblem(
        f"the example database ({where}) holds {damaged} stored examples {whose} that cannot "
        f"be read or decoded (empty, truncated or corrupted entries); kvcheck {command} "
        "stopped before running any test and changed nothing in the database: restore it "
        "from a copy, or point KVCHECK_DB at another database"
    )


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
