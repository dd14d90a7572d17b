"""Pool calls: :mod:`kvcheck.specs` operations as the method calls a pool receives.

The one encoder of an operation: :func:`plan_call` says, for an op on a pool built from a
spec, which method SGLang's caller calls and with which arguments, each as data (a
:class:`CallPlan` of :class:`Arg`\\ s: tensors by their bytes, rows and dtype
(:class:`Rows`) or values (:class:`Ints`), a :class:`Layer`, an earlier host copy
(:class:`HostCopyRef`), a plain value). From it :func:`build_call` makes the tensors on a
device (:func:`encode_op`, run by :func:`run_call`: what the machines and the properties
call) and :mod:`kvcheck.runner.repro` writes the source of a reproduction script's call,
so the two cannot drift. The specs describe payloads as raw bytes so that the reference
model needs no dtype semantics; here those bytes become tensors of the pool's dtype (fp8
payloads as fp8 views of the bytes), and each operation the call SGLang makes:
``set_kv_buffer``, ``set_mla_kv_buffer``, ``set_kv_buffer_prefix_valid``,
``target.write_index_k``, ``set_compress_tail_for_request``, ``move_kv_cache``,
``get_cpu_copy`` and ``load_cpu_copy``. Strategies draw calls from here and the
properties (:mod:`kvcheck.properties.apply`) apply them.

Example:
    >>> from kvcheck.specs import Move, PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> call = encode_op(spec, Move(tgt=(1,), src=(2,)), device="cpu", copies={})
    >>> call.method, describe_op(Move(tgt=(1,), src=(2,)))
    ('move_kv_cache', 'pool.move_kv_cache(tgt_loc=[1], src_loc=[2])')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvcheck.geometry import latent_width
from kvcheck.specs import (
    DSA_QUANT_BLOCK,
    QUANT_BLOCKS,
    HostCopy,
    HostReload,
    Move,
    Op,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)

__all__ = [
    "NOOP_WRITE_METHODS",
    "Arg",
    "ArgValue",
    "CallPlan",
    "HostCopyRef",
    "Ints",
    "Layer",
    "NoOpCall",
    "OpEncodingError",
    "PoolCall",
    "Rows",
    "build_call",
    "build_value",
    "describe_op",
    "encode_op",
    "loc_tensor",
    "op_method",
    "plan_call",
    "request_kwargs",
    "rows_tensor",
    "run_call",
]

#: Pool methods that write: each must raise on the no-op pool.
NOOP_WRITE_METHODS: tuple[str, ...] = ("set_kv_buffer", "load_cpu_copy")

_METHODS: dict[type, str] = {
    WriteKV: "set_kv_buffer",
    WriteMLA: "set_mla_kv_buffer",
    WritePrefixValid: "set_kv_buffer_prefix_valid",
    WriteIndexK: "set_index_k_scale_buffer",
    WriteCompressTail: "set_compress_tail_for_request",
    Move: "move_kv_cache",
    HostCopy: "get_cpu_copy",
    HostReload: "load_cpu_copy",
}


def op_method(op: Op) -> str:
    """The SGLang pool method ``op`` stands for.

    Example:
        >>> op_method(Move(tgt=(), src=()))
        'move_kv_cache'
    """
    try:
        return _METHODS[type(op)]
    except KeyError:
        raise OpEncodingError(f"op={op!r} is not an operation from kvcheck.specs") from None


class OpEncodingError(TypeError):
    """An operation whose bytes cannot form the tensors of the call (a harness bug).

    Deliberately not a ``ValueError``: a pool's rejection of bad input must never be
    confused with the harness failing to build the input.
    """


@dataclass(frozen=True)
class PoolCall:
    """One pool call ready to run: ``method`` on the pool (or the target), with its arguments.

    ``via_target`` marks calls that go through the target (``target.write_index_k``) rather
    than a pool method; ``kwargs`` are keyword arguments (name, value), passed only when
    the operation sets them, so a pool without that parameter still takes the call.
    """

    method: str
    args: tuple[Any, ...]
    via_target: bool = False
    kwargs: tuple[tuple[str, Any], ...] = ()


def loc_tensor(locs: Sequence[int], *, device: str | torch.device) -> torch.Tensor:
    """Token locations as a 1-D ``int64`` tensor on ``device`` (values are not checked).

    Example:
        >>> loc_tensor((3, 1), device="cpu")
        tensor([3, 1])
    """
    return torch.tensor(list(locs), dtype=torch.int64, device=device)


def rows_tensor(
    rows: Sequence[bytes],
    *,
    dtype: torch.dtype,
    inner: tuple[int, ...],
    device: str | torch.device,
) -> torch.Tensor:
    """Stack raw row bytes into a ``[len(rows), *inner]`` tensor of ``dtype`` on ``device``.

    ``inner`` may hold one ``-1`` (derived from the row length) when there is at least one
    row; with no rows it must be explicit. Raises :class:`OpEncodingError` when the bytes do
    not fit the shape.

    Example:
        >>> rows_tensor((b"\\x00<", b"\\x00@"), dtype=torch.float16, inner=(1, -1),
        ...             device="cpu").flatten().tolist()
        [1.0, 2.0]
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not rows:
        if -1 in inner:
            raise OpEncodingError(f"inner={inner!r} needs explicit sizes when there are no rows")
        return torch.zeros((0, *inner), dtype=dtype, device=device)
    data = b"".join(rows)
    if not data:  # rows of no bytes (a zero-width rope part): torch cannot view them
        shape = tuple(0 if size == -1 else size for size in inner)
        return torch.zeros((len(rows), *shape), dtype=dtype, device=device)
    if len(data) % (itemsize * len(rows)):
        raise OpEncodingError(
            f"rows of {[len(row) for row in rows]} bytes do not hold whole {dtype} values"
        )
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        return raw.view(dtype).reshape(len(rows), *inner).to(device)
    except RuntimeError as exc:
        raise OpEncodingError(
            f"rows of {[len(row) for row in rows]} bytes do not fit shape "
            f"{(len(rows), *inner)} of {dtype}: {exc}"
        ) from None


