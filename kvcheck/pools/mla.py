"""``MLATokenToKVPool``: one latent (compressed KV + rope key) buffer per layer."""

from __future__ import annotations

import math

import torch

from kvcheck.pools import _dcp
from kvcheck.pools._dtypes import SUPPORTED_DTYPES
from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._refusals import require_int
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

    Decode context parallel (SGLang's ``--dcp-size``): the pool is rank ``dcp_rank`` of
    ``dcp_size`` ranks (``D``; default 1, off; with ``D > 1`` ``size`` is a multiple of
    ``page_size``). Its buffers keep ``size + page_size`` rows, but writes, moves and host
    copies name tokens by *widened* id ``w`` in ``[0, token_slots)``, ``token_slots =
    (size + page_size) * D``: the rank owns ``w`` when ``w % D == dcp_rank`` and keeps
    its row at ``w // D``. ``set_mla_kv_buffer`` drops the ids of other ranks (as
    SGLang's kernel does), ``set_kv_buffer`` refuses (SGLang has no DCP-aware path for
    it), a move pair must have one owner, and a host-copy run must start page-aligned
    (``indices[j] % D == j % D``). Reads (``get_key_buffer``, ``get_value_buffer``,
    ``get_kv_buffer``, ``get_mla_kv_buffer``) take this rank's physical rows, as
    SGLang's attention reads collapsed ids.

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

    Rank 1 of 2: widened ids 2 and 3 are written, only 3 (row 3 // 2 = 1) is this rank's.

        >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.float32, kv_lora_rank=2,
        ...                         qk_rope_head_dim=1, layer_num=1, device="cpu",
        ...                         dcp_size=2, dcp_rank=1)
        >>> pool.token_slots, pool.kv_buffer[0].shape[0]
        (12, 6)
        >>> nope = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
        >>> pool.set_mla_kv_buffer(None, torch.tensor([2, 3]), nope, torch.zeros(2, 1, 1),
        ...                        layer_id_override=0)
        >>> pool.kv_buffer[0][:, 0, 0].tolist()
        [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
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
        dcp_size: int = 1,
        dcp_rank: int = 0,
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
        self.dcp_size, self.dcp_rank = _dcp.check_dcp_args(
            self.size, self.page_size, dcp_size, dcp_rank
        )
        self.kv_cache_dim = self._latent_row_width()
        self.kv_buffer = [
            self._zeros((self.num_slots, 1, self.kv_cache_dim)) for _ in range(self.layer_num)
        ]

    def _latent_row_width(self) -> int:
        """Storage elements of one latent row: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    # --- decode context parallel ---------------------------------------------------------

    @property
    def token_slots(self) -> int:
        """Token ids writes, moves and host copies take: ``(size + page_size) *
        dcp_size`` widened ids (``num_slots`` without DCP)."""
        return self.num_slots * self.dcp_size

    @property
    def token_page_size(self) -> int:
        """Widened ids in one allocator page: ``page_size * dcp_size``."""
        return self.page_size * self.dcp_size

    def _token_bound(self) -> tuple[int, str]:
        """``(token_slots, reason)``: the bound of widened ids and how an error says it."""
        return self.token_slots, _dcp.bound_reason(self.size, self.page_size, self.dcp_size)

    def _refuse_dcp_write(self, where: str) -> None:
        if self.dcp_size > 1:
            raise RuntimeError(
                f"{where}: dcp_size={self.dcp_size}: there is no DCP-aware write path for"
                " whole latent rows (SGLang asserts the same); use set_mla_kv_buffer, which"
                " takes widened ids and keeps this rank's"
            )

    def _check_run(self, idx: torch.Tensor, *, where: str) -> None:
        _dcp.check_run("indices", idx, dcp_size=self.dcp_size, where=where)

    def _run_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's physical rows of a checked host-copy run."""
        return _dcp.run_rows(idx, dcp_size=self.dcp_size, dcp_rank=self.dcp_rank)

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
        ``cache_v`` is ignored (the latent row holds both), and may be ``None``. With
        ``dcp_size > 1`` it raises ``RuntimeError`` after the argument checks and writes
        nothing: use :meth:`set_mla_kv_buffer`.

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
        self._refuse_dcp_write(where)
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
        :meth:`set_kv_buffer`, except that ``loc`` holds widened ids in ``[0,
        token_slots)``: with ``dcp_size > 1`` an id this rank owns writes row ``loc[i] //
        dcp_size`` and the others are dropped (see the class docstring).

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
        limit, reason = self._token_bound()
        loc = self._locations(
            "loc", loc, distinct=True, where=where, limit=limit, limit_reason=reason
        )
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
        rows = self._latent_rows(nope, rope, where=where)
        if self.dcp_size > 1:
            owned = _dcp.owned_mask(loc, dcp_size=self.dcp_size, dcp_rank=self.dcp_rank)
            loc, rows = loc[owned] // self.dcp_size, rows[owned]
        scatter_rows(self.kv_buffer[local], loc, rows)

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

        ``loc``: 1-D int32/int64 in ``[0, size + page_size)`` (repeats allowed): physical
        rows of this rank also under DCP (SGLang's attention reads collapsed ids).
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
        Locations are widened ids in ``[0, token_slots)``; with ``dcp_size > 1`` each pair
        must have one owner (``tgt % dcp_size == src % dcp_size``, else ``ValueError``
        before anything moves) and only this rank's pairs move, row ``tgt // dcp_size``
        taking row ``src // dcp_size``.

        Example:
            >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.float32,
            ...                         kv_lora_rank=1, qk_rope_head_dim=0, layer_num=1,
            ...                         device="cpu", dcp_size=2, dcp_rank=0)
            >>> pool.kv_buffer[0][:, 0, 0] = torch.arange(6.0)
            >>> pool.move_kv_cache(torch.tensor([0, 1]), torch.tensor([10, 3]))
            >>> pool.kv_buffer[0][:, 0, 0].tolist()  # row 0 took row 5; id 1 is rank 1's
            [5.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        """
        limit, reason = self._token_bound()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        self._check_move_owners(tgt, src)
        if self.is_meta or tgt.numel() == 0:
            return
        tgt_rows, src_rows = self._owned_move(tgt, src)
        move_rows(self.kv_buffer, tgt=tgt_rows, src=src_rows)

    def _check_move_owners(self, tgt: torch.Tensor, src: torch.Tensor) -> None:
        _dcp.check_same_owner(tgt, src, dcp_size=self.dcp_size, where="move_kv_cache")

    def _owned_move(
        self, tgt: torch.Tensor, src: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The physical ``(tgt, src)`` rows of this rank's pairs of a checked move."""
        return _dcp.owned_pairs(tgt, src, dcp_size=self.dcp_size, dcp_rank=self.dcp_rank)

    # --- host copies ---------------------------------------------------------------------

    def _latent_host_layout(self, num_tokens: int) -> list[tuple[int, ...]]:
        """Latent rows of a host copy of ``num_tokens`` ids: this rank's positions."""
        rows = _dcp.run_count(num_tokens, dcp_size=self.dcp_size, dcp_rank=self.dcp_rank)
        return [(rows, 1, self.kv_cache_dim)] * self.layer_num

    def _copy_latent_rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._to_host(gather_rows(buffer, idx)) for buffer in self.kv_buffer)

    def _load_latent_rows(self, rows: tuple[torch.Tensor, ...], idx: torch.Tensor) -> None:
        for buffer, layer_rows in zip(self.kv_buffer, rows, strict=True):
            scatter_rows(buffer, idx, layer_rows.to(self._torch_device))

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy slots ``indices`` (may repeat) of every layer's latent buffer to the CPU.

        ``indices`` are widened ids in ``[0, token_slots)``. With ``dcp_size > 1`` the run
        must start page-aligned (``indices[j] % dcp_size == j % dcp_size``, else
        ``ValueError``) and the copy holds this rank's positions ``j % dcp_size ==
        dcp_rank`` only, rows ``indices[j] // dcp_size``.

        Example:
            >>> pool = MLATokenToKVPool(size=4, page_size=2, dtype=torch.float32,
            ...                         kv_lora_rank=1, qk_rope_head_dim=0, layer_num=1,
            ...                         device="cpu", dcp_size=2, dcp_rank=1)
            >>> pool.kv_buffer[0][:, 0, 0] = torch.arange(6.0)
            >>> copy = pool.get_cpu_copy(torch.tensor([4, 5, 6, 7, 8]))
            >>> copy.num_tokens, copy.parts["kv"][0][:, 0, 0].tolist()  # ids 5 and 7
            (5, [2.0, 3.0])
        """
        where = "get_cpu_copy"
        limit, reason = self._token_bound()
        idx = self._locations(
            "indices", indices, distinct=False, where=where, limit=limit, limit_reason=reason
        )
        self._check_run(idx, where=where)
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={"kv": self._copy_latent_rows(self._run_rows(idx))},
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i`` to slot ``indices[i]`` (distinct, same count as copied).

        ``indices`` follow :meth:`get_cpu_copy`'s rules (widened, a page-aligned run under
        DCP); with ``dcp_size > 1`` only this rank's positions are written, to rows
        ``indices[j] // dcp_size``."""
        where = "load_cpu_copy"
        limit, reason = self._token_bound()
        idx = self._locations(
            "indices", indices, distinct=True, where=where, limit=limit, limit_reason=reason
        )
        self._check_run(idx, where=where)
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
        self._load_latent_rows(copy.parts["kv"], self._run_rows(idx))

    # --- accounting ----------------------------------------------------------------------

    def get_kv_size_bytes(self) -> int:
        """Bytes of all latent buffers, one ``int`` (SGLang 0.5.23 returns one number
        for MLA: ``layer_num * (size + page_size) * kv_cache_dim * itemsize``, per rank
        also under DCP)."""
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
        self._invariant(
            0 <= self.dcp_rank < self.dcp_size,
            f"dcp_rank={self.dcp_rank} not in [0, dcp_size={self.dcp_size})",
        )
        expected = (self.num_slots, 1, self.kv_cache_dim)
        for i, buffer in enumerate(self.kv_buffer):
            self._invariant(
                tuple(buffer.shape) == expected and buffer.dtype == self.store_dtype,
                f"kv_buffer[{i}] is {tuple(buffer.shape)} {buffer.dtype},"
                f" expected {expected} {self.store_dtype}",
            )
