"""Pool selection under --prefill-only-disable-kv-cache: refused for exactly the right families.

With the flag on, a plain MHA model gets the no-op pool and every other family a
``RuntimeError``; a draft worker, or the flag off, keeps the model's normal pool
(:func:`kvcheck.properties.serving.check_pool_selection`).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from kvcheck.properties.serving import check_pool_selection
from kvcheck.strategies import model_configs, server_flags
from kvcheck.vocabulary import (
    DEEPSEEK_V3_2,
    GLM_5_2_LIKE,
    MINIMAL_VALID_FLAGS,
    QWEN3_EMBEDDING_8B,
    ModelConfig,
)

pytestmark = pytest.mark.kvcheck_needs("pool_selection")

#: Flags validation accepts, with the flag drawn on or off: selection runs after validation.
ACCEPTED_FLAGS = server_flags(max_violations=0)
#: Accepted flags with --prefill-only-disable-kv-cache on.
FLAG_ON_FLAGS = server_flags(prefill_only_disable_kv_cache=True, max_violations=0)


@given(flags=ACCEPTED_FLAGS, model=model_configs(), is_draft=st.booleans())
def test_pool_selection_refuses_exactly_the_unsupported_families(
    kvcheck_target: Any, flags: dict[str, Any], model: Any, is_draft: bool
) -> None:
    """Any model, flag on or off, worker or draft: the family the rules pick, or RuntimeError."""
    outcome = check_pool_selection(kvcheck_target, flags, model, is_draft=is_draft)
    event(f"{'draft' if is_draft else 'worker'}: {outcome}")


@given(flags=FLAG_ON_FLAGS, model=model_configs())
def test_draft_worker_keeps_its_normal_pool(
    kvcheck_target: Any, flags: dict[str, Any], model: Any
) -> None:
    """A draft worker is never given the no-op pool nor refused, whatever the model."""
    outcome = check_pool_selection(kvcheck_target, flags, model, is_draft=True)
    assert outcome not in ("noop", "refused"), f"draft worker for {model!r} got {outcome!r}"


FLAG_ON = dict(MINIMAL_VALID_FLAGS)
FLAG_OFF: dict[str, Any] = {}
#: A plain MLA model (DeepSeek-V3.2's latent without its indexer) and a hybrid linear
#: attention MHA model: each is refused by its own rule, which random draws reach only in
#: some runs.
PLAIN_MLA = ModelConfig(
    name="plain-MLA",
    attention_arch="mla",
    num_hidden_layers=4,
    num_attention_heads=16,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
HYBRID_LINEAR = ModelConfig(
    name="hybrid-linear",
    attention_arch="mha",
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    is_hybrid_linear=True,
)

NAMED_CASES: dict[str, tuple[Any, dict[str, Any], bool, str]] = {
    "qwen3-embedding-8b-flag-on": (QWEN3_EMBEDDING_8B, FLAG_ON, False, "noop"),
    "qwen3-embedding-8b-flag-on-draft": (QWEN3_EMBEDDING_8B, FLAG_ON, True, "mha"),
    "qwen3-embedding-8b-flag-off": (QWEN3_EMBEDDING_8B, FLAG_OFF, False, "mha"),
    "deepseek-v3.2-flag-on": (DEEPSEEK_V3_2, FLAG_ON, False, "refused"),
    "deepseek-v3.2-flag-on-draft": (DEEPSEEK_V3_2, FLAG_ON, True, "dsa"),
    "deepseek-v3.2-flag-off": (DEEPSEEK_V3_2, FLAG_OFF, False, "dsa"),
    "glm-5.2-like-flag-on": (GLM_5_2_LIKE, FLAG_ON, False, "refused"),
    "glm-5.2-like-flag-on-draft": (GLM_5_2_LIKE, FLAG_ON, True, "dsa"),
    "plain-mla-flag-on": (PLAIN_MLA, FLAG_ON, False, "refused"),
    "hybrid-linear-flag-on": (HYBRID_LINEAR, FLAG_ON, False, "refused"),
}


@pytest.mark.parametrize(
    ("model", "flags", "is_draft", "outcome"), list(NAMED_CASES.values()), ids=list(NAMED_CASES)
)
def test_named_models(
    kvcheck_target: Any, model: Any, flags: dict[str, Any], is_draft: bool, outcome: str
) -> None:
    """Qwen3-Embedding gets the no-op pool; the DSA, MLA and hybrid linear models are
    refused, except as drafts."""
    assert check_pool_selection(kvcheck_target, flags, model, is_draft=is_draft) == outcome
