"""M2 (sglang 0.5.23): a HybridReqToTokenPool.alloc refused for want of a mamba slot keeps the row.

``alloc`` takes the request rows first (``ReqToTokenPool.alloc``), then a mamba slot per
request that holds none, and refuses by ``assert mid is not None`` when the mamba allocator
is empty: the rows already taken (and the slots of earlier requests in the batch) stay
taken, bound to no request the caller keeps. A pool of 4 rows and 1 mamba slot admits one
request; the second is refused, and the free rows go 3 -> 2. (Under ``python -O`` the
assert is gone and ``mid[0]`` raises ``TypeError`` on ``None``, after the same row was
taken.) Exit 1 and "BUG PRESENT: ..." while the refusal changes the free rows; 0 once it
changes nothing.
"""

from types import SimpleNamespace

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

shape = Mamba2StateShape.create(
    tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=2, head_dim=2, state_size=3,
    conv_kernel=3,
)  # fmt: skip
params = Mamba2CacheParams(
    shape=shape, layers=[0], dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
)
pool = HybridReqToTokenPool(
    size=4, mamba_size=1, mamba_spec_state_size=1, max_context_len=8, device="cpu",
    enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0],
    enable_mamba_extra_buffer=False,
)  # fmt: skip


def request(rid):
    """The fields of sglang's ``Req`` the pool reads and sets: a new request holds nothing."""
    kv = SimpleNamespace(
        req_pool_idx=None, mamba_pool_idx=None, kv_allocated_len=0, holds_kv=False,
        holds_mamba=False, mamba_ping_pong_track_buffer=None,
    )  # fmt: skip
    return SimpleNamespace(rid=rid, kv=kv)


pool.alloc([request("first")])  # takes a row and the only mamba slot
rows_before = pool.available_size()
slots_before = pool.mamba_allocator.available_size()
second = request("second")
try:
    refusal = f"returned {pool.alloc([second])!r}"
except (AssertionError, TypeError) as error:  # TypeError: under python -O
    refusal = f"raised {type(error).__name__}"
rows_after = pool.available_size()
cpu.verdict(
    rows_after != rows_before
    and (
        f"alloc([second]) {refusal} ({slots_before} mamba slots free) but the free rows "
        f"went {rows_before} -> {rows_after}; the refused request's req_pool_idx is "
        f"{second.kv.req_pool_idx}: a row is taken and owned by nobody"
    ),
    "fixed: the refused alloc left the free rows as they were",
)
