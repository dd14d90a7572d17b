"""The sglang releases kvcheck is checked against are listed once: ``releases.txt``.

``kvcheck/targets/sglang/releases.txt`` ships in the package; :data:`KNOWN_RELEASES` reads
it, and so does ``scripts/install_sglang.sh`` (``--releases`` prints what it read, which
``.ci/run`` and the README use). Runs without sglang.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from kvcheck.targets.sglang.release import KNOWN_RELEASES, RELEASES_FILE, read_releases

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "scripts" / "install_sglang.sh"
LIST = ROOT / "kvcheck" / "targets" / "sglang" / RELEASES_FILE

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _recipe(
    *args: str, env: dict[str, str] | None = None, recipe: Path = RECIPE, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(recipe), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_known_releases_are_the_shipped_file() -> None:
    """KNOWN_RELEASES is what the package's releases.txt lists, oldest first."""
    shipped = files("kvcheck.targets.sglang").joinpath(RELEASES_FILE)
    assert shipped.is_file()
    assert read_releases(shipped.read_text(encoding="utf-8")) == KNOWN_RELEASES
    assert read_releases(LIST.read_text(encoding="utf-8")) == KNOWN_RELEASES


def test_the_list_is_package_data() -> None:
    """pyproject.toml ships releases.txt with the package (a wheel without it cannot import
    the sglang target)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with (ROOT / "pyproject.toml").open("rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert RELEASES_FILE in package_data["kvcheck.targets.sglang"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0.5.1\n0.5.2\n", ("0.5.1", "0.5.2")),
        ("# oldest first\n\n  0.5.1  # a comment\n\t0.5.2", ("0.5.1", "0.5.2")),
    ],
    ids=["plain", "comments-blanks-no-final-newline"],
)
def test_read_releases_skips_comments_and_blank_lines(text: str, expected: tuple) -> None:
    """One release a line; ``#`` starts a comment; blank lines are skipped."""
    assert read_releases(text) == expected


@pytest.mark.parametrize(
    "text, match",
    [
        ("# nothing\n", "lists no release"),
        ("0.5.2\n0.5.1\n", "oldest first"),
        ("0.5.1\n0.5.1\n", "oldest first"),
        ("0.5.1\nnext\n", "not a version"),
    ],
    ids=["empty", "newest-first", "twice", "not-a-version"],
)
def test_read_releases_refuses_a_bad_list(text: str, match: str) -> None:
    """An empty list, one out of order or with a repeat, or a word that is not a version is
    refused, naming the problem."""
    with pytest.raises(ValueError, match=match):
        read_releases(text)


@needs_bash
def test_the_install_recipe_reads_the_same_list(tmp_path: Path) -> None:
    """``install_sglang.sh --releases`` prints KNOWN_RELEASES, from anywhere it is run."""
    done = _recipe("--releases", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tuple(done.stdout.split()) == KNOWN_RELEASES


@needs_bash
def test_the_install_recipe_parses_the_file_as_python_does(tmp_path: Path) -> None:
    """Comments, blank lines, blanks around a release and a missing final newline read the
    same in the recipe as in :func:`read_releases`."""
    text = "# a comment\n\n  0.5.1   # first\n\t0.5.2\n# 0.5.3 not yet\n0.5.10"
    recipe = tmp_path / "scripts" / "install_sglang.sh"
    recipe.parent.mkdir()
    shutil.copy(RECIPE, recipe)
    listed = tmp_path / "kvcheck" / "targets" / "sglang" / RELEASES_FILE
    listed.parent.mkdir(parents=True)
    listed.write_text(text)
    done = _recipe("--releases", recipe=recipe)
    assert done.returncode == 0, done.stderr
    assert tuple(done.stdout.splitlines()) == read_releases(text)


@needs_bash
def test_the_install_recipe_refuses_an_unknown_release_listing_the_known_ones() -> None:
    """An unknown KVCHECK_SGLANG_VERSION stops the recipe before it looks at any
    interpreter, naming the known releases and the file."""
    done = _recipe(
        env={"KVCHECK_SGLANG_VERSION": "0.0.1", "PYTHON": "/nonexistent/python"},
    )
    assert done.returncode == 1
    assert "sglang 0.0.1 is not a release this recipe knows" in done.stderr
    assert f"known: {' '.join(KNOWN_RELEASES)}" in done.stderr
    assert RELEASES_FILE in done.stderr


#: Folders whose Markdown names releases as facts about one finding or one measurement
#: (each finding's releases, dated tables from a run on each release), not as the list.
_FACTS_ABOUT_RELEASES = ("docs/",)
_SEPARATOR = re.compile(r"(?:[\s,;'\"()\[\]*`]+|\band\b|\bor\b)+")


def _spellings_of_the_list(text: str) -> list[int]:
    """Line numbers where every known release appears in one run, separated by nothing but
    list punctuation or "and"/"or" (a tuple, a bash array, a loop, a sentence)."""
    release = re.compile(
        r"(?<![\w.])(" + "|".join(map(re.escape, KNOWN_RELEASES)) + r")(?!\w|\.\d)"
    )
    lines, run, last_end, run_start = [], set(), -1, 0
    for match in release.finditer(text):
        if run and _SEPARATOR.fullmatch(text[last_end : match.start()]):
            run.add(match.group(1))
        else:
            run, run_start = {match.group(1)}, match.start()
        last_end = match.end()
        if run == set(KNOWN_RELEASES):
            lines.append(text.count("\n", 0, run_start) + 1)
            run = set()
    return lines


def test_the_list_detector_finds_every_spelling() -> None:
    """The check below recognizes a tuple, a bash array, a loop and a sentence, in any order."""
    if len(KNOWN_RELEASES) < 2:
        pytest.skip("one known release: nothing can spell a list")
    first, *middle, last = KNOWN_RELEASES
    for spelled in (
        repr(KNOWN_RELEASES),
        f"KNOWN=({' '.join(KNOWN_RELEASES)})",
        f"for r in {' '.join(reversed(KNOWN_RELEASES))}; do",
        f"checked on {', '.join([first, *middle])} and {last}.",
    ):
        assert _spellings_of_the_list(f"x\n{spelled}\n") == [2], spelled
    assert _spellings_of_the_list(f"{first}-{last}, a range") == []


def test_no_other_file_spells_the_list() -> None:
    """releases.txt is the only file that spells the known releases as a list: everything
    else reads it (release.py, install_sglang.sh) or asks the recipe (.ci/run, README)."""
    if len(KNOWN_RELEASES) < 2:
        pytest.skip("one known release: nothing can spell a list")
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know the repository's files")
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    offenders = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path == LIST or name.startswith(_FACTS_ABOUT_RELEASES) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (images) spell nothing
        offenders += [f"{name}:{line}" for line in _spellings_of_the_list(text)]
    assert not offenders, (
        f"these spell the known sglang releases; read {LIST.relative_to(ROOT)} instead "
        f"(KNOWN_RELEASES, or `bash scripts/install_sglang.sh --releases`): {offenders}"
    )
