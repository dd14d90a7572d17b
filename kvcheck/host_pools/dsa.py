"""kvcheck's host pool for a device pool's other per-layer buffers: SGLang 0.5.23's
``DSAIndexerPoolHost`` (a DSA pool's index-K pages) and, by the same rule, any buffer a pool
variant adds (scales, say).

It mirrors the device buffers named (``index_k_with_scale_buffer`` by default): each layer
whose buffer has rows (a DSA skip layer has none), compactly. A buffer with a row per token
slot is kept like a latent row; a buffer with a row per page is kept by page: ``(layers,
pages, *row)`` in ``layer_first``, ``(pages, layers, *row)`` otherwise. Its host slots are its
anchor's (the host pool of the same device pool's main buffers): the anchor allocates, both
transfer with the same host indices.

Example:
    >>> import torch
    >>> from kvcheck.pools import DSATokenToKVPool
    >>> from kvcheck.host_pools import MLATokenToKVPoolHost
    >>> device = DSATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=4,
    ...                           qk_rope_head_dim=4, layer_num=2, device="cpu",
    ...                           index_head_dim=128, skip_topk_layers=[True, False])
    >>> anchor = MLATokenToKVPoolHost(device, 2.0, 0, 4, "page_first", host_token_capacity=8)
    >>> indexer = DSAIndexerPoolHost(device, anchor)
    >>> tuple(indexer.index_k_with_scale_buffer.shape), indexer.get_size_per_token()
    ((2, 1, 528), 132)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvcheck.host_pools import _layouts
from kvcheck.host_pools.base import Component, HostKVCache


class DSAIndexerPoolHost(HostKVCache):
    """Host copies of ``device_pool``'s ``buffer_names`` buffers, in ``anchor_host``'s slots
    and layout."""

    def __init__(
        self,
        device_pool: Any,
        anchor_host: HostKVCache,
        *,
        buffer_names: Sequence[str] = ("index_k_with_scale_buffer",),
        pin_memory: bool = False,
        device: str = "cpu",
    ) -> None:
        self.anchor = anchor_host
        self.buffer_names = tuple(buffer_names)
        self.LAYOUTS = anchor_host.LAYOUTS
        super().__init__(
            device_pool,
            0.0,
            0,
            anchor_host.page_size,
            anchor_host.layout,
            pin_memory,
            device,
            host_token_capacity=anchor_host.size,
        )

    def _device_dtype(self) -> torch.dtype:
        return getattr(self.device_pool, self.buffer_names[0])[0].dtype

    def size_per_token_of(self, device_pool: Any) -> int:  # pragma: no cover - sized by the anchor
        raise NotImplementedError

    def init_kv_buffer(self) -> None:
        token_rows = self.device_pool.size + self.page_size
        for name in self.buffer_names:
            buffers = getattr(self.device_pool, name)
            layers = [layer for layer, buffer in enumerate(buffers) if buffer.shape[0] > 0]
            sample = buffers[layers[0]] if layers else buffers[0]
            row_shape = tuple(sample.shape[1:])
            row_bytes = int(sample[0].numel() if sample.shape[0] else torch.Size(row_shape).numel())
            row_bytes *= sample.element_size()
            unit = "token" if sample.shape[0] == token_rows else "page"
            count = len(layers)
            if unit == "token":
                dims = _layouts.host_dims(
                    self.layout,
                    layers=count,
                    slots=self.size,
                    page_size=self.page_size,
                    row=row_shape,
                )
            elif self.layout == "layer_first":
                dims = (count, self.page_num, *row_shape)
            else:
                dims = (self.page_num, count, *row_shape)
            host = torch.zeros(dims, dtype=sample.dtype, device=self.device)
            setattr(self, name, host)
            self.components.append(Component(name, host, layers, unit, row_bytes))

    # -- slots are the anchor's ------------------------------------------------------------

    def clear(self) -> None:
        """Nothing of its own: the anchor's slots are the ones in use."""

    def available_size(self) -> int:
        return self.anchor.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self.anchor.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        return self.anchor.free(indices)

    def check_held(self, indices: object, *, where: str, name: str) -> torch.Tensor:
        return self.anchor.check_held(indices, where=where, name=name)

    # -- pages -----------------------------------------------------------------------------

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The rows of the page starting at host slot ``index``, every mirrored layer."""
        index = self._page_start(f"{type(self).__name__}.get_data_page", index)
        pages = []
        for component in self.components:
            if component.unit == "token":
                page = _layouts.page_view(component.host, self.layout, index, self.page_size)
            elif self.layout == "layer_first":
                page = component.host[:, index // self.page_size : index // self.page_size + 1]
            else:
                page = component.host[index // self.page_size : index // self.page_size + 1]
            pages.append(page)
        if len(pages) == 1 and not flat:
            return pages[0]
        return torch.cat([page.flatten() for page in pages])

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        """Per page, per mirrored buffer (and per layer for ``layer_first``) its region."""
        starts = self._check_meta(indices)
        ptrs: list[int] = []
        sizes: list[int] = []
        for start in starts:
            page = start // self.page_size
            for component in self.components:
                base, layers = component.host.data_ptr(), len(component.layers)
                per_page = component.row_bytes * (
                    self.page_size if component.unit == "token" else 1
                )
                if self.layout == "layer_first":
                    span = self.size if component.unit == "token" else self.page_num
                    first = start if component.unit == "token" else page
                    for layer in range(layers):
                        row = component.row_bytes
                        ptrs.append(base + (layer * span + first) * row)
                        sizes.append(per_page)
                else:
                    ptrs.append(base + page * layers * per_page)
                    sizes.append(layers * per_page)
        return ptrs, sizes

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        """The host tensors a zero-copy backend registers: one per mirrored buffer."""
        return [component.host for component in self.components]

    def destroy(self) -> None:
        """Release the mirrored buffers and ``kv_buffer``; a second call does nothing."""
        if not getattr(self, "_destroyed", False):
            for name in self.buffer_names:
                setattr(self, name, None)
        super().destroy()
