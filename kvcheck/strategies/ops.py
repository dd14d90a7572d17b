"""Single operations for one pool spec, drawn one at a time (the state machines' steps).

:func:`kvcheck.strategies.op_sequences` draws whole sequences up front; a state machine
instead draws one operation per step, knowing which host copies exist so far. These
strategies build :mod:`kvcheck.specs` operations whose payload bytes always encode finite
values of the pool's dtype (a pool that converts values instead of copying bytes must
still round-trip them).

Hypothesis deletes steps from a falsifying example only a few choices at a time, so the
draws here are shaped for that:

- :func:`step_kinds` lets a step shrink to a do-nothing kind with no further choices,
  which shrinking can then delete;
- what a step draws never depends on what earlier steps did (apart from which host
  copies exist), so deleting a step leaves the later steps' operations unchanged.
  Operations meet each other because about half of all slots are drawn from the first
  few (:data:`CROWDED`), not because they aim at slots written earlier;
- a payload row is two integers (first byte, byte step), not one choice per byte.

Each operation shrinks towards one token at slot 0 of the lowest layer, with rows of
``0x01`` bytes. Strategies are cached (specs are frozen and hashable): building and
validating them afresh for every step would cost more than running the step. Operations
are built inside composites rather than with ``.map``, so a falsifying example prints
the operation itself.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvcheck.reference import index_k_row_bytes, index_scale_row_bytes
from kvcheck.specs import HostCopy, HostReload, Move, Op, PoolSpec, WriteIndexK, WriteKV

#: Tokens one operation touches at most: enough for overlaps, small enough to read.
MAX_TOKENS_PER_OP = 4
#: About half of all slots (and pages) are drawn from this many first ones.
CROWDED = 4
#: Name of the host copies ``invalid_ops`` draws (the pool must refuse them).
REJECTED_COPY_NAME = "partial_page_copy"

#: dtype -> (bytes per value, exponent bits that are all ones only for inf/nan, the top
#: exponent bit). Clearing that bit where the exponent is all ones leaves a finite value,
#: and leaves finite encodings (zeros above all) untouched.
_EXPONENT_BITS: dict[str, tuple[int, int, int]] = {
    "float32": (4, 0x7F800000, 0x40000000),
    "bfloat16": (2, 0x7F80, 0x4000),
    "float16": (2, 0x7C00, 0x4000),
    "float8_e4m3fn": (1, 0x7F, 0x40),
    "float8_e5m2": (1, 0x7C, 0x40),
}


# --- small cached strategies -------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@functools.lru_cache(maxsize=4096)
def choice(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(values)``, built once per tuple of values."""
    return st.sampled_from(values)


@functools.lru_cache(maxsize=4096)
def _permutations(values: tuple[int, ...]) -> st.SearchStrategy[list[int]]:
    return st.permutations(values)


@functools.lru_cache(maxsize=4096)
def _choices(values: tuple[int, ...], count: int) -> st.SearchStrategy[list[int]]:
    return st.lists(choice(values), min_size=count, max_size=count)


@st.composite
def _step_kinds(draw: st.DrawFn, kinds: tuple[str, ...]) -> str:
    index = draw(_ints(0, _KIND_SLOTS - 1), label="kind")
    return kinds[0] if index == 0 else kinds[1 + (index - 1) % (len(kinds) - 1)]


#: The kind draw takes one of this many values; only 0 means the first kind.
_KIND_SLOTS = 64


@functools.lru_cache(maxsize=256)
def step_kinds(kinds: tuple[str, ...]) -> st.SearchStrategy[str]:
    """One of ``kinds``, where ``kinds[0]`` is drawn less often but is what a step shrinks to.

    A state machine puts a do-nothing kind first: generating it wastes a step, but a
    step that shrinks to it has almost no choices left and shrinking can delete it.
    (Inside state machines Hypothesis favours zeros, so it still comes up in about one
    step in five.)
    """
    if len(kinds) < 2:
        raise ValueError(f"kinds={kinds!r} needs a shrink target and at least one other kind")
    return _step_kinds(kinds)


# --- payloads ----------------------------------------------------------------------------


def _finite(raw: bytes, dtype: str) -> bytes:
    width, all_ones, top_bit = _EXPONENT_BITS[dtype]
    values = np.frombuffer(raw, dtype=np.dtype(f"<u{width}")).copy()
    special = (values & all_ones) == all_ones
    values[special] &= values.dtype.type(((1 << (8 * width)) - 1) ^ top_bit)
    return values.tobytes()


