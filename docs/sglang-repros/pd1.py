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
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool


def index_keys_registered(pool, dsa_pool):
    spans = list(zip(*get_kv_transfer_buf_infos(pool)[:2], strict=True))
    setup_state_kv_args(args := KVArgs(), pool)
    for ptrs, lens in zip(args.state_data_ptrs, args.state_data_lens, strict=True):
        spans += zip(ptrs, lens, strict=True)
    keys = dsa_pool.get_index_k_with_scale_buffer(0)
    return any(p <= keys.data_ptr() <= p + n - keys.nbytes for p, n in spans)


PAGE, DTYPE = 64, cpu.DSA["dtype"]  # the DSA pool's 64-token index pages
side = dict(page_size=PAGE, device="cpu", enable_memory_saver=False, kv_lora_rank=4)
full = dict(side, qk_rope_head_dim=4, index_head_dim=128, kv_cache_dim=8)
with cpu.one_rank():
    hybrid = SWAKVPool(size=2 * PAGE, size_swa=2 * PAGE, page_size=PAGE, dtype=DTYPE,
        head_num=0, head_dim=0, swa_attention_layer_ids=[1], full_attention_layer_ids=[0],
        device="cpu", full_kv_pool_class=DSATokenToKVPool, swa_kv_pool_class=MLATokenToKVPool,
        full_kv_pool_kwargs=full, swa_kv_pool_kwargs=dict(side, qk_rope_head_dim=4))  # fmt: skip
    alone = DSATokenToKVPool(size=2 * PAGE, dtype=DTYPE, layer_num=1, **full)
    sent = index_keys_registered(hybrid, hybrid.full_kv_pool), index_keys_registered(alone, alone)
alone = "registered" if sent[1] else "unregistered"
cpu.verdict(
    not sent[0] and f"the hybrid's DSA index keys are in no span PD registers (alone: {alone})",
    "fixed: PD registers the DSA full side's index keys of a sliding-window hybrid",
)
