"""A target's host tier (hierarchical caching): byte-exact round trips, in every layout.

For every family with a host pool, every variant the target builds and every host layout it
declares (:func:`kvcheck.strategies.host_pool_specs`), through
:func:`kvcheck.properties.host_pools.check_host_round_trip`: a device pool holding written
bytes (scales and index keys included, whatever the variant holds) backs whole pages up to
host slots the host pool hands out; the host buffers then hold exactly the bytes the layout
places there, the flat data pages are the layout's pages, and loading every layer back into
other device slots restores them byte for byte without touching any other slot. A data page
set from another round-trips too, and the host pools' buffer infos equal the bytes they
hold. With ``input_validation``, a bad host call (a double free, a foreign or out-of-range
slot, a bad size, mismatched index lists, an io backend the layout does not transfer with)
raises ``ValueError`` and changes nothing. Each quantized variant has a run of its own, its
scale buffers kept beside the payload (where the target builds its host tier, in the
layouts it builds it in).

What a zero-copy storage backend is told is checked too: each host pool's key size per
token, the tensors it registers, whether its pages are stride-aligned, and an MHA
``page_head`` pool's page regions split by head group; a page backed up and loaded back
through the controller's hooks (``prepare_transfer_indices``, the ``*_physical`` transfers);
host slots freed and handed out again; ``destroy()`` of the tier, twice; and a host pool in
a layout the device pool's family does not take (or no family takes) refused with
``ValueError``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcheck.machines import supported_op_kinds
from kvcheck.properties.host_pools import (
    check_host_layouts_refused,
    check_host_round_trip,
    check_host_storage_and_teardown,
)
from kvcheck.strategies.limits import unbuilt_variant_reason
from kvcheck.strategies.tier_specs import host_pool_specs
from kvcheck.targets import supports
from kvcheck.targets.findings import steered_tags
from kvcheck.targets.tier_support import host_pool_skip_reason, host_variant_skip_reason
from kvcheck.tiers import HOST_FAMILIES
from kvcheck.variants import VARIANTS, Variant


def _host_spec_or_skip(target: Any, family: str, data: st.DataObject) -> Any:
    """A host pool spec of ``family`` inside ``target``'s surface, steered as its findings
    ask (the test skips, saying why, where the target builds no such host pool)."""
    reason = host_pool_skip_reason(target, family)
    if reason is not None:
        pytest.skip(reason)
    specs = host_pool_specs(families=(family,), target=target, steer=steered_tags(target))
    return data.draw(specs, label="host pool")


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f) for f in HOST_FAMILIES],
)
@given(data=st.data())
def test_host_round_trip_is_byte_exact(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """Backup then load of whole pages restores every byte; host bytes sit where the layout says."""
    spec = _host_spec_or_skip(kvcheck_target, family, data)
    check_host_round_trip(
        kvcheck_target,
        spec,
        data,
        device=kvcheck_device,
        write_kinds=supported_op_kinds(kvcheck_target, family),
        validates=supports(kvcheck_target, "input_validation"),
        steer=steered_tags(kvcheck_target),
    )


#: Every quantized device variant with a host tier (token-major: ``hnd`` pools have none):
#: a run of its own each, so that each one's scales get their share of round trips (the
#: family runs above draw unquantized pools only).
QUANTIZED_HOSTS: tuple[Variant, ...] = tuple(
    v for v in VARIANTS if v.kv_quant != "none" and v.token_major and v.family in HOST_FAMILIES
)


def _host_settings() -> settings:
    """A fifth of the profile's examples per variant (the host pools of 128-token MXFP8
    pages are the largest the suite builds); the variant filter may reject draws on a
    target whose limits narrow the spec: expected, not a health problem."""
    current = settings()
    return settings(
        current,
        max_examples=max(5, current.max_examples // 5),
        suppress_health_check=[*current.suppress_health_check, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(v, marks=pytest.mark.kvcheck_needs(f"{v.family}_pool"), id=v.test_id)
        for v in QUANTIZED_HOSTS
    ],
)
def test_quantized_host_round_trip_is_byte_exact(
    kvcheck_target: Any, kvcheck_device: str, variant: Variant
) -> None:
    """A quantized pool's host tier round-trips its payload and every scale buffer byte for
    byte (scales at their layout's place, in the data pages and page meta beside the
    payload). Skipped for a target that builds no such pool or no host tier for it."""
    for reason in (
        host_pool_skip_reason(kvcheck_target, variant.family),
        unbuilt_variant_reason(kvcheck_target, variant),
        host_variant_skip_reason(kvcheck_target, variant.name),
    ):
        if reason is not None:
            pytest.skip(reason)
    steer = steered_tags(kvcheck_target)
    specs = host_pool_specs(
        families=(variant.family,),
        kv_quants=(variant.kv_quant,),
        target=kvcheck_target,
        steer=steer,
    ).filter(lambda spec: spec.device.variant == variant.name)

    @_host_settings()
    @given(data=st.data())
    def round_trip(data: st.DataObject) -> None:
        check_host_round_trip(
            kvcheck_target,
            data.draw(specs, label="host pool"),
            data,
            device=kvcheck_device,
            write_kinds=supported_op_kinds(kvcheck_target, variant.family),
            validates=supports(kvcheck_target, "input_validation"),
            steer=steer,
        )

    round_trip()


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=pytest.mark.kvcheck_needs(f"{f}_pool"), id=f) for f in HOST_FAMILIES],
)
@given(data=st.data())
def test_host_storage_queries_and_teardown(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """Storage-backend queries describe the host bytes; hooks, slot reuse and destroy hold."""
    spec = _host_spec_or_skip(kvcheck_target, family, data)
    check_host_storage_and_teardown(
        kvcheck_target,
        spec,
        data,
        device=kvcheck_device,
        write_kinds=supported_op_kinds(kvcheck_target, family),
        steer=steered_tags(kvcheck_target),
    )
    check_host_layouts_refused(kvcheck_target, spec, device=kvcheck_device)
