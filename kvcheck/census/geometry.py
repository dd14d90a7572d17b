"""The sizes a pool's tensors are measured against: capacity, page size, layers, rows.

A census never asks what class a pool is; it reads the numbers the pool keeps about
itself (``size``, ``page_size``, ``layer_num``, ``start_layer``, ``max_batch_size``, ...)
and classifies each tensor's shape against them. A sub-pool (an SWA pool's ``swa_kv_pool``,
a hybrid pool's ``mamba_pool``) carries its own numbers; what it does not say it inherits
from the pool that holds it.

Example:
    >>> from types import SimpleNamespace
    >>> geometry = geometry_of(SimpleNamespace(size=8, page_size=4, layer_num=2))
    >>> geometry.slot_extents, geometry.page_extents
    ((12, 9), (3, 4))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CensusGeometry", "geometry_of"]

#: Attributes that give a pool's layer count, first found wins.
_LAYER_ATTRIBUTES = ("layer_num", "num_layers", "num_mamba_layers")
#: Attributes that give a pool's request rows (a req-to-token pool's rows, a tail's requests).
_ROW_ATTRIBUTES = (
    "max_batch_size",
    "max_running_requests",
    "max_num_reqs",
    "qsa_num_request_slots",
)
#: Attributes that give how many token slots one row of a grouped state stands for (a
#: compressed index cache: one row per group of slots; a per-request ring: that many rows
#: per request).
_GROUP_ATTRIBUTES = ("qsa_compress_ratio",)


@dataclass(frozen=True)
class CensusGeometry:
    """What a pool's tensors are sized by.

    ``size`` is the capacity the scheduler sees (None when the pool does not say),
    ``page_size`` its tokens per page, ``layers`` its local layer count, ``rows`` its
    request-row counts, ``token_stride`` how many ids one row stands for beyond the
    pool's own (decode context parallel widens ids by its width), ``group`` how many token
    slots one row of a grouped state stands for (1: none; :attr:`grouped_slot_extents`,
    :attr:`grouped_row_extents`).
    """

    size: int | None
    page_size: int = 1
    layers: int | None = None
    start_layer: int = 0
    rows: tuple[int, ...] = ()
    token_stride: int = 1
    group: int = 1

    def same_ids(self, other: CensusGeometry) -> bool:
        """Whether token ids mean the same rows here and in ``other`` (same capacity, page
        size and id stride; layer counts may differ, as between a hybrid's sub-pools)."""
        return (self.size, self.page_size, self.token_stride) == (
            other.size,
            other.page_size,
            other.token_stride,
        )

    @property
    def num_slots(self) -> int | None:
        """Rows of a token buffer: ``size + page_size`` (SGLang's padding page first)."""
        return None if self.size is None else self.size + self.page_size

    @property
    def slot_extents(self) -> tuple[int, ...]:
        """First-dimension lengths of a token-slot buffer: ``size + page_size``, that
        rounded up to whole pages (fused K/V halves), and ``size + 1`` (a pool of
        single-slot pages with a padding slot, like a mamba pool)."""
        if self.size is None:
            return ()
        slots = self.size + self.page_size
        padded = -(-slots // self.page_size) * self.page_size
        return tuple(dict.fromkeys((slots, padded, self.size + 1)))

    @property
    def page_extents(self) -> tuple[int, ...]:
        """First-dimension lengths of a page buffer: the pages of ``size + page_size``
        ids (times ``token_stride``), and one spare page."""
        if self.size is None:
            return ()
        ids = (self.size + self.page_size) * self.token_stride
        pages = -(-ids // self.page_size)
        return (pages, pages + 1)

    @property
    def grouped_slot_extents(self) -> tuple[int, ...]:
        """First-dimension lengths of a state with one row per ``group`` token slots (a
        compressed cache: row ``slot // group``); empty without a group.

        Example:
            >>> CensusGeometry(size=16, page_size=4, group=2).grouped_slot_extents
            (10, 9)
        """
        if self.group <= 1:
            return ()
        return tuple(dict.fromkeys(-(-slots // self.group) for slots in self.slot_extents))

    @property
    def grouped_row_extents(self) -> tuple[int, ...]:
        """First-dimension lengths of a per-request ring of ``group`` rows a request (rows
        ``r * group`` to ``r * group + group - 1``); empty without a group."""
        if self.group <= 1:
            return ()
        return tuple(dict.fromkeys(rows * self.group for rows in self.rows))

    @property
    def row_extents(self) -> tuple[int, ...]:
        """First-dimension lengths of a request-row buffer: each row count and one more
        (SGLang keeps a row for invalid request ids), and the capacity itself (a row pool's
        ``size`` is its rows: a req-to-token pool, a free list)."""
        counts = (*self.rows, *(() if self.size is None else (self.size,)))
        return tuple(dict.fromkeys(n for rows in counts for n in (rows, rows + 1)))


def _int_attribute(obj: object, name: str) -> int | None:
    # A property may raise on a half-built or meta pool: treat it as absent.
    try:
        value = getattr(obj, name, None)
    except Exception:
        return None
    if isinstance(value, bool):
        return None
    try:
        import operator

        return operator.index(value) if value is not None else None
    except TypeError:
        return None


def geometry_of(
    obj: object,
    *,
    parent: CensusGeometry | None = None,
    override: Mapping[str, Any] | None = None,
) -> CensusGeometry:
    """The geometry ``obj`` declares through its own attributes, falling back to
    ``parent``'s for what it leaves out, then ``override`` (CensusGeometry field ->
    value) on top.

    Example:
        >>> from types import SimpleNamespace
        >>> outer = geometry_of(SimpleNamespace(size=16, page_size=4, layer_num=3))
        >>> inner = geometry_of(SimpleNamespace(size=6), parent=outer)
        >>> inner.size, inner.page_size, inner.layers
        (6, 4, 3)
    """
    if override is not None and not isinstance(override, Mapping):
        raise ValueError(f"override={override!r} must be a mapping of CensusGeometry fields")
    unknown = sorted(set(override or ()) - {f.name for f in dataclasses.fields(CensusGeometry)})
    if unknown:
        raise ValueError(
            f"override: {unknown} are not CensusGeometry fields"
            f" ({', '.join(f.name for f in dataclasses.fields(CensusGeometry))})"
        )
    base = parent or CensusGeometry(size=None)
    size = _int_attribute(obj, "size")
    page_size = _int_attribute(obj, "page_size")
    layers = next(
        (n for n in (_int_attribute(obj, a) for a in _LAYER_ATTRIBUTES) if n is not None), None
    )
    start_layer = _int_attribute(obj, "start_layer")
    rows = tuple(n for n in (_int_attribute(obj, a) for a in _ROW_ATTRIBUTES) if n is not None)
    stride = _int_attribute(obj, "dcp_size")
    group = next(
        (n for n in (_int_attribute(obj, a) for a in _GROUP_ATTRIBUTES) if n is not None), None
    )
    found = CensusGeometry(
        size=size if size is not None else base.size,
        page_size=page_size if page_size and page_size > 0 else base.page_size,
        layers=layers if layers is not None else base.layers,
        start_layer=start_layer if start_layer is not None else base.start_layer,
        rows=rows or base.rows,
        token_stride=stride if stride and stride > 0 else base.token_stride,
        group=group if group and group > 0 else base.group,
    )
    return dataclasses.replace(found, **dict(override or {}))
