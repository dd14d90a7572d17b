"""pytest plugin for kvcheck (registered through the ``pytest11`` entry point).

Installing kvcheck is enough for any test suite to get:

- options ``--kvcheck-target`` (env ``KVCHECK_TARGET``), ``--kvcheck-device``
  (``auto``/``cpu``/``cuda``/``cuda:N``, env ``KVCHECK_DEVICE``) and ``--kvcheck-profile``
  (env ``KVCHECK_PROFILE``);
- session fixtures ``kvcheck_target`` (a :class:`kvcheck.targets.Target`) and
  ``kvcheck_device`` (a torch device string such as ``"cpu"`` or ``"cuda:0"``);
- markers ``kvcheck_needs(*capabilities, family=None)`` (skip, quoting the target's
  reason, when the target lacks one; a per-family declaration such as ``"meta_device:mha"``
  applies when the marker's ``family`` or the test's ``family`` parameter names that
  family), ``gpu`` (skip unless the device is CUDA) and ``sglang`` (runs only when the
  target is ``sglang``, so the default run never pays for importing sglang);
- the target's ``expected_failures``: matching tests run as strict expected failures, so a
  discrepancy that gets fixed fails the run as XPASS(strict) until its entry is removed;
- the target's ``prepare()`` hook, run once per test process before any test (not in the
  xdist controller, which runs none);
- kvcheck's Hypothesis profiles (:mod:`kvcheck.profiles`) with the ``KVCHECK_DB`` database;
- report header lines with the target, device, profile, database and ``KVCHECK_*`` variables;
- under ``pytest -n N`` with several GPUs, one GPU per xdist worker, round-robin.

A project that uses none of the fixtures or markers sees only the header lines and the
kvcheck profile (loaded only when the project did not choose a Hypothesis profile itself).
Heavy imports (torch, the pools) happen only when a test asks for a device or a pool.

Example (a downstream test module)::

    import pytest

    @pytest.mark.kvcheck_needs("mha_pool")
    def test_builds(kvcheck_target, kvcheck_device):
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["KVCheckSession"]

_TARGET_OPTION = "--kvcheck-target"
_DEVICE_OPTION = "--kvcheck-device"
_PROFILE_OPTION = "--kvcheck-profile"
_RESULTS_OPTION = "--kvcheck-results"
_ENV_PREFIX = "KVCHECK_"
_KVCHECK_FIXTURES = frozenset({"kvcheck_target", "kvcheck_device"})
_SGLANG_MARKER = "sglang"


class KVCheckSession:
    """What the plugin settled for this pytest process (one per ``pytest.Config``)."""

    def __init__(
        self,
        *,
        target: Any,
        target_source: str,
        device_spec: str,
        gpu_assignment: str | None,
        database: Any,
        record_results: bool,
    ) -> None:
        self.target = target
        self.target_source = target_source
        self.device_spec = device_spec
        self.gpu_assignment = gpu_assignment
        self.database = database
        self.record_results = record_results
        self._device: str | None = None

    @property
    def device_resolved(self) -> str | None:
        """The device, if it has been resolved already (resolving imports torch)."""
        return self._device

    def device(self) -> str:
        """The torch device string to run on, resolved once per process."""
        if self._device is None:
            from kvcheck.devices import resolve_device

            self._device = resolve_device(self.device_spec)
        return self._device


_SESSION = pytest.StashKey[KVCheckSession]()
#: The reason an item runs as one of the target's expected failures.
_EXPECTED_FAILURE = pytest.StashKey[str]()
#: The declared finding a test pins: it must fail, and with exactly that failure.
_PINNED_FINDING = pytest.StashKey[Any]()
#: Puts back the Hypothesis profiles this session changed (see ``_snapshot_profiles``).
_RESTORE_PROFILES = pytest.StashKey[Callable[[], None]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck", "kvcheck: KV-cache pool verification")
    group.addoption(
        _TARGET_OPTION,
        default=None,
        metavar="NAME",
        help="what to check: kvcheck (default), sglang, or module:attr naming a Target "
        "instance, class or factory. Env: KVCHECK_TARGET.",
    )
    group.addoption(
        _DEVICE_OPTION,
        default=None,
        metavar="DEVICE",
        help="auto (default: cuda when available, else cpu), cpu, cuda or cuda:N. "
        "Env: KVCHECK_DEVICE.",
    )
    group.addoption(
        _PROFILE_OPTION,
        default=None,
        metavar="PROFILE",
        help="Hypothesis profile: kvcheck-dev, kvcheck-ci, kvcheck-thorough or "
        "kvcheck-replay (default: kvcheck-ci when CI is set, else kvcheck-dev). "
        "Env: KVCHECK_PROFILE.",
    )
    group.addoption(
        _RESULTS_OPTION,
        default=None,
        metavar="FILE",
        help="write per-test results (outcome, Hypothesis examples, reproductions) as JSON "
        "to FILE; used by the kvcheck command.",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kvcheck_needs(*capabilities): skip, with the target's reason, unless the kvcheck "
        "target supports every capability (see kvcheck.targets.CAPABILITIES)",
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason on CPU")
    config.addinivalue_line(
        "markers",
        f"{_SGLANG_MARKER}: checks the sglang target itself; runs only when the kvcheck target "
        "is sglang (--kvcheck-target=sglang or KVCHECK_TARGET=sglang), skipped otherwise",
    )
    if config.getoption("help", False):
        return  # keep `pytest --help` free of Hypothesis and target imports
    config.stash[_SESSION] = _start_session(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    restore = config.stash.get(_RESTORE_PROFILES, None)
    if restore is not None:
        del config.stash[_RESTORE_PROFILES]
        restore()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(_SESSION, None)
    if session is None:
        return None
    from hypothesis import settings

    from kvcheck.db import describe_database
    from kvcheck.profiles import PROFILE_NAMES

    profile = _current_profile_name(settings)
    if profile in PROFILE_NAMES:
        database = describe_database(session.database)
    else:
        database = f"as Hypothesis profile {profile!r} sets it (not a kvcheck profile)"
    target = session.target
    env = {name: value for name, value in os.environ.items() if name.startswith(_ENV_PREFIX)}
    env_text = ", ".join(f"{name}={value!r}" for name, value in sorted(env.items()))
    lines = [
        f"kvcheck target: {target.name} {target.version} ({session.target_source})",
        f"kvcheck device: {_describe_device(session)}",
        f"kvcheck hypothesis profile: {profile}",
        f"kvcheck database: {database}",
        f"kvcheck env: {env_text or 'no KVCHECK_* variables set'}",
    ]
    expected = getattr(target, "expected_failures", None) or {}
    if expected:
        from kvcheck.targets.expected import generates_examples

        how = (
            "strict xfail: one that passes fails the run"
            if generates_examples()
            else "not strict under this profile, which only replays stored examples"
        )
        lines.append(
            f"kvcheck expected failures: {len(expected)} declared by target {target.name!r} ({how})"
        )
    return lines


@pytest.fixture(scope="session")
def kvcheck_target(pytestconfig: pytest.Config) -> Any:
    """The target under test (``--kvcheck-target`` / ``KVCHECK_TARGET``, default ``kvcheck``)."""
    return _session(pytestconfig).target


@pytest.fixture(scope="session")
def kvcheck_device(pytestconfig: pytest.Config) -> str:
    """The torch device string tests run on: ``"cpu"`` or ``"cuda:N"``."""
    try:
        return _session(pytestconfig).device()
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests the target or the device cannot serve, with the reason; mark the target's
    expected failures as strict xfails."""
    session = config.stash.get(_SESSION, None)
    if session is None:
        return
    from kvcheck.targets import capability_skip_reason, expected_failure_reason
    from kvcheck.targets.expected import generates_examples
    from kvcheck.targets.findings import pinned_finding

    for item in items:
        capabilities = [c for marker in item.iter_markers("kvcheck_needs") for c in marker.args]
        reason = None
        if capabilities:
            with contextlib.suppress(ValueError):  # unknown names fail the test in setup
                reason = capability_skip_reason(
                    session.target, capabilities, family=_item_family(item)
                )
        if reason is None and item.get_closest_marker("gpu") is not None:
            reason = _gpu_skip_reason(session)
        if reason is None and item.get_closest_marker(_SGLANG_MARKER) is not None:
            reason = _sglang_skip_reason(session)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            continue
        pinned = pinned_finding(session.target, item.nodeid)
        if pinned is not None:
            item.stash[_PINNED_FINDING] = pinned
            item.add_marker(
                pytest.mark.xfail(
                    strict=generates_examples(),
                    reason=f"pins finding {pinned.id} of target {session.target.name!r}: "
                    f"{pinned.summary}",
                )
            )
            continue
        expected = expected_failure_reason(session.target, item.nodeid)
        if expected is not None:
            item.stash[_EXPECTED_FAILURE] = expected
            item.add_marker(
                pytest.mark.xfail(
                    # A replay-only profile may not reach the failure: no XPASS(strict) then.
                    strict=generates_examples(),
                    reason=f"expected failure declared by target {session.target.name!r}: "
                    f"{expected}",
                )
            )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A misspelled capability is a bug in the test: fail it rather than skip or pass."""
    session = item.config.stash.get(_SESSION, None)
    if session is None:
        return
    capabilities = [c for marker in item.iter_markers("kvcheck_needs") for c in marker.args]
    if capabilities:
        from kvcheck.targets import capability_skip_reason

        try:
            capability_skip_reason(session.target, capabilities, family=_item_family(item))
        except ValueError as exc:
            pytest.fail(f"@pytest.mark.kvcheck_needs on {item.nodeid}: {exc}", pytrace=False)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Record Hypothesis statistics and database hits of kvcheck tests as user properties;
    run the target's expected failures without shrinking (:mod:`kvcheck.targets.expected`)."""
    session = item.config.stash.get(_SESSION, None)
    if session is None or not _is_tracked(item, session):
        with _fast_if_expected_to_fail(item), _steering(item, session):
            yield
        return
    from kvcheck.db import recording_test, stored_examples_fetched
    from kvcheck.results import (
        DEVICE_PROPERTY,
        STATISTICS_PROPERTY,
        STORED_PROPERTY,
        summarize_statistics,
    )

    runs: list[dict[str, Any]] = []
    with (
        _fast_if_expected_to_fail(item),
        _steering(item, session),
        recording_test(item.nodeid),
        _collecting_statistics(runs),
    ):
        yield
    if runs:
        item.user_properties.append((STATISTICS_PROPERTY, json.dumps(summarize_statistics(runs))))
    item.user_properties.append((STORED_PROPERTY, stored_examples_fetched(item.nodeid)))
    if session.device_resolved is not None:
        item.user_properties.append((DEVICE_PROPERTY, session.device_resolved))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Attach each Hypothesis failure's falsifying example and blob to the call report."""
    outcome = yield
    if call.when != "call" or call.excinfo is None:
        return
    session = item.config.stash.get(_SESSION, None)
    report = outcome.get_result()
    _hold_pinned_failure_to_its_finding(item, call, report)
    if session is None or not report.failed or not _is_tracked(item, session):
        return
    from kvcheck.results import FAILURES_PROPERTY, failures_from_exception

    failures = failures_from_exception(call.excinfo.value)
    report.user_properties.append((FAILURES_PROPERTY, json.dumps(failures)))


