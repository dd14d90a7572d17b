"""M2 (sglang 0.5.23): a HybridReqToTokenPool.alloc refused for want of a mamba slot keeps the row.

``alloc`` takes the request rows first (``ReqToTokenPool.alloc``), then a mamba slot per
request that holds none, and refuses by ``assert mid is not None`` when the mamba allocator
is empty: the rows already taken stay taken, bound to a request the caller was refused. A
pool of 4 rows and 1 mamba slot admits one request; the second is refused, and the free
rows go 3 -> 2. sglang's own path runs here (no kernel: the pool's Python code). Under
``python -O`` the assert is gone and ``mid[0]`` raises ``TypeError`` on ``None``, after
the same row was taken. Exit 1 and "BUG PRESENT: ..." while the refusal changes the free
rows; 0 once it changes nothing.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu

pool = cpu.hybrid_req_pool(rows=4, mamba_slots=1)
pool.alloc([cpu.new_request("first")])  # takes a row and the only mamba slot
rows_before = pool.available_size()
slots_before = pool.mamba_allocator.available_size()
second = cpu.new_request("second")
try:
    refusal = f"returned {pool.alloc([second])!r}"
except (AssertionError, TypeError) as error:  # TypeError: under python -O
    refusal = f"raised {type(error).__name__}"
rows_after = pool.available_size()
cpu.verdict(
    rows_after != rows_before
    and (
        f"alloc([second]) {refusal} ({slots_before} mamba slots free) but the free rows "
        f"went {rows_before} -> {rows_after}; the refused request's req_pool_idx is "
        f"{second.kv.req_pool_idx}: a row is taken and owned by nobody"
    ),
    "fixed: the refused alloc left the free rows as they were",
)
