"""The Hypothesis example database that ``KVCHECK_DB`` names.

Failures reproduce because Hypothesis stores every failing example and replays it first on
the next run. ``KVCHECK_DB`` says where they are stored:

- unset or empty: ``.hypothesis/examples`` under the current directory;
- a directory path: that directory (created on first write);
- ``LOCAL{os.pathsep}SHARED``: write to ``LOCAL``, also read ``SHARED`` without ever writing
  to it (a database another runner uploaded as a CI artifact);
- ``redis://host:port/db``: a Redis server several runners share (needs
  ``pip install 'kvcheck[redis]'``).

Stored examples are the user's data, and one database may serve several targets (a CI
runner's Redis server checks ``kvcheck``, ``sglang`` and a team's own pool). So every run
sees the database through :class:`TargetDatabase`, which keys each example by the target
it failed on as well as by the test: a run of one target never replays, shrinks or deletes
another target's examples. A target is keyed by its identity
(:func:`kvcheck.targets.target_identity`: its class and the parameters that change what it
builds), never by how ``--target`` spelled it; the pytest plugin keys each test by the
target that test really uses (:class:`PerTestTargetDatabase`). The database also lists which
targets stored examples in it (:func:`stored_targets`), which is how ``kvcheck replay``
without ``--target`` knows what to replay. Examples an older kvcheck stored without a
target (keyed by test only), or under the target of a run that a test did not use, are
read but never moved, archived or counted as the target's
(:func:`unattributed_examples_fetched`).

:class:`RecordingDatabase` wraps any of them and counts, per running test, how many stored
examples the test fetched, which is how ``kvcheck replay`` knows what had something to
replay, and how many of them could not be decoded (an empty entry among them), which is
how ``kvcheck replay`` knows whether a pass replayed every stored example.

A database that cannot be written is never silent: :func:`check_writable` (run before the
suite) creates the directory and a probe file, and :class:`RecordingDatabase` records, per
test, every save that failed (Hypothesis's own directory database drops write errors), which
the plugin and ``kvcheck verify`` then report. :func:`scan_database` counts what a database
holds, per target, and how much of it cannot be decoded, before ``kvcheck replay`` and
``kvcheck verify`` run: an entry that is empty or is not a serialized example is damage,
and the command stops before any test runs (:meth:`DatabaseScan.damaged`).

Example:
    >>> db = database_from_spec("/tmp/kvcheck-db")
    >>> describe_database(db)
    'directory /tmp/kvcheck-db'
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
    choices_from_bytes,
)

__all__ = [
    "DATABASE_ENV_VAR",
    "DEFAULT_DATABASE_DIR",
    "DatabaseScan",
    "DatabaseSpecError",
    "PerTestTargetDatabase",
    "RecordingDatabase",
    "StrictDirectoryDatabase",
    "TargetDatabase",
    "TargetHoldings",
    "blocked_directory",
    "check_writable",
    "database_from_env",
    "database_from_spec",
    "describe_database",
    "keyed_by_test_target",
    "probe_directory",
    "recording_test",
    "save_errors",
    "scan_database",
    "stored_examples_damaged",
    "stored_examples_fetched",
    "stored_targets",
    "unattributed_examples_fetched",
]

DATABASE_ENV_VAR = "KVCHECK_DB"
#: Relative to the current directory, like Hypothesis's own default.
DEFAULT_DATABASE_DIR = Path(".hypothesis") / "examples"
_REDIS_SCHEMES = ("redis", "rediss")
#: A shared database must not hang a run: fail fast when the server is unreachable.
_REDIS_CONNECT_TIMEOUT_S = 5.0
_REDIS_OPERATION_TIMEOUT_S = 30.0


class DatabaseSpecError(ValueError):
    """A ``KVCHECK_DB`` value that does not name a usable database."""


class StrictDirectoryDatabase(DirectoryBasedExampleDatabase):
    """A directory database whose failed saves raise ``OSError`` instead of vanishing.

    Hypothesis's :class:`~hypothesis.database.DirectoryBasedExampleDatabase` swallows every
    ``OSError`` while saving, so an unwritable directory loses failing examples without a
    word. This one checks that the value landed and, when it did not, repeats the write
    itself so that the real error (permission, disk full) surfaces.

    Example:
        >>> import tempfile
        >>> db = StrictDirectoryDatabase(Path(tempfile.mkdtemp()) / "db")
        >>> db.save(b"k", b"v")
        >>> list(db.fetch(b"k"))
        [b'v']
    """

    def __repr__(self) -> str:
        return f"StrictDirectoryDatabase({self.path!r})"

    def save(self, key: bytes, value: bytes) -> None:
        super().save(key, value)
        path = self._value_path(key, value)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)  # raises the OSError Hypothesis swallowed


def database_from_spec(
    spec: str | None, *, cwd: Path | None = None, check_connection: bool = True
) -> ExampleDatabase:
    """Build the example database ``spec`` (a ``KVCHECK_DB`` value) names.

    Relative paths are taken from ``cwd`` (default: the current directory) and made
    absolute, so a later ``chdir`` does not move the database. A ``redis://`` database is
    pinged unless ``check_connection`` is False.

    Example:
        >>> import os
        >>> db = database_from_spec("local" + os.pathsep + "/tmp", cwd=Path("/work"))
        >>> describe_database(db)
        'directory /work/local + read-only directory /tmp'
    """
    base = Path.cwd() if cwd is None else Path(cwd)
    text = "" if spec is None else spec.strip()
    if not text:
        return StrictDirectoryDatabase(base / DEFAULT_DATABASE_DIR)
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in _REDIS_SCHEMES:
        return _redis_database(text, check_connection=check_connection)
    if "://" in text:
        raise DatabaseSpecError(
            f"{DATABASE_ENV_VAR}={text!r}: unsupported URL scheme {scheme!r}; use a directory, "
            f"LOCAL{os.pathsep}SHARED directories, or redis://host:port/db"
        )
    parts = text.split(os.pathsep)
    if len(parts) == 1:
        return StrictDirectoryDatabase(_directory(text, base, role="database"))
    if len(parts) == 2 and all(part.strip() for part in parts):
        local = _directory(parts[0].strip(), base, role="local database")
        shared = _directory(parts[1].strip(), base, role="shared database")
        if not shared.is_dir():
            raise DatabaseSpecError(
                f"{DATABASE_ENV_VAR}={text!r}: the shared (read-only) database {str(shared)!r} "
                "does not exist; download it first or drop it from the setting"
            )
        return MultiplexedDatabase(
            StrictDirectoryDatabase(local),
            ReadOnlyDatabase(DirectoryBasedExampleDatabase(shared)),
        )
    raise DatabaseSpecError(
        f"{DATABASE_ENV_VAR}={text!r}: expected one directory or exactly two joined by "
        f"{os.pathsep!r} (LOCAL{os.pathsep}SHARED), got {len(parts)} parts"
    )


def database_from_env(*, writable: bool = False) -> ExampleDatabase:
    """The database ``KVCHECK_DB`` names (:func:`database_from_spec`); with ``writable``,
    also checked with probe files (:func:`check_writable`).

    Example:
        >>> isinstance(database_from_env(), ExampleDatabase)
        True
    """
    database = database_from_spec(os.environ.get(DATABASE_ENV_VAR))
    if writable:
        check_writable(database)
    return database


def describe_database(db: Any) -> str:
    """One line saying where ``db`` keeps examples, for report headers and summaries.

    Example:
        >>> describe_database(None)
        'none (examples are not saved)'
    """
    if db is None:
        return "none (examples are not saved)"
    if isinstance(db, RecordingDatabase):
        return describe_database(db.inner)
    if isinstance(db, TargetDatabase):
        return f"{describe_database(db.inner)} (examples of target {db.target!r})"
    if isinstance(db, PerTestTargetDatabase):
        return (
            f"{describe_database(db.inner)} (examples keyed by the target each test uses; "
            f"default {db.default!r})"
        )
    if isinstance(db, DirectoryBasedExampleDatabase):
        return f"directory {db.path}"
    # Hypothesis keeps the wrapped databases in ``_wrapped``; fall back to repr without it.
    wrapped = getattr(db, "_wrapped", None)
    if isinstance(db, ReadOnlyDatabase) and wrapped is not None:
        return f"read-only {describe_database(wrapped)}"
    if isinstance(db, MultiplexedDatabase) and wrapped is not None:
        return " + ".join(describe_database(part) for part in wrapped)
    redis_client = getattr(db, "redis", None)
    if redis_client is not None:
        kwargs = redis_client.connection_pool.connection_kwargs
        host, port, number = kwargs.get("host"), kwargs.get("port"), kwargs.get("db", 0)
        return f"redis redis://{host}:{port}/{number}"
    return repr(db)


def check_writable(db: ExampleDatabase) -> None:
    """Raise :class:`DatabaseSpecError` unless every directory ``db`` writes to is usable.

    Creates each writable directory (read-only parts are only read) and a probe file in it,
    then removes the probe: what a failing example's save would do, done before the run.
    Other databases (Redis) were checked when they were built.

    Example:
        >>> import tempfile
        >>> check_writable(database_from_spec(tempfile.mkdtemp()))
    """
    for directory in _written_directories(db):
        blocked = blocked_directory(directory)
        if blocked is not None:
            raise DatabaseSpecError(
                f"{DATABASE_ENV_VAR}: cannot write failing examples to {str(directory)!r}: "
                f"{blocked}; point KVCHECK_DB at a directory"
            )
        try:
            probe_directory(directory)
        except OSError as exc:
            raise DatabaseSpecError(
                f"{DATABASE_ENV_VAR}: cannot write failing examples to {str(directory)!r} "
                f"({type(exc).__name__}: {exc.strerror or exc}); fix its permissions or "
                "point KVCHECK_DB at a writable directory"
            ) from exc


def blocked_directory(directory: Path) -> str | None:
    """Why ``directory`` cannot be made, said plainly, where the reason is its path: it or
    a parent is a file, or a symbolic link to nowhere; None otherwise (permissions are
    left to the probe, whose error says them).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "gone").symlink_to(root / "missing")
        >>> blocked_directory(root / "gone" / "db")  # doctest: +ELLIPSIS
        "'.../gone' is a symbolic link to '.../missing', which does not exist"
        >>> (root / "file").touch()
        >>> blocked_directory(root / "file" / "db")  # doctest: +ELLIPSIS
        "'.../file' is a file, not a directory"
    """
    for path in (directory, *directory.parents):
        if path.is_symlink() and not path.exists():
            return (
                f"{str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist"
            )
        if path.exists():
            return None if path.is_dir() else f"{str(path)!r} is a file, not a directory"
    return None


def probe_directory(directory: Path) -> None:
    """Create ``directory`` and a probe file in it, then remove the probe; ``OSError`` if not.

    Example:
        >>> import tempfile
        >>> probe_directory(Path(tempfile.mkdtemp()) / "new")
    """
    probe = directory / f".kvcheck-probe-{uuid.uuid4().hex}"
    directory.mkdir(parents=True, exist_ok=True)
    probe.write_bytes(b"probe")
    probe.unlink()


@dataclass(frozen=True)
class TargetHoldings:
    """The stored examples of one target: how many, how many cannot be decoded, and how
    many Hypothesis would have deleted (fixed, undecodable) and kvcheck archived instead."""

    target: str
    entries: int = 0
    undecodable: int = 0
    archived: int = 0


@dataclass(frozen=True)
class DatabaseScan:
    """What a database holds: entries (all of them), undecodable entries, per target.

    ``targets`` lists every target that stored examples, with its counts (a target whose
    examples all replayed as fixed shows 0 entries, and keeps them in its archive, which
    ``entries`` leaves out). ``legacy`` counts the examples an older
    kvcheck stored without a target (``None`` where they cannot be counted: Redis).
    ``missing`` lists the directories that do not exist; ``scanned`` is False where the
    total cannot be counted (Redis), whose ``entries`` and ``undecodable`` then count the
    targets' examples only. ``legacy_undecodable`` counts the older kvcheck's examples that
    cannot be decoded, and with a damaged index (kvcheck's list of targets and keys), every
    example the index no longer attributes to a target.
    """

    entries: int = 0
    undecodable: int = 0
    missing: tuple[str, ...] = ()
    scanned: bool = True
    targets: tuple[TargetHoldings, ...] = ()
    legacy: int | None = 0
    legacy_undecodable: int = 0

    def damaged(self, target: str) -> int:
        """The entries a run of ``target`` would read that cannot be read or decoded: its own
        and the older kvcheck's (read by every target). Another target's damage is not
        counted: a run of ``target`` never reads it.

        Example:
            >>> scan = DatabaseScan(targets=(TargetHoldings("a", 3, 1), TargetHoldings("b", 2, 2)),
            ...                     legacy=4, legacy_undecodable=1)
            >>> scan.damaged("a"), scan.damaged("c")
            (2, 1)
        """
        return self.holdings(target).undecodable + self.legacy_undecodable

    def as_one(self, target: str, names: Sequence[str]) -> DatabaseScan:
        """This scan with the holdings of ``names`` (one target's identity and the spellings
        an older kvcheck keyed it by) counted as ``target``'s.

        Example:
            >>> scan = DatabaseScan(targets=(TargetHoldings("pkg:Cls", 2), TargetHoldings("b", 1),
            ...                              TargetHoldings("pkg:inst", 3, 1)))
            >>> scan.as_one("pkg:inst", ["pkg:Cls", "pkg:inst"]).holdings("pkg:inst")
            TargetHoldings(target='pkg:inst', entries=5, undecodable=1, archived=0)
        """
        mine = [held for held in self.targets if held.target in names]
        rest = tuple(held for held in self.targets if held.target not in names)
        if not mine:
            return self
        merged = TargetHoldings(
            target,
            sum(held.entries for held in mine),
            sum(held.undecodable for held in mine),
            sum(held.archived for held in mine),
        )
        return replace(self, targets=(merged, *rest))

    def holdings(self, target: str) -> TargetHoldings:
        """``target``'s counts (zero when it stored nothing).

        Example:
            >>> DatabaseScan().holdings("kvcheck")
            TargetHoldings(target='kvcheck', entries=0, undecodable=0, archived=0)
        """
        for held in self.targets:
            if held.target == target:
                return held
        return TargetHoldings(target)


def scan_database(db: ExampleDatabase) -> DatabaseScan:
    """Count the stored examples in ``db``, per target, and those that cannot be decoded.

    Hypothesis deletes an entry it cannot decode when it meets it, so a corrupted database
    must be counted before a run. A directory is counted file by file; what no target's
    index accounts for is an older kvcheck's (``legacy``). Hypothesis's index of keys and
    kvcheck's own index of targets are not examples; they are left out.

    Example:
        >>> import tempfile
        >>> db = database_from_spec(tempfile.mkdtemp())
        >>> db.save(b"key", b"\\xff")  # not a serialized example, and no target recorded
        >>> scan = scan_database(db)
        >>> scan.entries, scan.undecodable, scan.legacy
        (1, 1, 1)
    """
    return _merged([_scan_part(part) for part in _parts_read(db)])


def _scan_part(part: ExampleDatabase) -> DatabaseScan:
    """One database that is read (a directory, a Redis server): its scan."""
    counted = [_holdings(part, name) for name in stored_targets(part)]
    targets = tuple(held for held, _ in counted)
    held = sum(t.entries for t in targets)
    held_undecodable = sum(t.undecodable for t in targets)
    if not isinstance(part, DirectoryBasedExampleDatabase):
        return DatabaseScan(
            entries=held, undecodable=held_undecodable, scanned=False, targets=targets, legacy=None
        )
    directory = Path(part.path)
    if not directory.is_dir():
        return DatabaseScan(missing=(str(directory),))
    files = undecodable_files = 0
    for key_dir in directory.iterdir():
        if not key_dir.is_dir() or key_dir.name == _HYPOTHESIS_KEY_INDEX:
            continue
        values = [value for value in key_dir.iterdir() if value.is_file()]
        files += len(values)
        undecodable_files += sum(not _file_decodes(value) for value in values)
    # Neither kvcheck's index nor the archive holds examples a run reads.
    index_entries, index_undecodable = _count(_index_values(part))
    archived = sum(t.archived for t in targets)
    archived_undecodable = sum(undecodable for _, undecodable in counted)
    entries = files - index_entries - archived
    undecodable = undecodable_files - index_undecodable - archived_undecodable
    return DatabaseScan(
        entries=entries,
        undecodable=undecodable,
        targets=targets,
        legacy=entries - held,
        legacy_undecodable=undecodable - held_undecodable,
    )


def _merged(scans: list[DatabaseScan]) -> DatabaseScan:
    """The scans of a database's parts (LOCAL and SHARED directories) added up."""
    targets: dict[str, TargetHoldings] = {}
    for scan in scans:
        for held in scan.targets:
            before = targets.get(held.target, TargetHoldings(held.target))
            targets[held.target] = TargetHoldings(
                held.target,
                before.entries + held.entries,
                before.undecodable + held.undecodable,
                before.archived + held.archived,
            )
    legacies = [scan.legacy for scan in scans]
    return DatabaseScan(
        entries=sum(scan.entries for scan in scans),
        undecodable=sum(scan.undecodable for scan in scans),
        missing=tuple(path for scan in scans for path in scan.missing),
        scanned=all(scan.scanned for scan in scans),
        targets=tuple(targets[name] for name in sorted(targets)),
        legacy=None if None in legacies else sum(legacy or 0 for legacy in legacies),
        legacy_undecodable=sum(scan.legacy_undecodable for scan in scans),
    )


def _parts_read(db: Any) -> list[ExampleDatabase]:
    """The databases ``db`` reads from, under kvcheck's and Hypothesis's wrappers."""
    db = _unwrapped(db)
    wrapped = getattr(db, "_wrapped", None)
    if isinstance(db, ReadOnlyDatabase) and wrapped is not None:
        return _parts_read(wrapped)
    if isinstance(db, MultiplexedDatabase) and wrapped is not None:
        return [part for inner in wrapped for part in _parts_read(inner)]
    return [db]


# --- recording which tests had stored examples ----------------------------------------------

_current_test: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kvcheck_current_test", default=None
)
#: test id -> stored examples fetched while it ran; per process, keyed by test, so xdist
#: workers and tests never share an entry.
_fetched: dict[str, int] = {}
#: test id -> of those, the ones that are empty or cannot be decoded (Hypothesis drops the
#: undecodable ones, and replays an empty one as a fresh random example).
_fetched_damaged: dict[str, int] = {}
#: test id -> how many of the fetched examples no target can claim (see TargetDatabase).
_unattributed: dict[str, int] = {}
#: test id -> why its saves failed; saves outside any recorded test go under _NO_TEST.
_save_errors: dict[str, list[str]] = {}
_NO_TEST = "<no kvcheck test running>"


