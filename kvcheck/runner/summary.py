"""What ``kvcheck verify`` and ``kvcheck replay`` print once the suite has run.

Both read the results file the pytest plugin wrote (:mod:`kvcheck.runner.results`). By default the
verify summary is short: one failure in full (the property, its error with the first
differing byte, its example, the ``@reproduce_failure`` line and the standalone script) and
every other failure in one line (property, error headline, size of its example, where its
full report is), then passes collapsed into one line and skips grouped by reason. The one in
full is the smallest failure that carries a standalone script, so that a script command is
printed wherever any failure has one; without scripts, the smallest failure. An example is
headed "Minimal example:" only when Hypothesis shrank it in the run, "Example (not
shrunk):" otherwise (:func:`kvcheck.runner.results.failures_from_exception`).
``verbosity=1`` adds a row per test and prints every failure in full; ``verbosity=-1``
leaves only the counts and the names of the failures. A failure the kvcheck command already
printed in full while the run went on (:func:`render_failure_now`) is one line in the
summary, which says when it was printed.

A replay verdict comes from evidence only (:func:`replay_verdicts`): "fixed" needs every
stored example of the test decoded, replayed and passing.

Example:
    >>> results = {"target": {"name": "kvcheck", "version": "0.1.0"}, "tests": [
    ...     {"nodeid": "suite/test_a.py::test_x", "outcome": "passed", "duration_s": 0.5,
    ...      "statistics": {"examples": 100}}]}
    >>> print(render_verify(results, exit_code=0).splitlines()[-1])
    1 passed in 0.5s; exit 0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from kvcheck.runner.results import FAILING_OUTCOMES, capped_lines

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "FAILING_OUTCOMES",
    "exit_code_for",
    "render_failure_now",
    "render_replay",
    "render_verify",
    "replay_verdicts",
    "short_name",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: Skip reasons listed one by one before the rest are counted.
_MAX_SKIP_GROUPS = 8
#: Lines of one failure's error message shown by default (the first difference is early).
_MAX_ERROR_LINES = 25
_OUTCOME_LABEL = {"failed": "FAILED", "error": "ERROR", "xpassed": "XPASS(strict)"}
#: Characters of an error's first line in a one-line failure.
_MAX_HEADLINE = 120
#: The size of a failure without a minimal example: larger than any example.
_NO_EXAMPLE = 1 << 30


def exit_code_for(pytest_status: int) -> int:
    """kvcheck's exit status for a pytest exit status.

    0 all passed; 1 a property failed (pytest's "tests failed"); 2 anything that means the
    suite did not run as asked: interrupted or broken collection (2), internal error (3),
    usage error (4), nothing selected (5).

    Example:
        >>> [exit_code_for(status) for status in range(6)]
        [0, 1, 2, 2, 2, 2]
    """
    if pytest_status == 0:
        return EXIT_OK
    if pytest_status == 1:
        return EXIT_FAILED
    return EXIT_USAGE


def short_name(nodeid: str) -> str:
    """A node id without its directories: ``test_file.py::test_name[params]``.

    Example:
        >>> short_name("../site-packages/kvcheck/suite/test_pools.py::test_move[mha]")
        'test_pools.py::test_move[mha]'
    """
    path, sep, rest = nodeid.partition("::")
    return f"{PurePosixPath(path.replace(chr(92), '/')).name}{sep}{rest}"


def render_verify(
    results: Mapping[str, Any],
    *,
    exit_code: int,
    verbosity: int = 0,
    locations: Mapping[str, str] | None = None,
    interrupted: bool = False,
    wall_s: float | None = None,
    command: str = "kvcheck verify",
    printed: Mapping[str, float] | None = None,
) -> str:
    """The verify summary: one failure in full (:func:`_failure_blocks` says which), the
    others in a line each, passes collapsed, skips grouped by reason.

    ``verbosity`` 1 adds a row per test (result, examples, time) and prints every failure
    in full; -1 keeps only the counts and the failures' names. ``locations`` (label ->
    path) are listed at the end. The time shown is ``wall_s`` (the kvcheck command's wall
    time) when given, else pytest's own session time from ``results``. ``command`` heads it
    (``kvcheck campaign`` prints the same summary). ``printed`` (node id -> seconds) names
    the failures already printed in full during the run: each is one line here.
    """
    tests = list(results.get("tests", ()))
    lines = [_heading(command, results), ""]
    lines += _collection_errors(results)
    if tests and verbosity > 0:
        lines += [*_table(tests), ""]
    failing = [test for test in tests if test["outcome"] in FAILING_OUTCOMES]
    printed = printed or {}
    if failing and verbosity >= 0:
        if verbosity == 0 and len(failing) > 1:  # the one in full: see _in_full
            first = _in_full(failing)["nodeid"]
            shown = f" (printed above at {printed[first]:.0f} s)" if first in printed else ""
            script = " with a script" if any(map(_has_script, failing)) else ""
            heading = (
                f"Failures ({len(failing)}): the smallest{script} in full{shown}, the other "
                f"{len(failing) - 1} in a line each (--verbose prints every one in full)"
            )
        else:
            above = any(test["nodeid"] in printed for test in failing)
            heading = f"Failures ({len(failing)}), each with its reproduction" + (
                " (a line for each printed above)" if above else ""
            )
        lines += [
            heading,
            "",
            *_failure_blocks(failing, verbosity=verbosity, locations=locations, printed=printed),
        ]
    elif failing:
        lines += [f"{_OUTCOME_LABEL[t['outcome']]} {short_name(t['nodeid'])}" for t in failing]
        lines.append("")
    lines += _lost_saves(tests)
    if interrupted:
        lines.append("INTERRUPTED (Ctrl-C or SIGTERM): only the tests that finished are counted")
    lines += _collapsed(tests)
    lines += _locations(locations, failing)
    seconds = results.get("duration_s", _total(tests)) if wall_s is None else wall_s
    lines.append(f"{_counts(tests)} in {_seconds(seconds)}; exit {exit_code}")
    return "\n".join(lines)


def replay_verdicts(tests: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(verdict, test)`` for every test that replayed stored examples or failed.

    Verdicts: ``still failing`` (stored examples, test fails), ``fixed`` (the test passes
    and every stored example it fetched was decoded, replayed and passed), ``unconfirmed``
    (the test passes, but some stored example was damaged, rejected as invalid or not run,
    so the pass is no evidence of a fix), ``failed`` (fails without stored examples),
    ``skipped``. The count replayed is the Hypothesis statistics of the reuse phase; the
    count fetched and damaged is :class:`kvcheck.runner.db.RecordingDatabase`'s.

    Example:
        >>> reuse = {"phases": {"reuse": {"valid": 2, "failing": 0, "invalid": 0}}}
        >>> replay_verdicts([{"outcome": "passed", "stored_examples": 2, "statistics": reuse},
        ...                  {"outcome": "passed", "stored_examples": 3, "statistics": reuse}])
        ... # doctest: +ELLIPSIS
        [('fixed', ...), ('unconfirmed', ...)]
    """
    return [(verdict, test) for test in tests if (verdict := _verdict(test)) is not None]


