"""How each sglang release spells the scheduler memory calls the driver makes: the one
place that knows the releases apart for `kvcheck.targets.sglang.scheduler_memory`.

Two spellings exist among the releases kvcheck checks, and the installed one is read off
sglang (what its modules define), never off its version number:

- **lock receipts** (0.5.22 and later): a request's prefix lives in ``req.prefix_len`` /
  ``req.extend_end``; the scheduler locks the matched node with ``RadixCache.lock``,
  which returns a receipt kept in ``req.lock`` (``unlock`` takes it back); a chunk is
  published by ``common.checkpoint_kv_cache``; ``release_kv_cache(..., checkpoint=)``.
- **last-node pins** (0.5.21): the prefix is the tensor ``req.prefix_indices`` and the
  chunk ``req.extend_range``; the scheduler pins ``req.last_node`` with
  ``inc_lock_ref`` (its receipt kept in ``req.lock_receipt``) and ``unpin`` drops it; a
  chunk is published by ``common.maybe_cache_unfinished_req(req, tree, chunked=True)``
  (``RadixCache.cache_unfinished_req``, which re-pins the request's new last node);
  ``release_kv_cache(..., is_insert=)``.

Each spelling repeats the calls the scheduler itself makes in that release (cited on each
method), so the driver above stays one sequence of steps for every release.

Example, where sglang is installed::

    api = scheduler_api(modules)  # LockReceipts() on 0.5.23
    api.lock_match(tree, req)
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

__all__ = ["LastNodePins", "LockReceipts", "SchedulerApi", "missing_for_every_api", "scheduler_api"]


class SchedulerApi:
    """The calls the driver makes that a release spells its own way; ``needs`` names
    what the release must define for this spelling (owner in the driver's modules, then
    its names; ``release_kv_cache`` keywords under ``"release_kv_cache("``)."""

    name: ClassVar[str]
    needs: ClassVar[dict[str, tuple[str, ...]]]

    def __init__(self, modules: SimpleNamespace) -> None:
        self.m = modules

    @classmethod
    def missing(cls, modules: SimpleNamespace) -> list[str]:
        """What ``modules`` lacks of `needs` (empty: this spelling fits the release)."""
        lacking = []
        for owner, names in cls.needs.items():
            if owner == "release_kv_cache(":
                keywords = inspect.signature(modules.common.release_kv_cache).parameters
                lacking += [f"release_kv_cache({n}=)" for n in names if n not in keywords]
            else:
                found = getattr(modules, owner)
                lacking += [f"{owner}.{n}" for n in names if not hasattr(found, n)]
        return lacking

    def prefix_len(self, req: Any) -> int:
        """How many tokens of ``req`` are in its row already (or matched, before
        allocation): the next extend starts there."""
        raise NotImplementedError

    def extend_end(self, req: Any) -> int:
        """Where this round's extend of ``req`` ends."""
        raise NotImplementedError

    def set_extend_end(self, req: Any, end: int) -> None:
        """Extend ``req`` from its prefix to ``end`` this round."""
        raise NotImplementedError

    def lock_match(self, tree: Any, req: Any) -> None:
        """Lock the node ``req``'s match ended at, as the scheduler's admission does."""
        raise NotImplementedError

    def unlock_match(self, tree: Any, req: Any) -> None:
        """Drop that lock again (an admission refused for want of memory)."""
        raise NotImplementedError

    def locked_node(self, req: Any) -> Any:
        """The tree node ``req`` holds a lock on (``None``: none)."""
        raise NotImplementedError

    def checkpoint(self, req: Any, tree: Any) -> None:
        """Publish a chunked request's computed prefix, as the scheduler does between
        chunks (``Scheduler.stash_chunked_request``)."""
        raise NotImplementedError

    def release(self, req: Any, tree: Any, *, cache: bool) -> None:
        """``release_kv_cache``: cache the request first when ``cache``."""
        raise NotImplementedError

    def start_unmatched(self, req: Any, tree: Any) -> None:
        """Make ``req`` a request that matched nothing (a restore refills its row)."""
        raise NotImplementedError


