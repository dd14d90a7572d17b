"""kvcheck's own host pools, modelled on SGLang 0.5.23's (``srt/mem_cache/pool_host/``).

The hierarchical cache's host tier: :class:`MHATokenToKVPoolHost` (K and V, four layouts;
two buffers when V's head dim is its own), :class:`MLATokenToKVPoolHost` (latent rows) and
:class:`DSAIndexerPoolHost` (a DSA pool's index-K pages, or any other per-layer buffer of a
pool, in the slots of an anchor host pool). A quantized pool's scale buffers are mirrored
by the MHA or MLA host pool itself, beside the payload (``k_scale_host``, ...: backed up,
loaded, paged and described with it). Same constructors and methods as SGLang's, built
from the device pool itself; unlike SGLang's they refuse bad calls (``ValueError``, nothing
changed).

Example:
    >>> import torch
    >>> from kvcheck.pools import MHATokenToKVPool
    >>> device = MHATokenToKVPool(size=4, page_size=2, dtype=torch.float16, head_num=1,
    ...                           head_dim=2, layer_num=1, device="cpu")
    >>> host = MHATokenToKVPoolHost(device, 2.0, 0, 2, "layer_first", host_token_capacity=4)
    >>> tuple(host.kv_buffer.shape)
    (2, 1, 4, 1, 2)
"""

from kvcheck.host_pools.base import HostKVCache, host_attribute, scale_buffer_names
from kvcheck.host_pools.dsa import DSAIndexerPoolHost
from kvcheck.host_pools.mha import MHATokenToKVPoolHost
from kvcheck.host_pools.mla import MLATokenToKVPoolHost

__all__ = [
    "DSAIndexerPoolHost",
    "HostKVCache",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPoolHost",
    "host_attribute",
    "scale_buffer_names",
]