def render_replay(
    results: Mapping[str, Any],
    *,
    exit_code: int,
    verbosity: int = 0,
    scan: Any = None,
    target: str | None = None,
    locations: Mapping[str, str] | None = None,
) -> str:
    """The replay summary: per test with stored examples, still failing or fixed.

    ``scan`` (a :class:`kvcheck.runner.db.DatabaseScan`) adds what the database held before the
    run, for ``target`` (the name it was run as) and in all, and how many of its examples
    could not be decoded.
    """
    tests = list(results.get("tests", ()))
    verdicts = replay_verdicts(tests)
    lines = [_heading("kvcheck replay", results), ""]
    if scan is not None:
        lines += [_held(scan, target), ""]
    lines += _collection_errors(results)
    if verdicts:
        lines.append(f"{'VERDICT':<14} {'REPLAYED':>8}  PROPERTY")
        lines += [f"{v:<14} {_replayed(t):>8}  {short_name(t['nodeid'])}" for v, t in verdicts]
        lines += [
            f"  unconfirmed {short_name(t['nodeid'])}: {_unreplayed(t)}"
            for v, t in verdicts
            if v == "unconfirmed"
        ]
    else:
        lines.append(f"nothing to replay: no stored examples in {results.get('database', '?')}")
    if not any(test.get("stored_examples") for test in tests):
        lines.append(
            "nothing was replayed: no selected test had stored examples (another suite, "
            "target or -k selection saved them?)"
        )
    failing = [test for verdict, test in verdicts if verdict in ("still failing", "failed")]
    if failing and verbosity >= 0:
        lines += ["", "Still failing, with their reproductions", "-" * 39]
        lines += _failure_blocks(failing, verbosity=verbosity, locations=locations)[:-1]
    lines += ["", *_lost_saves(tests)]
    lines += _locations(locations, failing)
    counts = Counter(verdict for verdict, _ in verdicts)
    without = sum(1 for test in tests if not test.get("stored_examples"))
    parts = [
        f"{counts[name]} {name}"
        for name in ("still failing", "unconfirmed", "fixed", "failed", "skipped")
        if counts[name]
    ]
    parts.append(f"{_plural(without, 'test')} without stored examples")
    lines += [f"{', '.join(parts)}; exit {exit_code}"]
    return "\n".join(lines)


