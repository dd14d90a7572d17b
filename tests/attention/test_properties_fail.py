"""Each attention property fails on a deliberately broken implementation, and shrinks.

A property that cannot fail proves nothing. Each test hands a property a plausible bug,
asks Hypothesis (``find``) for an example that the property rejects, and checks that
the example it shrank to is the small one a reviewer would expect.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from kvcheck.attention import paged_attention, prefill_attention
from kvcheck.attention import reference as reference_module
from kvcheck.attention.reference import reference_varlen_attention
from kvcheck.properties.attention import (
    check_causal_suffix_matches_full,
    check_flash_matches_reference,
    check_noop_pool_matches_full_pool,
    check_padding_segment_isolates_real_tokens,
    check_paged_matches_raw,
)
from kvcheck.strategies.attention import page_layouts, query_lengths, varlen_batches

# Derandomized so the shrunk example is the same on every run; no explain phase:
# find() returns the shrunk example, which is all these tests inspect.
FIND_SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    phases=[Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
SMALL_BATCHES = varlen_batches(max_num_seqs=3, max_seq_len=8)


@st.composite
def batches_with_layouts(draw):
    batch = draw(SMALL_BATCHES)
    return batch, draw(page_layouts(batch.seq_lens))


@st.composite
def batches_with_query_lengths(draw):
    batch = draw(SMALL_BATCHES)
    return batch, draw(query_lengths(batch.seq_lens))


def _fails(check, *args, **kwargs) -> bool:
    try:
        check(*args, **kwargs)
    except AssertionError:
        return True
    return False


def paged_attention_with_zero_based_pages(q, pool, cu_seqlens, max_seqlen, **kwargs):
    """Bug: treats the 1-based page ids of the table as 0-based (reads one page too low)."""
    kwargs["page_table"] = kwargs["page_table"] - 1
    return paged_attention(q, pool, cu_seqlens, max_seqlen, **kwargs)


def test_paged_property_catches_an_off_by_one_page_gather():
    """An off-by-one page gather fails raw==paged; the minimal case is one 1-token sequence."""
    batch, layout = find(
        batches_with_layouts(),
        lambda ex: _fails(
            check_paged_matches_raw,
            *ex,
            dtype=torch.float32,
            device="cpu",
            backend="torch",
            paged_fn=paged_attention_with_zero_based_pages,
        ),
        settings=FIND_SETTINGS,
    )
    assert batch.seq_lens == (1,) and layout.page_size == 1


CORRECT_MASK = reference_module.attention_mask


def top_left_attention_mask(seqlen_q, seqlen_k, *, causal, window=(-1, -1), device="cpu"):
    """Bug: aligns the causal mask and window to the top-left corner."""
    side = max(seqlen_q, seqlen_k)
    square = CORRECT_MASK(side, side, causal=causal, window=window, device=device)
    return square[:seqlen_q, :seqlen_k]


def test_alignment_property_catches_a_top_left_causal_mask(monkeypatch):
    """A top-left-aligned mask fails the suffix property; minimal: 2 tokens, 1 causal query."""
    monkeypatch.setattr(reference_module, "attention_mask", top_left_attention_mask)
    batch, query_lens = find(
        batches_with_query_lengths(),
        lambda ex: _fails(
            check_causal_suffix_matches_full,
            *ex,
            dtype=torch.float32,
            device="cpu",
            backend="torch",
        ),
        settings=FIND_SETTINGS,
    )
    assert batch.seq_lens == (2,) and query_lens == (1,)
    assert batch.causal or batch.window[1] >= 0


def test_top_left_mask_is_invisible_when_queries_equal_keys(monkeypatch):
    """With seqlen_q == seqlen_k both alignments agree: why the suffix property is needed."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 1, 8, generator=generator) for _ in range(3))
    cu = torch.tensor([0, 4], dtype=torch.int32)
    correct = reference_varlen_attention(q, k, v, cu, 4, causal=True)
    monkeypatch.setattr(reference_module, "attention_mask", top_left_attention_mask)
    broken = reference_varlen_attention(q, k, v, cu, 4, causal=True)
    torch.testing.assert_close(broken, correct, rtol=0, atol=0)


def fold_padding_into_last_sequence(cu_seqlens, max_seqlen, *, num_tokens):
    """Bug: stretches the last sequence over the padding instead of giving it a segment."""
    stretched = cu_seqlens.clone()
    stretched[-1] = num_tokens
    last = int(stretched[-1] - stretched[-2])
    return stretched, max(max_seqlen, last)


def test_padding_property_catches_padding_folded_into_the_last_sequence():
    """Padding inside the last sequence changes its outputs; minimal: 1 bidirectional token."""
    batch, pad_tokens = find(
        st.tuples(SMALL_BATCHES, st.integers(1, 8)),
        lambda ex: _fails(
            check_padding_segment_isolates_real_tokens,
            ex[0],
            pad_tokens=ex[1],
            dtype=torch.float32,
            device="cpu",
            backend="torch",
            pad_fn=fold_padding_into_last_sequence,
        ),
        settings=FIND_SETTINGS,
    )
    assert batch.seq_lens == (1,) and pad_tokens == 1 and not batch.causal


def prefill_forgetting_causal_on_raw_path(q, k, v, cu_seqlens, max_seqlen, **kwargs):
    """Bug: the raw-K/V path drops the causal flag (attends bidirectionally)."""
    if kwargs["skip_kv_cache"]:
        kwargs["causal"] = False
    return prefill_attention(q, k, v, cu_seqlens, max_seqlen, **kwargs)


def test_noop_property_catches_a_raw_path_that_differs_from_the_paged_one():
    """A raw-K/V path that loses the causal mask fails; minimal: one causal 2-token sequence."""
    batch, _layout = find(
        batches_with_layouts(),
        lambda ex: _fails(
            check_noop_pool_matches_full_pool,
            *ex,
            dtype=torch.float32,
            device="cpu",
            backend="torch",
            prefill_fn=prefill_forgetting_causal_on_raw_path,
        ),
        settings=FIND_SETTINGS,
    )
    assert batch.seq_lens == (2,) and batch.causal


def flash_ignoring_softcap(q, k, v, cu_seqlens, max_seqlen, **kwargs):
    """Bug: a kernel that silently ignores softcap."""
    kwargs["softcap"] = 0.0
    return reference_varlen_attention(q, k, v, cu_seqlens, max_seqlen, **kwargs)


def test_flash_property_catches_a_kernel_ignoring_softcap():
    """A kernel without softcap fails flash==torch; the minimal case uses the smallest cap."""
    batch = find(
        SMALL_BATCHES,
        lambda b: _fails(
            check_flash_matches_reference,
            b,
            dtype=torch.float16,
            device="cpu",
            flash_fn=flash_ignoring_softcap,
        ),
        settings=FIND_SETTINGS,
    )
    assert batch.softcap == 1.0 and len(batch.seq_lens) == 1
