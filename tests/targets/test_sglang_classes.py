"""sglang's pool classes against the target's declaration (:mod:`kvcheck.targets.sglang.classes`).

Runs only with ``KVCHECK_TARGET=sglang`` (it imports every module of sglang's
``srt/mem_cache``). On a checked release every class the package defines has a row, and
every class row names a class the release defines; a module dropped into the package with
a class no row knows is listed as ``not built: new in <release>``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcheck.declaration import Key
from kvcheck.targets.discovery import ClassEntry
from kvcheck.targets.sglang.classes import CLASS_ROWS, PACKAGE
from kvcheck.targets.sglang.release import KNOWN_RELEASES, installed_release
from kvcheck.targets.sglang.target import SGLangTarget

pytestmark = pytest.mark.kvcheck_target("sglang")


def _installed() -> str | None:
    """The installed sglang release, or None without sglang (the mark above then skips
    every test; the conditions below are read while collecting)."""
    try:
        return installed_release()
    except ModuleNotFoundError:
        return None


FAKE_MODULE = "kvcheck_fake_new_pool"


@pytest.fixture(scope="module")
def entries() -> list[ClassEntry]:
    return SGLangTarget().classes()


@pytest.mark.skipif(
    _installed() not in KNOWN_RELEASES, reason="the rows are about checked releases"
)
def test_every_class_of_a_checked_release_is_declared(entries: list[ClassEntry]) -> None:
    new = [entry.line() for entry in entries if entry.why.startswith("new in ")]
    failed = [entry.line() for entry in entries if entry.kind == "module"]
    assert (new, failed) == ([], [])
    assert sum(entry.built for entry in entries) >= 19  # the pools, allocators, host pools


@pytest.mark.skipif(
    _installed() != KNOWN_RELEASES[-1], reason="the rows are about the newest release"
)
def test_every_class_row_names_a_class_the_release_defines(entries: list[ClassEntry]) -> None:
    found = {entry.qualified for entry in entries}
    rows = {row.key.name for row in CLASS_ROWS}
    assert rows - found == set()
    assert all(row.key == Key.upstream(row.key.name) for row in CLASS_ROWS)


@pytest.fixture
def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import sglang.srt.mem_cache as package

    (tmp_path / f"{FAKE_MODULE}.py").write_text(
        "from sglang.srt.mem_cache.memory_pool import KVCache\n\n"
        "class FakeNewKVPool(KVCache):\n    pass\n"
    )
    # The package's search path gains the directory for this test only (a namespace
    # path cannot be edited in place, so it is replaced by a list).
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    try:
        yield f"{PACKAGE}.{FAKE_MODULE}:FakeNewKVPool"
    finally:
        sys.modules.pop(f"{PACKAGE}.{FAKE_MODULE}", None)


def test_a_new_class_in_the_package_is_not_built_new_in_the_release(fake_module: str) -> None:
    entries = {entry.qualified: entry for entry in SGLangTarget().classes()}
    assert entries[fake_module].line() == (
        f"{fake_module} (KV pool): not built: new in {installed_release()}"
    )


def test_the_classes_command_lists_every_class_and_the_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvcheck.runner.cli import main

    assert main(["classes", "--target", "sglang"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "built:" and "not built:" in out
    assert f"{PACKAGE}.qsa_kv_pool:QSATokenToKVPool (KV pool): built (" in "\n".join(out)
    assert out[-1].startswith(f"sglang {installed_release()}: ")
    assert " pool classes: " in out[-1]
