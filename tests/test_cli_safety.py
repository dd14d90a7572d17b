"""The kvcheck command never passes silently: bad output paths, unusable databases, lost
saves, misspelled variables, targets in the current directory, and the plumbing that turns a
failure's reproduction data into a standalone script (with a fake ``kvcheck.runner.repro``).

Checks that stop before pytest starts run in-process; the others run small pytest suites.
Interrupts, and the printed commands run as printed, are in ``test_cli_commands.py``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from kvcheck.failures import (
    FailureSignature,
    PropertyFailure,
    Reproduction,
    reproduction_from_json,
)
from kvcheck.runner import cli, preflight, repro
from kvcheck.runner.repro_scripts import python_command, write_repro_scripts
from kvcheck.runner.results import failures_from_exception
from kvcheck.runner.summary import render_verify
from kvcheck.specs import Move, PoolSpec

_LEAKY_PREFIXES = ("KVCHECK_", "PYTEST_XDIST_")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No KVCHECK_*/CI/xdist settings from the outer run; a fresh working directory."""
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in ("CI", "GITHUB_ACTIONS"):
            monkeypatch.delenv(name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


@pytest.fixture
def fake_repro(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in for kvcheck.runner.repro with the agreed API (reproduction data -> script)."""
    module = types.ModuleType("kvcheck.runner.repro")

    def render_script(data: dict[str, Any], *, target: str, import_root: Any = None) -> str:
        return f"# {target}\nDATA = {data!r}\n"

    module.render_script = render_script  # type: ignore[attr-defined]
    module.script_name = repro.script_name  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvcheck.runner.repro", module)
    return module


# --- before the run -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "make", "message"),
    [
        ("--json", lambda d: str(d / "no" / "such" / "out.json"), "does not exist"),
        ("--junit-xml", lambda d: str(d / "no" / "out.xml"), "does not exist"),
        ("--json", lambda d: str(d), "is a directory"),
    ],
    ids=["json-missing-dir", "junit-missing-dir", "json-is-dir"],
)
def test_bad_output_path_exits_2_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str, make: Any, message: str
) -> None:
    """An output file that could not be written is refused before pytest starts."""
    assert cli.main(["verify", option, make(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and option in captured.err
    assert "running" not in captured.out  # nothing ran


def test_unwritable_database_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A KVCHECK_DB directory that cannot be created stops verify, naming it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("KVCHECK_DB", str(blocker / "db"))
    assert cli.main(["verify"]) == 2
    assert f"cannot write failing examples to '{blocker / 'db'}'" in capsys.readouterr().err


def test_results_dir_that_is_a_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--results-dir must be a directory kvcheck can write to."""
    (tmp_path / "taken").write_text("x")
    assert cli.main(["verify", "--results-dir", str(tmp_path / "taken")]) == 2
    assert "--results-dir" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing", "empty", "undecodable"])
def test_replay_refuses_a_database_with_nothing_to_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str
) -> None:
    """A mistyped path, an empty database or junk entries: exit 2 with counts, never 0
    (junk is damage: replay stops before any test, tests/test_verdict_evidence.py)."""
    db = tmp_path / "db"
    if case != "missing":
        db.mkdir()
    if case == "undecodable":
        for index in range(3):
            DirectoryBasedExampleDatabase(db).save(b"key", bytes([255, index]))
    # A mistyped path is a subdirectory that was never written: the shared part must exist.
    monkeypatch.setenv("KVCHECK_DB", str(db))
    assert cli.main(["replay"]) == 2
    error = capsys.readouterr().err
    if case == "undecodable":
        assert "holds 3 stored examples" in error and "cannot be read or decoded" in error
    else:
        assert "nothing to replay" in error and "holds no stored examples" in error


def test_unknown_variable_warns_with_did_you_mean(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCHECK_TARGE (typo) is named on stderr with the variable it probably meant."""
    monkeypatch.setenv("KVCHECK_TARGE", "sglang")
    assert cli.main(["verify", "--target", "bogus"]) == 2
    assert "did you mean KVCHECK_TARGET?" in capsys.readouterr().err


def test_module_target_resolves_from_the_current_directory() -> None:
    """module:attr is imported from the current directory, as `python -m pytest` does."""
    Path("mymod_kvcheck_cwd.py").write_text(
        "from kvcheck.targets.builtin import KVCheckTarget\ntarget = KVCheckTarget()\n"
    )
    try:
        target, root = preflight.checked_target("mymod_kvcheck_cwd:target")
    finally:
        sys.modules.pop("mymod_kvcheck_cwd", None)
    assert (target, root) == ("mymod_kvcheck_cwd:target", os.getcwd())
    assert os.getcwd() not in sys.path  # only for the resolution


def test_family_becomes_a_keyword_and_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    """--family F selects tests whose id contains F; unknown families are usage errors."""
    assert preflight.keyword(None, ["dsa", "mla"]) == "dsa or mla"
    assert preflight.keyword("move", ["dsa"]) == "(dsa) and (move)"
    assert cli.main(["verify", "--family", "gqa"]) == 2
    assert "invalid choice: 'gqa'" in capsys.readouterr().err


# --- reproduction scripts (plumbing, with a fake kvcheck.runner.repro) ---------------------


def test_failure_entry_carries_signature_and_reproduction_data() -> None:
    """A PropertyFailure's signature and reproduction reach its results entry."""
    spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
    reproduction = Reproduction(spec=spec, ops=(Move(tgt=(1,), src=(2,)),))
    error = PropertyFailure(
        "k_buffer[layer 0] row 3 byte 5 is 0x01 but should be 0x00 [move_kv_cache]\n1 byte differs",
        signature=FailureSignature(check="bytes", call="move_kv_cache", kind="bytes differ"),
        reproduction=reproduction,
    )
    error.add_note("Failing test case: test_move(\n    family='mha',\n)")
    entry = failures_from_exception(error)[0]
    assert reproduction_from_json(entry["reproduction_data"]) == reproduction
    assert entry["signature"] == {
        "check": "bytes",
        "call": "move_kv_cache",
        "kind": "bytes differ",
        "family": "",
    }
    assert entry["reproduction"].startswith("Minimal example: test_move(")


@pytest.mark.parametrize(
    "heading",
    ["Failing test case: <state machine>", "Falsifying example:"],
    ids=["one-note", "bare-heading"],
)
def test_a_state_machine_heading_is_read_in_either_hypothesis_shape(heading: str) -> None:
    """Hypothesis heads a failing state machine's steps with "Failing test case: <state
    machine>" (newer releases) or a bare "Falsifying example:" (6.139, the declared floor),
    the steps in the notes after it: either way the heading is kvcheck's, once, first, and
    the steps follow."""
    error = AssertionError("boom")
    for note in (heading, "state = M()", "state.boom()"):
        error.add_note(note)
    entry = failures_from_exception(error)[0]
    lines = entry["reproduction"].splitlines()
    assert lines[0].startswith("Minimal example:") and lines[1:] == ["state = M()", "state.boom()"]
    assert not any("Falsifying" in line or "Failing test" in line for line in lines)


def _failing_results(**failure: Any) -> dict[str, Any]:
    return {
        "tests": [
            {
                "nodeid": "suite/test_pools.py::test_move[mha-2]",
                "outcome": "failed",
                "failures": [{"error": "PropertyFailure: got 1 but should be 0", **failure}],
            },
            {"nodeid": "suite/test_pools.py::test_ok", "outcome": "passed"},
        ]
    }


def test_scripts_are_written_per_failure_and_shown(
    fake_repro: types.ModuleType, tmp_path: Path
) -> None:
    """Each failure with reproduction data gets repro_<test>.py; the summary shows its path."""
    results = _failing_results(reproduction_data={"calls": ["move"], "family": "mha"})
    note = write_repro_scripts(results, repro_dir=tmp_path / "repros", target="sglang")
    assert note is None
    script = tmp_path / "repros" / "repro_test_move_mha_2.py"
    assert script.read_text().startswith("# sglang\n")
    failure = results["tests"][0]["failures"][0]
    assert failure["script"] == str(script)
    assert failure["script_command"] == f"{python_command()} {script}"
    assert f"standalone script: {python_command()} {script}" in render_verify(results, exit_code=1)


def test_script_notes_when_nothing_to_write(tmp_path: Path) -> None:
    """Without reproduction data no folder is created and the note says why."""
    note = write_repro_scripts(_failing_results(), repro_dir=tmp_path / "r", target="kvcheck")
    assert note is not None and "no failure carried reproduction data" in note
    assert not (tmp_path / "r").exists()


# --- end to end (pytest subprocesses) --------------------------------------------------------


_CONFTEST = """
    import os
    import sys
    import types

    # The standalone-script renderer, faked so the plumbing is tested on its own.
    fake = types.ModuleType("kvcheck.runner.repro")
    fake.reproduction_to_json = lambda rep: dict(rep)
    fake.render_script = lambda data, *, target, **_: f"# {target}\\nDATA = {data!r}\\n"
    sys.modules["kvcheck.runner.repro"] = fake

    if os.environ.get("REFUSE_SAVES"):
        from kvcheck.runner.db import StrictDirectoryDatabase

        def refuse(self, key, value):
            raise PermissionError(13, "Permission denied (simulated)")

        StrictDirectoryDatabase.save = refuse
"""
_SUITE = """
    from hypothesis import given, strategies as st

    from kvcheck.failures import PropertyFailure, Reproduction
    from kvcheck.specs import Move, PoolSpec

    SPEC = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")

    @given(st.integers(0, 1000))
    def test_small(x):
        if x >= 7:
            ops = (Move(tgt=(1,), src=(x % 4,)),)
            raise PropertyFailure(f"got {x} but should be below 7",
                                  reproduction=Reproduction(spec=SPEC, ops=ops))

    def test_fine():
        pass
"""


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    root = tmp_path / "suite"
    root.mkdir()
    (root / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (root / "test_small.py").write_text(textwrap.dedent(_SUITE))
    return root


def test_verify_writes_a_script_per_failure(
    suite: Path,
    fake_repro: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """verify writes repro_<test>.py under .kvcheck/repros and prints its path; a failed
    save of the failing example is listed and makes the exit status 2."""
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    monkeypatch.setenv("REFUSE_SAVES", "1")
    status = cli.main(
        ["verify", "--suite", str(suite), "--device", "cpu", "--", "-p", "no:randomly"]
    )
    out = capfd.readouterr().out
    assert f"standalone script: {python_command()} .kvcheck/repros/repro_test_small.py" in out
    script = Path(".kvcheck/repros/repro_test_small.py").read_text()
    assert script.startswith("# kvcheck\nDATA = ") and "'src': [3]" in script
    assert "DATABASE ERROR: the failing examples of 1 test could not be saved" in out
    assert "test_small.py::test_small: PermissionError" in out
    assert out.count("Permission denied (simulated)") == 1  # repeated reasons said once
    assert status == 2
    results = json.loads(Path(".kvcheck/results.json").read_text())
    failing = next(t for t in results["tests"] if t["outcome"] == "failed")
    assert failing["failures"][0]["reproduction_data"]["ops"] == [
        {"op": "Move", "tgt": [1], "src": [3]}
    ]


@pytest.fixture(autouse=True)
def _forget_modules() -> Iterator[None]:
    yield
    sys.modules.pop("mymod_kvcheck_cwd", None)
