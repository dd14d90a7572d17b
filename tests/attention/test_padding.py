"""A CUDA-graph bucket's padding, appended as its own segment, leaves real tokens alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.attention import VarlenBatch, append_padding_segment, varlen_attention
from kvcheck.properties.attention import (
    check_padding_segment_isolates_real_tokens,
    padded_batch_tensors,
)
from kvcheck.strategies.attention import varlen_batches

CU = torch.tensor([0, 3, 5], dtype=torch.int32)


def test_no_padding_leaves_offsets_unchanged():
    """A bucket exactly the size of the batch needs no extra segment."""
    cu, max_seqlen = append_padding_segment(CU, 3, num_tokens=5)
    assert cu is CU and max_seqlen == 3


@pytest.mark.parametrize(
    ("num_tokens", "offsets", "max_seqlen"),
    [(6, [0, 3, 5, 6], 3), (8, [0, 3, 5, 8], 3), (12, [0, 3, 5, 12], 7)],
    ids=["pad-1", "pad-3-short", "pad-7-longest"],
)
def test_padding_becomes_one_segment(num_tokens, offsets, max_seqlen):
    """The padded tail is one more segment; max_seqlen grows only if the tail is longer."""
    cu, got_max = append_padding_segment(CU, 3, num_tokens=num_tokens)
    assert (cu.tolist(), got_max, cu.dtype) == (offsets, max_seqlen, torch.int32)


def test_bucket_smaller_than_the_batch_is_refused():
    """A bucket with fewer rows than real tokens is a ValueError."""
    with pytest.raises(ValueError, match=r"num_tokens=4 < cu_seqlens\[-1\]=5"):
        append_padding_segment(CU, 3, num_tokens=4)


@pytest.mark.parametrize("pad_tokens", [1, 4], ids=["pad-1", "pad-4"])
def test_torch_path_refuses_padding_without_its_segment(pad_tokens):
    """q longer than cu_seqlens[-1] without a padding segment is refused with a clear error."""
    batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=8)
    q, k, v = padded_batch_tensors(batch, pad_tokens=pad_tokens, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"append them as a segment of their own"):
        varlen_attention(
            q, k, v, batch.cu_seqlens_tensor(device="cpu"), 3, causal=True, backend="torch"
        )


@settings(max_examples=50, deadline=None)
@given(
    batch=varlen_batches(max_num_seqs=3, max_seq_len=8),
    pad_tokens=st.integers(1, 12),
)
def test_padding_segment_leaves_real_outputs_unchanged(batch, pad_tokens):
    """Real tokens' outputs are bit-identical with the padding segment, and none is NaN."""
    check_padding_segment_isolates_real_tokens(
        batch, pad_tokens=pad_tokens, dtype=torch.float32, device="cpu", backend="torch"
    )
