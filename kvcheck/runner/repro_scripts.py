"""Writing a run's standalone reproduction scripts to disk (what a script holds is
:mod:`kvcheck.runner.repro`'s for a pool failure, :mod:`kvcheck.runner.tier_scripts`'s for
an allocator or host-pool one), without importing torch when nothing failed.

Example:
    >>> write_repro_scripts({"tests": []}, repro_dir=Path("unused"), target="kvcheck")
    'none (no failure carried reproduction data)'
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from kvcheck.runner.launch import shown_path

__all__ = ["python_command", "write_repro_scripts"]


def write_repro_scripts(
    results: dict[str, Any],
    *,
    repro_dir: Path,
    target: str,
    import_root: str | None = None,
    used: set[str] | None = None,
) -> str | None:
    """A standalone script per failure that carries reproduction data; its path goes on the
    failure as ``script``, and the command that runs it from here as ``script_command``.
    A failure that has a ``script`` already keeps it; ``used`` holds the script names
    taken so far (several calls in one run: a failure reported during the run, the rest
    at its end). Returns a note instead of the folder when none could be written."""
    from kvcheck.runner.results import FAILING_OUTCOMES

    failures = [
        (test["nodeid"], failure)
        for test in results.get("tests", ())
        if test.get("outcome") in FAILING_OUTCOMES
        for failure in (test.get("failures") or ())
        if failure.get("reproduction_data")
    ]
    if not failures:
        return "none (no failure carried reproduction data)"
    failures = [(nodeid, failure) for nodeid, failure in failures if not failure.get("script")]
    from kvcheck.runner.repro import render_script, script_name  # imports torch

    try:
        repro_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"not written: cannot create {repro_dir} ({exc.strerror or exc})"
    used = set() if used is None else used
    for nodeid, failure in failures:
        path = repro_dir / script_name(nodeid, used)
        try:
            data = failure["reproduction_data"]
            if isinstance(data, dict) and not data.get("test"):
                data = {**data, "test": nodeid}  # the script's header names its test
            script = render_script(data, target=target, import_root=import_root)
            path.write_text(script, encoding="utf-8")
        except Exception as exc:  # one bad script must not hide the others or the summary
            failure["script_error"] = f"{type(exc).__name__}: {exc}"
            continue
        failure["script"] = shown_path(path)
        failure["script_command"] = f"{python_command()} {shlex.quote(shown_path(path))}"
    return None


def python_command() -> str:
    """How the user's shell runs this interpreter: ``python`` when that is the one on PATH
    (the same file in the same directory: a virtual environment's), else its full path."""
    found = shutil.which("python")
    executable = Path(sys.executable)
    if found is not None and Path(found).parent.resolve() == executable.parent.resolve():
        with contextlib.suppress(OSError):
            if os.path.samefile(found, executable):
                return "python"
    return shlex.quote(str(executable))
