"""The shipped attention properties (``kvcheck/suite/test_attention.py``) fail on broken targets.

Each test runs a suite property's own check on the suite's own strategy
(``PAGED_CASES``), through a target with one deliberate bug (a read API that reads
another layer, a stale ``get_kv_buffer``, a no-op pool that accepts writes, pool
selection that ignores the flag), and requires a ``PropertyFailure`` naming that call,
shrunk by Hypothesis to a small example. Settings are bounded and derandomized, with
no database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings

from kvcheck.attention import VarlenBatch, scrambled_layout
from kvcheck.failures import PropertyFailure
from kvcheck.pools import MHATokenToKVPool, NoOpMHATokenToKVPool
from kvcheck.specs import PoolSpec
from kvcheck.suite.test_attention import (
    PAGED_CASES,
    PagedCase,
    check_noop_case,
    check_paged_case,
)
from kvcheck.targets.builtin import KVCheckTarget

#: Bounded and deterministic: find the bug, shrink it, no database, no explanation phase.
TWIN_SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow],
)
CPU = "cpu"

# --- broken pools: each breaks one read or write of the MHA / no-op pool -------------------


class StartLayerIgnoringMHA(MHATokenToKVPool):
    """get_key_buffer indexes its buffers by the global layer id, ignoring start_layer."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]


class FirstLayerValueMHA(MHATokenToKVPool):
    """get_value_buffer returns the pool's first layer's V, whatever layer is asked for."""

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[0]


class StaleKVPairMHA(MHATokenToKVPool):
    """get_kv_buffer returns copies taken when the pool was built (a stale view), while
    get_key_buffer and get_value_buffer are right."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshot = [
            (k.clone(), v.clone()) for k, v in zip(self.k_buffer, self.v_buffer, strict=True)
        ]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._snapshot[layer_id - self.start_layer]


class SilentNoOp(NoOpMHATokenToKVPool):
    """A no-op pool whose set_kv_buffer returns without raising."""

    def set_kv_buffer(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        return None


class AttentionBrokenTarget(KVCheckTarget):
    """kvcheck's target with broken pool classes for some families, or a selection bug."""

    unsupported: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self, pool_classes: Mapping[str, type] | None = None, *, noop_under_flag: bool = True
    ) -> None:
        self.pool_classes = dict(pool_classes or {})
        self.noop_under_flag = noop_under_flag
        self.name = "broken-" + "-".join(c.__name__ for c in self.pool_classes.values())

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """The broken class for its family; kvcheck's own pool for any other."""
        pool_class = self.pool_classes.get(spec.family)
        if pool_class is None:
            return super().make_pool(spec, device=device)
        return pool_class(
            size=spec.size,
            page_size=spec.page_size,
            dtype=getattr(torch, spec.dtype),
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            v_head_dim=spec.v_head_dim,
            layer_num=spec.layer_num,
            start_layer=spec.start_layer,
            device=device,
        )

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        """kvcheck's selection, except that the flag's no-op pool becomes "mha" when asked."""
        family = super().select_pool_family(flags, model, is_draft=is_draft)
        return family if self.noop_under_flag or family != "noop" else "mha"


def shrunk_failure(
    check: Callable[[Any, str, PagedCase], None], target: Any
) -> tuple[PagedCase, PropertyFailure]:
    """The minimal ``PAGED_CASES`` example on which ``check`` fails, and its failure."""

    def fails(case: PagedCase) -> bool:
        try:
            check(target, CPU, case)
        except PropertyFailure:
            return True
        return False

    case = find(PAGED_CASES, fails, settings=TWIN_SETTINGS)
    with pytest.raises(PropertyFailure) as caught:
        check(target, CPU, case)
    return case, caught.value


