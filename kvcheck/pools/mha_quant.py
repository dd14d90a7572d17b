"""Quantized MHA pools: SGLang 0.5.23's KV-cache quant methods and its MXFP8 pool.

:class:`QuantizedMHATokenToKVPool` is ``MHATokenToKVPool`` with a quant method, by SGLang's
names: ``cpu_fp8_e4m3`` (K/V stored as float8_e4m3fn, divided by the caller's scales),
``fp4_mx_block16`` (packed e2m1 values, one exponent byte per 16 values of the flattened
heads) and ``nvfp4`` (packed e2m1, one e4m3 scale per 16 values of a head against the
layer's global scale, in token-linear and/or TRT-LLM's native layout, with the shared fp8
dequant workspace where FlashInfer prefill needs it). :class:`MHATokenToKVPoolMXFP8`
keeps fp8 values with one e8m0 scale per 32, interleaved in FA4's layout on 128-token pages
and token-major otherwise.

Scales are state: every method that writes, moves, copies, counts or describes a token's
payload does the same for its scales (kvcheck's contract; SGLang's findings Q2-Q6 say where
it does not). Buffers are allocated one by one (no fused K/V halves), token-major (NHD), and
``v_head_dim`` shapes V and its scales everywhere.

Example:
    >>> from types import SimpleNamespace
    >>> pool = QuantizedMHATokenToKVPool(size=8, page_size=4, dtype=torch.float4_e2m1fn_x2,
    ...     head_num=2, head_dim=16, layer_num=1, device="cpu", quant_method="fp4_mx_block16")
    >>> pool.k_buffer[0].shape, pool.k_scale_buffer[0].shape
    (torch.Size([12, 2, 8]), torch.Size([12, 2]))
    >>> k = torch.full((1, 2, 16), 3.0, dtype=torch.bfloat16)
    >>> pool.set_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([5]), k, k)
    >>> pool.move_kv_cache(torch.tensor([6]), torch.tensor([5]))
    >>> pool.k_scale_buffer[0][6].tolist(), pool.get_key_buffer(0)[6, 0, :2].tolist()
    ([126, 126], [3.0, 3.0])
    >>> pool.get_kv_size_bytes()
    (216, 216)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvcheck.pools import _quant
from kvcheck.pools._dtypes import FLOAT_PAYLOAD_DTYPES, FP4_DTYPE
from kvcheck.pools._host_copy import KVHostCopy, check_host_copy
from kvcheck.pools._refusals import check_payload, check_prefix_grid, check_scale
from kvcheck.pools.mha import MHATokenToKVPool

#: SGLang's quant-method names, and the cache dtype each takes.
QUANT_METHODS: dict[str, torch.dtype] = {
    "cpu_fp8_e4m3": torch.float8_e4m3fn,
    "fp4_mx_block16": FP4_DTYPE,
    "nvfp4": FP4_DTYPE,
}
#: NVFP4 scale layouts (see :data:`kvcheck.specs.NVFP4_LAYOUTS`).
NVFP4_LAYOUTS: tuple[str, ...] = ("linear+dq", "both+dq", "linear", "native")
#: MXFP8 keeps FA4's interleaved scale layout on pages of this many tokens.
MXFP8_INTERLEAVED_PAGE = 128
_PARTS = ("k", "v")


class _ScaledBuffers(MHATokenToKVPool):
    """What every quantized MHA pool shares: payload buffers (``k_buffer``, ``v_buffer``)
    and scale buffers, each with the :class:`~kvcheck.pools._quant.ScaleLayout` that says
    where a token's scales live; moves, host copies and accounting of both together."""

    #: scale buffer attribute -> (part "k"/"v", layout); set by ``_create_buffers``.
    _scale_layouts: dict[str, tuple[str, _quant.ScaleLayout]]

    @property
    def fused_kv(self) -> bool:
        """Never: each quantized buffer is an allocation of its own (SGLang's)."""
        return False

    def _payload_dim(self, part: str) -> int:
        return self.head_dim if part == "k" else self.v_head_dim

    def _zeros_of(self, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        return [self._zeros(shape, dtype) for _ in range(self.layer_num)]

    def _scale_buffers(self) -> dict[str, list[torch.Tensor]]:
        return {name: getattr(self, name) for name in self._scale_layouts}

    def _workspaces(self) -> list[torch.Tensor]:
        return [
            buffer
            for buffer in (getattr(self, "dq_k_buffer", None), getattr(self, "dq_v_buffer", None))
            if buffer is not None
        ]

    # --- stores ----------------------------------------------------------------------------

    def _store(
        self,
        local: int,
        loc: torch.Tensor,
        payload: dict[str, torch.Tensor],
        scales: dict[str, torch.Tensor],
    ) -> None:
        """Write token rows ``payload[part]`` (storage bytes ``[n, ...]``) and their scale
        bytes ``scales[part]`` (``[n, heads, blocks]``) to slots ``loc`` of one layer."""
        for part, rows in payload.items():
            buffer = getattr(self, f"{part}_buffer")[local]
            buffer.view(torch.uint8).index_copy_(0, loc, rows.view(torch.uint8))
        for name, (part, layout) in self._scale_layouts.items():
            layout.scatter(getattr(self, name)[local].view(torch.uint8), loc, scales[part])

    def _token_scales(self, local: int, loc: torch.Tensor) -> dict[str, torch.Tensor]:
        """Tokens ``loc``'s scale bytes per part, read from the first layout that has them."""
        found: dict[str, torch.Tensor] = {}
        for name, (part, layout) in self._scale_layouts.items():
            if part not in found:
                found[part] = layout.gather(getattr(self, name)[local].view(torch.uint8), loc)
        return found

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy slot ``src_loc[i]`` to ``tgt_loc[i]`` in every layer: payload and scales, in
        every layout (all sources are read before any target is written; targets
        distinct; empty locations are a no-op)."""
        tgt, src = self._move_locations(tgt_loc, src_loc)
        if self.is_meta or tgt.numel() == 0:
            return
        for local in range(self.layer_num):
            payload = {
                part: getattr(self, f"{part}_buffer")[local].view(torch.uint8).index_select(0, src)
                for part in _PARTS
            }
            self._store(local, tgt, payload, self._token_scales(local, src))

    # --- host copies -----------------------------------------------------------------------

    def _host_layout(self, num_tokens: int) -> dict[str, list[tuple[int, ...]]]:
        layout: dict[str, list[tuple[int, ...]]] = {}
        for part in _PARTS:
            row = tuple(getattr(self, f"{part}_buffer")[0].shape[1:])
            layout[part] = [(num_tokens, *row)] * self.layer_num
        for part, scale in self._scale_layouts.values():
            shape = (num_tokens, scale.heads, scale.blocks)
            layout.setdefault(f"{part}_scale", [shape] * self.layer_num)
        return layout

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Copy slots ``indices`` (may repeat) of every layer to the CPU: payload rows
        (``"k"``, ``"v"``, storage bytes) and their scale bytes (``"k_scale"``,
        ``"v_scale"``: ``[tokens, heads, blocks]``, whatever layout the pool keeps)."""
        idx = self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in self._host_layout(0)}
        for local in range(self.layer_num):
            for part in _PARTS:
                buffer = getattr(self, f"{part}_buffer")[local].view(torch.uint8)
                parts[part].append(self._to_host(buffer.index_select(0, idx)))
            if self.is_meta:
                for name, shapes in self._host_layout(idx.numel()).items():
                    if name.endswith("_scale"):
                        parts[name].append(torch.empty(shapes[0], dtype=torch.uint8, device="meta"))
                continue
            for part, rows in self._token_scales(local, idx).items():
                parts[f"{part}_scale"].append(self._to_host(rows))
        return KVHostCopy(
            source=type(self).__name__,
            num_tokens=idx.numel(),
            parts={name: tuple(layers) for name, layers in parts.items()},
        )

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        """Write copied token ``i`` (payload and scales) to slot ``indices[i]`` (distinct;
        as many as were copied), in every layout the pool keeps."""
        where = "load_cpu_copy"
        idx = self._locations("indices", indices, distinct=True, where=where)
        layout = self._host_layout(idx.numel())
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
        device = self._torch_device
        for local in range(self.layer_num):
            payload = {part: copy.parts[part][local].to(device) for part in _PARTS}
            scales = {
                part: copy.parts[f"{part}_scale"][local].to(device)
                for part in _PARTS
                if f"{part}_scale" in copy.parts
            }
            self._store(local, idx, payload, scales)

    # --- accounting and descriptors ----------------------------------------------------------

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)``: every K (V) payload and scale buffer, in every layout,
        plus the dequant workspace's K (V) half when the pool keeps one."""
        sizes = []
        for part in _PARTS:
            tensors = list(getattr(self, f"{part}_buffer"))
            for name, (owner, _) in self._scale_layouts.items():
                if owner == part:
                    tensors += getattr(self, name)
            workspace = getattr(self, f"dq_{part}_buffer", None)
            if workspace is not None:
                tensors.append(workspace)
            sizes.append(sum(tensor.numel() * tensor.element_size() for tensor in tensors))
        return sizes[0], sizes[1]

    def get_kv_scale_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Transfer descriptors ``(ptrs, lens, item_lens)`` of the scale buffers (every
        layer's K scales, then V scales, for each layout the pool keeps): ``data_ptr()``
        (0 on ``meta``), the buffer's bytes, and one page: ``page_size`` rows of a
        token-major buffer, one leading row of a paged one (SGLang's MXFP8 descriptors).

        Example:
            >>> pool = MHATokenToKVPoolMXFP8(size=8, page_size=4, dtype=torch.float8_e4m3fn,
            ...                              head_num=1, head_dim=64, layer_num=1, device="meta")
            >>> pool.get_kv_scale_buf_infos()
            ([0, 0], [24, 24], [8, 8])
        """
        ptrs, lens, item_lens = [], [], []
        for name, (_, layout) in self._scale_layouts.items():
            for buffer in getattr(self, name):
                row = math.prod(buffer.shape[1:]) * buffer.element_size()
                ptrs.append(0 if self.is_meta else buffer.data_ptr())
                lens.append(buffer.shape[0] * row)
                item_lens.append(row * (self.page_size if layout.kind == "token" else 1))
        return ptrs, lens, item_lens

    def check_valid(self) -> None:
        """Assert one payload and one buffer per scale layout per layer, on the device."""
        buffers = {"k_buffer": self.k_buffer, "v_buffer": self.v_buffer}
        buffers.update(self._scale_buffers())
        self._check_common_invariants(buffers)
        for part in _PARTS:
            for i, buffer in enumerate(getattr(self, f"{part}_buffer")):
                self._invariant(
                    buffer.shape[0] == self.num_slots and buffer.dtype == self.store_dtype,
                    f"{part}_buffer[{i}] is {tuple(buffer.shape)} {buffer.dtype}, expected"
                    f" {self.num_slots} rows of {self.store_dtype}",
                )

    # --- argument checks ---------------------------------------------------------------------

    def _float_payloads(
        self, cache_k: object, cache_v: object, n: int, where: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` K and V rows in one float dtype (bf16, fp16 or fp32), to be encoded."""
        shapes = {"k": (n, self.head_num, self.head_dim), "v": (n, self.head_num, self.v_head_dim)}
        k, v = (
            check_payload(
                f"cache_{part}",
                value,
                shape=shapes[part],
                dtypes=FLOAT_PAYLOAD_DTYPES,
                device=self._torch_device,
                where=where,
            )
            for part, value in zip(_PARTS, (cache_k, cache_v), strict=True)
        )
        if k.dtype != v.dtype:
            raise ValueError(
                f"{where}: cache_v has dtype {v.dtype} but cache_k has {k.dtype}; the pool"
                " encodes K and V of one dtype"
            )
        return k, v


class QuantizedMHATokenToKVPool(_ScaledBuffers):
    """``MHATokenToKVPool`` with one of SGLang's KV-cache quant methods (``quant_method``).

    - ``"cpu_fp8_e4m3"`` (dtype float8_e4m3fn): ``k_buffer``/``v_buffer`` ``[rows, H, D]``
      float8_e4m3fn, no scales; a write stores ``(x / k_scale).to(float8_e4m3fn)`` (scale
      1 when None; saturating); reads return the fp8 buffers.
    - ``"fp4_mx_block16"`` (dtype float4_e2m1fn_x2): payload ``[rows, H, D // 2]`` uint8,
      ``k_scale_buffer``/``v_scale_buffer`` ``[rows, H * D // 16]`` uint8 (one exponent byte
      per block of 16 values of the flattened heads); ``k_scale``/``v_scale`` are ignored
      (the block scales carry the magnitude, as in SGLang); ``get_key_buffer`` and
      ``get_value_buffer`` return the layer dequantized to bf16 (a new tensor).
    - ``"nvfp4"`` (dtype float4_e2m1fn_x2): payload ``[rows, H, D // 2]`` uint8, e4m3 block
      scales per head in the layouts ``nvfp4_layout`` names (``k_scale_buffer`` ``[rows,
      H, D // 16]``, ``native_k_scale_buffer`` ``[pages, H, page_size, D // 16]``, V's
      swizzled), and with ``+dq`` the shared fp8 ``dq_k_buffer``/``dq_v_buffer`` ``[rows,
      H, D]`` (scratch for prefill, counted in ``get_kv_size_bytes``). ``k_scale``/
      ``v_scale`` are the global scales (default: the layer's, 1.0); ``get_key_buffer``
      returns the packed bytes viewed as float4_e2m1fn_x2.

    ``rows = size + page_size``; V uses ``v_head_dim``. Writes take bf16, fp16 or fp32
    payloads (``set_kv_buffer``, ``set_kv_buffer_prefix_valid``) and never touch them.
    """

    _POOL_DTYPES = (torch.float8_e4m3fn, FP4_DTYPE)

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
        quant_method: str = "fp4_mx_block16",
        nvfp4_layout: str = "linear+dq",
    ) -> None:
        if quant_method not in QUANT_METHODS:
            raise ValueError(f"quant_method={quant_method!r} not in {tuple(QUANT_METHODS)}")
        if dtype != QUANT_METHODS[quant_method]:
            raise ValueError(
                f"quant_method={quant_method!r} needs dtype={QUANT_METHODS[quant_method]},"
                f" got dtype={dtype!r}"
            )
        if nvfp4_layout not in NVFP4_LAYOUTS:
            raise ValueError(f"nvfp4_layout={nvfp4_layout!r} not in {NVFP4_LAYOUTS}")
        self.quant_method = quant_method
        self.nvfp4_layout = nvfp4_layout
        super().__init__(
            size,
            page_size,
            dtype,
            head_num,
            head_dim,
            layer_num,
            device,
            enable_memory_saver,
            v_head_dim,
            start_layer,
            end_layer,
        )
        #: NVFP4's per-layer global scales (SGLang's ``k_scales_gpu``: 1.0 without a
        #: calibrated checkpoint), by local layer.
        self.k_global_scales = [1.0] * self.layer_num
        self.v_global_scales = [1.0] * self.layer_num

    def _check_dims(self) -> None:
        block = 16 if self.quant_method != "cpu_fp8_e4m3" else 1
        for name, dim in (("head_dim", self.head_dim), ("v_head_dim", self.v_head_dim)):
            width = dim if self.quant_method == "nvfp4" else self.head_num * dim
            if width % block:
                raise ValueError(
                    f"quant_method={self.quant_method!r}: {name}={dim} with head_num="
                    f"{self.head_num} does not split into blocks of {block}"
                )
        if self.quant_method == "nvfp4" and "native" in self._nvfp4_scales():
            if self.head_dim % 64 or self.v_head_dim % 64 or self.page_size % 4:
                raise ValueError(
                    "native NVFP4 scales need head_dim and v_head_dim multiples of 64 and"
                    f" page_size % 4 == 0, got {self.head_dim}, {self.v_head_dim},"
                    f" page_size={self.page_size}"
                )
            if self.num_slots % self.page_size:
                raise ValueError(
                    f"native NVFP4 scales need whole pages: size={self.size} is not a multiple"
                    f" of page_size={self.page_size}"
                )

    def _nvfp4_scales(self) -> tuple[str, ...]:
        scales = self.nvfp4_layout.removesuffix("+dq")
        return ("linear", "native") if scales == "both" else (scales,)

    def _create_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self.kv_layout != "nhd":
            raise ValueError("quantized MHA pools are token-major only (kv_layout='nhd')")
        self._check_dims()
        rows, heads = self.num_slots, self.head_num
        self._scale_layouts = {}
        self.k_scale_buffer = self.v_scale_buffer = None
        self.native_k_scale_buffer = self.native_v_scale_buffer = None
        self.dq_k_buffer = self.dq_v_buffer = None
        if self.quant_method == "cpu_fp8_e4m3":
            self.store_dtype = torch.float8_e4m3fn
            return (
                self._zeros_of((rows, heads, self.head_dim), self.store_dtype),
                self._zeros_of((rows, heads, self.v_head_dim), self.store_dtype),
            )
        payload = [
            self._zeros_of((rows, heads, self._payload_dim(p) // 2), torch.uint8) for p in _PARTS
        ]
        for part in _PARTS:
            dim = self._payload_dim(part)
            if self.quant_method == "fp4_mx_block16":
                layout = _quant.ScaleLayout("token", 1, heads * dim // 16)
                setattr(
                    self,
                    f"{part}_scale_buffer",
                    self._zeros_of((rows, heads * dim // 16), torch.uint8),
                )
                self._scale_layouts[f"{part}_scale_buffer"] = (part, layout)
                continue
            if "linear" in self._nvfp4_scales():
                layout = _quant.ScaleLayout("token", heads, dim // 16)
                setattr(
                    self,
                    f"{part}_scale_buffer",
                    self._zeros_of((rows, heads, dim // 16), torch.uint8),
                )
                self._scale_layouts[f"{part}_scale_buffer"] = (part, layout)
            if "native" in self._nvfp4_scales():
                page = self.page_size
                layout = _quant.ScaleLayout(f"native_{part}", heads, dim // 16, page)
                shape = (rows // page, heads, page, dim // 16)
                setattr(self, f"native_{part}_scale_buffer", self._zeros_of(shape, torch.uint8))
                self._scale_layouts[f"native_{part}_scale_buffer"] = (part, layout)
            if self.nvfp4_layout.endswith("+dq"):
                workspace = self._zeros((rows, heads, dim), torch.float8_e4m3fn)
                setattr(self, f"dq_{part}_buffer", workspace)
        # Described (and counted) in SGLang's order: each layout's K, then its V.
        order = [f"{layout}{part}_scale_buffer" for layout in ("", "native_") for part in _PARTS]
        self._scale_layouts = {n: self._scale_layouts[n] for n in order if n in self._scale_layouts}
        return payload[0], payload[1]

    # --- reads -------------------------------------------------------------------------------

    def _read(self, part: str, layer_id: int, where: str) -> torch.Tensor:
        local = self._local_layer(layer_id, where=where)
        buffer = getattr(self, f"{part}_buffer")[local]
        if self.quant_method == "cpu_fp8_e4m3":
            return buffer
        if self.quant_method == "nvfp4":
            return buffer.view(FP4_DTYPE)
        scales = getattr(self, f"{part}_scale_buffer")[local]
        values = _quant.fp4_block16_dequantize(buffer.reshape(self.num_slots, -1), scales)
        return values.reshape(self.num_slots, self.head_num, -1)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s K cache: the fp8 buffer (``cpu_fp8_e4m3``), the layer
        dequantized to bf16 (``fp4_mx_block16``, a new tensor) or the packed bytes viewed as
        float4_e2m1fn_x2 (``nvfp4``)."""
        return self._read("k", layer_id, "get_key_buffer")

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s V cache (see :meth:`get_key_buffer`)."""
        return self._read("v", layer_id, "get_value_buffer")

    def get_raw_kv_buffer(
        self, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(k, v, k_scales, v_scales)`` of global layer ``layer_id`` as stored (FP4 methods
        with token-linear scales; NVFP4's viewed as float8_e4m3fn). ``RuntimeError`` for a
        pool without them (``cpu_fp8_e4m3``, native-only NVFP4), as SGLang."""
        local = self._local_layer(layer_id, where="get_raw_kv_buffer")
        if self.k_scale_buffer is None or self.v_scale_buffer is None:
            raise RuntimeError(
                f"get_raw_kv_buffer: the {self.quant_method!r} pool keeps no token-linear FP4"
                " scales"
            )
        k_scale, v_scale = self.k_scale_buffer[local], self.v_scale_buffer[local]
        if self.quant_method == "nvfp4":
            k_scale, v_scale = k_scale.view(torch.float8_e4m3fn), v_scale.view(torch.float8_e4m3fn)
        return self.k_buffer[local], self.v_buffer[local], k_scale, v_scale

    def get_dequant_workspace(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared fp8 dequant workspace ``(dq_k_buffer, dq_v_buffer)``; ``RuntimeError``
        for a pool without one."""
        if self.dq_k_buffer is None or self.dq_v_buffer is None:
            raise RuntimeError("get_dequant_workspace: the pool keeps no dequant workspace")
        return self.dq_k_buffer, self.dq_v_buffer

    # --- writes ------------------------------------------------------------------------------

    def _encode(
        self,
        local: int,
        k: torch.Tensor,
        v: torch.Tensor,
        k_scale: float | None,
        v_scale: float | None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Storage bytes and scale bytes (``[n, heads, blocks]``) of float rows."""
        n = k.shape[0]
        if self.quant_method == "cpu_fp8_e4m3":
            return {
                "k": _quant.cpu_fp8_quantize(k, k_scale),
                "v": _quant.cpu_fp8_quantize(v, v_scale),
            }, {}
        payload, scales = {}, {}
        globals_ = {"k": k_scale, "v": v_scale}
        defaults = {"k": self.k_global_scales[local], "v": self.v_global_scales[local]}
        for part, rows in (("k", k), ("v", v)):
            if self.quant_method == "fp4_mx_block16":
                packed, sf = _quant.fp4_block16_quantize(rows.reshape(n, -1))
                payload[part], scales[part] = (
                    packed.reshape(n, self.head_num, -1),
                    sf.reshape(n, 1, -1),
                )
            else:
                given = globals_[part]
                g = float(given) if given is not None else defaults[part]
                payload[part], scales[part] = _quant.nvfp4_quantize(rows, g)
        return payload, scales

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
        """Encode ``cache_k[i]``/``cache_v[i]`` (bf16, fp16 or fp32 ``[len(loc), H, D]`` /
        ``[len(loc), H, v_head_dim]``) and store the values with their block scales at slot
        ``loc[i]`` of one layer (``layer_id_override`` or ``layer.layer_id``). ``loc``: 1-D,
        distinct, in ``[0, size + page_size)``. The scales mean what the quant method says
        (see the class docstring); the caller's tensors are never modified."""
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        loc = self._locations("loc", loc, distinct=True, where=where)
        k, v = self._float_payloads(cache_k, cache_v, loc.numel(), where)
        ks = check_scale("k_scale", k_scale, device=self._torch_device, where=where)
        vs = check_scale("v_scale", v_scale, device=self._torch_device, where=where)
        if self.is_meta or loc.numel() == 0:
            return
        self._store(local, loc, *self._encode(local, k, v, ks, vs))

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
        """The committed prefix of each row of a ``[B, W]`` grid, encoded as
        :meth:`set_kv_buffer` encodes it (grid rules: ``MHATokenToKVPool``'s)."""
        where = "set_kv_buffer_prefix_valid"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        committed = check_prefix_grid(
            loc_2d, commit_lens, limit=self.num_slots, device=self._torch_device, where=where
        )
        k, v = self._float_payloads(cache_k, cache_v, int(loc_2d.numel()), where)
        ks = check_scale("k_scale", k_scale, device=self._torch_device, where=where)
        vs = check_scale("v_scale", v_scale, device=self._torch_device, where=where)
        if self.is_meta or committed is None:
            return
        cells, loc = committed
        if cells.numel() == 0:
            return
        encoded = self._encode(local, k.index_select(0, cells), v.index_select(0, cells), ks, vs)
        self._store(local, loc, *encoded)


class MHATokenToKVPoolMXFP8(_ScaledBuffers):
    """SGLang's MXFP8 MHA pool: fp8 e4m3 K/V ``[rows, H, D]`` / ``[rows, H, v_head_dim]``
    (float8_e4m3fn) with one e8m0 scale per 32 values of a head: ``k_scale_buffer`` /
    ``v_scale_buffer`` float8_e8m0fnu, in FA4's interleaved layout ``[pages, H, 32, 4,
    D // 32]`` when ``page_size == 128`` (``size`` whole pages) and ``[rows, H, D // 32]``
    otherwise. ``head_dim`` and ``v_head_dim`` are multiples of 32.

    ``set_kv_buffer`` with ``k_scale`` and ``v_scale`` (e8m0 or uint8 ``[n, H, dim // 32]``)
    stores fp8 (or uint8) rows and those scales as given; without them (SGLang's fused
    path) it quantizes bf16/fp16/fp32 rows itself, on the interleaved layout only
    (``ValueError`` otherwise, as SGLang). ``set_kv_buffer_prefix_valid`` raises
    ``NotImplementedError`` (SGLang's: it would not carry the scales). Reads return the fp8
    buffers; ``get_kv_scale_buffer`` the layer's two scale buffers.
    """

    _POOL_DTYPES = (torch.float8_e4m3fn,)
    k_scale_buffer: list[torch.Tensor]
    v_scale_buffer: list[torch.Tensor]

    @property
    def interleaved(self) -> bool:
        """Whether the scales are in FA4's interleaved layout (128-token pages)."""
        return self.page_size == MXFP8_INTERLEAVED_PAGE

    def _create_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self.kv_layout != "nhd":
            raise ValueError("MXFP8 KV cache is token-major only (kv_layout='nhd')")
        for name, dim in (("head_dim", self.head_dim), ("v_head_dim", self.v_head_dim)):
            if dim % 32:
                raise ValueError(f"MXFP8 KV cache needs {name} divisible by 32, got {dim}")
        if self.interleaved and self.num_slots % self.page_size:
            raise ValueError(
                f"MXFP8 interleaved scales need whole pages: size={self.size} is not a multiple"
                f" of page_size={self.page_size}"
            )
        self.store_dtype = torch.float8_e4m3fn
        rows, heads = self.num_slots, self.head_num
        self._scale_layouts = {}
        for part in _PARTS:
            blocks = self._payload_dim(part) // 32
            if self.interleaved:
                shape: tuple[int, ...] = (rows // self.page_size, heads, 32, 4, blocks)
                layout = _quant.ScaleLayout("interleaved", heads, blocks, self.page_size)
            else:
                shape = (rows, heads, blocks)
                layout = _quant.ScaleLayout("token", heads, blocks)
            setattr(self, f"{part}_scale_buffer", self._zeros_of(shape, torch.float8_e8m0fnu))
            self._scale_layouts[f"{part}_scale_buffer"] = (part, layout)
        return (
            self._zeros_of((rows, heads, self.head_dim), self.store_dtype),
            self._zeros_of((rows, heads, self.v_head_dim), self.store_dtype),
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s fp8 K buffer."""
        return self.k_buffer[self._local_layer(layer_id, where="get_key_buffer")]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s fp8 V buffer."""
        return self.v_buffer[self._local_layer(layer_id, where="get_value_buffer")]

    def get_kv_scale_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_scale_buffer, v_scale_buffer)`` of global layer ``layer_id`` (what FA4 reads)."""
        local = self._local_layer(layer_id, where="get_kv_scale_buffer")
        return self.k_scale_buffer[local], self.v_scale_buffer[local]

    def _scaled_rows(
        self, cache_k: object, cache_v: object, k_scale: object, v_scale: object, n: int, where: str
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        payload, scales = {}, {}
        for part, rows, scale in (("k", cache_k, k_scale), ("v", cache_v, v_scale)):
            dim = self._payload_dim(part)
            payload[part] = check_payload(
                f"cache_{part}",
                rows,
                shape=(n, self.head_num, dim),
                dtypes=(torch.float8_e4m3fn, torch.uint8),
                device=self._torch_device,
                where=where,
            ).view(torch.uint8)
            scales[part] = check_payload(
                f"{part}_scale",
                scale,
                shape=(n, self.head_num, dim // 32),
                dtypes=(torch.float8_e8m0fnu, torch.uint8),
                device=self._torch_device,
                where=where,
            ).view(torch.uint8)
        return payload, scales

    def set_kv_buffer(
        self,
        layer: object,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Store fp8 rows with the caller's e8m0 scales (both scales given), or quantize
        float rows (SGLang's fused path: no scales, interleaved layout only). Layer, ``loc``
        and caller-tensor rules are ``MHATokenToKVPool``'s."""
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        loc = self._locations("loc", loc, distinct=True, where=where)
        n = loc.numel()
        if k_scale is not None and v_scale is not None:
            encoded = self._scaled_rows(cache_k, cache_v, k_scale, v_scale, n, where)
        else:
            if not self.interleaved:
                raise ValueError(
                    f"{where}: MXFP8 KV cache requires K and V scale tensors off the"
                    " interleaved layout (page_size=128)"
                )
            k, v = self._float_payloads(cache_k, cache_v, n, where)
            if self.is_meta or n == 0:
                return
            (k_data, k_sf), (v_data, v_sf) = _quant.mxfp8_quantize(k), _quant.mxfp8_quantize(v)
            encoded = ({"k": k_data, "v": v_data}, {"k": k_sf, "v": v_sf})
        if self.is_meta or n == 0:
            return
        self._store(local, loc, *encoded)

    def set_kv_buffer_prefix_valid(self, *args: Any, **kwargs: Any) -> None:
        """Refused with ``NotImplementedError``, as SGLang refuses it (no scales to carry)."""
        raise NotImplementedError(
            "set_kv_buffer_prefix_valid: unsupported for the MXFP8 KV cache (it would not"
            " carry the scale buffers)"
        )
