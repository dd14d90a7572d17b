"""Properties of a pool's inputs: callers' tensors stay untouched, rejected calls change nothing.

- **No call changes a tensor the caller passed in**: locations, payloads and the tensors
  inside a host copy keep their shape, strides, dtype and every byte, whether the call
  succeeds or raises.
- **A rejected call leaves the pool byte-identical**: a call the contract rejects raises
  ``ValueError`` before it writes anything, so a write whose V payload is wrong must not
  have written its K first.

:func:`check_sequence_inputs` runs a :mod:`kvcheck.specs` operation sequence (valid and
invalid operations, the reference deciding which must raise).
:func:`kvcheck.strategies.bad_calls` draws malformed calls that the spec vocabulary cannot
express (float or 2-D locations, wrong dtypes, a valid K with a malformed V, ...), for
:func:`assert_rejected_call_changes_nothing`.

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

from typing import TYPE_CHECKING, Any

from kvcheck.calls import PoolCall, describe_op, encode_op, run_call
from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import fail
from kvcheck.properties.caller_tensors import (
    TensorSnapshot,
    assert_tensors_unchanged,
    collect_tensors,
    snapshot_tensors,
)
from kvcheck.properties.pool_state import assert_same_pool_bytes, read_pool_buffers
from kvcheck.reference import ReferencePool
from kvcheck.specs import HostCopy, OpSequence

if TYPE_CHECKING:  # kvcheck.strategies draws the calls and imports this package
    from kvcheck.strategies.malformed_calls import BadCall

__all__ = [
    "TensorSnapshot",
    "assert_rejected_call_changes_nothing",
    "assert_tensors_unchanged",
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
        >>> import torch
        >>> from kvcheck.specs import PoolSpec
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
        >>> from kvcheck.specs import HostReload, PoolSpec
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
            call = encode_op(sequence.spec, op, device=device, copies=copies)
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


def assert_rejected_call_changes_nothing(target: Any, pool: Any, bad: BadCall) -> None:
    """``bad`` raises ``ValueError``, changes no pool byte and none of its own tensors.

    Example:
        >>> import torch
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.strategies.malformed_calls import BadCall
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
