"""Q5 (sglang 0.5.23): MHA pools with a KV-cache quant method shape V by head_dim.

The pool shapes V by v_head_dim without a quant method (sglang serves K 192 / V 128
models, MiMoV2). With one (cpu_fp8_e4m3, fp4_mx_block16), _create_quantized_buffers hands
the method head_dim only: V is head_dim wide and a write of v_head_dim-wide V rows raises.
sglang's default path runs here (the fp4 quantizer is torch.compile'd, ~30 s). Exit 1 and
"BUG PRESENT: ..." while a quantized pool's V is not v_head_dim wide; 0 after.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import get_kv_cache_quant_method
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

H, K_DIM, V_DIM = 2, 32, 16  # K rows wider than V rows, as in MiMoV2
SHAPE = dict(size=8, page_size=4, head_dim=K_DIM, v_head_dim=V_DIM, **dict(cpu.MHA, head_num=H))
assert MHATokenToKVPool(dtype=torch.bfloat16, **SHAPE).v_buffer[0].shape[-1] == V_DIM  # control
broken, fp4_args = [], dict(num_layers=1, device="cpu", page_size=4)
for name, dtype, per_byte, args in [
    ("cpu_fp8_e4m3", torch.float8_e4m3fn, 1, {}),
    ("fp4_mx_block16", torch.float4_e2m1fn_x2, 2, fp4_args),
]:
    method = get_kv_cache_quant_method(name, **args)
    pool = MHATokenToKVPool(dtype=dtype, quant_method=method, **SHAPE)
    v_bytes = pool.v_buffer[0][0].numel() * pool.v_buffer[0].element_size()
    k, v = (torch.ones(1, H, dim, dtype=torch.bfloat16) for dim in (K_DIM, V_DIM))
    try:
        pool.set_kv_buffer(cpu.layer(0), cpu.ids(5), k, v)
        write = "stored"
    except Exception as error:  # the V rows do not fit the buffer built for head_dim
        write = f"raises {type(error).__name__}: {str(error).splitlines()[0]}"
    if v_bytes != H * V_DIM // per_byte or write != "stored":
        shape = tuple(pool.v_buffer[0].shape[1:])
        broken.append(f"{name}: V rows {shape} ({v_bytes} B), {V_DIM}-wide V rows {write}")
cpu.verdict(
    broken and f"quantized MHA pools ignore v_head_dim={V_DIM}: " + "; ".join(broken),
    "fixed: quantized MHA pools keep V rows of v_head_dim values",
)
