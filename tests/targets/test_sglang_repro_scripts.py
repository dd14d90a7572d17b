"""The reproduction scripts in ``docs/sglang-repros/`` stay short and standalone.

Each script is at most 40 lines (docstring included), so that its core (the build, the call
that breaks, the check) is read at a glance, and imports only torch, sglang, the standard
library and the folder's one shared CPU helper (``cpu_stand_ins``), so that it runs with
sglang alone. The helper imports torch, sglang and the standard library (and probes
transformers, sglang's own dependency, for torchvision), and sets no sglang environment
switch: a stand-in replaces a kernel's body, never sglang's choice of path. A script that
sets one itself says so in its docstring. These checks read the files; no sglang needed.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPROS = Path(__file__).resolve().parents[2] / "docs" / "sglang-repros"
HELPER = REPROS / "cpu_stand_ins" / "__init__.py"
SCRIPTS = sorted(REPROS.glob("*.py"))
MAX_LINES = 40
ALLOWED = {"torch", "sglang", "cpu_stand_ins"}
#: The helper tries the real torchvision, and asks transformers (sglang's dependency) first.
HELPER_ALSO = {"transformers", "torchvision"}
SGLANG_SWITCH = re.compile(r"\bSGLANG_[A-Z0-9_]+")


def imported_roots(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports, anywhere in the file."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def not_allowed(roots: set[str], allowed: set[str]) -> set[str]:
    return {root for root in roots if root not in allowed and root not in sys.stdlib_module_names}


def test_the_folder_has_its_scripts_and_one_helper():
    """The scripts and the shared helper are where the findings document links them."""
    assert len(SCRIPTS) >= 29, [path.name for path in SCRIPTS]
    assert HELPER.is_file()


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script_is_short(script: Path):
    """A reproduction is at most 40 lines, its docstring included."""
    lines = len(script.read_text().splitlines())
    assert lines <= MAX_LINES, f"{script.name} has {lines} lines, more than {MAX_LINES}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script_imports_sglang_torch_and_the_helper_only(script: Path):
    """A reproduction imports torch, sglang, the standard library and ``cpu_stand_ins``."""
    roots = imported_roots(script)
    assert "cpu_stand_ins" in roots, f"{script.name} does not import the shared helper"
    assert not not_allowed(roots, ALLOWED), f"{script.name} imports {not_allowed(roots, ALLOWED)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script_says_which_path_ran(script: Path):
    """The docstring names its finding and the path that ran; a script that sets an sglang
    switch itself names it there."""
    docstring = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert docstring.startswith(script.stem.upper().rstrip("0123456789")), docstring[:80]
    assert re.search(r"path|interpreter", docstring, re.IGNORECASE), (
        f"{script.name}: which path ran?"
    )
    code = script.read_text().replace(docstring, "")
    for switch in set(SGLANG_SWITCH.findall(code)):
        assert switch in docstring, f"{script.name} sets {switch} without saying so"


def helper_comes_first(path: Path) -> bool:
    """Whether the first top-level import of torch or sglang comes after the helper's."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            continue
        roots = {name.split(".")[0] for name in names}
        if "cpu_stand_ins" in roots:
            return True
        if roots & {"torch", "sglang"}:
            return False
    return False


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script_imports_the_helper_before_sglang(script: Path):
    """The helper loads first (its stand-ins must exist before sglang imports), which is also
    the order the warm Python of ``warm_python.py`` loads them in for the script."""
    assert helper_comes_first(script), f"{script.name} imports torch or sglang before the helper"


def test_scripts_that_set_the_environment_first_run_fresh(monkeypatch: pytest.MonkeyPatch):
    """The warm Python (``warm_python.py``) takes only scripts that touch no environment
    variable before the helper import (sglang and Triton may read it while loading)."""
    from tests.targets.warm_python import runs_warm

    monkeypatch.delenv("TESTS_REPROS_FRESH", raising=False)
    fresh = {script.stem for script in SCRIPTS if not runs_warm(script)}
    assert fresh == {"p1", "q6", "q13", "q16"}
    monkeypatch.setenv("TESTS_REPROS_FRESH", "1")
    assert not any(runs_warm(script) for script in SCRIPTS)


def test_the_order_check_catches_sglang_first(tmp_path: Path):
    """The order check fails on a script that imports sglang before the helper."""
    bad = tmp_path / "z9.py"
    bad.write_text('"""Z9: path."""\nimport sglang\nimport cpu_stand_ins\n')
    assert not helper_comes_first(bad)


def test_helper_imports_sglang_torch_and_the_stdlib_only():
    """The shared helper needs nothing beyond what the scripts may import."""
    extra = not_allowed(imported_roots(HELPER), ALLOWED | HELPER_ALSO)
    assert not extra, f"cpu_stand_ins imports {extra}"


def test_helper_sets_no_sglang_switch():
    """The helper replaces no path: it names no ``SGLANG_*`` environment variable."""
    assert not SGLANG_SWITCH.findall(HELPER.read_text())


def test_the_checks_catch_a_long_script_that_imports_kvcheck(tmp_path: Path):
    """The line and import checks fail on a script that breaks them."""
    bad = tmp_path / "z9.py"
    bad.write_text('"""Z9: path."""\nimport kvcheck\nimport cpu_stand_ins\n' + "x = 1\n" * 40)
    assert not_allowed(imported_roots(bad), ALLOWED) == {"kvcheck"}
    assert len(bad.read_text().splitlines()) > MAX_LINES
