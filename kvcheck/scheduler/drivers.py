"""Which scheduler memory the machine drives for a target: kvcheck's reference on the
built-in target, sglang's own scheduler memory code (through
`kvcheck.targets.sglang.scheduler_memory`) on the sglang target; none for other targets,
with the reason a skip quotes. Each target is driven in two pagings (`PAGINGS`): the
token allocator (page size 1) and a paged one; a release without a paged allocator that
runs here (sglang 0.5.21's is Triton-only) skips the second, saying so.

Example::

    >>> class Builtin:
    ...     name = "kvcheck"
    >>> memory_factory(Builtin()).__name__
    'ReferenceSchedulerMemory'
    >>> PAGINGS["paged"]
    (2, 4)
"""

from __future__ import annotations

from typing import Any

from kvcheck.scheduler.machine import MemoryFactory
from kvcheck.scheduler.model import EVICTION_POLICIES, ReferenceSchedulerMemory
from kvcheck.scheduler.snapshot import CachedNode, OwnCheck, RequestHolding, Snapshot
from kvcheck.targets.tier_support import allocator_skip_reason
from kvcheck.validation import check_one_of

__all__ = [
    "PAGINGS",
    "memory_eviction_policies",
    "memory_factory",
    "memory_prefix_caches",
    "memory_skip_reason",
]

#: The targets whose scheduler memory kvcheck can drive.
DRIVEN_TARGETS = ("kvcheck", "sglang")

#: The page sizes the machine draws in each paging: the token allocator's, a paged one's.
PAGINGS: dict[str, tuple[int, ...]] = {"token": (1,), "paged": (2, 4)}


def memory_skip_reason(target: Any, *, paging: str = "token") -> str | None:
    """Why the machine cannot drive ``target``'s scheduler memory in ``paging`` (one of
    `PAGINGS`), or ``None``.

    >>> class Other:
    ...     name = "mine"
    >>> memory_skip_reason(Other())
    "target 'mine' declares no scheduler memory (driven: kvcheck, sglang)"
    """
    check_one_of(paging, "paging", tuple(PAGINGS), error=ValueError)
    name = getattr(target, "name", None)
    if name not in DRIVEN_TARGETS:
        return f"target {name!r} declares no scheduler memory (driven: {', '.join(DRIVEN_TARGETS)})"
    if name == "sglang":
        from kvcheck.targets.sglang.scheduler_memory import why_not_driven

        why = why_not_driven()
        if why is None and paging == "paged":
            # The driver builds the target's own paged allocator: where the release has
            # none that runs here, only the paged half is off.
            why = allocator_skip_reason(target, "paged")
        return why
    return None


def memory_eviction_policies(target: Any) -> tuple[str, ...]:
    """The eviction policies the machine draws for ``target``'s memory: the reference's,
    or every one the sglang driver's ``RadixCache`` takes in the installed release.

    >>> class Builtin:
    ...     name = "kvcheck"
    >>> memory_eviction_policies(Builtin())
    ('lru', 'lfu')
    """
    if getattr(target, "name", None) == "sglang":
        from kvcheck.targets.sglang.scheduler_memory import eviction_policies

        return eviction_policies()
    return EVICTION_POLICIES


def memory_prefix_caches(target: Any) -> dict[str, tuple[str, ...]] | None:
    """The prefix caches the machine draws for ``target``'s memory, each with the eviction
    policies it takes: ``None`` for the reference (it has one), sglang's
    ``UnifiedRadixCache`` (the scheduler's, on the tree core sglang selects), the same on
    sglang's Python tree core, and the plain ``RadixCache`` on the sglang target
    (`kvcheck.targets.sglang.scheduler_trees`).

    >>> class Builtin:
    ...     name = "kvcheck"
    >>> memory_prefix_caches(Builtin()) is None
    True
    """
    if getattr(target, "name", None) == "sglang":
        from kvcheck.targets.sglang.scheduler_memory import PREFIX_CACHES, eviction_policies

        return {cache: eviction_policies(cache) for cache in PREFIX_CACHES}
    return None


def memory_factory(target: Any) -> MemoryFactory:
    """The memory factory for ``target`` (see `memory_skip_reason` for which)."""
    reason = memory_skip_reason(target)
    if reason is not None:
        raise ValueError(reason)
    if target.name == "sglang":
        return _sglang_memory
    return ReferenceSchedulerMemory


def _sglang_memory(**geometry: Any) -> Any:
    from kvcheck.targets.sglang.scheduler_memory import SglangSchedulerMemory

    class SglangMemoryWithSnapshot(SglangSchedulerMemory):
        def snapshot(self) -> Snapshot:
            raw = self.raw_state()
            raw["nodes"] = tuple(
                CachedNode(**n) for n in sorted(raw["nodes"], key=lambda n: n["node_id"])
            )
            raw["requests"] = tuple(RequestHolding(**r) for r in raw["requests"])
            raw["own_checks"] = tuple(OwnCheck(**c) for c in raw["own_checks"])
            return Snapshot(**raw)

    return SglangMemoryWithSnapshot(**geometry)
