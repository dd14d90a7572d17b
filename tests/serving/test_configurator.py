"""Pool sizing: cell size, pool bytes (against real pools on meta) and max_total_num_tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvcheck.serving import (
    HISPARSE_HOST_TO_DEVICE_RATIO,
    ServerArgs,
    cell_size_bytes,
    index_buf_size,
    index_k_bytes_per_token,
    kv_torch_dtype,
    latent_kv_cache_dim,
    max_total_num_tokens,
    pool_bytes,
    select_kv_pool,
)
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, MODELS, QWEN3_EMBEDDING_8B, ModelConfig

GIB = 1 << 30
TOY_MLA = ModelConfig(
    name="toy-mla", attention_arch="mla", num_hidden_layers=3, kv_lora_rank=32, qk_rope_head_dim=8
)
TOY_MHA = ModelConfig(
    name="toy-mha",
    attention_arch="mha",
    num_hidden_layers=2,
    num_key_value_heads=2,
    head_dim=16,
    v_head_dim=8,
)
ALL_MODELS = [*MODELS.values(), TOY_MLA, TOY_MHA]


def tensor_bytes(pool: Any) -> int:
    """Bytes of every buffer tensor a pool holds (meta tensors report their would-be size)."""
    names = ("k_buffer", "v_buffer", "kv_buffer", "index_k_with_scale_buffer")
    return sum(t.numel() * t.element_size() for name in names for t in getattr(pool, name, []))


# --- cell size ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "dtype", "kwargs", "expected"),
    [
        # 36 layers * 8 heads * (128 + 128) * 2 bytes
        pytest.param(QWEN3_EMBEDDING_8B, "bfloat16", {}, 147_456, id="qwen-bf16"),
        pytest.param(QWEN3_EMBEDDING_8B, "float8_e4m3fn", {}, 73_728, id="qwen-fp8"),
        # 61 * 576 * 2 latent + 61 * 132 indexer
        pytest.param(DEEPSEEK_V3_2, "bfloat16", {}, 78_324, id="deepseek-bf16"),
        pytest.param(DEEPSEEK_V3_2, "bfloat16", {"is_draft_worker": True}, 78_324, id="ds-draft"),
        # 78 * 576 * 2 latent + 21 * 132 indexer
        pytest.param(GLM_5_2_LIKE, "bfloat16", {}, 92_628, id="glm-bf16"),
        # SGLang's scaled fp8 row: 78 * (512 + 4 * 4 + 64 * 2) + 21 * 132
        pytest.param(GLM_5_2_LIKE, torch.float8_e4m3fn, {}, 53_940, id="glm-fp8"),
        # e5m2 keeps the raw row: 78 * 576 + 21 * 132
        pytest.param(GLM_5_2_LIKE, "float8_e5m2", {}, 47_700, id="glm-fp8-e5m2"),
        # every layer's indexer: 78 * 576 * 2 + 78 * 132
        pytest.param(GLM_5_2_LIKE, "bfloat16", {"is_draft_worker": True}, 100_152, id="glm-draft"),
        # HiSparse: every layer's indexer, two index slots per token: 78 * 1152 + 78 * 264
        pytest.param(GLM_5_2_LIKE, "bfloat16", {"enable_hisparse": True}, 110_448, id="glm-hisp"),
        # 3 layers * 40 * 4 bytes
        pytest.param(TOY_MLA, "float32", {}, 480, id="toy-mla-fp32"),
        # 2 layers * 2 heads * (16 + 8) * 2 bytes
        pytest.param(TOY_MHA, "float16", {}, 192, id="toy-mha-asymmetric-v"),
    ],
)
def test_cell_size_formulas(
    model: ModelConfig, dtype: Any, kwargs: dict[str, bool], expected: int
) -> None:
    """cell_size_bytes follows the MHA/MLA/DSA formulas (DSA indexer: non-skip layers only)."""
    assert cell_size_bytes(model, dtype=dtype, **kwargs) == expected


def test_cell_size_of_a_layer_window() -> None:
    """A pipeline stage's cell size counts only its layers and their indexers."""
    # layers 0..5 of GLM-5.2-like: indexers on 0, 1, 2 only
    assert cell_size_bytes(GLM_5_2_LIKE, dtype="bfloat16", layer_num=6) == 6 * 1152 + 3 * 132


