"""Two single-bug MHA pools, written as a user would bring their own pool to kvcheck.

Held out: neither is one of kvcheck's own twins (``tests/broken_pools.py``), and nothing in
kvcheck knows them. Each subclasses kvcheck's MHA pool, breaks one thing, and is exposed
as a target the way the README's "Check your own pool" section and ``examples/downstream``
do::

    cd scripts/time_to_first_report
    kvcheck verify --target user_pools:k_only_move
    kvcheck verify --target user_pools:last_layer_write

- ``k_only_move``: a move copies every layer's K rows and leaves V where it was;
- ``last_layer_write``: ``set_kv_buffer`` drops the write when it is for the pool's last
  layer of several (an off-by-one over the layers).

Each target is kvcheck's own with its class in place of the plain MHA pool, so the whole
suite runs (180 tests), as it does for a user who subclasses ``KVCheckTarget`` to swap in a
pool and keeps kvcheck's serving side.
"""

from __future__ import annotations

from typing import Any

from kvcheck.pools import MHATokenToKVPool
from kvcheck.specs import PoolSpec
from kvcheck.targets.builtin import KVCheckTarget


class KOnlyMovePool(MHATokenToKVPool):
    """Moves K; V stays at the source (the bug)."""

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        kept = [v.clone() for v in self.v_buffer]
        super().move_kv_cache(tgt_loc, src_loc)
        for v, before in zip(self.v_buffer, kept, strict=True):
            v.copy_(before)


class LastLayerDroppingPool(MHATokenToKVPool):
    """``set_kv_buffer`` writes nothing to the last of several layers (the bug)."""

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        *args: Any,
        layer_id_override: int | None = None,
        **kwargs: Any,
    ) -> None:
        layer_id = (
            getattr(layer, "layer_id", None) if layer_id_override is None else (layer_id_override)
        )
        if self.layer_num > 1 and layer_id == self.start_layer + self.layer_num - 1:
            return
        super().set_kv_buffer(
            layer, loc, cache_k, cache_v, *args, layer_id_override=layer_id_override, **kwargs
        )


class _OnePoolSwapped(KVCheckTarget):
    """kvcheck's own target with ``pool`` in place of its plain MHA pool (every layout; the
    quantized MHA pools, MLA, DSA and the no-op pool stay kvcheck's)."""

    pool: type[MHATokenToKVPool] = MHATokenToKVPool

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        arguments = self.pool_arguments(spec, device=device)
        if arguments.pool_class == "kvcheck.pools:MHATokenToKVPool":
            return arguments.build(self.pool)
        return arguments.build()


class KOnlyMoveTarget(_OnePoolSwapped):
    name = "user-k-only-move"
    version = "0.1.0"
    pool = KOnlyMovePool


class LastLayerWriteTarget(_OnePoolSwapped):
    name = "user-last-layer-write"
    version = "0.1.0"
    pool = LastLayerDroppingPool


k_only_move = KOnlyMoveTarget()
last_layer_write = LastLayerWriteTarget()
