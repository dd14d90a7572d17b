"""Naive models of the token-to-KV allocators: sets of free pages, loops, no tensors.

:class:`ReferenceAllocator` models a token, paged or sliding-window allocator
(:class:`kvcheck.tiers.AllocatorSpec`). It does not predict *which* free page an allocator
takes (SGLang's order is an implementation detail); it judges each answer the allocator
gives and then records it, so after every step it knows the truth: which pages are free,
which slots of each held page were handed out, which sliding-window peer each full-side
slot has. Each judging method returns the problems it found (empty: the answer is one a
correct allocator may give):

- every slot handed out lies in a page that was free, or continues the request's own last
  page right after its last slot (no slot is handed out twice);
- extend and decode answers are page-aligned: token ``k`` of a request at offset
  ``k % page_size`` of its page, fresh pages whole and from offset 0;
- an allocation is refused exactly when the free pages do not cover it, on either side;
- a free releases the pages of the slots it names, each once (a group's at its end).

Example:
    >>> from kvcheck.tiers import AllocatorSpec
    >>> ref = ReferenceAllocator(AllocatorSpec(kind="paged", size=8, page_size=4))
    >>> ref.alloc(4, [4, 5, 6, 7])
    []
    >>> ref.alloc(4, [4, 5, 6, 7])
    ['alloc(4): slot 4 is in page 1, which is held (handed out before and not freed)']
    >>> ref.available_size()
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcheck.tiers import AllocatorSpec

__all__ = ["ReferenceAllocator", "ReferenceSide", "Request", "answer_plan"]


@dataclass(frozen=True)
class Request:
    """One request of an extend or decode batch: ``prefix`` tokens held (the last at slot
    ``last_loc``, -1 without a prefix), growing to ``seq`` tokens."""

    prefix: int
    seq: int
    last_loc: int


def answer_plan(requests: Sequence[Request] | int, page_size: int) -> list[int | str]:
    """What each slot of a correct answer is, in order, as the judging methods see it:
    ``"page"`` (the first slot of a page that was free), ``"next"`` (the slot after the one
    before it in the answer) or a slot number ``s`` (the slot after ``s``, a continued
    request's last). ``requests`` is an extend or decode batch, or the size of an ``alloc``
    (whole pages, each from its first slot).

    Example:
        >>> answer_plan([Request(prefix=3, seq=6, last_loc=10)], 4)
        [10, 'page', 'next']
        >>> answer_plan(4, 2)
        ['page', 'next', 'page', 'next']
    """
    if isinstance(requests, int):
        return ["page" if i % page_size == 0 else "next" for i in range(requests)]
    plan: list[int | str] = []
    for request in requests:
        for token in range(request.prefix, request.seq):
            if token % page_size == 0:
                plan.append("page")
            elif token == request.prefix:
                plan.append(request.last_loc)
            else:
                plan.append("next")
    return plan


def _ceil_pages(tokens: int, page_size: int) -> int:
    pages = 0
    while pages * page_size < tokens:
        pages += 1
    return pages


@dataclass
class ReferenceSide:
    """One allocator (one side of a sliding-window one): free pages and held slots."""

    num_pages: int
    page_size: int
    free: set[int] = field(default_factory=set)
    #: held page -> how many of its slots were handed out (from offset 0)
    fill: dict[int, int] = field(default_factory=dict)
    #: tokens freed inside the open free group (None: no group open)
    group: list[int] | None = None

    def __post_init__(self) -> None:
        self.free = set(range(1, self.num_pages + 1))

    def available_size(self) -> int:
        return len(self.free) * self.page_size

    def new_pages(self, requests: Sequence[Request]) -> int:
        total = 0
        for request in requests:
            total += _ceil_pages(request.seq, self.page_size)
            total -= _ceil_pages(request.prefix, self.page_size)
        return total

    # -- judging answers ------------------------------------------------------------------

    def take_pages(self, call: str, slots: Sequence[int]) -> list[str]:
        """``alloc``'s answer: whole free pages, each slot once."""
        ps = self.page_size
        problems: list[str] = []
        if len(slots) % ps:
            return [f"{call}: {len(slots)} slots are not whole pages of {ps}"]
        taken: set[int] = set()
        for start in range(0, len(slots), ps):
            page = slots[start] // ps
            for offset in range(ps):
                slot = slots[start + offset]
                if slot != page * ps + offset:
                    problems.append(
                        f"{call}: slot {slot} at position {start + offset} breaks page {page} "
                        f"(expected slot {page * ps + offset})"
                    )
            problems.extend(self._fresh(call, slots[start], page, taken))
            taken.add(page)
        if not problems:
            for page in taken:
                self.free.discard(page)
                self.fill[page] = ps
        return problems

    def _fresh(self, call: str, slot: int, page: int, taken: set[int]) -> list[str]:
        if page in taken:
            return [f"{call}: page {page} (slot {slot}) is handed out twice in one answer"]
        if page == 0:
            return [f"{call}: slot {slot} is in page 0, the padding page"]
        if not 1 <= page <= self.num_pages:
            return [f"{call}: slot {slot} is in page {page}, outside pages 1..{self.num_pages}"]
        if page not in self.free:
            return [
                f"{call}: slot {slot} is in page {page}, which is held"
                " (handed out before and not freed)"
            ]
        return []

    def grow(self, call: str, requests: Sequence[Request], slots: Sequence[int]) -> list[str]:
        """``alloc_extend`` / ``alloc_decode``'s answer: page-aligned, request-major."""
        ps = self.page_size
        want = 0
        for request in requests:
            want += request.seq - request.prefix
        if len(slots) != want:
            return [f"{call}: {len(slots)} slots for a batch that grows by {want}"]
        problems: list[str] = []
        taken: set[int] = set()
        fills: dict[int, int] = {}
        position = 0
        for number, request in enumerate(requests):
            previous = request.last_loc
            for token in range(request.prefix, request.seq):
                slot = slots[position]
                position += 1
                where = f"{call}: request {number}, token {token} -> slot {slot}"
                if slot % ps != token % ps:
                    problems.append(
                        f"{where}: at offset {slot % ps}, not {token % ps} (page alignment)"
                    )
                elif token % ps:
                    if slot != previous + 1:
                        problems.append(f"{where}: does not follow slot {previous} in its page")
                else:
                    problems.extend(self._fresh(where, slot, slot // ps, taken))
                    taken.add(slot // ps)
                fills[slot // ps] = slot % ps + 1
                previous = slot
        if not problems:
            for page in taken:
                self.free.discard(page)
            self.fill.update(fills)
        return problems

    # -- freeing --------------------------------------------------------------------------

    def free_problem(self, slots: Sequence[int]) -> str | None:
        """Why freeing ``slots`` is not valid (None: it is)."""
        seen: set[int] = set()
        pending = set(self.group or ())
        for slot in slots:
            if slot in seen:
                return f"slot {slot} is listed twice"
            seen.add(slot)
            page = slot // self.page_size
            if not 0 <= page <= self.num_pages:
                return f"slot {slot} is outside the pool"
            if slot % self.page_size >= self.fill.get(page, 0):
                return f"slot {slot} was not handed out (or is free)"
            if slot in pending:
                return f"slot {slot} was freed already in the open free group"
        return None

    def release(self, slots: Sequence[int]) -> None:
        """Free ``slots`` (valid): their pages now, or at the end of the open group."""
        if self.group is not None:
            self.group.extend(slots)
            return
        for slot in slots:
            page = slot // self.page_size
            if page in self.fill:
                del self.fill[page]
                self.free.add(page)

    def end_group(self) -> None:
        pending = self.group or []
        self.group = None
        self.release(pending)


class ReferenceAllocator:
    """A token, paged or sliding-window allocator of ``spec``, modelled by its free pages.

    For ``swa`` the full side is :attr:`full`, the sliding-window side :attr:`swa`, and
    :attr:`mapping` holds each full-side slot's peer (slots without one are absent).
    """

    def __init__(self, spec: AllocatorSpec) -> None:
        self.spec = spec
        self.full = ReferenceSide(spec.num_pages, spec.page_size)
        self.swa: ReferenceSide | None = None
        self.mapping: dict[int, int] = {}
        #: pure sliding-window: one pool, each slot its own window peer
        self.pure = spec.kind == "pure_swa"
        if spec.kind == "swa":
            self.swa = ReferenceSide(spec.size_swa // spec.page_size, spec.page_size)

    def sides(self) -> tuple[ReferenceSide, ...]:
        return (self.full,) if self.swa is None else (self.full, self.swa)

    def available_size(self) -> int:
        """What the allocator can hand out: the smaller side's free slots."""
        return min(side.available_size() for side in self.sides())

    def refuses_pages(self, pages: int) -> bool:
        """Whether an allocation of ``pages`` fresh pages (on each side) must be refused."""
        return any(pages > len(side.free) for side in self.sides())

    # -- allocating ------------------------------------------------------------------------

    def alloc(self, need_size: int, slots: Sequence[int], peers: Sequence[int] = ()) -> list[str]:
        """Judge and record ``alloc(need_size)``'s answer (``peers``: its sliding-window peers)."""
        call = f"alloc({need_size})"
        if len(slots) != need_size:
            return [f"{call}: {len(slots)} slots"]
        problems = self.full.take_pages(call, slots)
        if self.swa is not None and not problems:
            problems = self.swa.take_pages(f"{call} (sliding-window peers)", peers)
            if not problems:
                for slot, peer in zip(slots, peers, strict=True):
                    self.mapping[slot] = peer
        return problems

    def swa_requests(self, requests: Sequence[Request]) -> list[Request]:
        """The batch on the sliding-window side: each last location translated."""
        return [
            Request(r.prefix, r.seq, -1 if r.last_loc == -1 else self.mapping.get(r.last_loc, 0))
            for r in requests
        ]

    def grow(
        self,
        call: str,
        requests: Sequence[Request],
        slots: Sequence[int],
        peers: Sequence[int] = (),
    ) -> list[str]:
        """Judge and record an extend or decode answer (``peers``: its sliding-window peers)."""
        problems = self.full.grow(call, requests, slots)
        if self.swa is not None and not problems:
            problems = self.swa.grow(
                f"{call} (sliding-window peers)", self.swa_requests(requests), peers
            )
            if not problems:
                for slot, peer in zip(slots, peers, strict=True):
                    self.mapping[slot] = peer
        return problems

    def new_pages(self, requests: Sequence[Request]) -> int:
        return self.full.new_pages(requests)

    # -- freeing ---------------------------------------------------------------------------

    def free_problem(self, slots: Sequence[int]) -> str | None:
        """Why ``free(slots)`` is bad input (None: it is valid)."""
        return self.full.free_problem(slots)

    def _window_slots(self, slots: Sequence[int]) -> list[int]:
        """Every slot of the full pages ``slots`` touch, each once."""
        ps = self.spec.page_size
        pages: list[int] = []
        for slot in slots:
            if slot // ps not in pages:
                pages.append(slot // ps)
        return [page * ps + offset for page in pages for offset in range(ps)]

    def swa_tail(
        self,
        call: str,
        request: Request,
        tail: int,
        slots: Sequence[int],
        peers: Sequence[int],
    ) -> list[str]:
        """Judge and record ``alloc_extend_swa_tail``'s answer: the full side grows as an
        extend grows it; the last ``tail`` slots get ``peers``, a fresh window request."""
        problems = self.full.grow(call, [request], slots)
        if problems or self.swa is None:
            return problems
        if len(peers) != tail:
            return [f"{call}: {len(peers)} window peers for a tail of {tail}"]
        problems = self.swa.grow(
            f"{call} (window peers of the tail)", [Request(0, tail, -1)], peers
        )
        if not problems:
            for slot, peer in zip(slots[len(slots) - tail :], peers, strict=True):
                self.mapping[slot] = peer
        return problems

    def refuses_tail(self, request: Request, tail: int) -> bool:
        """Whether ``alloc_extend_swa_tail`` of ``request`` must be refused."""
        if self.full.new_pages([request]) > len(self.full.free):
            return True
        window = Request(0, tail, -1)
        return self.swa is not None and self.swa.new_pages([window]) > len(self.swa.free)

    def free_swa(self, slots: Sequence[int]) -> None:
        """Release the sliding-window peers of the full pages ``slots`` touch (valid input);
        for a pure sliding-window allocator, the slots themselves."""
        if self.pure:
            self.full.release(slots)
            return
        assert self.swa is not None
        peers = []
        for slot in self._window_slots(slots):
            if slot in self.mapping:
                peers.append(self.mapping.pop(slot))
        self.swa.release(peers)

    def free(self, slots: Sequence[int]) -> None:
        """Release the pages of ``slots`` (valid input), both sides."""
        if self.swa is not None:
            self.free_swa(slots)
        self.full.release(slots)

    def free_full(self, slots: Sequence[int]) -> None:
        """``free_full`` (valid input): the full side's pages; nothing for a pure
        sliding-window allocator, whose ``free_swa`` released them."""
        if not self.pure:
            self.full.release(slots)

    def free_full_problem(self, slots: Sequence[int]) -> str | None:
        """Why ``free_full(slots)`` is bad input (None: it is valid)."""
        if self.pure:
            return None if len(set(slots)) == len(slots) else "a slot is listed twice"
        problem = self.full.free_problem(slots)
        if problem is None and self.swa is not None:
            live = [slot for slot in self._window_slots(slots) if slot in self.mapping]
            if live:
                return f"slots {live} still have window peers"
        return problem

    def free_pages_problems(
        self, side: ReferenceSide, pages: Sequence[int], name: str
    ) -> list[str]:
        """What is wrong with an allocator's census of ``side``'s free pages (each free page
        listed once, no other page)."""
        problems: list[str] = []
        seen: set[int] = set()
        for page in pages:
            if page in seen:
                problems.append(f"{name}: page {page} is listed free twice")
            elif page not in side.free:
                problems.append(f"{name}: page {page} is listed free but is held (or no page)")
            seen.add(page)
        for page in sorted(side.free):
            if page not in seen:
                problems.append(f"{name}: page {page} is free but not listed")
        return problems

    def free_group_begin(self) -> None:
        for side in self.sides():
            side.group = []

    def free_group_end(self) -> None:
        for side in self.sides():
            side.end_group()

    def expected_mapping(self, slots: Sequence[int]) -> list[int]:
        """The sliding-window peer of each full-side slot (0: none; -1 stays -1; a pure
        sliding-window allocator's: the slot itself)."""
        if self.pure:
            return list(slots)
        return [-1 if slot == -1 else self.mapping.get(slot, 0) for slot in slots]
