"""The settings the kvcheck commands check before they start pytest (``verify``, ``replay``,
``campaign``): cheap checks first, each failure a :class:`UsageProblem` whose message names
the option or variable and what is wrong, so a mistyped setting costs a second, not a run.

Example:
    >>> keyword("move", ["mha", "dsa"])
    '(mha or dsa) and (move)'
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SUITE",
    "UsageProblem",
    "check_database",
    "check_output_path",
    "check_workers",
    "checked_device",
    "checked_target",
    "keyword",
    "usable_directory",
]

#: The suite shipped with kvcheck, run with ``--pyargs``.
DEFAULT_SUITE = "kvcheck.suite"


class UsageProblem(Exception):
    """A command-line or environment setting that stops the command before it runs."""


def checked_target(name: str | None) -> tuple[str, str | None]:
    """Resolve the target as pytest will (module:attr is imported from the current
    directory); return its name and, for module:attr, the directory its module came from.
    The built-in ``kvcheck`` target, part of this package, is left to pytest: checking it
    here would only cost the command's start-up an import of torch."""
    from kvcheck.targets import (
        BUILTIN_TARGETS,
        DEFAULT_TARGET,
        TargetError,
        resolve_target,
        target_spec,
    )

    spec = target_spec(name)
    if spec == DEFAULT_TARGET:
        return spec, None
    try:
        with _cwd_on_sys_path():
            resolve_target(name)
    except TargetError as exc:
        raise UsageProblem(str(exc)) from exc
    if spec in BUILTIN_TARGETS:
        return spec, None
    from kvcheck.runner.repro import import_root

    return spec, import_root(spec.partition(":")[0].strip())


def resolved_quietly(name: str) -> Any:
    """The target ``name`` resolves to, imported as pytest will (the current directory on
    the path), or None where it cannot be resolved (the caller reports why elsewhere).

    Example:
        >>> resolved_quietly("no_such_module:target") is None
        True
    """
    from kvcheck.targets import DEFAULT_TARGET, TargetError, resolve_target

    if name == DEFAULT_TARGET:  # kvcheck's own target is its name: no torch import needed
        return None
    try:
        with _cwd_on_sys_path():
            return resolve_target(name, available=False)
    except (TargetError, ImportError):
        return None


@contextlib.contextmanager
def _cwd_on_sys_path() -> Iterator[None]:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def keyword(expression: str | None, families: Sequence[str] | None) -> str | None:
    """The -k expression: the families or-ed, and-ed with the user's -k ``expression``.

    Example:
        >>> keyword("move", ["mha", "dsa"])
        '(mha or dsa) and (move)'
        >>> keyword(None, ["dsa"])
        'dsa'
    """
    if not families:
        return expression
    chosen = " or ".join(dict.fromkeys(families))
    return f"({chosen}) and ({expression})" if expression else chosen


def checked_device(spec: str | None) -> str | None:
    """The device ``--device`` (else ``KVCHECK_DEVICE``) names, or None for the default;
    a CUDA device on a machine without one is refused."""
    from kvcheck.runner.devices import DEVICE_ENV_VAR, cuda_problem, parse_device_spec

    if spec is None and not os.environ.get(DEVICE_ENV_VAR, "").strip():
        return None
    try:
        device = parse_device_spec(spec if spec is not None else os.environ[DEVICE_ENV_VAR])
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    if device.startswith("cuda"):
        problem = cuda_problem(device)
        if problem is not None:
            raise UsageProblem(problem)
    return device


def check_database(*, writable: bool) -> Any:
    """The database KVCHECK_DB names; with ``writable``, checked with a probe file."""
    from kvcheck.runner.db import DatabaseSpecError, database_from_env

    try:
        return database_from_env(writable=writable)
    except DatabaseSpecError as exc:
        raise UsageProblem(str(exc)) from exc


def check_output_path(option: str, path: Path) -> None:
    """Refuse before the run a file that could not be written after it: the file is opened
    for appending (created, then removed, when it did not exist), whatever ``os.access``
    claims (``/proc`` passes that check and refuses every new file)."""
    if path.is_dir():
        raise UsageProblem(f"{option} {path}: is a directory; give a file name")
    from kvcheck.runner.db import blocked_directory

    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        blocked = blocked_directory(parent)
        if blocked is not None:
            raise UsageProblem(f"{option} {path}: {blocked}")
        raise UsageProblem(f"{option} {path}: directory {str(parent)!r} does not exist")
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: cannot write there ({exc.strerror or exc})") from exc
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def usable_directory(option: str, path: Path, *, keep: bool = True) -> Path:
    """Create ``path`` and a probe file in it; a UsageProblem saying why when that fails.
    Without ``keep`` the directories it created are removed again (a check before the
    slower ones, which must leave nothing behind if one of them fails)."""
    from kvcheck.runner.db import blocked_directory, probe_directory

    blocked = blocked_directory(path)
    if blocked is not None:
        raise UsageProblem(f"{option} {path}: cannot write there: {blocked}")
    created = [parent for parent in (path, *path.parents) if not parent.exists()]
    try:
        probe_directory(path)
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: cannot write there ({exc.strerror or exc})") from exc
    if not keep:
        for directory in created:  # deepest first
            with contextlib.suppress(OSError):
                directory.rmdir()
    return path.resolve()


def check_workers(workers: str | None) -> None:
    """``-n``: a number of workers, ``auto`` or ``logical``."""
    if workers is None or workers in ("auto", "logical") or workers.isdigit():
        return
    raise UsageProblem(f"-n {workers!r}: expected a number of workers, auto or logical")
