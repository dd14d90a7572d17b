"""The torch reference follows flash_attn_varlen_func's documented semantics."""

from __future__ import annotations

import math

import pytest
import torch

from kvcheck.attention import attention_mask, reference_varlen_attention

CU_ONE = torch.tensor([0, 1], dtype=torch.int32)


def _cu(*lens: int) -> torch.Tensor:
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "causal", "window", "expected"),
    [
        # flash-attn's docstring: causal, seqlen_q=2, seqlen_k=5
        (2, 5, True, (-1, -1), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        # flash-attn's docstring: causal, seqlen_q=5, seqlen_k=2 (rows 0-2 see no key)
        (5, 2, True, (-1, -1), [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]),
        (3, 3, False, (-1, -1), [[1, 1, 1], [1, 1, 1], [1, 1, 1]]),
        (3, 3, True, (-1, -1), [[1, 0, 0], [1, 1, 0], [1, 1, 1]]),
        (4, 4, False, (1, 0), [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]),
        (3, 3, False, (0, 1), [[1, 1, 0], [0, 1, 1], [0, 0, 1]]),
        (3, 3, False, (-1, 0), [[1, 0, 0], [1, 1, 0], [1, 1, 1]]),
        # causal forces right=0 even when a wider right window is given
        (3, 3, True, (0, 2), [[1, 0, 0], [0, 1, 0], [0, 0, 1]]),
        # window aligned bottom-right too: query i's diagonal is key i + 2
        (2, 4, False, (1, 0), [[0, 1, 1, 0], [0, 0, 1, 1]]),
    ],
    ids=[
        "doc-causal-2x5",
        "doc-causal-5x2",
        "bidirectional",
        "causal-square",
        "window-left1",
        "window-right1",
        "window-right0-is-causal",
        "causal-overrides-right",
        "window-bottom-right",
    ],
)
def test_attention_mask_matches_documented_layout(seqlen_q, seqlen_k, causal, window, expected):
    """The mask is aligned bottom-right, -1 is unbounded and causal sets right to 0."""
    mask = attention_mask(seqlen_q, seqlen_k, causal=causal, window=window)
    assert mask.int().tolist() == expected


def test_gqa_query_head_reads_kv_head_h_div_group():
    """Query head h attends with KV head h // (num_heads // num_kv_heads)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 6, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 4)
    cu = _cu(2, 3)
    out = reference_varlen_attention(q, k, v, cu, 3, causal=True)
    for h in range(6):
        single = reference_varlen_attention(
            q[:, h : h + 1],
            k[:, h // 3 : h // 3 + 1],
            v[:, h // 3 : h // 3 + 1],
            cu,
            3,
            causal=True,
        )
        torch.testing.assert_close(out[:, h : h + 1], single, rtol=0, atol=0)


def test_default_scale_is_inverse_sqrt_of_query_head_dim():
    """softmax_scale=None means 1/sqrt(q.shape[-1]), not V's head dim."""
    torch.manual_seed(1)
    q, k, v = torch.randn(4, 2, 16), torch.randn(4, 2, 16), torch.randn(4, 2, 4)
    cu = _cu(4)
    default = reference_varlen_attention(q, k, v, cu, 4, causal=False)
    explicit = reference_varlen_attention(q, k, v, cu, 4, causal=False, softmax_scale=0.25)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)


def test_softcap_is_applied_to_scaled_scores_before_softmax():
    """Scores become softcap * tanh(scale * q.k / softcap) before the softmax."""
    q = torch.tensor([[[1.0, 0.0]]])  # one query
    k = torch.tensor([[[0.0, 0.0]], [[4.0, 0.0]]])  # scores 0 and 4 before scaling
    v = torch.tensor([[[1.0]], [[0.0]]])
    out = reference_varlen_attention(
        q,
        k,
        v,
        _cu(1),
        1,
        causal=False,
        softmax_scale=0.5,
        softcap=1.0,
        cu_seqlens_k=_cu(2),
        max_seqlen_k=2,
    )
    capped = [0.0, math.tanh(2.0)]
    expected = math.exp(capped[0]) / (math.exp(capped[0]) + math.exp(capped[1]))
    assert out.item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_output_has_query_dtype_and_fp32_accumulation(dtype):
    """Low-precision inputs are computed in fp32 and rounded once to q's dtype."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(6, 2, 8).to(dtype) for _ in range(3))
    cu = _cu(2, 4)
    out = reference_varlen_attention(q, k, v, cu, 4, causal=True)
    upcast = reference_varlen_attention(q.float(), k.float(), v.float(), cu, 4, causal=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out, upcast.to(dtype), rtol=0, atol=0)


def test_rows_with_no_key_output_zero():
    """A query row the mask leaves without keys outputs zeros, not NaN (flash-attn's rule)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 1, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 4)
    out = reference_varlen_attention(
        q, k, v, _cu(3), 3, causal=True, cu_seqlens_k=_cu(1), max_seqlen_k=1
    )
    assert out[:2].eq(0).all() and torch.equal(out[2], v[0])


def test_single_token_sequence_returns_its_own_value():
    """A sequence of one token attends only to itself, in every mode."""
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 2, 8), torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    for causal in (True, False):
        out = reference_varlen_attention(q, k, v, CU_ONE, 1, causal=causal, window=(0, 0))
        torch.testing.assert_close(out, v.expand(1, 2, 8), rtol=0, atol=1e-7)


def test_empty_sequences_are_allowed():
    """Zero-length segments are legal and contribute no rows."""
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4)
    with_empty = torch.tensor([0, 0, 2, 2], dtype=torch.int32)
    out = reference_varlen_attention(q, k, v, with_empty, 2, causal=True)
    plain = reference_varlen_attention(q, k, v, _cu(2), 2, causal=True)
    torch.testing.assert_close(out, plain, rtol=0, atol=0)


def test_sequences_do_not_see_each_other():
    """Changing one sequence's K/V leaves every other sequence's output unchanged."""
    torch.manual_seed(6)
    q, k, v = torch.randn(5, 2, 4), torch.randn(5, 1, 4), torch.randn(5, 1, 4)
    cu = _cu(2, 3)
    before = reference_varlen_attention(q, k, v, cu, 3, causal=False)
    k2, v2 = k.clone(), v.clone()
    k2[2:], v2[2:] = 100.0, -7.0
    after = reference_varlen_attention(q, k2, v2, cu, 3, causal=False)
    torch.testing.assert_close(after[:2], before[:2], rtol=0, atol=0)
    assert not torch.equal(after[2:], before[2:])
