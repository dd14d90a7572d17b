"""SGLang 0.5.23's scaled fp8 DSA latent row: quantize bf16 nope values per block of 128.

A scaled row is ``kv_lora_rank`` float8_e4m3fn bytes, one little-endian fp32 scale per
block of :data:`QUANT_BLOCK` of them, then the rope part's bf16 bytes unchanged (656 bytes
for ``kv_lora_rank=512, qk_rope_head_dim=64`` where the raw fp8 row takes 576). Each block
is quantized as SGLang's ``quantize_k_cache_separate`` computes it, in float32:
``scale = max|x| / 448`` and ``clamp(x * (1 / scale), -448, 448)`` cast to fp8 (ties to
even). A zero value stays that zero (with its sign), also in an all-zero block (scale 0),
where SGLang's kernel has no guard and computes ``0 * inf``.

Example:
    >>> import torch
    >>> scaled_row_width(512, 64)
    656
    >>> nope = torch.full((1, 128), 2.0, dtype=torch.bfloat16)
    >>> row = quantize_rows(nope, torch.empty((1, 0), dtype=torch.bfloat16))
    >>> row.shape, hex(row[0, 0].item()), round(row[0, 128:].view(torch.float32).item() * 448, 5)
    (torch.Size([1, 132]), '0x7e', 2.0)
"""

from __future__ import annotations

import torch

#: Nope values per fp32 scale.
QUANT_BLOCK = 128
#: The largest finite float8_e4m3fn value.
FP8_MAX = 448.0
#: The dtype a scaled row's values take, and the dtype its nope and rope parts are given in.
SCALED_DTYPE = torch.float8_e4m3fn
SOURCE_DTYPE = torch.bfloat16


def scaled_row_width(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """Bytes of one scaled latent row (``kv_lora_rank`` a multiple of 128).

    Example:
        >>> scaled_row_width(128, 0)
        132
    """
    return kv_lora_rank + kv_lora_rank // QUANT_BLOCK * 4 + qk_rope_head_dim * 2


def quantize_rows(nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """``[n, width]`` uint8 scaled rows from bf16 ``nope`` ``[n, R]`` and ``rope`` ``[n, P]``.

    Reads its inputs only; the result is a new tensor on their device.
    """
    count, rank = nope.shape
    blocks = nope.float().reshape(count, rank // QUANT_BLOCK, QUANT_BLOCK)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    # Multiply by the reciprocal, as the kernel does (not a division per value).
    # A zero stays that zero: SGLang's kernel computes 0 * inf (NaN) for an all-zero
    # block or a scale whose reciprocal overflows, kvcheck's contract stores the zero.
    scaled = torch.where(blocks == 0, blocks, blocks * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)
    values = scaled.to(SCALED_DTYPE).view(torch.uint8).reshape(count, rank)
    scale_bytes = scale.reshape(count, -1).contiguous().view(torch.uint8)
    rope_bytes = rope.contiguous().view(torch.uint8).reshape(count, -1)
    return torch.cat([values, scale_bytes, rope_bytes], dim=1)
