"""Write the table of pool variants in docs/checks.md from the declarations.

The table sits between ``<!-- variants -->`` and ``<!-- /variants -->`` in docs/checks.md: one
row per variant of :data:`kvcheck.variants.VARIANTS` (generated from the axes), with the
axis values that make it, whether kvcheck's own target builds it, and what the sglang
target's declaration says (how it builds it, or why not). ``--check`` changes nothing and
exits 1 when the table is stale (``tests/test_declared_once.py`` runs it).

Usage: ``python scripts/render_variants.py [--check]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from kvcheck.declaration import Builds, Key, declaration_of, surface_refusal
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.targets.sglang.declaration import DECLARATION
from kvcheck.targets.sglang.target import SURFACE
from kvcheck.variants import VARIANTS, Variant

ROOT = Path(__file__).resolve().parents[1]
CHECKS_DOC = ROOT / "docs" / "checks.md"
BLOCK = re.compile(r"<!-- variants -->\n.*?<!-- /variants -->", flags=re.DOTALL)


def _axes(variant: Variant) -> str:
    baseline = {v.family: v for v in VARIANTS if v.is_baseline}[variant.family]
    shown = [
        f"`{field}` {'/'.join(map(str, values))}"
        for field, values in variant.axis_values.items()
        if values != baseline.axis_values[field]
    ]
    return ", ".join(shown) or "baseline"


def _sglang(variant: Variant) -> str:
    status = DECLARATION.status(Key.variant(variant.name))
    if isinstance(status, Builds):
        return status.how
    why = DECLARATION.why_not(Key.variant(variant.name))
    if why is not None:
        return f"not built: {why}"
    if surface_refusal(SURFACE, variant) is None:
        return "the family's pool class"
    return "not built: outside its surface"


def table() -> str:
    """The block: the markers around a Markdown table of every variant."""
    builtin = declaration_of(KVCheckTarget())
    rows = ["| variant | axis values | kvcheck | sglang (0.5.23) |", "|---|---|---|---|"]
    for variant in VARIANTS:
        own = "built" if isinstance(builtin.status(Key.variant(variant.name)), Builds) else "—"
        sglang = _sglang(variant).replace("|", "\\|")
        rows.append(f"| `{variant.name}` | {_axes(variant)} | {own} | {sglang} |")
    return "<!-- variants -->\n" + "\n".join(rows) + "\n<!-- /variants -->"


def refreshed(text: str) -> str:
    """``text`` with its variants block rewritten (``ValueError`` when it has none)."""
    if not BLOCK.search(text):
        raise ValueError("docs/checks.md has no <!-- variants --> block")
    return BLOCK.sub(lambda _: table(), text)


def main(argv: list[str]) -> int:
    text = CHECKS_DOC.read_text(encoding="utf-8")
    new = refreshed(text)
    if "--check" in argv:
        if new != text:
            print("docs/checks.md's variant table is stale: run python scripts/render_variants.py")
            return 1
        return 0
    CHECKS_DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
