"""Vectorized copies on per-layer token-row buffers (``[slots, ...]`` tensors).

Every function works on storage tensors, so fp8 data (held as ``uint8``) is copied byte
for byte. Moves gather every source row before writing any target row, so sources may
repeat and may overlap targets.

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


def scatter_rows(buffer: torch.Tensor, loc: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows[i]`` to ``buffer[loc[i]]``; ``rows`` is only read.

    A payload that is itself a view of ``buffer`` is copied first, so a write never
    reads rows it has already overwritten.
    """
    if _shares_memory(buffer, rows):
        rows = rows.clone()
    buffer.index_copy_(0, loc, rows)


def move_rows(buffers: Iterable[torch.Tensor], *, tgt: torch.Tensor, src: torch.Tensor) -> None:
    """In each buffer, copy row ``src[i]`` to row ``tgt[i]`` (gather first, then scatter)."""
    for buffer in buffers:
        buffer.index_copy_(0, tgt, buffer.index_select(0, src))


def gather_rows(buffer: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """A new tensor holding ``buffer[loc[i]]`` in order (never a view of ``buffer``)."""
    return buffer.index_select(0, loc)
