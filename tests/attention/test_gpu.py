"""The attention properties on CUDA, with flash-attn where it is installed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.attention import flash_attn_available, flash_attn_version
from kvcheck.properties.attention import (
    check_causal_suffix_matches_full,
    check_flash_matches_reference,
    check_noop_pool_matches_full_pool,
    check_padding_segment_isolates_real_tokens,
    check_paged_matches_raw,
)
from kvcheck.strategies.attention import page_layouts, query_lengths, varlen_batches

HAS_CUDA = torch.cuda.is_available()
HAS_FLASH = HAS_CUDA and flash_attn_available()

needs_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)"
)
needs_flash = pytest.mark.skipif(
    not HAS_FLASH,
    reason=(
        "needs a CUDA device and flash-attn "
        f"(cuda={HAS_CUDA}, flash-attn={flash_attn_version() or 'not importable'}; "
        "pip install 'kvcheck[flash-attn]')"
    ),
)
pytestmark = pytest.mark.gpu

LOW_PRECISION = st.sampled_from([torch.float16, torch.bfloat16])
# Long enough to cross flash-attn's 64/128-token blocks; head dims it compiles for.
GPU_BATCHES = varlen_batches(max_num_seqs=4, max_seq_len=300, max_kv_heads=4, head_dims=(64, 128))
GPU_SETTINGS = settings(max_examples=40, deadline=None)


@needs_flash
@GPU_SETTINGS
@given(batch=GPU_BATCHES, dtype=LOW_PRECISION)
def test_flash_matches_torch_reference(batch, dtype):
    """flash_attn_varlen_func agrees with the torch reference within the flash tolerances."""
    check_flash_matches_reference(batch, dtype=dtype, device="cuda")


@needs_flash
@GPU_SETTINGS
@given(data=st.data(), dtype=LOW_PRECISION)
def test_flash_aligns_query_suffix_bottom_right(data, dtype):
    """flash-attn's mask is bottom-right aligned like the reference's (seqlen_q < seqlen_k)."""
    batch = data.draw(GPU_BATCHES, label="batch")
    query_lens = data.draw(query_lengths(batch.seq_lens), label="query lengths")
    check_causal_suffix_matches_full(batch, query_lens, dtype=dtype, device="cuda", backend="flash")


@needs_flash
@GPU_SETTINGS
@given(batch=GPU_BATCHES, dtype=LOW_PRECISION, pad_tokens=st.integers(1, 200))
def test_flash_padding_segment_leaves_real_outputs_unchanged(batch, dtype, pad_tokens):
    """With the padding as its own segment, flash-attn's real outputs are unchanged, no NaN."""
    check_padding_segment_isolates_real_tokens(
        batch, pad_tokens=pad_tokens, dtype=dtype, device="cuda", backend="flash"
    )


@needs_cuda
@GPU_SETTINGS
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_raw_equals_paged_on_cuda_torch(data, dtype):
    """On CUDA the torch path through the pool agrees with raw K/V within the table."""
    batch = data.draw(GPU_BATCHES, label="batch")
    layout = data.draw(page_layouts(batch.seq_lens, page_sizes=(1, 16, 64)), label="layout")
    check_paged_matches_raw(batch, layout, dtype=dtype, device="cuda", backend="torch")


@needs_flash
@GPU_SETTINGS
@given(data=st.data(), dtype=LOW_PRECISION)
def test_raw_equals_paged_on_cuda_flash(data, dtype):
    """With flash-attn, attention through the pool agrees with raw K/V within the table."""
    batch = data.draw(GPU_BATCHES, label="batch")
    layout = data.draw(page_layouts(batch.seq_lens, page_sizes=(1, 16, 64)), label="layout")
    check_paged_matches_raw(batch, layout, dtype=dtype, device="cuda", backend="flash")


@needs_cuda
@GPU_SETTINGS
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_noop_pool_matches_full_pool_on_cuda(data, dtype):
    """On CUDA the serving layer's no-op pool gives the full pool's outputs (flash if present)."""
    batch = data.draw(GPU_BATCHES, label="batch")
    layout = data.draw(page_layouts(batch.seq_lens, page_sizes=(1, 16, 64)), label="layout")
    check_noop_pool_matches_full_pool(batch, layout, dtype=dtype, device="cuda", backend="auto")


@needs_cuda
@GPU_SETTINGS
@given(batch=GPU_BATCHES, dtype=LOW_PRECISION, pad_tokens=st.integers(1, 200))
def test_torch_padding_segment_on_cuda(batch, dtype, pad_tokens):
    """The torch path on CUDA isolates the padding segment too (real outputs bit-identical)."""
    check_padding_segment_isolates_real_tokens(
        batch, pad_tokens=pad_tokens, dtype=dtype, device="cuda", backend="torch"
    )
