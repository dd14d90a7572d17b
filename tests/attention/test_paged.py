"""Attention on raw K/V equals attention through an MHA pool read back by page."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.attention import (
    READ_APIS,
    PagedLayout,
    VarlenBatch,
    gather_kv_by_page,
    paged_attention,
    scrambled_layout,
    token_slots,
    write_kv_by_page,
)
from kvcheck.properties.attention import attention_pool_spec, check_paged_matches_raw
from kvcheck.strategies.attention import page_layouts, varlen_batches
from kvcheck.targets.builtin import KVCheckTarget

TABLE = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)
CU = torch.tensor([0, 3, 4], dtype=torch.int32)


def test_token_slots_follow_the_page_table():
    """Token t of sequence s lives at page_table[s, t // page_size] * page_size + t % page_size."""
    assert token_slots(TABLE, CU, page_size=2).tolist() == [6, 7, 2, 4]
    wide = torch.tensor([[5, 1, 4], [2, 0, 0]], dtype=torch.int32)
    assert token_slots(wide, CU, page_size=1).tolist() == [5, 1, 4, 2]


def test_layout_and_tensor_page_table_agree():
    """PagedLayout.token_slots (the write side) and token_slots (the read side) agree."""
    layout = scrambled_layout((5, 1, 0, 3), page_size=2, spare_pages=2)
    cu = torch.tensor([0, 5, 6, 6, 9], dtype=torch.int32)
    from_tensor = token_slots(layout.page_table_tensor(device="cpu"), cu, page_size=2)
    assert tuple(from_tensor.tolist()) == layout.token_slots((5, 1, 0, 3))


BAD_TABLES = {
    "int64": (TABLE.long(), CU, r"page_table must be an int32 tensor"),
    "1-d": (TABLE.flatten(), CU, r"page_table\.shape=\(4,\) must be"),
    "too-few-rows": (TABLE[:1], CU, r"page_table\.shape\[0\]=1 != 2 sequences"),
    "too-few-pages": (TABLE[:, :1], CU, r"sequence 0 has 3 tokens and needs 2 pages"),
    "page-outside-pool": (
        torch.tensor([[9, 1], [2, 0]], dtype=torch.int32),
        CU,
        r"page_table\[0\] uses pages \[9, 1\], outside the pool's \[0, 5\) pages",
    ),
}


@pytest.mark.parametrize(("table", "cu", "message"), BAD_TABLES.values(), ids=BAD_TABLES)
def test_bad_page_tables_are_refused(table, cu, message):
    """Malformed page tables are a ValueError naming the table, never a wrong gather."""
    with pytest.raises(ValueError, match=message):
        token_slots(table, cu, page_size=2, num_slots=10)


def test_paged_attention_reads_only_its_layer():
    """K/V written to layer 1 are read from layer 1; layer 0's data does not leak in."""
    batch = VarlenBatch(seq_lens=(3, 1), num_heads=2, num_kv_heads=1, head_dim=8)
    layout = scrambled_layout(batch.seq_lens, page_size=2)
    spec = attention_pool_spec(batch, layout, dtype=torch.float32)
    pool = KVCheckTarget().make_pool(spec, device="cpu")
    q, k, v = batch.make_qkv(dtype=torch.float32, device="cpu")
    cu, table = batch.cu_seqlens_tensor(device="cpu"), layout.page_table_tensor(device="cpu")
    write_kv_by_page(pool, layer_id=1, k=k, v=v, cu_seqlens=cu, page_table=table)
    out0 = paged_attention(q, pool, cu, 3, layer_id=0, page_table=table, causal=True)
    out1 = paged_attention(q, pool, cu, 3, layer_id=1, page_table=table, causal=True)
    assert not torch.equal(out0, out1)


@pytest.mark.parametrize("page_size", [1, 2, 16], ids=["page-1", "page-2", "page-16"])
def test_scrambled_layout_matches_raw_exactly(page_size):
    """A fixed non-contiguous layout gives the same fp32 outputs as raw K/V, bit for bit."""
    batch = VarlenBatch(
        seq_lens=(1, 7, 4),
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        v_head_dim=4,
        window=(3, -1),
        softcap=30.0,
        seed=11,
    )
    layout = scrambled_layout(batch.seq_lens, page_size=page_size, spare_pages=2)
    check_paged_matches_raw(batch, layout, dtype=torch.float32, device="cpu", backend="torch")


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_raw_equals_paged_fp32_exact(data):
    """For any batch and page layout, paged fp32 attention on CPU equals raw-K/V exactly."""
    batch = data.draw(varlen_batches(max_num_seqs=3, max_seq_len=12), label="batch")
    layout = data.draw(page_layouts(batch.seq_lens), label="page layout")
    check_paged_matches_raw(batch, layout, dtype=torch.float32, device="cpu", backend="torch")


@settings(max_examples=15, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float16, torch.bfloat16]))
def test_raw_equals_paged_low_precision(data, dtype):
    """fp16/bf16 paged attention agrees with raw-K/V attention within the dtype's tolerance."""
    batch = data.draw(varlen_batches(max_num_seqs=2, max_seq_len=8), label="batch")
    layout = data.draw(page_layouts(batch.seq_lens), label="page layout")
    check_paged_matches_raw(batch, layout, dtype=dtype, device="cpu", backend="torch")