# --- helpers ----------------------------------------------------------------------------------


def _session(config: pytest.Config) -> KVCheckSession:
    session = config.stash.get(_SESSION, None)
    if session is None:
        raise pytest.UsageError("the kvcheck plugin was not configured for this run")
    return session


def _start_session(config: pytest.Config) -> KVCheckSession:
    """Settle target, device, GPU share and profile; any bad setting stops the run."""
    from kvcheck.devices import DEVICE_ENV_VAR, assign_worker_gpu, parse_device_spec
    from kvcheck.targets import (
        TARGET_ENV_VAR,
        TargetError,
        prepare_target,
        resolve_target,
        target_spec,
    )

    device_option = config.getoption("kvcheck_device")
    try:
        device_spec = parse_device_spec(device_option or os.environ.get(DEVICE_ENV_VAR))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    worker_input = getattr(config, "workerinput", None)
    worker_id = worker_input.get("workerid") if isinstance(worker_input, dict) else None
    gpu_assignment = assign_worker_gpu(worker_id, device_spec)

    target_option = config.getoption("kvcheck_target")
    if target_option:
        source = f"from {_TARGET_OPTION}"
    elif os.environ.get(TARGET_ENV_VAR, "").strip():
        source = f"from {TARGET_ENV_VAR}"
    else:
        source = f"default; choose with {_TARGET_OPTION} or {TARGET_ENV_VAR}"
    try:
        target = resolve_target(target_option)
        if not _is_xdist_controller(config, worker_id):
            # Heavy one-time setup (sglang's import) before any test: a Hypothesis test
            # must not see it (sglang raises the recursion limit while importing).
            prepare_target(target)
    except TargetError as exc:
        raise pytest.UsageError(f"kvcheck: {exc}") from exc
    source = f"{target_spec(target_option)!r}, {source}"

    database = _load_profile(config)
    session = KVCheckSession(
        target=target,
        target_source=source,
        device_spec=device_spec,
        gpu_assignment=gpu_assignment,
        database=database,
        record_results=bool(config.getoption("kvcheck_results")),
    )
    if device_spec.startswith("cuda"):
        # An explicit CUDA request on a machine without one stops the run here, once.
        try:
            session.device()
        except ValueError as exc:
            raise pytest.UsageError(f"kvcheck: {exc}") from exc
    results_path = config.getoption("kvcheck_results")
    if results_path and worker_id is None:
        from kvcheck.results import ResultsCollector

        collector = ResultsCollector(Path(results_path), context=lambda: _results_context(session))
        config.pluginmanager.register(collector, "kvcheck-results")
    return session


