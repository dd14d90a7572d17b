"""B4 (sglang 0.5.21): DSAIndexerPoolHost keeps and transfers skip-topk layers' index keys.

A layer that reuses the previous layer's top-k gets a zero-row index-K buffer, but the host
pool takes ``layer_num`` host layers, counts them in ``get_size_per_token()`` and hands
every device buffer to the transfer kernels (``index_k_device_ptrs``; per layer
``index_k_with_scale_buffer[layer_id]``): a backup reads, and a load writes, a page row of a
buffer that has none. 0.5.22 gives such layers no host layer (``owned_device_layers``). A
2-layer DSA pool whose layer 1 skips top-k, one 64-token page, ``layer_first``; sglang's
constructors run (path: the default; the kernels are GPU-only, so what they are handed is
read). Exit 1 and "BUG PRESENT: ..." while a skip layer has a host layer; 0 once not.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.mem_cache.pool_host import dsa as host_dsa
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

PAGE, args = 64, dict(cpu.DSA, layer_num=2)
with cpu.one_rank():
    pool = DSATokenToKVPool(size=PAGE, page_size=PAGE, skip_topk_layers=[False, True], **args)
    if hasattr(host_dsa, "make_dsa_indexer_pool_decl"):  # 0.5.22 on: the host tier's decl
        owned = host_dsa.make_dsa_indexer_pool_decl(pool).owned_device_layers
        cpu.verdict(
            owned != (0,) and f"the index-K host tier owns device layers {owned}",
            f"fixed: the index-K host tier owns device layer(s) {owned} only",
        )
    anchor = MLATokenToKVPoolHost(pool, 1.0, 0, PAGE, "layer_first", pin_memory=False)
    host = host_dsa.DSAIndexerPoolHost(pool, anchor, "layer_first", pin_memory=False)
rows = [buf.shape[0] for buf in pool.index_k_with_scale_buffer]  # index-K rows per layer
cpu.verdict(
    host.layer_num > sum(r > 0 for r in rows)
    and (
        f"device index-K rows per layer {rows}, yet the host keeps {host.layer_num} layers "
        f"({host.get_size_per_token()} bytes per token, not {host.indexer_size_per_token}"
        f") and hands the kernels {host.index_k_device_ptrs.numel()} device buffers, layer 1's "
        "empty one included"
    ),
    f"fixed: the host keeps {host.layer_num} layer(s), those with index keys",
)
