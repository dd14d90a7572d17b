"""Q6 (sglang 0.5.23): MHA fp4_mx_block16 host copies carry the FP4 payload without its scales.

An MHA pool with the fp4_mx_block16 quant method keeps one exponent byte per 16 values in
k_scale_buffer/v_scale_buffer. move_kv_cache moves them with the payload (the control);
get_cpu_copy/load_cpu_copy (PD decode retraction) copy k_buffer and v_buffer only. Path:
sglang's default, the pool built as for speculative decoding (enable_kv_cache_copy=True),
its Triton move kernel run by Triton's interpreter (TRITON_INTERPRET=1); the quantizer is
torch.compile'd (~30 s). Exit 1 and "BUG PRESENT: ..." while a reloaded token's scales stay
behind; 0 and "fixed" once it reads back equal.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: see the docstring
# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import get_kv_cache_quant_method
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

method = get_kv_cache_quant_method("fp4_mx_block16", num_layers=1, device="cpu", page_size=4)
args = dict(cpu.MHA, head_dim=32, quant_method=method, enable_kv_cache_copy=True)
pool = MHATokenToKVPool(size=16, page_size=4, dtype=torch.float4_e2m1fn_x2, **args)
row = torch.cat([torch.linspace(-24, 24, 16), torch.linspace(-6, 6, 16)]).to(torch.bfloat16)
pool.set_kv_buffer(cpu.layer(0), cpu.ids(5), row.view(1, 1, 32), row.view(1, 1, 32))
pool.move_kv_cache(cpu.ids(9), cpu.ids(5))  # control: the move carries the scales
pool.load_cpu_copy(pool.get_cpu_copy(cpu.ids(5)), cpu.ids(13))  # a retracted request resumed
k_sf, v_sf = pool.k_scale_buffer[0], pool.v_scale_buffer[0]
scales = {s: (k_sf[s].tolist(), v_sf[s].tolist()) for s in (5, 9, 13)}
reads = {slot: pool.get_key_buffer(0)[slot].float().flatten()[:3].tolist() for slot in scales}
assert scales[9] == scales[5] and reads[9] == reads[5], f"control: the move 5 -> 9 {scales}"
cpu.verdict(
    (scales[13] != scales[5] or reads[13] != reads[5])
    and f"the host copy of slot 5 reloaded to 13 left its K/V scales behind: {scales}, "
    f"get_key_buffer reads {reads} (the move 5 -> 9, by sglang's Triton kernel, carried them)",
    "fixed: reloaded FP4 K/V rows carry their scales",
)
