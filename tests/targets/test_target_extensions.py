"""Optional target members: per-family capabilities, spec limits, expected failures, prepare().

The resolver and limit helpers are called directly; the plugin's use of them runs in
inner pytest sessions (``pytester``) against a small fake target.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs
from kvcheck.strategies.limits import (
    fit_spec,
    pool_spec_limits_of,
    spec_limit_violations,
    within_target_limits,
)
from kvcheck.surface import Surface, surface_problems
from kvcheck.targets import (
    TargetError,
    capability_skip_reason,
    check_target,
    expected_failure_reason,
    prepare_target,
    supports,
)
from kvcheck.targets.builtin import KVCheckTarget

pytest_plugins = ["pytester"]

SEARCH = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)

DSA_LIMITS = {"dsa": {"page_size": (64,), "index_head_dim": (128,)}}


class LimitedTarget(KVCheckTarget):
    """The built-in pools behind sglang-like declarations."""

    name = "limited"

    def __init__(self) -> None:
        super().__init__()
        self.unsupported: Mapping[str, str] = {"meta_device:mha": "MHA pools need a device module"}
        self.pool_spec_limits = DSA_LIMITS


# --- per-family capabilities ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "family", "skipped"),
    [
        (["meta_device"], "mha", True),
        (["meta_device"], "dsa", False),
        (["meta_device"], None, False),
        (["meta_device:mha"], None, True),
        (["dsa_pool", "meta_device"], "dsa", False),
    ],
    ids=["family-mha", "family-dsa", "no-family", "family-in-name", "other-capability"],
)
def test_skip_reason_honours_per_family_declarations(
    capabilities: list[str], family: str | None, skipped: bool
) -> None:
    """ "meta_device:mha" skips MHA pools on meta, and nothing else."""
    reason = capability_skip_reason(LimitedTarget(), capabilities, family=family)
    assert (reason is not None) == skipped
    if skipped:
        assert reason == (
            "target 'limited' does not support meta_device:mha (MHA pools need a device module)"
        )


def test_supports_answers_per_family() -> None:
    """supports() is the yes/no form of the skip reason."""
    target = LimitedTarget()
    assert not supports(target, "meta_device", family="mha")
    assert supports(target, "meta_device", family="mla")


@pytest.mark.parametrize(
    ("capabilities", "family"),
    [(["meta_device:tpu"], None), (["metadevice:mha"], None), (["move"], "tpu")],
    ids=["unknown-family-in-name", "unknown-capability", "unknown-family-argument"],
)
def test_skip_reason_rejects_unknown_names(capabilities: list[str], family: str | None) -> None:
    """A misspelled capability or family is a ValueError naming it."""
    with pytest.raises(ValueError, match=r"tpu|metadevice"):
        capability_skip_reason(LimitedTarget(), capabilities, family=family)


def test_check_target_accepts_optional_members() -> None:
    """A target with per-family keys, limits, expected failures and prepare() is valid."""
    target = LimitedTarget()
    target.expected_failures = {"test_a.py::test_f": "bug 1"}  # type: ignore[attr-defined]
    target.prepare = lambda: None  # type: ignore[attr-defined]
    assert check_target(target) == []


@pytest.mark.parametrize(
    ("member", "value", "problem"),
    [
        ("unsupported", {"meta_device:tpu": "x"}, "unknown pool family 'tpu'"),
        ("expected_failures", {"test_f": "bug"}, "must be a str naming a module and a test"),
        ("expected_failures", {"test_a.py::test_f": ""}, "must be a non-empty str"),
        ("expected_failures", ["test_a.py::test_f"], "expected a mapping pattern -> reason"),
        ("pool_spec_limits", {"dsa": {"page": (64,)}}, "['page']: not a PoolSpec field"),
        ("pool_spec_limits", {"dsa": {"page_size": 64}}, "=64 must be a non-empty tuple"),
        ("pool_spec_limits", {"tpu": {}}, "['tpu']: not a pool family"),
        ("surface", {"mha": {}}, "is not a kvcheck.surface.Surface"),
        ("prepare", "not callable", "is not callable"),
    ],
    ids=[
        "unknown-family",
        "pattern-without-test",
        "empty-reason",
        "not-a-mapping",
        "unknown-field",
        "values-not-a-tuple",
        "unknown-limit-family",
        "surface-not-a-surface",
        "prepare-not-callable",
    ],
)
def test_check_target_reports_bad_optional_members(member: str, value: Any, problem: str) -> None:
    """Each malformed optional member is listed with what is wrong with it."""
    target = LimitedTarget()
    setattr(target, member, value)
    assert any(problem in found for found in check_target(target)), check_target(target)


# --- expected failures and prepare() ----------------------------------------------------------


@pytest.mark.parametrize(
    ("nodeid", "reason"),
    [
        ("kvcheck/suite/test_a.py::test_f[x-2]", "bug 1"),
        ("test_a.py::test_f[x-2]", "bug 1"),
        ("../site-packages/kvcheck/suite/test_a.py::test_g", "bug 2"),
        ("kvcheck/suite/xtest_a.py::test_g", None),
        ("kvcheck/suite/test_a.py::test_fx", None),
        ("kvcheck/suite/test_a.py::test_f[y]", None),
    ],
    ids=["suffix", "whole", "installed-path", "no-partial-file", "no-partial-test", "param"],
)
def test_expected_failure_patterns_match_node_id_suffixes(nodeid: str, reason: str | None) -> None:
    """Patterns match the end of a node id at a path boundary; only * is a wildcard."""
    target = SimpleNamespace(
        expected_failures={"test_a.py::test_f[x-*]": "bug 1", "test_a.py::test_g": "bug 2"}
    )
    assert expected_failure_reason(target, nodeid) == reason


def test_prepare_target_runs_the_hook_once() -> None:
    """prepare_target calls prepare() and tolerates targets without one."""
    calls: list[str] = []
    prepare_target(SimpleNamespace(name="t", prepare=lambda: calls.append("prepared")))
    prepare_target(KVCheckTarget())
    assert calls == ["prepared"]


def test_prepare_failure_names_the_target() -> None:
    """An exception in prepare() becomes a TargetError naming the target and the error."""

    def broken() -> None:
        raise ImportError("no module named sglang")

    with pytest.raises(TargetError, match=r"target 't': prepare\(\) failed with ImportError"):
        prepare_target(SimpleNamespace(name="t", prepare=broken))


# --- pool spec limits -------------------------------------------------------------------------


def test_fit_spec_keeps_whole_pages_and_extra_index_pages() -> None:
    """A new page size keeps the number of pages and index_buf_size's extra pages."""
    spec = PoolSpec(
        family="dsa", size=12, page_size=4, layer_num=1, dtype="bfloat16", index_buf_size=16
    )
    fitted = fit_spec(spec, page_size=64)
    assert (fitted.size, fitted.page_size, fitted.index_buf_size) == (192, 64, 256)


