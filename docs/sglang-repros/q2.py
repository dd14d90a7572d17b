"""Q2 (sglang 0.5.23): MLATokenToKVPoolFP4 moves and host-copies FP4 payload without scales.

MLATokenToKVPoolFP4 keeps per layer packed FP4 latent rows kv_buffer [rows, 1, (R+P)/2]
and one scale byte per 16 values in kv_scale_buffer [rows, (R+P)/16]; it inherits
move_kv_cache, get_cpu_copy and load_cpu_copy from MLATokenToKVPool, which touch kv_buffer
only, so a moved (speculative accept) or reloaded (PD retraction) token dequantizes to
other values. sglang's default path runs here (its quantizer is torch code under
torch.compile, ~30 s). Exit 1 and "BUG PRESENT: ..." while scales stay behind; 0 after.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPoolFP4

with cpu.one_rank():
    FP4 = dict(cpu.MLA, dtype=torch.float4_e2m1fn_x2)
    pool = MLATokenToKVPoolFP4(size=16, page_size=4, kv_lora_rank=32, qk_rope_head_dim=16, **FP4)
    # One latent row (nope 32 + rope 16); block maxima 24, 12, 6 -> scales 129, 128, 127.
    row = torch.cat([torch.linspace(-m, m, 16) for m in (24, 12, 6)]).to(torch.bfloat16)
    pool.set_kv_buffer(cpu.layer(0), cpu.ids(5), row.view(1, 1, 48), None)
    pool.move_kv_cache(cpu.ids(9), cpu.ids(5))  # e.g. an accepted draft token
    pool.load_cpu_copy(pool.get_cpu_copy(cpu.ids(5)), cpu.ids(13))  # a retracted request
    scales = {slot: pool.kv_scale_buffer[0][slot].tolist() for slot in (5, 9, 13)}
    reads = {slot: pool.get_key_buffer(0)[slot].float().flatten()[:3].tolist() for slot in scales}
cpu.verdict(
    any(scales[s] != scales[5] or reads[s] != reads[5] for s in (9, 13))
    and (
        "MLATokenToKVPoolFP4 moved (5 -> 9) and host-copied (5 -> 13) the packed payload but "
        f"not kv_scale_buffer: scales {scales}; get_key_buffer reads {reads}"
    ),
    "fixed: moved and reloaded FP4 latent rows carry their scales",
)
