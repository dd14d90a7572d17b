"""Deliberately broken allocators and host pools, each with one bug a tier property must catch.

Every class subclasses one of kvcheck's allocators (:mod:`kvcheck.allocators`) or host pools
(:mod:`kvcheck.host_pools`) and breaks exactly one rule; :class:`BrokenTierTarget` serves it
in place of the real one. ``test_tier_properties_fail.py`` runs each property against its
twin and requires it to fail with the property's signature, shrunk small.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from kvcheck.allocators import (
    Growth,
    PagedTokenToKVPoolAllocator,
    PureSWATokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from kvcheck.host_pools import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from kvcheck.host_pools.base import IO_BACKENDS, Component
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.tiers import HOST_IO_BACKENDS, AllocatorSpec, HostPoolSpec, host_layouts_for

# --- allocators ---------------------------------------------------------------------------------


class TwiceHandingTokenAllocator(TokenToKVPoolAllocator):
    """Hands out a slot twice: from the second allocation on, the first slot of each answer
    is one handed out before (the fresh slot it replaces is lost, so the count stays right)."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        held = [page for page, fill in self._fill.items() if fill]
        out = super().alloc(need_size)
        if out is not None and len(out) and held:
            out[0] = held[0]
        return out


class DriftingPagedAllocator(PagedTokenToKVPoolAllocator):
    """Keeps a running count for ``available_size()`` that a free raises by the tokens it
    names, not by the pages it releases: a request whose last page is partly filled drifts it."""

    def clear(self) -> None:
        super().clear()
        self._count = self.num_pages * self.page_size

    def available_size(self) -> int:
        return self._count

    def alloc(self, need_size: int) -> torch.Tensor | None:
        out = super().alloc(need_size)
        if out is not None:
            self._count -= len(out)
        return out

    def grow(self, growths: list[Growth]) -> torch.Tensor | None:
        pages = self.new_pages_needed(growths)
        out = super().grow(growths)
        if out is not None:
            self._count -= pages * self.page_size
        return out

    def _release(self, pages: list[int]) -> None:
        freed = sum(self._fill.get(page, 0) for page in pages)
        super()._release(pages)
        self._count += freed


