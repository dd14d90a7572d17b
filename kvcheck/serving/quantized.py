"""Quantized KV caches in serving: the pool each quantized ``--kv-cache-dtype`` selects,
and what one token costs in it, scale buffers included.

SGLang 0.5.23's quantized ``--kv-cache-dtype`` choices select these kvcheck variants
(``PoolSpec.variant``):

* ``mxfp8``: ``mha:mxfp8`` (``mha:mxfp8:flat`` off 128-token pages), fp8 values and one
  e8m0 scale per 32 values of a head;
* ``nvfp4``: ``mha:nvfp4``, packed e2m1 values, one e4m3 scale per 16 values of a head in
  the layouts :data:`SERVING_NVFP4_LAYOUT` names, and the shared fp8 dequant workspace;
* ``fp4_mx_block16``: ``mha:fp4_mx_block16``, packed e2m1 values and one exponent byte per
  16 values of the flattened heads;
* ``nvfp4`` and ``fp4_mx_block16`` on an MLA model: ``mla:fp4`` (the storage dtype is FP4,
  and an FP4 MLA cache is the block-16 latent pool whatever the recipe).

The bytes are not a formula of their own: :func:`quantized_pool_spec` describes the pool
kvcheck builds, and :mod:`kvcheck.geometry` (the one home of row and buffer sizes, which
kvcheck's pools are tested against) says what its buffers hold. DSA models and MXFP8 MLA
have no quantized pool in kvcheck (``ValueError``).

Example (Qwen3-Embedding-8B, 36 layers of 8 KV heads of 128: 147456 bf16 bytes a token):
    >>> from kvcheck.vocabulary import QWEN3_EMBEDDING_8B
    >>> quantized_cell_bytes(QWEN3_EMBEDDING_8B, "mxfp8", layer_num=36)
    QuantizedCell(payload=73728, scales=2304, workspace=0)
    >>> quantized_pool_spec(QWEN3_EMBEDDING_8B, "nvfp4", num_tokens=64, page_size=64,
    ...                     layer_num=36).variant
    'mha:nvfp4'
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from kvcheck.geometry import WORKSPACE_BUFFERS, row_bytes, scale_buffer_shapes, scale_row_bytes
from kvcheck.serving.model_config import ModelConfig
from kvcheck.specs import QUANT_DTYPES, PoolSpec

__all__ = [
    "QUANTIZED_KV_CACHE_DTYPES",
    "SERVING_NVFP4_LAYOUT",
    "QuantizedCell",
    "is_quantized_kv_cache_dtype",
    "quantized_cell_bytes",
    "quantized_pool_spec",
]

#: SGLang 0.5.23's ``--kv-cache-dtype`` choices that select a pool with scale buffers.
QUANTIZED_KV_CACHE_DTYPES: tuple[str, ...] = ("mxfp8", "nvfp4", "fp4_mx_block16")
#: The NVFP4 scale layouts serving sizes and builds: token-linear e4m3 scales with the
#: shared fp8 dequant workspace, what SGLang allocates for a FlashInfer prefill backend
#: with a decode backend that does not read TRT-LLM's native scales.
SERVING_NVFP4_LAYOUT = "linear+dq"


class QuantizedCell(NamedTuple):
    """Bytes one token costs in a quantized pool, over the pool's layers.

    ``payload``: the encoded K/V (or latent) values; ``scales``: their block scales, in
    every layout the pool keeps; ``workspace``: NVFP4's fp8 dequant workspace, one row per
    token shared by every layer (0 for the other variants).
    """

    payload: int
    scales: int
    workspace: int

    @property
    def total(self) -> int:
        """All bytes one token costs: SGLang's ``cell_size``."""
        return self.payload + self.scales + self.workspace


def is_quantized_kv_cache_dtype(name: object) -> bool:
    """Whether ``name`` is a ``--kv-cache-dtype`` that selects a pool with scale buffers.

    Example:
        >>> is_quantized_kv_cache_dtype("nvfp4"), is_quantized_kv_cache_dtype("bfloat16")
        (True, False)
    """
    return isinstance(name, str) and name in QUANTIZED_KV_CACHE_DTYPES


