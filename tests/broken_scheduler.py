"""Deliberately broken scheduler memories, each breaking one rule of the reference
(`kvcheck.scheduler.model.ReferenceSchedulerMemory`), or reporting a verdict of its own
that disagrees with kvcheck's law; `test_scheduler_laws_fail.py` shows the
scheduler-memory machine fails on each with the law named here."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvcheck.scheduler.laws import AGREEMENT
from kvcheck.scheduler.model import ReferenceSchedulerMemory
from kvcheck.scheduler.snapshot import OwnCheck, Snapshot


class SharedPageCountedTwice(ReferenceSchedulerMemory):
    """Inserting a sequence whose prefix is cached already counts that shared prefix as
    evictable again (sglang #35270's shape): evictable over-counts."""

    breaks = "conservation"

    def insert(self, tokens: list[int], slots: list[int]) -> int:
        present = super().insert(tokens, slots)
        self.evictable_size += present
        return present


class LastDecodeSlotFreedTwice(ReferenceSchedulerMemory):
    """Releasing a request that has decoded frees its last slot a second time: the page
    is on the free list twice."""

    breaks = "conservation"

    def release(self, req: Any) -> None:
        last = (
            self.req_to_token[req.row][req.allocated - 1] if req.allocated > req.protected else None
        )
        decoded = req.committed == len(req.tokens) and req.allocated > 0
        super().release(req)
        if last is not None and decoded:
            self.free_slots_of([last])


class AbortForgetsChunkedSlots(ReferenceSchedulerMemory):
    """Aborting a request in the middle of a chunked prefill gives back its row and lock
    but forgets the slots of the chunks it has prefilled."""

    breaks = "conservation"

    def abort(self, rid: str) -> None:
        req = self.requests[rid]
        if req.committed < len(req.tokens):
            req.allocated = req.protected
        super().abort(rid)


class RestoreLeaksRow(ReferenceSchedulerMemory):
    """Restoring a retracted request takes two req-to-token rows and uses one."""

    breaks = "bookkeeping"

    def restore(self, rid: str) -> bool:
        done = super().restore(rid)
        if done and self.free_rows:
            self.free_rows.pop(0)
        return done


class LockKeptOnEviction(ReferenceSchedulerMemory):
    """Eviction takes locked leaves too, and does not release their lock references: the
    requests locking them hold a prefix that is gone, still counted as protected."""

    breaks = "conservation"

    def _leaves(self) -> list[Any]:
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack += node.children.values()
            if node is not self.root and not node.children:
                found.append(node)
        return found

    def _drop(self, victim: Any) -> None:
        if victim.lock_ref:
            self.free_slots_of(victim.slots)
            del victim.parent.children[self._page_key(victim.tokens)]
            return
        super()._drop(victim)


class OwnCheckBlindToLeak(LastDecodeSlotFreedTwice):
    """The target's own conservation check (exact, as sglang's busy check is) finds
    nothing while the memory double-frees a slot: it disagrees with kvcheck's law."""

    breaks = AGREEMENT

    def snapshot(self) -> Snapshot:
        own = OwnCheck("the twin's own leak check", "conservation", exact=True, failure=None)
        return dataclasses.replace(super().snapshot(), own_checks=(own,))


class OwnCheckCriesWolf(ReferenceSchedulerMemory):
    """The target's own conservation check reports a leak whenever the tree caches
    anything, on a memory that keeps every law: it disagrees with kvcheck's law."""

    breaks = AGREEMENT

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        failure = "leak: the tree is not empty" if snap.nodes else None
        own = OwnCheck("the twin's own leak check", "conservation", exact=True, failure=failure)
        return dataclasses.replace(snap, own_checks=(own,))


TWINS = (
    SharedPageCountedTwice,
    LastDecodeSlotFreedTwice,
    AbortForgetsChunkedSlots,
    RestoreLeaksRow,
    LockKeptOnEviction,
    OwnCheckBlindToLeak,
    OwnCheckCriesWolf,
)