class UnalignedPagedAllocator(PagedTokenToKVPoolAllocator):
    """Fills the rest of a request's partly filled last page back to front: the right slots,
    each at the wrong offset for its token."""

    def grow(self, growths: list[Growth]) -> torch.Tensor | None:
        out = super().grow(growths)
        if out is None:
            return None
        ps, position = self.page_size, 0
        for g in growths:
            rest = min(g.seq, -(-g.prefix // ps) * ps) - g.prefix if g.prefix % ps else 0
            out[position : position + rest] = out[position : position + rest].flip(0)
            position += g.seq - g.prefix
        return out


class GroupReleasingTwicePagedAllocator(PagedTokenToKVPoolAllocator):
    """At the end of a free group, releases each free's pages on their own: a page two frees
    of the group named (a request's row split across them) comes back twice."""

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self._calls: list[list[int]] = []

    def _free_checked(self, ids: list[int]) -> None:
        if self.free_group is not None and ids:
            self._calls.append(sorted({slot // self.page_size for slot in ids}))
        super()._free_checked(ids)

    def free_group_end(self) -> None:
        calls = self._calls
        super().free_group_end()
        for pages in calls[1:]:
            for page in pages:
                if page in self.free_pages and any(page in other for other in calls[:1]):
                    self.free_pages.insert(0, page)


class TrustingPagedAllocator(PagedTokenToKVPoolAllocator):
    """Checks nothing a free names (as SGLang's): a double free releases a page twice."""

    def check_free(self, free_index: Any, *, where: str) -> list[int]:
        return [int(x) for x in free_index.tolist()]

    def _free_checked(self, ids: list[int]) -> None:
        if ids:
            pages = sorted({slot // self.page_size for slot in ids})
            if self.free_group is not None:
                self.free_group.extend(ids)
                self._group_pages.update(pages)
            else:
                for page in pages:
                    self._fill.pop(page, None)
                self.free_pages = pages + self.free_pages


class LeakyDecodeSWAAllocator(SWATokenToKVPoolAllocator):
    """``alloc_decode`` takes the full side's page before asking the sliding-window side (the
    shape of SGLang 0.5.23's F1): a decode refused on the window side leaks a full page."""

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        prefixes = seq_lens - 1
        growths = self.full_attn_allocator.check_growth(
            "alloc_decode", prefixes, prefixes, seq_lens, seq_lens_cpu, last_loc
        )
        swa = self._swa_growths("alloc_decode", growths)
        full = self.full_attn_allocator.grow(growths)
        if full is None:
            return None
        swa_out = self.swa_attn_allocator.grow(swa)
        if swa_out is None:
            return None
        self._map(full, swa_out)
        return full


class SegmentReleasingTwicePagedAllocator(PagedTokenToKVPoolAllocator):
    """``free_segment`` releases a segment's last page twice (it lists it once more) but
    counts distinct free pages, so ``available_size()`` stays right and only the census of
    free pages shows the page that would be handed out twice."""

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        super().free_segment(free_index, start_pos=start_pos)
        if self.free_group is None and len(free_index):
            self.free_pages.append(int(free_index[-1]) // self.page_size)

    def available_size(self) -> int:
        return len(set(self.free_pages) | set(self.release_pages)) * self.page_size


class TailDriftingSWAAllocator(SWATokenToKVPoolAllocator):
    """``alloc_extend_swa_tail`` takes one more window page than the tail needs whenever the
    tail is shorter than the request: ``swa_available_size()`` drifts below the truth."""

    def alloc_extend_swa_tail(self, *args: Any) -> torch.Tensor | None:
        out = super().alloc_extend_swa_tail(*args)
        window = self.swa_attn_allocator
        if out is not None and args[6] < args[5] and window.free_pages:
            (page,) = window._take(1)
            window._fill[page] = window.page_size
        return out


class FullReleasingPureSWAAllocator(PureSWATokenToKVPoolAllocator):
    """``free_full`` releases its slots (as a two-sided allocator's full side would), though
    ``free_swa`` released them already: each comes back twice."""

    def free_full(self, free_index: torch.Tensor) -> None:
        super().free_full(free_index)
        self.swa_attn_allocator.free_pages.extend(int(x) for x in free_index.tolist())


class EmptyFreeReleasingPagedAllocator(PagedTokenToKVPoolAllocator):
    """A ``free`` that names no slot releases the highest held page (an index taken from
    the end of an empty list, as ``free_index[-1]`` would be read)."""

    def free(self, free_index: torch.Tensor) -> None:
        if not len(free_index) and self._fill and self.free_group is None:
            self._release([max(self._fill)])
            return
        super().free(free_index)


class SegmentTrustingPagedAllocator(PagedTokenToKVPoolAllocator):
    """Takes any segment start (as SGLang's, which only asserts): a segment that starts
    mid-page is freed as if it started the page."""

    def _segment_ids(self, where: str, free_index: Any, start_pos: object) -> list[int]:
        return [int(x) for x in free_index.tolist()]


class NestingPagedAllocator(PagedTokenToKVPoolAllocator):
    """``free_group_begin`` inside an open free group starts nothing new and says nothing
    (the open group goes on collecting)."""

    def free_group_begin(self) -> None:
        if self.free_group is None:
            super().free_group_begin()


class PageMergingPagedAllocator(PagedTokenToKVPoolAllocator):
    """``free_segments`` frees the distinct slots of all its segments in one ``free``: two
    segments that share a page are taken silently instead of refused."""

    def free_segments(self, segments: Any) -> None:
        distinct = sorted({int(x) for index, _ in segments for x in index.tolist()})
        self.free(torch.tensor(distinct, dtype=torch.int64))

    free_full_segments = free_segments  # one pool: the full side is the only side


class FirstFreeingPagedAllocator(PagedTokenToKVPoolAllocator):
    """``free_segments`` checks each segment against the one before only when it reaches it
    (as SGLang's does): a segment that shares a page is refused after the segments before
    it were freed."""

    def free_segments(self, segments: Any) -> None:
        previous_end: int | None = None
        for index, start_pos in segments:
            if not len(index):
                continue
            ps = self.page_size
            if previous_end is not None and start_pos // ps <= (previous_end - 1) // ps:
                raise ValueError(f"segment at {start_pos} shares a page with the one before")
            previous_end = start_pos + len(index)
            self.free_segment(index, start_pos=start_pos)

    free_full_segments = free_segments  # one pool: the full side is the only side


class FullSideCapacitySWAAllocator(SWATokenToKVPoolAllocator):
    """``check_decode_capacity`` asks the full side only: a decode the window side cannot
    serve is let through to an allocation that fails."""

    def check_decode_capacity(self, *, num_tokens: int, tree_cache: Any, **_: Any) -> bool:
        return num_tokens <= self.full_available_size()


class FullSizedSWAAllocator(SWATokenToKVPoolAllocator):
    """Reports the full side's capacity as ``size`` (not the smaller side's)."""

    @property
    def size(self) -> int:
        return self.size_full


# --- host pools ---------------------------------------------------------------------------------


class ShiftedPageHost(MHATokenToKVPoolHost):
    """Writes each page one page further on (and reads it from there): loads still give the
    bytes back, but the host pages sit at the wrong offset for anyone reading the layout."""

    def _shift(self, host_ids: torch.Tensor) -> torch.Tensor:
        return (host_ids + self.page_size) % self.size

    def _backup(
        self,
        component: Component,
        host_layer: int,
        source: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        super()._backup(component, host_layer, source, self._shift(host_ids), device_ids)

    def _load(
        self,
        component: Component,
        host_layer: int,
        target: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        super()._load(component, host_layer, target, self._shift(host_ids), device_ids)


class LayerForgettingHost(MLATokenToKVPoolHost):
    """Backs up every layer but the last."""

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        where = "backup_from_device_all_layer"
        host_ids, device_ids = self._check_transfer(where, host_indices, device_indices, io_backend)
        for component in self.components:
            buffers = getattr(device_pool, component.name)
            for host_layer, layer in enumerate(component.layers[:-1]):
                self._backup(component, host_layer, buffers[layer], host_ids, device_ids)


class UnderstatingHost(MLATokenToKVPoolHost):
    """``get_size_per_token()`` counts one layer fewer than it holds."""

    def get_size_per_token(self) -> int:
        return super().get_size_per_token() - self.components[0].row_bytes


class NextPageMetaHost(MLATokenToKVPoolHost):
    """``get_page_buffer_meta`` names the page after each page asked for."""

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        shifted = (indices + self.page_size) % self.size
        return super().get_page_buffer_meta(shifted)


class ScaleDroppingHost(MHATokenToKVPoolHost):
    """Backs up a quantized pool's payload but not its scales: a load restores the values
    with whatever scales the host held before (zeros)."""

    def _backup(
        self,
        component: Component,
        host_layer: int,
        source: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        if not component.raw:
            super()._backup(component, host_layer, source, host_ids, device_ids)


class ScaleMisplacingHost(MHATokenToKVPoolHost):
    """Loads a quantized pool's scales one device page further on than their payload (the
    host bytes are right; the device's are not)."""

    def _load(
        self,
        component: Component,
        host_layer: int,
        target: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        if component.raw:
            slots = self.device_pool.size + self.page_size
            device_ids = (device_ids + self.page_size) % slots
        super()._load(component, host_layer, target, host_ids, device_ids)


class AnyBackendHost(MLATokenToKVPoolHost):
    """Transfers with any io backend it is handed (as the layout's own)."""

    def _check_transfer(
        self, where: str, host_indices: object, device_indices: object, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        own = IO_BACKENDS[self.layout][0]
        return super()._check_transfer(where, host_indices, device_indices, own)


class WholeRowKeySizeHost(MHATokenToKVPoolHost):
    """``get_ksize_per_token()`` counts V's bytes too."""

    def get_ksize_per_token(self) -> int:
        return self.get_size_per_token()


class KeyOnlyRegisteringHost(MHATokenToKVPoolHost):
    """``get_hybrid_pool_buffer()`` leaves V out."""

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        return [self.k_buffer]


class BaseOnlyAlignedHost(MLATokenToKVPoolHost):
    """``is_stride_page_aligned`` looks at the buffer's first byte only, in any layout."""

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        return self.kv_buffer.data_ptr() % page_size_bytes == 0


class ValueFirstSplitMetaHost(MHATokenToKVPoolHost):
    """``get_split_heads_page_buffer_meta`` names each head group's V region before its K."""

    def get_split_heads_page_buffer_meta(
        self, indices: torch.Tensor, split_factor: int
    ) -> tuple[list[int], list[int]]:
        ptrs, sizes = super().get_split_heads_page_buffer_meta(indices, split_factor)
        swapped = [ptr for pair in zip(ptrs[1::2], ptrs[::2], strict=True) for ptr in pair]
        return swapped, sizes


class PageKeepingHost(MLATokenToKVPoolHost):
    """A free of more than one page keeps its last slot (never handed out again)."""

    def free(self, indices: torch.Tensor) -> int:
        ids = self.check_held(indices, where="free", name="indices")
        if len(ids) > self.page_size:
            self.slot_used[ids] = False
            self.free_slots = torch.cat([self.free_slots, ids[:-1]])
            return len(ids)
        return super().free(indices)


class PhysicalSkippingHost(MHATokenToKVPoolHost):
    """``backup_from_device_all_layer_physical`` copies nothing."""

    def backup_from_device_all_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        self._check_transfer("backup", host_indices, device_indices, io_backend)


class OnceDestroyedHost(MLATokenToKVPoolHost):
    """``destroy()`` fails when called a second time."""

    def destroy(self) -> None:
        if getattr(self, "_destroyed", False):
            raise RuntimeError("already destroyed")
        super().destroy()


class PartialPageHost(MLATokenToKVPoolHost):
    """``alloc`` hands out any number of host slots, part of a page included."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self.slot_used[taken] = True
        return taken.clone()


class UnheldFreeingHost(MLATokenToKVPoolHost):
    """``free`` takes back slots it does not hold (a double free puts a slot on the free
    list twice)."""

    def free(self, indices: torch.Tensor) -> int:
        ids = torch.as_tensor(indices, dtype=torch.int64).reshape(-1).cpu()
        self.slot_used[ids] = False
        self.free_slots = torch.cat([self.free_slots, ids])
        return len(ids)


class BrokenTierTarget(KVCheckTarget):
    """kvcheck's target with one broken allocator or host pool class in place of its own."""

    unsupported: Mapping[str, str] = MappingProxyType({})

    def __init__(self, broken: type, findings: tuple[Any, ...] = ()) -> None:
        self.broken = broken
        self.name = f"broken-{broken.__name__}"
        self.findings = findings

    def make_allocator(self, spec: AllocatorSpec, *, device: str, kvcache: Any = None) -> Any:
        """The broken allocator where it is of the spec's kind, kvcheck's otherwise."""
        allocator = super().make_allocator(spec, device=device, kvcache=kvcache)
        if (
            isinstance(allocator, self.broken.__mro__[1])
            and type(allocator) is self.broken.__mro__[1]
        ):
            allocator.__class__ = self.broken
            allocator.clear()
        return allocator

    def make_host_pool(
        self, spec: HostPoolSpec, device_pool: Any, *, device: str
    ) -> tuple[Any, ...]:
        """The broken host pool in place of the main one of its class."""
        parts = super().make_host_pool(spec, device_pool, device=device)
        if type(parts[0]) is self.broken.__mro__[1]:
            parts[0].__class__ = self.broken
        return parts


class LayoutFallbackTarget(BrokenTierTarget):
    """Builds a host pool in the family's first layout when asked for one it does not take
    (instead of refusing)."""

    def __init__(self) -> None:
        super().__init__(MLATokenToKVPoolHost)
        self.name = "broken-LayoutFallbackTarget"

    def make_host_pool(
        self, spec: HostPoolSpec, device_pool: Any, *, device: str
    ) -> tuple[Any, ...]:
        """kvcheck's host tier, in a layout it takes whatever ``spec`` asks."""
        taken = host_layouts_for(spec.device)
        if spec.layout not in taken:
            spec = HostPoolSpec(
                device=spec.device,
                layout=taken[0],
                io_backend=HOST_IO_BACKENDS[taken[0]][0],
                host_pages=spec.host_pages,
            )
        return super().make_host_pool(spec, device_pool, device=device)
