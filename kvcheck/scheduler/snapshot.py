"""What the scheduler's memory holds after a step, as plain data the laws read.

Both the reference model and a target's driver describe themselves with a `Snapshot`:
the counters their prefix cache and allocator *report* (the terms of sglang's
``available + evictable + protected + session_held + uncached == total``) beside the
structure those counters should summarise (free pages, tree nodes, request rows), so a
law can recompute each counter and compare.

Example::

    >>> snap = Snapshot(page_size=1, total=2, available=2, evictable=0, protected=0,
    ...                 free_slots=frozenset({1, 2}), nodes=(), requests=(),
    ...                 req_rows_total=1, req_rows_free=1)
    >>> snap.total
    2
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CachedNode", "OwnCheck", "RequestHolding", "Snapshot"]


@dataclass(frozen=True)
class CachedNode:
    """One node of the prefix tree: its id, its parent's id (``None`` under the root), the
    token ids its edge carries, the KV slots holding them and its lock reference."""

    node_id: int
    parent_id: int | None
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    lock_ref: int


@dataclass(frozen=True)
class RequestHolding:
    """What one live request holds: its req-to-token row and the slots written there up
    to ``allocated`` (``row_slots``), the prefix the tree owns (``protected``), how much
    KV it has committed, its token ids, and the tree node it locks (``None``: none)."""

    rid: str
    row: int
    row_slots: tuple[int, ...]
    protected: int
    committed: int
    allocated: int
    tokens: tuple[int, ...]
    locked_node: int | None


@dataclass(frozen=True)
class OwnCheck:
    """The verdict of a check the target makes of its own memory, run on the state the
    snapshot describes: where the check lives (``name``), the kvcheck law it checks
    (one of ``kvcheck.scheduler.laws.LAWS``), whether it checks all of that law
    (``exact``) or a part, and what it reported (``failure``; ``None``: nothing)."""

    name: str
    law: str
    exact: bool
    failure: str | None


@dataclass(frozen=True)
class Snapshot:
    """The scheduler memory after one step; see the module docstring."""

    page_size: int
    total: int
    available: int
    evictable: int
    protected: int
    free_slots: frozenset[int]
    nodes: tuple[CachedNode, ...]
    requests: tuple[RequestHolding, ...]
    req_rows_total: int
    req_rows_free: int
    session_held: int = 0
    #: The target's own checks of this state (the laws hold them to agree).
    own_checks: tuple[OwnCheck, ...] = ()
    #: Reads the value the pool holds at a slot (the bytes law compares it with
    #: `kv_value` of the tokens written there); ``None`` when the memory has no pool.
    read_slot: Callable[[int], int] | None = field(default=None, compare=False)


def kv_value(tokens: tuple[int, ...]) -> int:
    """The value a correct forward pass stores for the last token of ``tokens``: it
    depends on the whole prefix, as real KV does, and fits a float32 exactly.

    >>> kv_value((1, 2)) == kv_value((1, 2)) != kv_value((2, 2))
    True
    """
    value = 7
    for token in tokens:
        value = (value * 31 + token + 1) % 65521
    return value
