"""Proof that the allocator, host-pool and lifecycle properties can fail: each catches its
broken twin (``broken_tiers.py``), with the property's own signature, shrunk small."""

from __future__ import annotations

from typing import Any

import pytest
from broken_tiers import (
    AnyBackendHost,
    BaseOnlyAlignedHost,
    BrokenTierTarget,
    DriftingPagedAllocator,
    EmptyFreeReleasingPagedAllocator,
    FullReleasingPureSWAAllocator,
    FullSideCapacitySWAAllocator,
    FullSizedSWAAllocator,
    GroupReleasingTwicePagedAllocator,
    KeyOnlyRegisteringHost,
    LayerForgettingHost,
    LayoutFallbackTarget,
    LeakyDecodeSWAAllocator,
    NextPageMetaHost,
    OnceDestroyedHost,
    PageKeepingHost,
    PhysicalSkippingHost,
    ScaleDroppingHost,
    ScaleMisplacingHost,
    SegmentReleasingTwicePagedAllocator,
    SegmentTrustingPagedAllocator,
    ShiftedPageHost,
    TailDriftingSWAAllocator,
    TrustingPagedAllocator,
    TwiceHandingTokenAllocator,
    UnalignedPagedAllocator,
    UnderstatingHost,
    ValueFirstSplitMetaHost,
    WholeRowKeySizeHost,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.allocator_machine import allocator_machine
from kvcheck.failures import PropertyFailure
from kvcheck.lifecycle import lifecycle_machine, lifecycle_specs
from kvcheck.machines import supported_op_kinds
from kvcheck.properties.host_pools import (
    check_host_layouts_refused,
    check_host_round_trip,
    check_host_storage_and_teardown,
)
from kvcheck.strategies.tier_specs import allocator_specs, host_pool_specs

TWIN = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    stateful_step_count=10,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _steps(error: PropertyFailure) -> int:
    notes = "\n".join(getattr(error, "__notes__", ()))
    return notes.count("state.step(")


def allocator_failure(
    broken: type,
    kind: str,
    *,
    min_page_size: int = 1,
    max_examples: int | None = None,
    smaller_window: bool = False,
) -> PropertyFailure:
    """Run ``kind``'s allocator machine on the twin; the failure it ends with
    (``smaller_window``: only sliding-window sides smaller than the full side)."""
    specs = allocator_specs(kinds=(kind,), max_pages=4)
    if min_page_size > 1:
        specs = specs.filter(lambda spec: spec.page_size >= min_page_size)
    if smaller_window:
        specs = specs.filter(lambda spec: spec.size_swa < spec.size)
    machine = allocator_machine(BrokenTierTarget(broken), device="cpu", kind=kind, specs=specs)
    twin = TWIN if max_examples is None else settings(TWIN, max_examples=max_examples)
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=twin)
    return caught.value


def test_a_slot_handed_out_twice_is_caught() -> None:
    """An allocator that hands out a held slot again fails the no-slot-twice check."""
    error = allocator_failure(TwiceHandingTokenAllocator, "token")
    assert error.signature.check == "allocation" and error.signature.kind == "slot handed out twice"
    assert _steps(error) <= 3, error.__notes__


def test_an_available_size_that_drifts_is_caught() -> None:
    """An allocator whose available_size counts freed tokens, not pages, fails the size check."""
    error = allocator_failure(DriftingPagedAllocator, "paged")
    assert error.signature.check == "available_size", error
    assert _steps(error) <= 3, error.__notes__


def test_a_page_that_comes_back_twice_is_caught() -> None:
    """A free group that releases a page once per free naming it fails: the page comes back
    twice (the size check sees it first)."""
    error = allocator_failure(GroupReleasingTwicePagedAllocator, "paged")
    assert error.signature.check in ("available_size", "allocation"), error
    assert _steps(error) <= 4, error.__notes__