def test_fit_spec_rejects_unknown_fields() -> None:
    """Only PoolSpec fields can be fitted."""
    spec = PoolSpec(family="mha", size=4, page_size=4, layer_num=1, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"\['pages'\] are not PoolSpec fields"):
        fit_spec(spec, pages=2)


def test_spec_limit_violations_name_field_and_values() -> None:
    """A spec outside the limits is described field by field; other families have none."""
    dsa = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1, dtype="bfloat16")
    mha = PoolSpec(family="mha", size=4, page_size=4, layer_num=1, dtype="bfloat16")
    assert spec_limit_violations(LimitedTarget(), dsa) == ["page_size=4 not in (64,)"]
    assert spec_limit_violations(LimitedTarget(), mha) == []


@settings(max_examples=25)
@given(data=st.data())
def test_drawn_specs_stay_inside_the_limits(data: st.DataObject) -> None:
    """Every drawn DSA spec has 64-token pages and whole pages; other families are untouched."""
    spec = data.draw(pool_specs(families=("dsa", "mha"), max_size=16, target=LimitedTarget()))
    assert spec_limit_violations(LimitedTarget(), spec) == []
    if spec.family == "dsa":
        assert spec.size % spec.page_size == 0
    else:
        assert spec.page_size <= 8


def test_without_limits_the_strategy_is_unchanged() -> None:
    """A target that declares no limits gets the strategy it passed in."""
    specs = pool_specs(families=("dsa",))
    assert within_target_limits(KVCheckTarget(), specs) is specs


