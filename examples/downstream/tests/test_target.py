"""The kvcheck target mechanism: this project's pool reached through --kvcheck-target."""

from __future__ import annotations

from typing import Any

import pytest
from kvcheck.specs import PoolSpec
from kvcheck.targets import capability_skip_reason, resolve_target

from downstream_pool import CountingMHAPool, DownstreamTarget


def test_fixture_is_the_target_named_in_addopts(kvcheck_target: Any) -> None:
    """pyproject's --kvcheck-target=downstream_pool:target reaches the kvcheck_target fixture."""
    assert isinstance(kvcheck_target, DownstreamTarget)
    assert kvcheck_target.name == "downstream-pool"


def test_resolver_accepts_module_attr() -> None:
    """The module:attr spelling the kvcheck command takes resolves to the same target."""
    assert resolve_target("downstream_pool:target").name == "downstream-pool"
    assert resolve_target("downstream_pool.target:DownstreamTarget").name == "downstream-pool"


@pytest.mark.kvcheck_needs("mha_pool")
def test_target_builds_the_counting_pool(kvcheck_target: Any, kvcheck_device: str) -> None:
    """make_pool returns this package's pool for an MHA spec."""
    spec = PoolSpec(family="mha", size=8, page_size=4, layer_num=2, dtype="bfloat16")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert isinstance(pool, CountingMHAPool)
    assert len(pool.k_buffer) == 2


def test_unsupported_families_are_skipped_with_the_reason(kvcheck_target: Any) -> None:
    """Properties needing an MLA pool would be skipped: the target's surface has no MLA pool."""
    reason = capability_skip_reason(kvcheck_target, ["mla_pool"])
    assert reason is not None and "no mla pool: its surface declares none" in reason
