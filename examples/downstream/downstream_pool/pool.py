"""``CountingMHAPool``: kvcheck's MHA pool plus a count of the tokens written per layer.

Stands in for "our own pool": a subclass adding bookkeeping, which must not change what the
pool stores or what it rejects.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvcheck.pools import MHATokenToKVPool


class CountingMHAPool(MHATokenToKVPool):
    """An MHA pool that counts, per global layer, the tokens accepted by ``set_kv_buffer``.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> pool = CountingMHAPool(size=4, page_size=4, dtype=torch.float32, head_num=1,
        ...                        head_dim=2, layer_num=1, device="cpu")
        >>> kv = torch.ones(2, 1, 2)
        >>> pool.set_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([1, 2]), kv, kv)
        >>> pool.tokens_written[0]
        2
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokens_written: Counter[int] = Counter()

    def set_kv_buffer(
        self, layer: Any, loc: Any, cache_k: Any, cache_v: Any, *args: Any, **kwargs: Any
    ) -> None:
        super().set_kv_buffer(layer, loc, cache_k, cache_v, *args, **kwargs)
        # Counted only after the base class accepted the write: rejected writes change nothing.
        # Callers may pass layer=None with layer_id_override, as sglang's pools allow.
        layer_id = kwargs.get("layer_id_override")
        if layer_id is None:
            layer_id = layer.layer_id
        self.tokens_written[layer_id] += int(loc.numel())
