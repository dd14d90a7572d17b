"""N4 (sglang 0.5.23): NoOpMHATokenToKVPool.get_contiguous_buf_infos raises AttributeError.

The no-op pool (``--prefill-only-disable-kv-cache``) inherits MHA's
``get_contiguous_buf_infos``, the transfer descriptors PD disaggregation and HiCache host
pools register at startup; it reads ``self._kv_buffer_descs``, which MHA's
``_create_buffers`` builds and the no-op pool's override does not. The MHA pool of the same
shape is asked too, as the control (sglang's default path runs here). Exit 1 and "BUG
PRESENT: ..." while the no-op pool raises AttributeError; 0 once it describes or refuses.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, NoOpMHATokenToKVPool

shape = dict(size=16, page_size=4, dtype=torch.bfloat16, head_dim=8, **cpu.MHA)
ptrs, lens, items = MHATokenToKVPool(**shape).get_contiguous_buf_infos()
bug, fixed = None, "fixed: the no-op pool describes its buffers"
try:
    NoOpMHATokenToKVPool(**shape).get_contiguous_buf_infos()
except AttributeError as error:
    bug = (
        f"NoOpMHATokenToKVPool.get_contiguous_buf_infos() raised AttributeError: {error} "
        f"(the MHA pool of the same shape describes {len(ptrs)} buffers of {lens[0]} bytes)"
    )
except Exception as error:  # a deliberate refusal is a fix too
    fixed = f"fixed: the no-op pool refuses with {type(error).__name__}: {error}"
cpu.verdict(bug, fixed)
