"""Per-test results of a pytest run, gathered for ``kvcheck verify`` and ``kvcheck replay``.

Workers (or the single pytest process) attach what only they can see to each report as
``user_properties``, which pytest-xdist carries to the controller and junit XML keeps:

- ``kvcheck_statistics``: the Hypothesis run statistics of the test (examples per phase),
- ``kvcheck_failures``: per distinct failure, the error, Hypothesis's falsifying example
  and its ``@reproduce_failure`` blob,
- ``kvcheck_stored_examples``: stored examples the test fetched from the database,
- ``kvcheck_stored_damaged``: of those, the ones that were empty or could not be decoded,
- ``kvcheck_unattributed_examples``: stored examples the test replayed that its target
  cannot claim (stored without a target): never archived, never evidence of a fix,
- ``kvcheck_device``: the device the worker ran on,
- ``kvcheck_save_errors``: why saving a failing example to the database failed, if it did;
- ``kvcheck_pins``: the id of the target's declared finding the test pins, if it pins one.

On the controller, :class:`ResultsCollector` folds the setup/call/teardown reports into one
:class:`RecordedTest` per test, writes them as JSON (``--kvcheck-results FILE``), streams
the kvcheck command's progress (a failing test's whole record as soon as it has finished,
so that the command reports it while the run goes on) and warns of every failing example
that was not saved.
It also heads each example by what the run did to it: :data:`EXAMPLE_HEADING` ("Minimal
example:") only when Hypothesis shrank in this run, :data:`UNSHRUNK_HEADING` otherwise (a
stored example replayed by ``kvcheck replay``, whose profile does not shrink, or one that
Hypothesis replayed exactly from the database and did not shrink again).

Example:
    >>> summarize_statistics([{"generate-phase": {"test-cases": [{"status": "valid"}] * 3,
    ...                                           "duration-seconds": 0.5}}])["examples"]
    3
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvcheck.failures import leaf_exceptions, reproduction_to_json
from kvcheck.runner.db import (
    save_errors,
    stored_examples_damaged,
    stored_examples_fetched,
    unattributed_examples_fetched,
)
from kvcheck.targets.findings import STEERED_EVENT
from kvcheck.tier_calls import CALLS_HEADING, TierReproduction, tier_reproduction_to_json

__all__ = [
    "DEVICE_PROPERTY",
    "EXAMPLE_HEADING",
    "FAILING_OUTCOMES",
    "FAILURES_PROPERTY",
    "PINS_PROPERTY",
    "RESULTS_FORMAT",
    "SAVE_ERRORS_PROPERTY",
    "STATISTICS_PROPERTY",
    "STORED_DAMAGED_PROPERTY",
    "STORED_PROPERTY",
    "UNSHRUNK_HEADING",
    "RecordedTest",
    "ResultsCollector",
    "call_properties",
    "capped_lines",
    "failures_from_exception",
    "load_results",
    "summarize_statistics",
]

RESULTS_FORMAT = 1
STATISTICS_PROPERTY = "kvcheck_statistics"
FAILURES_PROPERTY = "kvcheck_failures"
STORED_PROPERTY = "kvcheck_stored_examples"
STORED_DAMAGED_PROPERTY = "kvcheck_stored_damaged"
UNATTRIBUTED_PROPERTY = "kvcheck_unattributed_examples"
DEVICE_PROPERTY = "kvcheck_device"
SAVE_ERRORS_PROPERTY = "kvcheck_save_errors"
PINS_PROPERTY = "kvcheck_pins"
#: The outcomes that fail a run.
FAILING_OUTCOMES = ("failed", "error", "xpassed")

#: Phases whose test cases are examples of the property (shrinking only re-runs failures).
_EXAMPLE_PHASES = ("explicit", "reuse", "generate", "target")
_BLOB = re.compile(r"@reproduce_failure\([^)]*\)")
#: A note that starts with a heading ("Falsifying example:", "Failing test case:" ...)
#: followed by a call or, for state machines, by steps on the next lines; older Hypothesis
#: releases (6.139) give a state machine's heading as a note of its own, its steps in the
#: notes after it.
_EXAMPLE_NOTE = re.compile(r"\A[A-Z][A-Za-z ]*:(?:[ \n]|\Z)")
_DRAW = re.compile(r"\ADraw \d+")
#: A step of a state machine as Hypothesis lists it (``state.step(data=data(...))``).
_STATE_STEP = re.compile(r"\Astate(\.| = )")
#: kvcheck's heading for the minimal example, whatever Hypothesis calls it: only for an
#: example Hypothesis shrank in the run that reported it.
EXAMPLE_HEADING = "Minimal example:"
#: The heading of an example no shrinking ran on in its run: it may be far from minimal.
UNSHRUNK_HEADING = "Example (not shrunk):"
#: Keep a plain (non-Hypothesis) failure readable in a summary.
_MAX_MESSAGE_LINES = 30


def summarize_statistics(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Fold Hypothesis statistics dicts (one per ``@given`` run in the test) into counts.

    ``examples`` counts passing and failing test cases outside shrinking, ``invalid``
    those rejected by ``assume``/filters, ``shrinks`` the cases tried while shrinking,
    ``steered`` the examples rejected per declared finding (finding id -> count).

    Example:
        >>> summarize_statistics([])["examples"]
        0
    """
    phases: dict[str, dict[str, float]] = {}
    stopped: list[str] = []
    steered: Counter[str] = Counter()
    for stats in runs:
        for key, phase_stats in stats.items():
            if not key.endswith("-phase") or not isinstance(phase_stats, Mapping):
                continue
            name = key.removesuffix("-phase")
            cases = phase_stats.get("test-cases", ())
            statuses = Counter(case.get("status") for case in cases)
            steered.update(
                str(event).removeprefix(STEERED_EVENT).partition(":")[0]
                for case in cases
                for event in case.get("events", ())
                if str(event).startswith(STEERED_EVENT)
            )
            entry = phases.setdefault(
                name, {"valid": 0, "failing": 0, "invalid": 0, "seconds": 0.0}
            )
            entry["valid"] += statuses["valid"]
            entry["failing"] += statuses["interesting"]
            entry["invalid"] += statuses["invalid"] + statuses["overrun"]
            entry["seconds"] += float(phase_stats.get("duration-seconds", 0.0))
        if stats.get("stopped-because"):
            stopped.append(str(stats["stopped-because"]))
    in_examples = [phases[name] for name in _EXAMPLE_PHASES if name in phases]
    shrink = phases.get("shrink", {})
    return {
        "runs": len(runs),
        "examples": int(sum(p["valid"] + p["failing"] for p in in_examples)),
        "failing": int(sum(p["failing"] for p in in_examples)),
        "invalid": int(sum(p["invalid"] for p in in_examples)),
        "shrinks": int(sum(shrink.get(key, 0) for key in ("valid", "failing", "invalid"))),
        "phases": phases,
        "stopped_because": stopped,
        "steered": dict(sorted(steered.items())),
    }


