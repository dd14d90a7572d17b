"""Run the reproduction scripts of ``docs/sglang-repros/`` without paying sglang's import
for each one.

Each script starts by importing the folder's CPU helper and sglang's pool modules: 10-12 s
of a 13-15 s run on this 2-core machine, 35 times on the newest release. A warm Python
(:data:`SERVER`, one per test process) imports them once, as a script does (the helper
first), then forks a child per script that runs it as ``__main__`` from its folder with its
own ``sys.argv``, output files and exit status, and an empty ``atexit`` list (the parent's
handlers are not the script's). The child's imports still execute (the names are bound by
the script's own statements); only their cost is gone.

A script that sets an environment variable before that import runs in a fresh Python, as
printed: the variable may be read while sglang or Triton load (``TRITON_INTERPRET`` is), and
in the warm Python they have loaded already. ``TESTS_REPROS_FRESH=1`` runs every script
fresh. That scripts import the helper before sglang, which is what makes the warm parent's
order theirs, is checked without sglang in ``test_sglang_repro_scripts.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: The server: reads one JSON request per line, answers one JSON line per request.
SERVER = Path(__file__).with_name("_warm_server.py")

_HELPER_IMPORT = re.compile(r"^import cpu_stand_ins\b", re.MULTILINE)


@dataclass(frozen=True)
class Ran:
    """What a script did: its exit status and output, as ``subprocess.run`` gives them."""

    returncode: int
    stdout: str
    stderr: str


def runs_warm(script: Path) -> bool:
    """Whether ``script`` may run in the warm Python: nothing before its helper import
    touches the environment (``TESTS_REPROS_FRESH=1``: none may)."""
    if os.environ.get("TESTS_REPROS_FRESH", "") not in ("", "0"):
        return False
    source = script.read_text()
    match = _HELPER_IMPORT.search(source)
    return match is not None and "environ" not in source[: match.start()]


def script_environment() -> dict[str, str]:
    """The environment a user's shell gives a script: no kvcheck variable, no PYTHONPATH
    (the script needs sglang and torch alone)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("KVCHECK")}
    env.pop("PYTHONPATH", None)
    return env


def run_fresh(script: Path, timeout_s: float) -> Ran:
    """Run ``script`` as a user would: ``python script.py`` from its folder."""
    completed = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=script_environment(),
        cwd=script.parent,
        check=False,
    )
    return Ran(completed.returncode, completed.stdout, completed.stderr)


class WarmPython:
    """One warm interpreter for a folder's scripts; started on the first :meth:`run`."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.folder = folder
        self.log = log
        self._process: subprocess.Popen[str] | None = None
        self._log_file: IO[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        if self._process is None:
            self._log_file = self.log.open("w")
            self._process = subprocess.Popen(
                [sys.executable, str(SERVER), str(self.folder)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_file,
                text=True,
                env=script_environment(),
                cwd=self.folder,
            )
        return self._process

    def run(self, script: Path, timeout_s: float) -> Ran:
        """Run ``script`` in a child of the warm interpreter; the answer's output is the
        script's alone."""
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps({"script": str(script), "timeout": timeout_s}) + "\n")
        process.stdin.flush()
        answer = process.stdout.readline()
        if not answer:
            raise RuntimeError(
                f"the warm Python ended (exit {process.wait()}); its log: {self.log}\n"
                + self.log.read_text()[-3000:]
            )
        ran = json.loads(answer)
        return Ran(ran["returncode"], ran["stdout"], ran["stderr"])

    def close(self) -> None:
        """End the interpreter (its children have all been waited for)."""
        if self._process is not None:
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.close()
            self._process.wait(timeout=60)
            self._process.stdout.close()  # an unclosed pipe is a ResourceWarning (an error)
            self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
