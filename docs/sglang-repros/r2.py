"""R2 (sglang 0.5.23): under decode context parallel, move_kv_cache treats widened ids as rows.

With ``--dcp-size D`` callers name tokens by widened id and a rank keeps id ``w`` at row
``w // D`` when ``w % D`` is its rank: ``set_mla_kv_buffer`` applies that owner rule and the
host copies collapse ids with ``maybe_dcp_kernel_indices``; ``move_kv_cache`` moves row
``tgt`` from row ``src``. Its speculative callers pass the widened ids the write was given.
Rank 1 of ``--dcp-size 2`` (4 tokens, pages of 2: rows 0..5) writes widened id 3 (row 1),
then moves it to widened id 5 (row 2). sglang's default path runs here (0.5.21, whose write
is Triton only: the row is placed where its kernel puts it). Exit 1 and "BUG PRESENT: ..."
while row 2 does not hold the row afterwards; 0 and "fixed" once it does.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.kernels.ops.kvcache import mla_buffer
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

with cpu.one_rank(dcp_size=2, rank=1):
    pool = MLATokenToKVPool(size=4, page_size=2, kv_lora_rank=2, qk_rope_head_dim=1, **cpu.MLA)
    nope, rope = torch.tensor([[[1.0, 2.0]]]).bfloat16(), torch.tensor([[[3.0]]]).bfloat16()
    if hasattr(mla_buffer, "set_mla_kv_buffer_naive"):  # a torch path (sglang 0.5.22 on)
        pool.set_mla_kv_buffer(cpu.layer(0), cpu.ids(3), nope, rope)  # widened id 3: row 1
    else:  # 0.5.21 launches Triton here: the row where its kernel's owner rule puts it
        pool.kv_buffer[0][1] = torch.cat([nope, rope], dim=-1).view(1, 3)
    written = pool.kv_buffer[0][1].clone()
    try:
        pool.move_kv_cache(cpu.ids(5), cpu.ids(3))  # widened 3 -> widened 5
        outcome = "accepted"
    except Exception as exc:  # an id past the rows raises on some paths
        outcome = f"{type(exc).__name__}: {exc}"
cpu.verdict(
    not torch.equal(pool.kv_buffer[0][2], written)
    and (
        f"after set_mla_kv_buffer at widened id 3 (rank 1's row 1), move_kv_cache(tgt=[5], "
        f"src=[3]) was {outcome} and row 2 (widened id 5) does not hold the row"
    ),
    "fixed: the move carried widened id 3 to widened id 5",
)
