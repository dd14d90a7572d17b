"""Guards an allocator or host pool keeps itself: every bad input of a guarded kind is
refused, and the refusal changes nothing.

A target that validates input (capability ``input_validation``) keeps every guard here. A
target that does not may still guard some contracts itself, with an ``assert`` or a check
of its own (SGLang's allocators assert that a segment free starts on a page boundary,
that free groups do not nest and that the segments of one free share no page; its host
pools assert that an allocation is whole pages and that a freed slot is held): such a
guard is that target's own contract, so the suite checks it holds for every input of its
kind, on that target too. The target names the guards it keeps in ``tier_guards``
(:func:`kept_guards`).

A guard holds when the call raises (``AssertionError`` or ``ValueError``: either is a
refusal) and the allocator's or host pool's free space is what it was before the call.

Example:
    >>> from types import SimpleNamespace
    >>> unchecked = {"input_validation": "checks nothing"}
    >>> guards = ("host_partial_page",)
    >>> target = SimpleNamespace(name="t", unsupported=unchecked, tier_guards=guards)
    >>> sorted(kept_guards(target))
    ['host_partial_page']
    >>> guard_skip_reason(target, "segment_start")
    "target 't' does not guard segment_start (a segment free whose start is not page-aligned)"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from hypothesis import strategies as st

from kvcheck.failures import FailureSignature, PropertyFailure
from kvcheck.properties.allocators import allocator_family, allocator_sizes
from kvcheck.properties.assertions import failure
from kvcheck.tiers import AllocatorSpec

__all__ = [
    "ALLOCATOR_GUARDS",
    "GUARDS",
    "HOST_GUARDS",
    "check_allocator_guard",
    "check_host_guard",
    "guard_skip_reason",
    "kept_guards",
]

#: Every guard, and the bad input it refuses.
GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "segment_start": "a segment free whose start is not page-aligned",
        "nested_free_group": "free_group_begin inside an open free group",
        "segments_share_page": "a free of several segments, two of which share a page",
        "host_partial_page": "a host alloc of part of a page",
        "host_double_free": "a host free of a slot not held",
    }
)
#: The allocator guards (checked on every allocator kind) and the host-pool ones.
ALLOCATOR_GUARDS: tuple[str, ...] = ("segment_start", "nested_free_group", "segments_share_page")
HOST_GUARDS: tuple[str, ...] = ("host_partial_page", "host_double_free")
#: What a refusal may raise: a check's ``ValueError`` or an ``assert``'s ``AssertionError``.
_REFUSALS = (AssertionError, ValueError)


def kept_guards(target: Any) -> frozenset[str]:
    """The guards ``target`` keeps: every one where it validates input, else those it
    names in ``tier_guards``."""
    from kvcheck.targets import supports

    if supports(target, "input_validation"):
        return frozenset(GUARDS)
    return frozenset(getattr(target, "tier_guards", ()) or ())


def guard_skip_reason(target: Any, guard: str) -> str | None:
    """Why ``guard`` is not checked on ``target`` (None: it is)."""
    if guard not in GUARDS:
        raise ValueError(f"guard={guard!r} not in {tuple(GUARDS)}")
    if guard in kept_guards(target):
        return None
    name = getattr(target, "name", target)
    return f"target {name!r} does not guard {guard} ({GUARDS[guard]})"


def _refused(
    run: Callable[[], Any], sizes: Callable[[], dict[str, int]], signature: FailureSignature
) -> None:
    """``run()`` raises a refusal and ``sizes()`` is unchanged by it."""
    __tracebackhide__ = True
    call = signature.call
    before = sizes()
    try:
        run()
    except PropertyFailure:
        raise
    except _REFUSALS:
        pass
    else:
        raise failure(
            f"got no exception but should be refused [{call}: {signature.kind}]",
            signature=FailureSignature(
                "guard", call.split("(")[0], "not refused", signature.family
            ),
        )
    after = sizes()
    if after != before:
        raise failure(
            f"got {after} after the refusal but should be {before} [{call}: {signature.kind}]",
            signature=FailureSignature(
                "guard", call.split("(")[0], "refusal changed the free space", signature.family
            ),
        )


# --- allocators --------------------------------------------------------------------------------


def _requests(allocator: Any, spec: AllocatorSpec, data: st.DataObject) -> list[list[int]]:
    """One to three requests' rows of slots, as the scheduler allocates them (``alloc`` at
    page size 1, a prefill ``alloc_extend`` above it)."""
    rows: list[list[int]] = []
    for _ in range(data.draw(st.integers(1, 3), label="requests")):
        tokens = data.draw(st.integers(1, 3 * spec.page_size), label="request tokens")
        if spec.page_size == 1:
            out = allocator.alloc(tokens)
        else:
            t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
            out = allocator.alloc_extend(t(0), t(0), t(tokens), t(tokens), t(-1), tokens)
        if out is not None:
            rows.append([int(x) for x in out.tolist()])
    return rows


def check_allocator_guard(
    allocator: Any, spec: AllocatorSpec, guard: str, data: st.DataObject
) -> None:
    """After a few requests are allocated, one bad call of ``guard``'s kind is refused and
    changes no free space (page size 1 has no unaligned segment start: nothing to check).

    Example:
        >>> import torch
        >>> from hypothesis import given, settings, strategies as st
        >>> from kvcheck.allocators import PagedTokenToKVPoolAllocator
        >>> spec = AllocatorSpec(kind="paged", size=8, page_size=2)
        >>> @settings(max_examples=5, database=None)
        ... @given(st.data())
        ... def holds(data):
        ...     allocator = PagedTokenToKVPoolAllocator(8, 2, torch.bfloat16, "cpu", None, False)
        ...     check_allocator_guard(allocator, spec, "segment_start", data)
        >>> holds()
    """
    if guard not in ALLOCATOR_GUARDS:
        raise ValueError(f"guard={guard!r} not in {ALLOCATOR_GUARDS}")
    rows = [row for row in _requests(allocator, spec, data) if row]
    if not rows:
        return
    family, ps = allocator_family(spec), spec.page_size
    sizes = lambda: allocator_sizes(allocator, spec)  # noqa: E731
    full = data.draw(st.booleans(), label="full side only") and spec.kind != "token"
    row = data.draw(st.sampled_from(rows), label="request")
    ids = lambda part: torch.tensor(part, dtype=torch.int64)  # noqa: E731
    if guard == "segment_start":
        starts = [s for s in range(1, len(row)) if s % ps]
        if not starts:
            return
        start = data.draw(st.sampled_from(starts), label="start_pos")
        method = "free_full_segment" if full else "free_segment"
        call = f"{method}({row[start:]}, start_pos={start})"
        _refused(
            lambda: getattr(allocator, method)(ids(row[start:]), start_pos=start),
            sizes,
            FailureSignature("guard", call, GUARDS[guard], family),
        )
        return
    if guard == "nested_free_group":
        allocator.free_group_begin()
        if data.draw(st.booleans(), label="free in the group"):
            allocator.free(ids(row))
        try:
            _refused(
                allocator.free_group_begin,
                sizes,
                FailureSignature("guard", "free_group_begin()", GUARDS[guard], family),
            )
        finally:
            allocator.free_group_end()
        return
    first_end = data.draw(st.integers(1, len(row)), label="first segment's end")
    # An aligned start at or before the first segment's last page: the two share it.
    second = data.draw(
        st.sampled_from(list(range(0, first_end, ps))), label="second segment's start"
    )
    second_end = data.draw(st.integers(second + 1, len(row)), label="second segment's end")
    segments = [(row[:first_end], 0), (row[second:second_end], second)]
    method = "free_full_segments" if full else "free_segments"
    call = f"{method}({segments})"
    _refused(
        lambda: getattr(allocator, method)([(ids(part), at) for part, at in segments]),
        sizes,
        FailureSignature("guard", call, GUARDS[guard], family),
    )


# --- host pools --------------------------------------------------------------------------------


def check_host_guard(host: Any, page_size: int, guard: str, data: st.DataObject) -> None:
    """After some host pages are allocated (and some of them freed), one bad host call of
    ``guard``'s kind is refused and changes ``available_size()`` (page size 1 has no
    partial page: nothing to check).

    Example:
        >>> import torch
        >>> from hypothesis import given, settings, strategies as st
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.tiers import HostPoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> target = resolve_target("kvcheck")
        >>> device = PoolSpec(family="mla", size=8, page_size=2, layer_num=1, dtype="bfloat16")
        >>> spec = HostPoolSpec(device=device, layout="layer_first", io_backend="kernel",
        ...                     host_pages=3)
        >>> pool = target.make_pool(device, device="cpu")
        >>> @settings(max_examples=5, database=None)
        ... @given(st.data())
        ... def holds(data):
        ...     host = target.make_host_pool(spec, pool, device="cpu")[0]
        ...     check_host_guard(host, 2, "host_double_free", data)
        >>> holds()
    """
    if guard not in HOST_GUARDS:
        raise ValueError(f"guard={guard!r} not in {HOST_GUARDS}")
    family = f"host:{type(host).__name__}"
    sizes = lambda: {"available_size()": int(host.available_size())}  # noqa: E731
    pages = int(host.available_size()) // page_size
    held = data.draw(st.integers(0, pages), label="host pages allocated")
    out = host.alloc(held * page_size) if held else None
    slots = [] if out is None else [int(x) for x in out.tolist()]
    freed = data.draw(st.integers(0, held), label="host pages freed") * page_size
    if freed:
        host.free(torch.tensor(slots[:freed], dtype=torch.int64))
    if guard == "host_partial_page":
        if page_size == 1:
            return
        whole = st.integers(0, pages + 1).map(lambda n: n * page_size)
        need = data.draw(st.tuples(whole, st.integers(1, page_size - 1)).map(sum), label="tokens")
        _refused(
            lambda: host.alloc(need),
            sizes,
            FailureSignature("guard", f"alloc({need})", GUARDS[guard], family),
        )
        return
    held_now = set(slots[freed:])
    total = int(getattr(host, "size", pages * page_size))
    not_held = [slot for slot in range(total) if slot not in held_now]
    if not not_held:
        return
    slot = data.draw(st.sampled_from(not_held), label="slot not held")
    _refused(
        lambda: host.free(torch.tensor([slot], dtype=torch.int64)),
        sizes,
        FailureSignature("guard", f"free([{slot}])", GUARDS[guard], family),
    )
