"""Q14 (sglang 0.5.23): an MXFP8 pool off 128-token pages (flat scales) cannot be written.

Off 128-token pages the pool keeps "flat per slot" scales ([rows, H, D/32]), which its
_write_scales, moves, host copies and get_kv_scale_buf_infos serve, but set_kv_buffer
refuses: with scales it asserts the page_size=128 interleaved layout, without (fused) it
raises ValueError; nothing refuses the page size before. Path: sglang's GPU path, its CUDA
guard (_is_cuda, can_use_store_cache) answered True and store_cache's body a row copy.
Exit 1 and "BUG PRESENT: ..." while a flat pool refuses every write; 0 once it stores one.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache import memory_pool

pool = cpu.mxfp8_pool(page_size=4, size=8, head_dim=32)
memory_pool._is_cuda = True  # set_kv_buffer's first assert: CUDA and store_cache rows
memory_pool.can_use_store_cache = lambda *sizes: True
# the CUDA row store: rows i of k and v to rows loc[i]
memory_pool.store_cache = lambda k, v, kc, vc, loc, **_: (
    kc.__setitem__(loc, k),
    vc.__setitem__(loc, v),
)
rows = torch.ones(1, 1, 32).to(torch.float8_e4m3fn)
scales = torch.full((1, 1, 1), 8.0).to(torch.float8_e8m0fnu)
refusals = []
for label, args in (
    ("with scales", (rows, rows, scales, scales)),
    ("fused, without", (rows.float(), rows.float())),
):
    try:
        pool.set_kv_buffer(cpu.layer(0), cpu.ids(5), *args)
    except (AssertionError, ValueError) as error:
        refusals.append(f"{label}: {type(error).__name__}: {error}")
cpu.verdict(
    len(refusals) == 2
    and f"MXFP8 pool at page_size=4 (CUDA guard passed as on a GPU) built flat scales "
    f"{tuple(pool.k_scale_buffer[0].shape)}, then refused every write: {'; '.join(refusals)}",
    f"fixed: a flat-scale MXFP8 pool stores a write (refused only: {refusals})",
)
