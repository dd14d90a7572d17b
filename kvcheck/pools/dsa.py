"""``DSATokenToKVPool``: MLA latent buffers plus the DSA indexer's paged fp8 keys."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvcheck.pools._checks import check_page_table, check_payload, require_int
from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._index_k import QUANT_BLOCK, IndexKPageLayout
from kvcheck.pools._rows import move_rows
from kvcheck.pools._scaled_latent import SCALED_DTYPE, SOURCE_DTYPE, quantize_rows, scaled_row_width
from kvcheck.pools.mla import MLATokenToKVPool

#: Index-K storage: raw bytes (fp8 keys and fp32 scales packed per page).
INDEX_K_DTYPE = torch.uint8


def _check_index_head_dim(index_head_dim: object) -> int:
    value = require_int("index_head_dim", index_head_dim, minimum=1)
    if value % QUANT_BLOCK != 0:
        raise ValueError(
            f"index_head_dim={value} must be a positive multiple of {QUANT_BLOCK}"
            f" (one fp32 scale per {QUANT_BLOCK} channels; SGLang's CUDA kernels need 128)"
        )
    return value


def _check_skip_mask(skip_topk_layers: object, layer_num: int) -> list[bool]:
    if skip_topk_layers is None:
        return [False] * layer_num
    if not isinstance(skip_topk_layers, Sequence) or isinstance(skip_topk_layers, str):
        raise ValueError(
            f"skip_topk_layers={skip_topk_layers!r} must be a list of bools, one per local layer"
        )
    mask = list(skip_topk_layers)
    if len(mask) != layer_num:
        raise ValueError(
            f"skip_topk_layers has the wrong length: len(skip_topk_layers)={len(mask)} but"
            f" layer_num={layer_num}; give one bool per local layer"
        )
    for i, flag in enumerate(mask):
        if not isinstance(flag, bool):
            raise ValueError(f"skip_topk_layers[{i}]={flag!r} must be a bool")
    return mask


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA latent buffers plus, per local layer, a ``uint8`` index-K page buffer.

    ``index_k_with_scale_buffer[i]`` is ``[num_index_pages, page_size * (D + S)]`` with
    ``D = index_head_dim`` fp8 key bytes and ``S = index_head_dim // 128 * 4`` fp32 scale
    bytes per token, ``num_index_pages = (index_buf_size + page_size + 1) // page_size``
    (``index_buf_size`` defaults to ``size``). A page row holds its ``page_size`` keys, then
    their scales (see :mod:`kvcheck.pools._index_k`). Index-K covers token ids
    ``[0, num_index_pages * page_size)``; index writes, moves and host copies refuse
    tokens beyond that while any layer has an index buffer. Moves and host copies are
    token-granular: they carry each listed token's latent row, key bytes and scale bytes
    and never touch the other tokens of its page. ``get_index_k_scale_buffer`` gathers
    sequences' keys and scales through their page tables.

    ``skip_topk_layers[i]`` (local) marks a layer that reuses the previous layer's top-k:
    its index buffer has zero rows (zero bytes, still a list entry so layers stay aligned),
    index writes to it raise ``ValueError``, and moves and host copies skip it.

    ``kv_cache_dim`` (default ``kv_lora_rank + qk_rope_head_dim``, the raw row) may ask
    for SGLang 0.5.23's scaled fp8 latent row instead (``dtype=torch.float8_e4m3fn``,
    ``kv_lora_rank`` a multiple of 128, ``kv_cache_dim = kv_lora_rank + kv_lora_rank //
    128 * 4 + 2 * qk_rope_head_dim``, 656 for 512 and 64): ``latent_layout`` is then
    ``"scaled"``, ``kv_buffer`` rows are those bytes (``uint8``), ``set_mla_kv_buffer``
    quantizes bf16 parts into them, ``set_kv_buffer`` and ``get_mla_kv_buffer`` refuse,
    and moves, host copies and reads copy whole rows' bytes.

    Accepted here on every device: ``page_size >= 1`` and ``index_head_dim`` any positive
    multiple of 128. SGLang's CUDA kernels require ``page_size == 64`` and
    ``index_head_dim == 128``; this pool copies bytes with torch indexing instead, so it
    is not bound to those values.

    Example:
        >>> import torch
        >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4, dtype=torch.bfloat16,
        ...                         qk_rope_head_dim=2, layer_num=2, device="cpu",
        ...                         index_head_dim=128, skip_topk_layers=[False, True])
        >>> [tuple(b.shape) for b in pool.index_k_with_scale_buffer]
        [(3, 528), (0, 528)]
        >>> key = torch.full((1, 128), 7, dtype=torch.uint8)
        >>> pool.set_index_k_scale_buffer(0, torch.tensor([5]), key, torch.ones(1, 1))
        >>> pool.move_kv_cache(tgt_loc=torch.tensor([9]), src_loc=torch.tensor([5]))
        >>> pool.get_index_k_with_scale_buffer(0)[2, 128:256].unique().tolist()
        [7]
        >>> pool.get_state_buf_infos()[1:]
        ([1584, 0], [528, 0])
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int,
        dtype: torch.dtype,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device,
        index_head_dim: int,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        skip_topk_layers: Sequence[bool] | None = None,
        index_buf_size: int | None = None,
        kv_cache_dim: int | None = None,
    ) -> None:
        # Validate the DSA arguments before the latent buffers are allocated.
        self._requested_kv_cache_dim = (
            None if kv_cache_dim is None else require_int("kv_cache_dim", kv_cache_dim, minimum=1)
        )
        checked_layer_num = require_int("layer_num", layer_num, minimum=1)
        checked_head_dim = _check_index_head_dim(index_head_dim)
        checked_mask = _check_skip_mask(skip_topk_layers, checked_layer_num)
        checked_buf_size = (
            None
            if index_buf_size is None
            else require_int("index_buf_size", index_buf_size, minimum=1)
        )
        super().__init__(
            size,
            page_size,
            dtype,
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
        )
        self.index_head_dim = checked_head_dim
        self.skip_topk_layers = checked_mask
        self.index_buf_size = self.size if checked_buf_size is None else checked_buf_size
        self.index_layout = IndexKPageLayout(self.page_size, self.index_head_dim)
        self.num_index_pages = (self.index_buf_size + self.page_size + 1) // self.page_size
        self.index_k_with_scale_buffer = [
            self._zeros((self._index_rows(i), self.index_layout.row_bytes), INDEX_K_DTYPE)
            for i in range(self.layer_num)
        ]

    # --- the latent row layout -----------------------------------------------------------

    def _latent_row_width(self) -> int:
        """``kv_lora_rank + qk_rope_head_dim`` (raw), or the scaled fp8 row's bytes when
        ``kv_cache_dim`` asks for them, as SGLang's ``kv_cache_dim`` override does."""
        raw = super()._latent_row_width()
        requested = self._requested_kv_cache_dim
        self.latent_layout = "raw"
        if requested is None or requested == raw:
            return raw
        rank, rope = self.kv_lora_rank, self.qk_rope_head_dim
        if self.dtype != SCALED_DTYPE or rank % 128:
            raise ValueError(
                f"kv_cache_dim={requested} differs from kv_lora_rank + qk_rope_head_dim={raw}:"
                f" only the scaled fp8 layout overrides it, which needs dtype={SCALED_DTYPE}"
                f" (got {self.dtype}) and kv_lora_rank a multiple of 128 (got {rank})"
            )
        scaled = scaled_row_width(rank, rope)
        if requested != scaled:
            raise ValueError(
                f"kv_cache_dim={requested} must be {raw} (raw layout) or {scaled} (scaled fp8"
                f" layout: {rank} fp8 values, {rank // 128} fp32 scales, {rope} bf16 rope values)"
            )
        self.latent_layout = "scaled"
        return scaled

    def _refuse_scaled(self, where: str, instead: str) -> None:
        if self.latent_layout == "scaled":
            raise ValueError(
                f"{where}: this pool stores scaled fp8 latent rows (kv_cache_dim="
                f"{self.kv_cache_dim}); {instead}"
            )

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: object = None,
        layer_id_override: int | None = None,
    ) -> None:
        """MLA's ``set_kv_buffer``; a scaled pool refuses it (its rows are quantized from
        their parts: use :meth:`set_mla_kv_buffer`)."""
        self._refuse_scaled("set_kv_buffer", "write them with set_mla_kv_buffer")
        super().set_kv_buffer(layer, loc, cache_k, cache_v, layer_id_override)

    def _mla_part(
        self, name: str, value: object, shape: tuple[int, ...], *, where: str
    ) -> torch.Tensor:
        """MLA's check; a scaled pool takes bfloat16 parts only (it quantizes them)."""
        if self.latent_layout != "scaled":
            return super()._mla_part(name, value, shape, where=where)
        return check_payload(
            name,
            value,
            shape=shape,
            dtypes=(SOURCE_DTYPE,),
            device=self._torch_device,
            where=where,
        )

    def _latent_rows(self, nope: torch.Tensor, rope: torch.Tensor, *, where: str) -> torch.Tensor:
        """MLA's rows; a scaled pool quantizes each token's finite bf16 nope values per
        block of 128 and stores them with their fp32 scales and the bf16 rope bytes (see
        :mod:`kvcheck.pools._scaled_latent`).

        Example (through ``set_mla_kv_buffer``):
            >>> pool = DSATokenToKVPool(size=4, page_size=2, kv_lora_rank=128, layer_num=1,
            ...                         dtype=torch.float8_e4m3fn, qk_rope_head_dim=1,
            ...                         device="cpu", index_head_dim=128, kv_cache_dim=134)
            >>> nope = torch.full((1, 1, 128), -4.0, dtype=torch.bfloat16)
            >>> rope = torch.full((1, 1, 1), 3.0, dtype=torch.bfloat16)
            >>> pool.set_mla_kv_buffer(None, torch.tensor([2]), nope, rope,
            ...                        layer_id_override=0)
            >>> row = pool.kv_buffer[0][2, 0]
            >>> hex(row[0].item()), round(row[128:132].view(torch.float32).item() * 448, 5)
            ('0xfe', 4.0)
            >>> row[132:].view(torch.bfloat16).tolist()
            [3.0]
        """
        if self.latent_layout != "scaled":
            return super()._latent_rows(nope, rope, where=where)
        if not bool(torch.isfinite(nope).all()):
            raise ValueError(f"{where}: cache_k_nope holds a non-finite value; it cannot be scaled")
        count = nope.shape[0]
        return quantize_rows(nope.reshape(count, -1), rope.reshape(count, -1)).view(count, 1, -1)

    def get_mla_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MLA's ``get_mla_kv_buffer``; a scaled pool refuses it (its rows are not values
        of one dtype: read them with ``get_key_buffer`` and dequantize)."""
        self._refuse_scaled(
            "get_mla_kv_buffer", "read them with get_key_buffer and dequantize per block"
        )
        return super().get_mla_kv_buffer(layer, loc, dst_dtype)

    # --- index-K geometry ----------------------------------------------------------------

    def _index_rows(self, local: int) -> int:
        return 0 if self.skip_topk_layers[local] else self.num_index_pages

    @property
    def _index_layers(self) -> list[int]:
        """Local layers that hold index keys."""
        return [i for i, skip in enumerate(self.skip_topk_layers) if not skip]

    def _index_token_limit(self) -> tuple[int | None, str]:
        """Location bound for operations that touch index-K (``None``: the slot bound)."""
        capacity = self.num_index_pages * self.page_size
        if not self._index_layers or capacity >= self.num_slots:
            return None, ""
        return capacity, (
            f"index-K holds token ids [0, {capacity}): num_index_pages={self.num_index_pages}"
            f" of page_size={self.page_size} for index_buf_size={self.index_buf_size}"
        )

    # --- index-K reads and writes --------------------------------------------------------

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s ``uint8`` page buffer (zero rows for a skip layer)."""
        local = self._local_layer(layer_id, where="get_index_k_with_scale_buffer")
        return self.index_k_with_scale_buffer[local]

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Write token ``loc[i]``'s index key and scales inside its page.

        ``index_k``: ``[n, index_head_dim]`` float8_e4m3fn or uint8. ``index_k_scale``:
        ``[n, index_head_dim // 128]`` float32, or ``[n]`` float32 when that is 1 (SGLang's
        1-D form), or its raw bytes ``[n, index_head_dim // 128 * 4]`` uint8. ``loc``:
        distinct token ids. A skip layer raises ``ValueError``.
        """
        where = "set_index_k_scale_buffer"
        local = self._local_layer(layer_id, where=where)
        if self.skip_topk_layers[local]:
            raise ValueError(
                f"{where}: layer_id={layer_id} is a skip-topk layer (skip_topk_layers[{local}]"
                " is True): it reuses the previous layer's top-k and has no index-K buffer"
            )
        limit, reason = self._index_token_limit()
        loc = self._locations(
            "loc", loc, distinct=True, where=where, limit=limit, limit_reason=reason
        )
        n = loc.numel()
        key = check_payload(
            "index_k",
            index_k,
            shape=(n, self.index_head_dim),
            dtypes=(torch.float8_e4m3fn, torch.uint8),
            device=self._torch_device,
            where=where,
        )
        scale = self._scale_bytes(index_k_scale, n, where=where)
        if self.is_meta:
            return
        self.index_layout.write(
            self.index_k_with_scale_buffer[local], loc, key.view(INDEX_K_DTYPE), scale
        )

    def _scale_bytes(self, value: object, n: int, *, where: str) -> torch.Tensor:
        """Validate ``index_k_scale`` and return its bytes as ``[n, S]`` uint8."""
        layout = self.index_layout
        if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 2:
            return check_payload(
                "index_k_scale",
                value,
                shape=(n, layout.scale_bytes),
                dtypes=(torch.uint8,),
                device=self._torch_device,
                where=where,
            )
        if isinstance(value, torch.Tensor) and value.dim() == 1 and layout.scale_count == 1:
            shape: tuple[int, ...] = (n,)
        else:
            shape = (n, layout.scale_count)
        scale = check_payload(
            "index_k_scale",
            value,
            shape=shape,
            dtypes=(torch.float32,),
            device=self._torch_device,
            where=where,
        )
        # .contiguous() copies only when needed and never writes to the caller's tensor.
        return scale.reshape(n, layout.scale_count).contiguous().view(INDEX_K_DTYPE)

    # --- moves ---------------------------------------------------------------------------

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move latent rows and, for each non-skip layer, each token's index key and scales.

        Token ``src_loc[i]``'s key bytes and scale bytes are copied to token
        ``tgt_loc[i]``'s place in its own page; the page's other tokens are untouched.
        All sources are read before any target is written; targets must be distinct.
        """
        limit, reason = self._index_token_limit()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        if self.is_meta or tgt.numel() == 0:
            return
        move_rows(self.kv_buffer, tgt=tgt, src=src)
        for i in self._index_layers:
            self.index_layout.move(self.index_k_with_scale_buffer[i], tgt=tgt, src=src)

    # --- host copies ---------------------------------------------------------------------

    def _copy_indices(self, indices: object, *, distinct: bool, where: str) -> torch.Tensor:
        """Validate host-copy ``indices``: any token ids within the slots and, while a
        layer holds index keys, within index-K's tokens."""
        limit, reason = self._index_token_limit()
        return self._locations(
            "indices", indices, distinct=distinct, where=where, limit=limit, limit_reason=reason
        )

    def _host_layout(self, num_tokens: int) -> dict[str, list[tuple[int, ...]]]:
        token_bytes = self.index_layout.token_bytes
        return {
            "kv": self._latent_host_layout(num_tokens),
            "index_k": [(0 if skip else num_tokens, token_bytes) for skip in self.skip_topk_layers],
        }

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy tokens ``indices`` (any token ids, repeats allowed): each token's latent row
        and, for non-skip layers, its index key and scale bytes.

        Copies are token-granular, as SGLang's callers need (one request's slots: whole
        pages plus a partial last page, several requests concatenated, runs crossing
        pages). Index-K parts hold one token row per index, ``D`` key bytes then ``S``
        scale bytes (``[len(indices), D + S]`` uint8); skip layers contribute zero-row
        entries. ``indices`` must lie in index-K's tokens while any layer has index keys.

        Example:
            >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4,
            ...                         dtype=torch.bfloat16, qk_rope_head_dim=2, layer_num=1,
            ...                         device="cpu", index_head_dim=128)
            >>> key = torch.full((1, 128), 7, dtype=torch.uint8)
            >>> pool.set_index_k_scale_buffer(0, torch.tensor([5]), key, torch.ones(1, 1))
            >>> copy = pool.get_cpu_copy(torch.tensor([5, 6]))
            >>> pool.load_cpu_copy(copy, torch.tensor([2, 9]))  # token 2: 5's bytes
            >>> pool.get_index_k_with_scale_buffer(0)[0, 256:384].unique().tolist()
            [7]
        """
        idx = self._copy_indices(indices, distinct=False, where="get_cpu_copy")
        index_rows = tuple(
            self._to_host(self.index_layout.read(buffer, idx[:0] if skip else idx))
            if not self.is_meta
            else torch.empty(
                (0 if skip else idx.numel(), self.index_layout.token_bytes),
                dtype=INDEX_K_DTYPE,
                device="meta",
            )
            for buffer, skip in zip(
                self.index_k_with_scale_buffer, self.skip_topk_layers, strict=True
            )
        )
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={"kv": self._copy_latent_rows(idx), "index_k": index_rows},
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i`` to token ``indices[i]``: its latent row and, for
        non-skip layers, its key and scale bytes. ``indices``: distinct, as many as the
        copy holds, any token ids (they may differ from the copied ones). Every token not
        listed keeps its bytes, including the other tokens of a listed token's page."""
        where = "load_cpu_copy"
        idx = self._copy_indices(indices, distinct=True, where=where)
        copy = check_host_copy(
            kv_cache_cpu,
            source=type(self).__name__,
            expected=self._host_layout(idx.numel()),
            dtypes={"kv": self.store_dtype, "index_k": INDEX_K_DTYPE},
            where=where,
            num_tokens=idx.numel(),
        )
        if self.is_meta:
            return
        self._load_latent_rows(copy.parts["kv"], idx)
        for i in self._index_layers:
            rows = copy.parts["index_k"][i].to(self._torch_device)
            self.index_layout.write_rows(self.index_k_with_scale_buffer[i], idx, rows)

    # --- paged index-K reads -------------------------------------------------------------

    def get_index_k_scale_buffer(
        self,
        layer_id: int,
        seq_len_tensor: torch.Tensor,
        page_indices: torch.Tensor,
        seq_len_sum: int,
        max_seq_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather each sequence's first ``seq_len`` index keys and scales through its page
        table (SGLang's ``GetKAndS``); reads only.

        ``seq_len_tensor``: 1-D int32/int64 ``[B]``, values ``>= 0``. ``page_indices``:
        2-D int32/int64 ``[B, P]``; row ``b`` lists sequence ``b``'s index pages in order.
        Sequence ``b``'s token ``j < seq_len[b]`` lives in page ``page_indices[b, j //
        page_size]`` at offset ``j % page_size``. ``seq_len_sum`` must equal
        ``sum(seq_len)`` and ``max_seq_len`` be ``>= max(seq_len)`` (0 when ``B == 0``).
        Each used page id (columns ``< ceil(seq_len[b] / page_size)``, which must exist)
        must be in ``[0, num_index_pages)``; unused columns are not read. A skip layer
        raises ``ValueError``.

        Returns fresh uint8 tensors ``(k [seq_len_sum, D], scale [seq_len_sum, S])``: row
        ``sum(seq_len[:b]) + j`` holds that token's key bytes and scale bytes.

        Example:
            >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4,
            ...                         dtype=torch.bfloat16, qk_rope_head_dim=2, layer_num=1,
            ...                         device="cpu", index_head_dim=128)
            >>> key = torch.arange(3, dtype=torch.uint8)[:, None].expand(3, 128)
            >>> pool.set_index_k_scale_buffer(0, torch.tensor([8, 9, 4]), key,
            ...                               torch.ones(3, 1))
            >>> k, s = pool.get_index_k_scale_buffer(0, torch.tensor([2, 1]),
            ...                                      torch.tensor([[2], [1]]), 3, 2)
            >>> k[:, 0].tolist(), s.shape
            ([0, 1, 2], torch.Size([3, 4]))
        """
        where = "get_index_k_scale_buffer"
        local = self._local_layer(layer_id, where=where)
        if self.skip_topk_layers[local]:
            raise ValueError(
                f"{where}: layer_id={layer_id} is a skip-topk layer (skip_topk_layers[{local}]"
                " is True): it has no index-K buffer"
            )
        tokens = check_page_table(
            seq_len_tensor,
            page_indices,
            seq_len_sum,
            max_seq_len,
            page_size=self.page_size,
            num_pages=self.num_index_pages,
            device=self._torch_device,
            where=where,
        )
        layout = self.index_layout
        if tokens is None or self.is_meta:
            total = int(seq_len_sum)  # validated by check_page_table
            key = torch.empty((total, layout.key_bytes), dtype=INDEX_K_DTYPE, device="meta")
            scale = torch.empty((total, layout.scale_bytes), dtype=INDEX_K_DTYPE, device="meta")
            return key, scale
        rows = layout.read(self.index_k_with_scale_buffer[local], tokens)
        return rows[:, : layout.key_bytes].contiguous(), rows[:, layout.key_bytes :].contiguous()

    # --- transfer descriptors and accounting ---------------------------------------------

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Index-K transfer descriptors, one entry per local layer (as SGLang's DSA pool).

        Returns ``(ptrs, lens, item_lens)``: the buffer's ``data_ptr()``, its total bytes
        (``num_index_pages * row_bytes``) and the bytes of one page row
        (``page_size * (D + S)``). Skip layers give ``(0, 0, 0)``; their entries are kept so
        layer offsets line up between transfer peers. The latent buffers are not included
        (SGLang describes them separately). On ``meta`` every pointer is 0.
        """
        ptrs, lens, item_lens = [], [], []
        for buffer, skip in zip(self.index_k_with_scale_buffer, self.skip_topk_layers, strict=True):
            ptrs.append(0 if skip else buffer.data_ptr())
            lens.append(0 if skip else buffer.nbytes)
            item_lens.append(0 if skip else self.index_layout.row_bytes)
        return ptrs, lens, item_lens

    def get_kv_size_bytes(self) -> int:
        """One ``int``, as SGLang 0.5.23 returns for DSA: the bytes of all latent buffers
        plus the bytes of all index-K page buffers (skip layers add 0)."""
        return super().get_kv_size_bytes() + sum(
            buffer.nbytes for buffer in self.index_k_with_scale_buffer
        )

    def check_valid(self) -> None:
        """Assert the latent invariants and one index buffer per layer, empty for skip layers."""
        super().check_valid()
        self._check_common_invariants({"index_k_with_scale_buffer": self.index_k_with_scale_buffer})
        self._invariant(
            len(self.skip_topk_layers) == self.layer_num,
            f"skip_topk_layers has {len(self.skip_topk_layers)} entries, expected {self.layer_num}",
        )
        for i, buffer in enumerate(self.index_k_with_scale_buffer):
            expected = (self._index_rows(i), self.index_layout.row_bytes)
            self._invariant(
                tuple(buffer.shape) == expected and buffer.dtype == INDEX_K_DTYPE,
                f"index_k_with_scale_buffer[{i}] is {tuple(buffer.shape)} {buffer.dtype},"
                f" expected {expected} {INDEX_K_DTYPE}"
                f" (skip_topk_layers[{i}]={self.skip_topk_layers[i]})",
            )
