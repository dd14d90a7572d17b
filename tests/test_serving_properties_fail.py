"""Proof that each serving property can fail: broken targets are caught and shrunk small.

For every bug in ``broken_serving`` the property is searched with the strategies the
shipped suite draws from, for at most as many examples as the default profile runs (100),
derandomized and without an example database. ``find`` returns the minimal failing
example after shrinking; the tests pin how small it is, that the healthy target passes
on it, and what the failure says.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from broken_serving import (
    CellSizeCountsSkipLayers,
    DraftGetsNoOpPool,
    ForgetsPaddingPage,
    HiSparseIndexOnce,
    InvertedSkipMaskSizing,
    LetsMLAThrough,
    MessageOnlyErrors,
    OffByOneSkipOffset,
    QuantizedCellWithoutScales,
    RawFp8DsaRow,
    TwoPagesShort,
    VagueErrors,
    forgets_rule,
    swaps_rules,
)
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from kvcheck.failures import PropertyFailure
from kvcheck.properties.serving import (
    _rule_inputs,
    check_capacity_fits_budget,
    check_cell_size,
    check_more_skips_never_lower_capacity,
    check_pool_selection,
    check_skip_rule,
    check_validation_agrees,
    rules_named_by,
)
from kvcheck.reference import reference_skip_mask, reference_violations
from kvcheck.serving import PREFILL_ONLY_RULE_ORDER
from kvcheck.strategies import dtypes, model_configs, server_flags
from kvcheck.suite.test_serving_configurator import (
    CapacityCase,
    SkipPair,
    capacity_cases,
    skip_pairs,
)
from kvcheck.suite.test_serving_selection import ACCEPTED_FLAGS, FLAG_ON_FLAGS
from kvcheck.suite.test_serving_validation import ONE_VIOLATION, SEVERAL_VIOLATIONS
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, QWEN3_EMBEDDING_8B

#: As many examples as the default profile gives a shipped property, reproducibly. The
#: explain phase (which only annotates a failure report) is left out: it doubles the time.
SEARCH = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
HEALTHY = KVCheckTarget()


def minimal_failure(strategy: st.SearchStrategy[Any], check: Callable[[Any], object]) -> Any:
    """The shrunk example on which ``check`` raises PropertyFailure (NoSuchExample if none)."""

    def fails(example: Any) -> bool:
        try:
            check(example)
        except PropertyFailure:
            return True
        return False

    return find(strategy, fails, settings=SEARCH)


def failure_message(check: Callable[[], object]) -> str:
    with pytest.raises(PropertyFailure) as info:
        check()
    return str(info.value)


# --- validation ---------------------------------------------------------------------------


def _violated(flags: dict[str, Any]) -> tuple[str, ...]:
    return reference_violations(_rule_inputs(flags))


@pytest.mark.parametrize("rule", PREFILL_ONLY_RULE_ORDER)
def test_validation_that_forgets_a_rule_is_caught(rule: str) -> None:
    """Forgetting any one rule fails the validation property, shrunk to that rule alone."""
    broken = forgets_rule(rule)
    flags = minimal_failure(ONE_VIOLATION, lambda f: check_validation_agrees(broken, f))
    assert _violated(flags) == (rule,), f"shrunk to {flags}"
    assert check_validation_agrees(HEALTHY, flags) == rule
    message = failure_message(lambda: check_validation_agrees(broken, flags))
    assert rule in message


#: Neighbours in the rule order: a swap shows only when both are broken.
ADJACENT_SWAPS = [
    ("is_embedding", "fp4_kv_cache_dtype"),
    ("chunked_prefill_size", "disable_radix_cache"),
    ("attn_cp_size", "prefill_context_parallel"),
    ("hisparse", "fa_prefill_backend"),
]


@pytest.mark.parametrize(
    ("first", "second"), ADJACENT_SWAPS, ids=["+".join(pair) for pair in ADJACENT_SWAPS]
)
def test_validation_in_another_order_is_caught(first: str, second: str) -> None:
    """Checking two neighbouring rules in swapped order fails, shrunk to exactly those two."""
    broken = swaps_rules(first, second)
    flags = minimal_failure(SEVERAL_VIOLATIONS, lambda f: check_validation_agrees(broken, f))
    assert set(_violated(flags)) == {first, second}, f"shrunk to {flags}"
    message = failure_message(lambda: check_validation_agrees(broken, flags))
    assert f"got {second!r} but should be {first!r}" in message


def test_backend_rule_checked_first_is_caught() -> None:
    """Moving the backend rule to the front fails, shrunk to two violations."""
    broken = swaps_rules("is_embedding", "fa_prefill_backend")
    flags = minimal_failure(SEVERAL_VIOLATIONS, lambda f: check_validation_agrees(broken, f))
    violated = _violated(flags)
    assert len(violated) == 2 and {"is_embedding", "fa_prefill_backend"} & set(violated)


def test_reordering_is_caught_without_rule_ids() -> None:
    """Errors without a rule id are identified by the flags their message names."""
    broken = MessageOnlyErrors(swaps_rules("chunked_prefill_size", "disable_radix_cache"))
    flags = minimal_failure(SEVERAL_VIOLATIONS, lambda f: check_validation_agrees(broken, f))
    assert set(_violated(flags)) == {"chunked_prefill_size", "disable_radix_cache"}
    message = failure_message(lambda: check_validation_agrees(broken, flags))
    assert "('disable_radix_cache',)" in message


@settings(SEARCH)
@given(flags=server_flags())
def test_correct_messages_without_rule_ids_pass(flags: dict[str, Any]) -> None:
    """A correct validation whose errors carry no rule id passes on its messages alone."""
    assert check_validation_agrees(MessageOnlyErrors(), flags) == check_validation_agrees(
        HEALTHY, flags
    )


def test_message_without_the_conflicting_flag_is_caught() -> None:
    """The right rule with a message that omits the conflicting flag fails, on one violation."""
    broken = VagueErrors()
    flags = minimal_failure(ONE_VIOLATION, lambda f: check_validation_agrees(broken, f))
    assert len(_violated(flags)) == 1, f"shrunk to {flags}"
    assert "a message that names" in failure_message(lambda: check_validation_agrees(broken, flags))


# --- pool selection -----------------------------------------------------------------------

SELECTION_CASES = st.tuples(ACCEPTED_FLAGS, model_configs(), st.booleans())
#: What the shipped draft-worker test draws: flag on, any model, a draft worker.
DRAFT_CASES = st.tuples(FLAG_ON_FLAGS, model_configs(), st.just(True))


def _select(target: Any) -> Callable[[tuple[dict[str, Any], Any, bool]], object]:
    return lambda case: check_pool_selection(target, case[0], case[1], is_draft=case[2])


def test_selection_that_lets_mla_through_is_caught() -> None:
    """Building the MLA pool with the flag on fails, shrunk to a marker-free one-layer MLA."""
    flags, model, is_draft = minimal_failure(SELECTION_CASES, _select(LetsMLAThrough()))
    assert flags["prefill_only_disable_kv_cache"] and not is_draft
    assert model.attention_arch == "mla" and model.num_hidden_layers == 1
    assert model.sliding_window is None and not model.is_hybrid_linear
    assert _select(HEALTHY)((flags, model, is_draft)) == "refused"


def test_draft_worker_given_the_noop_pool_is_caught() -> None:
    """A draft worker treated as a normal one fails, shrunk to a one-layer draft, flag on."""
    flags, model, is_draft = minimal_failure(DRAFT_CASES, _select(DraftGetsNoOpPool()))
    assert flags["prefill_only_disable_kv_cache"] and is_draft
    assert model.num_hidden_layers == 1, f"shrunk to {model}"
    assert _select(HEALTHY)((flags, model, is_draft)) == model.attention_arch


# --- the skip rule ------------------------------------------------------------------------


def test_off_by_one_skip_offset_is_caught() -> None:
    """Reading the offset one layer late fails the shipped search, shrunk to two layers."""
    broken = OffByOneSkipOffset()
    model = minimal_failure(
        model_configs(archs=("dsa",), max_layers=16, include_markers=False, allow_invalid=True),
        lambda m: check_skip_rule(broken, m),
    )
    assert model.index_skip_topk_offset is not None
    assert model.num_hidden_layers <= 2, f"shrunk to {model}"
    assert "first of" in failure_message(lambda: check_skip_rule(broken, model))


def test_off_by_one_skip_offset_on_valid_configs_shrinks_to_freq_2_offset_1() -> None:
    """Among valid configs the smallest witness is two layers, freq 2, offset 1, at layer 1."""
    broken = OffByOneSkipOffset()
    model = minimal_failure(
        model_configs(archs=("dsa",), max_layers=16, include_markers=False),
        lambda m: check_skip_rule(broken, m),
    )
    fields = (model.num_hidden_layers, model.index_topk_freq, model.index_skip_topk_offset)
    assert fields == (2, 2, 1), f"shrunk to {model}"
    check_skip_rule(HEALTHY, model)
    message = failure_message(lambda: check_skip_rule(broken, model))
    assert "got False but should be True" in message and "layer 1 is the first" in message


# --- the configurator ---------------------------------------------------------------------

CELL_CASES = st.tuples(model_configs(include_markers=False), dtypes(), st.booleans(), st.booleans())


def _cell(target: Any) -> Callable[[tuple[Any, str, bool, bool]], object]:
    return lambda case: check_cell_size(
        target, case[0], dtype=case[1], is_draft=case[2], enable_hisparse=case[3]
    )


def test_cell_size_that_counts_skip_layers_is_caught() -> None:
    """Charging skip layers an indexer fails, shrunk to a small DSA model with one skip."""
    model, dtype, is_draft, enable_hisparse = minimal_failure(
        CELL_CASES, _cell(CellSizeCountsSkipLayers())
    )
    assert model.num_hidden_layers <= 3 and not (is_draft or enable_hisparse)
    assert reference_skip_mask(model).count(True) == 1, f"shrunk to {model}"
    _cell(HEALTHY)((model, dtype, is_draft, enable_hisparse))


def test_quantized_cell_without_its_scales_is_caught() -> None:
    """A configurator that leaves a quantized dtype's scale bytes out fails the cell-size
    check and the capacity check of the quantized property (its pools overshoot the
    budget), shrunk to a one-layer MHA model."""
    from kvcheck.suite.test_serving_configurator import quantized_capacity_cases

    broken = QuantizedCellWithoutScales()
    cases = quantized_capacity_cases()
    case = minimal_failure(cases, lambda c: check_cell_size(broken, c.model, dtype=c.dtype))
    assert (case.model.attention_arch, case.model.num_hidden_layers) == ("mha", 1)
    check_cell_size(HEALTHY, case.model, dtype=case.dtype)
    case = minimal_failure(cases, _capacity(broken))
    assert case.model.num_hidden_layers == 1, f"shrunk to {case}"
    _capacity(HEALTHY)(case)


def test_cell_size_with_a_raw_fp8_dsa_row_is_caught() -> None:
    """Sizing an fp8 e4m3 DSA row raw (576 bytes, not SGLang's scaled 656) fails, shrunk to
    a one-layer DSA model in float8_e4m3fn."""
    model, dtype, is_draft, enable_hisparse = minimal_failure(CELL_CASES, _cell(RawFp8DsaRow()))
    assert (model.attention_arch, model.num_hidden_layers, dtype) == ("dsa", 1, "float8_e4m3fn")
    assert not (is_draft or enable_hisparse)
    _cell(HEALTHY)((model, dtype, is_draft, enable_hisparse))


def test_a_size_for_a_refused_configuration_is_caught() -> None:
    """An fp8 e4m3 DSA latent of 64 (not a multiple of 128) has no scaled row: a target that
    sizes it anyway fails, and one that refuses it with ValueError passes."""
    narrow = dataclasses.replace(DEEPSEEK_V3_2, kv_lora_rank=64)
    message = failure_message(
        lambda: check_cell_size(RawFp8DsaRow(), narrow, dtype="float8_e4m3fn")
    )
    assert "accepted a refused configuration" in message or "ValueError (kv_lora_rank=64" in message
    assert check_cell_size(HEALTHY, narrow, dtype="float8_e4m3fn") is None


def test_cell_size_that_counts_hisparse_indexers_once_is_caught() -> None:
    """Charging a HiSparse pool one index slot per token fails, shrunk to one DSA layer."""
    model, dtype, is_draft, enable_hisparse = minimal_failure(
        CELL_CASES, _cell(HiSparseIndexOnce())
    )
    assert model.attention_arch == "dsa" and model.num_hidden_layers == 1 and enable_hisparse
    assert not is_draft, f"shrunk to a draft: {model}"
    _cell(HEALTHY)((model, dtype, is_draft, enable_hisparse))


def _capacity(target: Any) -> Callable[[CapacityCase], object]:
    return lambda case: check_capacity_fits_budget(
        target,
        case.model,
        case.budget_bytes,
        dtype=case.dtype,
        page_size=case.page_size,
        is_draft=case.is_draft,
        enable_hisparse=case.enable_hisparse,
    )


def test_capacity_that_forgets_the_padding_page_is_caught() -> None:
    """Dividing the budget by the cell size overshoots it, shrunk to one layer, page_size=1."""
    case = minimal_failure(capacity_cases(), _capacity(ForgetsPaddingPage()))
    assert case.model.num_hidden_layers == 1, f"shrunk to {case}"
    assert case.page_size == 1
    assert _capacity(HEALTHY)(case).pages_short == 0
    assert "over the budget" in failure_message(lambda: _capacity(ForgetsPaddingPage())(case))


def test_capacity_two_pages_short_is_caught() -> None:
    """An answer two pages below the most that fits fails, shrunk to a one-layer model."""
    case = minimal_failure(capacity_cases(), _capacity(TwoPagesShort()))
    assert case.model.num_hidden_layers == 1 and case.page_size == 1
    assert "2 pages short" in failure_message(lambda: _capacity(TwoPagesShort())(case))


def _monotone(target: Any) -> Callable[[SkipPair], object]:
    return lambda pair: check_more_skips_never_lower_capacity(
        target,
        pair.model,
        pair.more_skips,
        pair.budget_bytes,
        dtype=pair.dtype,
        page_size=pair.page_size,
    )


def test_sizing_that_charges_skip_layers_is_caught_by_monotonicity() -> None:
    """Charging skip layers instead of indexer layers lowers capacity; shrunk to two layers."""
    pair = minimal_failure(skip_pairs(), _monotone(InvertedSkipMaskSizing()))
    assert pair.model.num_hidden_layers == 2, f"shrunk to {pair}"
    assert reference_skip_mask(pair.more_skips).count(True) == 1
    before, after = _monotone(HEALTHY)(pair)
    assert after >= before


# --- the checks themselves ----------------------------------------------------------------

BAD_ARGUMENTS: dict[str, tuple[Callable[[], object], str]] = {
    "flags-not-a-mapping": (lambda: check_validation_agrees(HEALTHY, [("x", 1)]), "flags="),
    "unknown-flag": (
        lambda: check_validation_agrees(HEALTHY, {"prefill_only": True}),
        "not ServerArgs fields",
    ),
    "target-without-method": (
        lambda: check_validation_agrees(object(), {}),
        "validate_server_args",
    ),
    "is-draft-not-bool": (
        lambda: check_pool_selection(HEALTHY, {}, GLM_5_2_LIKE, is_draft=1),  # type: ignore[arg-type]
        "is_draft=1",
    ),
    "model-not-a-config": (lambda: check_cell_size(HEALTHY, "glm", dtype="bfloat16"), "model="),
    "unknown-dtype": (lambda: check_cell_size(HEALTHY, GLM_5_2_LIKE, dtype="int8"), "dtype='int8'"),
    "skip-rule-on-mha": (
        lambda: check_skip_rule(HEALTHY, QWEN3_EMBEDDING_8B),
        "attention_arch='mha'",
    ),
    "page-size-zero": (
        lambda: check_capacity_fits_budget(
            HEALTHY, GLM_5_2_LIKE, 1 << 30, dtype="bfloat16", page_size=0
        ),
        "page_size=0",
    ),
    "negative-budget": (
        lambda: check_capacity_fits_budget(
            HEALTHY, GLM_5_2_LIKE, -1, dtype="bfloat16", page_size=64
        ),
        "budget_bytes=-1",
    ),
    "fewer-skips-in-model-b": (
        lambda: check_more_skips_never_lower_capacity(
            HEALTHY,
            GLM_5_2_LIKE,
            _every_layer(GLM_5_2_LIKE),
            1 << 30,
            dtype="bfloat16",
            page_size=64,
        ),
        "layer_id=3 skips in model_a only",
    ),
    "different-depths": (
        lambda: check_more_skips_never_lower_capacity(
            HEALTHY, GLM_5_2_LIKE, DEEPSEEK_V3_2, 1 << 30, dtype="bfloat16", page_size=64
        ),
        "model_a.num_hidden_layers=78",
    ),
    "budget-below-one-page": (
        lambda: check_more_skips_never_lower_capacity(
            HEALTHY, GLM_5_2_LIKE, GLM_5_2_LIKE, 1024, dtype="bfloat16", page_size=64
        ),
        "budget_bytes=1024",
    ),
}


def _every_layer(model: Any) -> Any:
    return dataclasses.replace(model, index_topk_freq=None, index_skip_topk_offset=None)


@pytest.mark.parametrize(
    ("call", "fragment"), list(BAD_ARGUMENTS.values()), ids=list(BAD_ARGUMENTS)
)
def test_bad_arguments_raise_value_error(call: Callable[[], object], fragment: str) -> None:
    """A check given bad input raises ValueError naming the argument, never a failure."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        call()


MESSAGES = {
    "kvcheck-radix": ("... requires --disable-radix-cache: ...", ("disable_radix_cache",)),
    "sglang-fp4": (
        "does not support --kv-cache-dtype=nvfp4 or --kv-cache-dtype=fp4_mx_block16",
        ("fp4_kv_cache_dtype",),
    ),
    "sglang-prefill-cp": ("incompatible with --enable-prefill-cp", ("prefill_context_parallel",)),
    "sglang-attn-cp": ("incompatible with --attn-cp-size > 1", ("attn_cp_size",)),
    "prefill-backend-is-not-attention-backend": (
        "set --prefill-attention-backend fa3",
        ("fa_prefill_backend",),
    ),
    "kv-dtype-without-value": ("check --kv-cache-dtype", PREFILL_ONLY_RULE_ORDER[1:3]),
    "two-rules": (
        "--is-embedding and --chunked-prefill-size=-1",
        ("is_embedding", "chunked_prefill_size"),
    ),
    "flag-inside-a-longer-flag": ("--is-embedding-model", ()),
    "no-flag": ("FA prefill backend (fa3/fa4)", ()),
}


@pytest.mark.parametrize(("message", "rules"), list(MESSAGES.values()), ids=list(MESSAGES))
def test_rules_named_by_messages(message: str, rules: tuple[str, ...]) -> None:
    """Rules are read off whole-word flag names, SGLang's spellings included."""
    assert rules_named_by(message) == rules
