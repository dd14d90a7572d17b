"""Q16 (sglang 0.5.23): a flat-scale MXFP8 move raises AttributeError after the payload moved.

Off 128-token pages MHATokenToKVPoolMXFP8.move_kv_cache calls MHATokenToKVPool.move_kv_cache,
whose _move_kv_cache_impl copies K and V, then calls _move_native_fp4_scales, which reads
self.native_k_scale_buffer; MXFP8's own _create_buffers never sets it: AttributeError with
the fp8 payload at tgt and its scales not (latent: flat pools cannot be written, Q14). Path:
sglang's default, the pool built with enable_kv_cache_copy=True (as with speculative
decoding), its Triton copy run by Triton's interpreter on CPU.
Exit 1 and "BUG PRESENT: ..." while the move raises it; 0 once the move completes.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: see the docstring
# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch

pool = cpu.mxfp8_pool(page_size=4, size=8, head_dim=32, enable_kv_cache_copy=True)
k = pool.k_buffer[0].view(torch.uint8)
k.zero_()[1] = 56  # token 1 alone: fp8 1.0
try:
    pool.move_kv_cache(cpu.ids(2), cpu.ids(1))
    error = None
except AttributeError as exc:
    error = exc
print(f"default move 1 -> 2: {error!r}; fp8 payload at slot 2: {k[2].equal(k[1])}")
bug = error and f"the move raised {error!r}, leaving slot 2 with the payload, not its scales"
cpu.verdict(bug, "fixed: the flat-scale MXFP8 move on the default path completes")
