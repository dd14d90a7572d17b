"""I10 (sglang 0.5.23): an index-K write to a DSA skip layer writes through a 0-byte buffer.

Layers in ``skip_topk_layers`` get 0-page index-K buffers; ``set_index_k_scale_buffer``
launches its kernel anyway, which (no bounds check) stores at offsets from the buffer's null
data pointer (a GPU faults). sglang's own kernel runs under Triton's interpreter
(TRITON_INTERPRET=1; sglang has no torch body), in child interpreters: a write to layer 1
(control: bytes where the page layout says), then to skip layer 0. A caller error sglang does
not refuse: exit 1, "CONTRACT DIFFERENCE PRESENT", while it reaches the kernel; 0 once refused.
"""

import sys

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

if sys.argv[1:]:  # the child: token 1's index key (fp8 1.0) and scale (1.0) to one layer
    layer, args = int(sys.argv[1]), dict(cpu.DSA, layer_num=2, skip_topk_layers=[True, False])
    with cpu.one_rank():
        pool = DSATokenToKVPool(size=128, page_size=64, **args)
        key = torch.ones((1, 128)).to(torch.float8_e4m3fn)
        pool.set_index_k_scale_buffer(layer, cpu.ids(1), key, torch.ones((1, 1)))
    row = pool.index_k_with_scale_buffer[layer][0]  # token 1: bytes 128..255, scale at 8196
    print(sorted(set(row[128:256].tolist())), row[8196:8200].view(torch.float32).tolist())
    sys.exit(0)
control = cpu.child(__file__, 1, TRITON_INTERPRET="1")
if control.stdout.strip() != "[56] [1.0]":  # 56 = 0x38, fp8 e4m3 1.0
    print(f"cannot show it here: the control write did not run as expected: {cpu.ended(control)}")
    sys.exit(2)
skipped = cpu.child(__file__, 0, TRITON_INTERPRET="1")
refused = skipped.returncode > 0 and "/triton/" not in skipped.stderr
cpu.differs(
    not refused
    and (
        "set_index_k_scale_buffer(layer_id=0, loc=[1]) on the 0-page skip layer launched "
        f"sglang's index-K kernel (run by Triton's interpreter), and {cpu.ended(skipped)}"
    ),
    f"fixed: the skip-layer write is refused before the kernel: {cpu.ended(skipped)}",
)
