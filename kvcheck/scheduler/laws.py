"""The laws a scheduler's KV memory keeps after every step, read off a `Snapshot`.

- ``conservation``: sglang's own law, in the terms of its invariant checker
  (``managers/scheduler_components/invariant_checker.py``): ``available + evictable +
  protected + session_held + uncached == total``, where ``uncached`` is what live requests
  hold beyond the prefix the tree owns (their allocated length rounded up to a page, less
  their protected prefix).
- ``ownership``: every page is exactly one of free, cached in the tree, or private to one
  live request; a request's protected prefix is the tree's slots along its locked path.
- ``bookkeeping``: each node's lock reference counts the live requests locking it or a
  node below it; evictable and protected equal the unlocked and locked tokens of the
  tree; the tree is page-aligned; the req-to-token rows add up.
- ``bytes``: the pool holds, at every cached and every committed slot, the value the
  request that wrote it wrote.

Where the target checks its own memory too (`Snapshot.own_checks`, sglang's scheduler
invariant checker on the sglang target), its verdict must agree with the law it checks:
a target check that fails where kvcheck's law holds, or an ``exact`` one that passes where
it breaks, is itself a failure (``agreement``) naming both. A check of part of a law may
pass where the law breaks; where both fail, the law's failure quotes the target's.

Example::

    >>> from kvcheck.scheduler.snapshot import Snapshot
    >>> empty = Snapshot(page_size=1, total=2, available=2, evictable=0, protected=0,
    ...                  free_slots=frozenset({1, 2}), nodes=(), requests=(),
    ...                  req_rows_total=1, req_rows_free=1)
    >>> check_laws(empty)
    >>> check_laws(Snapshot(**{**empty.__dict__, "available": 1}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    kvcheck.scheduler.laws.LawBroken: conservation: available=1 + evictable=0 + ...
"""

from __future__ import annotations

from collections import Counter

from kvcheck.scheduler.snapshot import CachedNode, Snapshot, kv_value

__all__ = ["AGREEMENT", "LAWS", "LawBroken", "check_laws", "describe_holdings"]

#: Every law, in the order they are checked (the cheapest and most basic first).
LAWS = ("conservation", "bookkeeping", "ownership", "bytes")

#: What a failure is named when the target's own check and kvcheck's law disagree.
AGREEMENT = "agreement"


class LawBroken(AssertionError):
    """A law of the scheduler's memory failed; ``law`` names it (one of `LAWS`, or
    `AGREEMENT` when the target's own check and kvcheck's law disagree)."""

    def __init__(self, law: str, detail: str) -> None:
        super().__init__(f"{law}: {detail}")
        self.law = law


