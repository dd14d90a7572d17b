"""T2 (sglang 0.5.23): DSA get_kv_size_bytes and mem_usage leave out the kpool compress tails.

A ``DSATokenToKVPool`` with ``index_kpool > 1`` and ``index_kpool_compress`` allocates, per
top-k layer, bf16 rings of keys and scores for every request slot (``_compress_tail_k``,
``_compress_tail_score``) and describes them in ``get_compress_tail_buf_infos``;
``get_kv_size_bytes`` (and ``mem_usage``) counts the latent and index-K buffers only (at
61 layers, 256 request slots, kpool 4: 32 MiB unreported a rank). One layer, kpool 2, 8
request slots; sglang's default path runs here (pools are only built). Exit 1 and "BUG
PRESENT: ..." while the report leaves bytes out; 0 and "fixed" once it counts them.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

PAGE = cpu.kpool_page()
with cpu.one_rank():
    args = dict(cpu.DSA, index_kpool=2, index_kpool_compress=True, max_running_requests=8)
    pool = DSATokenToKVPool(size=2 * PAGE, page_size=PAGE, **args)
report = pool.get_kv_size_bytes()  # one number for a DSA pool (K and V for MHA)
reported = int(sum(report)) if isinstance(report, tuple) else int(report)
names = ("kv_buffer", "index_k_with_scale_buffer", "_compress_tail_k", "_compress_tail_score")
held = {name: sum(t.nbytes for t in getattr(pool, name)) for name in names}
tails = held["_compress_tail_k"] + held["_compress_tail_score"]
described = sum(pool.get_compress_tail_buf_infos()[1])
cpu.verdict(
    reported < sum(held.values())
    and (
        f"get_kv_size_bytes() reports {reported} bytes (mem_usage {pool.mem_usage:.9f} GB) "
        f"but the pool holds {sum(held.values())}: the compress tails ({tails} bytes, "
        f"described by get_compress_tail_buf_infos: {described}) are not counted"
    ),
    f"fixed: the pool reports {reported} bytes and holds {sum(held.values())}",
)
