"""``kvcheck campaign --address`` where no cluster answers fails in seconds with one line
(issue 36, "What was seen" item 6), without a real cluster: an unused port, probed with a
socket before Ray starts; and Ray's own start-up messages go to a log, not the terminal."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from kvcheck.runner.campaign.address import address_problem
from kvcheck.runner.campaign.command import _stderr_to
from kvcheck.runner.cli import main


def _unused_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_no_cluster_at_the_address_fails_in_seconds_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """campaign --address HOST:PORT with nothing listening exits 2 within seconds, with
    one line naming the address and what to do, before any collection or Ray start."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVCHECK_DB", raising=False)
    port = _unused_port()
    started = time.monotonic()
    status = main(["campaign", "--address", f"127.0.0.1:{port}", "--minutes", "1"])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert status == 2 and elapsed < 10, elapsed
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in lines[0]
    assert "ray start --head" in lines[0] and "GCS" not in captured.err
    assert "collecting" not in captured.out


@pytest.mark.parametrize("address", ["head-node", "host:port", "ray://host", "h:70000"])
def test_a_malformed_address_is_named(address: str) -> None:
    """An address that is not auto, host:port or ray://host:port says which forms work."""
    assert address_problem(address) == (
        f"--address {address!r}: expected auto, host:port or ray://host:port"
    )


def test_a_listening_port_passes_the_probe() -> None:
    """A head that accepts connections passes, in host:port and ray:// forms."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert address_problem(f"127.0.0.1:{port}") is None
        assert address_problem(f"ray://127.0.0.1:{port}") is None


def test_ray_start_up_messages_go_to_the_log(tmp_path: Path) -> None:
    """What is written to file descriptor 2 inside the block (as Ray's C++ core writes)
    lands in the log, and the terminal's stderr is back afterwards."""
    log = tmp_path / "ray.log"
    with _stderr_to(log):
        os.write(2, b"[W rpc_client.h] Failed to connect to GCS\n")
    assert "Failed to connect to GCS" in log.read_text()
    os.write(2, b"after the block\n")
    assert "after the block" not in log.read_text()