def test_an_unaligned_extend_is_caught() -> None:
    """An allocator that fills the rest of a partly filled page out of order fails alignment."""
    # The twin reverses the slots that fill a partly filled last page, so it shows only where
    # two or more of them are left: page size 3 or more. Hypothesis seeds its search with
    # constants from the modules loaded so far, so what a test finds within its examples
    # depends on the tests that ran before it in the process; the margin covers that.
    error = allocator_failure(UnalignedPagedAllocator, "paged", min_page_size=3, max_examples=600)
    assert error.signature.check == "allocation" and error.signature.kind == "page alignment"
    assert _steps(error) <= 3, error.__notes__


def test_a_refusal_that_changes_one_side_is_caught() -> None:
    """A sliding-window decode refused on the window side must not take a full-side page."""
    # The leak shows only where the window side runs out first: a smaller window side.
    error = allocator_failure(LeakyDecodeSWAAllocator, "swa", min_page_size=2, smaller_window=True)
    assert error.signature.check == "refusal", error
    assert error.signature.kind == "refusal changed the allocator"
    assert _steps(error) <= 4, error.__notes__


def test_a_double_free_that_is_accepted_is_caught() -> None:
    """An allocator that takes a double free without ValueError fails the bad-input check."""
    error = allocator_failure(TrustingPagedAllocator, "paged")
    assert error.signature.check == "raises", error
    assert error.signature.kind == "no exception instead of ValueError"


def test_a_segment_free_that_lists_a_page_twice_is_caught() -> None:
    """A segment free that puts a page on the free list twice fails the free-page census,
    though available_size() is right."""
    error = allocator_failure(SegmentReleasingTwicePagedAllocator, "paged")
    assert error.signature.check == "free_pages", error
    assert error.signature.kind == "page free twice"
    assert _steps(error) <= 3, error.__notes__


def test_a_swa_tail_that_drifts_the_window_side_is_caught() -> None:
    """alloc_extend_swa_tail must take window pages for the tail only."""
    error = allocator_failure(TailDriftingSWAAllocator, "swa", min_page_size=2)
    assert error.signature.check == "available_size", error
    assert error.signature.call == "alloc_extend_swa_tail"
    assert _steps(error) <= 3, error.__notes__


def test_a_pure_swa_free_full_that_releases_again_is_caught() -> None:
    """A pure sliding-window free_full must release nothing: free_swa released the slots."""
    error = allocator_failure(FullReleasingPureSWAAllocator, "pure_swa")
    assert error.signature.check in ("available_size", "free_pages"), error
    assert _steps(error) <= 4, error.__notes__


def test_an_empty_free_that_releases_a_page_is_caught() -> None:
    """A free that names no slot must change nothing."""
    error = allocator_failure(EmptyFreeReleasingPagedAllocator, "paged")
    assert error.signature.check == "available_size", error
    assert _steps(error) <= 3, error.__notes__


def test_a_segment_that_starts_mid_page_is_refused() -> None:
    """A segment free whose start is not page-aligned is bad input: ValueError."""
    error = allocator_failure(SegmentTrustingPagedAllocator, "paged")
    assert error.signature.check == "raises", error
    assert error.signature.kind == "no exception instead of ValueError"


def test_a_decode_capacity_that_asks_one_side_is_caught() -> None:
    """check_decode_capacity must answer for both sides of a sliding-window allocator."""
    error = allocator_failure(FullSideCapacitySWAAllocator, "swa")
    assert error.signature.check == "hook", error
    assert error.signature.call == "check_decode_capacity"
    assert _steps(error) <= 3, error.__notes__


def test_a_capacity_reported_wrong_is_caught() -> None:
    """A sliding-window allocator's size is the smaller side's."""
    error = allocator_failure(FullSizedSWAAllocator, "swa")
    assert error.signature.check == "capacity", error
    assert _steps(error) <= 1, error.__notes__


