"""Allocators as drawn (kvcheck.strategies.allocator_specs): each kind at every page size
SGLang builds it at, inside what a target declares of each kind (the page sizes it builds the
kind at, or none)."""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.declaration import Builds, Declaration, Key, Refuses, Row, declaration_of
from kvcheck.specs import SWAPoolSpec
from kvcheck.strategies.tier_specs import allocator_specs
from kvcheck.swa_machine import swa_pool_machine
from kvcheck.targets import resolve_target
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.targets.tier_support import (
    allocator_page_sizes,
    allocator_skip_reason,
    build_allocator,
)
from kvcheck.tiers import ALLOCATOR_KINDS, AllocatorSpec
from kvcheck.tiers import allocator_page_sizes as kind_page_sizes

QUICK = settings(max_examples=60, database=None, deadline=None)


class _PageSizeOneTarget(KVCheckTarget):
    """kvcheck's target, declaring what the sglang target declares on a release whose paged
    allocator has no torch path (0.5.21): no paged allocator, SWA at page size 1 only."""

    name = "page-size-one"
    declaration = Declaration(
        rows=(
            Row(Key.tier("allocator", "paged"), Refuses("extend and decode need Triton")),
            Row(Key.tier("allocator", "swa"), Builds("token sides only", only=(1,))),
        )
    )


@pytest.mark.parametrize("kind", ALLOCATOR_KINDS)
def test_each_kind_is_drawn_at_every_page_size_sglang_builds_it_at(kind: str) -> None:
    """Every page size up to the bound that the kind takes is drawn (page size 1 included
    where SGLang builds the kind there), and no other."""
    sizes = kind_page_sizes(kind, max_page_size=4)
    for page_size in sizes:
        found = find(
            allocator_specs(kinds=(kind,), max_page_size=4),
            lambda spec, page_size=page_size: spec.page_size == page_size,
            settings=settings(database=None, max_examples=500),
        )
        assert found.kind == kind


def test_the_page_sizes_of_each_kind() -> None:
    """token and pure SWA at page size 1, paged at 2 and up, SWA at any; a spec outside them
    is refused, naming the kind and what it takes."""
    assert kind_page_sizes("token", max_page_size=4) == (1,)
    assert kind_page_sizes("pure_swa", max_page_size=4) == (1,)
    assert kind_page_sizes("paged", max_page_size=4) == (2, 3, 4)
    assert kind_page_sizes("swa", max_page_size=4) == (1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"kind='paged' takes page_size >= 2, got page_size=1"):
        AllocatorSpec(kind="paged", size=4, page_size=1)
    with pytest.raises(ValueError, match=r"kind='pure_swa' takes page_size=1, got page_size=2"):
        AllocatorSpec(kind="pure_swa", size=4, page_size=2)


@QUICK
@given(st.data())
def test_a_target_narrows_a_kinds_page_sizes(data: st.DataObject) -> None:
    """A kind's declared page sizes bound the draw, and a refused kind is never drawn."""
    target = _PageSizeOneTarget()
    spec = data.draw(allocator_specs(kinds=("token", "paged", "swa"), target=target))
    assert spec.kind in ("token", "swa")
    assert spec.page_size == 1


def test_a_refused_kind_skips_and_an_undeclared_page_size_is_not_built() -> None:
    """The refusal is the skip's reason; a page size the target does not declare is refused
    before the target is asked to build it; a kind narrowed to nothing the bound reaches is
    an invalid argument."""
    target = _PageSizeOneTarget()
    assert "extend and decode need Triton" in (allocator_skip_reason(target, "paged") or "")
    assert allocator_skip_reason(target, "swa") is None
    assert allocator_page_sizes(target, "swa") == (1,)
    assert allocator_page_sizes(target, "token") is None
    with pytest.raises(ValueError, match=r"page_size in \(1,\) only, got page_size=2"):
        build_allocator(
            target, AllocatorSpec(kind="swa", size=4, page_size=2, size_swa=2), device="cpu"
        )
    with pytest.raises(InvalidArgument, match="builds none of kinds=\\('paged',\\)"):
        allocator_specs(kinds=("paged",), target=target)


def test_a_hybrid_pool_is_drawn_on_the_pages_of_its_swa_allocator() -> None:
    """The SWA pool machine draws hybrids only at page sizes the target builds its SWA
    allocator at."""
    machine = swa_pool_machine(_PageSizeOneTarget(), device="cpu")
    built: list[int] = []

    class Recording(machine):  # type: ignore[misc, valid-type]
        def _build(self, spec: SWAPoolSpec) -> None:
            built.append(spec.sub.page_size)
            super()._build(spec)

    quick = settings(QUICK, max_examples=10, stateful_step_count=2)
    run_state_machine_as_test(Recording, settings=quick)
    assert built and set(built) == {1}


def test_the_builtin_target_narrows_no_allocator() -> None:
    """kvcheck's own target builds every kind at every page size SGLang builds it at."""
    assert not declaration_of(resolve_target("kvcheck")).allocator_page_sizes()
