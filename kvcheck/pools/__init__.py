"""Production-grade KV-cache pools modeled on SGLang 0.5.23's ``memory_pool.py``.

Four families share the abstract :class:`KVCache` (layer mapping, argument checks,
byte accounting):

- :class:`MHATokenToKVPool`: per-layer K and V token buffers; ``set_kv_buffer`` (payloads
  of another dtype are scaled and converted), ``set_kv_buffer_prefix_valid``.
- :class:`NoOpMHATokenToKVPool`: the MHA API with one-page placeholders; every write
  raises ``RuntimeError`` (``--prefill-only-disable-kv-cache``); moves and host copies
  validate their arguments and do nothing.
- :class:`MLATokenToKVPool`: one latent buffer per layer; ``set_mla_kv_buffer`` /
  ``get_mla_kv_buffer`` take and give the latent row as its nope and rope parts.
- :class:`QuantizedMHATokenToKVPool` (SGLang's quant methods ``cpu_fp8_e4m3``,
  ``fp4_mx_block16``, ``nvfp4``), :class:`MHATokenToKVPoolMXFP8` and
  :class:`MLATokenToKVPoolFP4`: quantized pools whose block scales are state, written,
  moved, copied, counted and described with their payload.
- :class:`DSATokenToKVPool`: MLA plus the DSA indexer's paged fp8 keys, with skip layers;
  token-granular moves and host copies, paged reads (``get_index_k_scale_buffer``).

Every family has SGLang 0.5.23's signatures (``layer_id_override``, ``k_scale``/
``v_scale``, ``get_contiguous_buf_infos``). Every pool works on ``cpu``, ``cuda`` and
``meta``; bad input raises ``ValueError`` naming the argument and leaves the pool
unchanged, and no call modifies a tensor the caller passed in.

Example:
    >>> import torch
    >>> from kvcheck.pools import DSATokenToKVPool
    >>> pool = DSATokenToKVPool(size=3_000_000, page_size=64, kv_lora_rank=512,
    ...                         dtype=torch.float8_e4m3fn, qk_rope_head_dim=64, layer_num=78,
    ...                         device="meta", index_head_dim=128)
    >>> round(pool.mem_usage, 2)
    154.3
"""

from kvcheck.pools.base import KVCache
from kvcheck.pools.dsa import DSATokenToKVPool
from kvcheck.pools.mha import MHATokenToKVPool
from kvcheck.pools.mha_quant import MHATokenToKVPoolMXFP8, QuantizedMHATokenToKVPool
from kvcheck.pools.mla import MLATokenToKVPool
from kvcheck.pools.mla_fp4 import MLATokenToKVPoolFP4
from kvcheck.pools.noop import NoOpMHATokenToKVPool

__all__ = [
    "DSATokenToKVPool",
    "KVCache",
    "MHATokenToKVPool",
    "MHATokenToKVPoolMXFP8",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "NoOpMHATokenToKVPool",
    "QuantizedMHATokenToKVPool",
]
