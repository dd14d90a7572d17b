"""kvcheck's own token-to-KV allocators, modelled on SGLang 0.5.23's (``srt/mem_cache/allocator/``).

They hand out the slot ids of a device pool: ``TokenToKVPoolAllocator`` (page size 1),
``PagedTokenToKVPoolAllocator`` (pages; ``alloc_extend`` / ``alloc_decode`` page-aligned) and
``SWATokenToKVPoolAllocator`` (a full side and a sliding-window side) and
``PureSWATokenToKVPoolAllocator`` (every layer sliding-window: one pool). Same constructors and
methods as SGLang's; unlike SGLang's they refuse bad calls (``ValueError``, nothing changed)
and ask both sides before any sliding-window allocation.

Example:
    >>> import torch
    >>> allocator = TokenToKVPoolAllocator(4, torch.bfloat16, "cpu", None, False)
    >>> allocator.alloc(2).tolist(), allocator.available_size()
    ([1, 2], 2)
"""

from kvcheck.allocators.base import PageAllocator
from kvcheck.allocators.paged import Growth, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvcheck.allocators.pure_swa import PureSWATokenToKVPoolAllocator
from kvcheck.allocators.swa import SWATokenToKVPoolAllocator

__all__ = [
    "Growth",
    "PageAllocator",
    "PagedTokenToKVPoolAllocator",
    "PureSWATokenToKVPoolAllocator",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
]
