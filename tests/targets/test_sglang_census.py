"""The census on sglang pools nobody modelled: SWAKVPool (full and SWA sub-pools) and
MambaPool (a linear-attention state stacked by layer), built on CPU straight from sglang.
Runs only with ``KVCHECK_TARGET=sglang`` (importing sglang costs 10-15 s)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvcheck.census import IndexSpace, take_census
from kvcheck.properties.census import assert_accounting_covers_census
from kvcheck.specs import PoolSpec

pytestmark = pytest.mark.kvcheck_target("sglang")


@pytest.fixture(scope="module")
def sglang_target() -> Any:
    from kvcheck.targets import resolve_target

    target = resolve_target("sglang")
    # One plain pool first: the target sets up sglang's CPU environment when it builds.
    target.make_pool(
        PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16"), device="cpu"
    )
    return target


def test_swa_pool_census_measures_each_sub_pool_by_its_own_size(sglang_target: Any) -> None:
    """SWAKVPool: the full sub-pool's buffers are slots of size 8, the SWA sub-pool's of
    size 4; the pointer tables are per-layer; nothing unclassified; accounting holds."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = SWAKVPool(
        size=8,
        size_swa=4,
        page_size=2,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=4,
        swa_attention_layer_ids=[0, 2],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    census = take_census(pool)
    assert census.unclassified == ()
    slots = {
        (e.path.split(".")[0], e.geometry.size)
        for e in census.entries
        if e.space is IndexSpace.SLOT
    }
    assert slots == {("full_kv_pool", 8), ("swa_kv_pool", 4)}
    assert assert_accounting_covers_census(pool, census=census) == 352


def test_mamba_pool_census_finds_states_stacked_by_layer(sglang_target: Any) -> None:
    """MambaPool: conv and temporal states are [layers, size + 1, ...]: slots at dim 1."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool

    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=8,
        n_groups=1,
        num_heads=2,
        head_dim=4,
        state_size=4,
        conv_kernel=4,
    )
    pool = MambaPool(
        size=5,
        spec_state_size=5,
        cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2],
        device="cpu",
    )
    census = take_census(pool)
    assert census.unclassified == ()
    assert {(e.path, e.space, e.dim) for e in census.entries} >= {
        ("mamba_cache.temporal", IndexSpace.SLOT, 1)
    }
    assert assert_accounting_covers_census(pool, census=census) == census.held_bytes()
