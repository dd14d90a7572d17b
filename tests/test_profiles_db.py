"""Hypothesis profiles (kvcheck.runner.profiles) and the KVCHECK_DB database (kvcheck.runner.db)."""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    InMemoryExampleDatabase,
    MultiplexedDatabase,
)

from kvcheck.runner import profiles
from kvcheck.runner.db import (
    DatabaseSpecError,
    RecordingDatabase,
    StrictDirectoryDatabase,
    TargetDatabase,
    check_writable,
    database_from_spec,
    describe_database,
    recording_test,
    save_errors,
    scan_database,
    stored_examples_fetched,
)


@pytest.fixture(autouse=True)
def restore_hypothesis_profiles() -> Iterator[None]:
    """Registering/loading profiles is process-global: put the registry back afterwards."""
    # Hypothesis offers no public way to unregister a profile, hence the private registry.
    saved = dict(settings._profiles)
    current = settings.get_current_profile_name()
    yield
    settings._profiles.clear()
    settings._profiles.update(saved)
    settings.load_profile(current)


# --- database_from_spec ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", [None, "", "   "], ids=["none", "empty", "blank"])
def test_default_is_hypothesis_examples_under_cwd(tmp_path: Path, spec: str | None) -> None:
    """Unset KVCHECK_DB means .hypothesis/examples under the working directory."""
    db = database_from_spec(spec, cwd=tmp_path)
    assert isinstance(db, DirectoryBasedExampleDatabase)
    assert db.path == tmp_path / ".hypothesis" / "examples"


def test_relative_directory_is_made_absolute(tmp_path: Path) -> None:
    """A relative directory is anchored at cwd so a later chdir does not move it."""
    db = database_from_spec("ci-db", cwd=tmp_path)
    assert isinstance(db, DirectoryBasedExampleDatabase)
    assert db.path == tmp_path / "ci-db"
    assert describe_database(db) == f"directory {tmp_path / 'ci-db'}"


def test_directory_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    """A path naming a regular file is a DatabaseSpecError naming the path."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatabaseSpecError, match="is not a directory"):
        database_from_spec(str(tmp_path / "file"))


def test_local_plus_shared_reads_both_writes_local(tmp_path: Path) -> None:
    """LOCAL:SHARED saves only to LOCAL and fetches from both."""
    shared_dir = tmp_path / "shared"
    DirectoryBasedExampleDatabase(shared_dir).save(b"k", b"from-artifact")
    db = database_from_spec(f"{tmp_path / 'local'}{os.pathsep}{shared_dir}")
    assert isinstance(db, MultiplexedDatabase)
    db.save(b"k", b"new")
    assert set(db.fetch(b"k")) == {b"new", b"from-artifact"}
    assert set(DirectoryBasedExampleDatabase(shared_dir).fetch(b"k")) == {b"from-artifact"}
    assert describe_database(db) == (
        f"directory {tmp_path / 'local'} + read-only directory {shared_dir}"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f"a{os.pathsep}b{os.pathsep}c", "got 3 parts"),
        (f"a{os.pathsep}", "exactly two"),
        (f"a{os.pathsep}missing-shared", "does not exist"),
        ("s3://bucket/db", "unsupported URL scheme 's3'"),
        ("redis://:6379/0", "no host"),
        ("redis://localhost:port/0", "bad port"),
        ("redis://localhost:6379/zero", "is not a number"),
    ],
    ids=["three-parts", "empty-part", "missing-shared", "s3", "no-host", "bad-port", "bad-db"],
)
def test_bad_specs_name_the_setting(tmp_path: Path, spec: str, message: str) -> None:
    """Every unusable KVCHECK_DB raises DatabaseSpecError quoting KVCHECK_DB and the value."""
    with pytest.raises(DatabaseSpecError, match=message) as excinfo:
        database_from_spec(spec, cwd=tmp_path)
    assert "KVCHECK_DB" in str(excinfo.value)


def test_redis_without_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """A redis:// database without the redis package says to install kvcheck[redis]."""
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(DatabaseSpecError, match=r"kvcheck\[redis\]"):
        database_from_spec("redis://localhost:6379/0")