def test_limit_problems_are_reported_before_drawing() -> None:
    """Malformed limits are an InvalidArgument naming the target, raised at once."""
    target = SimpleNamespace(name="bad", pool_spec_limits={"dsa": {"page_size": []}})
    assert surface_problems(target.pool_spec_limits)
    with pytest.raises(InvalidArgument, match="target 'bad'"):
        pool_specs(families=("dsa",), target=target)


# --- the plugin -------------------------------------------------------------------------------

_FAKE_TARGET = """
    import os
    from kvcheck.targets.builtin import KVCheckTarget

    class FakeTarget(KVCheckTarget):
        name = "fake"
        version = "1.0"
        unsupported = {"meta_device:mha": "no meta MHA"}
        expected_failures = {
            "test_inner.py::test_known_bug": "bug 7 (docs#b7)",
            "test_inner.py::test_fixed_bug": "bug 8 (docs#b8)",
            "test_inner.py::test_property_bug": "bug 9 (docs#b9)",
        }

        def prepare(self):
            if os.environ.get("FAKE_PREPARE_FAILS"):
                raise RuntimeError("GPU driver too old")
            with open(os.environ["FAKE_PREPARE_LOG"], "a") as log:
                log.write("prepared\\n")

    target = FakeTarget()
"""

_INNER_TESTS = """
    import os
    import pytest
    from hypothesis import given, strategies as st

    @pytest.mark.parametrize("family", ["mha", "dsa"])
    @pytest.mark.kvcheck_needs("meta_device")
    def test_meta(kvcheck_target, family):
        assert family == "dsa"

    @pytest.mark.kvcheck_needs("meta_device", family="mha")
    def test_meta_by_marker(kvcheck_target):
        raise AssertionError("must be skipped")

    def test_known_bug(kvcheck_target):
        assert False, "still broken"

    def test_fixed_bug(kvcheck_target):
        assert True

    @given(st.integers(0, 1000))
    def test_property_bug(kvcheck_target, x):
        with open(os.environ["FAKE_CALL_LOG"], "a") as log:
            log.write(f"{x}\\n")
        assert x < 10

    @pytest.mark.kvcheck_target("sglang")
    def test_needs_sglang():
        raise AssertionError("must be skipped")
"""


@pytest.fixture
def inner_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An inner pytest session whose target is the fake one; yields (pytester, logs dir)."""
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")):
            monkeypatch.delenv(name)
    saved = dict(settings._profiles)  # Hypothesis has no public way to unregister
    current = settings.get_current_profile_name()
    pytester.makepyfile(fake_target=_FAKE_TARGET, test_inner=_INNER_TESTS)
    pytester.syspathinsert()
    monkeypatch.setenv("KVCHECK_TARGET", "fake_target:target")
    monkeypatch.setenv("KVCHECK_DB", str(pytester.path / "db"))
    monkeypatch.setenv("FAKE_PREPARE_LOG", str(pytester.path / "prepare.log"))
    monkeypatch.setenv("FAKE_CALL_LOG", str(pytester.path / "calls.log"))
    yield pytester
    settings._profiles.clear()
    settings._profiles.update(saved)
    settings.load_profile(current)


def test_plugin_applies_families_expected_failures_and_the_sglang_marker(inner_run: Any) -> None:
    """Per-family skips, strict xfails (a fixed bug fails the run) and sglang-only tests."""
    result = inner_run.runpytest("-rsxX", "-p", "no:randomly")
    result.assert_outcomes(passed=1, skipped=3, xfailed=2, failed=1)
    for line in (
        "*kvcheck expected failures: 3 declared by target 'fake'*",
        "*SKIPPED*meta_device:mha (no meta MHA)*",
        "*SKIPPED*checks the sglang target, but the kvcheck target is 'fake'*",
        "*XFAIL*test_known_bug*bug 7 (docs#b7)*",
        "*[[]XPASS(strict)[]]*bug 8 (docs#b8)*",
    ):
        result.stdout.fnmatch_lines([line])
    assert (inner_run.path / "prepare.log").read_text() == "prepared\n"


def test_expected_property_failures_are_not_shrunk(inner_run: Any) -> None:
    """An expected-failure property stops at its first failing example, unshrunk."""
    result = inner_run.runpytest("-p", "no:randomly", "-k", "test_property_bug")
    result.assert_outcomes(xfailed=1)
    calls = [int(x) for x in (inner_run.path / "calls.log").read_text().split()]
    first_failure = next(i for i, x in enumerate(calls) if x >= 10)
    # Hypothesis reruns the failing example once to report it; nothing is shrunk.
    assert calls[first_failure + 1 :] in ([], [calls[first_failure]])


def test_prepare_failure_stops_the_run(inner_run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose prepare() fails stops the run with the target and the error."""
    monkeypatch.setenv("FAKE_PREPARE_FAILS", "1")
    result = inner_run.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*target 'fake': prepare() failed with RuntimeError*too old*"])


