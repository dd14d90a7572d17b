"""CPU bodies of sglang's JIT HiCache transfer kernels, for its MXFP8 host pool.

sglang 0.5.23's ``MHATokenToKVPoolMXFP8Host`` (``pool_host/mha_mxfp8.py``) moves a page's
fp8 payload and its UE8M0 scale rows with the JIT kernels of
``sglang.kernels.ops.kvcache.hicache`` only: its constructor refuses unless the staged
write-back kernel can be built (``can_use_write_back_jit``: CUDA or HIP, a platform with
``hicache_device_kernels``, rows of 16-byte multiples), and its transfers call
``transfer_hicache_all_layer_staged_lf_pf`` / ``transfer_hicache_one_layer`` (payload) and
``transfer_hicache_all_layer_mla_staged_lf_pf`` / ``transfer_hicache_one_layer_mla``
(scales, one page a row). :func:`cpu_hicache_jit` puts, for one block, CPU bodies of those
four and of the two ``can_use_*`` probes under the names the host pool modules call, and
lets the MHA host module take its CUDA branch (``_is_cuda``, the platform capability) so the
staging buffers are built. Each body writes the bytes the kernel's source documents
(``kernels/jit/csrc/kvcacheio/relayout.cuh``, ``staged_write_back.cuh``, ``hicache.cuh``):

- staged write-back: for page ``i`` of the indices, token ``o < page_size`` and layer ``l``,
  host row ``dst[dst_indices[i * page_size] + o, l]`` takes device row
  ``src_indices[i * page_size] + o`` of layer ``l`` (from the pointer table); only each
  page's first index is read;
- one-layer load: ``dst.view(-1, element_dim)[indices_dst[k]]`` takes
  ``src.view(-1, element_dim)[indices_src[k]]`` for every pair;
- probes: the staged kernel takes rows of 16-byte multiples; the plain one rows that its
  copy groups tile (sglang's own ``_tiles_across_lanes``), nothing compiled.

Raw addresses resolve against the tensors registered for the block
(:func:`kvcheck.targets.sglang.kvcacheio.registered`); a copy that would leave them raises
``IndexError`` (the GPU kernels do not check). Where CUDA is available nothing is patched.

Example:
    >>> src = torch.arange(4, dtype=torch.uint8).reshape(4, 1)
    >>> dst = torch.zeros(4, 1, dtype=torch.uint8)
    >>> transfer_hicache_one_layer_mla(dst, torch.tensor([0]), src, torch.tensor([3]))
    >>> dst.flatten().tolist()
    [3, 0, 0, 0]
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from kvcheck.targets.sglang import kvcacheio

__all__ = [
    "JIT_NAMES",
    "cpu_hicache_jit",
    "transfer_hicache_all_layer_mla_staged_lf_pf",
    "transfer_hicache_all_layer_staged_lf_pf",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
]

#: The sglang modules whose names the stand-ins replace (the MXFP8 host pool's, and the MHA
#: host pool's it runs through ``super()``).
MODULES: tuple[str, ...] = (
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.pool_host.mha_mxfp8",
)
#: Module-level name -> the stand-in's name here (the host pools import the JIT functions
#: as ``jit_*``).
JIT_NAMES: dict[str, str] = {
    "can_use_hicache_jit_kernel": "can_use_hicache_jit_kernel",
    "can_use_write_back_jit_kernel": "can_use_write_back_jit_kernel",
    "jit_transfer_hicache_one_layer": "transfer_hicache_one_layer",
    "jit_transfer_hicache_all_layer_staged_lf_pf": "transfer_hicache_all_layer_staged_lf_pf",
    "jit_transfer_hicache_one_layer_mla": "transfer_hicache_one_layer_mla",
    "jit_transfer_hicache_all_layer_mla_staged_lf_pf": (
        "transfer_hicache_all_layer_mla_staged_lf_pf"
    ),
}


def can_use_write_back_jit_kernel(*, element_size: int, **_: Any) -> bool:
    """The staged kernel's own check (``element_size % 16 == 0``), nothing compiled."""
    return element_size % 16 == 0


def can_use_hicache_jit_kernel(*, element_size: int, **_: Any) -> bool:
    """Whether the plain kernel's copy groups tile a row (sglang's ``_tiles_across_lanes``
    at its default unroll), nothing compiled."""
    hicache = importlib.import_module("sglang.kernels.ops.kvcache.hicache")
    return bool(hicache._tiles_across_lanes(element_size, hicache._default_unroll(element_size)))


