"""Pool specs a target can serve: drawing inside its surface instead of filtering.

A target declares what it builds as a :class:`kvcheck.surface.Surface`: the variants it
takes beyond the baseline, and the values it accepts for other fields (sglang 0.5.23's DSA
pool takes only 64-token index pages, ``page_size // index_kpool``, and 128-byte index
keys). The suite draws its specs with ``pool_specs(..., target=kvcheck_target)``
(:func:`kvcheck.strategies.pool_specs`), which moves each drawn spec inside the surface
with :func:`within_target_limits` instead of rejecting the ones outside it (a filter would
discard nearly every DSA spec).

Example:
    >>> from types import SimpleNamespace
    >>> from hypothesis import find
    >>> from kvcheck.strategies import pool_specs
    >>> from kvcheck.surface import Surface
    >>> target = SimpleNamespace(name="t", surface=Surface.of(dsa={"page_size": (64,)}))
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

from kvcheck.specs import FP4_DTYPE, NVFP4_LAYOUTS, PoolSpec
from kvcheck.surface import LIMIT_NAMES, surface_of
from kvcheck.validation import check_type

__all__ = [
    "PoolSpecLimits",
    "fit_spec",
    "pool_spec_limits_of",
    "spec_limit_violations",
    "within_target_limits",
]

#: family -> PoolSpec field -> accepted values.
PoolSpecLimits = Mapping[str, Mapping[str, tuple[Any, ...]]]


def pool_spec_limits_of(target: object) -> PoolSpecLimits:
    """Per family, the fields ``target``'s surface (:func:`kvcheck.surface.surface_of`)
    narrows below what kvcheck draws: the variants it does not take and the values it
    accepts for other fields. A malformed declaration raises ``InvalidArgument`` naming the
    target.

    Example:
        >>> pool_spec_limits_of(object())["dsa"]
        {'latent_layout': ('raw',), 'index_kpool': (1,), 'dcp_size': (1,)}
    """
    try:
        return surface_of(target).limits()
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc


def spec_limit_violations(target: object, spec: PoolSpec) -> list[str]:
    """Fields of ``spec`` outside the target's limits, as ``"page_size=4 not in (64,)"``.

    Example:
        >>> from types import SimpleNamespace
        >>> from kvcheck.surface import Surface
        >>> target = SimpleNamespace(surface=Surface.of(dsa={"page_size": (64,)}))
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
    of 1 drops the compress-tail fields; ``kv_quant="none"`` drops the FP4 dtype (for
    bfloat16) and the NVFP4 layout; a new ``dcp_size`` keeps the rank inside it (rank
    modulo width).

    Example:
        >>> spec = PoolSpec(family="dsa", size=8, page_size=4, layer_num=1, dtype="bfloat16",
        ...                 index_buf_size=12)
        >>> fitted = fit_spec(spec, page_size=64)
        >>> fitted.size, fitted.index_buf_size
        (128, 192)
    """
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec", error=ValueError)
    unknown = sorted(set(values) - LIMIT_NAMES)
    if unknown:
        raise ValueError(f"values: {unknown} are not PoolSpec fields")
    changes = dict(values)
    if changes.get("kv_quant", spec.kv_quant) == "none" and spec.kv_quant != "none":
        # Back to an unquantized pool: the FP4 dtype and NVFP4 layouts go with the variant.
        changes.setdefault("dtype", "bfloat16" if spec.dtype == FP4_DTYPE else spec.dtype)
        changes["nvfp4_layout"] = NVFP4_LAYOUTS[0]
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
        # A quantized variant the target does not build becomes its unquantized pool
        # (another variant would need other shapes).
        else "none"
        if name == "kv_quant"
        else draw(st.sampled_from(allowed), label=f"{spec.family} {name} the target accepts")
        for name, allowed in fields.items()
    }
    return fit_spec(spec, **values)


def within_target_limits(
    target: object, specs: st.SearchStrategy[PoolSpec]
) -> st.SearchStrategy[PoolSpec]:
    """``specs`` with every drawn spec moved inside the target's surface
    (:func:`pool_spec_limits_of`: the variants and values it declares).

    A spec whose family has limits keeps the fields already inside them; each field
    outside is redrawn from the accepted values (``page_size`` through :func:`fit_spec`,
    so capacities stay whole pages and keep their number of pages). Nothing is filtered,
    and a target without limits (one declaring every variant) gets ``specs`` itself.

    A malformed surface raises ``InvalidArgument`` naming the target. Shrinks as ``specs``
    does, with each redrawn field towards its first accepted value.

    Example:
        >>> from types import SimpleNamespace
        >>> from hypothesis import find
        >>> from kvcheck.surface import Surface
        >>> target = SimpleNamespace(name="t", surface=Surface.of(mha={"head_num": (4, 8)}))
        >>> specs = st.builds(PoolSpec, family=st.just("mha"), size=st.just(2),
        ...                   page_size=st.just(1), layer_num=st.just(1), dtype=st.just("float16"))
        >>> find(within_target_limits(target, specs), lambda spec: True).head_num
        4
    """
    check_type(st.SearchStrategy, specs, "specs", what="a Hypothesis strategy of PoolSpec")
    limits = pool_spec_limits_of(target)
    if not limits:
        return specs
    return _fitted(specs, limits)
