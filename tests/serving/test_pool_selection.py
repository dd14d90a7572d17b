"""Pool selection: the no-op pool, the model's own pool, and the families the flag refuses."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvcheck.pools import (
    DSATokenToKVPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    NoOpMHATokenToKVPool,
)
from kvcheck.serving import (
    UNSUPPORTED_POOL_FAMILIES,
    ServerArgs,
    select_kv_pool,
    skip_topk_layers,
    unsupported_pool_family,
)
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, QWEN3_EMBEDDING_8B, ModelConfig

PREFILL_ONLY = ServerArgs(
    is_embedding=True,
    prefill_only_disable_kv_cache=True,
    chunked_prefill_size=-1,
    disable_radix_cache=True,
)
#: The flag on without the other rules, for models whose resolved flags would be rejected.
FLAG_ONLY = ServerArgs.unchecked(prefill_only_disable_kv_cache=True)
PLAIN = ServerArgs()
TOY_MLA = ModelConfig(
    name="toy-mla", attention_arch="mla", num_hidden_layers=2, kv_lora_rank=32, qk_rope_head_dim=8
)
TOY_MHA = ModelConfig(
    name="toy-mha", attention_arch="mha", num_hidden_layers=2, num_key_value_heads=2, head_dim=16
)


def build(args: ServerArgs, model: ModelConfig, **kwargs: Any) -> Any:
    """select_kv_pool with small meta-device defaults."""
    options: dict[str, Any] = {
        "max_total_num_tokens": 256,
        "page_size": 64,
        "dtype": torch.bfloat16,
        "device": "meta",
        **kwargs,
    }
    return select_kv_pool(args, model, **options)


# --- the pool each configuration gets -------------------------------------------------------


def test_flag_on_plain_mha_gets_the_noop_pool() -> None:
    """--prefill-only-disable-kv-cache on a plain MHA model builds the no-op pool, size kept."""
    pool = build(PREFILL_ONLY, QWEN3_EMBEDDING_8B, max_total_num_tokens=436_800)
    assert type(pool) is NoOpMHATokenToKVPool
    assert pool.size == 436_800
    assert (pool.head_num, pool.head_dim, pool.layer_num) == (8, 128, 36)
    assert pool.get_kv_size_bytes() == (0, 0)


@pytest.mark.parametrize(
    ("model", "pool_class"),
    [
        pytest.param(QWEN3_EMBEDDING_8B, MHATokenToKVPool, id="mha"),
        pytest.param(TOY_MLA, MLATokenToKVPool, id="mla"),
        pytest.param(GLM_5_2_LIKE, DSATokenToKVPool, id="dsa-glm"),
        pytest.param(DEEPSEEK_V3_2, DSATokenToKVPool, id="dsa-deepseek"),
    ],
)
def test_flag_off_builds_the_models_own_pool(model: ModelConfig, pool_class: type) -> None:
    """Without the flag each model gets its own family's pool (exact class)."""
    pool = build(PLAIN, model)
    assert type(pool) is pool_class
    assert pool.layer_num == model.num_hidden_layers


def test_dsa_pool_gets_the_skip_mask() -> None:
    """A target DSA pool is built with the skip rule's mask (21 indexer layers for GLM)."""
    pool = build(PLAIN, GLM_5_2_LIKE)
    assert list(pool.skip_topk_layers) == skip_topk_layers(GLM_5_2_LIKE)
    assert list(pool.skip_topk_layers).count(False) == 21
    assert list(build(PLAIN, DEEPSEEK_V3_2).skip_topk_layers) == [False] * 61


def test_hisparse_dsa_pool_allocates_every_layer() -> None:
    """--enable-hisparse keeps every layer's index-K buffer."""
    pool = build(ServerArgs(enable_hisparse=True), GLM_5_2_LIKE)
    assert list(pool.skip_topk_layers) == [False] * 78


@pytest.mark.parametrize(
    ("args", "model", "pool_class"),
    [
        pytest.param(PREFILL_ONLY, QWEN3_EMBEDDING_8B, MHATokenToKVPool, id="mha-keeps-mha"),
        pytest.param(FLAG_ONLY, GLM_5_2_LIKE, DSATokenToKVPool, id="dsa-keeps-dsa"),
        pytest.param(FLAG_ONLY, TOY_MLA, MLATokenToKVPool, id="mla-keeps-mla"),
    ],
)
def test_draft_worker_keeps_its_normal_pool(
    args: ServerArgs, model: ModelConfig, pool_class: type
) -> None:
    """A draft worker ignores the flag and builds its model's normal pool."""
    pool = build(args, model, is_draft_worker=True)
    assert type(pool) is pool_class
    assert unsupported_pool_family(args, model, is_draft_worker=True) is None


def test_draft_dsa_pool_allocates_every_layer() -> None:
    """A draft worker's DSA pool has an all-False skip mask."""
    pool = build(PLAIN, GLM_5_2_LIKE, is_draft_worker=True)
    assert list(pool.skip_topk_layers) == [False] * 78


def test_layer_window_reaches_the_pool() -> None:
    """start_layer/layer_num give the pool its global layer range and the matching mask slice."""
    pool = build(PLAIN, GLM_5_2_LIKE, start_layer=4, layer_num=8)
    assert (pool.start_layer, pool.layer_num) == (4, 8)
    assert list(pool.skip_topk_layers) == skip_topk_layers(GLM_5_2_LIKE)[4:12]