def _ceil_to(n: int, page: int) -> int:
    return -(-n // page) * page


def uncached_tokens(snap: Snapshot) -> int:
    """What live requests hold beyond their protected prefix, by whole pages (sglang's
    ``kv_private_tokens`` summed)."""
    return sum(_ceil_to(r.allocated, snap.page_size) - r.protected for r in snap.requests)


def _conservation(snap: Snapshot) -> None:
    uncached = uncached_tokens(snap)
    accounted = snap.available + snap.evictable + snap.protected + snap.session_held + uncached
    if accounted != snap.total:
        raise LawBroken(
            "conservation",
            f"available={snap.available} + evictable={snap.evictable} + "
            f"protected={snap.protected} + session_held={snap.session_held} + "
            f"uncached={uncached} = {accounted} but total={snap.total}",
        )


def _paths(snap: Snapshot) -> dict[int, list[CachedNode]]:
    """Each node's path from the root's child down to it."""
    by_id = {n.node_id: n for n in snap.nodes}
    paths: dict[int, list[CachedNode]] = {}
    for node in snap.nodes:
        path, walk = [], node
        while True:
            path.append(walk)
            if walk.parent_id is None:
                break
            if walk.parent_id not in by_id:
                raise LawBroken("bookkeeping", f"node {walk.node_id}'s parent is not in the tree")
            walk = by_id[walk.parent_id]
        paths[node.node_id] = path[::-1]
    return paths


def _bookkeeping(snap: Snapshot) -> None:
    paths = _paths(snap)
    locks: Counter[int] = Counter()
    for req in snap.requests:
        if req.locked_node is not None:
            if req.locked_node not in paths:
                raise LawBroken(
                    "bookkeeping",
                    f"request {req.rid} locks node {req.locked_node}, not in the tree",
                )
            locks.update(n.node_id for n in paths[req.locked_node])
    for node in snap.nodes:
        if node.lock_ref != locks[node.node_id]:
            raise LawBroken(
                "bookkeeping",
                f"node {node.node_id} {node.tokens} has lock_ref={node.lock_ref} but "
                f"{locks[node.node_id]} live requests lock it or a node below it",
            )
        if len(node.tokens) % snap.page_size or len(node.slots) != len(node.tokens):
            raise LawBroken(
                "bookkeeping",
                f"node {node.node_id} holds {len(node.tokens)} tokens in {len(node.slots)} "
                f"slots; page_size={snap.page_size}",
            )
    evictable = sum(len(n.tokens) for n in snap.nodes if n.lock_ref == 0)
    protected = sum(len(n.tokens) for n in snap.nodes if n.lock_ref > 0)
    if (snap.evictable, snap.protected) != (evictable, protected):
        raise LawBroken(
            "bookkeeping",
            f"the cache reports evictable={snap.evictable}, protected={snap.protected} but "
            f"its tree holds {evictable} unlocked and {protected} locked tokens",
        )
    rows = [r.row for r in snap.requests]
    if len(set(rows)) != len(rows) or snap.req_rows_free + len(rows) != snap.req_rows_total:
        raise LawBroken(
            "bookkeeping",
            f"req-to-token rows: {len(rows)} live ({sorted(rows)}) + free="
            f"{snap.req_rows_free} != total={snap.req_rows_total}",
        )


def _ownership(snap: Snapshot) -> None:
    page = snap.page_size
    owners: dict[int, list[str]] = {}
    for free_page in sorted({slot // page for slot in snap.free_slots}):
        owners.setdefault(free_page, []).append("free")
    paths = _paths(snap)
    for node in snap.nodes:
        for node_page in sorted({s // page for s in node.slots}):
            owners.setdefault(node_page, []).append(f"node {node.node_id}")
    for req in snap.requests:
        for p in sorted({s // page for s in req.row_slots[req.protected : req.allocated]}):
            owners.setdefault(p, []).append(f"request {req.rid}")
        shared = (
            [s for n in paths.get(req.locked_node, []) for s in n.slots]
            if (req.locked_node is not None)
            else []
        )
        if list(req.row_slots[: req.protected]) != shared[: req.protected] or (
            len(shared) < req.protected
        ):
            raise LawBroken(
                "ownership",
                f"request {req.rid}'s protected prefix {list(req.row_slots[: req.protected])} is "
                f"not the tree's slots {shared} along the path it locks",
            )
    twice = {p: o for p, o in owners.items() if len(o) > 1}
    if twice:
        first = min(twice)
        raise LawBroken("ownership", f"page {first} is owned by {' and '.join(twice[first])}")
    every = set(range(1, snap.total // page + 1))
    if set(owners) != every:
        lost = sorted(every - set(owners))
        stray = sorted(set(owners) - every)
        raise LawBroken(
            "ownership", f"pages neither free, cached nor held: {lost}; pages out of range: {stray}"
        )


def _bytes(snap: Snapshot) -> None:
    read = snap.read_slot
    if read is None:
        return
    for node_id, path in _paths(snap).items():
        tokens = [t for n in path for t in n.tokens]
        slots = [s for n in path for s in n.slots]
        start = len(tokens) - len(path[-1].tokens)
        for p in range(start, len(tokens)):
            if read(slots[p]) != kv_value(tuple(tokens[: p + 1])):
                raise LawBroken(
                    "bytes",
                    f"cached node {node_id} position {p} (slot {slots[p]}) reads "
                    f"{read(slots[p])} but its writer wrote {kv_value(tuple(tokens[: p + 1]))}",
                )
    for req in snap.requests:
        for p in range(req.committed):
            want = kv_value(req.tokens[: p + 1])
            if read(req.row_slots[p]) != want:
                raise LawBroken(
                    "bytes",
                    f"request {req.rid} position {p} (slot {req.row_slots[p]}) reads "
                    f"{read(req.row_slots[p])} but should be {want}",
                )


_CHECKS = {
    "conservation": _conservation,
    "bookkeeping": _bookkeeping,
    "ownership": _ownership,
    "bytes": _bytes,
}


def check_laws(snap: Snapshot) -> None:
    """Raise `LawBroken` for the first of `LAWS` that ``snap`` breaks, or for the first
    of its own checks that disagrees with the law it checks (see the module docstring)."""
    unknown = sorted({c.law for c in snap.own_checks} - set(LAWS))
    if unknown:
        raise ValueError(f"own_checks check laws {unknown}; allowed: {', '.join(LAWS)}")
    for law in LAWS:
        own = [c for c in snap.own_checks if c.law == law]
        try:
            _CHECKS[law](snap)
        except LawBroken as broken:
            for check in own:
                if check.failure is None and check.exact:
                    raise LawBroken(
                        AGREEMENT,
                        f"{check.name} finds nothing wrong but kvcheck's {law} law says: {broken}",
                    ) from broken
                if check.failure is not None:
                    broken.add_note(f"{check.name} agrees: {check.failure}")
            raise
        for check in own:
            if check.failure is not None:
                raise LawBroken(
                    AGREEMENT,
                    f"{check.name} reports {check.failure!r} but kvcheck's {law} law holds",
                )


def describe_holdings(snap: Snapshot) -> str:
    """Which request held what, and the counters, one line each (for a failure's note)."""
    lines = [
        f"total={snap.total} available={snap.available} evictable={snap.evictable} "
        f"protected={snap.protected} page_size={snap.page_size}"
    ]
    for req in snap.requests:
        lines.append(
            f"request {req.rid}: row {req.row}, protected {req.protected}, committed "
            f"{req.committed}, allocated {req.allocated}, locks node {req.locked_node}, "
            f"slots {list(req.row_slots)}"
        )
    for node in snap.nodes:
        lines.append(
            f"node {node.node_id} (parent {node.parent_id}): tokens {list(node.tokens)}, "
            f"slots {list(node.slots)}, lock_ref {node.lock_ref}"
        )
    return "\n".join(lines)