def test_describe_database_of_none_and_unknown() -> None:
    """Disabled and foreign databases get a readable description."""
    assert describe_database(None) == "none (examples are not saved)"
    assert describe_database(InMemoryExampleDatabase()).startswith("InMemoryExampleDatabase")


# --- RecordingDatabase ------------------------------------------------------------------------


def test_recording_counts_fetches_per_test() -> None:
    """Fetched values are counted for the test running; fetches outside any test are not."""
    db = RecordingDatabase(InMemoryExampleDatabase())
    db.save(b"key", b"one")
    db.save(b"key", b"two")
    assert sorted(db.fetch(b"key")) == [b"one", b"two"]  # outside a test: not counted
    with recording_test("test_x"):
        list(db.fetch(b"key"))
        list(db.fetch(b"other"))
    with recording_test("test_y"):
        pass
    assert stored_examples_fetched("test_x") == 2
    assert stored_examples_fetched("test_y") == 0


def test_recording_delegates_writes() -> None:
    """save, move and delete reach the wrapped database."""
    inner = InMemoryExampleDatabase()
    db = RecordingDatabase(inner)
    db.save(b"a", b"v")
    db.move(b"a", b"b", b"v")
    assert list(inner.fetch(b"b")) == [b"v"] and list(inner.fetch(b"a")) == []
    db.delete(b"b", b"v")
    assert list(inner.fetch(b"b")) == []
    assert db == RecordingDatabase(inner)
    assert describe_database(db) == describe_database(inner)


def test_recording_forwards_change_events() -> None:
    """Listeners on the wrapper hear the wrapped database's changes."""
    inner = InMemoryExampleDatabase()
    db = RecordingDatabase(inner)
    events: list[object] = []
    db.add_listener(events.append)
    inner.save(b"k", b"v")
    db.remove_listener(events.append)
    inner.save(b"k", b"w")
    assert events == [("save", (b"k", b"v"))]


def test_recording_rejects_non_database() -> None:
    """Wrapping something that is not an ExampleDatabase is a ValueError."""
    with pytest.raises(ValueError, match="inner="):
        RecordingDatabase({})  # type: ignore[arg-type]


def test_stored_failure_is_replayed_through_the_recording(tmp_path: Path) -> None:
    """A failure saved by one run is fetched, and fails, in a replay-only rerun."""
    db = RecordingDatabase(database_from_spec(str(tmp_path / "db")))

    def make_test(profile: str) -> Callable[[], None]:
        # A fresh function per run, same source: Hypothesis keys the database by source.
        @settings(database=db, **profiles.profile_options(profile))
        @given(st.integers(0, 10))
        def failing(x: int) -> None:
            assert x < 3

        return failing

    with pytest.raises(AssertionError):
        make_test(profiles.DEV)()
    with recording_test("replay"), pytest.raises(AssertionError):
        make_test(profiles.REPLAY)()
    assert stored_examples_fetched("replay") >= 1


# --- profiles -----------------------------------------------------------------------------------


def test_register_profiles_uses_the_given_database() -> None:
    """All four profiles exist, with deadline off, blobs printed and the database on."""
    db = InMemoryExampleDatabase()
    profiles.register_profiles(db)
    for name in profiles.PROFILE_NAMES:
        profile = settings.get_profile(name)
        assert profile.database is db
        assert profile.deadline is None and profile.print_blob
        assert HealthCheck.too_slow in profile.suppress_health_check


def test_profile_sizes() -> None:
    """dev and ci run at least 100 examples; thorough runs thousands; replay only replays."""
    profiles.register_profiles(InMemoryExampleDatabase())
    assert settings.get_profile(profiles.DEV).max_examples >= 100
    assert settings.get_profile(profiles.CI).max_examples >= 100
    assert settings.get_profile(profiles.THOROUGH).max_examples >= 1000
    assert settings.get_profile(profiles.REPLAY).phases == (Phase.explicit, Phase.reuse)
    assert 0 < settings.get_profile(profiles.SMOKE).max_examples < 100


