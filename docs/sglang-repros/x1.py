"""X1 (sglang 0.5.21, 0.5.22): DSA move_kv_cache moves index-K page rows addressed by token ids.

``DSATokenToKVPool.move_kv_cache`` moves the latent rows, then ``IndexKeyCache.move`` the
index keys: one buffer row per 64-token page (64 fp8 keys, then their fp32 scales), but
``index_k[tgt_loc] = index_k[src_loc]`` copies the page rows numbered by the token ids, so
a token's key does not move, another page is overwritten and an id past the pages raises
``IndexError`` after the latent rows moved. sglang 0.5.23 moves each token's bytes. Token 1
(page 0) and 69 (page 1) get keys; token 1 moves to 2, then to 193 (default path here).
Exit 1 and "BUG PRESENT: ..." while a move misses or clobbers keys or raises; 0 after.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE, KEY = 64, 128  # 64-token pages (sglang asserts them), 128-byte index keys
with cpu.one_rank():
    pool = DSATokenToKVPool(size=4 * PAGE, page_size=PAGE, **cpu.DSA)
    buffer = pool.index_k_with_scale_buffer[0]  # [pages, 64 * (128 + 4)] bytes
    key = lambda t: buffer[t // PAGE, t % PAGE * KEY :][:KEY]  # noqa: E731 (its documented bytes)
    key(1).fill_(7), key(PAGE + 5).fill_(9)  # token 1 (page 0), token 69 (page 1)
    pool.move_kv_cache(cpu.ids(2), cpu.ids(1))
    problems = [] if (key(2) == 7).all() else ["move(tgt=[2], src=[1]) left token 2's key empty"]
    if (key(2 * PAGE + 5) == 9).all():
        problems.append("and overwrote page 2 with page 1's row (token 133 holds 69's key)")
    try:
        pool.move_kv_cache(cpu.ids(3 * PAGE + 1), cpu.ids(1))
    except IndexError as error:
        problems.append(f"move(tgt=[{3 * PAGE + 1}], src=[1]) raised IndexError: {error}")
cpu.verdict(
    "; ".join(problems),
    "fixed: move_kv_cache carries one token's index key and leaves other pages alone",
)