def call_properties(
    nodeid: str, runs: Sequence[Mapping[str, Any]], *, device: str | None
) -> list[tuple[str, Any]]:
    """The user properties a test process attaches to test ``nodeid`` after its call: its
    Hypothesis ``runs`` summarized, the stored examples it fetched and how many of them were
    damaged (empty or undecodable), the saves that failed (:mod:`kvcheck.runner.db`) and its
    ``device``; each but the fetch count only when known or not zero.

    Example:
        >>> call_properties("a test that never ran", [], device="cpu")
        [('kvcheck_stored_examples', 0), ('kvcheck_device', 'cpu')]
    """
    properties: list[tuple[str, Any]] = []
    if runs:
        properties.append((STATISTICS_PROPERTY, json.dumps(summarize_statistics(runs))))
    properties.append((STORED_PROPERTY, stored_examples_fetched(nodeid)))
    if damaged := stored_examples_damaged(nodeid):
        properties.append((STORED_DAMAGED_PROPERTY, damaged))
    if unattributed := unattributed_examples_fetched(nodeid):
        properties.append((UNATTRIBUTED_PROPERTY, unattributed))
    if lost := save_errors(nodeid):
        properties.append((SAVE_ERRORS_PROPERTY, json.dumps(lost)))
    if device is not None:
        properties.append((DEVICE_PROPERTY, device))
    return properties


