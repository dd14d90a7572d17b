"""docs/sglang-findings.md, its issue files and its appendix keep up with the target (no
sglang needed).

The index (``docs/sglang-findings.md``) is the upstream report: at most 150 lines, one
table sorted by severity whose classes and releases are the declared ones (``CLASSES``,
``RELEASES``). Every bug and precondition has an issue file in ``docs/sglang-findings/``
with every section and its script embedded verbatim; every declared finding has a row;
the appendix keeps the retired findings and a row for every CPU stand-in; every link and
anchor resolves.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest

from kvcheck.targets.sglang import adapt, env, mxfp8_kernels
from kvcheck.targets.sglang import target as sglang_target
from kvcheck.targets.sglang.findings import CLASS_ORDER, CLASSES, RELEASES, SGLANG_FINDINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FINDINGS_DOC = DOCS / "sglang-findings.md"
APPENDIX = DOCS / "sglang-findings-appendix.md"
ISSUES = DOCS / "sglang-findings"
REPROS = DOCS / "sglang-repros"
#: The most lines the index may have.
INDEX_LINES = 150
#: The sections every issue file has, in order.
ISSUE_SECTIONS = (
    "## Affected releases",
    "## Where",
    "## What happens",
    "## Why it matters",
    "## Reproduction",
    "## Suggested fix",
)
#: Index class cells, by CLASSES value.
CLASS_CELLS = {
    "serving bug": "serving bug",
    "latent bug": "latent bug",
    "precondition": "precondition",
    "contract difference": "contract difference",
}
#: Context managers of the target's env module that are building blocks of the stand-ins, not one.
ENV_HELPERS = frozenset({"scoped_environ"})

ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
LINK = re.compile(r"\]\(([^)\s]*)\)")

sys.path.insert(0, str(ROOT / "scripts"))
import embed_repros  # noqa: E402


def _text(path: Path = FINDINGS_DOC) -> str:
    return path.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The lines under the ``## `` heading that starts with ``heading``, up to the next."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : len(text) if end < 0 else end]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of every body row of the first Markdown table in ``section``."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # the header row


def _index() -> list[dict[str, str]]:
    rows = _table_rows(_section(_text(), "Findings"))
    names = ("id", "class", "title", "where", "releases", "script")
    assert rows and all(len(row) == len(names) for row in rows), rows[:1]
    return [dict(zip(names, row, strict=True)) for row in rows]


def _finding_id(cell: str) -> str:
    """The declared id of an index row (``I1-I10`` is the group ``I``)."""
    match = re.fullmatch(r"\[([A-Z0-9-]+)\]\(([^)]+)\)", cell)
    assert match, f"index id cell {cell!r} is not a link"
    return "I" if match.group(1).startswith("I1-") else match.group(1)


def _issue_ids() -> list[str]:
    return [fid for fid, cls in CLASSES.items() if cls != "contract difference"]


def test_index_is_short() -> None:
    """The index fits in INDEX_LINES lines: the details live in the issue files."""
    assert len(_text().splitlines()) <= INDEX_LINES


def test_index_rows_have_the_declared_class_and_releases() -> None:
    """Every index row has its finding's CLASSES class and RELEASES range, and every
    classed finding has one row."""
    seen = []
    for row in _index():
        finding_id = _finding_id(row["id"])
        seen.append(finding_id)
        assert row["class"] == CLASS_CELLS[CLASSES[finding_id]], row
        assert row["releases"] == RELEASES[finding_id].describe(), row
        assert row["title"] and re.match(r"`[^`]+\.py`: ", row["where"]), row
    assert sorted(seen) == sorted(CLASSES)
    assert set(CLASSES) == set(RELEASES)


def test_index_is_sorted_by_severity() -> None:
    """Serving bugs first, then latent bugs, preconditions, contract differences."""
    order = [CLASS_ORDER.index(CLASSES[_finding_id(row["id"])]) for row in _index()]
    assert order == sorted(order)


def test_headline_counts_the_classes() -> None:
    """The headline's counts are those of CLASSES (the group I counts as one)."""
    headline = _text().split("\n## ")[0]
    counts = {cls: list(CLASSES.values()).count(cls) for cls in CLASS_ORDER}
    for cls, phrase in (
        ("serving bug", "bugs on a serving path"),
        ("latent bug", "latent bugs"),
        ("precondition", "undocumented preconditions"),
        ("contract difference", "contract\ndifferences"),
    ):
        assert f"{counts[cls]} {phrase}" in headline, (cls, counts[cls])


def test_bugs_and_preconditions_link_their_issue_file_and_script() -> None:
    """A bug or precondition row links its issue file and its script; a contract
    difference links the appendix."""
    for row in _index():
        finding_id = _finding_id(row["id"])
        if CLASSES[finding_id] == "contract difference":
            assert "sglang-findings-appendix.md#" in row["id"], row
            continue
        name = finding_id.lower()
        assert row["id"] == f"[{finding_id}](sglang-findings/{name}.md)", row
        assert row["script"] == f"[{name}.py](sglang-repros/{name}.py)", row


def test_every_script_belongs_to_a_finding() -> None:
    """Each script in docs/sglang-repros/ is named after a finding of RELEASES (``i10`` is
    in the group ``I``), and every bug and precondition has one."""
    names = {path.stem for path in REPROS.glob("*.py") if not path.stem.startswith("_")}
    for name in names:
        finding_id = name.upper()
        assert finding_id in RELEASES or finding_id.rstrip("0123456789") in RELEASES, name
    assert {fid.lower() for fid in _issue_ids()} <= names


