"""kvcheck's reusable property functions and state machine, applied to the counting pool."""

from __future__ import annotations

from hypothesis import given
from hypothesis.stateful import run_state_machine_as_test
from kvcheck.machines import pool_machine
from kvcheck.properties import assert_accounting
from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs

from downstream_pool.target import target


@given(pool_specs(families=("mha",)))
def test_counting_pool_accounts_for_its_bytes(spec: PoolSpec) -> None:
    """get_kv_size_bytes and mem_usage agree with the bytes the counting pool holds."""
    pool = target.make_pool(spec, device="cpu")
    assert_accounting(pool, spec)
    assert pool.get_kv_size_bytes()[0] > 0


def test_counting_pool_matches_the_reference_after_every_step() -> None:
    """kvcheck's differential machine drives the counting pool and the reference together."""
    machine = pool_machine(target, device="cpu", family="mha")
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
    assert machine.__name__.startswith("MHA")
