"""The scheduler-memory machine: a request's life through the prefix cache, the
req-to-token pool and the allocator, with every law of `kvcheck.scheduler.laws` checked
after every step.

Steps are drawn the way a scheduler makes them: a new request whose prompt shares a
prefix with earlier ones (its first prefill chunk with it), a further chunk of a chunked
prefill, decode (speculative: drafts allocated, some accepted, the rest given back),
finish (the request is cached), abort at any point, retraction with its backup and a
later restore, eviction to make room, and flush when idle. The memory's geometry (a
page size and an eviction policy from those the machine is given, by default page size
1, 2 or 4 and LRU or LFU; a few pages and rows) is drawn once per example, and so is the
prefix cache where the memory offers several (``prefix_caches``: each with the eviction
policies it takes). Examples shrink towards one short request and the first page size,
prefix cache and policy given.

Example::

    >>> from hypothesis import settings
    >>> from kvcheck.scheduler.model import ReferenceSchedulerMemory
    >>> machine = scheduler_machine(
    ...     ReferenceSchedulerMemory, settings=settings(max_examples=2, database=None)
    ... )
    >>> from hypothesis.stateful import run_state_machine_as_test
    >>> run_state_machine_as_test(machine, settings=machine.TestCase.settings)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.scheduler.laws import LawBroken, check_laws, describe_holdings
from kvcheck.scheduler.model import EVICTION_POLICIES
from kvcheck.scheduler.snapshot import Snapshot

__all__ = ["STEP_KINDS", "SchedulerMemory", "scheduler_machine"]

#: The step kinds the machine draws, each a rule of its own (so call counts name them).
STEP_KINDS = (
    "admit",
    "prefill_chunk",
    "decode",
    "finish",
    "abort",
    "retract",
    "restore",
    "evict",
    "flush",
)

#: The token ids prompts draw from: few, so that prompts share prefixes often.
VOCABULARY = st.integers(min_value=0, max_value=2)


class SchedulerMemory(Protocol):
    """What the machine drives: the reference (`ReferenceSchedulerMemory`) or a target's
    driver over its own scheduler code. A step returns ``False`` when it refuses for want
    of memory, leaving everything as it was."""

    def admit(self, rid: str, tokens: list[int], *, first_chunk: int) -> bool: ...
    def prefill_chunk(self, rid: str, tokens: int) -> bool: ...
    def decode(self, rid: str, accepted: list[int], *, draft: int) -> bool: ...
    def finish(self, rid: str) -> None: ...
    def abort(self, rid: str) -> None: ...
    def retract(self, rid: str) -> Any: ...
    def restore(self, rid: str) -> bool: ...
    def evict(self, tokens: int) -> int: ...
    def flush(self) -> bool: ...
    def snapshot(self) -> Snapshot: ...


#: Builds a memory from its geometry: ``total``, ``page_size``, ``rows``, ``max_len`` and
#: ``eviction``, and ``prefix_cache`` where the machine is given several, all keyword
#: arguments.
MemoryFactory = Callable[..., SchedulerMemory]

MAX_LEN = 24

#: The page sizes the machine draws by default: the token allocator and two paged ones.
PAGE_SIZES = (1, 2, 4)


class SchedulerMemoryMachine(RuleBasedStateMachine):
    """See the module docstring; `scheduler_machine` binds the memory factory."""

    make_memory: MemoryFactory
    page_sizes: tuple[int, ...]
    eviction_policies: tuple[str, ...]
    prefix_caches: dict[str, tuple[str, ...]] | None

    def __init__(self) -> None:
        super().__init__()
        self.memory: SchedulerMemory | None = None
        self.phase: dict[str, str] = {}  # rid -> "prefill", "running" or "retracted"
        self.prompts: list[list[int]] = []
        self.steps: list[str] = []
        self.counter = 0

    @initialize(
        data=st.data(),
        pages=st.integers(min_value=4, max_value=12),
        rows=st.integers(min_value=2, max_value=4),
    )
    def build(self, data: st.DataObject, pages: int, rows: int) -> None:
        page_size = data.draw(st.sampled_from(type(self).page_sizes), label="page size")
        caches = type(self).prefix_caches
        chosen: dict[str, str] = {}
        policies = type(self).eviction_policies
        if caches is not None:
            chosen["prefix_cache"] = data.draw(st.sampled_from(list(caches)), label="prefix cache")
            policies = caches[chosen["prefix_cache"]]
        chosen["eviction"] = data.draw(st.sampled_from(policies), label="eviction")
        self.memory = type(self).make_memory(
            total=pages * page_size, page_size=page_size, rows=rows, max_len=MAX_LEN, **chosen
        )
        self.steps.append(
            f"memory(total={pages * page_size}, page_size={page_size}, rows={rows}, "
            + ", ".join(f"{name}={value!r}" for name, value in chosen.items())
            + ")"
        )

    @property
    def _memory(self) -> SchedulerMemory:
        assert self.memory is not None
        return self.memory

    def _holding(self, rid: str) -> Any:
        return next(r for r in self._memory.snapshot().requests if r.rid == rid)

    def _pick(self, data: st.DataObject, phases: tuple[str, ...]) -> str:
        rids = sorted(r for r, p in self.phase.items() if p in phases)
        return data.draw(st.sampled_from(rids), label="request")

    def _has(self, *phases: str) -> bool:
        return any(p in phases for p in self.phase.values())

    def _log(self, step: str) -> None:
        self.steps.append(step)

    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        shared: list[int] = []
        if self.prompts:
            source = data.draw(st.sampled_from(self.prompts), label="shares a prefix with")
            shared = source[: data.draw(st.integers(0, len(source)), label="shared length")]
        fresh = data.draw(st.lists(VOCABULARY, min_size=1, max_size=8), label="fresh tokens")
        tokens = (shared + fresh)[: MAX_LEN - 6]
        first_chunk = data.draw(st.integers(1, len(tokens)), label="first chunk")
        self.counter += 1
        rid = f"r{self.counter}"
        admitted = self._memory.admit(rid, tokens, first_chunk=first_chunk)
        self._log(f"admit({rid!r}, {tokens}, first_chunk={first_chunk}) -> {admitted}")
        if admitted:
            self.prompts.append(tokens)
            held = self._holding(rid)
            self.phase[rid] = "prefill" if held.committed < len(tokens) else "running"

    @precondition(lambda self: self._has("prefill"))
    @rule(data=st.data())
    def prefill_chunk(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("prefill",))
        size = data.draw(st.integers(1, 8), label="chunk")
        done = self._memory.prefill_chunk(rid, size)
        self._log(f"prefill_chunk({rid!r}, {size}) -> {done}")
        held = self._holding(rid)
        if held.committed == len(held.tokens):
            self.phase[rid] = "running"

    @precondition(lambda self: self._has("running"))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("running",))
        draft = data.draw(st.integers(0, 3), label="draft tokens")
        accepted = data.draw(st.lists(VOCABULARY, min_size=1, max_size=draft + 1), label="accepted")
        done = self._memory.decode(rid, accepted, draft=draft)
        self._log(f"decode({rid!r}, {accepted}, draft={draft}) -> {done}")

    @precondition(lambda self: self._has("running"))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("running",))
        self._memory.finish(rid)
        self._log(f"finish({rid!r})")
        del self.phase[rid]

    @precondition(lambda self: self._has("prefill", "running"))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("prefill", "running"))
        self._memory.abort(rid)
        self._log(f"abort({rid!r})")
        del self.phase[rid]

    @precondition(lambda self: self._has("running"))
    @rule(data=st.data())
    def retract(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("running",))
        self._memory.retract(rid)
        self._log(f"retract({rid!r})")
        self.phase[rid] = "retracted"

    @precondition(lambda self: self._has("retracted"))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        rid = self._pick(data, ("retracted",))
        done = self._memory.restore(rid)
        self._log(f"restore({rid!r}) -> {done}")
        if done:
            self.phase[rid] = "running"

    @rule(tokens=st.integers(1, 16))
    def evict(self, tokens: int) -> None:
        freed = self._memory.evict(tokens)
        self._log(f"evict({tokens}) -> {freed}")

    @precondition(lambda self: not self._has("prefill", "running"))
    @rule()
    def flush(self) -> None:
        done = self._memory.flush()
        self._log(f"flush() -> {done}")

    @invariant()
    def laws_hold(self) -> None:
        if self.memory is None:
            return
        snap = self.memory.snapshot()
        try:
            check_laws(snap)
        except LawBroken as broken:
            broken.add_note(
                f"the {broken.law} law broke after step {len(self.steps) - 1}: {self.steps[-1]}"
            )
            broken.add_note("steps:\n  " + "\n  ".join(self.steps))
            broken.add_note("held after that step:\n" + describe_holdings(snap))
            raise


def scheduler_machine(
    make_memory: MemoryFactory,
    *,
    settings: Settings | None = None,
    page_sizes: tuple[int, ...] = PAGE_SIZES,
    eviction_policies: tuple[str, ...] = EVICTION_POLICIES,
    prefix_caches: dict[str, tuple[str, ...]] | None = None,
) -> type[SchedulerMemoryMachine]:
    """A machine class driving the memories ``make_memory`` builds (called with the
    geometry as keyword arguments: ``total``, ``page_size``, ``rows``, ``max_len``,
    ``eviction``), under ``settings`` (default: the current profile), drawing the page
    size from ``page_sizes`` and the eviction policy from ``eviction_policies`` (each
    shrinking towards its first). With ``prefix_caches`` (each prefix cache the memory
    builds, with the eviction policies it takes), the machine draws one and passes it as
    ``prefix_cache=``, and draws the policy from its own.

    >>> from kvcheck.scheduler.model import ReferenceSchedulerMemory
    >>> scheduler_machine(ReferenceSchedulerMemory).__name__
    'SchedulerMemoryMachine'
    """
    if not callable(make_memory):
        raise TypeError(f"make_memory={make_memory!r} must be callable")
    if not page_sizes or any(not isinstance(p, int) or p < 1 for p in page_sizes):
        raise ValueError(f"page_sizes={page_sizes!r} must be a non-empty tuple of integers >= 1")
    if not eviction_policies or any(not isinstance(p, str) for p in eviction_policies):
        raise ValueError(
            f"eviction_policies={eviction_policies!r} must be a non-empty tuple of names"
        )
    if prefix_caches is not None and (
        not prefix_caches
        or any(not isinstance(name, str) or not kinds for name, kinds in prefix_caches.items())
    ):
        raise ValueError(
            f"prefix_caches={prefix_caches!r} must map each prefix cache's name to a "
            "non-empty tuple of its eviction policies"
        )
    machine: type[SchedulerMemoryMachine] = type(
        "SchedulerMemoryMachine",
        (SchedulerMemoryMachine,),
        {
            "make_memory": staticmethod(make_memory),
            "page_sizes": tuple(page_sizes),
            "eviction_policies": tuple(eviction_policies),
            "prefix_caches": None if prefix_caches is None else dict(prefix_caches),
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine
