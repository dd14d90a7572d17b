"""Property: a DSA skip-topk layer holds zero index-K bytes, however you measure.

Measured three ways (:mod:`kvcheck.memory`):

- by storage, on any device: each skip layer's index buffer is empty, and the distinct
  storages behind all KV buffers total exactly the bytes the spec needs, so a zero-row
  view cut from a full allocation is caught too;
- by the CUDA caching allocator: building the pool raises ``torch.cuda.memory_allocated``
  by exactly the expected blocks, skip layers adding 0;
- on ``meta`` at production scale: shapes alone, for configurations far larger than any
  test machine's memory.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=3, dtype="bfloat16",
    ...                 skip_topk_layers=(True, False, True))
    >>> target = resolve_target("kvcheck")
    >>> assert_skip_layers_hold_no_storage(target.make_pool(spec, device="cpu"), spec)
    >>> meta_pool = assert_meta_pool_bytes(target, spec)
"""

from __future__ import annotations

from typing import Any

from kvcheck.geometry import INDEX_BUFFER, allocated_bytes, buffer_bytes, tensor_nbytes
from kvcheck.memory import (
    buffer_storages,
    expected_cuda_allocation_bytes,
    measure_cuda_allocation,
    shape_bytes,
    storage_bytes,
)
from kvcheck.properties.assertions import fail
from kvcheck.specs import PoolSpec

__all__ = [
    "assert_cuda_allocation_matches",
    "assert_meta_pool_bytes",
    "assert_skip_layers_hold_no_storage",
]


def _require_dsa(spec: Any) -> PoolSpec:
    if not isinstance(spec, PoolSpec) or spec.family != "dsa":
        raise ValueError(f"spec={spec!r} must be a PoolSpec with family='dsa'")
    return spec


def assert_skip_layers_hold_no_storage(pool: Any, spec: PoolSpec) -> None:
    """Each skip layer's index buffer is empty and owns no storage; totals match the spec.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="dsa", size=2, page_size=1, layer_num=2, dtype="float16",
        ...                 skip_topk_layers=(False, True))
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_skip_layers_hold_no_storage(pool, spec)
    """
    __tracebackhide__ = True
    _require_dsa(spec)
    storages = [item for item in buffer_storages(pool) if item.name == INDEX_BUFFER]
    if len(storages) != spec.layer_num:
        raise fail(
            got=len(storages),
            expected=spec.layer_num,
            call="pool construction",
            detail=f"{INDEX_BUFFER} must keep one entry per layer, skip layers included",
        )
    for item, skip in zip(storages, spec.skip_mask, strict=True):
        if not skip:
            continue
        where = f"{INDEX_BUFFER}[{item.layer}] (global layer {spec.start_layer + item.layer})"
        if item.nbytes:
            raise fail(
                got=item.nbytes,
                expected=0,
                call="pool construction",
                detail=f"{where} is a skip layer but its tensor spans bytes",
            )
        if item.storage_nbytes and item.shared_with is None:
            raise fail(
                got=item.storage_nbytes,
                expected=0,
                call="pool construction",
                detail=f"{where} is a skip layer but its empty tensor pins a storage of bytes",
            )
    held = storage_bytes(pool)
    if held != allocated_bytes(spec):
        raise fail(
            got=held,
            expected=allocated_bytes(spec),
            call="pool construction",
            detail="bytes held by the distinct storages behind the KV buffers",
        )


def assert_cuda_allocation_matches(target: Any, spec: PoolSpec, *, device: str) -> Any:
    """Building ``spec`` on CUDA raises ``torch.cuda.memory_allocated`` by exactly the
    expected blocks (:func:`kvcheck.memory.expected_cuda_allocation_bytes`); skip layers
    add 0. Returns the pool.

    Example::

        assert_cuda_allocation_matches(target, spec, device="cuda:0")
    """
    __tracebackhide__ = True
    pool, delta = measure_cuda_allocation(
        lambda: target.make_pool(spec, device=device), device=device
    )
    expected = expected_cuda_allocation_bytes(spec)
    if delta != expected:
        per_tensor = {name: sizes for name, sizes in tensor_nbytes(spec).items() if sizes}
        raise fail(
            got=delta,
            expected=expected,
            call=f"target.make_pool(spec, device={device!r})",
            detail=(
                "torch.cuda.memory_allocated() delta; expected one 512-byte-rounded block per "
                f"non-empty tensor of {per_tensor} (skip layers 0)"
            ),
        )
    return pool


def assert_meta_pool_bytes(target: Any, spec: PoolSpec) -> Any:
    """On ``meta`` the pool's buffers span exactly the spec's bytes, skip layers none.

    Works at any scale (nothing is allocated). Returns the meta pool.

    Example:
        >>> from kvcheck.memory import production_dsa_spec
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> from kvcheck.targets import resolve_target
        >>> spec = production_dsa_spec(GLM_5_2_LIKE, num_tokens=4_000_000)
        >>> pool = assert_meta_pool_bytes(resolve_target("kvcheck"), spec)
    """
    __tracebackhide__ = True
    pool = target.make_pool(spec, device="meta")
    expected_sizes = tensor_nbytes(spec)
    for name, sizes in expected_sizes.items():
        tensors = getattr(pool, name)
        got_sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
        if got_sizes != sizes:
            first = next(
                (
                    i
                    for i, (got, want) in enumerate(zip(got_sizes, sizes, strict=False))
                    if got != want
                ),
                min(len(got_sizes), len(sizes)),
            )
            skip = spec.skip_mask[first] if name == INDEX_BUFFER and first < len(sizes) else None
            raise fail(
                got=got_sizes[first] if first < len(got_sizes) else "missing",
                expected=sizes[first] if first < len(sizes) else "no such layer",
                call="target.make_pool(spec, device='meta')",
                detail=f"bytes of {name}[{first}]"
                + ("" if skip is None else f" (skip layer: {skip})"),
            )
    for measured, expected, how in (
        (shape_bytes(pool), buffer_bytes(spec), "shapes"),
        (storage_bytes(pool), allocated_bytes(spec), "storages"),
    ):
        if measured != expected:
            raise fail(
                got=measured,
                expected=expected,
                call="target.make_pool(spec, device='meta')",
                detail=f"total bytes of the KV buffers by {how}",
            )
    return pool