# --- families the flag refuses --------------------------------------------------------------

UNSUPPORTED_CASES = [
    (
        "hybrid DSA/MLA-SWA KV pool",
        FLAG_ONLY,
        dataclasses.replace(GLM_5_2_LIKE, sliding_window=128),
    ),
    ("hybrid DSA/MLA-SWA KV pool", FLAG_ONLY, dataclasses.replace(TOY_MLA, sliding_window=128)),
    ("DSA/MLA KV pool", FLAG_ONLY, GLM_5_2_LIKE),
    ("DSA/MLA KV pool", FLAG_ONLY, DEEPSEEK_V3_2),
    ("MLA KV pool", FLAG_ONLY, TOY_MLA),
    ("SWA KV pool", FLAG_ONLY, dataclasses.replace(TOY_MHA, sliding_window=4096)),
    ("hybrid linear/Mamba KV pool", FLAG_ONLY, dataclasses.replace(TOY_MHA, is_hybrid_linear=True)),
    ("hybrid linear/Mamba KV pool", FLAG_ONLY, dataclasses.replace(TOY_MLA, is_hybrid_linear=True)),
    (
        "FP4 MHA KV pool",
        ServerArgs.unchecked(prefill_only_disable_kv_cache=True, kv_cache_dtype="nvfp4"),
        TOY_MHA,
    ),
]


@pytest.mark.parametrize(
    ("family", "args", "model"),
    UNSUPPORTED_CASES,
    ids=[f"{family}-{model.name}" for family, _, model in UNSUPPORTED_CASES],
)
def test_flag_on_unsupported_family_raises_runtime_error(
    family: str, args: ServerArgs, model: ModelConfig
) -> None:
    """The flag on a non-plain-MHA model raises RuntimeError naming the family and the support."""
    assert unsupported_pool_family(args, model) == family
    with pytest.raises(RuntimeError) as caught:
        build(args, model)
    message = str(caught.value)
    assert "--prefill-only-disable-kv-cache" in message
    assert family in message
    assert "plain MHA" in message and "no sliding window" in message and "FP4" in message


def test_fp4_pool_dtype_counts_as_fp4() -> None:
    """An FP4 torch dtype for the pool is refused as an FP4 MHA KV pool."""
    assert unsupported_pool_family(PREFILL_ONLY, TOY_MHA, dtype=torch.float4_e2m1fn_x2) == (
        "FP4 MHA KV pool"
    )
    with pytest.raises(RuntimeError, match="FP4 MHA KV pool"):
        build(PREFILL_ONLY, TOY_MHA, dtype=torch.float4_e2m1fn_x2)


def test_a_checkpoints_fp4_kv_cache_does_not_make_an_fp4_pool() -> None:
    """With --kv-cache-dtype auto a checkpoint's NVFP4 KV cache keeps the model dtype, as
    SGLang 0.5.23's configure_kv_cache_dtype does ("auto" takes only an FP8 declaration),
    so the flag gets the no-op pool; an explicit dtype does the same."""
    model = dataclasses.replace(TOY_MHA, kv_cache_quant_algo="NVFP4")
    for kv_cache_dtype in ("auto", "bf16"):
        args = ServerArgs.unchecked(
            prefill_only_disable_kv_cache=True, kv_cache_dtype=kv_cache_dtype
        )
        assert unsupported_pool_family(args, model) is None
    assert type(build(FLAG_ONLY, model)).__name__ == "NoOpMHATokenToKVPool"


def test_every_family_name_is_listed_in_check_order() -> None:
    """UNSUPPORTED_POOL_FAMILIES names exactly the families the cases above hit."""
    assert {case[0] for case in UNSUPPORTED_CASES} == set(UNSUPPORTED_POOL_FAMILIES)


def test_flag_off_has_no_unsupported_family() -> None:
    """Without the flag every model is fine for unsupported_pool_family."""
    assert unsupported_pool_family(PLAIN, GLM_5_2_LIKE) is None
    assert unsupported_pool_family(PLAIN, QWEN3_EMBEDDING_8B) is None


@pytest.mark.parametrize(
    ("model", "family"),
    [
        pytest.param(dataclasses.replace(TOY_MHA, sliding_window=4096), "SWA KV pool", id="swa"),
        pytest.param(
            dataclasses.replace(TOY_MHA, is_hybrid_linear=True),
            "hybrid linear/Mamba KV pool",
            id="hybrid",
        ),
    ],
)
def test_family_kvcheck_does_not_implement_raises_value_error(
    model: ModelConfig, family: str
) -> None:
    """Without the flag, a family kvcheck has no pool for raises ValueError naming it."""
    with pytest.raises(ValueError, match=family):
        build(PLAIN, model)


@pytest.mark.parametrize(
    ("args", "model", "message"),
    [
        pytest.param({"a": 1}, TOY_MHA, "server_args=", id="server-args"),
        pytest.param(PLAIN, "toy", "model=", id="model"),
    ],
)
def test_bad_inputs_raise(args: Any, model: Any, message: str) -> None:
    """Non-ServerArgs / non-ModelConfig inputs raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=message):
        build(args, model)