class LockReceipts(SchedulerApi):
    """0.5.22 and later (see the module docstring)."""

    name = "lock receipts"
    needs: ClassVar[dict[str, tuple[str, ...]]] = {
        "RadixCache": ("lock", "unlock"),
        "common": ("checkpoint_kv_cache", "release_kv_cache"),
        "release_kv_cache(": ("checkpoint",),
    }

    def prefix_len(self, req: Any) -> int:
        return int(req.prefix_len)

    def extend_end(self, req: Any) -> int:
        return int(req.extend_end)

    def set_extend_end(self, req: Any, end: int) -> None:
        req.extend_end = end

    def lock_match(self, tree: Any, req: Any) -> None:
        # schedule_policy.PrefillAdder: req.lock = self.tree_cache.lock(req.last_node)
        req.lock = tree.lock(req.last_node)

    def unlock_match(self, tree: Any, req: Any) -> None:
        tree.unlock(req.lock)
        req.lock = None

    def locked_node(self, req: Any) -> Any:
        return req.lock.node if req.lock is not None else None

    def checkpoint(self, req: Any, tree: Any) -> None:
        self.m.common.checkpoint_kv_cache(req, tree)

    def release(self, req: Any, tree: Any, *, cache: bool) -> None:
        self.m.common.release_kv_cache(req, tree, checkpoint=cache)

    def start_unmatched(self, req: Any, tree: Any) -> None:
        req.prefix_len, req.last_node, req.lock = 0, tree.root_node_handle(), None


class LastNodePins(SchedulerApi):
    """0.5.21 (see the module docstring)."""

    name = "last-node pins"
    needs: ClassVar[dict[str, tuple[str, ...]]] = {
        "RadixCache": ("inc_lock_ref", "dec_lock_ref", "unpin", "cache_unfinished_req"),
        "common": ("maybe_cache_unfinished_req", "release_kv_cache"),
        "release_kv_cache(": ("is_insert",),
    }

    def prefix_len(self, req: Any) -> int:
        return len(req.prefix_indices)

    def extend_end(self, req: Any) -> int:
        return int(req.extend_range.end)

    def set_extend_end(self, req: Any, end: int) -> None:
        req.set_extend_range(len(req.prefix_indices), end)

    def lock_match(self, tree: Any, req: Any) -> None:
        # schedule_policy.PrefillAdder._req_inc_lock_ref keeps the receipt on the request.
        req.lock_receipt = tree.inc_lock_ref(req.last_node).to_dec_params()

    def unlock_match(self, tree: Any, req: Any) -> None:
        tree.unpin(req)

    def locked_node(self, req: Any) -> Any:
        # unpin (release_kv_cache's) drops the lock on last_node, wherever it points.
        return req.last_node

    def checkpoint(self, req: Any, tree: Any) -> None:
        # Scheduler.stash_chunked_request: maybe_cache_unfinished_req(req, tree, chunked=True)
        self.m.common.maybe_cache_unfinished_req(req, tree, chunked=True)

    def release(self, req: Any, tree: Any, *, cache: bool) -> None:
        self.m.common.release_kv_cache(req, tree, is_insert=cache)

    def start_unmatched(self, req: Any, tree: Any) -> None:
        req.prefix_indices = torch.empty((0,), dtype=torch.int64)
        req.last_node = tree.root_node_handle()


#: Every spelling, newest first (the first that fits the installed release is used).
APIS: tuple[type[SchedulerApi], ...] = (LockReceipts, LastNodePins)


def scheduler_api(modules: SimpleNamespace) -> SchedulerApi | None:
    """The spelling that fits the release ``modules`` were imported from, or ``None``
    (`missing_for_every_api` says why)."""
    for api in APIS:
        if not api.missing(modules):
            return api(modules)
    return None


def missing_for_every_api(modules: SimpleNamespace) -> str:
    """What the release lacks for each spelling, one clause each (for a skip reason)."""
    return "; ".join(f"{api.name}: no {', '.join(api.missing(modules))}" for api in APIS)
