"""Properties of the no-op pool (``--prefill-only-disable-kv-cache``).

- Every write raises ``RuntimeError``, whatever its arguments (valid ones included), with
  a message naming ``NoOpMHATokenToKVPool`` and the configuration it needs, and leaves the
  placeholders as they were.
- The pool holds only its placeholders: ``[page_size, head_num, head_dim]`` and
  ``[page_size, head_num, v_head_dim]`` per layer, zero-filled; reads return them;
  ``get_kv_size_bytes()`` is ``(0, 0)`` and ``mem_usage`` ``0.0``.
- ``move_kv_cache`` of valid locations changes nothing.

:func:`kvcheck.strategies.noop_write_calls` and :func:`kvcheck.strategies.noop_move_arguments`
draw the arguments.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="noop", size=64, page_size=4, layer_num=2, dtype="float16")
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> assert_noop_holds_only_placeholders(pool, spec)
    >>> assert_noop_write_raises(pool, "set_kv_buffer", (None,), {})
    >>> import torch
    >>> assert_noop_move_changes_nothing(pool, (torch.tensor([1]), torch.tensor([2])), {})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvcheck.calls import NoOpCall
from kvcheck.failures import FailureSignature
from kvcheck.memory import storage_bytes
from kvcheck.properties.assertions import assert_equal, fail
from kvcheck.properties.pool_state import assert_same_pool_bytes, read_pool_buffers
from kvcheck.reference import expected_buffer_bytes
from kvcheck.specs import PoolSpec

__all__ = [
    "NOOP_CLASS_NAME",
    "NOOP_CONFIGURATION_FLAGS",
    "assert_noop_holds_only_placeholders",
    "assert_noop_move_changes_nothing",
    "assert_noop_write_raises",
]

NOOP_CLASS_NAME = "NoOpMHATokenToKVPool"
#: The error must name at least one of these, so the reader learns what to configure.
NOOP_CONFIGURATION_FLAGS: tuple[str, ...] = ("--prefill-only-disable-kv-cache", "--is-embedding")


def _placeholder_shapes(spec: PoolSpec) -> dict[str, tuple[int, ...]]:
    return {
        "k_buffer": (spec.page_size, spec.head_num, spec.head_dim),
        "v_buffer": (spec.page_size, spec.head_num, spec.effective_v_head_dim),
    }


def assert_noop_holds_only_placeholders(pool: Any, spec: PoolSpec) -> None:
    """Only zero-filled one-page placeholders, returned by reads, reported as no bytes.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="noop", size=1024, page_size=1, layer_num=1,
        ...                 dtype="bfloat16", v_head_dim=3)
        >>> assert_noop_holds_only_placeholders(
        ...     resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    call = "NoOpMHATokenToKVPool construction"
    for name, shape in _placeholder_shapes(spec).items():
        buffers = getattr(pool, name)
        assert_equal(len(buffers), spec.layer_num, call=call, detail=f"number of {name} layers")
        for local, buffer in enumerate(buffers):
            assert_equal(tuple(buffer.shape), shape, call=call, detail=f"shape of {name}[{local}]")
            if buffer.device.type != "meta" and bool(buffer.count_nonzero()):
                raise fail(
                    got="non-zero bytes",
                    expected="zeros",
                    call=call,
                    detail=f"{name}[{local}] placeholder",
                )
    held = storage_bytes(pool)
    assert_equal(
        held,
        expected_buffer_bytes(spec),
        call=call,
        detail="bytes held by the placeholders' storages (nothing else may be allocated)",
    )
    for layer_id in spec.layer_ids:
        local = layer_id - spec.start_layer
        for read, name in (("get_key_buffer", "k_buffer"), ("get_value_buffer", "v_buffer")):
            got = getattr(pool, read)(layer_id)
            expected = getattr(pool, name)[local]
            if tuple(got.shape) != tuple(expected.shape) or got.data_ptr() != expected.data_ptr():
                raise fail(
                    got=tuple(got.shape),
                    expected=tuple(expected.shape),
                    call=f"pool.{read}({layer_id})",
                    detail=f"reads must return the {name}[{local}] placeholder itself",
                )
    assert_equal(tuple(pool.get_kv_size_bytes()), (0, 0), call="pool.get_kv_size_bytes()")
    assert_equal(float(pool.mem_usage), 0.0, call="pool.mem_usage")


def assert_noop_write_raises(
    pool: Any, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """``pool.method(*args, **kwargs)`` raises ``RuntimeError`` naming the pool and the
    configuration, and the placeholders keep their bytes.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="noop", size=8, page_size=2, layer_num=1, dtype="float16")
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_noop_write_raises(pool, "load_cpu_copy", (), {"indices": 3})
    """
    __tracebackhide__ = True
    call = repr(NoOpCall(method, tuple(args), dict(kwargs)))
    before = read_pool_buffers(pool)

    def signature(kind: str) -> FailureSignature:
        return FailureSignature(check="raises", call=method, kind=kind, family="noop")

    try:
        getattr(pool, method)(*args, **kwargs)
    except RuntimeError as exc:
        message = str(exc)
        if NOOP_CLASS_NAME not in message or not any(
            flag in message for flag in NOOP_CONFIGURATION_FLAGS
        ):
            raise fail(
                got=message,
                expected=f"a message naming {NOOP_CLASS_NAME} and one of "
                f"{', '.join(NOOP_CONFIGURATION_FLAGS)}",
                call=call,
                signature=signature("message names no flag"),
            ) from exc
    except Exception as exc:  # any other exception is the wrong answer
        raise fail(
            got=f"{type(exc).__name__}: {exc}",
            expected="RuntimeError",
            call=call,
            signature=signature(f"{type(exc).__name__} instead of RuntimeError"),
        ) from exc
    else:
        raise fail(
            got="no exception",
            expected="RuntimeError",
            call=call,
            signature=signature("no exception instead of RuntimeError"),
        )
    assert_same_pool_bytes(read_pool_buffers(pool), before, start_layer=pool.start_layer, call=call)


def assert_noop_move_changes_nothing(
    pool: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """``pool.move_kv_cache(*args, **kwargs)`` (a valid move) returns without raising and
    changes no byte.

    Example:
        >>> import torch
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="noop", size=8, page_size=2, layer_num=1, dtype="float16")
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_noop_move_changes_nothing(pool, (torch.tensor([9]), torch.tensor([0])), {})
    """
    __tracebackhide__ = True
    call = repr(NoOpCall("move_kv_cache", tuple(args), dict(kwargs)))
    before = read_pool_buffers(pool)
    try:
        pool.move_kv_cache(*args, **kwargs)
    except Exception as exc:  # a no-op must accept anything
        raise fail(
            got=f"{type(exc).__name__}: {exc}",
            expected="no exception",
            call=call,
            signature=FailureSignature(
                check="raises",
                call="move_kv_cache",
                kind=f"{type(exc).__name__} instead of no exception",
                family="noop",
            ),
        ) from exc
    assert_same_pool_bytes(read_pool_buffers(pool), before, start_layer=pool.start_layer, call=call)
