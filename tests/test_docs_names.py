"""Names a newcomer can follow: module docstrings, and the architecture doc's glossary and
the paths and names it points to."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import kvcheck

ROOT = Path(kvcheck.__file__).resolve().parents[1]
PACKAGE = ROOT / "kvcheck"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MODULES = sorted(PACKAGE.rglob("*.py"))

#: A measured duration, a share or an "N of M" count: figures that go stale as the code or
#: the machine changes. They belong in the docs that date them (README, docs/), not in a
#: module's description of what it owns.
_STALE_FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s?(?:s|ms|min|minutes|seconds|hours)\b"
    r"|\d\s?%|\b\d+ of \d+\b"
)

#: kvcheck's own words, each defined in the glossary of docs/architecture.md.
GLOSSARY_WORDS = (
    "target",
    "surface",
    "variant",
    "axis",
    "family",
    "tier",
    "twin",
    "steer",
    "pin",
    "reach",
    "finding",
    "stand-in",
    "profile",
    "campaign",
    "replay",
    "identity",
)


def _module_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", MODULES, ids=_module_id)
def test_every_module_says_what_it_owns(path: Path) -> None:
    """Every module of kvcheck starts with a docstring whose first line says what it owns,
    and whose prose (examples aside) carries no measured time, share or count."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert docstring, f"{_module_id(path)}: no module docstring"
    assert docstring.splitlines()[0].strip(), f"{_module_id(path)}: empty first line"
    prose = [line for line in docstring.splitlines() if not line.startswith((" ", "\t"))]
    stale = [line for line in prose if _STALE_FIGURE.search(line)]
    assert not stale, f"{_module_id(path)}: figures that go stale: {stale}"


def test_the_stale_figure_check_finds_figures() -> None:
    """The check above recognizes timings, ranges of them, shares and "N of M" counts."""
    for figure in ("(7-25 s)", "takes 17 s", "in 1.5 seconds", "60.3% of lines", "221 of 305"):
        assert _STALE_FIGURE.search(figure), figure
    for prose in ("page size 1", "sglang 0.5.23's pools", "fp8 is 1 byte", "3 tokens"):
        assert not _STALE_FIGURE.search(prose), prose


def _glossary() -> dict[str, str]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (.+) \|$", section, flags=re.MULTILINE)
    return {word: meaning for word, meaning in rows if word != "word"}


def test_the_glossary_defines_kvchecks_words() -> None:
    """docs/architecture.md's glossary defines each of kvcheck's own words."""
    glossary = _glossary()
    missing = [word for word in GLOSSARY_WORDS if not glossary.get(word)]
    assert not missing, f"docs/architecture.md's glossary lacks {missing}"


def _exists(name: str) -> bool:
    """Whether a path (from the repository root, or within kvcheck/ or tests/) or a dotted
    ``kvcheck.`` name (a module, then attributes) exists."""
    if "/" in name:
        path = name.split(":", 1)[0]
        return any((base / path).exists() for base in (ROOT, PACKAGE, ROOT / "tests"))
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_the_architecture_doc_names_what_exists() -> None:
    """Every path and every ``kvcheck.`` name that docs/architecture.md quotes exists, so a
    rename that forgets the doc (and its glossary) fails here."""
    quoted = set(re.findall(r"`([^`\s]+)`", ARCHITECTURE.read_text(encoding="utf-8")))
    names = [
        name
        for name in quoted
        if ("/" in name and not name.startswith("-")) or re.fullmatch(r"kvcheck(\.\w+)+", name)
    ]
    assert len(names) > 20  # the check reads the doc's names at all
    missing = sorted(name for name in names if not _exists(name))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
