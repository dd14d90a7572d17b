"""KV-pool sizing: bytes per token, bytes of a built pool, and the token capacity of a budget.

Per token, over the layers a pool holds (``itemsize`` of the KV dtype; fp8 is 1 byte):

* MHA: ``layers * num_key_value_heads * (head_dim + v_head_dim) * itemsize``
* MLA: ``layers * (kv_lora_rank + qk_rope_head_dim) * itemsize``
* DSA: MLA's latent rows, except that a ``float8_e4m3fn`` pool stores SGLang's scaled row
  (:func:`latent_kv_cache_dim`: ``kv_lora_rank`` fp8 values, one fp32 scale per 128 of
  them, the rope values in bf16; 656 bytes for 512 + 64), plus ``indexer_layers *
  (index_head_dim + index_head_dim // 128 * 4)``: an fp8 key byte per channel and one fp32
  scale per 128 channels. ``indexer_layers`` counts the layers that do not reuse an earlier
  top-k (:func:`~kvcheck.serving.dsa_layer_skips_topk`); a draft worker or HiSparse
  allocates every layer's indexer, as SGLang does, and with HiSparse each token has
  :data:`HISPARSE_HOST_TO_DEVICE_RATIO` index slots (the index buffer spans the
  host-expanded logical ids).

A quantized ``--kv-cache-dtype`` (``mxfp8``, ``nvfp4``, ``fp4_mx_block16``: pass it as
``dtype``) costs what its pool holds (:mod:`kvcheck.serving.quantized`): the encoded
payload, its block scales per layer and, for NVFP4, a dequant workspace row shared by
every layer.

:func:`cell_size_bytes` is that per-token figure (SGLang's ``cell_size``). A built pool
holds more than ``size * cell_size``: every token buffer has ``size + page_size`` rows
(SGLang's padding page), and each DSA index-K buffer holds
``(index_buf_size + page_size + 1) // page_size`` whole pages of ``page_size`` tokens, with
``index_buf_size`` from :func:`index_buf_size` (``size``, or ``size`` times the HiSparse
ratio). :func:`pool_bytes` counts exactly those tensors, and
:func:`max_total_num_tokens` is the largest multiple of ``page_size`` whose pools fit in
the budget. SGLang itself divides the budget by ``cell_size`` and rounds down to a page,
which can overshoot by the padding page and the index-page rounding; kvcheck's answer is
at most two pages smaller and never overshoots.

Example (DeepSeek-V3.2 in bf16: 61 * 576 * 2 latent bytes + 61 * 132 indexer bytes):
    >>> from kvcheck.vocabulary import DEEPSEEK_V3_2
    >>> cell_size_bytes(DEEPSEEK_V3_2, dtype="bfloat16")
    78324
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.geometry import buffer_bytes
from kvcheck.serving.model_config import ModelConfig, layer_window, skip_topk_layers
from kvcheck.serving.quantized import (
    is_quantized_kv_cache_dtype,
    quantized_cell_bytes,
    quantized_pool_spec,
)
from kvcheck.specs import DSA_QUANT_BLOCK, DTYPE_ITEMSIZE

#: Bytes of one fp32 scale stored beside each 128-channel block of a DSA index key (and of
#: a scaled fp8 latent row).
_SCALE_BYTES = 4
#: Bytes of one bf16 rope value in a scaled fp8 DSA latent row.
_ROPE_BYTES = 2
#: The KV dtype whose DSA latent rows SGLang 0.5.23 stores scaled
#: (``calculate_mla_kv_cache_dim``, unless a trtllm or tilelang DSA backend is chosen).
SCALED_LATENT_KV_DTYPE = "float8_e4m3fn"
#: SGLang 0.5.23's default HiSparse ``host_to_device_ratio`` (``parse_hisparse_config``):
#: ``HiSparseDSATokenToKVPool`` builds its index-K buffer for ``size`` times this many
#: tokens, and the configurator charges each indexer layer that many times.
HISPARSE_HOST_TO_DEVICE_RATIO = 2


def kv_torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """The torch dtype a KV pool is built with, from a torch dtype or its name.

    Accepted: float32, bfloat16, float16, float8_e4m3fn, float8_e5m2 (the dtypes the pools
    store). Anything else raises ValueError naming ``dtype``.

    Example:
        >>> kv_torch_dtype("float8_e4m3fn")
        torch.float8_e4m3fn
    """
    name = dtype.removeprefix("torch.") if isinstance(dtype, str) else _torch_dtype_name(dtype)
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(
            f"dtype={dtype!r} is not a KV-pool dtype; use one of {sorted(DTYPE_ITEMSIZE)}"
        )
    return getattr(torch, name)


def index_k_bytes_per_token(index_head_dim: int) -> int:
    """Bytes one token's DSA index key takes in one layer: fp8 key bytes plus fp32 scales.

    Example:
        >>> index_k_bytes_per_token(128)
        132
    """
    if isinstance(index_head_dim, bool) or not isinstance(index_head_dim, int):
        raise ValueError(f"index_head_dim={index_head_dim!r} must be an int")
    if index_head_dim <= 0 or index_head_dim % DSA_QUANT_BLOCK != 0:
        raise ValueError(
            f"index_head_dim={index_head_dim} must be a positive multiple of {DSA_QUANT_BLOCK}"
        )
    return index_head_dim + index_head_dim // DSA_QUANT_BLOCK * _SCALE_BYTES


def latent_kv_cache_dim(config: ModelConfig, *, dtype: torch.dtype | str) -> int:
    """Elements of one MLA/DSA latent row (bytes, for fp8), SGLang's ``kv_cache_dim``.

    ``kv_lora_rank + qk_rope_head_dim``, except for a DSA model in ``float8_e4m3fn``: the
    scaled row of ``kv_lora_rank + kv_lora_rank // 128 * 4 + qk_rope_head_dim * 2`` bytes.
    That row needs ``kv_lora_rank`` to be a multiple of 128 (one scale per block of 128
    values); ValueError naming it otherwise.

    Example:
        >>> from kvcheck.vocabulary import DEEPSEEK_V3_2
        >>> latent_kv_cache_dim(DEEPSEEK_V3_2, dtype="bfloat16")
        576
        >>> latent_kv_cache_dim(DEEPSEEK_V3_2, dtype="float8_e4m3fn")
        656
    """
    if not config.uses_latent_cache:
        raise ValueError(
            f"{config.name!r} has no latent rows (attention_arch={config.attention_arch!r})"
        )
    name = _torch_dtype_name(kv_torch_dtype(dtype))
    rank, rope = config.kv_lora_rank, config.qk_rope_head_dim
    if not (config.is_dsa and name == SCALED_LATENT_KV_DTYPE):
        return rank + rope
    if rank % DSA_QUANT_BLOCK:
        raise ValueError(
            f"kv_lora_rank={rank} of {config.name!r} is not a multiple of {DSA_QUANT_BLOCK}: "
            f"a {SCALED_LATENT_KV_DTYPE} DSA latent row is stored scaled, one fp32 scale per "
            f"{DSA_QUANT_BLOCK} values"
        )
    return rank + rank // DSA_QUANT_BLOCK * _SCALE_BYTES + rope * _ROPE_BYTES


def index_buf_size(num_tokens: int, *, enable_hisparse: bool = False) -> int:
    """Tokens a DSA pool of ``num_tokens`` keeps index keys for: ``num_tokens``, times
    :data:`HISPARSE_HOST_TO_DEVICE_RATIO` with HiSparse.

    Example:
        >>> index_buf_size(1024), index_buf_size(1024, enable_hisparse=True)
        (1024, 2048)
    """
    _check_count("num_tokens", num_tokens, minimum=0)
    return num_tokens * (HISPARSE_HOST_TO_DEVICE_RATIO if enable_hisparse else 1)


def num_indexer_layers(
    config: ModelConfig,
    *,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> int:
    """How many of the pool's layers hold a DSA index-K buffer (0 for MHA and MLA models).

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> num_indexer_layers(GLM_5_2_LIKE), num_indexer_layers(GLM_5_2_LIKE, enable_hisparse=True)
        (21, 78)
    """
    if not config.is_dsa:
        layer_window(config, start_layer=start_layer, layer_num=layer_num)
        return 0
    mask = skip_topk_layers(
        config,
        is_draft_worker=is_draft_worker,
        enable_hisparse=enable_hisparse,
        start_layer=start_layer,
        layer_num=layer_num,
    )
    return mask.count(False)


def cell_size_bytes(
    config: ModelConfig,
    *,
    dtype: torch.dtype | str,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> int:
    """Bytes one token costs across the pool's layers (see the module docstring).

    ``start_layer``/``layer_num`` select the layers one pipeline stage holds (default: all).
    ``dtype`` is a pool dtype (:func:`kv_torch_dtype`) or a quantized ``--kv-cache-dtype``
    (:data:`~kvcheck.serving.quantized.QUANTIZED_KV_CACHE_DTYPES`), whose scales count.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE, QWEN3_EMBEDDING_8B
        >>> cell_size_bytes(QWEN3_EMBEDDING_8B, dtype="bfloat16")
        147456
        >>> cell_size_bytes(QWEN3_EMBEDDING_8B, dtype="fp4_mx_block16")
        41472
        >>> cell_size_bytes(GLM_5_2_LIKE, dtype="bfloat16")
        92628
    """
    layers = len(layer_window(config, start_layer=start_layer, layer_num=layer_num))
    if is_quantized_kv_cache_dtype(dtype):
        return quantized_cell_bytes(config, str(dtype), layer_num=layers).total
    indexer_layers = num_indexer_layers(
        config,
        is_draft_worker=is_draft_worker,
        enable_hisparse=enable_hisparse,
        start_layer=start_layer,
        layer_num=layer_num,
    )
    index_bytes = (
        index_k_bytes_per_token(config.index_head_dim)
        * index_buf_size(1, enable_hisparse=enable_hisparse)
        if config.is_dsa
        else 0
    )
    return layers * _token_row_bytes(config, dtype) + indexer_layers * index_bytes


def pool_bytes(
    config: ModelConfig,
    *,
    num_tokens: int,
    dtype: torch.dtype | str,
    page_size: int,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
    prefill_only_disable_kv_cache: bool = False,
) -> int:
    """Bytes of the tensors in the pool that ``select_kv_pool`` builds for ``num_tokens``.

    Token buffers have ``num_tokens + page_size`` rows; each DSA indexer layer holds
    ``(index_buf_size + page_size + 1) // page_size`` pages of ``page_size`` tokens
    (:func:`index_buf_size`); a quantized ``dtype`` adds the pool's scale buffers and NVFP4's
    dequant workspace, on those rows too.
    ``prefill_only_disable_kv_cache=True`` (plain MHA models only) gives the no-op pool's
    placeholders instead: ``[page_size, heads, head_dim]`` K and ``[page_size, heads,
    v_head_dim]`` V per layer, whatever ``num_tokens`` is.

    Example:
        >>> from kvcheck.vocabulary import QWEN3_EMBEDDING_8B
        >>> pool_bytes(QWEN3_EMBEDDING_8B, num_tokens=64, dtype="bfloat16", page_size=64)
        18874368
        >>> pool_bytes(QWEN3_EMBEDDING_8B, num_tokens=64, dtype="bfloat16", page_size=64,
        ...            prefill_only_disable_kv_cache=True)
        9437184
    """
    _check_count("num_tokens", num_tokens, minimum=0)
    _check_count("page_size", page_size, minimum=1)
    layers = len(layer_window(config, start_layer=start_layer, layer_num=layer_num))
    if is_quantized_kv_cache_dtype(dtype):
        if prefill_only_disable_kv_cache:
            raise ValueError(
                f"prefill_only_disable_kv_cache=True describes the no-op MHA pool, which "
                f"cannot hold dtype={dtype!r} (its pool keeps scale buffers)"
            )
        spec = quantized_pool_spec(
            config,
            str(dtype),
            num_tokens=num_tokens,
            page_size=page_size,
            layer_num=layers,
            start_layer=start_layer,
        )
        return buffer_bytes(spec)
    itemsize = kv_torch_dtype(dtype).itemsize

    if prefill_only_disable_kv_cache:
        if config.attention_arch != "mha":
            raise ValueError(
                f"prefill_only_disable_kv_cache=True describes the no-op MHA pool, but "
                f"{config.name!r} has attention_arch={config.attention_arch!r}"
            )
        return layers * page_size * _token_row_elements(config) * itemsize

    token_bytes = layers * (num_tokens + page_size) * _token_row_bytes(config, dtype)
    if not config.is_dsa:
        return token_bytes
    index_tokens = index_buf_size(num_tokens, enable_hisparse=enable_hisparse)
    index_pages = (index_tokens + page_size + 1) // page_size
    indexer_layers = num_indexer_layers(
        config,
        is_draft_worker=is_draft_worker,
        enable_hisparse=enable_hisparse,
        start_layer=start_layer,
        layer_num=layer_num,
    )
    page_bytes = page_size * index_k_bytes_per_token(config.index_head_dim)
    return token_bytes + indexer_layers * index_pages * page_bytes


def max_total_num_tokens(
    config: ModelConfig,
    *,
    budget_bytes: int,
    dtype: torch.dtype | str,
    page_size: int,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> int:
    """The largest multiple of ``page_size`` whose pools fit in ``budget_bytes``.

    Guarantees ``pool_bytes(config, num_tokens=result, ...) <= budget_bytes`` and that one
    more page would not fit. A budget that cannot hold one page of tokens (plus the padding
    page and index pages) raises ValueError naming ``budget_bytes`` and that minimum.

    Example:
        >>> from kvcheck.vocabulary import QWEN3_EMBEDDING_8B
        >>> max_total_num_tokens(QWEN3_EMBEDDING_8B, budget_bytes=60 << 30,
        ...                      dtype="bfloat16", page_size=64)
        436800
    """
    _check_count("budget_bytes", budget_bytes, minimum=0)
    _check_count("page_size", page_size, minimum=1)

    options: dict[str, Any] = {
        "dtype": dtype,
        "is_draft_worker": is_draft_worker,
        "enable_hisparse": enable_hisparse,
        "start_layer": start_layer,
        "layer_num": layer_num,
    }

    def fits(pages: int) -> bool:
        return (
            pool_bytes(config, num_tokens=pages * page_size, page_size=page_size, **options)
            <= budget_bytes
        )

    if not fits(1):
        minimum = pool_bytes(config, num_tokens=page_size, page_size=page_size, **options)
        raise ValueError(
            f"budget_bytes={budget_bytes} is below the minimum of {minimum} bytes that "
            f"{config.name!r} needs for one page of page_size={page_size} tokens "
            "(plus the padding page)"
        )
    cell = cell_size_bytes(config, **options)
    # pool_bytes(n) >= n * cell, so no page count above budget // cell // page_size fits;
    # pool_bytes grows with n, so binary search finds the last page count that fits.
    lo, hi = 1, max(1, budget_bytes // cell // page_size)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * page_size


def _token_row_elements(config: ModelConfig) -> int:
    """Elements one token occupies in one layer's K/V (MHA) or raw latent (MLA/DSA) buffers."""
    if config.uses_latent_cache:
        return config.kv_lora_rank + config.qk_rope_head_dim
    return config.num_key_value_heads * (config.head_dim + config.effective_v_head_dim)


def _token_row_bytes(config: ModelConfig, dtype: torch.dtype | str) -> int:
    """Bytes one token occupies in one layer's K/V or latent buffers (scaled fp8 DSA rows
    included: :func:`latent_kv_cache_dim` counts bytes for fp8)."""
    itemsize = kv_torch_dtype(dtype).itemsize
    if config.uses_latent_cache:
        return latent_kv_cache_dim(config, dtype=dtype) * itemsize
    return _token_row_elements(config) * itemsize


def _torch_dtype_name(dtype: Any) -> str:
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={dtype!r} must be a torch.dtype or a dtype name")
    return str(dtype).removeprefix("torch.")


def _check_count(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
