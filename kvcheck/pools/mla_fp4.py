"""``MLATokenToKVPoolFP4``: SGLang 0.5.23's FP4 MLA pool, with its scales kept as state.

Each layer holds the latent row (``kv_lora_rank + qk_rope_head_dim`` values) packed as e2m1
codes, two a byte, in ``kv_buffer`` ``[rows, 1, (R + P) // 2]`` uint8, and one exponent byte
per block of 16 values in ``kv_scale_buffer`` ``[rows, (R + P) // 16]`` uint8: SGLang's
``fp4_mx_block16`` encoding (for ``--kv-cache-dtype`` ``fp4_mx_block16`` and ``nvfp4``
alike). Moves, host copies, ``get_kv_size_bytes`` and ``get_kv_scale_buf_infos`` carry the
scales with their payload (kvcheck's contract; SGLang's findings Q2-Q4).

Example:
    >>> from types import SimpleNamespace
    >>> pool = MLATokenToKVPoolFP4(size=4, page_size=2, dtype=torch.float4_e2m1fn_x2,
    ...                            kv_lora_rank=16, qk_rope_head_dim=16, layer_num=1,
    ...                            device="cpu")
    >>> pool.kv_buffer[0].shape, pool.kv_scale_buffer[0].shape
    (torch.Size([6, 1, 16]), torch.Size([6, 2]))
    >>> nope = torch.full((1, 1, 16), 1.5, dtype=torch.bfloat16)
    >>> pool.set_mla_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([3]), nope, -nope)
    >>> pool.move_kv_cache(torch.tensor([4]), torch.tensor([3]))
    >>> pool.kv_scale_buffer[0][4].tolist(), pool.get_key_buffer(0)[4, 0, 15:17].tolist()
    ([125, 125], [1.5, -1.5])
    >>> pool.get_kv_size_bytes()
    108
"""

from __future__ import annotations

import math

import torch

from kvcheck.pools import _quant
from kvcheck.pools._dtypes import FLOAT_PAYLOAD_DTYPES, FP4_DTYPE, SUPPORTED_DTYPES
from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._refusals import check_payload
from kvcheck.pools.mla import MLATokenToKVPool

_BLOCK = 16