def assert_small(case: PagedCase, *, max_tokens: int) -> None:
    """Shrunk: one sequence of at most ``max_tokens`` tokens, fp32, at most one spare page.

    Hypothesis also draws values from constants found in loaded modules, so the exact
    example depends on what the session imported: bounded, not pinned.
    """
    assert len(case.batch.seq_lens) == 1 and case.batch.seq_lens[0] <= max_tokens, case
    assert case.dtype == "float32", case
    assert case.layout.num_pages <= -(-max_tokens // case.layout.page_size) + 1, case


# --- the paged property ----------------------------------------------------------------------


def test_paged_property_catches_a_key_read_that_ignores_start_layer() -> None:
    """Reading K by global id as a local index shows once the pool starts at layer 1: the
    layer above is a decoy. Minimal: start_layer=1, two tokens (one key changes nothing)."""
    target = AttentionBrokenTarget({"mha": StartLayerIgnoringMHA})
    case, failure = shrunk_failure(check_paged_case, target)
    assert failure.signature.check == "attention"
    assert failure.signature.call == "get_key_buffer/get_value_buffer"
    assert failure.signature.kind == "outputs differ"
    assert case.start_layer == 1
    assert_small(case, max_tokens=3)


def test_paged_property_catches_a_value_read_of_the_wrong_layer() -> None:
    """V read from the pool's first layer (a decoy, below the checked one) fails at once:
    one token, layer 0."""
    target = AttentionBrokenTarget({"mha": FirstLayerValueMHA})
    case, failure = shrunk_failure(check_paged_case, target)
    assert failure.signature.call == "get_key_buffer/get_value_buffer"
    assert case.start_layer == 0
    assert_small(case, max_tokens=1)


def test_paged_property_catches_a_stale_get_kv_buffer() -> None:
    """get_kv_buffer is checked on its own: a stale pair fails even though the split
    reads are right. Minimal: one token."""
    target = AttentionBrokenTarget({"mha": StaleKVPairMHA})
    case, failure = shrunk_failure(check_paged_case, target)
    assert failure.signature.call == "get_kv_buffer"
    assert failure.signature.kind == "outputs differ"
    assert_small(case, max_tokens=1)


# --- the no-op property ----------------------------------------------------------------------


def test_noop_property_catches_selection_that_ignores_the_flag() -> None:
    """A target that builds the MHA pool under the flag fails at select_pool_family on the
    smallest example."""
    target = AttentionBrokenTarget(noop_under_flag=False)
    case, failure = shrunk_failure(check_noop_case, target)
    assert failure.signature.call == "select_pool_family"
    assert failure.signature.kind == "wrong family"
    assert case.start_layer == 0
    assert_small(case, max_tokens=1)


def test_noop_property_catches_a_noop_pool_that_accepts_writes() -> None:
    """A no-op pool that returns silently from set_kv_buffer fails on the smallest example."""
    target = AttentionBrokenTarget({"noop": SilentNoOp})
    case, failure = shrunk_failure(check_noop_case, target)
    assert failure.signature.call == "set_kv_buffer"
    assert failure.signature.kind == "no exception"
    assert failure.signature.family == "noop"
    assert_small(case, max_tokens=1)


def test_noop_property_reads_the_full_pool_through_the_target() -> None:
    """The full pool it compares against is the target's: a wrong V read fails the no-op
    property too, at the paged prefill."""
    target = AttentionBrokenTarget({"mha": FirstLayerValueMHA})
    case, failure = shrunk_failure(check_noop_case, target)
    assert failure.signature.call == "prefill_attention"
    assert failure.signature.family == "mha"
    assert_small(case, max_tokens=1)


def test_twin_target_is_correct_without_its_bug() -> None:
    """The broken-target scaffolding itself passes both properties when given no bug."""
    target = AttentionBrokenTarget({"mha": MHATokenToKVPool, "noop": NoOpMHATokenToKVPool})
    batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=8, v_head_dim=4)
    layout = scrambled_layout(batch.seq_lens, page_size=2)
    case = PagedCase(batch=batch, layout=layout, start_layer=2, dtype="float32")
    check_paged_case(target, CPU, case)
    check_noop_case(target, CPU, case)


def test_a_read_that_raises_is_the_pools_failure() -> None:
    """A read API raising on a valid global layer id (here IndexError: the global id used as
    a local index past the buffers) is a PropertyFailure naming the read, not an error."""
    target = AttentionBrokenTarget({"mha": StartLayerIgnoringMHA})
    batch = VarlenBatch(seq_lens=(2,), num_heads=1, num_kv_heads=1, head_dim=8)
    case = PagedCase(
        batch=batch, layout=scrambled_layout((2,), page_size=2), start_layer=2, dtype="float32"
    )
    with pytest.raises(PropertyFailure) as caught:
        check_paged_case(target, CPU, case)
    assert caught.value.signature.call == "get_key_buffer/get_value_buffer"
    assert caught.value.signature.kind == "raised IndexError"
    assert isinstance(caught.value.__cause__, IndexError)