def test_ci_profile_keeps_the_database_hypothesis_ci_drops() -> None:
    """Hypothesis's own ci profile has no database; kvcheck-ci keeps one."""
    db = InMemoryExampleDatabase()
    profiles.register_profiles(db)
    assert settings.get_profile("ci").database is None
    assert settings.get_profile(profiles.CI).database is db


def test_register_profiles_reads_kvcheck_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a database argument the profiles use KVCHECK_TARGET's share of KVCHECK_DB,
    wrapped for recording."""
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    monkeypatch.setenv("KVCHECK_TARGET", "mypkg:pool")
    profiles.register_profiles()
    db = settings.get_profile(profiles.DEV).database
    assert isinstance(db, RecordingDatabase)
    assert isinstance(db.inner, TargetDatabase) and db.inner.target == "mypkg:pool"
    assert isinstance(db.inner.inner, DirectoryBasedExampleDatabase)
    assert db.inner.inner.path == tmp_path / "db"


def test_register_profiles_rejects_non_database() -> None:
    """A database argument that is not an ExampleDatabase is a ValueError."""
    with pytest.raises(ValueError, match="database="):
        profiles.register_profiles("somewhere")  # type: ignore[arg-type]


def test_profile_options_rejects_unknown_name() -> None:
    """Only kvcheck's profile names have options."""
    with pytest.raises(ValueError, match="name='fast'"):
        profiles.profile_options("fast")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, profiles.DEV),
        ({"CI": "true"}, profiles.CI),
        ({"CI": ""}, profiles.CI),
        ({"CI": "1", "KVCHECK_PROFILE": "kvcheck-thorough"}, profiles.THOROUGH),
    ],
    ids=["local", "ci", "ci-empty", "env-wins"],
)
def test_default_profile_name(environ: dict[str, str], expected: str) -> None:
    """KVCHECK_PROFILE, else kvcheck-ci when CI is set (any value), else kvcheck-dev."""
    assert profiles.default_profile_name(environ) == expected


@pytest.mark.parametrize(
    ("kvcheck_option", "hypothesis_option", "current", "environ", "expected"),
    [
        ("kvcheck-thorough", None, "default", {}, "kvcheck-thorough"),
        (None, "my-profile", "default", {"KVCHECK_PROFILE": "kvcheck-ci"}, None),
        (None, None, "project", {"KVCHECK_PROFILE": "kvcheck-thorough"}, "kvcheck-thorough"),
        (None, None, "default", {}, "kvcheck-dev"),
        (None, None, "default", {"CI": "1"}, "kvcheck-ci"),
        (None, None, "ci", {"GITHUB_ACTIONS": "true"}, "kvcheck-ci"),
        (None, None, "kvcheck-ci", {}, "kvcheck-dev"),
        (None, None, "project", {}, None),
    ],
    ids=[
        "option",
        "hypothesis-option-wins-over-env",
        "env",
        "default-local",
        "default-ci",
        "hypothesis-ci-replaced",
        "earlier-session",
        "project-profile-kept",
    ],
)
def test_choose_profile_to_load(
    kvcheck_option: str | None,
    hypothesis_option: str | None,
    current: str,
    environ: dict[str, str],
    expected: str | None,
) -> None:
    """The plugin's profile choice, in precedence order."""
    chosen = profiles.choose_profile_to_load(
        kvcheck_option=kvcheck_option,
        hypothesis_option=hypothesis_option,
        current=current,
        environ=environ,
    )
    assert chosen == expected


def test_the_install_recipe_variable_is_known() -> None:
    """KVCHECK_SGLANG_VERSION (the README sets it for scripts/install_sglang.sh) draws no
    "unknown variable" warning; a typo of it still does, with the right name."""
    assert profiles.unknown_env_warnings({"KVCHECK_SGLANG_VERSION": "0.5.22"}) == []
    assert profiles.unknown_env_warnings({"KVCHECK_SGLANG_VERSON": "0.5.22"}) == [
        "unknown variable KVCHECK_SGLANG_VERSON='0.5.22' is ignored "
        "(did you mean KVCHECK_SGLANG_VERSION?)"
    ]