def _staged(
    tables: list[torch.Tensor],
    dsts: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    element_size: int,
    page_size: int,
) -> None:
    src, dst = src_indices.cpu().tolist(), dst_indices.cpu().tolist()
    if len(src) != len(dst) or len(src) % page_size:
        raise RuntimeError("staged write-back: index lengths differ or are not whole pages")
    for table, host in zip(tables, dsts, strict=True):
        layers = kvcacheio._table(table)
        rows = host.view(torch.uint8).reshape(host.shape[0], len(layers), -1)
        if rows.shape[-1] != element_size:
            raise RuntimeError("staged write-back: host rows are not one element wide")
        for first in range(0, len(src), page_size):
            for offset in range(page_size):
                token, slot = src[first] + offset, dst[first] + offset
                if not 0 <= slot < rows.shape[0]:
                    raise IndexError(f"staged write-back: host row {slot} outside the host pool")
                for layer, base in enumerate(layers):
                    rows[slot, layer] = kvcacheio._bytes(base + token * element_size, element_size)


def transfer_hicache_all_layer_staged_lf_pf(  # type: ignore[no-untyped-def]
    k_ptr_src, v_ptr_src, src_indices, dst_indices, staging_k, staging_v, dst_k, dst_v, *,
    page_size, element_size=None, **_,
) -> None:  # fmt: skip
    """CPU body: every layer's K and V rows of whole device pages into page-first host rows."""
    size = element_size or staging_k[0, 0].numel() * staging_k.element_size()
    _staged([k_ptr_src, v_ptr_src], [dst_k, dst_v], src_indices, dst_indices, size, page_size)


def transfer_hicache_all_layer_mla_staged_lf_pf(  # type: ignore[no-untyped-def]
    ptr_src, src_indices, dst_indices, staging, dst, *, page_size, element_size=None, **_
) -> None:
    """CPU body: every layer's rows of whole device pages into page-first host rows (one
    component: a latent row, or the MXFP8 host's page of scales at ``page_size=1``)."""
    size = element_size or staging[0, 0].numel() * staging.element_size()
    _staged([ptr_src], [dst], src_indices, dst_indices, size, page_size)


def _one(
    dst: torch.Tensor,
    indices_dst: torch.Tensor,
    src: torch.Tensor,
    indices_src: torch.Tensor,
    element_dim: int,
) -> None:
    if indices_dst.numel() != indices_src.numel():
        raise RuntimeError("one-layer transfer: index lengths differ")
    rows_dst, rows_src = dst.view(-1, element_dim), src.view(-1, element_dim)
    d, s = indices_dst.long().cpu(), indices_src.long().cpu()
    for rows, ids in ((rows_dst, d), (rows_src, s)):
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows.shape[0]):
            raise IndexError(f"one-layer transfer: rows {ids.tolist()} outside {rows.shape[0]}")
    rows_dst[d.to(rows_dst.device)] = rows_src[s.to(rows_src.device)].to(rows_dst.device)


def transfer_hicache_one_layer(  # type: ignore[no-untyped-def]
    k_cache_dst, v_cache_dst, indices_dst, k_cache_src, v_cache_src, indices_src, *,
    element_dim=None, **_,
) -> None:  # fmt: skip
    """CPU body: one layer's K and V rows, pair by pair."""
    width = element_dim or k_cache_dst.size(-1)
    _one(k_cache_dst, indices_dst, k_cache_src, indices_src, width)
    _one(v_cache_dst, indices_dst, v_cache_src, indices_src, width)


def transfer_hicache_one_layer_mla(  # type: ignore[no-untyped-def]
    cache_dst, indices_dst, cache_src, indices_src, *, element_dim=None, **_
) -> None:
    """CPU body: one layer's rows of one component, pair by pair."""
    _one(cache_dst, indices_dst, cache_src, indices_src, element_dim or cache_dst.size(-1))


class _Capabilities:
    """The platform's capabilities with the HiCache device kernels on."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name == "hicache_device_kernels":
            return True
        return getattr(self._real, name)


@contextlib.contextmanager
def cpu_hicache_jit(*buffers: Any) -> Iterator[None]:
    """Within the block, sglang's MHA and MXFP8 host pool modules have the CPU bodies of
    the JIT HiCache kernels (see the module), take their CUDA branch, and raw addresses
    inside ``buffers`` (the device pool's and the host pool's tensors) resolve."""
    if torch.cuda.is_available():
        yield
        return
    modules = [importlib.import_module(name) for name in MODULES]
    platform = importlib.import_module("sglang.srt.platforms").current_platform
    saved = [(module, dict(module.__dict__)) for module in modules]
    # 0.5.22 on: the host pools ask the platform's capabilities for the HiCache device
    # kernels; 0.5.21's platform has none (its host pools ask _is_cuda only).
    real_capabilities = getattr(platform, "capabilities", None)
    try:
        for module in modules:
            for name, here in JIT_NAMES.items():
                if name in module.__dict__:
                    setattr(module, name, globals()[here])
        modules[0]._is_cuda = True  # type: ignore[attr-defined]
        if real_capabilities is not None:
            platform.capabilities = _Capabilities(real_capabilities)
        with kvcacheio.registered(*buffers):
            yield
    finally:
        if real_capabilities is not None:
            platform.capabilities = real_capabilities
        for module, old in saved:
            for name in (*JIT_NAMES, "_is_cuda"):
                if name in old:
                    setattr(module, name, old[name])
