"""The standalone reproductions in ``docs/sglang-repros/`` still show their sglang findings.

There is one script per bug and undocumented precondition in ``docs/sglang-findings.md``
(``test_sglang_findings_doc.py`` checks the pairing without sglang). Each imports sglang
and torch alone (no kvcheck, no Hypothesis) and exits 1 printing ``BUG PRESENT: ...``
while the finding is there, 0 printing ``fixed`` once it is gone. This test requires the
finding: when a sglang release fixes one, the test fails, and the finding's entry and its
script move to "fixed in". A script that cannot run (an import error, a crash, a control
step that fails: exit 2) fails the test too: it must reach its verdict.

Marked ``sglang``: runs only when the kvcheck target is sglang
(``KVCHECK_TARGET=sglang python -m pytest tests/targets``). Each script starts a fresh
Python that imports sglang (7-15 s on a quiet machine; i10.py and l1.py start two more).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kvcheck_target("sglang")

REPROS = Path(__file__).resolve().parents[2] / "docs" / "sglang-repros"
SCRIPTS = sorted(REPROS.glob("*.py"))
#: Enough for sglang's import on a loaded 2-core machine; a hang still ends the test.
TIMEOUT_S = 600


def test_there_are_reproductions():
    """The folder holds scripts (which ones is the findings document's test's business)."""
    assert {path.stem for path in SCRIPTS} >= {"w1", "c3", "p1", "i10", "h1"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_reproduction_shows_the_bug(script: Path):
    """The script exits 1 saying BUG PRESENT, run as a user would, outside kvcheck."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("KVCHECK")}
    env.pop("PYTHONPATH", None)  # sglang alone: the script must not need kvcheck
    completed = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=script.parent,
        check=False,
    )
    output = completed.stdout + completed.stderr
    verdicts = [line for line in completed.stdout.splitlines() if line.startswith("BUG PRESENT")]
    assert completed.returncode == 1 and len(verdicts) == 1, (
        f"{script.name} exited {completed.returncode}; expected 1 with one BUG PRESENT line "
        f"(0 and 'fixed' means sglang fixed it: update docs/sglang-findings.md)\n"
        f"{output[-3000:]}"
    )
    # Exit 1 is also what an uncaught exception gives: the verdict must be the script's.
    assert "Traceback (most recent call last)" not in completed.stderr, completed.stderr[-3000:]
