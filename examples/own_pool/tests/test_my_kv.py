from hypothesis import given
from hypothesis.stateful import run_state_machine_as_test
from kvcheck import strategies as kst
from kvcheck.machines import pool_machine
from kvcheck.properties import assert_accounting

from my_kv import target


@given(kst.pool_specs(families=("mha",), target=target))  # only specs my target builds
def test_my_pool_accounts_for_its_bytes(kvcheck_device, spec):
    assert_accounting(target.make_pool(spec, device=kvcheck_device), spec)


def test_my_pool_matches_the_reference_after_every_step(kvcheck_device):
    machine = pool_machine(target, device=kvcheck_device, family="mha")
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
