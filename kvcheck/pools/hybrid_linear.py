"""The linear-attention hybrid pool: full-attention KV for some layers, mamba state for the rest.

Modeled on SGLang 0.5.23's ``HybridLinearKVPool``: the full-attention layers keep per-token
K/V in an MHA pool that is dense over those layers only, so every call translates the
model's global layer id through ``full_attention_layer_id_mapping``; the mamba state lives
in the request pool's :class:`~kvcheck.pools.mamba.MambaPool`, which this pool reaches for
host copies and the state's transfer description.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from kvcheck.pools.mamba import MambaPool
    >>> mamba = MambaPool(size=2, conv_shapes=[(3, 2)], temporal_shape=(1, 2, 2),
    ...                   mamba_layer_ids=[0, 2], device="cpu")
    >>> pool = HybridLinearKVPool(size=4, dtype=torch.float32, page_size=1, head_num=1,
    ...                           head_dim=2, full_attention_layer_ids=[1, 3], device="cpu",
    ...                           mamba_pool=mamba)
    >>> k = torch.ones(1, 1, 2)
    >>> pool.set_kv_buffer(SimpleNamespace(layer_id=3), torch.tensor([2]), k, 2 * k)
    >>> pool.full_kv_pool.get_value_buffer(1)[2].tolist()
    [[2.0, 2.0]]
    >>> pool.get_kv_size_bytes()
    (80, 80)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvcheck.pools.mamba import MambaPool
from kvcheck.pools.mha import MHATokenToKVPool

__all__ = ["HybridLinearKVPool"]


class HybridLinearKVPool:
    """Full KV over ``full_attention_layer_ids`` (global ids) beside a mamba pool."""

    full_kv_pool_cls = MHATokenToKVPool

    def __init__(
        self,
        *,
        size: int,
        dtype: torch.dtype,
        page_size: int,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids: Sequence[int],
        device: str | torch.device,
        mamba_pool: MambaPool,
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.page_size = page_size
        self.device = device
        self.mamba_pool = mamba_pool
        self.full_kv_pool = self.full_kv_pool_cls(
            size=size,
            page_size=page_size,
            dtype=dtype,
            head_num=head_num,
            head_dim=head_dim,
            layer_num=len(full_attention_layer_ids),
            device=device,
        )
        self.full_attention_layer_id_mapping = {
            layer_id: i for i, layer_id in enumerate(full_attention_layer_ids)
        }
        k_bytes, v_bytes = self.get_kv_size_bytes()
        self.mem_usage = (k_bytes + v_bytes) / (1 << 30)

    def _full_id(self, layer_id: int) -> int:
        if layer_id not in self.full_attention_layer_id_mapping:
            raise ValueError(
                f"layer_id={layer_id} is not a full-attention layer: "
                f"{sorted(self.full_attention_layer_id_mapping)}"
            )
        return self.full_attention_layer_id_mapping[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """K of global full-attention layer ``layer_id``."""
        return self.full_kv_pool.get_key_buffer(self._full_id(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """V of global full-attention layer ``layer_id``."""
        return self.full_kv_pool.get_value_buffer(self._full_id(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of global full-attention layer ``layer_id``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self,
        layer: Any,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Write K/V of ``layer.layer_id`` (a global full-attention id) at slots ``loc``."""
        self.full_kv_pool.set_kv_buffer(
            None,
            loc,
            cache_k,
            cache_v,
            k_scale,
            v_scale,
            layer_id_override=self._full_id(layer.layer_id),
        )

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move every full layer's K/V from ``src_loc`` to ``tgt_loc`` (mamba state has no
        token slots to move)."""
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> tuple[Any, Any]:
        """Host copies of the full KV at ``indices`` and, given ``mamba_indices``, of those
        slots' mamba state."""
        kv_cpu = self.full_kv_pool.get_cpu_copy(indices)
        mamba_cpu = None if mamba_indices is None else self.mamba_pool.get_cpu_copy(mamba_indices)
        return kv_cpu, mamba_cpu

    def load_cpu_copy(
        self,
        cache_cpu: tuple[Any, Any],
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result back at ``indices`` (and ``mamba_indices``)."""
        kv_cpu, mamba_cpu = cache_cpu
        self.full_kv_pool.load_cpu_copy(kv_cpu, indices)
        if mamba_cpu is not None and mamba_indices is not None:
            self.mamba_pool.load_cpu_copy(mamba_cpu, mamba_indices)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Bytes of the full K and V buffers (the mamba state is counted by its pool)."""
        return self.full_kv_pool.get_kv_size_bytes()

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The full KV's transfer description."""
        return self.full_kv_pool.get_contiguous_buf_infos()

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The mamba state's transfer description."""
        return self.mamba_pool.get_contiguous_buf_infos()