def host_failure(
    broken: type,
    family: str,
    layouts: tuple[str, ...] | None = None,
    *,
    kv_quants: tuple[str, ...] = ("none",),
) -> PropertyFailure:
    """Run the host round trip on the twin; the failure it ends with."""
    target = BrokenTierTarget(broken)
    specs = host_pool_specs(
        families=(family,), target=target, max_layers=2, max_size=8, kv_quants=kv_quants
    )
    if layouts is not None:
        specs = specs.filter(lambda spec: spec.layout in layouts)

    @TWIN
    @given(spec=specs, data=st.data())
    def round_trip(spec: Any, data: st.DataObject) -> None:
        check_host_round_trip(
            target,
            spec,
            data,
            device="cpu",
            write_kinds=supported_op_kinds(target, family),
            validates=True,
        )

    with pytest.raises(PropertyFailure) as caught:
        round_trip()
    return caught.value


def test_a_host_page_at_the_wrong_offset_is_caught() -> None:
    """A host pool that writes (and reads) each page one page off round-trips, yet fails the
    placement check."""
    error = host_failure(ShiftedPageHost, "mha")
    assert error.signature.check == "host_bytes", error
    assert error.signature.family.startswith("host:mha"), error


def test_a_host_pool_that_forgets_a_layer_is_caught() -> None:
    """A host pool that backs up every layer but the last fails on the host bytes."""
    error = host_failure(LayerForgettingHost, "mla")
    assert error.signature.check == "host_bytes", error


def test_a_host_size_per_token_that_understates_is_caught() -> None:
    """get_size_per_token() one layer short fails the buffer-infos check."""
    error = host_failure(UnderstatingHost, "mla")
    assert error.signature.check == "buffer_infos" and error.signature.call == "get_size_per_token"


def test_a_page_meta_that_names_another_page_is_caught() -> None:
    """get_page_buffer_meta naming the next page fails once a host has two pages."""
    error = host_failure(NextPageMetaHost, "mla", layouts=("page_first",))
    assert error.signature.check == "buffer_infos"
    assert error.signature.call == "get_page_buffer_meta"


@pytest.mark.parametrize("quant", ["mxfp8", "fp4_mx_block16", "nvfp4"])
def test_a_host_pool_that_drops_the_scales_is_caught(quant: str) -> None:
    """A host pool that backs up a quantized pool's payload but not its scales fails on the
    host bytes (the scale buffers hold zeros where the scales belong)."""
    error = host_failure(ScaleDroppingHost, "mha", kv_quants=(quant,))
    assert error.signature.check == "host_bytes", error
    assert error.signature.family.startswith(f"host:mha:{quant}"), error


@pytest.mark.parametrize("quant", ["mxfp8", "fp4_mx_block16"])
def test_a_host_pool_that_loads_scales_to_another_page_is_caught(quant: str) -> None:
    """A host pool that loads the scales one page away from their payload holds the right
    host bytes, yet the device pool after the load differs from the reference."""
    error = host_failure(ScaleMisplacingHost, "mha", kv_quants=(quant,))
    assert error.signature.call == "load_to_device_per_layer", error
    assert error.signature.family.startswith(f"mha:{quant}"), error


def test_the_lifecycle_catches_a_host_pool_that_drops_the_scales() -> None:
    """The lifecycle machine, too, fails on a host tier that leaves the scales behind."""
    target = BrokenTierTarget(ScaleDroppingHost)
    specs = lifecycle_specs(target, "mha", kv_quants=("mxfp8", "fp4_mx_block16"))
    machine = lifecycle_machine(target, device="cpu", family="mha", specs=specs)
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=settings(TWIN, stateful_step_count=20))
    assert caught.value.signature.check in ("host_bytes", "bytes"), caught.value


def test_a_host_pool_taking_any_io_backend_is_caught() -> None:
    """A host pool that transfers with an io backend its layout does not take fails the
    bad-input check."""
    error = host_failure(AnyBackendHost, "mla")
    assert error.signature.check == "raises", error
    assert "io_backend" in error.signature.call, error
    assert error.signature.kind == "no exception instead of ValueError", error


def storage_failure(
    broken: type, family: str, layouts: tuple[str, ...] | None = None
) -> PropertyFailure:
    """Run the storage-queries-and-teardown check on the twin; the failure it ends with."""
    target = BrokenTierTarget(broken)
    specs = host_pool_specs(families=(family,), target=target, max_layers=2, max_size=8)
    if layouts is not None:
        specs = specs.filter(lambda spec: spec.layout in layouts)

    @TWIN
    @given(spec=specs, data=st.data())
    def storage(spec: Any, data: st.DataObject) -> None:
        check_host_storage_and_teardown(
            target, spec, data, device="cpu", write_kinds=supported_op_kinds(target, family)
        )

    with pytest.raises(PropertyFailure) as caught:
        storage()
    return caught.value


