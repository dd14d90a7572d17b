"""Q15 (sglang 0.5.23): flat-scale MXFP8 moves and reloads need index_put on float8_e8m0fnu.

Off 128-token pages MHATokenToKVPoolMXFP8 keeps flat float8_e8m0fnu scales; load_cpu_copy
and move_kv_cache store them by index assignment, an index_put CPU torch (2.13) lacks:
NotImplementedError after the fp8 payload moved (latent: MXFP8 needs a Blackwell GPU). Paths:
the reload has one; the move runs on sglang's torch move (SGLANG_NATIVE_MOVE_KV_CACHE=1),
because on the default path (its Triton copy) the move raises AttributeError first: Q16.
Exit 1 and "BUG PRESENT: ..." while the reload or torch move raises it; 0 once they carry.
"""

import os

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch

os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"  # read by the constructor: the torch move
native = cpu.mxfp8_pool(page_size=4, size=8, head_dim=32)
move = lambda pool: pool.move_kv_cache(cpu.ids(2), cpu.ids(1))  # noqa: E731
reload = lambda pool: pool.load_cpu_copy(pool.get_cpu_copy(cpu.ids(1)), cpu.ids(2))  # noqa: E731
bugs = []
for path, pool, call in [
    ("torch move", native, move),
    ("reload", native, reload),
]:
    k, sf = pool.k_buffer[0].view(torch.uint8), pool.k_scale_buffer[0].view(torch.uint8)
    k.zero_()[1], sf.zero_()[1] = 56, 130  # token 1 alone: fp8 1.0 with scale x8
    try:
        error = call(pool)
    except Exception as exc:
        error = exc
    line = f"{path} 1 -> 2: {error!r}: payload {k[2].equal(k[1])}, scales {sf[2].equal(sf[1])}"
    print(line)
    bugs += [line] if isinstance(error, NotImplementedError) else []
cpu.verdict("; ".join(bugs), "fixed: flat-scale MXFP8 moves and reloads carry their scales")
