"""Which index space a tensor's first dimensions run over, read from its shape alone.

The rules, first match wins (``geometry`` is the pool's :class:`CensusGeometry`):

1. no elements: a **placeholder** (a skip layer's zero-row buffer, a dummy);
2. a 1-D integer table of at most eight entries per layer: **per-layer** (the pointer
   and stride tables a pool keeps for its kernels; KV data is never 32- or 64-bit ints);
3. first dimension a slot extent (``size + page_size``, padded to whole pages, or
   ``size + 1``): **token slot**;
4. first dimension the page size, below the slot count, in a pool with no token-slot
   buffer (``has_slot_buffers`` false): a **placeholder** (a no-op pool's one page of
   stand-in rows; beside slot buffers such a length is a page count);
5. first dimension a page extent: **page**;
6. first dimension a request-row extent: **request row**;
7. first dimension the layer count: the same rules on the second dimension (a state
   stacked by layer, ``[layers, slots, ...]``), else **per-layer**;
8. in a pool whose geometry has a ``group`` (slots one row stands for): first dimension
   a grouped slot extent, **token slot** in groups (row ``slot // group``); a request
   rows times the group, **request row** in groups (a per-request ring);
9. anything else is **unclassified**, and the census names it.

Example:
    >>> import torch
    >>> geometry = CensusGeometry(size=8, page_size=4, layers=2, rows=(5,))
    >>> [classify(torch.zeros(shape), geometry).space.value
    ...  for shape in [(12, 2), (3, 64), (4, 1), (6, 3), (2, 12, 5), (0, 7), (7,)]]
    ['slot', 'page', 'placeholder', 'row', 'slot', 'placeholder', 'unclassified']
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from kvcheck.census.geometry import CensusGeometry

__all__ = ["Classification", "IndexSpace", "classify"]

#: Per-layer tables hold at most this many entries per layer (K and V pointers of payload
#: and scale buffers, their strides).
_TABLE_ENTRIES_PER_LAYER = 8


class IndexSpace(enum.Enum):
    """What the leading dimension of a tensor (at :attr:`Classification.dim`) indexes."""

    SLOT = "slot"
    PAGE = "page"
    ROW = "row"
    LAYER = "layer"
    PLACEHOLDER = "placeholder"
    #: Declared only (:mod:`kvcheck.census.declared`): scratch no operation carries.
    WORKSPACE = "workspace"
    #: Declared only: another layout of state another tensor holds.
    MIRROR = "mirror"
    UNCLASSIFIED = "unclassified"

    @property
    def holds_state(self) -> bool:
        """Whether tensors of this space hold cache state that operations must carry."""
        return self in (IndexSpace.SLOT, IndexSpace.PAGE, IndexSpace.ROW)


@dataclass(frozen=True)
class Classification:
    """A tensor's index space, the dimension that runs over it, and why."""

    space: IndexSpace
    dim: int | None
    why: str
    #: Token slots (SLOT) or rows per request (ROW) one row along ``dim`` groups.
    group: int = 1


def _leading(
    length: int, geometry: CensusGeometry, *, dim: int, has_slot_buffers: bool
) -> Classification | None:
    if length in geometry.slot_extents:
        return Classification(IndexSpace.SLOT, dim, f"dim {dim} = {length} token slots")
    slots = geometry.num_slots
    placeholder = dim == 0 and not has_slot_buffers and length == geometry.page_size
    if placeholder and slots is not None and length < slots:
        return Classification(IndexSpace.PLACEHOLDER, None, f"one page of {length} rows")
    if length in geometry.page_extents:
        return Classification(IndexSpace.PAGE, dim, f"dim {dim} = {length} pages")
    return None


def classify(
    tensor: torch.Tensor, geometry: CensusGeometry, *, has_slot_buffers: bool = False
) -> Classification:
    """The index space of ``tensor`` in a pool of ``geometry`` (see the module's rules);
    ``has_slot_buffers``: whether the pool holds token-slot buffers besides it."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor={type(tensor).__name__} must be a torch.Tensor")
    if not isinstance(geometry, CensusGeometry):
        raise ValueError(f"geometry={geometry!r} must be a CensusGeometry")
    shape = tuple(tensor.shape)
    if tensor.numel() == 0:
        return Classification(IndexSpace.PLACEHOLDER, None, f"no elements (shape {shape})")
    layers = geometry.layers
    if (
        tensor.dim() == 1
        and not tensor.dtype.is_floating_point
        and tensor.element_size() >= 4
        and layers
        and shape[0] % layers == 0
        and shape[0] <= _TABLE_ENTRIES_PER_LAYER * layers
    ):
        return Classification(IndexSpace.LAYER, 0, f"a table of {shape[0]} ints, {layers} layers")
    if tensor.dim() == 0:
        return Classification(IndexSpace.UNCLASSIFIED, None, "a scalar tensor")
    found = _leading(shape[0], geometry, dim=0, has_slot_buffers=has_slot_buffers)
    if (
        found is not None
        and found.space in (IndexSpace.PAGE, IndexSpace.PLACEHOLDER)
        and layers
        and shape[0] == layers
        and tensor.dim() > 1
    ):
        # One layer's state stacked [1, slots, ...] (a one-layer mamba pool) also reads as
        # one page of page_size 1: the slot axis behind it is the better reading.
        stacked = _leading(shape[1], geometry, dim=1, has_slot_buffers=True)
        if stacked is not None and stacked.space is IndexSpace.SLOT:
            return stacked
    if found is not None:
        return found
    if shape[0] in geometry.row_extents:
        return Classification(IndexSpace.ROW, 0, f"dim 0 = {shape[0]} request rows")
    if layers and shape[0] == layers:
        if tensor.dim() > 1:
            stacked = _leading(shape[1], geometry, dim=1, has_slot_buffers=True)
            if stacked is None and shape[1] in geometry.row_extents:
                stacked = Classification(IndexSpace.ROW, 1, f"dim 1 = {shape[1]} request rows")
            if stacked is not None:
                return stacked
        return Classification(IndexSpace.LAYER, 0, f"dim 0 = {layers} layers")
    group = geometry.group
    if shape[0] in geometry.grouped_slot_extents:
        why = f"dim 0 = {shape[0]} rows of {group} token slots each"
        return Classification(IndexSpace.SLOT, 0, why, group=group)
    if shape[0] in geometry.grouped_row_extents:
        why = f"dim 0 = {shape[0]} rows, {group} per request row"
        return Classification(IndexSpace.ROW, 0, why, group=group)
    return Classification(
        IndexSpace.UNCLASSIFIED,
        None,
        f"shape {shape} matches no slot {geometry.slot_extents}, page {geometry.page_extents},"
        f" row {geometry.row_extents} or layer ({layers}) count",
    )
