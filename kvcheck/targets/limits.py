"""Pool specs a target can serve: drawing inside ``pool_spec_limits`` instead of filtering.

Some implementations assert a layout: sglang 0.5.23's DSA pool takes only 64-token pages
and 128-byte index keys. Such a target declares ``pool_spec_limits`` (pool family ->
:class:`~kvcheck.specs.PoolSpec` field -> the values it accepts), and the suite draws its
specs with :func:`target_pool_specs`, which moves each drawn spec into the limits instead
of rejecting the ones outside them (a filter would discard nearly every DSA spec).

Example::

    from hypothesis import given, strategies as st
    from kvcheck.targets.limits import target_pool_specs

    @given(data=st.data())
    def test_builds(kvcheck_target, kvcheck_device, data):
        spec = data.draw(target_pool_specs(kvcheck_target, families=("dsa",)), label="spec")
        kvcheck_target.make_pool(spec, device=kvcheck_device)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st

from kvcheck.specs import POOL_FAMILIES, PoolSpec

__all__ = [
    "PoolSpecLimits",
    "fit_spec",
    "pool_spec_limit_problems",
    "pool_spec_limits_of",
    "spec_limit_violations",
    "target_pool_specs",
    "within_target_limits",
]

#: family -> PoolSpec field -> accepted values.
PoolSpecLimits = Mapping[str, Mapping[str, tuple[Any, ...]]]

_SPEC_FIELDS = frozenset(field.name for field in dataclasses.fields(PoolSpec)) - {"family"}


def pool_spec_limit_problems(limits: object) -> list[str]:
    """What is wrong with ``limits`` as a ``pool_spec_limits`` declaration (empty if fine).

    Example:
        >>> pool_spec_limit_problems({"dsa": {"page_size": (64,)}})
        []
        >>> pool_spec_limit_problems({"dsa": {"page": (64,)}})[0]
        "pool_spec_limits['dsa']: 'page' is not a PoolSpec field"
    """
    if not isinstance(limits, Mapping):
        return [f"pool_spec_limits: {limits!r} (expected a mapping family -> field -> values)"]
    problems: list[str] = []
    for family, fields in limits.items():
        where = f"pool_spec_limits[{family!r}]"
        if family not in POOL_FAMILIES:
            problems.append(f"{where}: family not in {POOL_FAMILIES}")
        if not isinstance(fields, Mapping):
            problems.append(f"{where}: {fields!r} (expected a mapping field -> values)")
            continue
        for name, values in fields.items():
            if name not in _SPEC_FIELDS:
                problems.append(f"{where}: {name!r} is not a PoolSpec field")
            elif not isinstance(values, tuple) or not values:
                problems.append(f"{where}[{name!r}]: {values!r} (expected a non-empty tuple)")
    return problems


def pool_spec_limits_of(target: object) -> PoolSpecLimits:
    """The target's ``pool_spec_limits``, or an empty mapping when it declares none.

    Example:
        >>> pool_spec_limits_of(object())
        {}
    """
    return getattr(target, "pool_spec_limits", None) or {}


def spec_limit_violations(target: object, spec: PoolSpec) -> list[str]:
    """Fields of ``spec`` outside the target's limits, as ``"page_size=4 not in (64,)"``.

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(pool_spec_limits={"dsa": {"page_size": (64,)}})
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1, dtype="bfloat16")
        >>> spec_limit_violations(target, spec)
        ['page_size=4 not in (64,)']
    """
    if not isinstance(spec, PoolSpec):
        raise ValueError(f"spec={spec!r} is not a kvcheck.specs.PoolSpec")
    fields = pool_spec_limits_of(target).get(spec.family, {})
    return [
        f"{name}={getattr(spec, name)!r} not in {values!r}"
        for name, values in fields.items()
        if getattr(spec, name) not in values
    ]


def fit_spec(spec: PoolSpec, **values: Any) -> PoolSpec:
    """``spec`` with ``values`` replaced, keeping what depends on them consistent.

    A new ``page_size`` keeps the number of pages: ``size`` becomes ``pages * page_size``
    and an ``index_buf_size`` keeps its extra pages beyond ``size``.

    Example:
        >>> spec = PoolSpec(family="dsa", size=8, page_size=4, layer_num=1, dtype="bfloat16",
        ...                 index_buf_size=12)
        >>> fitted = fit_spec(spec, page_size=64)
        >>> fitted.size, fitted.index_buf_size
        (128, 192)
    """
    if not isinstance(spec, PoolSpec):
        raise ValueError(f"spec={spec!r} is not a kvcheck.specs.PoolSpec")
    unknown = sorted(set(values) - _SPEC_FIELDS)
    if unknown:
        raise ValueError(f"values: {unknown} are not PoolSpec fields")
    changes = dict(values)
    page_size = changes.get("page_size", spec.page_size)
    if page_size != spec.page_size:
        pages = max(1, spec.size // spec.page_size)
        changes.setdefault("size", pages * page_size)
        if spec.index_buf_size is not None and "index_buf_size" not in changes:
            extra_pages = max(0, spec.index_buf_size - spec.size) // spec.page_size
            changes["index_buf_size"] = changes["size"] + extra_pages * page_size
    return dataclasses.replace(spec, **changes)


@st.composite
def _fitted(
    draw: Callable[..., Any], base: st.SearchStrategy[PoolSpec], limits: PoolSpecLimits
) -> PoolSpec:
    spec = draw(base)
    fields = limits.get(spec.family, {})
    if not fields:
        return spec
    values = {
        name: getattr(spec, name)
        if getattr(spec, name) in allowed
        else draw(st.sampled_from(allowed), label=f"{spec.family} {name} the target accepts")
        for name, allowed in fields.items()
    }
    return fit_spec(spec, **values)


def within_target_limits(
    target: object, specs: st.SearchStrategy[PoolSpec]
) -> st.SearchStrategy[PoolSpec]:
    """``specs`` with every drawn spec moved inside the target's ``pool_spec_limits``.

    A spec whose family has limits keeps the fields already inside them; each field
    outside is redrawn from the accepted values (``page_size`` through :func:`fit_spec`,
    so capacities stay whole pages and keep their number of pages). Nothing is filtered,
    and a target without limits gets ``specs`` itself.

    Example::

        @given(data=st.data())
        def test_builds(kvcheck_target, kvcheck_device, data):
            specs = within_target_limits(kvcheck_target, pool_specs(families=("dsa",)))
            spec = data.draw(specs, label="spec")
            kvcheck_target.make_pool(spec, device=kvcheck_device)
    """
    if not isinstance(specs, st.SearchStrategy):
        raise ValueError(f"specs={specs!r} must be a Hypothesis strategy of PoolSpec")
    limits = pool_spec_limits_of(target)
    problems = pool_spec_limit_problems(limits)
    if problems:
        raise ValueError(f"target {getattr(target, 'name', target)!r}: {'; '.join(problems)}")
    if not limits:
        return specs
    return _fitted(specs, limits)


def target_pool_specs(target: object, **pool_specs_options: Any) -> st.SearchStrategy[PoolSpec]:
    """:func:`kvcheck.strategies.pool_specs` inside the target's ``pool_spec_limits``.

    ``pool_specs_options`` go to ``pool_specs`` unchanged; see :func:`within_target_limits`
    for how limits apply (they win over ``max_size`` and ``max_page_size``).

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(name="t", pool_spec_limits={"dsa": {"page_size": (64,)}})
        >>> spec = target_pool_specs(target, families=("dsa",)).example()  # doctest: +SKIP
        >>> spec.page_size, spec.size % 64                                  # doctest: +SKIP
        (64, 0)
    """
    from kvcheck.strategies import pool_specs

    return within_target_limits(target, pool_specs(**pool_specs_options))
