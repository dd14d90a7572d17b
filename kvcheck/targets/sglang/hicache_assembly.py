"""The HiCache host pool group sglang assembles for a device pool, on CPU: the sglang
target's ``hicache_assembly`` member, read by the census (`kvcheck.suite.test_census`).

With ``--enable-hierarchical-cache`` (or a PD decode server's host-pool retraction) the
scheduler's ``UnifiedRadixCache.init_hicache`` calls
``hybrid_cache.hybrid_pool_assembler.attach_hybrid_pool_to_unified_cache``, which picks a
stack strategy for the device pool and the tree's components (``_select_strategy``) and
builds its host pool group. Here the same strategy is picked and built, for the
components sglang's registry gives the pool's model (``FULL``, with ``SWA`` for a
sliding-window hybrid and ``MAMBA`` for a linear-attention one).

Stand-ins (each declared, none changes which strategy runs or what it assembles):

- host memory is not registered with CUDA (``pool_host.common._cuda_host_register`` does
  nothing: there is no driver here; the buffers are plain CPU memory);
- the cache controller the strategy builds after the group (``HybridCacheController``,
  CUDA streams and threads) is not started: its construction is where the build stops,
  with the group it was handed;
- the tree the strategy's eviction callbacks would call is a placeholder (they are
  stored, not called, while the group is assembled).

What it answers: the group's entries (`HostEntry`), or the error the assembly raised.
`missing_entries` compares them with the host pools the device pool and its sub-pools
declare (``host_pool_decls()``, sglang 0.5.22 on): sglang's own check
(``_check_declared_pools_present``) reads the outer pool's declarations only.

Example, where sglang is installed::

    entries = hicache_assembly(swa_pool)  # [HostEntry(name='kv', ...), ...]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvcheck.targets.sglang import env

__all__ = ["HostEntry", "hicache_assembly", "missing_entries"]


@dataclass(frozen=True)
class HostEntry:
    """One entry of the group: its pool name, the device pool it transfers and the class
    of the host pool holding its copy."""

    name: str
    device_pool: Any
    host_pool: str


class _Assembled(Exception):
    """Raised in place of starting the cache controller: the group is complete."""

    def __init__(self, group: Any) -> None:
        super().__init__("host pool group assembled")
        self.group = group


def _components(modules: SimpleNamespace, pool: Any) -> set[Any]:
    kinds = {modules.ComponentType.FULL}
    if isinstance(pool, modules.SWAKVPool):
        kinds.add(modules.ComponentType.SWA)
    if modules.HybridLinearKVPool is not None and isinstance(pool, modules.HybridLinearKVPool):
        kinds.add(modules.ComponentType.MAMBA)
    return kinds


def _modules() -> SimpleNamespace:
    with env.torchvision_stand_in():
        from sglang.srt.mem_cache import cache_init_params, swa_memory_pool
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler
        from sglang.srt.mem_cache.pool_host import common as host_common
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.runtime_context import get_context

        try:
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool
        except ImportError:
            HybridLinearKVPool = None
    return SimpleNamespace(
        assembler=hybrid_pool_assembler,
        host_common=host_common,
        CacheInitParams=cache_init_params.CacheInitParams,
        ComponentType=ComponentType,
        SWAKVPool=swa_memory_pool.SWAKVPool,
        HybridLinearKVPool=HybridLinearKVPool,
        get_context=get_context,
    )


@contextlib.contextmanager
def _stand_ins(modules: SimpleNamespace) -> Iterator[None]:
    assembler, host_common = modules.assembler, modules.host_common
    saved = assembler.HybridCacheController, host_common._cuda_host_register

    def controller(_allocator: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Assembled(group)

    assembler.HybridCacheController = controller
    host_common._cuda_host_register = lambda *args, **kwargs: None
    try:
        yield
    finally:
        assembler.HybridCacheController, host_common._cuda_host_register = saved


def hicache_assembly(
    pool: Any, *, allocator: Any = None, req_to_token_pool: Any = None
) -> list[HostEntry]:
    """The entries of the host pool group sglang's HiCache strategy assembles for
    ``pool`` (its error propagates: that is what a server starting with HiCache meets).
    ``allocator`` is the pool's token allocator where the strategy reads it (the SWA
    allocator of a sliding-window hybrid), ``req_to_token_pool`` the request pool whose
    mamba slots a linear-attention hybrid's strategy reads."""
    m = _modules()
    strategy = m.assembler._select_strategy(pool, _components(m, pool))
    params = m.CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator
        if allocator is not None
        else SimpleNamespace(swa_attn_allocator=None),
        page_size=pool.page_size,
    )
    tree = SimpleNamespace(evict_host=lambda *args: None, evict=lambda *args: None)
    config = m.get_context().override_server_args(
        enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=0
    )
    config.install()
    try:
        with _stand_ins(m):
            strategy.build(
                cache=tree,
                kvcache=pool,
                params=params,
                server_args=None,
                load_cache_event=None,
            )
    except _Assembled as assembled:
        group = assembled.group
    else:
        raise RuntimeError(f"{type(strategy).__name__} built no cache controller")
    finally:
        config.restore()
    return [
        HostEntry(
            str(getattr(name, "value", name)), entry.device_pool, type(entry.host_pool).__name__
        )
        for name, entry in group.entry_map.items()
    ]


def missing_entries(pool: Any, entries: list[HostEntry]) -> list[str]:
    """The host pools ``pool`` or a sub-pool declares that no entry transfers from that
    device pool, each as ``"<sub-pool>: <pool name>"`` (empty where the release
    declares none)."""
    pools = [("pool", pool)]
    for attribute in ("full_kv_pool", "swa_kv_pool"):
        sub = getattr(pool, attribute, None)
        if sub is not None:
            pools.append((attribute, sub))
    missing = []
    for label, device_pool in pools:
        declare = getattr(device_pool, "host_pool_decls", None)
        if declare is None:
            continue
        for decl in declare():
            name = str(getattr(decl.pool_name, "value", decl.pool_name))
            # A primary pool (its own host indices) is the sub-pool's entry, whatever the
            # group calls it (a window side's KV is the group's SWA); a sidecar keeps its
            # name (a DSA side's indexer).
            # The outer pool's declarations are read as sglang's own check reads them, by
            # name (a hybrid declares its KV over itself, the group holds its sides).
            primary = decl.indices_from_pool is None
            if label == "pool":
                found = any(entry.name == name for entry in entries)
            else:
                found = any(
                    entry.device_pool is decl.device_pool and (primary or entry.name == name)
                    for entry in entries
                )
            if not found:
                missing.append(f"{label} ({type(device_pool).__name__}): {name}")
    return missing
