"""``DSATokenToKVPool``: MLA latent buffers plus the DSA indexer's paged fp8 keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._index_k import QUANT_BLOCK, IndexKPageLayout
from kvcheck.pools._refusals import (
    check_page_table,
    check_payload,
    describe,
    require_bool,
    require_int,
)
from kvcheck.pools._rows import move_rows
from kvcheck.pools._scaled_latent import SCALED_DTYPE, SOURCE_DTYPE, quantize_rows, scaled_row_width
from kvcheck.pools.mla import MLATokenToKVPool

#: Index-K storage: raw bytes (fp8 keys and fp32 scales packed per page).
INDEX_K_DTYPE = torch.uint8
#: Compress-tail storage (keys and scores), as SGLang 0.5.23 allocates it.
TAIL_DTYPE = torch.bfloat16
#: Host-copy entries of the compress tails (SGLang's ``cpu_copy`` keys).
TAIL_PARTS: tuple[str, str] = ("tail_k", "tail_score")


class _KpoolArgs(NamedTuple):
    index_kpool: int
    index_kpool_compress: bool
    tail_extra_slots: int
    max_running_requests: int | None
    use_compress: bool


def _check_kpool(
    page_size: object,
    index_kpool: object,
    index_kpool_compress: object,
    tail_extra_slots: object,
    max_running_requests: object,
) -> _KpoolArgs:
    kpool = require_int("index_kpool", index_kpool, minimum=1)
    page = require_int("page_size", page_size, minimum=1)
    if page % kpool:
        raise ValueError(
            f"page_size={page} must be a multiple of index_kpool={kpool} (a page row holds"
            f" page_size // index_kpool index slots)"
        )
    compress = require_bool("index_kpool_compress", index_kpool_compress)
    extra = require_int("tail_extra_slots", tail_extra_slots, minimum=0)
    # SGLang ignores the compress flag (and so max_running_requests) with index_kpool == 1.
    use_compress = kpool > 1 and compress
    requests: int | None = None
    if use_compress:
        if max_running_requests is None:
            raise ValueError(
                f"max_running_requests=None: index_kpool={kpool} with index_kpool_compress=True"
                " keeps a compress tail per request slot and needs an integer >= 0"
            )
        requests = require_int("max_running_requests", max_running_requests, minimum=0)
    elif isinstance(max_running_requests, int) and not isinstance(max_running_requests, bool):
        requests = max_running_requests  # kept for the record; it sizes nothing here
    return _KpoolArgs(kpool, compress, extra, requests, use_compress)


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

    ``index_k_with_scale_buffer[i]`` is ``[num_index_pages, index_page_size * (D + S)]``
    with ``D = index_head_dim`` fp8 key bytes and ``S = index_head_dim // 128 * 4`` fp32
    scale bytes per token (per index slot, below), ``num_index_pages = (index_buf_size +
    page_size + 1) // page_size`` (``index_buf_size`` defaults to SGLang's ``(size +
    page_size) * dcp_size - page_size``, ``size`` without DCP) and
    ``index_page_size = page_size`` without an index kpool. A page row holds its keys, then
    their scales (see :mod:`kvcheck.pools._index_k`). Index-K covers token ids
    ``[0, num_index_pages * page_size)``; index writes, moves and host copies refuse
    tokens beyond that while any layer has an index buffer. Moves and host copies are
    token-granular: they carry each listed token's latent row, key bytes and scale bytes
    and never touch the other tokens of its page. ``get_index_k_scale_buffer`` gathers
    sequences' keys and scales through their page tables.

    ``skip_topk_layers[i]`` (local) marks a layer that reuses the previous layer's top-k:
    its index buffer has zero rows (zero bytes, still a list entry so layers stay aligned),
    index writes to it raise ``ValueError``, and moves and host copies skip it.

    ``index_kpool`` (SGLang 0.5.23; default 1, ``page_size`` a multiple of it) pools the
    index keys: one index *slot* per ``index_kpool`` tokens, token ``t`` using slot ``t //
    index_kpool``. Rows stay pages of ``page_size`` tokens and hold ``index_page_size =
    page_size // index_kpool`` slots, so a row is ``index_page_size * (D + S)`` bytes and
    slot ``s`` sits in row ``s // index_page_size`` at offset ``s % index_page_size``.
    Index writes and paged reads address slots (``[0, ceil(token_slots / index_kpool))``);
    host copies carry each token's slot (a reload writes slot ``indices[i] // index_kpool``,
    the later token winning when two share one); a non-empty move raises ``ValueError``
    and changes nothing (a token's key cannot move without its slot's other tokens).

    With ``index_kpool > 1`` and ``index_kpool_compress`` (ignored with a kpool of 1) the
    pool also keeps per-request compress tails: ``_compress_tail_k[i]`` and
    ``_compress_tail_score[i]``, bfloat16 zeros ``[max_running_requests + 1, tail_width,
    index_head_dim]`` (zero rows for a skip layer), ``tail_width = index_kpool +
    tail_extra_slots`` ring slots per request; otherwise both are ``None``. See
    :meth:`set_compress_tail_for_request`, :meth:`get_compress_tail_buffers`,
    :meth:`get_compress_tail_buf_infos`; host copies and reloads given a
    ``req_pool_index`` carry that request's tails. ``get_kv_size_bytes`` counts them.

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

    Decode context parallel (``dcp_size``, ``dcp_rank``): the latent rows follow MLA's
    rules (widened ids, this rank's rows only; see :class:`MLATokenToKVPool`), but index
    keys are replicated: every rank keeps one per widened id, so the default index-K
    buffer covers ``token_slots`` ids, index writes take slots in ``[0,
    ceil(token_slots / index_kpool))``, a move copies the index keys of every pair (the
    latent rows of this rank's pairs only) and a host copy carries the index keys of
    every position (the latent rows of this rank's positions only).

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

    A kpool of 2: rows of two slots, slot 3 is row 1's second slot; moves are refused.

        >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4, dtype=torch.bfloat16,
        ...                         qk_rope_head_dim=2, layer_num=1, device="cpu",
        ...                         index_head_dim=128, index_kpool=2)
        >>> pool.index_page_size, tuple(pool.index_k_with_scale_buffer[0].shape)
        (2, (3, 264))
        >>> pool.set_index_k_scale_buffer(0, torch.tensor([3]), key, torch.ones(1, 1))
        >>> pool.get_index_k_with_scale_buffer(0)[1, 128:256].unique().tolist()
        [7]
        >>> copy = pool.get_cpu_copy(torch.tensor([6, 7]))  # both tokens use slot 3
        >>> pool.move_kv_cache(tgt_loc=torch.tensor([9]), src_loc=torch.tensor([5]))
        Traceback (most recent call last):
        ...
        ValueError: move_kv_cache: index_kpool=2: moving pooled index keys needs ...

    Rank 0 of 2: index keys for all 24 widened ids, latent rows for ids 0, 2, 4, ...

        >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4, dtype=torch.bfloat16,
        ...                         qk_rope_head_dim=2, layer_num=1, device="cpu",
        ...                         index_head_dim=128, dcp_size=2, dcp_rank=0)
        >>> pool.index_buf_size, pool.num_index_pages, pool.kv_buffer[0].shape[0]
        (20, 6, 12)
        >>> pool.set_index_k_scale_buffer(0, torch.tensor([23]), key, torch.ones(1, 1))
        >>> pool.move_kv_cache(tgt_loc=torch.tensor([1]), src_loc=torch.tensor([23]))
        >>> pool.get_index_k_with_scale_buffer(0)[0, 128:256].unique().tolist()
        [7]
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
        index_kpool: int = 1,
        index_kpool_compress: bool = False,
        tail_extra_slots: int = 0,
        max_running_requests: int | None = None,
        dcp_size: int = 1,
        dcp_rank: int = 0,
    ) -> None:
        # Validate the DSA arguments before the latent buffers are allocated.
        kpool = _check_kpool(
            page_size, index_kpool, index_kpool_compress, tail_extra_slots, max_running_requests
        )
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
            dcp_size=dcp_size,
            dcp_rank=dcp_rank,
        )
        self.index_head_dim = checked_head_dim
        self.skip_topk_layers = checked_mask
        # SGLang's default: index keys for every widened id (size without DCP).
        self.index_buf_size = (
            self.token_slots - self.page_size if checked_buf_size is None else checked_buf_size
        )
        self.index_kpool = kpool.index_kpool
        self.index_kpool_compress = kpool.index_kpool_compress
        self.tail_extra_slots = kpool.tail_extra_slots
        self.max_running_requests = kpool.max_running_requests
        self.kpool_use_compress = kpool.use_compress
        self.index_page_size = self.page_size // self.index_kpool
        # Rows stay token pages (as SGLang's IndexKeyCache); each holds index_page_size
        # index slots, one per index_kpool tokens.
        self.index_layout = IndexKPageLayout(self.index_page_size, self.index_head_dim)
        self.num_index_pages = (self.index_buf_size + self.page_size + 1) // self.page_size
        self.index_k_with_scale_buffer = [
            self._zeros((self._index_rows(i), self.index_layout.row_bytes), INDEX_K_DTYPE)
            for i in range(self.layer_num)
        ]
        self._compress_tail_k: list[torch.Tensor] | None = None
        self._compress_tail_score: list[torch.Tensor] | None = None
        if self.kpool_use_compress:
            self._compress_tail_k = [
                self._zeros(self._tail_shape(i), TAIL_DTYPE) for i in range(self.layer_num)
            ]
            self._compress_tail_score = [
                self._zeros(self._tail_shape(i), TAIL_DTYPE) for i in range(self.layer_num)
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

    def _index_token_limit(self) -> tuple[int, str]:
        """Location bound (and its reason) for operations that touch index-K: the widened
        ids, ``token_slots``, or fewer when index-K holds fewer tokens.

        Token ``t`` uses index slot ``t // index_kpool``, so the bound is the same for
        every ``index_kpool``: ``num_index_pages * page_size`` tokens."""
        capacity = self.num_index_pages * self.page_size
        if not self._index_layers or capacity >= self.token_slots:
            return self._token_bound()
        return capacity, (
            f"index-K holds token ids [0, {capacity}): num_index_pages={self.num_index_pages}"
            f" of page_size={self.page_size} for index_buf_size={self.index_buf_size}"
        )

    def _index_slot_limit(self) -> tuple[int, str]:
        """Bound of the index slots ``set_index_k_scale_buffer`` takes: the slots of the
        pool's token ids, ``ceil(token_slots / index_kpool)``, and the slots index-K
        holds, ``num_index_pages * index_page_size``."""
        if self.index_kpool == 1:
            return self._index_token_limit()
        tokens = self.token_slots
        slots = -(-tokens // self.index_kpool)
        capacity = self.num_index_pages * self.index_page_size
        named = "num_slots" if self.dcp_size == 1 else "token_slots (widened)"
        return min(slots, capacity), (
            f"index slots: one per index_kpool={self.index_kpool} tokens of {named}="
            f"{tokens} is {slots}; index-K holds num_index_pages={self.num_index_pages}"
            f" rows of index_page_size={self.index_page_size}, {capacity} slots"
        )

    def _tail_shape(self, local: int) -> tuple[int, int, int]:
        requests = self.max_running_requests
        rows = 0 if self.skip_topk_layers[local] or requests is None else requests + 1
        return (rows, self.tail_width, self.index_head_dim)

    @property
    def tail_width(self) -> int:
        """Ring slots of one request's compress tail: ``index_kpool + tail_extra_slots``."""
        return self.index_kpool + self.tail_extra_slots

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
        """Write index slot ``loc[i]``'s key and scales inside its page row.

        A slot is a token id when ``index_kpool == 1``; otherwise slot ``s`` holds the key
        of tokens ``[s * index_kpool, (s + 1) * index_kpool)`` and ``loc`` lies in
        ``[0, ceil(token_slots / index_kpool))`` (and in index-K's slots; ``token_slots``
        is ``num_slots`` without DCP, the widened ids with it: every rank keeps every
        id's index key). Slot ``s`` sits
        in row ``s // index_page_size`` at offset ``s % index_page_size``.

        ``index_k``: ``[n, index_head_dim]`` float8_e4m3fn or uint8. ``index_k_scale``:
        ``[n, index_head_dim // 128]`` float32, or ``[n]`` float32 when that is 1 (SGLang's
        1-D form), or its raw bytes ``[n, index_head_dim // 128 * 4]`` uint8. ``loc``:
        distinct index slots. A skip layer raises ``ValueError``.
        """
        where = "set_index_k_scale_buffer"
        local = self._local_layer(layer_id, where=where)
        if self.skip_topk_layers[local]:
            raise ValueError(
                f"{where}: layer_id={layer_id} is a skip-topk layer (skip_topk_layers[{local}]"
                " is True): it reuses the previous layer's top-k and has no index-K buffer"
            )
        limit, reason = self._index_slot_limit()
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
        With ``index_kpool > 1`` a non-empty move raises ``ValueError`` (after the
        location checks) and changes nothing; an empty one does nothing.

        Locations are widened ids; with ``dcp_size > 1`` each pair must have one owner
        (checked before anything moves), the latent rows of this rank's pairs move (row
        ``tgt // dcp_size`` takes row ``src // dcp_size``) and the index keys of every
        pair move (index keys are replicated on every rank).
        """
        limit, reason = self._index_token_limit()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        self._check_move_owners(tgt, src)
        if tgt.numel() == 0:
            return
        if self.index_kpool > 1:
            # Refused before anything moves: a token shares its index slot with
            # index_kpool - 1 others, so its key cannot follow it alone. (SGLang 0.5.23
            # moves the latent rows first and then fails its assert.)
            raise ValueError(
                f"move_kv_cache: index_kpool={self.index_kpool}: moving pooled index keys"
                f" needs regrouping tokens (one index slot per {self.index_kpool} tokens);"
                " only an empty move is accepted"
            )
        if self.is_meta:
            return
        tgt_rows, src_rows = self._owned_move(tgt, src)
        move_rows(self.kv_buffer, tgt=tgt_rows, src=src_rows)
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

    def _index_slots(self, tokens: torch.Tensor) -> torch.Tensor:
        """The index slot of each token: ``token // index_kpool``."""
        return tokens // self.index_kpool

    def get_cpu_copy(
        self, indices: torch.Tensor, req_pool_index: int | torch.Tensor | None = None
    ) -> KVHostCopy:
        """Copy tokens ``indices`` (any token ids, repeats allowed): each token's latent row
        and, for non-skip layers, its index slot's key and scale bytes.

        Copies are token-granular, as SGLang's callers need (one request's slots: whole
        pages plus a partial last page, several requests concatenated, runs crossing
        pages). Index-K parts hold one row per index, the ``D`` key bytes then ``S``
        scale bytes of slot ``indices[i] // index_kpool`` (``[len(indices), D + S]``
        uint8; with ``index_kpool == 1`` the token's own); skip layers contribute
        zero-row entries. ``indices`` must lie in index-K's tokens while any layer has
        index keys.

        ``indices`` are widened ids; with ``dcp_size > 1`` the run must start
        page-aligned (``indices[j] % dcp_size == j % dcp_size``, else ``ValueError``),
        the latent part holds this rank's positions only (as MLA's) and the index-K part
        every position.

        ``req_pool_index`` (SGLang's name), on a pool with compress tails, also copies
        request ``req_pool_index``'s tail keys and scores of every layer (``None`` for a
        skip layer); it must lie in ``[0, max_running_requests + 1)``. A pool without
        tails ignores it.

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
        where = "get_cpu_copy"
        idx = self._copy_indices(indices, distinct=False, where=where)
        self._check_run(idx, where=where)
        request = self._tail_request(req_pool_index, where=where)
        # Meta rows are shapes only (and torch's meta floor division imports its refs).
        slots = idx if self.is_meta else self._index_slots(idx)
        index_rows = tuple(
            self._to_host(self.index_layout.read(buffer, slots[:0] if skip else slots))
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
            parts={"kv": self._copy_latent_rows(self._run_rows(idx)), "index_k": index_rows},
            tails={} if request is None else self._copy_tails(request),
        )

    def _copy_tails(self, request: int) -> dict[str, tuple[torch.Tensor | None, ...]]:
        """Host copies (never views: later pool writes must not show) of one request's
        tail rows, per layer; ``None`` for a skip layer."""
        assert self._compress_tail_k is not None and self._compress_tail_score is not None
        return {
            name: tuple(
                None if skip else self._host_tail(tail[request])
                for tail, skip in zip(tails, self.skip_topk_layers, strict=True)
            )
            for name, tails in zip(
                TAIL_PARTS, (self._compress_tail_k, self._compress_tail_score), strict=True
            )
        }

    def _host_tail(self, rows: torch.Tensor) -> torch.Tensor:
        # copy=True: on a CPU pool .to("cpu") alone would return a view of the pool.
        return rows.clone() if self.is_meta else rows.to("cpu", copy=True)

    def load_cpu_copy(
        self,
        kv_cache_cpu: KVHostCopy,
        indices: torch.Tensor,
        req_pool_index: int | torch.Tensor | None = None,
    ) -> None:
        """Write copied token ``i`` to token ``indices[i]``: its latent row and, for
        non-skip layers, its key and scale bytes to index slot ``indices[i] //
        index_kpool``. ``indices``: distinct, as many as the copy holds, any token ids
        (they may differ from the copied ones). When two listed tokens share a slot
        (``index_kpool > 1``) the later one's bytes stay. Every slot not written keeps its
        bytes, including the other slots of a written slot's page row.

        ``req_pool_index``, on a pool with compress tails, writes the tails the copy holds
        (if it was taken with a request) to that request slot; a pool without tails
        ignores it. Everything is checked before anything is written.

        With ``dcp_size > 1`` ``indices`` follow :meth:`get_cpu_copy`'s run rule; the
        latent rows of this rank's positions and the index keys of every position are
        written."""
        where = "load_cpu_copy"
        idx = self._copy_indices(indices, distinct=True, where=where)
        self._check_run(idx, where=where)
        request = self._tail_request(req_pool_index, where=where)
        copy = check_host_copy(
            kv_cache_cpu,
            source=type(self).__name__,
            expected=self._host_layout(idx.numel()),
            dtypes={"kv": self.store_dtype, "index_k": INDEX_K_DTYPE},
            where=where,
            num_tokens=idx.numel(),
        )
        tails = None if request is None else self._checked_tails(copy, where=where)
        if self.is_meta:
            return
        self._load_latent_rows(copy.parts["kv"], self._run_rows(idx))
        slots, rows = self._last_per_slot(idx)
        for i in self._index_layers:
            layer_rows = copy.parts["index_k"][i].to(self._torch_device)
            self.index_layout.write_rows(self.index_k_with_scale_buffer[i], slots, layer_rows[rows])
        if tails is not None and request is not None:
            self._load_tails(tails, request)

    def _last_per_slot(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct slots of tokens ``idx`` and, for each, the position of its last token
        in ``idx``: the copy row that slot takes (index_put_ with repeated indices keeps
        an unspecified one)."""
        slots = self._index_slots(idx)
        if self.index_kpool == 1:
            return slots, torch.arange(idx.numel(), device=idx.device)
        unique, inverse = torch.unique(slots, return_inverse=True)
        positions = torch.arange(idx.numel(), device=idx.device)
        last = torch.full_like(unique, -1).scatter_reduce(0, inverse, positions, "amax")
        return unique, last

    def _checked_tails(
        self, copy: KVHostCopy, *, where: str
    ) -> dict[str, tuple[torch.Tensor | None, ...]] | None:
        """The copy's tails when it has some (shapes checked against this pool), else None."""
        if not copy.tails:
            return None
        if set(copy.tails) != set(TAIL_PARTS):
            raise ValueError(
                f"{where}: kv_cache_cpu holds tails {sorted(copy.tails)}, expected"
                f" {sorted(TAIL_PARTS)}"
            )
        shape = (self.tail_width, self.index_head_dim)
        for name in TAIL_PARTS:
            layers = copy.tails[name]
            if len(layers) != self.layer_num:
                raise ValueError(
                    f"{where}: kv_cache_cpu has {len(layers)} layers of {name!r}, expected"
                    f" {self.layer_num}"
                )
            for i, (tail, skip) in enumerate(zip(layers, self.skip_topk_layers, strict=True)):
                if skip and tail is None:
                    continue
                if (
                    skip
                    or not isinstance(tail, torch.Tensor)
                    or tuple(tail.shape) != shape
                    or tail.dtype != TAIL_DTYPE
                ):
                    got = describe(tail) if isinstance(tail, torch.Tensor) else repr(tail)
                    want = "None (skip layer)" if skip else f"shape {shape} and dtype {TAIL_DTYPE}"
                    raise ValueError(
                        f"{where}: kv_cache_cpu tail {name!r} layer {i} must be {want}, got {got}"
                    )
        return dict(copy.tails)

    def _load_tails(self, tails: dict[str, tuple[torch.Tensor | None, ...]], request: int) -> None:
        assert self._compress_tail_k is not None and self._compress_tail_score is not None
        for name, buffers in zip(
            TAIL_PARTS, (self._compress_tail_k, self._compress_tail_score), strict=True
        ):
            for buffer, saved in zip(buffers, tails[name], strict=True):
                if saved is not None:
                    buffer[request] = saved.to(self._torch_device)

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

        ``seq_len_tensor``: 1-D int32/int64 ``[B]``, values ``>= 0``, counting index
        slots (tokens when ``index_kpool == 1``). ``page_indices``: 2-D int32/int64
        ``[B, P]``; row ``b`` lists sequence ``b``'s index page rows in order. Sequence
        ``b``'s slot ``j < seq_len[b]`` lives in row ``page_indices[b, j //
        index_page_size]`` at offset ``j % index_page_size``. ``seq_len_sum`` must equal
        ``sum(seq_len)`` and ``max_seq_len`` be ``>= max(seq_len)`` (0 when ``B == 0``).
        Each used row id (columns ``< ceil(seq_len[b] / index_page_size)``, which must
        exist) must be in ``[0, num_index_pages)``; unused columns are not read. A skip
        layer raises ``ValueError``.

        Returns fresh uint8 tensors ``(k [seq_len_sum, D], scale [seq_len_sum, S])``: row
        ``sum(seq_len[:b]) + j`` holds that slot's key bytes and scale bytes.

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
            page_size=self.index_page_size,
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

    # --- compress tails ------------------------------------------------------------------

    def _require_tails(self, where: str) -> None:
        if not self.kpool_use_compress:
            raise ValueError(
                f"{where}: this pool keeps no compress tails (index_kpool={self.index_kpool},"
                f" index_kpool_compress={self.index_kpool_compress}); they need"
                " index_kpool > 1 and index_kpool_compress=True"
            )

    def _tail_request(self, req_pool_index: object, *, where: str) -> int | None:
        """The validated request slot of a host copy or reload; ``None`` when the pool
        has no tails (the argument is then ignored, as SGLang does) or none was named."""
        if not self.kpool_use_compress or req_pool_index is None:
            return None
        return self._request_slot("req_pool_index", req_pool_index, where=where)

    def _request_slot(self, name: str, value: object, *, where: str) -> int:
        """``value`` (an int or a one-element integer tensor) as a request slot in
        ``[0, max_running_requests + 1)``."""
        requests = (self.max_running_requests or 0) + 1
        if isinstance(value, torch.Tensor):
            dtype = value.dtype
            if (
                value.numel() != 1
                or dtype.is_floating_point
                or dtype.is_complex
                or dtype == torch.bool
            ):
                raise ValueError(
                    f"{where}: {name} must be an int or a one-element integer tensor,"
                    f" got {describe(value)}"
                )
            if value.device.type == "meta":
                raise ValueError(f"{where}: {name} is on meta; its value cannot be read")
            value = int(value.reshape(()).item())
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{where}: {name}={value!r} must be an int or a one-element integer tensor"
            )
        if not 0 <= value < requests:
            raise ValueError(
                f"{where}: {name}={value} not in [0, {requests}) (max_running_requests="
                f"{self.max_running_requests} plus SGLang's spare request slot)"
            )
        return value

    def get_compress_tail_buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Global layer ``layer_id``'s compress-tail buffers ``(keys, scores)`` (the pool's
        tensors, not copies): bfloat16 ``[max_running_requests + 1, tail_width,
        index_head_dim]``, zero rows for a skip layer. ``ValueError`` on a pool without
        tails or for a layer outside the pool.
        """
        where = "get_compress_tail_buffers"
        self._require_tails(where)
        local = self._local_layer(layer_id, where=where)
        assert self._compress_tail_k is not None and self._compress_tail_score is not None
        return self._compress_tail_k[local], self._compress_tail_score[local]

    def set_compress_tail_for_request(
        self,
        layer_id: int,
        req_pool_idx: int | torch.Tensor,
        key_tail: torch.Tensor,
        score_tail: torch.Tensor,
        n_remain: int,
        dst_logical_start: int,
    ) -> None:
        """Write request ``req_pool_idx``'s tail: row ``i < n_remain`` of ``key_tail`` and
        ``score_tail`` goes to ring slot ``(dst_logical_start + i) % tail_width``.

        ``key_tail``/``score_tail``: bfloat16 ``[n_remain, index_head_dim]`` (never
        modified). ``req_pool_idx``: an int or a one-element integer tensor in ``[0,
        max_running_requests + 1)``. ``n_remain`` in ``[0, tail_width]`` (more would write
        a slot twice); 0 writes nothing. ``dst_logical_start``: an int ``>= 0``.
        ``ValueError`` (before any write) on a pool without tails, for a layer outside the
        pool or a skip layer, or for any bad argument.

        Example:
            >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4,
            ...                         dtype=torch.bfloat16, qk_rope_head_dim=2, layer_num=1,
            ...                         device="cpu", index_head_dim=128, index_kpool=2,
            ...                         index_kpool_compress=True, tail_extra_slots=1,
            ...                         max_running_requests=2)
            >>> rows = torch.tensor([[1.0], [2.0]], dtype=torch.bfloat16).expand(2, 128)
            >>> pool.set_compress_tail_for_request(0, 1, rows, -rows, 2, dst_logical_start=2)
            >>> keys, scores = pool.get_compress_tail_buffers(0)
            >>> keys.shape, keys[1, :, 0].tolist(), scores[1, :, 0].tolist()
            (torch.Size([3, 3, 128]), [2.0, 0.0, 1.0], [-2.0, 0.0, -1.0])
        """
        where = "set_compress_tail_for_request"
        self._require_tails(where)
        local = self._local_layer(layer_id, where=where)
        if self.skip_topk_layers[local]:
            raise ValueError(
                f"{where}: layer_id={layer_id} is a skip-topk layer (skip_topk_layers[{local}]"
                " is True): it has no compress tail"
            )
        request = self._request_slot("req_pool_idx", req_pool_idx, where=where)
        width = self.tail_width
        count = require_int("n_remain", n_remain, minimum=0)
        if count > width:
            raise ValueError(
                f"{where}: n_remain={count} must be in [0, {width}] (tail_width = index_kpool"
                f" + tail_extra_slots): more rows would write a ring slot twice"
            )
        start = require_int("dst_logical_start", dst_logical_start, minimum=0)
        shape = (count, self.index_head_dim)
        rows = [
            check_payload(
                name,
                value,
                shape=shape,
                dtypes=(TAIL_DTYPE,),
                device=self._torch_device,
                where=where,
            )
            for name, value in (("key_tail", key_tail), ("score_tail", score_tail))
        ]
        if count == 0 or self.is_meta:
            return
        assert self._compress_tail_k is not None and self._compress_tail_score is not None
        slots = (torch.arange(count, device=self._torch_device) + start) % width
        # Indexed assignment copies the rows in; distinct slots since count <= width.
        for tails, part in zip(
            (self._compress_tail_k, self._compress_tail_score), rows, strict=True
        ):
            tails[local][request, slots] = part.to(self._torch_device)

    def get_compress_tail_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Transfer descriptors of the compress tails, as SGLang's: every layer's key
        buffer, then every layer's score buffer; ``(ptrs, lens, item_lens)`` with
        ``item_len`` one request's bytes (``tail_width * index_head_dim * 2``). A zero-row
        (skip) layer gives ``(0, 0, 0)``; a pool without tails gives ``([], [], [])``.
        On ``meta`` every pointer is 0.

        Example:
            >>> pool = DSATokenToKVPool(size=8, page_size=4, kv_lora_rank=4,
            ...                         dtype=torch.bfloat16, qk_rope_head_dim=2, layer_num=2,
            ...                         device="meta", index_head_dim=128, index_kpool=2,
            ...                         index_kpool_compress=True, max_running_requests=1,
            ...                         skip_topk_layers=[False, True])
            >>> pool.get_compress_tail_buf_infos()
            ([0, 0, 0, 0], [1024, 0, 1024, 0], [512, 0, 512, 0])
        """
        if self._compress_tail_k is None or self._compress_tail_score is None:
            return [], [], []
        ptrs, lens, item_lens = [], [], []
        for buffer in [*self._compress_tail_k, *self._compress_tail_score]:
            empty = buffer.shape[0] == 0
            ptrs.append(0 if empty or self.is_meta else buffer.data_ptr())
            lens.append(buffer.nbytes)
            item_lens.append(0 if empty else buffer[0].nbytes)
        return ptrs, lens, item_lens

    # --- transfer descriptors and accounting ---------------------------------------------

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Index-K transfer descriptors, one entry per local layer (as SGLang's DSA pool).

        Returns ``(ptrs, lens, item_lens)``: the buffer's ``data_ptr()``, its total bytes
        (``num_index_pages * row_bytes``) and the bytes of one page row
        (``index_page_size * (D + S)``). Skip layers give ``(0, 0, 0)``; their entries are kept so
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
        """One ``int``: the bytes of all latent buffers, of all index-K page buffers (skip
        layers add 0) and of all compress-tail buffers, keys and scores (every byte the
        pool allocates; SGLang 0.5.23 leaves the tails out)."""
        tails = [*(self._compress_tail_k or []), *(self._compress_tail_score or [])]
        return (
            super().get_kv_size_bytes()
            + sum(buffer.nbytes for buffer in self.index_k_with_scale_buffer)
            + sum(buffer.nbytes for buffer in tails)
        )

    def check_valid(self) -> None:
        """Assert the latent invariants, one index buffer per layer (empty for skip
        layers) and, with compress tails, one key and one score buffer per layer."""
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
        k_tails, score_tails = self._compress_tail_k, self._compress_tail_score
        self._invariant(
            (k_tails is not None and score_tails is not None) == self.kpool_use_compress,
            f"compress tails allocated={k_tails is not None and score_tails is not None} but"
            f" kpool_use_compress={self.kpool_use_compress}",
        )
        if k_tails is None or score_tails is None:
            return
        tails = {"_compress_tail_k": k_tails, "_compress_tail_score": score_tails}
        self._check_common_invariants(tails)
        for name, buffers in tails.items():
            for i, buffer in enumerate(buffers):
                self._invariant(
                    tuple(buffer.shape) == self._tail_shape(i) and buffer.dtype == TAIL_DTYPE,
                    f"{name}[{i}] is {tuple(buffer.shape)} {buffer.dtype}, expected"
                    f" {self._tail_shape(i)} {TAIL_DTYPE}",
                )
