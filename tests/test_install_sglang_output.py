"""``scripts/install_sglang.sh`` prints only what matters (issue 36, "What was seen" item
4): pip's dependency-resolver block (sglang's own CUDA pins, left out on purpose) becomes
one line saying it is expected, anything else pip says is kept, a failing pip shows all
of its output, and the last line says what was installed and how to run the target.

pip is a stand-in here (a ``PYTHON`` that answers ``-m pip`` with canned output and runs
the real interpreter otherwise), so nothing is downloaded or installed; the release asked
for is one the environment does not hold, so the recipe does call pip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from kvcheck.targets.sglang.release import KNOWN_RELEASES

RECIPE = Path(__file__).parents[1] / "scripts" / "install_sglang.sh"
RESOLVER_BLOCK = """\
ERROR: pip's dependency resolver does not currently take into account all the packages \
that are installed. This behaviour is the source of the following dependency conflicts.
sglang 0.5.22 requires torch==2.14.1, but you have torch 2.13.0+cpu which is incompatible.
sglang 0.5.22 requires flashinfer-python==0.6.1, which is not installed.
sglang 0.5.22 requires sgl-kernel==0.4.0, which is not installed.
"""


def _installed_torch() -> str | None:
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _other_release() -> str | None:
    """A known release other than the installed sglang (so the recipe calls pip)."""
    try:
        installed = version("sglang")
    except PackageNotFoundError:
        installed = None
    others = [release for release in KNOWN_RELEASES if release != installed]
    return others[-1] if others else None


pytestmark = [
    pytest.mark.skipif(shutil.which("bash") is None, reason="the recipe is a bash script"),
    pytest.mark.skipif(_installed_torch() is None, reason="the recipe needs an installed torch"),
]


def _run(tmp_path: Path, pip_output: str, pip_status: int = 0) -> subprocess.CompletedProcess[str]:
    canned = tmp_path / "pip-output.txt"
    canned.write_text(pip_output)
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m pip" ]; then\n'
        f"  cat {canned}\n"
        f"  exit {pip_status}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    torch = (_installed_torch() or "").split("+")[0]
    env = {
        **os.environ,
        "PYTHON": str(fake),
        "KVCHECK_TORCH_PIN": torch,
        "KVCHECK_SGLANG_VERSION": _other_release() or "",
    }
    return subprocess.run(
        ["bash", str(RECIPE)], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_the_resolver_block_becomes_one_line_and_the_last_says_what_to_run(
    tmp_path: Path,
) -> None:
    """pip's resolver block is one line saying why it is expected; other pip lines stay;
    the last line names the release, the kept torch and the command to run."""
    done = _run(tmp_path, RESOLVER_BLOCK + "WARNING: a pip warning kvcheck does not own\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "dependency resolver" not in out and "requires torch" not in out
    assert out.count("pip lists 3 of sglang's own pins as conflicts") == 2  # one per pip call
    assert "the CPU torch is kept on purpose" in out
    assert "WARNING: a pip warning kvcheck does not own" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"install_sglang: installed sglang {_other_release()} ")
    assert "kvcheck verify --target sglang" in last and "untouched" in last


def test_a_clean_install_prints_no_conflict_line(tmp_path: Path) -> None:
    """Without a resolver block there is no line about conflicts."""
    done = _run(tmp_path, "")
    assert done.returncode == 0, done.stderr
    assert "conflicts" not in done.stdout


def test_a_failing_pip_shows_all_its_output(tmp_path: Path) -> None:
    """A pip that fails has its whole output shown, and the recipe stops saying so."""
    done = _run(tmp_path, RESOLVER_BLOCK + "ERROR: No matching distribution\n", pip_status=1)
    assert done.returncode == 1
    assert "ERROR: No matching distribution" in done.stderr
    assert "requires torch==2.14.1" in done.stderr
    assert "pip install failed (exit 1" in done.stderr
