"""``kvcheck campaign``: the command line, and the run from settings to summary.

The settings are checked as ``kvcheck verify`` checks them (target, device, ``KVCHECK_DB``
with a probe, output paths), before anything starts. Then: collect the suite once, start
or join the Ray cluster, run the shards (:mod:`~kvcheck.runner.campaign.driver`), merge
their results (:mod:`~kvcheck.runner.campaign.merge`), write a standalone script per
failure, print the summary ``verify`` prints and write ``results.json`` and ``junit.xml``
to the results directory.

The summary's first line says how much the campaign searched: the planned tests (those not
skipped at collection) that some shard ran to their end, out of all of them, the examples
per searched test, and how long one round of the plan (every planned test its shards)
takes at the examples per second the campaign measured, so a budget can be sized.

Exit status as ``verify``'s, plus one: 0 every planned test searched and all passed;
1 a property failed; 2 usage, target or setup error (Ray missing, the suite not collected,
a shard that could not run its tests or was lost), or a failing example that could not be
saved; 3 incomplete: nothing failed, but the budget (``--minutes`` or ``--examples``) ended
before every planned test had a shard run to its end, so a pass says nothing of the rest
(``unsearched`` in ``results.json`` lists them); 130 interrupted (SIGINT, SIGTERM), after
the summary of what the shards ran. 130 wins over 2, 2 over 1, 1 over 3.

Example:
    >>> import argparse
    >>> commands = argparse.ArgumentParser(prog="kvcheck").add_subparsers()
    >>> parser = add_campaign_parser(commands)
    >>> parser.parse_args(["--minutes", "2", "--workers", "2"]).workers
    2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kvcheck.runner.campaign.plan import DEFAULT_EXAMPLES_PER_TEST
from kvcheck.runner.preflight import (
    UsageProblem,
    check_database,
    check_output_path,
    checked_device,
    checked_target,
    keyword,
    usable_directory,
)
from kvcheck.runner.repro_scripts import write_repro_scripts
from kvcheck.specs import POOL_FAMILIES

__all__ = [
    "DEFAULT_MINUTES",
    "DEFAULT_RESULTS_DIR",
    "EXIT_INCOMPLETE",
    "add_campaign_parser",
    "run_campaign",
]

#: The time budget when neither --minutes nor --examples is given.
DEFAULT_MINUTES = 10.0
DEFAULT_RESULTS_DIR = str(Path(".kvcheck") / "campaign")
#: The budget ended before every planned test had a shard run to its end (nothing failed).
EXIT_INCOMPLETE = 3
_EXIT_STATUS_TEXT = (
    "Exit status: 0 every planned test searched and all passed; 1 a property failed; 2 usage, "
    "target or setup error (Ray missing, a shard that could not run), or a failing example "
    "that could not be saved; 3 incomplete: nothing failed, but the budget ended before "
    "every planned test had a shard run to its end (the summary's first line and "
    "'unsearched' in results.json say which); 130 interrupted (Ctrl-C, SIGTERM), after the "
    "summary of what ran."
)


def add_campaign_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``campaign`` subcommand to ``commands`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "campaign",
        help="search deeper on a Ray cluster (local by default), sharing one example database",
        description="Split the shipped suite into shards (test x seed, ten times a default "
        "run's examples each) and run them as Ray tasks until the budget is spent; every "
        "shard reads and writes the KVCHECK_DB database. Needs pip install "
        "'kvcheck[campaign]'.",
        epilog=_EXIT_STATUS_TEXT,
    )
    budget = parser.add_argument_group("budget (the first one reached ends the campaign)")
    budget.add_argument(
        "--minutes",
        type=float,
        default=None,
        help=f"time budget (default: {DEFAULT_MINUTES:g} when --examples is not given)",
    )
    budget.add_argument(
        "--examples", type=int, default=None, help="examples to hand out, all shards together"
    )
    parser.add_argument(
        "--examples-per-test",
        type=int,
        default=DEFAULT_EXAMPLES_PER_TEST,
        metavar="N",
        help=f"max_examples of each test in a shard (default {DEFAULT_EXAMPLES_PER_TEST}; "
        "a default run has 100)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="shards at a time (default: the cluster's GPUs, else its CPUs; with a local "
        "cluster, also the CPUs it gets)",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="join this Ray cluster (auto, host:port or ray://host:10001; default: start a "
        "local one)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the first shard's --hypothesis-seed; each next shard takes the next one "
        "(default: random, printed, so a campaign can be repeated)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="kvcheck (default), sglang, or module:attr (default: KVCHECK_TARGET, else kvcheck)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="auto, cpu, cuda or cuda:N on every worker (default: KVCHECK_DEVICE, else auto)",
    )
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR", help="pytest -k")
    parser.add_argument(
        "--family",
        dest="families",
        action="append",
        default=None,
        choices=POOL_FAMILIES,
        help="only this pool family's tests (repeatable), as for verify",
    )
    parser.add_argument(
        "--results-dir",
        default=DEFAULT_RESULTS_DIR,
        metavar="DIR",
        help=f"where results.json, junit.xml, shards.jsonl and repros/ go (default "
        f"{DEFAULT_RESULTS_DIR})",
    )
    parser.add_argument(
        "--repro-dir", default=None, metavar="DIR", help="default: repros/ in --results-dir"
    )
    parser.add_argument(
        "--json", dest="json_path", default=None, metavar="FILE", help="also write results here"
    )
    parser.add_argument(
        "--junit-xml", default=None, metavar="FILE", help="also write the JUnit XML here"
    )
    parser.add_argument(
        "--suite", default="kvcheck.suite", help="tests to run: a path or a dotted module"
    )
    output = parser.add_mutually_exclusive_group()
    for flags, verbosity, does in (
        (("-v", "--verbose"), 1, "a row per test in the summary"),
        (("-q", "--quiet"), -1, "no progress line; only events and the summary"),
    ):
        output.add_argument(
            *flags, dest="verbosity", action="store_const", const=verbosity, default=0, help=does
        )
    parser.set_defaults(handler=run_campaign)
    return parser


def run_campaign(options: argparse.Namespace, extra: Sequence[str]) -> int:
    """The ``campaign`` command's handler: run it and return its exit status."""
    from kvcheck.runner.campaign.address import address_problem
    from kvcheck.runner.campaign.collect import CollectionError
    from kvcheck.runner.campaign.ray_executor import RAY_MISSING, ray_available
    from kvcheck.runner.profiles import unknown_env_warnings

    time_budget_s, examples = _budgets(options)
    for warning in unknown_env_warnings():
        print(f"kvcheck: warning: {warning}", file=sys.stderr)
    target, import_root = checked_target(options.target)
    device = checked_device(options.device)
    database = check_database(writable=True)
    for option, value in (("--json", options.json_path), ("--junit-xml", options.junit_xml)):
        if value is not None:
            check_output_path(option, Path(value))
    results_dir = usable_directory("--results-dir", Path(options.results_dir))
    repro_dir = Path(options.repro_dir) if options.repro_dir else results_dir / "repros"
    unreachable = address_problem(options.address)
    if unreachable is not None:
        raise UsageProblem(unreachable)
    if not ray_available():
        raise UsageProblem(RAY_MISSING)
    context = _context(options, target=target, device=device, extra=extra)
    _warn_unshared_database(database, address=options.address)
    seed = options.seed if options.seed is not None else random.randrange(2**31)
    print(f"kvcheck campaign: target {target}; collecting {options.suite}", flush=True)
    try:
        with _terminate_as_interrupt():
            planner, run, workers = _collect_and_drive(
                options,
                context=context,
                seed=seed,
                examples=examples,
                time_budget_s=time_budget_s,
                database=database,
                ray_log=results_dir / RAY_LOG,
            )
    except CollectionError as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the shards ran (the driver counts interrupts itself)
        print("\nkvcheck campaign: interrupted before any shard ran; exit 130", file=sys.stderr)
        return 130
    return _report(
        options,
        planner=planner,
        run=run,
        workers=workers,
        context=context,
        seed=seed,
        results_dir=results_dir,
        repro_dir=repro_dir,
        import_root=import_root,
    )


