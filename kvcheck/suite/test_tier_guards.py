"""The guards a target's allocators and host pools keep themselves hold for every input of
their kind (:mod:`kvcheck.properties.guards`): a segment free that starts mid-page, a
nested free group, segments that share a page, a host alloc of part of a page and a host
free of a slot not held are each refused, and the refusal changes no free space.

A target that validates input keeps them all; one that does not is checked on the guards
it names in ``tier_guards`` (SGLang's ``assert``s), and skips the others, saying so.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcheck.properties.guards import (
    ALLOCATOR_GUARDS,
    HOST_GUARDS,
    check_allocator_guard,
    check_host_guard,
    guard_skip_reason,
)
from kvcheck.strategies.tier_specs import allocator_specs, host_pool_specs
from kvcheck.targets.findings import steered_tags
from kvcheck.targets.tier_support import (
    allocator_skip_reason,
    build_allocator,
    build_host_pool,
    host_pool_skip_reason,
)
from kvcheck.tiers import ALLOCATOR_KINDS, HOST_FAMILIES


def _skip_unless(*reasons: str | None) -> None:
    for reason in reasons:
        if reason is not None:
            pytest.skip(reason)


@pytest.mark.parametrize("kind", ALLOCATOR_KINDS)
@pytest.mark.parametrize("guard", ALLOCATOR_GUARDS)
@given(data=st.data())
def test_allocator_guard_holds(
    kvcheck_target: Any, kvcheck_device: str, guard: str, kind: str, data: st.DataObject
) -> None:
    """The allocator refuses every bad call of the guard's kind, changing nothing."""
    _skip_unless(
        guard_skip_reason(kvcheck_target, guard), allocator_skip_reason(kvcheck_target, kind)
    )
    spec = data.draw(allocator_specs(kinds=(kind,), target=kvcheck_target), label="allocator")
    allocator = build_allocator(kvcheck_target, spec, device=kvcheck_device)
    check_allocator_guard(allocator, spec, guard, data)
    assert allocator.available_size() >= 0


def _host_settings() -> settings:
    """A tenth of the profile's examples: the slot guards do not depend on the bytes, and
    each example builds a device pool and its host tier."""
    current = settings()
    return settings(
        current,
        max_examples=max(5, current.max_examples // 10),
        suppress_health_check=[*current.suppress_health_check, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f) for f in HOST_FAMILIES],
)
@pytest.mark.parametrize("guard", HOST_GUARDS)
@given(data=st.data())
@_host_settings()
def test_host_guard_holds(
    kvcheck_target: Any, kvcheck_device: str, guard: str, family: str, data: st.DataObject
) -> None:
    """The host pool that allocates host slots refuses every bad call of the guard's kind,
    changing nothing."""
    _skip_unless(
        guard_skip_reason(kvcheck_target, guard), host_pool_skip_reason(kvcheck_target, family)
    )
    specs = host_pool_specs(
        families=(family,), target=kvcheck_target, steer=steered_tags(kvcheck_target)
    )
    spec = data.draw(specs, label="host pool")
    pool = kvcheck_target.make_pool(spec.device, device=kvcheck_device)
    host = build_host_pool(kvcheck_target, spec, pool, device=kvcheck_device)[0]
    check_host_guard(host, spec.page_size, guard, data)
    assert host.available_size() >= 0
