"""kvcheck's token and paged allocators, with SGLang 0.5.23's API.

``TokenToKVPoolAllocator`` hands out single slots (page size 1; freed slots go to the back
of the free list). ``PagedTokenToKVPoolAllocator`` hands out pages: ``alloc`` whole pages,
``alloc_extend`` and ``alloc_decode`` the slots a batch of requests grows by, page-aligned
(freed pages go to the front of the free list).

Page alignment (what ``alloc_extend`` returns for a request with ``p`` tokens already held,
its last at slot ``l``, growing to ``s``): first the rest of its last page, ``l + 1, l + 2,
...`` (up to ``min(s, ceil(p / ps) * ps) - p`` slots), then fresh pages in order, each from
its offset 0. A request's ``k``-th token therefore always sits at offset ``k % ps`` of its
page. Requests are served in batch order; the result is request-major.

Example:
    >>> import torch
    >>> allocator = PagedTokenToKVPoolAllocator(16, 4, torch.bfloat16, "cpu", None, False)
    >>> t = lambda *xs: torch.tensor(xs)
    >>> out = allocator.alloc_extend(t(0), t(0), t(6), t(6), t(-1), 6)
    >>> out.tolist()
    [4, 5, 6, 7, 8, 9]
    >>> allocator.alloc_decode(t(7), t(7), t(9)).tolist()
    [10]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcheck.allocators import _refusals
from kvcheck.allocators.base import PageAllocator


@dataclass(frozen=True)
class Growth:
    """One request of an extend or decode batch: ``prefix`` tokens held, the last at slot
    ``last_loc`` (-1 when none), growing to ``seq`` tokens."""

    prefix: int
    seq: int
    last_loc: int

    def new_pages(self, page_size: int) -> int:
        """Fresh pages it takes: ``ceil(seq / ps) - ceil(prefix / ps)``."""
        return -(-self.seq // page_size) - -(-self.prefix // page_size)


class TokenToKVPoolAllocator(PageAllocator):
    """Slots one by one (page size 1), SGLang's ``TokenToKVPoolAllocator(size, dtype, device,
    kvcache, need_sort)``. ``alloc_extend`` / ``alloc_decode`` are for the paged allocator."""

    _freed_first = False

    def __init__(
        self, size: int, dtype: torch.dtype, device: Any, kvcache: Any, need_sort: bool
    ) -> None:
        super().__init__(size, 1, dtype, device, kvcache, need_sort)

    def alloc_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """Not for page size 1: ``alloc`` the tokens instead (as SGLang raises)."""
        raise NotImplementedError("alloc_extend is only for the paged allocator")

    def alloc_decode(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """Not for page size 1: ``alloc`` the tokens instead (as SGLang raises)."""
        raise NotImplementedError("alloc_decode is only for the paged allocator")


class PagedTokenToKVPoolAllocator(PageAllocator):
    """Pages of ``page_size`` slots, SGLang's ``PagedTokenToKVPoolAllocator(size, page_size,
    dtype, device, kvcache, need_sort)``."""

    _freed_first = True

    # -- checking a batch ---------------------------------------------------------------------

    def check_growth(
        self,
        where: str,
        prefix_lens: Any,
        prefix_lens_cpu: Any,
        seq_lens: Any,
        seq_lens_cpu: Any,
        last_loc: Any,
    ) -> list[Growth]:
        """The batch as :class:`Growth` records, or ``ValueError`` when it is not one this
        allocator can grow: lengths ``0 <= prefix <= seq``, CPU copies equal to the device
        tensors, and each ``last_loc`` the request's last slot (-1 without a prefix), at the
        offset its length gives, in a held page whose next slots are not handed out yet (two
        requests cannot continue one page).
        """
        prefixes = _refusals.slot_ids(where, "prefix_lens", prefix_lens)
        _refusals.same_values(where, "prefix_lens_cpu", prefixes, prefix_lens_cpu)
        seqs = _refusals.slot_ids(where, "seq_lens", seq_lens)
        _refusals.same_values(where, "seq_lens_cpu", seqs, seq_lens_cpu)
        lasts = _refusals.slot_ids(where, "last_loc", last_loc)
        if not len(prefixes) == len(seqs) == len(lasts):
            raise ValueError(
                f"{where}: prefix_lens, seq_lens and last_loc have lengths "
                f"{len(prefixes)}, {len(seqs)}, {len(lasts)}"
            )
        growths = [Growth(p, s, last) for p, s, last in zip(prefixes, seqs, lasts, strict=True)]
        continued: set[int] = set()
        for i, growth in enumerate(growths):
            page = self._check_request(where, i, growth)
            if page is not None:
                if page in continued:
                    raise ValueError(f"{where}: two requests continue page {page}")
                continued.add(page)
        return growths

    def _check_request(self, where: str, i: int, growth: Growth) -> int | None:
        """Check request ``i``; the page it continues, if its last page is partly filled."""
        ps = self.page_size
        if not 0 <= growth.prefix <= growth.seq:
            raise ValueError(
                f"{where}: request {i}: prefix_len={growth.prefix}, seq_len={growth.seq} "
                "(need 0 <= prefix_len <= seq_len)"
            )
        if growth.prefix == 0:
            if growth.last_loc != -1:
                raise ValueError(
                    f"{where}: request {i}: last_loc={growth.last_loc} with no prefix (need -1)"
                )
            return None
        page, offset = divmod(growth.last_loc, ps)
        if not 0 < page <= self.num_pages:
            raise ValueError(
                f"{where}: request {i}: last_loc={growth.last_loc} is not an allocatable slot"
            )
        if offset != (growth.prefix - 1) % ps:
            raise ValueError(
                f"{where}: request {i}: last_loc={growth.last_loc} sits at offset {offset} of its "
                f"page, but token {growth.prefix - 1} of a request sits at offset "
                f"{(growth.prefix - 1) % ps}"
            )
        fill = self._fill.get(page, 0)
        if fill <= offset:
            raise ValueError(
                f"{where}: request {i}: last_loc={growth.last_loc} was never handed out or is free"
            )
        if growth.prefix % ps and growth.seq > growth.prefix and fill != offset + 1:
            raise ValueError(
                f"{where}: request {i}: the slots after last_loc={growth.last_loc} in its page "
                "were handed out already"
            )
        return page if growth.prefix % ps and growth.seq > growth.prefix else None

    # -- growing -----------------------------------------------------------------------------

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """The slots each request grows by, page-aligned (see the module); None, changing
        nothing, when fewer fresh pages are free than the batch needs.

        ``extend_num_tokens`` must be ``sum(seq_lens - prefix_lens)``; ``num_new_pages``, when
        given, the fresh pages the batch needs.
        """
        where = f"{type(self).__name__}.alloc_extend"
        growths = self.check_growth(
            where, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc
        )
        extend_num_tokens = _refusals.count(where, "extend_num_tokens", extend_num_tokens)
        total = sum(g.seq - g.prefix for g in growths)
        if extend_num_tokens != total:
            raise ValueError(
                f"{where}: extend_num_tokens={extend_num_tokens} but the batch grows by {total}"
            )
        needed = sum(g.new_pages(self.page_size) for g in growths)
        if num_new_pages is not None and num_new_pages != needed:
            raise ValueError(f"{where}: num_new_pages={num_new_pages} but the batch needs {needed}")
        return self.grow(growths)

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request (``seq_lens`` counts it; ``last_loc`` is the slot of token
        ``seq_len - 2``); a fresh page where the new token starts one. None, changing nothing,
        when fewer fresh pages are free than that."""
        where = f"{type(self).__name__}.alloc_decode"
        seqs = _refusals.slot_ids(where, "seq_lens", seq_lens)
        if any(seq < 1 for seq in seqs):
            raise ValueError(f"{where}: seq_lens={seqs} must be >= 1 (they count the new token)")
        prefixes = torch.tensor([seq - 1 for seq in seqs], dtype=torch.int64)
        growths = self.check_growth(where, prefixes, prefixes, seq_lens, seq_lens_cpu, last_loc)
        return self.grow(growths)

    def grow(self, growths: list[Growth]) -> torch.Tensor | None:
        """Allocate a checked batch (None when its fresh pages are not free)."""
        ps = self.page_size
        if not self._ensure_free(sum(g.new_pages(ps) for g in growths)):
            return None
        out: list[int] = []
        for growth in growths:
            token = growth.prefix
            if token % ps and growth.seq > token:
                page = growth.last_loc // ps
                while token < growth.seq and token % ps:
                    out.append(page * ps + token % ps)
                    token += 1
                self._fill[page] = token % ps or ps
            while token < growth.seq:
                (page,) = self._take(1)
                used = min(ps, growth.seq - token)
                out.extend(page * ps + offset for offset in range(used))
                self._fill[page] = used
                token += used
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    def new_pages_needed(self, growths: list[Growth]) -> int:
        """Fresh pages a checked batch takes."""
        return sum(g.new_pages(self.page_size) for g in growths)
