"""The no-op pool: every write raises, only placeholders are held, moves change nothing.

Writes are drawn both valid (a ``set_kv_buffer`` any MHA pool would accept) and with
arbitrary arguments; each must raise ``RuntimeError`` naming ``NoOpMHATokenToKVPool`` and
the configuration it needs, without touching the placeholders.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.properties.noop import (
    assert_noop_holds_only_placeholders,
    assert_noop_move_changes_nothing,
    assert_noop_write_raises,
    noop_move_arguments,
    noop_write_calls,
)
from kvcheck.strategies import pool_specs
from kvcheck.targets.limits import within_target_limits

#: No-op pools of every shape, large capacities included (they allocate one page only).
NOOP_SPECS = pool_specs(families=("noop",), max_size=1 << 16, max_page_size=64)


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_write_raises_whatever_the_arguments(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Every write raises RuntimeError naming the pool and the flags; placeholders stay zero."""
    spec = data.draw(within_target_limits(kvcheck_target, NOOP_SPECS), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    call = data.draw(noop_write_calls(spec, device=kvcheck_device), label="call")
    assert_noop_write_raises(pool, call.method, call.args, call.kwargs)
    assert_noop_holds_only_placeholders(pool, spec)


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_holds_only_placeholders(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """Only one-page placeholders are held and read back; reported bytes and GiB are zero."""
    spec = data.draw(within_target_limits(kvcheck_target, NOOP_SPECS), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_noop_holds_only_placeholders(pool, spec)
    assert pool.size == spec.size


@pytest.mark.kvcheck_needs("noop_pool")
@given(data=st.data())
def test_noop_move_changes_nothing(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """move_kv_cache accepts any arguments and changes no byte."""
    spec = data.draw(within_target_limits(kvcheck_target, NOOP_SPECS), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    args, kwargs = data.draw(noop_move_arguments(spec, device=kvcheck_device), label="move")
    assert_noop_move_changes_nothing(pool, args, kwargs)
    assert_noop_holds_only_placeholders(pool, spec)