def test_latent_kv_cache_dim_is_sglangs() -> None:
    """The latent row SGLang builds: raw, except scaled for an fp8 e4m3 DSA model; a scaled
    row needs kv_lora_rank a multiple of 128."""
    assert latent_kv_cache_dim(DEEPSEEK_V3_2, dtype="bfloat16") == 576
    assert latent_kv_cache_dim(DEEPSEEK_V3_2, dtype="float8_e5m2") == 576
    assert latent_kv_cache_dim(DEEPSEEK_V3_2, dtype=torch.float8_e4m3fn) == 656
    assert latent_kv_cache_dim(TOY_MLA, dtype="float8_e4m3fn") == 40
    narrow = dataclasses.replace(DEEPSEEK_V3_2, kv_lora_rank=64)
    with pytest.raises(ValueError, match="kv_lora_rank=64"):
        latent_kv_cache_dim(narrow, dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="kv_lora_rank=64"):
        cell_size_bytes(narrow, dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="no latent rows"):
        latent_kv_cache_dim(QWEN3_EMBEDDING_8B, dtype="bfloat16")


def test_index_buf_size_spans_the_hisparse_ratio() -> None:
    """HiSparse index buffers hold HISPARSE_HOST_TO_DEVICE_RATIO slots per token."""
    assert HISPARSE_HOST_TO_DEVICE_RATIO == 2
    assert index_buf_size(640) == 640
    assert index_buf_size(640, enable_hisparse=True) == 1280


def test_index_k_bytes_per_token() -> None:
    """An index key costs D fp8 bytes plus 4 bytes of scale per 128 channels."""
    assert index_k_bytes_per_token(128) == 132
    assert index_k_bytes_per_token(256) == 264
    with pytest.raises(ValueError, match="index_head_dim=96"):
        index_k_bytes_per_token(96)


# --- capacity -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "kwargs", "expected"),
    [
        pytest.param(GLM_5_2_LIKE, {}, 695_424, id="glm"),
        pytest.param(GLM_5_2_LIKE, {"is_draft_worker": True}, 643_200, id="glm-draft"),
        pytest.param(DEEPSEEK_V3_2, {}, 822_464, id="deepseek"),
        pytest.param(QWEN3_EMBEDDING_8B, {}, 436_800, id="qwen"),
    ],
)
def test_named_model_capacity_at_60_gib_bf16(
    model: ModelConfig, kwargs: dict[str, bool], expected: int
) -> None:
    """Token capacities of the named models for a 60 GiB bf16 budget with 64-token pages."""
    got = max_total_num_tokens(
        model, budget_bytes=60 * GIB, dtype="bfloat16", page_size=64, **kwargs
    )
    assert got == expected


