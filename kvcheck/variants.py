"""Every pool variant kvcheck models, generated from the variant axes (never listed by hand).

A *variant* is what :attr:`kvcheck.specs.PoolSpec.variant` names: a family, with the axis
values that make its pools hold or move bytes differently (``"mha:mxfp8:flat"``,
``"dsa:scaled:kpool"``). :data:`VARIANTS` builds one small spec for every combination of
the values :data:`kvcheck.specs.AXES` gives a family (at a page size that takes MXFP8's
interleaved scales and at one that does not), keeps the combinations ``PoolSpec`` accepts
and groups them by the name they get. So a new axis value (a new quantized KV dtype, a new
layout) becomes a variant here, and the suite's per-variant runs, the machines' steering
and the findings' variant patterns follow without another list to edit.

Example:
    >>> [variant.name for variant in variants_of("mla")]
    ['mla', 'mla:fp4', 'mla:dcp']
    >>> variant_named("dsa:kpool").axis_values["index_kpool"]
    (2, 4)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvcheck.specs import (
    AXES,
    DTYPE_ITEMSIZE,
    FP4_DTYPE,
    MXFP8_INTERLEAVED_PAGE,
    POOL_FAMILIES,
    PoolSpec,
)

__all__ = [
    "VARIANTS",
    "Variant",
    "variant_for",
    "variant_named",
    "variant_names",
    "variants_of",
]


@dataclass(frozen=True)
class Variant:
    """One pool variant: its name, its family and, per axis of the family, the values
    whose pools bear this name (the baseline value alone for an axis it does not vary),
    and the dtypes those pools take."""

    name: str
    family: str
    axis_values: Mapping[str, tuple[Any, ...]]
    dtypes: tuple[str, ...]

    @property
    def is_baseline(self) -> bool:
        """Whether this is its family's plain variant (every axis at its baseline)."""
        return self.name == self.family

    @property
    def kv_quant(self) -> str:
        """The variant's quantized KV dtype (``"none"`` for an unquantized variant)."""
        return str(self.axis_values.get("kv_quant", ("none",))[0])

    @property
    def token_major(self) -> bool:
        """Whether its pools keep a row per token slot (MHA's head-major ``hnd`` does not:
        it has no host tier)."""
        return self.axis_values.get("kv_layout", ("nhd",)) == ("nhd",)

    @property
    def test_id(self) -> str:
        """The name as a pytest id part: ``mha-mxfp8-flat``."""
        return self.name.replace(":", "-")

    def takes(self, family_values: Mapping[str, tuple[Any, ...] | None]) -> str | None:
        """The first axis whose values (``family_values``: field -> the values a target
        accepts, ``None`` for any) share none with this variant's, else None.

        Example:
            >>> variant_named("mha:hnd").takes({"kv_layout": ("nhd",)})
            'kv_layout'
            >>> variant_named("mha:hnd").takes({"kv_layout": None}) is None
            True
        """
        for field, values in self.axis_values.items():
            accepted = family_values.get(field)
            if accepted is not None and not set(accepted) & set(values):
                return field
        return None


#: Shapes every variant's blocks fit: head and latent dims that are multiples of 64 and
#: 128, two whole pages, and a request slot for DSA compress tails.
_PROBE_SHAPE: Mapping[str, Any] = MappingProxyType(
    {
        "layer_num": 1,
        "head_dim": 64,
        "kv_lora_rank": 128,
        "qk_rope_head_dim": 64,
        "max_running_requests": 1,
    }
)
#: Page sizes that decide a variant by themselves (MXFP8 keeps interleaved scales at 128
#: only), and a small one.
_PROBE_PAGES = (MXFP8_INTERLEAVED_PAGE, 4)
_PROBE_DTYPES = (*DTYPE_ITEMSIZE, FP4_DTYPE)


def _generate() -> tuple[Variant, ...]:
    found: dict[str, dict[str, Any]] = {}
    for family in POOL_FAMILIES:
        axes = [axis for axis in AXES if family in axis.families]
        for combo in itertools.product(*(axis.values_for(family) for axis in axes)):
            values = dict(zip((axis.field for axis in axes), combo, strict=True))
            for page, dtype in itertools.product(_PROBE_PAGES, _PROBE_DTYPES):
                try:
                    spec = PoolSpec(
                        family=family,  # type: ignore[arg-type]
                        size=2 * page,
                        page_size=page,
                        dtype=dtype,
                        **_PROBE_SHAPE,
                        **values,
                    )
                except ValueError:
                    continue
                entry = found.setdefault(
                    spec.variant, {"family": family, "axes": {a.field: [] for a in axes}}
                )
                entry.setdefault("dtypes", []).append(dtype)
                for field, value in values.items():
                    if value not in entry["axes"][field]:
                        entry["axes"][field].append(value)
    return tuple(
        Variant(
            name,
            entry["family"],
            MappingProxyType({field: tuple(vals) for field, vals in entry["axes"].items()}),
            tuple(dict.fromkeys(entry["dtypes"])),
        )
        for name, entry in found.items()
    )


#: Every variant, family by family (:data:`kvcheck.specs.POOL_FAMILIES` order), each
#: family's baseline first.
VARIANTS: tuple[Variant, ...] = _generate()
_BY_NAME = {variant.name: variant for variant in VARIANTS}


def variant_names() -> tuple[str, ...]:
    """Every variant's name.

    Example:
        >>> variant_names()[:3]
        ('mha', 'mha:fp8_scaled', 'mha:cpu_fp8')
    """
    return tuple(_BY_NAME)


def variants_of(family: str) -> tuple[Variant, ...]:
    """The variants of ``family`` (a :data:`kvcheck.specs.POOL_FAMILIES` value), baseline
    first.

    Example:
        >>> [variant.name for variant in variants_of("noop")]
        ['noop']
    """
    if family not in POOL_FAMILIES:
        raise ValueError(f"family={family!r} not in {POOL_FAMILIES}")
    return tuple(variant for variant in VARIANTS if variant.family == family)


def variant_for(family: str, **axis_values: Any) -> Variant:
    """The first variant of ``family`` whose pools take every one of ``axis_values``
    (field -> value); ``ValueError`` when none does.

    Example:
        >>> variant_for("mla", kv_quant="fp4").name
        'mla:fp4'
    """
    for variant in variants_of(family):
        if all(value in variant.axis_values.get(f, ()) for f, value in axis_values.items()):
            return variant
    raise ValueError(f"no {family} variant takes {axis_values!r}")


def variant_named(name: str) -> Variant:
    """The variant called ``name``; ``ValueError`` listing the variants for any other.

    Example:
        >>> variant_named("mla:fp4").kv_quant
        'fp4'
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"variant {name!r} is not one of {', '.join(_BY_NAME)}") from None
