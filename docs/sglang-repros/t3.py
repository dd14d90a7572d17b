"""T3 (sglang 0.5.23): on a CPU pool, a reload restores another request's compress tails.

Retraction offloads with ``DSATokenToKVPool.get_cpu_copy(indices, req_pool_index=r)``: the
latent and index-K parts are gathered (real copies), but the compress tails are saved as
``tail_k[r].to("cpu", non_blocking=True)``, which on a CPU pool returns the pool's own row
``r``; the slot is reused while the request waits, and ``load_cpu_copy`` restores the new
request's tails. Slot 1 gets tails 1.0, is copied, gets 2.0 (reused), then is reloaded;
sglang's default path runs, torch.cuda.synchronize() a no-op on a CPU torch (G2). Exit 1
and "BUG PRESENT: ..." while the reloaded tails are 2.0; 0 and "fixed" once they are 1.0.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE, KPOOL, REQUEST = cpu.kpool_page(), 2, 1
cpu.no_cuda_synchronize()
with cpu.one_rank():
    args = dict(cpu.DSA, index_kpool=KPOOL, index_kpool_compress=True, max_running_requests=3)
    pool = DSATokenToKVPool(size=2 * PAGE, page_size=PAGE, **args)
    tails = lambda v: [torch.full((KPOOL, 128), v, dtype=torch.bfloat16)] * 2  # noqa: E731
    pool.set_compress_tail_for_request(0, torch.tensor(REQUEST), *tails(1.0), KPOOL, 0)
    indices = torch.arange(PAGE, PAGE + 3)  # request A's tokens
    copy = pool.get_cpu_copy(indices, req_pool_index=REQUEST)
    pool.set_compress_tail_for_request(0, torch.tensor(REQUEST), *tails(2.0), KPOOL, 0)
    pool.load_cpu_copy(copy, indices, req_pool_index=REQUEST)
    tail_k = pool.get_compress_tail_buffers(0)[0][REQUEST]
    restored = sorted(set(tail_k.float().flatten().tolist()))
cpu.verdict(
    restored != [1.0]
    and (
        "request slot 1's compress tails were copied to the host as 1.0, the slot was reused "
        f"and written with 2.0, and load_cpu_copy restored {restored}: the host copy held a "
        "view of the pool, so the retracted request got the new request's tails"
    ),
    "fixed: load_cpu_copy restored the tails that were copied",
)
