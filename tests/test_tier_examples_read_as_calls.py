"""A user target's allocator failures read as calls (issue 36, "What was seen" item 2):
the failure lists every call made on the allocator, in order, as Python
(``allocator.clear()``), after the line that builds it; the machine's draws are labelled
with the call they choose, never a bare number (``Draw 2 (clear instead): 1``)."""

from __future__ import annotations

import re

import pytest
from broken_tiers import BrokenTierTarget, DriftingPagedAllocator, TwiceHandingTokenAllocator
from hypothesis.stateful import run_state_machine_as_test
from test_tier_properties_fail import TWIN

from kvcheck.allocator_machine import allocator_machine
from kvcheck.failures import PropertyFailure
from kvcheck.strategies.tier_specs import allocator_specs


def _failure(broken: type, kind: str) -> PropertyFailure:
    machine = allocator_machine(
        BrokenTierTarget(broken),
        device="cpu",
        kind=kind,
        specs=allocator_specs(kinds=(kind,), max_pages=4),
    )
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=TWIN)
    return caught.value


@pytest.mark.parametrize(
    ("broken", "kind"),
    [(TwiceHandingTokenAllocator, "token"), (DriftingPagedAllocator, "paged")],
    ids=["token", "paged"],
)
def test_an_allocator_failure_lists_its_calls_as_python(broken: type, kind: str) -> None:
    """The failure's note builds the allocator from its spec, then lists each call on it;
    the last call listed is the one the failure names."""
    error = _failure(broken, kind)
    notes = "\n".join(error.__notes__)
    listed = notes.split("calls, in order:\n", 1)[1].splitlines()
    assert listed[0].startswith("  allocator = target.make_allocator(AllocatorSpec(")
    calls = [line.strip() for line in listed[1:] if line.startswith("  allocator.")]
    assert calls, notes
    assert all(re.fullmatch(r"allocator\.[a-z_]+\(.*\).*", call) for call in calls), calls
    failing = str(error).splitlines()[0]
    assert calls[-1].removeprefix("allocator.").split(" ")[0].split("(")[0] in failing


def test_the_drain_or_clear_draw_names_the_call() -> None:
    """The draw that picks clear() over a drain says so in its label (what Hypothesis
    prints beside the drawn number), not "clear instead"."""
    import inspect

    import kvcheck.allocator_machine as machine

    source = inspect.getsource(machine)
    assert 'label="clear instead"' not in source
    assert 'label="0: clear(), else a drain"' in source


def test_the_surface_line_shows_the_tiers_a_target_declares() -> None:
    """The ``kvcheck surface:`` line names the allocators and host pools a target declares
    with ``Surface.with_tiers``, after its pool families; a target that declares none
    shows its families alone."""
    from types import SimpleNamespace

    from kvcheck.runner.plugin import _describe_surface
    from kvcheck.surface import Surface

    declared = Surface.of(mha={}).with_tiers(
        allocators=("token", "paged"), host_layouts={"mha": ("layer_first",)}
    )
    line = _describe_surface(SimpleNamespace(name="mine", surface=declared))
    assert line == "mha; allocators token/paged; host pools mha (layer_first)"
    assert _describe_surface(SimpleNamespace(name="mine", surface=Surface.of(mha={}))) == "mha"
