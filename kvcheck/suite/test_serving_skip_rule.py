"""The DSA top-k sharing rule: which layers skip their indexer, layer by layer.

Every layer's decision and the pool's skip mask equal the reference's; configs the rule
rejects raise ``ValueError`` (:func:`kvcheck.properties.serving.check_skip_rule`).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given

from kvcheck.properties.serving import check_skip_rule
from kvcheck.strategies import model_configs
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, ModelConfig

pytestmark = pytest.mark.kvcheck_needs("skip_rule")


@given(
    model=model_configs(archs=("dsa",), max_layers=16, include_markers=False, allow_invalid=True)
)
def test_skip_rule_matches_reference(kvcheck_target: Any, model: Any) -> None:
    """Every skip-topk field combination, valid or not, decides each layer as the rule says."""
    mask = check_skip_rule(kvcheck_target, model)
    event("invalid config" if mask is None else f"indexer layers: {mask.count(False)}")


@given(model=model_configs(archs=("dsa",), min_layers=60, max_layers=80, include_markers=False))
def test_skip_rule_at_production_depth(kvcheck_target: Any, model: Any) -> None:
    """Models as deep as GLM-5 and DeepSeek-V3.2 decide every layer as the rule says."""
    assert check_skip_rule(kvcheck_target, model) is not None


NAMED_MODELS = {"glm-5.2-like": (GLM_5_2_LIKE, 21), "deepseek-v3.2": (DEEPSEEK_V3_2, 61)}


@pytest.mark.parametrize(
    ("model", "indexer_layers"), list(NAMED_MODELS.values()), ids=list(NAMED_MODELS)
)
def test_named_models(kvcheck_target: Any, model: ModelConfig, indexer_layers: int) -> None:
    """GLM-5.2-like keeps 21 indexer layers of 78; DeepSeek-V3.2 all 61."""
    mask = check_skip_rule(kvcheck_target, model)
    assert mask is not None and mask.count(False) == indexer_layers


def _dsa(**fields: Any) -> ModelConfig:
    return ModelConfig(
        name="toy-dsa",
        attention_arch="dsa",
        num_hidden_layers=8,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        index_head_dim=128,
        index_topk=64,
        **fields,
    )


#: Each rule deciding on its own, and shadowing the lower-precedence ones.
SMALL_CONFIGS: dict[str, tuple[dict[str, Any], list[int]]] = {
    "no-field": ({}, [0, 1, 2, 3, 4, 5, 6, 7]),
    "freq-2": ({"index_topk_freq": 2}, [0, 1, 3, 5, 7]),
    "freq-4-offset-3": ({"index_topk_freq": 4, "index_skip_topk_offset": 3}, [0, 1, 2, 6]),
    "freq-3-offset-1": ({"index_topk_freq": 3, "index_skip_topk_offset": 1}, [0, 3, 6]),
    "pattern-FSFS": ({"index_topk_pattern": "FSFS"}, [0, 2, 4, 5, 6, 7]),
    "pattern-over-freq": ({"index_topk_pattern": "FF", "index_topk_freq": 8}, list(range(8))),
    "cli-factor-3": ({"cli_factor": 3}, [0, 3, 6]),
    "cli-factor-1-falls-through": ({"cli_factor": 1, "index_topk_freq": 4}, [0, 1, 5]),
    "indexer-types-over-cli-factor": (
        {"indexer_types": ("full", "shared", "full"), "cli_factor": 2},
        [0, 2, 3, 4, 5, 6, 7],
    ),
}


@pytest.mark.parametrize(
    ("fields", "indexer_layers"), list(SMALL_CONFIGS.values()), ids=list(SMALL_CONFIGS)
)
def test_small_configs(
    kvcheck_target: Any, fields: dict[str, Any], indexer_layers: list[int]
) -> None:
    """Hand-checked masks: the rule that decides, and the ones it shadows."""
    mask = check_skip_rule(kvcheck_target, _dsa(**fields))
    assert mask is not None
    assert [layer for layer, skip in enumerate(mask) if not skip] == indexer_layers
