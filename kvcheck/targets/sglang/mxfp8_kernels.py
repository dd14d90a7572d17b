"""CPU bodies of the GPU-only pieces behind sglang's ``MHATokenToKVPoolMXFP8`` writes.

sglang 0.5.23's MXFP8 pool stores a write in three GPU-only steps: the CUDA JIT
``store_cache`` (fp8 rows to slot rows), the Triton ``_store_sf_interleaved_kernel``
(UE8M0 scales into FA4's interleaved page layout; also run by its moves and reloads) and the
Triton ``_mxfp8_quant_store_qkv_kernel`` (its fused path: quantize float rows, store the
fp8 rows and the interleaved scales). Each is replaced here, only while one of the pool's
own methods runs (:func:`kvcheck.targets.sglang.target` scopes them), by a CPU body that
writes the bytes the kernel's source documents; sglang's Python wrappers around the two
Triton kernels (their asserts, dtype views and grids) run unpatched, and so does all of
the pool's torch code (payload copies, ``_read_sf_interleaved``, host copies, accounting).

Where a kernel has no bounds check, its body raises ``IndexError`` instead of writing
outside the buffer (a GPU would corrupt memory there), so such a write still fails a check.
Nothing here imports sglang: each context manager patches the module it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "INTERLEAVE_KERNEL_NAME",
    "QUANT_STORE_KERNEL_NAME",
    "cpu_mxfp8_interleave_kernel",
    "cpu_mxfp8_quant_store_kernel",
    "cpu_store_cache",
    "quantize_mxfp8_blocks",
]

#: The Triton kernel ``store_sf_interleaved`` launches (``mxfp8_interleave_sf.py``).
INTERLEAVE_KERNEL_NAME = "_store_sf_interleaved_kernel"
#: The Triton kernel ``quant_store_kv_mxfp8`` launches (``mxfp8_quant_store_kv.py``).
QUANT_STORE_KERNEL_NAME = "_mxfp8_quant_store_qkv_kernel"

#: FA4's interleaved scale atom: a page's scale block per head is 32 rows of
#: ``page_size // 32`` token groups of the scale bytes of one token.
_ATOM_ROWS = 32
#: The largest finite e4m3 value: the quantizer maps each block's absolute maximum onto it.
_E4M3_MAX = 448.0
_E8M0_BIAS = 127


def _flat_offsets(offsets: torch.Tensor, numel: int, what: str) -> torch.Tensor:
    """``offsets``, after checking they fall inside a buffer of ``numel`` elements."""
    if offsets.numel() and (int(offsets.min()) < 0 or int(offsets.max()) >= numel):
        raise IndexError(
            f"{what}: the GPU kernel would write outside its buffer (offsets "
            f"{int(offsets.min())}..{int(offsets.max())}, buffer of {numel}); it has no bounds "
            "check, so kvcheck's CPU body refuses instead"
        )
    return offsets


class _CpuStoreSfInterleaved:
    """CPU body of ``_store_sf_interleaved_kernel``, launched as ``kernel[grid](...)``.

    The kernel takes the scales as one u32 per (token, head) (the 4 scale bytes of a 128-wide
    head) and stores token ``loc[i]``'s word of head ``h`` at u32 offset
    ``page * nheads * 128 + h * 128 + (page_offset % 32) * 4 + page_offset // 32`` of the
    scale buffer (page and offset of ``loc[i]`` in ``page_size`` pages), skipping slot 0.
    """

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(
        self,
        sf_in: torch.Tensor,
        sf_out: torch.Tensor,
        loc: torch.Tensor,
        num_tokens: int,
        *,
        nheads: int,
        page_size: int,
        **_block: Any,
    ) -> None:
        slots = loc.reshape(-1)[:num_tokens].long()
        keep = slots != 0
        slots = slots[keep]
        page_offsets = slots % page_size
        # The kernel's constants: 4 token groups of 32 per 128-token page, 128 words per head.
        positions = (page_offsets % _ATOM_ROWS) * 4 + page_offsets // _ATOM_ROWS
        words = sf_in.reshape(num_tokens, nheads)[keep]
        out = sf_out.reshape(-1)
        for head in range(nheads):
            offsets = (slots // page_size) * (nheads * 128) + head * 128 + positions
            out[_flat_offsets(offsets, out.numel(), "store_sf_interleaved")] = words[:, head]


def quantize_mxfp8_blocks(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize ``rows`` (``[..., blocks, 32]``) as ``_mxfp8_quant_store_qkv_kernel``:
    per block of 32 the biased exponent ``ceil(log2(amax / 448)) + 127`` clamped to 0..254
    (``amax`` at least 1e-30), values divided by ``2 ** (exponent - 127)``, clamped to
    +-448 and cast to e4m3. Returns ``(fp8 values as uint8, exponent bytes as uint8)``.

    The cast is torch's (round to nearest even); the GPU's Triton cast is not checked here.
    """
    values = rows.to(torch.float32)
    amax = values.abs().amax(dim=-1).clamp_min(1e-30)
    biased = (torch.ceil(torch.log2(amax / _E4M3_MAX)) + _E8M0_BIAS).clamp(0.0, 254.0)
    descale = torch.exp2(biased - _E8M0_BIAS)
    quantized = (values / descale.unsqueeze(-1)).clamp(-_E4M3_MAX, _E4M3_MAX)
    return quantized.to(torch.float8_e4m3fn).view(torch.uint8), biased.to(torch.uint8)