# --- pieces -----------------------------------------------------------------------------------


def _held(scan: Any, target: str | None) -> str:
    """What the database held before a replay: this target's, an older kvcheck's, in all.

    Example:
        >>> from kvcheck.runner.db import DatabaseScan, TargetHoldings
        >>> scan = DatabaseScan(entries=5, targets=(TargetHoldings("a", 3),), legacy=2)
        >>> _held(scan, "a")
        "the database held 3 stored examples of target 'a' and 2 stored by an older ...; 5 in all"
    """
    parts = []
    if target is not None:
        held = scan.holdings(target)
        parts.append(f"{_plural(held.entries, 'stored example')} of target {target!r}")
        if held.archived:
            parts[-1] += f" ({held.archived} more archived: fixed or undecodable)"
    if scan.legacy:
        parts.append(
            f"{scan.legacy} stored by an older kvcheck without a target (replayed by every "
            "target, never archived, no evidence of a fix)"
        )
    text = "the database held " + (" and ".join(parts) or "no stored examples of this target")
    if scan.scanned:
        text += f"; {scan.entries} in all"
        if scan.undecodable:
            text += f"; {scan.undecodable} stored examples could not be decoded"
    return text


def _heading(command: str, results: Mapping[str, Any]) -> str:
    target = results.get("target") or {}
    device = results.get("device") or {}
    devices = sorted({t["device"] for t in results.get("tests", ()) if t.get("device")})
    device_text = ", ".join(devices) or device.get("resolved") or device.get("requested", "?")
    surface = f"\nsurface: {target['surface']}" if target.get("surface") else ""
    surface += f"\nclasses: {target['classes']}" if target.get("classes") else ""
    note = f", {target['note']}" if target.get("note") else ""
    return (
        f"{command}: target {target.get('name', '?')} {target.get('version', '')}".rstrip()
        + note
        + f"; device {device_text}; profile {results.get('profile', '?')}"
        + surface
        + f"\ndatabase: {results.get('database', '?')}"
    )