class MLATokenToKVPoolFP4(MLATokenToKVPool):
    """FP4 latent rows with their block scales (see the module docstring).

    ``set_kv_buffer`` takes whole rows ``[n, 1, R + P]`` and ``set_mla_kv_buffer`` their
    nope ``[n, 1, R]`` and rope ``[n, 1, P]`` parts (``None`` when ``P == 0``), in bf16,
    fp16 or fp32, encoded row by row (each part is whole blocks, so both give the same
    bytes). ``get_key_buffer`` returns the layer dequantized to bf16 ``[rows, 1, R + P]``,
    ``get_value_buffer`` its first ``kv_lora_rank`` channels, ``get_mla_kv_buffer`` the
    dequantized parts of the given slots (bf16 unless ``dst_dtype``). ``kv_lora_rank`` and
    ``qk_rope_head_dim`` are multiples of 16; no decode context parallel.
    """

    _POOL_DTYPES = (FP4_DTYPE,)

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
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
        )
        self.kv_scale_buffer = [
            self._zeros((self.num_slots, self._width // _BLOCK)) for _ in range(self.layer_num)
        ]

    @property
    def _width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def _latent_row_width(self) -> int:
        """Bytes of one packed latent row: two values a byte."""
        for name, value in (
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
        ):
            if value % _BLOCK:
                raise ValueError(f"MLA FP4 needs {name} a multiple of {_BLOCK}, got {value}")
        return self._width // 2

    # --- reads -------------------------------------------------------------------------------

    def _dequantized(self, local: int, loc: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, 1, R + P]`` bf16 values of rows ``loc`` (every row when None)."""
        packed, scales = self.kv_buffer[local], self.kv_scale_buffer[local]
        if loc is not None:
            packed, scales = packed.index_select(0, loc), scales.index_select(0, loc)
        values = _quant.fp4_block16_dequantize(packed.reshape(packed.shape[0], -1), scales)
        return values.reshape(packed.shape[0], 1, self._width)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s latent rows dequantized to bf16 (a new tensor)."""
        return self._dequantized(self._local_layer(layer_id, where="get_key_buffer"))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The first ``kv_lora_rank`` dequantized channels of layer ``layer_id``'s rows."""
        local = self._local_layer(layer_id, where="get_value_buffer")
        return self._dequantized(local)[..., : self.kv_lora_rank]

    def get_mla_kv_buffer(
        self, layer: object, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(nope, rope)`` of rows ``loc`` (repeats allowed), dequantized, as ``dst_dtype``
        (default bf16); rope is ``None`` when ``qk_rope_head_dim == 0``."""
        where = "get_mla_kv_buffer"
        local = self._layer_of(layer, where=where)
        loc = self._locations("loc", loc, distinct=False, where=where)
        if dst_dtype is not None and dst_dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{where}: dst_dtype={dst_dtype!r} is not a supported dtype")
        rows = self._dequantized(local, loc).to(dst_dtype or torch.bfloat16)
        nope = rows[..., : self.kv_lora_rank].contiguous()
        if self.qk_rope_head_dim == 0:
            return nope, None
        return nope, rows[..., self.kv_lora_rank :].contiguous()

    # --- writes ------------------------------------------------------------------------------

    def _float_part(self, name: str, value: object, width: int, n: int, where: str) -> torch.Tensor:
        return check_payload(
            name,
            value,
            shape=(n, 1, width),
            dtypes=FLOAT_PAYLOAD_DTYPES,
            device=self._torch_device,
            where=where,
        )

    def _store_rows(self, local: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        packed, scales = _quant.fp4_block16_quantize(rows.reshape(loc.numel(), -1))
        self.kv_buffer[local].index_copy_(0, loc, packed.reshape(loc.numel(), 1, -1))
        self.kv_scale_buffer[local].index_copy_(0, loc, scales)

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: object = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Encode latent rows ``cache_k[i]`` (``[len(loc), 1, R + P]``, bf16/fp16/fp32) into
        slot ``loc[i]``'s payload and scales; ``cache_v`` is ignored."""
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=False)
        loc = self._locations("loc", loc, distinct=True, where=where)
        rows = self._float_part("cache_k", cache_k, self._width, loc.numel(), where)
        if self.is_meta or loc.numel() == 0:
            return
        self._store_rows(local, loc, rows)

    def set_mla_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor | None,
        layer_id_override: int | None = None,
    ) -> None:
        """Encode latent row ``loc[i]`` from its nope and rope parts (one float dtype)."""
        where = "set_mla_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=False)
        loc = self._locations("loc", loc, distinct=True, where=where)
        n = loc.numel()
        nope = self._float_part("cache_k_nope", cache_k_nope, self.kv_lora_rank, n, where)
        if cache_k_rope is None and self.qk_rope_head_dim:
            raise ValueError(f"{where}: cache_k_rope may be None only when qk_rope_head_dim == 0")
        parts = [nope]
        if cache_k_rope is not None:
            rope = self._float_part("cache_k_rope", cache_k_rope, self.qk_rope_head_dim, n, where)
            if self.qk_rope_head_dim and rope.dtype != nope.dtype:
                raise ValueError(f"{where}: cache_k_rope has dtype {rope.dtype}, not {nope.dtype}")
            parts.append(rope)
        if self.is_meta or n == 0:
            return
        self._store_rows(local, loc, torch.cat(parts, dim=-1).float())

    # --- moves, host copies, accounting ------------------------------------------------------

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy slot ``src_loc[i]``'s payload and scales to ``tgt_loc[i]`` in every layer
        (gather, then scatter; targets distinct)."""
        tgt, src = self._move_locations(tgt_loc, src_loc)
        if self.is_meta or tgt.numel() == 0:
            return
        for buffer in (*self.kv_buffer, *self.kv_scale_buffer):
            buffer.index_copy_(0, tgt, buffer.index_select(0, src))

    def _fp4_host_layout(self, num_tokens: int) -> dict[str, list[tuple[int, ...]]]:
        return {
            "kv": [(num_tokens, 1, self.kv_cache_dim)] * self.layer_num,
            "kv_scale": [(num_tokens, self._width // _BLOCK)] * self.layer_num,
        }

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy slots ``indices`` (may repeat) of every layer to the CPU: the packed rows
        (``"kv"``) and their scales (``"kv_scale"``)."""
        idx = self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={
                "kv": tuple(self._to_host(b.index_select(0, idx)) for b in self.kv_buffer),
                "kv_scale": tuple(
                    self._to_host(b.index_select(0, idx)) for b in self.kv_scale_buffer
                ),
            },
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i``'s payload and scales to slot ``indices[i]`` (distinct)."""
        where = "load_cpu_copy"
        idx = self._locations("indices", indices, distinct=True, where=where)
        layout = self._fp4_host_layout(idx.numel())
        copy = check_host_copy(
            kv_cache_cpu,
            source=type(self).__name__,
            expected=layout,
            dtypes=dict.fromkeys(layout, torch.uint8),
            where=where,
            num_tokens=idx.numel(),
        )
        if self.is_meta:
            return
        for name, buffers in (("kv", self.kv_buffer), ("kv_scale", self.kv_scale_buffer)):
            for buffer, rows in zip(buffers, copy.parts[name], strict=True):
                buffer.index_copy_(0, idx, rows.to(self._torch_device))

    def get_kv_size_bytes(self) -> int:
        """Bytes of every layer's payload and scale buffers, one int."""
        return sum(buffer.nbytes for buffer in (*self.kv_buffer, *self.kv_scale_buffer))

    def get_kv_scale_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Transfer descriptors ``(ptrs, lens, item_lens)`` of the scale buffers, one per
        local layer: pointer (0 on ``meta``), bytes, and one page of rows."""
        ptrs, lens, item_lens = [], [], []
        for buffer in self.kv_scale_buffer:
            row = math.prod(buffer.shape[1:])
            ptrs.append(0 if self.is_meta else buffer.data_ptr())
            lens.append(buffer.shape[0] * row)
            item_lens.append(self.page_size * row)
        return ptrs, lens, item_lens

    def check_valid(self) -> None:
        """Assert one payload and one scale buffer per layer with the documented shapes."""
        super().check_valid()
        self._check_common_invariants({"kv_scale_buffer": self.kv_scale_buffer})
        expected = (self.num_slots, self._width // _BLOCK)
        for i, buffer in enumerate(self.kv_scale_buffer):
            self._invariant(
                tuple(buffer.shape) == expected and buffer.dtype == torch.uint8,
                f"kv_scale_buffer[{i}] is {tuple(buffer.shape)} {buffer.dtype},"
                f" expected {expected}",
            )