def _load_profile(config: pytest.Config) -> Any:
    """Register kvcheck's profiles and load the one in effect; return the database."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from kvcheck.db import (
        DATABASE_ENV_VAR,
        DatabaseSpecError,
        RecordingDatabase,
        database_from_spec,
    )
    from kvcheck.profiles import PROFILE_NAMES, choose_profile_to_load, register_profiles

    kvcheck_option = config.getoption("kvcheck_profile")
    hypothesis_option = config.getoption("hypothesis_profile", None)
    if kvcheck_option and hypothesis_option:
        raise pytest.UsageError(
            f"give one of {_PROFILE_OPTION}={kvcheck_option} and "
            f"--hypothesis-profile={hypothesis_option}, not both"
        )
    try:
        database = RecordingDatabase(database_from_spec(os.environ.get(DATABASE_ENV_VAR)))
    except DatabaseSpecError as exc:
        raise pytest.UsageError(f"kvcheck: {exc}") from exc
    config.stash[_RESTORE_PROFILES] = _snapshot_profiles(settings)
    register_profiles(database)
    chosen = choose_profile_to_load(
        kvcheck_option=kvcheck_option,
        hypothesis_option=hypothesis_option,
        current=_current_profile_name(settings),
    )
    if chosen is not None:
        try:
            # get_profile first: a failed load_profile would leave the bad name current.
            settings.get_profile(chosen)
        except InvalidArgument as exc:
            raise pytest.UsageError(
                f"kvcheck: Hypothesis profile {chosen!r} is not registered "
                f"({_PROFILE_OPTION} / KVCHECK_PROFILE); kvcheck's: {', '.join(PROFILE_NAMES)}"
            ) from exc
        settings.load_profile(chosen)
    return database


def _snapshot_profiles(settings: Any) -> Callable[[], None]:
    """Return an undo for the profile changes a session makes.

    Profiles are process-global. A pytest run started inside another (pytester's in-process
    runs) re-registers them with its own database; undoing that at unconfigure leaves the
    outer run's profiles and current profile as they were.
    """
    from hypothesis.errors import InvalidArgument

    from kvcheck.profiles import PROFILE_NAMES

    current = _current_profile_name(settings)
    saved = {}
    for name in PROFILE_NAMES:
        with contextlib.suppress(InvalidArgument):  # not registered yet: nothing to restore
            saved[name] = settings.get_profile(name)

    def restore() -> None:
        for name, profile in saved.items():
            settings.register_profile(name, profile)
        settings.load_profile(current)

    return restore


@contextlib.contextmanager
def _collecting_statistics(runs: list[dict[str, Any]]) -> Iterator[None]:
    """Collect the raw statistics of every Hypothesis run inside the block into ``runs``.

    Hypothesis's own pytest plugin installs a statistics callback around the test; ours is
    the inner wrapper (``trylast``), so it sees the callback and passes each run on to it.
    """
    if "hypothesis" not in sys.modules:
        yield
        return
    from hypothesis.statistics import collector

    previous = collector.value

    def note(statistics: dict[str, Any]) -> None:
        runs.append(dict(statistics))
        if previous is not None:
            previous(statistics)

    # Hypothesis declares the variable with its None default's type, hence the ignore.
    with collector.with_value(note):  # type: ignore[arg-type]
        yield


def _current_profile_name(settings: Any) -> str:
    getter = getattr(settings, "get_current_profile_name", None)
    if getter is not None:
        return str(getter())
    return str(getattr(settings, "_current_profile", "default"))


def _describe_device(session: KVCheckSession) -> str:
    from kvcheck.devices import count_gpus

    if session.device_resolved is None and "torch" in sys.modules:
        with contextlib.suppress(ValueError):
            session.device()
    if session.device_resolved is not None:
        text = f"{session.device_resolved} (requested {session.device_spec})"
    else:
        text = (
            f"{session.device_spec} (cuda when torch sees a GPU, else cpu; resolved on first use)"
        )
    if session.gpu_assignment is not None:
        text += f"; this xdist worker uses CUDA_VISIBLE_DEVICES={session.gpu_assignment}"
    elif session.device_spec in ("auto", "cuda") and count_gpus() > 1:
        text += f"; xdist workers each take one of the {count_gpus()} GPUs, round-robin"
    return text


def _gpu_skip_reason(session: KVCheckSession) -> str | None:
    try:
        device = session.device()
    except ValueError as exc:
        return str(exc)
    if device.startswith("cuda"):
        return None
    return (
        f"needs a CUDA device, but the kvcheck device is {device!r} "
        f"({_DEVICE_OPTION}={session.device_spec}; auto picks cuda only when "
        "torch.cuda.is_available())"
    )


def _steering(item: pytest.Item, session: KVCheckSession | None) -> Any:
    """Steer around the target's declared findings, except in a test that pins one."""
    if session is None or _PINNED_FINDING in item.stash:
        return contextlib.nullcontext()
    from kvcheck.targets.findings import active_findings, declared_findings

    return active_findings(declared_findings(session.target))


