"""Vectorized encoders of the quantized KV caches, and where each layout keeps a token's scales.

The encodings are those SGLang 0.5.23 stores (the reference, :mod:`kvcheck.reference.quant`,
states each one value by value; nothing is shared with it):

- :func:`fp4_block16_quantize` / :func:`fp4_block16_dequantize`: ``fp4_mx_block16`` (MHA and
  MLA FP4), one biased exponent byte per 16 values of the flattened row;
- :func:`nvfp4_quantize`: NVFP4, one e4m3 scale per 16 values of each head, against the
  layer's global scale;
- :func:`mxfp8_quantize`: MXFP8's fused write, one e8m0 scale per 32 values of each head;
- :func:`cpu_fp8_quantize`: the CPU fp8 method, ``(x / scale).to(float8_e4m3fn)``.

:class:`ScaleLayout` reads and writes one token's scale bytes (``[n, heads, blocks]``) in a
buffer of any layout: token-major rows, MXFP8's interleaved pages (FA4's
``BlockScaledBasicChunk``) and NVFP4's native pages (TRT-LLM's, V scales swizzled).

Example:
    >>> x = torch.tensor([[1.0, -6.0] + [0.0] * 14])
    >>> packed, scales = fp4_block16_quantize(x)
    >>> packed[0, 0].item(), scales.tolist()
    (242, [[127]])
    >>> fp4_block16_dequantize(packed, scales)[0, :2].tolist()
    [1.0, -6.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: e2m1 magnitudes by code (bit 3 is the sign).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: ``fp4_mx_block16`` rounds ``|y|`` to the code of how many of these it reaches.
_BLOCK16_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
#: NVFP4 rounds to nearest, ties to even codes: a magnitude reaching a midpoint goes up,
#: except at the midpoints below even codes (0.25, 1.25, 2.5: kept) ...
_NEAREST_EVEN_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                        (3.5, True), (5.0, False))  # fmt: skip
_FP8_MAX = 448.0


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 2k]`` uint8 codes as ``[..., k]`` bytes, the even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    codes = torch.empty(
        (*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.uint8, device=packed.device
    )
    codes[..., 0::2] = packed & 0xF
    codes[..., 1::2] = packed >> 4
    return codes


#: The signed value of each of the 16 codes (code 8 is -0.0), float32 on the CPU.
_SIGNED_E2M1 = torch.tensor([*_E2M1, *(-v for v in _E2M1)], dtype=torch.float32)


def _signed_e2m1(codes: torch.Tensor) -> torch.Tensor:
    return _SIGNED_E2M1.to(codes.device)[codes.long()]


def fp4_block16_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed [n, W // 2], scales [n, W // 16])`` uint8 of ``x`` ``[n, W]`` (any float
    dtype), in float32: per block of 16, exponent ``ceil(log2(max(max|x| / 6, 1e-10)))``,
    scale byte exponent + 127, codes ``|x / 2**e|`` rounded with ties away from zero."""
    rows = x.float().reshape(x.shape[0], -1, 16)
    largest = rows.abs().amax(dim=-1, keepdim=True)
    exponent = torch.ceil(torch.log2(torch.clamp(largest / 6.0, min=1e-10)))
    scaled = rows / torch.exp2(exponent)
    bounds = torch.tensor(_BLOCK16_BOUNDS, device=x.device)
    magnitude = (scaled.abs().unsqueeze(-1) >= bounds).sum(dim=-1).to(torch.uint8)
    codes = magnitude | ((scaled < 0).to(torch.uint8) << 3)
    scales = (exponent.squeeze(-1) + 127).to(torch.uint8)
    return _pack(codes.reshape(x.shape[0], -1)), scales


