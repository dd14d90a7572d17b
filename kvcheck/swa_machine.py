"""A differential state machine for a target's sliding-window hybrid pool.

Each example draws one hybrid (:func:`kvcheck.strategies.swa_pool_specs`), builds it
through the target's ``make_swa_pool`` with the target's own SWA allocator over it (which
registers its full-to-SWA mapping with the pool, as SGLang's scheduler builds them), and a
:class:`~kvcheck.reference.swa.ReferenceSWAPool` beside it. The steps are the calls SGLang's
callers make across the two sub-pools:

- a request's prefill (``alloc`` / ``alloc_extend`` of fresh slots);
- a layer's write through the layer mapping (``set_kv_buffer`` with the full location and
  its translation, as the attention backend passes them), at the request's tokens still in
  the window for a window layer;
- a speculative move (``move_kv_cache``) inside one request's window;
- window eviction (the allocator's ``free_swa`` of a request's oldest pages);
- retraction: offload (``get_cpu_copy``, then ``free``) and reload (a fresh allocation,
  then ``load_cpu_copy``);
- a finished request's ``free`` (``free_full`` of its evicted part, as SGLang's
  ``free_kv_row_segments`` frees it) and a flush (the allocator's ``clear``).

After every step every layer's whole key (and MHA value) buffer equals the reference's
rows, so a write, move or reload that lands on the wrong side or the wrong slot is seen
wherever it lands.

Example::

    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.swa_machine import swa_pool_machine
    from kvcheck.targets import resolve_target

    Machine = swa_pool_machine(resolve_target("kvcheck"), device="cpu")
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcheck.pools.swa import SWALayer
from kvcheck.reference.swa import ReferenceSWACopy, ReferenceSWAPool
from kvcheck.specs import SWA_FAMILIES, SWAPoolSpec
from kvcheck.strategies.pools import swa_pool_specs
from kvcheck.targets import capability_skip_reason
from kvcheck.targets.tier_support import allocator_page_sizes, build_allocator
from kvcheck.tiers import AllocatorSpec

__all__ = ["STEP_KINDS", "SWAPoolMachine", "swa_families", "swa_pool_machine", "swa_skip_reason"]

#: The steps the machine draws, in shrink order; a request's prefill and its writes come
#: first, since every other step needs them (a flush last: it undoes the most). Writes come
#: up three times as often as the rest: a move, eviction or reload shows only on rows that
#: were written.
STEP_KINDS: tuple[str, ...] = (
    "prefill",
    "write",
    "evict_window",
    "offload",
    "reload",
    "write",
    "speculative_move",
    "prefill",
    "write",
    "finish",
    "flush",
)


def swa_skip_reason(target: Any, family: str | None = None) -> str | None:
    """Why ``target``'s hybrid pools (of ``family``'s sub-pools, when given) cannot be
    checked: no ``make_swa_pool``, or a declared ``swa_pool`` refusal; None when they can.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> swa_skip_reason(resolve_target("kvcheck"), "dsa") is None
        True
    """
    if not callable(getattr(target, "make_swa_pool", None)):
        return f"target {getattr(target, 'name', target)!r} has no make_swa_pool"
    return capability_skip_reason(target, ["swa_pool"], family=family)


def swa_families(target: Any) -> tuple[str, ...]:
    """The sub-pool families whose hybrids ``target`` builds and the machine drives (not
    those a ``swa_machine`` refusal keeps out of it).

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> swa_families(resolve_target("kvcheck"))
        ('mha', 'mla', 'dsa')
    """
    return tuple(
        family
        for family in SWA_FAMILIES
        if swa_skip_reason(target, family) is None
        and capability_skip_reason(target, ["swa_machine"], family=family) is None
    )


class SWAPoolMachine(RuleBasedStateMachine):
    """Drives a target's hybrid pool and the reference with the same calls (see the module)."""

    target: Any = None
    device: str = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self.spec: SWAPoolSpec | None = None
        self.pool: Any = None
        self.allocator: Any = None
        self.reference: ReferenceSWAPool | None = None
        #: request id -> its full-side slots, in token order
        self.rows: dict[int, list[int]] = {}
        #: request id -> how many of its first tokens left the window
        self.evicted: dict[int, int] = {}
        #: offloaded request -> (the pool's copy, the reference's copy, its token count)
        self.offloaded: dict[int, tuple[Any, ReferenceSWACopy, int]] = {}
        self.next_request = 0
        self.payloads = 0
        self.last_call = "construction"

    # -- construction ----------------------------------------------------------------------

    def _build(self, spec: SWAPoolSpec) -> None:
        self.spec = spec
        self.pool = self.target.make_swa_pool(spec, device=self.device)
        allocator_spec = AllocatorSpec(
            kind="swa", size=spec.sub.size, size_swa=spec.size_swa, page_size=spec.sub.page_size
        )
        self.allocator = build_allocator(
            self.target, allocator_spec, device=self.device, kvcache=self.pool
        )
        self.reference = ReferenceSWAPool(spec)

    @property
    def _spec(self) -> SWAPoolSpec:
        assert self.spec is not None
        return self.spec

    @property
    def _ref(self) -> ReferenceSWAPool:
        assert self.reference is not None
        return self.reference

    def _mapping(self) -> list[int]:
        return [int(peer) for peer in self.allocator.full_to_swa_index_mapping.tolist()]

    def _slots(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _alloc(self, count: int) -> list[int] | None:
        """A fresh request's ``count`` slots (page size 1: ``alloc``; else ``alloc_extend``
        from an empty prefix, as a prefill does), or None when the allocator refuses."""
        if self._spec.sub.page_size == 1:
            got = self.allocator.alloc(count)
        else:
            zero = torch.tensor([0], dtype=torch.int64)
            seq = torch.tensor([count], dtype=torch.int64)
            last = torch.tensor([-1], dtype=torch.int64)
            got = self.allocator.alloc_extend(zero, zero, seq, seq, last, count)
        return None if got is None else [int(slot) for slot in got.tolist()]

    def _release(self, slots: list[int], evicted: int) -> None:
        """Free a request's slots as SGLang's ``free_kv_row_segments`` does: the part that
        left the window full side only (``free_full``), the rest on both sides (``free``)."""
        if evicted:
            self.allocator.free_full(self._slots(slots[:evicted]))
        if slots[evicted:]:
            self.allocator.free(self._slots(slots[evicted:]))

    def _in_window(self, request: int) -> list[int]:
        return self.rows[request][self.evicted[request] :]

    def _payload(self, data: st.DataObject, count: int, shape: tuple[int, ...]) -> torch.Tensor:
        seed = data.draw(st.integers(0, 2**16), label="payload seed")
        # Every payload differs from every other, whatever the drawn seed shrinks to: a move
        # or reload onto a row that already holds the same values would show nothing.
        self.payloads += 1
        generator = torch.Generator().manual_seed(self.payloads * (2**17) + seed)
        values = torch.randn((count, *shape), generator=generator)
        return values.to(torch.bfloat16)

    # -- the one rule ----------------------------------------------------------------------

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One call of a drawn kind on the pool (or its allocator) and the reference."""
        if self.pool is None:
            return
        kind = data.draw(st.sampled_from(STEP_KINDS), label="kind")
        getattr(self, f"_{kind}")(data)

    # -- steps -----------------------------------------------------------------------------

    def _prefill(self, data: st.DataObject) -> None:
        """A new request's slots on both sides."""
        # Up to everything free: a request that takes the window side's last slots makes the
        # next one's peers wrap around to slots that eviction gave back, so full slots and
        # their peers stop being equal (where a write at the wrong index shows).
        free = int(self.allocator.available_size())
        if free < 1:
            return
        fill = data.draw(st.booleans(), label="take everything free")
        count = free if fill else data.draw(st.integers(1, free), label="tokens")
        self.last_call = f"alloc of {count} tokens"
        slots = self._alloc(count)
        if slots is None:
            return
        self.rows[self.next_request] = slots
        self.evicted[self.next_request] = 0
        self.next_request += 1

    def _write(self, data: st.DataObject) -> None:
        """One layer's ``set_kv_buffer`` at some of a request's tokens (a window layer:
        only tokens still in the window), with the full location and its translation."""
        if not self.rows:
            return
        request = data.draw(st.sampled_from(sorted(self.rows)), label="request")
        layer_id = data.draw(st.integers(0, self._spec.sub.layer_num - 1), label="layer")
        tokens = self._in_window(request) if self._ref.is_swa(layer_id) else self.rows[request]
        if not tokens:
            return
        every = data.draw(st.booleans(), label="every token")
        chosen = (
            list(tokens)
            if every
            else data.draw(
                st.lists(st.sampled_from(tokens), min_size=1, unique=True), label="tokens"
            )
        )
        sub = self._spec.sub
        loc = self._slots(chosen)
        swa_loc = self.pool.translate_loc_from_full_to_swa(loc)
        layer = SWALayer(layer_id)
        where = self.target.swa_write_loc(loc, swa_loc)
        self.last_call = (
            f"set_kv_buffer(layer {layer_id}, loc={chosen}, swa_loc={swa_loc.tolist()})"
        )
        if sub.family == "mha":
            v_dim = sub.head_dim if sub.v_head_dim is None else sub.v_head_dim
            k = self._payload(data, len(chosen), (sub.head_num, sub.head_dim))
            v = self._payload(data, len(chosen), (sub.head_num, v_dim))
            self.pool.set_kv_buffer(layer, where, k, v)
            values = {"k": k.float().tolist(), "v": v.float().tolist()}
        else:
            width = sub.kv_lora_rank + sub.qk_rope_head_dim
            k = self._payload(data, len(chosen), (1, width))
            self.pool.set_kv_buffer(layer, where, k, None)
            values = {"k": k.float().tolist()}
        self._ref.write(layer_id, chosen, self._mapping(), values)

    def _speculative_move(self, data: st.DataObject) -> None:
        """``move_kv_cache`` of some of a request's window tokens onto others (accepted draft
        tokens moved into place)."""
        candidates = [r for r in sorted(self.rows) if len(self._in_window(r)) >= 2]
        if not candidates:
            return
        request = data.draw(st.sampled_from(candidates), label="request")
        tokens = data.draw(st.permutations(self._in_window(request)), label="order")
        count = data.draw(st.integers(1, len(tokens) // 2), label="moved")
        tgt, src = tokens[:count], tokens[count : 2 * count]
        self.last_call = f"move_kv_cache(tgt={tgt}, src={src})"
        mapping = self._mapping()
        self.pool.move_kv_cache(self._slots(tgt), self._slots(src))
        self._ref.move(tgt, src, mapping)

    def _evict_window(self, data: st.DataObject) -> None:
        """The allocator's ``free_swa`` of a request's oldest pages still in the window."""
        page = self._spec.sub.page_size
        candidates = [r for r in sorted(self.rows) if len(self._in_window(r)) > page]
        if not candidates:
            return
        request = data.draw(st.sampled_from(candidates), label="request")
        start = self.evicted[request]
        pages = data.draw(st.integers(1, (len(self.rows[request]) - start - 1) // page))
        end = start + pages * page
        slots = self.rows[request][start:end]
        self.last_call = f"free_swa({slots})"
        self.allocator.free_swa(self._slots(slots))
        self.evicted[request] = end

    def _offload(self, data: st.DataObject) -> None:
        """Retraction: ``get_cpu_copy`` of a request's slots, then their ``free``."""
        if not self.rows:
            return
        # Requests with evicted tokens first: their copies are the ones with a window mask.
        order = sorted(self.rows, key=lambda r: (-self.evicted[r], r))
        request = data.draw(st.sampled_from(order), label="request")
        slots = self.rows.pop(request)
        evicted = self.evicted.pop(request)
        self.last_call = f"get_cpu_copy({slots})"
        copy = self.pool.get_cpu_copy(self._slots(slots))
        saved = self._ref.get_cpu_copy(slots, self._mapping())
        self._release(slots, evicted)
        self.offloaded[request] = (copy, saved, len(slots))

    def _reload(self, data: st.DataObject) -> None:
        """A retracted request comes back: fresh slots, then ``load_cpu_copy``."""
        if not self.offloaded:
            return
        request = data.draw(st.sampled_from(sorted(self.offloaded)), label="request")
        copy, saved, count = self.offloaded[request]
        slots = self._alloc(count)
        if slots is None:
            return
        del self.offloaded[request]
        self.last_call = f"load_cpu_copy(copy of request {request}, {slots})"
        self.pool.load_cpu_copy(copy, self._slots(slots))
        self._ref.load_cpu_copy(saved, slots, self._mapping())
        self.rows[request] = slots
        self.evicted[request] = 0

    def _finish(self, data: st.DataObject) -> None:
        """A finished request's ``free`` (both sides)."""
        if not self.rows:
            return
        request = data.draw(st.sampled_from(sorted(self.rows)), label="request")
        slots = self.rows.pop(request)
        evicted = self.evicted.pop(request)
        self.last_call = f"free({slots})"
        self._release(slots, evicted)

    def _flush(self, data: st.DataObject) -> None:
        """The allocator's ``clear`` (a cache flush): every request's slots are gone."""
        self.last_call = "clear()"
        self.allocator.clear()
        self.rows.clear()
        self.evicted.clear()

    # -- the check -------------------------------------------------------------------------

    @invariant()
    def buffers_match_reference(self) -> None:
        """Every layer's key (and MHA value) buffer equals the reference, row for row."""
        if self.reference is None:
            return
        for layer_id, rows in self._ref.rows.items():
            names = ("k", "v") if "v" in rows[0] else ("k",)
            for name in names:
                read = self.pool.get_key_buffer if name == "k" else self.pool.get_value_buffer
                held = read(layer_id)[: len(rows)].float().tolist()
                expected = [row[name] for row in rows]
                if held != expected:
                    wrong = [
                        i for i, (h, e) in enumerate(zip(held, expected, strict=False)) if h != e
                    ]
                    side = "window" if self._ref.is_swa(layer_id) else "full"
                    raise AssertionError(
                        f"after {self.last_call}: layer {layer_id} ({side} side) buffer "
                        f"{name!r} differs from the reference at rows {wrong}"
                    )


def swa_pool_machine(
    target: Any,
    *,
    device: str,
    specs: st.SearchStrategy[SWAPoolSpec] | None = None,
    settings: Settings | None = None,
) -> type[SWAPoolMachine]:
    """A state machine class that checks ``target``'s sliding-window hybrid pools.

    ``specs`` draws each example's hybrid (default: :func:`swa_pool_specs` of the families
    :func:`swa_families` gives, on pages of 1 or 2 slots where the target builds its SWA
    allocator at that page size). ``ValueError`` when the target builds no hybrid.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> swa_pool_machine(resolve_target("kvcheck"), device="cpu").__name__
        'SWAPoolMachine'
    """
    families = swa_families(target)
    if not families:
        raise ValueError(swa_skip_reason(target) or "the target builds no hybrid family")
    if specs is None:
        # The hybrid's pages are its SWA allocator's: those the target builds it at.
        declared = allocator_page_sizes(target, "swa")
        page_sizes = tuple(p for p in (1, 2) if declared is None or p in declared)
        if not page_sizes:
            raise ValueError(
                f"target {getattr(target, 'name', target)!r} builds its SWA allocator at "
                f"page_size in {declared} only, none of (1, 2)"
            )
        specs = swa_pool_specs(families=families, page_sizes=page_sizes)
    chosen = specs

    @initialize(spec=chosen)
    def build(self: SWAPoolMachine, spec: SWAPoolSpec) -> None:
        """Build the target's hybrid, its allocator and the reference from one spec."""
        self._build(spec)

    machine: type[SWAPoolMachine] = type(
        "SWAPoolMachine",
        (SWAPoolMachine,),
        {
            "build": build,
            "target": target,
            "device": device,
            "__module__": __name__,
            "__qualname__": "SWAPoolMachine",
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine
