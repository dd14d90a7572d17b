"""The reference encoders of the quantized KV caches: one value at a time, in loops.

Each encoder is written from the format's definition as SGLang 0.5.23 computes it (in
IEEE float32, where it matters, through numpy scalars), so that it shares nothing with
the vectorized encoders of :mod:`kvcheck.pools` or with torch's casts:

- :func:`e4m3_saturating_byte`: the fp8 e4m3 byte of a value, ties to even, out-of-range
  values (and infinities) saturating to +-448, as torch's cast does (the CPU fp8 method);
- :func:`fp4_block16_encode` / :func:`fp4_block16_decode`: SGLang's ``fp4_mx_block16``
  (MHA and MLA FP4): per block of 16 values one biased power-of-two exponent byte, e2m1
  codes rounded with ties away from zero, two codes per byte (first in the low nibble);
- :func:`nvfp4_encode`: NVFP4, per block of 16 values an e4m3 scale of ``max / (6 g)``
  (``g`` the layer's global scale) and e2m1 codes rounded to nearest, ties to even, as
  kvcheck's contract states it (FlashInfer's CUDA quantizer is not run on a CPU; see
  docs/sglang-findings-appendix.md, "CPU stand-ins");
- :func:`mxfp8_block_encode`: MXFP8's fused write, per block of 32 values an e8m0 byte
  ``clamp(ceil(log2(max / 448)) + 127, 0, 254)`` and the values divided by its power of
  two, cast to e4m3.

Example:
    >>> packed, scales = fp4_block16_encode([1.0, -6.0] + [0.0] * 14)
    >>> packed[:2].hex(), list(scales)
    ('f200', [127])
    >>> fp4_block16_decode(packed, scales)[:2]
    [1.0, -6.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "E2M1_VALUES",
    "bf16_bytes",
    "bf16_row_bytes",
    "e4m3_saturating_byte",
    "e4m3_value",
    "encode_row",
    "fp4_block16_decode",
    "fp4_block16_encode",
    "mxfp8_block_encode",
    "nvfp4_encode",
    "payload_row_bytes",
    "quantized_kv_size_bytes",
    "quantized_scale_buf_infos",
    "render_scales",
    "round_to_dtype",
    "scale_buffer_names",
    "scale_row_bytes",
    "values_of",
]

#: The magnitudes of the eight e2m1 codes (the sign is the code's bit 3).
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: ``fp4_mx_block16``: the magnitude code of ``|y|`` is how many of these it reaches, so
#: every tie between two codes goes to the larger magnitude (away from zero).
_BLOCK16_THRESHOLDS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E4M3_MAX = 448.0


def _f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even), as a Python float."""
    return float(np.float32(value))


def e4m3_value(byte: int) -> float:
    """The value of a float8_e4m3fn byte (``0x7f``/``0xff`` are NaN).

    Example:
        >>> e4m3_value(0x38), e4m3_value(0xfe), e4m3_value(0x01)
        (1.0, -448.0, 0.001953125)
    """
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e4m3_saturating_byte(value: float) -> int:
    """The float8_e4m3fn byte nearest to ``value`` (ties to even); beyond +-448, and for
    +-inf, the largest finite value of that sign; NaN gives ``0x7f``.

    Example:
        >>> [hex(e4m3_saturating_byte(v)) for v in (1.0, 1000.0, -math.inf, 0.0625 * 1.5)]
        ['0x38', '0x7e', '0xfe', '0x1c']
    """
    if math.isnan(value):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if magnitude >= _E4M3_MAX:
        return sign | 0x7E
    if magnitude < 2.0**-6:  # subnormals: multiples of 2**-9 (ties to even by round())
        return sign | round(magnitude * 2.0**9)
    mantissa, exponent = math.frexp(magnitude)
    exponent -= 1
    steps = round((mantissa * 2.0 - 1.0) * 8)
    if steps == 8:
        steps, exponent = 0, exponent + 1
    if exponent + 7 > 15 or (exponent + 7 == 15 and steps == 7):
        return sign | 0x7E  # rounded up past 448: saturate
    return sign | (exponent + 7) << 3 | steps