def fp4_block16_dequantize(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``[n, 2 * W]`` values of packed ``fp4_mx_block16`` rows ``[n, W]`` with their scale
    bytes ``[n, W // 8]``: each code's signed e2m1 value times ``2 ** (scale - 127)``."""
    values = _signed_e2m1(_unpack(packed)).reshape(packed.shape[0], -1, 16)
    powers = torch.exp2(scales.float() - 127).unsqueeze(-1)
    return (values * powers).reshape(packed.shape[0], -1).to(dtype)


def _e2m1_nearest_even(scaled: torch.Tensor) -> torch.Tensor:
    magnitude = scaled.abs().clamp(max=6.0)
    code = torch.zeros_like(magnitude, dtype=torch.uint8)
    for bound, inclusive in _NEAREST_EVEN_BOUNDS:
        reached = magnitude >= bound if inclusive else magnitude > bound
        code += reached.to(torch.uint8)
    negative = torch.signbit(scaled).to(torch.uint8) << 3
    return code | negative


def nvfp4_quantize(x: torch.Tensor, global_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed [n, H, D // 2], e4m3 scale bytes [n, H, D // 16])`` of ``x`` ``[n, H, D]``:
    per block of 16, scale ``e4m3(max|x| / (6 g))`` and codes ``x / (scale * g)`` rounded
    to the nearest e2m1 value, ties to even (0 where the scale is 0)."""
    n, heads, dim = x.shape
    blocks = x.float().reshape(n, heads, dim // 16, 16)
    g = torch.tensor(global_scale, dtype=torch.float32, device=x.device)
    largest = blocks.abs().amax(dim=-1)
    scale = (largest / (6.0 * g)).clamp(max=_FP8_MAX).to(torch.float8_e4m3fn)
    denominator = (scale.float() * g).unsqueeze(-1)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    scaled = torch.where(denominator > 0, blocks / safe, blocks * 0.0)
    codes = _e2m1_nearest_even(scaled).reshape(n, heads, dim)
    return _pack(codes), scale.view(torch.uint8)


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 bytes [n, H, D], e8m0 scale bytes [n, H, D // 32])`` of ``x`` ``[n, H, D]``:
    per block of 32, ``b = clamp(ceil(log2(max(max|x|, 1e-30) / 448)) + 127, 0, 254)`` and
    the values divided by ``2 ** (b - 127)``, clamped to +-448, cast to e4m3."""
    n, heads, dim = x.shape
    blocks = x.float().reshape(n, heads, dim // 32, 32)
    largest = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
    biased = (torch.ceil(torch.log2(largest / _FP8_MAX)) + 127).clamp(0, 254)
    values = (blocks / torch.exp2(biased - 127)).clamp(-_FP8_MAX, _FP8_MAX)
    data = values.to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, heads, dim)
    return data, biased.squeeze(-1).to(torch.uint8)


def cpu_fp8_quantize(x: torch.Tensor, scale: float | None) -> torch.Tensor:
    """The CPU fp8 method's stored values: ``x`` divided by ``scale`` (1 when None) in its
    own dtype, then cast to float8_e4m3fn (saturating beyond +-448, as torch casts)."""
    quotient = x / (1.0 if scale is None else scale)
    return quotient.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)


@dataclass(frozen=True)
class ScaleLayout:
    """Where one token's scale bytes ``[heads, blocks]`` live in a per-layer scale buffer.

    ``kind`` is ``"token"`` (a row per slot, ``[rows, heads, blocks]`` or flattened),
    ``"interleaved"`` (MXFP8 on 128-token pages, ``[pages, heads, 32, 4, blocks]``: token
    offset ``o`` of its page at ``[:, o % 32, o // 32]``), ``"native_k"`` (NVFP4,
    ``[pages, heads, page_size, blocks]``) or ``"native_v"`` (NVFP4, the same shape with
    each aligned group of 4 tokens' scales swizzled: block ``s`` of offset ``o`` at flat
    position ``((o // 4) * 4 + s // (blocks // 4)) * blocks + (s % (blocks // 4)) * 4
    + o % 4`` of the page's ``page_size * blocks`` bytes).
    """

    kind: str
    heads: int
    blocks: int
    page_size: int = 1

    def _flat_positions(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(page [n, 1], byte [n, blocks])`` of each token's scales in its page's plane
        of one head (``[pages, heads, page_size * blocks]``), for the native V layout."""
        offset = (loc % self.page_size).unsqueeze(-1)
        s = torch.arange(self.blocks, device=loc.device).unsqueeze(0)
        group = self.blocks // 4
        byte = ((offset // 4) * 4 + s // group) * self.blocks + (s % group) * 4 + offset % 4
        return (loc // self.page_size).unsqueeze(-1), byte

    def gather(self, buffer: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """A new ``[n, heads, blocks]`` tensor of tokens ``loc``'s scale bytes."""
        if self.kind == "token":
            return buffer.index_select(0, loc).reshape(loc.numel(), self.heads, self.blocks)
        if self.kind == "native_v":
            page, byte = self._flat_positions(loc)
            plane = buffer.reshape(buffer.shape[0], self.heads, -1)
            return plane[page, :, byte].permute(0, 2, 1).contiguous()
        page, offset = loc // self.page_size, loc % self.page_size
        if self.kind == "interleaved":
            return buffer[page, :, offset % 32, offset // 32, :].contiguous()
        return buffer[page, :, offset, :].contiguous()

    def scatter(self, buffer: torch.Tensor, loc: torch.Tensor, scales: torch.Tensor) -> None:
        """Write ``scales`` ``[n, heads, blocks]`` as tokens ``loc``'s (``loc`` distinct)."""
        scales = scales.reshape(loc.numel(), self.heads, self.blocks).to(buffer.dtype)
        if self.kind == "token":
            buffer.index_copy_(0, loc, scales.reshape(loc.numel(), *buffer.shape[1:]))
        elif self.kind == "native_v":
            page, byte = self._flat_positions(loc)
            plane = buffer.view(buffer.shape[0], self.heads, -1)
            plane[page, :, byte] = scales.permute(0, 2, 1)
        else:
            page, offset = loc // self.page_size, loc % self.page_size
            if self.kind == "interleaved":
                buffer[page, :, offset % 32, offset // 32, :] = scales
            else:
                buffer[page, :, offset, :] = scales
