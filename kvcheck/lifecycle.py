"""The server's path for a request's KV memory, in miniature: a differential state machine
over a target's allocator, device pool and host tier together.

Each example draws a device pool of one family with a host tier
(:func:`kvcheck.strategies.host_pool_specs`, every variant and host layout the target
declares), builds the target's pool, its allocator (``token`` for page size 1, ``paged``
above, handing out the pool's slots) and its host pools, with a reference beside each
(:class:`~kvcheck.reference.ReferencePool`,
:class:`~kvcheck.reference.allocators.ReferenceAllocator`,
:class:`~kvcheck.reference.host_pools.ReferenceHostPool`). Slot ids always come from the
allocator, as in the server. Steps:

``admit``
    new requests: ``alloc_extend`` of a prefill batch (``alloc`` at page size 1), then
    writes of their tokens;
``decode``
    one token per running request (``alloc_decode`` / ``alloc``), written;
``speculate``
    a request grows by draft tokens (``alloc_extend`` / ``alloc``), they are written, and the
    accepted ones are moved to the front of the draft (``move_kv_cache``: the accepted
    speculative tokens);
``write``
    more writes to a running request's slots;
``backup``
    the request's whole pages are backed up to the host (host ``alloc``, then
    ``backup_from_device_all_layer`` on every host pool), as the cache controller writes back
    a radix node;
``finish``
    requests are freed (alone or in a free group); their slots go back to the allocator and
    are handed out again later, their bytes overwritten;
``load``
    a host copy comes back: ``alloc`` of fresh device slots, ``load_to_device_per_layer`` for
    every layer of every host pool; the request runs on from there, its bytes read back
    through the read API;
``evict``
    a host copy is freed (host ``free``).

After every step every device buffer equals the reference byte for byte, the allocator's
sizes and the host pool's free slots equal the truth; after a backup every host buffer holds
the bytes the layout places there; after a load the request's tokens read back through the
pool's read API.

Example::

    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.lifecycle import lifecycle_machine
    from kvcheck.targets import resolve_target

    Machine = lifecycle_machine(resolve_target("kvcheck"), device="cpu", family="dsa")
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.calls import describe_op
from kvcheck.failures import FailureSignature
from kvcheck.properties.allocators import (
    allocator_sizes,
    assert_allocator_state,
    assert_answer,
    assert_refusal,
)
from kvcheck.properties.apply import apply_op_like_reference
from kvcheck.properties.assertions import failure
from kvcheck.properties.host_pools import assert_host_bytes, assert_host_slots, host_family
from kvcheck.properties.pool_state import (
    assert_pool_matches_reference,
    assert_read_api_matches_reference,
)
from kvcheck.reference import ReferencePool
from kvcheck.reference.allocators import ReferenceAllocator, Request
from kvcheck.reference.host_pools import ReferenceHostPool
from kvcheck.specs import HostCopy, HostReload, Move, Op, PoolSpec
from kvcheck.steering import Steering
from kvcheck.strategies import ops as draws
from kvcheck.strategies.tier_specs import host_pool_specs
from kvcheck.targets import supports
from kvcheck.targets.findings import steered_tags
from kvcheck.targets.tier_support import (
    allocator_skip_reason,
    build_allocator,
    build_host_pool,
    host_pool_skip_reason,
)
from kvcheck.tiers import HOST_FAMILIES, AllocatorSpec, HostPoolSpec

__all__ = ["LIFECYCLE_STEPS", "LifecycleMachine", "lifecycle_machine", "lifecycle_specs"]

LIFECYCLE_STEPS: tuple[str, ...] = (
    "pause",
    "admit",
    "decode",
    "write",
    "backup",
    "finish",
    "load",
    "speculate",
    "evict",
)
#: Write kinds the machine puts at a request's slots (those the pool's variant takes).
_WRITE_KINDS = ("write_kv", "write_mla", "write_index_k", "cast_write_kv")


def lifecycle_specs(
    target: Any, family: str, *, kv_quants: tuple[str, ...] = ("none",)
) -> st.SearchStrategy[HostPoolSpec]:
    """Host tiers for ``family`` inside ``target``'s surface, their device pools at least a
    page large (the allocator hands out whole pages of the pool's slots), of the quantized
    variants ``kv_quants`` (default unquantized; a quantized pool's host tier keeps its
    scales too).

    Example:
        >>> from hypothesis import find
        >>> from kvcheck.targets import resolve_target
        >>> find(lifecycle_specs(resolve_target("kvcheck"), "mla"), lambda s: True).device.size
        1
    """

    def at_least_a_page(spec: HostPoolSpec) -> HostPoolSpec:
        device = spec.device
        pages = max(1, device.size // device.page_size)
        if pages * device.page_size == device.size:
            return spec
        return dataclasses.replace(
            spec, device=dataclasses.replace(device, size=pages * device.page_size)
        )

    return host_pool_specs(
        families=(family,),
        target=target,
        max_host_pages=4,
        kv_quants=kv_quants,
        steer=steered_tags(target),
    ).map(at_least_a_page)


def _allocator_spec(device: PoolSpec) -> AllocatorSpec:
    kind = "token" if device.page_size == 1 else "paged"
    return AllocatorSpec(kind=kind, size=device.size, page_size=device.page_size)


@dataclasses.dataclass
class _Request:
    row: list[int]  # device slots, token order


@dataclasses.dataclass
class _Cached:
    host_ids: list[int]
    name: str  # the reference's host copy of the same tokens
    tokens: int


class LifecycleMachine(RuleBasedStateMachine):
    """Drives a target's allocator, device pool and host tier with the reference (see the
    module)."""

    target: Any = None
    device: str = "cpu"
    family: str = "mha"
    kinds: tuple[str, ...] = ()
    steer: Steering = Steering()
    read_api: bool = True
    moves: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.spec: HostPoolSpec | None = None
        self.pool: Any = None
        self.allocator: Any = None
        self.parts: tuple[Any, ...] = ()
        self.ref_pool: ReferencePool | None = None
        self.ref_alloc: ReferenceAllocator | None = None
        self.ref_host: ReferenceHostPool | None = None
        self.requests: dict[int, _Request] = {}
        self.cached: dict[int, _Cached] = {}
        self.copies: dict[str, Any] = {}
        self.history: list[str] = []
        self.counter = 0
        self.last_call = "construction"
        self.loaded: list[int] = []
        self.backed_up = False
        self.steps = 0

    # -- building ---------------------------------------------------------------------------

    def _build(self, spec: HostPoolSpec) -> None:
        self.spec = spec
        device = spec.device
        self.pool = self.target.make_pool(device, device=self.device)
        self.ref_pool = ReferencePool(device)
        alloc_spec = _allocator_spec(device)
        self.allocator = build_allocator(
            self.target, alloc_spec, device=self.device, kvcache=self.pool
        )
        self.ref_alloc = ReferenceAllocator(alloc_spec)
        self.parts = build_host_pool(self.target, spec, self.pool, device=self.device)
        self.ref_host = ReferenceHostPool(spec)

    @property
    def _spec(self) -> HostPoolSpec:
        assert self.spec is not None
        return self.spec

    def _new_id(self) -> int:
        self.counter += 1
        return self.counter

    # -- the one rule -----------------------------------------------------------------------

    @precondition(lambda self: self.pool is not None)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One step of the request lifecycle, of a drawn kind."""
        kind = data.draw(st.sampled_from(self.kinds), label="step")
        self.steps += 1
        if kind != "pause":
            getattr(self, f"_{kind}")(data)

    # -- allocating and writing -------------------------------------------------------------

    def _grow(
        self, batch: list[tuple[int | None, int]], *, decode: bool = False
    ) -> list[list[int]] | None:
        """Grow each (request id or None for a new one, tokens) of ``batch`` through the
        allocator; the new slots per entry, or None when the allocator refused."""
        assert self.ref_alloc is not None
        alloc_spec = self.ref_alloc.spec
        requests = []
        for number, tokens in batch:
            row = self.requests[number].row if number is not None else []
            requests.append(Request(len(row), len(row) + tokens, row[-1] if row else -1))
        before = allocator_sizes(self.allocator, alloc_spec)
        total = sum(r.seq - r.prefix for r in requests)
        if alloc_spec.page_size == 1:
            call = f"alloc({total})"
            out = self.allocator.alloc(total)
        else:
            t = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
            prefix, seq = [r.prefix for r in requests], [r.seq for r in requests]
            last = t([r.last_loc for r in requests])
            if decode:
                call = f"alloc_decode(seq_lens={seq}, last_loc={last.tolist()})"
                out = self.allocator.alloc_decode(t(seq), t(seq), last)
            else:
                call = (
                    f"alloc_extend(prefix_lens={prefix}, seq_lens={seq}, last_loc={last.tolist()})"
                )
                out = self.allocator.alloc_extend(t(prefix), t(prefix), t(seq), t(seq), last, total)
        self._log(call)
        pages = self.ref_alloc.new_pages(requests)
        assert_refusal(
            out is None,
            self.ref_alloc.refuses_pages(pages),
            before=before,
            allocator=self.allocator,
            call=call,
            spec=alloc_spec,
        )
        if out is None:
            return None
        slots = [int(x) for x in out.tolist()]
        if alloc_spec.page_size == 1:
            problems = self.ref_alloc.alloc(total, slots)
        else:
            problems = self.ref_alloc.grow(call, requests, slots)
        assert_answer(problems, call=call, spec=alloc_spec)
        grown, position = [], 0
        for number, tokens in batch:
            new = slots[position : position + tokens]
            position += tokens
            if number is None:
                number = self._new_id()
                self.requests[number] = _Request([])
            self.requests[number].row.extend(new)
            grown.append(new)
        return grown

    def _write(self, data: st.DataObject, slots: list[int] | None = None) -> None:
        if slots is None:
            if not self.requests:
                return
            number = data.draw(st.sampled_from(sorted(self.requests)), label="request")
            slots = self.requests[number].row
        if not slots:
            return
        slots = data.draw(
            st.lists(st.sampled_from(slots), unique=True, min_size=1, max_size=4), label="slots"
        )
        kinds = self._write_kinds()
        if not kinds:
            return
        kind = data.draw(st.sampled_from(kinds), label="write kind")
        op = data.draw(self._write_strategy(kind), label="write")
        self._apply(_at_slots(op, slots, self._spec.device, kind))

    def _write_kinds(self) -> list[str]:
        applies = set(draws.family_op_kinds(self._spec.device))
        return [kind for kind in _WRITE_KINDS if kind in applies and kind in self.write_kinds]

    write_kinds: tuple[str, ...] = _WRITE_KINDS

    def _write_strategy(self, kind: str) -> st.SearchStrategy[Any]:
        spec = self._spec.device
        if kind == "write_index_k":
            return draws.write_index_k_ops(spec, layer_ids=draws.indexed_layers(spec, skip=False))
        if kind == "write_mla":
            return draws.write_mla_ops(spec, padding_slot=False)
        if kind == "cast_write_kv":
            return draws.cast_write_kv_ops(spec, scales=not self.steer.avoids("cast_write:scales"))
        return draws.write_kv_ops(spec)

    def _apply(self, op: Op) -> None:
        assert self.ref_pool is not None
        self._log(describe_op(op))
        apply_op_like_reference(
            self.target, self.pool, self.ref_pool, op, device=self.device, copies=self.copies
        )

    def _log(self, call: str) -> None:
        self.last_call = call
        self.history.append(call)

    # -- steps ------------------------------------------------------------------------------

    def _admit(self, data: st.DataObject) -> None:
        device = self._spec.device
        count = data.draw(st.integers(1, 2), label="new requests")
        lengths = [
            data.draw(st.integers(1, device.size), label="prompt tokens") for _ in range(count)
        ]
        grown = self._grow([(None, n) for n in lengths])
        for slots in grown or []:
            self._write(data, slots)

    def _decode(self, data: st.DataObject) -> None:
        running = sorted(n for n, r in self.requests.items() if r.row)
        if not running:
            return
        chosen = data.draw(
            st.lists(st.sampled_from(running), unique=True, min_size=1, max_size=2),
            label="requests",
        )
        grown = self._grow([(n, 1) for n in chosen], decode=True)
        for slots in grown or []:
            self._write(data, slots)

    def _speculate(self, data: st.DataObject) -> None:
        running = sorted(n for n, r in self.requests.items() if r.row)
        if not running:
            return
        number = data.draw(st.sampled_from(running), label="request")
        drafts = data.draw(st.integers(1, 4), label="draft tokens")
        grown = self._grow([(number, drafts)])
        if not grown:
            return
        draft = grown[0]
        for slot in draft:
            self._write(data, [slot])
        if not self.moves:
            return
        accepted = data.draw(
            st.lists(st.sampled_from(range(len(draft))), unique=True, max_size=len(draft)),
            label="accepted",
        )
        accepted.sort()
        self._apply(Move(tgt=tuple(draft[: len(accepted)]), src=tuple(draft[i] for i in accepted)))

    def _backup(self, data: st.DataObject) -> None:
        spec = self._spec
        ps = spec.page_size
        whole = sorted(n for n, r in self.requests.items() if len(r.row) >= ps)
        if not whole:
            return
        number = data.draw(st.sampled_from(whole), label="request")
        row = self.requests[number].row
        # A page-aligned prefix, as a radix node is; one that fits the host when one does.
        pages = data.draw(st.integers(1, len(row) // ps), label="pages")
        assert self.ref_host is not None and self.ref_pool is not None
        room = self.ref_host.available_size() // ps
        tokens = (min(pages, room) if room else pages) * ps
        host = self.parts[0].alloc(tokens)
        self._log(f"host alloc({tokens})")
        if host is None:
            if tokens <= self.ref_host.available_size():
                raise failure(
                    f"got None but should be {tokens} host slots [host alloc({tokens})]",
                    signature=FailureSignature("host_slots", "alloc", "refused", host_family(spec)),
                )
            return
        host_ids = [int(x) for x in host.tolist()]
        assert_answer_host(self.ref_host.alloc(tokens, host_ids), spec=spec)
        device_ids = torch.tensor(row[:tokens], dtype=torch.int64)
        call = (
            f"backup_from_device_all_layer(host_indices={host_ids}, device_indices={row[:tokens]})"
        )
        self._log(call)
        for part in self.parts:
            part.backup_from_device_all_layer(self.pool, host, device_ids, spec.io_backend)
        name = f"cached{self._new_id()}"
        self.ref_pool.apply(HostCopy(name=name, indices=tuple(row[:tokens])))
        self.ref_host.backup(self.ref_pool, host_ids, row[:tokens])
        self.cached[self._new_id()] = _Cached(host_ids, name, tokens)
        self.backed_up = True
        if data.draw(st.booleans(), label="the request finishes"):
            self._finish_requests([number], grouped=False)

    def _finish(self, data: st.DataObject) -> None:
        if not self.requests:
            return
        assert self.ref_alloc is not None
        chosen = data.draw(
            st.lists(st.sampled_from(sorted(self.requests)), unique=True, min_size=1, max_size=2),
            label="finished",
        )
        grouped = len(chosen) > 1 and data.draw(st.booleans(), label="free group")
        self._finish_requests(chosen, grouped=grouped)

    def _finish_requests(self, chosen: list[int], *, grouped: bool) -> None:
        assert self.ref_alloc is not None
        self._log(
            f"free({[self.requests[n].row for n in chosen]}){' in a group' if grouped else ''}"
        )
        if grouped:
            self.allocator.free_group_begin()
            self.ref_alloc.free_group_begin()
        for number in chosen:
            row = self.requests.pop(number).row
            if row:
                self.allocator.free(torch.tensor(row, dtype=torch.int64))
                self.ref_alloc.free(row)
        if grouped:
            self.allocator.free_group_end()
            self.ref_alloc.free_group_end()

    def _load(self, data: st.DataObject) -> None:
        if not self.cached:
            self._backup(data)
        if not self.cached:
            return
        assert self.ref_alloc is not None and self.ref_pool is not None
        spec = self._spec
        key = data.draw(st.sampled_from(sorted(self.cached)), label="host copy")
        entry = self.cached[key]
        before = allocator_sizes(self.allocator, self.ref_alloc.spec)
        out = self.allocator.alloc(entry.tokens)
        call = f"alloc({entry.tokens}) for a load-back"
        self._log(call)
        ps = spec.page_size
        assert_refusal(
            out is None,
            self.ref_alloc.refuses_pages(entry.tokens // ps),
            before=before,
            allocator=self.allocator,
            call=call,
            spec=self.ref_alloc.spec,
        )
        if out is None:
            return
        slots = [int(x) for x in out.tolist()]
        assert_answer(
            self.ref_alloc.alloc(entry.tokens, slots), call=call, spec=self.ref_alloc.spec
        )
        host = torch.tensor(entry.host_ids, dtype=torch.int64)
        self._log(
            f"load_to_device_per_layer(host_indices={entry.host_ids}, "
            f"device_indices={slots}, every layer)"
        )
        for layer in range(spec.device.layer_num):
            for part in self.parts:
                part.load_to_device_per_layer(self.pool, host, out, layer, spec.io_backend)
        self.ref_pool.apply(HostReload(name=entry.name, indices=tuple(slots)))
        number = self._new_id()
        self.requests[number] = _Request(slots)
        self.loaded = slots

    def _evict(self, data: st.DataObject) -> None:
        if not self.cached:
            return
        assert self.ref_host is not None
        key = data.draw(st.sampled_from(sorted(self.cached)), label="host copy")
        entry = self.cached.pop(key)
        self._log(f"host free({entry.host_ids})")
        self.parts[0].free(torch.tensor(entry.host_ids, dtype=torch.int64))
        self.ref_host.free(entry.host_ids)

    # -- the invariant ----------------------------------------------------------------------

    @invariant()
    def tiers_match_reference(self) -> None:
        """Device bytes, allocator sizes and host slots equal the reference; after a backup,
        the host bytes; after a load, what the read API gives."""
        if self.pool is None:
            return
        assert (
            self.ref_pool is not None and self.ref_alloc is not None and self.ref_host is not None
        )
        call = self.last_call
        try:
            assert_pool_matches_reference(
                self.pool, self.ref_pool, call=call, method=call.split("(")[0]
            )
            assert_allocator_state(self.allocator, self.ref_alloc, call=call)
            assert_host_slots(self.parts[0], self.ref_host, call=call, spec=self._spec)
            if self.backed_up:
                assert_host_bytes(self.parts, self.ref_host, call=call, spec=self._spec)
                self.backed_up = False
            if self.loaded and self.read_api:
                device = self._spec.device
                assert_read_api_matches_reference(
                    self.pool,
                    self.ref_pool,
                    call=call,
                    mla_reads=device.family in ("mla", "dsa") and device.latent_layout == "raw",
                    # The paged index-K gather (GetKAndS, a GPU kernel in SGLang) is the pool
                    # machines' check; the lifecycle reads a request's tokens back.
                    paged_index_reads=False,
                )
                self.loaded = []
        except AssertionError as exc:
            exc.add_note("lifecycle so far:\n  " + "\n  ".join(self.history[-12:]))
            raise


def assert_answer_host(problems: list[str], *, spec: HostPoolSpec) -> None:
    """Fail with the reference's objections to a host ``alloc`` answer."""
    __tracebackhide__ = True
    if problems:
        raise failure(
            "host alloc answer breaks the contract [alloc]\n" + "\n".join(problems[:6]),
            signature=FailureSignature(
                "host_slots", "alloc", "slot handed out twice", host_family(spec)
            ),
        )


def _at_slots(op: Op, slots: list[int], spec: PoolSpec, kind: str) -> Op:
    """``op`` moved to ``slots`` (its rows cut to as many): any write with ``locs``."""
    if kind == "write_index_k":
        targets = list(dict.fromkeys(slot // spec.index_kpool for slot in slots))
    else:
        targets = list(slots)
    count = min(len(op.locs), len(targets))  # type: ignore[union-attr]
    old = len(op.locs)  # type: ignore[union-attr]
    changes: dict[str, Any] = {"locs": tuple(targets[:count])}
    for field in dataclasses.fields(op):
        value = getattr(op, field.name)
        if field.name != "locs" and isinstance(value, tuple) and len(value) == old and old:
            changes[field.name] = value[:count]
    payload = getattr(op, "payload", None)
    if payload is not None:
        changes["payload"] = dataclasses.replace(
            payload,
            **{
                f.name: getattr(payload, f.name)[:count]
                for f in dataclasses.fields(payload)
                if isinstance(getattr(payload, f.name), tuple)
                and len(getattr(payload, f.name)) == old
            },
        )
    return dataclasses.replace(op, **changes)  # type: ignore[type-var]


def lifecycle_machine(
    target: Any,
    *,
    device: str,
    family: str,
    specs: st.SearchStrategy[HostPoolSpec] | None = None,
    settings: Settings | None = None,
) -> type[LifecycleMachine]:
    """A lifecycle machine class for ``target``'s ``family`` pools (see the module).

    ``ValueError`` when the target builds no host pool for ``family`` or no allocator the
    family's page sizes need. Steps whose capability the target lacks (``move``,
    ``read_api``) are left out.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> lifecycle_machine(resolve_target("kvcheck"), device="cpu", family="mla").__name__
        'MLALifecycleMachine'
    """
    if family not in HOST_FAMILIES:
        raise ValueError(f"family={family!r} not in {HOST_FAMILIES}")
    for reason in (
        host_pool_skip_reason(target, family),
        allocator_skip_reason(target, "token"),
        allocator_skip_reason(target, "paged"),
    ):
        if reason is not None:
            raise ValueError(reason)
    chosen = lifecycle_specs(target, family) if specs is None else specs
    moves = supports(target, "move", family=family)
    # The tiers' own steps twice: a request's path through them takes several steps.
    kinds = (*LIFECYCLE_STEPS, "backup", "load", "finish")

    @initialize(spec=chosen)
    def build(self: LifecycleMachine, spec: HostPoolSpec) -> None:
        """Build the target's pool, allocator and host pools, and their references."""
        self._build(spec)

    write_kinds = tuple(
        kind for kind in _WRITE_KINDS if kind in draws.OP_KINDS and _served(target, kind, family)
    )
    name = f"{family.upper()}LifecycleMachine"
    machine: type[LifecycleMachine] = type(
        name,
        (LifecycleMachine,),
        {
            "build": build,
            "target": target,
            "device": device,
            "family": family,
            "kinds": kinds,
            "moves": moves,
            "read_api": supports(target, "read_api", family=family),
            "write_kinds": write_kinds,
            "steer": steered_tags(target),
            "__module__": __name__,
            "__qualname__": name,
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine


def _served(target: Any, kind: str, family: str) -> bool:
    needs = {
        "write_index_k": "index_k_write",
        "write_mla": "mla_write",
        "cast_write_kv": "cast_write",
    }
    capability = needs.get(kind)
    served = capability is None or supports(target, capability, family=family)
    return served and not steered_tags(target).avoids(kind, family=family)
