"""A differential state machine for a target's token-to-KV allocator.

Each example draws one allocator (:func:`kvcheck.strategies.allocator_specs`), builds it
through the target and a :class:`~kvcheck.reference.allocators.ReferenceAllocator` beside it,
and runs the calls SGLang's scheduler makes, shaped as its callers shape them
(``srt/mem_cache/allocation.py``): ``alloc`` for page size 1 and for a host load-back,
``alloc_extend`` for a prefill batch (new requests and continued ones, int64 or int32 lengths,
as the speculative-decoding path passes), ``alloc_decode`` (one token per request), ``free`` of
finished requests, alone or in a free group (a request's row split over two frees in it),
or in segments (``free_segment(s)``, as the radix cache and ``free_kv_row_segments`` free),
``free_swa`` / ``free_swa_segment`` of the pages that left a request's sliding window,
``free_full`` / ``free_full_segments`` of those pages when the request finishes,
``alloc_extend_swa_tail`` (PD decode's preallocation: window peers for a tail only), frees
that name no slot, ``clear()``, a drain (``alloc`` of everything free, then freed) and, for
a target that validates input, bad calls. Every answer is judged by the reference (no slot
handed out twice, page alignment, refused exactly when the pages do not cover it, a refusal
changes nothing) and after every step ``available_size()`` (and SWA's two sides and its
mapping, and each side's census of its free pages) must equal the truth. Every call on the
allocator is recorded (:class:`~kvcheck.tier_log.TierLog`) with what was expected of its
answer: a failure lists the calls as Python and carries them for a standalone script.

Example::

    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.allocator_machine import allocator_machine
    from kvcheck.targets import resolve_target

    Machine = allocator_machine(resolve_target("kvcheck"), device="cpu", kind="paged")
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.failures import FailureSignature
from kvcheck.properties.allocators import (
    allocator_family,
    allocator_sizes,
    assert_allocator_state,
    assert_answer,
    assert_bad_call_refused,
    assert_hook_answer,
    assert_refusal,
    assert_reported_capacity,
)
from kvcheck.properties.assertions import failure
from kvcheck.reference.allocators import ReferenceAllocator, ReferenceSide, Request, answer_plan
from kvcheck.steering import Steering
from kvcheck.strategies.tier_specs import allocator_specs
from kvcheck.targets import supports
from kvcheck.targets.findings import steered_tags
from kvcheck.targets.tier_support import allocator_skip_reason, build_allocator
from kvcheck.tier_log import TierLog, checking, expect, expecting
from kvcheck.tiers import ALLOCATOR_KINDS, AllocatorSpec

__all__ = ["AllocatorMachine", "allocator_machine"]

_KINDS = (
    "pause",
    "alloc",
    "extend",
    "decode",
    "swa_tail",
    "free",
    "free_swa",
    "paged_call",
    "drain",
    "bad",
)

#: Slots of a request's row and the row position of the first (a free's segment).
Segment = tuple[list[int], int]
#: A free call: the method and the segments it names (one for a plain free).
FreeCall = tuple[str, list[Segment]]


def _lens(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


class AllocatorMachine(RuleBasedStateMachine):
    """Drives a target's allocator and the reference with the same calls (see the module)."""

    target: Any = None
    device: str = "cpu"
    kind: str = "token"
    validates: bool = True
    steer: Steering = Steering()

    def __init__(self) -> None:
        super().__init__()
        self.allocator: Any = None
        self.reference: ReferenceAllocator | None = None
        self.spec: AllocatorSpec | None = None
        #: request id -> its row of full-side slots, in token order
        self.rows: dict[int, list[int]] = {}
        #: request id -> how many of its first tokens left the sliding window
        self.dead: dict[int, int] = {}
        self.freed: list[int] = []  # slots of pages freed last (for double frees)
        self.next_request = 0
        #: The step just taken, as the failure messages name it.
        self.last_call = "allocator construction"
        #: Every call made on the allocator, with what was expected of its answer: a
        #: failure's example and its standalone script (:mod:`kvcheck.tier_log`).
        self.log: TierLog | None = None

    def _noted(self, error: BaseException) -> None:
        """Give ``error`` the calls made on the allocator so far, as Python, and their
        reproduction (the steps Hypothesis prints name the draws, not the calls)."""
        if self.log is not None:
            self.log.attach(error)

    def _build(self, spec: AllocatorSpec) -> None:
        self.spec = spec
        self.reference = ReferenceAllocator(spec)
        self.log = TierLog("allocator", spec, device=self.device)
        allocator = build_allocator(self.target, spec, device=self.device)
        self.allocator = self.log.wrap(allocator, "allocator")

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _spec(self) -> AllocatorSpec:
        assert self.spec is not None
        return self.spec

    @property
    def _ref(self) -> ReferenceAllocator:
        assert self.reference is not None
        return self.reference

    def _peers(self, slots: torch.Tensor) -> list[int]:
        if self._spec.kind != "swa" or not len(slots):
            return []
        with checking(self.allocator):
            peers = self.allocator.translate_loc_from_full_to_swa(slots)
        return [int(x) for x in peers.tolist()]

    def _expect_slots(
        self, method: str, plan: list[int | str], side: ReferenceSide | None = None
    ) -> None:
        """What the latest ``method`` call must have answered: slots following ``plan``
        (:func:`~kvcheck.reference.allocators.answer_plan`) in ``side``'s free pages (the
        full side's by default). Said before the reference judges the answer, for the
        failure's script (:mod:`kvcheck.tier_log`)."""
        side = self._ref.full if side is None else side
        rule = {
            "count": len(plan),
            "free_pages": sorted(side.free),
            "page_size": side.page_size,
            "plan": plan,
        }
        expect(self.allocator, method, slots=rule)

    def _expect_peers(self, plan: list[int | str]) -> None:
        """The window peers of the latest answer (a sliding-window allocator's) follow
        ``plan`` in the window side's free pages."""
        if self._ref.swa is not None:
            self._expect_slots("translate_loc_from_full_to_swa", plan, self._ref.swa)

    def _kinds(self) -> tuple[str, ...]:
        spec = self._spec
        kinds = ["pause", "free", "drain"]
        if spec.page_size == 1:
            kinds.append("alloc")
            if spec.kind in ("token", "pure_swa"):
                kinds.append("paged_call")
        else:
            kinds += ["extend", "decode"]
            if spec.kind == "paged":
                kinds.append("alloc")
            if spec.kind == "swa":
                kinds.append("swa_tail")
        if spec.kind in ("swa", "pure_swa"):
            kinds.append("free_swa")
        if self.validates:
            kinds.append("bad")
        return tuple(kind for kind in _KINDS if kind in kinds)

    # -- the one rule ----------------------------------------------------------------------

    @precondition(lambda self: self.allocator is not None)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One call of a drawn kind on the allocator and the reference."""
        kind = data.draw(st.sampled_from(self._kinds()), label="kind")
        if kind != "pause":
            try:
                getattr(self, f"_{kind}")(data)
            except Exception as error:
                self._noted(error)
                raise

    # -- allocating ------------------------------------------------------------------------

    def _alloc(self, data: st.DataObject) -> None:
        spec = self._spec
        # Up to the larger side: a sliding-window side may be the larger one.
        most = max(spec.num_pages, spec.size_swa // spec.page_size)
        pages = data.draw(st.integers(0, most), label="pages")
        self._alloc_tokens(pages * spec.page_size)

    def _alloc_tokens(self, need: int) -> list[int] | None:
        spec, ref = self._spec, self._ref
        call = self.last_call = f"alloc({need})"
        before = allocator_sizes(self.allocator, spec)
        out = self.allocator.alloc(need)
        assert_refusal(
            out is None,
            ref.refuses_pages(need // spec.page_size),
            before=before,
            allocator=self.allocator,
            call=call,
            spec=spec,
        )
        if out is None:
            return None
        slots = [int(x) for x in out.tolist()]
        self._expect_slots("alloc", answer_plan(need, spec.page_size))
        peers = self._peers(out)
        if peers:
            self._expect_peers(answer_plan(need, spec.page_size))
        assert_answer(ref.alloc(need, slots, peers), call=call, spec=spec)
        if slots:
            self._add_request(slots)
        return slots

    def _add_request(self, slots: list[int]) -> int:
        number = self.next_request
        self.next_request += 1
        self.rows[number] = list(slots)
        self.dead[number] = 0
        return number

    def _growable(self) -> list[int]:
        """Requests that can grow: they hold a slot, and their last one a window peer."""
        return [number for number, row in self.rows.items() if len(row) > self.dead[number]]

    def _extend(self, data: st.DataObject) -> None:
        spec = self._spec
        growable = self._growable()
        continued = data.draw(
            st.lists(st.sampled_from(growable), unique=True, min_size=1, max_size=3)
            if growable
            else st.just([]),
            label="continued requests",
        )
        fresh = data.draw(st.integers(0 if continued else 1, 2), label="new requests")
        # Mostly a page or two (what fits), sometimes up to more than the pool holds.
        small = st.integers(0, 2 * spec.page_size)
        tokens = st.one_of(small, small, st.integers(0, spec.size + spec.page_size))
        batch: list[tuple[int | None, Request]] = []
        for number in continued:
            row = self.rows[number]
            # Up to the end of a partly filled last page, where page alignment goes wrong.
            rest = -len(row) % spec.page_size
            grow = data.draw(st.one_of(tokens, st.just(rest)) if rest else tokens, label="tokens")
            batch.append((number, Request(len(row), len(row) + grow, row[-1])))
        for _ in range(fresh):
            batch.append((None, Request(0, 1 + data.draw(tokens, label="tokens"), -1)))
        order = data.draw(st.permutations(range(len(batch))), label="batch order")
        batch = [batch[i] for i in order]
        dtype = data.draw(st.sampled_from((torch.int64, torch.int32)), label="lens dtype")
        self._grow("alloc_extend", batch, dtype)

    def _decode(self, data: st.DataObject) -> None:
        numbers = self._growable()
        if not numbers:
            return
        chosen = data.draw(
            st.lists(st.sampled_from(numbers), unique=True, min_size=1, max_size=3),
            label="requests",
        )
        batch: list[tuple[int | None, Request]] = [
            (n, Request(len(self.rows[n]), len(self.rows[n]) + 1, self.rows[n][-1])) for n in chosen
        ]
        self._grow("alloc_decode", batch, torch.int64)

    def _one_side_refuses(self, requests: list[Request]) -> bool:
        ref = self._ref
        if ref.swa is None:
            return False
        pages = ref.new_pages(requests)
        return (pages > len(ref.full.free)) != (pages > len(ref.swa.free))

    def _grow(
        self, method: str, batch: list[tuple[int | None, Request]], dtype: torch.dtype
    ) -> None:
        spec, ref = self._spec, self._ref
        requests = [request for _, request in batch]
        steered = self.steer.avoids("allocator:one_side_refused", where=spec.kind)
        if steered and self._one_side_refuses(requests):
            return
        prefix = [r.prefix for r in requests]
        seq = [r.seq for r in requests]
        last = _lens([r.last_loc for r in requests], dtype)
        total = sum(s - p for p, s in zip(prefix, seq, strict=True))
        if method == "alloc_extend":
            call = f"alloc_extend(prefix_lens={prefix}, seq_lens={seq}, last_loc={last.tolist()})"
            args: tuple[Any, ...] = (
                _lens(prefix, dtype),
                _lens(prefix, dtype),
                _lens(seq, dtype),
                _lens(seq, dtype),
                last,
                total,
            )
        else:
            call = f"alloc_decode(seq_lens={seq}, last_loc={last.tolist()})"
            args = (_lens(seq, dtype), _lens(seq, dtype), last)
        self.last_call = call
        before = allocator_sizes(self.allocator, spec)
        out = getattr(self.allocator, method)(*args)
        assert_refusal(
            out is None,
            ref.refuses_pages(ref.new_pages(requests)),
            before=before,
            allocator=self.allocator,
            call=call,
            spec=spec,
        )
        if out is None:
            return
        slots = [int(x) for x in out.tolist()]
        self._expect_slots(method, answer_plan(requests, spec.page_size))
        peers = self._peers(out)
        if peers:
            self._expect_peers(answer_plan(ref.swa_requests(requests), spec.page_size))
        assert_answer(ref.grow(call, requests, slots, peers), call=call, spec=spec)
        position = 0
        for number, request in batch:
            grown = slots[position : position + request.seq - request.prefix]
            position += len(grown)
            if number is None:
                self._add_request(grown)
            else:
                self.rows[number].extend(grown)

    # -- freeing ---------------------------------------------------------------------------

    def _segments(self, data: st.DataObject, ids: list[int], start: int) -> list[Segment]:
        """``ids`` (row positions from ``start``, page-aligned) cut at page boundaries."""
        ps = self._spec.page_size
        bounds = list(range(start + ps, start + len(ids), ps))
        cuts = sorted(
            data.draw(st.lists(st.sampled_from(bounds), unique=True, max_size=2), label="cuts")
            if bounds
            else []
        )
        edges = [start, *cuts, start + len(ids)]
        return [(ids[a - start : b - start], a) for a, b in itertools.pairwise(edges)]

    def _row_frees(self, data: st.DataObject, number: int, grouped: bool) -> list[FreeCall]:
        """The calls that free request ``number``'s row, in one of the ways callers do."""
        row, dead = self.rows[number], self.dead[number]
        kind = self._spec.kind
        if dead and (
            kind == "pure_swa"
            or self.steer.avoids("allocator:free_dead_window", where=kind)
            or data.draw(st.booleans(), label="free_full the dead window")
        ):
            # free_kv_row_segments: the window-freed part full-side only, the rest whole.
            how = data.draw(st.sampled_from(("segments", "segment", "whole")), label="how")
            if how == "segments":
                return [
                    ("free_full_segments", self._segments(data, row[:dead], 0)),
                    ("free_segments", self._segments(data, row[dead:], dead)),
                ]
            if how == "segment":
                return [
                    ("free_full_segment", [(row[:dead], 0)]),
                    ("free_segment", [(row[dead:], dead)]),
                ]
            return [("free_full", [(row[:dead], 0)]), ("free", [(row[dead:], dead)])]
        if grouped and len(row) > 1 and data.draw(st.booleans(), label="split row"):
            # Two frees of one group name the row's shared page: it must come back once.
            cut = data.draw(st.integers(1, len(row) - 1), label="split at")
            return [("free", [(row[:cut], 0)]), ("free", [(row[cut:], cut)])]
        how = data.draw(st.sampled_from(("free", "free_segment", "free_segments")), label="how")
        if how == "free_segment":
            return [("free_segment", [(row, 0)])]
        if how == "free_segments":
            return [("free_segments", self._segments(data, row, 0))]
        return [("free", [(row, 0)])]

    def _call_free(self, method: str, segments: list[Segment]) -> None:
        """One free call on the allocator and the reference."""
        ref = self._ref
        ids = [slot for part, _ in segments for slot in part]
        if method.endswith("_segments"):
            getattr(self.allocator, method)(
                [(torch.tensor(part, dtype=torch.int64), at) for part, at in segments]
            )
        elif ids:
            index = torch.tensor(ids, dtype=torch.int64)
            if method.endswith("_segment"):
                getattr(self.allocator, method)(index, start_pos=segments[0][1])
            else:
                getattr(self.allocator, method)(index)
        if method.startswith("free_full"):
            ref.free_full(ids)
        elif ids:
            ref.free(ids)

    def _free(self, data: st.DataObject) -> None:
        if not self.rows or data.draw(st.integers(0, 4), label="empty free") == 0:
            self._empty(data)
            return
        chosen = data.draw(
            st.lists(st.sampled_from(sorted(self.rows)), unique=True, min_size=1, max_size=3),
            label="finished requests",
        )
        grouped = data.draw(st.booleans(), label="free group")
        calls = [call for number in chosen for call in self._row_frees(data, number, grouped)]
        self.last_call = ("group: " if grouped else "") + ", ".join(
            f"{m}({segments})" for m, segments in calls
        )
        ref = self._ref
        if grouped:
            self.allocator.free_group_begin()
            ref.free_group_begin()
        for method, segments in calls:
            self._call_free(method, segments)
        if grouped:
            self.allocator.free_group_end()
            ref.free_group_end()
        self.freed = [slot for number in chosen for slot in self.rows[number]]
        for number in chosen:
            del self.rows[number]
            del self.dead[number]

    def _free_swa(self, data: st.DataObject) -> None:
        ps = self._spec.page_size
        candidates = [
            n for n, row in self.rows.items() if (len(row) - 1) // ps > self.dead[n] // ps
        ]
        if not candidates:
            return
        number = data.draw(st.sampled_from(candidates), label="request")
        row, dead = self.rows[number], self.dead[number]
        # Whole pages out of the window, never the page of the last token.
        upto = (
            data.draw(
                st.integers(dead // ps + 1, (len(row) - 1) // ps), label="window starts at page"
            )
            * ps
        )
        ids = row[dead:upto]
        index = torch.tensor(ids, dtype=torch.int64)
        grouped = data.draw(st.booleans(), label="free group")
        ref = self._ref
        if grouped:
            self.allocator.free_group_begin()
            ref.free_group_begin()
        if data.draw(st.booleans(), label="as a segment"):
            self.last_call = f"free_swa_segment({ids}, start_pos={dead})"
            self.allocator.free_swa_segment(index, start_pos=dead)
        else:
            self.last_call = f"free_swa({ids})"
            self.allocator.free_swa(index)
        ref.free_swa(ids)
        if grouped:
            self.allocator.free_group_end()
            ref.free_group_end()
            self.last_call = f"group: {self.last_call}"
        self.dead[number] = upto

    def _swa_tail(self, data: st.DataObject) -> None:
        """``alloc_extend_swa_tail`` of a new request (PD decode's preallocation): window
        peers for a tail that starts a page of its row."""
        spec = self._spec
        ps = spec.page_size
        small = st.integers(1, 3 * ps)
        seq = data.draw(st.one_of(small, st.integers(1, spec.size + ps)), label="tokens")
        # The tail starts a page of the row; no tail at all when the row ends a page (the
        # whole window was cut: the request cannot grow then).
        last_start = seq // ps if seq % ps == 0 else (seq - 1) // ps
        start = ps * data.draw(st.integers(0, last_start), label="tail starts at page")
        self._swa_tail_request(seq, start)

    def _swa_tail_request(self, seq: int, start: int) -> None:
        """``alloc_extend_swa_tail`` of a new request of ``seq`` tokens, its tail from
        token ``start`` on."""
        spec, ref = self._spec, self._ref
        tail = seq - start
        t = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        call = self.last_call = f"alloc_extend_swa_tail(seq_lens=[{seq}], swa_tail_len={tail})"
        before = allocator_sizes(self.allocator, spec)
        out = self.allocator.alloc_extend_swa_tail(t(0), t(0), t(seq), t(seq), t(-1), seq, tail)
        request = Request(0, seq, -1)
        assert_refusal(
            out is None,
            ref.refuses_tail(request, tail),
            before=before,
            allocator=self.allocator,
            call=call,
            spec=spec,
        )
        if out is None:
            return
        slots = [int(x) for x in out.tolist()]
        self._expect_slots("alloc_extend_swa_tail", answer_plan([request], spec.page_size))
        peers = self._peers(out[start:]) if len(slots) == seq else []
        if peers:
            self._expect_peers(answer_plan([Request(0, tail, -1)], spec.page_size))
        assert_answer(ref.swa_tail(call, request, tail, slots, peers), call=call, spec=spec)
        number = self._add_request(slots)
        self.dead[number] = start

    def _check_hooks(self) -> None:
        """What the scheduler asks around allocations, at the boundaries: whether a decode
        of ``num_tokens`` fits (the free slots, one more), PD decode's admission questions
        (each side within its own budget, no ceiling of a static pool's own, no per-request
        workspace) and the transfer ids of every request's slots."""
        spec, ref, allocator = self._spec, self._ref, self.allocator
        free = ref.available_size()
        for tokens in (free, free + 1):
            call = f"check_decode_capacity(num_tokens={tokens}, tree_cache=None)"
            got = allocator.check_decode_capacity(num_tokens=tokens, tree_cache=None)
            expect(allocator, "check_decode_capacity", truth=tokens <= free)
            assert_hook_answer(bool(got), tokens <= free, call=call, spec=spec)
        full, window = spec.size, spec.page_size
        for budget, window_budget in ((full, None), (full - 1, None), (full, window - 1)):
            call = (
                f"prealloc_fits(None, {full}, {window}, full_budget_tokens={budget}, "
                f"swa_budget_tokens={window_budget})"
            )
            got = allocator.prealloc_fits(
                None, full, window, full_budget_tokens=budget, swa_budget_tokens=window_budget
            )
            fits = full <= budget and (window_budget is None or window <= window_budget)
            expect(allocator, "prealloc_fits", truth=fits)
            assert_hook_answer(bool(got), fits, call=call, spec=spec)
        call = f"prealloc_ceiling_fits({full}, {window})"
        ceiling = allocator.prealloc_ceiling_fits(full, window)
        expect(allocator, "prealloc_ceiling_fits", equals=None)
        assert_hook_answer(ceiling, None, call=call, spec=spec)
        # PD decode's per-request slot reserve came with sglang 0.5.22: an allocator of an
        # older release has no such hook to check (every other hook here is older).
        if hasattr(allocator, "request_slot_reserve"):
            call = f"request_slot_reserve(has_req_pool_slot=True, prefill_tokens={free})"
            got_reserve = allocator.request_slot_reserve(
                has_req_pool_slot=True, prefill_tokens=free
            )
            expect(allocator, "request_slot_reserve", equals=0)
            assert_hook_answer(got_reserve, 0, call=call, spec=spec)
        for row in self.rows.values():
            if not row:
                continue
            index = torch.tensor(row, dtype=torch.int64)
            call = f"translate_kv_indices_for_transfer({row})"
            got_ids = allocator.translate_kv_indices_for_transfer(index).tolist()
            expect(allocator, "translate_kv_indices_for_transfer", equals=row)
            assert_hook_answer(got_ids, row, call=call, spec=spec)
            if spec.kind in ("swa", "pure_swa"):
                call = f"translate_swa_indices_for_transfer({row})"
                got_ids = allocator.translate_swa_indices_for_transfer(index).tolist()
                want = ref.expected_mapping(row)
                expect(allocator, "translate_swa_indices_for_transfer", equals=want)
                assert_hook_answer(got_ids, want, call=call, spec=spec)

    def _paged_call(self, data: st.DataObject) -> None:
        """A page-size > 1 entry point of a page-size-1 allocator raises NotImplementedError
        (as SGLang's do) and changes nothing."""
        spec = self._spec
        methods = ["alloc_extend", "alloc_decode"]
        if spec.kind == "pure_swa":
            methods.append("alloc_extend_swa_tail")
        method = data.draw(st.sampled_from(methods), label="page-size > 1 call")
        call = self.last_call = f"{method}(...)"
        before = allocator_sizes(self.allocator, spec)
        one = torch.tensor([1], dtype=torch.int64)
        try:
            with expecting(self.allocator, raises="NotImplementedError"):
                getattr(self.allocator, method)(one, one, one, one, -one, 1)
        except NotImplementedError:
            pass
        else:
            raise failure(
                f"got an answer but should be NotImplementedError [{call}: page size 1]",
                signature=FailureSignature(
                    check="raises",
                    call=method,
                    kind="no exception instead of NotImplementedError",
                    family=allocator_family(spec),
                ),
            )
        assert_refusal(True, True, before=before, allocator=self.allocator, call=call, spec=spec)

    def _clear(self, data: st.DataObject) -> None:
        """``clear()`` (a cache flush): every slot free again, as when built."""
        self.last_call = "clear()"
        self.allocator.clear()
        self.reference = ReferenceAllocator(self._spec)
        self.rows.clear()
        self.dead.clear()
        self.freed = []

    def _empty(self, data: st.DataObject) -> None:
        """A free that names no slot (a finished request that held none) changes nothing."""
        methods = ["free", "free_full", "free_segment", "free_full_segment", "free_segments"]
        if self._spec.kind in ("swa", "pure_swa"):
            methods += ["free_swa", "free_swa_segment"]
        method = data.draw(st.sampled_from(methods), label="empty free")
        empty = torch.empty((0,), dtype=torch.int64)
        self.last_call = f"{method}([])"
        if method == "free_segments":
            self.allocator.free_segments([(empty, 0)])
        elif method.endswith("_segment"):
            getattr(self.allocator, method)(empty, start_pos=0)
        else:
            getattr(self.allocator, method)(empty)

    def _drain(self, data: st.DataObject) -> None:
        # One drain in four is a clear() (a cache flush) instead; shrinks towards clear().
        # The calls themselves are listed as Python on a failure (_noted).
        if data.draw(st.integers(0, 3), label="0: clear(), else a drain") == 0:
            self._clear(data)
            return
        spec, ref = self._spec, self._ref
        need = ref.available_size()
        before = set(self.rows)
        if spec.page_size == 1 or spec.kind == "paged":
            self._alloc_tokens(need)
        else:
            if need:
                self._grow("alloc_extend", [(None, Request(0, need, -1))], torch.int64)
            self._decode_at_capacity()
        for number in sorted(set(self.rows) - before):
            row, dead = self.rows[number], self.dead[number]
            self.last_call = f"free({row}) after draining"
            if dead:  # a tail-0 request: no window peer left
                self._call_free("free_full", [(row, 0)])
            else:
                self._call_free("free", [(row, 0)])
            del self.rows[number]
            del self.dead[number]

    def _decode_at_capacity(self) -> None:
        """With the window side drained, take the rest of the full side (a request without
        a window tail) and decode a request whose next token starts a page: both sides
        refuse it, and the refusal changes nothing."""
        ref, ps = self._ref, self._spec.page_size
        assert ref.swa is not None
        if ref.swa.free or not ref.full.free:
            return
        rest = len(ref.full.free) * ps
        self._swa_tail_request(rest, rest)
        at_boundary = [n for n in self._growable() if len(self.rows[n]) % ps == 0]
        if at_boundary:
            row = self.rows[at_boundary[0]]
            request = Request(len(row), len(row) + 1, row[-1])
            self._grow("alloc_decode", [(at_boundary[0], request)], torch.int64)

    # -- bad input -------------------------------------------------------------------------

    def _window_freed_rows(self) -> list[int]:
        """Requests whose window-freed slots are all still free: freeing their row frees
        those twice. Once another request got one of them back, the row's ids name a live
        slot, and no allocator can tell the stale id from the new owner's."""
        return [
            number
            for number, dead in self.dead.items()
            if dead and all(self._ref.free_problem([s]) for s in self.rows[number][:dead])
        ]

    def _bad(self, data: st.DataObject) -> None:
        spec, ref = self._spec, self._ref
        choices = ["out of range", "padding slot", "negative alloc"]
        if self.freed and all(ref.free_problem([s]) for s in self.freed):
            choices.append("double free")
        if self.rows and any(len(r) > 0 for r in self.rows.values()):
            choices.append("repeated slot")
        if spec.page_size > 1 and spec.kind == "paged":
            choices.append("unaligned alloc")
        if spec.page_size > 1 and self._growable():
            choices.append("wrong last_loc")
        if spec.page_size > 1 and any(len(r) > 1 for r in self.rows.values()):
            choices.append("unaligned segment")
        if spec.kind == "swa" and any(len(r) > self.dead[n] for n, r in self.rows.items()):
            choices.append("free_full of live peers")
        if spec.kind == "pure_swa" and self._window_freed_rows():
            # One pool: free_swa gave those slots back, so free of the row frees them twice.
            choices.append("free after a window free")
        why = data.draw(st.sampled_from(choices), label="bad input")
        allocator = self.allocator
        if why == "free after a window free":
            number = data.draw(st.sampled_from(self._window_freed_rows()), label="request")
            ids = self.rows[number]
            call = self.last_call = f"free({ids}) after free_swa({ids[: self.dead[number]]})"
            assert_bad_call_refused(
                lambda: allocator.free(torch.tensor(ids, dtype=torch.int64)),
                allocator=allocator,
                call=call,
                spec=spec,
                why=why,
            )
            return
        if why in ("unaligned segment", "free_full of live peers"):
            self._bad_segment_or_full(data, why)
            return
        if why in ("out of range", "padding slot", "double free", "repeated slot"):
            if why == "out of range":
                ids = [
                    spec.size + spec.page_size + data.draw(st.integers(0, 3), label="past the end")
                ]
            elif why == "padding slot":
                ids = [0]
            elif why == "double free":
                ids = [data.draw(st.sampled_from(self.freed), label="freed slot")]
            else:
                row = self.rows[
                    data.draw(
                        st.sampled_from([n for n, r in self.rows.items() if r]), label="request"
                    )
                ]
                ids = [row[-1], row[-1]]
            call = self.last_call = f"free({ids})"
            assert_bad_call_refused(
                lambda: allocator.free(torch.tensor(ids, dtype=torch.int64)),
                allocator=allocator,
                call=call,
                spec=spec,
                why=why,
            )
            return
        if why in ("negative alloc", "unaligned alloc"):
            need = (
                -spec.page_size
                if why == "negative alloc"
                else data.draw(st.integers(1, spec.page_size - 1), label="tokens")
            )
            call = self.last_call = f"alloc({need})"
            if spec.kind == "swa" and spec.page_size > 1:
                return  # no alloc on a paged sliding-window allocator
            assert_bad_call_refused(
                lambda: allocator.alloc(need), allocator=allocator, call=call, spec=spec, why=why
            )
            return
        number = data.draw(st.sampled_from(self._growable()), label="request")
        row = self.rows[number]
        # The request's second-to-last slot (never its last: at the wrong offset) or slot 0.
        wrong = row[-2] if len(row) > 1 else 0
        t = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        call = self.last_call = (
            f"alloc_extend(prefix_lens=[{len(row)}], seq_lens=[{len(row) + 1}], last_loc=[{wrong}])"
        )
        assert_bad_call_refused(
            lambda: allocator.alloc_extend(
                t(len(row)), t(len(row)), t(len(row) + 1), t(len(row) + 1), t(wrong), 1
            ),
            allocator=allocator,
            call=call,
            spec=spec,
            why=why,
        )

    def _bad_segment_or_full(self, data: st.DataObject, why: str) -> None:
        spec, allocator = self._spec, self.allocator
        if why == "unaligned segment":
            number = data.draw(
                st.sampled_from([n for n, r in self.rows.items() if len(r) > 1]), label="request"
            )
            ids, method, at = self.rows[number][1:], "free_segment", 1
        else:
            number = data.draw(
                st.sampled_from([n for n, r in self.rows.items() if len(r) > self.dead[n]]),
                label="request",
            )
            at = self.dead[number]
            ids, method = self.rows[number][at:], "free_full_segment"
        index = torch.tensor(ids, dtype=torch.int64)
        call = self.last_call = f"{method}({ids}, start_pos={at})"
        assert_bad_call_refused(
            lambda: getattr(allocator, method)(index, start_pos=at),
            allocator=allocator,
            call=call,
            spec=spec,
            why=why,
        )

    # -- the invariant ---------------------------------------------------------------------

    @invariant()
    def sizes_match_reference(self) -> None:
        """``available_size()`` (SWA: both sides and the mapping), the free-page census, the
        reported capacities and the scheduler hooks' answers equal the truth."""
        if self.allocator is not None:
            try:
                with checking(self.allocator):
                    assert_allocator_state(self.allocator, self._ref, call=self.last_call)
                    assert_reported_capacity(self.allocator, self._spec, call=self.last_call)
                    self._check_hooks()
            except Exception as error:
                self._noted(error)
                raise


def allocator_machine(
    target: Any,
    *,
    device: str,
    kind: str,
    specs: st.SearchStrategy[AllocatorSpec] | None = None,
    settings: Settings | None = None,
) -> type[AllocatorMachine]:
    """A state machine class that checks ``target``'s allocator of ``kind``.

    ``specs`` draws each example's allocator (default: :func:`allocator_specs` of ``kind``, at
    the page sizes the target builds it at).
    Bad calls run only when the target supports ``input_validation``. ``ValueError`` when the
    target's surface declares no allocator of ``kind``.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> allocator_machine(resolve_target("kvcheck"), device="cpu", kind="swa").__name__
        'SWAAllocatorMachine'
    """
    if kind not in ALLOCATOR_KINDS:
        raise ValueError(f"kind={kind!r} not in {ALLOCATOR_KINDS}")
    reason = allocator_skip_reason(target, kind)
    if reason is not None:
        raise ValueError(reason)
    chosen = allocator_specs(kinds=(kind,), target=target) if specs is None else specs

    @initialize(spec=chosen)
    def build(self: AllocatorMachine, spec: AllocatorSpec) -> None:
        """Build the target's allocator and the reference from one spec."""
        self._build(spec)

    words = {"swa": "SWA", "pure_swa": "PureSWA"}
    name = f"{words.get(kind, kind.capitalize())}AllocatorMachine"
    machine: type[AllocatorMachine] = type(
        name,
        (AllocatorMachine,),
        {
            "build": build,
            "target": target,
            "device": device,
            "kind": kind,
            "validates": supports(target, "input_validation"),
            "steer": steered_tags(target),
            "__module__": __name__,
            "__qualname__": name,
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine
