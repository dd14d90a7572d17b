"""G2 (sglang 0.5.23): DSA host copies call torch.cuda.synchronize() whatever the device.

``DSATokenToKVPool.get_cpu_copy`` / ``load_cpu_copy`` (retraction's offload and reload)
copy the latent rows through ``MLATokenToKVPool``, which waits with
``current_platform.synchronize()``, then the index keys through ``IndexKeyCache``, which
calls ``torch.cuda.synchronize()`` unconditionally: on a torch without CUDA the offload of
a CPU DSA pool raises. sglang's default path runs here. Exit 1 and "BUG PRESENT: ..."
while it raises; 0 and "fixed" once it copies (on a CUDA torch there is nothing to show).
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

if torch.backends.cuda.is_built():
    cpu.verdict(None, "fixed: this torch has CUDA, so torch.cuda.synchronize() works")
PAGE = 64  # sglang asserts 64-token DSA pages
with cpu.one_rank():
    pool = DSATokenToKVPool(size=2 * PAGE, page_size=PAGE, **cpu.DSA)
    try:
        pool.get_cpu_copy(torch.arange(PAGE))
        bug = None
    except Exception as error:
        bug = (
            f"DSATokenToKVPool(device='cpu').get_cpu_copy(one page) raised "
            f"{type(error).__name__}: {error} (torch.cuda.synchronize() in the index-K copy)"
        )
cpu.verdict(bug, "fixed: the CPU DSA pool's host copy works on a torch without CUDA")
