"""Segment frees: a request's kv row freed by the segment of it each call names.

SGLang 0.5.23's schedulers free a request's row in segments (``free_segment(free_index,
start_pos=...)``: ``free_index`` is ``row[start_pos : start_pos + n]``), several at once
(``free_segments([(free_index, start_pos), ...])``, ascending and page-disjoint) and, for a
sliding-window allocator, the part that left the window on the full side only
(``free_full_segment`` / ``free_full_segments``). A segment covers the pages
``[start_pos // ps, ceil(end / ps))``: its start is page-aligned (the first slot named is at
offset 0 of its page, as token ``start_pos`` of a page-aligned row is), its end may fall
mid-page, and its last page is released whole.

:class:`SegmentFrees` adds the four methods to an allocator that has ``free``, ``free_full``
and a ``_free_ids(where, free_index, full_only)`` check (the ids, or ``ValueError``); unlike
SGLang's (``assert``), it refuses a bad segment with ``ValueError`` before anything changes,
every segment of a call checked before the first is freed.

Example:
    >>> import torch
    >>> from kvcheck.allocators import PagedTokenToKVPoolAllocator
    >>> allocator = PagedTokenToKVPoolAllocator(16, 4, torch.bfloat16, "cpu", None, False)
    >>> row = allocator.alloc(8)
    >>> allocator.free_segments([(row[:4], 0), (row[4:6], 4)])
    >>> allocator.available_size()
    16
    >>> try:
    ...     allocator.free_segment(allocator.alloc(4)[1:], start_pos=1)
    ... except ValueError as error:
    ...     print(error)
    PagedTokenToKVPoolAllocator.free_segment: start_pos=1 is not page-aligned (page_size=4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kvcheck.allocators import _refusals

__all__ = ["SegmentFrees"]


class SegmentFrees:
    """``free_segment``, ``free_segments``, ``free_full_segment``, ``free_full_segments``."""

    page_size: int

    if TYPE_CHECKING:  # provided by the allocator class the mixin is part of

        def free(self, free_index: torch.Tensor) -> None: ...

        def free_full(self, free_index: torch.Tensor) -> None: ...

        def _free_ids(self, where: str, free_index: Any, full_only: bool) -> list[int]: ...

    def _segment_ids(self, where: str, free_index: Any, start_pos: object) -> list[int]:
        """The ids of a segment whose start is valid (the free itself is checked later)."""
        start = _refusals.count(where, "start_pos", start_pos)
        ps = self.page_size
        if start % ps:
            raise ValueError(f"{where}: start_pos={start} is not page-aligned (page_size={ps})")
        ids = _refusals.slot_ids(where, "free_index", free_index)
        if ids and ids[0] % ps:
            raise ValueError(
                f"{where}: free_index starts at slot {ids[0]}, offset {ids[0] % ps} of its page, "
                f"but token start_pos={start} of a row sits at offset 0"
            )
        return ids

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free`` of ``row[start_pos : start_pos + len(free_index)]`` (page-aligned start)."""
        where = f"{type(self).__name__}.free_segment"
        self._segment_ids(where, free_index, start_pos)
        self.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free_full`` of a segment (page-aligned start)."""
        where = f"{type(self).__name__}.free_full_segment"
        self._segment_ids(where, free_index, start_pos)
        self.free_full(free_index)

    def _check_segments(self, where: str, segments: Any, full_only: bool) -> list[Any]:
        """The non-empty ``(free_index, start_pos)`` pairs, all checked together."""
        if not isinstance(segments, Sequence) or isinstance(segments, (str, bytes)):
            raise ValueError(f"{where}: segments={segments!r} must be a list of pairs")
        chosen: list[Any] = []
        previous_end: int | None = None
        for number, pair in enumerate(segments):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f"{where}: segment {number}={pair!r} is not a pair")
            free_index, start_pos = pair
            ids = self._segment_ids(where, free_index, start_pos)
            if not ids:
                continue
            ps = self.page_size
            if previous_end is not None and start_pos // ps <= (previous_end - 1) // ps:
                raise ValueError(
                    f"{where}: segment {number} at start_pos={start_pos} shares a page with the "
                    f"one ending at {previous_end}"
                )
            previous_end = start_pos + len(ids)
            chosen.append(pair)
        if chosen:
            every = torch.cat([torch.as_tensor(index).long().reshape(-1) for index, _ in chosen])
            self._free_ids(where, every, full_only)
        return chosen

    def free_segments(self, segments: Sequence[tuple[torch.Tensor, int]]) -> None:
        """``free_segment`` of each segment (ascending, page-disjoint; all checked first)."""
        for free_index, start_pos in self._check_segments(
            f"{type(self).__name__}.free_segments", segments, False
        ):
            self.free_segment(free_index, start_pos=start_pos)

    def free_full_segments(self, segments: Sequence[tuple[torch.Tensor, int]]) -> None:
        """``free_full_segment`` of each segment (as :meth:`free_segments`)."""
        for free_index, start_pos in self._check_segments(
            f"{type(self).__name__}.free_full_segments", segments, True
        ):
            self.free_full_segment(free_index, start_pos=start_pos)
