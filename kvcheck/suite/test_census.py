"""The state census on every pool variant the target builds: no model of the pool's class.

Each variant's pool (:data:`kvcheck.variants.VARIANTS`, built through the target's own
``make_pool``) gets a census (:func:`kvcheck.census.take_census`) that must classify every
tensor it holds, and the census properties (:mod:`kvcheck.properties.census`): accounting,
host copies and moves of Hypothesis-drawn whole pages, transfer descriptions, what PD
registers (the target's ``pd_registration``) and reset.
A failure that a declared finding of the target already describes (same check, call,
kind and family) is reported as that finding's expected failure; any other fails.

The hybrid pools the target builds (the sliding-window hybrid of each sub-pool family,
``make_swa_pool``; the linear-attention hybrid's KV pool and its req-to-token pool, which
owns the mamba state, ``make_linear_hybrid``) get the census too: every tensor classified,
sub-pools included, accounting, transfer descriptions and PD's registration covering
them. Their host copies and moves are left to their machines: which rows a window layer's
token lands on, or which mamba slot a request holds, needs a model of the translation.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from kvcheck.census import KNOWN_ROLES, Census, IndexSpace, take_census
from kvcheck.failures import FailureSignature, PropertyFailure
from kvcheck.linear_hybrid_machine import linear_hybrid_skip_reason, small_linear_hybrid_spec
from kvcheck.machines import variant_machine_specs
from kvcheck.properties.census import (
    assert_accounting_covers_census,
    assert_clear_resets_census,
    assert_descriptions_cover_census,
    assert_hicache_assembly_whole,
    assert_host_copy_restores_census,
    assert_move_carries_census,
    assert_registration_covers_census,
    description_methods,
)
from kvcheck.specs import SWA_FAMILIES, LinearHybridSpec, PoolSpec, SWAPoolSpec
from kvcheck.strategies.limits import unbuilt_variant_reason, within_target_limits
from kvcheck.swa_machine import swa_skip_reason
from kvcheck.targets.findings import Finding, declared_findings, matching_finding
from kvcheck.variants import VARIANTS, Variant, variant_named

#: Pages every census pool has: the padding page and three a move or copy may use.
_PAGES = 4
#: Request rows of a pool with per-request state (rows 0 .. 2; sglang adds one more).
_REQUEST_ROWS = 3
#: Hypothesis examples per drawn-page property (each one fills, copies and compares).
_EXAMPLES = 3

_VARIANT_PARAMS = [
    pytest.param(v, marks=pytest.mark.kvcheck_needs(f"{v.family}_pool"), id=v.test_id)
    for v in VARIANTS
]


_SPECS: dict[tuple[str, str], PoolSpec] = {}


def census_spec(target: Any, variant: Variant) -> PoolSpec:
    """A small spec of ``variant`` inside the target's surface, with ``_PAGES - 1`` pages
    of capacity and two layers (a DSA pool's second skips its index keys: a zero-row
    buffer the census must call a placeholder)."""
    key = (str(getattr(target, "name", target)), variant.name)
    if key in _SPECS:
        return _SPECS[key]
    specs = within_target_limits(target, variant_machine_specs(variant))
    try:
        # A pool with per-request state (DSA compress tails) where the variant allows one:
        # its request copies carry a request row.
        spec = find(specs, lambda s: s.compress_tails, settings=settings(database=None))
        spec = dataclasses.replace(spec, max_running_requests=_REQUEST_ROWS - 1)
    except NoSuchExample:
        spec = find(specs, lambda s: True, settings=settings(database=None))
    skips = (False, True) if spec.family == "dsa" else None
    _SPECS[key] = dataclasses.replace(
        spec, size=(_PAGES - 1) * spec.page_size, layer_num=2, skip_topk_layers=skips
    )
    return _SPECS[key]


def _built(target: Any, variant: Variant, device: str) -> tuple[PoolSpec, Any, Census]:
    why = unbuilt_variant_reason(target, variant)
    if why is not None:
        pytest.skip(why)
    spec = census_spec(target, variant)
    pool = target.make_pool(spec, device=device)
    geometry: dict[str, Any] = {"token_stride": spec.dcp_size}
    if spec.max_running_requests is not None:
        geometry["rows"] = (spec.max_running_requests,)  # sglang's pool does not keep it
    census = take_census(pool, geometry=geometry, declared=KNOWN_ROLES)
    return spec, pool, census


def _raised_finding(
    target: Any, error: BaseException, *, calls: tuple[str, ...], family: str
) -> Finding | None:
    """The declared finding about the pool raising ``error`` from one of ``calls``, in
    the signatures the suite's other properties give a raise (``check="raises"`` or the
    call's own check; the kind as the exception's type, with or without its message),
    else None. As a refusal of bad input ("instead of ValueError") only by a finding that
    names one of ``calls``: the census passes valid calls, so a broad input-validation
    finding must not claim a raise it did not cause."""
    name = type(error).__name__
    kinds = (f"raises {name}", f"{name}: {error}", name, f"{name} instead of ValueError")
    checks = (*(call.removeprefix("get_") for call in calls), "raises")
    findings = declared_findings(target)
    # A finding about a refusal of bad input claims a raise only where it names the call
    # (T1: the kpool move asserts): one about every call (I) did not cause this raise.
    of_a_call = [finding for finding in findings if finding.call]
    for kind in kinds:
        among = of_a_call if kind.endswith("instead of ValueError") else findings
        for call in calls:
            for check in checks:
                signature = FailureSignature(check=check, call=call, kind=kind, family=family)
                finding = matching_finding(among, signature)
                if finding is not None:
                    return finding
    return None


def _known_finding(
    target: Any, error: Exception, *, calls: tuple[str, ...], family: str
) -> Finding | None:
    """The declared finding a property failure (by its signature) or a raise (by
    :func:`_raised_finding`) of ``calls`` is, else None."""
    if isinstance(error, PropertyFailure):
        return matching_finding(declared_findings(target), error.signature)
    return _raised_finding(target, error, calls=calls, family=family)


def _known(findings: list[Finding]) -> str:
    """``findings`` as an xfail reason, one summary for the parts of one finding
    (``known finding PD1.descriptions, PD1: ...``)."""
    ids: dict[str, list[str]] = {}
    for finding in findings:
        ids.setdefault(finding.summary, [])
        if finding.id not in ids[finding.summary]:
            ids[finding.summary].append(finding.id)
    return "; ".join(f"known finding {', '.join(i)}: {summary}" for summary, i in ids.items())


class _Met:
    """The declared findings a test's checks meet. Each check runs even after an earlier
    one met a finding (a finding masks nothing); :meth:`end` turns them into the test's
    xfail."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.findings: list[Finding] = []

    def check(self, check: Callable[[], object], *, calls: tuple[str, ...], family: str) -> Any:
        """``check()``, or None where it failed as a declared finding describes."""
        try:
            return check()
        except Exception as error:
            known = _known_finding(self.target, error, calls=calls, family=family)
            if known is None:
                raise
            self.findings.append(known)
            return None

    def end(self) -> None:
        """The xfail of the findings met, if any."""
        if self.findings:
            pytest.xfail(_known(self.findings))


