"""Single pool operations for one pool spec: kvcheck's one operation generator.

Every operation kvcheck draws comes from here: :func:`kvcheck.strategies.op_sequences`
composes these strategies into whole sequences, the differential state machines
(:mod:`kvcheck.machines`) draw one per step, and the input properties
(:mod:`kvcheck.strategies.malformed_calls`) start their malformed calls from them. Each builds
:mod:`kvcheck.specs` operations whose payload bytes encode finite values of the dtype
they are written in.

The operations are the calls SGLang's own callers make on a pool:

- :func:`write_kv_ops` (``set_kv_buffer`` in the pool's dtype) and
  :func:`cast_write_kv_ops` (the caller's activations in bf16/fp16/fp32, converted by the
  pool, MHA with and without ``k_scale``/``v_scale``);
- :func:`write_mla_ops` (``set_mla_kv_buffer``: the latent row as its nope and rope parts);
- :func:`write_prefix_valid_ops` (``set_kv_buffer_prefix_valid``: a grid of slots, each
  row committing a prefix);
- :func:`write_index_k_ops` (DSA index keys and scales);
- :func:`move_ops` (sources repeat and overlap targets);
- :func:`host_copy_ops` / :func:`host_reload_ops`: index sets shaped as the scheduler
  passes them (one request's slots, whole pages plus a partial last page; several
  requests at once) or arbitrary token sets;
- :func:`invalid_ops`: operations the hardening contract rejects.

Hypothesis deletes steps from a falsifying example only a few choices at a time, so the
draws are shaped for that: :func:`step_kinds` lets a step shrink to a do-nothing kind;
what a step draws never depends on earlier steps (apart from which host copies exist),
and operations meet because about half of all slots come from the first few
(:data:`CROWDED`); a payload row is two integers, not one choice per byte. Each operation
shrinks towards one token at slot 0 of the lowest layer. Strategies are cached per
(frozen, hashable) spec.

Example:
    >>> from hypothesis import find
    >>> from kvcheck.specs import PoolSpec
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16",
    ...                 head_dim=1)
    >>> find(write_kv_ops(spec), lambda op: True)
    WriteKV(layer_id=0, locs=(0,), k_rows=(b'\\x01\\x01',), v_rows=(b'\\x01\\x01',), \
payload=None, override=False)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.geometry import index_k_row_bytes, index_scale_row_bytes, row_bytes, row_elements
from kvcheck.specs import (
    COMPRESS_TAIL_ITEMSIZE,
    DSA_QUANT_BLOCK,
    DTYPE_ITEMSIZE,
    MXFP8_INTERLEAVED_PAGE,
    HostCopy,
    HostReload,
    Move,
    Op,
    Payload,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.validation import check_type

#: A flag that is true two times in three and shrinks to false.
MOSTLY_TRUE: st.SearchStrategy[bool] = st.sampled_from((False, True, True))
#: Tokens one operation touches at most: enough for overlaps, small enough to read.
MAX_TOKENS_PER_OP = 4
#: About half of all slots (and pages) are drawn from this many first ones.
CROWDED = 4

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


def choice(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(values)``, built once per tuple of values (of their types too:
    ``(False, True)`` equals ``(0, 1)``, and must not draw layer ids as booleans)."""
    return _choice(values, tuple(type(value) for value in values))


@functools.lru_cache(maxsize=4096)
def _choice(values: tuple[Any, ...], types: tuple[type, ...]) -> st.SearchStrategy[Any]:
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


def indexed_layers(spec: PoolSpec, *, skip: bool) -> tuple[int, ...]:
    """Global DSA layers that have (``skip=False``) or lack (``skip=True``) index-K."""
    if spec.family != "dsa":
        return ()
    return tuple(
        layer for layer, s in zip(spec.layer_ids, spec.skip_mask, strict=True) if s == skip
    )


# --- exact values for payloads in another dtype ---------------------------------------------

#: Values every dtype kvcheck uses represents exactly, also after a division by any of
#: :data:`CAST_SCALES` (results lie in [-8, 8] on a grid of 1/4): the bytes a pool must
#: store for a converted payload are then known without trusting any conversion.
EXACT_VALUES: tuple[float, ...] = (1.0, 0.5, 1.5, 2.0, 3.0, 4.0, -1.0, -0.5, -1.5, -2.0, -3.0, -4.0)
#: ``k_scale``/``v_scale`` values a caller passes (None: no scale), powers of two.
CAST_SCALES: tuple[float | None, ...] = (None, 2.0, 0.5, 1.0)
#: Dtypes attention layers hand to ``set_kv_buffer``: a pool of another dtype converts them.
CALLER_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")


@functools.lru_cache(maxsize=4096)
def value_bytes(value: float, dtype: str) -> bytes:
    """The bytes of ``value`` in ``dtype`` (a torch dtype name), for an exact value.

    Example:
        >>> value_bytes(1.0, "bfloat16")
        b'\\x80?'
    """
    import torch

    tensor = torch.tensor([value], dtype=torch.float32).to(getattr(torch, dtype))
    return bytes(tensor.view(torch.uint8).tolist())


