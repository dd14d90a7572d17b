"""Every shell command in README.md and docs/ runs, or is marked as one that cannot run here.

A command is a line of a ``bash`` block (with its backslash continuations). One that needs
the network, a GPU, a cluster, sglang, a stored failure or minutes carries a visible marker
comment on its line, ``# [needs network; takes 2 min]``; a marker on a comment line before
a block's first command (a script's header) marks the whole block. Each block's unmarked
commands run here, in order, in a scratch directory that sees the clone's folders, and must
exit 0; commands that must not run unmarked (installs, the suite, clusters) are refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.DOTALL | re.MULTILINE)

#: One marker: what a command needs or how long it takes, or its expected exit status.
MARKER = re.compile(r"#\s*\[((?:needs [^;\]]+|takes [^;\]]+|exits \d+)(?:;\s*[^;\]]+)*)\]")
_MARKER_PART = re.compile(
    r"needs [\w .'-]+|takes (?:up to )?\d+(?:\.\d+)? (?:s|min|h)|takes minutes|exits \d+"
)

#: Commands that need the network, minutes, sglang, a GPU or a cluster when they run for
#: real (not their ``--help``): each must carry a marker.
NEEDS_A_MARKER = re.compile(
    r"^(?:\S+=\S+\s+)*(?:pip |python3? -m pip |pytest|python3? -m pytest"
    r"|kvcheck (?:verify|replay|campaign)"
    r"|python3? (?:tools|scripts)/(?!render_variants|embed_repros)|bash scripts/"
    r"|python3? docs/sglang-repros/|kubectl |srun |sbatch |ray |for |set -o pipefail)"
)


@dataclass(frozen=True)
class Command:
    """One shell command of a document, where it is, and its marker (None: unmarked)."""

    document: Path
    line: int
    text: str
    marker: str | None


def _commands(document: Path) -> list[list[Command]]:
    """The document's bash blocks, each as its commands; a block-wide marker (a comment line
    before the first command) applies to every command of the block."""
    text = document.read_text(encoding="utf-8")
    blocks = []
    for match in SHELL_BLOCK.finditer(text):
        first_line = text.count("\n", 0, match.start(1)) + 1
        commands: list[Command] = []
        block_marker = None
        pending, start = "", 0
        for offset, line in enumerate(match.group(1).splitlines()):
            stripped = line.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                marker = MARKER.search(stripped)
                if marker and not commands:
                    block_marker = marker.group(1)
                continue
            if not pending:
                start = first_line + offset
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            pending += line
            marker = MARKER.search(pending)
            found = marker.group(1) if marker else block_marker
            commands.append(Command(document, start, pending.strip(), found))
            pending = ""
        blocks.append(commands)
    return blocks


ALL_BLOCKS = [block for document in DOCUMENTS for block in _commands(document) if block]


def _id(block: list[Command]) -> str:
    return f"{block[0].document.relative_to(ROOT)}:{block[0].line}"


def test_the_documents_have_commands_to_check() -> None:
    """The extraction finds the README's commands, marked and unmarked (it reads them at all)."""
    readme = [command for block in _commands(ROOT / "README.md") for command in block]
    assert any(command.marker is None for command in readme)
    assert any(command.marker and "takes" in command.marker for command in readme)
    assert len(ALL_BLOCKS) > 10


def test_the_marker_and_the_slow_command_checks_find_what_they_should() -> None:
    """A marker is read from a command's line; the commands that must be marked are."""
    assert MARKER.search("kvcheck verify  # [needs network; takes 3 min]")
    assert not MARKER.search("kvcheck verify  # needs a GPU")
    for slow in (
        "pip install -e .",
        "kvcheck verify --target sglang",
        "KVCHECK_TARGET=sglang python3 -m pytest tests/targets",
        "python tools/reach.py --target sglang",
        "bash scripts/install_sglang.sh",
        "kubectl exec -it head -- kvcheck campaign",
    ):
        assert NEEDS_A_MARKER.search(slow), slow
    for cheap in ("kvcheck verify --help", "kvcheck memory-report", "cd examples/own_pool"):
        assert not NEEDS_A_MARKER.search(cheap) or "--help" in cheap, cheap


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=_id)
def test_every_slow_command_is_marked(block: list[Command]) -> None:
    """A command that needs the network, sglang, a GPU, a cluster or minutes says so, with
    a marker whose every part reads ``needs ...``, ``takes N s|min|h`` or ``exits N``."""
    for command in block:
        where = f"{command.document.relative_to(ROOT)}:{command.line}: {command.text!r}"
        if command.marker is None:
            slow = NEEDS_A_MARKER.search(command.text) and "--help" not in command.text
            assert not slow, f"{where} needs a marker, e.g. # [needs network; takes 2 min]"
            continue
        parts = [part.strip() for part in command.marker.split(";")]
        odd = [part for part in parts if not _MARKER_PART.fullmatch(part)]
        assert not odd, (
            f"{where}: marker parts {odd} read neither 'needs X', 'takes N min' nor 'exits N'"
        )


def _scratch(tmp_path: Path) -> Path:
    """A directory that sees the clone's folders (commands name scripts/, examples/, ...)
    and nothing it could write into the clone by accident."""
    for name in ("scripts", "tools", "examples", "docs", "tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _runs_here(command: Command) -> bool:
    return command.marker is None and not command.text.startswith("cd ")


@pytest.mark.parametrize(
    "block", [block for block in ALL_BLOCKS if any(map(_runs_here, block))], ids=_id
)
def test_every_unmarked_command_runs(block: list[Command], tmp_path: Path) -> None:
    """The block's unmarked commands run in order (marked ones are left out) and exit 0."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("kvcheck", path=str(bin_dir)) is None:
        pytest.skip(f"kvcheck is not installed beside {sys.executable}")
    script = "\n".join(["set -e", *(c.text for c in block if c.marker is None)])
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "KVCHECK_DB": str(tmp_path / "db"),
    }
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=_scratch(scratch),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout[-2000:] + done.stderr[-2000:]
    assert done.returncode == 0, f"{_id(block)} exited {done.returncode}:\n{script}\n{output}"
    assert done.stdout.strip(), f"{_id(block)} printed nothing:\n{script}"


def test_the_readme_is_one_screen_per_task() -> None:
    """The README stays short (reference material lives in docs/, linked from it)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference to docs/"


def test_the_readme_shows_the_own_pool_example_as_it_is() -> None:
    """The README's own-pool target, its tests and their pytest configuration are the files
    of ``examples/own_pool`` (which run), not a copy that drifts from them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Check your own pool", 1)[1].split("\n## ", 1)[0]
    python = re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    toml = re.findall(r"^```toml\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    example = ROOT / "examples" / "own_pool"
    assert python == [
        (example / "my_kv.py").read_text(encoding="utf-8"),
        (example / "tests" / "test_my_kv.py").read_text(encoding="utf-8"),
    ]
    configuration = (example / "pyproject.toml").read_text(encoding="utf-8")
    assert len(toml) == 1
    assert all(line in configuration.splitlines() for line in toml[0].splitlines())
