"""T1 (sglang 0.5.23): a DSA move with index_kpool > 1 moves the latent rows, then fails.

``DSATokenToKVPool.move_kv_cache`` moves the latent rows (``MLATokenToKVPool``), then asks
the index-K cache to move the keys; with ``index_kpool > 1`` 0.5.23's ``IndexKeyCache.move``
asserts ``index_kpool == 1`` and 0.5.21/0.5.22 raise X1's ``IndexError``: half a move done.
An ``index_kpool=2`` pool (128-token pages; 64 on 0.5.21) writes a latent row at token 130
and moves it to 140; sglang's default path runs, torch.cuda.synchronize() a no-op on a CPU
torch (G2). Exit 1 and "BUG PRESENT: ..." while the refused move has changed the pool; 0
and "fixed" once it succeeds whole or changes nothing.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE = cpu.kpool_page()
cpu.no_cuda_synchronize()
with cpu.one_rank():
    pool = DSATokenToKVPool(size=2 * PAGE, page_size=PAGE, index_kpool=2, **cpu.DSA)
    pool.kv_buffer[0][130] = 1.0
    before = pool.kv_buffer[0].clone()
    try:
        pool.move_kv_cache(cpu.ids(140), cpu.ids(130))
        outcome = "accepted"
    except Exception as exc:  # the refusal is fine; what it left behind is the question
        outcome = f"{type(exc).__name__}: {exc}"
    changed = not torch.equal(pool.kv_buffer[0], before)
cpu.verdict(
    outcome != "accepted"
    and changed
    and (
        f"move_kv_cache on an index_kpool=2 DSA pool raised ({outcome}) after moving the "
        "latent row of token 130 to token 140"
    ),
    f"fixed: the move was {'accepted' if outcome == 'accepted' else 'refused whole'}",
)