def _exact_row(start: int, step: int, count: int) -> tuple[float, ...]:
    return tuple(EXACT_VALUES[(start + step * i) % len(EXACT_VALUES)] for i in range(count))


#: Operation kinds :func:`op_sequences` draws, in shrink order.
OP_KINDS: tuple[str, ...] = (
    "write_kv",
    "move",
    "host_copy",
    "host_reload",
    "write_index_k",
    "write_compress_tail",
    "cast_write_kv",
    "write_mla",
    "write_prefix_valid",
)


def family_op_kinds(spec: PoolSpec) -> tuple[str, ...]:
    """The operation kinds that apply to ``spec``'s family (index-K writes only where a
    layer has index-K; ``set_mla_kv_buffer`` for MLA/DSA; prefix-valid writes for MHA;
    no ``set_kv_buffer`` for a scaled latent layout or under decode context parallel;
    compress-tail writes where a layer keeps tails; no moves with an index kpool, which
    refuses them).

    Example:
        >>> family_op_kinds(PoolSpec(family="mla", size=2, page_size=1, layer_num=1,
        ...                          dtype="bfloat16"))
        ('write_kv', 'move', 'host_copy', 'host_reload', 'cast_write_kv', 'write_mla')
    """
    applies = {
        "write_index_k": bool(indexed_layers(spec, skip=False)),
        "write_compress_tail": spec.compress_tails and bool(indexed_layers(spec, skip=False)),
        # A pool with an index kpool refuses every non-empty move (the machines still
        # draw moves there, to check that the refusal changes nothing).
        "move": spec.index_kpool == 1,
        "write_mla": spec.family in ("mla", "dsa"),
        "write_prefix_valid": spec.family in ("mha", "noop"),
        # A scaled latent row is written only from its bf16 parts (set_mla_kv_buffer);
        # under decode context parallel set_kv_buffer is refused (no DCP-aware path).
        "write_kv": spec.latent_layout == "raw" and spec.dcp_size == 1,
        # MXFP8 quantizes a write itself (no caller scales) on 128-token pages only.
        "cast_write_kv": spec.latent_layout == "raw"
        and spec.dcp_size == 1
        and not (spec.kv_quant == "mxfp8" and spec.page_size != MXFP8_INTERLEAVED_PAGE),
    }
    return tuple(kind for kind in OP_KINDS if applies.get(kind, True))


# --- slots and pages ---------------------------------------------------------------------


def _draw_crowded(draw: st.DrawFn, count: int, what: str) -> int:
    """One of ``range(count)``: about half the time one of the first :data:`CROWDED`."""
    crowded = draw(st.booleans(), label=f"a crowded {what}")
    first = draw(_ints(0, min(count, CROWDED) - 1), label=f"crowded {what}")
    anywhere = draw(_ints(0, count - 1), label=what)
    return first if crowded else anywhere


def _draw_locs(
    draw: st.DrawFn,
    spec: PoolSpec,
    min_size: int = 1,
    count: int | None = None,
    slots: int | None = None,
) -> tuple[int, ...]:
    """``count`` (default 1-4, at least ``min_size``) distinct slots of ``slots`` (default:
    the token ids callers name, widened under DCP), often crowded ones."""
    slots = spec.token_slots if slots is None else slots
    if count is None:
        count = draw(_ints(min_size, min(MAX_TOKENS_PER_OP, slots)), label="tokens")
    chosen: list[int] = []
    for _ in range(count):
        slot = _draw_crowded(draw, slots, "slot")
        if slot in chosen:
            # A repeat: take the lowest free slot instead (count <= slots, so one is).
            slot = min(set(range(slots)) - set(chosen))
        chosen.append(slot)
    return tuple(chosen)


def _draw_pages(draw: st.DrawFn, spec: PoolSpec, count: int) -> list[int]:
    """``count`` distinct allocator pages (count <= the pages the buffers hold)."""
    num_pages = spec.num_slots // spec.page_size
    pages: list[int] = []
    for _ in range(count):
        page = _draw_crowded(draw, num_pages, "page")
        if page in pages:
            page = min(set(range(num_pages)) - set(pages))
        pages.append(page)
    return pages


#: How a host copy's index set is laid out: ``None`` for arbitrary tokens, else the run
#: length of each request segment, every run starting on a page boundary (one request:
#: its whole pages, then a partial last page). Pages are the allocator's: under DCP,
#: widened pages of ``page_size * dcp_size`` ids.
CopyLayout = tuple[int, ...] | None


