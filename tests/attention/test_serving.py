"""Through the serving layer, --prefill-only-disable-kv-cache gives the full pool's outputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.attention import VarlenBatch, scrambled_layout, uses_raw_kv
from kvcheck.attention.prefill import prefill_attention
from kvcheck.properties.attention import (
    CHECKED_LAYER,
    check_noop_pool_matches_full_pool,
    embedding_server_args,
    serving_model_config,
)
from kvcheck.strategies.attention import page_layouts, varlen_batches


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_noop_pool_outputs_equal_full_pool_outputs(data):
    """The no-op pool (raw K/V) and the full pool (paged) give identical fp32 outputs."""
    batch = data.draw(varlen_batches(max_num_seqs=3, max_seq_len=10), label="batch")
    layout = data.draw(page_layouts(batch.seq_lens), label="page layout")
    check_noop_pool_matches_full_pool(
        batch, layout, dtype=torch.float32, device="cpu", backend="torch"
    )


def test_noop_pool_refuses_the_paged_write():
    """Writing K/V through the no-op pool raises RuntimeError naming the pool."""
    from kvcheck.serving import select_kv_pool

    batch = VarlenBatch(seq_lens=(2, 3), num_heads=2, num_kv_heads=1, head_dim=8)
    layout = scrambled_layout(batch.seq_lens, page_size=2)
    pool = select_kv_pool(
        embedding_server_args(prefill_only_disable_kv_cache=True, device="cpu"),
        serving_model_config(batch),
        max_total_num_tokens=layout.pool_size,
        page_size=layout.page_size,
        dtype=torch.float32,
        device="cpu",
    )
    q, k, v = batch.make_qkv(dtype=torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="NoOpMHATokenToKVPool"):
        prefill_attention(
            q,
            k,
            v,
            batch.cu_seqlens_tensor(device="cpu"),
            3,
            pool=pool,
            layer_id=CHECKED_LAYER,
            page_table=layout.page_table_tensor(device="cpu"),
            skip_kv_cache=False,
            causal=True,
        )


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"is_embedding": False}, False),
        ({"chunked_prefill_size": 8192}, False),
        ({"disable_radix_cache": False}, False),
    ],
    ids=["flag-settings", "not-embedding", "chunked", "radix-cache"],
)
def test_raw_kv_path_needs_embedding_unchunked_no_radix(changes, expected):
    """The backend skips the cache only for embedding mode, unchunked, radix cache off."""
    from types import SimpleNamespace

    settings_ = {"is_embedding": True, "chunked_prefill_size": -1, "disable_radix_cache": True}
    args = SimpleNamespace(**{**settings_, **changes})
    assert uses_raw_kv(args, SimpleNamespace(attention_arch="mha")) is expected


def test_mla_models_never_take_the_raw_kv_path():
    """MLA attention reads the cache in its absorbed path, so it never skips it."""
    from types import SimpleNamespace

    args = embedding_server_args(prefill_only_disable_kv_cache=True, device="cpu")
    assert uses_raw_kv(args, SimpleNamespace(attention_arch="mla")) is False
