"""The package's layers: a module imports only from layers below its own (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvcheck

#: Bottom to top. Sub-packages and top-level modules of ``kvcheck``; a module may import
#: from its own layer's package and from any layer listed before it.
LAYERS: tuple[str, ...] = (
    "specs",
    "variants",
    "geometry",
    "tiers",
    "steering",
    "surface",
    "declaration",
    "validation",
    "vocabulary",
    "pools",
    "allocators",
    "host_pools",
    "serving",
    "reference",
    "calls",
    "failures",
    "tier_calls",
    "tier_log",
    "memory",
    "census",
    "attention",
    "strategies",
    "targets",
    "properties",
    "machines",
    "allocator_machine",
    "swa_machine",
    "linear_hybrid_machine",
    "lifecycle",
    "scheduler",
    "suite",
    "runner",
)
PACKAGE = Path(kvcheck.__file__).parent


def _imported_units(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvcheck"):
            names = [node.module]
            if node.module == "kvcheck":
                names = [f"kvcheck.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("kvcheck.")]
    return found


def test_every_unit_of_the_package_has_a_layer() -> None:
    """A new module or sub-package must be placed in LAYERS (and in the architecture doc)."""
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    units -= {"__init__", "__pycache__"}
    assert units - set(LAYERS) == set()


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """Every import, lazy ones included, points down (or stays in the module's layer)."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for path in PACKAGE.rglob("*.py"):
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if unit == "__init__":
            continue
        for line, imported in _imported_units(ast.parse(path.read_text())):
            if imported in rank and rank[imported] > rank[unit]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports kvcheck.{imported}")
    assert upward == []


def test_the_package_never_imports_the_developer_tools() -> None:
    """tools/ (reach, call counts, across) sits outside the installed package: it may import
    kvcheck, and nothing in kvcheck imports it (an installed kvcheck has no tools)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if any(name == "tools" or name.startswith("tools.") for name in names):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
