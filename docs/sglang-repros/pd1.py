"""PD1 (sglang 0.5.23): PD registers no index keys for a DSA model's sliding-window pool.

A DSA model with window layers (Dots3) gets a SWAKVPool (DSA full side, MLA window side).
PD registers get_kv_transfer_buf_infos (the full side's latent rows) and setup_state_kv_args
(the window side only): the index keys, registered for the DSA pool alone, are not. sglang's
default path runs. Exit 1 and "BUG PRESENT: ..." while so; 0 and "fixed" once registered.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.disaggregation.base.conn import KVArgs
from sglang.srt.disaggregation.utils import get_kv_transfer_buf_infos, setup_state_kv_args
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool


def index_keys_registered(pool, dsa_pool):
    spans = list(zip(*get_kv_transfer_buf_infos(pool)[:2], strict=True))
    setup_state_kv_args(args := KVArgs(), pool)
    for ptrs, lens in zip(args.state_data_ptrs, args.state_data_lens, strict=True):
        spans += zip(ptrs, lens, strict=True)
    keys = dsa_pool.get_index_k_with_scale_buffer(0)
    return any(p <= keys.data_ptr() <= p + n - keys.nbytes for p, n in spans)


PAGE = 64  # the DSA pool's 64-token index pages
hybrid = cpu.dsa_swa_hybrid(PAGE)  # DSA full side, MLA window side, as the configurator builds
with cpu.one_rank():
    alone = DSATokenToKVPool(size=2 * PAGE, page_size=PAGE, **cpu.DSA)
    sent = index_keys_registered(hybrid, hybrid.full_kv_pool), index_keys_registered(alone, alone)
alone = "registered" if sent[1] else "unregistered"
cpu.verdict(
    not sent[0] and f"the hybrid's DSA index keys are in no span PD registers (alone: {alone})",
    "fixed: PD registers the DSA full side's index keys of a sliding-window hybrid",
)