def quantized_pool_spec(
    config: ModelConfig,
    kv_cache_dtype: str,
    *,
    num_tokens: int,
    page_size: int,
    layer_num: int,
    start_layer: int = 0,
) -> PoolSpec:
    """The :class:`~kvcheck.specs.PoolSpec` of the pool ``kv_cache_dtype`` selects for
    ``config`` (see the module docstring), holding ``num_tokens`` tokens.

    Raises ``ValueError`` naming ``kv_cache_dtype`` (one of
    :data:`QUANTIZED_KV_CACHE_DTYPES`) or the model when kvcheck has no such pool, and the
    spec's own ``ValueError`` when the model's shapes cannot hold the variant's blocks
    (MXFP8 needs head dims that are multiples of 32, say).

    Example:
        >>> from kvcheck.vocabulary import QWEN3_EMBEDDING_8B
        >>> spec = quantized_pool_spec(QWEN3_EMBEDDING_8B, "mxfp8", num_tokens=128,
        ...                            page_size=128, layer_num=1)
        >>> spec.variant, spec.dtype
        ('mha:mxfp8', 'float8_e4m3fn')
    """
    kv_quant = _kv_quant(config, kv_cache_dtype)
    common: dict[str, Any] = {
        "size": num_tokens,
        "page_size": page_size,
        "layer_num": layer_num,
        "start_layer": start_layer,
        "dtype": QUANT_DTYPES[kv_quant][0],
        "kv_quant": kv_quant,
    }
    if kv_quant == "fp4":
        return PoolSpec(
            family="mla",
            kv_lora_rank=config.kv_lora_rank,
            qk_rope_head_dim=config.qk_rope_head_dim,
            **common,
        )
    if kv_quant == "nvfp4":
        common["nvfp4_layout"] = SERVING_NVFP4_LAYOUT
    return PoolSpec(
        family="mha",
        head_num=config.num_key_value_heads,
        head_dim=config.head_dim,
        v_head_dim=config.effective_v_head_dim,
        **common,
    )


def quantized_cell_bytes(
    config: ModelConfig, kv_cache_dtype: str, *, layer_num: int
) -> QuantizedCell:
    """Bytes one token costs over ``layer_num`` layers of the pool ``kv_cache_dtype``
    selects: payload and scale rows per layer, plus NVFP4's shared workspace row once.

    Same refusals as :func:`quantized_pool_spec`.

    Example:
        >>> from kvcheck.vocabulary import QWEN3_EMBEDDING_8B
        >>> quantized_cell_bytes(QWEN3_EMBEDDING_8B, "nvfp4", layer_num=36)
        QuantizedCell(payload=36864, scales=4608, workspace=2048)
    """
    if isinstance(layer_num, bool) or not isinstance(layer_num, int) or layer_num < 1:
        raise ValueError(f"layer_num={layer_num!r} must be an int >= 1")
    # One page of one layer: rows and scales per token do not depend on the size, and a
    # whole page satisfies MXFP8's interleaved layout.
    page = 128 if kv_cache_dtype == "mxfp8" else 1
    spec = quantized_pool_spec(config, kv_cache_dtype, num_tokens=page, page_size=page, layer_num=1)
    workspace = sum(
        math.prod(shape[1:])  # [rows, heads, dim] fp8: one byte per value of a row
        for name, shape in scale_buffer_shapes(spec).items()
        if name in WORKSPACE_BUFFERS
    )
    return QuantizedCell(
        payload=layer_num * sum(row_bytes(spec)),
        scales=layer_num * sum(scale_row_bytes(spec)) * _scale_layouts(spec),
        workspace=workspace,
    )


def _scale_layouts(spec: PoolSpec) -> int:
    """How many copies of each scale the pool keeps (NVFP4 can keep two layouts)."""
    return max(1, len(spec.nvfp4_scales))


def _kv_quant(config: ModelConfig, kv_cache_dtype: str) -> str:
    """kvcheck's ``kv_quant`` for ``kv_cache_dtype`` on ``config``'s attention family."""
    if not isinstance(config, ModelConfig):
        raise ValueError(f"config={config!r} must be a ModelConfig")
    if not is_quantized_kv_cache_dtype(kv_cache_dtype):
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r} is not a quantized --kv-cache-dtype; "
            f"use one of {QUANTIZED_KV_CACHE_DTYPES}"
        )
    if config.is_dsa:
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r}: kvcheck has no quantized DSA pool "
            f"({config.name!r} is a DSA model)"
        )
    if config.uses_latent_cache:
        if kv_cache_dtype == "mxfp8":
            raise ValueError(
                f"kv_cache_dtype='mxfp8': kvcheck's MXFP8 pool is MHA only ({config.name!r} "
                "is an MLA model)"
            )
        return "fp4"
    return kv_cache_dtype