def failures_from_exception(exc: BaseException) -> list[dict[str, Any]]:
    """One entry per distinct failure: error, minimal example, draws, blob, reproduction.

    Hypothesis attaches the minimal example, ``Draw N (label): ...`` lines and the
    ``@reproduce_failure`` line as exception notes; several distinct bugs arrive as an
    ``ExceptionGroup``. Its headings change between releases ("Falsifying example:",
    "Failing test case:"), so the heading is dropped and kvcheck's own put in its place:
    ``example`` is the bare call (or state-machine steps), ``reproduction`` is that under
    :data:`EXAMPLE_HEADING` followed by the draws (the collector puts
    :data:`UNSHRUNK_HEADING` in its place, and ``shrunk`` False, when the run's statistics
    show no shrinking). A leaf with a ``signature`` (a
    :class:`~kvcheck.failures.PropertyFailure`) adds its fields; one with a
    ``reproduction`` adds ``reproduction_data``
    (:func:`kvcheck.failures.reproduction_to_json`, or for a tier failure
    :func:`kvcheck.tier_calls.tier_reproduction_to_json`). A tier failure's example is the
    calls it made on the allocator or host pool, as Python (the note
    :mod:`kvcheck.tier_log` gives it), in place of Hypothesis's draws and steps.

    Example:
        >>> err = AssertionError("boom")
        >>> err.add_note("Falsifying example: test(x=1)")
        >>> err.add_note("Draw 1 (y): 0")
        >>> entry = failures_from_exception(err)[0]
        >>> entry["example"], entry["draws"]
        ('test(x=1)', ['Draw 1 (y): 0'])
        >>> print(entry["reproduction"])
        Minimal example: test(x=1)
        Draw 1 (y): 0
    """
    entries: list[dict[str, Any]] = []
    for leaf in leaf_exceptions(exc):
        blob = None
        example: str | None = None
        draws: list[str] = []
        other: list[str] = []
        for note in (str(note) for note in getattr(leaf, "__notes__", ())):
            if match := _BLOB.search(note):
                blob = match.group(0)
                continue
            text = note.strip("\n")
            if _DRAW.match(text):
                draws += text.splitlines()
            elif example is None and _EXAMPLE_NOTE.match(text):
                example = _EXAMPLE_NOTE.sub("", text, count=1).strip("\n")
            elif text.strip():
                other.append(text)
        calls = next((text for text in other if text.startswith(CALLS_HEADING)), None)
        if calls is not None:
            example = textwrap.dedent(calls.removeprefix(CALLS_HEADING).strip("\n"))
            draws = []
            other = [text for text in other if text != calls and not _STATE_STEP.match(text)]
        message = str(leaf).strip()
        entry: dict[str, Any] = {
            "error": f"{type(leaf).__name__}: {message}" if message else type(leaf).__name__,
            "example": example,
            "draws": draws,
            "notes": other,
            "reproduction": _reproduction_text(example, draws, other),
            "blob": blob,
        }
        signature = getattr(leaf, "signature", None)
        if signature is not None:
            entry["signature"] = {
                name: str(getattr(signature, name, "") or "")
                for name in ("check", "call", "kind", "family")
            }
        reproduction = getattr(leaf, "reproduction", None)
        if reproduction is not None:
            try:
                entry["reproduction_data"] = (
                    tier_reproduction_to_json(reproduction)
                    if isinstance(reproduction, TierReproduction)
                    else reproduction_to_json(reproduction)
                )
            except Exception as error:  # a broken renderer must not hide the failure itself
                entry["reproduction_error"] = f"{type(error).__name__}: {error}"
        entries.append(entry)
    return entries


@dataclass
class RecordedTest:
    """What happened to one test, across its setup, call and teardown."""

    nodeid: str
    #: passed | failed | error | skipped | xfailed | xpassed, or interrupted: it started and
    #: never finished (Ctrl-C), so a setup report alone never counts as a pass.
    outcome: str = "interrupted"
    duration_s: float = 0.0
    skip_reason: str | None = None
    message: str | None = None
    statistics: dict[str, Any] | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    stored_examples: int | None = None
    #: Of the stored examples fetched, those that were empty or could not be decoded.
    stored_damaged: int = 0
    #: Stored examples replayed that the test's target cannot claim (stored without one).
    unattributed: int = 0
    device: str | None = None
    save_errors: list[str] = field(default_factory=list)
    #: The declared finding this test pins (it must fail with exactly that finding).
    pins: str | None = None


