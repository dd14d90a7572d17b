"""Properties of the no-op pool (``--prefill-only-disable-kv-cache``).

- Every write raises ``RuntimeError``, whatever its arguments (valid ones included), with
  a message naming ``NoOpMHATokenToKVPool`` and the configuration it needs, and leaves the
  placeholders as they were.
- The pool holds only its placeholders: ``[page_size, head_num, head_dim]`` and
  ``[page_size, head_num, v_head_dim]`` per layer, zero-filled; reads return them;
  ``get_kv_size_bytes()`` is ``(0, 0)`` and ``mem_usage`` ``0.0``.
- ``move_kv_cache`` of valid locations changes nothing.

:func:`noop_write_calls` and :func:`noop_move_arguments` draw the arguments.

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
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from kvcheck.failures import FailureSignature
from kvcheck.memory import storage_bytes
from kvcheck.properties.assertions import assert_equal, fail
from kvcheck.properties.ops import loc_tensor, rows_tensor
from kvcheck.properties.pool_state import assert_same_pool_bytes, read_pool_buffers
from kvcheck.reference import expected_buffer_bytes
from kvcheck.specs import PoolSpec

__all__ = [
    "NOOP_CLASS_NAME",
    "NOOP_CONFIGURATION_FLAGS",
    "NOOP_WRITE_METHODS",
    "NoOpCall",
    "assert_noop_holds_only_placeholders",
    "assert_noop_move_changes_nothing",
    "assert_noop_write_raises",
    "noop_move_arguments",
    "noop_write_calls",
]

NOOP_CLASS_NAME = "NoOpMHATokenToKVPool"
#: Pool methods that write: each must raise on the no-op pool.
NOOP_WRITE_METHODS: tuple[str, ...] = ("set_kv_buffer", "load_cpu_copy")
#: The error must name at least one of these, so the reader learns what to configure.
NOOP_CONFIGURATION_FLAGS: tuple[str, ...] = ("--prefill-only-disable-kv-cache", "--is-embedding")


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


# --- arguments ---------------------------------------------------------------------------


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


@st.composite
def _valid_write(draw: st.DrawFn, spec: PoolSpec, device: str) -> NoOpCall:
    """A ``set_kv_buffer`` any MHA pool of ``spec`` would accept."""
    layer_id = draw(st.sampled_from(spec.layer_ids), label="layer_id")
    count = draw(st.integers(0, min(4, spec.num_slots)), label="count")
    locs = draw(
        st.lists(st.integers(0, spec.num_slots - 1), min_size=count, max_size=count, unique=True),
        label="locs",
    )
    dtype = getattr(torch, spec.dtype)
    k_bytes = spec.head_num * spec.head_dim * spec.itemsize
    v_bytes = spec.head_num * spec.effective_v_head_dim * spec.itemsize
    fill = draw(st.integers(0, 255), label="fill byte")
    k = rows_tensor(
        (bytes([fill]) * k_bytes,) * count,
        dtype=dtype,
        inner=(spec.head_num, spec.head_dim),
        device=device,
    )
    v = rows_tensor(
        (bytes([fill]) * v_bytes,) * count,
        dtype=dtype,
        inner=(spec.head_num, spec.effective_v_head_dim),
        device=device,
    )
    args = (SimpleNamespace(layer_id=layer_id), loc_tensor(locs, device=device), k, v)
    return NoOpCall("set_kv_buffer", args, {})


def noop_write_calls(
    spec: PoolSpec, *, device: str, methods: tuple[str, ...] = NOOP_WRITE_METHODS
) -> st.SearchStrategy[NoOpCall]:
    """Write calls on a no-op pool of ``spec``: valid ``set_kv_buffer`` calls, valid-looking
    ``load_cpu_copy`` calls, and either method with arbitrary positional and keyword
    arguments, for the write ``methods`` given (of :data:`NOOP_WRITE_METHODS`). Tensors are
    built on ``device``. Shrinks towards a valid one-layer write of no tokens.

    Example::

        @given(call=noop_write_calls(spec, device="cpu"))
        def test_writes_raise(call):
            assert_noop_write_raises(pool, call.method, call.args, call.kwargs)
    """
    if not isinstance(spec, PoolSpec) or spec.family != "noop":
        raise ValueError(f"spec={spec!r} must be a PoolSpec with family='noop'")
    unknown = sorted(set(methods) - set(NOOP_WRITE_METHODS))
    if not methods or unknown:
        raise ValueError(f"methods={methods!r} must be a non-empty subset of {NOOP_WRITE_METHODS}")
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
    spec: PoolSpec, *, device: str
) -> st.SearchStrategy[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` for a valid ``move_kv_cache(tgt_loc, src_loc)`` on a no-op pool:
    the two location tensors SGLang's callers pass (distinct targets, sources that may
    repeat, anywhere in ``[0, size + page_size)``), by position or by keyword. (Malformed
    moves are hardening: the no-op pool refuses them with ValueError like any pool.)
    Shrinks towards an empty positional move.

    Example::

        @given(arguments=noop_move_arguments(spec, device="cpu"))
        def test_moves(arguments):
            assert_noop_move_changes_nothing(pool, *arguments)
    """
    if not isinstance(spec, PoolSpec) or spec.family != "noop":
        raise ValueError(f"spec={spec!r} must be a PoolSpec with family='noop'")
    return _move_arguments(spec, device)
