"""Hardening: bad input raises ValueError, changes no pool byte and no caller tensor.

(That no *valid* call changes a caller's tensor is a core invariant, checked on every
call by the state machines on every target.) Random operation sequences, valid and
invalid (the reference deciding which must raise),
check that locations, payloads and host-copy tensors keep every byte and their layout.
Malformed calls the spec vocabulary cannot express (float or 2-D locations, wrong
dtypes, a valid K beside a malformed V, ...) are made on pools already holding data, and
must raise ``ValueError`` leaving every buffer byte-identical.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.machines import supported_op_kinds
from kvcheck.properties.apply import apply_op
from kvcheck.properties.inputs import assert_rejected_call_changes_nothing, check_sequence_inputs
from kvcheck.strategies import bad_calls, op_sequences, pool_specs

_CAPABILITIES = ("move", "host_copy", "input_validation")


def _per_family(families: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(
            family,
            marks=pytest.mark.kvcheck_needs(
                f"{family}_pool", *_CAPABILITIES, *(("index_k_write",) if family == "dsa" else ())
            ),
            id=family,
        )
        for family in families
    ]


@pytest.mark.parametrize("family", _per_family(("mha", "mla", "dsa", "noop")))
@given(data=st.data())
def test_calls_leave_caller_tensors_unchanged(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """Every call, accepted or rejected, leaves the caller's tensors byte-identical."""
    specs = pool_specs(families=(family,), target=kvcheck_target)
    kinds = supported_op_kinds(kvcheck_target, family)
    sequence = data.draw(
        op_sequences(specs, max_ops=6, include_invalid=True, kinds=kinds), label="ops"
    )
    check_sequence_inputs(kvcheck_target, sequence, device=kvcheck_device)
    assert sequence.spec.family == family


@pytest.mark.parametrize("family", _per_family(("mha", "mla", "dsa")))
@given(data=st.data())
def test_rejected_calls_leave_pool_unchanged(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """A malformed call raises ValueError and leaves every buffer of a filled pool unchanged."""
    spec = data.draw(pool_specs(families=(family,), target=kvcheck_target), label="spec")
    setup = data.draw(
        op_sequences(spec, max_ops=3, kinds=supported_op_kinds(kvcheck_target, family)),
        label="setup ops",
    )
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    copies: dict[str, Any] = {}
    for op in setup.ops:
        apply_op(kvcheck_target, pool, op, spec=spec, device=kvcheck_device, copies=copies)
    bad = data.draw(bad_calls(spec, device=kvcheck_device), label="bad call")
    assert_rejected_call_changes_nothing(kvcheck_target, pool, bad)