def bf16_bytes(value: float) -> bytes:
    """The two little-endian bytes of ``value`` rounded to bfloat16 (ties to even; the
    value is first rounded to float32).

    Example:
        >>> bf16_bytes(1.0).hex(), bf16_bytes(-0.0).hex()
        ('803f', '0080')
    """
    bits = int(np.array([value], dtype=np.float32).view(np.uint32)[0])
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:  # NaN stays a quiet NaN
        top = (bits >> 16) | 0x40
    else:
        top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return int(top & 0xFFFF).to_bytes(2, "little")


def bf16_row_bytes(values: Sequence[float]) -> bytes:
    """:func:`bf16_bytes` of each finite value, concatenated (ties to even, in one pass).

    Example:
        >>> bf16_row_bytes([1.0, 1 + 2**-8, 1 + 3 * 2**-8]).hex()
        '803f803f823f'
    """
    bits = np.array(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return top.astype("<u2").tobytes()


def round_to_dtype(value: float, dtype: str) -> float:
    """``value`` rounded to ``dtype`` ("float32", "bfloat16" or "float16"), ties to even.

    Example:
        >>> round_to_dtype(1 + 2**-9, "bfloat16"), round_to_dtype(1 + 2**-9, "float16")
        (1.0, 1.001953125)
    """
    if dtype == "float32":
        return _f32(value)
    if dtype == "float16":
        return float(np.float16(_f32(value)))
    if dtype == "bfloat16":
        return values_of(bf16_bytes(value), "bfloat16")[0]
    raise ValueError(f"dtype={dtype!r} not in ('float32', 'bfloat16', 'float16')")


def values_of(data: bytes, dtype: str) -> list[float]:
    """The values that little-endian ``data`` encodes in ``dtype``, one by one.

    Example:
        >>> values_of(bytes.fromhex("803f0040"), "bfloat16")
        [1.0, 2.0]
    """
    if dtype == "bfloat16":
        out = []
        for i in range(0, len(data), 2):
            bits = (data[i] | data[i + 1] << 8) << 16
            out.append(float(np.array([bits], dtype=np.uint32).view(np.float32)[0]))
        return out
    if dtype in ("float32", "float16"):
        return [float(v) for v in np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))]
    if dtype == "float8_e4m3fn":
        return [e4m3_value(byte) for byte in data]
    raise ValueError(f"dtype={dtype!r}: no reference decoding")


def _pack(codes: Sequence[int]) -> bytes:
    """Two 4-bit codes per byte, the first in the low nibble."""
    return bytes(codes[i] | codes[i + 1] << 4 for i in range(0, len(codes), 2))


def fp4_block16_encode(values: Sequence[float]) -> tuple[bytes, bytes]:
    """``(packed codes, scale bytes)`` of a row of finite values in SGLang's
    ``fp4_mx_block16`` encoding, block by block of 16 consecutive values.

    Per block, in float32 as SGLang's compiled ``batched_quantize`` computes it: ``a`` is
    the largest magnitude, ``e = ceil(float32(log2(max(float32(a / 6), 1e-10))))`` and the
    scale byte ``e + 127``; each value ``y = x / 2**e`` takes the code whose magnitude is
    the number of thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 that ``|y|`` reaches (ties
    away from zero, beyond 6 saturating at 6), with the sign bit where ``y < 0``.

    Example:
        >>> packed, scales = fp4_block16_encode([3.0] * 15 + [0.375])
        >>> packed.hex(), list(scales)
        ('7777777777777727', [126])
    """
    if len(values) % 16:
        raise ValueError(f"len(values)={len(values)} is not whole blocks of 16")
    codes: list[int] = []
    scales = bytearray()
    for start in range(0, len(values), 16):
        block = [_f32(value) for value in values[start : start + 16]]
        largest = 0.0
        for value in block:
            largest = max(largest, abs(value))
        quotient = max(_f32(largest / 6.0), _f32(1e-10))
        exponent = math.ceil(_f32(math.log2(quotient)))
        scales.append(exponent + 127)
        for value in block:
            scaled = value / 2.0**exponent
            magnitude = sum(1 for threshold in _BLOCK16_THRESHOLDS if abs(scaled) >= threshold)
            codes.append((8 if scaled < 0 else 0) | magnitude)
    return _pack(codes), bytes(scales)


