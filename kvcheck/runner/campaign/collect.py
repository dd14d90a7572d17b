"""What the suite holds for this target: its tests, as the campaign plans them.

The driver collects the suite once, in a pytest subprocess run as a shard would be run
(same target, device and selection), with :mod:`kvcheck.runner.campaign.pytest_plugin`
writing each collected test, the argument that runs it alone and its collection-time
skip. Nothing runs.

Example:
    >>> properties_from_plan({"tests": [{"nodeid": "a.py::t", "module": "a", "function": "t"}]})
    [Property(nodeid='a.py::t', module='a', function='t', skip=None)]
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvcheck.runner.campaign.plan import Property
from kvcheck.runner.campaign.pytest_plugin import PLAN_OPTION
from kvcheck.runner.campaign.shard import ShardContext, shard_environment, working_directory

__all__ = ["CollectionError", "collect_properties", "properties_from_plan"]

_LOG_TAIL_LINES = 25


class CollectionError(Exception):
    """The suite could not be collected; the message ends with pytest's own output."""


def collect_properties(context: ShardContext, *, keyword: str | None) -> list[Property]:
    """The tests of ``context``'s suite that ``keyword`` (pytest ``-k``) selects, in the
    order the suite runs them. Raises :class:`CollectionError` with pytest's reason."""
    from kvcheck.runner.launch import pytest_command

    with tempfile.TemporaryDirectory(prefix="kvcheck-campaign-collect-") as scratch:
        plan_path = Path(scratch) / "plan.json"
        command = pytest_command(
            suite=context.suite,
            target=context.target,
            device=context.device,
            profile=None,
            workers=None,
            junit_xml=None,
            keyword=keyword,
            results_path=Path(scratch) / "results.json",
            import_dir=working_directory(context.cwd),
            extra=[
                "--collect-only",
                "-q",
                "-p",
                "kvcheck.runner.campaign.pytest_plugin",
                f"{PLAN_OPTION}={plan_path}",
                *context.pytest_args,
            ],
        )
        finished = subprocess.run(
            command,
            cwd=working_directory(context.cwd),
            env=shard_environment(context),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            plan = json.loads(plan_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            plan = None
    # pytest exits 5 when -k selects nothing: the plan (empty) says so better.
    if plan is None or finished.returncode not in (0, 5):
        output = (finished.stdout + finished.stderr).strip().splitlines()[-_LOG_TAIL_LINES:]
        raise CollectionError(
            f"collecting {context.suite} for target {context.target!r} failed (pytest exit "
            f"{finished.returncode}); its output ends:\n"
            + "\n".join(f"    {line}" for line in output)
        )
    return properties_from_plan(plan)


def properties_from_plan(plan: Mapping[str, Any]) -> list[Property]:
    """The :class:`Property` list of a plan file's content."""
    return [
        Property(
            nodeid=str(test["nodeid"]),
            module=str(test["module"]),
            function=str(test["function"]),
            skip=None if test.get("skip") is None else str(test["skip"]),
        )
        for test in plan.get("tests", ())
    ]
