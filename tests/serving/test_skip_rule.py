"""ModelConfig validation and the DSA top-k sharing rule (dsa_layer_skips_topk and its mask)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.serving import dsa_layer_skips_topk, skip_topk_layers
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, ModelConfig


def dsa(**fields: Any) -> ModelConfig:
    """A small DSA config with the given top-k sharing fields."""
    base: dict[str, Any] = {
        "name": "toy-dsa",
        "attention_arch": "dsa",
        "num_hidden_layers": 12,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "index_head_dim": 128,
        "index_topk": 64,
    }
    return ModelConfig(**{**base, **fields})


def skips(config: Any, layers: int = 12) -> list[int]:
    """Ids of the layers that reuse an earlier top-k."""
    return [layer for layer in range(layers) if dsa_layer_skips_topk(config, layer)]


# --- precedence -----------------------------------------------------------------------------


def test_indexer_types_take_precedence_over_every_other_field() -> None:
    """indexer_types decides even when cli_factor, pattern and freq are set."""
    config = dsa(
        indexer_types=("full", "shared", "full", "shared"),
        cli_factor=3,
        index_topk_pattern="FFFFSSSS",
        index_topk_freq=2,
    )
    assert skips(config) == [1, 3]


def test_indexer_types_shorter_than_the_model_leave_later_layers_fresh() -> None:
    """Layers past the end of indexer_types compute a fresh top-k."""
    assert skips(dsa(indexer_types=["full", "shared"])) == [1]


def test_cli_factor_above_one_beats_pattern_and_freq() -> None:
    """cli_factor > 1 keeps only every cli_factor-th layer fresh, ignoring pattern and freq."""
    config = dsa(cli_factor=4, index_topk_pattern="FFFFFFFFFFFF", index_topk_freq=2)
    assert skips(config) == [1, 2, 3, 5, 6, 7, 9, 10, 11]


def test_cli_factor_one_falls_through_to_the_pattern() -> None:
    """cli_factor == 1 is no sharing, so the next field (the pattern) decides."""
    assert skips(dsa(cli_factor=1, index_topk_pattern="FSSF")) == [1, 2]


def test_pattern_beats_freq_and_ends_fresh() -> None:
    """index_topk_pattern decides before freq; layers past its end compute a fresh top-k."""
    assert skips(dsa(index_topk_pattern="FSFS", index_topk_freq=3)) == [1, 3]


@pytest.mark.parametrize(
    ("freq", "offset", "expected"),
    [
        pytest.param(None, None, [], id="no-fields-every-layer-fresh"),
        pytest.param(1, None, [], id="freq-1"),
        pytest.param(2, None, [2, 4, 6, 8, 10], id="freq-2-no-offset"),
        pytest.param(3, None, [2, 3, 5, 6, 8, 9, 11], id="freq-3-no-offset"),
        pytest.param(4, 3, [3, 4, 5, 7, 8, 9, 11], id="freq-4-offset-3"),
        pytest.param(2, 1, [1, 3, 5, 7, 9, 11], id="freq-2-offset-1"),
    ],
)
def test_freq_with_and_without_offset(
    freq: int | None, offset: int | None, expected: list[int]
) -> None:
    """Layer i skips when max(i - offset + 1, 0) % freq != 0, or max(i - 1, 0) without offset."""
    assert skips(dsa(index_topk_freq=freq, index_skip_topk_offset=offset)) == expected


def test_duck_typed_hf_config_is_accepted() -> None:
    """An HF-style object with index_topk (no attention_arch) is read through getattr."""
    hf = SimpleNamespace(num_hidden_layers=8, index_topk=2048, index_topk_freq=2)
    assert skips(hf, layers=8) == [2, 4, 6]


# --- named configs --------------------------------------------------------------------------


def test_glm_5_2_like_has_21_indexer_layers() -> None:
    """GLM-5.2-like (freq 4, offset 3) runs the indexer on layers 0, 1, 2, 6, 10, ..., 74."""
    fresh = [layer for layer, skip in enumerate(skip_topk_layers(GLM_5_2_LIKE)) if not skip]
    assert fresh == [0, 1, 2, *range(6, 78, 4)]
    assert len(fresh) == 21


def test_deepseek_v3_2_indexes_every_layer() -> None:
    """DeepSeek-V3.2 sets no sharing field, so all 61 layers run their indexer."""
    mask = skip_topk_layers(DEEPSEEK_V3_2)
    assert mask == [False] * 61


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"is_draft_worker": True}, id="draft-worker"),
        pytest.param({"enable_hisparse": True}, id="hisparse"),
    ],
)
def test_draft_worker_and_hisparse_allocate_every_layer(kwargs: dict[str, bool]) -> None:
    """A draft worker and HiSparse get an all-False mask (every index-K buffer allocated)."""
    assert skip_topk_layers(GLM_5_2_LIKE, **kwargs) == [False] * 78


def test_layer_window_slices_the_global_mask() -> None:
    """start_layer/layer_num select the local layers of the global mask."""
    full = skip_topk_layers(GLM_5_2_LIKE)
    assert skip_topk_layers(GLM_5_2_LIKE, start_layer=5, layer_num=10) == full[5:15]
    assert skip_topk_layers(GLM_5_2_LIKE, start_layer=70) == full[70:]


@pytest.mark.parametrize(
    ("start_layer", "layer_num", "message"),
    [
        pytest.param(-1, None, "start_layer=-1", id="negative-start"),
        pytest.param(78, None, "start_layer=78", id="start-past-end"),
        pytest.param(0, 0, "layer_num=0", id="no-layers"),
        pytest.param(70, 9, "layer_num=9", id="window-past-end"),
    ],
)
def test_bad_layer_window_raises(start_layer: int, layer_num: int | None, message: str) -> None:
    """A window outside the model raises ValueError naming the argument."""
    with pytest.raises(ValueError, match=message):
        skip_topk_layers(GLM_5_2_LIKE, start_layer=start_layer, layer_num=layer_num)


# --- invalid configs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        pytest.param({"index_topk_freq": 0}, "index_topk_freq", id="freq-0"),
        pytest.param({"index_topk_freq": -2}, "index_topk_freq", id="freq-negative"),
        pytest.param({"cli_factor": 0}, "cli_factor", id="cli-factor-0"),
        pytest.param({"index_skip_topk_offset": 0}, "index_skip_topk_offset", id="offset-0"),
        pytest.param({"index_skip_topk_offset": -1}, "index_skip_topk_offset", id="offset-neg"),
        pytest.param({"index_topk_pattern": "SFFF"}, "index_topk_pattern", id="pattern-S-first"),
        pytest.param({"index_topk_pattern": "FXF"}, "index_topk_pattern", id="pattern-letter"),
        pytest.param({"indexer_types": ("shared",)}, "indexer_types", id="types-shared-first"),
        pytest.param({"indexer_types": ("full", "dense")}, "indexer_types", id="types-unknown"),
    ],
)
def test_invalid_sharing_fields_raise(fields: dict[str, Any], field_name: str) -> None:
    """Invalid sharing fields raise ValueError naming the field, for ModelConfig and duck types."""
    with pytest.raises(ValueError, match=field_name):
        dsa(**fields)
    hf = SimpleNamespace(num_hidden_layers=4, index_topk=64, **fields)
    with pytest.raises(ValueError, match=field_name):
        dsa_layer_skips_topk(hf, 1)


def test_invalid_field_raises_even_when_a_higher_precedence_field_decides() -> None:
    """Every present sharing field is checked, not only the deciding one."""
    hf = SimpleNamespace(index_topk=64, indexer_types=["full", "full"], index_topk_freq=0)
    with pytest.raises(ValueError, match="index_topk_freq"):
        dsa_layer_skips_topk(hf, 0)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(ModelConfig(name="mha", attention_arch="mha", num_hidden_layers=2), id="mha"),
        pytest.param(
            ModelConfig(name="mla", attention_arch="mla", num_hidden_layers=2, kv_lora_rank=16),
            id="mla",
        ),
        pytest.param(SimpleNamespace(num_hidden_layers=2), id="hf-without-index-topk"),
    ],
)
def test_non_dsa_config_raises(config: Any) -> None:
    """The rule and the mask are only defined for DSA configs."""
    with pytest.raises(ValueError, match="not a DSA model"):
        dsa_layer_skips_topk(config, 0)
    with pytest.raises(ValueError, match="not a DSA model"):
        skip_topk_layers(config)


@pytest.mark.parametrize("layer_id", [-1, 1.0, True])
def test_bad_layer_id_raises(layer_id: Any) -> None:
    """layer_id must be a non-negative int."""
    with pytest.raises(ValueError, match="layer_id="):
        dsa_layer_skips_topk(GLM_5_2_LIKE, layer_id)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"attention_arch": "gqa"}, "attention_arch='gqa'", id="arch"),
        pytest.param({"num_hidden_layers": 0}, "num_hidden_layers=0", id="no-layers"),
        pytest.param({"kv_lora_rank": 0}, "kv_lora_rank=0", id="dsa-without-latent"),
        pytest.param({"index_head_dim": 64}, "index_head_dim=64", id="index-dim-not-128k"),
        pytest.param({"index_topk": 0}, "index_topk=0", id="no-topk"),
        pytest.param({"sliding_window": 0}, "sliding_window=0", id="window"),
        pytest.param({"kv_cache_quant_algo": ""}, "kv_cache_quant_algo=''", id="quant-algo"),
        pytest.param({"name": ""}, "name=''", id="name"),
    ],
)
def test_invalid_model_fields_raise(fields: dict[str, Any], message: str) -> None:
    """ModelConfig rejects bad geometry with a message naming the field and value."""
    with pytest.raises(ValueError, match=message):
        dsa(**fields)


def test_sharing_fields_on_a_non_dsa_model_raise() -> None:
    """Top-k sharing fields on an MHA model are a config error."""
    with pytest.raises(ValueError, match="index_topk_freq=4"):
        ModelConfig(name="m", attention_arch="mha", num_hidden_layers=2, index_topk_freq=4)


def test_indexer_types_list_is_stored_as_a_tuple() -> None:
    """A JSON-style list is accepted and stored as a tuple, keeping the config hashable."""
    config = dsa(indexer_types=["full", "shared"])
    assert config.indexer_types == ("full", "shared")
    assert hash(config) == hash(dsa(indexer_types=("full", "shared")))
