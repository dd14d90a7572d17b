"""Each variant, tier and finding is named where it is declared, and nowhere else in the
library; and no second table says why something is not built.

Variants are generated from the axes (:mod:`kvcheck.variants`); what a target builds,
refuses or cannot reach is its declaration (:mod:`kvcheck.declaration`; sglang's in
:mod:`kvcheck.targets.sglang.declaration`); sglang's findings in
:mod:`kvcheck.targets.sglang.findings`. A string literal elsewhere in ``kvcheck/`` that
spells a variant (``"dsa:scaled:kpool"``) or a finding id is a second copy of that
knowledge, which drifts: this test names the module and line. Docstrings are prose and
not checked.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import kvcheck
from kvcheck.declaration import CAPABILITIES
from kvcheck.targets.sglang.findings import SGLANG_FINDINGS
from kvcheck.variants import VARIANTS

PACKAGE = Path(kvcheck.__file__).parent
#: The modules that declare variants, tiers and findings: the only ones that may spell them.
DECLARING = {
    "variants.py",
    "declaration.py",
    "targets/sglang/declaration.py",
    "targets/sglang/findings.py",
}
#: Variant names (a family's baseline is its family's name, which code uses everywhere).
VARIANT_NAMES = sorted((v.name for v in VARIANTS if not v.is_baseline), key=len, reverse=True)
_VARIANT = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, VARIANT_NAMES)) + r")(?!\w)")
_FINDING_IDS = sorted({f.id.split(".")[0] for f in SGLANG_FINDINGS if len(f.id) > 1})
_FINDING = re.compile(r"^(" + "|".join(map(re.escape, _FINDING_IDS)) + r")$")


def _literals(path: Path) -> Iterator[ast.Constant]:
    """The string literals of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node


def _library_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative not in DECLARING:
            yield relative, path


def test_no_variant_or_finding_is_spelled_outside_its_declaration() -> None:
    """No string literal outside the declaring modules names a variant or a finding id."""
    spelled = [
        f"kvcheck/{relative}:{node.lineno}: {match}"
        for relative, path in _library_modules()
        for node in _literals(path)
        for match in [*_VARIANT.findall(node.value), *_FINDING.findall(node.value)]
    ]
    assert spelled == [], "\n".join(spelled)


def _reason_tables(path: Path) -> Iterator[tuple[int, str]]:
    """Module-level dicts keyed by variant names, capability labels or tier keys with
    string values: tables of reasons."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    keys = {*VARIANT_NAMES, *CAPABILITIES, "allocators", "host_pools"}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and value.args:  # MappingProxyType({...})
            value = value.args[0]
        if not isinstance(value, ast.Dict):
            continue
        names = [k.value for k in value.keys if isinstance(k, ast.Constant)]
        texts = [v for v in value.values if isinstance(v, ast.Constant | ast.JoinedStr | ast.BinOp)]
        if len(texts) != len(value.values):
            continue  # not reasons: values of another kind (tuples of needs, ...)
        label = [str(name).partition(":")[0] for name in names]
        if names and all(
            isinstance(name, str) and (name in keys or head in keys)
            for name, head in zip(names, label, strict=True)
        ):
            yield node.lineno, ", ".join(map(str, names[:3]))


def test_no_second_table_says_why_something_is_not_built() -> None:
    """Reasons keyed by variant, capability or tier live in a declaration only."""
    tables = [
        f"kvcheck/{relative}:{line}: {{{keys}, ...}}"
        for relative, path in _library_modules()
        for line, keys in _reason_tables(path)
    ]
    assert tables == [], "\n".join(tables)


def test_the_check_sees_a_spelled_variant(tmp_path: Path) -> None:
    """The scanner finds a variant in a literal and a reason table, not in a docstring."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""mha:hnd in prose."""\n'
        'KIND = "dsa:scaled:kpool"\n'
        'WHY = {"mha:hnd": "no head-major buffers"}\n',
        encoding="utf-8",
    )
    found = [_VARIANT.findall(node.value) for node in _literals(module)]
    assert [match for matches in found for match in matches] == [
        "dsa:scaled:kpool",
        "mha:hnd",
    ]
    assert [line for line, _ in _reason_tables(module)] == [3]


def test_the_docs_variant_table_is_the_declarations() -> None:
    """docs/checks.md's variant table is what ``scripts/render_variants.py`` writes from the
    variants and the declarations (run it after changing either)."""
    sys.path.insert(0, str(PACKAGE.parent / "scripts"))
    try:
        import render_variants
    finally:
        sys.path.pop(0)
    checks_doc = PACKAGE.parent / "docs" / "checks.md"
    text = checks_doc.read_text(encoding="utf-8")
    assert render_variants.refreshed(text) == text, "run python scripts/render_variants.py"
