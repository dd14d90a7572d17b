"""Failures belong to the target that found them (issue 32, item 2).

A downstream project in ``tmp_path`` with one buggy target class, run by pytest in a
subprocess: its examples are keyed by the target each test uses, by that target's identity
(not its spelling), and examples no target can claim are never archived nor "fixed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from kvcheck.runner.db import TargetDatabase, scan_database, stored_targets
from kvcheck.targets import resolve_target, target_identity

#: The identity of ``my_pkg.kv:MyTarget``, however it is spelled.
MY_TARGET = "my_pkg.kv:MyTarget"

_TARGET = """
    from kvcheck.pools import MHATokenToKVPool
    from kvcheck.targets.builtin import KVCheckTarget


    class NoMovePool(MHATokenToKVPool):
        def move_kv_cache(self, tgt_loc, src_loc):
            pass  # the other bug: a move copies nothing


    class MyTarget(KVCheckTarget):
        def clamp(self, x):
            return x  # the bug: no upper bound

        def make_pool(self, spec, *, device):
            if spec.variant != "mha":
                return super().make_pool(spec, device=device)
            return self.pool_arguments(spec, device=device).build(NoMovePool)


    buggy = MyTarget()
"""
#: Each way a test picks its target other than the run's: strategies' target=, a
#: parameter, the project's own fixture.
_OWN_TARGET_TESTS = """
    import pytest
    from hypothesis import given, strategies as st
    from kvcheck import strategies as kst

    from my_pkg.kv import buggy


    @given(spec=kst.pool_specs(families=("mha",), target=buggy), x=st.integers(0, 10_000))
    def test_by_strategy(kvcheck_device, spec, x):
        assert buggy.clamp(x) <= 100


    @pytest.mark.parametrize("kvcheck_target", [buggy])
    @given(x=st.integers(0, 10_000))
    def test_by_parameter(kvcheck_target, x):
        assert kvcheck_target.clamp(x) <= 100


    def test_by_machine(kvcheck_device):
        from hypothesis.stateful import run_state_machine_as_test
        from kvcheck.machines import pool_machine

        machine = pool_machine(buggy, device=kvcheck_device, family="mha")
        run_state_machine_as_test(machine, settings=machine.TestCase.settings)
"""
_OWN_FIXTURE = """
    import pytest
    from my_pkg.kv import buggy


    @pytest.fixture
    def kvcheck_target():
        return buggy
"""
_FIXTURE_TEST = """
    from hypothesis import given, strategies as st


    @given(x=st.integers(0, 10_000))
    def test_by_fixture(kvcheck_target, x):
        assert kvcheck_target.clamp(x) <= 100
"""
#: A property of the run's target (its ``kvcheck_target`` fixture); LIMIT says how buggy.
_RUN_TARGET_TEST = """
    import os
    from hypothesis import given, strategies as st


    @given(x=st.integers(0, 10_000))
    def test_clamp(kvcheck_target, x):
        clamp = getattr(kvcheck_target, "clamp", lambda x: min(x, 100))
        assert clamp(x) <= int(os.environ.get("LIMIT", "100"))