def fp4_block16_decode(packed: bytes, scales: bytes) -> list[float]:
    """The values a ``fp4_mx_block16`` row holds: each code's e2m1 value (signed, so code
    ``0x8`` is -0.0) times ``2 ** (scale byte - 127)`` of its block.

    Example:
        >>> fp4_block16_decode(bytes([0x8f] + [0] * 7), bytes([128]))[:3]
        [-12.0, -0.0, 0.0]
    """
    out: list[float] = []
    for index, byte in enumerate(packed):
        for code in (byte & 0xF, byte >> 4):
            value = E2M1_VALUES[code & 0x7] * 2.0 ** (scales[(2 * index) // 16] - 127)
            out.append(-value if code & 0x8 else value)
    return out


def _e2m1_nearest_even(value: float) -> int:
    """The e2m1 code nearest to ``value`` (ties to the even code), saturating at 6."""
    sign = 8 if math.copysign(1.0, value) < 0 else 0
    magnitude = min(abs(value), 6.0)
    best = 0
    for code in range(1, 8):
        distance, best_distance = (
            abs(E2M1_VALUES[code] - magnitude),
            abs(E2M1_VALUES[best] - magnitude),
        )
        if distance < best_distance or (distance == best_distance and code % 2 == 0):
            best = code
    return sign | best


def nvfp4_encode(values: Sequence[float], global_scale: float) -> tuple[bytes, bytes]:
    """``(packed codes, e4m3 scale bytes)`` of a head's row of finite values in NVFP4, per
    block of 16: the scale is the e4m3 byte of ``float32(max|x| / float32(6 g))``; each
    value becomes the e2m1 code nearest to ``float32(x / float32(scale * g))`` (ties to
    even, saturating at 6; 0 where the scale is 0); ``g = global_scale``.

    Example:
        >>> packed, scales = nvfp4_encode([6.0, -1.0] + [0.0] * 14, 1.0)
        >>> packed[:1].hex(), scales.hex()
        ('a7', '38')
    """
    if len(values) % 16:
        raise ValueError(f"len(values)={len(values)} is not whole blocks of 16")
    g = _f32(global_scale)
    codes: list[int] = []
    scales = bytearray()
    for start in range(0, len(values), 16):
        block = [_f32(value) for value in values[start : start + 16]]
        largest = 0.0
        for value in block:
            largest = max(largest, abs(value))
        scale_byte = e4m3_saturating_byte(_f32(largest / _f32(6.0 * g)))
        scales.append(scale_byte)
        denominator = _f32(e4m3_value(scale_byte) * g)
        for value in block:
            scaled = _f32(value / denominator) if denominator > 0 else math.copysign(0.0, value)
            codes.append(_e2m1_nearest_even(scaled))
    return _pack(codes), bytes(scales)


def mxfp8_block_encode(values: Sequence[float]) -> tuple[bytes, bytes]:
    """``(e4m3 bytes, e8m0 scale bytes)`` of a head's row in MXFP8, per block of 32: the
    scale byte ``b = clamp(ceil(float32(log2(float32(max(max|x|, 1e-30) / 448)))) + 127,
    0, 254)`` and each value ``clamp(x / 2**(b - 127), -448, 448)`` as e4m3 (ties to even).

    Example:
        >>> data, scales = mxfp8_block_encode([896.0] + [1.0] * 31)
        >>> data[:2].hex(), list(scales)
        ('7e30', [128])
    """
    if len(values) % 32:
        raise ValueError(f"len(values)={len(values)} is not whole blocks of 32")
    data = bytearray()
    scales = bytearray()
    for start in range(0, len(values), 32):
        block = [_f32(value) for value in values[start : start + 32]]
        largest = 1e-30
        for value in block:
            largest = max(largest, abs(value))
        exponent = math.ceil(_f32(math.log2(_f32(_f32(largest) / 448.0))))
        biased = min(max(exponent + 127, 0), 254)
        scales.append(biased)
        for value in block:
            scaled = min(max(_f32(value / 2.0 ** (biased - 127)), -_E4M3_MAX), _E4M3_MAX)
            data.append(e4m3_saturating_byte(scaled))
    return bytes(data), bytes(scales)


# --- per variant: what a write stores, where scales live, what the pool holds ----------------

#: Values per scale byte, per quantized variant.
_BLOCKS = {"mxfp8": 32, "fp4_mx_block16": 16, "nvfp4": 16, "fp4": 16}
#: Pages of this many tokens keep MXFP8's scales interleaved (FA4's layout).
_INTERLEAVED_PAGE = 128


def _dims(spec: Any) -> dict[str, int]:
    """Values of one token's K and V rows (MLA: the latent row, no V)."""
    if spec.family == "mla":
        return {"k": spec.kv_lora_rank + spec.qk_rope_head_dim}
    v_dim = spec.head_dim if spec.v_head_dim is None else spec.v_head_dim
    return {"k": spec.head_num * spec.head_dim, "v": spec.head_num * v_dim}


def payload_row_bytes(spec: Any, part: str) -> int:
    """Bytes of one token's stored K (``part="k"``; MLA: latent) or V row in a quantized pool:
    one per value for the fp8 variants, one per two values for FP4.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1,
        ...                 dtype="float4_e2m1fn_x2", kv_quant="nvfp4", head_num=2, head_dim=32)
        >>> payload_row_bytes(spec, "k")
        32
    """
    values = _dims(spec)[part]
    return values if spec.kv_quant in ("cpu_fp8", "mxfp8") else values // 2


def scale_row_bytes(spec: Any, part: str) -> int:
    """Scale bytes of one token's K (MLA: latent) or V row: one per block (0: none)."""
    block = _BLOCKS.get(spec.kv_quant)
    return 0 if block is None else _dims(spec)[part] // block


def encode_row(
    spec: Any, part: str, data: bytes, dtype: str, scale: float | None
) -> tuple[bytes, bytes]:
    """``(stored bytes, scale bytes)`` of one token's ``part`` row given as ``data`` in
    ``dtype`` (the caller's values): the quantized variant's encoding, head by head where
    the scales are per head. ``scale`` is the caller's ``k_scale``/``v_scale``: the CPU fp8
    method divides by it (in the payload's dtype), NVFP4 takes it as the global scale
    (default 1.0), ``fp4_mx_block16`` and MXFP8's fused write ignore it.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1,
        ...                 dtype="float8_e4m3fn", kv_quant="cpu_fp8", head_dim=2)
        >>> encode_row(spec, "k", bf16_bytes(3.0) + bf16_bytes(1000.0), "bfloat16", 2.0)
        (b'<~', b'')
    """
    values = values_of(data, dtype)
    quant = spec.kv_quant
    if quant == "cpu_fp8":
        divisor = 1.0 if scale is None else scale
        return bytes(e4m3_saturating_byte(round_to_dtype(v / divisor, dtype)) for v in values), b""
    if quant in ("fp4_mx_block16", "fp4"):
        return fp4_block16_encode(values)
    heads = spec.head_num
    per_head = len(values) // heads
    stored, scales = b"", b""
    for head in range(heads):
        row = values[head * per_head : (head + 1) * per_head]
        if quant == "nvfp4":
            packed, block_scales = nvfp4_encode(row, 1.0 if scale is None else scale)
        else:
            packed, block_scales = mxfp8_block_encode(row)
        stored, scales = stored + packed, scales + block_scales
    return stored, scales


def scale_buffer_names(spec: Any) -> tuple[str, ...]:
    """The scale buffers a quantized pool keeps, by attribute name (SGLang's)."""
    if spec.kv_quant == "fp4":
        return ("kv_scale_buffer",)
    if spec.kv_quant in ("mxfp8", "fp4_mx_block16"):
        return ("k_scale_buffer", "v_scale_buffer")
    if spec.kv_quant != "nvfp4":
        return ()
    names: tuple[str, ...] = ()
    if "linear" in spec.nvfp4_scales:
        names += ("k_scale_buffer", "v_scale_buffer")
    if "native" in spec.nvfp4_scales:
        names += ("native_k_scale_buffer", "native_v_scale_buffer")
    return names


def _paged(spec: Any, name: str) -> bool:
    """Whether ``name`` keeps a page per row (MXFP8 interleaved, NVFP4 native)."""
    interleaved = spec.kv_quant == "mxfp8" and spec.page_size == _INTERLEAVED_PAGE
    return name.startswith("native_") or interleaved


def render_scales(spec: Any, name: str, scales: dict[int, bytes]) -> np.ndarray:
    """Scale buffer ``name`` of one layer as ``[rows, row bytes]`` uint8, from each slot's
    scale bytes (``[heads, blocks]`` in order; a missing slot holds zeros): a row per slot,
    or for a paged layout a row per page, where token offset ``o`` and head ``h``'s block
    ``s`` sits at ``h * 128 * B + ((o % 32) * 4 + o // 32) * B + s`` (MXFP8 interleaved),
    ``h * P * B + o * B + s`` (NVFP4 native K) or ``h * P * B + ((o // 4) * 4 + s // (B // 4))
    * B + (s % (B // 4)) * 4 + o % 4`` (NVFP4 native V); ``B`` blocks a head, ``P`` the page.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> spec = PoolSpec(family="mha", size=128, page_size=128, layer_num=1,
        ...                 dtype="float8_e4m3fn", kv_quant="mxfp8", head_dim=128)
        >>> rendered = render_scales(spec, "k_scale_buffer", {33: bytes([1, 2, 3, 4])})
        >>> rendered.shape, [int(i) for i in np.flatnonzero(rendered[0])]
        ((2, 512), [20, 21, 22, 23])
    """
    part = "v" if name.startswith(("v_", "native_v")) else "k"
    row = scale_row_bytes(spec, part)
    slots = spec.size + spec.page_size
    if not _paged(spec, name):
        out = np.zeros((slots, row), dtype=np.uint8)
        for slot, data in scales.items():
            out[slot] = np.frombuffer(data, dtype=np.uint8)
        return out
    page = spec.page_size
    heads = spec.head_num
    blocks = row // heads
    out = np.zeros((slots // page, page * row), dtype=np.uint8)
    for slot, data in scales.items():
        offset = slot % page
        for head in range(heads):
            for s in range(blocks):
                if name.startswith("native_v"):
                    group = blocks // 4
                    at = ((offset // 4) * 4 + s // group) * blocks + (s % group) * 4 + offset % 4
                elif name.startswith("native_k"):
                    at = offset * blocks + s
                else:
                    at = ((offset % 32) * 4 + offset // 32) * blocks + s
                out[slot // page, head * page * blocks + at] = data[head * blocks + s]
    return out


def quantized_kv_size_bytes(spec: Any) -> tuple[int, int] | int:
    """What ``get_kv_size_bytes()`` of a quantized pool must return: per part, every
    layer's payload and scale bytes (each scale layout it keeps), plus NVFP4's shared dequant
    workspace once (fp8, a byte per value); MLA FP4: one int.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> quantized_kv_size_bytes(PoolSpec(family="mla", size=4, page_size=2, layer_num=2,
        ...     dtype="float4_e2m1fn_x2", kv_quant="fp4", kv_lora_rank=32, qk_rope_head_dim=16))
        324
    """
    rows = spec.size + spec.page_size
    layouts = max(1, len(scale_buffer_names(spec)) // 2)
    sizes = []
    for part in _dims(spec):
        per_token = payload_row_bytes(spec, part) + layouts * scale_row_bytes(spec, part)
        total = spec.layer_num * rows * per_token
        if spec.dequant_workspace:
            total += rows * _dims(spec)[part]
        sizes.append(total)
    if spec.family == "mla":
        return sizes[0]
    return sizes[0], sizes[1]


def quantized_scale_buf_infos(spec: Any) -> tuple[list[int], list[int]]:
    """``(lens, item_lens)`` of ``get_kv_scale_buf_infos()``: every scale buffer (each
    layout's K buffers of every layer, then its V buffers), its bytes and one page (a
    token-major buffer's ``page_size`` rows, a paged buffer's one row).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> quantized_scale_buf_infos(PoolSpec(family="mha", size=4, page_size=2,
        ...     layer_num=1, dtype="float8_e4m3fn", kv_quant="mxfp8", head_dim=64))
        ([12, 12], [4, 4])
    """
    rows = spec.size + spec.page_size
    lens: list[int] = []
    item_lens: list[int] = []
    for name in scale_buffer_names(spec):
        part = "v" if name.startswith(("v_", "native_v")) else "k"
        nbytes = rows * scale_row_bytes(spec, part)
        page = spec.page_size * scale_row_bytes(spec, part)
        lens += [nbytes] * spec.layer_num
        item_lens += [page] * spec.layer_num
    return lens, item_lens
