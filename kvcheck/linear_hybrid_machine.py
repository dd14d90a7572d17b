"""A differential state machine for a target's linear-attention hybrid pool.

Each example draws one :class:`~kvcheck.specs.LinearHybridSpec` (full-attention and mamba
layers interleaved, with or without speculative decoding), builds the target's
``(kv_pool, req_to_token_pool)`` through ``make_linear_hybrid`` and a
:class:`~kvcheck.reference.linear_hybrid.ReferenceLinearHybrid` beside it, and makes the
calls sglang's callers make across the sub-pools:

- *admit*: ``req_to_token_pool.alloc([req])`` (a row and a mamba slot), the forward's
  ``clear_slots`` of a slot that needs it, the request's token slots in ``req_to_token``;
- *K/V writes* per full-attention layer (``set_kv_buffer`` with the global layer id) and
  *mamba state writes* per mamba layer (into ``mamba2_layer_cache(layer_id)``'s views, as the
  linear-attention kernels write);
- *fork* (prefix sharing): a new request shares the source's token slots and gets a copy of
  its mamba state (``copy_mamba_state``, the radix cache's copy-on-write);
- *speculative decoding*: verify writes every layer's draft states into the scratch of
  ``get_speculative_mamba2_params_all_layers()``, the commit copies an accepted step into
  the request's state, and the accepted token's K/V moves to its final slot
  (``move_kv_cache``);
- *retraction*: ``get_cpu_copy(tokens, mamba_indices=...)``, then ``free_mamba_cache`` and
  ``free``; later a reload into fresh slots with ``load_cpu_copy``;
- *finish* (``free_mamba_cache`` and ``free``) and *flush* (``req_to_token_pool.clear()``);
- *a refused admission*: admission while every mamba slot is held and a row is free.
  sglang's pool guards this itself (an assert after the row is taken), so the refusal is
  checked as a contract: ``None`` or an exception, and no row or slot taken.

After every step: each live request's row maps its tokens and its mamba slot, no row or
mamba slot is held twice, the free counts equal the truth, and every live token's K/V (read
through the hybrid's global layer ids and through the dense full pool) and every live
request's conv, temporal and draft state (read through the dense mamba layer axis) equal the
reference. At the start: the pools' byte accounting and the mamba state's PD description.

Example::

    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.linear_hybrid_machine import linear_hybrid_machine
    from kvcheck.targets import resolve_target

    Machine = linear_hybrid_machine(resolve_target("kvcheck"), device="cpu")
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import fail
from kvcheck.reference.linear_hybrid import ReferenceLinearHybrid, ReferenceRequest, pattern
from kvcheck.specs import LinearHybridSpec
from kvcheck.steering import Steering
from kvcheck.targets.findings import steered_tags

__all__ = [
    "LinearHybridMachine",
    "assert_alloc_refusal_changes_nothing",
    "linear_hybrid_machine",
    "linear_hybrid_skip_reason",
    "small_linear_hybrid_spec",
]

_SEEDS = st.integers(min_value=1, max_value=99)
_PICK = st.integers(min_value=0, max_value=63)


def linear_hybrid_skip_reason(target: Any) -> str | None:
    """Why ``target`` cannot run the linear-hybrid machine, or ``None`` when it can.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> linear_hybrid_skip_reason(resolve_target("kvcheck")) is None
        True
        >>> print(linear_hybrid_skip_reason(SimpleNamespace(name="t")))
        target 't' builds no linear-attention hybrid pool (it has no make_linear_hybrid)
    """
    if not callable(getattr(target, "make_linear_hybrid", None)):
        name = getattr(target, "name", target)
        return (
            f"target {name!r} builds no linear-attention hybrid pool (it has no make_linear_hybrid)"
        )
    return None


def small_linear_hybrid_spec() -> LinearHybridSpec:
    """A small hybrid with a layer of each kind, two heads and speculative drafts: every
    tensor kind a linear hybrid holds, for checks that need one pool and no search.

    Example:
        >>> spec = small_linear_hybrid_spec()
        >>> spec.full_layer_ids, spec.mamba_layer_ids, spec.draft_tokens
        ((1,), (0,), 2)
    """
    return LinearHybridSpec(
        full_layer_ids=(1,),
        mamba_layer_ids=(0,),
        size=8,
        head_num=2,
        head_dim=4,
        rows=3,
        mamba_size=2,
        max_context_len=4,
        draft_tokens=2,
    )


@st.composite
def _specs(draw: st.DrawFn) -> LinearHybridSpec:
    """Small hybrids; shrinks towards two layers (mamba first), no drafts, one head."""
    layer_num = draw(st.integers(min_value=2, max_value=4), label="layer_num")
    kinds = draw(
        st.lists(st.booleans(), min_size=layer_num, max_size=layer_num).filter(
            lambda k: any(k) and not all(k)
        ),
        label="is_full_attention per layer",
    )
    return LinearHybridSpec(
        full_layer_ids=tuple(i for i, full in enumerate(kinds) if full),
        mamba_layer_ids=tuple(i for i, full in enumerate(kinds) if not full),
        size=draw(st.integers(min_value=6, max_value=12), label="size"),
        head_num=draw(st.integers(min_value=1, max_value=2), label="head_num"),
        head_dim=draw(st.sampled_from((2, 4)), label="head_dim"),
        rows=draw(st.integers(min_value=2, max_value=4), label="rows"),
        mamba_size=draw(st.integers(min_value=2, max_value=4), label="mamba_size"),
        max_context_len=4,
        draft_tokens=draw(st.none() | st.integers(min_value=1, max_value=3), label="draft_tokens"),
    )


class _RequestKV:
    """The request fields sglang's hybrid request pool reads and sets (``req.kv``)."""

    def __init__(self) -> None:
        self.req_pool_idx: int | None = None
        self.mamba_pool_idx: Any = None
        self.kv_allocated_len = 0
        self.mamba_needs_clear = False

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


