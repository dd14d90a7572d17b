"""L1 (sglang 0.5.23): a head-major (HND) MHA pool cannot be offloaded to the host.

With ``SGLANG_USE_HND_KVCACHE=1`` (a layout sglang offers) layers are ``[pages, heads,
page_size, dim]``; ``get_cpu_copy``/``load_cpu_copy`` index by slot and assert ``not
self.use_hnd`` (under ``python -O``: token 1 is not restored). Only PD decode retraction
offloads, and it stops at startup on HND. Token 1 is offloaded, cleared and reloaded in
child interpreters, with and without -O. Exit 1 and "BUG PRESENT: ..." while either run
fails to restore it; 0 and "fixed" once both do.
"""

import sys

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

if sys.argv[1:]:  # the child, with the variable set: token 1's K row after the round trip
    shape = dict(cpu.MHA, head_num=2, head_dim=2)
    pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, **shape)
    assert pool.use_hnd or not __debug__, "SGLANG_USE_HND_KVCACHE=1 did not select HND"
    row = torch.arange(1, 5, dtype=torch.bfloat16).view(1, 2, 2)
    pool.set_kv_buffer(cpu.layer(0), cpu.ids(1), row, row)
    copy = pool.get_cpu_copy(cpu.ids(1))
    torch._foreach_zero_([*pool.k_buffer, *pool.v_buffer])  # pages reused while it waits
    pool.load_cpu_copy(copy, cpu.ids(1))
    print(pool.k_buffer[0][0, :, 1, :].flatten().tolist())  # page 0, offset 1
    sys.exit(0)
runs = {
    label: cpu.child(__file__, "child", flags=flags, SGLANG_USE_HND_KVCACHE="1")
    for label, flags in (("python", ()), ("python -O", ("-O",)))
}
restored = "[1.0, 2.0, 3.0, 4.0]"
failed = {label: cpu.ended(run) for label, run in runs.items() if run.stdout.strip() != restored}
cpu.verdict(
    failed
    and f"an HND pool cannot offload token 1 ({restored}) and get it back: "
    + "; ".join(f"{label}: {how}" for label, how in failed.items()),
    "fixed: the HND pool's host copy restores token 1, with and without -O",
)
