"""The pytest subprocess of ``kvcheck verify`` and ``kvcheck replay``, and interrupts.

**Imports.** ``python -m pytest`` puts the current directory first on ``sys.path`` before
anything is imported, so a folder named ``kvcheck`` there (the parent of a clone, like
``~/src``) would shadow the installed package. pytest is started by
:data:`PYTEST_BOOTSTRAP` instead, which drops the current directory, and the plugin puts it
back first (``--kvcheck-import-dir``) once kvcheck is imported, in the controller and in
every xdist worker, so ``module:attr`` targets and a project's own modules still import from
it as they would under ``python -m pytest``.

**Interrupts** (:class:`Interrupts`). pytest runs in its own process group, so a signal
reaches it only through the kvcheck command, once: a terminal's Ctrl-C (SIGINT to the
foreground process group), ``timeout -s INT`` (the process, then its group) and a CI cancel
(SIGINT or SIGTERM to the kvcheck process only) all end the same way. Before pytest starts,
the first signal stops the checks (exit 130). While it runs, the first is passed on as one
SIGINT: pytest stops after the current test, records what ran and exits; more signals within
:data:`INTERRUPT_GRACE_S` are ignored, and one after it kills pytest's process group (the
summary is then built from the tests kvcheck saw finish). After pytest, they are only
counted. The command exits 130 in every case, after the summary of what ran.

Example:
    >>> cmd = pytest_command(suite="kvcheck.suite", target="kvcheck", device=None,
    ...                      profile=None, workers="2", junit_xml=None, keyword=None,
    ...                      results_path=Path("r.json"), import_dir="/work")
    >>> cmd[1] == "-c" and cmd[3:5]
    ['--pyargs', 'kvcheck.suite']
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "EXIT_INTERRUPTED",
    "INTERRUPT_GRACE_S",
    "PYTEST_BOOTSTRAP",
    "Interrupts",
    "SuiteRun",
    "pytest_command",
    "run_pytest",
    "shown_path",
]

#: Exit status after an interrupt (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: pytest's exit status for "interrupted".
_PYTEST_INTERRUPTED = 2
#: After the first interrupt, how long further ones are ignored before one kills pytest.
INTERRUPT_GRACE_S = 10.0
#: ``python -c`` program that runs pytest as ``python -m pytest`` would, without the current
#: directory on ``sys.path`` while kvcheck is imported (see the module docstring).
PYTEST_BOOTSTRAP = (
    "import os, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.', os.getcwd())]; "
    "from kvcheck.runner.launch import run_pytest; sys.exit(run_pytest())"
)
_PROGRESS_OPTION = "--kvcheck-progress-fd"


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
    import_dir: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line that runs ``suite`` for the kvcheck command.

    ``suite`` is a path, or a dotted module run with ``--pyargs``. ``import_dir`` (the
    kvcheck command's current directory) goes first on ``sys.path`` once kvcheck is
    imported. With ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, the plugins the suite needs are
    named with ``-p``.
    """
    command = [sys.executable, "-c", PYTEST_BOOTSTRAP]
    command += [suite] if Path(suite).exists() else ["--pyargs", suite]
    # No .pytest_cache inside an installed package; verbose lines are the live progress.
    command += ["-p", "no:cacheprovider", "-v", "--tb=short"]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        # Without entry-point plugins, name the ones the suite needs.
        command += ["-p", "kvcheck.runner.plugin", "-p", "_hypothesis_pytestplugin"]
        if workers is not None:
            command += ["-p", "xdist.plugin"]
    command += [f"--kvcheck-target={target}", f"--kvcheck-results={results_path}"]
    if import_dir is not None:
        command.append(f"--kvcheck-import-dir={import_dir}")
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


def run_pytest() -> int:
    """pytest's console entry (what ``python -m pytest`` runs); a Ctrl-C during pytest's
    start-up, before its session handles one, ends as pytest's "interrupted" status (2)
    instead of a traceback.

    SIGINT raises KeyboardInterrupt here even when the process started with it ignored: a
    command started in the background of a script (``cmd &`` without job control, as CI
    runners and ``nohup`` jobs do) inherits an ignored SIGINT across exec, and Python keeps
    it ignored, so the one SIGINT kvcheck sends to stop pytest (an interrupt, a campaign's
    stop) would do nothing and pytest would be killed without writing its results."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        import pytest

        return int(pytest.console_main())
    except KeyboardInterrupt:
        return _PYTEST_INTERRUPTED


class Interrupts:
    """SIGINT and SIGTERM handling for one kvcheck command (see the module docstring).

    Used as a context manager around the command: it installs its handler (in the main
    thread only; elsewhere it changes nothing) and puts the previous handlers back.

    Example:
        >>> with Interrupts() as interrupts:
        ...     interrupts.received
        0
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        #: Signals received so far.
        self.received = 0
        self._first_at: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stage = "checks"  # then "running", then "done"
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for number in self._SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def running(self) -> None:
        """pytest is about to start: from now on a signal is passed on, not raised."""
        self._stage = "running"

    def started(self, process: subprocess.Popen[bytes]) -> None:
        """pytest started as ``process``; a signal that came while it started is passed on."""
        self._process = process
        if self._first_at is not None:
            self._send(signal.SIGINT)

    def finished(self) -> None:
        """pytest has exited: signals are only counted now."""
        self._stage = "done"
        self._process = None

    def _handle(self, number: int, frame: FrameType | None) -> None:
        self.received += 1
        if self._stage == "checks":
            raise KeyboardInterrupt
        if self._stage == "done":
            return
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
            self._send(signal.SIGINT)
        elif now - self._first_at > INTERRUPT_GRACE_S:
            self._send(signal.SIGKILL)  # pytest did not stop: stop waiting for it

    def _send(self, number: int) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if number == signal.SIGKILL:
                os.killpg(process.pid, number)  # pytest leads its group: its workers too
            else:
                process.send_signal(number)


