"""A1 (sglang 0.5.23): MHA get_kv_size_bytes and mem_usage leave out the fused K/V padding.

When K and V rows have one shape, ``MHATokenToKVPool._create_buffers_normal`` allocates a
layer's K and V as the two halves of one ``[2, padded, heads, head_dim]`` tensor, padded
to whole pages, and keeps views of ``size + page_size`` rows; ``get_kv_size_bytes`` (and
``mem_usage``, and the allocation log) add up the views. A pool of 3 tokens on pages of 2
is asked for its bytes and its storages are measured (sglang's default path runs here).
Exit 1 and "BUG PRESENT: ..." while fewer bytes are reported than allocated; 0 after.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

pool = MHATokenToKVPool(size=3, page_size=2, dtype=torch.bfloat16, head_dim=4, **cpu.MHA)
k_reported, v_reported = (int(n) for n in pool.get_kv_size_bytes())
allocated = cpu.storage_bytes([*pool.k_buffer, *pool.v_buffer])
reported = k_reported + v_reported
cpu.verdict(
    reported < allocated
    and (
        f"get_kv_size_bytes() reports K {k_reported} + V {v_reported} = {reported} bytes "
        f"(mem_usage {pool.mem_usage:.9f} GB), but the pool's K/V storage holds {allocated} "
        f"bytes: {allocated - reported} bytes of page padding are not counted"
    ),
    f"fixed: the pool reports {reported} bytes and holds {allocated}",
)
