"""The standalone reproductions in ``docs/sglang-repros/`` show their sglang findings on
the releases that have them.

There is one script per bug and undocumented precondition in ``docs/sglang-findings.md``
(``test_sglang_findings_doc.py`` checks the pairing without sglang). Each imports sglang,
torch and the folder's shared CPU helper (``cpu_stand_ins/``; no kvcheck, no Hypothesis;
``test_sglang_repro_scripts.py`` checks that and their length without sglang) and exits 1
printing ``BUG PRESENT: ...`` while the finding is there, 0 printing ``fixed`` once it is
gone (or ``not applicable`` on a release that cannot have it), and 3 printing ``cannot
check here`` where this machine cannot run the check for the installed release (a GPU-only
path). This test requires what the finding's release range (``RELEASES`` in
``kvcheck/targets/sglang/findings.py``) says of the installed release: when a release
fixes a finding, the test fails until the range ends. A script that cannot run (an import
error, a crash, a control step that fails: exit 2) fails the test too: it must reach its
verdict; exit 3 skips, saying why.

Marked ``sglang``: runs only when the kvcheck target is sglang
(``KVCHECK_TARGET=sglang python -m pytest tests/targets``). A script runs in a child of a
warm Python that has imported the helper and sglang's pool module once per test process
(``warm_python.py``: a fresh start is 10-12 s of sglang import per script), or, where it
sets an environment variable before that import, in a fresh Python; ``TESTS_REPROS_FRESH=1``
runs every one fresh, as printed (i10.py and l1.py start more Pythons themselves).
``TESTS_REPROS=differing`` (CI's older releases) runs, on a release older than the newest
known one, only the scripts whose finding holds on some known releases and not others (the
verdicts that change with the release); the scripts of findings that hold on every known
release run on the newest, and their pins check each finding on every release.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from kvcheck.targets.sglang.findings import CLASSES, RELEASES
from kvcheck.targets.sglang.release import KNOWN_RELEASES
from tests.targets.warm_python import WarmPython, run_fresh, runs_warm

pytestmark = pytest.mark.kvcheck_target("sglang")

REPROS = Path(__file__).resolve().parents[2] / "docs" / "sglang-repros"
SCRIPTS = sorted(REPROS.glob("*.py"))
#: Enough for sglang's import on a loaded 2-core machine; a hang still ends the test.
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def warm_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmPython]:
    """One warm Python per test process (``warm_python.py``), started on first use."""
    warm = WarmPython(REPROS, tmp_path_factory.mktemp("warm") / "server.log")
    yield warm
    warm.close()


def test_there_are_reproductions():
    """The folder holds scripts (which ones is the findings document's test's business)."""
    assert {path.stem for path in SCRIPTS} >= {"w1", "c3", "p1", "i10", "h1"}


def finding_of(script: Path) -> str:
    """The finding a script reproduces: its name's id (``i10.py`` belongs to ``I``)."""
    name = script.stem.upper()
    return name if name in RELEASES else name.rstrip("0123456789")


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_reproduction_shows_the_bug(script: Path, warm_python: WarmPython):
    """The script exits 1 saying BUG PRESENT where the installed release has its finding,
    and 0 saying fixed (or not applicable) where it does not, run as a user would."""
    installed = version("sglang")
    releases = RELEASES[finding_of(script)]
    scope = os.environ.get("TESTS_REPROS", "all")
    if scope not in ("all", "differing"):
        pytest.fail(f"TESTS_REPROS={scope!r}: expected 'all' or 'differing'")
    everywhere = all(release in releases for release in KNOWN_RELEASES)
    if scope == "differing" and everywhere and installed != KNOWN_RELEASES[-1]:
        pytest.skip(
            f"TESTS_REPROS=differing: {finding_of(script)} holds on every known release "
            f"({releases.describe()}); its script runs on {KNOWN_RELEASES[-1]}, its pins here"
        )
    if runs_warm(script):
        completed = warm_python.run(script, TIMEOUT_S)
    else:
        completed = run_fresh(script, TIMEOUT_S)
    output = completed.stdout + completed.stderr
    lines = completed.stdout.splitlines()
    if completed.returncode == 3:
        pytest.skip(f"{script.name} on sglang {installed}: {lines[-1] if lines else output}")
    # Exit 1 is also what an uncaught exception gives: the verdict must be the script's.
    assert "Traceback (most recent call last)" not in completed.stderr, completed.stderr[-3000:]
    # A contract difference is no defect: its script says so in its own words.
    present = (
        "CONTRACT DIFFERENCE PRESENT"
        if CLASSES[finding_of(script)] == "contract difference"
        else "BUG PRESENT"
    )
    verdicts = [line for line in lines if line.startswith(present)]
    if installed in releases:
        assert completed.returncode == 1 and len(verdicts) == 1, (
            f"{script.name} exited {completed.returncode} on sglang {installed}; expected 1 "
            f"with one {present} line, as its finding holds for {releases.describe()} (0 and "
            f"'fixed' means sglang fixed it: end its range in RELEASES)\n{output[-3000:]}"
        )
    else:
        assert completed.returncode == 0 and not verdicts, (
            f"{script.name} exited {completed.returncode} on sglang {installed}; expected 0 "
            f"('fixed' or 'not applicable'): its finding holds for {releases.describe()} "
            f"only\n{output[-3000:]}"
        )
        assert lines and lines[-1].startswith(("fixed", "not applicable")), output[-3000:]