def _request(rid: str) -> Any:
    return SimpleNamespace(rid=rid, kv=_RequestKV())


def _signature(call: str, kind: str) -> FailureSignature:
    return FailureSignature(check="linear_hybrid", call=call, kind=kind, family="linear_hybrid")


def _check(got: Any, expected: Any, call: str, kind: str) -> None:
    if got != expected:
        raise fail(got=got, expected=expected, call=call, signature=_signature(call, kind))


def _check_tensor(got: torch.Tensor, expected: torch.Tensor, call: str) -> None:
    if not torch.equal(got.detach().to("cpu", torch.float32), expected):
        raise fail(
            got=got.tolist(),
            expected=expected.tolist(),
            call=call,
            signature=_signature(call, "state differs"),
        )


def assert_alloc_refusal_changes_nothing(req_pool: Any) -> None:
    """A request arrives at ``req_pool`` (a hybrid request pool whose mamba slots are all
    held): ``alloc([req])`` refuses it (returns ``None`` or raises; sglang asserts) and
    leaves the free rows, the free mamba slots and the request as they were, so a caller
    that handles the refusal loses nothing. Raises a ``linear_hybrid`` failure otherwise.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0,), rows=3,
        ...                         mamba_size=1)
        >>> _kv, req_pool = resolve_target("kvcheck").make_linear_hybrid(spec, device="cpu")
        >>> req_pool.alloc([_request("held")])
        [3]
        >>> assert_alloc_refusal_changes_nothing(req_pool)
        >>> req_pool.available_size()
        2
    """
    if not callable(getattr(req_pool, "alloc", None)):
        raise ValueError(f"req_pool={req_pool!r} is not a hybrid request pool (it has no alloc)")
    req = _request("refused")
    before = (
        int(req_pool.available_size()),
        int(req_pool.mamba_allocator.available_size()),
        None,
        None,
    )
    try:
        rows = req_pool.alloc([req])
        refusal = f"returned {rows!r}"
    except Exception as error:  # any refusal will do: what it leaves is checked
        rows, refusal = None, f"raised {type(error).__name__}"
    after = (
        int(req_pool.available_size()),
        int(req_pool.mamba_allocator.available_size()),
        req.kv.req_pool_idx,
        req.kv.mamba_pool_idx,
    )
    call = "req_to_token_pool.alloc([refused]) with every mamba slot held"
    if rows is not None:
        raise fail(
            got=rows,
            expected="a refusal (None or an exception)",
            call=call,
            signature=_signature("req_to_token_pool.alloc", "not refused"),
        )
    if after != before:
        raise fail(
            got=f"{after} after it {refusal}",
            expected=f"{before} (free rows, free mamba slots, request's row, its slot)",
            call=call,
            signature=_signature("req_to_token_pool.alloc", "refusal changed the pool"),
        )


