"""One shard, run where a worker runs it: a pytest subprocess of the suite's tests.

:func:`run_shard` is what a campaign task calls on its worker (it knows nothing of Ray):
it runs the shard's tests as ``kvcheck verify`` would (:func:`kvcheck.runner.cli.pytest_command`,
so node ids and database keys are the same and ``kvcheck replay`` finds what it stores),
under the ``kvcheck-campaign`` profile with the shard's seed (as ``@seed``: the database
stays on, which ``--hypothesis-seed`` would turn off) and example count, and
returns the results the pytest plugin wrote (:mod:`kvcheck.runner.results`) as a plain
dict, which travels back to the driver. While pytest runs, the shard reads the test cases
it has run so far (the campaign plugin's progress file) every ``poll_s`` and passes them to
``on_examples``, which the Ray task forwards to the driver: the progress line counts
examples as they run.

pytest runs in a session of its own, so a Ctrl-C in the worker's terminal does not reach
it; the shard stops it when ``should_stop()`` says so (the campaign is interrupted or out
of time, or another shard already failed every test of this one): SIGINT, as a Ctrl-C,
so pytest records what ran and writes its results, then SIGKILL after a grace period.
Linux also kills it if the worker process dies.

Example:
    >>> context = ShardContext(suite="kvcheck.suite", target="kvcheck")
    >>> from kvcheck.runner.campaign.plan import Shard
    >>> command = shard_command(Shard(1, ("test_noop.py::t",), 7, 50), context,
    ...                         results_path=Path("r.json"))
    >>> [arg for arg in command if arg.startswith(("--kvcheck-campaign-s", "--kvcheck-campaign-e"))]
    ['--kvcheck-campaign-seed=7', '--kvcheck-campaign-examples=50']
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcheck.runner.campaign.plan import Shard
from kvcheck.runner.campaign.pytest_plugin import PROGRESS_OPTION, SEED_OPTION, TEST_OPTION

__all__ = [
    "ShardContext",
    "results_json",
    "run_shard",
    "shard_command",
    "shard_environment",
    "working_directory",
]

#: How long pytest gets to stop after its SIGINT before it is killed.
_STOP_GRACE_S = 20.0
#: Lines of pytest's output a shard that went wrong sends back.
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class ShardContext:
    """What every shard of a campaign shares: the suite and target, the device, the
    driver's directory (where pytest runs, if the worker's machine has it), the
    environment to add (``KVCHECK_DB``, ``PYTHONPATH``) and pytest arguments to pass on."""

    suite: str
    target: str
    device: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pytest_args: tuple[str, ...] = ()


def shard_command(
    shard: Shard,
    context: ShardContext,
    *,
    results_path: Path,
    progress_path: Path | None = None,
) -> list[str]:
    """The pytest command line of ``shard``: its tests, seed and example count (and where
    to keep its running counts, if ``progress_path``)."""
    from kvcheck.runner.launch import pytest_command
    from kvcheck.runner.profiles import CAMPAIGN

    return pytest_command(
        suite=context.suite,
        target=context.target,
        device=context.device,
        profile=CAMPAIGN,
        workers=None,
        junit_xml=None,
        keyword=None,
        results_path=results_path,
        import_dir=working_directory(context.cwd),
        extra=[
            "-p",
            "kvcheck.runner.campaign.pytest_plugin",
            *(f"{TEST_OPTION}={nodeid}" for nodeid in shard.nodeids),
            f"{SEED_OPTION}={shard.seed}",
            f"--kvcheck-campaign-examples={shard.examples}",
            *([] if progress_path is None else [f"{PROGRESS_OPTION}={progress_path}"]),
            *context.pytest_args,
        ],
    )


def run_shard(
    shard: Shard,
    context: ShardContext,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_examples: Callable[[dict[str, int]], None] = lambda counts: None,
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """Run ``shard`` and return what came of it, as plain data.

    Keys: ``shard`` (its number), ``seed``, ``nodeids``, ``exit_status`` (pytest's),
    ``stopped`` (``should_stop()`` ended it), ``results`` (the results file, ``None`` if
    pytest wrote none), ``examples_seen`` (test cases run per test, as counted while they
    ran: they count a test the shard was stopped in), ``log_tail`` (the end of pytest's
    output, when it did not exit 0 or 1), ``host``, ``gpus`` (``CUDA_VISIBLE_DEVICES``)
    and ``wall_s``. Every ``poll_s`` seconds while pytest runs, ``should_stop`` is asked
    and ``on_examples`` told the test cases run so far per test.
    """
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"kvcheck-shard-{shard.number}-") as scratch:
        results_path = Path(scratch) / "results.json"
        log_path = Path(scratch) / "pytest.log"
        progress_path = Path(scratch) / "progress.json"
        command = shard_command(
            shard, context, results_path=results_path, progress_path=progress_path
        )
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=working_directory(context.cwd),
                env=shard_environment(context),
                start_new_session=True,
                preexec_fn=_child_setup(),
            )
            status, stopped = _wait(
                process, should_stop, lambda: on_examples(_seen(progress_path)), poll_s
            )
        seen = _seen(progress_path)
        results = _load(results_path)
        tail = None if status in (0, 1) and results is not None else _tail(log_path)
    return {
        "shard": shard.number,
        "seed": shard.seed,
        "nodeids": list(shard.nodeids),
        "exit_status": status,
        "stopped": stopped,
        "results": results,
        "examples_seen": seen,
        "log_tail": tail,
        "host": socket.gethostname(),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "wall_s": round(time.monotonic() - started, 3),
    }


def _wait(
    process: subprocess.Popen[bytes],
    should_stop: Callable[[], bool],
    on_poll: Callable[[], None],
    poll_s: float,
) -> tuple[int, bool]:
    """pytest's exit status, and whether it was stopped; a KeyboardInterrupt in the worker
    stops it too (and is not raised: what ran is still returned). ``on_poll`` is called
    every ``poll_s`` while it runs."""
    stopped = False
    try:
        while True:
            try:
                return process.wait(timeout=poll_s), stopped
            except subprocess.TimeoutExpired:
                on_poll()
                if not stopped and should_stop():
                    stopped = True
                    process.send_signal(signal.SIGINT)
                    try:
                        return process.wait(timeout=_STOP_GRACE_S), stopped
                    except subprocess.TimeoutExpired:
                        process.kill()
                        return process.wait(), stopped
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=_STOP_GRACE_S), True
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(), True


def working_directory(cwd: str | None) -> str | None:
    """The driver's directory where this machine has it (one machine, a shared file
    system), else the worker's own."""
    return cwd if cwd is not None and Path(cwd).is_dir() else None


