"""A verdict only from evidence (issue 32): what ``kvcheck replay`` and ``verify`` may claim.

A damaged database stops both commands before any test runs and changes nothing; "fixed"
needs every stored example replayed and passing; an example nobody shrank is not called
minimal; and the failure printed in full carries a script wherever any failure does.

The end-to-end tests share one database seeded by a single ``kvcheck verify`` of a buggy
target (a clamp without an upper bound, ``two_targets.py``), copied afresh for each test.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase, choices_to_bytes
from two_targets import BUGGY, environment, write_project

from kvcheck.runner.cli import main
from kvcheck.runner.db import TargetDatabase, _keys_key
from kvcheck.runner.results import EXAMPLE_HEADING, UNSHRUNK_HEADING
from kvcheck.runner.summary import render_verify

FAILING_TEST = "test_clamp.py::test_clamp_at_most_100"
#: The project's property, with a "fix" (``CLAMP_FIX=1``) that no longer draws the stored
#: failing input: the property passes without ever replaying the example that failed.
_SUITE = """
    import os

    from hypothesis import assume, given, strategies as st


    @given(x=st.integers(0, 10_000))
    def test_clamp_at_most_100(kvcheck_target, x):
        if os.environ.get("CLAMP_FIX") == "1":
            assume(x != 101)
            return
        assert (x if kvcheck_target.name == "buggy" else min(x, 100)) <= 100
"""


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(project, database) after one ``kvcheck verify`` stored the buggy target's failure."""
    base = tmp_path_factory.mktemp("evidence")
    root = write_project(base / "project")
    (root / "test_clamp.py").write_text(textwrap.dedent(_SUITE))
    database = base / "db"
    with pytest.MonkeyPatch.context() as patch:
        _environment(patch, root, database, work=base / "seed")
        assert main(["verify", "--target", BUGGY, *_options(root)]) == 1
    return root, database


@pytest.fixture
def project(
    seeded: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The seeded project, with a fresh copy of its database as KVCHECK_DB, from a fresh
    working directory; yields the database copy's path."""
    root, database = seeded
    copy = tmp_path / "db"
    shutil.copytree(database, copy)
    _environment(monkeypatch, root, copy, work=tmp_path / "work")
    yield copy


def _environment(patch: pytest.MonkeyPatch, root: Path, database: Path, *, work: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")) or name in ("CI", "CLAMP_FIX"):
            patch.delenv(name)
    for name, value in environment(root, str(database)).items():
        patch.setenv(name, value)
    patch.syspath_prepend(str(root))
    work.mkdir()
    patch.chdir(work)


def _options(root: Path) -> list[str]:
    return ["--suite", str(root), "--device", "cpu", "-q"]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


# --- item 1: a damaged database stops the command before any test ------------------------------


@pytest.mark.parametrize("damage", ["emptied", "random bytes"])
@pytest.mark.parametrize("command", ["replay", "verify"])
def test_a_damaged_database_stops_before_any_test_and_is_left_as_it_was(
    project: Path,
    seeded: tuple[Path, Path],
    command: str,
    damage: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Every entry emptied (``: > file``) or overwritten with random bytes: replay and verify
    exit 2 with one error line naming the count and the database, run no test, print no
    verdict, and leave every byte of the database (archive included) as it was."""
    rng = random.Random(0)
    for path in sorted(project.rglob("*")):
        if path.is_file():
            path.write_bytes(b"" if damage == "emptied" else rng.randbytes(37))
    before = _snapshot(project)
    capfd.readouterr()
    assert main([command, "--target", BUGGY, *_options(seeded[0])]) == 2
    out, err = capfd.readouterr()
    (line,) = err.strip().splitlines()
    count = re.search(r"holds (\d+) stored examples", line)
    assert count is not None and int(count.group(1)) > 0, line
    assert str(project) in line
    assert "fixed" not in out and "still failing" not in out
    assert not Path(".kvcheck/results.json").exists()  # pytest never ran
    assert _snapshot(project) == before


# --- item 2: "fixed" only when every stored example replayed and passed ------------------------


def test_a_pass_that_never_replayed_the_stored_failure_is_not_fixed(
    project: Path,
    seeded: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A "fix" that rejects the stored failing input (``assume``) passes on the other stored
    examples; replay calls it unconfirmed, not fixed, and exits 2."""
    shared = DirectoryBasedExampleDatabase(project)
    keys = sorted(set(shared.fetch(_keys_key(BUGGY))), key=len)
    # A passing example beside the failing one, so the replay has something valid to run.
    TargetDatabase(shared, BUGGY).save(keys[0], choices_to_bytes((5,)))
    monkeypatch.setenv("CLAMP_FIX", "1")
    capfd.readouterr()
    status = main(["replay", "--target", BUGGY, *_options(seeded[0]), "--json", "out.json"])
    out = capfd.readouterr().out
    verdicts = json.loads(Path("out.json").read_text())["verdicts"]
    assert [v["verdict"] for v in verdicts] == ["unconfirmed"], out
    assert not re.search(rf"^fixed\b.*{re.escape(FAILING_TEST)}", out, re.MULTILINE)
    assert status == 2


# --- item 3: an example that was not shrunk is not called minimal ------------------------------


def test_a_replayed_example_is_not_labelled_minimal(
    project: Path, seeded: tuple[Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    """Replay does not shrink: its still-failing example is headed "Example (not shrunk):",
    in the summary and in results.json."""
    capfd.readouterr()
    assert main(["replay", "--target", BUGGY, *_options(seeded[0])[:-1]]) == 1
    out = capfd.readouterr().out
    assert EXAMPLE_HEADING not in out
    assert f"{UNSHRUNK_HEADING} test_clamp_at_most_100(" in out
    (test,) = json.loads(Path(".kvcheck/results.json").read_text())["tests"]
    assert [failure["shrunk"] for failure in test["failures"]] == [False]


# --- item 4: the failure printed in full carries a script wherever any failure does ------------


def test_replay_finds_a_targets_examples_under_any_spelling_of_it(
    seeded: tuple[Path, Path], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Examples stored by ``--target buggy_target:BuggyTarget`` (the class) are replayed by
    ``--target buggy_target:buggy`` (an instance of it): one target, one set of examples."""
    instance = BUGGY.replace(":BuggyTarget", ":buggy")
    assert main(["replay", "--target", instance, *_options(seeded[0])]) == 1
    assert "still failing" in capsys.readouterr().out


def test_the_failure_in_full_carries_a_script_when_any_failure_has_one() -> None:
    """The smallest failure is an input check without a script; another has one. The summary
    prints a script command, the one of the failure that carries it."""
    input_check = {
        "nodeid": "suite/test_inputs.py::test_rejected_calls_leave_pool_unchanged[mha]",
        "outcome": "failed",
        "failures": [{"error": "AssertionError: accepted", "reproduction": "Minimal example: f()"}],
    }
    with_script = {
        "nodeid": "suite/test_pools.py::test_move_keeps_v[mha]",
        "outcome": "failed",
        "failures": [
            {
                "error": "PropertyFailure: v_buffer differs",
                "reproduction": "Minimal example: test_move_keeps_v(\n    spec=...,\n)",
                "script": ".kvcheck/repros/repro_test_move_keeps_v.py",
                "script_command": "python .kvcheck/repros/repro_test_move_keeps_v.py",
            }
        ],
    }
    text = render_verify({"tests": [input_check, with_script]}, exit_code=1)
    assert "standalone script: python .kvcheck/repros/repro_test_move_keeps_v.py" in text
