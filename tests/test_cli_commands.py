"""Every command kvcheck prints runs as printed, from where the user stands (issue 21).

Each test runs the installed ``kvcheck`` command (the console script beside
``sys.executable``) in a subprocess, from a working directory that holds a folder named
``kvcheck`` (the parent of a clone, like ``~/src``), on small suites so that each takes a
few seconds. Interrupts are sent when the command's output shows the wanted stage: a line
printed by a blocking target module or conftest, or a progress line.
"""

from __future__ import annotations

import os
import runpy
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
KVCHECK = Path(sys.executable).with_name("kvcheck")

_SUITE = """
    from kvcheck.failures import PropertyFailure, Reproduction
    from kvcheck.specs import Move, PoolSpec, WriteKV

    SPEC = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16", head_dim=2)


    def test_move_keeps_v():
        write = WriteKV(layer_id=0, locs=(3,), k_rows=(bytes(range(49, 53)),),
                        v_rows=(bytes(range(57, 61)),))
        ops = (write, Move(tgt=(5,), src=(3,)))
        raise PropertyFailure("v_buffer differs", reproduction=Reproduction(SPEC, ops))
"""
#: A target module in the working directory serving kvcheck's MHA pool with a move that
#: forgets V (tests/broken_pools.py), as a user's module:attr target would.
_TARGET = f"""
    import sys

    sys.path.insert(0, {str(TESTS_DIR)!r})
    from repro_targets import MOVE_IGNORES_V as target  # noqa: E402
"""
_BLOCKING_SUITE = """
    import signal


    def test_first():
        pass


    def test_waits_for_the_interrupt():
        signal.pause()  # returns when the interrupt arrives (KeyboardInterrupt)
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory holding a folder named kvcheck, and a clean environment."""
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")) or name in ("CI", "PYTHONPATH"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    work = tmp_path / "src"
    (work / "kvcheck").mkdir(parents=True)  # like ~/src/kvcheck, a clone: no __init__.py
    assert KVCHECK.is_file(), f"no kvcheck command beside {sys.executable}"
    yield work


def _suite(directory: Path, source: str, *, conftest: str | None = None) -> Path:
    directory.mkdir()
    (directory / "test_it.py").write_text(textwrap.dedent(source))
    if conftest is not None:
        (directory / "conftest.py").write_text(textwrap.dedent(conftest))
    return directory