def _as_finding(
    target: Any, check: Callable[[], object], *, calls: tuple[str, ...], family: str
) -> object:
    """``check()``, with a failure a declared finding describes turned into its xfail."""
    met = _Met(target)
    result = met.check(check, calls=calls, family=family)
    met.end()
    return result


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_classifies_every_tensor(
    kvcheck_target: Any, kvcheck_device: str, variant: Variant
) -> None:
    """Every tensor the pool holds has an index space: none is left unclassified."""
    _, _, census = _built(kvcheck_target, variant, kvcheck_device)
    assert census.entries, census.describe()
    assert census.unclassified == (), census.describe()


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_accounting(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """get_kv_size_bytes and mem_usage equal the bytes of the tensors the census finds."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    counted = _as_finding(
        kvcheck_target,
        lambda: assert_accounting_covers_census(pool, census=census, family=spec.variant),
        calls=("get_kv_size_bytes",),
        family=spec.variant,
    )
    assert isinstance(counted, int) and counted >= 0


def _skip(target: Any, why: str) -> NoReturn:
    """Skip naming the target: what its pool lacks, not what the target declared."""
    pytest.skip(f"target {getattr(target, 'name', target)!r}: {why}")


def _page_ids(*, least: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, _PAGES - 1), min_size=least, max_size=_PAGES - 1, unique=True)


def _no_widened_ids(spec: PoolSpec) -> None:
    if spec.dcp_size > 1:
        pytest.skip(
            f"dcp_size={spec.dcp_size}: token ids are widened across decode-context-parallel"
            " ranks, and which of this rank's rows a token lands on needs a model of the pool"
        )


def _run_drawn(
    target: Any, body: Callable[[Any], object], *, calls: tuple[str, ...], family: str
) -> None:
    """``body(data)`` over Hypothesis examples; a declared finding ends the test as its
    xfail, and a pool that refuses the operation outright (``ValueError``) skips it,
    quoting the pool."""
    known: list[Finding] = []
    refused: list[str] = []

    @settings(max_examples=_EXAMPLES, deadline=None)
    @given(data=st.data())
    def examples(data: Any) -> None:
        try:
            body(data)
        except ValueError as error:
            refused.append(str(error))
        except Exception as error:
            finding = _known_finding(target, error, calls=calls, family=family)
            if finding is None:
                raise
            known.append(finding)

    examples()
    if known:
        pytest.xfail(_known(known[:1]))
    if refused:
        _skip(target, f"the pool refuses the operation: {refused[0]}")


def _request_rows(pool: Any, census: Census) -> list[int]:
    """The request rows a host copy may name: those of the pool's request-row state, where
    its ``get_cpu_copy`` takes a ``req_pool_index``; none otherwise."""
    if "req_pool_index" not in inspect.signature(pool.get_cpu_copy).parameters:
        return []
    extents = {e.extent for e in census.state_entries() if e.space is IndexSpace.ROW}
    return list(range(min(extents))) if extents else []


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_host_copy(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """get_cpu_copy, overwrite, load_cpu_copy restores every slot and page tensor at the
    copied pages and changes nothing else."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    _no_widened_ids(spec)
    if not census.state_entries():
        _skip(
            kvcheck_target, f"{census.pool_type} holds no cache state to copy (placeholders only)"
        )
    if "host_copy" in getattr(kvcheck_target, "unsupported", {}):
        pytest.skip(kvcheck_target.unsupported["host_copy"])
    checked: list[int] = []

    requests = _request_rows(pool, census)

    def body(data: Any) -> None:
        pages = data.draw(_page_ids(least=1), label="pages copied")
        request = None
        if requests:
            request = data.draw(st.sampled_from(requests), label="request row copied")
        checked.append(
            assert_host_copy_restores_census(
                pool, pages, census=census, family=spec.variant, req_pool_index=request
            )
        )

    calls = ("get_cpu_copy", "load_cpu_copy")
    _run_drawn(kvcheck_target, body, calls=calls, family=spec.variant)
    assert all(n > 0 for n in checked)


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_move(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """move_kv_cache carries every slot and page tensor from the source pages to the target
    pages and changes nothing else."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    _no_widened_ids(spec)
    if "move" in getattr(kvcheck_target, "unsupported", {}):
        pytest.skip(kvcheck_target.unsupported["move"])
    checked: list[int] = []

    def body(data: Any) -> None:
        pages = data.draw(_page_ids(least=2), label="pages")
        cut = data.draw(st.integers(1, len(pages) - 1), label="targets | sources")
        tgt, src = pages[:cut], pages[cut:]
        src = (src * len(tgt))[: len(tgt)]  # a source may feed several targets
        checked.append(
            assert_move_carries_census(
                pool, tgt_pages=tgt, src_pages=src, census=census, family=spec.variant
            )
        )

    _run_drawn(kvcheck_target, body, calls=("move_kv_cache",), family=spec.variant)
    assert all(n == len(census.state_entries()) for n in checked)


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_descriptions(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """The pool's transfer descriptions cover every state tensor's bytes exactly once."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    if not description_methods(pool):
        _skip(kvcheck_target, f"{census.pool_type} offers no get_*buf_infos transfer description")
    methods = _as_finding(
        kvcheck_target,
        lambda: assert_descriptions_cover_census(pool, census=census, family=spec.variant),
        calls=description_methods(pool),
        family=spec.variant,
    )
    assert isinstance(methods, tuple) and methods
    assert set(methods) <= set(description_methods(pool))


def _assert_registration(target: Any, pool: Any, census: Census, *, family: str, met: _Met) -> None:
    """What the target's PD registers for ``pool`` covers its census once (a declared
    finding goes to ``met``; a skip, naming the target, where it declares no registration)."""
    register = getattr(target, "pd_registration", None)
    if register is None:
        _skip(target, "declares no pd_registration (what PD registers for a pool)")
    components = met.check(
        lambda: assert_registration_covers_census(register(pool), census=census, family=family),
        # PD reads the KV description first: a pool whose get_contiguous_buf_infos raises
        # fails PD's registration with that finding.
        calls=("setup_state_kv_args", "get_contiguous_buf_infos"),
        family=family,
    )
    assert components is None or "kv" in components


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_pd_registration(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """What PD registers for the pool (its KV and each state component) covers every
    state tensor's bytes exactly once: a tensor left out never reaches the decode side."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    met = _Met(kvcheck_target)
    _assert_registration(kvcheck_target, pool, census, family=spec.variant, met=met)
    met.end()


@pytest.mark.parametrize("variant", _VARIANT_PARAMS)
def test_census_reset(kvcheck_target: Any, kvcheck_device: str, variant: Variant) -> None:
    """clear() gives back the pool's initial availability and bookkeeping."""
    spec, pool, census = _built(kvcheck_target, variant, kvcheck_device)
    if not callable(getattr(pool, "clear", None)):
        _skip(kvcheck_target, f"{census.pool_type} has no clear(): nothing to reset")
    checked = _as_finding(
        kvcheck_target,
        lambda: assert_clear_resets_census(pool, census=census, family=spec.variant),
        calls=("clear",),
        family=spec.variant,
    )
    assert isinstance(checked, int)


# --- the hybrids ---------------------------------------------------------------------------

#: The KV pool of a linear hybrid reaches the mamba pool its req-to-token pool owns (and
#: accounts for); the KV pool's own accounting leaves it out on purpose.
_NOT_OWNED_BY_KV_POOL = {
    "mamba_pool.*": "owned and counted by the req-to-token pool's MambaPool",
}


def _check_hybrid(
    target: Any,
    pool: Any,
    census: Census,
    *,
    family: str,
    met: _Met,
    exempt: Mapping[str, str] | None = None,
) -> None:
    """Accounting, descriptions and PD's registration of a hybrid against its census, each
    checked even after another met a declared finding (``met`` keeps them; the caller
    ends it)."""
    counted = met.check(
        lambda: assert_accounting_covers_census(pool, census=census, exempt=exempt, family=family),
        calls=("get_kv_size_bytes",),
        family=family,
    )
    assert counted is None or counted > 0
    methods = met.check(
        lambda: assert_descriptions_cover_census(pool, census=census, family=family),
        calls=description_methods(pool),
        family=family,
    )
    assert methods is None or (methods and set(methods) <= set(description_methods(pool)))
    _assert_registration(target, pool, census, family=family, met=met)


def _hybrid_census(pool: Any) -> Census:
    return take_census(pool, declared=KNOWN_ROLES)


def _swa_pool(target: Any, family: str, device: str) -> Any:
    """A two-layer hybrid (a full layer, then a window layer) whose sides are the family's
    plain census pool: inside the target's surface (sglang's DSA sides on 64-token index
    pages), both sides of the same capacity."""
    why = swa_skip_reason(target, family)
    if why is not None:
        pytest.skip(why)
    plain = census_spec(target, variant_named(family))
    sub = dataclasses.replace(plain, skip_topk_layers=None, max_running_requests=None)
    spec = SWAPoolSpec(sub, size_swa=sub.size, swa_layers=(False, True))
    return target.make_swa_pool(spec, device=device)


@pytest.mark.parametrize("family", SWA_FAMILIES)
def test_swa_hybrid_census(kvcheck_target: Any, kvcheck_device: str, family: str) -> None:
    """Both sides' tensors are classified; accounting and descriptions cover them all."""
    pool = _swa_pool(kvcheck_target, family, kvcheck_device)
    census = _hybrid_census(pool)
    assert census.unclassified == (), census.describe()
    met = _Met(kvcheck_target)
    _check_hybrid(kvcheck_target, pool, census, family=f"swa:{family}", met=met)
    met.end()


@pytest.mark.parametrize("family", SWA_FAMILIES)
def test_swa_hybrid_hicache_assembly(kvcheck_target: Any, kvcheck_device: str, family: str) -> None:
    """The HiCache host pool group the target assembles for the hybrid has an entry for
    every host pool the hybrid and its sides declare (a side left out is never offloaded
    to host memory, nor loaded back)."""
    assemble = _hicache_assembly(kvcheck_target)
    pool = _swa_pool(kvcheck_target, family, kvcheck_device)
    _as_finding(
        kvcheck_target,
        lambda: assert_hicache_assembly_whole(assemble, pool, family=f"swa:{family}"),
        calls=("hicache_assembly",),
        family=f"swa:{family}",
    )


def test_linear_hybrid_census(kvcheck_target: Any, kvcheck_device: str) -> None:
    """The KV pool and the req-to-token pool: every tensor classified, the KV pool's
    accounting covers what it owns, and the PD descriptions of each cover its state (the
    mamba slots' scratch is declared a workspace, ``KNOWN_ROLES``)."""
    why = linear_hybrid_skip_reason(kvcheck_target)
    if why is not None:
        pytest.skip(why)
    kv_pool, req_pool = kvcheck_target.make_linear_hybrid(
        small_linear_hybrid_spec(), device=kvcheck_device
    )
    kv_census, req_census = _hybrid_census(kv_pool), _hybrid_census(req_pool)
    assert kv_census.unclassified == (), kv_census.describe()
    assert req_census.unclassified == (), req_census.describe()
    met = _Met(kvcheck_target)
    _check_hybrid(
        kvcheck_target, kv_pool, kv_census, family="linear", met=met, exempt=_NOT_OWNED_BY_KV_POOL
    )
    met.end()


def _hicache_assembly(target: Any) -> Callable[..., Any]:
    assemble = getattr(target, "hicache_assembly", None)
    if assemble is None:
        _skip(target, "declares no hicache_assembly (what its HiCache assembles)")
    return assemble  # type: ignore[no-any-return]


#: A QSA hybrid: pages of 4 (a multiple of the compress ratio above 1, as sglang requires),
#: four request rows (their pending ring, rows times the ratio, is no page count).
_QSA_SPEC = LinearHybridSpec(
    full_layer_ids=(1,), mamba_layer_ids=(0,), size=16, page_size=4, rows=4, mamba_size=4
)


def test_qsa_hybrid_census(kvcheck_target: Any, kvcheck_device: str) -> None:
    """QSA's hybrid: every tensor classified (its compressed keys as token slots in groups,
    its pending ring as request rows in groups); accounting, descriptions and PD's
    registration cover them; a retracted request's host copy restores its pages'
    compressed keys and its ring rows, as it restores their KV."""
    make = getattr(kvcheck_target, "make_qsa_hybrid", None)
    if make is None:
        _skip(kvcheck_target, "has no make_qsa_hybrid (a linear hybrid with a QSA index cache)")
    kv_pool, _req_pool = make(_QSA_SPEC, device=kvcheck_device)
    census = _hybrid_census(kv_pool)
    assert census.unclassified == (), census.describe()
    met = _Met(kvcheck_target)
    _check_hybrid(
        kvcheck_target, kv_pool, census, family="qsa", met=met, exempt=_NOT_OWNED_BY_KV_POOL
    )
    checked = met.check(
        lambda: assert_host_copy_restores_census(
            kv_pool, [1], census=census, req_pool_index=1, family="qsa"
        ),
        calls=("get_cpu_copy", "load_cpu_copy"),
        family="qsa",
    )
    assert checked is None or checked > 0
    met.end()


@pytest.mark.parametrize("hybrid", ["linear", "qsa"])
def test_linear_hybrid_hicache_assembly(
    kvcheck_target: Any, kvcheck_device: str, hybrid: str
) -> None:
    """The HiCache host pool group the target assembles for a linear-attention hybrid
    (KV, mamba state; QSA's index cache too) has an entry for every host pool it
    declares."""
    assemble = _hicache_assembly(kvcheck_target)
    if hybrid == "qsa":
        make = getattr(kvcheck_target, "make_qsa_hybrid", None)
        if make is None:
            _skip(kvcheck_target, "has no make_qsa_hybrid (a linear hybrid with a QSA index cache)")
        kv_pool, req_pool = make(_QSA_SPEC, device=kvcheck_device)
    else:
        why = linear_hybrid_skip_reason(kvcheck_target)
        if why is not None:
            pytest.skip(why)
        kv_pool, req_pool = kvcheck_target.make_linear_hybrid(
            small_linear_hybrid_spec(), device=kvcheck_device
        )
    _as_finding(
        kvcheck_target,
        lambda: assert_hicache_assembly_whole(
            lambda pool: assemble(pool, req_pool), kv_pool, family=hybrid
        ),
        calls=("hicache_assembly",),
        family=hybrid,
    )
