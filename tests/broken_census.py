"""Deliberately broken pools for the census properties: each hides one tensor from one
whole-pool operation (helpers, not tests; run by ``test_census_properties_fail.py``)."""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.pools import MHATokenToKVPool


class AccountingHidesV(MHATokenToKVPool):
    """get_kv_size_bytes leaves out every V buffer."""

    def get_kv_size_bytes(self) -> tuple[int, int]:
        return super().get_kv_size_bytes()[0], 0


class HostCopyHidesLastV(MHATokenToKVPool):
    """load_cpu_copy does not restore the last layer's V buffer."""

    def load_cpu_copy(self, kv_cache_cpu: Any, indices: torch.Tensor) -> None:
        kept = self.v_buffer[-1][indices].clone()
        super().load_cpu_copy(kv_cache_cpu, indices)
        self.v_buffer[-1][indices] = kept


class MoveHidesLastK(MHATokenToKVPool):
    """move_kv_cache does not move the last layer's K buffer."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        kept = self.k_buffer[-1][tgt_loc].clone()
        super().move_kv_cache(tgt_loc, src_loc)
        self.k_buffer[-1][tgt_loc] = kept


class DescriptionHidesLastV(MHATokenToKVPool):
    """get_contiguous_buf_infos leaves out the last layer's V buffer."""

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        ptrs, lens, items = super().get_contiguous_buf_infos()
        return ptrs[:-1], lens[:-1], items[:-1]


class HiddenSideBuffer(MHATokenToKVPool):
    """A per-slot side buffer (one per layer) that no operation knows about."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.side_buffer = [self._zeros((self.num_slots, 4)) for _ in range(self.layer_num)]


class RowPool:
    """A request-row pool in miniature: ``size`` rows, a free list, ``alloc``, ``clear``."""

    def __init__(self, size: int, *, device: str = "cpu") -> None:
        self.size = size
        self.free_slots = torch.arange(size, dtype=torch.int64, device=device)
        self.states = torch.zeros(size + 1, 8, device=device)
        self.free_count = size

    def available_size(self) -> int:
        return self.free_count

    def alloc(self, need: int) -> torch.Tensor:
        self.free_count -= need
        return self.free_slots[self.free_count :]

    def clear(self) -> None:
        self.free_slots = torch.arange(self.size, dtype=torch.int64, device=self.states.device)
        self.free_count = self.size


class ClearKeepsFreeList(RowPool):
    """clear() resets the count but not the free-list tensor (its ids stay shuffled)."""

    def clear(self) -> None:
        self.free_count = self.size


class GroupedStatePool:
    """A QSA-like pool in miniature: token-slot KV, compressed keys of one row per
    ``qsa_compress_ratio`` slots, and a pending ring of that many rows per request; its
    host copies carry all three (a request copy: the request's ring rows)."""

    def __init__(self, *, size: int = 16, page_size: int = 4, rows: int = 4) -> None:
        self.size, self.page_size = size, page_size
        self.qsa_compress_ratio, self.qsa_num_request_slots = 2, rows
        slots = size + page_size
        self.kv = torch.zeros(slots, 4)
        self.compressed_k = torch.zeros(-(-slots // self.qsa_compress_ratio), 4)
        self.ring = torch.zeros(rows * self.qsa_compress_ratio, 4)

    def _where(self, indices: torch.Tensor, request: int) -> tuple[torch.Tensor, slice]:
        ratio = self.qsa_compress_ratio
        return torch.unique(indices // ratio), slice(request * ratio, (request + 1) * ratio)

    def get_cpu_copy(self, indices: torch.Tensor, req_pool_index: int = 0) -> Any:
        groups, ring = self._where(indices, req_pool_index)
        return self.kv[indices].clone(), self.compressed_k[groups].clone(), self.ring[ring].clone()

    def load_cpu_copy(self, copy: Any, indices: torch.Tensor, req_pool_index: int = 0) -> None:
        groups, ring = self._where(indices, req_pool_index)
        self.kv[indices], self.compressed_k[groups], self.ring[ring] = copy


class ReloadForgetsCompressedKeys(GroupedStatePool):
    """load_cpu_copy restores the KV and the ring, not the compressed keys (as sglang's
    QSA pool, whose copies are its linear hybrid's)."""

    def load_cpu_copy(self, copy: Any, indices: torch.Tensor, req_pool_index: int = 0) -> None:
        _, ring = self._where(indices, req_pool_index)
        self.kv[indices], self.ring[ring] = copy[0], copy[2]


class ReloadForgetsTheRing(GroupedStatePool):
    """load_cpu_copy restores the KV and the compressed keys, not the request's ring."""

    def load_cpu_copy(self, copy: Any, indices: torch.Tensor, req_pool_index: int = 0) -> None:
        groups, _ = self._where(indices, req_pool_index)
        self.kv[indices], self.compressed_k[groups] = copy[0], copy[1]
