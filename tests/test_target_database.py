"""Stored examples are keyed by target: no run of one target loses another's.

Unit tests of :class:`kvcheck.runner.db.TargetDatabase` and the per-target scan, then the
data-loss scenario end to end through ``kvcheck verify``/``kvcheck replay`` on a directory
database (the Redis side is in ``test_redis_db.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase
from two_targets import BUGGY, FAILING_TEST, environment, write_project

from kvcheck.runner import profiles
from kvcheck.runner.cli import main
from kvcheck.runner.db import (
    TargetDatabase,
    TargetHoldings,
    describe_database,
    scan_database,
    stored_targets,
)


def _property(database: object, profile: str, *, limit: int) -> Callable[[], None]:
    """A fresh property with the same source each time (Hypothesis keys it by source)."""

    @settings(database=database, **profiles.profile_options(profile))
    @given(st.integers(0, 1000))
    def property_under_test(x: int) -> None:
        assert x < limit

    return property_under_test


def _files(directory: Path) -> int:
    return sum(1 for path in directory.rglob("*") if path.is_file())


# --- the wrapper ----------------------------------------------------------------------------------


def test_one_targets_examples_are_invisible_to_another() -> None:
    """A save under one target is fetched by that target only."""
    shared = InMemoryExampleDatabase()
    TargetDatabase(shared, "mypkg:buggy").save(b"test", b"example")
    assert list(TargetDatabase(shared, "kvcheck").fetch(b"test")) == []
    assert list(TargetDatabase(shared, "mypkg:buggy").fetch(b"test")) == [b"example"]


def test_delete_and_move_stay_inside_the_target() -> None:
    """Another target's delete and move of the same key and value leave the example alone."""
    shared = InMemoryExampleDatabase()
    buggy, healthy = TargetDatabase(shared, "buggy"), TargetDatabase(shared, "healthy")
    buggy.save(b"test", b"example")
    healthy.delete(b"test", b"example")
    healthy.move(b"test", b"test.secondary", b"example")
    assert list(buggy.fetch(b"test")) == [b"example"]
    assert list(buggy.fetch(b"test.secondary")) == []
    buggy.move(b"test", b"test.secondary", b"example")
    assert list(buggy.fetch(b"test")) == []
    assert list(buggy.fetch(b"test.secondary")) == [b"example"]


def test_a_passing_run_of_another_target_keeps_the_failure(tmp_path: Path) -> None:
    """Hypothesis itself, run for the healthy target, neither replays nor deletes the buggy
    target's example; the buggy target's replay still fails."""
    shared = DirectoryBasedExampleDatabase(tmp_path / "db")
    with pytest.raises(AssertionError):
        _property(TargetDatabase(shared, "buggy"), profiles.DEV, limit=500)()
    stored = _files(tmp_path / "db")
    _property(TargetDatabase(shared, "healthy"), profiles.DEV, limit=2000)()
    assert _files(tmp_path / "db") >= stored
    assert scan_database(shared).holdings("buggy").entries >= 1
    with pytest.raises(AssertionError):
        _property(TargetDatabase(shared, "buggy"), profiles.REPLAY, limit=500)()


def test_an_older_kvchecks_examples_are_read_and_never_deleted(tmp_path: Path) -> None:
    """An example stored under the bare key (kvcheck before target keys) is replayed by a
    target; when it passes there it is not deleted, since it may be another target's."""
    shared = DirectoryBasedExampleDatabase(tmp_path / "db")
    with pytest.raises(AssertionError) as excinfo:
        _property(shared, profiles.DEV, limit=500)()  # an older kvcheck: no target in the key
    assert "x=500" in "\n".join(getattr(excinfo.value, "__notes__", []))
    legacy = scan_database(shared).legacy
    assert legacy is not None and legacy >= 1
    with pytest.raises(AssertionError) as excinfo:
        _property(TargetDatabase(shared, "kvcheck"), profiles.REPLAY, limit=500)()
    assert "x=500" in "\n".join(getattr(excinfo.value, "__notes__", []))
    _property(TargetDatabase(shared, "kvcheck"), profiles.REPLAY, limit=2000)()  # fixed
    assert scan_database(shared).legacy == legacy


def test_stored_targets_and_scan_count_per_target(tmp_path: Path) -> None:
    """The scan lists each target that stored examples, its counts, and what is legacy."""
    shared = DirectoryBasedExampleDatabase(tmp_path / "db")
    with pytest.raises(AssertionError):
        _property(TargetDatabase(shared, "b"), profiles.DEV, limit=500)()
    TargetDatabase(shared, "a").save(b"key", b"\xff")  # undecodable
    shared.save(b"old", b"\xff")  # an older kvcheck's, undecodable
    assert stored_targets(shared) == ["a", "b"]
    scan = scan_database(shared)
    assert scan.holdings("a") == TargetHoldings("a", entries=1, undecodable=1)
    held_b = scan.holdings("b")
    assert held_b.entries >= 1 and held_b.undecodable == 0
    assert scan.legacy == 1
    assert scan.entries == 1 + held_b.entries + 1
    assert scan.undecodable == 2
    assert scan.holdings("never ran") == TargetHoldings("never ran")


