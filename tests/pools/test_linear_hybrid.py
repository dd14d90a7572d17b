"""Unit tests of kvcheck's linear-attention hybrid: MambaPool, HybridReqToTokenPool,
HybridLinearKVPool, and the reference it is judged by."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvcheck.pools.hybrid_linear import HybridLinearKVPool
from kvcheck.pools.mamba import HybridReqToTokenPool, MambaPool
from kvcheck.reference.linear_hybrid import ReferenceLinearHybrid, pattern
from kvcheck.specs import LinearHybridSpec
from kvcheck.targets.builtin import KVCheckTarget

SPEC = LinearHybridSpec(full_layer_ids=(1, 3), mamba_layer_ids=(0, 2), draft_tokens=2)


def _request() -> SimpleNamespace:
    return SimpleNamespace(kv=SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None))


def _pools() -> tuple[HybridLinearKVPool, HybridReqToTokenPool]:
    kv_pool, req_pool = KVCheckTarget().make_linear_hybrid(SPEC, device="cpu")
    return kv_pool, req_pool


def test_clear_slots_zeroes_only_the_named_slots_and_keeps_drafts() -> None:
    """clear_slots zeroes conv and temporal of its slots; other slots and the drafts stay."""
    pool = MambaPool(
        size=3,
        conv_shapes=[(2, 2)],
        temporal_shape=(1, 1, 2),
        mamba_layer_ids=[0],
        device="cpu",
        speculative_num_draft_tokens=1,
    )
    cache = pool.get_speculative_mamba2_params_all_layers()
    cache.temporal.fill_(1.0)
    cache.conv[0].fill_(2.0)
    cache.intermediate_ssm.fill_(3.0)
    pool.clear_slots(torch.tensor([2]))
    assert cache.temporal[0, 2].abs().sum().item() == 0.0
    assert cache.conv[0][0, 2].abs().sum().item() == 0.0
    assert cache.temporal[0, 1].sum().item() == 2.0
    assert cache.intermediate_ssm[0, 2].sum().item() == 6.0


def test_alloc_refused_for_lack_of_a_mamba_slot_takes_no_row() -> None:
    """A refused alloc returns None and leaves rows and mamba slots as they were."""
    _kv_pool, req_pool = _pools()
    held = [_request() for _ in range(SPEC.mamba_size)]
    assert req_pool.alloc(held) is not None
    rows = req_pool.available_size()
    assert req_pool.alloc([_request()]) is None
    assert req_pool.available_size() == rows
    assert req_pool.mamba_allocator.available_size() == 0


def test_free_and_flush_return_rows_and_slots() -> None:
    """free/free_mamba_cache return one row and one slot; clear returns everything."""
    _kv_pool, req_pool = _pools()
    a, b = _request(), _request()
    req_pool.alloc([a, b])
    req_pool.free_mamba_cache(a)
    req_pool.free(a)
    assert req_pool.available_size() == SPEC.rows - 1
    assert req_pool.mamba_allocator.available_size() == SPEC.mamba_size - 1
    with pytest.raises(ValueError, match="mamba"):
        req_pool.free_mamba_cache(a)
    req_pool.clear()
    assert req_pool.available_size() == SPEC.rows
    assert req_pool.mamba_allocator.available_size() == SPEC.mamba_size


def test_host_round_trip_carries_kv_and_mamba_state_to_new_slots() -> None:
    """get_cpu_copy then load_cpu_copy into other slots restores K/V and conv/temporal."""
    kv_pool, req_pool = _pools()
    k = torch.ones(1, SPEC.head_num, SPEC.head_dim)
    kv_pool.set_kv_buffer(SimpleNamespace(layer_id=3), torch.tensor([2]), k, 2 * k)
    req_pool.mamba2_layer_cache(2).temporal[1] = pattern(4, SPEC.temporal_shape)
    copy = kv_pool.get_cpu_copy(torch.tensor([2]), mamba_indices=torch.tensor([1]))
    kv_pool.load_cpu_copy(copy, torch.tensor([5]), mamba_indices=torch.tensor([3]))
    assert torch.equal(kv_pool.get_value_buffer(3)[5], 2 * k[0])
    assert torch.equal(
        req_pool.mamba_pool.mamba_cache.temporal[1, 3], pattern(4, SPEC.temporal_shape)
    )


def test_layer_ids_outside_the_mapping_are_refused() -> None:
    """A mamba layer id is no full-attention layer, and a full one no mamba layer."""
    kv_pool, req_pool = _pools()
    with pytest.raises(ValueError, match="full-attention"):
        kv_pool.get_key_buffer(0)
    with pytest.raises(ValueError, match="mamba layer"):
        req_pool.mamba2_layer_cache(1)


def test_reference_sizes_by_hand() -> None:
    """The reference's byte formulas on a hand-computed hybrid."""
    ref = ReferenceLinearHybrid(SPEC)
    # K per layer: (16 + 1) slots * 1 head * 4 dims * 4 bytes = 272, two full layers.
    assert ref.kv_bytes() == (544, 544)
    # Per slot: conv 10 * 2 + temporal 2 * 2 * 3 = 32 floats; 5 slots, 2 layers, x(1 + 2 drafts).
    assert ref.mamba_bytes() == 32 * 5 * 2 * 3 * 4
    assert ref.state_descriptions() == [(400, 80), (400, 80), (240, 48), (240, 48)]
    assert (
        KVCheckTarget().make_linear_hybrid(SPEC, device="cpu")[1].mamba_pool.get_kv_size_bytes()
        == ref.mamba_bytes()
    )