def _draw_runs(draw: st.DrawFn, spec: PoolSpec, runs: tuple[int, ...]) -> tuple[int, ...]:
    """Slots for page-aligned runs of the given lengths on distinct pages."""
    page_size = spec.token_page_size
    pages_per_run = [-(-length // page_size) for length in runs]
    pages = _draw_pages(draw, spec, sum(pages_per_run))
    slots: list[int] = []
    for length, count in zip(runs, pages_per_run, strict=True):
        own, pages = pages[:count], pages[count:]
        run = [page * page_size + offset for page in own for offset in range(page_size)]
        slots += run[:length]
    return tuple(slots)


def _draw_copy_layout(draw: st.DrawFn, spec: PoolSpec) -> CopyLayout:
    """Arbitrary tokens, one request, or two requests (each whole pages + a partial page).

    Under DCP a rank takes its share of the ids as ``indices[rank::dcp_size]``, which SGLang
    allows when each run starts page-aligned; so there are no arbitrary tokens, and a run
    followed by another has a whole number of ``dcp_size`` ids."""
    num_pages = spec.num_slots // spec.page_size
    shape = draw(choice(("request", "tokens", "requests")), label="index set")
    if shape == "tokens" and spec.dcp_size > 1:
        shape = "request"
    if shape == "tokens" or (num_pages < 2 and shape == "requests"):
        return None
    requests = 1 if shape == "request" else 2
    pages_each = min(2, num_pages // requests)
    runs = [
        draw(_ints(1, pages_each * spec.token_page_size), label="request tokens")
        for _ in range(requests)
    ]
    ranks = spec.dcp_size
    return (*(-(-run // ranks) * ranks for run in runs[:-1]), runs[-1])


# --- valid operations --------------------------------------------------------------------


@st.composite
def _write_kv_ops(
    draw: st.DrawFn,
    spec: PoolSpec,
    locs: tuple[int, ...] | None,
    layer_ids: tuple[int, ...] | None,
    extra_k_bytes: int,
) -> WriteKV:
    if spec.quantized:
        return draw(_quant_write_kv_ops(spec, locs, layer_ids, extra_k_bytes > 0, cast=False))
    layer_id = draw(choice(layer_ids or tuple(spec.layer_ids)), label="layer_id")
    if locs is None:
        locs = _draw_locs(draw, spec, slots=spec.num_slots)
    k_bytes, v_bytes = row_bytes(spec)
    k_rows = draw(payload_rows(spec.dtype, len(locs), k_bytes + extra_k_bytes), label="k_rows")
    v_rows = draw(payload_rows(spec.dtype, len(locs), v_bytes), label="v_rows") if v_bytes else ()
    override = _draw_override(draw)
    return WriteKV(layer_id=layer_id, locs=locs, k_rows=k_rows, v_rows=v_rows, override=override)


def _draw_override(draw: st.DrawFn) -> bool:
    """Whether a write names its layer by ``layer_id_override`` (shrinks to
    ``layer.layer_id``): SGLang's SWA pool writes MHA, MLA and DSA layers that way. Two
    chances in three: inside state machines Hypothesis favours the first value, so an even
    choice came out at one write in nine to one in two (``python tools/call_counts.py``)."""
    return bool(draw(choice((False, True)), label="layer_id_override"))


# --- quantized pools' payloads ---------------------------------------------------------------

#: Values a quantized pool's payloads take: multiples of 1/4 up to 8, their negatives and
#: zero (1.0 first: a shrunk row still shows), each row scaled by a power of two. Every
#: encoder rounds them as SGLang's kernels do: no block maximum over 6 (or 448) lies just
#: above a power of two, and rounding ties (0.25, 1.25, 2.5, 5 over a power of two) occur.
QUANT_VALUES: tuple[float, ...] = (
    1.0,
    *(i / 4 for i in range(1, 33) if i != 4),
    *(-i / 4 for i in range(1, 33)),
    0.0,
)
#: Powers of two a quantized payload row is scaled by (exponents; 0 is the shrink target).
QUANT_POWERS: tuple[int, int] = (-6, 6)
#: e8m0 scale bytes MXFP8's callers pass: any exponent but 0xFF (NaN).
_E8M0_BYTES = 254


def float_row_bytes(values: tuple[float, ...], dtype: str) -> bytes:
    """Little-endian bytes of ``values`` (each exact in ``dtype``: bf16, fp16 or fp32).

    Example:
        >>> float_row_bytes((1.0, -2.0), "bfloat16").hex()
        '803f00c0'
    """
    array = np.array(values, dtype=np.float32)
    if dtype == "bfloat16":
        return (array.view(np.uint32) >> 16).astype("<u2").tobytes()
    return array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()


@st.composite
def _quant_rows(draw: st.DrawFn, count: int, values: int, dtype: str) -> tuple[bytes, ...]:
    rows = []
    for _ in range(count):
        start = draw(_ints(0, len(QUANT_VALUES) - 1), label="first value")
        step = draw(_ints(0, len(QUANT_VALUES) - 1), label="value step")
        power = 2.0 ** draw(_ints(*QUANT_POWERS), label="power of two")
        row = tuple(
            QUANT_VALUES[(start + step * i) % len(QUANT_VALUES)] * power for i in range(values)
        )
        rows.append(float_row_bytes(row, dtype))
    return tuple(rows)


@functools.lru_cache(maxsize=1024)
def quant_rows(count: int, values: int, dtype: str) -> st.SearchStrategy[tuple[bytes, ...]]:
    """``count`` rows of ``values`` payload values for a quantized pool, in ``dtype`` (see
    :data:`QUANT_VALUES`): three choices per row. Shrinks towards rows of 1.0."""
    return _quant_rows(count, values, dtype)


@st.composite
def _e8m0_rows(draw: st.DrawFn, count: int, row_bytes: int) -> tuple[bytes, ...]:
    rows = []
    for _ in range(count):
        start = draw(_ints(0, _E8M0_BYTES - 1), label="first scale")
        step = draw(_ints(0, _E8M0_BYTES - 1), label="scale step")
        rows.append(bytes(1 + (start + step * i) % _E8M0_BYTES for i in range(row_bytes)))
    return tuple(rows)


@st.composite
def _quant_write_kv_ops(
    draw: st.DrawFn,
    spec: PoolSpec,
    locs: tuple[int, ...] | None,
    layer_ids: tuple[int, ...] | None,
    too_long: bool,
    cast: bool,
) -> WriteKV:
    """A write to a quantized pool: bf16 rows it encodes (``cast``: fp16 or fp32 rows,
    with the caller's ``k_scale``/``v_scale``), or for MXFP8 fp8 rows with e8m0 scales
    (``cast``: float rows it encodes itself)."""
    layer_id = draw(choice(layer_ids or tuple(spec.layer_ids)), label="layer_id")
    if locs is None:
        locs = _draw_locs(draw, spec, slots=spec.num_slots)
    override = _draw_override(draw)
    k_values, v_values = row_elements(spec)
    heads = spec.head_num if spec.family == "mha" else 1
    extra = heads if too_long else 0  # one value more per head: an invalid write
    if spec.kv_quant == "mxfp8" and not cast:
        k_rows = draw(payload_rows("float8_e4m3fn", len(locs), k_values + extra), label="k_rows")
        v_rows = draw(payload_rows("float8_e4m3fn", len(locs), v_values), label="v_rows")
        payload = Payload(
            dtype="float8_e4m3fn",
            k_rows=k_rows,
            v_rows=v_rows,
            k_scale_rows=draw(_e8m0_rows(len(locs), k_values // 32), label="k scales"),
            v_scale_rows=draw(_e8m0_rows(len(locs), v_values // 32), label="v scales"),
        )
        return WriteKV(layer_id=layer_id, locs=locs, k_rows=(), payload=payload, override=override)
    dtype = draw(choice(("float16", "float32")), label="dtype") if cast else "bfloat16"
    scaled = cast and spec.kv_quant in ("cpu_fp8", "fp4_mx_block16", "nvfp4")
    k_scale = draw(choice(CAST_SCALES), label="k_scale") if scaled else None
    v_scale = draw(choice(CAST_SCALES), label="v_scale") if scaled else None
    k_rows = draw(quant_rows(len(locs), k_values + extra, dtype), label="k_rows")
    v_rows = draw(quant_rows(len(locs), v_values, dtype), label="v_rows") if v_values else ()
    payload = Payload(dtype=dtype, k_rows=k_rows, v_rows=v_rows, k_scale=k_scale, v_scale=v_scale)
    return WriteKV(layer_id=layer_id, locs=locs, k_rows=(), payload=payload, override=override)


@functools.lru_cache(maxsize=4096)
def write_kv_ops(
    spec: PoolSpec,
    *,
    locs: tuple[int, ...] | None = None,
    layer_ids: tuple[int, ...] | None = None,
    extra_k_bytes: int = 0,
) -> st.SearchStrategy[WriteKV]:
    """``set_kv_buffer`` of 1-4 tokens (or ``locs``) on one layer (of ``layer_ids``), in the
    pool's dtype; ``extra_k_bytes`` lengthens every K row, making the write invalid.

    Shrinks towards one token at slot 0 of the lowest layer with rows of ``0x01`` bytes.
    """
    return _write_kv_ops(_checked(spec), locs, layer_ids, extra_k_bytes)


@st.composite
def _cast_rows(
    draw: st.DrawFn, count: int, values: int, stored: str, caller: str, scale: float | None
) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """(bytes the pool must store, bytes the caller passes) for ``count`` rows."""
    stored_rows, caller_rows = [], []
    for _ in range(count):
        start = draw(_ints(0, len(EXACT_VALUES) - 1), label="first value")
        step = draw(_ints(0, len(EXACT_VALUES) - 1), label="value step")
        row = _exact_row(start, step, values)
        caller_rows.append(b"".join(value_bytes(value, caller) for value in row))
        divided = row if scale is None else tuple(value / scale for value in row)
        stored_rows.append(b"".join(value_bytes(value, stored) for value in divided))
    return tuple(stored_rows), tuple(caller_rows)


@st.composite
def _cast_write_kv_ops(draw: st.DrawFn, spec: PoolSpec, scales: bool) -> WriteKV:
    layer_id = draw(choice(tuple(spec.layer_ids)), label="layer_id")
    locs = _draw_locs(draw, spec, slots=spec.num_slots)
    caller = draw(choice(tuple(d for d in CALLER_DTYPES if d != spec.dtype)), label="dtype")
    k_values, v_values = row_elements(spec)
    # SGLang's MLA/DSA writes convert without scales; MHA divides by them first (fp8
    # with per-tensor scales: always).
    scaled = scales and spec.family in ("mha", "noop")
    options = CAST_SCALES[1:] if spec.kv_quant == "fp8_scaled" else CAST_SCALES
    k_scale = draw(choice(options), label="k_scale") if scaled else None
    v_scale = draw(choice(options), label="v_scale") if scaled else None
    k_rows, k_payload = draw(_cast_rows(len(locs), k_values, spec.dtype, caller, k_scale))
    v_rows: tuple[bytes, ...] = ()
    v_payload: tuple[bytes, ...] = ()
    if v_values:
        v_rows, v_payload = draw(_cast_rows(len(locs), v_values, spec.dtype, caller, v_scale))
    payload = Payload(
        dtype=caller, k_rows=k_payload, v_rows=v_payload, k_scale=k_scale, v_scale=v_scale
    )
    return WriteKV(layer_id=layer_id, locs=locs, k_rows=k_rows, v_rows=v_rows, payload=payload)


@functools.lru_cache(maxsize=4096)
def cast_write_kv_ops(spec: PoolSpec, *, scales: bool = True) -> st.SearchStrategy[WriteKV]:
    """``set_kv_buffer`` with the caller's payload in another dtype (bf16, fp16 or fp32,
    never the pool's), which the pool converts; MHA/NoOp writes carry ``k_scale`` and
    ``v_scale`` (None, 2, 0.5 or 1) that divide the values first, as SGLang does. Values
    come from :data:`EXACT_VALUES`, so the stored bytes (``k_rows``/``v_rows``) are exact.
    On a quantized pool: fp16 or fp32 rows of :data:`QUANT_VALUES` it encodes, with scales
    where its quant method reads them (MXFP8: float rows it quantizes itself).

    ``scales=False`` never passes scales; an ``fp8_scaled`` pool always gets them. Shrinks
    towards one token at slot 0 of the lowest layer, values 1.0, no scales.
    """
    checked = _checked(spec)
    if checked.quantized:
        return _quant_write_kv_ops(checked, None, None, False, cast=True)
    return _cast_write_kv_ops(checked, scales)


@st.composite
def _write_mla_ops(draw: st.DrawFn, spec: PoolSpec, padding_slot: bool) -> WriteMLA:
    layer_id = draw(choice(tuple(spec.layer_ids)), label="layer_id")
    locs = _draw_locs(draw, spec)
    if not padding_slot and 0 in locs:
        # Slot 0 becomes the lowest free slot (or is dropped when none is free).
        free = sorted(set(range(1, spec.token_slots)) - set(locs))
        locs = (
            tuple(free[0] if loc == 0 else loc for loc in locs)
            if free
            else tuple(loc for loc in locs if loc)
        )
    if spec.quantized:  # FP4: bf16 parts the pool encodes
        nope = draw(quant_rows(len(locs), spec.kv_lora_rank, "bfloat16"), label="nope")
        rope = draw(quant_rows(len(locs), spec.qk_rope_head_dim, "bfloat16"), label="rope")
        override = _draw_override(draw)
        return WriteMLA(layer_id, locs, nope, rope, dtype="bfloat16", override=override)
    # A scaled latent row is quantized from bf16 parts; a raw one takes the pool's dtype.
    dtype = "bfloat16" if spec.latent_layout == "scaled" else spec.dtype
    itemsize = DTYPE_ITEMSIZE[dtype]
    if spec.latent_layout == "scaled":
        # Each block of 128 values its own sequence, so that blocks get different scales
        # (one sequence repeats every 256 bytes: two blocks would be equal).
        blocks = [
            draw(payload_rows(dtype, len(locs), DSA_QUANT_BLOCK * itemsize), label="nope block")
            for _ in range(spec.kv_lora_rank // DSA_QUANT_BLOCK)
        ]
        nope = tuple(b"".join(parts) for parts in zip(*blocks, strict=True))
    else:
        nope = draw(payload_rows(dtype, len(locs), spec.kv_lora_rank * itemsize), label="nope")
    rope = draw(payload_rows(dtype, len(locs), spec.qk_rope_head_dim * itemsize), label="rope")
    return WriteMLA(
        layer_id=layer_id,
        locs=locs,
        nope_rows=nope,
        rope_rows=rope,
        dtype=dtype if dtype != spec.dtype else None,
        override=_draw_override(draw),
    )


@functools.lru_cache(maxsize=4096)
def write_mla_ops(spec: PoolSpec, *, padding_slot: bool = True) -> st.SearchStrategy[WriteMLA]:
    """MLA/DSA ``set_mla_kv_buffer`` of 1-4 tokens: the nope and rope parts of each latent
    row, in the pool's dtype (bfloat16 for a scaled latent layout, which quantizes them);
    ``padding_slot=False`` never targets slot 0. Shrinks
    towards one token at slot 0 (else 1) of the lowest layer."""
    checked = _checked(spec)
    if checked.family not in ("mla", "dsa"):
        raise InvalidArgument(f"spec.family={checked.family!r}: set_mla_kv_buffer is MLA/DSA")
    if not padding_slot and checked.num_slots < 2:
        raise InvalidArgument(f"spec.num_slots={checked.num_slots}: no slot besides 0")
    return _write_mla_ops(checked, padding_slot)


@st.composite
def _write_prefix_valid_ops(draw: st.DrawFn, spec: PoolSpec) -> WritePrefixValid:
    layer_id = draw(choice(tuple(spec.layer_ids)), label="layer_id")
    batch = draw(_ints(1, 2), label="batch")
    width = draw(_ints(1, max(1, min(2, spec.num_slots // batch))), label="width")
    cells = _draw_locs(draw, spec, count=batch * width)
    grid = tuple(cells[row * width : (row + 1) * width] for row in range(batch))
    commits = tuple(draw(_ints(0, width), label="commit_len") for _ in range(batch))
    if spec.quantized:  # bf16 rows the pool encodes
        k_values, v_values = row_elements(spec)
        return WritePrefixValid(
            layer_id=layer_id,
            loc_grid=grid,
            commit_lens=commits,
            k_rows=draw(quant_rows(len(cells), k_values, "bfloat16"), label="k_rows"),
            v_rows=draw(quant_rows(len(cells), v_values, "bfloat16"), label="v_rows"),
            dtype="bfloat16",
        )
    k_bytes, v_bytes = row_bytes(spec)
    k_rows = draw(payload_rows(spec.dtype, len(cells), k_bytes), label="k_rows")
    v_rows = draw(payload_rows(spec.dtype, len(cells), v_bytes), label="v_rows")
    return WritePrefixValid(
        layer_id=layer_id, loc_grid=grid, commit_lens=commits, k_rows=k_rows, v_rows=v_rows
    )


@functools.lru_cache(maxsize=4096)
def write_prefix_valid_ops(spec: PoolSpec) -> st.SearchStrategy[WritePrefixValid]:
    """MHA ``set_kv_buffer_prefix_valid``: a 1-2 by 1-2 grid of distinct slots whose rows
    commit 0..width cells each (uncommitted cells are passed but must not be written).
    Shrinks towards a 1x1 grid at slot 0 that commits nothing."""
    checked = _checked(spec)
    if checked.family not in ("mha", "noop"):
        raise InvalidArgument(
            f"spec.family={checked.family!r}: set_kv_buffer_prefix_valid is MHA's"
        )
    return _write_prefix_valid_ops(checked)


@st.composite
def _write_index_k_ops(draw: st.DrawFn, spec: PoolSpec, layer_ids: tuple[int, ...]) -> WriteIndexK:
    layer_id = draw(choice(layer_ids), label="layer_id")
    locs = _draw_locs(draw, spec, slots=spec.index_slots)
    dim = spec.index_head_dim
    keys = draw(payload_rows("float8_e4m3fn", len(locs), index_k_row_bytes(dim)), label="keys")
    scales = draw(payload_rows("float32", len(locs), index_scale_row_bytes(dim)), label="scales")
    return WriteIndexK(layer_id=layer_id, locs=locs, key_rows=keys, scale_rows=scales)


@functools.lru_cache(maxsize=4096)
def write_index_k_ops(
    spec: PoolSpec, *, layer_ids: tuple[int, ...]
) -> st.SearchStrategy[WriteIndexK]:
    """DSA ``set_index_k_scale_buffer`` of 1-4 index slots (token ids; with an index kpool
    the slots of token groups) on one of ``layer_ids`` (fp8 keys, fp32 scales, all
    finite). Shrinks towards one token at slot 0 of ``layer_ids[0]``."""
    if not layer_ids:
        raise InvalidArgument(f"layer_ids={layer_ids!r} must name at least one layer")
    return _write_index_k_ops(_checked(spec), layer_ids)


@st.composite
def _write_compress_tail_ops(
    draw: st.DrawFn, spec: PoolSpec, layer_ids: tuple[int, ...], extra_rows: int
) -> WriteCompressTail:
    layer_id = draw(choice(layer_ids), label="layer_id")
    request = _draw_crowded(draw, spec.tail_requests, "request slot")
    count = draw(_ints(1, spec.tail_width), label="n_remain") + extra_rows
    # Starts past the ring's end wrap around, as a request's logical positions do.
    start = draw(_ints(0, 2 * spec.tail_width + 1), label="dst_logical_start")
    row = spec.index_head_dim * COMPRESS_TAIL_ITEMSIZE
    keys = draw(payload_rows("bfloat16", count, row), label="key tail")
    scores = draw(payload_rows("bfloat16", count, row), label="score tail")
    return WriteCompressTail(
        layer_id=layer_id, req_pool_idx=request, key_rows=keys, score_rows=scores, start=start
    )


@functools.lru_cache(maxsize=4096)
def write_compress_tail_ops(
    spec: PoolSpec, *, layer_ids: tuple[int, ...] | None = None, extra_rows: int = 0
) -> st.SearchStrategy[WriteCompressTail]:
    """DSA ``set_compress_tail_for_request``: 1 to ``tail_width`` bf16 key and score rows
    for one request slot (often a crowded one) on one of ``layer_ids`` (default: the
    layers that keep tails), at a ring start that often wraps; ``extra_rows`` more rows
    than drawn (an invalid, too-long tail).
    Shrinks towards one row for request 0 at start 0 of ``layer_ids[0]``.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1, dtype="bfloat16",
        ...                 index_kpool=2, index_kpool_compress=True, max_running_requests=1)
        >>> op = find(write_compress_tail_ops(spec, layer_ids=(0,)), lambda op: True)
        >>> op.req_pool_idx, op.start, len(op.key_rows), len(op.key_rows[0])
        (0, 0, 1, 256)
    """
    checked = _checked(spec)
    if not checked.compress_tails:
        raise InvalidArgument(f"spec {checked.variant!r} keeps no compress tails")
    if layer_ids is None:
        layer_ids = indexed_layers(checked, skip=False)
    if not layer_ids:
        raise InvalidArgument(f"layer_ids={layer_ids!r} must name at least one layer")
    return _write_compress_tail_ops(checked, layer_ids, extra_rows)


def _draw_request(draw: st.DrawFn, spec: PoolSpec, requests: bool) -> int | None:
    """A host copy's request slot: none, or (on a pool with tails, ``requests`` true) in
    two copies of three, as retraction always names one (shrinks to none)."""
    if not (requests and spec.compress_tails) or not draw(MOSTLY_TRUE, label="with a request slot"):
        return None
    return _draw_crowded(draw, spec.tail_requests, "request slot")


@st.composite
def _move_ops(draw: st.DrawFn, spec: PoolSpec) -> Move:
    if draw(choice((False,) * 7 + (True,)), label="empty move"):
        return Move(tgt=(), src=())
    window = _draw_locs(draw, spec, min_size=min(2, spec.num_slots))
    count = draw(_ints(1, len(window)), label="count")
    tgt = tuple(draw(_permutations(window), label="targets")[:count])
    if spec.dcp_size == 1:
        src = tuple(draw(_choices(window, count), label="sources"))
        return Move(tgt=tgt, src=src)
    # Under DCP a rank moves only its own rows: each source shares its target's rank.
    ranks = spec.dcp_size
    src = tuple(
        draw(choice(tuple(w for w in window if w % ranks == t % ranks)), label="source")
        for t in tgt
    )
    return Move(tgt=tgt, src=src)


@functools.lru_cache(maxsize=1024)
def move_ops(spec: PoolSpec) -> st.SearchStrategy[Move]:
    """A move inside one small window of slots: distinct targets, sources that repeat and
    overlap targets often; about one move in eight is empty (a no-op). Under decode
    context parallel the slots are widened ids and each source shares its target's rank.
    Shrinks towards a one-token move inside the first slots."""
    return _move_ops(_checked(spec))


@st.composite
def _host_copy_ops(
    draw: st.DrawFn, spec: PoolSpec, name: str, whole_pages: bool, requests: bool
) -> HostCopy:
    if whole_pages:
        runs = draw(_ints(1, min(2, spec.num_slots // spec.page_size)), label="requests")
        layout: CopyLayout = tuple(spec.token_page_size for _ in range(runs))
    else:
        layout = _draw_copy_layout(draw, spec)
    indices = _draw_locs(draw, spec) if layout is None else _draw_runs(draw, spec, layout)
    request = _draw_request(draw, spec, requests)
    return HostCopy(name=name, indices=indices, req_pool_index=request)


@functools.lru_cache(maxsize=4096)
def host_copy_ops(
    spec: PoolSpec, name: str, *, whole_pages: bool = False, requests: bool = True
) -> st.SearchStrategy[HostCopy]:
    """``get_cpu_copy`` remembered under ``name``: about a third each of one request's
    slots (page-aligned: whole pages, then a partial last page), two requests' slots at
    once, and 1-4 arbitrary tokens; with ``whole_pages`` one or two whole pages only.
    Under decode context parallel pages are widened (``page_size * dcp_size`` ids), there
    are no arbitrary tokens, and a run followed by another holds whole groups of
    ``dcp_size`` ids, as SGLang's ``maybe_dcp_kernel_indices`` requires.
    On a DSA pool with compress tails, two copies in three also name a request slot (none
    with ``requests=False``).
    Use :func:`copy_layout` on the op to draw a matching reload.
    Shrinks towards one request holding the first slot of the first page drawn."""
    return _host_copy_ops(_checked(spec), name, whole_pages, requests)


def copy_layout(spec: PoolSpec, indices: tuple[int, ...]) -> CopyLayout:
    """The :data:`CopyLayout` of a host copy's ``indices``: page-aligned runs on whole
    pages, else None (a capacity that is not whole pages leaves a partial last page, which
    no request is given).

    Example:
        >>> spec = PoolSpec(family="dsa", size=8, page_size=2, layer_num=1, dtype="bfloat16")
        >>> copy_layout(spec, (4, 5, 6, 0)), copy_layout(spec, (1, 2))
        ((3, 1), None)
        >>> copy_layout(PoolSpec(family="mla", size=2, page_size=3, layer_num=1,
        ...                      dtype="bfloat16"), (0, 3))
    """
    page_size = spec.token_page_size
    whole_pages_end = spec.token_slots // page_size * page_size
    runs: list[int] = []
    previous = None
    for slot in indices:
        if slot >= whole_pages_end:
            return None
        if previous is not None and slot == previous + 1:
            runs[-1] += 1
        elif slot % page_size == 0:
            runs.append(1)
        else:
            return None
        previous = slot
    return tuple(runs) or None


@st.composite
def _host_reload_ops(
    draw: st.DrawFn,
    spec: PoolSpec,
    copies: tuple[tuple[str, int, CopyLayout], ...],
    requests: bool,
) -> HostReload:
    name, count, layout = draw(choice(copies), label="copy")
    if layout is None:
        indices = _draw_locs(draw, spec, count=count)
    else:
        indices = _draw_runs(draw, spec, layout)
    request = _draw_request(draw, spec, requests)
    return HostReload(name=name, indices=indices, req_pool_index=request)


def host_reload_ops(
    spec: PoolSpec, copies: Mapping[str, tuple[int, CopyLayout]], *, requests: bool = True
) -> st.SearchStrategy[HostReload]:
    """``load_cpu_copy`` of one of ``copies`` (name -> (copied tokens, layout), in the order
    they were taken) to the same or other slots of the same shape: a request's copy goes
    back to page-aligned runs of the same lengths, as the scheduler reloads a retracted
    request into newly allocated pages (on a DSA pool with tails, two reloads in three name a
    request slot, which may differ from the copy's; none with ``requests=False``).
    Shrinks towards the first copy."""
    if not copies:
        raise InvalidArgument("copies must name at least one host copy")
    items = tuple((name, count, layout) for name, (count, layout) in copies.items())
    return _cached_host_reload_ops(_checked(spec), items, requests)


@functools.lru_cache(maxsize=4096)
def _cached_host_reload_ops(
    spec: PoolSpec, copies: tuple[tuple[str, int, CopyLayout], ...], requests: bool
) -> st.SearchStrategy[HostReload]:
    return _host_reload_ops(spec, copies, requests)


# --- invalid operations ------------------------------------------------------------------

#: Kinds of invalid operation, each with the capabilities it needs.
INVALID_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("write_loc_out_of_range", ()),
    ("write_loc_repeated", ()),
    ("write_row_too_long", ()),
    ("write_layer_out_of_range", ()),
    ("move_length_mismatch", ("move",)),
    ("move_target_repeated", ("move",)),
    ("move_target_out_of_range", ("move",)),
    ("index_k_to_skip_layer", ("index_k_write",)),
    ("compress_tail_too_long", ("compress_tail",)),
    ("compress_tail_request_out_of_range", ("compress_tail",)),
    ("compress_tail_to_skip_layer", ("compress_tail",)),
    ("reload_length_mismatch", ("host_copy",)),
)


def _invalid_kinds(
    spec: PoolSpec, copies: tuple[tuple[str, int], ...], skipped: frozenset[str]
) -> tuple[str, ...]:
    # reload_length_mismatch comes last: it appears once a copy exists, and being last it
    # does not shift the other kinds' indices when it does.
    tails = spec.compress_tails and bool(indexed_layers(spec, skip=False))
    possible = {
        "index_k_to_skip_layer": bool(indexed_layers(spec, skip=True)),
        "compress_tail_too_long": tails,
        "compress_tail_request_out_of_range": tails,
        "compress_tail_to_skip_layer": spec.compress_tails
        and bool(indexed_layers(spec, skip=True)),
        "reload_length_mismatch": bool(copies),
    }
    return tuple(
        kind
        for kind, needs in INVALID_KINDS
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
    limit = spec.token_slots
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
    if kind.startswith("compress_tail"):
        skip = kind == "compress_tail_to_skip_layer"
        layers = indexed_layers(spec, skip=skip)
        extra = 1 if kind == "compress_tail_too_long" else 0
        op = draw(write_compress_tail_ops(spec, layer_ids=layers, extra_rows=extra))
        if kind == "compress_tail_request_out_of_range":
            bad = draw(choice((spec.tail_requests, -1)), label="bad request slot")
            op = dataclasses.replace(op, req_pool_idx=bad)
        return op
    name, count = draw(choice(copies), label="copy")
    wrong = draw(choice((count - 1, *((count + 1,) if count < limit else ()))), label="count")
    return HostReload(name=name, indices=tuple(range(wrong)))


def invalid_ops(
    spec: PoolSpec, copies: Mapping[str, int], *, skipped: frozenset[str] = frozenset()
) -> st.SearchStrategy[Op]:
    """Operations the hardening contract rejects with ``ValueError``: out-of-range or
    repeated locations, K rows one head-dim element too long, layers outside the pool,
    bad moves, index-K writes to skip layers, compress tails too long, for a request slot
    outside the tails or to a skip layer, reloads of the wrong length (``copies``:
    name -> copied tokens). On NoOp some of these are accepted moves:
    :meth:`ReferencePool.expected_error` is the authority.

    ``skipped`` capabilities (``move``, ``host_copy``, ``index_k_write``,
    ``compress_tail``) are left out.
    Shrinks towards the first kind, an out-of-range slot after no others.
    """
    return _cached_invalid_ops(_checked(spec), tuple(copies.items()), frozenset(skipped))


@functools.lru_cache(maxsize=4096)
def _cached_invalid_ops(
    spec: PoolSpec, copies: tuple[tuple[str, int], ...], skipped: frozenset[str]
) -> st.SearchStrategy[Op]:
    return _invalid_ops(spec, copies, skipped)


def _checked(spec: Any) -> PoolSpec:
    return check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec")
