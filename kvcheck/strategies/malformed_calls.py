"""Pool calls as tensors: malformed calls every pool must reject, and calls on the no-op pool.

:func:`bad_calls` draws calls the :mod:`kvcheck.specs` vocabulary cannot express (float
or 2-D locations, wrong dtypes, a valid K beside a malformed V, ...), for
:func:`kvcheck.properties.inputs.assert_rejected_call_changes_nothing`.
:func:`noop_write_calls` and :func:`noop_move_arguments` draw the arguments the no-op
pool's properties (:mod:`kvcheck.properties.noop`) take. Every valid write starts from
:func:`kvcheck.strategies.ops.write_kv_ops`, the one write generator.

Example:
    >>> from hypothesis import find
    >>> from kvcheck.specs import PoolSpec
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
    >>> find(bad_calls(spec, device="cpu"), lambda bad: True).kind
    'loc_float'
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from kvcheck.calls import NOOP_WRITE_METHODS, NoOpCall, PoolCall, loc_tensor, rows_tensor
from kvcheck.geometry import index_k_row_bytes, index_scale_row_bytes, latent_row_bytes
from kvcheck.specs import DSA_QUANT_BLOCK, PoolSpec, WriteKV
from kvcheck.strategies import ops as draws
from kvcheck.validation import check_choices, check_one_of, check_type

__all__ = [
    "BAD_CALL_KINDS",
    "BadCall",
    "bad_calls",
    "noop_move_arguments",
    "noop_write_calls",
]


# --- malformed calls -------------------------------------------------------------------------

#: Kinds of malformed call :func:`bad_calls` draws, by family group.
BAD_CALL_KINDS: dict[str, tuple[str, ...]] = {
    "common": (
        "loc_float",
        "loc_2d",
        "loc_int16",
        "loc_negative",
        "cache_k_wrong_dtype",
        "cache_k_extra_row",
        "layer_without_id",
        "move_tgt_float",
        "move_src_2d",
        "move_src_out_of_range",
        "copy_indices_float",
        "reload_not_a_copy",
    ),
    "mha": ("cache_v_wrong_shape", "cache_v_wrong_dtype"),
    "dsa": (
        "index_k_wrong_dtype",
        "index_scale_wrong_shape",
        "index_loc_out_of_range",
        "index_loc_repeated",
    ),
}


@dataclass(frozen=True)
class BadCall:
    """A malformed call the pool must reject with ``ValueError``, named by its ``kind``."""

    kind: str
    call: PoolCall

    def __repr__(self) -> str:
        args = ", ".join(_short(arg) for arg in self.call.args)
        return f"BadCall({self.kind!r}: {self.call.method}({args}))"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8:
            return f"tensor({value.tolist()}, dtype={value.dtype})"
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    return repr(value)


def _kinds(spec: PoolSpec) -> tuple[str, ...]:
    kinds = BAD_CALL_KINDS["common"]
    if spec.family == "mha":
        kinds += BAD_CALL_KINDS["mha"]
    if spec.family == "dsa" and draws.indexed_layers(spec, skip=False):
        kinds += BAD_CALL_KINDS["dsa"]
    return kinds


def _write_tensors(
    spec: PoolSpec, op: WriteKV, device: str
) -> tuple[SimpleNamespace, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(layer, loc, k, v) of ``set_kv_buffer`` for ``op`` (v is None for MLA/DSA)."""
    layer = SimpleNamespace(layer_id=op.layer_id)
    loc = loc_tensor(op.locs, device=device)
    dtype = getattr(torch, spec.dtype)
    latent = spec.family in ("mla", "dsa")
    # A latent row's values: its width, or a scaled fp8 row's bytes (one fp8 value each).
    latent_values = latent_row_bytes(spec) // spec.itemsize
    heads, k_dim = (1, latent_values) if latent else (spec.head_num, spec.head_dim)
    k = rows_tensor(op.k_rows, dtype=dtype, inner=(heads, k_dim), device=device)
    v = None
    if not latent:
        v = rows_tensor(
            op.v_rows, dtype=dtype, inner=(heads, spec.effective_v_head_dim), device=device
        )
    return layer, loc, k, v