@contextlib.contextmanager
def recording_test(test_id: str) -> Iterator[None]:
    """Attribute database fetches made inside the block to ``test_id`` (and reset its count).

    Example:
        >>> with recording_test("test_a"):
        ...     pass
        >>> stored_examples_fetched("test_a")
        0
    """
    _fetched[test_id] = 0
    _fetched_damaged[test_id] = 0
    _unattributed[test_id] = 0
    _save_errors.pop(test_id, None)
    token = _current_test.set(test_id)
    try:
        yield
    finally:
        _current_test.reset(token)


def stored_examples_fetched(test_id: str) -> int:
    """Stored examples of its own target that ``test_id`` fetched through a
    :class:`RecordingDatabase` (unattributed ones left out:
    :func:`unattributed_examples_fetched`)."""
    return _fetched.get(test_id, 0) - _unattributed.get(test_id, 0)


def unattributed_examples_fetched(test_id: str) -> int:
    """Stored examples ``test_id`` read that its target cannot claim as its own: stored by
    an older kvcheck without a target, or under the target of a run the test did not use.
    They are replayed but never archived, and a pass does not make them "fixed".

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> shared = InMemoryExampleDatabase()
        >>> shared.save(b"test", b"stored without a target")
        >>> db = RecordingDatabase(TargetDatabase(shared, "kvcheck"))
        >>> with recording_test("test_c"):
        ...     _ = list(db.fetch(b"test"))
        >>> stored_examples_fetched("test_c"), unattributed_examples_fetched("test_c")
        (0, 1)
    """
    return _unattributed.get(test_id, 0)


