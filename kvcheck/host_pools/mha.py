"""kvcheck's MHA host pool, SGLang 0.5.23's ``MHATokenToKVPoolHost`` (and, for a V head dim of
its own, ``AsymmetricMHATokenToKVPoolHost``) in one class.

Symmetric pools keep K and V in one host buffer ``kv_buffer`` of shape ``(2, ...)`` in any of
the four layouts (:mod:`kvcheck.host_pools._layouts`); a pool whose V head dim differs keeps
``k_buffer`` and ``v_buffer`` apart, in the page-first layouts only, and has no flat data
pages (as SGLang's has none).

Example:
    >>> import torch
    >>> from kvcheck.pools import MHATokenToKVPool
    >>> device = MHATokenToKVPool(size=8, page_size=2, dtype=torch.float16, head_num=2,
    ...                           head_dim=4, layer_num=3, device="cpu")
    >>> host = MHATokenToKVPoolHost(device, 2.0, 0, 2, "page_head", host_token_capacity=4)
    >>> tuple(host.kv_buffer.shape), host.get_size_per_token()
    ((2, 2, 2, 2, 3, 4), 96)
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.host_pools._layouts import host_dims
from kvcheck.host_pools.base import Component, HostKVCache


class MHATokenToKVPoolHost(HostKVCache):
    """Host copies of an MHA pool's K and V rows."""

    LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
    ASYMMETRIC_LAYOUTS = ("page_first", "page_first_direct")

    def _device_dtype(self) -> torch.dtype:
        return self.device_pool.k_buffer[0].dtype

    def _dims(self, device_pool: Any) -> tuple[int, int, int]:
        heads, head_dim = tuple(device_pool.k_buffer[0].shape[1:])
        v_head_dim = int(device_pool.v_buffer[0].shape[-1])
        return int(heads), int(head_dim), v_head_dim

    def size_per_token_of(self, device_pool: Any) -> int:
        heads, head_dim, v_head_dim = self._dims(device_pool)
        itemsize = device_pool.k_buffer[0].element_size()
        return (head_dim + v_head_dim) * heads * int(device_pool.layer_num) * itemsize

    def init_kv_buffer(self) -> None:
        self.head_num, self.head_dim, self.v_head_dim = self._dims(self.device_pool)
        self.asymmetric = self.v_head_dim != self.head_dim
        if self.asymmetric and self.layout not in self.ASYMMETRIC_LAYOUTS:
            raise ValueError(
                f"{type(self).__name__}: layout={self.layout!r} not in {self.ASYMMETRIC_LAYOUTS}"
                f" for head_dim={self.head_dim} != v_head_dim={self.v_head_dim}"
            )
        layers = list(range(self.layer_num))
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        shape = {"layers": self.layer_num, "slots": self.size, "page_size": self.page_size}
        k_dims = host_dims(self.layout, row=(self.head_num, self.head_dim), **shape)
        if self.asymmetric:
            v_dims = host_dims(self.layout, row=(self.head_num, self.v_head_dim), **shape)
            self._k = torch.zeros(k_dims, dtype=self.dtype, device=self.device)
            self._v = torch.zeros(v_dims, dtype=self.dtype, device=self.device)
            self.kv_buffer: Any = (self._k, self._v)
        else:
            self.kv_buffer = torch.zeros((2, *k_dims), dtype=self.dtype, device=self.device)
            self._k, self._v = self.kv_buffer[0], self.kv_buffer[1]
        self.components = [
            Component(
                "k_buffer", self._k, layers, "token", self.head_num * self.head_dim * itemsize
            ),
            Component(
                "v_buffer", self._v, layers, "token", self.head_num * self.v_head_dim * itemsize
            ),
        ]
        self._add_scale_components()

    @property
    def k_buffer(self) -> torch.Tensor:
        return self._k

    @property
    def v_buffer(self) -> torch.Tensor:
        return self._v

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """The page starting at host slot ``index``: ``kv_buffer`` sliced by the layout,
        then (a quantized pool) each scale buffer's part of the page, as flat bytes."""
        where = f"{type(self).__name__}.get_data_page"
        if self.asymmetric:
            raise NotImplementedError(f"{where}: no flat data pages when head_dim != v_head_dim")
        index = self._page_start(where, index)
        return self._with_scale_pages(self._main_page_view(index), index, flat)

    def _main_page_view(self, index: int) -> torch.Tensor:
        ps = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index : index + ps]
        if self.layout == "page_first":
            return self.kv_buffer[:, index : index + ps]
        return self.kv_buffer[:, index // ps : index // ps + 1]

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        """Per page (and per layer for ``layer_first``): its K region, then its V region;
        then each scale buffer's regions of the page."""
        starts = self._check_meta(indices)
        ptrs: list[int] = []
        sizes: list[int] = []
        k_row = self.components[0].row_bytes
        v_row = self.components[1].row_bytes
        for start in starts:
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    offset = layer * self.size + start
                    ptrs += [
                        self._k.data_ptr() + offset * k_row,
                        self._v.data_ptr() + offset * v_row,
                    ]
                    sizes += [self.page_size * k_row, self.page_size * v_row]
            else:
                ptrs += [
                    self._k.data_ptr() + start * self.layer_num * k_row,
                    self._v.data_ptr() + start * self.layer_num * v_row,
                ]
                sizes += [
                    self.layer_num * self.page_size * k_row,
                    self.layer_num * self.page_size * v_row,
                ]
            for component in self.scale_components:
                for ptr, size in self._component_page_meta(component, start):
                    ptrs.append(ptr)
                    sizes.append(size)
        return ptrs, sizes

    def get_ksize_per_token(self) -> int:
        """Host bytes per host slot of K rows, every layer."""
        return self.components[0].row_bytes * self.layer_num

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        """The host tensors a zero-copy backend registers: K's, then V's."""
        return [self._k, self._v]

    def get_split_heads_page_buffer_meta(
        self, indices: torch.Tensor, split_factor: int
    ) -> tuple[list[int], list[int]]:
        """``page_head`` only: per page, per group of ``head_num // split_factor`` heads, its
        K region, then its V region (a rank with fewer heads takes one group)."""
        where = f"{type(self).__name__}.get_split_heads_page_buffer_meta"
        if self.asymmetric:
            raise NotImplementedError(f"{where}: no page_head layout when head_dim != v_head_dim")
        if self.layout != "page_head":
            raise ValueError(f"{where}: needs layout='page_head', got {self.layout!r}")
        if (
            isinstance(split_factor, bool)
            or not isinstance(split_factor, int)
            or split_factor < 1
            or self.head_num % split_factor
        ):
            raise ValueError(
                f"{where}: split_factor={split_factor!r} must be an int >= 1 dividing "
                f"head_num={self.head_num}"
            )
        starts = self._check_meta(indices)
        group = self.head_num // split_factor
        head_bytes = self.components[0].row_bytes // self.head_num
        block = self.page_size * self.layer_num * head_bytes  # one head of one page
        ptrs: list[int] = []
        for start in starts:
            page = start // self.page_size
            for first_head in range(0, self.head_num, group):
                offset = (page * self.head_num + first_head) * block
                ptrs += [self._k.data_ptr() + offset, self._v.data_ptr() + offset]
        return ptrs, [group * block] * len(ptrs)
