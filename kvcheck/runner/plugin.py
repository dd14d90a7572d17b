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
  family), ``gpu`` (skip unless the device is CUDA) and ``kvcheck_target(name)`` (runs only
  when the target is ``name``, so the default run never pays for importing another one);
- the target's ``expected_failures``: matching tests run as strict expected failures, so a
  discrepancy that gets fixed fails the run as XPASS(strict) until its entry is removed;
- the target's ``prepare()`` hook, run once per test process before any test (not in the
  xdist controller, which runs none);
- kvcheck's Hypothesis profiles (:mod:`kvcheck.runner.profiles`) with the ``KVCHECK_DB`` database,
  applied to the tests that use kvcheck (below), or to every test when asked for;
- report header lines with the target, device, profile, database and ``KVCHECK_*`` variables
  (with a did-you-mean for an unknown ``KVCHECK_*`` variable, repeated in the summary), and
  after collection the targets the collected tests use;
- stored examples keyed by the target each test uses (:func:`kvcheck.targets.target_identity`
  of its ``kvcheck_target`` fixture or parameter, of the targets its ``@given`` strategies
  were built for, or of the targets it hands a strategy or a machine before its examples
  are read), the run's target only for a test that shows none;
- a terminal-summary warning naming every test whose failing example could not be saved;
- under ``pytest -n N`` with several GPUs, one GPU per xdist worker, round-robin.