_ROOT = Path(__file__).resolve().parents[1]
_ENV_NAME = re.compile(r"KVCHECK_[A-Z0-9_]+")


def _variables_read_or_passed_on() -> dict[str, str]:
    """Each KVCHECK_* variable the package, its scripts and CI read or set for a child
    process, with one file that does: names as whole string constants in Python (not in
    docstrings or examples), ``$NAME``/``${NAME`` and ``NAME=`` in shell."""
    found: dict[str, str] = {}
    for root in ("kvcheck", "scripts"):
        for path in sorted((_ROOT / root).rglob("*.py")):
            if path.name == "profiles.py" and path.parent.name == "runner":
                continue  # the list itself
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and _ENV_NAME.fullmatch(value):
                    found.setdefault(value, str(path.relative_to(_ROOT)))
    shell = [*sorted((_ROOT / "scripts").glob("*.sh")), _ROOT / ".ci" / "run"]
    for path in shell:
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"\$\{?(KVCHECK_[A-Z0-9_]+)|\b(KVCHECK_[A-Z0-9_]+)=", text):
            found.setdefault(match.group(1) or match.group(2), str(path.relative_to(_ROOT)))
    return found


def test_every_variable_kvcheck_reads_is_known() -> None:
    """No KVCHECK_* variable that kvcheck, its scripts or CI read is called unknown: each is
    in KNOWN_ENV_VARS."""
    found = _variables_read_or_passed_on()
    assert {"KVCHECK_TARGET", "KVCHECK_SGLANG_VERSION", "KVCHECK_CI_SCRATCH"} <= set(found)
    missing = {name: where for name, where in found.items() if name not in profiles.KNOWN_ENV_VARS}
    assert not missing, f"add to KNOWN_ENV_VARS (kvcheck/runner/profiles.py): {missing}"


# --- the database never fails silently ------------------------------------------------------


def test_hypothesis_drops_save_errors_strict_database_raises(tmp_path: Path) -> None:
    """Hypothesis's directory database swallows a failed save; kvcheck's raises it."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    DirectoryBasedExampleDatabase(blocker / "db").save(b"k", b"v")  # silently lost
    with pytest.raises(OSError):
        StrictDirectoryDatabase(blocker / "db").save(b"k", b"v")


def test_recording_database_records_failed_saves_per_test(tmp_path: Path) -> None:
    """A failed save (or move) is recorded for the running test instead of raised or lost."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    db = RecordingDatabase(StrictDirectoryDatabase(blocker / "db"))
    with recording_test("test_lost"):
        db.save(b"k", b"v")
        db.move(b"k", b"k2", b"v")
    reasons = save_errors("test_lost")
    assert len(reasons) == 2 and all("Error" in reason for reason in reasons)
    with recording_test("test_lost"):  # a new run of the test starts clean
        pass
    assert save_errors("test_lost") == []


def test_check_writable_names_the_directory(tmp_path: Path) -> None:
    """An uncreatable database directory is a DatabaseSpecError naming it; a good one passes."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DatabaseSpecError, match="cannot write failing examples to"):
        check_writable(database_from_spec(str(blocker / "db")))
    check_writable(database_from_spec(str(tmp_path / "new" / "db")))
    assert (tmp_path / "new" / "db").is_dir() and not list((tmp_path / "new" / "db").iterdir())


def test_scan_counts_entries_and_undecodable_ones(tmp_path: Path) -> None:
    """scan_database counts stored examples, those that cannot be decoded, missing dirs."""
    from hypothesis.database import choices_to_bytes

    db = database_from_spec(str(tmp_path / "db"))
    assert scan_database(db).missing == (str(tmp_path / "db"),)
    db.save(b"key", choices_to_bytes((1, True)))
    db.save(b"key", b"\xff")
    scan = scan_database(db)
    assert (scan.entries, scan.undecodable, scan.missing) == (2, 1, ())
