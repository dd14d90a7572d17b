"""Bad varlen input is refused with a ValueError naming the argument and its value."""

from __future__ import annotations

import pytest
import torch

from kvcheck.attention import (
    VarlenBatch,
    flash_varlen_attention,
    paged_attention,
    prefill_attention,
    reference_varlen_attention,
    scrambled_layout,
    varlen_attention,
)
from kvcheck.attention.tolerances import COMPARISONS, TOLERANCES, tolerance
from kvcheck.properties.attention import paged_case


def _call(**overrides):
    args = {
        "q": torch.zeros(5, 4, 8),
        "k": torch.zeros(5, 2, 8),
        "v": torch.zeros(5, 2, 8),
        "cu_seqlens": torch.tensor([0, 2, 5], dtype=torch.int32),
        "max_seqlen": 3,
    }
    options = {"causal": True}
    for name, value in overrides.items():
        (args if name in args else options)[name] = value
    return args, options


BAD_CALLS = {
    "cu-int64": (
        {"cu_seqlens": torch.tensor([0, 2, 5], dtype=torch.int64)},
        r"cu_seqlens\.dtype=torch\.int64 must be torch\.int32",
    ),
    "cu-not-from-0": (
        {"cu_seqlens": torch.tensor([1, 2, 5], dtype=torch.int32)},
        r"cu_seqlens\[0\]=1 must be 0",
    ),
    "cu-decreasing": (
        {"cu_seqlens": torch.tensor([0, 4, 2, 5], dtype=torch.int32)},
        r"non-decreasing: cu_seqlens\[2\]=2 < cu_seqlens\[1\]=4",
    ),
    "cu-short-of-tokens": (
        {"cu_seqlens": torch.tensor([0, 2, 4], dtype=torch.int32)},
        r"cu_seqlens\[-1\]=4 < q\.shape\[0\]=5",
    ),
    "cu-beyond-tokens": (
        {"cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32)},
        r"cu_seqlens\[-1\]=6 > q\.shape\[0\]=5",
    ),
    "cu-2d": (
        {"cu_seqlens": torch.tensor([[0, 5]], dtype=torch.int32)},
        r"cu_seqlens\.shape=\(1, 2\) must be 1-D",
    ),
    "cu-list": ({"cu_seqlens": [0, 2, 5]}, r"cu_seqlens=list must be a torch\.Tensor"),
    "heads-not-divisible": (
        {"q": torch.zeros(5, 3, 8)},
        r"q\.shape\[1\]=3 query heads is not divisible by k\.shape\[1\]=2",
    ),
    "k-dtype": (
        {"k": torch.zeros(5, 2, 8, dtype=torch.float16)},
        r"k\.dtype=torch\.float16 != q\.dtype=torch\.float32",
    ),
    "v-dtype": (
        {"v": torch.zeros(5, 2, 8, dtype=torch.bfloat16)},
        r"v\.dtype=torch\.bfloat16 != q\.dtype=torch\.float32",
    ),
    "q-int": ({"q": torch.zeros(5, 4, 8, dtype=torch.int32)}, r"q\.dtype=torch\.int32"),
    "q-rank2": ({"q": torch.zeros(5, 32)}, r"q\.shape=\(5, 32\) must have 3 dimensions"),
    "k-rank4": ({"k": torch.zeros(5, 2, 8, 1)}, r"k\.shape=\(5, 2, 8, 1\) must have 3"),
    "v-rank2": ({"v": torch.zeros(5, 16)}, r"v\.shape=\(5, 16\) must have 3"),
    "k-head-dim": ({"k": torch.zeros(5, 2, 4)}, r"k\.shape\[2\]=4 != q\.shape\[2\]=8"),
    "v-tokens": ({"v": torch.zeros(4, 2, 8)}, r"v\.shape\[0\]=4 != k\.shape\[0\]=5"),
    "v-heads": ({"v": torch.zeros(5, 1, 8)}, r"v\.shape\[1\]=1 != k\.shape\[1\]=2"),
    "max-seqlen-short": ({"max_seqlen": 2}, r"max_seqlen=2 < 3"),
    "max-seqlen-float": ({"max_seqlen": 3.0}, r"max_seqlen=3\.0 must be an int"),
    "window-below-minus-1": ({"window": (-2, 0)}, r"left=-2 must be an int >= -1"),
    "window-one-side": ({"window": (4,)}, r"window=\(4,\) must be a pair"),
    "softcap-negative": ({"softcap": -1.0}, r"softcap=-1\.0 must be finite and >= 0"),
    "scale-nan": ({"softmax_scale": float("nan")}, r"softmax_scale=nan must be finite"),
    "causal-int": ({"causal": 1}, r"causal=1 must be a bool"),
    "backend-unknown": ({"backend": "triton"}, r"backend='triton' must be one of"),
}


@pytest.mark.parametrize(("overrides", "message"), BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_input_raises_value_error_naming_the_argument(overrides, message):
    """Each malformed argument is a ValueError whose message names it and its value."""
    args, options = _call(**overrides)
    with pytest.raises(ValueError, match=message):
        varlen_attention(*args.values(), **options)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [v for k, v in BAD_CALLS.items() if k != "backend-unknown"],
    ids=[k for k in BAD_CALLS if k != "backend-unknown"],
)
def test_flash_path_validates_like_the_reference(overrides, message):
    """The flash wrapper refuses the same input before any kernel sees it."""
    args, options = _call(**overrides)

    def kernel_must_not_run(*_args, **_kwargs):
        raise AssertionError("the kernel was called with invalid input")

    with pytest.raises(ValueError, match=message):
        flash_varlen_attention(*args.values(), flash_fn=kernel_must_not_run, **options)


def test_mismatched_key_segments_are_refused():
    """cu_seqlens_k must describe as many sequences as cu_seqlens."""
    q, kv = torch.zeros(3, 1, 4), torch.zeros(4, 1, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens_k has 1 segments but cu_seqlens has 2"):
        varlen_attention(
            q,
            kv,
            kv,
            torch.tensor([0, 1, 3], dtype=torch.int32),
            2,
            causal=True,
            cu_seqlens_k=torch.tensor([0, 4], dtype=torch.int32),
            max_seqlen_k=4,
        )


def test_an_unknown_comparison_names_the_known_ones():
    """tolerance() refuses a comparison the table does not define, listing the ones it does."""
    with pytest.raises(ValueError, match=r"comparison='paged' not in \('paged_vs_raw'"):
        tolerance("paged", dtype=torch.float32, device="cpu")
    assert {comparison for comparison, _, _ in TOLERANCES} == set(COMPARISONS)


def _zeros_kernel(q, k, v, **_flash_keywords):
    return torch.zeros_like(q)


def _entry_points():
    raw = tuple(_call()[0].values())
    batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
    case = paged_case(
        batch, scrambled_layout((3, 2), page_size=2), dtype=torch.float32, device="cpu"
    )
    pages = {"layer_id": 0, "page_table": case.page_table}
    prefill_args = (case.q, case.k, case.v, case.cu_seqlens, 3)
    return {
        "varlen": lambda **kw: varlen_attention(*raw, **kw),
        "reference": lambda **kw: reference_varlen_attention(*raw, **kw),
        "flash": lambda **kw: flash_varlen_attention(*raw, flash_fn=_zeros_kernel, **kw),
        "paged": lambda **kw: paged_attention(case.q, case.pool, case.cu_seqlens, 3, **pages, **kw),
        "prefill-raw": lambda **kw: prefill_attention(
            *prefill_args, pool=case.pool, **pages, skip_kv_cache=True, **kw
        ),
        "prefill-paged": lambda **kw: prefill_attention(
            *prefill_args, pool=case.pool, **pages, skip_kv_cache=False, **kw
        ),
    }


UNKNOWN_OPTIONS = {
    "varlen": {"flash_fn": torch.zeros_like},
    "reference": {"backend": "torch"},
    "flash": {"backend": "flash"},
    "paged": {"cu_seqlens_k": torch.tensor([0, 3, 5], dtype=torch.int32)},
    "prefill-raw": {"max_seqlen_k": 3},
    "prefill-paged": {"read": "kv"},
}


@pytest.mark.parametrize("entry", UNKNOWN_OPTIONS)
def test_options_behave_like_explicit_keyword_parameters(entry):
    """Entry points take their options as **options, yet, as explicit keyword-only
    parameters would, a missing ``causal`` or an option they do not take is a TypeError."""
    call = _entry_points()[entry]
    assert call(causal=True).shape[0] == 5
    with pytest.raises(TypeError, match="causal"):
        call()
    ((name, value),) = UNKNOWN_OPTIONS[entry].items()
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        call(causal=True, **{name: value})
