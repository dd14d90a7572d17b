"""A DSA skip-topk layer holds zero index-K bytes: by storage, by the CUDA allocator, on meta.

- storage (any device): every drawn DSA pool's skip layers own no storage and the
  storages behind all KV buffers total exactly what the spec needs;
- CUDA (``gpu``): building a pool raises ``torch.cuda.memory_allocated`` by exactly the
  expected 512-byte blocks, and skip layers add 0;
- ``meta`` at production scale: GLM-5.2-like (78 layers) and DeepSeek-V3.2 at millions of
  tokens, with skip layers honoured and with every layer allocated.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.geometry import tensor_nbytes
from kvcheck.memory import (
    cuda_allocator_config_problem,
    cuda_block_bytes,
    expected_cuda_allocation_bytes,
    measure_cuda_allocation,
    production_dsa_spec,
)
from kvcheck.properties.skip_layers import (
    assert_cuda_allocation_matches,
    assert_meta_pool_bytes,
    assert_skip_layers_hold_no_storage,
)
from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs
from kvcheck.strategies.limits import within_target_limits
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE


def dsa_specs(target: Any) -> st.SearchStrategy[PoolSpec]:
    """Small DSA pools of every skip-mask shape ``target`` takes (under 1 MiB per tensor,
    for CUDA)."""
    return pool_specs(families=("dsa",), max_layers=6, max_size=64, max_page_size=16, target=target)


#: Production-scale DSA pools (meta only): real model geometry, millions of tokens.
PRODUCTION_SPECS = st.builds(
    production_dsa_spec,
    st.sampled_from((GLM_5_2_LIKE, DEEPSEEK_V3_2)),
    num_tokens=st.integers(1, 8_000_000),
    page_size=st.sampled_from((64, 1, 16)),
    dtype=st.sampled_from(("float8_e4m3fn", "bfloat16")),
    honour_skip_layers=st.booleans(),
)


@pytest.mark.kvcheck_needs("dsa_pool")
@given(data=st.data())
def test_skip_layers_hold_no_storage(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Skip layers' index buffers own no storage; all storages total the expected bytes."""
    spec = data.draw(dsa_specs(kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_skip_layers_hold_no_storage(pool, spec)
    assert len(pool.index_k_with_scale_buffer) == spec.layer_num


@pytest.mark.kvcheck_needs("dsa_pool", "meta_device", family="dsa")
@given(data=st.data())
def test_production_scale_pools_on_meta_hold_the_expected_bytes(
    kvcheck_target: Any, data: st.DataObject
) -> None:
    """On meta, production-scale DSA pools span exactly the formula's bytes, skip layers none."""
    spec = data.draw(within_target_limits(kvcheck_target, PRODUCTION_SPECS), label="spec")
    pool = assert_meta_pool_bytes(kvcheck_target, spec)
    assert pool.layer_num == spec.layer_num


@pytest.mark.parametrize(
    ("model", "num_tokens"),
    [
        pytest.param(GLM_5_2_LIKE, 2_000_000, id="GLM-5.2-like-2M"),
        pytest.param(DEEPSEEK_V3_2, 4_000_000, id="DeepSeek-V3.2-4M"),
    ],
)
@pytest.mark.kvcheck_needs("dsa_pool", "meta_device", family="dsa")
def test_skip_layers_save_exactly_their_index_bytes_at_scale(
    kvcheck_target: Any, model: Any, num_tokens: int
) -> None:
    """Honouring skip layers saves exactly their index-K bytes, per the formula, on meta."""
    honoured = production_dsa_spec(model, num_tokens=num_tokens)
    everything = production_dsa_spec(model, num_tokens=num_tokens, honour_skip_layers=False)
    assert_meta_pool_bytes(kvcheck_target, honoured)
    assert_meta_pool_bytes(kvcheck_target, everything)
    per_layer = tensor_nbytes(everything)["index_k_with_scale_buffer"][0]
    saved = sum(tensor_nbytes(everything)["index_k_with_scale_buffer"]) - sum(
        tensor_nbytes(honoured)["index_k_with_scale_buffer"]
    )
    assert saved == sum(honoured.skip_mask) * per_layer


def _skip_if_allocator_unpredictable() -> None:
    problem = cuda_allocator_config_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.mark.gpu
@pytest.mark.kvcheck_needs("dsa_pool")
@given(data=st.data())
def test_cuda_allocation_is_exactly_the_expected_blocks(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Building a DSA pool raises memory_allocated by exactly its rounded blocks; skips add 0."""
    _skip_if_allocator_unpredictable()
    spec = data.draw(dsa_specs(kvcheck_target), label="spec")
    pool = assert_cuda_allocation_matches(kvcheck_target, spec, device=kvcheck_device)
    assert pool.layer_num == spec.layer_num


@pytest.mark.gpu
@pytest.mark.kvcheck_needs("dsa_pool")
def test_cuda_skip_layers_add_zero_bytes(kvcheck_target: Any, kvcheck_device: str) -> None:
    """With a GLM-like mask the allocator sees exactly the skipped layers' blocks saved."""
    _skip_if_allocator_unpredictable()
    mask = (False, False, False, True, True, True, False, True)  # index_topk_freq=4, offset 3
    specs = {
        name: PoolSpec(
            family="dsa",
            size=100,
            page_size=64,
            layer_num=len(mask),
            dtype="bfloat16",
            kv_lora_rank=5,
            qk_rope_head_dim=3,
            skip_topk_layers=layer_mask,
        )
        for name, layer_mask in (("skipping", mask), ("allocating", (False,) * len(mask)))
    }
    deltas = {}
    for name, spec in specs.items():
        build = functools.partial(kvcheck_target.make_pool, spec, device=kvcheck_device)
        _, deltas[name] = measure_cuda_allocation(build, device=kvcheck_device)
        assert deltas[name] == expected_cuda_allocation_bytes(spec), name
    index_bytes = tensor_nbytes(specs["allocating"])["index_k_with_scale_buffer"][0]
    assert deltas["allocating"] - deltas["skipping"] == sum(mask) * cuda_block_bytes(index_bytes)