def _draft_windows_alias(req_pool: Any, spec: LinearHybridSpec) -> bool:
    """Whether two draft steps' conv windows of one slot share memory in ``req_pool``."""
    if not spec.draft_tokens or spec.draft_tokens < 2:
        return False
    params = req_pool.get_speculative_mamba2_params_all_layers()
    for window in params.intermediate_conv_window:
        steps = [window[0, 1, 0], window[0, 1, 1]]
        if steps[0].untyped_storage().data_ptr() != steps[1].untyped_storage().data_ptr():
            continue
        elements = steps[0].untyped_storage().nbytes() // steps[0].element_size()
        every = torch.arange(elements)
        held = [
            set(
                torch.as_strided(every, t.size(), t.stride(), t.storage_offset()).flatten().tolist()
            )
            for t in steps
        ]
        if held[0] & held[1]:
            return True
    return False


class LinearHybridMachine(RuleBasedStateMachine):
    """The hybrid's pools against the reference; :func:`linear_hybrid_machine` binds it."""

    target: Any = None
    device: str = "cpu"
    specs: st.SearchStrategy[LinearHybridSpec] = _specs()
    steer: Steering = Steering()

    def __init__(self) -> None:
        super().__init__()
        self.names = (f"r{i}" for i in itertools.count())
        self.live: dict[str, Any] = {}
        #: Token slot -> requests sharing it (a fork shares its source's tokens).
        self.token_owners: dict[int, int] = {}
        self.retracted: dict[str, tuple[Any, ReferenceRequest, list[tuple[int, int]]]] = {}

    # --- set up -------------------------------------------------------------------------

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        spec = data.draw(self.specs, label="spec")
        self.spec = spec
        self.kv_pool, self.req_pool = self.target.make_linear_hybrid(spec, device=self.device)
        self.ref = ReferenceLinearHybrid(spec)
        self.free_tokens = list(range(1, spec.size + 1))
        got_kv = tuple(int(b) for b in self.kv_pool.get_kv_size_bytes())
        _check(got_kv, self.ref.kv_bytes(), "kv_pool.get_kv_size_bytes()", "accounting")
        got_mamba = int(self.req_pool.mamba_pool.get_kv_size_bytes())
        _check(got_mamba, self.ref.mamba_bytes(), "mamba_pool.get_kv_size_bytes()", "accounting")
        self.draft_windows_alias = _draft_windows_alias(self.req_pool, spec)
        for owner, name in ((self.kv_pool, "kv_pool"), (self.req_pool, "req_to_token_pool")):
            _ptrs, lens, items = owner.get_state_buf_infos()
            got = [(int(n), int(i)) for n, i in zip(lens, items, strict=True)]
            _check(
                got, self.ref.state_descriptions(), f"{name}.get_state_buf_infos()", "description"
            )

    # --- helpers ------------------------------------------------------------------------

    def _pick(self, index: int) -> str:
        names = sorted(self.live)
        return names[index % len(names)]

    def _slot(self, name: str) -> int:
        return int(self.live[name].kv.mamba_pool_idx)

    def _has_room(self, tokens: int) -> bool:
        spec = self.spec
        return len(self.live) < min(spec.rows, spec.mamba_size) and len(self.free_tokens) >= tokens

    def _mamba_slots_run_out(self) -> bool:
        """Every mamba slot is held while a row is free (and no finding steers away)."""
        return (
            hasattr(self, "spec")
            and self.spec.mamba_size <= len(self.live) < self.spec.rows
            and not self.steer.avoids("linear_hybrid:refused_alloc")
        )

    def _take_tokens(self, count: int) -> list[int]:
        taken, self.free_tokens = self.free_tokens[:count], self.free_tokens[count:]
        for slot in taken:
            self.token_owners[slot] = 1
        return taken

    def _drop_tokens(self, tokens: list[int]) -> None:
        for slot in tokens:
            self.token_owners[slot] -= 1
            if self.token_owners[slot] == 0:
                del self.token_owners[slot]
                self.free_tokens.append(slot)

    def _alloc(self, name: str, tokens: list[int]) -> Any:
        """Row and mamba slot for a new request, its tokens mapped, its slot cleared as the
        forward does when ``mamba_needs_clear`` is set."""
        req = _request(name)
        rows = self.req_pool.alloc([req])
        if rows is None:
            raise fail(
                got=None,
                expected="a row",
                call=f"req_to_token_pool.alloc([{name}])",
                signature=_signature("alloc", "refused"),
            )
        if req.kv.mamba_needs_clear:
            self.req_pool.mamba_pool.clear_slots(torch.tensor([int(req.kv.mamba_pool_idx)]))
            req.kv.mamba_needs_clear = False
        self.req_pool.write(
            (req.kv.req_pool_idx, slice(0, len(tokens))), torch.tensor(tokens, dtype=torch.int32)
        )
        req.kv.kv_allocated_len = len(tokens)
        self.live[name] = req
        return req

    def _release(self, name: str) -> None:
        req = self.live.pop(name)
        self.req_pool.free_mamba_cache(req)
        self.req_pool.free(req)
        self._drop_tokens(self.ref.requests[name].tokens)
        self.ref.release(name)

    # --- rules --------------------------------------------------------------------------

    @rule(tokens=st.integers(min_value=1, max_value=3))
    def admit(self, tokens: int) -> None:
        # Part of admission rather than a rule of its own, so the other rules' draws stay
        # as they were: a full mamba allocator makes admission a refusal.
        if self._mamba_slots_run_out():
            assert_alloc_refusal_changes_nothing(self.req_pool)
            return
        if not self._has_room(tokens):
            return
        name = next(self.names)
        slots = self._take_tokens(tokens)
        self._alloc(name, slots)
        self.ref.admit(name)
        self.ref.requests[name].tokens = slots

    @precondition(lambda self: self.live)
    @rule(pick=_PICK, layer=_PICK, seed=_SEEDS)
    def write_kv(self, pick: int, layer: int, seed: int) -> None:
        name = self._pick(pick)
        layer_id = self.spec.full_layer_ids[layer % len(self.spec.full_layer_ids)]
        tokens = self.ref.requests[name].tokens
        shape = (self.spec.head_num, self.spec.head_dim)
        k = torch.stack([pattern(seed + i, shape) for i in range(len(tokens))])
        v = torch.stack([pattern(seed + 50 + i, shape) for i in range(len(tokens))])
        self.kv_pool.set_kv_buffer(
            SimpleNamespace(layer_id=layer_id), torch.tensor(tokens, dtype=torch.int64), k, v
        )
        for i, slot in enumerate(tokens):
            self.ref.write_kv(layer_id, slot, seed + i, seed + 50 + i)

    @precondition(lambda self: self.live)
    @rule(pick=_PICK, layer=_PICK, temporal=st.booleans(), seed=_SEEDS)
    def write_mamba(self, pick: int, layer: int, temporal: bool, seed: int) -> None:
        name = self._pick(pick)
        layer_id = self.spec.mamba_layer_ids[layer % len(self.spec.mamba_layer_ids)]
        cache = self.req_pool.mamba2_layer_cache(layer_id)
        slot = self._slot(name)
        if temporal:
            cache.temporal[slot] = pattern(seed, self.spec.temporal_shape)
            self.ref.write_temporal(name, layer_id, seed)
        else:
            cache.conv[0][slot] = pattern(seed, self.spec.conv_shapes[0])
            self.ref.write_conv(name, layer_id, 0, seed)

    @precondition(lambda self: self.live)
    @rule(pick=_PICK, tokens=st.integers(min_value=0, max_value=1))
    def fork(self, pick: int, tokens: int) -> None:
        """A new request on the source's prefix: shared token slots, copied mamba state."""
        src = self._pick(pick)
        shared = list(self.ref.requests[src].tokens)
        if not self._has_room(tokens) or len(shared) + tokens > self.spec.max_context_len:
            return
        for slot in shared:
            self.token_owners[slot] += 1
        dst = next(self.names)
        fresh = self._take_tokens(tokens)
        req = self._alloc(dst, shared + fresh)
        self.req_pool.copy_mamba_state(
            torch.tensor([self._slot(src)]), torch.tensor([int(req.kv.mamba_pool_idx)])
        )
        self.ref.fork(src, dst)
        self.ref.requests[dst].tokens = shared + fresh

    @precondition(lambda self: self.live and self.spec.draft_tokens is not None)
    @rule(pick=_PICK, step=_PICK, seed=_SEEDS)
    def verify_drafts(self, pick: int, step: int, seed: int) -> None:
        """Target verify writes one draft step's state on every mamba layer."""
        name = self._pick(pick)
        assert self.spec.draft_tokens is not None
        # Where the draft steps' conv windows share elements (sglang's sliding layout: step
        # k's window is step k-1's shifted by a token), one step's window cannot be written
        # apart from its neighbours': only the first step is drafted there.
        step = 0 if self.draft_windows_alias else step % self.spec.draft_tokens
        params = self.req_pool.get_speculative_mamba2_params_all_layers()
        slot = self._slot(name)
        for dense, layer_id in enumerate(self.spec.mamba_layer_ids):
            ssm_seed, conv_seed = seed + dense, seed + 40 + dense
            params.intermediate_ssm[dense, slot, step] = pattern(ssm_seed, self.spec.temporal_shape)
            for index, conv in enumerate(params.intermediate_conv_window):
                conv[dense, slot, step] = pattern(conv_seed + index, self.spec.conv_shapes[index])
            self.ref.write_drafts(name, layer_id, step, ssm_seed, conv_seed)

    @precondition(lambda self: any(self.ref.requests[n].draft_ssm for n in self.live))
    @rule(pick=_PICK, step=_PICK)
    def commit_draft(self, pick: int, step: int) -> None:
        """The accepted step's drafts become the request's state (the post-verify commit)."""
        names = sorted(n for n in self.live if self.ref.requests[n].draft_ssm)
        name = names[pick % len(names)]
        steps = sorted({s for (_, s) in self.ref.requests[name].draft_ssm})
        step = steps[step % len(steps)]
        params = self.req_pool.get_speculative_mamba2_params_all_layers()
        slot = self._slot(name)
        for dense in range(len(self.spec.mamba_layer_ids)):
            params.temporal[dense, slot] = params.intermediate_ssm[dense, slot, step]
            for conv, drafts in zip(params.conv, params.intermediate_conv_window, strict=True):
                conv[dense, slot] = drafts[dense, slot, step]
        self.ref.commit_draft(name, step)

    @precondition(lambda self: self.live and self.free_tokens)
    @rule(pick=_PICK)
    def move_accepted_token(self, pick: int) -> None:
        """Speculative accept: the last token's K/V moves to a fresh slot."""
        name = self._pick(pick)
        tokens = self.ref.requests[name].tokens
        src = tokens[-1]
        if self.token_owners[src] != 1:
            return  # a shared prefix token stays where its other owners read it
        (tgt,) = self._take_tokens(1)
        self.kv_pool.move_kv_cache(torch.tensor([tgt]), torch.tensor([src]))
        self.ref.move_kv([tgt], [src])
        tokens[-1] = tgt
        self._drop_tokens([src])
        row = self.live[name].kv.req_pool_idx
        self.req_pool.write((row, len(tokens) - 1), tgt)

    @precondition(lambda self: self.live)
    @rule(pick=_PICK)
    def retract(self, pick: int) -> None:
        """Offload to the host, then free the row, the mamba slot and the tokens."""
        name = self._pick(pick)
        tokens = list(self.ref.requests[name].tokens)
        copy = self.kv_pool.get_cpu_copy(
            torch.tensor(tokens, dtype=torch.int64), mamba_indices=torch.tensor([self._slot(name)])
        )
        saved_kv = [
            self.ref.kv_at(layer, slot) for layer in self.spec.full_layer_ids for slot in tokens
        ]
        saved = self.ref.requests[name]
        self._release(name)
        self.retracted[name] = (copy, saved, saved_kv)

    @precondition(lambda self: self.retracted)
    @rule(pick=_PICK)
    def reload(self, pick: int) -> None:
        """A retracted request comes back in fresh slots from its host copy."""
        name = sorted(self.retracted)[pick % len(self.retracted)]
        copy, saved, saved_kv = self.retracted[name]
        if not self._has_room(len(saved.tokens)):
            return
        del self.retracted[name]
        tokens = self._take_tokens(len(saved.tokens))
        req = self._alloc(name, tokens)
        self.kv_pool.load_cpu_copy(
            copy,
            torch.tensor(tokens, dtype=torch.int64),
            mamba_indices=torch.tensor([int(req.kv.mamba_pool_idx)]),
        )
        self.ref.admit(name)
        restored = self.ref.requests[name]
        restored.tokens = tokens
        restored.conv, restored.temporal = dict(saved.conv), dict(saved.temporal)
        values = iter(saved_kv)
        for layer in self.spec.full_layer_ids:
            for slot in tokens:
                self.ref.write_kv(layer, slot, *next(values))

    @precondition(lambda self: self.live)
    @rule(pick=_PICK)
    def finish(self, pick: int) -> None:
        self._release(self._pick(pick))

    @precondition(lambda self: self.live)
    @rule()
    def flush(self) -> None:
        """``req_to_token_pool.clear()``: every row and mamba slot free (host copies stay)."""
        self.req_pool.clear()
        self.live = {}
        self.token_owners = {}
        self.free_tokens = list(range(1, self.spec.size + 1))
        self.ref.flush()

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def slots_are_owned_once(self) -> None:
        if not hasattr(self, "spec"):
            return
        spec = self.spec
        rows = [req.kv.req_pool_idx for req in self.live.values()]
        slots = [int(req.kv.mamba_pool_idx) for req in self.live.values()]
        _check(
            len(set(rows)), len(rows), "req_to_token_pool.alloc (rows held twice)", "owned twice"
        )
        _check(
            len(set(slots)),
            len(slots),
            "req_to_token_pool.alloc (mamba slots held twice)",
            "owned twice",
        )
        for slot in slots:
            if not 1 <= slot <= spec.mamba_size:
                raise fail(
                    got=slot,
                    expected=f"a slot in 1..{spec.mamba_size}",
                    call="req_to_token_pool.alloc",
                    signature=_signature("alloc", "range"),
                )
        _check(
            int(self.req_pool.available_size()),
            spec.rows - len(rows),
            "req_to_token_pool.available_size()",
            "leak",
        )
        _check(
            int(self.req_pool.mamba_allocator.available_size()),
            spec.mamba_size - len(slots),
            "req_to_token_pool.mamba_allocator.available_size()",
            "leak",
        )

    @invariant()
    def state_equals_reference(self) -> None:
        if not hasattr(self, "spec"):
            return
        spec = self.spec
        kv_shape = (spec.head_num, spec.head_dim)
        cache = self.req_pool.mamba_pool.mamba_cache
        for name, req in sorted(self.live.items()):
            truth = self.ref.requests[name]
            row = req.kv.req_pool_idx
            got_row = self.req_pool.req_to_token[row, : len(truth.tokens)].tolist()
            _check(got_row, truth.tokens, f"req_to_token[{row}] of {name}", "mapping")
            mapped = int(self.req_pool.get_mamba_indices(torch.tensor([row]))[0])
            _check(mapped, self._slot(name), f"get_mamba_indices([{row}]) of {name}", "mapping")
            for dense, layer_id in enumerate(spec.full_layer_ids):
                for slot in truth.tokens:
                    k_seed, v_seed = self.ref.kv_at(layer_id, slot)
                    _check_tensor(
                        self.kv_pool.get_key_buffer(layer_id)[slot],
                        pattern(k_seed, kv_shape),
                        f"kv_pool.get_key_buffer({layer_id})[{slot}]",
                    )
                    _check_tensor(
                        self.kv_pool.full_kv_pool.get_value_buffer(dense)[slot],
                        pattern(v_seed, kv_shape),
                        f"kv_pool.full_kv_pool.get_value_buffer({dense})[{slot}]",
                    )
            slot = self._slot(name)
            for dense, layer_id in enumerate(spec.mamba_layer_ids):
                _check_tensor(
                    cache.temporal[dense, slot],
                    pattern(truth.temporal.get(layer_id, 0), spec.temporal_shape),
                    f"mamba_cache.temporal[{dense}, {slot}] of {name}",
                )
                for index, conv in enumerate(cache.conv):
                    _check_tensor(
                        conv[dense, slot],
                        pattern(truth.conv.get((layer_id, index), 0), spec.conv_shapes[index]),
                        f"mamba_cache.conv[{index}][{dense}, {slot}] of {name}",
                    )
                for (layer, step), seed in truth.draft_ssm.items():
                    if layer == layer_id:
                        _check_tensor(
                            cache.intermediate_ssm[dense, slot, step],
                            pattern(seed, spec.temporal_shape),
                            f"intermediate_ssm[{dense}, {slot}, {step}] of {name}",
                        )
                for (layer, index, step), seed in truth.draft_conv.items():
                    if layer == layer_id:
                        _check_tensor(
                            cache.intermediate_conv_window[index][dense, slot, step],
                            pattern(seed, spec.conv_shapes[index]),
                            f"intermediate_conv_window[{index}][{dense}, {slot}, {step}] of {name}",
                        )