def _collect_and_drive(
    options: argparse.Namespace,
    *,
    context: Any,
    seed: int,
    examples: int | None,
    time_budget_s: float | None,
    database: Any,
    ray_log: Path,
) -> tuple[Any, Any, int]:
    """Collect the suite while the Ray cluster starts, then run the shards; (the planner,
    the driver's run, the workers)."""
    from kvcheck.runner.campaign.collect import collect_properties
    from kvcheck.runner.campaign.driver import drive
    from kvcheck.runner.campaign.plan import Planner
    from kvcheck.runner.campaign.progress import Progress
    from kvcheck.runner.campaign.ray_executor import RayExecutor
    from kvcheck.runner.db import describe_database

    expression = keyword(options.keyword, options.families)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        collecting = pool.submit(collect_properties, context, keyword=expression)
        try:
            # Ray's own start-up chatter (token authentication, GCS retries) is Ray's,
            # not the campaign's: it goes to a log beside the results.
            with _stderr_to(ray_log):
                executor = RayExecutor(context, address=options.address, workers=options.workers)
        except Exception as exc:  # ray.init: an unreachable address, a broken install
            where = options.address or "a local cluster"
            raise UsageProblem(f"cannot start Ray ({where}): {exc} (Ray's log: {ray_log})") from exc
        with executor:
            properties = collecting.result()
            if not properties:
                raise UsageProblem("no test of the suite is selected (check -k and --family)")
            planner = Planner(
                properties,
                seed=seed,
                examples_per_test=options.examples_per_test,
                max_examples=examples,
            )
            searching = len(planner.searching())
            print(
                f"kvcheck campaign: {searching} tests to search "
                f"({len(properties) - searching} skipped), {planner.examples_per_test} "
                f"examples each per shard, seeds from {seed} (repeat with --seed {seed}); on "
                f"{executor.describe()}; database: {describe_database(database)}",
                flush=True,
            )
            progress = Progress(budget_s=time_budget_s, quiet=options.verbosity < 0)
            run = drive(planner, executor, time_budget_s=time_budget_s, progress=progress)
            return planner, run, executor.capacity


