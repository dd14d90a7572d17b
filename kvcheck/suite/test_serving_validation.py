"""--prefill-only-disable-kv-cache validation: accepted exactly when the rules allow it.

Rejections must be the first violated rule's ``ValueError``, naming the flag and the
conflicting one (:func:`kvcheck.properties.serving.check_validation_agrees`).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest
from hypothesis import event, given

from kvcheck.properties.serving import check_validation_agrees
from kvcheck.reference import PREFILL_ONLY_RULES
from kvcheck.strategies import server_flags
from kvcheck.vocabulary import MINIMAL_VALID_FLAGS

pytestmark = pytest.mark.kvcheck_needs("server_args")

#: The combination the flag accepts with the fewest settings.
VALID = dict(MINIMAL_VALID_FLAGS)


@given(flags=server_flags())
def test_validation_agrees_with_the_rules(kvcheck_target: Any, flags: dict[str, Any]) -> None:
    """Any combination is accepted exactly when the rules allow it, else rejected by rule."""
    rule = check_validation_agrees(kvcheck_target, flags)
    event(f"rule: {rule or 'accepted'}")


#: Exactly one rule broken: every rule gets its turn as the one that must raise.
ONE_VIOLATION = server_flags(prefill_only_disable_kv_cache=True, min_violations=1, max_violations=1)
#: Several rules broken at once: only the first may raise.
SEVERAL_VIOLATIONS = server_flags(
    prefill_only_disable_kv_cache=True, min_violations=2, max_violations=3
)


@given(flags=ONE_VIOLATION)
def test_each_broken_rule_raises_its_error(kvcheck_target: Any, flags: dict[str, Any]) -> None:
    """With exactly one rule broken, that rule's error is raised, whichever rule it is."""
    rule = check_validation_agrees(kvcheck_target, flags)
    assert rule is not None, f"{flags} breaks a rule but was accepted"
    event(f"rule: {rule}")


@given(flags=SEVERAL_VIOLATIONS)
def test_first_violated_rule_wins(kvcheck_target: Any, flags: dict[str, Any]) -> None:
    """With several rules broken at once, the error is the first violated rule's."""
    rule = check_validation_agrees(kvcheck_target, flags)
    assert rule is not None, f"{flags} breaks at least two rules but was accepted"
    event(f"rule: {rule}")


@given(flags=server_flags(prefill_only_disable_kv_cache=False))
def test_flag_off_accepts_every_combination(kvcheck_target: Any, flags: dict[str, Any]) -> None:
    """Without --prefill-only-disable-kv-cache none of its rules apply."""
    assert check_validation_agrees(kvcheck_target, flags) is None


SINGLE_VIOLATIONS: dict[str, tuple[dict[str, Any], str]] = {
    "not-embedding": ({"is_embedding": False}, "is_embedding"),
    "kv-nvfp4": ({"kv_cache_dtype": "nvfp4"}, "fp4_kv_cache_dtype"),
    "kv-fp4_mx_block16": ({"kv_cache_dtype": "fp4_mx_block16"}, "fp4_kv_cache_dtype"),
    "kv-mxfp8": ({"kv_cache_dtype": "mxfp8"}, "mxfp8_kv_cache_dtype"),
    "chunked-4096": ({"chunked_prefill_size": 4096}, "chunked_prefill_size"),
    "chunked-by-default": ({"chunked_prefill_size": None}, "chunked_prefill_size"),
    "radix-cache-on": ({"disable_radix_cache": False}, "disable_radix_cache"),
    "attn-cp-2": ({"attn_cp_size": 2}, "attn_cp_size"),
    "prefill-cp": ({"enable_prefill_context_parallel": True}, "prefill_context_parallel"),
    "hisparse": ({"enable_hisparse": True}, "hisparse"),
    "backend-triton": ({"attention_backend": "triton"}, "fa_prefill_backend"),
    "prefill-backend-flashinfer": (
        {"prefill_attention_backend": "flashinfer"},
        "fa_prefill_backend",
    ),
    "fa3-with-fp8_e5m2-becomes-triton": ({"kv_cache_dtype": "fp8_e5m2"}, "fa_prefill_backend"),
    "default-backend-sm100": (
        {"attention_backend": None, "gpu_arch": "sm100"},
        "fa_prefill_backend",
    ),
    "default-backend-cpu": ({"attention_backend": None, "device": "cpu"}, "fa_prefill_backend"),
}