def _hold_pinned_failure_to_its_finding(item: pytest.Item, call: Any, report: Any) -> None:
    """A pinned test that fails otherwise than with its finding is a real failure."""
    finding = item.stash.get(_PINNED_FINDING, None)
    if finding is None or not getattr(report, "skipped", False) or call.excinfo is None:
        return
    from kvcheck.targets.expected import pinned_failure_mismatch

    mismatch = pinned_failure_mismatch(finding, call.excinfo.value)
    if mismatch is None:
        return
    report.outcome = "failed"
    if hasattr(report, "wasxfail"):
        del report.wasxfail
    report.longrepr = (
        f"{report.longrepr}\n\nkvcheck: this test pins a finding but failed otherwise: {mismatch}"
    )


def _fast_if_expected_to_fail(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    if _EXPECTED_FAILURE not in item.stash and _PINNED_FINDING not in item.stash:
        return contextlib.nullcontext()
    from kvcheck.targets.expected import failing_fast

    return failing_fast(getattr(item, "obj", None))


def _is_xdist_controller(config: pytest.Config, worker_id: str | None) -> bool:
    """The xdist process that hands tests to workers and runs none itself."""
    return worker_id is None and getattr(config.option, "dist", "no") != "no"


def _item_family(item: pytest.Item) -> str | None:
    """The pool family a test builds: its markers' ``family=``, else its ``family`` parameter."""
    for marker in item.iter_markers("kvcheck_needs"):
        family = marker.kwargs.get("family")
        if family is not None:
            return str(family)
    from kvcheck.specs import POOL_FAMILIES

    callspec = getattr(item, "callspec", None)
    family = callspec.params.get("family") if callspec is not None else None
    return family if family in POOL_FAMILIES else None


def _sglang_skip_reason(session: KVCheckSession) -> str | None:
    if session.target.name == "sglang":
        return None
    return (
        f"checks the sglang target, but the kvcheck target is {session.target.name!r}; run "
        "with --kvcheck-target=sglang or KVCHECK_TARGET=sglang (after "
        "`bash scripts/install_sglang.sh`)"
    )


def _is_tracked(item: pytest.Item, session: KVCheckSession) -> bool:
    """kvcheck tests, or every test when the kvcheck command asked for results."""
    if session.record_results:
        return True
    fixtures = set(getattr(item, "fixturenames", ()))
    return (
        bool(fixtures & _KVCHECK_FIXTURES) or item.get_closest_marker("kvcheck_needs") is not None
    )


def _results_context(session: KVCheckSession) -> dict[str, Any]:
    from hypothesis import settings

    from kvcheck.db import describe_database

    return {
        "target": {
            "name": session.target.name,
            "version": session.target.version,
            "source": session.target_source,
        },
        "device": {"requested": session.device_spec, "resolved": session.device_resolved},
        "profile": _current_profile_name(settings),
        "database": describe_database(session.database),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIX)},
    }