def pattern_row(start: int, step: int, dtype: str, row_bytes: int) -> bytes:
    """The bytes ``start, start+step, start+2*step, ...`` (mod 256), made to encode finite
    ``dtype`` values.

    Example:
        >>> pattern_row(1, 1, "float8_e4m3fn", 4)
        b'\\x01\\x02\\x03\\x04'
    """
    raw = bytes((start + step * i) & 0xFF for i in range(row_bytes))
    return _finite(raw, dtype)


@st.composite
def _payload_rows(draw: st.DrawFn, dtype: str, count: int, row_bytes: int) -> tuple[bytes, ...]:
    rows = []
    for _ in range(count):
        start = draw(_ints(1, 255), label="first byte")
        step = draw(_ints(0, 255), label="byte step")
        rows.append(pattern_row(start, step, dtype, row_bytes))
    return tuple(rows)


@functools.lru_cache(maxsize=1024)
def payload_rows(dtype: str, count: int, row_bytes: int) -> st.SearchStrategy[tuple[bytes, ...]]:
    """``count`` rows of ``row_bytes`` bytes, each encoding finite ``dtype`` values.

    Each row is an arithmetic byte sequence drawn as two integers: rows differ from each
    other and bytes within a row differ (so a layout bug that permutes bytes shows), yet
    an example has two choices per row rather than one per byte, which keeps shrinking
    fast. The first byte is never zero, so every write shows in a zero-filled pool.
    Shrinks towards rows of ``0x01`` bytes.
    """
    return _payload_rows(dtype, count, row_bytes)


