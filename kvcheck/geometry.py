"""Byte geometry of the pools kvcheck models: one home for row, page and buffer sizes.

Strategies size the rows they draw with it, properties lay out and name bytes with it, and
:mod:`kvcheck.memory` predicts the tensors a pool must allocate with it. The reference
model (:mod:`kvcheck.reference`) keeps formulas of its own on purpose: the tests hold the
two against each other, so a mistake in either shows as a disagreement instead of being
shared by the pool check and its expectation.

Per token and layer a pool stores:

- MHA (and the no-op pool's placeholders): a K row of ``head_num * head_dim`` values and a
  V row of ``head_num * v_head_dim`` values;
- MLA and DSA: one latent row of ``kv_lora_rank + qk_rope_head_dim`` values (a DSA spec
  with ``latent_layout="scaled"``: :func:`scaled_fp8_latent_row_bytes` bytes instead);
- DSA, on layers that are not skip layers: ``index_head_dim`` fp8 key bytes and one fp32
  scale per block of 128 channels, stored by page (keys of the page first, then scales);
  with an index kpool, one such key per ``index_kpool`` tokens, and with compress tails
  a bf16 ring of keys and one of scores per request slot (SGLang's private
  ``_compress_tail_k`` / ``_compress_tail_score``).

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> spec = PoolSpec(family="dsa", size=8, page_size=4, layer_num=2, dtype="bfloat16",
    ...                 skip_topk_layers=(False, True))
    >>> row_bytes(spec), index_token_bytes(spec.index_head_dim), num_index_pages(spec)
    ((48, 0), 132, 3)
    >>> tensor_nbytes(spec)["index_k_with_scale_buffer"]
    [1584, 0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from kvcheck.specs import DSA_QUANT_BLOCK, MXFP8_INTERLEAVED_PAGE, QUANT_BLOCKS, PoolSpec

__all__ = [
    "COMPRESS_TAIL_BUFFERS",
    "FAMILY_BUFFERS",
    "INDEX_BUFFER",
    "KV_BUFFER_ATTRIBUTES",
    "SCALE_BUFFERS",
    "WORKSPACE_BUFFERS",
    "allocated_bytes",
    "buffer_bytes",
    "fused_kv",
    "index_k_row_bytes",
    "index_scale_row_bytes",
    "index_token_bytes",
    "latent_row_bytes",
    "latent_width",
    "num_index_pages",
    "row_bytes",
    "row_elements",
    "scale_buffer_shapes",
    "scale_row_bytes",
    "scaled_fp8_latent_row_bytes",
    "tensor_nbytes",
]

#: The DSA pool's paged index-K buffer (keys and scales of a page in one row).
INDEX_BUFFER = "index_k_with_scale_buffer"

#: Pool attributes that hold the KV cache, one tensor per local layer (SGLang's names), in
#: the order failures and reports name them.
#: The DSA pool's per-request compress tails (keys, scores), one tensor per local layer.
COMPRESS_TAIL_BUFFERS: tuple[str, ...] = ("_compress_tail_k", "_compress_tail_score")
#: A quantized pool's block scales, one tensor per local layer: MHA K and V scales in the
#: token-linear (or, MXFP8 on 128-token pages, FA4's interleaved) layout, NVFP4's
#: TRT-LLM native layout, and MLA FP4's latent-row scales (SGLang's names).
SCALE_BUFFERS: tuple[str, ...] = (
    "k_scale_buffer",
    "v_scale_buffer",
    "native_k_scale_buffer",
    "native_v_scale_buffer",
    "kv_scale_buffer",
)
#: NVFP4's dequant workspace: one fp8 K and one V tensor shared by every layer (scratch:
#: held and counted, never compared).
WORKSPACE_BUFFERS: tuple[str, ...] = ("dq_k_buffer", "dq_v_buffer")
KV_BUFFER_ATTRIBUTES: tuple[str, ...] = (
    "k_buffer",
    "v_buffer",
    "kv_buffer",
    INDEX_BUFFER,
    *COMPRESS_TAIL_BUFFERS,
    *SCALE_BUFFERS,
    *WORKSPACE_BUFFERS,
)

#: The buffers each pool family holds.
FAMILY_BUFFERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mha": ("k_buffer", "v_buffer"),
        "noop": ("k_buffer", "v_buffer"),
        "mla": ("kv_buffer",),
        "dsa": ("kv_buffer", INDEX_BUFFER),
    }
)

_FP32_BYTES = 4
_BF16_BYTES = 2


def _checked(spec: object) -> PoolSpec:
    if not isinstance(spec, PoolSpec):
        raise ValueError(f"spec={spec!r} is not a kvcheck.specs.PoolSpec")
    return spec


def latent_width(spec: PoolSpec) -> int:
    """Values in one MLA/DSA latent row: ``kv_lora_rank + qk_rope_head_dim``.

    Example:
        >>> latent_width(PoolSpec(family="mla", size=2, page_size=1, layer_num=1,
        ...                       dtype="bfloat16", kv_lora_rank=512, qk_rope_head_dim=64))
        576
    """
    spec = _checked(spec)
    return spec.kv_lora_rank + spec.qk_rope_head_dim


def scaled_fp8_latent_row_bytes(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """Bytes of one fp8 DSA latent row in SGLang 0.5.23's scaled layout: the
    ``kv_lora_rank`` values in fp8, one fp32 scale per block of 128 of them, and the rope
    part kept in bf16 (kvcheck's pools store the raw ``kv_lora_rank + qk_rope_head_dim``
    fp8 bytes instead).

    Example:
        >>> scaled_fp8_latent_row_bytes(512, 64), 512 + 64
        (656, 576)
    """
    for name, value in (("kv_lora_rank", kv_lora_rank), ("qk_rope_head_dim", qk_rope_head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be an int >= 0")
    blocks = -(-kv_lora_rank // DSA_QUANT_BLOCK)
    return kv_lora_rank + blocks * _FP32_BYTES + qk_rope_head_dim * _BF16_BYTES


def latent_row_bytes(spec: PoolSpec) -> int:
    """Bytes of one MLA/DSA latent row in the spec's layout: ``latent_width * itemsize``
    (``raw``), or :func:`scaled_fp8_latent_row_bytes` (``scaled``).

    Example:
        >>> spec = PoolSpec(family="dsa", size=2, page_size=1, layer_num=1,
        ...                 dtype="float8_e4m3fn", kv_lora_rank=512, qk_rope_head_dim=64)
        >>> latent_row_bytes(spec), latent_row_bytes(
        ...     PoolSpec(**{**spec.__dict__, "latent_layout": "scaled"}))
        (576, 656)
    """
    spec = _checked(spec)
    if spec.latent_layout == "scaled":
        return scaled_fp8_latent_row_bytes(spec.kv_lora_rank, spec.qk_rope_head_dim)
    return latent_width(spec) * spec.itemsize


def row_elements(spec: PoolSpec) -> tuple[int, int]:
    """(K or latent values, V values or 0) one token stores in one layer.

    Example:
        >>> row_elements(PoolSpec(family="mha", size=2, page_size=1, layer_num=1,
        ...                       dtype="bfloat16", head_num=2, head_dim=4, v_head_dim=3))
        (8, 6)
    """
    spec = _checked(spec)
    if spec.family in ("mha", "noop"):
        return spec.head_num * spec.head_dim, spec.head_num * spec.effective_v_head_dim
    return latent_width(spec), 0


def row_bytes(spec: PoolSpec) -> tuple[int, int]:
    """(K or latent bytes, V bytes or 0) one token stores in one layer (a scaled latent
    row: :func:`latent_row_bytes`; packed FP4: half a byte per value).

    Example:
        >>> row_bytes(PoolSpec(family="mha", size=2, page_size=1, layer_num=1,
        ...                    dtype="bfloat16", head_num=2, head_dim=4, v_head_dim=3))
        (16, 12)
        >>> row_bytes(PoolSpec(family="mla", size=2, page_size=1, layer_num=1,
        ...                    dtype="float4_e2m1fn_x2", kv_quant="fp4", kv_lora_rank=32,
        ...                    qk_rope_head_dim=16))
        (24, 0)
    """
    if _checked(spec).latent_layout == "scaled":
        return latent_row_bytes(spec), 0
    key, value = row_elements(spec)
    if spec.kv_quant in ("fp4_mx_block16", "nvfp4", "fp4"):
        return key // 2, value // 2
    return key * spec.itemsize, value * spec.itemsize


def scale_row_bytes(spec: PoolSpec) -> tuple[int, int]:
    """(K or latent scale bytes, V scale bytes) one token holds in one layer: a byte per
    block of :data:`kvcheck.specs.QUANT_BLOCKS` values (e8m0 for MXFP8 and the block-16
    FP4 encoding, e4m3 for NVFP4, in each layout it keeps); ``(0, 0)`` without scales.

    Example:
        >>> scale_row_bytes(PoolSpec(family="mha", size=2, page_size=1, layer_num=1,
        ...                          dtype="float8_e4m3fn", kv_quant="mxfp8", head_num=2,
        ...                          head_dim=64, v_head_dim=32))
        (4, 2)
    """
    block = QUANT_BLOCKS.get(_checked(spec).kv_quant)
    if block is None:
        return 0, 0
    key, value = row_elements(spec)
    return key // block, value // block


def scale_buffer_shapes(spec: PoolSpec) -> dict[str, tuple[int, ...]]:
    """The shape of each scale and workspace buffer a quantized pool holds (SGLang's):
    ``k_scale_buffer``/``v_scale_buffer`` ``[rows, head_num * dim // 16]``
    (``fp4_mx_block16``: blocks run over the flattened heads), ``[rows, head_num,
    dim // 16]`` (NVFP4 linear) or ``[rows, head_num, dim // 32]`` (MXFP8 flat),
    ``[pages, head_num, 32, 4, dim // 32]`` (MXFP8 on 128-token pages, FA4's layout);
    NVFP4 native ``[pages, head_num, page_size, dim // 16]``; MLA FP4 ``kv_scale_buffer``
    ``[rows, (kv_lora_rank + qk_rope_head_dim) // 16]``; NVFP4's shared dequant workspace
    ``[rows, head_num, dim]`` fp8. ``rows = size + page_size``.

    Example:
        >>> spec = PoolSpec(family="mha", size=128, page_size=128, layer_num=1,
        ...                 dtype="float8_e4m3fn", kv_quant="mxfp8", head_dim=128)
        >>> scale_buffer_shapes(spec)["k_scale_buffer"]
        (2, 1, 32, 4, 4)
    """
    spec = _checked(spec)
    rows, heads, quant = spec.num_slots, spec.head_num, spec.kv_quant
    dims = {"k": spec.head_dim, "v": spec.effective_v_head_dim}
    shapes: dict[str, tuple[int, ...]] = {}
    if quant == "fp4":
        return {"kv_scale_buffer": (rows, latent_width(spec) // 16)}
    if quant == "fp4_mx_block16":
        return {f"{p}_scale_buffer": (rows, heads * d // 16) for p, d in dims.items()}
    if quant == "mxfp8":
        for part, dim in dims.items():
            if spec.page_size == MXFP8_INTERLEAVED_PAGE:
                shape: tuple[int, ...] = (rows // spec.page_size, heads, 32, 4, dim // 32)
            else:
                shape = (rows, heads, dim // 32)
            shapes[f"{part}_scale_buffer"] = shape
    if quant == "nvfp4":
        for part, dim in dims.items():
            if "linear" in spec.nvfp4_scales:
                shapes[f"{part}_scale_buffer"] = (rows, heads, dim // 16)
            if "native" in spec.nvfp4_scales:
                pages = rows // spec.page_size
                shapes[f"native_{part}_scale_buffer"] = (pages, heads, spec.page_size, dim // 16)
        if spec.dequant_workspace:
            for part, dim in dims.items():
                shapes[f"dq_{part}_buffer"] = (rows, heads, dim)
    return shapes


def index_k_row_bytes(index_head_dim: int) -> int:
    """fp8 key bytes one token takes in a DSA index-K page: one byte per channel.

    Example:
        >>> index_k_row_bytes(128)
        128
    """
    if isinstance(index_head_dim, bool) or not isinstance(index_head_dim, int):
        raise ValueError(f"index_head_dim={index_head_dim!r} must be an int")
    if index_head_dim < DSA_QUANT_BLOCK or index_head_dim % DSA_QUANT_BLOCK:
        raise ValueError(
            f"index_head_dim={index_head_dim} must be a positive multiple of {DSA_QUANT_BLOCK}"
        )
    return index_head_dim


def index_scale_row_bytes(index_head_dim: int) -> int:
    """fp32 scale bytes one token takes: one float per block of 128 channels.

    Example:
        >>> index_scale_row_bytes(256)
        8
    """
    return index_k_row_bytes(index_head_dim) // DSA_QUANT_BLOCK * _FP32_BYTES


def index_token_bytes(index_head_dim: int) -> int:
    """Key plus scale bytes one token takes in a DSA index-K page.

    Example:
        >>> index_token_bytes(128)
        132
    """
    return index_k_row_bytes(index_head_dim) + index_scale_row_bytes(index_head_dim)


def num_index_pages(spec: PoolSpec) -> int:
    """Pages (rows) of each non-skip DSA index-K buffer: every page the index buffer's
    tokens can reach, plus the padding page (``(index_buf_size + page_size + 1) //
    page_size``, as SGLang sizes it).

    Example:
        >>> num_index_pages(PoolSpec(family="dsa", size=8, page_size=2, layer_num=1,
        ...                          dtype="bfloat16"))
        5
    """
    spec = _checked(spec)
    return (spec.effective_index_buf_size + spec.page_size + 1) // spec.page_size


def tensor_nbytes(spec: PoolSpec) -> dict[str, list[int]]:
    """Bytes each KV buffer of a pool built from ``spec`` must have, per local layer.

    MHA ``k_buffer``/``v_buffer`` hold ``size + page_size`` rows (the padding page), the
    no-op pool one placeholder page; MLA/DSA ``kv_buffer`` ``size + page_size`` latent rows;
    DSA ``index_k_with_scale_buffer`` :func:`num_index_pages` pages of
    ``page_size // index_kpool`` index slots on non-skip layers and nothing on skip layers,
    and with compress tails ``_compress_tail_k``/``_compress_tail_score`` of
    ``max_running_requests + 1`` rings of ``index_kpool + tail_extra_slots`` bf16 rows each
    (nothing on skip layers).

    Example:
        >>> tensor_nbytes(PoolSpec(family="dsa", size=2, page_size=2, layer_num=2,
        ...                        dtype="bfloat16", kv_lora_rank=4, qk_rope_head_dim=2,
        ...                        skip_topk_layers=(True, False)))
        {'kv_buffer': [48, 48], 'index_k_with_scale_buffer': [0, 528]}
    """
    spec = _checked(spec)
    layers = spec.layer_num
    key, value = row_bytes(spec)
    scales = {
        # The dequant workspace is one tensor shared by every layer.
        name: [math.prod(shape)] * (1 if name.startswith("dq_") else layers)
        for name, shape in scale_buffer_shapes(spec).items()
    }
    if spec.family in ("mha", "noop"):
        rows = spec.page_size if spec.family == "noop" else spec.num_slots
        return {"k_buffer": [rows * key] * layers, "v_buffer": [rows * value] * layers, **scales}
    result = {"kv_buffer": [spec.num_slots * key] * layers, **scales}
    if spec.family == "dsa":
        if len(spec.skip_mask) != layers:
            raise ValueError(
                f"spec.skip_topk_layers has {len(spec.skip_mask)} entries, layer_num={layers}"
            )
        page = spec.index_page_size * index_token_bytes(spec.index_head_dim)
        full = num_index_pages(spec) * page
        result[INDEX_BUFFER] = [0 if skip else full for skip in spec.skip_mask]
        if spec.compress_tails:
            ring = spec.tail_width * spec.index_head_dim * _BF16_BYTES
            tail = spec.tail_requests * ring
            for name in COMPRESS_TAIL_BUFFERS:
                result[name] = [0 if skip else tail for skip in spec.skip_mask]
    return result


def fused_kv(spec: PoolSpec) -> bool:
    """Whether each layer's K and V buffers are the two halves of one allocation, each
    padded to whole pages: MHA (and the no-op pool) when ``v_head_dim`` equals
    ``head_dim``, as SGLang 0.5.23 allocates them, unless the spec says its target does not
    pad (``kv_page_padding=False``).

    Example:
        >>> fused_kv(PoolSpec(family="mha", size=2, page_size=1, layer_num=1,
        ...                   dtype="bfloat16", head_dim=4, v_head_dim=2))
        False
    """
    spec = _checked(spec)
    if spec.quantized:  # the quantized pools allocate each buffer on its own
        return False
    return (
        spec.kv_page_padding
        and spec.family in ("mha", "noop")
        and spec.head_dim == spec.effective_v_head_dim
    )


def allocated_bytes(spec: PoolSpec) -> int:
    """Bytes the storages behind a pool's KV buffers hold: :func:`buffer_bytes` plus, for
    fused K/V, each half's padding to whole pages (a size that is not whole pages leaves
    up to ``page_size - 1`` rows of every half unused).

    Example:
        >>> spec = PoolSpec(family="mha", size=3, page_size=2, layer_num=1,
        ...                 dtype="bfloat16", head_num=1, head_dim=4)
        >>> buffer_bytes(spec), allocated_bytes(spec)
        (80, 96)
    """
    if not fused_kv(spec):
        return buffer_bytes(spec)
    key, _ = row_bytes(spec)
    rows = spec.page_size if spec.family == "noop" else spec.num_slots
    pages = -(-rows // spec.page_size)
    return spec.layer_num * 2 * pages * spec.page_size * key


def buffer_bytes(spec: PoolSpec) -> int:
    """All KV buffer bytes of a pool built from ``spec`` (the sum of :func:`tensor_nbytes`).

    Example:
        >>> buffer_bytes(PoolSpec(family="mla", size=2, page_size=2, layer_num=3,
        ...                       dtype="float16", kv_lora_rank=4, qk_rope_head_dim=2))
        144
    """
    return sum(sum(sizes) for sizes in tensor_nbytes(spec).values())