@pytest.mark.parametrize("finding_id", _issue_ids())
def test_issue_file_has_every_section(finding_id: str) -> None:
    """Each bug and precondition has docs/sglang-findings/<id>.md: a title, then the
    sections of ISSUE_SECTIONS in order, and its script linked and embedded."""
    name = finding_id.lower()
    text = _text(ISSUES / f"{name}.md")
    assert text.startswith(f"# {finding_id}: "), text[:80]
    positions = [text.find(f"\n{section}\n") for section in ISSUE_SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions
    assert f"<!-- script: ../sglang-repros/{name}.py -->" in text


def test_every_issue_file_is_a_bug_or_precondition() -> None:
    """No issue file is left for a finding that is not a bug or precondition."""
    named = {path.stem.upper() for path in ISSUES.glob("*.md")}
    assert named == set(_issue_ids())


@pytest.mark.parametrize("issue", sorted(ISSUES.glob("*.md")), ids=lambda path: path.stem)
def test_embedded_scripts_equal_their_files(issue: Path) -> None:
    """Every embedded script is its file verbatim (``python scripts/embed_repros.py``
    refreshes them)."""
    assert embed_repros.refreshed(issue) == _text(issue), (
        f"{issue.name} is stale: run python scripts/embed_repros.py"
    )


def test_embed_repros_finds_a_stale_block(tmp_path: Path) -> None:
    """The refresher rewrites a block whose script changed."""
    (tmp_path / "x.py").write_text("print(1)\n", encoding="utf-8")
    issue = tmp_path / "x.md"
    issue.write_text("a\n<!-- script: x.py -->\n```python\nold\n```\n<!-- /script -->\n")
    assert "print(1)" in embed_repros.refreshed(issue)
    assert "old" not in embed_repros.refreshed(issue)


def test_every_declared_finding_has_an_index_row() -> None:
    """Each finding the sglang target declares (and steers around or pins) is classed."""
    declared = {finding.id.split(".")[0] for finding in SGLANG_FINDINGS}
    assert declared - set(CLASSES) == set()


def test_retired_findings_are_not_declared() -> None:
    """A retired finding has an entry under Retired and no declared Finding or pin left."""
    retired = {name.upper() for name in ANCHOR.findall(_section(_text(APPENDIX), "Retired"))}
    declared = {finding.id.split(".")[0] for finding in SGLANG_FINDINGS}
    assert retired and retired & declared == set()
    assert retired & set(CLASSES) == set()


def test_stand_ins_have_rows_saying_what_sglang_does_without_them() -> None:
    """Every stand-in the target installs is listed in SGLANG_STAND_INS and has a row in the
    document's stand-ins table, and every row names one."""
    rows = _table_rows(_section(_text(APPENDIX), "CPU stand-ins"))
    named = {re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", row[0]).group(1) for row in rows}  # type: ignore[union-attr]
    assert all(len(row) == 5 and all(row) for row in rows)
    assert named == set(sglang_target.SGLANG_STAND_INS)


def _context_managers(module: object) -> set[str]:
    """Names of the ``@contextmanager`` functions defined in ``module``."""
    return {
        name
        for name, value in vars(module).items()
        if inspect.isgeneratorfunction(getattr(value, "__wrapped__", None))
        and getattr(value, "__module__", None) == getattr(module, "__name__", None)
    }


def test_every_scoped_patch_and_stand_in_class_is_registered() -> None:
    """A new context manager in sglang.env or *StandIn class in sglang.adapt must be
    added to SGLANG_STAND_INS (and so to the document's table)."""
    registered = set(sglang_target.SGLANG_STAND_INS)
    assert _context_managers(env) - ENV_HELPERS <= registered
    # _kernel_replaced: the patch the two Triton-kernel stand-ins share, not one itself.
    assert _context_managers(mxfp8_kernels) - {"_kernel_replaced"} <= registered
    classes = {name for name, value in vars(adapt).items() if inspect.isclass(value)}
    assert {name for name in classes if name.endswith("StandIn")} <= registered
    modules = (env, mxfp8_kernels, adapt, sglang_target)
    for name in registered:
        assert any(hasattr(module, name) for module in modules), name


@pytest.mark.parametrize(
    "path",
    [
        FINDINGS_DOC,
        APPENDIX,
        DOCS / "sglang-reach.md",
        DOCS / "architecture.md",
        ROOT / "README.md",
        DOCS / "gpu-report.md",
        *(DOCS / f"{name}.md" for name in ("checks", "running", "targets", "campaign")),
        *(DOCS / f"{name}.md" for name in ("sglang-releases", "layout", "development")),
        *sorted(ISSUES.glob("*.md")),
    ],
    ids=lambda path: path.name,
)
def test_links_and_anchors_resolve(path: Path) -> None:
    """Every relative link names an existing file, and every #anchor one of its anchors."""
    text = path.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.name}: link to missing {target!r}"
        if anchor and linked.suffix == ".md":
            anchors = set(ANCHOR.findall(linked.read_text(encoding="utf-8")))
            anchors |= _heading_anchors(linked.read_text(encoding="utf-8"))
            assert anchor in anchors, f"{path.name}: link to missing anchor {target!r}"


def _heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the Markdown headings of ``text``."""
    anchors = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_every_entry_anchor_is_on_its_own_heading() -> None:
    """Each ``<a id>`` of a finding stands right before that finding's heading (an anchor
    followed by another finding's heading sends a reader to the wrong entry)."""
    lines = _text(APPENDIX).splitlines()
    for number, line in enumerate(lines):
        match = ANCHOR.fullmatch(line.strip())
        if not match or match.group(1) in (
            "stand-ins",
            "scaled",
            "kpool",
            "dcp",
            "releases",
            "quantized",
        ):
            continue
        heading = lines[number + 1]
        label = match.group(1).upper()
        assert heading.startswith("### "), (line, heading)
        assert heading[4:].startswith((f"{label}.", f"{label}-", "I1-I9")), (line, heading)