A good neighbour: a test "uses kvcheck" when it lives in kvcheck's package (the shipped
suite), takes a ``kvcheck_target``/``kvcheck_device`` fixture, or carries a
``kvcheck_needs``/``gpu``/``kvcheck_target`` marker. Only those run under kvcheck's profile (loaded
around the test and put back after it); every other test keeps Hypothesis's settings as the
project has them. kvcheck's profile applies to every test instead when asked for: a
``--kvcheck-target``/``--kvcheck-device``/``--kvcheck-profile`` option (command line or the
project's ``addopts``), ``KVCHECK_PROFILE``, the ``kvcheck`` command, kvcheck's own
checkout. A project that chose a Hypothesis profile itself keeps it everywhere. Heavy imports
(torch, the pools) happen only when a test asks for a device or a pool.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["KVCheckSession"]
#: The shipped suite runs its cheapest properties first (see the module).
pytest_plugins = ["kvcheck.runner.order"]

_TARGET_OPTION = "--kvcheck-target"
_DEVICE_OPTION = "--kvcheck-device"
_PROFILE_OPTION = "--kvcheck-profile"
_RESULTS_OPTION = "--kvcheck-results"
_PROGRESS_OPTION = "--kvcheck-progress-fd"
_IMPORT_DIR_OPTION = "--kvcheck-import-dir"
_ENV_PREFIX = "KVCHECK_"
#: The kvcheck package directory (this module is kvcheck/runner/plugin.py).
_PACKAGE = Path(__file__).resolve().parents[1]
_KVCHECK_FIXTURES = frozenset({"kvcheck_target", "kvcheck_device"})
_TARGET_MARKER = "kvcheck_target"
_TARGET_FIXTURE = "kvcheck_target"
_KVCHECK_MARKERS = ("kvcheck_needs", "gpu", _TARGET_MARKER)
#: Hypothesis settings a test's own ``@settings(...)`` may have changed from its parent.
_SETTING_NAMES = (
    "max_examples",
    "derandomize",
    "database",
    "verbosity",
    "phases",
    "stateful_step_count",
    "report_multiple_bugs",
    "suppress_health_check",
    "deadline",
    "print_blob",
    "backend",
)


@dataclass(kw_only=True)
class KVCheckSession:
    """What the plugin settled for this pytest process (one per ``pytest.Config``)."""

    target: Any
    #: The run's target's identity (:func:`kvcheck.targets.target_identity`).
    target_key: str
    target_source: str
    device_spec: str
    gpu_assignment: str | None
    database: Any
    record_results: bool
    #: The kvcheck profile in effect (None: the project chose its own Hypothesis profile).
    profile: str | None = None
    #: True: loaded for the whole run; False: loaded around each test that uses kvcheck.
    profile_everywhere: bool = True
    #: Hypothesis's own profile objects, which a ``@given`` test binds when nobody chose.
    unchosen_settings: tuple[Any, ...] = ()
    #: The device, once resolved (resolving imports torch): see :meth:`device`.
    device_resolved: str | None = field(default=None, init=False)
    #: Under xdist, the controller runs no ``prepare()``: how a worker described the
    #: prepared target (its surface), for the results.
    prepared_target: dict[str, str] = field(default_factory=dict, init=False)

    def device(self) -> str:
        """The torch device string to run on, resolved once per process."""
        if self.device_resolved is None:
            from kvcheck.runner.devices import resolve_device

            self.device_resolved = resolve_device(self.device_spec)
        return self.device_resolved

    def profile_name(self) -> str:
        """The Hypothesis profile the tests that use kvcheck run under."""
        from hypothesis import settings

        if self.profile_everywhere or self.profile is None:
            return _current_profile_name(settings)
        return self.profile


_SESSION = pytest.StashKey[KVCheckSession]()
#: The key under which an xdist worker hands the controller its prepared target's description.
_WORKER_TARGET = "kvcheck_target"
#: The reason an item runs as one of the target's expected failures.
_EXPECTED_FAILURE = pytest.StashKey[str]()
#: Why a test's ``kvcheck_needs`` marker names no capability of the target.
_BAD_CAPABILITY = pytest.StashKey[str]()
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
    group.addoption(
        _PROGRESS_OPTION,
        default=None,
        type=int,
        metavar="FD",
        help="write one JSON line per finished test to file descriptor FD; used by the "
        "kvcheck command for its progress line.",
    )
    group.addoption(
        _IMPORT_DIR_OPTION,
        default=None,
        metavar="DIR",
        help="put DIR first on sys.path once kvcheck is imported, as python -m pytest puts "
        "the current directory, so that a folder named kvcheck there cannot shadow the "
        "installed package; used by the kvcheck command (kvcheck.runner.launch).",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before any conftest or test module is imported (in each xdist worker too), put the
    kvcheck command's ``--kvcheck-import-dir`` first on ``sys.path``."""
    directory = getattr(early_config.known_args_namespace, "kvcheck_import_dir", None)
    if directory and directory not in sys.path:
        sys.path.insert(0, directory)


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
        f"{_TARGET_MARKER}(name): checks target `name` itself; runs only when the kvcheck "
        "target is that one (--kvcheck-target / KVCHECK_TARGET), skipped otherwise",
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

    from kvcheck.runner.db import describe_database
    from kvcheck.runner.profiles import PROFILE_NAMES, unknown_env_warnings

    current = _current_profile_name(settings)
    profile = session.profile_name()
    if profile in PROFILE_NAMES:
        database = describe_database(session.database)
    else:
        database = f"as Hypothesis profile {current!r} sets it (not a kvcheck profile)"
    if not session.profile_everywhere:
        profile = (
            f"{profile} for tests that use kvcheck (its suite, fixtures kvcheck_target/"
            f"kvcheck_device, markers kvcheck_needs/gpu/kvcheck_target); other tests keep "
            f"Hypothesis profile {current!r}"
        )
    target = session.target
    env_text = ", ".join(f"{name}={value!r}" for name, value in _kvcheck_env().items())
    lines = [
        f"kvcheck target: {_describe_target(target)} ({session.target_source}); a test "
        "that uses another target (a kvcheck_target fixture or parameter, strategies' "
        "target=) is checked and keyed by that one (listed after collection)",
        f"kvcheck surface: {_describe_surface(target)}",
        f"kvcheck device: {_describe_device(session)}",
        f"kvcheck hypothesis profile: {profile}",
        f"kvcheck database: {database}",
        f"kvcheck env: {env_text or 'no KVCHECK_* variables set'}",
    ]
    lines += [f"kvcheck WARNING: {warning}" for warning in unknown_env_warnings()]
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


def pytest_report_collectionfinish(
    config: pytest.Config, start_path: Path, items: list[pytest.Item]
) -> list[str] | None:
    """Which targets the collected tests use, and so key their stored examples by."""
    session = config.stash.get(_SESSION, None)
    if session is None:
        return None
    counts: dict[str, int] = {}
    for item in items:
        if _uses_kvcheck(item):
            where = _collected_target(item, session)
            counts[where] = counts.get(where, 0) + 1
    if not counts:
        return None
    if list(counts) == [session.target_key]:
        return [f"kvcheck targets: {session.target_key} (every test that uses kvcheck)"]
    shown = ", ".join(f"{name} ({number} tests)" for name, number in sorted(counts.items()))
    return [f"kvcheck targets, per test: {shown}"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker, hand the controller the prepared target's description (the
    controller runs no ``prepare()``, and a target may read its surface there)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    kvcheck = session.config.stash.get(_SESSION, None)
    if isinstance(workeroutput, dict) and kvcheck is not None:
        wants_classes = bool(session.config.getoption("kvcheck_results", None))
        workeroutput[_WORKER_TARGET] = {
            "surface": _describe_surface(kvcheck.target),
            "classes": _describe_classes(kvcheck.target) if wants_classes else "",
        }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the xdist controller, keep the first worker's description of the target."""
    described = getattr(node, "workeroutput", {}).get(_WORKER_TARGET)
    session = node.config.stash.get(_SESSION, None)
    if isinstance(described, dict) and session is not None and not session.prepared_target:
        session.prepared_target.update(described)


@pytest.hookimpl(tryfirst=True)  # before the results collector's lost saves
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _SESSION in config.stash:
        from kvcheck.runner.profiles import unknown_env_warnings

        for warning in unknown_env_warnings():
            terminalreporter.write_line(f"kvcheck WARNING: {warning}", yellow=True, bold=True)


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

    target = session.target
    for item in items:
        capabilities = [c for marker in item.iter_markers("kvcheck_needs") for c in marker.args]
        reason = None
        if capabilities:
            try:
                reason = capability_skip_reason(target, capabilities, family=_item_family(item))
            except ValueError as exc:  # an unknown name fails the test in setup
                item.stash[_BAD_CAPABILITY] = str(exc)
        if reason is None and item.get_closest_marker("gpu") is not None:
            reason = _gpu_skip_reason(session)
        if reason is None and item.get_closest_marker(_TARGET_MARKER) is not None:
            reason = _other_target_skip_reason(item, session)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            continue
        pinned = pinned_finding(target, item.nodeid)
        expected = None if pinned is not None else expected_failure_reason(target, item.nodeid)
        if pinned is not None:
            from kvcheck.runner.results import PINS_PROPERTY

            item.stash[_PINNED_FINDING] = pinned
            item.user_properties.append((PINS_PROPERTY, pinned.id))
            why = f"pins finding {pinned.id} of target {target.name!r}: {pinned.summary}"
        elif expected is not None:
            item.stash[_EXPECTED_FAILURE] = expected
            why = f"expected failure declared by target {target.name!r}: {expected}"
        else:
            continue
        # A replay-only profile may not reach the failure: no XPASS(strict) then.
        item.add_marker(pytest.mark.xfail(strict=generates_examples(), reason=why))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A misspelled capability is a bug in the test: fail it rather than skip or pass."""
    problem = item.stash.get(_BAD_CAPABILITY, None)
    if problem is not None:
        pytest.fail(f"@pytest.mark.kvcheck_needs on {item.nodeid}: {problem}", pytrace=False)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Record Hypothesis statistics and database hits of kvcheck tests as user properties;
    run the target's expected failures without shrinking (:mod:`kvcheck.targets.expected`)."""
    session = item.config.stash.get(_SESSION, None)
    if session is None:
        with _fast_if_expected_to_fail(item), _steering(item, session):
            yield
        return
    if not _is_tracked(item, session):
        with _fast_if_expected_to_fail(item), _steering(item, session), _keyed_by_target(item):
            yield
        return
    from kvcheck.runner.db import recording_test
    from kvcheck.runner.results import call_properties

    runs: list[dict[str, Any]] = []
    with (
        _fast_if_expected_to_fail(item),
        _steering(item, session),
        _kvcheck_profile_around(item, session),
        _keyed_by_target(item),
        recording_test(item.nodeid),
        _collecting_statistics(runs),
    ):
        yield
    item.user_properties += call_properties(item.nodeid, runs, device=session.device_resolved)


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
    from kvcheck.runner.results import FAILURES_PROPERTY, failures_from_exception

    failures = failures_from_exception(call.excinfo.value)
    report.user_properties.append((FAILURES_PROPERTY, json.dumps(failures, default=str)))


# --- helpers ----------------------------------------------------------------------------------


def _session(config: pytest.Config) -> KVCheckSession:
    session = config.stash.get(_SESSION, None)
    if session is None:
        raise pytest.UsageError("the kvcheck plugin was not configured for this run")
    return session


def _start_session(config: pytest.Config) -> KVCheckSession:
    """Settle target, device, GPU share and profile; any bad setting stops the run."""
    from kvcheck.runner.devices import DEVICE_ENV_VAR, assign_worker_gpu, parse_device_spec
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

    from kvcheck.targets import target_identity

    target_option = config.getoption("kvcheck_target")
    if target_option:
        source = f"from {_TARGET_OPTION}"
    elif os.environ.get(TARGET_ENV_VAR, "").strip():
        source = f"from {TARGET_ENV_VAR}"
    else:
        source = f"default; choose with {_TARGET_OPTION} or {TARGET_ENV_VAR}"
    try:
        target = resolve_target(target_option)
        if worker_id is not None or getattr(config.option, "dist", "no") == "no":
            # Heavy one-time setup (a target's imports) before any test: a Hypothesis test
            # must not see it (a package may raise the recursion limit while importing). The
            # xdist controller runs no test, so it skips it.
            prepare_target(target)
    except TargetError as exc:
        raise pytest.UsageError(f"kvcheck: {exc}") from exc
    spelling = target_spec(target_option)
    try:
        target_key = target_identity(target)
    except TargetError as exc:
        raise pytest.UsageError(f"kvcheck: {exc}") from exc
    source = f"{spelling!r}, {source}"
    if target_key != spelling:
        source += f"; stored examples keyed {target_key!r}"

    record_results = bool(config.getoption("kvcheck_results"))
    database, profile, everywhere, unchosen = _load_profile(
        config, target_key=target_key, spelling=spelling, record_results=record_results
    )
    session = KVCheckSession(
        target=target,
        target_key=target_key,
        target_source=source,
        device_spec=device_spec,
        gpu_assignment=gpu_assignment,
        database=database,
        record_results=record_results,
        profile=profile,
        profile_everywhere=everywhere,
        unchosen_settings=unchosen,
    )
    if device_spec.startswith("cuda"):
        # An explicit CUDA request on a machine without one stops the run here, once.
        try:
            session.device()
        except ValueError as exc:
            raise pytest.UsageError(f"kvcheck: {exc}") from exc
    if worker_id is None:  # under xdist the controller sees every worker's reports
        from kvcheck.runner.results import ResultsCollector

        results_path = config.getoption("kvcheck_results")
        collector = ResultsCollector(
            Path(results_path) if results_path else None,
            # Only a run that writes results (kvcheck verify) discovers the target's classes:
            # the discovery imports every module of the package, which under reach's
            # coverage would count their import-time lines as reached.
            context=lambda: _results_context(session, classes=bool(results_path)),
            progress_fd=config.getoption("kvcheck_progress_fd"),
        )
        config.pluginmanager.register(collector, "kvcheck-results")
    return session


def _load_profile(
    config: pytest.Config, *, target_key: str, spelling: str, record_results: bool
) -> tuple[Any, str | None, bool, tuple[Any, ...]]:
    """Register kvcheck's profiles and settle which applies where.

    The database is the one ``KVCHECK_DB`` names, seen per test as the share of the target
    the test uses (``target_key``, the run's target, for a test that shows none; examples an
    older kvcheck keyed by its ``spelling`` are its own too), so this run never touches
    another target's stored examples. Returns the database, the kvcheck
    profile in effect (None when the project chose its own Hypothesis profile), whether it
    is loaded for the whole run (any ``--kvcheck-*`` option given, ``KVCHECK_PROFILE``, the
    kvcheck command, kvcheck's checkout) rather than around each test that uses kvcheck, and
    Hypothesis's own profile objects.
    """
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from kvcheck.runner.db import (
        DATABASE_ENV_VAR,
        DatabaseSpecError,
        PerTestTargetDatabase,
        RecordingDatabase,
        database_from_env,
    )
    from kvcheck.runner.profiles import (
        PROFILE_ENV_VAR,
        PROFILE_NAMES,
        choose_profile_to_load,
        register_profiles,
    )

    kvcheck_option = config.getoption("kvcheck_profile")
    hypothesis_option = config.getoption("hypothesis_profile", None)
    if kvcheck_option and hypothesis_option:
        raise pytest.UsageError(
            f"give one of {_PROFILE_OPTION}={kvcheck_option} and "
            f"--hypothesis-profile={hypothesis_option}, not both"
        )
    # Asked-for databases are checked now: a failure found later must be saved.
    asked = bool(os.environ.get(DATABASE_ENV_VAR, "").strip()) or record_results
    try:
        inner = database_from_env(writable=asked)
    except DatabaseSpecError as exc:
        raise pytest.UsageError(f"kvcheck: {exc}") from exc
    database = RecordingDatabase(PerTestTargetDatabase(inner, target_key, aliases=(spelling,)))
    config.stash[_RESTORE_PROFILES] = _snapshot_profiles(settings)
    register_profiles(database)
    chosen = choose_profile_to_load(
        kvcheck_option=kvcheck_option,
        hypothesis_option=hypothesis_option,
        current=_current_profile_name(settings),
    )
    unchosen = tuple(
        settings._profiles[name]  # Hypothesis's own profiles, bound by undecorated tests
        for name in ("default", "ci")
        if name in getattr(settings, "_profiles", {})
    )
    if chosen is None:
        return database, None, True, unchosen
    try:
        # get_profile first: a failed load_profile would leave the bad name current.
        settings.get_profile(chosen)
    except InvalidArgument as exc:
        raise pytest.UsageError(
            f"kvcheck: Hypothesis profile {chosen!r} is not registered "
            f"({_PROFILE_OPTION} / KVCHECK_PROFILE); kvcheck's: {', '.join(PROFILE_NAMES)}"
        ) from exc
    # A project that passes kvcheck options (on the command line or in its addopts) uses
    # kvcheck for its whole suite; one that merely has kvcheck installed does not.
    named_options = any(
        config.getoption(name) for name in ("kvcheck_target", "kvcheck_device", "kvcheck_profile")
    )
    everywhere = (
        named_options
        or bool(os.environ.get(PROFILE_ENV_VAR, "").strip())
        or record_results
        or _is_kvcheck_checkout(config)
    )
    if everywhere:
        settings.load_profile(chosen)
    return database, chosen, everywhere, unchosen


@contextlib.contextmanager
def _keyed_by_target(item: pytest.Item) -> Iterator[None]:
    """Key the test's stored examples by the target it uses (see the module): its
    ``kvcheck_target`` argument, else the targets of its ``@given`` strategies, else those
    it noted so far (a strategy or a machine built for a target in its body)."""
    from kvcheck.runner.db import keyed_by_test_target
    from kvcheck.strategies.limits import noting_targets

    explicit = _targets_shown(item)
    with noting_targets() as noted:

        def identity() -> str | None:
            return _joint_identity(explicit or noted)

        with keyed_by_test_target(identity):
            yield


def _targets_shown(item: pytest.Item) -> list[Any]:
    """The targets a test shows before it runs: its ``kvcheck_target`` argument (the plugin's
    fixture, the project's own or a parameter), else its ``@given`` strategies' targets."""
    funcargs = getattr(item, "funcargs", None) or {}
    if _TARGET_FIXTURE in funcargs:
        return [funcargs[_TARGET_FIXTURE]]
    from kvcheck.strategies.limits import targets_of

    test = getattr(item, "obj", None)
    handle = getattr(getattr(test, "__func__", test), "hypothesis", None)
    given = getattr(handle, "_given_kwargs", None)  # Hypothesis's record of @given
    return targets_of(given) if isinstance(given, dict) else []


def _joint_identity(targets: list[Any]) -> str | None:
    """One key for a test's targets: the identity of each, joined when there are several."""
    from kvcheck.targets import target_identity

    keys = sorted({target_identity(target) for target in targets})
    return " + ".join(keys) or None


def _collected_target(item: pytest.Item, session: KVCheckSession) -> str:
    """The target a collected test uses, as far as collection can tell."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and _TARGET_FIXTURE in callspec.params:
        return _joint_identity([callspec.params[_TARGET_FIXTURE]]) or session.target_key
    if _TARGET_FIXTURE in getattr(item, "fixturenames", ()):
        fixture_info = getattr(item, "_fixtureinfo", None)
        definitions = getattr(fixture_info, "name2fixturedefs", {}).get(_TARGET_FIXTURE, ())
        own = getattr(kvcheck_target, "__wrapped__", kvcheck_target)
        if definitions and getattr(definitions[-1], "func", own) is not own:
            return f"the project's {_TARGET_FIXTURE} fixture (per test)"
        return session.target_key
    shown = _targets_shown(item)
    if shown:
        return _joint_identity(shown) or session.target_key
    # A test that shows no target may hand one to a machine or a strategy in its body: its
    # examples are keyed by that target (noted as it runs), which collection cannot see.
    return f"the target it builds for when it runs, else {session.target_key}"


def _is_kvcheck_checkout(config: pytest.Config) -> bool:
    """pytest runs in kvcheck's own source tree (its tests are kvcheck's suite too)."""
    return _PACKAGE.parent == Path(config.rootpath).resolve()


def _uses_kvcheck(item: pytest.Item) -> bool:
    """In kvcheck's package, or takes a kvcheck fixture, or carries a kvcheck marker."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & _KVCHECK_FIXTURES:
        return True
    if any(item.get_closest_marker(name) is not None for name in _KVCHECK_MARKERS):
        return True
    return _PACKAGE in Path(str(item.path)).resolve().parents


@contextlib.contextmanager
def _kvcheck_profile_around(item: pytest.Item, session: KVCheckSession) -> Iterator[None]:
    """Run a test that uses kvcheck under kvcheck's profile, then put everything back.

    ``@given`` binds ``settings.default`` when the module is imported, so loading the
    profile now reaches only settings made during the test (state machines); the test's
    bound settings are rebased too when they are Hypothesis's own profile (nobody chose)
    or a test's ``@settings(...)`` on top of it (its own choices kept).
    """
    if session.profile is None or session.profile_everywhere or not _uses_kvcheck(item):
        yield
        return
    from hypothesis import settings

    previous = _current_profile_name(settings)
    profile = settings.get_profile(session.profile)
    test = getattr(item, "obj", None)
    test = getattr(test, "__func__", test)  # a method's function carries the settings
    bound = getattr(test, "_hypothesis_internal_use_settings", None)
    rebased = _rebased_settings(bound, profile, session.unchosen_settings)
    settings.load_profile(session.profile)
    if rebased is not None:
        test._hypothesis_internal_use_settings = rebased  # type: ignore[union-attr]
    try:
        yield
    finally:
        if rebased is not None:
            test._hypothesis_internal_use_settings = bound  # type: ignore[union-attr]
        settings.load_profile(previous)


def _rebased_settings(bound: Any, profile: Any, unchosen: tuple[Any, ...]) -> Any:
    """``profile`` with the test's own changes to Hypothesis's defaults, or None to keep."""
    if bound is None:
        return None
    if any(bound is default for default in unchosen):
        return profile
    parent = getattr(bound, "_fallback", None)
    if parent is None or not any(parent is default for default in unchosen):
        return None  # settings the project chose: leave them
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    changed = {
        name: getattr(bound, name)
        for name in _SETTING_NAMES
        if getattr(bound, name, None) != getattr(parent, name, None)
    }
    try:
        return settings(profile, **changed)
    except InvalidArgument:
        return None


def _snapshot_profiles(settings: Any) -> Callable[[], None]:
    """Return an undo for the profile changes a session makes.

    Profiles are process-global. A pytest run started inside another (pytester's in-process
    runs) re-registers them with its own database; undoing that at unconfigure leaves the
    outer run's profiles and current profile as they were.
    """
    from hypothesis.errors import InvalidArgument

    from kvcheck.runner.profiles import PROFILE_NAMES

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
    from kvcheck.runner.devices import count_gpus

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
    """Steer around the target's declared findings, except in a test that pins one or
    that the target expects to fail as a whole (``expected_failures``)."""
    if session is None or _PINNED_FINDING in item.stash or _EXPECTED_FAILURE in item.stash:
        return contextlib.nullcontext()
    from kvcheck.targets.findings import active_findings, declared_findings

    return active_findings(declared_findings(session.target))


def _hold_pinned_failure_to_its_finding(item: pytest.Item, call: Any, report: Any) -> None:
    """A pinned test that fails otherwise than with its finding is a real failure."""
    finding = item.stash.get(_PINNED_FINDING, None)
    if finding is None or not getattr(report, "skipped", False) or call.excinfo is None:
        return
    if call.excinfo.errisinstance(pytest.skip.Exception):
        return  # skipped with its reason (the target cannot build what it needs): not run
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


def _other_target_skip_reason(item: pytest.Item, session: KVCheckSession) -> str | None:
    """Why a test marked ``kvcheck_target(name)`` is skipped: another target is checked."""
    marker = item.get_closest_marker(_TARGET_MARKER)
    wanted = marker.args[0] if marker is not None and marker.args else None
    if not isinstance(wanted, str):
        raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.{_TARGET_MARKER}('name')")
    if session.target.name == wanted:
        return None
    return (
        f"checks the {wanted} target, but the kvcheck target is {session.target.name!r}; run "
        f"with --kvcheck-target={wanted} or KVCHECK_TARGET={wanted}"
    )


def _is_tracked(item: pytest.Item, session: KVCheckSession) -> bool:
    """Tests that use kvcheck, or every test when the kvcheck command asked for results."""
    return session.record_results or _uses_kvcheck(item)


def _describe_target(target: Any) -> str:
    """``name version``, with the target's note on that version (its optional
    ``describe()``: whether kvcheck is checked against the installed release, say)."""
    text = f"{target.name} {target.version}"
    describe = getattr(target, "describe", None)
    note = describe() if callable(describe) else None
    return f"{text}, {note}" if note else text


def _describe_surface(target: Any) -> str:
    """The families and variants the target declares it builds, and the tiers around its
    pools (allocators, host pools) it declares, in one line."""
    from kvcheck.surface import surface_of

    try:
        surface = surface_of(target)
    except ValueError as exc:
        return f"malformed ({exc})"
    tiers = surface.describe_tiers()
    return f"{surface.describe()}; {tiers}" if tiers else surface.describe()


def _describe_classes(target: Any) -> str:
    """The counts of the upstream pool classes the target builds and does not (its optional
    ``classes()``), with the command that lists them; "" for a target without it.

    Read where the target is prepared (a test process), so that the discovery's imports
    come on top of the ones the run made anyway."""
    classes = getattr(target, "classes", None)
    if not callable(classes):
        return ""
    from kvcheck.targets.discovery import census_line

    try:
        entries = classes()
    except Exception as error:  # the summary says so rather than losing the run's results
        return f"discovery failed ({type(error).__name__}: {error})"
    return census_line(entries, listed_by=f"kvcheck classes --target {target.name}")


def _kvcheck_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIX)}


def _results_context(session: KVCheckSession, *, classes: bool = True) -> dict[str, Any]:
    from kvcheck.runner.db import describe_database
    from kvcheck.targets.findings import declared_findings

    describe = getattr(session.target, "describe", None)
    return {
        "target": {
            "name": session.target.name,
            "version": session.target.version,
            "note": describe() if callable(describe) else None,
            "findings": [finding.id for finding in declared_findings(session.target)],
            "source": session.target_source,
            "surface": session.prepared_target.get("surface") or _describe_surface(session.target),
            "classes": (session.prepared_target.get("classes") or _describe_classes(session.target))
            if classes
            else "",
        },
        "device": {"requested": session.device_spec, "resolved": session.device_resolved},
        "profile": session.profile_name(),
        "database": describe_database(session.database),
        "env": _kvcheck_env(),
    }
