"""A naive model of a host tier: host slots, the bytes each host slot holds, and where each
layout puts them, by loops and its own offset formulas (no code shared with the host pools).

:class:`ReferenceHostPool` mirrors :class:`kvcheck.tiers.HostPoolSpec`'s host tier as the
parts a target builds (:func:`kvcheck.targets.tier_support.build_host_pool`): part 0 keeps the
device pool's main rows (MHA: K and V, in one ``kv_buffer`` or, for a V head dim of its own,
``k_buffer`` and ``v_buffer``; MLA and DSA: the latent ``kv_buffer``) and a quantized pool's
scale buffers (``k_scale_buffer`` as ``k_scale_host``, ...: a row per token slot, its bytes
whole, or a row per page, by page; in the page's bytes after the payload), part 1, where the pool
has other per-layer buffers (DSA's index-K pages), keeps those under their own names, only
for layers that have rows. Per layout, byte offsets of row ``R`` bytes wide, host slot ``t``
(page ``p = t // ps``), host layer ``l`` of ``L``, ``S`` host slots, ``P`` host pages:

- ``layer_first``: ``(l * S + t) * R``; ``page_first``: ``(t * L + l) * R``;
- ``page_first_direct``: ``(p * L + l) * ps * R + (t % ps) * R``;
- ``page_head`` (MHA, ``H`` heads of ``D = R / H`` bytes; head ``h``):
  ``(p * H + h) * ps * L * D + (t % ps) * L * D + l * D``;
- a buffer of page rows: ``(l * P + p) * R`` in ``layer_first``, ``(p * L + l) * R`` otherwise;
- MHA's ``kv_buffer`` holds all of K, then all of V.

Example:
    >>> from kvcheck.reference import ReferencePool
    >>> from kvcheck.specs import PoolSpec, WriteKV
    >>> from kvcheck.tiers import HostPoolSpec
    >>> device = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float8_e5m2",
    ...                   kv_lora_rank=1, qk_rope_head_dim=1)
    >>> pool = ReferencePool(device)
    >>> pool.apply(WriteKV(layer_id=0, locs=(2, 3), k_rows=(b"ab", b"cd")))
    >>> host = ReferenceHostPool(HostPoolSpec(device=device, layout="page_first",
    ...                                       io_backend="kernel", host_pages=2))
    >>> host.alloc(2, [0, 1])
    []
    >>> host.backup(pool, [0, 1], [2, 3])
    >>> host.expected_buffers(0)["kv_buffer"].tobytes()
    b'abcd\\x00\\x00\\x00\\x00'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcheck.reference import quant
from kvcheck.reference.pools import ReferencePool
from kvcheck.tiers import HostPoolSpec

__all__ = ["HostPiece", "ReferenceHostPool"]

_MAIN_BUFFERS = {"mha": ("k_buffer", "v_buffer"), "mla": ("kv_buffer",), "dsa": ("kv_buffer",)}


@dataclass
class HostPiece:
    """One mirrored device buffer: where it lives in the host tier and how wide its rows are."""

    source: str  # the device buffer (a key of ReferencePool.expected_buffers())
    attribute: str  # the host attribute holding it
    base: int  # its first byte in that attribute
    layers: list[int]  # local device layers, in host-layer order
    unit: str  # "token" or "page"
    row: int  # bytes per row
    heads: int = 1  # page_head: heads per row
    #: host layer -> host slot (token) or host page (page) -> bytes
    rows: dict[int, dict[int, bytes]] = field(default_factory=dict)


class ReferenceHostPool:
    """Host slots and host bytes of the tier ``spec`` describes."""

    def __init__(self, spec: HostPoolSpec) -> None:
        self.spec = spec
        self.size = spec.host_size
        self.page_size = spec.page_size
        self.free_slots: list[int] = list(range(self.size))
        self.held: set[int] = set()
        self.parts: list[list[HostPiece]] = []
        self._pieces(ReferencePool(spec.device).expected_buffers())

    # -- what is mirrored, where ----------------------------------------------------------

    def _pieces(self, buffers: Mapping[str, list[np.ndarray]]) -> None:
        spec = self.spec
        device = spec.device
        main = _MAIN_BUFFERS[device.family]
        slots = self.size * 1
        anchor: list[HostPiece] = []
        base = 0
        for name in main:
            arrays = buffers[name]
            row = arrays[0].shape[1]
            layers = list(range(device.layer_num))
            if device.family == "mha" and not spec.asymmetric:
                attribute = "kv_buffer"
            else:
                attribute, base = name, 0
            anchor.append(HostPiece(name, attribute, base, layers, "token", row, device.head_num))
            base += slots * len(layers) * row
        scales = quant.scale_buffer_names(device)
        for name in scales:
            arrays = buffers[name]
            unit = "token" if arrays[0].shape[0] == device.num_slots else "page"
            attribute = name[: -len("_buffer")] + "_host"
            layers = list(range(device.layer_num))
            anchor.append(HostPiece(name, attribute, 0, layers, unit, arrays[0].shape[1]))
        self.parts.append(anchor)
        others = []
        for name, arrays in buffers.items():
            if name in main or name in scales:
                continue
            layers = [layer for layer, array in enumerate(arrays) if array.shape[0] > 0]
            if not layers:
                continue
            unit = "token" if arrays[layers[0]].shape[0] == device.num_slots else "page"
            others.append(HostPiece(name, name, 0, layers, unit, arrays[layers[0]].shape[1]))
        if others:
            self.parts.append(others)

    def _offset(
        self, piece: HostPiece, host_layer: int, unit_id: int, pages: int, head: int = 0
    ) -> int:
        """Byte offset of a row (or of one head's part of it, for page_head) in its attribute."""
        layout, ps, count = self.spec.layout, self.page_size, len(piece.layers)
        size, row = self.size, piece.row
        if piece.unit == "page":
            if layout == "layer_first":
                return piece.base + (host_layer * pages + unit_id) * row
            return piece.base + (unit_id * count + host_layer) * row
        t = unit_id
        if layout == "layer_first":
            return piece.base + (host_layer * size + t) * row
        if layout == "page_first":
            return piece.base + (t * count + host_layer) * row
        if layout == "page_first_direct":
            return piece.base + ((t // ps) * count + host_layer) * ps * row + (t % ps) * row
        width = row // piece.heads
        block = ((t // ps) * piece.heads + head) * ps * count * width
        return piece.base + block + (t % ps) * count * width + host_layer * width

    def _spans(
        self, piece: HostPiece, host_layer: int, unit_id: int, pages: int
    ) -> list[tuple[int, int]]:
        """The (offset, length) pieces of one row, in the row's own byte order."""
        if self.spec.layout == "page_head" and piece.unit == "token":
            width = piece.row // piece.heads
            return [
                (self._offset(piece, host_layer, unit_id, pages, head), width)
                for head in range(piece.heads)
            ]
        return [(self._offset(piece, host_layer, unit_id, pages), piece.row)]

    def _units(self, piece: HostPiece) -> int:
        return self.size if piece.unit == "token" else self.size // self.page_size

    # -- host slots ------------------------------------------------------------------------

    def alloc(self, need_size: int, slots: Sequence[int]) -> list[str]:
        """Judge and record ``alloc(need_size)``'s answer: that many free slots, each once."""
        problems = []
        if len(slots) != need_size:
            problems.append(f"host alloc({need_size}) returned {len(slots)} slots")
        seen: set[int] = set()
        for slot in slots:
            if slot in seen or slot in self.held or not 0 <= slot < self.size:
                problems.append(
                    f"host alloc({need_size}): slot {slot} is held, repeated or outside the pool"
                )
            seen.add(slot)
        if not problems:
            for slot in slots:
                self.held.add(slot)
                self.free_slots.remove(slot)
        return problems

    def available_size(self) -> int:
        return len(self.free_slots)

    def free_problem(self, slots: Sequence[int]) -> str | None:
        """Why ``free(slots)`` is bad input (None: it is valid)."""
        seen: set[int] = set()
        for slot in slots:
            if slot in seen:
                return f"host slot {slot} is listed twice"
            if slot not in self.held:
                return f"host slot {slot} is not held"
            seen.add(slot)
        return None

    def free(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self.held.discard(slot)
            self.free_slots.append(slot)

    # -- bytes -----------------------------------------------------------------------------

    def backup(
        self, device: ReferencePool, host_ids: Sequence[int], device_ids: Sequence[int]
    ) -> None:
        """Copy the rows of ``device_ids`` (every layer) into ``host_ids``, as the device
        reference holds them now; page rows move by page (``ids[k * ps] // ps``)."""
        buffers = device.expected_buffers()
        ps = self.page_size
        for part in self.parts:
            for piece in part:
                arrays = buffers[piece.source]
                for host_layer, layer in enumerate(piece.layers):
                    stored = piece.rows.setdefault(host_layer, {})
                    if piece.unit == "token":
                        for host_slot, device_slot in zip(host_ids, device_ids, strict=True):
                            stored[host_slot] = arrays[layer][device_slot].tobytes()
                    else:
                        for k in range(0, len(host_ids), ps):
                            stored[host_ids[k] // ps] = arrays[layer][device_ids[k] // ps].tobytes()

    def expected_buffers(
        self, part: int, *, pages: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        """Part ``part``'s host attributes as flat uint8 arrays. ``pages`` gives a page-row
        attribute's page count where the pool holds more pages than its slots need."""
        out: dict[str, np.ndarray] = {}
        for piece in self.parts[part]:
            count = (pages or {}).get(piece.attribute, self.size // self.page_size)
            units = self.size if piece.unit == "token" else count
            length = piece.base + units * len(piece.layers) * piece.row
            if piece.attribute in out and len(out[piece.attribute]) < length:
                grown = np.zeros(length, dtype=np.uint8)
                grown[: len(out[piece.attribute])] = out[piece.attribute]
                out[piece.attribute] = grown
            buffer = out.setdefault(piece.attribute, np.zeros(length, dtype=np.uint8))
            for host_layer, stored in piece.rows.items():
                for unit_id, data in stored.items():
                    cursor = 0
                    for offset, width in self._spans(piece, host_layer, unit_id, count):
                        buffer[offset : offset + width] = np.frombuffer(
                            data[cursor : cursor + width], np.uint8
                        )
                        cursor += width
        return out

    def _page_spans(self, part: int, index: int) -> list[tuple[HostPiece, int, int, int, int, int]]:
        """The data page starting at host slot ``index``, in the flat page's order: per piece
        of a row, (mirrored buffer, host layer, slot or page, head, offset, length)."""
        layout, ps = self.spec.layout, self.page_size
        slots = list(range(index, index + ps))
        spans: list[tuple[HostPiece, int, int, int, int, int]] = []
        pages = self.size // ps
        for piece in self.parts[part]:
            layers = range(len(piece.layers))
            heads = range(piece.heads if layout == "page_head" and piece.unit == "token" else 1)
            width = piece.row // len(heads)
            if piece.unit == "page":
                order = [(layer, index // ps, 0) for layer in layers]
            elif layout == "page_first":
                order = [(layer, t, 0) for t in slots for layer in layers]
            elif layout == "page_head":
                order = [(layer, t, h) for h in heads for t in slots for layer in layers]
            else:
                order = [(layer, t, 0) for layer in layers for t in slots]
            for layer, unit_id, head in order:
                offset = self._offset(piece, layer, unit_id, pages, head)
                spans.append((piece, layer, unit_id, head, offset, width))
        return spans

    def expected_data_page(self, part: int, index: int) -> bytes:
        """``get_data_page(index)`` of part ``part``, flat, as bytes."""
        buffers = self.expected_buffers(part)
        return b"".join(
            buffers[piece.attribute][offset : offset + width].tobytes()
            for piece, _, _, _, offset, width in self._page_spans(part, index)
        )

    def set_data_page(self, part: int, index: int, data: bytes) -> None:
        """Record ``set_from_flat_data_page(index, data)``: the page's rows take ``data``."""
        cursor = 0
        rows: dict[tuple[int, int, int], bytearray] = {}
        pieces = self.parts[part]
        for piece, layer, unit_id, head, _, width in self._page_spans(part, index):
            key = (pieces.index(piece), layer, unit_id)
            row = rows.setdefault(key, bytearray(piece.row))
            row[head * width : (head + 1) * width] = data[cursor : cursor + width]
            cursor += width
        for (number, layer, unit_id), row in rows.items():
            pieces[number].rows.setdefault(layer, {})[unit_id] = bytes(row)

    def expected_page_ranges(
        self, part: int, starts: Sequence[int]
    ) -> dict[str, list[tuple[int, int]]]:
        """The bytes of the data pages starting at ``starts``, per attribute, as merged
        ``[start, end)`` ranges (what ``get_page_buffer_meta`` must name)."""
        spans: dict[str, list[tuple[int, int]]] = {}
        for index in starts:
            for piece, _, _, _, offset, width in self._page_spans(part, index):
                spans.setdefault(piece.attribute, []).append((offset, offset + width))
        return {attribute: merge_ranges(ranges) for attribute, ranges in spans.items()}

    def expected_size_per_token(self, part: int) -> int:
        """Host bytes per host slot of part ``part`` (page rows count ``row / page_size``)."""
        total = 0
        for piece in self.parts[part]:
            per_token = piece.row if piece.unit == "token" else piece.row // self.page_size
            total += per_token * len(piece.layers)
        return total

    # -- what a zero-copy storage backend is told ------------------------------------------

    def expected_ksize_per_token(self, part: int) -> int:
        """Host bytes per host slot of part ``part``'s key side: MHA's K rows, every byte of
        any other part."""
        keys = [piece for piece in self.parts[part] if piece.source == "k_buffer"]
        if not keys:
            return self.expected_size_per_token(part)
        return sum(piece.row * len(piece.layers) for piece in keys)

    def expected_stride_aligned(
        self, part: int, addresses: Mapping[str, int], page_size_bytes: int
    ) -> bool:
        """``is_stride_page_aligned(page_size_bytes)`` of part ``part`` whose attributes start
        at ``addresses``: never in ``layer_first``; otherwise every mirrored buffer's first
        byte and the step from one page's first byte to the next's are multiples."""
        if self.spec.layout == "layer_first":
            return False
        pages = self.size // self.page_size
        for piece in self.parts[part]:
            second = self.page_size if piece.unit == "token" else 1
            step = self._offset(piece, 0, second, pages) - self._offset(piece, 0, 0, pages)
            first = addresses[piece.attribute] + self._offset(piece, 0, 0, pages)
            if first % page_size_bytes or step % page_size_bytes:
                return False
        return True

    def expected_split_head_regions(
        self, start: int, split_factor: int
    ) -> list[tuple[str, list[tuple[int, int]]]]:
        """``page_head`` only: the page starting at host slot ``start`` as
        ``get_split_heads_page_buffer_meta`` names it: per group of ``heads // split_factor``
        heads, K's bytes of those heads, then V's, as (attribute, merged ranges)."""
        pieces = self.parts[0]
        heads = pieces[0].heads
        group = heads // split_factor
        pages = self.size // self.page_size
        regions = []
        for first in range(0, heads, group):
            for piece in pieces:
                width = piece.row // heads
                ranges = []
                for slot in range(start, start + self.page_size):
                    for layer in range(len(piece.layers)):
                        for head in range(first, first + group):
                            offset = self._offset(piece, layer, slot, pages, head)
                            ranges.append((offset, offset + width))
                regions.append((piece.attribute, merge_ranges(ranges)))
        return regions


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges, sorted, with touching or overlapping ones joined.

    Example:
        >>> merge_ranges([(4, 6), (0, 2), (2, 3)])
        [(0, 3), (4, 6)]
    """
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
