"""What every kvcheck host pool shares: host slots, sizing, and moving rows between tiers.

A host pool keeps copies of a device pool's pages in host memory (SGLang's hierarchical
cache). Its slots are handed out like a device allocator's, but in whole pages and
including slot 0 (the host has no padding page): ``alloc(n)`` gives ``n`` free slots (FIFO)
or None, ``free(ids)`` takes held slots back. ``backup_from_device_all_layer`` copies the
rows of device slots into host slots for every layer; ``load_to_device_per_layer`` copies
one layer back. Each mirrored device buffer is a *component*: token rows (K, V, a latent
row) live at the layout's place for (layer, host slot) (:mod:`kvcheck.host_pools._layouts`);
page rows (DSA index-K pages) move whole, host page ``host_ids[k * page_size] // page_size``.

kvcheck's host pools refuse bad calls with ``ValueError`` before changing anything: a size
that is not whole pages or negative, host slots outside the pool, not held or listed twice,
index lists of different lengths, device slots outside the device pool, a layer the pool
does not mirror, an io backend the layout does not transfer with, and, for the page-granular
``page_first_direct`` layout (and page components), index lists that are not whole
page-aligned runs.

Example:
    >>> import torch
    >>> from kvcheck.pools import MLATokenToKVPool
    >>> from kvcheck.host_pools import MLATokenToKVPoolHost
    >>> device = MLATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=4,
    ...                           qk_rope_head_dim=4, layer_num=2, device="cpu")
    >>> host = MLATokenToKVPoolHost(device, 2.0, 0, 4, "page_first", host_token_capacity=8)
    >>> slots = host.alloc(4)
    >>> slots.tolist(), host.available_size()
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcheck.host_pools import _layouts

_INDEX_DTYPES = (torch.int32, torch.int64)
#: The io backends each layout transfers with.
IO_BACKENDS: dict[str, tuple[str, ...]] = {
    "layer_first": ("kernel", "direct"),
    "page_first": ("kernel",),
    "page_first_direct": ("direct",),
    "page_head": ("kernel",),
}


@dataclass
class Component:
    """One mirrored device buffer: its attribute on the device pool, its host buffer, the
    local device layers it mirrors (host layer ``j`` is device layer ``layers[j]``) and its
    unit (``"token"`` rows or ``"page"`` rows)."""

    name: str
    host: torch.Tensor
    layers: list[int]
    unit: str
    row_bytes: int
    #: Moved as bytes (a scale buffer: its host copy is uint8 rows of the device row's bytes).
    raw: bool = False


def scale_buffer_names(device_pool: Any) -> list[str]:
    """The scale buffers of a quantized device pool (public ``*_scale_buffer`` lists, one
    tensor per layer; a DSA pool's ``index_k_with_scale_buffer`` is index keys, not a scale
    buffer): what a host pool keeps beside the payload, so scales travel with it.

    Example:
        >>> from types import SimpleNamespace
        >>> pool = SimpleNamespace(layer_num=1, k_scale_buffer=[torch.zeros(2)],
        ...                        v_scale_buffer=None, index_k_with_scale_buffer=[torch.zeros(2)])
        >>> scale_buffer_names(pool)
        ['k_scale_buffer']
    """
    names = []
    for name, value in vars(device_pool).items():
        if name.startswith(("_", "index_k")) or not name.endswith("_scale_buffer"):
            continue
        if isinstance(value, list) and len(value) == int(device_pool.layer_num):
            names.append(name)
    return names


def host_attribute(buffer_name: str) -> str:
    """The host attribute mirroring device buffer ``buffer_name`` (``k_scale_buffer`` ->
    ``k_scale_host``, SGLang's MXFP8 host pool's names)."""
    return buffer_name.removesuffix("_buffer") + "_host"


def _ids(where: str, name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{where}: {name} must be a 1-D integer tensor, got {value!r}")
    return value.long().cpu()


class HostKVCache:
    """Host slots and transfers of one host pool; subclasses say what they mirror
    (:meth:`init_kv_buffer` fills ``self.components``)."""

    LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_first_direct")
    #: The host buffer (or buffers) SGLang's API calls ``kv_buffer``; None after destroy().
    kv_buffer: Any

    def __init__(
        self,
        device_pool: Any,
        host_to_device_ratio: float,
        host_size: float,
        page_size: int,
        layout: str,
        pin_memory: bool = False,
        device: str = "cpu",
        *,
        host_token_capacity: int | None = None,
    ) -> None:
        where = type(self).__name__
        if layout not in self.LAYOUTS:
            raise ValueError(f"{where}: layout={layout!r} not in {self.LAYOUTS}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"{where}: page_size={page_size!r} must be an int >= 1")
        if page_size != device_pool.page_size:
            raise ValueError(
                f"{where}: page_size={page_size} differs from the device pool's "
                f"{device_pool.page_size}"
            )
        self.device_pool = device_pool
        self.layout = layout
        self.page_size = page_size
        self.pin_memory = pin_memory
        self.device = device
        self.layer_num = int(device_pool.layer_num)
        self.dtype = self._device_dtype()
        if host_token_capacity is not None:
            if (
                isinstance(host_token_capacity, bool)
                or not isinstance(host_token_capacity, int)
                or host_token_capacity <= 0
                or host_token_capacity % page_size
            ):
                raise ValueError(
                    f"{where}: host_token_capacity={host_token_capacity!r} must be a positive "
                    f"multiple of page_size={page_size}"
                )
            self.size = host_token_capacity
        else:
            if host_size > 0:
                tokens = int(host_size * 1e9 // self.size_per_token_of(device_pool))
            else:
                tokens = int(device_pool.size * host_to_device_ratio)
            self.size = (tokens // page_size + 1) * page_size
        self.page_num = self.size // page_size
        self.components: list[Component] = []
        self.init_kv_buffer()
        self.clear()

    # -- what subclasses provide ------------------------------------------------------------

    def _device_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def size_per_token_of(self, device_pool: Any) -> int:
        raise NotImplementedError

    def init_kv_buffer(self) -> None:
        raise NotImplementedError

    def get_size_per_token(self) -> int:
        """Host bytes per host slot across every mirrored layer and component."""
        total = 0
        for component in self.components:
            per_token = component.row_bytes
            if component.unit == "page":
                per_token = component.row_bytes // self.page_size
            total += per_token * len(component.layers)
        return total

    # -- slots -----------------------------------------------------------------------------

    def clear(self) -> None:
        """Every host slot free (slot 0 included), none held."""
        self.free_slots = torch.arange(self.size, dtype=torch.int64)
        self.slot_used = torch.zeros(self.size, dtype=torch.bool)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` free host slots (whole pages), oldest free first; None when fewer."""
        where = f"{type(self).__name__}.alloc"
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise ValueError(f"{where}: need_size={need_size!r} must be an int >= 0")
        if need_size % self.page_size:
            raise ValueError(
                f"{where}: need_size={need_size} is not whole pages of page_size={self.page_size}"
            )
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self.slot_used[taken] = True
        return taken.clone()

    def free(self, indices: torch.Tensor) -> int:
        """Take held host slots back (after every free slot); returns how many."""
        ids = self.check_held(indices, where=f"{type(self).__name__}.free", name="indices")
        self.slot_used[ids] = False
        self.free_slots = torch.cat([self.free_slots, ids])
        return len(ids)

    def check_held(self, indices: object, *, where: str, name: str) -> torch.Tensor:
        """``indices`` as CPU int64, if they are distinct held host slots."""
        ids = _ids(where, name, indices)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"{where}: {name}={ids.tolist()} not all in [0, {self.size})")
        if len(torch.unique(ids)) != len(ids):
            raise ValueError(f"{where}: {name}={ids.tolist()} lists a slot twice")
        if len(ids) and not bool(self.slot_used[ids].all()):
            raise ValueError(f"{where}: {name}={ids.tolist()} are not all held (allocated)")
        return ids

    # -- transfers -------------------------------------------------------------------------

    def _check_transfer(
        self, where: str, host_indices: object, device_indices: object, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if io_backend not in IO_BACKENDS[self.layout]:
            raise ValueError(
                f"{where}: io_backend={io_backend!r} does not transfer layout {self.layout!r}"
                f" (takes {IO_BACKENDS[self.layout]})"
            )
        host_ids = self.check_held(host_indices, where=where, name="host_indices")
        device_ids = _ids(where, "device_indices", device_indices)
        if len(device_ids) != len(host_ids):
            raise ValueError(
                f"{where}: {len(host_ids)} host_indices but {len(device_ids)} device_indices"
            )
        rows = self.device_pool.size + self.page_size
        if len(device_ids) and (device_ids.min() < 0 or device_ids.max() >= rows):
            raise ValueError(
                f"{where}: device_indices={device_ids.tolist()} not all in [0, {rows})"
            )
        if self.layout == "page_first_direct" or any(c.unit == "page" for c in self.components):
            for name, ids in (("host_indices", host_ids), ("device_indices", device_ids)):
                self._check_runs(where, name, ids)
        return host_ids, device_ids

    def _check_runs(self, where: str, name: str, ids: torch.Tensor) -> None:
        ps = self.page_size
        if len(ids) % ps:
            raise ValueError(f"{where}: {name} must be whole pages of {ps}, got {len(ids)} ids")
        for start in range(0, len(ids), ps):
            run = ids[start : start + ps].tolist()
            if run[0] % ps or run != list(range(run[0], run[0] + ps)):
                raise ValueError(
                    f"{where}: {name}[{start}:{start + ps}]={run} is not one whole page"
                )

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        """Copy every mirrored layer's rows of ``device_indices`` into ``host_indices``."""
        where = f"{type(self).__name__}.backup_from_device_all_layer"
        host_ids, device_ids = self._check_transfer(where, host_indices, device_indices, io_backend)
        for component in self.components:
            buffers = getattr(device_pool, component.name)
            for host_layer, layer in enumerate(component.layers):
                self._backup(component, host_layer, buffers[layer], host_ids, device_ids)

    def load_to_device_per_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
    ) -> None:
        """Copy the rows of ``host_indices`` of local layer ``layer_id`` into ``device_indices``."""
        where = f"{type(self).__name__}.load_to_device_per_layer"
        if (
            isinstance(layer_id, bool)
            or not isinstance(layer_id, int)
            or not 0 <= layer_id < self.layer_num
        ):
            raise ValueError(f"{where}: layer_id={layer_id!r} not in [0, {self.layer_num})")
        host_ids, device_ids = self._check_transfer(where, host_indices, device_indices, io_backend)
        for component in self.components:
            if layer_id not in component.layers:
                continue
            host_layer = component.layers.index(layer_id)
            target = getattr(device_pool, component.name)[layer_id]
            self._load(component, host_layer, target, host_ids, device_ids)

    def _backup(
        self,
        component: Component,
        host_layer: int,
        source: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        ps = self.page_size
        source = self._rows_of(component, source)
        if component.unit == "token":
            rows = source[device_ids.to(source.device)].to(component.host.device)
            _layouts.put_rows(
                component.host, self._token_layout(), host_layer, host_ids, rows, page_size=ps
            )
            return
        pages = source[(device_ids[::ps] // ps).to(source.device)].to(component.host.device)
        self._set_page_rows(component, host_layer, host_ids[::ps] // ps, pages)

    def _load(
        self,
        component: Component,
        host_layer: int,
        target: torch.Tensor,
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
    ) -> None:
        ps = self.page_size
        target = self._rows_of(component, target)
        if component.unit == "token":
            rows = _layouts.get_rows(
                component.host, self._token_layout(), host_layer, host_ids, page_size=ps
            )
            target[device_ids.to(target.device)] = rows.reshape(
                len(host_ids), *target.shape[1:]
            ).to(target.device)
            return
        pages = self._page_rows(component, host_layer, host_ids[::ps] // ps)
        target[(device_ids[::ps] // ps).to(target.device)] = pages.reshape(
            -1, *target.shape[1:]
        ).to(target.device)

    def _token_layout(self) -> str:
        return self.layout

    @staticmethod
    def _rows_of(component: Component, buffer: torch.Tensor) -> torch.Tensor:
        """The device buffer as the component moves it (a raw one: ``[rows, bytes]`` uint8)."""
        if component.raw:
            return buffer.view(torch.uint8).reshape(buffer.shape[0], -1)
        return buffer

    # -- scale buffers beside the payload --------------------------------------------------

    def _add_scale_components(self) -> None:
        """Mirror the device pool's scale buffers (:func:`scale_buffer_names`) as uint8
        components of this host pool, attribute ``<name>_host``: a buffer with a row per
        token slot in the layout's token place (``page_head``: the row whole, one "head"), a
        buffer with a row per page (MXFP8 interleaved, NVFP4 native) by page: ``(layers,
        pages, bytes)`` in ``layer_first``, ``(pages, layers, bytes)`` otherwise."""
        token_rows = self.device_pool.size + self.page_size
        layers = list(range(self.layer_num))
        for name in scale_buffer_names(self.device_pool):
            sample = getattr(self.device_pool, name)[0]
            row_bytes = sample[0].nbytes if sample.shape[0] else 0
            unit = "token" if sample.shape[0] == token_rows else "page"
            if unit == "token":
                row = (1, row_bytes) if self.layout == "page_head" else (row_bytes,)
                dims = _layouts.host_dims(
                    self.layout,
                    layers=self.layer_num,
                    slots=self.size,
                    page_size=self.page_size,
                    row=row,
                )
            elif self.layout == "layer_first":
                dims = (self.layer_num, self.page_num, row_bytes)
            else:
                dims = (self.page_num, self.layer_num, row_bytes)
            host = torch.zeros(dims, dtype=torch.uint8, device=self.device)
            setattr(self, host_attribute(name), host)
            self.components.append(Component(name, host, layers, unit, row_bytes, raw=True))

    @property
    def scale_components(self) -> list[Component]:
        """The mirrored scale buffers (empty for an unquantized pool)."""
        return [component for component in self.components if component.raw]

    def _component_page(self, component: Component, index: int) -> torch.Tensor:
        """Component ``component``'s part of the data page starting at host slot ``index``."""
        if component.unit == "token":
            return _layouts.page_view(component.host, self.layout, index, self.page_size)
        page = index // self.page_size
        if self.layout == "layer_first":
            return component.host[:, page : page + 1]
        return component.host[page : page + 1]

    def _with_scale_pages(self, main: torch.Tensor, index: int, flat: bool) -> torch.Tensor:
        """The data page: ``main`` (the payload's page), then each scale component's, as
        one flat uint8 page when the pool keeps scales (``flat=False`` is then refused: a
        page of several buffers has no one shape)."""
        if not self.scale_components:
            return main.flatten() if flat else main
        if not flat:
            raise NotImplementedError(
                f"{type(self).__name__}.get_data_page: a page with scales is flat bytes only"
            )
        pages = [main, *(self._component_page(c, index) for c in self.scale_components)]
        return torch.cat([page.contiguous().reshape(-1).view(torch.uint8) for page in pages])

    def _component_page_meta(self, component: Component, start: int) -> list[tuple[int, int]]:
        """The regions (pointer, bytes) of component ``component``'s part of the page
        starting at host slot ``start``: one per layer in ``layer_first``, else one."""
        page, base = start // self.page_size, component.host.data_ptr()
        layers, row = len(component.layers), component.row_bytes
        per_page = row * (self.page_size if component.unit == "token" else 1)
        if self.layout != "layer_first":
            return [(base + page * layers * per_page, layers * per_page)]
        span = self.size if component.unit == "token" else self.page_num
        first = start if component.unit == "token" else page
        return [(base + (layer * span + first) * row, per_page) for layer in range(layers)]

    def _component_buf_infos(self, component: Component) -> list[tuple[int, int, int]]:
        """Regions (pointer, bytes, item bytes) tiling a component's host buffer for a
        transfer engine: one per layer in ``layer_first``, else the whole buffer (items of
        a page)."""
        base, layers, row = component.host.data_ptr(), len(component.layers), component.row_bytes
        item = row * (self.page_size if component.unit == "token" else 1)
        if self.layout == "layer_first":
            per_layer = component.host.nbytes // max(layers, 1)
            return [(base + layer * per_layer, per_layer, item) for layer in range(layers)]
        return [(base, component.host.nbytes, layers * item)]

    def _page_rows(
        self, component: Component, host_layer: int, pages: torch.Tensor
    ) -> torch.Tensor:
        """Copies of host page rows ``pages`` of ``host_layer`` (page components)."""
        if self.layout == "layer_first":
            return component.host[host_layer, pages].clone()
        return component.host[pages, host_layer].clone()

    def _set_page_rows(
        self, component: Component, host_layer: int, pages: torch.Tensor, rows: torch.Tensor
    ) -> None:
        if self.layout == "layer_first":
            component.host[host_layer, pages] = rows.reshape(len(pages), *component.host.shape[2:])
        else:
            component.host[pages, host_layer] = rows.reshape(len(pages), *component.host.shape[2:])

    # -- pages for storage backends --------------------------------------------------------

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int:
        """Bytes of the first region :meth:`get_page_buffer_meta` names for one page."""
        _, sizes = self.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        return sizes[0] // split_factor

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """Zeros, as long as one flat data page."""
        return torch.zeros_like(self.get_data_page(0, flat=True))

    def _page_start(self, where: str, index: object) -> int:
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or index < 0
            or index % self.page_size
            or index >= self.size
        ):
            raise ValueError(
                f"{where}: index={index!r} must be a page's first host slot in [0, {self.size})"
            )
        return index

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        """Overwrite the data page starting at host slot ``index`` with ``data_page`` (flat)."""
        where = f"{type(self).__name__}.set_from_flat_data_page"
        index = self._page_start(where, index)
        if self.scale_components:
            self._set_scaled_page(where, index, data_page)
            return
        view = self.get_data_page(index, flat=False)
        if (
            not isinstance(data_page, torch.Tensor)
            or data_page.numel() != view.numel()
            or data_page.dtype != view.dtype
        ):
            raise ValueError(
                f"{where}: data_page must hold {view.numel()} values of {view.dtype}, "
                f"got {data_page!r}"
            )
        view.copy_(data_page.reshape(view.shape))

    def _set_scaled_page(self, where: str, index: int, data_page: object) -> None:
        """Overwrite a page with scales from its flat uint8 bytes (payload, then scales)."""
        main = self._main_page_view(index)
        views = [main, *(self._component_page(c, index) for c in self.scale_components)]
        total = sum(view.nbytes for view in views)
        if (
            not isinstance(data_page, torch.Tensor)
            or data_page.dtype != torch.uint8
            or data_page.numel() != total
        ):
            raise ValueError(
                f"{where}: data_page must hold {total} uint8 values, got {data_page!r}"
            )
        cursor = 0
        for view in views:
            chunk = data_page[cursor : cursor + view.nbytes].to(view.device)
            view.copy_(chunk.view(view.dtype).reshape(view.shape))
            cursor += view.nbytes

    def _main_page_view(self, index: int) -> torch.Tensor:
        """The payload's page view (subclasses that keep scales say where it is)."""
        raise NotImplementedError

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        raise NotImplementedError

    def _check_meta(self, indices: object) -> list[int]:
        where = f"{type(self).__name__}.get_page_buffer_meta"
        ids = _ids(where, "indices", indices)
        if len(ids) % self.page_size:
            raise ValueError(f"{where}: {len(ids)} indices are not whole pages of {self.page_size}")
        starts = ids[:: self.page_size].tolist()
        for start in starts:
            self._page_start(where, start)
        return starts

    # -- storage-backend queries, teardown, and the controller's transfer hooks -------------

    def get_ksize_per_token(self) -> int:
        """Host bytes per host slot of the key side: every mirrored byte for a pool with no
        separate V (MLA, DSA index keys); MHA overrides it with its K rows."""
        return self.get_size_per_token()

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        """Whether every page region a zero-copy storage backend is handed starts on a
        multiple of ``page_size_bytes``: the layout is page-major (``layer_first`` never is)
        and each host buffer starts, and steps from page to page, on such a multiple."""
        where = f"{type(self).__name__}.is_stride_page_aligned"
        if (
            isinstance(page_size_bytes, bool)
            or not isinstance(page_size_bytes, int)
            or page_size_bytes < 1
        ):
            raise ValueError(f"{where}: page_size_bytes={page_size_bytes!r} must be an int >= 1")
        if self.layout == "layer_first":
            return False
        for component in self.components:
            per_page = component.row_bytes * len(component.layers)
            if component.unit == "token":
                per_page *= self.page_size
            if component.host.data_ptr() % page_size_bytes or per_page % page_size_bytes:
                return False
        return True

    def destroy(self) -> None:
        """Release the host buffers (SGLang unregisters pinned ones here); a second call
        does nothing."""
        if getattr(self, "_destroyed", False):
            return
        self._destroyed = True
        self.kv_buffer = None

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The indices one transfer uses: a plain host pool's own, unchanged."""
        return host_indices, device_indices

    def backup_from_device_all_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        """:meth:`backup_from_device_all_layer` with indices already resolved."""
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

    def load_to_device_per_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
    ) -> None:
        """:meth:`load_to_device_per_layer` with indices already resolved."""
        self.load_to_device_per_layer(
            device_pool, host_indices, device_indices, layer_id, io_backend
        )
