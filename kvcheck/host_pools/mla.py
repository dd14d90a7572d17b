"""kvcheck's MLA host pool, SGLang 0.5.23's ``MLATokenToKVPoolHost``: host copies of a latent
pool's rows (an MLA pool, or a DSA pool's latent part) in ``kv_buffer``.

Example:
    >>> import torch
    >>> from kvcheck.pools import MLATokenToKVPool
    >>> device = MLATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=4,
    ...                           qk_rope_head_dim=4, layer_num=2, device="cpu")
    >>> host = MLATokenToKVPoolHost(device, 2.0, 0, 4, "layer_first", host_token_capacity=8)
    >>> _, lens, items = host.get_contiguous_buf_infos()
    >>> lens, items
    ([128, 128], [64, 64])
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.host_pools import _layouts
from kvcheck.host_pools.base import Component, HostKVCache


class MLATokenToKVPoolHost(HostKVCache):
    """Host copies of a latent pool's rows."""

    def _device_dtype(self) -> torch.dtype:
        return self.device_pool.kv_buffer[0].dtype

    def size_per_token_of(self, device_pool: Any) -> int:
        row = device_pool.kv_buffer[0]
        return int(row[0].numel()) * row.element_size() * int(device_pool.layer_num)

    def init_kv_buffer(self) -> None:
        row_shape = tuple(self.device_pool.kv_buffer[0].shape[1:])
        self.kv_cache_dim = int(row_shape[-1])
        dims = _layouts.host_dims(
            self.layout,
            layers=self.layer_num,
            slots=self.size,
            page_size=self.page_size,
            row=row_shape,
        )
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype, device=self.device)
        row_bytes = self.kv_buffer[(0,) * (len(dims) - len(row_shape))].nbytes
        self.token_stride_size = row_bytes
        self.components = [
            Component("kv_buffer", self.kv_buffer, list(range(self.layer_num)), "token", row_bytes)
        ]
        self._add_scale_components()

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index``: ``kv_buffer`` sliced by the layout,
        then (an FP4 pool) its scale buffer's part of the page, as flat bytes."""
        index = self._page_start(f"{type(self).__name__}.get_data_page", index)
        return self._with_scale_pages(self._main_page_view(index), index, flat)

    def _main_page_view(self, index: int) -> torch.Tensor:
        return _layouts.page_view(self.kv_buffer, self.layout, index, self.page_size)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        """Per page (and per layer for ``layer_first``) the region holding its rows, then
        each scale buffer's regions of the page."""
        starts = self._check_meta(indices)
        row, base = self.token_stride_size, self.kv_buffer.data_ptr()
        ptrs: list[int] = []
        sizes: list[int] = []
        for start in starts:
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    ptrs.append(base + (layer * self.size + start) * row)
                    sizes.append(self.page_size * row)
            else:
                ptrs.append(base + start * self.layer_num * row)
                sizes.append(self.layer_num * self.page_size * row)
            for component in self.scale_components:
                for ptr, size in self._component_page_meta(component, start):
                    ptrs.append(ptr)
                    sizes.append(size)
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Regions that tile ``kv_buffer`` and any scale buffer, for a transfer engine: one
        per layer in ``layer_first`` (items of a page of rows), else one of whole pages
        (items of a page of every layer)."""
        regions = [
            region
            for component in self.components
            for region in self._component_buf_infos(component)
        ]
        return (
            [ptr for ptr, _, _ in regions],
            [length for _, length, _ in regions],
            [item for _, _, item in regions],
        )
