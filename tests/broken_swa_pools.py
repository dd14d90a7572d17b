"""Deliberately broken sliding-window hybrid pools, each with one bug (helpers, not tests).

Each subclasses kvcheck's :class:`~kvcheck.pools.swa.SWAKVPool` and breaks one of the ways a
whole-pool operation must cover both sub-pools; :class:`BrokenSWATarget` builds one in place
of the real hybrid. ``tests/test_swa_pool_fail.py`` proves the hybrid machine catches each.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.pools.swa import SWAHostCopy, SWAKVPool, _unwrap
from kvcheck.specs import SWAPoolSpec
from kvcheck.targets.builtin import KVCheckTarget


class FullIndexWindowWrite(SWAKVPool):
    """Writes a sliding-window layer at the full-side location, not its translation."""

    def set_kv_buffer(
        self, layer: Any, loc_info: Any, cache_k: Any, cache_v: Any, *args: Any
    ) -> None:
        loc, _ = _unwrap(loc_info)
        super().set_kv_buffer(layer, type(loc_info)(loc, loc), cache_k, cache_v, *args)


class FullSideOnlyMove(SWAKVPool):
    """A speculative move that moves the full side only (the window side keeps stale rows)."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)


class EvictionBlindReload(SWAKVPool):
    """A reload that forgets which tokens had left the window when copied: it writes the
    copied window rows at the peers of the first tokens, in order, shifting every row of a
    request whose oldest tokens were evicted onto another token."""

    def load_cpu_copy(self, kv_cache_cpu: SWAHostCopy, indices: torch.Tensor) -> None:
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu.full, indices)
        if kv_cache_cpu.swa is None:
            return
        peers = self.translate_loc_from_full_to_swa(indices)
        self.swa_kv_pool.load_cpu_copy(kv_cache_cpu.swa, peers[: kv_cache_cpu.swa.num_tokens])


class InOrderLayerMapping(SWAKVPool):
    """Maps layers by position (the first ``full_layer_nums`` global ids to the full side),
    ignoring which ids the model marks as sliding-window layers."""

    def _side(self, layer_id: int, *, where: str) -> tuple[Any, int, bool]:
        position = sorted(self.layers_mapping).index(layer_id)
        if position < self.full_layer_nums:
            return self.full_kv_pool, position, False
        return self.swa_kv_pool, position - self.full_layer_nums, True


class BrokenSWATarget(KVCheckTarget):
    """kvcheck's target, building ``pool_class`` as its hybrid pool."""

    name = "broken-swa"

    def __init__(self, pool_class: type[SWAKVPool]) -> None:
        self.pool_class = pool_class

    def make_swa_pool(self, spec: SWAPoolSpec, *, device: str) -> Any:
        pool = super().make_swa_pool(spec, device=device)
        pool.__class__ = self.pool_class
        return pool
