"""Properties of a pool's inputs: callers' tensors stay untouched, rejected calls change nothing.

- **No call changes a tensor the caller passed in**: locations, payloads and the tensors
  inside a host copy keep their shape, strides, dtype and every byte, whether the call
  succeeds or raises.
- **A rejected call leaves the pool byte-identical**: a call the contract rejects raises
  ``ValueError`` before it writes anything, so a write whose V payload is wrong must not
  have written its K first.

:func:`check_sequence_inputs` runs a :mod:`kvcheck.specs` operation sequence (valid and
invalid operations, the reference deciding which must raise). :func:`bad_calls` draws
malformed calls that the spec vocabulary cannot express (float or 2-D locations, wrong
dtypes, a valid K with a malformed V, ...), for :func:`assert_rejected_call_changes_nothing`.

Example:
    >>> from kvcheck.specs import Move, OpSequence, PoolSpec, WriteKV
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float8_e5m2",
    ...                 head_num=1, head_dim=1)
    >>> ops = (WriteKV(layer_id=0, locs=(3, 1), k_rows=(b"\\x01", b"\\x02"),
    ...                v_rows=(b"\\x03", b"\\x04")), Move(tgt=(1, 1), src=(0, 2)))
    >>> check_sequence_inputs(resolve_target("kvcheck"), OpSequence(spec, ops), device="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import fail
from kvcheck.properties.caller_tensors import (
    TensorSnapshot,
    assert_tensors_unchanged,
    collect_tensors,
    snapshot_tensors,
)
from kvcheck.properties.ops import (
    PoolCall,
    describe_op,
    encode_op,
    loc_tensor,
    rows_tensor,
    run_call,
)
from kvcheck.properties.pool_state import assert_same_pool_bytes, read_pool_buffers
from kvcheck.reference import ReferencePool, index_k_row_bytes, index_scale_row_bytes
from kvcheck.specs import DSA_QUANT_BLOCK, HostCopy, OpSequence, PoolSpec
from kvcheck.strategies import ops as draws

__all__ = [
    "BAD_CALL_KINDS",
    "BadCall",
    "TensorSnapshot",
    "assert_rejected_call_changes_nothing",
    "assert_tensors_unchanged",
    "bad_calls",
    "check_sequence_inputs",
    "collect_tensors",
    "run_checked_call",
    "snapshot_tensors",
]


def run_checked_call(
    target: Any,
    pool: Any,
    call: PoolCall,
    *,
    description: str,
    expected_error: type[Exception] | None,
) -> Any:
    """Run ``call``; the caller's tensors must be unchanged afterwards whatever happens.

    With ``expected_error`` the call must raise it (or a subclass) and leave every pool
    buffer byte-identical; without, it must not raise. Returns the call's result.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=1, dtype="float16")
        >>> target = resolve_target("kvcheck")
        >>> pool = target.make_pool(spec, device="cpu")
        >>> call = PoolCall("move_kv_cache", (torch.tensor([0.5]), torch.tensor([1])))
        >>> run_checked_call(target, pool, call, description="float tgt_loc",
        ...                  expected_error=ValueError)
    """
    __tracebackhide__ = True
    tensors = collect_tensors(call.args)
    before_tensors = snapshot_tensors(tensors)
    before_pool = read_pool_buffers(pool) if expected_error is not None else None
    raised: Exception | None = None
    result = None
    try:
        result = run_call(target, pool, call)
    except Exception as exc:  # compared below, after the inputs
        raised = exc
    assert_tensors_unchanged(tensors, before_tensors, call=description, method=call.method)
    got_kind = "no exception" if raised is None else type(raised).__name__
    if expected_error is None:
        if raised is not None:
            raise fail(
                got=f"{type(raised).__name__}: {raised}",
                expected="no exception",
                call=description,
                signature=FailureSignature(
                    check="raises", call=call.method, kind=f"{got_kind} instead of no exception"
                ),
            ) from raised
        return result
    if raised is None or not isinstance(raised, expected_error):
        got = "no exception" if raised is None else f"{type(raised).__name__}: {raised}"
        raise fail(
            got=got,
            expected=expected_error.__name__,
            call=description,
            signature=FailureSignature(
                check="raises",
                call=call.method,
                kind=f"{got_kind} instead of {expected_error.__name__}",
            ),
        ) from raised
    assert before_pool is not None
    assert_same_pool_bytes(
        read_pool_buffers(pool), before_pool, start_layer=pool.start_layer, call=description
    )
    return None


def check_sequence_inputs(target: Any, sequence: OpSequence, *, device: str) -> None:
    """Run ``sequence`` on a fresh pool: no call changes the caller's tensors, every call
    the reference rejects raises and leaves the pool byte-identical, every other one passes.

    Example:
        >>> from kvcheck.specs import HostReload
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> ops = (HostCopy(name="a", indices=(1, 2)), HostReload(name="a", indices=(3, 4)))
        >>> check_sequence_inputs(resolve_target("kvcheck"), OpSequence(spec, ops),
        ...                       device="cpu")
    """
    __tracebackhide__ = True
    pool = target.make_pool(sequence.spec, device=device)
    reference = ReferencePool(sequence.spec)
    copies: dict[str, Any] = {}
    for op in sequence.ops:
        expected = reference.expected_error(op)
        try:
            call = encode_op(pool, op, device=device, copies=copies)
        except ValueError:
            if expected is None:
                raise
            continue  # a reload of a copy that was never made: nothing to call
        result = run_checked_call(
            target, pool, call, description=describe_op(op), expected_error=expected
        )
        if expected is None:
            reference.apply(op)
            if isinstance(op, HostCopy):
                copies[op.name] = result


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


@st.composite
def _bad_calls(draw: st.DrawFn, spec: PoolSpec, device: str) -> BadCall:
    kind = draw(st.sampled_from(_kinds(spec)), label="kind")
    op = draw(draws.write_kv_ops(spec), label="valid write")
    layer = SimpleNamespace(layer_id=op.layer_id)
    loc = loc_tensor(op.locs, device=device)
    dtype = getattr(torch, spec.dtype)
    latent = spec.family in ("mla", "dsa")
    heads, k_dim = (
        (1, spec.kv_lora_rank + spec.qk_rope_head_dim)
        if latent
        else (
            spec.head_num,
            spec.head_dim,
        )
    )
    k = rows_tensor(op.k_rows, dtype=dtype, inner=(heads, k_dim), device=device)
    v = None
    if not latent:
        v = rows_tensor(
            op.v_rows, dtype=dtype, inner=(heads, spec.effective_v_head_dim), device=device
        )
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
        bad_src[-1] = spec.num_slots
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
        bad[-1] = spec.num_slots
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


def bad_calls(spec: PoolSpec, *, device: str) -> st.SearchStrategy[BadCall]:
    """Malformed calls on a pool of ``spec`` (MHA, MLA or DSA) that must raise ``ValueError``.

    Each starts from a valid write of non-zero-able payloads and breaks one thing (see
    :data:`BAD_CALL_KINDS`): location dtype, rank or value; a payload's dtype or row count;
    the layer object; for MHA a malformed V beside a valid K; moves with a float target,
    a 2-D or out-of-range source; host copies with float indices or a non-copy; for DSA
    index-K writes with a wrong key dtype, a scale of the wrong shape beside valid keys,
    an out-of-range or repeated location. Shrinks towards the first kind, one token.

    Example::

        @given(bad=bad_calls(spec, device="cpu"))
        def test_rejected(bad):
            assert_rejected_call_changes_nothing(target, pool, bad)
    """
    if not isinstance(spec, PoolSpec) or spec.family not in ("mha", "mla", "dsa"):
        raise ValueError(f"spec={spec!r} must be a PoolSpec of family 'mha', 'mla' or 'dsa'")
    return _bad_calls(spec, device)


def assert_rejected_call_changes_nothing(target: Any, pool: Any, bad: BadCall) -> None:
    """``bad`` raises ``ValueError``, changes no pool byte and none of its own tensors.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=2, page_size=1, layer_num=1, dtype="float32")
        >>> target = resolve_target("kvcheck")
        >>> pool = target.make_pool(spec, device="cpu")
        >>> bad = BadCall("copy_indices_float",
        ...               PoolCall("get_cpu_copy", (torch.tensor([1.0]),)))
        >>> assert_rejected_call_changes_nothing(target, pool, bad)
    """
    __tracebackhide__ = True
    run_checked_call(target, pool, bad.call, description=repr(bad), expected_error=ValueError)
