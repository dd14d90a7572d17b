"""Q3 (sglang 0.5.23): MLATokenToKVPoolFP4.get_kv_size_bytes (and mem_usage) omit its scales.

The MLA FP4 pool allocates per layer kv_buffer [rows, 1, (R+P)/2] and kv_scale_buffer
[rows, (R+P)/16] uint8, and inherits MLATokenToKVPool.get_kv_size_bytes, which sums
kv_buffer only: the reported size is short by 1/9 of the pool, while sglang's configurator
counts the scales in the cell size (DefaultPoolConfigurator._compute_cell_size) and the
quantized MHA pools count theirs. sglang's default path runs here (pools are only built).
Exit 1 and "BUG PRESENT: ..." while the report leaves the scales out; 0 once it counts them.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPoolFP4

FP4 = dict(cpu.MLA, dtype=torch.float4_e2m1fn_x2, layer_num=2)
pool = MLATokenToKVPoolFP4(size=64, page_size=16, kv_lora_rank=512, qk_rope_head_dim=64, **FP4)
payload = sum(t.nbytes for t in pool.kv_buffer)
scales = sum(t.nbytes for t in pool.kv_scale_buffer)
reported = int(pool.get_kv_size_bytes())
cpu.verdict(
    reported != payload + scales
    and (
        f"get_kv_size_bytes() = {reported} (mem_usage {round(pool.mem_usage * (1 << 30))} "
        f"bytes) for an MLA FP4 pool holding {payload} payload + {scales} scale bytes = "
        f"{payload + scales}; the configurator's cell size counts the scales"
    ),
    "fixed: get_kv_size_bytes counts the FP4 scale buffers",
)
