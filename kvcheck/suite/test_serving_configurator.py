"""The pool configurator: cell size, capacity for a budget, and the effect of skip layers.

The cell size equals the reference formula, the capacity's pools fit the budget they were
sized for (measured on ``meta`` where the target builds there) and fall at most one page
short of the most that fits, and turning more layers into skip layers never lowers the
capacity (:mod:`kvcheck.properties.serving`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from kvcheck.properties.serving import (
    check_capacity_fits_budget,
    check_cell_size,
    check_more_skips_never_lower_capacity,
)
from kvcheck.reference import QUANTIZED_KV_DTYPES, reference_pool_bytes, reference_skip_mask
from kvcheck.strategies import dtypes, model_configs, page_sizes
from kvcheck.targets import supports
from kvcheck.vocabulary import (
    DEEPSEEK_V3,
    DEEPSEEK_V3_2,
    GLM_5_2_LIKE,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    QWEN3_8B,
    QWEN3_EMBEDDING_8B,
    ModelConfig,
)

pytestmark = pytest.mark.kvcheck_needs("configurator")

_GIB = 1 << 30


class CapacityCase(NamedTuple):
    """One input of :func:`check_capacity_fits_budget`."""

    model: ModelConfig
    budget_bytes: int
    dtype: str
    page_size: int
    is_draft: bool
    enable_hisparse: bool


class SkipPair(NamedTuple):
    """Two DSA models where ``more_skips`` skips every layer ``model`` skips, and maybe more."""

    model: ModelConfig
    more_skips: ModelConfig
    budget_bytes: int
    dtype: str
    page_size: int


def _budget_between_pages(
    draw: Callable[..., Any], model: ModelConfig, dtype: str, page_size: int, **options: bool
) -> int:
    """A budget that holds ``pages`` pages and less than one page more: the tight spots.

    For a configuration the reference refuses (an fp8 DSA latent whose ``kv_lora_rank`` is
    not a multiple of 128), any budget: the target must refuse it whatever the budget.
    """
    pages = draw(st.integers(1, 64), label="pages that fit")

    def held(tokens: int) -> int:
        return reference_pool_bytes(
            model, num_tokens=tokens, dtype=dtype, page_size=page_size, **options
        )

    try:
        held(page_size)
    except ValueError:
        return draw(st.integers(1, 1 << 24), label="budget of a refused configuration")

    fits, next_page = held(pages * page_size), held((pages + 1) * page_size)
    return fits + draw(st.integers(0, next_page - fits - 1), label="bytes to spare")


@st.composite
def capacity_cases(draw: Callable[..., Any], max_layers: int = 8) -> CapacityCase:
    """Small models of any family with budgets just above a page boundary.

    Shrinks towards a one-layer MHA model in bf16, page_size=1, a budget of exactly one page.
    """
    model = draw(model_configs(max_layers=max_layers, include_markers=False), label="model")
    dtype = draw(dtypes(), label="dtype")
    page_size = draw(page_sizes(family=model.attention_arch, max_page_size=64), label="page")
    options = {
        "is_draft_worker": draw(st.booleans(), label="is_draft"),
        "enable_hisparse": draw(st.booleans(), label="enable_hisparse"),
    }
    budget = _budget_between_pages(draw, model, dtype, page_size, **options)
    return CapacityCase(
        model, budget, dtype, page_size, options["is_draft_worker"], options["enable_hisparse"]
    )


@st.composite
def skip_pairs(draw: Callable[..., Any], max_layers: int = 12) -> SkipPair:
    """A DSA model (any skip-topk fields) and a copy that skips more layers via indexer_types.

    Shrinks towards two one-layer models that skip nothing, page_size=1, one page of budget.
    """
    model = draw(
        model_configs(archs=("dsa",), max_layers=max_layers, include_markers=False),
        label="model",
    )
    mask = reference_skip_mask(model)
    # Layer 0 has no earlier top-k to reuse, so only later layers can start skipping.
    extra = draw(st.lists(st.booleans(), min_size=len(mask), max_size=len(mask)), label="extra")
    more = [
        skip or (add and layer > 0)
        for layer, (skip, add) in enumerate(zip(mask, extra, strict=True))
    ]
    more_skips = dataclasses.replace(
        model,
        name=f"{model.name}-more-skips",
        indexer_types=tuple("shared" if skip else "full" for skip in more),
        cli_factor=None,
        index_topk_pattern=None,
        index_topk_freq=None,
        index_skip_topk_offset=None,
    )
    dtype = draw(dtypes(), label="dtype")
    page_size = draw(page_sizes(family="dsa", max_page_size=64), label="page_size")
    budget = _budget_between_pages(draw, model, dtype, page_size)
    return SkipPair(model, more_skips, budget, dtype, page_size)


@given(
    model=model_configs(include_markers=False),
    dtype=dtypes(),
    is_draft=st.booleans(),
    enable_hisparse=st.booleans(),
)
def test_cell_size_matches_formula(
    kvcheck_target: Any, model: ModelConfig, dtype: str, is_draft: bool, enable_hisparse: bool
) -> None:
    """Bytes per token equal the formula; only non-skip layers pay for an indexer."""
    check_cell_size(
        kvcheck_target, model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
    )


@given(case=capacity_cases())
def test_capacity_fits_its_budget(kvcheck_target: Any, case: CapacityCase) -> None:
    """The capacity is page-aligned, its pools fit the budget, and it is at most a page short."""
    found = check_capacity_fits_budget(
        kvcheck_target,
        case.model,
        case.budget_bytes,
        dtype=case.dtype,
        page_size=case.page_size,
        is_draft=case.is_draft,
        enable_hisparse=case.enable_hisparse,
    )
    event(f"pages short: {found.pages_short}, measured by {found.measured_by}")


@given(pair=skip_pairs())
def test_more_skip_layers_never_lower_capacity(kvcheck_target: Any, pair: SkipPair) -> None:
    """Skipping the indexer on more layers leaves at least as many tokens in the budget."""
    before, after = check_more_skips_never_lower_capacity(
        kvcheck_target,
        pair.model,
        pair.more_skips,
        pair.budget_bytes,
        dtype=pair.dtype,
        page_size=pair.page_size,
    )
    event("more tokens" if after > before else "same tokens")


@st.composite
def quantized_capacity_cases(
    draw: Callable[..., Any],
    max_layers: int = 8,
    archs: tuple[str, ...] = ("mha", "mla", "dsa"),
    kv_cache_dtypes: tuple[str, ...] = QUANTIZED_KV_DTYPES,
) -> CapacityCase:
    """Models of ``archs`` (DSA too by default: no quantized pool, so both sides refuse) with
    one of ``kv_cache_dtypes`` and a budget just above a page boundary; MHA head dims drawn
    as multiples of 32 often enough that most draws fit the variant's blocks.

    Shrinks towards a one-layer model of the first arch with the first dtype, page_size=1,
    one page of budget.
    """
    model = draw(
        model_configs(archs=archs, max_layers=max_layers, include_markers=False), label="model"
    )
    if model.attention_arch == "mha" and draw(st.booleans(), label="whole blocks"):
        dims = st.sampled_from((32, 64, 128))
        model = dataclasses.replace(
            model, head_dim=draw(dims, label="head_dim"), v_head_dim=draw(dims, label="v_head_dim")
        )
    dtype = draw(st.sampled_from(kv_cache_dtypes), label="kv_cache_dtype")
    page_size = draw(st.sampled_from((1, 16, 64, 128)), label="page_size")
    budget = _budget_between_pages(draw, model, dtype, page_size)
    return CapacityCase(model, budget, dtype, page_size, False, False)


def _quantized_cases_for(target: Any) -> st.SearchStrategy[CapacityCase]:
    """:func:`quantized_capacity_cases` narrowed to what ``target`` sizes: the families it
    does not declare ``quantized_configurator:<family>`` unsupported for, and the dtypes
    it does not list in ``unsized_kv_cache_dtypes`` (a skip quotes why when none is left)."""
    archs = tuple(
        arch
        for arch in ("mha", "mla", "dsa")
        if supports(target, "quantized_configurator", family=arch)
    )
    unsized = getattr(target, "unsized_kv_cache_dtypes", None) or {}
    sized = tuple(dtype for dtype in QUANTIZED_KV_DTYPES if dtype not in unsized)
    if not archs or not sized:
        pytest.skip(
            f"{target.name} sizes no quantized --kv-cache-dtype of these families: "
            + "; ".join(f"{dtype}: {why}" for dtype, why in unsized.items())
        )
    return quantized_capacity_cases(archs=archs, kv_cache_dtypes=sized)


@pytest.mark.kvcheck_needs("quantized_configurator")
@given(data=st.data())
def test_quantized_cells_count_the_scales(kvcheck_target: Any, data: st.DataObject) -> None:
    """A quantized --kv-cache-dtype costs its payload and scales per token (NVFP4 also its
    dequant workspace), and a model whose heads are not whole blocks is refused."""
    case = data.draw(_quantized_cases_for(kvcheck_target), label="case")
    cell = check_cell_size(kvcheck_target, case.model, dtype=case.dtype)
    event(f"{case.model.attention_arch} {case.dtype}: {'refused' if cell is None else 'sized'}")


@pytest.mark.kvcheck_needs("quantized_configurator")
@given(data=st.data())
def test_quantized_capacity_fits_its_budget(kvcheck_target: Any, data: st.DataObject) -> None:
    """The capacity of a quantized --kv-cache-dtype is page-aligned, its pools (scale
    buffers, NVFP4's workspace) fit the budget, and it is at most a page short."""
    case = data.draw(_quantized_cases_for(kvcheck_target), label="case")
    found = check_capacity_fits_budget(
        kvcheck_target, case.model, case.budget_bytes, dtype=case.dtype, page_size=case.page_size
    )
    event(f"{case.dtype}: {found.measured_by}")


NAMED_CELL_SIZES: dict[str, tuple[ModelConfig, str, bool, int]] = {
    "glm-5.2-like-bf16": (GLM_5_2_LIKE, "bfloat16", False, 92628),
    "glm-5.2-like-bf16-draft": (GLM_5_2_LIKE, "bfloat16", True, 100152),
    "deepseek-v3.2-bf16": (DEEPSEEK_V3_2, "bfloat16", False, 78324),
    # SGLang's scaled fp8 row: 61 layers * 656 bytes + 61 indexers * 132 bytes.
    "deepseek-v3.2-fp8": (DEEPSEEK_V3_2, "float8_e4m3fn", False, 48068),
    "qwen3-embedding-8b-bf16": (QWEN3_EMBEDDING_8B, "bfloat16", False, 147456),
    # 32 layers * 8 KV heads * (128 + 128) * 2 bytes; 80 * 8 * 256 * 2 for 70B.
    "llama-3.1-8b-bf16": (LLAMA_3_1_8B, "bfloat16", False, 131072),
    "llama-3.1-8b-fp8": (LLAMA_3_1_8B, "float8_e4m3fn", False, 65536),
    "llama-3.1-70b-bf16": (LLAMA_3_1_70B, "bfloat16", False, 327680),
    # 36 layers * 8 KV heads * (128 + 128) * 2 bytes, as its embedding sibling.
    "qwen3-8b-bf16": (QWEN3_8B, "bfloat16", False, 147456),
    # 61 layers * (512 + 64) * 2 bytes: MLA without an indexer.
    "deepseek-v3-bf16": (DEEPSEEK_V3, "bfloat16", False, 70272),
}


@pytest.mark.parametrize(
    ("model", "dtype", "is_draft", "cell_size"),
    list(NAMED_CELL_SIZES.values()),
    ids=list(NAMED_CELL_SIZES),
)
def test_named_cell_sizes(
    kvcheck_target: Any, model: ModelConfig, dtype: str, is_draft: bool, cell_size: int
) -> None:
    """Published configs: GLM-5.2-like pays for 21 indexers (78 as a draft), DeepSeek-V3.2
    for 61, DeepSeek-V3 for none; Llama 3.1 and Qwen3-8B pay for their KV heads."""
    assert check_cell_size(kvcheck_target, model, dtype=dtype, is_draft=is_draft) == cell_size


NAMED_CAPACITIES: dict[str, tuple[ModelConfig, int, str]] = {
    "glm-5.2-like-60gib-bf16": (GLM_5_2_LIKE, 60 * _GIB, "bfloat16"),
    "deepseek-v3.2-60gib-bf16": (DEEPSEEK_V3_2, 60 * _GIB, "bfloat16"),
    "qwen3-embedding-8b-60gib-bf16": (QWEN3_EMBEDDING_8B, 60 * _GIB, "bfloat16"),
    "glm-5.2-like-1gib-fp8": (GLM_5_2_LIKE, _GIB, "float8_e4m3fn"),
    "llama-3.1-8b-60gib-bf16": (LLAMA_3_1_8B, 60 * _GIB, "bfloat16"),
    "qwen3-8b-60gib-bf16": (QWEN3_8B, 60 * _GIB, "bfloat16"),
    "deepseek-v3-60gib-bf16": (DEEPSEEK_V3, 60 * _GIB, "bfloat16"),
}


@pytest.mark.parametrize(
    ("model", "budget_bytes", "dtype"), list(NAMED_CAPACITIES.values()), ids=list(NAMED_CAPACITIES)
)
def test_named_capacities_fit(
    kvcheck_target: Any, model: ModelConfig, budget_bytes: int, dtype: str
) -> None:
    """Production budgets: the pools for the capacity fit, measured at full scale on meta."""
    found = check_capacity_fits_budget(
        kvcheck_target, model, budget_bytes, dtype=dtype, page_size=64
    )
    assert found.max_total_num_tokens > 0


def test_glm_skip_layers_raise_capacity_over_deepseek_style_indexers(kvcheck_target: Any) -> None:
    """GLM-5.2-like with its 57 skip layers holds more tokens than with an indexer everywhere."""
    every_layer = dataclasses.replace(
        GLM_5_2_LIKE,
        name="GLM-5.2-like-no-skips",
        index_topk_freq=None,
        index_skip_topk_offset=None,
    )
    before, after = check_more_skips_never_lower_capacity(
        kvcheck_target, every_layer, GLM_5_2_LIKE, 60 * _GIB, dtype="bfloat16", page_size=64
    )
    assert after > before