def row_bytes(spec: PoolSpec) -> tuple[int, int]:
    """(K or latent row bytes, V row bytes or 0) of one token in one layer."""
    if spec.family in ("mha", "noop"):
        return (
            spec.head_num * spec.head_dim * spec.itemsize,
            spec.head_num * spec.effective_v_head_dim * spec.itemsize,
        )
    return (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.itemsize, 0


def indexed_layers(spec: PoolSpec, *, skip: bool) -> tuple[int, ...]:
    """Global DSA layers that have (``skip=False``) or lack (``skip=True``) index-K."""
    if spec.family != "dsa":
        return ()
    return tuple(
        layer for layer, s in zip(spec.layer_ids, spec.skip_mask, strict=True) if s == skip
    )


# --- slots and pages ---------------------------------------------------------------------


def _draw_crowded(draw: st.DrawFn, count: int, what: str) -> int:
    """One of ``range(count)``: about half the time one of the first :data:`CROWDED`."""
    crowded = draw(st.booleans(), label=f"a crowded {what}")
    first = draw(_ints(0, min(count, CROWDED) - 1), label=f"crowded {what}")
    anywhere = draw(_ints(0, count - 1), label=what)
    return first if crowded else anywhere


def _draw_locs(
    draw: st.DrawFn, spec: PoolSpec, min_size: int = 1, count: int | None = None
) -> tuple[int, ...]:
    """``count`` (default 1-4, at least ``min_size``) distinct slots, often crowded ones."""
    if count is None:
        count = draw(_ints(min_size, min(MAX_TOKENS_PER_OP, spec.num_slots)), label="tokens")
    chosen: list[int] = []
    for _ in range(count):
        slot = _draw_crowded(draw, spec.num_slots, "slot")
        if slot in chosen:
            # A repeat: take the lowest free slot instead (count <= num_slots, so one is).
            slot = min(set(range(spec.num_slots)) - set(chosen))
        chosen.append(slot)
    return tuple(chosen)


def _draw_whole_pages(draw: st.DrawFn, spec: PoolSpec, count: int | None = None) -> tuple[int, ...]:
    """Slots of 1-3 (or ``count``) distinct whole pages, each page's slots in order."""
    num_pages = spec.num_slots // spec.page_size
    wanted = draw(_ints(1, min(3, num_pages)), label="pages") if count is None else count
    pages: list[int] = []
    for _ in range(wanted):
        page = _draw_crowded(draw, num_pages, "page")
        if page in pages:
            page = min(set(range(num_pages)) - set(pages))
        pages.append(page)
    return tuple(
        page * spec.page_size + offset for page in pages for offset in range(spec.page_size)
    )


# --- valid operations --------------------------------------------------------------------


@st.composite
def _write_kv_ops(
    draw: st.DrawFn,
    spec: PoolSpec,
    locs: tuple[int, ...] | None,
    layer_ids: tuple[int, ...] | None,
    extra_k_bytes: int,
) -> WriteKV:
    layer_id = draw(choice(layer_ids or tuple(spec.layer_ids)), label="layer_id")
    if locs is None:
        locs = _draw_locs(draw, spec)
    k_bytes, v_bytes = row_bytes(spec)
    k_rows = draw(payload_rows(spec.dtype, len(locs), k_bytes + extra_k_bytes), label="k_rows")
    v_rows = draw(payload_rows(spec.dtype, len(locs), v_bytes), label="v_rows") if v_bytes else ()
    return WriteKV(layer_id=layer_id, locs=locs, k_rows=k_rows, v_rows=v_rows)


@functools.lru_cache(maxsize=4096)
def write_kv_ops(
    spec: PoolSpec,
    *,
    locs: tuple[int, ...] | None = None,
    layer_ids: tuple[int, ...] | None = None,
    extra_k_bytes: int = 0,
) -> st.SearchStrategy[WriteKV]:
    """``set_kv_buffer`` of 1-4 tokens (or ``locs``) on one layer (of ``layer_ids``);
    ``extra_k_bytes`` lengthens every K row, making the write invalid."""
    return _write_kv_ops(spec, locs, layer_ids, extra_k_bytes)


@st.composite
def _write_index_k_ops(draw: st.DrawFn, spec: PoolSpec, layer_ids: tuple[int, ...]) -> WriteIndexK:
    layer_id = draw(choice(layer_ids), label="layer_id")
    locs = _draw_locs(draw, spec)
    dim = spec.index_head_dim
    keys = draw(payload_rows("float8_e4m3fn", len(locs), index_k_row_bytes(dim)), label="keys")
    scales = draw(payload_rows("float32", len(locs), index_scale_row_bytes(dim)), label="scales")
    return WriteIndexK(layer_id=layer_id, locs=locs, key_rows=keys, scale_rows=scales)


@functools.lru_cache(maxsize=4096)
def write_index_k_ops(
    spec: PoolSpec, *, layer_ids: tuple[int, ...]
) -> st.SearchStrategy[WriteIndexK]:
    """DSA ``set_index_k_scale_buffer`` of 1-4 tokens on one of ``layer_ids``."""
    return _write_index_k_ops(spec, layer_ids)


@st.composite
def _move_ops(draw: st.DrawFn, spec: PoolSpec) -> Move:
    if draw(choice((False,) * 7 + (True,)), label="empty move"):
        return Move(tgt=(), src=())
    window = _draw_locs(draw, spec, min_size=min(2, spec.num_slots))
    count = draw(_ints(1, len(window)), label="count")
    tgt = tuple(draw(_permutations(window), label="targets")[:count])
    src = tuple(draw(_choices(window, count), label="sources"))
    return Move(tgt=tgt, src=src)


@functools.lru_cache(maxsize=1024)
def move_ops(spec: PoolSpec) -> st.SearchStrategy[Move]:
    """A move inside one small window of slots: sources repeat and overlap targets often.
    About one move in eight is empty (a no-op)."""
    return _move_ops(spec)


@st.composite
def _host_copy_ops(draw: st.DrawFn, spec: PoolSpec, name: str) -> HostCopy:
    if spec.family == "dsa":
        return HostCopy(name=name, indices=_draw_whole_pages(draw, spec))
    return HostCopy(name=name, indices=_draw_locs(draw, spec))


@functools.lru_cache(maxsize=4096)
def host_copy_ops(spec: PoolSpec, name: str) -> st.SearchStrategy[HostCopy]:
    """``get_cpu_copy`` of 1-4 slots (DSA: 1-3 whole pages), remembered under ``name``."""
    return _host_copy_ops(spec, name)


@st.composite
def _host_reload_ops(
    draw: st.DrawFn, spec: PoolSpec, copies: tuple[tuple[str, int], ...]
) -> HostReload:
    name, count = draw(choice(copies), label="copy")
    if spec.family == "dsa":
        indices = _draw_whole_pages(draw, spec, count // spec.page_size)
    else:
        indices = _draw_locs(draw, spec, count=count)
    return HostReload(name=name, indices=indices)


def host_reload_ops(spec: PoolSpec, copies: Mapping[str, int]) -> st.SearchStrategy[HostReload]:
    """``load_cpu_copy`` of one of ``copies`` (name -> copied tokens, in the order they were
    taken) to the same or other slots."""
    return _cached_host_reload_ops(spec, tuple(copies.items()))


@functools.lru_cache(maxsize=4096)
def _cached_host_reload_ops(
    spec: PoolSpec, copies: tuple[tuple[str, int], ...]
) -> st.SearchStrategy[HostReload]:
    return _host_reload_ops(spec, copies)


# --- invalid operations ------------------------------------------------------------------

#: Kinds of invalid operation, each with the capabilities it needs.
_INVALID_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("write_loc_out_of_range", ()),
    ("write_loc_repeated", ()),
    ("write_row_too_long", ()),
    ("write_layer_out_of_range", ()),
    ("move_length_mismatch", ("move",)),
    ("move_target_repeated", ("move",)),
    ("move_target_out_of_range", ("move",)),
    ("index_k_to_skip_layer", ("index_k_write",)),
    ("partial_page_copy", ("host_copy",)),
    ("reload_length_mismatch", ("host_copy",)),
)


def _invalid_kinds(
    spec: PoolSpec, copies: tuple[tuple[str, int], ...], skipped: frozenset[str]
) -> tuple[str, ...]:
    # reload_length_mismatch comes last: it appears once a copy exists, and being last it
    # does not shift the other kinds' indices when it does.
    possible = {
        "index_k_to_skip_layer": bool(indexed_layers(spec, skip=True)),
        "partial_page_copy": spec.family == "dsa" and spec.page_size > 1,
        "reload_length_mismatch": bool(copies),
    }
    return tuple(
        kind
        for kind, needs in _INVALID_KINDS
        if possible.get(kind, True) and not set(needs) & skipped
    )


@st.composite
def _invalid_ops(
    draw: st.DrawFn,
    spec: PoolSpec,
    copies: tuple[tuple[str, int], ...],
    skipped: frozenset[str],
) -> Op:
    kind = draw(choice(_invalid_kinds(spec, copies, skipped)), label="invalid kind")
    limit = spec.num_slots
    slot = _ints(0, limit - 1)
    bad_slot = choice((limit, -1, limit + 7))
    if kind == "write_loc_out_of_range":
        locs = (*_draw_locs(draw, spec, min_size=0), draw(bad_slot, label="bad slot"))
        return draw(write_kv_ops(spec, locs=locs))
    if kind == "write_loc_repeated":
        loc = draw(slot, label="repeated slot")
        return draw(write_kv_ops(spec, locs=(loc, loc)))
    if kind == "write_row_too_long":
        heads = spec.head_num if spec.family in ("mha", "noop") else 1
        return draw(write_kv_ops(spec, extra_k_bytes=heads * spec.itemsize))
    if kind == "write_layer_out_of_range":
        ids = spec.layer_ids
        return draw(write_kv_ops(spec, layer_ids=(ids.stop, ids.start - 1)))
    if kind == "move_length_mismatch":
        move = draw(move_ops(spec))
        return Move(tgt=move.tgt, src=(*move.src, draw(slot, label="extra source")))
    if kind == "move_target_repeated":
        target = draw(slot, label="repeated target")
        sources = (draw(slot, label="source"), draw(slot, label="source"))
        return Move(tgt=(target, target), src=sources)
    if kind == "move_target_out_of_range":
        return Move(tgt=(draw(bad_slot, label="bad target"),), src=(draw(slot, label="source"),))
    if kind == "index_k_to_skip_layer":
        return draw(write_index_k_ops(spec, layer_ids=indexed_layers(spec, skip=True)))
    if kind == "partial_page_copy":
        page = _draw_whole_pages(draw, spec, 1)
        broken = draw(choice((page[:-1], page[::-1], page[1:] + page[:1])), label="broken page")
        return HostCopy(name=REJECTED_COPY_NAME, indices=broken)
    name, count = draw(choice(copies), label="copy")
    wrong = draw(choice((count - 1, *((count + 1,) if count < limit else ()))), label="count")
    return HostReload(name=name, indices=tuple(range(wrong)))


def invalid_ops(
    spec: PoolSpec, copies: Mapping[str, int], *, skipped: frozenset[str] = frozenset()
) -> st.SearchStrategy[Op]:
    """Operations the contract rejects: out-of-range or repeated locations, K rows one
    head-dim element too long, layers outside the pool, bad moves, index-K writes to skip
    layers, partial DSA pages, reloads of the wrong length. On NoOp some of these are
    accepted moves: :meth:`ReferencePool.expected_error` is the authority.

    ``skipped`` capabilities (``move``, ``host_copy``, ``index_k_write``) are left out.
    """
    return _cached_invalid_ops(spec, tuple(copies.items()), frozenset(skipped))


@functools.lru_cache(maxsize=4096)
def _cached_invalid_ops(
    spec: PoolSpec, copies: tuple[tuple[str, int], ...], skipped: frozenset[str]
) -> st.SearchStrategy[Op]:
    return _invalid_ops(spec, copies, skipped)
