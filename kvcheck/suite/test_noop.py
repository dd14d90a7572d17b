"""The no-op pool: every write raises, only placeholders are held, valid moves change nothing.

Writes are drawn both valid (a ``set_kv_buffer`` any MHA pool would accept) and with
arbitrary arguments; each must raise ``RuntimeError`` naming ``NoOpMHATokenToKVPool`` and
the configuration it needs, without touching the placeholders.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.calls import NOOP_WRITE_METHODS, PoolCall, loc_tensor
from kvcheck.properties.inputs import run_checked_call
from kvcheck.properties.noop import (
    assert_noop_holds_only_placeholders,
    assert_noop_move_changes_nothing,
    assert_noop_write_raises,
)
from kvcheck.specs import Move, PoolSpec
from kvcheck.strategies import noop_move_arguments, noop_write_calls, pool_specs
from kvcheck.targets.findings import steered_tags


def noop_specs(target: Any) -> st.SearchStrategy[PoolSpec]:
    """No-op pools of every shape ``target`` takes, large capacities included (they
    allocate one page only)."""
    return pool_specs(families=("noop",), max_size=1 << 16, max_page_size=64, target=target)


#: The write methods, with the machine step each stands for (a finding that makes the
#: target's no-op pool accept one is steered around by steering the no-op pool off that step).
_WRITE_STEPS = {"set_kv_buffer": "write_kv", "load_cpu_copy": "host_reload"}


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_write_raises_whatever_the_arguments(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Every write raises RuntimeError naming the pool and the flags; placeholders stay zero."""
    spec = data.draw(noop_specs(kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    steered = steered_tags(kvcheck_target)
    methods = tuple(
        method for method, step in _WRITE_STEPS.items() if not steered.avoids(step, family="noop")
    )
    call = data.draw(
        noop_write_calls(spec, device=kvcheck_device, methods=methods or NOOP_WRITE_METHODS),
        label="call",
    )
    assert_noop_write_raises(pool, call.method, call.args, call.kwargs)
    assert_noop_holds_only_placeholders(pool, spec)


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_holds_only_placeholders(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Only one-page placeholders are held and read back; reported bytes and GiB are zero."""
    spec = data.draw(noop_specs(kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_noop_holds_only_placeholders(pool, spec)
    assert pool.size == spec.size


def _bad_moves(spec: Any) -> st.SearchStrategy[Move]:
    """A repeated target, a target outside the pool, or sources and targets of different
    lengths. Shrinks towards a repeated target at slot 0."""
    slot = st.integers(0, spec.num_slots - 1)
    outside = st.sampled_from((spec.num_slots, -1))
    return st.one_of(
        st.builds(lambda t, s: Move(tgt=(t, t), src=(s, s)), slot, slot),
        st.builds(lambda t, s: Move(tgt=(t,), src=(s,)), outside, slot),
        st.builds(lambda t, s, e: Move(tgt=(t,), src=(s, e)), slot, slot, slot),
    )


@pytest.mark.kvcheck_needs("noop_pool", "input_validation")
@given(data=st.data())
def test_noop_refuses_malformed_moves(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Hardening: a move of locations outside the pool, repeated targets or different
    lengths raises ValueError and changes no byte, as on any pool."""
    spec = data.draw(noop_specs(kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    bad = data.draw(_bad_moves(spec), label="move")
    call = PoolCall(
        "move_kv_cache",
        (loc_tensor(bad.tgt, device=kvcheck_device), loc_tensor(bad.src, device=kvcheck_device)),
    )
    run_checked_call(kvcheck_target, pool, call, description=repr(bad), expected_error=ValueError)
    assert_noop_holds_only_placeholders(pool, spec)


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_move_changes_nothing(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """A valid move_kv_cache (by position or keyword) is accepted and changes no byte."""
    spec = data.draw(noop_specs(kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    args, kwargs = data.draw(noop_move_arguments(spec, device=kvcheck_device), label="move")
    assert_noop_move_changes_nothing(pool, args, kwargs)
    assert_noop_holds_only_placeholders(pool, spec)
