"""kvcheck's pure sliding-window allocator, with SGLang 0.5.23's API.

A model whose every layer is sliding-window attention has no full-attention pool: SGLang
0.5.23's configurator builds ``PureSWATokenToKVPoolAllocator(size_swa, page_size, dtype,
device, kvcache, need_sort)`` for a hybrid-SWA model with no full-attention tokens
(``kv_cache_configurator.py``), at page size 1. Its one pool serves as both sides: a slot's
window peer is the slot itself, ``free_swa`` (a token left the window) releases the slot,
``free`` releases what is still held and ``free_full`` releases nothing (there is no full
side). A request whose window was freed is therefore freed as SGLang's callers free one,
``free_full`` of the window-freed part and ``free`` of the rest: ``free`` of a slot
``free_swa`` released is a double free, refused here (``ValueError``, nothing changed).

Example:
    >>> import torch
    >>> allocator = PureSWATokenToKVPoolAllocator(4, 1, torch.bfloat16, "cpu", None, False)
    >>> row = allocator.alloc(3)
    >>> allocator.free_swa(row[:1])
    >>> allocator.available_size(), allocator.translate_loc_from_full_to_swa(row).tolist()
    (2, [1, 2, 3])
    >>> allocator.free_full(row[:1]); allocator.free(row[1:]); allocator.available_size()
    4
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.allocators import _refusals
from kvcheck.allocators.capacity import CapacityHooks
from kvcheck.allocators.paged import TokenToKVPoolAllocator
from kvcheck.allocators.segments import SegmentFrees

__all__ = ["PureSWATokenToKVPoolAllocator"]


class PureSWATokenToKVPoolAllocator(SegmentFrees, CapacityHooks):
    """One token allocator of ``size_swa`` slots serving as the full and the window side."""

    def __init__(
        self,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        device: Any,
        kvcache: Any,
        need_sort: bool,
    ) -> None:
        if page_size != 1:
            raise ValueError(f"PureSWATokenToKVPoolAllocator: page_size={page_size!r} (need 1)")
        self.page_size = 1
        self.dtype = dtype
        self.device = device
        self._kvcache = kvcache
        self.swa_attn_allocator = TokenToKVPoolAllocator(size_swa, dtype, device, None, need_sort)
        self.full_attn_allocator = self.swa_attn_allocator
        self.need_sort = need_sort

    # -- sizes -------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return int(self.swa_attn_allocator.size)

    size_full = size_swa = size

    def available_size(self) -> int:
        return int(self.swa_attn_allocator.available_size())

    full_available_size = swa_available_size = available_size

    def get_kvcache(self) -> Any:
        return self._kvcache

    def clear(self) -> None:
        self.swa_attn_allocator.clear()

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The slots themselves (one pool: each slot is its own window peer)."""
        where = "translate_loc_from_full_to_swa"
        limit = self.size + 1
        for slot in _refusals.slot_ids(where, "kv_indices", kv_indices):
            if not -1 <= slot < limit:
                raise ValueError(f"{where}: slot {slot} not in [-1, {limit})")
        return kv_indices

    translate_swa_indices_for_transfer = translate_loc_from_full_to_swa

    def _problems(self) -> list[str]:
        return self.swa_attn_allocator._problems()

    # -- allocating --------------------------------------------------------------------------

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots, or None (nothing changes) when fewer are free."""
        return self.swa_attn_allocator.alloc(need_size)

    def alloc_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """Not at page size 1 (as SGLang raises)."""
        raise NotImplementedError("the pure sliding-window allocator takes page_size 1 only")

    alloc_decode = alloc_extend_swa_tail = alloc_extend

    # -- freeing -----------------------------------------------------------------------------

    def _free_ids(self, where: str, free_index: Any, full_only: bool) -> list[int]:
        if full_only:
            return self._released_ids(where, free_index)
        return self.swa_attn_allocator.check_free(free_index, where=where)

    def _released_ids(self, where: str, free_index: Any) -> list[int]:
        """``free_full``'s slots: ids in range (they were released by ``free_swa``)."""
        ids = _refusals.slot_ids(where, "free_index", free_index)
        _refusals.distinct(where, "free_index", ids)
        for slot in ids:
            if not 0 < slot <= self.size:
                raise ValueError(f"{where}: slot {slot} not in [1, {self.size + 1})")
        return ids

    def free(self, free_index: torch.Tensor) -> None:
        """Release the slots named (each held, once)."""
        where = "PureSWATokenToKVPoolAllocator.free"
        self.swa_attn_allocator._free_checked(self._free_ids(where, free_index, False))

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Release the slots named: they left the window, and the window is the only pool."""
        where = "PureSWATokenToKVPoolAllocator.free_swa"
        self.swa_attn_allocator._free_checked(self._free_ids(where, free_index, False))

    def free_full(self, free_index: torch.Tensor) -> None:
        """Nothing to release (no full side): ``free_swa`` released these slots already."""
        self._released_ids("PureSWATokenToKVPoolAllocator.free_full", free_index)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free_swa`` of a segment of a request's row."""
        self._segment_ids("PureSWATokenToKVPoolAllocator.free_swa_segment", free_index, start_pos)
        self.free_swa(free_index)

    def free_group_begin(self) -> None:
        """Defer frees until :meth:`free_group_end`."""
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        """Release what the group's frees named."""
        self.swa_attn_allocator.free_group_end()
