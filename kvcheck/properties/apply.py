"""Apply :mod:`kvcheck.specs` operations to a pool through a target, and check the call.

:func:`apply_op` encodes an operation as its pool call (:mod:`kvcheck.calls`) and runs
it; :func:`apply_op_like_reference` runs one operation on a pool and on a
:class:`~kvcheck.reference.ReferencePool` and fails when they disagree on whether the call
must raise, or when the call changed a tensor the caller passed.

Example:
    >>> from kvcheck.specs import PoolSpec, WriteKV
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16",
    ...                 head_num=1, head_dim=1)
    >>> target = resolve_target("kvcheck")
    >>> pool = target.make_pool(spec, device="cpu")
    >>> apply_op(target, pool, WriteKV(layer_id=0, locs=(3,), k_rows=(b"\\x00<",),
    ...                                v_rows=(b"\\x00@",)), spec=spec, device="cpu", copies={})
    >>> pool.k_buffer[0][3].item(), pool.v_buffer[0][3].item()
    (1.0, 2.0)
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch

from kvcheck.calls import OpEncodingError, describe_op, encode_op, op_method, run_call
from kvcheck.failures import FailureSignature
from kvcheck.memory import buffer_tensors
from kvcheck.properties.assertions import fail, failure
from kvcheck.properties.caller_tensors import (
    TensorSnapshot,
    assert_tensors_unchanged,
    collect_tensors,
    snapshot_tensors,
)
from kvcheck.reference import ReferencePool
from kvcheck.specs import HostCopy, Op, PoolSpec

__all__ = ["apply_op", "apply_op_like_reference", "assert_host_copy_is_a_copy"]


def apply_op(
    target: Any,
    pool: Any,
    op: Op,
    *,
    spec: PoolSpec,
    device: str | torch.device,
    copies: MutableMapping[str, Any],
) -> None:
    """Apply one :mod:`kvcheck.specs` operation to ``pool`` (built from ``spec``); the pool's
    exceptions propagate.

    ``copies`` holds host copies by name: ``HostCopy`` stores the result of
    ``get_cpu_copy`` there and ``HostReload`` passes it back to ``load_cpu_copy``.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> from kvcheck.specs import PoolSpec
        >>> target = resolve_target("kvcheck")
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> pool = target.make_pool(spec, device="cpu")
        >>> copies = {}
        >>> apply_op(target, pool, HostCopy(name="a", indices=(1, 2)), spec=spec, device="cpu",
        ...          copies=copies)
        >>> sorted(copies)
        ['a']
    """
    call = encode_op(spec, op, device=device, copies=copies)
    result = run_call(target, pool, call)
    if isinstance(op, HostCopy):
        copies[op.name] = result


def apply_op_like_reference(
    target: Any,
    pool: Any,
    reference: ReferencePool,
    op: Op,
    *,
    device: str | torch.device,
    copies: MutableMapping[str, Any],
) -> bool:
    """Apply ``op`` to ``pool`` and ``reference``; fail unless both accept or both reject it,
    or if the call changed any tensor it was given (accepted or not).

    The reference decides (:meth:`ReferencePool.expected_error`): a pool must raise that
    exception type (or a subclass) exactly when the reference does. An accepted op is then
    applied to the reference too. Returns whether the op was accepted. Raises
    :class:`~kvcheck.failures.PropertyFailure` naming the call otherwise.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> from kvcheck.specs import Move, PoolSpec
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> target = resolve_target("kvcheck")
        >>> pool, reference = target.make_pool(spec, device="cpu"), ReferencePool(spec)
        >>> apply_op_like_reference(target, pool, reference, Move(tgt=(1, 1), src=(0, 2)),
        ...                         device="cpu", copies={})
        False
    """
    __tracebackhide__ = True
    expected = reference.expected_error(op)
    call = describe_op(op)
    method, family = op_method(op), reference.spec.variant
    tensors: dict[str, torch.Tensor] = {}
    before: dict[str, TensorSnapshot] = {}
    try:
        pool_call = encode_op(reference.spec, op, device=device, copies=copies)
        tensors = collect_tensors(pool_call.args)
        before = snapshot_tensors(tensors)
        result = run_call(target, pool, pool_call)
    except OpEncodingError:
        raise
    except Exception as exc:  # any exception is compared with the one the contract demands
        assert_tensors_unchanged(tensors, before, call=call, method=method, family=family)
        if expected is not None and isinstance(exc, expected):
            return False
        wanted = "no exception" if expected is None else expected.__name__
        raise failure(
            f"got {type(exc).__name__}: {exc} but should be {wanted} [{call}]",
            signature=FailureSignature(
                check="raises",
                call=method,
                kind=f"{type(exc).__name__} instead of {wanted}",
                family=family,
            ),
        ) from exc
    assert_tensors_unchanged(tensors, before, call=call, method=method, family=family)
    if expected is not None:
        raise failure(
            f"got no exception but should be {expected.__name__} [{call}]\n"
            f"the reference rejects it: {_rejection_reason(reference, op)}",
            signature=FailureSignature(
                check="raises",
                call=method,
                kind=f"no exception instead of {expected.__name__}",
                family=family,
            ),
        )
    if isinstance(op, HostCopy):
        assert_host_copy_is_a_copy(pool, result, call=call, family=family)
        copies[op.name] = result
    reference.apply(op)
    return True


def assert_host_copy_is_a_copy(pool: Any, host_copy: Any, *, call: str, family: str) -> None:
    """No tensor in what ``get_cpu_copy`` returned shares memory with a pool buffer: a
    view would change with later pool writes, and a retracted request would come back
    with another request's bytes. (On a GPU ``.to("cpu")`` always copies; on a CPU pool
    it returns the tensor itself, so a pool that relies on it aliases there.)

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool = MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                         kv_lora_rank=2, qk_rope_head_dim=2, layer_num=1,
        ...                         device="cpu")
        >>> assert_host_copy_is_a_copy(pool, [pool.kv_buffer[0][1:]], call="c", family="mla")
        Traceback (most recent call last):
        ...
        kvcheck.failures.PropertyFailure: got 'a view of kv_buffer[0]' but should be 'a copy' [c]
        copy[0] shares memory with the pool
    """
    __tracebackhide__ = True
    owners = {
        int(item.tensor.untyped_storage().data_ptr()): item
        for item in buffer_tensors(pool)
        if item.tensor.numel()
    }
    for path, tensor in collect_tensors(host_copy, "copy").items():
        if not tensor.numel() or tensor.device.type == "meta":
            continue
        owner = owners.get(int(tensor.untyped_storage().data_ptr()))
        if owner is not None:
            name = owner.name
            raise fail(
                got=f"a view of {name}[{owner.layer}]",
                expected="a copy",
                call=call,
                detail=f"{path} shares memory with the pool",
                signature=FailureSignature(
                    check="host_copy",
                    call="get_cpu_copy",
                    kind=f"copy shares memory with {name}",
                    family=family,
                ),
            )


def _rejection_reason(reference: ReferencePool, op: Op) -> str:
    """The reference's own message for an op it rejects (applying a rejected op changes
    nothing, so this leaves the reference as it was)."""
    try:
        reference.apply(op)
    except Exception as exc:  # the contract's exception carries the reason
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"the reference accepted {op!r}, which it said it rejects")
