"""Pool specs a target can serve: drawing inside ``pool_spec_limits`` instead of filtering.

Some implementations assert a layout: sglang 0.5.23's DSA pool takes only 64-token index
pages (``page_size // index_kpool``) and 128-byte index keys. Such a target declares
``pool_spec_limits`` (pool family -> :class:`~kvcheck.specs.PoolSpec` field, or
``index_page_size`` -> the values it accepts), and the suite draws its
specs with ``pool_specs(..., target=kvcheck_target)`` (:func:`kvcheck.strategies.pool_specs`),
which moves each drawn spec into the limits with :func:`within_target_limits` instead of
rejecting the ones outside them (a filter would discard nearly every DSA spec). Targets
check their declaration with :func:`pool_spec_limit_problems`.

Example:
    >>> from types import SimpleNamespace
    >>> from hypothesis import find
    >>> from kvcheck.strategies import pool_specs
    >>> target = SimpleNamespace(name="t", pool_spec_limits={"dsa": {"page_size": (64,)}})
    >>> spec = find(pool_specs(families=("dsa",), target=target), lambda s: s.size > 64)
    >>> spec.page_size, spec.size
    (64, 128)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.specs import (
    DCP_SIZES,
    INDEX_KPOOLS,
    KV_LAYOUTS,
    LATENT_LAYOUTS,
    POOL_FAMILIES,
    PoolSpec,
)
from kvcheck.validation import check_type

__all__ = [
    "LAYOUT_DECLARATIONS",
    "NUMBER_DECLARATIONS",
    "PoolSpecLimits",
    "fit_spec",
    "layouts_problem",
    "numbers_problem",
    "pool_spec_limit_problems",
    "pool_spec_limits_of",
    "spec_limit_violations",
    "within_target_limits",
]

#: family -> PoolSpec field -> accepted values.
PoolSpecLimits = Mapping[str, Mapping[str, tuple[Any, ...]]]

_SPEC_FIELDS = frozenset(field.name for field in dataclasses.fields(PoolSpec)) - {"family"}
#: What a limit may name: a field, or ``index_page_size`` (``page_size // index_kpool``,
#: the token count of one DSA index page, which SGLang's kernels fix at 64).
_LIMIT_NAMES = _SPEC_FIELDS | {"index_page_size"}


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
            if name not in _LIMIT_NAMES:
                problems.append(f"{where}: {name!r} is not a PoolSpec field")
            elif not isinstance(values, tuple) or not values:
                problems.append(f"{where}[{name!r}]: {values!r} (expected a non-empty tuple)")
    return problems


#: Target attribute declaring the buffer layouts it builds -> (pool family, PoolSpec
#: field, every layout; the first is the default every target builds).
LAYOUT_DECLARATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kv_layouts": ("mha", "kv_layout", KV_LAYOUTS),
    "latent_layouts": ("dsa", "latent_layout", LATENT_LAYOUTS),
}
#: Target attribute declaring the DSA index kpools it builds (default ``(1,)``: kpool 1
#: only, so a target written before kpools existed is never handed one).
KPOOL_DECLARATION = "index_kpools"
#: Target attribute declaring the decode-context-parallel widths its MLA and DSA pools
#: take (default ``(1,)``: a target written before DCP existed is never handed one).
DCP_DECLARATION = "dcp_sizes"
#: Target attribute declaring numbers it builds -> (pool families, PoolSpec field, every
#: value; 1, the default every target builds, is always among them).
NUMBER_DECLARATIONS: dict[str, tuple[tuple[str, ...], str, tuple[int, ...]]] = {
    KPOOL_DECLARATION: (("dsa",), "index_kpool", INDEX_KPOOLS),
    DCP_DECLARATION: (("mla", "dsa"), "dcp_size", DCP_SIZES),
}


def pool_spec_limits_of(target: object) -> PoolSpecLimits:
    """The target's ``pool_spec_limits`` (empty when it declares none), plus the MHA
    and DSA layouts it builds: a layout beyond token-major NHD is opt-in, through the
    target's ``kv_layouts`` (default ``("nhd",)``), and one beyond the raw DSA latent row
    through its ``latent_layouts`` (default ``("raw",)``), and a DSA index kpool above 1
    through its ``index_kpools`` (default ``(1,)``), and a decode-context-parallel width
    above 1 for MLA and DSA through its ``dcp_sizes`` (default ``(1,)``), so a target
    written before a layout existed is never handed one it would silently build as another.

    Example:
        >>> from types import SimpleNamespace
        >>> pool_spec_limits_of(object())["dsa"]
        {'latent_layout': ('raw',), 'index_kpool': (1,), 'dcp_size': (1,)}
        >>> pool_spec_limits_of(SimpleNamespace(kv_layouts=("nhd", "hnd"),
        ...                                     latent_layouts=("raw", "scaled"),
        ...                                     index_kpools=(1, 2, 4), dcp_sizes=(1, 2, 4)))
        {}
    """
    declared = getattr(target, "pool_spec_limits", None) or {}
    merged = {family: dict(fields) for family, fields in declared.items()}
    for attribute, (family, field, every) in LAYOUT_DECLARATIONS.items():
        layouts = getattr(target, attribute, None) or every[:1]
        problem = layouts_problem(attribute, layouts)
        if problem:
            raise InvalidArgument(f"target {getattr(target, 'name', target)!r}: {problem}")
        if set(layouts) != set(every):
            merged.setdefault(family, {}).setdefault(field, layouts)
    for attribute, (families, field, every_number) in NUMBER_DECLARATIONS.items():
        numbers = getattr(target, attribute, None) or (1,)
        problem = numbers_problem(attribute, numbers)
        if problem:
            raise InvalidArgument(f"target {getattr(target, 'name', target)!r}: {problem}")
        if set(numbers) != set(every_number):
            for family in families:
                merged.setdefault(family, {}).setdefault(field, numbers)
    return merged


def layouts_problem(attribute: str, layouts: object) -> str | None:
    """What is wrong with a target's layout declaration ``attribute`` (a key of
    :data:`LAYOUT_DECLARATIONS`), or None.

    Example:
        >>> layouts_problem("kv_layouts", ("nhd", "hnd")), layouts_problem("kv_layouts", ("hnd",))
        (None, "kv_layouts=('hnd',) must be a tuple with 'nhd', of ('nhd', 'hnd')")
        >>> layouts_problem("latent_layouts", ("scaled",))
        "latent_layouts=('scaled',) must be a tuple with 'raw', of ('raw', 'scaled')"
    """
    every = LAYOUT_DECLARATIONS[attribute][2]
    if not isinstance(layouts, tuple) or every[0] not in layouts or set(layouts) - set(every):
        return f"{attribute}={layouts!r} must be a tuple with {every[0]!r}, of {every}"
    return None


def numbers_problem(attribute: str, numbers: object) -> str | None:
    """What is wrong with a target's declaration ``attribute`` (a key of
    :data:`NUMBER_DECLARATIONS`), or None: a tuple with 1, of the values kvcheck draws.

    Example:
        >>> numbers_problem("dcp_sizes", (1, 8))
        'dcp_sizes=(1, 8) must be a tuple with 1, of (1, 2, 4)'
    """
    every = NUMBER_DECLARATIONS[attribute][2]
    if not isinstance(numbers, tuple) or 1 not in numbers or set(numbers) - set(every):
        return f"{attribute}={numbers!r} must be a tuple with 1, of {every}"
    return None


def spec_limit_violations(target: object, spec: PoolSpec) -> list[str]:
    """Fields of ``spec`` outside the target's limits, as ``"page_size=4 not in (64,)"``.

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(pool_spec_limits={"dsa": {"page_size": (64,)}})
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1, dtype="bfloat16")
        >>> spec_limit_violations(target, spec)
        ['page_size=4 not in (64,)']
    """
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec", error=ValueError)
    fields = pool_spec_limits_of(target).get(spec.family, {})
    return [
        f"{name}={getattr(spec, name)!r} not in {values!r}"
        for name, values in fields.items()
        if getattr(spec, name) not in values
    ]


def fit_spec(spec: PoolSpec, **values: Any) -> PoolSpec:
    """``spec`` with ``values`` replaced, keeping what depends on them consistent.

    A new ``page_size`` keeps the number of pages: ``size`` becomes ``pages * page_size``,
    and an ``index_buf_size`` keeps its extra pages beyond SGLang's default (``size``, or
    ``(size + page_size) * dcp_size - page_size`` under decode context parallel).
    ``index_page_size`` sets ``page_size`` to it times the (new) ``index_kpool``; a kpool
    of 1 drops the compress-tail fields; a new ``dcp_size`` keeps the rank inside it (rank
    modulo width).

    Example:
        >>> spec = PoolSpec(family="dsa", size=8, page_size=4, layer_num=1, dtype="bfloat16",
        ...                 index_buf_size=12)
        >>> fitted = fit_spec(spec, page_size=64)
        >>> fitted.size, fitted.index_buf_size
        (128, 192)
    """
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec", error=ValueError)
    unknown = sorted(set(values) - _LIMIT_NAMES)
    if unknown:
        raise ValueError(f"values: {unknown} are not PoolSpec fields")
    changes = dict(values)
    kpool = changes.get("index_kpool", spec.index_kpool)
    if kpool == 1:
        changes.update(index_kpool_compress=False, max_running_requests=None, tail_extra_slots=0)
    if "dcp_size" in changes and "dcp_rank" not in changes:
        changes["dcp_rank"] = spec.dcp_rank % changes["dcp_size"]
    index_page_size = changes.pop("index_page_size", None)
    page_size = changes.get("page_size", spec.page_size)
    if index_page_size is not None:
        page_size = index_page_size * kpool
    elif page_size % kpool:
        page_size *= kpool  # the (new) page must hold whole groups of kpool tokens
    changes["page_size"] = page_size
    if page_size != spec.page_size:
        pages = max(1, spec.size // spec.page_size)
        changes.setdefault("size", pages * page_size)
    if spec.index_buf_size is not None and "index_buf_size" not in changes:
        # Keep the extra pages beyond SGLang's default (effective_index_buf_size of None).
        default = dataclasses.replace(spec, index_buf_size=None).effective_index_buf_size
        extra_pages = max(0, spec.index_buf_size - default) // spec.page_size
        fitted = dataclasses.replace(spec, index_buf_size=None, **changes)
        changes["index_buf_size"] = fitted.effective_index_buf_size + extra_pages * page_size
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
    """``specs`` with every drawn spec moved inside the target's limits
    (:func:`pool_spec_limits_of`: its ``pool_spec_limits`` and the MHA layouts it builds).

    A spec whose family has limits keeps the fields already inside them; each field
    outside is redrawn from the accepted values (``page_size`` through :func:`fit_spec`,
    so capacities stay whole pages and keep their number of pages). Nothing is filtered,
    and a target without limits (one declaring every layout) gets ``specs`` itself.

    Malformed limits raise ``InvalidArgument`` naming the target. Shrinks as ``specs``
    does, with each redrawn field towards its first accepted value.

    Example:
        >>> from types import SimpleNamespace
        >>> from hypothesis import find
        >>> target = SimpleNamespace(name="t", pool_spec_limits={"mha": {"head_num": (4, 8)}})
        >>> specs = st.builds(PoolSpec, family=st.just("mha"), size=st.just(2),
        ...                   page_size=st.just(1), layer_num=st.just(1), dtype=st.just("float16"))
        >>> find(within_target_limits(target, specs), lambda spec: True).head_num
        4
    """
    check_type(st.SearchStrategy, specs, "specs", what="a Hypothesis strategy of PoolSpec")
    limits = pool_spec_limits_of(target)
    problems = pool_spec_limit_problems(limits)
    if problems:
        name = getattr(target, "name", target)
        raise InvalidArgument(f"target {name!r}: {'; '.join(problems)}")
    if not limits:
        return specs
    return _fitted(specs, limits)