@pytest.mark.parametrize(
    ("broken", "family", "call"),
    [
        pytest.param(WholeRowKeySizeHost, "mha", "get_ksize_per_token", id="ksize"),
        pytest.param(KeyOnlyRegisteringHost, "mha", "get_hybrid_pool_buffer", id="registered"),
        pytest.param(BaseOnlyAlignedHost, "mla", "is_stride_page_aligned", id="stride"),
    ],
)
def test_a_storage_query_that_misdescribes_the_host_bytes_is_caught(
    broken: type, family: str, call: str
) -> None:
    """A key size, registered tensor list or stride answer that does not fit the host bytes
    fails the buffer-infos check on that call."""
    error = storage_failure(broken, family)
    assert error.signature.check == "buffer_infos" and error.signature.call == call, error


def test_a_split_page_meta_out_of_order_is_caught() -> None:
    """Split-heads page meta naming V before K fails once a page_head pool has a page."""
    error = storage_failure(ValueFirstSplitMetaHost, "mha", layouts=("page_head",))
    assert error.signature.check == "buffer_infos", error
    assert error.signature.call == "get_split_heads_page_buffer_meta", error


def test_a_host_pool_that_keeps_a_freed_slot_is_caught() -> None:
    """A free that keeps one slot back fails the slot-reuse check."""
    error = storage_failure(PageKeepingHost, "mla")
    assert error.signature.check == "host_slots", error


def test_a_physical_backup_that_copies_nothing_is_caught() -> None:
    """A controller-hook backup that skips the copy fails on the host bytes."""
    error = storage_failure(PhysicalSkippingHost, "mha")
    assert error.signature.check == "host_bytes", error


def test_a_destroy_that_fails_twice_is_caught() -> None:
    """destroy() raising on its second call fails the teardown check."""
    error = storage_failure(OnceDestroyedHost, "mla")
    assert error.signature.check == "teardown" and error.signature.call == "destroy", error


def test_a_target_that_builds_a_refused_layout_is_caught() -> None:
    """A target that falls back to a layout it takes, instead of refusing one it does not,
    fails the layout-refusal check."""
    target = LayoutFallbackTarget()

    @TWIN
    @given(spec=host_pool_specs(families=("mla",), target=target, max_layers=2, max_size=8))
    def refusal(spec: Any) -> None:
        check_host_layouts_refused(target, spec, device="cpu")

    with pytest.raises(PropertyFailure) as caught:
        refusal()
    assert caught.value.signature.check == "raises", caught.value
    assert caught.value.signature.kind == "no exception instead of ValueError", caught.value


def test_the_lifecycle_catches_a_host_pool_that_forgets_a_layer() -> None:
    """The lifecycle machine, too, fails on a host tier that leaves a layer behind."""
    target = BrokenTierTarget(LayerForgettingHost)
    specs = lifecycle_specs(target, "mla").filter(lambda spec: spec.device.layer_num > 1)
    machine = lifecycle_machine(target, device="cpu", family="mla", specs=specs)
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=settings(TWIN, stateful_step_count=20))
    assert caught.value.signature.check in ("host_bytes", "bytes"), caught.value


def test_the_lifecycle_catches_a_slot_handed_out_twice() -> None:
    """The lifecycle machine fails when the allocator hands a request another's slot."""
    target = BrokenTierTarget(TwiceHandingTokenAllocator)
    specs = lifecycle_specs(target, "mha").filter(lambda spec: spec.page_size == 1)
    machine = lifecycle_machine(target, device="cpu", family="mha", specs=specs)
    with pytest.raises(PropertyFailure) as caught:
        run_state_machine_as_test(machine, settings=TWIN)
    assert caught.value.signature.kind == "slot handed out twice", caught.value