class _CpuMxfp8QuantStore:
    """CPU body of ``_mxfp8_quant_store_qkv_kernel`` for the K/V rows it is launched with
    by ``quant_store_kv_mxfp8`` (``NQ == 0``: no query rows).

    Program ``(t, r)`` reads ``D`` values of head ``r`` of K (``r < NKV``) or of head
    ``r - NKV`` of V at ``t * stride_t + h * stride_h`` (K's ``D`` for both: a V narrower
    than K is read past its heads), quantizes them (:func:`quantize_mxfp8_blocks`) and,
    unless ``loc[t] == 0``, stores the fp8 values at element ``(loc[t] * NKV + h) * D`` of
    the cache and the ``D // 32`` exponent bytes at byte
    ``((loc // PAGE) * NKV + h) * (32 * (PAGE // 32) * SF) + (loc % PAGE % 32) * ((PAGE //
    32) * SF) + (loc % PAGE // 32) * SF`` of the scale buffer (FA4's interleaved layout).
    """

    def __getitem__(self, grid: Any) -> Any:
        tokens, _programs = grid
        return lambda *args, **kwargs: self._launch(int(tokens), *args, **kwargs)

    def _launch(
        self,
        tokens: int,
        _q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        loc: torch.Tensor,
        _q8: torch.Tensor,
        _sfq: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_sf: torch.Tensor,
        v_sf: torch.Tensor,
        _sqt: int,
        _sqh: int,
        skt: int,
        skh: int,
        svt: int,
        svh: int,
        *,
        NQ: int,
        NKV: int,
        D: int,
        PAGE: int,
    ) -> None:
        if NQ:
            raise NotImplementedError("kvcheck's CPU body stores K/V only (NQ == 0)")
        blocks = D // 32
        slots = loc.reshape(-1)[:tokens].long()
        keep = slots != 0
        for rows, t_stride, h_stride, cache, scales in (
            (k, skt, skh, k_cache, k_sf),
            (v, svt, svh, v_cache, v_sf),
        ):
            # The kernel addresses rows from their data pointer by the strides it is given.
            source = rows.as_strided(
                (rows.untyped_storage().nbytes() // rows.element_size() - rows.storage_offset(),),
                (1,),
            )
            starts = (
                torch.arange(tokens)[:, None] * t_stride + torch.arange(NKV)[None, :] * h_stride
            )
            reads = starts[..., None] + torch.arange(D)
            picked = source[_flat_offsets(reads, source.numel(), "quant_store_kv_mxfp8 (read)")]
            data, exponents = quantize_mxfp8_blocks(picked.reshape(tokens, NKV, blocks, 32))
            where = slots[keep]
            heads = torch.arange(NKV)
            payload_at = ((where[:, None] * NKV + heads) * D)[..., None] + torch.arange(D)
            out = cache.view(torch.uint8).reshape(-1)
            out[_flat_offsets(payload_at, out.numel(), "quant_store_kv_mxfp8")] = data[
                keep
            ].reshape(-1, NKV, D)
            offsets = where % PAGE
            group = (PAGE // 32) * blocks
            scale_base = (
                ((where // PAGE)[:, None] * NKV + heads) * (32 * group)
                + (offsets % 32)[:, None] * group
                + (offsets // 32)[:, None] * blocks
            )
            scale_at = scale_base[..., None] + torch.arange(blocks)
            sf = scales.view(torch.uint8).reshape(-1)
            sf[_flat_offsets(scale_at, sf.numel(), "quant_store_kv_mxfp8 (scales)")] = exponents[
                keep
            ]


def _cpu_store_cache_body(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    row_bytes: int = 0,
    v_row_bytes: int = 0,
    num_split: int = 0,
    size_limit: int = 0,
    reserved_skip_index: int = 0,
) -> None:
    """CPU body of sglang's ``store_cache`` (``kernels/jit/csrc/elementwise/kvcache.cuh``):
    the host checks (one dtype for all four tensors; rows of ``row_bytes``/``v_row_bytes``;
    unit inner strides) raise ``RuntimeError``, an index outside ``[0, size_limit)`` raises
    ``IndexError`` (the kernel's device assert), and row ``i`` of K and V is copied to row
    ``indices[i]`` of the caches unless it is ``reserved_skip_index``."""
    for name, tensor in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dim() != 2 or tensor.stride(-1) != 1 or tensor.dtype != k.dtype:
            raise RuntimeError(
                f"store_cache: {name} must be 2-D, unit-stride rows of {k.dtype}, got "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )
    size = k.element_size()
    row_bytes = row_bytes or k.shape[-1] * size
    v_row_bytes = v_row_bytes or v.shape[-1] * size
    for name, width, bytes_ in (
        ("k", k.shape[-1], row_bytes),
        ("v", v.shape[-1], v_row_bytes),
        ("k_cache", k_cache.shape[-1], row_bytes),
        ("v_cache", v_cache.shape[-1], v_row_bytes),
    ):
        if width * size != bytes_:
            raise RuntimeError(f"store_cache: {name} rows are {width * size} bytes, not {bytes_}")
    slots = indices.reshape(-1).long()
    limit = size_limit if size_limit > 0 else k_cache.shape[0]
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= limit):
        raise IndexError(
            f"store_cache: index outside [0, {limit}) (the kernel's device assert): "
            f"{slots.tolist()}"
        )
    keep = slots != reserved_skip_index
    k_cache.view(torch.uint8)[slots[keep]] = k.view(torch.uint8)[keep]
    v_cache.view(torch.uint8)[slots[keep]] = v.view(torch.uint8)[keep]


def _store_cache_loads(k_row_bytes: int, v_row_bytes: int = 0, num_threads: int = 0) -> bool:
    """Stand-in for ``can_use_store_cache``: the CPU body serves every row width."""
    return True


@contextmanager
def cpu_store_cache(memory_pool: Any) -> Iterator[None]:
    """Run sglang's MXFP8 ``set_kv_buffer`` past its CUDA guard on CPU: ``memory_pool``'s
    ``store_cache`` (the CUDA JIT kernel) becomes :func:`_cpu_store_cache_body`, its
    ``can_use_store_cache`` (whether that kernel builds) answers True, and its ``_is_cuda``
    is True, for the block only (``set_kv_buffer`` asserts ``_is_cuda and
    can_use_store_cache(...)`` before its store)."""
    patched = {
        "store_cache": _cpu_store_cache_body,
        "can_use_store_cache": _store_cache_loads,
        "_is_cuda": True,
    }
    originals = {name: getattr(memory_pool, name) for name in patched}
    for name, value in patched.items():
        setattr(memory_pool, name, value)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(memory_pool, name, original)


@contextmanager
def _kernel_replaced(module: Any, name: str, body: Any) -> Iterator[None]:
    original = getattr(module, name, None)
    if original is None:
        yield
        return
    setattr(module, name, body)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextmanager
def cpu_mxfp8_interleave_kernel(module: Any) -> Iterator[None]:
    """Run ``store_sf_interleaved`` of ``module`` (the release's ``mxfp8_interleave_sf``)
    on CPU: its wrapper, with the Triton kernel run by :class:`_CpuStoreSfInterleaved`."""
    with _kernel_replaced(module, INTERLEAVE_KERNEL_NAME, _CpuStoreSfInterleaved()):
        yield


@contextmanager
def cpu_mxfp8_quant_store_kernel(module: Any) -> Iterator[None]:
    """Run ``quant_store_kv_mxfp8`` of ``module`` (the release's MXFP8 quant-store module)
    on CPU: its wrapper, with the Triton kernel run by :class:`_CpuMxfp8QuantStore`."""
    with _kernel_replaced(module, QUANT_STORE_KERNEL_NAME, _CpuMxfp8QuantStore()):
        yield
