"""``campaign --address``: whether a Ray cluster answers there, asked with a plain socket
and a timeout before Ray is started, so a wrong address costs seconds and one line rather
than Ray's retries (it waits about a minute, printing "Failed to connect to GCS").

Example:
    >>> address_problem(None) is None, address_problem("auto") is None
    (True, True)
    >>> address_problem("head-node")
    "--address 'head-node': expected auto, host:port or ray://host:port"
"""

from __future__ import annotations

import socket

__all__ = ["PROBE_TIMEOUT_S", "address_problem"]

#: How long a cluster's head may take to accept a connection. A head that answers at all
#: answers in milliseconds; this only bounds a dropped packet's wait.
PROBE_TIMEOUT_S = 3.0


def address_problem(address: str | None, *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why no Ray cluster can be joined at ``address``, in one line, or None when its head
    accepts a TCP connection (or the address is ``None``, ``local`` or ``auto``, which Ray
    resolves itself: a local cluster, or the one this machine last started).

    ``host:port`` is the head's GCS port (``ray start --head`` prints it, 6379 by default);
    ``ray://host:port`` is Ray Client's (10001 by default).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be positive")
    if address is None or address.strip() in ("local", "auto"):
        return None
    text = address.strip()
    hostport = text.removeprefix("ray://")
    host, colon, port_text = hostport.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal in brackets
    if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return f"--address {text!r}: expected auto, host:port or ray://host:port"
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout_s):
            return None
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return (
            f"--address {text}: no Ray cluster answers at {host}:{port_text} ({reason}, "
            f"waited up to {timeout_s:g} s); start one there (ray start --head) or leave "
            "out --address to start a local cluster"
        )