@st.composite
def _bad_calls(draw: st.DrawFn, spec: PoolSpec, device: str) -> BadCall:
    kind = draw(st.sampled_from(_kinds(spec)), label="kind")
    op = draw(draws.write_kv_ops(spec), label="valid write")
    layer, loc, k, v = _write_tensors(spec, op, device)
    n = len(op.locs)

    def write(
        loc_arg: Any = loc, k_arg: Any = k, v_arg: Any = v, layer_arg: Any = layer
    ) -> PoolCall:
        return PoolCall("set_kv_buffer", (layer_arg, loc_arg, k_arg, v_arg))

    if kind == "loc_float":
        return BadCall(kind, write(loc_arg=loc.to(torch.float32)))
    if kind == "loc_2d":
        return BadCall(kind, write(loc_arg=loc.view(n, 1)))
    if kind == "loc_int16":
        return BadCall(kind, write(loc_arg=loc.to(torch.int16)))
    if kind == "loc_negative":
        bad = loc.clone()
        bad[draw(st.integers(0, n - 1), label="negative position")] = -1
        return BadCall(kind, write(loc_arg=bad))
    if kind == "cache_k_wrong_dtype":
        return BadCall(kind, write(k_arg=torch.zeros(k.shape, dtype=torch.float64, device=device)))
    if kind == "cache_k_extra_row":
        return BadCall(kind, write(k_arg=torch.cat([k, k[:1]])))
    if kind == "layer_without_id":
        return BadCall(kind, write(layer_arg=SimpleNamespace(id=op.layer_id)))
    if kind == "cache_v_wrong_shape":
        assert v is not None
        return BadCall(kind, write(v_arg=v[:, :, :-1] if v.shape[2] > 1 else torch.cat([v, v], 2)))
    if kind == "cache_v_wrong_dtype":
        assert v is not None
        return BadCall(kind, write(v_arg=v.to(torch.float64)))
    if kind.startswith("move_"):
        src = loc_tensor(op.locs[::-1], device=device)
        if kind == "move_tgt_float":
            return BadCall(kind, PoolCall("move_kv_cache", (loc.to(torch.float32), src)))
        if kind == "move_src_2d":
            return BadCall(kind, PoolCall("move_kv_cache", (loc, src.view(n, 1))))
        bad_src = src.clone()
        bad_src[-1] = spec.token_slots
        return BadCall(kind, PoolCall("move_kv_cache", (loc, bad_src)))
    if kind == "copy_indices_float":
        return BadCall(kind, PoolCall("get_cpu_copy", (loc.to(torch.float32),)))
    if kind == "reload_not_a_copy":
        return BadCall(kind, PoolCall("load_cpu_copy", ({"k": k}, loc)))
    return _bad_index_call(draw, spec, kind, loc, device)


def _bad_index_call(
    draw: st.DrawFn, spec: PoolSpec, kind: str, loc: torch.Tensor, device: str
) -> BadCall:
    layers = draws.indexed_layers(spec, skip=False)
    layer_id = draw(st.sampled_from(layers), label="index layer")
    n = loc.numel()
    dim = spec.index_head_dim
    keys = draw(draws.payload_rows("float8_e4m3fn", n, index_k_row_bytes(dim)), label="keys")
    scales = draw(draws.payload_rows("float32", n, index_scale_row_bytes(dim)), label="scales")
    key = rows_tensor(keys, dtype=torch.float8_e4m3fn, inner=(dim,), device=device)
    scale = rows_tensor(scales, dtype=torch.float32, inner=(dim // DSA_QUANT_BLOCK,), device=device)

    def index_write(loc_arg: Any = loc, key_arg: Any = key, scale_arg: Any = scale) -> PoolCall:
        return PoolCall("write_index_k", (layer_id, loc_arg, key_arg, scale_arg), via_target=True)

    if kind == "index_k_wrong_dtype":
        return BadCall(kind, index_write(key_arg=key.view(torch.uint8).to(torch.float16)))
    if kind == "index_scale_wrong_shape":
        return BadCall(kind, index_write(scale_arg=torch.cat([scale, scale[:1]])))
    if kind == "index_loc_out_of_range":
        bad = loc.clone()
        bad[-1] = spec.token_slots
        return BadCall(kind, index_write(loc_arg=bad))
    if n < 2:
        repeated = torch.cat([loc, loc])
        return BadCall(
            kind,
            index_write(
                loc_arg=repeated, key_arg=torch.cat([key, key]), scale_arg=torch.cat([scale, scale])
            ),
        )
    repeated = loc.clone()
    repeated[1] = repeated[0]
    return BadCall(kind, index_write(loc_arg=repeated))


def bad_calls(spec: PoolSpec, *, device: str = "cpu") -> st.SearchStrategy[BadCall]:
    """Malformed calls on a pool of ``spec`` (MHA, MLA or DSA) that must raise ``ValueError``.

    Each starts from a valid write of non-zero-able payloads and breaks one thing (see
    :data:`BAD_CALL_KINDS`): location dtype, rank or value; a payload's dtype or row count;
    the layer object; for MHA a malformed V beside a valid K; moves with a float target,
    a 2-D or out-of-range source; host copies with float indices or a non-copy; for DSA
    index-K writes with a wrong key dtype, a scale of the wrong shape beside valid keys,
    an out-of-range or repeated location. Tensors are built on ``device``.
    Shrinks towards the first kind, one token.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> bad = find(bad_calls(spec), lambda bad: bad.kind.startswith("index_"))
        >>> bad.kind, bad.call.method
        ('index_k_wrong_dtype', 'write_index_k')
    """
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec")
    check_one_of(spec.family, "spec.family", ("mha", "mla", "dsa"))
    check_type(str, device, "device", what="a device string such as 'cpu'")
    return _bad_calls(spec, device)


# --- calls on the no-op pool ----------------------------------------------------------------


def _garbage(device: str) -> st.SearchStrategy[Any]:
    """Values no pool would accept as an argument, and a few it would."""
    dtypes = st.sampled_from((torch.int64, torch.int32, torch.float32, torch.uint8))
    tensors = st.builds(
        lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device),
        st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple),
        dtypes,
    )
    return st.one_of(
        st.none(),
        st.integers(-3, 10),
        st.text(max_size=3),
        tensors,
        st.builds(SimpleNamespace, layer_id=st.integers(-1, 8)),
    )


