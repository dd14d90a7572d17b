"""sglang 0.5.23's token-to-KV allocators for the ``sglang`` target (``srt/mem_cache/allocator/``).

``token`` builds ``TokenToKVPoolAllocator``, ``paged`` ``PagedTokenToKVPoolAllocator`` (on
CPU its torch bodies ``alloc_extend_naive`` / ``alloc_decode_naive`` run: sglang takes the
Triton kernels only where its platform supports Triton) and ``swa``
``SWATokenToKVPoolAllocator`` over a small ``SWAKVPool`` (one sliding-window layer, one full
layer), which the allocator needs for its sides and its full-to-window mapping; ``pure_swa``
``PureSWATokenToKVPoolAllocator`` over such a pool too (it uses only its sliding-window pool,
as sglang's configurator builds it for a model with no full-attention tokens). Nothing is
stood in: every allocator method here is plain torch.

Example, where sglang is installed::

    from kvcheck.tiers import AllocatorSpec
    allocator = make_allocator(AllocatorSpec(kind="paged", size=16, page_size=4), device="cpu")
    type(allocator).__name__  # 'PagedTokenToKVPoolAllocator'
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from kvcheck.targets.sglang import env
from kvcheck.tiers import AllocatorSpec

ALLOCATOR_MODULE = "sglang.srt.mem_cache.allocator"
SWA_ALLOCATOR_MODULE = "sglang.srt.mem_cache.allocator.swa"
SWA_POOL_MODULE = "sglang.srt.mem_cache.swa_memory_pool"
#: The dtype sglang's allocators are given (they only pass it on; slots do not depend on it).
ALLOCATOR_DTYPE = torch.bfloat16


def _module(name: str) -> Any:
    with env.torchvision_stand_in():
        return importlib.import_module(name)


def swa_pool(spec: AllocatorSpec, *, device: str) -> Any:
    """The ``SWAKVPool`` an SWA allocator of ``spec`` hands out slots of: one full layer, one
    sliding-window layer, one head of 8 (built with sglang's native move on CPU)."""
    pool_class = _module(SWA_POOL_MODULE).SWAKVPool
    with env.native_kv_move():
        return pool_class(
            size=spec.size,
            size_swa=spec.size_swa or spec.size,
            page_size=spec.page_size,
            dtype=ALLOCATOR_DTYPE,
            head_num=1,
            head_dim=8,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device=device,
            enable_memory_saver=False,
        )


def make_allocator(spec: AllocatorSpec, *, device: str, kvcache: Any = None) -> Any:
    """sglang's allocator of ``spec.kind`` (``kvcache``: the device pool whose slots it hands
    out; an SWA allocator gets its own ``SWAKVPool`` when none is given)."""
    allocators = _module(ALLOCATOR_MODULE)
    dtype = ALLOCATOR_DTYPE
    if spec.kind == "token":
        return allocators.TokenToKVPoolAllocator(spec.size, dtype, device, kvcache, spec.need_sort)
    if spec.kind == "paged":
        return allocators.PagedTokenToKVPoolAllocator(
            spec.size, spec.page_size, dtype, device, kvcache, spec.need_sort
        )
    pool = kvcache if kvcache is not None else swa_pool(spec, device=device)
    swa = _module(SWA_ALLOCATOR_MODULE)
    if spec.kind == "pure_swa":
        return swa.PureSWATokenToKVPoolAllocator(
            spec.size, spec.page_size, dtype, device, pool, spec.need_sort
        )
    return swa.SWATokenToKVPoolAllocator(
        spec.size, spec.size_swa, spec.page_size, dtype, device, pool, spec.need_sort
    )
