"""Q13 (sglang 0.5.23): MXFP8 moves and reloads into slot 0 carry the payload, not the scales.

On 128-token pages MHATokenToKVPoolMXFP8 keeps one UE8M0 scale byte per 32 values in FA4's
interleaved layout (token t of a page at [page, h, t % 32, t // 32]). Slot 0 is the
CUDA-graph padding sink that set_kv_buffer's kernels skip (latent: no request gets it);
move_kv_cache and load_cpu_copy copy the fp8 rows with torch indexing (slot 0 written) and
the scales with store_sf_interleaved (slot 0 skipped). Path: sglang's default, its Triton
kernel run by Triton's interpreter (TRITON_INTERPRET=1). A contract difference, not a
defect: exit 1 and "CONTRACT DIFFERENCE PRESENT: ..." while slot 0 gets one part only.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: see the docstring
# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch

pool = cpu.mxfp8_pool(page_size=128, size=128, head_dim=128)
k_sf = pool.k_scale_buffer[0].view(torch.uint8)  # [pages, 1, 32, 4, 4]
pool.k_buffer[0][1] = pool.v_buffer[0][1] = torch.ones(1, 128).to(torch.float8_e4m3fn)
k_sf[0, 0, 1, 0] = pool.v_scale_buffer[0].view(torch.uint8)[0, 0, 1, 0] = 130  # token 1, x8
k = pool.k_buffer[0]  # token(s): its K payload and K scale byte (slots < 32: page 0)
token = lambda s: (k[s].float().tolist(), k_sf[0, 0, s, 0].tolist())  # noqa: E731
pool.move_kv_cache(cpu.ids(2), cpu.ids(1))  # control: an ordinary slot
assert token(2) == token(1), f"control: the move 1 -> 2 did not carry token 1 ({token(2)[1]})"
pool.move_kv_cache(cpu.ids(0), cpu.ids(1))
moved = [token(0)[i] == token(1)[i] for i in (0, 1)]
k[0] = 0  # slot 0's payload back to zeros, then token 1 reloaded into it
pool.load_cpu_copy(pool.get_cpu_copy(cpu.ids(1)), cpu.ids(0))
reloaded = [token(0)[i] == token(1)[i] for i in (0, 1)]
cpu.differs(
    (moved[0] != moved[1] or reloaded[0] != reloaded[1])
    and f"MHATokenToKVPoolMXFP8 moved token 1 into slot 0 with its fp8 payload ({moved[0]}) but "
    f"not its scales ({moved[1]}); a reload the same (payload {reloaded[0]}, scales "
    f"{reloaded[1]}); the move 1 -> 2 carried both: store_sf_interleaved skips slot 0",
    "fixed: a move or reload into slot 0 carries the payload and its scales alike",
)
