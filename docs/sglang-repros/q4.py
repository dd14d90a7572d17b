"""Q4 (sglang 0.5.23): FP4 pools describe only their payload to KV transfer, not their scales.

PD disaggregation registers and ships a pool's get_contiguous_buf_infos(). For an MHA pool
with an FP4 quant method (fp4_mx_block16, nvfp4) they cover k_buffer/v_buffer only, for
MLATokenToKVPoolFP4 kv_buffer only: the decode side dequantizes with zero scales
(MHATokenToKVPoolMXFP8 ships its scales through get_kv_scale_buf_infos). sglang's default
path runs here (pools are only built). Exit 1 and "BUG PRESENT: ..." while a scale buffer
lies outside every descriptor; 0 and "fixed" once each is described.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.layers.quantization import fp4_kv_cache_quant_method as fp4
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPoolFP4

FP4 = dict(cpu.MLA, size=16, page_size=4, dtype=torch.float4_e2m1fn_x2, layer_num=2)
nvfp4 = fp4.NVFP4KVCacheMethod(num_layers=2, device="cpu", page_size=4, native_scale_layout=False)
nvfp4.configure_attention_backends("flashinfer", "trtllm_mha")  # the default NVFP4 pair
mx = fp4.get_kv_cache_quant_method("fp4_mx_block16")
pools = {
    "MHA fp4_mx_block16": MHATokenToKVPool(**FP4, head_num=2, head_dim=64, quant_method=mx),
    "MHA nvfp4": MHATokenToKVPool(**FP4, head_num=2, head_dim=64, quant_method=nvfp4),
    "MLA FP4": MLATokenToKVPoolFP4(**FP4, kv_lora_rank=512, qk_rope_head_dim=64),
}
missing = []
for name, pool in pools.items():
    spans = list(zip(*pool.get_contiguous_buf_infos()[:2], strict=True))
    scales = [t for a in ("k", "v", "kv") for t in getattr(pool, f"{a}_scale_buffer", None) or ()]
    out = [t for t in scales if not any(p <= t.data_ptr() <= p + n - t.nbytes for p, n in spans)]
    if out:
        nbytes = sum(t.nbytes for t in out)
        missing.append(f"{name}: {len(out)} of {len(scales)} scale buffers ({nbytes} bytes)")
cpu.verdict(
    missing and "FP4 scale buffers lie outside every transfer descriptor: " + "; ".join(missing),
    "fixed: every FP4 scale buffer is described for KV transfer",
)