def _collection_errors(results: Mapping[str, Any]) -> list[str]:
    errors = results.get("collection_errors") or []
    if not errors:
        return []
    lines = ["Collection errors (the suite could not be loaded):"]
    for error in errors:
        lines.append(f"  {error.get('nodeid') or '<session>'}")
        lines += [f"    {line}" for line in str(error.get("message", "")).splitlines()]
    return [*lines, ""]


def _table(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"{'RESULT':<13} {'EXAMPLES':>8} {'TIME':>7}  PROPERTY"]
    for test in tests:
        lines.append(
            f"{_OUTCOME_LABEL.get(test['outcome'], test['outcome']):<13} "
            f"{_examples(test):>8} {_seconds(test.get('duration_s')):>7}  "
            f"{short_name(test['nodeid'])}"
        )
        if test.get("skip_reason") and test["outcome"] in ("skipped", "xfailed"):
            lines.append(f"{'':<31}{test['skip_reason']}")
    return lines


def render_failure_now(
    test: Mapping[str, Any], *, seconds: float, in_full: bool, where: str, command: str
) -> str:
    """What the kvcheck command prints the moment test ``test`` (a record of
    :mod:`kvcheck.runner.results`) has failed, ``seconds`` into the run: its whole failure
    block under a line saying the run goes on, or, for a later failure, one line naming
    ``where`` its full report will be.

    Example:
        >>> test = {"nodeid": "suite/test_a.py::test_x", "outcome": "failed",
        ...         "failures": [{"error": "AssertionError: 1 != 2", "reproduction": "t(x=1)"}]}
        >>> print(render_failure_now(test, seconds=31.2, in_full=True, where="",
        ...                          command="kvcheck verify"))  # doctest: +NORMALIZE_WHITESPACE
        kvcheck verify: at 31 s, a property failed; the run goes on (Ctrl-C stops it and
        keeps the results)
        FAILED test_a.py::test_x
            AssertionError: 1 != 2
            t(x=1)
        >>> print(render_failure_now(test, seconds=40, in_full=False, where="results.json",
        ...                          command="kvcheck verify"))  # doctest: +ELLIPSIS
        kvcheck verify: at 40 s, FAILED test_a.py::test_x: AssertionError: 1 != 2 (example: ...)
    """
    if not in_full:
        return f"{command}: at {seconds:.0f} s, {_failure_line(test, where=where)}"
    heading = (
        f"{command}: at {seconds:.0f} s, a property failed; the run goes on (Ctrl-C stops it "
        "and keeps the results)"
    )
    return "\n".join([heading, *_failure_block(test)])