def test_replay_profile_makes_expected_failures_lenient(inner_run: Any) -> None:
    """A profile that only replays stored examples cannot promise a failure: no strict XPASS."""
    result = inner_run.runpytest("-p", "no:randomly", "--kvcheck-profile=kvcheck-replay", "-rX")
    # The property has no stored example to replay, so Hypothesis skips it.
    result.assert_outcomes(passed=1, skipped=4, xfailed=1, xpassed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*expected failures: 3 declared*not strict under*replay*"])


# --- declared findings ---------------------------------------------------------------------

_FINDINGS_TARGET = """
    from kvcheck.targets.builtin import KVCheckTarget
    from kvcheck.targets.findings import Finding

    class FindingsTarget(KVCheckTarget):
        name = "findings"
        version = "1.0"
        findings = (
            Finding("F1", "odd numbers are refused", check="parity", kind="odd",
                    pinned=("test_findings.py::test_pins_f1*",)),
        )

    target = FindingsTarget()
"""

_FINDINGS_TESTS = """
    from hypothesis import given, strategies as st
    from kvcheck.failures import FailureSignature
    from kvcheck.properties.assertions import failure

    def check(x, kind):
        if kind and x % 2:
            raise failure(f"got {x}", signature=FailureSignature(check="parity", kind=kind))

    def test_pins_f1_with_its_failure(kvcheck_target):
        check(1, "odd")

    def test_pins_f1_but_fails_otherwise(kvcheck_target):
        check(1, "negative")

    def test_pins_f1_but_passes(kvcheck_target):
        check(2, "odd")

    def test_pins_f1_where_the_target_cannot_build_it(kvcheck_target):
        import pytest
        pytest.skip("the target builds no such pool here")

    @given(st.integers(0, 100))
    def test_property_with_the_finding_only(kvcheck_target, x):
        check(x, "odd")

    @given(st.integers(0, 100))
    def test_property_with_a_second_bug(kvcheck_target, x):
        check(x, "odd")
        assert x < 90, "second bug"
"""


def test_findings_are_matched_by_their_failure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pinned test xfails only with its finding's failure (another failure, or a pass,
    fails the run; a skip with its reason stays a skip); a property steers around the
    finding yet still fails on a second bug."""
    for name in list(os.environ):
        if name.startswith(("KVCHECK_", "PYTEST_XDIST_")):
            monkeypatch.delenv(name)
    saved, current = dict(settings._profiles), settings.get_current_profile_name()
    pytester.makepyfile(findings_target=_FINDINGS_TARGET, test_findings=_FINDINGS_TESTS)
    pytester.syspathinsert()
    monkeypatch.setenv("KVCHECK_TARGET", "findings_target:target")
    monkeypatch.setenv("KVCHECK_DB", str(pytester.path / "db"))
    try:
        result = pytester.runpytest("-rsxXf", "-p", "no:randomly")
    finally:
        settings._profiles.clear()
        settings._profiles.update(saved)
        settings.load_profile(current)
    result.assert_outcomes(passed=1, xfailed=1, failed=3, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*SKIPPED*the target builds no such pool here*",
            "*XFAIL*test_pins_f1_with_its_failure*pins finding F1*",
            "*FAILED*test_pins_f1_but_fails_otherwise*",
            "*FAILED*test_pins_f1_but_passes*",
            "*FAILED*test_property_with_a_second_bug*",
        ]
    )
    result.stdout.fnmatch_lines(["*pins a finding but failed otherwise*is not finding F1*"])


class BaselineOnly(KVCheckTarget):
    """A target whose own pools build no variant beyond the baseline, and says so."""

    surface = Surface.baseline()


def test_a_subclass_inherits_its_parents_surface() -> None:
    """A target subclass that overrides make_pool keeps the surface it inherits, unless it
    declares its own; the declaration replaces the legacy opt-in tuples and limits."""

    class OwnPools(KVCheckTarget):
        def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
            return super().make_pool(spec, device=device)

    assert pool_spec_limits_of(OwnPools()) == pool_spec_limits_of(KVCheckTarget()) == {}
    assert pool_spec_limits_of(BaselineOnly()) == {
        "mha": {"kv_layout": ("nhd",), "kv_quant": ("none",), "nvfp4_layout": ("linear+dq",)},
        "mla": {"dcp_size": (1,), "kv_quant": ("none",)},
        "dsa": {"latent_layout": ("raw",), "index_kpool": (1,), "dcp_size": (1,)},
    }
    narrowed = KVCheckTarget.surface.replace(noop=None, mla=None, dsa=None)
    assert narrowed.describe().startswith("mha (kv_layout nhd/hnd, kv_quant none/fp8_scaled/")
    target = SimpleNamespace(name="t", unsupported={}, surface=narrowed)
    assert "no dsa pool: its surface declares none" in str(
        capability_skip_reason(target, ["dsa_pool"])
    )
    assert capability_skip_reason(target, ["mha_pool"]) is None


def test_a_surface_names_families_fields_and_values_it_knows() -> None:
    """Unknown families and fields, empty or non-tuple values, an axis on a family it does
    not vary and an axis without its baseline are refused, naming family and field."""
    cases = {
        "surface['gqa']: not a pool family": {"gqa": {}},
        "surface['mha']['pages']: not a PoolSpec field": {"mha": {"pages": (1,)}},
        "surface['mha']['page_size']=[64] must be a non-empty tuple": {"mha": {"page_size": [64]}},
        "surface['mha']['dcp_size']: dcp_size varies only for mla, dsa": {
            "mha": {"dcp_size": (1,)}
        },
        "surface['dsa']['dcp_size']=(1, 8) must include the baseline 1": {
            "dsa": {"dcp_size": (1, 8)}
        },
    }
    for message, families in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            Surface(families)


def test_a_layout_is_drawn_only_for_targets_that_declare_it() -> None:
    """A target that declares the baseline only gets NHD specs only; kvcheck's own target,
    and one declaring both layouts, get HND specs too."""
    hnd = lambda spec: spec.kv_layout == "hnd"  # noqa: E731
    with pytest.raises(NoSuchExample):
        find(pool_specs(families=("mha",), target=BaselineOnly()), hnd, settings=SEARCH)
    for target in (KVCheckTarget(), SimpleNamespace(name="t", kv_layouts=("nhd", "hnd"))):
        assert find(pool_specs(families=("mha",), target=target), hnd, settings=SEARCH)

    class HndOnly(KVCheckTarget):
        kv_layouts = ("hnd",)

    assert any("['kv_layout']=('hnd',)" in problem for problem in check_target(HndOnly()))


def test_a_scaled_latent_layout_is_drawn_only_for_targets_that_declare_it() -> None:
    """A target that declares the baseline only gets raw DSA rows only; kvcheck's own
    target, and one declaring both layouts, get scaled fp8 rows too."""
    scaled = lambda spec: spec.latent_layout == "scaled"  # noqa: E731

    def specs(target: object) -> Any:
        return pool_specs(families=("dsa",), dtype_names=("float8_e4m3fn",), target=target)

    with pytest.raises(NoSuchExample):
        find(specs(BaselineOnly()), scaled, settings=SEARCH)
    for target in (KVCheckTarget(), SimpleNamespace(name="t", latent_layouts=("raw", "scaled"))):
        spec = find(specs(target), scaled, settings=SEARCH)
        assert spec.variant.startswith("dsa:scaled") and spec.kv_lora_rank in (128, 256)
    with pytest.raises(InvalidArgument, match="latent_layout"):
        specs(SimpleNamespace(name="t", latent_layouts=("scaled",)))

    class ScaledOnly(KVCheckTarget):
        latent_layouts = ("scaled",)

    assert any("['latent_layout']" in problem for problem in check_target(ScaledOnly()))


def test_an_index_kpool_is_drawn_only_for_targets_that_declare_it() -> None:
    """A target that declares the baseline only gets kpool 1 only; kvcheck's own target gets
    kpools with compress tails; a target declaring 64-token index pages (sglang) gets
    ``page_size = 64 * index_kpool``; a declaration without 1 is refused."""

    def specs(target: object) -> Any:
        return pool_specs(families=("dsa",), target=target)

    kpool = lambda spec: spec.index_kpool > 1  # noqa: E731
    with pytest.raises(NoSuchExample):
        find(specs(BaselineOnly()), kpool, settings=SEARCH)
    spec = find(specs(KVCheckTarget()), lambda s: s.compress_tails, settings=SEARCH)
    assert spec.variant.startswith("dsa:kpool") and spec.tail_requests >= 1
    paged = SimpleNamespace(
        name="t", surface=Surface.of(dsa={"index_kpool": (1, 2), "index_page_size": (64,)})
    )
    spec = find(specs(paged), kpool, settings=SEARCH)
    assert (spec.index_kpool, spec.page_size, spec.index_page_size) == (2, 128, 64)
    with pytest.raises(InvalidArgument, match="index_kpool"):
        specs(SimpleNamespace(name="t", index_kpools=(2,)))

    class KpoolOnly(KVCheckTarget):
        index_kpools = (2,)

    assert any("['index_kpool']=(2,)" in problem for problem in check_target(KpoolOnly()))


def test_fit_spec_keeps_pages_whole_groups_of_the_kpool() -> None:
    """A new page size or kpool keeps the page a multiple of the kpool: an index page size
    sets the page to it times the kpool, a page the kpool does not divide is multiplied by
    it, and kpool 1 drops the compress-tail fields."""
    spec = PoolSpec(
        family="dsa",
        size=8,
        page_size=4,
        layer_num=1,
        dtype="bfloat16",
        index_kpool=4,
        index_kpool_compress=True,
        max_running_requests=1,
    )
    assert fit_spec(spec, page_size=6).page_size == 24
    assert fit_spec(spec, index_page_size=64, index_kpool=2).page_size == 128
    plain = fit_spec(spec, index_kpool=1)
    assert (plain.page_size, plain.compress_tails, plain.max_running_requests) == (4, False, None)


def test_decode_context_parallel_is_drawn_only_for_targets_that_declare_it() -> None:
    """A target that declares the baseline only gets dcp_size 1 only (MLA and DSA);
    kvcheck's own target gets DCP ranks; a declaration without 1, or with a width kvcheck
    does not draw, is refused."""

    def specs(target: object) -> Any:
        return pool_specs(families=("mla", "dsa"), target=target)

    dcp = lambda spec: spec.dcp_size > 1  # noqa: E731
    with pytest.raises(NoSuchExample):
        find(specs(BaselineOnly()), dcp, settings=SEARCH)
    spec = find(specs(KVCheckTarget()), lambda s: s.dcp_size == 4, settings=SEARCH)
    assert spec.variant.endswith(":dcp") and 0 <= spec.dcp_rank < 4
    for bad in ((2,), (1, 8)):
        with pytest.raises(InvalidArgument, match="dcp_size"):
            specs(SimpleNamespace(name="t", dcp_sizes=bad))

    class WidthsOnly(KVCheckTarget):
        dcp_sizes = (2, 4)

    assert any("['dcp_size']=(2, 4)" in problem for problem in check_target(WidthsOnly()))


def test_fit_spec_keeps_the_dcp_rank_and_the_extra_index_pages() -> None:
    """A new dcp_size keeps the rank inside it; an explicit index_buf_size keeps its extra
    pages beyond SGLang's default, which is widened under DCP."""
    spec = PoolSpec(
        family="dsa",
        size=8,
        page_size=4,
        layer_num=1,
        dtype="bfloat16",
        dcp_size=4,
        dcp_rank=3,
        index_buf_size=(8 + 4) * 4 - 4 + 2 * 4,
    )
    narrower = fit_spec(spec, dcp_size=2)
    assert (narrower.dcp_rank, narrower.index_buf_size) == (1, (8 + 4) * 2 - 4 + 2 * 4)
    single = fit_spec(spec, dcp_size=1)
    assert (single.dcp_rank, single.index_buf_size) == (0, 8 + 2 * 4)
