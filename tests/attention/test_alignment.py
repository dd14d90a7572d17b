"""The causal mask and windows are aligned bottom-right when queries are a suffix of the keys."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.properties.attention import check_causal_suffix_matches_full
from kvcheck.strategies.attention import query_lengths, varlen_batches


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_query_suffix_sees_what_full_attention_sees(data):
    """The last m queries over all n keys equal the last m rows of full self-attention."""
    batch = data.draw(varlen_batches(max_num_seqs=3, max_seq_len=10), label="batch")
    query_lens = data.draw(query_lengths(batch.seq_lens), label="query lengths")
    check_causal_suffix_matches_full(
        batch, query_lens, dtype=torch.float32, device="cpu", backend="torch"
    )