"""


def _project(root: Path, tests: dict[str, str]) -> Path:
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "kv.py").write_text(textwrap.dedent(_TARGET))
    for name, source in tests.items():
        (root / name).write_text(textwrap.dedent(source))
    return root


def _pytest(root: Path, db: Path, *args: str, limit: int = 100) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVCHECK_", "PYTEST_", "HYPOTHESIS_")) and k != "CI"
    }
    env.update(KVCHECK_DB=str(db), LIMIT=str(limit))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly"]
    return subprocess.run(
        [*command, "--kvcheck-device=cpu", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_examples_are_keyed_by_the_target_each_test_uses(tmp_path: Path) -> None:
    """A project's tests that pick their own target (strategies' target=, a parameter, the
    project's kvcheck_target fixture, a machine built for it, as examples/own_pool's are)
    store their failures under it, not under the run's target, and the header after
    collection names it (a machine's test: as decided when it runs)."""
    root = _project(
        tmp_path / "project",
        {"test_own.py": _OWN_TARGET_TESTS, "conftest.py": _OWN_FIXTURE},
    )
    (root / "sub").mkdir()
    (root / "sub" / "conftest.py").write_text(textwrap.dedent(_OWN_FIXTURE))
    (root / "sub" / "test_fixture.py").write_text(textwrap.dedent(_FIXTURE_TEST))
    (root / "conftest.py").unlink()  # the fixture overrides kvcheck's in sub/ only
    result = _pytest(root, tmp_path / "db")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "4 failed" in result.stdout
    assert MY_TARGET in result.stdout  # after collection: the targets the tests use
    assert "the target it builds for when it runs, else kvcheck (1 tests)" in result.stdout
    shared = DirectoryBasedExampleDatabase(tmp_path / "db")
    assert stored_targets(shared) == [MY_TARGET]
    assert scan_database(shared).holdings(MY_TARGET).entries >= 4


def test_a_target_is_keyed_by_its_identity_not_its_spelling(tmp_path: Path) -> None:
    """An instance and its class name one target: examples stored under --kvcheck-target
    my_pkg.kv:buggy replay under my_pkg.kv:MyTarget, and examples an older kvcheck keyed by
    the spelling are read too."""
    root = _project(tmp_path / "project", {"test_clamp.py": _RUN_TARGET_TEST})
    db = tmp_path / "db"
    found = _pytest(root, db, "--kvcheck-target=my_pkg.kv:buggy")
    assert found.returncode == 1, found.stdout + found.stderr
    assert stored_targets(DirectoryBasedExampleDatabase(db)) == [MY_TARGET]
    replay = ("--kvcheck-profile=kvcheck-replay", f"--kvcheck-target={MY_TARGET}")
    replayed = _pytest(root, db, *replay)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    # A database an older kvcheck keyed by the spelling: read under the identity.
    old = tmp_path / "old-db"
    _pytest(root, old, "--kvcheck-target=my_pkg.kv:buggy")
    _rekey(DirectoryBasedExampleDatabase(old), MY_TARGET, "my_pkg.kv:buggy")
    assert stored_targets(DirectoryBasedExampleDatabase(old)) == ["my_pkg.kv:buggy"]
    from_old = _pytest(
        root, old, "--kvcheck-profile=kvcheck-replay", "--kvcheck-target=my_pkg.kv:buggy"
    )
    assert from_old.returncode == 1, from_old.stdout + from_old.stderr


def test_identity_is_the_class_and_its_parameters() -> None:
    """Built-ins keep their names; a broken target class keys each pool it serves apart."""
    assert target_identity(resolve_target("kvcheck")) == "kvcheck"
    assert target_identity(resolve_target("kvcheck.targets.builtin:KVCheckTarget")) == "kvcheck"
    one, two = (resolve_target(f"repro_targets:{n}") for n in ("MOVE_IGNORES_V", "SILENT_NOOP"))
    assert target_identity(one) != target_identity(two)
    assert target_identity(resolve_target("repro_targets:broken_factory")) == target_identity(one)


def test_examples_no_target_can_claim_are_never_archived_nor_fixed(tmp_path: Path) -> None:
    """Examples stored without a target (an older kvcheck) are replayed against the run's
    target but, when they pass there, stay where they are, and the test is not "fixed"."""
    root = _project(tmp_path / "project", {"test_clamp.py": _RUN_TARGET_TEST})
    db = tmp_path / "db"
    assert _pytest(root, db, "--kvcheck-target=my_pkg.kv:buggy").returncode == 1
    shared = DirectoryBasedExampleDatabase(db)
    for name in stored_targets(shared):
        _rekey(shared, name, None)  # as a kvcheck before target keys stored them
    legacy = scan_database(shared).legacy
    assert legacy
    results = tmp_path / "results.json"
    replayed = _pytest(
        root, db, "--kvcheck-profile=kvcheck-replay", f"--kvcheck-results={results}", limit=20_000
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    scan = scan_database(shared)
    assert scan.legacy == legacy
    assert scan.holdings("kvcheck").entries == scan.holdings("kvcheck").archived == 0
    (test,) = json.loads(results.read_text())["tests"]
    assert test["stored_examples"] == 0  # nothing of the target's: never "fixed"


def _rekey(shared: DirectoryBasedExampleDatabase, target: str, to: str | None) -> None:
    """Move ``target``'s examples to ``to``'s keys (None: no target at all), and its index."""
    from kvcheck.runner import db

    keys = list(shared.fetch(db._keys_key(target)))
    for key in keys:
        for value in list(shared.fetch(db._target_prefix(target) + key)):
            if to is None:
                shared.move(db._target_prefix(target) + key, key, value)
            else:
                TargetDatabase(shared, to).save(key, value)
                shared.delete(db._target_prefix(target) + key, value)
        shared.delete(db._keys_key(target), key)
    shared.delete(db.TARGETS_KEY, target.encode())


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