def stored_examples_damaged(test_id: str) -> int:
    """Of the stored examples ``test_id`` fetched, those that are empty or cannot be decoded.

    Example:
        >>> stored_examples_damaged("a test that never ran")
        0
    """
    return _fetched_damaged.get(test_id, 0)


def save_errors(test_id: str) -> list[str]:
    """Why saves made while ``test_id`` ran failed (empty when every save landed).

    Example:
        >>> save_errors("a test that never ran")
        []
    """
    return list(_save_errors.get(test_id, ()))


class RecordingDatabase(ExampleDatabase):
    """Delegates to ``inner`` and counts fetched values for the test that is running.

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> db = RecordingDatabase(InMemoryExampleDatabase())
        >>> db.save(b"key", b"example")
        >>> with recording_test("test_b"):
        ...     _ = list(db.fetch(b"key"))
        >>> stored_examples_fetched("test_b")
        1
    """

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        _check_inner(inner)
        self.inner = inner

    def __repr__(self) -> str:
        return f"RecordingDatabase({self.inner!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordingDatabase) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash((RecordingDatabase, id(self.inner)))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        test_id = _current_test.get()
        for value in self.inner.fetch(key):
            if test_id is not None:
                _fetched[test_id] = _fetched.get(test_id, 0) + 1
                if not _decodes(value):
                    _fetched_damaged[test_id] = _fetched_damaged.get(test_id, 0) + 1
            yield value

    def save(self, key: bytes, value: bytes) -> None:
        """Save through ``inner``; a failure is recorded for the running test, not raised.

        Raising would turn the property's own failure into a database error; losing the
        save silently would make ``kvcheck replay`` find nothing. So: record and go on.
        """
        try:
            self.inner.save(key, value)
        except Exception as exc:  # OSError from a directory, RedisError from a server
            _record_save_error(exc)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        """Move through ``inner``; a move saves ``value`` under ``dest``, so it is a save."""
        try:
            self.inner.move(src, dest, value)
        except Exception as exc:  # as for save: recorded for the running test
            _record_save_error(exc)

    def _start_listening(self) -> None:
        self.inner.add_listener(self._broadcast_change)

    def _stop_listening(self) -> None:
        self.inner.remove_listener(self._broadcast_change)