def _report(
    options: argparse.Namespace,
    *,
    planner: Any,
    run: Any,
    workers: int,
    context: Any,
    seed: int,
    results_dir: Path,
    repro_dir: Path,
    import_root: str | None,
) -> int:
    """Merge the shards' results, write the scripts and files, print the summary."""
    from kvcheck.runner.campaign.junit import junit_xml
    from kvcheck.runner.campaign.merge import merge_results
    from kvcheck.runner.launch import shown_path
    from kvcheck.runner.summary import render_verify

    _keep_shard_log(results_dir / "shards.jsonl", run)
    examples = run.examples()
    planned = [p.nodeid for p in planner.properties if p.skip is None]
    searched = run.searched()
    per_second = examples / run.duration_s if run.duration_s else 0.0
    results = merge_results(
        run.outcomes,
        properties=planner.properties,
        duration_s=run.duration_s,
        campaign={
            "seed": seed,
            "workers": workers,
            "shards": len(run.outcomes),
            "shards_lost": [
                {"shard": shard.number, "seed": shard.seed, "why": why} for shard, why in run.lost
            ],
            "shard_errors": _shard_errors(run.outcomes),
            "examples": examples,
            "examples_per_second": round(per_second, 2),
            "examples_per_test": planner.examples_per_test,
            "out_of_time": run.out_of_time,
            "interrupted": run.interrupted,
            "planned": len(planned),
            "searched": len([nodeid for nodeid in planned if nodeid in searched]),
            "unsearched": [nodeid for nodeid in planned if nodeid not in searched],
            "round_examples": planner.round_examples(),
            "round_s": round(planner.round_examples() / per_second, 1) if per_second else None,
        },
    )
    exit_code = _exit_code(results, interrupted=run.interrupted)
    results["exit_status"] = exit_code
    scripts_note = write_repro_scripts(
        results, repro_dir=repro_dir, target=context.target, import_root=import_root
    )
    results_path = results_dir / "results.json"
    junit_path = results_dir / "junit.xml"
    results_path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    junit_path.write_text(junit_xml(results), encoding="utf-8")
    locations = {
        "results": shown_path(results_path),
        "junit": shown_path(junit_path),
        "reproduction scripts": shown_path(repro_dir) if scripts_note is None else scripts_note,
    }
    text = render_verify(
        results,
        exit_code=exit_code,
        verbosity=options.verbosity,
        locations=locations,
        interrupted=run.interrupted,
        command="kvcheck campaign",
    )
    print("\n" + _campaign_lines(results, target=context.target) + text, flush=True)
    return _write_extra_outputs(options, results, exit_code=exit_code)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that a local Ray cluster is shut
    down on the way out (the driver's loop counts both itself while shards run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _budgets(options: argparse.Namespace) -> tuple[float | None, int | None]:
    """(seconds, examples); a usage error names the bad one."""
    from kvcheck.runner.preflight import UsageProblem

    if options.minutes is not None and not options.minutes > 0:
        raise UsageProblem(f"--minutes={options.minutes} must be positive")
    if options.examples is not None and options.examples < 1:
        raise UsageProblem(f"--examples={options.examples} must be at least 1")
    if options.examples_per_test < 1:
        raise UsageProblem(f"--examples-per-test={options.examples_per_test} must be at least 1")
    if options.workers is not None and options.workers < 1:
        raise UsageProblem(f"--workers={options.workers} must be at least 1")
    if options.seed is not None and options.seed < 0:
        raise UsageProblem(f"--seed={options.seed} must be at least 0")
    minutes = options.minutes
    if minutes is None and options.examples is None:
        minutes = DEFAULT_MINUTES
    return (None if minutes is None else minutes * 60.0), options.examples


def _context(
    options: argparse.Namespace, *, target: str, device: str | None, extra: Sequence[str]
) -> Any:
    """What every shard shares; the variables a worker needs from this environment."""
    from kvcheck.runner.campaign.shard import ShardContext

    env = {
        name: value
        for name, value in os.environ.items()
        if name.startswith("KVCHECK_") or name in ("PYTHONPATH", "CI")
    }
    if "KVCHECK_DB" not in env:
        # The default database is relative to this directory: name it for the workers.
        from kvcheck.runner.db import DEFAULT_DATABASE_DIR

        env["KVCHECK_DB"] = str(Path.cwd() / DEFAULT_DATABASE_DIR)
    return ShardContext(
        suite=options.suite,
        target=target,
        device=device,
        cwd=os.getcwd(),
        env=env,
        pytest_args=tuple(extra),
    )


#: Where Ray's own start-up messages go, in the results directory.
RAY_LOG = "ray.log"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 appends to ``path`` inside the block: Ray's C++ core writes there
    directly, past Python's ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _warn_unshared_database(database: Any, *, address: str | None) -> None:
    """On a cluster, a directory database is shared only through a shared file system."""
    from kvcheck.runner.db import describe_database

    if address is not None and "redis" not in describe_database(database):
        print(
            f"kvcheck: warning: the example database is {describe_database(database)}: on a "
            "cluster of several machines each shard writes to its own machine's copy, unless "
            "the directory is on a shared file system; set KVCHECK_DB=redis://host:6379/0",
            file=sys.stderr,
        )


def _exit_code(results: dict[str, Any], *, interrupted: bool) -> int:
    """verify's rules: 130 interrupted; 2 a lost save, a shard that could not run, a
    collection error; 1 a failing test; then 3 a planned test no shard ran to its end;
    else 0."""
    from kvcheck.runner.summary import EXIT_FAILED, EXIT_OK, EXIT_USAGE, FAILING_OUTCOMES

    if interrupted:
        return 130
    tests = results.get("tests", ())
    campaign = results.get("campaign") or {}
    if (
        any(test.get("save_errors") for test in tests)
        or campaign.get("shard_errors")
        or campaign.get("shards_lost")
        or results.get("collection_errors")
    ):
        return EXIT_USAGE
    if any(test.get("outcome") in FAILING_OUTCOMES for test in tests):
        return EXIT_FAILED
    if campaign.get("unsearched"):
        return EXIT_INCOMPLETE
    return EXIT_OK


def _shard_errors(outcomes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shards whose pytest could not run their tests (not stopped by the campaign)."""
    return [
        {
            "shard": outcome.get("shard"),
            "seed": outcome.get("seed"),
            "host": outcome.get("host"),
            "exit_status": outcome.get("exit_status"),
            "log_tail": outcome.get("log_tail"),
        }
        for outcome in outcomes
        if outcome.get("exit_status") not in (0, 1) and not outcome.get("stopped")
    ]


def _campaign_lines(results: dict[str, Any], *, target: str) -> str:
    """What the campaign adds above verify's summary: its size, speed, errors and how to
    replay what it found."""
    campaign = results["campaign"]
    lines = [
        _searched_line(results),
        f"kvcheck campaign: {campaign['shards']} shards on {campaign['workers']} workers, "
        f"{campaign['examples']:,} examples in {results['duration_s']:.0f}s "
        f"({campaign['examples_per_second']}/s), seeds from {campaign['seed']}"
        + ("; stopped at the time budget" if campaign["out_of_time"] else ""),
    ]
    for error in campaign["shard_errors"]:
        lines.append(
            f"SHARD ERROR: shard {error['shard']} (seed {error['seed']}) on {error['host']}: "
            f"pytest exit {error['exit_status']}; its output ends:"
        )
        lines += [f"    {line}" for line in str(error.get("log_tail") or "").splitlines()]
    for lost in campaign["shards_lost"]:
        lines.append(f"SHARD LOST: shard {lost['shard']} (seed {lost['seed']}): {lost['why']}")
    if any(test.get("failing_seeds") for test in results["tests"]):
        lines.append(
            "replay from any machine with the same KVCHECK_DB: "
            f"kvcheck replay --target {shlex.quote(target)}"
        )
    return "\n".join(lines) + "\n\n"


def _searched_line(results: dict[str, Any]) -> str:
    """The summary's first line: how much of the plan was searched, how deep, and how long
    one round of the plan takes at the measured rate.

    Example:
        >>> campaign = {"planned": 174, "searched": 3, "unsearched": ["t"] * 171,
        ...             "examples_per_test": 1000, "examples_per_second": 26.04,
        ...             "round_examples": 177000, "round_s": 6797.2}
        >>> tests = [{"nodeid": n, "outcome": "passed", "statistics": {"examples": 1000}}
        ...          for n in "abc"]
        >>> head, pace = _searched_line({"campaign": campaign, "tests": tests}).split("; ")
        >>> head.partition(" (")[0]
        'kvcheck campaign: INCOMPLETE: searched 3 of 174 planned tests'
        >>> head.rpartition("), ")[2]
        '1,000 examples per searched test (up to 1,000 per shard)'
        >>> pace.partition("would take about ")[2]
        '1h 53m at the measured 26.04 examples/s'
    """
    campaign = results["campaign"]
    planned, searched = int(campaign["planned"]), int(campaign["searched"])
    examples = sum(
        int((test.get("statistics") or {}).get("examples") or 0)
        for test in results.get("tests") or ()
        if test.get("outcome") not in ("interrupted", "skipped")
    )
    depth = (
        f"{examples // searched:,} examples per searched test" if searched else "no examples"
    ) + f" (up to {campaign['examples_per_test']:,} per shard)"
    if campaign.get("round_s") is None:
        pace = "no example ran, so the time one round of the plan takes is not known"
    else:
        pace = (
            f"one round of the plan ({campaign['round_examples']:,} examples) "
            f"{'would take' if campaign['unsearched'] else 'takes'} about "
            f"{_duration(float(campaign['round_s']))} at the measured "
            f"{campaign['examples_per_second']} examples/s"
        )
    if campaign["unsearched"]:
        head = (
            f"INCOMPLETE: searched {searched} of {planned} planned tests "
            f"({len(campaign['unsearched'])} never ran to the end of a shard: 'unsearched' "
            "in results.json)"
        )
    else:
        head = f"searched all {planned} planned tests"
    return f"kvcheck campaign: {head}, {depth}; {pace}"


def _duration(seconds: float) -> str:
    """``45s``, ``12m``, ``1h 53m``.

    Example:
        >>> _duration(44.6), _duration(720), _duration(6797.2)
        ('45s', '12m', '1h 53m')
    """
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes = round(seconds / 60)
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def _keep_shard_log(path: Path, run: Any) -> None:
    """One JSON line per finished shard, for a person who wants to see how it went."""
    from kvcheck.runner.campaign.shard import results_json

    with path.open("w", encoding="utf-8") as log:
        for outcome in run.outcomes:
            log.write(results_json(outcome) + "\n")


def _write_extra_outputs(
    options: argparse.Namespace, results: dict[str, Any], *, exit_code: int
) -> int:
    from kvcheck.runner.campaign.junit import junit_xml

    try:
        if options.json_path:
            payload = {**results, "command": "campaign", "exit_code": exit_code}
            Path(options.json_path).write_text(
                json.dumps(payload, indent=2, default=str), encoding="utf-8"
            )
        if options.junit_xml:
            Path(options.junit_xml).write_text(junit_xml(results), encoding="utf-8")
    except OSError as exc:
        print(f"kvcheck: error: cannot write an output file: {exc}", file=sys.stderr)
        return 2
    return exit_code
