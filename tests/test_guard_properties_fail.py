"""Proof that each guard check (:mod:`kvcheck.properties.guards`) can fail: it catches a
broken twin (``broken_tiers.py``) that takes its bad input silently, or that refuses it
after changing something, with a failure that names the guard's bad input; and it holds
on kvcheck's own allocators and host pools."""

from __future__ import annotations

from typing import Any

import pytest
from broken_tiers import (
    BrokenTierTarget,
    FirstFreeingPagedAllocator,
    NestingPagedAllocator,
    PageMergingPagedAllocator,
    PartialPageHost,
    SegmentTrustingPagedAllocator,
    UnheldFreeingHost,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcheck.failures import PropertyFailure
from kvcheck.properties.guards import (
    ALLOCATOR_GUARDS,
    GUARDS,
    HOST_GUARDS,
    check_allocator_guard,
    check_host_guard,
)
from kvcheck.strategies.tier_specs import allocator_specs, host_pool_specs
from kvcheck.targets import resolve_target
from kvcheck.targets.tier_support import build_allocator, build_host_pool
from kvcheck.tiers import ALLOCATOR_KINDS

#: Few, derandomized examples: every twin fails on most examples of its guard.
GUARD_TWIN = settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _allocator_guard_run(target: Any, guard: str, kind: str) -> Any:
    """The guard check on ``kind``'s allocators of ``target``, as a runnable Hypothesis
    test (``paged`` draws page sizes 2 and up: the mid-page starts its twin takes)."""
    specs = allocator_specs(kinds=(kind,), max_pages=4)

    @GUARD_TWIN
    @given(spec=specs, data=st.data())
    def holds(spec: Any, data: st.DataObject) -> None:
        allocator = build_allocator(target, spec, device="cpu")
        check_allocator_guard(allocator, spec, guard, data)

    return holds


def _host_guard_run(target: Any, guard: str, family: str) -> Any:
    """The host guard check on ``family``'s host pools of ``target`` (page size 2 and up:
    page size 1 has no partial page), as a runnable Hypothesis test."""
    specs = host_pool_specs(families=(family,), target=target, max_layers=1, max_size=8)
    specs = specs.filter(lambda spec: spec.page_size >= 2)

    @GUARD_TWIN
    @given(spec=specs, data=st.data())
    def holds(spec: Any, data: st.DataObject) -> None:
        pool = target.make_pool(spec.device, device="cpu")
        host = build_host_pool(target, spec, pool, device="cpu")[0]
        check_host_guard(host, spec.page_size, guard, data)

    return holds


def _failure(run: Any) -> PropertyFailure:
    with pytest.raises(PropertyFailure) as caught:
        run()
    return caught.value


def _assert_names_the_guard(error: PropertyFailure, guard: str, kind: str) -> None:
    """The failure is the guard check's, of ``kind``, and says which bad input it was."""
    assert error.signature.check == "guard", error
    assert error.signature.kind == kind, error
    assert GUARDS[guard] in str(error), error


def test_a_mid_page_segment_start_that_is_taken_is_caught() -> None:
    """A segment free that starts mid-page must be refused, not freed as if it started
    the page."""
    target = BrokenTierTarget(SegmentTrustingPagedAllocator)
    error = _failure(_allocator_guard_run(target, "segment_start", "paged"))
    _assert_names_the_guard(error, "segment_start", "not refused")
    assert error.signature.call in ("free_segment", "free_full_segment"), error


def test_a_nested_free_group_that_is_taken_is_caught() -> None:
    """free_group_begin inside an open group must be refused."""
    target = BrokenTierTarget(NestingPagedAllocator)
    error = _failure(_allocator_guard_run(target, "nested_free_group", "paged"))
    _assert_names_the_guard(error, "nested_free_group", "not refused")
    assert error.signature.call == "free_group_begin", error


def test_segments_that_share_a_page_taken_silently_are_caught() -> None:
    """A free of two segments that share a page must be refused, not merged."""
    target = BrokenTierTarget(PageMergingPagedAllocator)
    error = _failure(_allocator_guard_run(target, "segments_share_page", "paged"))
    _assert_names_the_guard(error, "segments_share_page", "not refused")
    assert error.signature.call in ("free_segments", "free_full_segments"), error


def test_segments_that_share_a_page_refused_after_a_free_are_caught() -> None:
    """A refusal of two segments that share a page must come before the first is freed
    (SGLang's free_segments frees it first)."""
    target = BrokenTierTarget(FirstFreeingPagedAllocator)
    error = _failure(_allocator_guard_run(target, "segments_share_page", "paged"))
    _assert_names_the_guard(error, "segments_share_page", "refusal changed the free space")
    assert error.signature.call in ("free_segments", "free_full_segments"), error


def test_a_host_alloc_of_part_of_a_page_is_caught() -> None:
    """A host alloc of part of a page must be refused."""
    error = _failure(_host_guard_run(BrokenTierTarget(PartialPageHost), "host_partial_page", "mla"))
    _assert_names_the_guard(error, "host_partial_page", "not refused")
    assert error.signature.call == "alloc", error


def test_a_host_free_of_a_slot_not_held_is_caught() -> None:
    """A host free of a slot not held (a double free among them) must be refused."""
    target = BrokenTierTarget(UnheldFreeingHost)
    error = _failure(_host_guard_run(target, "host_double_free", "mla"))
    _assert_names_the_guard(error, "host_double_free", "not refused")
    assert error.signature.call == "free", error


@pytest.mark.parametrize("kind", ALLOCATOR_KINDS)
@pytest.mark.parametrize("guard", ALLOCATOR_GUARDS)
def test_kvcheck_allocators_keep_every_guard(guard: str, kind: str) -> None:
    """The same checks pass on kvcheck's own allocators (their twins' parents)."""
    run = _allocator_guard_run(resolve_target("kvcheck"), guard, kind)
    run()


@pytest.mark.parametrize("family", ["mha", "mla"])
@pytest.mark.parametrize("guard", HOST_GUARDS)
def test_kvcheck_host_pools_keep_every_guard(guard: str, family: str) -> None:
    """The same checks pass on kvcheck's own host pools."""
    run = _host_guard_run(resolve_target("kvcheck"), guard, family)
    run()