# --- one target's share of a database ---------------------------------------------------------

#: The key under which a database lists, as values, the targets that stored examples in it.
TARGETS_KEY = b"kvcheck-targets"
#: Hypothesis's own index of keys in a directory database (not an example).
_HYPOTHESIS_KEY_INDEX = getattr(DirectoryBasedExampleDatabase, "_metakeys_hash", None)


def _target_prefix(target: str) -> bytes:
    # NUL cannot occur in a target name, so one target's keys never prefix another's.
    return b"kvcheck-target\x00" + target.encode() + b"\x00"


def _archive_prefix(target: str) -> bytes:
    """Where ``target``'s examples go when Hypothesis would delete them."""
    return b"kvcheck-archive\x00" + target.encode() + b"\x00"


def _keys_key(target: str) -> bytes:
    """Where a database lists, as values, the keys ``target`` stored examples under."""
    return b"kvcheck-target-keys\x00" + target.encode()


def stored_targets(db: ExampleDatabase) -> list[str]:
    """The targets that stored examples in ``db`` (sorted), whether or not any are left.

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> shared = InMemoryExampleDatabase()
        >>> TargetDatabase(shared, "sglang").save(b"test", b"example")
        >>> stored_targets(shared)
        ['sglang']
    """
    inner = _unwrapped(db)
    names = {value.decode(errors="replace") for value in inner.fetch(TARGETS_KEY)}
    return sorted(names)


