"""Property: a pool's own accounting agrees with the bytes it actually holds.

Three reports are checked against the reference formulas and against the storages
behind the buffers (:func:`kvcheck.memory.storage_bytes`):

- ``get_kv_size_bytes()``: MHA ``(k_bytes, v_bytes)``; NoOp ``(0, 0)``; MLA and DSA one
  int (DSA: latent plus index-K, skip layers adding 0), as SGLang 0.5.23 reports;
- ``mem_usage``: the reported bytes in GiB;
- DSA ``get_state_buf_infos()``: one ``(ptr, len, item_len)`` entry per local layer, the
  real buffer's pointer and byte length, ``(0, 0, 0)`` for skip layers.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=2, dtype="bfloat16",
    ...                 skip_topk_layers=(True, False))
    >>> assert_accounting(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
"""

from __future__ import annotations

import math
from typing import Any

from kvcheck.failures import FailureSignature
from kvcheck.geometry import (
    COMPRESS_TAIL_BUFFERS,
    SCALE_BUFFERS,
    allocated_bytes,
    buffer_bytes,
    tensor_nbytes,
)
from kvcheck.memory import buffer_storages, storage_bytes
from kvcheck.properties.assertions import assert_equal, fail
from kvcheck.reference import (
    expected_buffer_bytes,
    expected_compress_tail_buf_infos,
    expected_kv_size_bytes,
    expected_mem_usage,
    expected_scale_buf_infos,
    expected_state_buf_infos,
)
from kvcheck.specs import PoolSpec

__all__ = [
    "assert_accounting",
    "assert_compress_tail_buf_infos",
    "assert_contiguous_buf_infos",
    "assert_held_bytes",
    "assert_kv_size_bytes",
    "assert_mem_usage",
    "assert_scale_buf_infos",
    "assert_state_buf_infos",
    "reported_total_bytes",
]

_GIB = 1 << 30


def reported_total_bytes(reported: Any) -> int:
    """The total of a ``get_kv_size_bytes()`` result (a tuple of parts, or one int).

    Example:
        >>> reported_total_bytes((96, 48)), reported_total_bytes(7)
        (144, 7)
    """
    if isinstance(reported, tuple | list):
        return sum(int(part) for part in reported)
    return int(reported)


def _normalized(reported: Any) -> Any:
    return tuple(int(part) for part in reported) if isinstance(reported, tuple | list) else reported


def assert_held_bytes(pool: Any, spec: PoolSpec, *, call: str = "pool construction") -> None:
    """The storages behind ``pool``'s KV buffers total exactly what ``spec`` needs.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="noop", size=64, page_size=2, layer_num=1, dtype="float16")
        >>> assert_held_bytes(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    held = storage_bytes(pool)
    if held != expected_buffer_bytes(spec):
        detail = "bytes held by the storages of the KV buffers: " + ", ".join(
            f"{item.name}[{item.layer}]={item.storage_nbytes}"
            for item in buffer_storages(pool)
            if item.shared_with is None
        )
        raise fail(got=held, expected=expected_buffer_bytes(spec), call=call, detail=detail)


def _reported_kind(reported_total: float, spec: PoolSpec) -> str:
    """How a wrong report differs: leaving out fused K/V padding, or the DSA compress
    tails, is a kind of its own."""
    if spec.family != "noop" and reported_total == buffer_bytes(spec) != allocated_bytes(spec):
        return "fused K/V page padding unreported"
    tails = _tail_bytes(spec)
    if tails and reported_total == buffer_bytes(spec) - tails:
        return "compress tails unreported"
    scales = _scale_bytes(spec)
    if scales and reported_total == buffer_bytes(spec) - scales:
        return "scale buffers unreported"
    return "reported bytes differ"


def _scale_bytes(spec: PoolSpec) -> int:
    """Bytes of a quantized pool's scale buffers (0 without)."""
    sizes = tensor_nbytes(spec)
    return sum(sum(sizes.get(name, ())) for name in SCALE_BUFFERS)