def shard_environment(context: ShardContext) -> dict[str, str]:
    """The worker's environment with the campaign's variables; the driver's directory
    first on ``PYTHONPATH``, as ``kvcheck verify`` does (``module:attr`` targets)."""
    env = {**os.environ, **context.env}
    env.pop("KVCHECK_PROFILE", None)  # the shard names its profile
    cwd = working_directory(context.cwd)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd is not None and cwd not in parts:
        parts.insert(0, cwd)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _child_setup() -> Callable[[], None] | None:
    """For the child: SIGINT unblocked (a Ray task's thread blocks it, and the mask survives
    exec: pytest could not be stopped), and be killed when the worker that started it dies.
    Linux only; libc is loaded here, in the parent: the child of a threaded worker must
    not import anything."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return in_child


def _seen(path: Path) -> dict[str, int]:
    """The test cases per test in the progress file (none yet: empty)."""
    try:
        tests = json.loads(path.read_text(encoding="utf-8")).get("tests") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(nodeid): int(count) for nodeid, count in tests.items()}


def _load(path: Path) -> dict[str, Any] | None:
    from kvcheck.runner.results import load_results

    try:
        return load_results(path)
    except ValueError:
        return None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def results_json(outcome: Mapping[str, Any]) -> str:
    """``outcome`` as one JSON line (the driver keeps one per shard).

    Example:
        >>> results_json({"shard": 1})
        '{"shard": 1}'
    """
    return json.dumps(outcome, default=str)
