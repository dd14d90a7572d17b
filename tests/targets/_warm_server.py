"""The warm Python of ``warm_python.py``: ``python _warm_server.py FOLDER``.

Imports FOLDER's CPU helper, then sglang's pool module, as the scripts do; then reads
``{"script": PATH, "timeout": SECONDS}`` lines on stdin and answers each with
``{"returncode": N, "stdout": TEXT, "stderr": TEXT}`` on the stdout it started with. Anything
printed while loading goes to stderr (the caller's log), never into an answer.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import sys
import tempfile
import traceback


def child(script: str, out_path: str, err_path: str) -> None:
    """In the forked child: run ``script`` as ``__main__`` and exit with its status."""
    code = 0
    try:
        for fd, path in ((1, out_path), (2, err_path)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
        atexit._clear()
        sys.argv = [script]
        sys.path[0] = os.path.dirname(script)
        os.chdir(os.path.dirname(script))
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(script: str, timeout: float) -> dict[str, object]:
    """Fork a child for ``script``; its status and output, or a kill after ``timeout``."""
    with tempfile.TemporaryDirectory() as scratch:
        out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        for path in (out_path, err_path):
            open(path, "w").close()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(script, out_path, err_path)
        pidfd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with open(out_path) as out, open(err_path) as err:
            return {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": out.read(),
                "stderr": err.read(),
            }


def serve() -> None:
    """Load as the scripts do, then answer requests until stdin closes."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the imports' prints go to the log, not into the answers
    folder = sys.argv[1]
    sys.path[0] = folder  # where the server lives is no script's business
    sys.argv = [sys.argv[0]]
    import cpu_stand_ins  # noqa: F401  (first, as in every script)
    import sglang.srt.mem_cache.memory_pool  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        answers.write(json.dumps(run(request["script"], float(request["timeout"]))) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
