"""What a sliding-window hybrid pool must hold, by loops over rows (no pool code shared).

The reference keeps, per global layer, one row per slot of the side the layer belongs to:
``sub.size + page_size`` rows for a full-attention layer, ``size_swa + page_size`` for a
sliding-window layer. Each row maps a buffer name (``"k"``/``"v"`` for MHA, ``"k"`` alone,
the latent row, for MLA and DSA) to the values it holds. Operations name full-side slots and
are given the SWA mapping (the allocator's, as a list: ``mapping[full_slot]`` is the peer,
0 for none), so the reference decides by itself where each layer's rows go.

Example:
    >>> from kvcheck.specs import PoolSpec, SWAPoolSpec
    >>> spec = SWAPoolSpec(PoolSpec(family="mha", size=4, page_size=1, layer_num=2,
    ...                             dtype="bfloat16", head_num=1, head_dim=1),
    ...                    size_swa=2, swa_layers=(True, False))
    >>> ref = ReferenceSWAPool(spec)
    >>> mapping = [0, 2, 0, 0, 0, -1]
    >>> ref.write(0, [1], mapping, {"k": [[[7.0]]], "v": [[[8.0]]]})
    >>> ref.rows[0][2]["k"], ref.rows[1][1]["k"]
    ([[7.0]], [[0.0]])
"""

from __future__ import annotations

import copy
from typing import Any

from kvcheck.specs import SWAPoolSpec

__all__ = ["ReferenceSWACopy", "ReferenceSWAPool"]

Row = dict[str, Any]


def _zero_row(spec: SWAPoolSpec) -> Row:
    sub = spec.sub
    if sub.family == "mha":
        v_dim = sub.head_dim if sub.v_head_dim is None else sub.v_head_dim
        return {
            "k": [[0.0] * sub.head_dim for _ in range(sub.head_num)],
            "v": [[0.0] * v_dim for _ in range(sub.head_num)],
        }
    return {"k": [[0.0] * (sub.kv_lora_rank + sub.qk_rope_head_dim)]}


class ReferenceSWACopy:
    """A host copy in the reference: the full layers' rows per token, and the window layers'
    rows of the tokens that had a peer (``had_peer``)."""

    def __init__(self, full: dict[int, list[Row]], swa: dict[int, list[Row]], had_peer: list[bool]):
        self.full = full
        self.swa = swa
        self.had_peer = had_peer


class ReferenceSWAPool:
    """The rows a correct hybrid pool of ``spec`` holds (see the module)."""

    def __init__(self, spec: SWAPoolSpec) -> None:
        if not isinstance(spec, SWAPoolSpec):
            raise ValueError(f"spec={spec!r} is not a kvcheck.specs.SWAPoolSpec")
        self.spec = spec
        page = spec.sub.page_size
        self.rows: dict[int, list[Row]] = {}
        for layer, is_swa in enumerate(spec.swa_layers):
            count = (spec.size_swa if is_swa else spec.sub.size) + page
            self.rows[layer] = [_zero_row(spec) for _ in range(count)]

    def is_swa(self, layer_id: int) -> bool:
        """Whether global layer ``layer_id`` keeps only the window."""
        return bool(self.spec.swa_layers[layer_id])

    def _where(self, layer_id: int, full_slot: int, mapping: list[int]) -> int:
        return mapping[full_slot] if self.is_swa(layer_id) else full_slot

    def write(
        self, layer_id: int, full_slots: list[int], mapping: list[int], values: dict[str, Any]
    ) -> None:
        """Token ``i`` of ``values[name]`` (nested lists) lands in layer ``layer_id``'s row
        of ``full_slots[i]`` (a window layer: of its peer)."""
        for i, slot in enumerate(full_slots):
            row = self.rows[layer_id][self._where(layer_id, slot, mapping)]
            for name in row:
                row[name] = copy.deepcopy(values[name][i])

    def move(self, tgt: list[int], src: list[int], mapping: list[int]) -> None:
        """Each layer's row of ``tgt[i]`` becomes what its row of ``src[i]`` held (a window
        layer: at the peers), all read before any is written."""
        for layer_id, rows in self.rows.items():
            before = [copy.deepcopy(rows[self._where(layer_id, s, mapping)]) for s in src]
            for i, t in enumerate(tgt):
                rows[self._where(layer_id, t, mapping)] = before[i]

    def get_cpu_copy(self, full_slots: list[int], mapping: list[int]) -> ReferenceSWACopy:
        """The rows of ``full_slots``: every full layer's, and the window layers' of the
        tokens with a peer."""
        had_peer = [mapping[slot] > 0 for slot in full_slots]
        full: dict[int, list[Row]] = {}
        swa: dict[int, list[Row]] = {}
        for layer_id, rows in self.rows.items():
            if self.is_swa(layer_id):
                swa[layer_id] = [
                    copy.deepcopy(rows[mapping[slot]])
                    for slot, has in zip(full_slots, had_peer, strict=True)
                    if has
                ]
            else:
                full[layer_id] = [copy.deepcopy(rows[slot]) for slot in full_slots]
        return ReferenceSWACopy(full, swa, had_peer)

    def load_cpu_copy(
        self, saved: ReferenceSWACopy, full_slots: list[int], mapping: list[int]
    ) -> None:
        """Write ``saved`` back at ``full_slots``: full layers at every slot, window layers at
        the peers of the tokens that had one when copied and have one now; other window
        rows are left as they are."""
        for layer_id, saved_rows in saved.full.items():
            for slot, row in zip(full_slots, saved_rows, strict=True):
                self.rows[layer_id][slot] = copy.deepcopy(row)
        for layer_id, saved_rows in saved.swa.items():
            next_saved = 0
            for slot, had in zip(full_slots, saved.had_peer, strict=True):
                if not had:
                    continue
                row = saved_rows[next_saved]
                next_saved += 1
                if mapping[slot] > 0:
                    self.rows[layer_id][mapping[slot]] = copy.deepcopy(row)