#: Locations of a valid no-op write: about one in four is empty (no tokens), else 1-4 slots.
_NOOP_WRITE_LOCS: tuple[tuple[int, ...] | None, ...] = ((), None, None, None)


@st.composite
def _valid_write(draw: st.DrawFn, spec: PoolSpec, device: str) -> NoOpCall:
    """A ``set_kv_buffer`` any MHA pool of ``spec`` would accept."""
    locs = draw(draws.choice(_NOOP_WRITE_LOCS), label="empty write")
    op = draw(draws.write_kv_ops(spec, locs=locs), label="valid write")
    return NoOpCall("set_kv_buffer", _write_tensors(spec, op, device), {})


def noop_write_calls(
    spec: PoolSpec, *, device: str = "cpu", methods: tuple[str, ...] = NOOP_WRITE_METHODS
) -> st.SearchStrategy[NoOpCall]:
    """Write calls on a no-op pool of ``spec``: valid ``set_kv_buffer`` calls, valid-looking
    ``load_cpu_copy`` calls, and either method with arbitrary positional and keyword
    arguments, for the write ``methods`` given (of :data:`NOOP_WRITE_METHODS`). Tensors are
    built on ``device``. Shrinks towards a valid write of no tokens to the lowest layer.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="noop", size=4, page_size=2, layer_num=1, dtype="float16",
        ...                 head_dim=1)
        >>> find(noop_write_calls(spec), lambda call: True)
        pool.set_kv_buffer(namespace(layer_id=0), tensor([], dtype=torch.int64), \
tensor([], size=(0, 1, 1), dtype=torch.float16), tensor([], size=(0, 1, 1), dtype=torch.float16))
    """
    _check_noop_spec(spec, device)
    methods = check_choices(methods, "methods", NOOP_WRITE_METHODS)
    garbage = _garbage(device)
    arbitrary = st.builds(
        NoOpCall,
        st.sampled_from(methods),
        st.lists(garbage, max_size=5).map(tuple),
        st.dictionaries(
            st.sampled_from(
                ("layer", "loc", "cache_k", "cache_v", "k_scale", "indices", "kv_cache_cpu")
            ),
            garbage,
            max_size=3,
        ),
    )
    reload = st.lists(st.integers(0, spec.num_slots - 1), max_size=4, unique=True).map(
        lambda locs: NoOpCall("load_cpu_copy", (None, loc_tensor(locs, device=device)), {})
    )
    choices = [arbitrary]
    if "set_kv_buffer" in methods:
        choices.insert(0, _valid_write(spec, device))
    if "load_cpu_copy" in methods:
        choices.insert(1, reload)
    return st.one_of(*choices)


@st.composite
def _move_arguments(
    draw: st.DrawFn, spec: PoolSpec, device: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    form = draw(st.sampled_from(("positional", "keywords")), label="form")
    count = draw(st.integers(0, min(4, spec.num_slots)), label="count")
    slots = st.integers(0, spec.num_slots - 1)
    tgt_slots = draw(st.lists(slots, min_size=count, max_size=count, unique=True), label="tgt")
    src_slots = draw(st.lists(slots, min_size=count, max_size=count), label="src")
    tgt = loc_tensor(tgt_slots, device=device)
    src = loc_tensor(src_slots, device=device)
    if form == "positional":
        return (tgt, src), {}
    return (), {"tgt_loc": tgt, "src_loc": src}


def noop_move_arguments(
    spec: PoolSpec, *, device: str = "cpu"
) -> st.SearchStrategy[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` for a valid ``move_kv_cache(tgt_loc, src_loc)`` on a no-op pool:
    the two location tensors SGLang's callers pass (distinct targets, sources that may
    repeat, anywhere in ``[0, size + page_size)``), by position or by keyword. (Malformed
    moves are hardening: the no-op pool refuses them with ValueError like any pool.)
    Shrinks towards an empty positional move.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="noop", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> find(noop_move_arguments(spec), lambda arguments: bool(arguments[1]))
        ((), {'tgt_loc': tensor([], dtype=torch.int64), 'src_loc': tensor([], dtype=torch.int64)})
    """
    _check_noop_spec(spec, device)
    return _move_arguments(spec, device)


def _check_noop_spec(spec: Any, device: Any) -> None:
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec")
    check_one_of(spec.family, "spec.family", ("noop",))
    check_type(str, device, "device", what="a device string such as 'cpu'")