def test_target_name_is_validated() -> None:
    """An empty target name or one with NUL is refused, naming the argument."""
    for bad in ("", "  ", "a\x00b"):
        with pytest.raises(ValueError, match="target="):
            TargetDatabase(InMemoryExampleDatabase(), bad)
    with pytest.raises(ValueError, match="inner="):
        TargetDatabase(object(), "kvcheck")  # type: ignore[arg-type]


def test_description_names_the_target(tmp_path: Path) -> None:
    """Report headers say whose examples a run reads and writes."""
    db = TargetDatabase(DirectoryBasedExampleDatabase(tmp_path), "sglang")
    assert describe_database(db) == f"directory {tmp_path} (examples of target 'sglang')"


def test_change_events_come_back_without_the_target_prefix() -> None:
    """Listeners see this target's saves under the test's own key, and no other target's."""
    shared = InMemoryExampleDatabase()
    db = TargetDatabase(shared, "a")
    events: list[object] = []
    db.add_listener(events.append)
    db.save(b"test", b"v")
    TargetDatabase(shared, "b").save(b"test", b"w")
    db.remove_listener(events.append)
    assert events == [("save", (b"test", b"v"))]


# --- the data-loss scenario through the kvcheck command ---------------------------------------


@pytest.fixture
def two_target_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The two-target project, with the command's environment and a fresh working dir."""
    root = write_project(tmp_path / "project")
    for name, value in environment(root, str(tmp_path / "db")).items():
        monkeypatch.setenv(name, value)
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")) and name != "KVCHECK_DB":
            monkeypatch.delenv(name)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.syspath_prepend(str(root))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return root


def test_replay_without_target_keeps_and_replays_each_targets_failure(
    two_target_project: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """verify on the buggy target stores its failure; verify on kvcheck and replay without
    --target keep it, and replay names the target and reproduces it."""
    suite = ["--suite", str(two_target_project), "--device", "cpu", "-q"]
    assert main(["verify", "--target", BUGGY, *suite]) == 1
    stored = scan_database(DirectoryBasedExampleDatabase(tmp_path / "db")).holdings(BUGGY)
    assert stored.entries >= 1
    assert main(["verify", *suite]) == 0  # the built-in target passes, on the same database
    assert main(["replay", *suite]) == 1  # no --target: the buggy target's, still failing
    out = capfd.readouterr().out
    assert f"of target {BUGGY!r}" in out and "still failing" in out and FAILING_TEST in out
    after = scan_database(DirectoryBasedExampleDatabase(tmp_path / "db")).holdings(BUGGY)
    assert after.entries >= stored.entries
    assert main(["replay", "--target", BUGGY, *suite]) == 1


def test_replay_of_a_target_with_nothing_stored_names_the_targets_that_have(
    two_target_project: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """replay --target kvcheck on a database holding only the buggy target's examples is
    exit 2 with the command that replays them."""
    suite = ["--suite", str(two_target_project), "--device", "cpu", "-q"]
    assert main(["verify", "--target", BUGGY, *suite]) == 1
    capfd.readouterr()
    assert main(["replay", "--target", "kvcheck", *suite]) == 2
    error = capfd.readouterr().err
    assert "nothing to replay for target 'kvcheck'" in error
    assert f"kvcheck replay --target {BUGGY}" in error


def test_replay_without_target_replays_every_target_in_turn(
    two_target_project: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two targets with stored examples: each is replayed against itself, named, with its
    results in its own directory; --json needs one target."""
    suite = ["--suite", str(two_target_project), "--device", "cpu", "-q"]
    assert main(["verify", "--target", BUGGY, *suite]) == 1
    other = BUGGY.replace("buggy_target", "other_target")
    (two_target_project / "other_target.py").write_text(
        (two_target_project / "buggy_target.py").read_text()
    )
    assert main(["verify", "--target", other, *suite]) == 1
    capfd.readouterr()
    assert main(["replay", *suite, "--json", "out.json"]) == 2
    assert "choose one with --target" in capfd.readouterr().err
    assert main(["replay", *suite]) == 1
    out = capfd.readouterr().out
    assert f"target 1 of 2: {BUGGY!r}" in out and f"target 2 of 2: {other!r}" in out
    assert Path(".kvcheck/replay-buggy_target-BuggyTarget/results.json").is_file()
    assert Path(".kvcheck/replay-other_target-BuggyTarget/results.json").is_file()