def _kvcheck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KVCHECK), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """The command in a session of its own (as a terminal runs it), its output piped."""
    return subprocess.Popen(
        [str(KVCHECK), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _read_until(process: subprocess.Popen[str], wanted: str) -> list[str]:
    """The command's output lines up to the first that starts with ``wanted``."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(wanted):
            return seen
    raise AssertionError(f"the command ended before printing {wanted!r}: {''.join(seen)}")


# --- reproduction scripts -----------------------------------------------------------------------


def test_module_target_script_runs_as_printed_from_where_verify_ran(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a directory holding a kvcheck folder and a module:attr target, verify runs the
    suite, and the printed script command reproduces the bug (exit 1) as printed, there and
    (by its absolute path) from any other directory."""
    (workdir / "mypool.py").write_text(textwrap.dedent(_TARGET))
    suite = _suite(tmp_path / "suite", _SUITE)
    done = _kvcheck("verify", "--suite", str(suite), "--target", "mypool:target", cwd=workdir)
    assert done.returncode == 1, done.stdout + done.stderr
    (command,) = [
        line.split("standalone script: ", 1)[1]
        for line in done.stdout.splitlines()
        if "standalone script: " in line
    ]
    here = subprocess.run(command, shell=True, cwd=workdir, capture_output=True, text=True)
    assert here.returncode == 1, here.stderr
    assert "REPRODUCED: pool.v_buffer[0] (layer_id 0) row 5" in here.stderr
    # From elsewhere, in this process (it has torch imported already): what `python
    # /abs/path/script.py` runs, with sys.path and sys.modules put back afterwards.
    script = workdir / shlex.split(command)[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [str(script.parent), *sys.path])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    with pytest.raises(SystemExit) as there:
        runpy.run_path(str(script), run_name="__main__")
    assert str(there.value.code).startswith("REPRODUCED: pool.v_buffer[0] (layer_id 0) row 5")


# --- checks before the run ---------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("option", ["--json", "--junit-xml", "--results-dir", "--repro-dir"])
def test_an_output_path_under_proc_is_refused_before_the_run(workdir: Path, option: str) -> None:
    """/proc passes an os.access check but takes no new file: every output path is probed
    by writing there, and the command stops before pytest starts."""
    done = _kvcheck("verify", option, "/proc/kvcheck-out", cwd=workdir)
    assert done.returncode == 2
    assert f"{option} /proc/kvcheck-out: cannot write there" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (workdir / ".kvcheck" / "pytest.log").exists()  # pytest never started


def _unavailable_cuda() -> str:
    import torch

    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


def test_a_missing_device_is_refused_before_pytest_starts(workdir: Path) -> None:
    """A device this machine lacks is reported by the command itself (exit 2) before pytest
    starts. (A -k that selects no test is pytest's to find: tests/test_cli.py.)"""
    done = _kvcheck("verify", "--device", _unavailable_cuda(), cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "device=" in done.stderr
    assert not (workdir / ".kvcheck" / "pytest.log").exists()  # pytest never started


# --- interrupts --------------------------------------------------------------------------------


def test_an_interrupt_during_the_run_prints_what_ran_and_exits_130(
    workdir: Path, tmp_path: Path
) -> None:
    """`timeout -s INT` signals the command, then its process group (the second half is a
    terminal's Ctrl-C): pytest gets one SIGINT and stops, the summary of what ran is
    printed, no traceback, exit 130. (SIGTERM, a CI cancel, takes the same path: below.)"""
    suite = _suite(tmp_path / "blocking", _BLOCKING_SUITE)
    process = _start("verify", "--suite", str(suite), "--device", "cpu", cwd=workdir)
    seen = _read_until(process, "[1/2]")
    process.send_signal(signal.SIGINT)
    os.killpg(process.pid, signal.SIGINT)
    rest, errors = process.communicate(timeout=120)
    out = "".join(seen) + rest
    assert process.returncode == 130, out + errors
    assert "INTERRUPTED" in out and "1 property passed" in out
    assert out.rstrip().endswith("exit 130") and "2 passed" not in out
    assert "Traceback" not in out + errors


_BLOCKING_TARGET = """
    import signal

    print("importing the target", flush=True)
    signal.pause()
"""
_BLOCKING_CONFTEST = """
    import signal

    print("loading the suite's conftest", flush=True)
    signal.pause()
"""


@pytest.mark.parametrize(
    ("stage", "number"),
    [
        ("checks", signal.SIGINT),
        ("checks", signal.SIGTERM),
        ("pytest start-up", signal.SIGINT),  # passed on as during the run, whatever came
    ],
    ids=["checks-INT", "checks-TERM", "start-up-INT"],
)
def test_an_interrupt_before_any_test_exits_130_without_a_traceback(
    workdir: Path, tmp_path: Path, stage: str, number: int
) -> None:
    """SIGINT or SIGTERM to the command while it imports the target, or while pytest starts
    (loading the suite's conftest): exit 130, no traceback, nothing counted as run."""
    if stage == "checks":
        (workdir / "blocker.py").write_text(textwrap.dedent(_BLOCKING_TARGET))
        args, wanted = ["--target", "blocker:target"], "importing the target"
    else:
        suite = _suite(tmp_path / "slow", _BLOCKING_SUITE, conftest=_BLOCKING_CONFTEST)
        # --verbose -s: pytest's output (the conftest's line) streams to the command's.
        args, wanted = ["--suite", str(suite), "--verbose", "--", "-s"], "loading the suite's"
    process = _start("verify", "--device", "cpu", *args, cwd=workdir)
    seen = _read_until(process, wanted)
    process.send_signal(number)
    rest, errors = process.communicate(timeout=120)
    out = "".join(seen) + rest
    assert process.returncode == 130, out + errors
    assert "Traceback" not in out + errors
    assert "passed" not in out