def _in_full(failing: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The failure a condensed summary prints in full: the smallest (:func:`_example_size`)
    among those that carry a standalone script, or the smallest of all when none does: the
    one-line failures print no script command, so the full block must carry one wherever a
    script was written (the smallest failure may be an input check, which has no script)."""
    ordered = sorted(failing, key=_example_size)
    return next((test for test in ordered if _has_script(test)), ordered[0])


def _failure_blocks(
    failing: Sequence[Mapping[str, Any]],
    *,
    verbosity: int,
    locations: Mapping[str, str] | None,
    printed: Mapping[str, float] | None = None,
) -> list[str]:
    """One failure in full (:func:`_in_full`) and, unless ``verbosity`` is 1, every other in
    one line; each block ends with a blank line. A failure in ``printed`` (node id ->
    seconds) was printed in full during the run: it is one line, which says when."""
    printed = printed or {}
    where = ", ".join(
        path for label, path in (locations or {}).items() if label in ("results", "pytest log")
    )
    where = where or "results.json"

    def block(test: Mapping[str, Any], full: bool) -> list[str]:
        if test["nodeid"] in printed:
            return [_failure_line(test, where=f"printed above at {printed[test['nodeid']]:.0f} s")]
        return [*_failure_block(test), ""] if full else [_failure_line(test, where=where)]

    if verbosity > 0 or len(failing) == 1:
        lines = [line for test in failing for line in block(test, True)]
        return lines if lines[-1:] == [""] else [*lines, ""]
    first = _in_full(failing)
    ordered = [first, *(test for test in sorted(failing, key=_example_size) if test is not first)]
    lines = [line for test in ordered for line in block(test, test is first)]
    return lines if lines[-1:] == [""] else [*lines, ""]


def _failure_line(test: Mapping[str, Any], *, where: str) -> str:
    """``FAILED name: error headline (example: size; full report: where)``."""
    failures: Sequence[Mapping[str, Any]] = test.get("failures") or []
    error = str(failures[0].get("error") if failures else test.get("message") or "")
    headline = (error.strip().splitlines() or ["(no message)"])[0]
    if len(headline) > _MAX_HEADLINE:
        headline = headline[: _MAX_HEADLINE - 3] + "..."
    lines, _ = _example_size(test)
    size = "no example" if lines == _NO_EXAMPLE else _plural(lines, "line")
    if len(failures) > 1:
        size += f", {len(failures)} distinct failures"
    label = _OUTCOME_LABEL.get(test["outcome"], test["outcome"])
    name = short_name(test["nodeid"])
    return f"{label} {name}: {headline} (example: {size}; full report: {where})"


def _has_script(test: Mapping[str, Any]) -> bool:
    return any(failure.get("script") for failure in test.get("failures") or ())


def _example_size(test: Mapping[str, Any]) -> tuple[int, int]:
    """(lines, characters) of the test's smallest example; a test without one sorts after
    every test with one."""
    sizes = [
        (len(text.splitlines()), len(text))
        for failure in test.get("failures") or ()
        if (text := str(failure.get("reproduction") or "").strip())
    ]
    return min(sizes, default=(_NO_EXAMPLE, 0))


def _failure_block(test: Mapping[str, Any]) -> list[str]:
    title = f"{_OUTCOME_LABEL.get(test['outcome'], test['outcome'])} {short_name(test['nodeid'])}"
    statistics = test.get("statistics") or {}
    if statistics:
        title += (
            f" (found after {_plural(statistics.get('examples', 0), 'example')}, "
            f"{_plural(statistics.get('shrinks', 0), 'shrink step')})"
        )
    lines = [title]
    failures: Sequence[Mapping[str, Any]] = test.get("failures") or []
    if not failures:
        lines += _capped(str(test.get("message") or ""))
        return lines
    for index, failure in enumerate(failures, start=1):
        if len(failures) > 1:
            lines.append(f"  distinct failure {index} of {len(failures)}:")
        lines += _capped(str(failure.get("error")))
        lines += [f"    {line}" for line in str(failure.get("reproduction") or "").splitlines()]
        if failure.get("blob"):
            lines.append(f"    reproduce with: {failure['blob']}")
        if failure.get("script"):
            command = failure.get("script_command") or f"python {failure['script']}"
            lines.append(f"    standalone script: {command}")
        elif why := failure.get("script_error") or failure.get("reproduction_error"):
            lines.append(f"    no standalone script: {why}")
    return lines


def _capped(text: str) -> list[str]:
    """``text`` indented under its failure, cut to its first lines."""
    lines = capped_lines(text, _MAX_ERROR_LINES, where=" in results.json")
    return [f"    {line}" for line in lines]


def _lost_saves(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    lost = [test for test in tests if test.get("save_errors")]
    if not lost:
        return []
    lines = [
        f"DATABASE ERROR: the failing examples of {_plural(len(lost), 'test')} could not be "
        "saved; kvcheck replay will not find them:"
    ]
    for test in lost:
        for reason, times in Counter(test["save_errors"]).items():
            again = f" ({times} times)" if times > 1 else ""
            lines.append(f"    {short_name(test['nodeid'])}: {reason}{again}")
    return [*lines, ""]


def _collapsed(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    """Passes in one line, expected failures in one, skips grouped by reason."""
    counts = Counter(test["outcome"] for test in tests)
    lines: list[str] = []
    if number := counts["passed"]:
        lines.append(f"{number} propert{'y' if number == 1 else 'ies'} passed")
    if counts["xfailed"]:
        lines.append(
            f"{counts['xfailed']} expected failures (declared by the target) failed as expected"
        )
    skips = Counter(
        str(test.get("skip_reason") or "no reason given")
        for test in tests
        if test["outcome"] == "skipped"
    )
    if skips:
        lines.append(f"{counts['skipped']} skipped:")
        for reason, number in skips.most_common(_MAX_SKIP_GROUPS):
            lines.append(f"    {number} x {reason}")
        if rest := skips.most_common()[_MAX_SKIP_GROUPS:]:
            lines.append(
                f"    {sum(n for _, n in rest)} more, for {len(rest)} other reasons "
                "(--verbose lists every test)"
            )
    return lines


def _locations(locations: Mapping[str, str] | None, failing: Sequence[Any]) -> list[str]:
    return [
        f"{label}: {path}"
        for label, path in (locations or {}).items()
        if failing or label != "reproduction scripts"
    ]


def _verdict(test: Mapping[str, Any]) -> str | None:
    failed = test.get("outcome") in FAILING_OUTCOMES
    if not int(test.get("stored_examples") or 0):
        return "failed" if failed else None
    if failed:
        return "still failing"
    if test.get("outcome") != "passed":
        return "skipped"
    return "unconfirmed" if _unreplayed(test) else "fixed"


def _unreplayed(test: Mapping[str, Any]) -> str | None:
    """Why a passing test's stored examples are no evidence of a fix; None when every one
    was decoded, replayed and passed.

    Example:
        >>> _unreplayed({"stored_examples": 3, "stored_damaged": 1, "statistics": {
        ...     "phases": {"reuse": {"valid": 2, "failing": 0, "invalid": 0}}}})
        '2 of 3 stored examples replayed and passed; 1 empty or undecodable'
    """
    stored = int(test.get("stored_examples") or 0)
    damaged = int(test.get("stored_damaged") or 0)
    reuse = ((test.get("statistics") or {}).get("phases") or {}).get("reuse") or {}
    # The reuse phase also replays examples stored without a target (not the test's own):
    # every one of both kinds must have run and passed.
    unattributed = int(test.get("unattributed") or 0)
    passed = int(reuse.get("valid", 0)) - unattributed
    invalid = int(reuse.get("invalid", 0))
    if not damaged and not invalid and passed == stored:
        return None
    reasons = [f"{damaged} empty or undecodable"] if damaged else []
    if invalid:
        reasons.append(f"{invalid} rejected as invalid (assume, filter or overrun)")
    if not reuse:
        reasons.append("no replay statistics were recorded")
    return f"{passed} of {stored} stored examples replayed and passed; " + ", ".join(
        reasons or ["the others did not run"]
    )


def _replayed(test: Mapping[str, Any]) -> str:
    """Stored examples the reuse phase ran (the database may hold more than it needed)."""
    reuse = ((test.get("statistics") or {}).get("phases") or {}).get("reuse")
    if reuse:
        return str(int(reuse.get("valid", 0) + reuse.get("failing", 0)))
    return str(int(test.get("stored_examples") or 0) or "-")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _examples(test: Mapping[str, Any]) -> str:
    statistics = test.get("statistics")
    return "-" if not statistics else str(statistics.get("examples", 0))


def _seconds(value: Any) -> str:
    return f"{float(value or 0.0):.1f}s"


def _total(tests: Sequence[Mapping[str, Any]]) -> float:
    return sum(float(test.get("duration_s") or 0.0) for test in tests)


def _counts(tests: Sequence[Mapping[str, Any]]) -> str:
    counts = Counter(test["outcome"] for test in tests)
    order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "interrupted")
    parts = [f"{counts[outcome]} {outcome}" for outcome in order if counts[outcome]]
    return ", ".join(parts) or "no tests ran"