class TargetDatabase(ExampleDatabase):
    """One target's examples inside a database that several targets may share.

    Every key is prefixed with the target's name, so a run of one target never fetches,
    shrinks, moves or deletes another target's examples. The first save under a key also
    records the target (:func:`stored_targets`) and the key, so that what a target holds can
    be counted without running it.

    Older keys are read too. ``aliases`` are other names of this very target (the spelling an
    older kvcheck keyed it by: ``my_pkg.kv:buggy``): their examples are this target's, moved
    to its keys or its archive like its own. ``also_read`` names targets whose examples are
    read but never touched (an older kvcheck keyed a test by the run's target, not the one
    the test used), and so are examples stored under the bare key (``read_legacy``). Those
    are unattributed: replayed, never moved, archived or deleted, and counted apart
    (:func:`unattributed_examples_fetched`).

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> shared = InMemoryExampleDatabase()
        >>> TargetDatabase(shared, "mypkg:buggy").save(b"test", b"failing example")
        >>> list(TargetDatabase(shared, "kvcheck").fetch(b"test"))
        []
        >>> list(TargetDatabase(shared, "mypkg:buggy").fetch(b"test"))
        [b'failing example']
    """

    def __init__(
        self,
        inner: ExampleDatabase,
        target: str,
        *,
        read_legacy: bool = True,
        aliases: Iterable[str] = (),
        also_read: Iterable[str] = (),
    ) -> None:
        super().__init__()
        _check_inner(inner)
        _check_target_name(target, "target")
        self.inner = inner
        self.target = target
        self.read_legacy = read_legacy
        self.aliases = tuple(dict.fromkeys(a for a in aliases if a != target))
        self.also_read = tuple(
            dict.fromkeys(a for a in also_read if a != target and a not in self.aliases)
        )
        for name in (*self.aliases, *self.also_read):
            _check_target_name(name, "aliases/also_read")
        self._prefix = _target_prefix(target)
        self._alias_prefixes = tuple(_target_prefix(name) for name in self.aliases)
        self._archive = _archive_prefix(target)
        self._recorded: set[bytes] = set()

    def __repr__(self) -> str:
        return f"TargetDatabase({self.inner!r}, {self.target!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TargetDatabase) and (
            self.inner,
            self.target,
            self.read_legacy,
        ) == (other.inner, other.target, other.read_legacy)

    def __hash__(self) -> int:
        return hash((TargetDatabase, id(self.inner), self.target))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        seen: set[bytes] = set()
        for prefix in (self._prefix, *self._alias_prefixes):
            for value in self.inner.fetch(prefix + key):
                if value not in seen:
                    seen.add(value)
                    yield value
        if _is_kvcheck_key(key):
            return
        unattributed = [_target_prefix(name) + key for name in self.also_read]
        if self.read_legacy:
            unattributed.append(key)
        for where in unattributed:
            for value in self.inner.fetch(where):
                if value not in seen:
                    seen.add(value)
                    _record_unattributed()
                    yield value

    def save(self, key: bytes, value: bytes) -> None:
        self._record(key)
        self.inner.save(self._prefix + key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        """Move the example to this target's archive: it is the user's, never deleted.

        Hypothesis deletes an example that replays as fixed, one it cannot decode (after an
        upgrade changed its format) and, while it shrinks, ones that stopped failing. Each
        goes to the archive (:func:`scan_database` counts it), where no run reads it. An
        unattributed value (stored without a target, or under another target) is left where
        it is, for its own target.
        """
        held = self._held_under(key, value)
        if held is not None:
            self._record(key)
            self.inner.move(held, self._archive + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        """Move one of this target's values; an unattributed one stays where it is."""
        held = self._held_under(src, value)
        if held is None:
            return
        self._record(dest)
        self.inner.move(held, self._prefix + dest, value)

    def _held_under(self, key: bytes, value: bytes) -> bytes | None:
        """The full key under which this target (or an alias of it) holds ``value``."""
        for prefix in (self._prefix, *self._alias_prefixes):
            if value in self.inner.fetch(prefix + key):
                return prefix + key
        return None

    def _record(self, key: bytes) -> None:
        if key in self._recorded:
            return
        if not self._recorded:
            self.inner.save(TARGETS_KEY, self.target.encode())
        self.inner.save(_keys_key(self.target), key)
        self._recorded.add(key)

    def _start_listening(self) -> None:
        self.inner.add_listener(self._forward)

    def _stop_listening(self) -> None:
        self.inner.remove_listener(self._forward)

    def _forward(self, event: Any) -> None:
        kind, (key, *rest) = event
        if isinstance(key, bytes) and key.startswith(self._prefix):
            self._broadcast_change((kind, (key[len(self._prefix) :], *rest)))


#: The running test's target identity, as far as known: set by the pytest plugin around a
#: test (:func:`keyed_by_test_target`), asked again at every database call.
_test_target: contextvars.ContextVar[Callable[[], str | None] | None] = contextvars.ContextVar(
    "kvcheck_test_target", default=None
)


@contextlib.contextmanager
def keyed_by_test_target(identity: Callable[[], str | None]) -> Iterator[None]:
    """Inside the block, a :class:`PerTestTargetDatabase` keys by ``identity()``: the target
    the running test uses as far as known when the database is called (None: not known).

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> shared = InMemoryExampleDatabase()
        >>> db = PerTestTargetDatabase(shared, "kvcheck")
        >>> with keyed_by_test_target(lambda: "my_pkg.kv:MyTarget"):
        ...     db.save(b"test", b"example")
        >>> stored_targets(shared)
        ['my_pkg.kv:MyTarget']
    """
    token = _test_target.set(identity)
    try:
        yield
    finally:
        _test_target.reset(token)


class PerTestTargetDatabase(ExampleDatabase):
    """The database of a pytest session: each test's examples are kept under the target that
    test uses (its ``kvcheck_target`` fixture or parameter, its strategies' ``target=``, the
    target it hands a machine), which the plugin says through :func:`keyed_by_test_target`.

    A test that shows no target before its examples are read is keyed by the target that
    already holds examples under the test's key, when exactly one other than ``default``
    does (one the test used while drawing), else by ``default``, the session's target.
    ``aliases`` are older names of ``default`` (its spelling on the command line). A test
    that uses another target also reads, and never touches, the examples an older kvcheck
    stored for it under the session's target.

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> shared = InMemoryExampleDatabase()
        >>> db = PerTestTargetDatabase(shared, "kvcheck")
        >>> db.save(b"test", b"example")
        >>> list(TargetDatabase(shared, "kvcheck").fetch(b"test"))
        [b'example']
    """

    def __init__(
        self, inner: ExampleDatabase, default: str, *, aliases: Iterable[str] = ()
    ) -> None:
        super().__init__()
        _check_inner(inner)
        _check_target_name(default, "default")
        self.inner = inner
        self.default = default
        self.aliases = tuple(aliases)
        self._parts: dict[str, TargetDatabase] = {}
        #: key -> the target holding it, for tests that show none: looked up once per key,
        #: since it reads every target's key index and Hypothesis saves often while shrinking.
        self._holder: dict[bytes, str] = {}

    def __repr__(self) -> str:
        return f"PerTestTargetDatabase({self.inner!r}, {self.default!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerTestTargetDatabase) and (self.inner, self.default) == (
            other.inner,
            other.default,
        )

    def __hash__(self) -> int:
        return hash((PerTestTargetDatabase, id(self.inner), self.default))

    def target_for(self, key: bytes) -> str:
        """The target whose examples a call on ``key`` reads and writes now."""
        resolve = _test_target.get()
        known = resolve() if resolve is not None else None
        if known:
            return known
        if key not in self._holder:
            holders = [
                name
                for name in stored_targets(self.inner)
                if name != self.default and key in set(self.inner.fetch(_keys_key(name)))
            ]
            self._holder[key] = holders[0] if len(holders) == 1 else self.default
        return self._holder[key]

    def _part(self, key: bytes) -> TargetDatabase:
        target = self.target_for(key)
        part = self._parts.get(target)
        if part is None:
            if target == self.default:
                part = TargetDatabase(self.inner, target, aliases=self.aliases)
            else:  # an older kvcheck keyed this test by the session's target
                part = TargetDatabase(self.inner, target, also_read=(self.default, *self.aliases))
            self._parts[target] = part
        return part

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self._part(key).fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        self._part(key).save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self._part(key).delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._part(src).move(src, dest, value)


# --- helpers ----------------------------------------------------------------------------------


def _check_inner(inner: object) -> None:
    if not isinstance(inner, ExampleDatabase):
        raise ValueError(f"inner={inner!r} is not a Hypothesis ExampleDatabase")


def _check_target_name(name: object, argument: str) -> None:
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise ValueError(f"{argument}={name!r} must be a non-empty target name without NUL")


def _record_unattributed() -> None:
    test_id = _current_test.get()
    if test_id is not None:
        _unattributed[test_id] = _unattributed.get(test_id, 0) + 1


def _record_save_error(exc: BaseException) -> None:
    test_id = _current_test.get() or _NO_TEST
    _save_errors.setdefault(test_id, []).append(f"{type(exc).__name__}: {exc}")


def _directory(text: str, base: Path, *, role: str) -> Path:
    path = Path(text).expanduser()
    path = path if path.is_absolute() else base / path
    if path.exists() and not path.is_dir():
        raise DatabaseSpecError(
            f"{DATABASE_ENV_VAR}: the {role} {str(path)!r} exists but is not a directory"
        )
    return path


def _written_directories(db: Any) -> list[Path]:
    """The directories ``db`` writes to: read-only parts are never written, and Redis was
    pinged when it was built."""
    db = _unwrapped(db)
    if isinstance(db, DirectoryBasedExampleDatabase):
        return [Path(db.path)]
    wrapped = getattr(db, "_wrapped", None)
    if isinstance(db, MultiplexedDatabase) and wrapped is not None:
        return [path for part in wrapped for path in _written_directories(part)]
    return []


def _decodes(value: bytes) -> bool:
    """Whether ``value`` is a stored example: not empty, and a serialized choice sequence.

    An empty entry decodes to no choices, which Hypothesis replays as a fresh random example
    (so a test "passes" it); every example kvcheck's properties store draws something, so an
    empty one is damage (a truncated file), never a stored failure.
    """
    return bool(value) and choices_from_bytes(value) is not None


def _file_decodes(path: Path) -> bool:
    try:
        return _decodes(path.read_bytes())
    except OSError:
        return False


def _count(values: Iterable[bytes]) -> tuple[int, int]:
    """(values, undecodable values)."""
    entries = undecodable = 0
    for value in values:
        entries += 1
        undecodable += not _decodes(value)
    return entries, undecodable


def _unwrapped(db: Any) -> ExampleDatabase:
    """The database under kvcheck's wrappers: the one every target shares."""
    while isinstance(db, (RecordingDatabase, TargetDatabase, PerTestTargetDatabase)):
        db = db.inner
    return db


def _is_kvcheck_key(key: bytes) -> bool:
    return key == TARGETS_KEY or key.startswith(
        (b"kvcheck-target\x00", b"kvcheck-target-keys\x00", b"kvcheck-archive\x00")
    )


def _index_values(db: ExampleDatabase) -> Iterator[bytes]:
    """kvcheck's own index entries in ``db``: the targets, and each target's keys."""
    inner = _unwrapped(db)
    targets = list(inner.fetch(TARGETS_KEY))
    yield from targets
    for name in targets:
        yield from inner.fetch(_keys_key(name.decode(errors="replace")))


def _holdings(db: ExampleDatabase, target: str) -> tuple[TargetHoldings, int]:
    """``target``'s counts, and how many of its archived examples cannot be decoded."""
    inner = _unwrapped(db)
    prefix, archive = _target_prefix(target), _archive_prefix(target)
    keys = sorted(set(inner.fetch(_keys_key(target))))
    entries, undecodable = _count(value for key in keys for value in inner.fetch(prefix + key))
    archived, archived_undecodable = _count(
        value for key in keys for value in inner.fetch(archive + key)
    )
    return TargetHoldings(target, entries, undecodable, archived), archived_undecodable


def _redis_database(url: str, *, check_connection: bool) -> ExampleDatabase:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise DatabaseSpecError(f"{DATABASE_ENV_VAR}={url!r}: bad port ({exc})") from exc
    if not parts.hostname:
        raise DatabaseSpecError(
            f"{DATABASE_ENV_VAR}={url!r}: no host; expected redis://host:port/db"
        )
    number = parts.path.strip("/")
    if number and not number.isdigit():
        raise DatabaseSpecError(
            f"{DATABASE_ENV_VAR}={url!r}: database {number!r} is not a number; "
            "expected redis://host:port/db"
        )
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:
        raise DatabaseSpecError(
            f"{DATABASE_ENV_VAR}={url!r} needs the 'redis' package: "
            f"pip install 'kvcheck[redis]' ({exc})"
        ) from exc
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=_REDIS_CONNECT_TIMEOUT_S,
        socket_timeout=_REDIS_OPERATION_TIMEOUT_S,
    )
    if check_connection:
        try:
            client.ping()
        except redis.RedisError as exc:
            raise DatabaseSpecError(
                f"{DATABASE_ENV_VAR}={url!r}: cannot reach Redis at "
                f"{parts.hostname}:{port or 6379} ({type(exc).__name__}: {exc}); "
                "start the server or change the setting"
            ) from exc
    return RedisExampleDatabase(client)