def test_paged_layout_rejects_shared_pages():
    """Two sequences may not own the same page."""
    with pytest.raises(ValueError, match=r"page 2 is given to two sequences"):
        PagedLayout(page_size=2, num_pages=3, page_tables=((2,), (2,)))


def test_both_read_apis_gather_the_same_tokens():
    """get_kv_buffer ("kv") and get_key_buffer/get_value_buffer ("split") read the same K/V."""
    batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=8, v_head_dim=4)
    layout = scrambled_layout(batch.seq_lens, page_size=2)
    spec = attention_pool_spec(batch, layout, dtype=torch.float32, start_layer=2)
    pool = KVCheckTarget().make_pool(spec, device="cpu")
    _, k, v = batch.make_qkv(dtype=torch.float32, device="cpu")
    cu, table = batch.cu_seqlens_tensor(device="cpu"), layout.page_table_tensor(device="cpu")
    write_kv_by_page(pool, layer_id=3, k=k, v=v, cu_seqlens=cu, page_table=table)
    for read in READ_APIS:
        got_k, got_v = gather_kv_by_page(
            pool, layer_id=3, cu_seqlens=cu, page_table=table, read=read
        )
        torch.testing.assert_close(got_k, k, rtol=0, atol=0)
        torch.testing.assert_close(got_v, v, rtol=0, atol=0)


def test_unknown_read_api_is_refused():
    """A read API other than READ_APIS' is a ValueError naming the allowed values."""
    with pytest.raises(ValueError, match=r"read='attr' must be one of \('split', 'kv'\)"):
        gather_kv_by_page(object(), layer_id=0, cu_seqlens=CU, page_table=TABLE, read="attr")


BAD_SPEC_ARGUMENTS = {
    "family": ({"family": "mla"}, r"family='mla' must be 'mha' or 'noop'"),
    "start-layer": ({"start_layer": -1}, r"start_layer=-1 must be >= 0"),
    "dtype": ({"dtype": torch.int8}, r"dtype=torch.int8 must be one of"),
}


@pytest.mark.parametrize(
    ("overrides", "message"), BAD_SPEC_ARGUMENTS.values(), ids=BAD_SPEC_ARGUMENTS
)
def test_attention_pool_spec_validates_its_arguments(overrides, message):
    """attention_pool_spec refuses other families, negative start layers and non-float dtypes."""
    batch = VarlenBatch(seq_lens=(1,), num_heads=1, num_kv_heads=1, head_dim=8)
    layout = scrambled_layout(batch.seq_lens, page_size=1)
    with pytest.raises(ValueError, match=message):
        attention_pool_spec(batch, layout, **{"dtype": torch.float32, **overrides})
