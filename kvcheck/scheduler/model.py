"""kvcheck's own reference of a scheduler's KV memory: a radix prefix cache over token
ids with lock references and LRU/LFU eviction, a req-to-token pool, a token allocator in
pages (page size 1 or more) and a request's steps from admission to finish.

Written with plain loops and lists, sharing no code with sglang: it is what the
scheduler-memory machine runs on the built-in target, and what each twin breaks.

Example::

    >>> memory = ReferenceSchedulerMemory(total=8, page_size=1, rows=2, max_len=8)
    >>> memory.admit("a", [1, 2, 3], first_chunk=3)
    True
    >>> memory.finish("a")
    >>> memory.snapshot().evictable, memory.snapshot().available
    (3, 5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcheck.scheduler.snapshot import (
    CachedNode,
    RequestHolding,
    Snapshot,
    kv_value,
)
from kvcheck.validation import check_one_of, check_valid_integer

__all__ = ["EVICTION_POLICIES", "ReferenceSchedulerMemory"]

#: The orderings the prefix cache evicts in: least recently used, least frequently used.
EVICTION_POLICIES = ("lru", "lfu")


@dataclass
class _Node:
    node_id: int
    parent: _Node | None
    tokens: list[int]
    slots: list[int]
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    hits: int = 0


@dataclass
class _Request:
    rid: str
    tokens: list[int]
    row: int
    protected: int  # [0, protected) is the tree's, shared through locked_node
    committed: int
    allocated: int
    locked_node: _Node | None  # the root when it shares nothing


def _ceil_to(n: int, page: int) -> int:
    return -(-n // page) * page


class ReferenceSchedulerMemory:
    """The reference scheduler memory: ``total`` KV slots in pages of ``page_size``
    (slot 0 is the padding slot, as sglang keeps it), ``rows`` req-to-token rows of
    ``max_len`` positions each, and a prefix cache evicting by ``eviction`` ("lru" or
    "lfu"). Each step returns ``False`` when it refuses for want of memory, leaving the
    memory as it was."""

    def __init__(
        self, *, total: int, page_size: int, rows: int, max_len: int, eviction: str = "lru"
    ) -> None:
        for name, value in (("total", total), ("page_size", page_size), ("rows", rows)):
            check_valid_integer(value, name, min_value=1, error=ValueError)
        check_valid_integer(max_len, "max_len", min_value=1, error=ValueError)
        if total % page_size:
            raise ValueError(f"total={total} must be a multiple of page_size={page_size}")
        check_one_of(eviction, "eviction", EVICTION_POLICIES, error=ValueError)
        self.total, self.page_size, self.rows, self.max_len = total, page_size, rows, max_len
        self.eviction = eviction
        self._clock = 0
        self._next_id = 1
        # Retracted requests' backups live on the host: a flush leaves them.
        self.backups: dict[str, tuple[list[int], int, list[int]]] = {}
        self.free_pages: list[int] = []
        self.requests: dict[str, _Request] = {}
        self.flush()

    # -- the parts -------------------------------------------------------------------

    def _free_pages_alloc(self, pages: int) -> list[int] | None:
        if len(self.free_pages) < pages:
            return None
        taken, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        return taken

    def free_slots_of(self, slots: list[int]) -> None:
        """Give back the pages holding ``slots`` (a page goes back whole, as a paged
        allocator frees it)."""
        for page in sorted({slot // self.page_size for slot in slots}):
            self.free_pages.append(page)

    def _alloc_positions(self, req: _Request, end: int) -> bool:
        """Extend ``req``'s row to ``end`` positions: the last partly used page first,
        then fresh pages, evicting the cache to make room."""
        start = req.allocated
        if end <= start:
            return True
        new_pages = (_ceil_to(end, self.page_size) - _ceil_to(start, self.page_size)) // (
            self.page_size
        )
        if not self.make_room(new_pages * self.page_size):
            return False
        pages = self._free_pages_alloc(new_pages)
        assert pages is not None
        row = self.req_to_token[req.row]
        page_starts = [page * self.page_size for page in pages]
        for position in range(start, end):
            # A position inside a page continues the page its predecessor opened.
            row[position] = (
                page_starts.pop(0) if position % self.page_size == 0 else row[position - 1] + 1
            )
        req.allocated = end
        return True

    def available(self) -> int:
        return len(self.free_pages) * self.page_size

    def make_room(self, tokens: int) -> bool:
        """Evict until ``tokens`` are free; ``False`` (nothing evicted) when the cache
        cannot give that much."""
        if self.available() + self.evictable_size < tokens:
            return False
        if self.available() < tokens:
            self.evict(tokens - self.available())
        return self.available() >= tokens

    # -- the prefix cache --------------------------------------------------------------

    def _page_key(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[: self.page_size])

    def match(self, tokens: list[int]) -> tuple[list[int], _Node]:
        """The slots of the longest cached page-aligned prefix of ``tokens`` and the
        node it ends at (splitting a node where the match stops inside it)."""
        node, slots, position = self.root, [], 0
        self._clock += 1
        while len(tokens) - position >= self.page_size:
            child = node.children.get(self._page_key(tokens[position:]))
            if child is None:
                break
            same = 0
            while (
                same < len(child.tokens)
                and position + same < len(tokens)
                and child.tokens[same] == tokens[position + same]
            ):
                same += 1
            same -= same % self.page_size
            if same < len(child.tokens):
                child = self._split(child, same)
            child.last_access, child.hits = self._clock, child.hits + 1
            slots += child.slots
            position += same
            node = child
        return slots, node

    def _split(self, child: _Node, at: int) -> _Node:
        parent = child.parent
        assert parent is not None
        head = _Node(self._new_id(), parent, child.tokens[:at], child.slots[:at])
        head.lock_ref, head.last_access, head.hits = child.lock_ref, child.last_access, child.hits
        parent.children[self._page_key(head.tokens)] = head
        child.tokens, child.slots, child.parent = child.tokens[at:], child.slots[at:], head
        head.children[self._page_key(child.tokens)] = child
        return head

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def insert(self, tokens: list[int], slots: list[int]) -> int:
        """Cache ``tokens`` (page-aligned) held in ``slots``; the length already cached,
        whose slots in ``slots`` are the caller's duplicates to free."""
        _, node = self.match(tokens)
        present = 0
        walk = node
        while walk.parent is not None:
            present += len(walk.tokens)
            walk = walk.parent
        if present < len(tokens):
            leaf = _Node(self._new_id(), node, tokens[present:], slots[present:])
            leaf.last_access, leaf.hits = self._clock, 1
            node.children[self._page_key(leaf.tokens)] = leaf
            self.evictable_size += len(leaf.tokens)
        return present

    def lock(self, node: _Node) -> None:
        walk: _Node | None = node
        while walk is not None and walk.parent is not None:
            if walk.lock_ref == 0:
                self.evictable_size -= len(walk.tokens)
                self.protected_size += len(walk.tokens)
            walk.lock_ref += 1
            walk = walk.parent

    def unlock(self, node: _Node) -> None:
        walk: _Node | None = node
        while walk is not None and walk.parent is not None:
            walk.lock_ref -= 1
            if walk.lock_ref == 0:
                self.evictable_size += len(walk.tokens)
                self.protected_size -= len(walk.tokens)
            walk = walk.parent

    def _leaves(self) -> list[_Node]:
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack += node.children.values()
            if node is not self.root and not node.children and node.lock_ref == 0:
                found.append(node)
        return found

    def evict(self, tokens: int) -> int:
        """Evict unlocked leaves, oldest (LRU) or least hit (LFU) first, until
        ``tokens`` are freed; the number freed."""
        freed = 0
        while freed < tokens:
            leaves = self._leaves()
            if not leaves:
                break
            if self.eviction == "lru":
                victim = min(leaves, key=lambda n: (n.last_access, n.node_id))
            else:
                victim = min(leaves, key=lambda n: (n.hits, n.last_access, n.node_id))
            self._drop(victim)
            freed += len(victim.tokens)
        return freed

    def _drop(self, victim: _Node) -> None:
        self.free_slots_of(victim.slots)
        self.evictable_size -= len(victim.tokens)
        assert victim.parent is not None
        del victim.parent.children[self._page_key(victim.tokens)]

    # -- a request's steps ---------------------------------------------------------

    def admit(self, rid: str, tokens: list[int], *, first_chunk: int) -> bool:
        """A new request: match its prefix (at most all tokens but one, page-aligned),
        lock it, take a row and prefill the next ``first_chunk`` tokens."""
        if not self.free_rows or len(tokens) > self.max_len:
            return False
        limit = len(tokens) - 1
        slots, node = self.match(tokens[: limit - limit % self.page_size])
        self.lock(node)
        row = self.free_rows.pop(0)
        req = _Request(rid, list(tokens), row, len(slots), len(slots), len(slots), node)
        self.req_to_token[row][: len(slots)] = slots
        self.requests[rid] = req
        end = min(len(tokens), len(slots) + first_chunk)
        if not self._alloc_positions(req, end):
            self.unlock(node)
            del self.requests[rid]
            self.free_rows.insert(0, row)
            return False
        self._write(req, len(slots), end)
        return True

    def _write(self, req: _Request, start: int, end: int) -> None:
        for position in range(start, end):
            self.kv[self.req_to_token[req.row][position]] = kv_value(
                tuple(req.tokens[: position + 1])
            )
        req.committed = max(req.committed, end)

    def prefill_chunk(self, rid: str, tokens: int) -> bool:
        """The next chunk of a chunked prefill: cache what is computed so far (the
        scheduler's checkpoint), then prefill ``tokens`` more."""
        req = self.requests[rid]
        self.checkpoint(req)
        end = min(len(req.tokens), req.committed + tokens)
        if not self._alloc_positions(req, end):
            return False
        self._write(req, req.committed, end)
        return True

    def checkpoint(self, req: _Request) -> None:
        """Insert the request's committed page-aligned prefix into the tree, adopt the
        tree's slots where they were cached already (freeing its own copies) and move its
        lock to the new last node."""
        aligned = req.committed - req.committed % self.page_size
        if aligned <= req.protected:
            return
        row = self.req_to_token[req.row]
        present = self.insert(req.tokens[:aligned], row[:aligned])
        if present > req.protected:
            self.free_slots_of(row[req.protected : present])
        slots, node = self.match(req.tokens[:aligned])
        row[:aligned] = slots
        assert req.locked_node is not None
        self.unlock(req.locked_node)
        self.lock(node)
        req.locked_node, req.protected = node, aligned

    def decode(self, rid: str, accepted: list[int], *, draft: int) -> bool:
        """One decode step: allocate one slot plus ``draft`` speculative ones, commit the
        first ``len(accepted)`` (the verified token and the accepted drafts), and give
        back the whole pages beyond the committed length."""
        req = self.requests[rid]
        if not 1 <= len(accepted) <= draft + 1:
            raise ValueError(f"len(accepted)={len(accepted)}; allowed: 1..draft+1={draft + 1}")
        if req.committed + draft + 1 > self.max_len:
            return False
        if not self._alloc_positions(req, req.committed + draft + 1):
            return False
        start = req.committed
        req.tokens[start:] = list(accepted)
        self._write(req, start, start + len(accepted))
        self._free_beyond(req, _ceil_to(req.committed, self.page_size))
        return True

    def _free_beyond(self, req: _Request, keep: int) -> None:
        if req.allocated > keep:
            self.free_slots_of(self.req_to_token[req.row][keep : req.allocated])
            req.allocated = max(keep, req.committed)

    def finish(self, rid: str) -> None:
        """A finished request: cache it, free what the tree did not take, unlock."""
        req = self.requests[rid]
        self.checkpoint(req)
        self.release(req)

    def release(self, req: _Request) -> None:
        """Give back a request's own slots, its lock and its row (no caching)."""
        if req.allocated > req.protected:
            self.free_slots_of(self.req_to_token[req.row][req.protected : req.allocated])
        if req.locked_node is not None:
            self.unlock(req.locked_node)
        self.free_rows.append(req.row)
        del self.requests[req.rid]

    def abort(self, rid: str) -> None:
        """An aborted request, at any point of its life: released without caching."""
        self.release(self.requests[rid])

    def retract(self, rid: str) -> list[int]:
        """Retract a request under memory pressure: back up its KV values (all committed
        positions), then release it; the backup is what ``restore`` takes."""
        req = self.requests[rid]
        row = self.req_to_token[req.row]
        backup = [self.kv[row[p]] for p in range(req.committed)]
        self.backups[rid] = (list(req.tokens), req.committed, backup)
        self.release(req)
        return backup

    def restore(self, rid: str) -> bool:
        """Bring a retracted request back: a fresh row and fresh slots holding its
        backed-up values."""
        tokens, committed, backup = self.backups[rid]
        if not self.free_rows:
            return False
        row = self.free_rows.pop(0)
        req = _Request(rid, tokens, row, 0, 0, 0, self.root)
        self.requests[rid] = req
        if not self._alloc_positions(req, committed):
            del self.requests[rid]
            self.free_rows.insert(0, row)
            return False
        for position in range(committed):
            self.kv[self.req_to_token[row][position]] = backup[position]
        req.committed = committed
        del self.backups[rid]
        return True

    def flush(self) -> bool:
        """Empty the cache and the pools; refused while a request is live."""
        if self.requests:
            return False
        self.free_pages = list(range(1, self.total // self.page_size + 1))
        self.free_rows = list(range(self.rows))
        self.req_to_token = [[0] * self.max_len for _ in range(self.rows)]
        self.root = _Node(0, None, [], [])
        self.evictable_size = 0
        self.protected_size = 0
        self.kv: dict[int, int] = {}
        return True

    # -- what the laws read ------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        nodes, stack, seen = [], list(self.root.children.values()), set()
        while stack:
            node = stack.pop()
            assert id(node) not in seen, "the reference tree has a cycle"
            seen.add(id(node))
            stack += node.children.values()
            assert node.parent is not None
            nodes.append(
                CachedNode(
                    node.node_id,
                    node.parent.node_id if node.parent.parent is not None else None,
                    tuple(node.tokens),
                    tuple(node.slots),
                    node.lock_ref,
                )
            )
        requests = tuple(
            RequestHolding(
                req.rid,
                req.row,
                tuple(self.req_to_token[req.row][: req.allocated]),
                req.protected,
                req.committed,
                req.allocated,
                tuple(req.tokens),
                req.locked_node.node_id
                if req.locked_node is not None and req.locked_node.parent is not None
                else None,
            )
            for req in self.requests.values()
        )
        free = frozenset(
            page * self.page_size + off for page in self.free_pages for off in range(self.page_size)
        )
        return Snapshot(
            page_size=self.page_size,
            total=self.total,
            available=self.available(),
            evictable=self.evictable_size,
            protected=self.protected_size,
            free_slots=free,
            nodes=tuple(sorted(nodes, key=lambda n: n.node_id)),
            requests=requests,
            req_rows_total=self.rows,
            req_rows_free=len(self.free_rows),
            read_slot=lambda slot: self.kv.get(slot, -1),
        )
