"""CPU bodies of ``sgl_kernel.kvcacheio``'s host-transfer ops (:data:`OP_NAMES`), for sglang's
host pools.

On CPU, sglang 0.5.23's ``pool_host.{mha,mla,dsa}`` never import the transfer ops (they come
from ``sgl_kernel.kvcacheio`` on CUDA/HIP only), so every ``backup_from_device_all_layer`` and
``load_to_device_per_layer`` raises ``NameError``. :func:`installed` puts these bodies under
those names for the duration of a block. They transcribe sgl-kernel's
``csrc/kvcacheio/transfer.cu``: the *kernel* ops copy ``item_size`` bytes per index pair from
a base address plus an offset (``lf``: ``base + t*item``, per layer from a pointer table or a
per-layer tensor; ``pf``: ``base + t*layout_dim + l*item``; ``ph``: page-head,
``base + (t//ps)*ps*dim + (dim/H)*h*ps + (t%ps)*dim/H + l*item/H``), skipping pairs with a
negative id, requiring int64 indices of equal length and an item size that is a multiple of
8; the *direct* ops are the C++ slice copies (token runs; one representative per page for
the page-first-direct ones). Raw addresses are resolved against the tensors registered for
the block (the device pool's and the host pool's buffers) and a copy that would leave them
raises ``IndexError`` (the CUDA kernels do not check).

Example:
    >>> import torch
    >>> src, dst = torch.arange(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    >>> with registered(src, dst):
    ...     transfer_kv_per_layer_mla(src, dst, torch.tensor([1]), torch.tensor([5]), 8)
    >>> dst.tolist()
    [0, 0, 0, 0, 0, 1, 0, 0]
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch

#: The op names, as sglang's host pool modules import them.
OP_NAMES: tuple[str, ...] = (
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
)
#: The sglang modules that call them.
HOST_POOL_MODULES: tuple[str, ...] = (
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.pool_host.dsa",
)

_STORES: contextvars.ContextVar[Mapping[int, torch.Tensor]] = contextvars.ContextVar(
    "kvcheck_kvcacheio_stores", default=MappingProxyType({})
)


def _tensors(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from _tensors(value)


@contextlib.contextmanager
def registered(*values: Any) -> Iterator[None]:
    """Within the block, raw addresses inside ``values``' storages (tensors, or lists and
    tuples of them) resolve to their bytes."""
    stores = dict(_STORES.get())
    for tensor in _tensors(values):
        storage = tensor.untyped_storage()
        stores[storage.data_ptr()] = torch.empty(0, dtype=torch.uint8).set_(storage)
    token = _STORES.set(stores)
    try:
        yield
    finally:
        _STORES.reset(token)


@contextlib.contextmanager
def installed(modules: Sequence[Any], *buffers: Any) -> Iterator[None]:
    """Within the block, ``modules`` (sglang's host pool modules) have the ops, and the
    addresses of ``buffers`` resolve."""
    saved = [(module, {name: module.__dict__.get(name) for name in OP_NAMES}) for module in modules]
    try:
        for module in modules:
            for name in OP_NAMES:
                setattr(module, name, globals()[name])
        with registered(*buffers):
            yield
    finally:
        for module, old in saved:
            for name, value in old.items():
                if value is None:
                    module.__dict__.pop(name, None)
                else:
                    setattr(module, name, value)


def _bytes(address: int, count: int) -> torch.Tensor:
    for start, flat in _STORES.get().items():
        if start <= address and address + count <= start + flat.numel():
            return flat[address - start : address - start + count]
    raise IndexError(f"kvcacheio stand-in: {count} bytes at {address:#x} outside every buffer")


def _ptr(tensor: torch.Tensor) -> int:
    return int(tensor.data_ptr())


def _table(table: torch.Tensor) -> list[int]:
    return [int(x) for x in table.view(torch.int64).tolist()]


def _check(src: torch.Tensor, dst: torch.Tensor, item_size: int) -> None:
    if src.dtype != torch.int64 or dst.dtype != torch.int64:
        raise RuntimeError("kvcacheio: indices must be int64")
    if src.numel() != dst.numel():
        raise RuntimeError("kvcacheio: source and destination indices differ in length")
    if item_size % 8:
        raise RuntimeError("kvcacheio: item size must be a multiple of 8 bytes")


Offsets = Callable[[int, int], list[int]]


def _run(
    src_at: Offsets,
    dst_at: Offsets,
    src: torch.Tensor,
    dst: torch.Tensor,
    layers: Iterable[int],
    sizes: list[int],
) -> None:
    layers = list(layers)
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if s < 0 or d < 0:  # upstream skips negative ids
            continue
        for layer in layers:
            for source, target, size in zip(src_at(s, layer), dst_at(d, layer), sizes, strict=True):
                _bytes(target, size).copy_(_bytes(source, size).clone())


def _page_head(
    base: int, token: int, layer: int, item: int, dim: int, head: int, heads: int, page: int
) -> int:
    return (
        base
        + token // page * page * dim
        + dim // heads * head * page
        + token % page * dim // heads
        + layer * item // heads
    )


# --- the kernel ops (byte-addressed) ----------------------------------------------------------


def transfer_kv_per_layer(
    src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size, *args, **kwargs
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    bases = [(_ptr(src_k), _ptr(dst_k)), (_ptr(src_v), _ptr(dst_v))]
    _run(
        lambda t, _l: [s + t * item_size for s, _ in bases],
        lambda t, _l: [d + t * item_size for _, d in bases],
        src_indices,
        dst_indices,
        [0],
        [item_size] * 2,
    )


def transfer_kv_per_layer_pf_lf(
    src_k,
    dst_k,
    src_v,
    dst_v,
    src_indices,
    dst_indices,
    layer_id,
    item_size,
    src_layout_dim,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    bases = [(_ptr(src_k), _ptr(dst_k)), (_ptr(src_v), _ptr(dst_v))]
    _run(
        lambda t, layer: [s + t * src_layout_dim + layer * item_size for s, _ in bases],
        lambda t, _l: [d + t * item_size for _, d in bases],
        src_indices,
        dst_indices,
        [layer_id],
        [item_size] * 2,
    )


def transfer_kv_per_layer_ph_lf(
    src_k,
    dst_k,
    src_v,
    dst_v,
    src_indices,
    dst_indices,
    layer_id,
    item_size,
    src_layout_dim,
    page_size,
    head_num,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    part = item_size // head_num
    bases = [(_ptr(src_k), _ptr(dst_k)), (_ptr(src_v), _ptr(dst_v))]
    heads = range(head_num)
    _run(
        lambda t, ly: [
            _page_head(s, t, ly, item_size, src_layout_dim, h, head_num, page_size)
            for s, _ in bases
            for h in heads
        ],
        lambda t, _l: [d + t * item_size + part * h for _, d in bases for h in heads],
        src_indices,
        dst_indices,
        [layer_id],
        [part] * (2 * head_num),
    )


def transfer_kv_all_layer(
    src_k_layers,
    dst_k_layers,
    src_v_layers,
    dst_v_layers,
    src_indices,
    dst_indices,
    item_size,
    num_layers,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    tables = [
        (_table(src_k_layers), _table(dst_k_layers)),
        (_table(src_v_layers), _table(dst_v_layers)),
    ]
    _run(
        lambda t, ly: [s[ly] + t * item_size for s, _ in tables],
        lambda t, ly: [d[ly] + t * item_size for _, d in tables],
        src_indices,
        dst_indices,
        range(num_layers),
        [item_size] * 2,
    )


def transfer_kv_all_layer_lf_pf(
    src_k_layers,
    dst_k,
    src_v_layers,
    dst_v,
    src_indices,
    dst_indices,
    item_size,
    dst_layout_dim,
    num_layers,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    pairs = [(_table(src_k_layers), _ptr(dst_k)), (_table(src_v_layers), _ptr(dst_v))]
    _run(
        lambda t, ly: [s[ly] + t * item_size for s, _ in pairs],
        lambda t, layer: [d + t * dst_layout_dim + layer * item_size for _, d in pairs],
        src_indices,
        dst_indices,
        range(num_layers),
        [item_size] * 2,
    )


def transfer_kv_all_layer_lf_ph(
    src_k_layers,
    dst_k,
    src_v_layers,
    dst_v,
    src_indices,
    dst_indices,
    item_size,
    dst_layout_dim,
    num_layers,
    page_size,
    head_num,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    part = item_size // head_num
    pairs = [(_table(src_k_layers), _ptr(dst_k)), (_table(src_v_layers), _ptr(dst_v))]
    heads = range(head_num)
    _run(
        lambda t, ly: [s[ly] + t * item_size + part * h for s, _ in pairs for h in heads],
        lambda t, ly: [
            _page_head(d, t, ly, item_size, dst_layout_dim, h, head_num, page_size)
            for _, d in pairs
            for h in heads
        ],
        src_indices,
        dst_indices,
        range(num_layers),
        [part] * (2 * head_num),
    )


def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, *args, **kwargs):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    s, d = _ptr(src), _ptr(dst)
    _run(
        lambda t, _l: [s + t * item_size],
        lambda t, _l: [d + t * item_size],
        src_indices,
        dst_indices,
        [0],
        [item_size],
    )


def transfer_kv_per_layer_mla_pf_lf(
    src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim, *args, **kwargs
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    s, d = _ptr(src), _ptr(dst)
    _run(
        lambda t, layer: [s + t * src_layout_dim + layer * item_size],
        lambda t, _l: [d + t * item_size],
        src_indices,
        dst_indices,
        [layer_id],
        [item_size],
    )


def transfer_kv_all_layer_mla(
    src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers, *args, **kwargs
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    s, d = _table(src_layers), _table(dst_layers)
    _run(
        lambda t, ly: [s[ly] + t * item_size],
        lambda t, ly: [d[ly] + t * item_size],
        src_indices,
        dst_indices,
        range(num_layers),
        [item_size],
    )


def transfer_kv_all_layer_mla_lf_pf(
    src_layers,
    dst,
    src_indices,
    dst_indices,
    item_size,
    dst_layout_dim,
    num_layers,
    *args,
    **kwargs,
):  # type: ignore[no-untyped-def]
    _check(src_indices, dst_indices, item_size)
    s, d = _table(src_layers), _ptr(dst)
    _run(
        lambda t, ly: [s[ly] + t * item_size],
        lambda t, layer: [d + t * dst_layout_dim + layer * item_size],
        src_indices,
        dst_indices,
        range(num_layers),
        [item_size],
    )


# --- the direct ops (slice copies) -------------------------------------------------------------


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):  # type: ignore[no-untyped-def]
    """Per maximal run where both sides step by one, per layer: ``dst[d:d+n] = src[s:s+n]``."""
    if len(src_layers) != len(dst_layers):
        raise RuntimeError("transfer_kv_direct: layer counts differ")
    if (
        src_indices.numel() != dst_indices.numel()
        or page_size <= 0
        or src_indices.numel() % page_size
    ):
        raise RuntimeError("transfer_kv_direct: index lengths differ or are not whole pages")
    s, d = src_indices.cpu().tolist(), dst_indices.cpu().tolist()
    start = 0
    for i in range(len(s)):
        if i < len(s) - 1 and s[i + 1] - s[i] == 1 and d[i + 1] - d[i] == 1:
            continue
        count = i + 1 - start
        for source, target in zip(src_layers, dst_layers, strict=True):
            target[d[start] : d[start] + count].copy_(source[s[start] : s[start] + count])
        start = i + 1


def _page_first_direct(
    src_ptrs, dst_ptrs, src_indices, dst_indices, start_layer, page_size, to_pages
):  # type: ignore[no-untyped-def]
    if (
        src_indices.numel() != dst_indices.numel()
        or page_size <= 0
        or src_indices.numel() % page_size
    ):
        raise RuntimeError(
            "page-first direct transfer: index lengths differ or are not whole pages"
        )
    s, d = src_indices.cpu().tolist(), dst_indices.cpu().tolist()
    paged = dst_ptrs if to_pages else src_ptrs
    flat = src_ptrs if to_pages else dst_ptrs
    mla = len(paged) == 1
    layers = len(flat) if mla else len(flat) // 2
    for i in range(len(s) // page_size):
        first = i * page_size
        if to_pages:
            row, page = s[first], d[first] // page_size
        else:
            page, row = s[first] // page_size, d[first]
        for j in range(layers):
            sides = (
                [(paged[0], flat[j])]
                if mla
                else [(paged[0], flat[j]), (paged[1], flat[j + layers])]
            )
            for pages, rows in sides:
                block = pages.select(0, page).select(0, start_layer + j)
                if to_pages:
                    block[0:page_size].copy_(rows[row : row + page_size])
                else:
                    rows[row : row + page_size].copy_(block[0:page_size])


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size
):  # type: ignore[no-untyped-def]
    _page_first_direct(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size, False)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):  # type: ignore[no-untyped-def]
    _page_first_direct(src_ptrs, dst_ptrs, src_indices, dst_indices, 0, page_size, True)
