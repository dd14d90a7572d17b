"""Refresh the reproduction scripts embedded in the sglang issue files.

Each issue file in ``docs/sglang-findings/`` embeds its script between two markers::

    <!-- script: ../sglang-repros/w1.py -->
    ```python
    ...
    ```
    <!-- /script -->

This rewrites every such block from the named file, so the issue files stay copies of
``docs/sglang-repros/``. ``--check`` changes nothing and exits 1 if a block is stale.

Usage: ``python scripts/embed_repros.py [--check]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUES = ROOT / "docs" / "sglang-findings"

#: One embedded script: the opening marker (group ``path``), anything, the closing marker.
BLOCK = re.compile(r"<!-- script: (?P<path>[^ ]+) -->\n.*?<!-- /script -->", flags=re.DOTALL)


def embedded(path: str, script: str) -> str:
    """The block that embeds ``script`` (the text of the file at ``path``)."""
    return f"<!-- script: {path} -->\n```python\n{script.rstrip()}\n```\n<!-- /script -->"


def refreshed(issue: Path) -> str:
    """The text of ``issue`` with every embedded block rewritten from its script."""

    def block(match: re.Match[str]) -> str:
        script = (issue.parent / match.group("path")).read_text(encoding="utf-8")
        return embedded(match.group("path"), script)

    return BLOCK.sub(block, issue.read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for issue in sorted(ISSUES.glob("*.md")):
        text = refreshed(issue)
        if text != issue.read_text(encoding="utf-8"):
            stale.append(issue.name)
            if not check:
                issue.write_text(text, encoding="utf-8")
    verb = "stale" if check else "refreshed"
    for name in stale:
        print(f"{verb}: {name}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
