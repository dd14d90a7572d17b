"""Pool calls: :mod:`kvcheck.specs` operations as the method calls a pool receives.

The specs describe payloads as raw bytes so that the reference model needs no dtype
semantics; here those bytes become tensors of the pool's dtype (fp8 payloads as fp8 views
of the bytes) on the pool's device, and each operation becomes the call SGLang makes:
``set_kv_buffer``, ``set_mla_kv_buffer``, ``set_kv_buffer_prefix_valid``,
``target.write_index_k``, ``set_compress_tail_for_request``, ``move_kv_cache``,
``get_cpu_copy`` and ``load_cpu_copy``
(:func:`encode_op`, run by :func:`run_call`). Strategies draw calls from here and the
properties (:mod:`kvcheck.properties.ops`) apply them.

Example:
    >>> from kvcheck.specs import Move, PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> call = encode_op(pool, Move(tgt=(1,), src=(2,)), device="cpu", copies={})
    >>> call.method, describe_op(Move(tgt=(1,), src=(2,)))
    ('move_kv_cache', 'pool.move_kv_cache(tgt_loc=[1], src_loc=[2])')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvcheck.specs import (
    DSA_QUANT_BLOCK,
    HostCopy,
    HostReload,
    Move,
    Op,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)

__all__ = [
    "NOOP_WRITE_METHODS",
    "NoOpCall",
    "OpEncodingError",
    "PoolCall",
    "describe_op",
    "encode_op",
    "loc_tensor",
    "op_method",
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


def _is_latent(pool: Any) -> bool:
    """MLA and DSA pools keep one latent buffer per layer instead of K and V."""
    return hasattr(pool, "kv_buffer")


def encode_op(pool: Any, op: Op, *, device: str | torch.device, copies: dict[str, Any]) -> PoolCall:
    """The call ``op`` stands for, with its tensors built on ``device``.

    ``copies`` maps host-copy names to what ``get_cpu_copy`` returned; a ``HostReload`` of
    a name never copied is turned into a ``ValueError`` here, which is what the reference
    model expects (the harness has no copy to pass).

    Example:
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> pool = MHATokenToKVPool(size=4, page_size=2, dtype=torch.float16, head_num=1,
        ...                         head_dim=1, layer_num=1, device="cpu")
        >>> encode_op(pool, Move(tgt=(1,), src=(2,)), device="cpu", copies={}).method
        'move_kv_cache'
    """
    if isinstance(op, WriteKV):
        return _encode_write_kv(pool, op, device=device)
    if isinstance(op, WriteMLA):
        layer = SimpleNamespace(layer_id=op.layer_id)
        # The op names its dtype when it is not the pool's (bf16 parts of a scaled row).
        parts_dtype = pool.dtype if op.dtype is None else getattr(torch, op.dtype)
        nope = rows_tensor(
            op.nope_rows,
            dtype=parts_dtype,
            inner=(1, -1 if op.nope_rows else pool.kv_lora_rank),
            device=device,
        )
        rope = rows_tensor(
            op.rope_rows,
            dtype=parts_dtype,
            inner=(1, -1 if op.rope_rows and op.rope_rows[0] else pool.qk_rope_head_dim),
            device=device,
        )
        loc = loc_tensor(op.locs, device=device)
        if op.override:
            return PoolCall(
                "set_mla_kv_buffer",
                (None, loc, nope, rope),
                kwargs=(("layer_id_override", op.layer_id),),
            )
        return PoolCall("set_mla_kv_buffer", (layer, loc, nope, rope))
    if isinstance(op, WritePrefixValid):
        layer = SimpleNamespace(layer_id=op.layer_id)
        grid = torch.tensor([list(row) for row in op.loc_grid], dtype=torch.int64, device=device)
        commits = torch.tensor(list(op.commit_lens), dtype=torch.int32, device=device)
        heads = pool.head_num
        # A quantized pool takes the caller's float rows (op.dtype) and encodes them.
        dtype = pool.dtype if op.dtype is None else getattr(torch, op.dtype)
        k = rows_tensor(op.k_rows, dtype=dtype, inner=(heads, pool.head_dim), device=device)
        v = rows_tensor(op.v_rows, dtype=dtype, inner=(heads, pool.v_head_dim), device=device)
        return PoolCall("set_kv_buffer_prefix_valid", (layer, grid, commits, k, v))
    if isinstance(op, WriteIndexK):
        dim = getattr(pool, "index_head_dim", DSA_QUANT_BLOCK)
        key = rows_tensor(
            op.key_rows,
            dtype=torch.float8_e4m3fn,
            inner=(-1 if op.key_rows else dim,),
            device=device,
        )
        scale = rows_tensor(
            op.scale_rows,
            dtype=torch.float32,
            inner=(-1 if op.scale_rows else dim // DSA_QUANT_BLOCK,),
            device=device,
        )
        loc = loc_tensor(op.locs, device=device)
        return PoolCall("write_index_k", (op.layer_id, loc, key, scale), via_target=True)
    if isinstance(op, WriteCompressTail):
        dim = getattr(pool, "index_head_dim", DSA_QUANT_BLOCK)
        key, score = (
            rows_tensor(rows, dtype=torch.bfloat16, inner=(-1 if rows else dim,), device=device)
            for rows in (op.key_rows, op.score_rows)
        )
        args = (op.layer_id, op.req_pool_idx, key, score, len(op.key_rows), op.start)
        return PoolCall("set_compress_tail_for_request", args)
    if isinstance(op, Move):
        tgt, src = loc_tensor(op.tgt, device=device), loc_tensor(op.src, device=device)
        return PoolCall("move_kv_cache", (tgt, src))
    if isinstance(op, HostCopy):
        indices = loc_tensor(op.indices, device=device)
        return PoolCall("get_cpu_copy", (indices,), kwargs=request_kwargs(op))
    if isinstance(op, HostReload):
        if op.name not in copies:
            raise ValueError(f"name={op.name!r} was never copied: there is no copy to reload")
        indices = loc_tensor(op.indices, device=device)
        return PoolCall("load_cpu_copy", (copies[op.name], indices), kwargs=request_kwargs(op))
    raise OpEncodingError(f"op={op!r} is not an operation from kvcheck.specs")


def request_kwargs(op: HostCopy | HostReload) -> tuple[tuple[str, int], ...]:
    """A host copy's or reload's keyword arguments: ``req_pool_index`` only when the op
    names a request slot, so a pool without that parameter still takes the call.

    Example:
        >>> request_kwargs(HostCopy("a", (1,))), request_kwargs(HostCopy("a", (1,), 2))
        ((), (('req_pool_index', 2),))
    """
    return () if op.req_pool_index is None else (("req_pool_index", op.req_pool_index),)


def _encode_write_kv(pool: Any, op: WriteKV, *, device: str | torch.device) -> PoolCall:
    """``set_kv_buffer``: rows in the pool's dtype, or the caller's payload and its scales
    (MXFP8's e8m0 block scales as tensors); with ``op.override`` the layer goes as
    ``layer_id_override`` and ``layer`` is None."""
    call = _encode_write_kv_rows(pool, op, device=device)
    if not op.override:
        return call
    return PoolCall(
        call.method,
        (None, *call.args[1:]),
        kwargs=(*call.kwargs, ("layer_id_override", op.layer_id)),
    )


def _encode_write_kv_rows(pool: Any, op: WriteKV, *, device: str | torch.device) -> PoolCall:
    layer = SimpleNamespace(layer_id=op.layer_id)
    loc = loc_tensor(op.locs, device=device)
    payload = op.payload
    dtype = pool.dtype if payload is None else getattr(torch, payload.dtype)
    k_rows = op.k_rows if payload is None else payload.k_rows
    v_rows = op.v_rows if payload is None else payload.v_rows
    if _is_latent(pool):
        width = pool.kv_lora_rank + pool.qk_rope_head_dim
        k = rows_tensor(k_rows, dtype=dtype, inner=(1, -1 if k_rows else width), device=device)
        return PoolCall("set_kv_buffer", (layer, loc, k, None))
    heads = pool.head_num
    k = rows_tensor(
        k_rows, dtype=dtype, inner=(heads, -1 if k_rows else pool.head_dim), device=device
    )
    v_dim = -1 if v_rows else pool.v_head_dim
    v = rows_tensor(v_rows, dtype=dtype, inner=(heads, v_dim), device=device)
    if payload is not None and (payload.k_scale_rows or payload.v_scale_rows):
        k_scale, v_scale = (
            rows_tensor(rows, dtype=torch.float8_e8m0fnu, inner=(heads, -1), device=device)
            for rows in (payload.k_scale_rows, payload.v_scale_rows)
        )
        return PoolCall("set_kv_buffer", (layer, loc, k, v, k_scale, v_scale))
    if payload is None or (payload.k_scale is None and payload.v_scale is None):
        return PoolCall("set_kv_buffer", (layer, loc, k, v))
    return PoolCall("set_kv_buffer", (layer, loc, k, v, payload.k_scale, payload.v_scale))


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