def test_skip_layers_raise_capacity_over_draft_and_hisparse() -> None:
    """Eliding skip-layer indexers gives GLM-5.2-like more tokens than a draft pool, and a
    draft more than HiSparse, whose index buffers span twice the tokens."""
    common: dict[str, Any] = {"budget_bytes": 60 * GIB, "dtype": "bfloat16", "page_size": 64}
    elided = max_total_num_tokens(GLM_5_2_LIKE, **common)
    draft = max_total_num_tokens(GLM_5_2_LIKE, is_draft_worker=True, **common)
    hisparse = max_total_num_tokens(GLM_5_2_LIKE, enable_hisparse=True, **common)
    assert elided > draft > hisparse
    # DeepSeek-V3.2 indexes every layer, so eliding changes nothing.
    assert max_total_num_tokens(DEEPSEEK_V3_2, **common) == max_total_num_tokens(
        DEEPSEEK_V3_2, is_draft_worker=True, **common
    )


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("budget_bytes", [3 * GIB, 60 * GIB + 12_345], ids=["3GiB", "60GiB+"])
@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
def test_capacity_is_page_aligned_fits_and_is_maximal(
    model: ModelConfig, page_size: int, budget_bytes: int, draft: bool
) -> None:
    """The capacity is a page multiple whose pools fit the budget; one more page would not."""
    common: dict[str, Any] = {"dtype": "bfloat16", "page_size": page_size, "is_draft_worker": draft}
    tokens = max_total_num_tokens(model, budget_bytes=budget_bytes, **common)
    assert tokens % page_size == 0
    assert pool_bytes(model, num_tokens=tokens, **common) <= budget_bytes
    assert pool_bytes(model, num_tokens=tokens + page_size, **common) > budget_bytes


def test_capacity_counts_the_padding_page_and_index_pages() -> None:
    """The capacity is below budget // cell_size when the padding page would not fit."""
    cell = cell_size_bytes(GLM_5_2_LIKE, dtype="bfloat16")
    budget = cell * 64 * 100  # exactly 100 pages of cells: no room for the padding page
    tokens = max_total_num_tokens(GLM_5_2_LIKE, budget_bytes=budget, dtype="bfloat16", page_size=64)
    assert tokens == 99 * 64  # (tokens + padding page) * cell_size == budget


def test_budget_below_one_page_raises_with_the_minimum() -> None:
    """A budget that cannot hold one page raises ValueError naming budget_bytes and the minimum."""
    minimum = pool_bytes(QWEN3_EMBEDDING_8B, num_tokens=64, dtype="bfloat16", page_size=64)
    assert (
        max_total_num_tokens(
            QWEN3_EMBEDDING_8B, budget_bytes=minimum, dtype="bfloat16", page_size=64
        )
        == 64
    )
    with pytest.raises(ValueError, match=rf"budget_bytes={minimum - 1} .* {minimum} bytes"):
        max_total_num_tokens(
            QWEN3_EMBEDDING_8B, budget_bytes=minimum - 1, dtype="bfloat16", page_size=64
        )


# --- pool bytes equal real pools --------------------------------------------------------------


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
def test_pool_bytes_equal_the_tensors_select_kv_pool_builds(
    model: ModelConfig, page_size: int, draft: bool
) -> None:
    """pool_bytes equals the bytes of the real pool's buffers (built on meta)."""
    tokens = max_total_num_tokens(
        model, budget_bytes=GIB, dtype="bfloat16", page_size=page_size, is_draft_worker=draft
    )
    pool = select_kv_pool(
        ServerArgs.unchecked(),
        model,
        max_total_num_tokens=tokens,
        page_size=page_size,
        dtype="bfloat16",
        device="meta",
        is_draft_worker=draft,
    )
    expected = pool_bytes(
        model, num_tokens=tokens, dtype="bfloat16", page_size=page_size, is_draft_worker=draft
    )
    assert tensor_bytes(pool) == expected
    assert expected <= GIB


@pytest.mark.parametrize(
    ("dtype", "hisparse"),
    [("float8_e4m3fn", False), ("bfloat16", True), ("float8_e4m3fn", True)],
    ids=["scaled-fp8", "hisparse", "scaled-fp8-hisparse"],
)
def test_pool_bytes_equal_the_dsa_pool_select_kv_pool_builds(dtype: str, hisparse: bool) -> None:
    """A scaled fp8 DSA pool and a HiSparse pool hold exactly pool_bytes."""
    options: dict[str, Any] = {"dtype": dtype, "page_size": 64, "enable_hisparse": hisparse}
    tokens = max_total_num_tokens(DEEPSEEK_V3_2, budget_bytes=GIB, **options)
    pool = select_kv_pool(
        ServerArgs.unchecked(enable_hisparse=hisparse),
        DEEPSEEK_V3_2,
        max_total_num_tokens=tokens,
        page_size=64,
        dtype=dtype,
        device="meta",
    )
    assert tensor_bytes(pool) == pool_bytes(DEEPSEEK_V3_2, num_tokens=tokens, **options) <= GIB
    assert pool.index_buf_size == index_buf_size(tokens, enable_hisparse=hisparse)


