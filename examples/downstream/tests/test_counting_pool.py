"""Properties of CountingMHAPool written with kvcheck's public strategies."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs, token_locations

from downstream_pool import CountingMHAPool

# Plain float dtypes keep the payload construction obvious; kvcheck's suite covers fp8.
_SPECS = pool_specs(families=("mha",), dtype_names=("bfloat16", "float32"))


def _build(spec: PoolSpec) -> CountingMHAPool:
    return CountingMHAPool(
        size=spec.size,
        page_size=spec.page_size,
        dtype=getattr(torch, spec.dtype),
        head_num=spec.head_num,
        head_dim=spec.head_dim,
        v_head_dim=spec.v_head_dim,
        layer_num=spec.layer_num,
        start_layer=spec.start_layer,
        device="cpu",
    )


def _payload(n: int, heads: int, dim: int, *, dtype: str, offset: int) -> torch.Tensor:
    values = torch.arange(n * heads * dim, dtype=torch.float32) + offset
    return values.reshape(n, heads, dim).to(getattr(torch, dtype))


@given(data=st.data())
def test_written_tokens_read_back_and_are_counted(data: st.DataObject) -> None:
    """Every written slot reads back its K and V, and the count grows by the tokens written."""
    spec = data.draw(_SPECS, label="spec")
    pool = _build(spec)
    layer_id = data.draw(st.sampled_from(list(spec.layer_ids)), label="layer")
    locs = data.draw(token_locations(spec, min_size=1, max_size=4), label="locs")
    loc = torch.tensor(locs, dtype=torch.int64)
    k = _payload(len(locs), spec.head_num, spec.head_dim, dtype=spec.dtype, offset=1)
    v = _payload(len(locs), spec.head_num, spec.effective_v_head_dim, dtype=spec.dtype, offset=7)

    pool.set_kv_buffer(SimpleNamespace(layer_id=layer_id), loc, k, v)

    torch.testing.assert_close(pool.get_key_buffer(layer_id)[loc], k, rtol=0, atol=0)
    torch.testing.assert_close(pool.get_value_buffer(layer_id)[loc], v, rtol=0, atol=0)
    assert pool.tokens_written == {layer_id: len(locs)}


@given(data=st.data())
def test_rejected_write_is_not_counted(data: st.DataObject) -> None:
    """A write the base pool rejects (a repeated slot) raises and leaves the count at zero."""
    spec = data.draw(_SPECS, label="spec")
    pool = _build(spec)
    slot = data.draw(st.integers(0, spec.num_slots - 1), label="slot")
    loc = torch.tensor([slot, slot], dtype=torch.int64)
    k = _payload(2, spec.head_num, spec.head_dim, dtype=spec.dtype, offset=1)
    v = _payload(2, spec.head_num, spec.effective_v_head_dim, dtype=spec.dtype, offset=1)

    with pytest.raises(ValueError, match="loc"):
        pool.set_kv_buffer(SimpleNamespace(layer_id=spec.start_layer), loc, k, v)
    assert sum(pool.tokens_written.values()) == 0
