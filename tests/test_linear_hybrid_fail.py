"""The linear-hybrid machine fails on every broken twin (tests/broken_linear.py), and shrinks.

Each twin breaks one operation across the hybrid's sub-pools; the machine must catch it,
with the check that names the broken call, in a handful of steps.
"""

from __future__ import annotations

import pytest
from broken_linear import (
    BrokenLinearTarget,
    ConvlessDescriptionMambaPool,
    ForkWithoutTemporalMambaPool,
    MambaDroppingHostKVPool,
    MambaKeepingFlushReqPool,
    OffByOneLayerKVPool,
    RowKeepingRefusalReqPool,
    ScratchBlindAccountingMambaPool,
    ScratchClobberingMambaPool,
    SlotLeakingReqPool,
)
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.failures import PropertyFailure
from kvcheck.linear_hybrid_machine import linear_hybrid_machine
from kvcheck.specs import LinearHybridSpec

TWIN = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    stateful_step_count=10,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


#: Hybrids with draft scratch, for the twins that break only speculative state.
DRAFTED = st.builds(
    LinearHybridSpec,
    full_layer_ids=st.just((1,)),
    mamba_layer_ids=st.just((0,)),
    draft_tokens=st.integers(min_value=1, max_value=2),
)


def _failure(broken: type, specs: st.SearchStrategy[LinearHybridSpec] | None) -> PropertyFailure:
    machine = linear_hybrid_machine(
        BrokenLinearTarget(broken), device="cpu", settings=TWIN, specs=specs
    )
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=TWIN)
    return caught.value


@pytest.mark.parametrize(
    ("broken", "rules", "max_steps", "specs"),
    [
        pytest.param(ForkWithoutTemporalMambaPool, ("fork",), 8, None, id="fork-without-temporal"),
        pytest.param(SlotLeakingReqPool, ("finish", "retract"), 4, None, id="free-leaks-slot"),
        pytest.param(RowKeepingRefusalReqPool, ("admit",), 4, None, id="refusal-keeps-row"),
        pytest.param(MambaKeepingFlushReqPool, ("flush",), 4, None, id="flush-keeps-slots"),
        pytest.param(
            ScratchClobberingMambaPool, ("verify_drafts",), 8, DRAFTED, id="clear-clobbers-drafts"
        ),
        pytest.param(OffByOneLayerKVPool, ("write_kv",), 4, None, id="layer-mapping-off-by-one"),
        pytest.param(MambaDroppingHostKVPool, ("reload",), 8, None, id="reload-drops-mamba"),
        pytest.param(ScratchBlindAccountingMambaPool, ("build",), 1, None, id="accounting"),
        pytest.param(ConvlessDescriptionMambaPool, ("build",), 1, None, id="pd-description"),
    ],
)
def test_the_linear_hybrid_machine_catches_each_twin(
    broken: type,
    rules: tuple[str, ...],
    max_steps: int,
    specs: st.SearchStrategy[LinearHybridSpec] | None,
) -> None:
    """The minimal failing run of each twin makes the broken call, in a few steps (the
    bounds leave room: how far Hypothesis shrinks a run varies across its releases, and
    a 7-step fork run was seen where 3 steps would do)."""
    error = _failure(broken, specs)
    assert error.signature is not None and error.signature.check == "linear_hybrid", error
    notes = "\n".join(getattr(error, "__notes__", ()))
    assert any(f"state.{rule}(" in notes for rule in rules), notes
    assert _steps(error) <= max_steps, notes


def _steps(error: PropertyFailure) -> int:
    """Rule calls in the minimal run (the build, the invariants and teardown not counted)."""
    notes = "\n".join(getattr(error, "__notes__", ()))
    calls = [line for line in notes.splitlines() if line.startswith("state.")]
    skipped = ("state.build(", "state.teardown(", "state.slots_are_", "state.state_equals_")
    return len([c for c in calls if not c.startswith(skipped)])
