"""D21 (sglang 0.5.21): under DCP, the default DSA index-K buffer holds a key per physical token.

Under ``--dcp-size N`` callers name tokens by widened id (``(size + page_size) * N``) and
the DSA indexer writes index keys (not split by rank) at those ids; without an explicit
``index_buf_size`` the index-K buffer holds ``size`` tokens, and the Triton kernel has no
bounds check. sglang 0.5.22 sizes it ``(size + page_size) * dcp_size - page_size``. Rank 0
of ``--dcp-size 2`` with one 64-token page writes the key of widened id 254. Path: sglang's
default up to the launch, the kernel's body replaced by a recorder (nothing is written).
Exit 1 and "BUG PRESENT: ..." while it addresses a page past the buffer; 0 once it fits.
"""

from collections import defaultdict

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache import index_key_cache
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE, NAME = 64, "_set_k_and_s_triton_kernel"
kernels = next(m for m in vars(index_key_cache).values() if hasattr(m, NAME))  # per release
launches = []  # kernel[grid](buf_fp8, buf_fp32, loc, ..., PAGE_SIZE=...) records its launch
record = lambda buf, _, loc, *args, **meta: launches.append((buf, loc, meta))  # noqa: E731
setattr(kernels, NAME, defaultdict(lambda: record))
with cpu.one_rank(dcp_size=2, rank=0):
    pool = DSATokenToKVPool(size=PAGE, page_size=PAGE, **cpu.DSA)
    key = torch.ones((1, 128)).to(torch.float8_e4m3fn)
    pool.set_index_k_scale_buffer(0, cpu.ids(254), key, torch.ones((1, 1)))  # ids 0..255
buffer, loc, meta = launches[0]
token, pages = int(loc[0]), buffer.shape[0]
page = token // meta["PAGE_SIZE"]
cpu.verdict(
    page >= pages
    and (
        f"rank 0 of --dcp-size 2 (widened ids 0..255) launched the index-K write of id {token}"
        f" at page {page}, but the default buffer holds {pages} pages: it writes past its end"
    ),
    f"fixed: widened id {token} lands in page {page} of the {pages} the buffer holds",
)
