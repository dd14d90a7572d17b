"""M1 (sglang 0.5.23): MLATokenToKVPool.set_mla_kv_buffer drops every write to slot 0.

``set_kv_buffer`` (whole rows) writes slot 0 like any other; ``set_mla_kv_buffer`` (nope
and rope parts, what MLA attention backends call) skips every location equal to
``reserved_skip_index`` (0, kept for CUDA-graph padding) on every path: its Triton kernels
and ``set_mla_kv_buffer_naive``, the torch body sglang itself takes on platforms without
Triton (this one). Row A goes to slot 0 through set_kv_buffer, row B to slots 0 and 1
through set_mla_kv_buffer. A contract difference (slot 0 is padding), not a defect: exit 1
and "CONTRACT DIFFERENCE PRESENT: ..." while slot 0 still holds row A; 0 once it holds B;
3 on 0.5.21, whose set_mla_kv_buffer is Triton only (run it on a GPU).
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.kernels.ops.kvcache import mla_buffer
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

if not hasattr(mla_buffer, "set_mla_kv_buffer_naive"):  # its torch path came with 0.5.22
    cpu.cannot_check("this sglang's set_mla_kv_buffer has no torch path; run it on a GPU")
with cpu.one_rank():
    pool = MLATokenToKVPool(size=8, page_size=1, kv_lora_rank=4, qk_rope_head_dim=2, **cpu.MLA)
    pool.set_kv_buffer(cpu.layer(0), cpu.ids(0), torch.full((1, 1, 6), 7.0), None)  # row A
    nope, rope = torch.full((2, 1, 4), 3.0), torch.full((2, 1, 2), 5.0)  # row B
    pool.set_mla_kv_buffer(cpu.layer(0), cpu.ids(0, 1), nope.bfloat16(), rope.bfloat16())
    slot0, slot1 = (pool.get_key_buffer(0)[slot].flatten().tolist() for slot in (0, 1))
cpu.differs(
    slot0 != [3.0] * 4 + [5.0] * 2
    and (
        f"set_mla_kv_buffer(loc=[0, 1]) wrote slot 1 ({slot1}) but not slot 0: get_key_buffer"
        f"(0)[0] returns {slot0}, the row set_kv_buffer wrote there before"
    ),
    "fixed: set_mla_kv_buffer wrote slot 0 like every other slot",
)
