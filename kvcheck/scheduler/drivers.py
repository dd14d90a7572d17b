"""Which scheduler memory the machine drives for a target: kvcheck's reference on the
built-in target, sglang's own scheduler memory code (through
`kvcheck.targets.sglang.scheduler_memory`) on the sglang target; none for other targets,
with the reason a skip quotes.

Example::

    >>> class Builtin:
    ...     name = "kvcheck"
    >>> memory_factory(Builtin()).__name__
    'ReferenceSchedulerMemory'
"""

from __future__ import annotations

from typing import Any

from kvcheck.scheduler.machine import MemoryFactory
from kvcheck.scheduler.model import ReferenceSchedulerMemory
from kvcheck.scheduler.snapshot import CachedNode, RequestHolding, Snapshot

__all__ = ["memory_factory", "memory_skip_reason"]

#: The targets whose scheduler memory kvcheck can drive.
DRIVEN_TARGETS = ("kvcheck", "sglang")


def memory_skip_reason(target: Any) -> str | None:
    """Why the machine cannot drive ``target``'s scheduler memory, or ``None``.

    >>> class Other:
    ...     name = "mine"
    >>> memory_skip_reason(Other())
    "target 'mine' declares no scheduler memory (driven: kvcheck, sglang)"
    """
    name = getattr(target, "name", None)
    if name not in DRIVEN_TARGETS:
        return f"target {name!r} declares no scheduler memory (driven: {', '.join(DRIVEN_TARGETS)})"
    if name == "sglang":
        from kvcheck.targets.sglang.scheduler_memory import why_not_driven

        return why_not_driven()
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
            return Snapshot(**raw)

    return SglangMemoryWithSnapshot(**geometry)
