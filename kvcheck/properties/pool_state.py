"""Read a pool's buffers as bytes, in the reference model's layout, and compare them.

Every buffer becomes a ``[rows, row_bytes]`` ``uint8`` numpy array on the host: exactly
what :meth:`kvcheck.reference.ReferencePool.expected_buffers` renders, so a pool and its
reference compare byte for byte whatever the dtype (fp8 pools store ``uint8`` already;
``bfloat16`` rows become two bytes per value). Comparisons run in bulk and only walk the
data to name the first difference: buffer, layer (local and global), row and byte, and
for DSA index-K pages the token and whether the byte is part of its key or its scale.

Example:
    >>> from kvcheck.reference import ReferencePool
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=2, dtype="bfloat16",
    ...                 skip_topk_layers=(False, True))
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> [a.shape for a in read_pool_buffers(pool)["index_k_with_scale_buffer"]]
    [(3, 264), (0, 264)]
    >>> assert_pool_matches_reference(pool, ReferencePool(spec), call="construction")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvcheck.memory import KV_BUFFER_ATTRIBUTES
from kvcheck.properties._assertions import assert_bytes_equal, fail
from kvcheck.reference import ReferencePool, index_k_row_bytes, index_scale_row_bytes

__all__ = [
    "BUFFER_ATTRIBUTES",
    "PoolBytes",
    "assert_pool_matches_reference",
    "assert_same_pool_bytes",
    "read_buffer",
    "read_pool_buffers",
]

#: Pool attributes that hold per-layer buffers, in the order failures are reported.
BUFFER_ATTRIBUTES: tuple[str, ...] = KV_BUFFER_ATTRIBUTES

#: Buffer name -> one ``[rows, row_bytes]`` uint8 array per local layer.
PoolBytes = dict[str, list[np.ndarray]]


def read_buffer(tensor: torch.Tensor) -> np.ndarray:
    """A host copy of ``tensor``'s bytes as ``[rows, row_bytes]`` ``uint8`` (any dtype).

    Raises ``ValueError`` for a ``meta`` tensor, which holds no bytes to read.

    Example:
        >>> read_buffer(torch.ones(2, 1, dtype=torch.bfloat16)).tolist()
        [[128, 63], [128, 63]]
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor={tensor!r} is not a torch.Tensor")
    if tensor.device.type == "meta":
        raise ValueError(f"tensor on device {tensor.device} holds no bytes to read")
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor[0].numel() * tensor.element_size() if rows else _row_bytes(tensor)
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat.cpu().numpy().reshape(rows, row_bytes).copy()


def _row_bytes(tensor: torch.Tensor) -> int:
    inner = 1
    for size in tensor.shape[1:]:
        inner *= size
    return inner * tensor.element_size()


def read_pool_buffers(pool: Any, names: Iterable[str] | None = None) -> PoolBytes:
    """Every per-layer buffer of ``pool`` as bytes; ``names=None`` means every buffer it has.

    Example:
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> pool = MHATokenToKVPool(size=2, page_size=1, dtype=torch.float8_e5m2,
        ...                         head_num=1, head_dim=2, layer_num=1, device="cpu")
        >>> sorted(read_pool_buffers(pool))
        ['k_buffer', 'v_buffer']
    """
    chosen = BUFFER_ATTRIBUTES if names is None else tuple(names)
    return {
        name: [read_buffer(layer) for layer in getattr(pool, name)]
        for name in chosen
        if getattr(pool, name, None) is not None
    }


def _layer_label(name: str, local: int, start_layer: int) -> str:
    return f"{name}[{local}] (global layer {start_layer + local})"


def _index_k_position(reference: ReferencePool, page: int, column: int) -> str:
    """Which token and which part (key or scale) a byte of an index-K page row belongs to."""
    spec = reference.spec
    key = index_k_row_bytes(spec.index_head_dim)
    scale = index_scale_row_bytes(spec.index_head_dim)
    keys_end = spec.page_size * key
    if column < keys_end:
        offset, part, byte = column // key, "key", column % key
    else:
        offset, part, byte = (column - keys_end) // scale, "scale", (column - keys_end) % scale
    return f"token {page * spec.page_size + offset} {part} byte {byte}"


def _compare_layers(
    name: str,
    got: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    *,
    start_layer: int,
    call: str,
    describe_cell: Any = None,
) -> None:
    __tracebackhide__ = True
    if len(got) != len(expected):
        raise fail(
            got=len(got), expected=len(expected), call=call, detail=f"number of {name} layers"
        )
    for local, (got_layer, expected_layer) in enumerate(zip(got, expected, strict=True)):
        label = _layer_label(name, local, start_layer)
        if describe_cell is not None and got_layer.shape == expected_layer.shape:
            mismatch = np.argwhere(got_layer != expected_layer)
            if mismatch.size:
                row, column = (int(i) for i in mismatch[0])
                label = f"{label} ({describe_cell(row, column)})"
        assert_bytes_equal(got_layer, expected_layer, what=label, call=call)


def assert_pool_matches_reference(pool: Any, reference: ReferencePool, *, call: str) -> None:
    """Every buffer of ``pool`` equals ``reference``'s rendering of it, byte for byte.

    ``call`` names the operation just performed. A failure names the first differing
    buffer, layer, row and byte (for index-K pages also the token and key/scale part).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=1, dtype="float32")
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> pool.kv_buffer[0][1] = 1.0
        >>> assert_pool_matches_reference(pool, ReferencePool(spec), call="poke")
        Traceback (most recent call last):
        ...
        kvcheck.properties._assertions.PropertyFailure: got 128 but should be 0 [poke]
        kv_buffer[0] (global layer 0) first differs at row=1, byte=2
    """
    __tracebackhide__ = True
    expected = reference.expected_buffers()
    start_layer = reference.spec.start_layer
    for name, expected_layers in expected.items():
        tensors = getattr(pool, name, None)
        if tensors is None:
            raise fail(
                got="missing",
                expected=f"{len(expected_layers)} layers",
                call=call,
                detail=f"pool attribute {name}",
            )
        got_layers = [read_buffer(layer) for layer in tensors]
        describe = None
        if name == "index_k_with_scale_buffer":

            def describe(row: int, column: int) -> str:
                return _index_k_position(reference, row, column)

        _compare_layers(
            name,
            got_layers,
            expected_layers,
            start_layer=start_layer,
            call=call,
            describe_cell=describe,
        )


def assert_same_pool_bytes(
    got: Mapping[str, Sequence[np.ndarray]],
    expected: Mapping[str, Sequence[np.ndarray]],
    *,
    start_layer: int,
    call: str,
) -> None:
    """Two snapshots from :func:`read_pool_buffers` are identical (e.g. around a rejected call).

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool = MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                         kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1,
        ...                         device="cpu")
        >>> before = read_pool_buffers(pool)
        >>> assert_same_pool_bytes(read_pool_buffers(pool), before, start_layer=0, call="read")
    """
    __tracebackhide__ = True
    if sorted(got) != sorted(expected):
        raise fail(got=sorted(got), expected=sorted(expected), call=call, detail="buffer names")
    for name in expected:
        _compare_layers(name, got[name], expected[name], start_layer=start_layer, call=call)
