"""Host tiers of quantized pools as drawn (kvcheck.strategies.host_pool_specs): the variants
asked for, inside what a target declares of each variant's host tier."""

from __future__ import annotations

from hypothesis import find, given, settings
from hypothesis import strategies as st

from kvcheck.declaration import Builds, Declaration, Key, Refuses, Row, declaration_of
from kvcheck.steering import Steer
from kvcheck.strategies.tier_specs import host_pool_specs
from kvcheck.targets import resolve_target
from kvcheck.targets.builtin import KVCheckTarget

QUICK = settings(max_examples=40, database=None, deadline=None)


class _NarrowHostTarget(KVCheckTarget):
    """kvcheck's target, declaring MXFP8 host tiers in page_first only, symmetric only, and
    none for flat MXFP8 (what the sglang target declares)."""

    name = "narrow-host"
    declaration = Declaration(
        rows=(
            Row(Key.tier("host", "mha:mxfp8"), Builds("page_first only", only=("page_first",))),
            Row(Key.tier("host", "mha:mxfp8:asymmetric"), Refuses("no asymmetric MXFP8 tier")),
            Row(Key.tier("host", "mha:mxfp8:flat"), Refuses("no flat MXFP8 host tier")),
        )
    )


@QUICK
@given(st.data())
def test_quantized_host_specs_draw_the_variants_asked_for(data: st.DataObject) -> None:
    """``kv_quants`` reaches the device pools: every drawn pool is of one of them."""
    spec = data.draw(host_pool_specs(families=("mha",), kv_quants=("fp4_mx_block16", "nvfp4")))
    assert spec.device.kv_quant in ("fp4_mx_block16", "nvfp4")


@QUICK
@given(st.data())
def test_a_target_narrows_a_variants_host_layouts(data: st.DataObject) -> None:
    """A variant's declared layouts bound the draw; a variant it builds no host tier for
    (flat MXFP8) is never drawn, and asymmetric MXFP8 pools come back symmetric."""
    target = _NarrowHostTarget()
    spec = data.draw(host_pool_specs(families=("mha",), kv_quants=("mxfp8",), target=target))
    assert spec.device.variant == "mha:mxfp8"
    assert spec.layout == "page_first"
    assert spec.device.effective_v_head_dim == spec.device.head_dim


def test_the_builtin_target_narrows_nothing() -> None:
    """kvcheck's own target keeps every quantized variant's host tier in every layout."""
    assert not declaration_of(resolve_target("kvcheck")).host_variant_layouts()


@QUICK
@given(st.data())
def test_steered_dsa_host_tiers_keep_index_keys_on_every_layer(data: st.DataObject) -> None:
    """Under ``host:indexer_skip_layers`` a DSA host tier's device pool has no skip-topk
    layer."""
    steer = {Steer("host:indexer_skip_layers", "dsa")}
    spec = data.draw(host_pool_specs(families=("dsa",), steer=steer))
    assert not any(spec.device.skip_topk_layers)


def test_unsteered_dsa_host_tiers_have_skip_layers() -> None:
    """Without the steer, the host tier's DSA device pools do skip top-k on some layer (the
    steer is what takes them away)."""
    spec = find(
        host_pool_specs(families=("dsa",)),
        lambda spec: any(spec.device.skip_topk_layers),
        settings=settings(database=None),
    )
    assert spec.device.skip_topk_layers.count(False) >= 1