class ResultsCollector:
    """A pytest plugin object (controller side) that records every test's outcome.

    With a ``path`` it writes them there as JSON at the end, beside the items ``context``
    returns then (target, device, profile, database). With a ``progress_fd`` it writes one
    JSON line per finished test there (the kvcheck command's progress line), with the whole
    :class:`RecordedTest` of a failing one (the command's early report). The terminal
    summary names every test whose failing example could not be saved.

    Example:
        >>> collector = ResultsCollector(Path("out.json"), context=lambda: {"target": "x"})
        >>> collector.records
        {}
    """

    def __init__(
        self,
        path: Path | None,
        *,
        context: Callable[[], Mapping[str, Any]],
        progress_fd: int | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.context = context
        self.progress_fd = progress_fd
        self.records: dict[str, RecordedTest] = {}
        self.collection_errors: list[dict[str, str]] = []
        self._started = time.perf_counter()
        self._total_sent = False

    def pytest_collection_finish(self, session: Any) -> None:
        self._send_total(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._send_total(len(ids))

    def pytest_runtest_logreport(self, report: Any) -> None:
        record = self.records.setdefault(report.nodeid, RecordedTest(nodeid=report.nodeid))
        record.duration_s += float(getattr(report, "duration", 0.0) or 0.0)
        _apply_properties(record, getattr(report, "user_properties", ()))
        if report.when == "call":
            _head_examples(record)
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.passed:
                record.outcome = "xpassed" if xfail else "passed"
            elif report.failed:
                record.outcome = "failed"
                record.message = _failure_message(report)
            else:
                record.outcome = "xfailed" if xfail else "skipped"
                record.skip_reason = _skip_reason(report)
        elif report.failed and record.outcome not in ("failed", "error"):
            record.outcome = "error"
            record.message = f"error in {report.when}: {_failure_message(report)}"
        elif report.skipped and report.when == "setup":
            record.outcome = "xfailed" if xfail else "skipped"
            record.skip_reason = _skip_reason(report)
        elif report.when == "teardown" and record.outcome == "interrupted":
            record.outcome = "passed"  # a test without a call phase that set up and tore down
        if report.when == "teardown":
            event = {"event": "test", "nodeid": report.nodeid, "outcome": record.outcome}
            if record.outcome in FAILING_OUTCOMES:
                event["record"] = asdict(record)
            self._send(event)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collection_errors.append(
                {"nodeid": report.nodeid, "message": _failure_message(report)}
            )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lost = Counter(
            (record.nodeid, reason)
            for record in self.records.values()
            for reason in record.save_errors
        )
        if lost:
            terminalreporter.write_line(
                f"kvcheck WARNING: {lost.total()} failing example(s) could not be saved to "
                "the example database; kvcheck replay will not find them:",
                red=True,
                bold=True,
            )
        for (nodeid, reason), times in lost.items():
            again = f" ({times} times)" if times > 1 else ""
            terminalreporter.write_line(f"  {nodeid}: {reason}{again}", red=True)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """Write the JSON results file, if asked for (parent directories are created)."""
        if self.path is None:
            return
        payload = {
            "format": RESULTS_FORMAT,
            **self.context(),
            "exit_status": int(exitstatus),
            "duration_s": round(time.perf_counter() - self._started, 3),
            "collection_errors": self.collection_errors,
            "tests": [asdict(record) for record in self.records.values()],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(payload, indent=2), encoding="utf-8")

    def _send_total(self, total: int) -> None:
        if not self._total_sent:
            self._total_sent = True
            self._send({"event": "collected", "total": total})

    def _send(self, event: dict[str, Any]) -> None:
        if self.progress_fd is None:
            return
        data = (json.dumps(event, default=str) + "\n").encode()
        try:
            while data:  # a failing test's record may take several writes to a pipe
                data = data[os.write(self.progress_fd, data) :]
        except OSError:  # the kvcheck command went away: progress is only a display
            self.progress_fd = None


def load_results(path: Path) -> dict[str, Any]:
    """Read a results file written by :class:`ResultsCollector`; ``ValueError`` if unusable.

    Example:
        >>> try:
        ...     load_results(Path("/nonexistent.json"))
        ... except ValueError as exc:
        ...     print(str(exc).split(" (")[0])
        path='/nonexistent.json': no kvcheck results file
    """
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"path={str(path)!r}: no kvcheck results file ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != RESULTS_FORMAT:
        raise ValueError(
            f"path={str(path)!r}: not a kvcheck results file of format {RESULTS_FORMAT}"
        )
    return payload


def capped_lines(text: str, limit: int, *, where: str = "") -> list[str]:
    """The lines of ``text``, those past ``limit`` replaced by ``... (N more lines<where>)``.

    Example:
        >>> capped_lines("a\\nb\\nc", 2, where=" in the log")
        ['a', 'b', '... (1 more lines in the log)']
    """
    lines = text.splitlines()
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... ({len(lines) - limit} more lines{where})"]


# --- helpers ----------------------------------------------------------------------------------


def _reproduction_text(
    example: str | None, draws: list[str], other: list[str], *, heading: str = EXAMPLE_HEADING
) -> str | None:
    if example is None and not draws and not other:
        return None
    lines: list[str] = []
    if example == "":
        lines.append(heading)  # a bare heading: the steps are the notes after it
    elif example is not None:
        first = example.split("\n", 1)[0].rstrip()
        # A call starts on the heading's line; state-machine steps start on the next one.
        starts_a_call = "\n" not in example or first.endswith("(")
        lines.append(f"{heading}{' ' if starts_a_call else chr(10)}{example}")
    return "\n".join([*lines, *draws, *other])


def _head_examples(record: RecordedTest) -> None:
    """Mark each failure of ``record`` shrunk or not, and head its example to match.

    Only the run's own statistics are evidence: Hypothesis reports its shrink phase even
    when the settings leave shrinking out (``kvcheck replay``), and skips it when it replays
    a stored example exactly, so an example counts as shrunk only when the shrink phase ran
    test cases. A stored example could be anything (a damaged entry that happened to decode
    included), and "minimal" would be a claim nobody checked.

    Example:
        >>> record = RecordedTest("t", statistics={"shrinks": 0}, failures=[
        ...     {"example": "t(x=7)", "draws": [], "notes": []}])
        >>> _head_examples(record)
        >>> record.failures[0]["reproduction"], record.failures[0]["shrunk"]
        ('Example (not shrunk): t(x=7)', False)
    """
    shrunk = bool((record.statistics or {}).get("shrinks"))
    for failure in record.failures:
        failure["shrunk"] = shrunk
        if failure.get("example") is not None or failure.get("draws") or failure.get("notes"):
            failure["reproduction"] = _reproduction_text(
                failure.get("example"),
                list(failure.get("draws") or ()),
                list(failure.get("notes") or ()),
                heading=EXAMPLE_HEADING if shrunk else UNSHRUNK_HEADING,
            )


#: user property -> (field of RecordedTest, how its value is read)
_PROPERTY_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    STATISTICS_PROPERTY: ("statistics", json.loads),
    FAILURES_PROPERTY: ("failures", json.loads),
    STORED_PROPERTY: ("stored_examples", int),
    STORED_DAMAGED_PROPERTY: ("stored_damaged", int),
    UNATTRIBUTED_PROPERTY: ("unattributed", int),
    DEVICE_PROPERTY: ("device", str),
    SAVE_ERRORS_PROPERTY: ("save_errors", lambda value: list(json.loads(value))),
    PINS_PROPERTY: ("pins", str),
}


def _apply_properties(record: RecordedTest, properties: Sequence[Any]) -> None:
    for item in properties:
        if isinstance(item, tuple | list) and len(item) == 2 and item[0] in _PROPERTY_FIELDS:
            name, read = _PROPERTY_FIELDS[item[0]]
            setattr(record, name, read(item[1]))


def _skip_reason(report: Any) -> str | None:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail) or None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return None if longrepr is None else str(longrepr)


def _failure_message(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    message = getattr(crash, "message", None)
    if not message:
        message = str(getattr(report, "longreprtext", "") or report.longrepr or "")
    return "\n".join(capped_lines(message.strip(), _MAX_MESSAGE_LINES))
