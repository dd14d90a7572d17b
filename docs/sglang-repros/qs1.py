"""QS1 (sglang 0.5.23): a retracted QSA request comes back without its index state.

QSATokenToKVPool keeps, beside the full KV, compressed index keys (row slot // ratio) and a
per-request pending ring (rows r * ratio ...), but inherits get_cpu_copy/load_cpu_copy from
HybridLinearKVPool, which copy the full KV (and mamba state) only. A PD decode server of a
model with recurrent state retracts through them (backend cpu_tensor): the request resumes
with whatever its slots and row hold then. sglang's path runs (Python only). Exit 1 and
"BUG PRESENT: ..." while they are not restored; 0 and "fixed" once they are.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool

ROW, PAGE, RATIO = 1, 4, 2
req_pool = cpu.hybrid_req_pool(rows=4, mamba_slots=4)
pool = QSATokenToKVPool(size=16, dtype=torch.bfloat16, page_size=PAGE, head_num=1,
    head_dim=4, full_attention_layer_ids=[1], device="cpu", mamba_pool=req_pool.mamba_pool,
    qsa_index_kv_heads=1, qsa_index_head_dim=4, qsa_compress_ratio=RATIO, qsa_token_topk=2,
    num_request_slots=4)  # fmt: skip
state = {  # page 1 (tokens 4-7) and request row 1: the retracted request's
    "full K": pool.full_kv_pool.k_buffer[0][PAGE : 2 * PAGE],
    "compressed keys": pool.qsa_compressed_k_buffer_pool[0][PAGE // RATIO : 2 * PAGE // RATIO],
    "pending ring": pool.qsa_key_state_buffer_pool[0][ROW * RATIO : (ROW + 1) * RATIO],
}
tokens = torch.arange(PAGE, 2 * PAGE)
[view.fill_(1.0) for view in state.values()]  # the request's state
copy = pool.get_cpu_copy(tokens, req_pool_index=ROW)  # retraction
[view.fill_(2.0) for view in state.values()]  # the slots and row serve others meanwhile
pool.load_cpu_copy(copy, tokens, req_pool_index=ROW)  # the request resumes
lost = [name for name, view in state.items() if not bool((view == 1.0).all())]
cpu.verdict(
    lost
    and f"after get_cpu_copy and load_cpu_copy the request's {' and '.join(lost)} hold "
    "what others wrote since (its full K is back: "
    f"{'yes' if 'full K' not in lost else 'no'})",
    "fixed: load_cpu_copy restored the request's full K, compressed keys and pending ring",
)
