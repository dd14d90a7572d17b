"""Tests of :mod:`kvcheck.targets.discovery` on a throwaway package: no sglang needed.

The package is written to a temporary directory: a base module, a pool module whose
``NewPool`` no declaration knows, a standalone pool found by its name, and a module that
fails to import. sglang's real list is pinned in ``tests/targets/test_sglang_classes.py``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcheck.declaration import Builds, Declaration, Key, Refuses, Row
from kvcheck.targets.discovery import (
    ClassEntry,
    Discovery,
    Found,
    census,
    census_line,
    discover,
    format_census,
)

PACKAGE = "kvcheck_fake_pools"


@pytest.fixture
def fake_package(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / PACKAGE
    (root / "host").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "base.py").write_text("class KVCache:\n    pass\n")
    (root / "pools.py").write_text(
        "from kvcheck_fake_pools.base import KVCache\n"
        "class OldPool(KVCache):\n    pass\n"
        "class NewPool(OldPool):\n    pass\n"
        "class Helper:\n    pass\n"
        "Alias = OldPool\n"
    )
    (root / "host" / "__init__.py").write_text("")
    (root / "host" / "ring.py").write_text("class RingHostPool:\n    pass\n")
    (root / "host" / "gpu.py").write_text("raise ImportError('needs CUDA')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield PACKAGE
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def _discovered(package: str) -> Discovery:
    base = importlib.import_module(f"{package}.base").KVCache
    return discover(package, {base: "KV pool"}, name_suffixes={"HostPool": "host pool"})


DECLARED = Declaration(
    rows=(
        Row(Key.upstream(f"{PACKAGE}.base:KVCache"), Builds("the base")),
        Row(Key.upstream(f"{PACKAGE}.pools:OldPool"), Builds("OldPool(size)")),
        Row(Key.upstream(f"{PACKAGE}.host.ring:RingHostPool"), Refuses("GPU only on {release}")),
    )
)


def test_discover_picks_subclasses_and_pool_names_where_they_are_defined(
    fake_package: str,
) -> None:
    found = _discovered(fake_package)
    assert [(f.qualified, f.kind) for f in found.classes] == [
        (f"{PACKAGE}.base:KVCache", "KV pool"),
        (f"{PACKAGE}.host.ring:RingHostPool", "host pool"),
        (f"{PACKAGE}.pools:NewPool", "KV pool"),
        (f"{PACKAGE}.pools:OldPool", "KV pool"),
    ]
    assert list(found.import_errors) == [f"{PACKAGE}.host.gpu"]
    assert found.import_errors[f"{PACKAGE}.host.gpu"].startswith("ImportError")


def test_a_class_the_declaration_does_not_know_is_not_built_new_in_the_release(
    fake_package: str,
) -> None:
    entries = {e.qualified: e for e in census(_discovered(fake_package), DECLARED, release="9.9")}
    new = entries[f"{PACKAGE}.pools:NewPool"]
    assert (new.built, new.line()) == (
        False,
        f"{PACKAGE}.pools:NewPool (KV pool): not built: new in 9.9",
    )
    assert entries[f"{PACKAGE}.pools:OldPool"].built
    assert entries[f"{PACKAGE}.host.ring:RingHostPool"].why == "GPU only on 9.9"
    failed = entries[f"{PACKAGE}.host.gpu"]
    assert (failed.kind, failed.built) == ("module", False)
    assert "import failed: ImportError" in failed.why


def test_census_line_counts_and_names_the_new_classes(fake_package: str) -> None:
    entries = census(_discovered(fake_package), DECLARED, release="9.9")
    line = census_line(entries, listed_by="kvcheck classes --target fake")
    assert line == (
        f"4 pool classes: 2 built, 2 not built (1 new: {PACKAGE}.pools:NewPool; "
        "1 modules failed to import); kvcheck classes --target fake lists them"
    )
    listing = format_census(entries)
    assert listing.index("built:") < listing.index("not built:")
    assert all(entry.qualified in listing for entry in entries)


def test_discover_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="package="):
        discover("", {object: "x"})
    with pytest.raises(ValueError, match="bases="):
        discover("json", {})
    with pytest.raises(ValueError, match="is a module, not a package"):
        discover("json.decoder", {object: "x"})
    with pytest.raises(ValueError, match="release="):
        census(Discovery(), Declaration(), release="")


def test_entry_lines_say_built_and_why_not() -> None:
    assert ClassEntry("m:A", "allocator", True, "A()").line() == "m:A (allocator): built (A())"
    assert ClassEntry("m:B", "KV pool", False, "GPU").line() == "m:B (KV pool): not built (GPU)"
    assert Found("m", "A", "KV pool").qualified == "m:A"


def test_classes_command_refuses_a_target_without_discovery(capsys) -> None:
    from kvcheck.runner.cli import main

    assert main(["classes", "--target", "kvcheck"]) == 2
    assert "--target='kvcheck' declares no class discovery" in capsys.readouterr().err


def test_the_summary_gives_the_counts_from_the_targets_discovery() -> None:
    from types import SimpleNamespace

    from kvcheck.runner.plugin import _describe_classes
    from kvcheck.runner.summary import _heading

    def listed() -> list[ClassEntry]:
        return [ClassEntry("m:A", "KV pool", True, "A()"), ClassEntry("m:B", "KV pool", False, "x")]

    def broken() -> list[ClassEntry]:
        raise RuntimeError("no package")

    line = _describe_classes(SimpleNamespace(name="fake", classes=listed))
    assert line == "2 pool classes: 1 built, 1 not built; kvcheck classes --target fake lists them"
    assert _describe_classes(SimpleNamespace(name="fake")) == ""
    failed = _describe_classes(SimpleNamespace(name="fake", classes=broken))
    assert failed == "discovery failed (RuntimeError: no package)"
    heading = _heading("verify", {"target": {"name": "fake", "classes": line}})
    assert f"\nclasses: {line}" in heading
