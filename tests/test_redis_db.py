"""KVCHECK_DB=redis://... against a real redis-server started by the test.

Skipped, with a reason, where ``redis-server`` is not installed (CI installs it).
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import two_targets
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase

from kvcheck.runner import profiles
from kvcheck.runner.db import (
    DatabaseSpecError,
    RecordingDatabase,
    database_from_spec,
    describe_database,
    recording_test,
    scan_database,
    stored_examples_fetched,
)

pytest_plugins = ["pytester"]
redis = pytest.importorskip("redis", reason="the redis package is kvcheck's [redis] extra")
_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    _SERVER is None, reason="redis-server is not installed (apt-get install redis-server)"
)
_STARTUP_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway redis-server on a free loopback port, data in a temp dir, no persistence."""
    assert _SERVER is not None
    directory = tmp_path_factory.mktemp("redis")
    port = _free_port()
    server = subprocess.Popen(
        [
            _SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "notice",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_ready(server)
        url = f"redis://127.0.0.1:{port}/0"
        # Nobody reads the log pipe from here on: keep the server from filling it.
        redis.Redis.from_url(url).config_set("loglevel", "warning")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        assert server.stdout is not None
        server.stdout.close()


def _wait_until_ready(server: subprocess.Popen[bytes]) -> None:
    """Read the server log until it accepts connections (bounded; no polling sleeps).

    Raw ``os.read`` on the pipe: a buffered ``readline`` could hold the ready line in
    Python's buffer while ``select`` waits on an empty pipe.
    """
    assert server.stdout is not None
    fd = server.stdout.fileno()
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    log = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(timeout=remaining):
                break
            chunk = os.read(fd, 65536)
            if not chunk:  # the server exited
                break
            log += chunk
            if b"Ready to accept connections" in log:
                return
    server.kill()
    tail = log.decode(errors="replace").splitlines()[-20:]
    pytest.fail("redis-server did not start:\n" + "\n".join(tail), pytrace=False)


@pytest.fixture
def flushed(redis_url: str) -> str:
    """The server, emptied before the test."""
    redis.Redis.from_url(redis_url).flushdb()
    return redis_url


def test_redis_url_gives_a_redis_database(flushed: str) -> None:
    """redis://host:port/db builds Hypothesis's Redis database, and round-trips values."""
    db = database_from_spec(flushed)
    assert type(db).__name__ == "RedisExampleDatabase"
    db.save(b"key", b"value")
    assert list(db.fetch(b"key")) == [b"value"]
    db.delete(b"key", b"value")
    assert list(db.fetch(b"key")) == []
    assert describe_database(db) == f"redis {flushed}"


def test_unreachable_server_is_reported() -> None:
    """A URL where no server listens fails fast with 'cannot reach Redis'."""
    with pytest.raises(DatabaseSpecError, match=r"cannot reach Redis at 127\.0\.0\.1"):
        database_from_spec(f"redis://127.0.0.1:{_free_port()}/0")


def test_failure_found_by_one_runner_replays_on_another(flushed: str) -> None:
    """A failure saved through one client is replayed through a second, fresh one."""

    def make_test(db: ExampleDatabase, profile: str) -> Callable[[], None]:
        # A fresh function per run, same source: Hypothesis keys the database by source.
        @settings(database=db, **profiles.profile_options(profile))
        @given(st.integers(0, 1000))
        def property_under_test(x: int) -> None:
            assert x < 500

        return property_under_test

    with pytest.raises(AssertionError):
        make_test(database_from_spec(flushed), profiles.DEV)()
    other_runner = RecordingDatabase(database_from_spec(flushed))
    with recording_test("other-runner"), pytest.raises(AssertionError) as excinfo:
        make_test(other_runner, profiles.REPLAY)()
    assert stored_examples_fetched("other-runner") >= 1
    assert "x=500" in "\n".join(getattr(excinfo.value, "__notes__", []))


def test_plugin_header_shows_redis(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, flushed: str
) -> None:
    """With KVCHECK_DB=redis://..., pytest's header names the Redis database."""
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")) or name == "CI":
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVCHECK_DB", flushed)
    saved, current = dict(settings._profiles), settings.get_current_profile_name()
    try:
        pytester.makepyfile("def test_nothing():\n    assert True\n")
        result = pytester.runpytest()
    finally:  # the inner run re-registers the process-global profiles
        settings._profiles.clear()
        settings._profiles.update(saved)
        settings.load_profile(current)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [f"kvcheck database: redis {flushed} (examples keyed by the target each test uses*)"]
    )


def test_server_dir_is_the_temp_dir(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The server keeps its working files in the test's temp dir (nothing outside it)."""
    config = redis.Redis.from_url(redis_url).config_get("dir")
    assert Path(config["dir"]).is_relative_to(tmp_path_factory.getbasetemp())


# --- two targets sharing one server ----------------------------------------------------------


def _run_target(root: Path, url: str, target: str, *, profile: str) -> subprocess.Popen[bytes]:
    """A pytest run of the two-target project against the Redis database, as a runner does."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(root),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--kvcheck-target={target}",
        f"--kvcheck-profile={profile}",
        "--kvcheck-device=cpu",
    ]
    return subprocess.Popen(
        command,
        cwd=root,
        env=two_targets.environment(root, url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _finish(run: subprocess.Popen[bytes]) -> tuple[int, str]:
    output, _ = run.communicate(timeout=300)
    return run.returncode, output.decode(errors="replace")


def _buggy_examples(url: str) -> int:
    return scan_database(database_from_spec(url)).holdings(two_targets.BUGGY).entries


@pytest.mark.parametrize("concurrently", [False, True], ids=["one-after-the-other", "at-once"])
def test_two_targets_share_a_server_without_losing_a_failure(
    flushed: str, tmp_path: Path, concurrently: bool
) -> None:
    """The buggy target's failure survives runs of the healthy target on the same server, run
    after it or beside it, and replays from there."""
    root = two_targets.write_project(tmp_path / "project")
    if concurrently:
        buggy = _run_target(root, flushed, two_targets.BUGGY, profile=profiles.DEV)
        healthy = _run_target(root, flushed, "kvcheck", profile=profiles.DEV)
        (buggy_status, output), (healthy_status, _) = _finish(buggy), _finish(healthy)
    else:
        buggy_status, output = _finish(
            _run_target(root, flushed, two_targets.BUGGY, profile=profiles.DEV)
        )
    assert buggy_status == 1, output
    stored = _buggy_examples(flushed)
    assert stored >= 1
    if not concurrently:
        healthy_status, _ = _finish(_run_target(root, flushed, "kvcheck", profile=profiles.DEV))
    assert healthy_status == 0
    replayed, _ = _finish(_run_target(root, flushed, "kvcheck", profile=profiles.REPLAY))
    assert replayed == 0
    assert _buggy_examples(flushed) >= stored
    status, output = _finish(_run_target(root, flushed, two_targets.BUGGY, profile=profiles.REPLAY))
    assert status == 1 and two_targets.FAILING_TEST in output