def test_pool_bytes_of_a_layer_window_and_fp8_match_the_pool() -> None:
    """A pipeline stage in fp8 holds exactly pool_bytes for its layers."""
    common: dict[str, Any] = {"page_size": 64, "dtype": torch.float8_e4m3fn}
    pool = select_kv_pool(
        ServerArgs.unchecked(),
        GLM_5_2_LIKE,
        max_total_num_tokens=6400,
        device="meta",
        start_layer=40,
        layer_num=20,
        **common,
    )
    assert tensor_bytes(pool) == pool_bytes(
        GLM_5_2_LIKE, num_tokens=6400, start_layer=40, layer_num=20, **common
    )


def test_pool_bytes_of_the_noop_pool_are_its_placeholders() -> None:
    """With prefill_only_disable_kv_cache the bytes are the no-op pool's one-page placeholders."""
    flags = ServerArgs(
        is_embedding=True,
        prefill_only_disable_kv_cache=True,
        chunked_prefill_size=-1,
        disable_radix_cache=True,
    )
    pool = select_kv_pool(
        flags,
        QWEN3_EMBEDDING_8B,
        max_total_num_tokens=436_800,
        page_size=64,
        dtype="bfloat16",
        device="meta",
    )
    noop = pool_bytes(
        QWEN3_EMBEDDING_8B,
        num_tokens=436_800,
        dtype="bfloat16",
        page_size=64,
        prefill_only_disable_kv_cache=True,
    )
    assert tensor_bytes(pool) == noop == 36 * 64 * 8 * 256 * 2
    with pytest.raises(ValueError, match="attention_arch='dsa'"):
        pool_bytes(
            GLM_5_2_LIKE,
            num_tokens=64,
            dtype="bfloat16",
            page_size=64,
            prefill_only_disable_kv_cache=True,
        )


# --- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"num_tokens": -1}, "num_tokens=-1", id="negative-tokens"),
        pytest.param({"page_size": 0}, "page_size=0", id="page-size-0"),
        pytest.param({"dtype": "int8"}, "dtype='int8'", id="unknown-dtype-name"),
        pytest.param({"dtype": torch.int32}, "dtype=torch.int32", id="non-kv-dtype"),
        pytest.param({"layer_num": 99}, "layer_num=99", id="window"),
    ],
)
def test_bad_sizing_arguments_raise(kwargs: dict[str, Any], message: str) -> None:
    """Bad pool_bytes arguments raise ValueError naming the argument and value."""
    args: dict[str, Any] = {"num_tokens": 64, "dtype": "bfloat16", "page_size": 64, **kwargs}
    with pytest.raises(ValueError, match=message):
        pool_bytes(QWEN3_EMBEDDING_8B, **args)


@pytest.mark.parametrize("budget", [-1, 1.5, True])
def test_bad_budget_raises(budget: Any) -> None:
    """budget_bytes must be a non-negative int."""
    with pytest.raises(ValueError, match="budget_bytes="):
        max_total_num_tokens(QWEN3_EMBEDDING_8B, budget_bytes=budget, dtype="bfloat16", page_size=1)


def test_kv_torch_dtype_accepts_names_and_dtypes() -> None:
    """Dtype names (with or without 'torch.') and torch dtypes map to the same torch dtype."""
    assert kv_torch_dtype("bfloat16") is torch.bfloat16
    assert kv_torch_dtype("torch.float8_e5m2") is torch.float8_e5m2
    assert kv_torch_dtype(torch.float16) is torch.float16
