"""Pool specs a target can serve: drawing inside its surface instead of filtering.

A target declares what it builds as a :class:`kvcheck.surface.Surface`: the variants it
takes beyond the baseline, and the values it accepts for other fields (sglang 0.5.23's DSA
pool takes only 64-token index pages, ``page_size // index_kpool``, and 128-byte index
keys). The suite draws its specs with ``pool_specs(..., target=kvcheck_target)``
(:func:`kvcheck.strategies.pool_specs`), which moves each drawn spec inside the surface
with :func:`within_target_limits` instead of rejecting the ones outside it (a filter would
discard nearly every DSA spec).

A strategy given a ``target`` also says which target it serves, so that the pytest plugin
keys a test's stored examples by the target the test really uses (not the one the run was
started with): :func:`targets_of` finds the targets in a test's strategies before it runs,
and :func:`noting_targets` collects those a test hands a strategy or a machine while it runs.

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

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.declaration import surface_refusal
from kvcheck.specs import FP4_DTYPE, NVFP4_LAYOUTS, PoolSpec
from kvcheck.surface import LIMIT_NAMES, surface_of
from kvcheck.validation import check_type
from kvcheck.variants import Variant

__all__ = [
    "PoolSpecLimits",
    "carrying_target",
    "fit_spec",
    "note_target",
    "noting_targets",
    "pool_spec_limits_of",
    "spec_limit_violations",
    "targets_of",
    "unbuilt_variant_reason",
    "within_target_limits",
]

_S = TypeVar("_S", bound=st.SearchStrategy[Any])
#: The attribute a strategy built for a target carries it in (see :func:`carrying_target`).
_TARGET_ATTRIBUTE = "_kvcheck_target"
#: The targets noted while a test runs (None outside :func:`noting_targets`).
_noted: contextvars.ContextVar[list[object] | None] = contextvars.ContextVar(
    "kvcheck_noted_targets", default=None
)

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


def unbuilt_variant_reason(target: object, variant: Variant) -> str | None:
    """Why ``target`` builds no pool of ``variant`` (its surface leaves out the family or
    every value of one of the variant's axes, quoting the surface's note where it has one),
    or None when it builds it.

    Example:
        >>> from types import SimpleNamespace
        >>> from kvcheck.variants import variant_named
        >>> target = SimpleNamespace(name="t")
        >>> unbuilt_variant_reason(target, variant_named("mha:hnd"))
        "target 't' builds no mha:hnd pool (its surface lists no such kv_layout)"
        >>> unbuilt_variant_reason(target, variant_named("mha")) is None
        True
    """
    why = surface_refusal(surface_of(target), variant)
    if why is None:
        return None
    return f"target {getattr(target, 'name', target)!r} builds no {variant.name} pool ({why})"


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
    note_target(target)
    limits = pool_spec_limits_of(target)
    if not limits:
        return specs
    return _fitted(specs, limits)


# --- which target a test uses -----------------------------------------------------------------


def carrying_target(target: object, strategy: _S) -> _S:
    """Mark ``strategy`` (built by this call, never a shared one) as drawing for ``target``,
    and note ``target`` for the running test (:func:`note_target`); returns ``strategy``.

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(name="t")
        >>> fresh = st.integers().map(str)  # Hypothesis caches st.integers() itself
        >>> targets_of(carrying_target(target, fresh)) == [target]
        True
    """
    note_target(target)
    setattr(strategy, _TARGET_ATTRIBUTE, target)
    return strategy


def note_target(target: object) -> None:
    """Record that the running test uses ``target`` (nothing outside :func:`noting_targets`).

    Example:
        >>> with noting_targets() as noted:
        ...     note_target("a target")
        >>> noted
        ['a target']
    """
    noted = _noted.get()
    if noted is not None and not any(target is seen for seen in noted):
        noted.append(target)


@contextlib.contextmanager
def noting_targets() -> Iterator[list[object]]:
    """Collect, in the yielded list, the targets noted inside the block (strategies and
    machines built for a target while a test runs), in the order first noted.

    Example:
        >>> with noting_targets() as noted:
        ...     _ = within_target_limits(object(), st.nothing())
        >>> len(noted)
        1
    """
    noted: list[object] = []
    token = _noted.set(noted)
    try:
        yield noted
    finally:
        _noted.reset(token)


def targets_of(*strategies: object) -> list[object]:
    """The targets that ``strategies`` (a test's ``@given`` arguments, say) draw for: those
    built with ``target=`` anywhere inside them, and target objects they draw as values
    (``st.just(target)``), in the order found, each once.

    The walk goes through Hypothesis's wrappers (lazy, mapped, filtered, tuples, one-of,
    ``st.just``); what a composite strategy builds inside its function is out of its reach
    (:func:`noting_targets` sees that when it runs).

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(name="t", make_pool=print, unsupported={})
        >>> found = targets_of(st.tuples(st.integers(), st.just(target)))
        >>> found == [target]
        True
    """
    found: list[object] = []
    seen: set[int] = set()
    pending: list[object] = list(strategies)
    while pending:
        obj = pending.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (tuple, list, frozenset, set)):
            pending.extend(obj)
        elif isinstance(obj, dict):
            pending.extend(obj.values())
        elif isinstance(obj, st.SearchStrategy):
            carried = getattr(obj, _TARGET_ATTRIBUTE, None)
            if carried is not None:
                _add_once(found, carried)
            pending.extend(_parts(obj))
        elif _looks_like_target(obj):
            _add_once(found, obj)
    return found


def _parts(strategy: st.SearchStrategy[Any]) -> list[object]:
    """What a strategy is built from: its attributes, and a lazy one's strategy."""
    parts: list[object] = list(vars(strategy).values())
    if hasattr(type(strategy), "wrapped_strategy"):  # lazy and deferred strategies
        # A strategy with bad arguments raises here: Hypothesis reports it when the test runs.
        with contextlib.suppress(Exception):
            parts.append(strategy.wrapped_strategy)  # type: ignore[attr-defined]
    return parts


def _looks_like_target(obj: object) -> bool:
    return (
        not isinstance(obj, type)
        and isinstance(getattr(obj, "name", None), str)
        and callable(getattr(obj, "make_pool", None))
        and isinstance(getattr(obj, "unsupported", None), Mapping)
    )


def _add_once(found: list[object], target: object) -> None:
    if not any(target is seen for seen in found):
        found.append(target)
