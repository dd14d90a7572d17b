"""sglang's own scheduler invariant checker runs beside kvcheck's laws on the memory the
scheduler driver builds: it finds nothing on a sound memory, and where a slot a request
holds is freed behind the scheduler's back it reports the leak (conservation) and the
use-after-free (ownership), which kvcheck's conservation law quotes. Runs only with
``KVCHECK_TARGET=sglang`` (importing sglang costs 10-15 s)."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.scheduler.drivers import memory_factory
from kvcheck.scheduler.laws import LawBroken, check_laws

pytestmark = pytest.mark.kvcheck_target("sglang")


@pytest.fixture
def memory() -> Any:
    from kvcheck.targets import resolve_target

    return memory_factory(resolve_target("sglang"))(
        total=8, page_size=1, rows=2, max_len=24, eviction="lru"
    )


def _failures(snap: Any) -> dict[str, str | None]:
    return {check.law: check.failure for check in snap.own_checks}


def test_sglangs_checker_finds_nothing_on_a_sound_memory(memory: Any) -> None:
    """At idle its three checks run and pass; with a request live, the busy and page
    checks do (the row check is an idle check); kvcheck's laws hold throughout."""
    idle = memory.snapshot()
    assert _failures(idle) == {"conservation": None, "ownership": None, "bookkeeping": None}
    check_laws(idle)
    assert memory.admit("a", [1, 2, 0, 1], first_chunk=4)
    busy = memory.snapshot()
    assert _failures(busy) == {"conservation": None, "ownership": None}
    check_laws(busy)
    memory.finish("a")
    check_laws(memory.snapshot())


def test_sglangs_checker_sees_a_slot_freed_behind_the_schedulers_back(memory: Any) -> None:
    """A held slot given back to the allocator directly: sglang's busy check reports a
    leak and its page check a use-after-free; kvcheck's conservation law breaks too and
    quotes sglang's busy check."""
    assert memory.admit("a", [1, 2, 0, 1], first_chunk=4)
    req = memory.requests["a"]
    row = memory.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
    memory.allocator.free(row[1:2].clone())
    snap = memory.snapshot()
    failures = _failures(snap)
    assert failures["conservation"] is not None and failures["ownership"] is not None
    with pytest.raises(LawBroken) as caught:
        check_laws(snap)
    assert caught.value.law == "conservation"
    assert any("self_check_during_busy" in note for note in caught.value.__notes__)
