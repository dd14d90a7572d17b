"""HS1 (sglang 0.5.23): HiCache cannot start for an MLA model with sliding-window layers.

_build_hybrid_mla_swa_kv_pool gives such a model (Dots3) a SWAKVPool of MLA sides (a DSA
full side); with --enable-hierarchical-cache the stack strategy sglang selects for it
(_SwaStrategy) builds MHA host pools (use_mla=False). Its own path runs up to the cache
controller (CUDA streams); host memory is not CUDA-registered here (no driver). Exit 1 and
"BUG PRESENT: ..." while the group fails; 0 and "fixed" once it holds every declared pool.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import types

import cpu_stand_ins as cpu
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa
from sglang.srt.mem_cache.pool_host import common
from sglang.srt.mem_cache.unified_cache.components import ComponentType as C

hybrid, PAGE = cpu.dsa_swa_hybrid(), 64
common._cuda_host_register = lambda *args, **kwargs: None  # no CUDA driver: plain memory
hpa.HybridCacheController = lambda alloc, group, *a, **k: cpu.stop_with(group)  # CUDA streams
strategy, problem = hpa._select_strategy(hybrid, {C.FULL, C.SWA}), None
params = CacheInitParams(disable=False, req_to_token_pool=None, page_size=PAGE,
    token_to_kv_pool_allocator=types.SimpleNamespace(swa_attn_allocator=None))  # fmt: skip
with cpu.one_rank(), cpu.server_args(hicache_ratio=2.0, hicache_size=0):
    try:
        strategy.build(cache=None, kvcache=hybrid, params=params, server_args=None,
            load_cache_event=None)  # fmt: skip
    except cpu.Stopped as stopped:
        decls = getattr(hybrid.full_kv_pool, "host_pool_decls", list)()
        lost = [d.pool_name for d in decls if d.indices_from_pool and d.pool_name not in
            stopped.value.entry_map]  # fmt: skip
        problem = lost and f"the host pool group leaves out the DSA side's {lost}"
    except AttributeError as error:
        problem = f"{type(strategy).__name__}.build raised AttributeError: {error}"
cpu.verdict(problem, "fixed: HiCache assembles MLA host pools for every declared pool")
