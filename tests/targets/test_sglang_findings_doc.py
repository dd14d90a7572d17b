"""docs/sglang-findings.md keeps up with the target (no sglang needed).

The findings document is the upstream report; these tests hold it to what the code
declares: every bug and undocumented precondition in its summary has a reproduction
script and every script a row; every finding the sglang target declares has a row; every
CPU stand-in the target installs has a row saying what sglang does without it; and every
link and anchor resolves.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from kvcheck.targets.sglang import adapt, env, mxfp8_kernels
from kvcheck.targets.sglang import target as sglang_target
from kvcheck.targets.sglang.findings import RELEASES, SGLANG_FINDINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FINDINGS_DOC = DOCS / "sglang-findings.md"
REPROS = DOCS / "sglang-repros"
#: The classes the document defines, in the order its sections list them.
CLASSES = ("bug", "undocumented precondition", "contract difference")
#: Context managers of the target's env module that are building blocks of the stand-ins, not one.
ENV_HELPERS = frozenset({"scoped_environ"})

ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
LINK = re.compile(r"\]\(([^)\s]*)\)")


def _text() -> str:
    return FINDINGS_DOC.read_text(encoding="utf-8")


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


def _summary() -> list[dict[str, str]]:
    rows = _table_rows(_section(_text(), "Summary"))
    names = ("id", "class", "finding", "reached", "reproduction", "releases", "checked")
    assert rows and all(len(row) == len(names) for row in rows), rows[:1]
    return [dict(zip(names, row, strict=True)) for row in rows]


def _anchor_of(cell: str) -> str:
    match = re.fullmatch(r"\[[^\]]+\]\(#([a-z0-9-]+)\)", cell)
    assert match, f"summary id cell {cell!r} is not a link to its entry"
    return match.group(1)


def test_summary_rows_are_classified_and_say_where_they_were_checked() -> None:
    """Every summary row links its entry, has one of the three classes, says where it is
    reached from, the releases it holds for (as RELEASES declares them) and on which sglang
    releases it was checked."""
    for row in _summary():
        finding_id = _anchor_of(row["id"]).upper()
        # I10 is declared with I1-I9, as the input-validation group "I".
        releases = RELEASES.get(finding_id) or RELEASES[finding_id[0]]
        assert row["releases"] == releases.describe(), row
        assert row["class"] in CLASSES, row
        assert row["reached"] and row["finding"], row
        assert re.fullmatch(r"\d+\.\d+\.\d+(, \d+\.\d+\.\d+)*", row["checked"]), row


def test_every_bug_and_precondition_has_a_script_and_every_script_a_row() -> None:
    """Bugs and undocumented preconditions link a script in docs/sglang-repros/; contract
    differences link none; no script is left without its row."""
    linked = []
    for row in _summary():
        script = re.fullmatch(r"\[([a-z0-9]+\.py)\]\(sglang-repros/\1\)", row["reproduction"])
        if row["class"] == "contract difference":
            assert row["reproduction"] == "-", row
            continue
        assert script, f"{row['id']} ({row['class']}) has no reproduction script: {row}"
        assert (REPROS / script.group(1)).is_file(), script.group(1)
        linked.append(script.group(1))
    scripts = sorted(path.name for path in REPROS.glob("*.py"))
    assert sorted(linked) == scripts


def test_every_declared_finding_has_a_summary_row() -> None:
    """Each finding the sglang target declares (and steers around or pins) is reported."""
    rows = {_anchor_of(row["id"]) for row in _summary()}
    declared = {finding.id.split(".")[0].lower() for finding in SGLANG_FINDINGS}
    assert declared - rows == set()


def test_retired_findings_are_not_declared() -> None:
    """A retired finding has an entry under Retired and no declared Finding or pin left."""
    retired = set(ANCHOR.findall(_section(_text(), "Retired")))
    declared = {finding.id.split(".")[0].lower() for finding in SGLANG_FINDINGS}
    assert retired and retired & declared == set()
    summary = {_anchor_of(row["id"]) for row in _summary()}
    assert retired & summary == set()


def test_stand_ins_have_rows_saying_what_sglang_does_without_them() -> None:
    """Every stand-in the target installs is listed in SGLANG_STAND_INS and has a row in the
    document's stand-ins table, and every row names one."""
    rows = _table_rows(_section(_text(), "CPU stand-ins"))
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
    [FINDINGS_DOC, DOCS / "sglang-reach.md", ROOT / "README.md", DOCS / "gpu-report.md"],
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
    lines = _text().splitlines()
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