@pytest.mark.parametrize(
    ("change", "rule"), list(SINGLE_VIOLATIONS.values()), ids=list(SINGLE_VIOLATIONS)
)
def test_each_rule_alone_rejects(kvcheck_target: Any, change: dict[str, Any], rule: str) -> None:
    """Breaking one rule of an accepted combination raises that rule's error."""
    assert check_validation_agrees(kvcheck_target, VALID | change) == rule


#: One way to break each rule, in the rules' order.
BREAK_ONE: dict[str, dict[str, Any]] = {
    "is_embedding": {"is_embedding": False},
    "fp4_kv_cache_dtype": {"kv_cache_dtype": "nvfp4"},
    "mxfp8_kv_cache_dtype": {"kv_cache_dtype": "mxfp8"},
    "chunked_prefill_size": {"chunked_prefill_size": 8192},
    "disable_radix_cache": {"disable_radix_cache": False},
    "attn_cp_size": {"attn_cp_size": 4},
    "prefill_context_parallel": {"enable_prefill_context_parallel": True},
    "hisparse": {"enable_hisparse": True},
    "fa_prefill_backend": {"attention_backend": "flashinfer"},
}
#: Every pair of rules that can be broken together (FP4 and MXFP8 share one flag).
RULE_PAIRS = [
    (first.rule_id, second.rule_id)
    for first, second in combinations(PREFILL_ONLY_RULES, 2)
    if not BREAK_ONE[first.rule_id].keys() & BREAK_ONE[second.rule_id].keys()
]


@pytest.mark.parametrize(("first", "second"), RULE_PAIRS, ids=[f"{a}+{b}" for a, b in RULE_PAIRS])
def test_every_pair_of_rules_in_order(kvcheck_target: Any, first: str, second: str) -> None:
    """Of any two broken rules, the earlier one in the rule order raises."""
    flags = VALID | BREAK_ONE[first] | BREAK_ONE[second]
    assert check_validation_agrees(kvcheck_target, flags) == first


ACCEPTED: dict[str, dict[str, Any]] = {
    "minimal": {},
    "fa4": {"attention_backend": "fa4"},
    "default-backend-sm90": {"attention_backend": None},
    "fa3-prefill-over-triton": {"attention_backend": "triton", "prefill_attention_backend": "fa3"},
    "fa4-pair-wins": {
        "attention_backend": "triton",
        "prefill_attention_backend": "fa4",
        "decode_attention_backend": "fa4",
    },
    "kv-fp8_e4m3": {"kv_cache_dtype": "fp8_e4m3"},
    "page-size-64": {"page_size": 64},
}


@pytest.mark.parametrize("change", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_allowed_combinations_are_accepted(kvcheck_target: Any, change: dict[str, Any]) -> None:
    """Combinations that break no rule are accepted, including resolved defaults."""
    assert check_validation_agrees(kvcheck_target, VALID | change) is None


NAMED_MODELS: dict[str, tuple[str, str | None]] = {
    "qwen3-embedding-8b": ("Qwen/Qwen3-Embedding-8B", None),
    "deepseek-v3.2": ("deepseek-ai/DeepSeek-V3.2", "fa_prefill_backend"),
    "glm-5.2-like": ("GLM-5.2-like", "fa_prefill_backend"),
}


@pytest.mark.parametrize(
    ("model_path", "rule"), list(NAMED_MODELS.values()), ids=list(NAMED_MODELS)
)
def test_named_models_with_the_default_backend(
    kvcheck_target: Any, model_path: str, rule: str | None
) -> None:
    """An MHA model gets fa3 on Hopper and passes; a DSA model gets "dsa" and is rejected."""
    flags = VALID | {"model_path": model_path, "attention_backend": None}
    assert check_validation_agrees(kvcheck_target, flags) == rule
