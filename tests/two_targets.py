"""A tiny suite whose one property fails on one target only (a helper, not tests).

The property reads the target under test: ``buggy_target:BuggyTarget`` has a clamp without
an upper bound, the built-in target a correct one. Two targets sharing one example database
is then the data-loss scenario of a shared CI database: a run of the healthy target must
not replay, shrink or delete what the buggy one stored.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

#: The target that fails, as ``module:attr``, importable once :func:`write_project` ran.
BUGGY = "buggy_target:BuggyTarget"
#: The failing property's node id inside the project.
FAILING_TEST = "test_clamp.py::test_clamp_at_most_100"

_SUITE = """
    from hypothesis import given, strategies as st


    def clamp(target, x):
        return x if target.name == "buggy" else min(x, 100)


    @given(x=st.integers(0, 10_000))
    def test_clamp_at_most_100(kvcheck_target, x):
        assert clamp(kvcheck_target, x) <= 100
"""
_TARGET = """
    from kvcheck.targets.builtin import KVCheckTarget


    class BuggyTarget(KVCheckTarget):
        name = "buggy"


    buggy = BuggyTarget()  # the same target, spelled as an instance
"""


def write_project(root: Path) -> Path:
    """Write the suite and the buggy target under ``root``; return ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "test_clamp.py").write_text(textwrap.dedent(_SUITE))
    (root / "buggy_target.py").write_text(textwrap.dedent(_TARGET))
    return root


def environment(root: Path, database: str) -> dict[str, str]:
    """The environment of a run of the project against ``database`` (a ``KVCHECK_DB``)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("KVCHECK_", "PYTEST_XDIST_")) and name != "CI"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["KVCHECK_DB"] = database
    return env
