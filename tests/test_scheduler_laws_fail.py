"""The scheduler-memory machine fails on each broken twin (`broken_scheduler.py`) with
the law the twin breaks, says at which step and which request held what, and passes on
the reference; the laws themselves fail on hand-broken snapshots, and a target's own
check that disagrees with a law fails as such."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.scheduler.laws import AGREEMENT, LAWS, LawBroken, check_laws
from kvcheck.scheduler.machine import scheduler_machine
from kvcheck.scheduler.model import ReferenceSchedulerMemory
from kvcheck.scheduler.snapshot import OwnCheck
from tests.broken_scheduler import TWINS

SEARCH = settings(
    max_examples=400,
    stateful_step_count=25,
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.__name__)
def test_machine_fails_on_twin(twin: Any) -> None:
    """Each twin breaks its law, and the failure names the law, the step and the holdings."""
    machine = scheduler_machine(twin, settings=SEARCH)
    with pytest.raises(LawBroken) as caught:
        run_state_machine_as_test(machine, settings=SEARCH)
    assert caught.value.law == twin.breaks
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert f"the {twin.breaks} law broke after step" in notes
    assert "held after that step:" in notes


def test_machine_passes_on_the_reference() -> None:
    """The reference keeps every law over the same search the twins fail."""
    quick = settings(SEARCH, max_examples=60, phases=[Phase.generate])
    machine = scheduler_machine(ReferenceSchedulerMemory, settings=quick)
    run_state_machine_as_test(machine, settings=quick)
    assert machine.TestCase.settings.max_examples == 60


def test_the_machine_draws_each_prefix_cache_with_its_own_policies() -> None:
    """Given several prefix caches, the machine passes the one it drew as
    ``prefix_cache=`` and draws the eviction policy from that cache's own."""
    built: list[tuple[str, str]] = []

    def memory(*, prefix_cache: str, eviction: str, **geometry: Any) -> Any:
        built.append((prefix_cache, eviction))
        return ReferenceSchedulerMemory(eviction="lru", **geometry)

    caches = {"first": ("lru",), "second": ("lfu", "tlru")}
    quick = settings(SEARCH, max_examples=30, phases=[Phase.generate], stateful_step_count=2)
    machine = scheduler_machine(memory, settings=quick, prefix_caches=caches)
    run_state_machine_as_test(machine, settings=quick)
    assert {cache for cache, _ in built} == set(caches)
    assert all(eviction in caches[cache] for cache, eviction in built)


@pytest.mark.parametrize("caches", [{}, {"unified": ()}, {3: ("lru",)}])
def test_prefix_caches_must_name_each_cache_and_its_policies(caches: Any) -> None:
    """An empty mapping, a cache with no policies or an unnamed cache is refused."""
    with pytest.raises(ValueError, match="prefix_caches="):
        scheduler_machine(ReferenceSchedulerMemory, prefix_caches=caches)


def _busy_snapshot() -> Any:
    memory = ReferenceSchedulerMemory(total=8, page_size=2, rows=2, max_len=8)
    assert memory.admit("a", [1, 1, 2, 2], first_chunk=4)
    memory.finish("a")
    assert memory.admit("b", [1, 1, 2, 2, 0], first_chunk=5)
    snap = memory.snapshot()
    check_laws(snap)
    return snap


@pytest.mark.parametrize(
    ("change", "law"),
    [
        (lambda s: {"evictable": s.evictable + 2}, "conservation"),
        (
            lambda s: {
                "nodes": tuple(dataclasses.replace(n, lock_ref=0) for n in s.nodes),
                "evictable": s.evictable + s.protected,
                "protected": 0,
            },
            "bookkeeping",
        ),
        (
            lambda s: {
                "free_slots": s.free_slots | {s.nodes[0].slots[0]},
                "available": s.available,
            },
            "ownership",
        ),
        (lambda s: {"read_slot": lambda slot: 0}, "bytes"),
    ],
    ids=["conservation", "bookkeeping", "ownership", "bytes"],
)
def test_each_law_fails_on_a_broken_snapshot(change: Any, law: str) -> None:
    """A snapshot broken in one way fails the law that reads that part."""
    snap = _busy_snapshot()
    broken = dataclasses.replace(snap, **change(snap))
    with pytest.raises(LawBroken) as caught:
        check_laws(broken)
    assert caught.value.law == law
    assert law in LAWS


def test_sglang_driver_writes_the_value_the_laws_expect() -> None:
    """The sglang driver's KV value formula (kept in the targets layer) is the laws' own."""
    from kvcheck.scheduler.snapshot import kv_value
    from kvcheck.targets.sglang.scheduler_memory import _kv_value

    prefixes = [(), (0,), (1, 2, 2), tuple(range(20))]
    assert [_kv_value(p) for p in prefixes] == [kv_value(p) for p in prefixes]


def _own(law: str, *, exact: bool, failure: str | None) -> OwnCheck:
    return OwnCheck(f"the target's {law} check", law, exact=exact, failure=failure)


@pytest.mark.parametrize(
    ("broken", "own", "law"),
    [
        (False, _own("conservation", exact=True, failure="leak"), AGREEMENT),
        (True, _own("conservation", exact=True, failure=None), AGREEMENT),
        (True, _own("conservation", exact=False, failure=None), "conservation"),
        (True, _own("conservation", exact=True, failure="leak"), "conservation"),
        (False, _own("ownership", exact=False, failure="use-after-free"), AGREEMENT),
    ],
    ids=[
        "target-fails-law-holds",
        "exact-target-passes-law-breaks",
        "partial-target-passes-law-breaks",
        "both-fail",
        "partial-target-fails-law-holds",
    ],
)
def test_the_targets_own_check_must_agree_with_the_law(
    broken: bool, own: OwnCheck, law: str
) -> None:
    """A target check that fails where the law holds, or an exact one that passes where it
    breaks, is an agreement failure naming both; where both fail the law's failure quotes
    the target's; a partial check passing where the law breaks is no disagreement."""
    snap = _busy_snapshot()
    if broken:
        snap = dataclasses.replace(snap, evictable=snap.evictable + 2)
    with pytest.raises(LawBroken) as caught:
        check_laws(dataclasses.replace(snap, own_checks=(own,)))
    assert caught.value.law == law
    if law == AGREEMENT:
        assert own.name in str(caught.value) and own.law in str(caught.value)
    elif own.failure is not None:
        assert any(own.name in note for note in caught.value.__notes__)


def test_the_laws_hold_with_agreeing_own_checks() -> None:
    """Own checks that find nothing on a sound memory change nothing; one naming an unknown
    law is refused."""
    snap = _busy_snapshot()
    check_laws(dataclasses.replace(snap, own_checks=(_own("bytes", exact=True, failure=None),)))
    with pytest.raises(ValueError, match="own_checks"):
        check_laws(
            dataclasses.replace(snap, own_checks=(_own("tidiness", exact=True, failure=None),))
        )
