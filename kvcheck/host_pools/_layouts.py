"""Where a host layout keeps one token's row of one layer (SGLang 0.5.23's host layouts).

A host buffer of one component (K, V, or a latent row) has, per layout:

- ``layer_first``: ``(layers, slots, *row)``;
- ``page_first``: ``(slots, layers, *row)``;
- ``page_first_direct``: ``(pages, layers, page_size, *row)``;
- ``page_head`` (MHA, ``row = (heads, head_dim)``): ``(pages, heads, page_size, layers, head_dim)``.

Example:
    >>> import torch
    >>> host = torch.zeros(host_dims("page_first", layers=2, slots=4, page_size=2, row=(3,)))
    >>> put_rows(host, "page_first", 1, torch.tensor([2]), torch.ones(1, 3), page_size=2)
    >>> host[2, 1].tolist()
    [1.0, 1.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import torch

LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_first_direct", "page_head")


def host_dims(
    layout: str, *, layers: int, slots: int, page_size: int, row: tuple[int, ...]
) -> tuple[int, ...]:
    """The shape of one component's host buffer."""
    pages = slots // page_size
    if layout == "layer_first":
        return (layers, slots, *row)
    if layout == "page_first":
        return (slots, layers, *row)
    if layout == "page_first_direct":
        return (pages, layers, page_size, *row)
    if layout == "page_head":
        heads, head_dim = row
        return (pages, heads, page_size, layers, head_dim)
    raise ValueError(f"layout={layout!r} not in {LAYOUTS}")


def _index(layout: str, layer: int, ids: torch.Tensor, page_size: int) -> tuple[Any, ...]:
    if layout == "layer_first":
        return (layer, ids)
    if layout == "page_first":
        return (ids, layer)
    if layout == "page_first_direct":
        return (ids // page_size, layer, ids % page_size)
    return (ids // page_size, slice(None), ids % page_size, layer)


def get_rows(
    host: torch.Tensor, layout: str, layer: int, ids: torch.Tensor, *, page_size: int
) -> torch.Tensor:
    """Rows ``ids`` of ``layer``, ``[len(ids), *row]`` (a copy)."""
    return host[_index(layout, layer, ids.long().cpu(), page_size)].clone()


def put_rows(
    host: torch.Tensor,
    layout: str,
    layer: int,
    ids: torch.Tensor,
    rows: torch.Tensor,
    *,
    page_size: int,
) -> None:
    """Write ``rows`` (``[len(ids), *row]``) to slots ``ids`` of ``layer``."""
    if layout == "page_head":
        row: tuple[int, ...] = (host.shape[1], host.shape[4])
    else:
        row = tuple(host.shape[3 if layout == "page_first_direct" else 2 :])
    rows = rows.reshape(len(ids), *row)
    host[_index(layout, layer, ids.long().cpu(), page_size)] = rows.to(host.device)


def page_view(host: torch.Tensor, layout: str, index: int, page_size: int) -> torch.Tensor:
    """The data page starting at host slot ``index``, as a view in the layout's own order."""
    if layout == "layer_first":
        return host[:, index : index + page_size]
    if layout == "page_first":
        return host[index : index + page_size]
    return host[index // page_size : index // page_size + 1]
