"""``MHATokenToKVPool``: per-layer K and V token buffers for multi-head attention."""

from __future__ import annotations

import math

import torch

from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._refusals import check_prefix_grid, check_scale, require_int
from kvcheck.pools._rows import gather_rows, move_rows, scatter_rows
from kvcheck.pools.base import KVCache


class MHATokenToKVPool(KVCache):
    """K and V buffers per local layer: ``[size + page_size, head_num, head_dim]``.

    V may have its own head dim (``v_head_dim``, default ``head_dim``); when it has not,
    each layer's K and V are the halves of one ``[2, rows, head_num, head_dim]``
    allocation whose rows are padded to whole pages (``size`` need not be whole pages).
    fp8 dtypes are stored as ``uint8``; ``get_key_buffer``/``get_value_buffer`` return fp8
    views.
    Layer ids are global; ``start_layer`` maps them to local buffers.

    Writes (``set_kv_buffer``, ``set_kv_buffer_prefix_valid``) store a payload in the
    pool's dtype bit for bit and convert one of another floating dtype (divided by
    ``k_scale``/``v_scale`` where given, then ``.to(dtype)``), never touching the caller's
    tensors; ``layer_id_override`` picks the layer instead of ``layer.layer_id``.
    ``get_contiguous_buf_infos`` describes K then V buffers for transfer engines.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float8_e4m3fn,
        ...                         head_num=2, head_dim=4, layer_num=1, device="cpu")
        >>> pool.k_buffer[0].shape, pool.k_buffer[0].dtype
        (torch.Size([12, 2, 4]), torch.uint8)
        >>> k = torch.ones(1, 2, 4).to(torch.float8_e4m3fn)
        >>> pool.set_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([5]), k, k)
        >>> pool.move_kv_cache(tgt_loc=torch.tensor([6]), src_loc=torch.tensor([5]))
        >>> pool.get_key_buffer(0)[6].float().sum().item()
        8.0
        >>> pool.get_kv_size_bytes()
        (96, 96)
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        v_head_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        kv_layout: str = "nhd",
        kv_page_padding: bool = True,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
        )
        self.head_num = require_int("head_num", head_num, minimum=1)
        self.head_dim = require_int("head_dim", head_dim, minimum=1)
        self.v_head_dim = (
            self.head_dim
            if v_head_dim is None
            else require_int("v_head_dim", v_head_dim, minimum=1)
        )
        if kv_layout not in ("nhd", "hnd"):
            raise ValueError(f"kv_layout={kv_layout!r} not in ('nhd', 'hnd')")
        if kv_layout == "hnd" and self.size % self.page_size:
            raise ValueError(
                f"kv_layout='hnd' needs whole pages: size={self.size} is not a multiple of "
                f"page_size={self.page_size}"
            )
        self.kv_layout = kv_layout
        if not isinstance(kv_page_padding, bool):
            raise ValueError(f"kv_page_padding={kv_page_padding!r} must be a bool")
        self.kv_page_padding = kv_page_padding
        # Slot arithmetic for the row helpers: None for token rows, the page size for HND.
        self._slot_pages = self.page_size if kv_layout == "hnd" else None
        self.k_buffer, self.v_buffer = self._create_buffers()

    def _buffer_rows(self) -> int:
        """Rows of each per-layer buffer (the NoOp pool keeps only one page)."""
        return self.num_slots

    @property
    def fused_kv(self) -> bool:
        """Whether each layer's K and V are the two halves of one allocation, padded to
        whole pages (they are when their shapes match, as in SGLang 0.5.23, unless the pool
        was built with ``kv_page_padding=False``, as earlier releases allocate them)."""
        return self.kv_page_padding and self.v_head_dim == self.head_dim

    def _allocated_rows(self) -> int:
        """Rows each K and V buffer's allocation holds: a fused layer pads its halves to
        whole pages (a paged kernel reaches V from K's base by whole-page offsets)."""
        rows = self._buffer_rows()
        return -(-rows // self.page_size) * self.page_size if self.fused_kv else rows

    def _gather(self, buffer: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return gather_rows(buffer, idx, page_size=self._slot_pages)

    def _buffer_shape(self, dim: int, rows: int | None = None) -> tuple[int, ...]:
        """One K or V buffer's shape: ``[rows, head_num, dim]``, or for HND
        ``[rows // page_size, head_num, page_size, dim]``."""
        rows = self._buffer_rows() if rows is None else rows
        if self.kv_layout == "hnd":
            return (rows // self.page_size, self.head_num, self.page_size, dim)
        return (rows, self.head_num, dim)

    def _create_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self.fused_kv:
            shape = self._buffer_shape(self.head_dim, self._allocated_rows())
            fused = [self._zeros((2, *shape)) for _ in range(self.layer_num)]
            leading = self._buffer_shape(self.head_dim)[0]
            return [f[0, :leading] for f in fused], [f[1, :leading] for f in fused]
        k_shape, v_shape = self._buffer_shape(self.head_dim), self._buffer_shape(self.v_head_dim)
        k = [self._zeros(k_shape) for _ in range(self.layer_num)]
        v = [self._zeros(v_shape) for _ in range(self.layer_num)]
        return k, v

    # --- reads ---------------------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s K buffer, in ``dtype`` (an fp8 view for fp8 pools)."""
        return self._as_read_dtype(
            self.k_buffer[self._local_layer(layer_id, where="get_key_buffer")]
        )

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s V buffer, in ``dtype`` (an fp8 view for fp8 pools)."""
        return self._as_read_dtype(
            self.v_buffer[self._local_layer(layer_id, where="get_value_buffer")]
        )

    # --- writes --------------------------------------------------------------------------

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write ``cache_k[i]``/``cache_v[i]`` to slot ``loc[i]`` of one layer.

        The layer is ``layer_id_override`` when given (a global id; ``layer`` may then be
        ``None``), else ``layer.layer_id``. ``loc``: 1-D int32/int64, distinct, in
        ``[0, size + page_size)``. ``cache_k`` is ``[len(loc), head_num, head_dim]`` and
        ``cache_v`` ``[len(loc), head_num, v_head_dim]``, on the pool's device.

        Dtypes (SGLang's rule, without its in-place division): a payload in the pool's
        dtype (or raw ``uint8`` bytes for an fp8 pool) is stored bit for bit and the scales
        are ignored. A payload in another supported floating dtype (``cache_k`` and
        ``cache_v`` of one dtype) is divided by ``k_scale``/``v_scale`` where given and
        converted with ``.to(dtype)`` (see :func:`kvcheck.pools._dtypes.convert_payload`);
        the caller's tensors are never modified. Scales: ``None``, a finite number ``> 0``,
        or a one-element float tensor.

        Example:
            >>> from types import SimpleNamespace
            >>> pool = MHATokenToKVPool(size=4, page_size=2, dtype=torch.bfloat16, head_num=1,
            ...                         head_dim=2, layer_num=2, device="cpu", start_layer=3)
            >>> k = torch.tensor([[[3.0, 5.0]]])
            >>> pool.set_kv_buffer(None, torch.tensor([1]), k, k, k_scale=2.0,
            ...                    layer_id_override=4)
            >>> pool.get_key_buffer(4)[1].tolist(), k.tolist()
            ([[1.5, 2.5]], [[[3.0, 5.0]]])
        """
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        loc = self._locations("loc", loc, distinct=True, where=where)
        k, v, ks, vs = self._kv_payloads(cache_k, cache_v, loc.numel(), k_scale, v_scale, where)
        if self.is_meta:
            return
        self._write_rows(local, loc, self._stored_rows(k, ks), self._stored_rows(v, vs))

    def _kv_payloads(
        self,
        cache_k: object,
        cache_v: object,
        n: int,
        k_scale: object,
        v_scale: object,
        where: str,
    ) -> tuple[torch.Tensor, torch.Tensor, float | None, float | None]:
        """Validate ``n`` K and V rows (shapes, dtype pairing) and both scales."""
        k = self._cache_payload("cache_k", cache_k, (n, self.head_num, self.head_dim), where=where)
        v = self._cache_payload(
            "cache_v", cache_v, (n, self.head_num, self.v_head_dim), where=where
        )
        self._check_pair_dtypes(("cache_k", k), ("cache_v", v), where=where)
        ks = check_scale("k_scale", k_scale, device=self._torch_device, where=where)
        vs = check_scale("v_scale", v_scale, device=self._torch_device, where=where)
        return k, v, ks, vs

    def _write_rows(
        self, local: int, loc: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor
    ) -> None:
        scatter_rows(self.k_buffer[local], loc, k_rows, page_size=self._slot_pages)
        scatter_rows(self.v_buffer[local], loc, v_rows, page_size=self._slot_pages)

    def set_kv_buffer_prefix_valid(
        self,
        layer: object,
        loc_2d: torch.Tensor,
        commit_lens: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write the committed prefix of each row of a ``[B, W]`` location grid.

        ``loc_2d``: 2-D int32/int64 ``[B, W]``; ``commit_lens``: 1-D int32/int64 ``[B]``
        with values in ``[0, W]``. ``cache_k``/``cache_v`` hold one row per grid cell,
        row-major (``[B * W, head_num, head_dim]`` / ``[B * W, head_num, v_head_dim]``).
        Cell ``(b, w)`` is written (row ``b * W + w`` to slot ``loc_2d[b, w]``) only when
        ``w < commit_lens[b]``; other cells are not written and their locations are not
        checked. Committed locations must be in ``[0, size + page_size)`` and distinct.
        Layer, dtype and scale rules are those of :meth:`set_kv_buffer`.

        Example:
            >>> from types import SimpleNamespace
            >>> pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float32, head_num=1,
            ...                         head_dim=1, layer_num=1, device="cpu")
            >>> rows = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(4, 1, 1)
            >>> grid = torch.tensor([[5, 6], [7, -1]])  # -1: uncommitted, never read
            >>> pool.set_kv_buffer_prefix_valid(SimpleNamespace(layer_id=0), grid,
            ...                                 torch.tensor([2, 1]), rows, rows)
            >>> pool.k_buffer[0][4:9].flatten().tolist()
            [0.0, 1.0, 2.0, 3.0, 0.0]
        """
        where = "set_kv_buffer_prefix_valid"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        committed = check_prefix_grid(
            loc_2d, commit_lens, limit=self.num_slots, device=self._torch_device, where=where
        )
        rows = int(loc_2d.numel())  # loc_2d is a validated tensor here
        k, v, ks, vs = self._kv_payloads(cache_k, cache_v, rows, k_scale, v_scale, where)
        if self.is_meta or committed is None:
            return
        cells, loc = committed
        if cells.numel() == 0:
            return
        k_rows = self._stored_rows(k.index_select(0, cells), ks)
        v_rows = self._stored_rows(v.index_select(0, cells), vs)
        self._write_rows(local, loc, k_rows, v_rows)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy slot ``src_loc[i]`` to slot ``tgt_loc[i]`` in every layer's K and V.

        All sources are read before any target is written, so sources may repeat and
        overlap targets; targets must be distinct. Empty locations are a no-op.
        """
        tgt, src = self._move_locations(tgt_loc, src_loc)
        if self.is_meta or tgt.numel() == 0:
            return
        move_rows(self.k_buffer + self.v_buffer, tgt=tgt, src=src, page_size=self._slot_pages)

    # --- host copies ---------------------------------------------------------------------

    def _host_layout(self, num_tokens: int) -> dict[str, list[tuple[int, ...]]]:
        return {
            "k": [(num_tokens, self.head_num, self.head_dim)] * self.layer_num,
            "v": [(num_tokens, self.head_num, self.v_head_dim)] * self.layer_num,
        }

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy slots ``indices`` (may repeat) of every layer's K and V to the CPU.

        Returns an opaque copy for ``load_cpu_copy``; on ``meta`` its tensors are meta.
        """
        idx = self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={
                "k": tuple(self._to_host(self._gather(b, idx)) for b in self.k_buffer),
                "v": tuple(self._to_host(self._gather(b, idx)) for b in self.v_buffer),
            },
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i`` to slot ``indices[i]`` (distinct; may differ from the
        copied slots; ``len(indices)`` must equal the number of copied tokens)."""
        where = "load_cpu_copy"
        idx = self._locations("indices", indices, distinct=True, where=where)
        copy = check_host_copy(
            kv_cache_cpu,
            source=type(self).__name__,
            expected=self._host_layout(idx.numel()),
            dtypes={"k": self.store_dtype, "v": self.store_dtype},
            where=where,
            num_tokens=idx.numel(),
        )
        if self.is_meta:
            return
        for buffer, rows in zip(self.k_buffer, copy.parts["k"], strict=True):
            scatter_rows(buffer, idx, rows.to(self._torch_device), page_size=self._slot_pages)
        for buffer, rows in zip(self.v_buffer, copy.parts["v"], strict=True):
            scatter_rows(buffer, idx, rows.to(self._torch_device), page_size=self._slot_pages)

    # --- accounting ----------------------------------------------------------------------

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)``: bytes allocated for all K buffers and all V buffers,
        a fused layer's page padding included (what the pool holds, not its views)."""
        rows, itemsize = self._allocated_rows(), self.store_dtype.itemsize
        return (
            self.layer_num * rows * self.head_num * self.head_dim * itemsize,
            self.layer_num * rows * self.head_num * self.v_head_dim * itemsize,
        )

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Transfer descriptors ``(ptrs, lens, item_lens)``: K buffers of every local layer,
        then V buffers, as SGLang computes them for its plain NHD layout.

        For a buffer whose token row is ``row = head_num * dim * itemsize`` bytes
        (``itemsize`` of ``store_dtype``): ``ptr`` is its ``data_ptr()`` (0 on ``meta``),
        ``len`` its rows times ``row`` (``(size + page_size) * row``, SGLang's
        ``final_span_bytes(size, page_size)``) and ``item_len`` one page,
        ``page_size * row``.

        Example:
            >>> pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float16, head_num=2,
            ...                         head_dim=4, layer_num=2, device="meta", v_head_dim=2)
            >>> pool.get_contiguous_buf_infos()
            ([0, 0, 0, 0], [192, 192, 96, 96], [64, 64, 32, 32])
        """
        ptrs, lens, item_lens = [], [], []
        tokens_per_row = 1 if self._slot_pages is None else self.page_size
        for buffer in self.k_buffer + self.v_buffer:
            row = math.prod(buffer.shape[1:]) * buffer.element_size()
            ptrs.append(0 if self.is_meta else buffer.data_ptr())
            lens.append(buffer.shape[0] * row)
            item_lens.append(self.page_size // tokens_per_row * row)
        return ptrs, lens, item_lens

    def check_valid(self) -> None:
        """Assert one K and one V buffer per layer with the documented shapes and dtype."""
        self._check_common_invariants({"k_buffer": self.k_buffer, "v_buffer": self.v_buffer})
        rows = self._buffer_rows()
        for name, layers, dim in (
            ("k_buffer", self.k_buffer, self.head_dim),
            ("v_buffer", self.v_buffer, self.v_head_dim),
        ):
            for i, buffer in enumerate(layers):
                expected = self._buffer_shape(dim, rows)
                self._invariant(
                    tuple(buffer.shape) == expected and buffer.dtype == self.store_dtype,
                    f"{name}[{i}] is {tuple(buffer.shape)} {buffer.dtype},"
                    f" expected {expected} {self.store_dtype}",
                )