def _signature(call: str, reported_total: float, spec: PoolSpec) -> FailureSignature:
    return FailureSignature(
        check="accounting",
        call=call,
        kind=_reported_kind(reported_total, spec),
        family=spec.variant,
    )


def _tail_bytes(spec: PoolSpec) -> int:
    if not spec.compress_tails:
        return 0
    return sum(sum(tensor_nbytes(spec)[name]) for name in COMPRESS_TAIL_BUFFERS)


def assert_kv_size_bytes(
    pool: Any,
    spec: PoolSpec,
    *,
    call: str = "pool construction",
    tails_counted: bool = True,
    scales_counted: bool = True,
) -> None:
    """``get_kv_size_bytes()`` equals the formula and, except for NoOp, the bytes held
    (the allocations behind the buffers, fused K/V padding included, a quantized pool's
    scale buffers and dequant workspace too). With ``tails_counted=False`` or
    ``scales_counted=False`` (a target's declared finding) both leave out the DSA compress
    tails or the scale buffers, and every other byte is still checked.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=2, page_size=2, layer_num=3, dtype="bfloat16",
        ...                 head_num=1, head_dim=4)
        >>> assert_kv_size_bytes(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    reported = _normalized(pool.get_kv_size_bytes())
    total = reported_total_bytes(reported)
    left_out = (0 if tails_counted else _tail_bytes(spec)) + (
        0 if scales_counted else _scale_bytes(spec)
    )
    expected = expected_kv_size_bytes(spec)
    if left_out:
        expected = reported_total_bytes(expected) - left_out
    checks = [(reported, expected, "")]
    if spec.family != "noop":
        detail = "the reported total must equal the bytes the buffers' storages hold"
        checks.append((total, storage_bytes(pool) - left_out, detail))
    for got, expected, detail in checks:
        if got != expected:  # the signature (geometry sums) only for a failure: a hot path
            raise fail(
                got=got,
                expected=expected,
                call=f"pool.get_kv_size_bytes() after {call}",
                detail=detail,
                signature=_signature("get_kv_size_bytes", total, spec),
            )


def assert_mem_usage(
    pool: Any,
    spec: PoolSpec,
    *,
    call: str = "pool construction",
    tails_counted: bool = True,
    scales_counted: bool = True,
) -> None:
    """``mem_usage`` is the reported bytes in GiB (``0.0`` for NoOp; without the DSA
    compress tails or the scale buffers when ``tails_counted`` or ``scales_counted`` is
    false).

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=1, dtype="float32")
        >>> assert_mem_usage(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    got = float(pool.mem_usage)
    left_out = (0 if tails_counted else _tail_bytes(spec)) + (
        0 if scales_counted else _scale_bytes(spec)
    )
    expected = expected_mem_usage(spec) - left_out / _GIB
    if not math.isclose(got, expected, rel_tol=1e-12, abs_tol=0.0):
        raise fail(
            got=got,
            expected=expected,
            call=f"pool.mem_usage after {call}",
            signature=_signature("mem_usage", round(got * _GIB), spec),
        )


def assert_state_buf_infos(pool: Any, spec: PoolSpec, *, call: str = "pool construction") -> None:
    """DSA ``get_state_buf_infos()``: per layer the index buffer's pointer, bytes, page bytes.

    Skip layers give ``(0, 0, 0)``; every other layer's entry describes its real buffer
    (``data_ptr()``, ``nbytes``), which must also match the formulas.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="dsa", size=2, page_size=2, layer_num=2, dtype="bfloat16",
        ...                 skip_topk_layers=(False, True))
        >>> assert_state_buf_infos(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    if spec.family != "dsa":
        raise ValueError(f"spec.family={spec.family!r}: only DSA pools have state buffers")
    where = f"pool.get_state_buf_infos() after {call}"
    ptrs, lens, item_lens = (list(part) for part in pool.get_state_buf_infos())
    expected_lens, expected_item_lens = expected_state_buf_infos(spec)
    assert_equal(lens, expected_lens, call=where, detail="lens (bytes per layer)")
    assert_equal(item_lens, expected_item_lens, call=where, detail="item_lens (bytes per page)")
    buffers = pool.index_k_with_scale_buffer
    actual_ptrs = [
        0 if skip else buffer.data_ptr()
        for skip, buffer in zip(spec.skip_mask, buffers, strict=True)
    ]
    assert_equal(ptrs, actual_ptrs, call=where, detail="ptrs (0 for skip layers)")
    actual_lens = [
        0 if skip else buffer.nbytes for skip, buffer in zip(spec.skip_mask, buffers, strict=True)
    ]
    assert_equal(lens, actual_lens, call=where, detail="lens against the buffers' nbytes")


def _row_bytes(tensor: Any) -> int:
    return int(tensor[0].nbytes) if tensor.shape[0] else int(tensor.nbytes)


def assert_contiguous_buf_infos(
    pool: Any, spec: PoolSpec, *, call: str = "pool construction"
) -> None:
    """``get_contiguous_buf_infos()`` describes the KV buffers a transfer engine may read:
    one entry per buffer (MHA/NoOp: every K buffer, then every V buffer; MLA/DSA: every
    latent buffer) with its ``data_ptr()``, its bytes (never more than it holds) and the
    bytes of one page of its rows.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=2, dtype="float16")
        >>> assert_contiguous_buf_infos(resolve_target("kvcheck").make_pool(spec, device="cpu"),
        ...                             spec)
    """
    __tracebackhide__ = True
    where = f"pool.get_contiguous_buf_infos() after {call}"
    names = ("k_buffer", "v_buffer") if spec.family in ("mha", "noop") else ("kv_buffer",)
    buffers = [buffer for name in names for buffer in getattr(pool, name)]

    def signature(kind: str) -> FailureSignature:
        return FailureSignature(
            check="contiguous_buf_infos",
            call="get_contiguous_buf_infos",
            kind=kind,
            family=spec.variant,
        )

    try:
        ptrs, lens, item_lens = (list(part) for part in pool.get_contiguous_buf_infos())
    except Exception as exc:  # a crash is a wrong answer too, reported as one
        raise fail(
            got=f"{type(exc).__name__}: {exc}",
            expected="(ptrs, lens, item_lens)",
            call=where,
            signature=signature(f"raises {type(exc).__name__}"),
        ) from exc

    expected = (
        [buffer.data_ptr() for buffer in buffers],
        [int(buffer.nbytes) for buffer in buffers],
        # A row is a token slot, or a whole page in the HND layout.
        [
            _row_bytes(buffer) * (1 if spec.kv_layout == "hnd" else spec.page_size)
            for buffer in buffers
        ],
    )
    for what, got, wanted in zip(
        ("ptrs", "lens", "item_lens"), (ptrs, lens, item_lens), expected, strict=True
    ):
        if [int(value) for value in got] != wanted:
            raise fail(
                got=got,
                expected=wanted,
                call=where,
                detail=what,
                signature=signature(f"{what} wrong"),
            )


def assert_scale_buf_infos(pool: Any, spec: PoolSpec, *, call: str = "pool construction") -> None:
    """A quantized pool's ``get_kv_scale_buf_infos()`` describes every scale buffer a
    transfer engine must ship with the payload (SGLang's MXFP8 descriptors): each layout's
    K buffers of every layer, then its V buffers (MLA FP4: its latent scales), with the
    buffer's ``data_ptr()``, its bytes and one page; a pool that lacks the method, or
    leaves a scale buffer out, fails.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=2,
        ...                 dtype="float8_e4m3fn", kv_quant="mxfp8", head_dim=32)
        >>> assert_scale_buf_infos(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    where = f"pool.get_kv_scale_buf_infos() after {call}"
    lens, item_lens = expected_scale_buf_infos(spec)
    if not lens:
        return

    def signature(kind: str) -> FailureSignature:
        return FailureSignature(
            check="scale_buf_infos", call="get_kv_scale_buf_infos", kind=kind, family=spec.variant
        )

    describe = getattr(pool, "get_kv_scale_buf_infos", None)
    if not callable(describe):
        raise fail(
            got="no get_kv_scale_buf_infos",
            expected=f"descriptors of {len(lens)} scale buffers",
            call=where,
            signature=signature("scale buffers undescribed"),
        )
    ptrs, got_lens, got_items = (list(part) for part in describe())
    names = [name for name in SCALE_BUFFERS if name in tensor_nbytes(spec)]
    buffers = [buffer for name in names for buffer in getattr(pool, name)]
    for what, got, wanted in (
        ("lens", got_lens, lens),
        ("item_lens", got_items, item_lens),
        ("ptrs", ptrs, [buffer.data_ptr() for buffer in buffers]),
    ):
        if [int(value) for value in got] != wanted:
            raise fail(
                got=got,
                expected=wanted,
                call=where,
                detail=what,
                signature=signature(f"{what} wrong"),
            )


def assert_accounting(
    pool: Any,
    spec: PoolSpec,
    *,
    call: str = "pool construction",
    state_buf_infos: bool = True,
    compress_tails: bool = True,
    tails_counted: bool = True,
    scales_counted: bool = True,
) -> None:
    """All accounting properties at once: held bytes, ``get_kv_size_bytes``, ``mem_usage``
    and, for DSA when ``state_buf_infos`` is true, ``get_state_buf_infos``; for a DSA pool
    with compress tails (or any DSA pool that has the method) when ``compress_tails`` is
    true, ``get_compress_tail_buf_infos``.
    ``tails_counted=False`` expects the reports to leave the tails out (see
    :func:`assert_kv_size_bytes`).

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=2, page_size=1, layer_num=1, dtype="float16")
        >>> assert_accounting(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    assert_held_bytes(pool, spec, call=call)
    counted = {"tails_counted": tails_counted, "scales_counted": scales_counted}
    assert_kv_size_bytes(pool, spec, call=call, **counted)
    assert_mem_usage(pool, spec, call=call, **counted)
    if state_buf_infos and spec.family == "dsa":
        assert_state_buf_infos(pool, spec, call=call)
    # A DSA pool without tails that has the method must describe none.
    describes = callable(getattr(pool, "get_compress_tail_buf_infos", None))
    if compress_tails and spec.family == "dsa" and (spec.compress_tails or describes):
        assert_compress_tail_buf_infos(pool, spec, call=call)


def assert_compress_tail_buf_infos(
    pool: Any, spec: PoolSpec, *, call: str = "pool construction"
) -> None:
    """DSA ``get_compress_tail_buf_infos()``: every layer's key tail, then every layer's
    score tail, each the real tensor's pointer and bytes and one request's ring as the
    item; ``(0, 0, 0)`` for skip layers (their 0-row tensors keep layer offsets aligned);
    three empty lists for a DSA pool without tails.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=2, dtype="bfloat16",
        ...                 skip_topk_layers=(True, False), index_kpool=2,
        ...                 index_kpool_compress=True, max_running_requests=1)
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_compress_tail_buf_infos(pool, spec)
    """
    __tracebackhide__ = True
    where = f"pool.get_compress_tail_buf_infos() after {call}"
    ptrs, lens, item_lens = (list(part) for part in pool.get_compress_tail_buf_infos())
    expected_lens, expected_item_lens = expected_compress_tail_buf_infos(spec)
    assert_equal(lens, expected_lens, call=where, detail="lens (key tails, then score tails)")
    assert_equal(item_lens, expected_item_lens, call=where, detail="item_lens (one request)")
    if not spec.compress_tails:
        assert_equal(ptrs, [], call=where, detail="ptrs (no tails)")
        return
    tails = [pool.get_compress_tail_buffers(layer_id) for layer_id in spec.layer_ids]
    tensors = [pair[0] for pair in tails] + [pair[1] for pair in tails]
    actual = [tensor.data_ptr() if tensor.shape[0] else None for tensor in tensors]
    wanted = [None if length == 0 else ptr for ptr, length in zip(ptrs, lens, strict=True)]
    assert_equal(wanted, actual, call=where, detail="ptrs of the non-empty tails")
