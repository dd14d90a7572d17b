"""G1 (sglang 0.5.23): MLATokenToKVPool.get_mla_kv_buffer needs Triton; its write has a torch path.

sglang's platform layer states what a device can do (``supports_triton`` is False for
devices that cannot launch Triton, the CPU engine's ``CpuSRTPlatform`` among them) and
core "picks a code path the platform can serve". ``set_mla_kv_buffer`` falls back to
``set_mla_kv_buffer_naive`` (torch); ``get_mla_kv_buffer`` always calls the Triton gather.
Runs sglang's default path on the platform sglang picks on a plain CPU machine
(``supports_triton=False`` too). Exit 1 and "BUG PRESENT: ..." while the write succeeds
and the read of the same rows raises; 0 once it reads them (or where Triton launches, or
on 0.5.21, whose write has no torch path either: "not applicable").
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.kernels.ops.kvcache import mla_buffer
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.platforms import current_platform

if not hasattr(mla_buffer, "set_mla_kv_buffer_naive"):
    cpu.verdict(None, "not applicable: this sglang's set_mla_kv_buffer needs Triton too")
if current_platform.capabilities.supports_triton:
    cpu.verdict(None, "fixed: this platform launches Triton, so the read has its kernel")
with cpu.one_rank():
    pool = MLATokenToKVPool(size=8, page_size=1, kv_lora_rank=4, qk_rope_head_dim=2, **cpu.MLA)
    nope, rope = torch.full((2, 1, 4), 3.0).bfloat16(), torch.full((2, 1, 2), 5.0).bfloat16()
    pool.set_mla_kv_buffer(cpu.layer(0), cpu.ids(1, 2), nope, rope)  # sglang's torch path
    try:
        got, _ = pool.get_mla_kv_buffer(cpu.layer(0), cpu.ids(1, 2))
        bug = not torch.equal(got, nope) and f"the read returned other rows: {got.tolist()}"
    except Exception as error:
        bug = (
            f"on {type(current_platform).__name__} (supports_triton=False) set_mla_kv_buffer "
            "wrote slots [1, 2] through its torch path, and get_mla_kv_buffer of the same "
            f"slots raised {type(error).__name__}: {str(error)[:120]}"
        )
cpu.verdict(bug, "fixed: get_mla_kv_buffer read the rows back")
