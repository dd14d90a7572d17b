"""C3 (sglang 0.5.23): pools sized by the configurator exceed the memory budget by a page.

``DefaultPoolConfigurator.calculate_pool_sizes(available_bytes, page_size)`` answers
``available_bytes // cell_size`` tokens, rounded down to whole pages; every pool built for
it holds ``size + page_size`` rows (the padding page), so the pools take ``page_size *
cell_size`` bytes more than the budget. sglang's ``ModelConfig`` (a two-layer Qwen3), its
``KVCacheConfigurator`` and the steps ``configure`` takes after measuring free memory, for
a budget of 64 tokens' cells on 16-token pages (sglang's default path runs here).
Exit 1 and "BUG PRESENT: ..." while the pools exceed the budget; 0 once they fit.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

PAGE, TOKENS = 16, 64
with cpu.qwen3_configurator(page_size=PAGE) as configurator:
    sizer = create_memory_pool_configurator(configurator)
    budget = TOKENS * sizer._cell_size  # room for exactly 64 tokens
    config = sizer.calculate_pool_sizes(budget, PAGE)
    config.max_running_requests = 4
    sizes = configurator._derive_pool_sizes(config=config)
    pools = configurator._init_pools(
        sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None
    )
pool = pools.token_to_kv_pool
held = cpu.storage_bytes([*pool.k_buffer, *pool.v_buffer])
cpu.verdict(
    held > budget
    and (
        f"calculate_pool_sizes({budget}, page_size={PAGE}) -> max_total_num_tokens="
        f"{config.max_total_num_tokens} (cell size {sizer._cell_size}), but the "
        f"{type(pool).__name__} built for it holds {pool.k_buffer[0].shape[0]} rows = {held} "
        f"bytes, {held - budget} over the budget"
    ),
    f"fixed: the pool for {config.max_total_num_tokens} tokens takes {held} <= {budget} bytes",
)
