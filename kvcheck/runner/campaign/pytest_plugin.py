"""The campaign's side of a pytest run, loaded with ``-p kvcheck.runner.campaign.pytest_plugin``.

``--kvcheck-campaign-plan FILE``
    With ``--collect-only``: write the collected tests as JSON to FILE, each with its
    module, its property (test function) and the reason it is skipped at collection, if it
    is (the target's missing capability, no GPU). The campaign plans its shards from it.
``--kvcheck-campaign-test NODEID`` (repeatable)
    Run only these tests. The whole suite is collected, as ``kvcheck verify`` collects it,
    so every node id (and with it the database key of a parametrized property) is the
    one ``verify`` and ``replay`` use; a test that is not collected here is a usage error.
``--kvcheck-campaign-examples N``
    Every Hypothesis test (state machines too) runs ``N`` examples: the kvcheck profile in
    effect is loaded again with ``max_examples=N``. One shard, one count.
``--kvcheck-campaign-seed N``
    Every Hypothesis test (state machines too) draws from ``Random(N)``, as under
    ``--hypothesis-seed N``, but as ``@seed(N)`` does it: per test. Hypothesis turns the
    example database off under ``--hypothesis-seed``, and a campaign's failures must be
    stored, shrunk once and replayed; with ``@seed`` the database stays on.
``--kvcheck-campaign-progress FILE``
    Count test cases as they run and keep the counts in FILE, as JSON
    (``{"tests": {nodeid: test cases}}``), rewritten whole (never half written) at most
    every half second and when a test ends. A test case is one call of a ``@given`` test's
    body or one run of a state machine (one machine built), shrinking included: the shard
    reads the file while pytest runs, so the campaign's progress line counts examples as
    they run, not only when a shard finishes.

Example:
    >>> _function("test_x[mha]")
    'test_x'
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["EXAMPLES_OPTION", "PLAN_OPTION", "PROGRESS_OPTION", "SEED_OPTION", "TEST_OPTION"]

PLAN_OPTION = "--kvcheck-campaign-plan"
TEST_OPTION = "--kvcheck-campaign-test"
EXAMPLES_OPTION = "--kvcheck-campaign-examples"
SEED_OPTION = "--kvcheck-campaign-seed"
PROGRESS_OPTION = "--kvcheck-campaign-progress"
#: The progress file is rewritten at most this often while a test runs.
_PROGRESS_INTERVAL_S = 0.5
#: What ``@seed(N)`` sets on a test; a state machine class passes it to its test.
_SEED_ATTRIBUTE = "_hypothesis_internal_use_seed"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck-campaign", "kvcheck campaign (used by kvcheck campaign)")
    group.addoption(
        PLAN_OPTION,
        default=None,
        metavar="FILE",
        help="with --collect-only: write the collected tests and their skips to FILE as JSON",
    )
    group.addoption(
        TEST_OPTION,
        action="append",
        default=None,
        metavar="NODEID",
        help="run only this test (repeatable); one that is not collected is a usage error",
    )
    group.addoption(
        EXAMPLES_OPTION,
        default=None,
        type=int,
        metavar="N",
        help="run every Hypothesis test with max_examples=N (the kvcheck profile in effect)",
    )
    group.addoption(
        SEED_OPTION,
        default=None,
        type=int,
        metavar="N",
        help="seed every Hypothesis test (state machines too) as @seed(N) does; unlike "
        "--hypothesis-seed, the example database stays on",
    )
    group.addoption(
        PROGRESS_OPTION,
        default=None,
        metavar="FILE",
        help="count each test's test cases as they run and keep the counts in FILE (JSON)",
    )


class _Counter:
    """Test cases run per test, written to ``path`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: dict[str, int] = {}
        self.nodeid: str | None = None
        self._written_at = 0.0

    def add(self) -> None:
        if self.nodeid is None:
            return
        self.counts[self.nodeid] = self.counts.get(self.nodeid, 0) + 1
        if time.monotonic() - self._written_at >= _PROGRESS_INTERVAL_S:
            self.write()

    def write(self) -> None:
        self._written_at = time.monotonic()
        scratch = self.path.with_name(self.path.name + ".tmp")
        try:
            scratch.write_text(json.dumps({"tests": self.counts}), encoding="utf-8")
            os.replace(scratch, self.path)
        except OSError:  # progress is a courtesy: never fail a test over it
            pass


_counter: _Counter | None = None
_machine_init: Any = None


def _count_machines(counter: _Counter) -> None:
    """Count every state machine built (one per test case of a state-machine test)."""
    global _machine_init
    from hypothesis.stateful import RuleBasedStateMachine

    original = RuleBasedStateMachine.__init__
    _machine_init = original

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        counter.add()
        original(self, *args, **kwargs)

    RuleBasedStateMachine.__init__ = counted  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    global _counter, _machine_init
    if _counter is not None:
        _counter.write()
        _counter = None
    if _machine_init is not None:
        from hypothesis.stateful import RuleBasedStateMachine

        RuleBasedStateMachine.__init__ = _machine_init  # type: ignore[method-assign]
        _machine_init = None


@pytest.hookimpl(trylast=True)  # after kvcheck's plugin loaded its profile
def pytest_configure(config: pytest.Config) -> None:
    global _counter
    progress = config.getoption("kvcheck_campaign_progress")
    if progress is not None:
        _counter = _Counter(Path(progress))
        _count_machines(_counter)
    seed = config.getoption("kvcheck_campaign_seed")
    if seed is not None:
        from hypothesis.stateful import RuleBasedStateMachine

        # Every machine class inherits it; run_state_machine_as_test passes it on.
        setattr(RuleBasedStateMachine, _SEED_ATTRIBUTE, seed)
    examples = config.getoption("kvcheck_campaign_examples")
    if examples is None:
        return
    if examples < 1:
        raise pytest.UsageError(f"{EXAMPLES_OPTION}={examples} must be at least 1")
    from hypothesis import settings

    name = settings.get_current_profile_name()
    settings.register_profile(name, settings.get_profile(name), max_examples=examples)
    settings.load_profile(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Seed a ``@given`` test as ``@seed`` would, and count its test cases, for the duration
    of its call."""
    seed = item.config.getoption("kvcheck_campaign_seed")
    test = getattr(item, "obj", None)
    test = getattr(test, "__func__", test)
    given = getattr(test, "is_hypothesis_test", False) is True
    if _counter is not None:
        _counter.nodeid = item.nodeid
    before = getattr(test, _SEED_ATTRIBUTE, None)
    if given and seed is not None:
        setattr(test, _SEED_ATTRIBUTE, seed)
    try:
        with _counting(test if given and _counter is not None else None):
            yield
    finally:
        if given and seed is not None:
            setattr(test, _SEED_ATTRIBUTE, before)
        if _counter is not None:
            _counter.nodeid = None
            _counter.write()


@contextlib.contextmanager
def _counting(test: Any) -> Iterator[None]:
    """While it runs, count each call of the ``@given`` test's body (Hypothesis calls
    ``test.hypothesis.inner_test`` once per test case, and lets it be replaced)."""
    hypothesis: Any = getattr(test, "hypothesis", None)
    inner = getattr(hypothesis, "inner_test", None)
    if test is None or inner is None or _counter is None:
        yield
        return
    counter = _counter

    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter.add()
        return inner(*args, **kwargs)

    hypothesis.inner_test = counted
    try:
        yield
    finally:
        hypothesis.inner_test = inner


@pytest.hookimpl(trylast=True)  # after kvcheck's plugin added the target's skips
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config.getoption("kvcheck_campaign_test")
    if wanted:
        _select(config, items, wanted)
    path = config.getoption("kvcheck_campaign_plan")
    if path is not None:
        tests = [_described(item) for item in items]
        Path(path).write_text(json.dumps({"tests": tests}, indent=1), encoding="utf-8")


def _select(config: pytest.Config, items: list[pytest.Item], wanted: list[str]) -> None:
    missing = sorted(set(wanted) - {item.nodeid for item in items})
    if missing:
        raise pytest.UsageError(
            f"{TEST_OPTION}: {len(missing)} test(s) not collected here: {', '.join(missing)} "
            "(is the same kvcheck, target and working directory on every node?)"
        )
    keep = set(wanted)
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
    items[:] = [item for item in items if item.nodeid in keep]


def _described(item: pytest.Item) -> dict[str, Any]:
    module = getattr(getattr(item, "module", None), "__name__", "") or ""
    return {
        "nodeid": item.nodeid,
        "module": module.rpartition(".")[2] or Path(str(item.path)).stem,
        "function": getattr(item, "originalname", None) or _function(item.name),
        "skip": _skip_reason(item),
    }


def _function(name: str) -> str:
    """A test's function name: its name without parameters."""
    return name.partition("[")[0]


def _skip_reason(item: pytest.Item) -> str | None:
    """The reason of a ``skip`` marker, or of a ``skipif`` whose condition holds."""
    try:
        from _pytest.skipping import evaluate_skip_marks
    except ImportError:  # pytest moved it: fall back to the plain skip marker
        marker = item.get_closest_marker("skip")
        return None if marker is None else str(marker.kwargs.get("reason", "skipped"))
    skipped = evaluate_skip_marks(item)
    return None if skipped is None else str(skipped.reason or "skipped")
