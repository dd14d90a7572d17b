"""``MLATokenToKVPool``: one latent (compressed KV + rope key) buffer per layer."""

from __future__ import annotations

import math

import torch

from kvcheck.pools._checks import require_int
from kvcheck.pools._dtypes import SUPPORTED_DTYPES
from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._rows import gather_rows, move_rows, scatter_rows
from kvcheck.pools.base import KVCache


class MLATokenToKVPool(KVCache):
    """Latent buffers ``[size + page_size, 1, kv_lora_rank + qk_rope_head_dim]`` per layer.

    The key buffer of a layer is the whole latent row; the value buffer is its first
    ``kv_lora_rank`` channels (a view, as in SGLang). fp8 dtypes are stored as ``uint8``.
    A latent row is ``kv_lora_rank`` "nope" channels then ``qk_rope_head_dim`` rope
    channels: ``set_kv_buffer`` writes whole rows, ``set_mla_kv_buffer`` the two parts,
    ``get_mla_kv_buffer`` reads them back as fresh tensors. Payloads of another floating
    dtype are converted with ``.to(dtype)``.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> pool = MLATokenToKVPool(size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=4,
        ...                         qk_rope_head_dim=2, layer_num=2, device="cpu")
        >>> pool.kv_buffer[0].shape
        torch.Size([12, 1, 6])
        >>> row = torch.arange(6, dtype=torch.bfloat16).view(1, 1, 6)
        >>> pool.set_kv_buffer(SimpleNamespace(layer_id=1), torch.tensor([4]), row, None)
        >>> pool.get_value_buffer(1)[4].tolist()
        [[0.0, 1.0, 2.0, 3.0]]
        >>> pool.get_kv_size_bytes()  # one int: all latent buffers
        288
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
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
        self.kv_lora_rank = require_int("kv_lora_rank", kv_lora_rank, minimum=1)
        # SGLang allows a model without a rope part (qk_rope_head_dim == 0).
        self.qk_rope_head_dim = require_int("qk_rope_head_dim", qk_rope_head_dim, minimum=0)
        self.kv_cache_dim = self._latent_row_width()
        self.kv_buffer = [
            self._zeros((self.num_slots, 1, self.kv_cache_dim)) for _ in range(self.layer_num)
        ]

    def _latent_row_width(self) -> int:
        """Storage elements of one latent row: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    # --- reads ---------------------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s latent buffer, in ``dtype``."""
        local = self._local_layer(layer_id, where="get_key_buffer")
        return self._as_read_dtype(self.kv_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The first ``kv_lora_rank`` channels of layer ``layer_id``'s latent buffer."""
        local = self._local_layer(layer_id, where="get_value_buffer")
        return self._as_read_dtype(self.kv_buffer[local][..., : self.kv_lora_rank])

    # --- writes --------------------------------------------------------------------------

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: object = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write latent rows ``cache_k[i]`` (``[len(loc), 1, kv_cache_dim]``) to ``loc[i]``.

        The layer is ``layer_id_override`` when given (a global id; ``layer`` is then not
        read), else ``layer.layer_id``. ``loc``: 1-D int32/int64, distinct, in
        ``[0, size + page_size)``. ``cache_k`` is on the pool's device, in the pool's dtype
        (fp8 pools also take raw ``uint8`` bytes: stored bit for bit) or in another
        supported floating dtype, converted with ``.to(dtype)`` (no scales, as SGLang).
        ``cache_v`` is ignored (the latent row holds both), and may be ``None``.

        Example:
            >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.float16,
            ...                         kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1,
            ...                         device="cpu", start_layer=5)
            >>> row = torch.tensor([[[0.5, 1.5, 2.5]]], dtype=torch.bfloat16)
            >>> pool.set_kv_buffer(None, torch.tensor([3]), row, None, layer_id_override=5)
            >>> pool.kv_buffer[0][3].tolist()
            [[0.5, 1.5, 2.5]]
        """
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=False)
        loc = self._locations("loc", loc, distinct=True, where=where)
        rows = self._cache_payload(
            "cache_k", cache_k, (loc.numel(), 1, self.kv_cache_dim), where=where
        )
        if self.is_meta:
            return
        scatter_rows(self.kv_buffer[local], loc, self._stored_rows(rows, None))

    def set_mla_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor | None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write latent row ``loc[i]`` as ``cache_k_nope[i]`` followed by ``cache_k_rope[i]``.

        ``cache_k_nope``: ``[len(loc), 1, kv_lora_rank]``; ``cache_k_rope``:
        ``[len(loc), 1, qk_rope_head_dim]``, or ``None`` when ``qk_rope_head_dim == 0``.
        Both on the pool's device, either both native (the pool's dtype, or raw ``uint8``
        for fp8 pools: stored bit for bit) or both of one other supported floating dtype
        (converted with ``.to(dtype)``). Layer and ``loc`` rules are those of
        :meth:`set_kv_buffer`.

        Example:
            >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.float32,
            ...                         kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1,
            ...                         device="cpu")
            >>> from types import SimpleNamespace
            >>> nope, rope = torch.tensor([[[1.0, 2.0]]]), torch.tensor([[[9.0]]])
            >>> pool.set_mla_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([2]),
            ...                        nope, rope)
            >>> pool.kv_buffer[0][2].tolist()
            [[1.0, 2.0, 9.0]]
        """
        where = "set_mla_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=False)
        loc = self._locations("loc", loc, distinct=True, where=where)
        n = loc.numel()
        nope = self._mla_part("cache_k_nope", cache_k_nope, (n, 1, self.kv_lora_rank), where=where)
        rope_shape = (n, 1, self.qk_rope_head_dim)
        if cache_k_rope is None and self.qk_rope_head_dim == 0:
            rope = nope.new_empty(rope_shape)
        elif cache_k_rope is None:
            raise ValueError(
                f"{where}: cache_k_rope may be None only when qk_rope_head_dim == 0,"
                f" but qk_rope_head_dim={self.qk_rope_head_dim}"
            )
        else:
            rope = self._mla_part("cache_k_rope", cache_k_rope, rope_shape, where=where)
            if self.qk_rope_head_dim > 0:  # a zero-width rope holds no values to convert
                self._check_pair_dtypes(("cache_k_nope", nope), ("cache_k_rope", rope), where=where)
        if self.is_meta:
            return
        scatter_rows(self.kv_buffer[local], loc, self._latent_rows(nope, rope, where=where))

    def _mla_part(
        self, name: str, value: object, shape: tuple[int, ...], *, where: str
    ) -> torch.Tensor:
        """Validate one part (nope or rope) of a ``set_mla_kv_buffer`` row."""
        return self._cache_payload(name, value, shape, where=where)

    def _latent_rows(self, nope: torch.Tensor, rope: torch.Tensor, *, where: str) -> torch.Tensor:
        """The stored latent rows of validated parts: their concatenation, stored as given
        (native) or converted."""
        return torch.cat([self._stored_rows(nope, None), self._stored_rows(rope, None)], dim=-1)

    def get_mla_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Read latent rows ``loc`` of ``layer.layer_id`` as ``(nope, rope)``; reads only.

        ``loc``: 1-D int32/int64 in ``[0, size + page_size)`` (repeats allowed).
        Returns fresh tensors on the pool's device: ``nope`` ``[len(loc), 1, kv_lora_rank]``
        and ``rope`` ``[len(loc), 1, qk_rope_head_dim]`` (``None`` when
        ``qk_rope_head_dim == 0``), holding the stored values (read in the pool's dtype;
        fp8 pools give fp8 values) converted with ``.to(dst_dtype)``. ``dst_dtype``:
        ``None`` (the pool's dtype) or a supported cache dtype.

        Example:
            >>> from types import SimpleNamespace
            >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.bfloat16,
            ...                         kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1,
            ...                         device="cpu")
            >>> pool.kv_buffer[0][1] = torch.tensor([[1.0, 2.0, 3.0]])
            >>> nope, rope = pool.get_mla_kv_buffer(SimpleNamespace(layer_id=0),
            ...                                     torch.tensor([1, 1]), torch.float32)
            >>> nope.tolist(), rope.tolist()
            ([[[1.0, 2.0]], [[1.0, 2.0]]], [[[3.0]], [[3.0]]])
        """
        where = "get_mla_kv_buffer"
        local = self._layer_of(layer, where=where)
        loc = self._locations("loc", loc, distinct=False, where=where)
        if dst_dtype is not None and (
            not isinstance(dst_dtype, torch.dtype) or dst_dtype not in SUPPORTED_DTYPES
        ):
            allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
            raise ValueError(f"{where}: dst_dtype={dst_dtype!r} must be None or one of {allowed}")
        out_dtype = self.dtype if dst_dtype is None else dst_dtype
        n = loc.numel()
        if self.is_meta:
            rows = torch.empty((n, 1, self.kv_cache_dim), dtype=out_dtype, device="meta")
        else:
            gathered = gather_rows(self.kv_buffer[local], loc)
            rows = self._as_read_dtype(gathered).to(out_dtype)
        # .contiguous() on the column slices copies, so the two results share no memory.
        nope = rows[..., : self.kv_lora_rank].contiguous()
        if self.qk_rope_head_dim == 0:
            return nope, None
        return nope, rows[..., self.kv_lora_rank :].contiguous()

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy slot ``src_loc[i]`` to ``tgt_loc[i]`` in every layer's latent buffer.

        All sources are read before any target is written, so sources may repeat and
        overlap targets; targets must be distinct. Empty locations are a no-op.
        """
        tgt, src = self._move_locations(tgt_loc, src_loc)
        if self.is_meta or tgt.numel() == 0:
            return
        move_rows(self.kv_buffer, tgt=tgt, src=src)

    # --- host copies ---------------------------------------------------------------------

    def _latent_host_layout(self, num_tokens: int) -> list[tuple[int, ...]]:
        return [(num_tokens, 1, self.kv_cache_dim)] * self.layer_num

    def _copy_latent_rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._to_host(gather_rows(buffer, idx)) for buffer in self.kv_buffer)

    def _load_latent_rows(self, rows: tuple[torch.Tensor, ...], idx: torch.Tensor) -> None:
        for buffer, layer_rows in zip(self.kv_buffer, rows, strict=True):
            scatter_rows(buffer, idx, layer_rows.to(self._torch_device))

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy slots ``indices`` (may repeat) of every layer's latent buffer to the CPU."""
        idx = self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={"kv": self._copy_latent_rows(idx)},
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i`` to slot ``indices[i]`` (distinct, same count as copied)."""
        where = "load_cpu_copy"
        idx = self._locations("indices", indices, distinct=True, where=where)
        copy = check_host_copy(
            kv_cache_cpu,
            source=type(self).__name__,
            expected={"kv": self._latent_host_layout(idx.numel())},
            dtypes={"kv": self.store_dtype},
            where=where,
            num_tokens=idx.numel(),
        )
        if self.is_meta:
            return
        self._load_latent_rows(copy.parts["kv"], idx)

    # --- accounting ----------------------------------------------------------------------

    def get_kv_size_bytes(self) -> int:
        """Bytes of all latent buffers, one ``int`` (SGLang 0.5.23 returns one number
        for MLA: ``layer_num * (size + page_size) * kv_cache_dim * itemsize``)."""
        return sum(buffer.nbytes for buffer in self.kv_buffer)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Transfer descriptors ``(ptrs, lens, item_lens)`` of the latent buffers, one entry
        per local layer, as SGLang's MLA pool: ``data_ptr()`` (0 on ``meta``), the buffer's
        bytes (``(size + page_size) * row``) and one page, ``page_size * row``, where
        ``row = kv_cache_dim * itemsize`` of ``store_dtype``. DSA pools give the same
        (their index-K buffers are described by ``get_state_buf_infos``).

        Example:
            >>> pool = MLATokenToKVPool(size=8, page_size=4, dtype=torch.float8_e4m3fn,
            ...                         kv_lora_rank=4, qk_rope_head_dim=2, layer_num=2,
            ...                         device="meta")
            >>> pool.get_contiguous_buf_infos()
            ([0, 0], [72, 72], [24, 24])
        """
        ptrs, lens, item_lens = [], [], []
        for buffer in self.kv_buffer:
            row = math.prod(buffer.shape[1:]) * buffer.element_size()
            ptrs.append(0 if self.is_meta else buffer.data_ptr())
            lens.append(buffer.shape[0] * row)
            item_lens.append(self.page_size * row)
        return ptrs, lens, item_lens

    def check_valid(self) -> None:
        """Assert one latent buffer per layer with the documented shape and dtype."""
        self._check_common_invariants({"kv_buffer": self.kv_buffer})
        expected = (self.num_slots, 1, self.kv_cache_dim)
        for i, buffer in enumerate(self.kv_buffer):
            self._invariant(
                tuple(buffer.shape) == expected and buffer.dtype == self.store_dtype,
                f"kv_buffer[{i}] is {tuple(buffer.shape)} {buffer.dtype},"
                f" expected {expected} {self.store_dtype}",
            )
