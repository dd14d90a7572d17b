"""Quantized ``--kv-cache-dtype`` sizing and selection: cells count the scale buffers, the
capacity's pools fit, and each dtype selects its quantized pool."""

from __future__ import annotations

import dataclasses

import pytest

from kvcheck.memory import shape_bytes
from kvcheck.serving import (
    ServerArgs,
    cell_size_bytes,
    max_total_num_tokens,
    pool_bytes,
    select_kv_pool,
)
from kvcheck.serving.quantized import (
    QUANTIZED_KV_CACHE_DTYPES,
    quantized_cell_bytes,
    quantized_pool_spec,
)
from kvcheck.vocabulary import DEEPSEEK_V3_2, QWEN3_EMBEDDING_8B, ModelConfig

_MLA = ModelConfig(
    name="tiny-mla",
    attention_arch="mla",
    num_hidden_layers=2,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
)
# Qwen3-Embedding-8B: 36 layers x 8 KV heads x (128 + 128) values a token.
_QWEN_CELLS = {
    "mxfp8": (73728, 2304, 0),  # fp8 values; an e8m0 scale per 32
    "nvfp4": (36864, 4608, 2048),  # e2m1 pairs; an e4m3 scale per 16; fp8 dequant row once
    "fp4_mx_block16": (36864, 4608, 0),  # e2m1 pairs; an exponent byte per 16
}


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED_KV_CACHE_DTYPES)
def test_qwen_cells_count_payload_scales_and_workspace(kv_cache_dtype: str) -> None:
    """Each quantized dtype's cell is its payload plus its scales (plus NVFP4's workspace)."""
    cell = quantized_cell_bytes(QWEN3_EMBEDDING_8B, kv_cache_dtype, layer_num=36)
    assert tuple(cell) == _QWEN_CELLS[kv_cache_dtype]
    assert cell_size_bytes(QWEN3_EMBEDDING_8B, dtype=kv_cache_dtype) == cell.total


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED_KV_CACHE_DTYPES)
@pytest.mark.parametrize("page_size", [1, 64, 128])
def test_capacity_pools_fit_and_equal_the_built_pool(kv_cache_dtype: str, page_size: int) -> None:
    """The capacity's pool, built on meta, holds exactly pool_bytes, within the budget."""
    budget = 1 << 30
    tokens = max_total_num_tokens(
        QWEN3_EMBEDDING_8B, budget_bytes=budget, dtype=kv_cache_dtype, page_size=page_size
    )
    held = pool_bytes(
        QWEN3_EMBEDDING_8B, num_tokens=tokens, dtype=kv_cache_dtype, page_size=page_size
    )
    pool = select_kv_pool(
        ServerArgs.unchecked(kv_cache_dtype=kv_cache_dtype),
        QWEN3_EMBEDDING_8B,
        max_total_num_tokens=tokens,
        page_size=page_size,
        dtype="bfloat16",
        device="meta",
    )
    assert shape_bytes(pool) == held <= budget
    more = pool_bytes(
        QWEN3_EMBEDDING_8B, num_tokens=tokens + page_size, dtype=kv_cache_dtype, page_size=page_size
    )
    assert more > budget


@pytest.mark.parametrize(
    ("model", "kv_cache_dtype", "variant"),
    [
        (QWEN3_EMBEDDING_8B, "mxfp8", "mha:mxfp8:flat"),
        (QWEN3_EMBEDDING_8B, "nvfp4", "mha:nvfp4"),
        (QWEN3_EMBEDDING_8B, "fp4_mx_block16", "mha:fp4_mx_block16"),
        (_MLA, "nvfp4", "mla:fp4"),
        (_MLA, "fp4_mx_block16", "mla:fp4"),
    ],
)
def test_each_dtype_selects_its_variant(
    model: ModelConfig, kv_cache_dtype: str, variant: str
) -> None:
    """The spec serving builds names kvcheck's quantized variant for the dtype."""
    spec = quantized_pool_spec(model, kv_cache_dtype, num_tokens=4, page_size=1, layer_num=1)
    assert spec.variant == variant


def test_mla_fp4_cell_counts_its_latent_scales() -> None:
    """MLA FP4: half a byte per latent value plus a scale byte per 16, per layer."""
    assert cell_size_bytes(_MLA, dtype="nvfp4") == 2 * (48 // 2 + 48 // 16)


@pytest.mark.parametrize(
    ("model", "kv_cache_dtype", "message"),
    [
        (DEEPSEEK_V3_2, "nvfp4", "no quantized DSA pool"),
        (_MLA, "mxfp8", "MHA only"),
        (QWEN3_EMBEDDING_8B, "fp8_e4m3", "not a quantized --kv-cache-dtype"),
        (dataclasses.replace(QWEN3_EMBEDDING_8B, head_dim=48), "mxfp8", "multiples of 32"),
    ],
)
def test_refusals_name_what_is_wrong(model: ModelConfig, kv_cache_dtype: str, message: str) -> None:
    """A dtype kvcheck has no pool for, or shapes the pool cannot hold, raise ValueError."""
    with pytest.raises(ValueError, match=message):
        quantized_cell_bytes(model, kv_cache_dtype, layer_num=1)


def test_the_flag_keeps_the_noop_pool_when_taken_as_given() -> None:
    """Unvalidated flags with mxfp8 and the flag on keep kvcheck's no-op pool."""
    args = ServerArgs.unchecked(
        prefill_only_disable_kv_cache=True,
        kv_cache_dtype="mxfp8",
        is_embedding=True,
        chunked_prefill_size=-1,
        disable_radix_cache=True,
    )
    pool = select_kv_pool(
        args,
        QWEN3_EMBEDDING_8B,
        max_total_num_tokens=64,
        page_size=64,
        dtype="bfloat16",
        device="meta",
    )
    assert type(pool).__name__ == "NoOpMHATokenToKVPool"