def linear_hybrid_machine(
    target: Any,
    *,
    device: str,
    settings: Settings | None = None,
    specs: st.SearchStrategy[LinearHybridSpec] | None = None,
) -> type[LinearHybridMachine]:
    """The linear-hybrid machine bound to ``target`` and ``device`` (``specs``: the hybrids
    it draws; default: two to four layers, with and without draft tokens).

    ``settings`` defaults to a tenth of the loaded profile's examples (at least 5): each
    example builds two pools and checks every live slot after every step.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> machine = linear_hybrid_machine(resolve_target("kvcheck"), device="cpu")
        >>> machine.TestCase.settings.max_examples >= 5
        True
    """
    reason = linear_hybrid_skip_reason(target)
    if reason is not None:
        raise ValueError(f"target={getattr(target, 'name', target)!r}: {reason}")
    if not isinstance(device, str):
        raise ValueError(f"device={device!r} must be a device name such as 'cpu'")
    if settings is None:
        loaded = Settings()
        settings = Settings(loaded, max_examples=max(5, loaded.max_examples // 10))
    machine: type[LinearHybridMachine] = type(
        "LinearHybridMachineFor" + str(getattr(target, "name", "target")).title(),
        (LinearHybridMachine,),
        {
            "target": target,
            "device": device,
            "specs": specs if specs is not None else _specs(),
            "steer": steered_tags(target),
        },
    )
    machine.TestCase.settings = settings
    return machine
