"""The campaign's live progress line.

One line, rewritten in place on a terminal, says how far the campaign is: time (of its
budget), examples run and examples per second, shards done and running, failures found::

    campaign 01:12/02:00  4,210 examples (58.5/s)  shards 9 done, 2 running  failures 1

Off a terminal (CI logs) it is printed as its own line about every tenth of the time budget.
Events (a property failed, the budget is spent, an interrupt) get lines of their own.

Example:
    >>> status_line(Status(elapsed_s=72.4, examples=4210, shards_done=9, running=2,
    ...                    failures=1), budget_s=120)
    'campaign 01:12/02:00  4,210 examples (58.1/s)  shards 9 done, 2 running  failures 1'
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Progress", "Status", "status_line"]

#: Off a terminal: a line about every tenth of the time budget, never more often than this.
_MIN_INTERVAL_S = 5.0
#: Off a terminal, without a time budget: a line this often.
_NO_BUDGET_INTERVAL_S = 30.0


@dataclass(frozen=True)
class Status:
    """Where the campaign stands: seconds since it started, examples run (by the finished
    shards, and by the running ones as they last reported: counted as they run), shards
    finished and running, tests failed so far."""

    elapsed_s: float
    examples: int
    shards_done: int
    running: int
    failures: int


def status_line(status: Status, *, budget_s: float | None) -> str:
    """The progress line for ``status``; ``budget_s`` is the time budget, if there is one."""
    elapsed = _clock(status.elapsed_s)
    if budget_s is not None:
        elapsed += f"/{_clock(budget_s)}"
    rate = status.examples / status.elapsed_s if status.elapsed_s > 0 else 0.0
    return (
        f"campaign {elapsed}  {status.examples:,} examples ({rate:.1f}/s)  "
        f"shards {status.shards_done} done, {status.running} running  "
        f"failures {status.failures}"
    )


class Progress:
    """Prints the progress line (``quiet``: nothing but events) to ``stream``."""

    def __init__(
        self,
        *,
        budget_s: float | None,
        stream: TextIO | None = None,
        quiet: bool = False,
        tty: bool | None = None,
    ) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.budget_s = budget_s
        self.quiet = quiet
        self.tty = self.stream.isatty() if tty is None else tty
        self._interval = (
            _NO_BUDGET_INTERVAL_S if budget_s is None else max(_MIN_INTERVAL_S, budget_s / 10)
        )
        self._next_line_s = 0.0
        self._open_line = False

    def update(self, status: Status) -> None:
        """Show ``status``: in place on a terminal, else when a line is due."""
        if self.quiet:
            return
        line = status_line(status, budget_s=self.budget_s)
        if self.tty:
            width = shutil.get_terminal_size().columns
            self.stream.write(f"\r\x1b[K{line[: max(width - 1, 20)]}")
            self.stream.flush()
            self._open_line = True
        elif status.elapsed_s >= self._next_line_s:
            self._print(line)
            self._next_line_s = status.elapsed_s + self._interval

    def event(self, text: str) -> None:
        """A line of its own (printed even when quiet)."""
        self._print(text)

    def close(self) -> None:
        """End the line rewritten in place, if one is open."""
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False

    def _print(self, text: str) -> None:
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    """``mm:ss`` (``h:mm:ss`` from an hour on)."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
