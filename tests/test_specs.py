"""Which PoolSpec fields describe a pool (kvcheck.specs.SPEC_FIELDS): a report shows those
of its family and variant only, and its repr still rebuilds the spec."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis.vendor.pretty import pretty

from kvcheck.specs import SPEC_FIELDS, PoolSpec
from kvcheck.strategies import pool_specs
from kvcheck.variants import variant_names

#: A spec of each variant, every other field at its default.
_VARIANT_SPECS = {
    "mha": PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16"),
    "mha:hnd": PoolSpec(
        family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16", kv_layout="hnd"
    ),
    "noop": PoolSpec(family="noop", size=4, page_size=2, layer_num=1, dtype="bfloat16"),
    "mla": PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16"),
    "mla:dcp": PoolSpec(
        family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16", dcp_size=2
    ),
    "dsa:scaled:kpool:dcp": PoolSpec(
        family="dsa",
        size=4,
        page_size=2,
        layer_num=1,
        dtype="float8_e4m3fn",
        kv_lora_rank=128,
        latent_layout="scaled",
        index_kpool=2,
        dcp_size=2,
    ),
}
_LATENT = {"kv_lora_rank", "qk_rope_head_dim"}
_DSA = {"index_head_dim", "skip_topk_layers", "index_buf_size", "latent_layout"}
_KPOOL = {"index_kpool", "index_kpool_compress", "tail_extra_slots", "max_running_requests"}
_DCP = {"dcp_size", "dcp_rank"}


def test_every_field_has_a_row() -> None:
    """Each PoolSpec field is in a SPEC_FIELDS row (a field in none would never be shown),
    and each row names fields that exist; every variant part with a row is a real one."""
    names = {field.name for field in dataclasses.fields(PoolSpec)}
    listed = {name for row in SPEC_FIELDS.values() for name in row}
    assert listed == names
    parts = {part for variant in variant_names() for part in variant.split(":")}
    assert set(SPEC_FIELDS) - {""} <= parts


@pytest.mark.parametrize("variant", sorted(_VARIANT_SPECS))
def test_a_spec_shows_the_fields_of_its_family_and_variant(variant: str) -> None:
    """An MHA spec shows no latent, DSA, kpool or DCP field; a kpool or DCP field shows only
    on its variant; and the repr and Hypothesis's pretty printing show the same fields."""
    spec = _VARIANT_SPECS[variant]
    assert spec.variant == variant
    shown = set(spec.described_fields())
    family = variant.split(":")[0]
    assert set(SPEC_FIELDS[""]) <= shown
    assert (shown & _LATENT != set()) == (family in ("mla", "dsa"))
    assert (shown & _DSA != set()) == (family == "dsa")
    assert (shown & _KPOOL != set()) == ("kpool" in variant)
    assert (shown & _DCP != set()) == ("dcp" in variant)
    assert ("head_num" in shown) == (family in ("mha", "noop"))
    hidden = {field.name for field in dataclasses.fields(PoolSpec)} - shown
    for text in (repr(spec), pretty(spec)):
        assert all(f"{name}=" in text for name in shown)
        assert not any(f" {name}=" in text or f"({name}=" in text for name in hidden)


def test_a_field_that_does_not_apply_is_shown_when_it_is_set() -> None:
    """A field outside the family's rows is shown when it differs from its default, so the
    repr never hides a value."""
    spec = PoolSpec(
        family="mha", size=4, page_size=2, layer_num=1, dtype="float16", kv_lora_rank=32
    )
    assert "kv_lora_rank=32" in repr(spec)
    assert "qk_rope_head_dim" not in repr(spec)


@settings(max_examples=30, deadline=None)
@given(pool_specs())
def test_the_repr_rebuilds_the_spec(spec: PoolSpec) -> None:
    """eval(repr(spec)) == spec for any drawn spec."""
    assert eval(repr(spec), {"PoolSpec": PoolSpec}) == spec
