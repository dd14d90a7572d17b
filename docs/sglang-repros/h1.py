"""H1 (sglang 0.5.23): DSA host copies lose index keys unless indices are one page-aligned run.

``DSATokenToKVPool.get_cpu_copy`` copies latent KV token by token but index keys by whole
pages, chosen as ``indices[::page_size] // page_size``: every touched page only for one run
starting on a page boundary, else ``load_cpu_copy`` skips pages. Sets A (64..133, 192..201)
and B (120..200) are copied, cleared, reloaded (sglang's default path; G2's sync a no-op).
Exit 1 and "BUG PRESENT: ..." while a listed token's key is lost; 0 once all round-trip.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE, KEY = 64, 128  # sglang asserts 64-token DSA pages and 128-byte index keys


def key_of(buf, t):
    """Token t's key and scale bytes: page row = 64 keys of 128 bytes, then 64 fp32 scales."""
    page, at = divmod(t, PAGE)
    return torch.cat([buf[page, at * KEY :][:KEY], buf[page, PAGE * KEY + 4 * at :][:4]])


cpu.no_cuda_synchronize()
problems = []
with cpu.one_rank():
    pool = DSATokenToKVPool(size=5 * PAGE, page_size=PAGE, **cpu.DSA)
    buffer = pool.index_k_with_scale_buffer[0]
    for name, tokens in (("A", [*range(64, 134), *range(192, 202)]), ("B", [*range(120, 201)])):
        buffer.copy_(torch.randint(1, 256, buffer.shape, dtype=torch.uint8))
        original, copy = buffer.clone(), pool.get_cpu_copy(cpu.ids(*tokens))
        buffer.zero_()  # the pages are reused by other requests while this one is offloaded
        pool.load_cpu_copy(copy, cpu.ids(*tokens))
        lost = [t for t in tokens if not torch.equal(key_of(buffer, t), key_of(original, t))]
        if lost:
            problems.append(f"{name}: tokens {lost[0]}..{lost[-1]} lost their index keys")
cpu.verdict(
    problems and "DSA get_cpu_copy then load_cpu_copy: " + "; ".join(problems),
    "fixed: every listed token's index key round-trips through the host copy",
)
