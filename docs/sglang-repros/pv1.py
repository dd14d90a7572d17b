"""PV1 (sglang 0.5.21): off CUDA, set_kv_buffer_prefix_valid stores fp8 rows converted twice.

``MHATokenToKVPool.set_kv_buffer_prefix_valid`` casts the K/V rows to the pool's fp8 dtype
and views them as the uint8 store dtype; on a platform that is neither CUDA nor HIP it then
hands those uint8 rows to ``set_kv_buffer``, which converts them again, by value (the byte
0x30, e4m3 0.5, is stored as 48.0). sglang 0.5.22 converts after that branch. An e4m3 pool
gets the row [0.5, -2.0] at slot 1 through a prefix-valid write that commits it; sglang's
default path for a non-CUDA platform runs here. Exit 1 and "BUG PRESENT: ..." while the
slot holds anything else; 0 and "fixed" once it holds the row.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

pool = MHATokenToKVPool(size=4, page_size=1, dtype=torch.float8_e4m3fn, head_dim=2, **cpu.MHA)
row = torch.tensor([[[0.5, -2.0]]]).to(torch.float8_e4m3fn)
pool.set_kv_buffer_prefix_valid(cpu.layer(0), torch.tensor([[1]]), cpu.ids(1), row, row.clone())
stored = pool.get_key_buffer(0)[1].float().flatten().tolist()
cpu.verdict(
    stored != [0.5, -2.0]
    and (
        "set_kv_buffer_prefix_valid(loc=[[1]], commit_lens=[1]) of the fp8 row [0.5, -2.0] "
        f"stored {stored} at slot 1: its uint8 bytes were converted to fp8 again, by value"
    ),
    "fixed: the prefix-valid write stored the fp8 row as given",
)
