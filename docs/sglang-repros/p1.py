"""P1 (sglang 0.5.23): a draft MHA worker under --prefill-only-disable-kv-cache gets the no-op pool.

sglang's pool-family checks exempt the draft worker (it keeps its normal pool), but
``_build_mha_kv_pool`` picks ``NoOpMHATokenToKVPool`` from the flag alone: a speculative
draft's first KV write raises. The draft's pool is built by sglang's ``ModelConfig`` (a
two-layer Qwen3 ``config.json``) and ``KVCacheConfigurator.configure`` for the flags below,
then one token is written. sglang's default path, the KV-copy kernel its constructor warms
up run by Triton's interpreter (TRITON_INTERPRET=1). Exit 1 and "BUG PRESENT: ..." while
the draft's pool refuses the write; 0 and "fixed" once it stores it.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: see the docstring
# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig

flags = dict(
    is_embedding=True,
    prefill_only_disable_kv_cache=True,
    chunked_prefill_size=-1,
    disable_radix_cache=True,
    attention_backend="fa3",
    speculative_algorithm="EAGLE",
)
target = MemoryPoolConfig(max_total_num_tokens=64, max_running_requests=4)  # the draft takes it
with cpu.qwen3_configurator(draft=True, pool_config=target, **flags) as configurator:
    pool = configurator.configure(pre_model_load_memory=0).token_to_kv_pool
row = torch.ones((1, 1, 32), dtype=torch.bfloat16)
bug = None
try:
    pool.set_kv_buffer(cpu.layer(0), cpu.ids(1), row, row)
except RuntimeError as error:
    bug = (
        "KVCacheConfigurator.configure gave the draft worker (exempt from the flag's checks) "
        f"a {type(pool).__name__}, and its first KV write raised RuntimeError: {str(error)[:80]}"
    )
cpu.verdict(bug, f"fixed: the draft worker got {type(pool).__name__}, which stores its writes")