class SuiteRun:
    """The pytest subprocess: its output (streamed, or to the log file) and our progress line.

    pytest runs in its own process group and hears signals only from :class:`Interrupts`.
    Off ``--verbose`` its stdout and stderr go to ``log_path``. Each finished test reported
    on the progress pipe is kept (:attr:`finished`), so that what ran can be summarized even
    when pytest never wrote its results; each failing one's record is handed to
    ``on_failure`` as soon as it arrives (the command reports it while the run goes on).
    """

    def __init__(
        self,
        *,
        command: str,
        verbosity: int,
        log_path: Path,
        on_failure: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.command = command
        self.verbosity = verbosity
        self.log_path = log_path
        self.on_failure = on_failure
        self.total: int | None = None
        self.counts: Counter[str] = Counter()
        #: ``{"nodeid": ..., "outcome": ...}`` of each test pytest reported finished; a
        #: failing test's whole record (:class:`kvcheck.runner.results.RecordedTest`).
        self.finished: list[dict[str, Any]] = []
        self._tty = sys.stdout.isatty()
        self._next_report = 0
        self._started = time.monotonic()

    def run(self, argv: list[str], interrupts: Interrupts) -> int:
        """Run pytest with ``argv``; return its exit status."""
        if self.verbosity > 0:
            print(f"kvcheck {self.command}: {shlex.join(argv)}", flush=True)
        read_fd, write_fd = os.pipe()
        argv = [*argv, f"{_PROGRESS_OPTION}={write_fd}"]
        with contextlib.ExitStack() as stack:
            log = None if self.verbosity > 0 else stack.enter_context(self.log_path.open("wb"))
            interrupts.running()
            try:
                process = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=None if log is None else subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    start_new_session=True,
                )
            finally:
                os.close(write_fd)
            interrupts.started(process)
            with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as events:
                for line in events:
                    self._event(line)
            status = process.wait()
            interrupts.finished()
        self._end_line()
        return status

    def log_tail(self, lines: int = 20) -> str:
        """The end of pytest's output (its reason for stopping), indented."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"see {self.log_path}"
        tail = text.strip().splitlines()[-lines:]
        if not tail:
            return "it printed nothing"
        return "its output ends:\n" + "\n".join(f"    {line}" for line in tail)

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
                    f"(full pytest log: {shown_path(self.log_path)})",
                    flush=True,
                )
        elif event.get("event") == "test":
            outcome = str(event.get("outcome"))
            self.counts[outcome] += 1
            record = event.get("record")
            if isinstance(record, dict):  # a failing test, with its failures
                self.finished.append(record)
                self._report(record)
            else:
                self.finished.append({"nodeid": str(event.get("nodeid", "")), "outcome": outcome})
            if self.verbosity == 0:
                self._progress(str(event.get("nodeid", "")))

    def _report(self, record: dict[str, Any]) -> None:
        if self.on_failure is None:
            return
        if self._tty and self.verbosity == 0:
            print("\r\x1b[K", end="")  # the report takes the progress line's place
        try:
            self.on_failure(record)
        except Exception as exc:  # only a display: the summary still reports the failure
            print(f"kvcheck {self.command}: cannot report {record.get('nodeid')} now: {exc!r}")

    def _progress(self, nodeid: str) -> None:
        from kvcheck.runner.summary import short_name

        done = sum(self.counts.values())
        total = self.total or 0
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts.items()))
        # The elapsed time gives a sense of the whole run's length (issue 36, item 7).
        elapsed = round(time.monotonic() - self._started)
        text = f"[{done}/{total or '?'}] {counts} at {elapsed} s"
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


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it.

    Example:
        >>> shown_path(Path.cwd() / "a" / "b.json") == str(Path("a", "b.json"))
        True
    """
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    return str(path)