# --- the call an operation stands for, as data ------------------------------------------


@dataclass(frozen=True)
class Rows:
    """A tensor made of raw row bytes: ``[len(rows), *inner]`` values of ``dtype`` (a torch
    dtype name), row ``i`` holding ``rows[i]``.

    ``inner`` is the shape the pool expects. Rows of another size are part of the call (the
    pool must refuse them), so :attr:`shape` then derives the last size from their length.
    """

    dtype: str
    inner: tuple[int, ...]
    rows: tuple[bytes, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """``inner``, or ``inner`` with its last size ``-1`` when a row is not of that size.

        Example:
            >>> [Rows("float16", (1, 2), (bytes(size),)).shape for size in (4, 6)]
            [(1, 2), (1, -1)]
        """
        size = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        if any(len(row) != size * math.prod(self.inner) for row in self.rows):
            return (*self.inner[:-1], -1)
        return self.inner


@dataclass(frozen=True)
class Ints:
    """An integer tensor of ``dtype`` holding ``values``: token locations (``int64``), a grid
    of them (a tuple of rows), or lengths (``int32``)."""

    values: tuple[int, ...] | tuple[tuple[int, ...], ...]
    dtype: str = "int64"

    @property
    def locations(self) -> bool:
        """Whether these are plain token locations: one ``int64`` row."""
        return self.dtype == "int64" and not any(isinstance(v, tuple) for v in self.values)


@dataclass(frozen=True)
class Layer:
    """The attention layer a write names: SGLang's pools read its global ``layer_id`` only."""

    layer_id: int


@dataclass(frozen=True)
class HostCopyRef:
    """What ``get_cpu_copy`` returned for the host copy taken under ``name``."""

    name: str


#: An argument's value: a tensor (:class:`Rows`, :class:`Ints`), a :class:`Layer`, an
#: earlier host copy, or a plain ``int``, ``float`` or ``None``.
ArgValue = Rows | Ints | Layer | HostCopyRef | int | float | None


@dataclass(frozen=True)
class Arg:
    """One argument of a call: SGLang's parameter ``name`` and its ``value``; ``keyword``
    passes it by name. ``note`` is a remark for a person reading the call (a reproduction
    script writes it as a comment); it is no part of the value."""

    name: str
    value: ArgValue
    keyword: bool = False
    note: str = ""


@dataclass(frozen=True)
class CallPlan:
    """The call an operation stands for: ``method`` of the pool (of the target, which takes
    the pool first, when ``via_target``) with ``args`` in order, keyword ones last.

    ``pool_method`` is the SGLang pool method it stands for (:func:`op_method`; ``method``
    but for a target's ``write_index_k``); ``keeps`` names the host copy the caller keeps
    the call's result as.
    """

    method: str
    args: tuple[Arg, ...]
    pool_method: str
    via_target: bool = False
    keeps: str | None = None


def plan_call(spec: PoolSpec, op: Op) -> CallPlan:
    """The call ``op`` stands for on a pool built from ``spec``, its arguments as data.

    Raises :class:`OpEncodingError` for anything but an operation of :mod:`kvcheck.specs`.

    Example:
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> plan = plan_call(spec, HostCopy("a", (1, 2), req_pool_index=3))
        >>> plan.method, plan.keeps, [(arg.name, arg.value, arg.keyword) for arg in plan.args]
        ('get_cpu_copy', 'a', [('indices', Ints(values=(1, 2), dtype='int64'), False), \
('req_pool_index', 3, True)])
    """
    method = op_method(op)
    if isinstance(op, WriteKV):
        return CallPlan(method, _write_kv_args(spec, op), method)
    if isinstance(op, WriteMLA):
        dtype = spec.dtype if op.dtype is None else op.dtype  # bf16 parts of a scaled row
        layer, override = _layer_args(op)
        nope = Rows(dtype, (1, spec.kv_lora_rank), op.nope_rows)
        rope = Rows(dtype, (1, spec.qk_rope_head_dim), op.rope_rows)
        loc = Arg("loc", Ints(op.locs))
        args = (layer, loc, Arg("cache_k_nope", nope), Arg("cache_k_rope", rope), *override)
        return CallPlan(method, args, method)
    if isinstance(op, WritePrefixValid):
        # A quantized pool takes the caller's float rows (op.dtype) and encodes them.
        dtype, heads = spec.dtype if op.dtype is None else op.dtype, spec.head_num
        args = (
            Arg("layer", Layer(op.layer_id)),
            Arg("loc_2d", Ints(op.loc_grid)),
            Arg("commit_lens", Ints(op.commit_lens, "int32")),
            Arg("cache_k", Rows(dtype, (heads, spec.head_dim), op.k_rows)),
            Arg("cache_v", Rows(dtype, (heads, spec.effective_v_head_dim), op.v_rows)),
        )
        return CallPlan(method, args, method)
    if isinstance(op, WriteIndexK):
        dim = spec.index_head_dim
        args = (
            Arg("layer_id", op.layer_id),
            Arg("loc", Ints(op.locs)),
            Arg("index_k", Rows("float8_e4m3fn", (dim,), op.key_rows)),
            Arg("index_k_scale", Rows("float32", (dim // DSA_QUANT_BLOCK,), op.scale_rows)),
        )
        return CallPlan("write_index_k", args, method, via_target=True)
    if isinstance(op, WriteCompressTail):
        dim = spec.index_head_dim
        args = (
            Arg("layer_id", op.layer_id),
            Arg("req_pool_idx", op.req_pool_idx),
            Arg("key_tail", Rows("bfloat16", (dim,), op.key_rows)),
            Arg("score_tail", Rows("bfloat16", (dim,), op.score_rows)),
            Arg("n_remain", len(op.key_rows)),
            Arg("dst_logical_start", op.start),
        )
        return CallPlan(method, args, method)
    if isinstance(op, Move):
        return CallPlan(
            method, (Arg("tgt_loc", Ints(op.tgt)), Arg("src_loc", Ints(op.src))), method
        )
    # HostCopy or HostReload (op_method refused anything else)
    request = tuple(Arg(name, value, keyword=True) for name, value in request_kwargs(op))
    if isinstance(op, HostCopy):
        return CallPlan(method, (Arg("indices", Ints(op.indices)), *request), method, keeps=op.name)
    copy = Arg("kv_cache_cpu", HostCopyRef(op.name))
    return CallPlan(method, (copy, Arg("indices", Ints(op.indices)), *request), method)


def _layer_args(op: WriteKV | WriteMLA) -> tuple[Arg, tuple[Arg, ...]]:
    """The layer argument, and with ``op.override`` the keyword that names the layer instead
    (``layer=None, layer_id_override=layer_id``, as SGLang's SWA pool calls)."""
    if op.override:
        layer = Arg("layer", None, note="the layer goes as layer_id_override, as SWA pools pass it")
        return layer, (Arg("layer_id_override", op.layer_id, keyword=True),)
    return Arg("layer", Layer(op.layer_id)), ()


def _write_kv_args(spec: PoolSpec, op: WriteKV) -> tuple[Arg, ...]:
    """``set_kv_buffer``'s arguments: rows in the pool's dtype, or the caller's payload and
    its scales (per tensor, or MXFP8's e8m0 block scales as tensors); a latent row is the
    whole cache entry (no V, no scales)."""
    payload = op.payload
    dtype = spec.dtype if payload is None else payload.dtype
    k_rows = op.k_rows if payload is None else payload.k_rows
    v_rows = op.v_rows if payload is None else payload.v_rows
    layer, override = _layer_args(op)
    loc = Arg("loc", Ints(op.locs))
    if spec.family in ("mla", "dsa"):
        k = Rows(dtype, (1, latent_width(spec)), k_rows)
        cache_v = Arg("cache_v", None, note="the latent row holds both")
        return (layer, loc, Arg("cache_k", k), cache_v, *override)
    heads, k_dim, v_dim = spec.head_num, spec.head_dim, spec.effective_v_head_dim
    k, v = Rows(dtype, (heads, k_dim), k_rows), Rows(dtype, (heads, v_dim), v_rows)
    args = [layer, loc, Arg("cache_k", k), Arg("cache_v", v)]
    if payload is not None and (payload.k_scale_rows or payload.v_scale_rows):
        block = QUANT_BLOCKS["mxfp8"]
        note = f"MXFP8's scaled write: the caller's e8m0 scales, one per {block} fp8 values"
        k_scale = Rows("float8_e8m0fnu", (heads, k_dim // block), payload.k_scale_rows)
        v_scale = Rows("float8_e8m0fnu", (heads, v_dim // block), payload.v_scale_rows)
        args += [Arg("k_scale", k_scale, note=note), Arg("v_scale", v_scale)]
    elif payload is not None and (payload.k_scale is not None or payload.v_scale is not None):
        args += [Arg("k_scale", payload.k_scale), Arg("v_scale", payload.v_scale)]
    return (*args, *override)


# --- the call as tensors ----------------------------------------------------------------


def build_value(value: ArgValue, *, device: str | torch.device, copies: Mapping[str, Any]) -> Any:
    """What the caller passes for ``value``: its tensor on ``device``, a layer object, the
    host copy ``copies`` holds under its name, or the plain value itself.

    Raises ``ValueError`` for a host copy never taken (the harness has no copy to pass:
    what the reference model expects), :class:`OpEncodingError` for rows that cannot form
    the tensor.

    Example:
        >>> build_value(Ints(((1, 2),), "int32"), device="cpu", copies={})
        tensor([[1, 2]], dtype=torch.int32)
    """
    if isinstance(value, Rows):
        dtype = getattr(torch, value.dtype)
        return rows_tensor(value.rows, dtype=dtype, inner=value.shape, device=device)
    if isinstance(value, Ints):
        values = [list(v) if isinstance(v, tuple) else v for v in value.values]
        return torch.tensor(values, dtype=getattr(torch, value.dtype), device=device)
    if isinstance(value, Layer):
        return SimpleNamespace(layer_id=value.layer_id)
    if isinstance(value, HostCopyRef):
        if value.name not in copies:
            raise ValueError(f"name={value.name!r} was never copied: there is no copy to reload")
        return copies[value.name]
    return value


def build_call(
    plan: CallPlan, *, device: str | torch.device, copies: Mapping[str, Any]
) -> PoolCall:
    """``plan`` as a call ready to run, its tensors on ``device`` (see :func:`build_value`).

    Example:
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> build_call(plan_call(spec, Move(tgt=(1,), src=(2,))), device="cpu", copies={}).args
        (tensor([1]), tensor([2]))
    """
    built = [(arg, build_value(arg.value, device=device, copies=copies)) for arg in plan.args]
    return PoolCall(
        plan.method,
        tuple(value for arg, value in built if not arg.keyword),
        via_target=plan.via_target,
        kwargs=tuple((arg.name, value) for arg, value in built if arg.keyword),
    )


def encode_op(
    spec: PoolSpec, op: Op, *, device: str | torch.device, copies: Mapping[str, Any]
) -> PoolCall:
    """The call ``op`` stands for on a pool built from ``spec``, with its tensors built on
    ``device``: :func:`build_call` of :func:`plan_call`.

    ``copies`` maps host-copy names to what ``get_cpu_copy`` returned; a ``HostReload`` of
    a name never copied is turned into a ``ValueError`` here, which is what the reference
    model expects (the harness has no copy to pass).

    Example:
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16",
        ...                 head_num=1, head_dim=1)
        >>> encode_op(spec, Move(tgt=(1,), src=(2,)), device="cpu", copies={}).method
        'move_kv_cache'
    """
    if not isinstance(spec, PoolSpec):
        raise TypeError(f"spec={spec!r} is not a PoolSpec (encode_op takes the pool's spec)")
    return build_call(plan_call(spec, op), device=device, copies=copies)


def request_kwargs(op: HostCopy | HostReload) -> tuple[tuple[str, int], ...]:
    """A host copy's or reload's keyword arguments: ``req_pool_index`` only when the op
    names a request slot, so a pool without that parameter still takes the call.

    Example:
        >>> request_kwargs(HostCopy("a", (1,))), request_kwargs(HostCopy("a", (1,), 2))
        ((), (('req_pool_index', 2),))
    """
    return () if op.req_pool_index is None else (("req_pool_index", op.req_pool_index),)


def run_call(target: Any, pool: Any, call: PoolCall) -> Any:
    """Run an encoded call on ``pool`` (through ``target`` where the call needs it)."""
    if call.via_target:
        return getattr(target, call.method)(pool, *call.args, **dict(call.kwargs))
    return getattr(pool, call.method)(*call.args, **dict(call.kwargs))


def describe_op(op: Op) -> str:
    """A short description of the pool call ``op`` stands for (rows summarized by size).

    Example:
        >>> describe_op(Move(tgt=(1, 2), src=(2, 2)))
        'pool.move_kv_cache(tgt_loc=[1, 2], src_loc=[2, 2])'
    """
    if isinstance(op, WriteKV):
        layer = f"layer_id_override={op.layer_id}" if op.override else f"layer_id={op.layer_id}"
        if op.payload is not None:
            payload = op.payload
            scales = "".join(
                f", {name}={value}"
                for name, value in (("k_scale", payload.k_scale), ("v_scale", payload.v_scale))
                if value is not None
            )
            if payload.k_scale_rows:
                scales += (
                    f", e8m0 k_scale={_bytes_summary(payload.k_scale_rows)},"
                    f" v_scale={_bytes_summary(payload.v_scale_rows)}"
                )
            return (
                f"pool.set_kv_buffer({layer}, loc={list(op.locs)}, "
                f"{payload.dtype} k_rows={_bytes_summary(payload.k_rows)}, "
                f"v_rows={_bytes_summary(payload.v_rows)}{scales})"
            )
        return (
            f"pool.set_kv_buffer({layer}, loc={list(op.locs)}, "
            f"k_rows={_bytes_summary(op.k_rows)}, v_rows={_bytes_summary(op.v_rows)})"
        )
    if isinstance(op, WriteMLA):
        layer = f"layer_id_override={op.layer_id}" if op.override else f"layer_id={op.layer_id}"
        return (
            f"pool.set_mla_kv_buffer({layer}, loc={list(op.locs)}, "
            f"nope={_bytes_summary(op.nope_rows)}, rope={_bytes_summary(op.rope_rows)}"
            + ("" if op.dtype is None else f", dtype={op.dtype}")
            + ")"
        )
    if isinstance(op, WritePrefixValid):
        return (
            f"pool.set_kv_buffer_prefix_valid(layer_id={op.layer_id}, "
            f"loc_2d={[list(row) for row in op.loc_grid]}, commit_lens={list(op.commit_lens)}, "
            f"k_rows={_bytes_summary(op.k_rows)}, v_rows={_bytes_summary(op.v_rows)}"
            + ("" if op.dtype is None else f", dtype={op.dtype}")
            + ")"
        )
    if isinstance(op, WriteIndexK):
        return (
            f"target.write_index_k(pool, layer_id={op.layer_id}, loc={list(op.locs)}, "
            f"key_rows={_bytes_summary(op.key_rows)}, scale_rows={_bytes_summary(op.scale_rows)})"
        )
    if isinstance(op, WriteCompressTail):
        return (
            f"pool.set_compress_tail_for_request(layer_id={op.layer_id}, "
            f"req_pool_idx={op.req_pool_idx}, key_tail={_bytes_summary(op.key_rows)}, "
            f"score_tail={_bytes_summary(op.score_rows)}, n_remain={len(op.key_rows)}, "
            f"dst_logical_start={op.start})"
        )
    if isinstance(op, Move):
        return f"pool.move_kv_cache(tgt_loc={list(op.tgt)}, src_loc={list(op.src)})"
    if isinstance(op, HostCopy | HostReload):
        request = "".join(f", {name}={value}" for name, value in request_kwargs(op))
        if isinstance(op, HostCopy):
            return f"{op.name} = pool.get_cpu_copy(indices={list(op.indices)}{request})"
        return f"pool.load_cpu_copy({op.name}, indices={list(op.indices)}{request})"
    return repr(op)


def _bytes_summary(rows: Sequence[bytes]) -> str:
    if not rows:
        return "[]"
    return f"{len(rows)} rows of {sorted({len(row) for row in rows})} bytes"


@dataclass(frozen=True)
class NoOpCall:
    """One call on the no-op pool: ``method`` with ``args`` and ``kwargs``."""

    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    def __repr__(self) -> str:
        parts = [repr(arg) for arg in self.args]
        parts += [f"{name}={value!r}" for name, value in self.kwargs.items()]
        return f"pool.{self.method}({', '.join(parts)})"
