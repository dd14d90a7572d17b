"""Vectorized copies on per-layer token-row buffers (``[slots, ...]`` tensors).

Every function works on storage tensors, so fp8 data (held as ``uint8``) is copied byte
for byte. Moves gather every source row before writing any target row, so sources may
repeat and may overlap targets. With ``page_size``, a buffer is head-major by page
(``[pages, heads, page_size, dim]``, the HND layout) and a slot is ``[page, :, offset]``.

Example:
    >>> import torch
    >>> buf = torch.arange(4).view(4, 1)
    >>> move_rows([buf], tgt=torch.tensor([0, 1]), src=torch.tensor([1, 0]))
    >>> buf.view(-1).tolist()
    [1, 0, 2, 3]
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _by_slot(buffer: torch.Tensor, page_size: int) -> torch.Tensor:
    # [pages, heads, page, dim] -> a [pages, page, heads, dim] view: (page, offset) indexes
    # one slot's [heads, dim] row.
    return buffer.permute(0, 2, 1, 3)


def scatter_rows(
    buffer: torch.Tensor, loc: torch.Tensor, rows: torch.Tensor, *, page_size: int | None = None
) -> None:
    """Write ``rows[i]`` to slot ``loc[i]`` of ``buffer``; ``rows`` is only read.

    A payload that is itself a view of ``buffer`` is copied first, so a write never
    reads rows it has already overwritten.
    """
    if _shares_memory(buffer, rows):
        rows = rows.clone()
    if page_size is None:
        buffer.index_copy_(0, loc, rows)
    else:
        _by_slot(buffer, page_size)[loc // page_size, loc % page_size] = rows


def move_rows(
    buffers: Iterable[torch.Tensor],
    *,
    tgt: torch.Tensor,
    src: torch.Tensor,
    page_size: int | None = None,
) -> None:
    """In each buffer, copy slot ``src[i]`` to slot ``tgt[i]`` (gather first, then scatter)."""
    for buffer in buffers:
        scatter_rows(
            buffer, tgt, gather_rows(buffer, src, page_size=page_size), page_size=page_size
        )


def gather_rows(
    buffer: torch.Tensor, loc: torch.Tensor, *, page_size: int | None = None
) -> torch.Tensor:
    """A new tensor holding slot ``loc[i]``'s row in order (never a view of ``buffer``).

    Example:
        >>> hnd = torch.arange(8).view(2, 1, 2, 2)  # 2 pages of 2 slots, 1 head, dim 2
        >>> gather_rows(hnd, torch.tensor([3, 0]), page_size=2).tolist()
        [[[6, 7]], [[0, 1]]]
    """
    if page_size is None:
        return buffer.index_select(0, loc)
    return _by_slot(buffer, page_size)[loc // page_size, loc % page_size]
