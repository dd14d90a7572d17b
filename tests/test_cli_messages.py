"""The messages a newcomer meets first say what to do (issue 36, "What was seen" item 8):
a did-you-mean for a mistyped target, "has no attribute" once, the traceback of a target
module that raised with -v, an output path under a file, KVCHECK_DB on a dangling link,
the fp8 dtype names for a bare ``fp8``, ``--`` in the run commands' help, and one wording
for a byte that differs in verify's failure and in the reproduction script; and (item 7)
the elapsed time on each progress line.

Every check here stops before pytest starts, so each runs in well under a second.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvcheck.failures import PropertyFailure
from kvcheck.properties.assertions import assert_bytes_equal
from kvcheck.runner.cli import main


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No KVCHECK_* setting of the outer run reaches the command."""
    for name in list(os.environ):
        if name.startswith("KVCHECK_"):
            monkeypatch.delenv(name)


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``my_kv_pkg`` in the working directory: ``kv`` defines ``MyTarget``,
    ``broken`` raises on import."""
    package = tmp_path / "my_kv_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kv.py").write_text("class MyTarget:\n    pass\n")
    (package / "broken.py").write_text(
        textwrap.dedent(
            """
            def _load_weights():
                raise RuntimeError("weights file missing")

            _load_weights()
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    yield package
    for name in [name for name in sys.modules if name.startswith("my_kv_pkg")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("typed", "meant"), [("sglnag", "sglang"), ("kvchek", "kvcheck"), ("SGLang", "sglang")]
)
def test_a_mistyped_target_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], typed: str, meant: str
) -> None:
    """--target with a near miss of a built-in name suggests that name."""
    assert main(["verify", "--target", typed]) == 2
    assert f"unknown target {typed!r} (did you mean {meant!r}?)" in capsys.readouterr().err


def test_a_missing_attribute_is_named_once_with_the_nearest_name(
    capsys: pytest.CaptureFixture[str], user_package: Path
) -> None:
    """module:attr with a misspelt attribute says "has no attribute" once and suggests the
    module's nearest name."""
    assert main(["verify", "--target", "my_kv_pkg.kv:MyTargte"]) == 2
    error = capsys.readouterr().err
    assert error.count("has no attribute") == 1
    assert "module 'my_kv_pkg.kv' has no attribute 'MyTargte' (did you mean 'MyTarget'?)" in error


def test_a_target_module_that_raises_shows_its_traceback_with_verbose(
    capsys: pytest.CaptureFixture[str], user_package: Path
) -> None:
    """A target module that raises on import: one line that points at -v; with -v, the
    traceback down to the user's own line."""
    assert main(["verify", "--target", "my_kv_pkg.broken:target"]) == 2
    short = capsys.readouterr().err
    assert "RuntimeError: weights file missing" in short and "-v shows its traceback" in short
    assert "Traceback" not in short
    assert main(["verify", "-v", "--target", "my_kv_pkg.broken:target"]) == 2
    full = capsys.readouterr().err
    assert "Traceback (most recent call last)" in full
    assert "_load_weights" in full and str(user_package / "broken.py") in full


def test_a_missing_import_inside_the_target_module_is_its_own_error(
    capsys: pytest.CaptureFixture[str], user_package: Path
) -> None:
    """A target module that exists but imports a missing package gets the traceback pointer
    (the module was found; its import line is the problem)."""
    (user_package / "needs.py").write_text("import no_such_dependency_kv\n")
    assert main(["verify", "--target", "my_kv_pkg.needs:target"]) == 2
    error = capsys.readouterr().err
    assert "No module named 'no_such_dependency_kv'" in error and "-v shows" in error


def test_an_output_path_under_a_file_says_the_parent_is_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--json FILE whose parent is a file says it is a file, not that it does not exist."""
    (tmp_path / "hostname").write_text("box\n")
    target = tmp_path / "hostname" / "out.json"
    assert main(["verify", "--json", str(target)]) == 2
    error = capsys.readouterr().err
    assert f"{str(tmp_path / 'hostname')!r} is a file, not a directory" in error
    assert "does not exist" not in error


def test_a_database_on_a_dangling_symlink_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCHECK_DB naming a symbolic link to nowhere names the link and where it points."""
    link = tmp_path / "examples"
    link.symlink_to(tmp_path / "gone" / "db")
    monkeypatch.setenv("KVCHECK_DB", str(link))
    assert main(["verify"]) == 2
    error = capsys.readouterr().err
    assert "is a symbolic link to" in error and "which does not exist" in error
    assert "FileExistsError" not in error and "permissions" not in error


@pytest.mark.parametrize(
    ("dtype", "suggested"),
    [
        ("fp8", "'fp8_e4m3', 'fp8_e5m2', 'float8_e4m3fn' or 'float8_e5m2'"),
        ("float8", "'float8_e4m3fn' or 'float8_e5m2'"),
    ],
)
def test_a_bare_fp8_dtype_suggests_the_fp8_names(
    capsys: pytest.CaptureFixture[str], dtype: str, suggested: str
) -> None:
    """memory-report --dtype fp8 suggests the fp8 dtypes, not the nearest string mxfp8."""
    assert main(["memory-report", "--dtype", dtype]) == 2
    error = capsys.readouterr().err
    assert f"(did you mean {suggested}?)" in error
    assert "did you mean 'mxfp8'" not in error


def test_replay_help_lists_only_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    """replay --help has no --call-floor (replay has none) and says where pytest's
    arguments go."""
    assert main(["replay", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--call-floor" not in out and "--target" in out
    assert "Arguments after -- go to pytest" in " ".join(out.split())


def test_verify_help_mentions_the_pytest_separator(capsys: pytest.CaptureFixture[str]) -> None:
    """verify --help says that arguments after -- go to pytest, with an example."""
    assert main(["verify", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Arguments after -- go to pytest as they are, e.g. kvcheck verify -- -x" in out


def test_a_differing_byte_reads_as_the_reproduction_script_reads_it() -> None:
    """verify's byte difference uses the script's words: ``row R byte B is 0x01 but
    should be 0x00``, with the call and the count of differing bytes."""
    expected = np.zeros((4, 8), dtype=np.uint8)
    got = expected.copy()
    got[2, 5] = 1
    got[3, 0] = 7
    with pytest.raises(PropertyFailure) as caught:
        assert_bytes_equal(got, expected, what="k_buffer[0]", call="pool.set_kv_buffer(...)")
    first, second = str(caught.value).splitlines()
    assert first == "k_buffer[0] row 2 byte 5 is 0x01 but should be 0x00 [pool.set_kv_buffer(...)]"
    assert second == "2 bytes differ"


def test_the_reproduction_script_uses_the_same_byte_wording() -> None:
    """The script's expect_bytes says the same words (it is text inside the script)."""
    from kvcheck.runner import repro

    source = Path(repro.__file__).read_text()
    assert "row {row} byte {byte} is 0x{int(got[row, byte]):02x} but should be" in source


def test_a_progress_line_off_a_terminal_says_how_long_the_run_has_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 7: off a terminal each progress line carries the elapsed seconds, so a long
    run (``--target sglang``) gives a sense of its length while it goes."""
    from kvcheck.runner.launch import SuiteRun

    run = SuiteRun(command="verify", verbosity=0, log_path=tmp_path / "pytest.log")
    run._tty = False  # capsys is no terminal either; said here so the test reads alone
    run.total = 4
    run.counts["passed"] = 1
    run._progress("tests/test_x.py::test_a")
    assert capsys.readouterr().out.strip() == "[1/4] 1 passed at 0 s"
