"""What every kvcheck allocator shares: pages, the free list, free groups and refusing bad calls.

An allocator hands out token slots of the device pool in pages of ``page_size`` slots
(page size 1 for the token allocator). Page 0 is SGLang's padding page and is never handed
out, so pages ``1 .. size // page_size`` are the allocatable ones. A page is *held* from the
call that hands out its first slot until a ``free`` names any of its slots: freeing is
page-granular, as in SGLang (a request frees its row, whose last page it may fill only in
part). ``available_size()`` is always ``free pages * page_size``.

Unlike SGLang 0.5.23, kvcheck's allocators refuse bad calls with ``ValueError`` and change
nothing: a size that is not whole pages, a negative size, a slot outside the pool, a slot
of a page nobody holds (a foreign slot, or one freed already), a slot listed twice, and
extend/decode arguments whose last locations are not the requests' last slots, and segment
frees (:mod:`kvcheck.allocators.segments`) whose start is not page-aligned or whose segments
share a page.

Example:
    >>> import torch
    >>> from kvcheck.allocators import PagedTokenToKVPoolAllocator
    >>> allocator = PagedTokenToKVPoolAllocator(8, 4, torch.bfloat16, "cpu", None, False)
    >>> allocator.alloc(4).tolist(), allocator.available_size()
    ([4, 5, 6, 7], 4)
    >>> allocator.free(torch.tensor([5]))
    >>> allocator.available_size()
    8
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.allocators import _refusals
from kvcheck.allocators.capacity import CapacityHooks
from kvcheck.allocators.segments import SegmentFrees


class PageAllocator(SegmentFrees, CapacityHooks):
    """Free list, held pages and free groups of one allocator (one side, for SWA).

    Subclasses set ``_freed_first`` (where released pages go: the back of the free list,
    as SGLang's token allocator does, or the front, as its paged allocator does).
    """

    _freed_first: bool = False

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: Any,
        kvcache: Any,
        need_sort: bool,
    ) -> None:
        size = _refusals.count(type(self).__name__, "size", size)
        page_size = _refusals.count(type(self).__name__, "page_size", page_size)
        if page_size < 1 or size < page_size or size % page_size:
            raise ValueError(
                f"{type(self).__name__}: size={size} must be whole pages of page_size={page_size}"
            )
        if not isinstance(need_sort, bool):
            raise ValueError(f"{type(self).__name__}: need_sort={need_sort!r} must be a bool")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self._kvcache = kvcache
        self.need_sort = need_sort
        self.num_pages = size // page_size
        self.clear()

    # -- state -------------------------------------------------------------------------------

    def clear(self) -> None:
        """Every page free again (page 0 never is), no group open."""
        self.free_pages = list(range(1, self.num_pages + 1))
        self.release_pages: list[int] = []  # need_sort: freed, waiting for a sorted merge
        #: page -> slots of it handed out so far (a request fills its last page in part).
        self._fill: dict[int, int] = {}
        self.free_group: list[int] | None = None  # tokens freed in the open group
        self._group_pages: set[int] = set()

    def get_kvcache(self) -> Any:
        """The device pool whose slots this allocator hands out (may be None)."""
        return self._kvcache

    def available_size(self) -> int:
        """Slots free to hand out: free pages (released ones included) times page size."""
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    @property
    def size_full(self) -> int:
        """The capacity (one pool: all of it is the full side)."""
        return self.size

    def _problems(self) -> list[str]:
        """Accounting violations: a free page listed twice, free and held, or out of range."""
        listed = self.free_pages + self.release_pages
        problems = [f"page {p} is listed free twice" for p in set(listed) if listed.count(p) > 1]
        problems += [f"page {p} is free and held" for p in set(listed) & set(self._fill)]
        problems += [f"page {p} is not a page" for p in listed if not 0 < p <= self.num_pages]
        return problems

    def get_all_free_pages(self) -> torch.Tensor:
        """Every free page id (the free list, then the pages waiting for a merge)."""
        return torch.tensor(self.free_pages + self.release_pages, dtype=torch.int64)

    def merge_and_sort_free(self) -> None:
        """Fold released pages into the free list, sorted (``need_sort``)."""
        if self.release_pages:
            self.free_pages = sorted(self.free_pages + self.release_pages)
            self.release_pages = []

    def _slots(self, pages: list[int]) -> torch.Tensor:
        ps = self.page_size
        ids = [page * ps + offset for page in pages for offset in range(ps)]
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def _ensure_free(self, pages: int) -> bool:
        if pages > len(self.free_pages):
            self.merge_and_sort_free()
        return pages <= len(self.free_pages)

    def _take(self, count: int) -> list[int]:
        taken, self.free_pages = self.free_pages[:count], self.free_pages[count:]
        return taken

    # -- alloc -------------------------------------------------------------------------------

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots in whole fresh pages, or None (nothing changes) when fewer are free.

        ``need_size`` must be a multiple of the page size.
        """
        where = f"{type(self).__name__}.alloc"
        need_size = _refusals.count(where, "need_size", need_size)
        if need_size % self.page_size:
            raise ValueError(
                f"{where}: need_size={need_size} is not whole pages of page_size={self.page_size}"
            )
        pages = need_size // self.page_size
        if not self._ensure_free(pages):
            return None
        taken = self._take(pages)
        for page in taken:
            self._fill[page] = self.page_size
        return self._slots(taken)

    # -- free --------------------------------------------------------------------------------

    def check_free(self, free_index: Any, *, where: str) -> list[int]:
        """The ids of ``free_index`` if freeing them is valid; ``ValueError`` otherwise.

        Valid: distinct slots that were handed out, in pages still held, not already named
        by a free of the open group.
        """
        ids = _refusals.slot_ids(where, "free_index", free_index)
        _refusals.distinct(where, "free_index", ids)
        pending = set(self.free_group or ())
        limit = (self.num_pages + 1) * self.page_size
        for slot in ids:
            if not 0 <= slot < limit:
                raise ValueError(f"{where}: slot {slot} not in [0, {limit})")
            page, offset = divmod(slot, self.page_size)
            if offset >= self._fill.get(page, 0):
                state = "the padding page" if page == 0 else "no held page"
                raise ValueError(
                    f"{where}: slot {slot} is in {state}: it was never handed out or is free"
                )
            if slot in pending:
                raise ValueError(f"{where}: slot {slot} was freed already in this free group")
        return ids

    def free(self, free_index: torch.Tensor) -> None:
        """Release the pages of the slots named (inside a free group: at its end)."""
        ids = self.check_free(free_index, where=f"{type(self).__name__}.free")
        self._free_checked(ids)

    def free_full(self, free_index: torch.Tensor) -> None:
        """``free`` (one pool: no sliding-window peer to leave alone)."""
        ids = self.check_free(free_index, where=f"{type(self).__name__}.free_full")
        self._free_checked(ids)

    def _free_ids(self, where: str, free_index: Any, full_only: bool) -> list[int]:
        return self.check_free(free_index, where=where)

    def _free_checked(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.free_group is not None:
            self.free_group.extend(ids)
            self._group_pages.update(slot // self.page_size for slot in ids)
            return
        self._release(sorted({slot // self.page_size for slot in ids}))

    def _release(self, pages: list[int]) -> None:
        for page in pages:
            self._fill.pop(page, None)
        if self.need_sort:
            self.release_pages.extend(pages)
        elif self._freed_first:
            self.free_pages = pages + self.free_pages
        else:
            self.free_pages = self.free_pages + pages

    def free_group_begin(self) -> None:
        """Defer frees until :meth:`free_group_end` (a page freed twice in it is released once)."""
        if self.free_group is not None:
            raise ValueError(f"{type(self).__name__}.free_group_begin: a free group is open")
        self.free_group = []
        self._group_pages = set()

    def free_group_end(self) -> None:
        """Release every page the group's frees named, once each."""
        if self.free_group is None:
            raise ValueError(f"{type(self).__name__}.free_group_end: no free group is open")
        pages = sorted(self._group_pages)
        self.free_group = None
        self._group_pages = set()
        if pages:
            self._release(pages)
