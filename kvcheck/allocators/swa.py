"""kvcheck's sliding-window allocator, with SGLang 0.5.23's API.

A sliding-window model keeps two device pools: the full-attention layers' (every token)
and the sliding-window layers' (only the tokens inside the window). The allocator hands out
*full-side* slots and gives each a sliding-window peer, recorded in
``full_to_swa_index_mapping`` (0: no peer; ``mapping[-1] == -1`` so a last location of -1
translates to -1). ``free_swa`` releases the sliding-window peers of slots that left the
window (page-granular: the peers of every slot of the full pages named), ``free`` both
sides. Every allocation asks both sides first: one refused on either side changes neither.

Example:
    >>> import torch
    >>> allocator = SWATokenToKVPoolAllocator(8, 4, 1, torch.bfloat16, "cpu", None, False)
    >>> full = allocator.alloc(3)
    >>> full.tolist(), allocator.translate_loc_from_full_to_swa(full).tolist()
    ([1, 2, 3], [1, 2, 3])
    >>> allocator.free_swa(full[:2])
    >>> allocator.full_available_size(), allocator.swa_available_size()
    (5, 3)
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.allocators import _refusals
from kvcheck.allocators.capacity import CapacityHooks
from kvcheck.allocators.paged import Growth, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvcheck.allocators.segments import SegmentFrees


class SWATokenToKVPoolAllocator(SegmentFrees, CapacityHooks):
    """SGLang's ``SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, device, kvcache,
    need_sort)``: a full side of ``size`` slots and a sliding-window side of ``size_swa``.

    ``kvcache``, when given and when it has ``register_mapping``, is handed the mapping (as
    SGLang's SWA pool is, so attention translates locations itself).
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        device: Any,
        kvcache: Any,
        need_sort: bool,
    ) -> None:
        page_size = _refusals.count(type(self).__name__, "page_size", page_size)
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self._kvcache = kvcache
        self.full_attn_allocator: Any
        self.swa_attn_allocator: Any
        if page_size == 1:
            self.full_attn_allocator = TokenToKVPoolAllocator(size, dtype, device, None, need_sort)
            self.swa_attn_allocator = TokenToKVPoolAllocator(
                size_swa, dtype, device, None, need_sort
            )
        else:
            self.full_attn_allocator = PagedTokenToKVPoolAllocator(
                size, page_size, dtype, device, None, need_sort
            )
            self.swa_attn_allocator = PagedTokenToKVPoolAllocator(
                size_swa, page_size, dtype, device, None, need_sort
            )
        self.full_to_swa_index_mapping = torch.zeros(size + page_size + 1, dtype=torch.int64)
        self.full_to_swa_index_mapping[-1] = -1
        register = getattr(kvcache, "register_mapping", None)
        if callable(register):
            register(self.full_to_swa_index_mapping)

    # -- sizes -------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The smaller side's capacity."""
        return min(self.size_full, self.size_swa)

    @property
    def size_full(self) -> int:
        return int(self.full_attn_allocator.size)

    @property
    def size_swa(self) -> int:
        return int(self.swa_attn_allocator.size)

    def available_size(self) -> int:
        """What both sides can still hand out: the smaller side's free slots."""
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return int(self.full_attn_allocator.available_size())

    def swa_available_size(self) -> int:
        return int(self.swa_attn_allocator.available_size())

    def get_kvcache(self) -> Any:
        return self._kvcache

    def clear(self) -> None:
        """Both sides free, every mapping entry 0 (the last stays -1)."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0

    # -- translating -------------------------------------------------------------------------

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The sliding-window peers of full-side slots (0: none; -1 stays -1)."""
        ids = _refusals.slot_ids("translate_loc_from_full_to_swa", "kv_indices", kv_indices)
        limit = len(self.full_to_swa_index_mapping) - 1
        for slot in ids:
            if not -1 <= slot < limit:
                raise ValueError(
                    f"translate_loc_from_full_to_swa: slot {slot} not in [-1, {limit})"
                )
        return self.full_to_swa_index_mapping[kv_indices.long().cpu()].to(kv_indices.device)

    def translate_swa_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The window-side ids the PD transfer engine addresses: the slots' window peers."""
        return self.translate_loc_from_full_to_swa(kv_indices)

    def _problems(self) -> list[str]:
        return [f"full side: {p}" for p in self.full_attn_allocator._problems()] + [
            f"window side: {p}" for p in self.swa_attn_allocator._problems()
        ]

    def _map(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        self.full_to_swa_index_mapping[full.long().cpu()] = swa.long().cpu()

    # -- allocating --------------------------------------------------------------------------

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots on both sides (page size 1 only), mapped; None when either side
        has fewer free (nothing changes)."""
        if self.page_size != 1:
            raise NotImplementedError("SWA alloc is for page size 1; use alloc_extend")
        need_size = _refusals.count("SWATokenToKVPoolAllocator.alloc", "need_size", need_size)
        if need_size > self.full_available_size() or need_size > self.swa_available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        self._map(full, swa)
        return full

    def _swa_growths(self, where: str, growths: list[Growth]) -> list[Growth]:
        """The batch on the sliding-window side: each last location translated; a request
        continuing from a token whose peer left the window cannot grow."""
        mapping = self.full_to_swa_index_mapping
        translated = []
        for i, growth in enumerate(growths):
            last = growth.last_loc
            peer = -1 if last == -1 else int(mapping[last])
            if growth.prefix and peer <= 0:
                raise ValueError(
                    f"{where}: request {i}: last_loc={last} has no sliding-window peer (its "
                    "window was freed); a request grows from a token inside its window"
                )
            translated.append(Growth(growth.prefix, growth.seq, peer))
        return translated

    def _grow(self, where: str, args: tuple[Any, ...]) -> torch.Tensor | None:
        prefix_lens, prefix_cpu, seq_lens, seq_cpu, last_loc = args
        full_side = self.full_attn_allocator
        growths = full_side.check_growth(
            where, prefix_lens, prefix_cpu, seq_lens, seq_cpu, last_loc
        )
        swa_growths = self._swa_growths(where, growths)
        swa_last = torch.tensor([g.last_loc for g in swa_growths], dtype=torch.int64)
        self.swa_attn_allocator.check_growth(
            where, prefix_lens, prefix_cpu, seq_lens, seq_cpu, swa_last
        )
        needed = full_side.new_pages_needed(growths)
        if needed * self.page_size > min(self.full_available_size(), self.swa_available_size()):
            return None
        full = full_side.grow(growths)
        swa = self.swa_attn_allocator.grow(swa_growths)
        self._map(full, swa)
        return full

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """The paged ``alloc_extend`` on both sides (page size > 1), the new slots mapped; None
        when either side lacks the pages (nothing changes)."""
        where = "SWATokenToKVPoolAllocator.alloc_extend"
        if self.page_size == 1:
            raise NotImplementedError("SWA alloc_extend is for page size > 1; use alloc")
        growths = self.full_attn_allocator.check_growth(
            where, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc
        )
        extend_num_tokens = _refusals.count(where, "extend_num_tokens", extend_num_tokens)
        total = sum(g.seq - g.prefix for g in growths)
        if extend_num_tokens != total:
            raise ValueError(
                f"{where}: extend_num_tokens={extend_num_tokens} but the batch grows by {total}"
            )
        return self._grow(where, (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc))

    def alloc_extend_swa_tail(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> torch.Tensor | None:
        """One request (page size > 1) grown on the full side as ``alloc_extend`` grows it,
        with sliding-window peers for its last ``swa_tail_len`` tokens only (fresh pages: the
        tail starts a page of the row, ``(seq_len - swa_tail_len) % page_size == 0``); the
        new slots before the tail get no peer. None when either side lacks the pages
        (nothing changes). SGLang's decode side of PD disaggregation preallocates a
        transferred request so (only its window's KV comes over for the window layers)."""
        where = "SWATokenToKVPoolAllocator.alloc_extend_swa_tail"
        if self.page_size == 1:
            raise NotImplementedError("SWA alloc_extend_swa_tail is for page size > 1")
        full_side = self.full_attn_allocator
        growths = full_side.check_growth(
            where, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc
        )
        if len(growths) != 1:
            raise ValueError(f"{where}: a batch of {len(growths)} requests (it takes one)")
        (growth,) = growths
        extend_num_tokens = _refusals.count(where, "extend_num_tokens", extend_num_tokens)
        if extend_num_tokens != growth.seq - growth.prefix:
            raise ValueError(
                f"{where}: extend_num_tokens={extend_num_tokens} but the request grows by "
                f"{growth.seq - growth.prefix}"
            )
        tail = _refusals.count(where, "swa_tail_len", swa_tail_len)
        start = growth.seq - tail
        if tail > extend_num_tokens or start % self.page_size:
            raise ValueError(
                f"{where}: swa_tail_len={tail} must be at most extend_num_tokens="
                f"{extend_num_tokens} and start a page of the row (seq_len={growth.seq}, "
                f"page_size={self.page_size})"
            )
        tail_growth = Growth(0, tail, -1)
        full_pages = full_side.new_pages_needed(growths)
        swa_pages = tail_growth.new_pages(self.page_size)
        if (
            full_pages * self.page_size > self.full_available_size()
            or swa_pages * self.page_size > self.swa_available_size()
        ):
            return None
        full = full_side.grow(growths)
        if tail:
            self._map(full[len(full) - tail :], self.swa_attn_allocator.grow([tail_growth]))
        return full

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """The paged ``alloc_decode`` on both sides; None when either side lacks a page."""
        where = "SWATokenToKVPoolAllocator.alloc_decode"
        if self.page_size == 1:
            raise NotImplementedError("SWA alloc_decode is for page size > 1; use alloc")
        seqs = _refusals.slot_ids(where, "seq_lens", seq_lens)
        if any(seq < 1 for seq in seqs):
            raise ValueError(f"{where}: seq_lens={seqs} must be >= 1 (they count the new token)")
        prefixes = torch.tensor([seq - 1 for seq in seqs], dtype=torch.int64)
        return self._grow(where, (prefixes, prefixes, seq_lens, seq_lens_cpu, last_loc))

    # -- freeing -----------------------------------------------------------------------------

    def _peers(self, full_ids: list[int]) -> tuple[list[int], list[int]]:
        """The slots whose mapping ``free_swa`` clears (every slot of the full pages named)
        and their live peers."""
        ps = self.page_size
        pages = sorted({slot // ps for slot in full_ids})
        slots = [page * ps + offset for page in pages for offset in range(ps)]
        mapping = self.full_to_swa_index_mapping
        peers = [int(mapping[slot]) for slot in slots if int(mapping[slot]) > 0]
        return slots, peers

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Release the sliding-window peers of the full pages named (their slots left the
        window); slots already without a peer are skipped. The full side keeps its slots."""
        where = "SWATokenToKVPoolAllocator.free_swa"
        ids = self.full_attn_allocator.check_free(free_index, where=where)
        slots, peers = self._peers(ids)
        self.swa_attn_allocator.check_free(torch.tensor(peers, dtype=torch.int64), where=where)
        self._free_swa_checked(slots, peers)

    def _free_swa_checked(self, slots: list[int], peers: list[int]) -> None:
        if slots:
            self.full_to_swa_index_mapping[torch.tensor(slots, dtype=torch.int64)] = 0
        self.swa_attn_allocator._free_checked(peers)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free_swa`` of ``row[start_pos : start_pos + len(free_index)]`` (page-aligned start)."""
        where = "SWATokenToKVPoolAllocator.free_swa_segment"
        self._segment_ids(where, free_index, start_pos)
        self.free_swa(free_index)

    def _free_ids(self, where: str, free_index: Any, full_only: bool) -> list[int]:
        """The ids of a valid ``free`` (``full_only``: ``free_full``): full-side slots held,
        their live peers held on the sliding-window side (``free_full``: none left)."""
        ids = self.full_attn_allocator.check_free(free_index, where=where)
        _, peers = self._peers(ids)
        if full_only and peers:
            raise ValueError(f"{where}: slots {ids} still have sliding-window peers {peers}")
        self.swa_attn_allocator.check_free(torch.tensor(peers, dtype=torch.int64), where=where)
        return ids

    def free(self, free_index: torch.Tensor) -> None:
        """Release both sides' pages of the slots named (the full side's, and their peers)."""
        ids = self._free_ids("SWATokenToKVPoolAllocator.free", free_index, False)
        slots, peers = self._peers(ids)
        self._free_swa_checked(slots, peers)
        self.full_attn_allocator._free_checked(ids)

    def free_full(self, free_index: torch.Tensor) -> None:
        """Release the full side's pages only (their peers must be gone already)."""
        ids = self._free_ids("SWATokenToKVPoolAllocator.free_full", free_index, True)
        self.full_attn_allocator._free_checked(ids)

    def free_group_begin(self) -> None:
        """Defer both sides' frees until :meth:`free_group_end`."""
        if self.full_attn_allocator.free_group is not None:
            raise ValueError("SWATokenToKVPoolAllocator.free_group_begin: a free group is open")
        self.full_attn_allocator.free_group_begin()
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        """Release what both sides' frees in the group named."""
        if self.full_attn_allocator.free_group is None:
            raise ValueError("SWATokenToKVPoolAllocator.free_group_end: no free group is open")
        self.swa_attn_allocator.free_group_end()
        self.full_attn_allocator.free_group_end()
