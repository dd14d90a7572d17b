"""W1 (sglang 0.5.23): MHATokenToKVPool.set_kv_buffer divides the caller's K/V in place.

With a K/V payload whose dtype is not the pool's and k_scale/v_scale given, set_kv_buffer
runs ``cache_k.div_(k_scale)`` / ``cache_v.div_(v_scale)`` on the caller's tensors before
casting them (sglang's Triton backend clones K and V before every call to protect them).
A bf16 pool stores a float32 row with scales 2 and 4; sglang's default path runs here.
Exit 1 and "BUG PRESENT: ..." while the caller's tensors change; 0 and "fixed" after.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, head_dim=4, **cpu.MHA)
cache_k = torch.full((1, 1, 4), 6.0)  # float32 rows for a bf16 pool, with per-layer scales
cache_v = torch.full((1, 1, 4), 8.0)
k_before, v_before = cache_k.clone(), cache_v.clone()
layer = cpu.layer(0)
pool.set_kv_buffer(layer, cpu.ids(1), cache_k, cache_v, k_scale=2.0, v_scale=4.0)

changed = not (torch.equal(cache_k, k_before) and torch.equal(cache_v, v_before))
cpu.verdict(
    changed
    and (
        f"set_kv_buffer(..., k_scale=2.0, v_scale=4.0) changed the caller's cache_k from "
        f"{k_before.flatten().tolist()} to {cache_k.flatten().tolist()} and cache_v from "
        f"{v_before.flatten().tolist()} to {cache_v.flatten().tolist()}"
    ),
    "fixed: set_kv_buffer left the caller's K/V tensors unchanged",
)
