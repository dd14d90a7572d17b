"""Running a target's declared expected failures: strict, and without wasted shrinking.

A target lists the suite tests it is known to fail in ``expected_failures`` (see
:func:`kvcheck.targets.expected_failure_reason`). The pytest plugin runs each as a strict
``xfail``, so a discrepancy that gets fixed fails the run as XPASS(strict) until its entry
is removed. Such a test only has to fail: its minimal reproduction lives in the narrow
pinned test that accompanies every entry. So while it runs, Hypothesis stops at the first
failing example and neither shrinks nor explains it (:func:`failing_fast`), which keeps a
target with many findings from spending minutes minimizing failures nobody reads. It may
also try up to :data:`FAIL_FAST_MIN_EXAMPLES` examples, so that a finding that only some
inputs reach is still found on every run: a strict xfail that passes by luck would fail
the run for nothing. Stopping at the first failure keeps that cheap.

Example::

    with failing_fast(test_function):
        test_function()  # a @given test or one that runs a state machine
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "FAIL_FAST_MIN_EXAMPLES",
    "FAIL_FAST_PROFILE",
    "failing_fast",
    "generates_examples",
    "pinned_failure_mismatch",
]

#: The Hypothesis profile loaded while an expected failure runs (the current profile,
#: without the shrink and explain phases, stopping at the first bug).
FAIL_FAST_PROFILE = "kvcheck-expected-failure"

#: The fewest examples an expected failure may try before it counts as passing.
FAIL_FAST_MIN_EXAMPLES = 1000

# Hypothesis keeps a @given test's settings on this attribute; there is no public way to
# change them for one run and put them back.
_SETTINGS_ATTR = "_hypothesis_internal_use_settings"


def generates_examples() -> bool:
    """Whether the current Hypothesis profile generates new examples (False for replay).

    A profile that only replays stored examples cannot be relied on to make an expected
    failure fail, so the plugin does not make those xfails strict under it.

    Example:
        >>> isinstance(generates_examples(), bool)
        True
    """
    from hypothesis import Phase, settings

    return Phase.generate in settings().phases


@contextlib.contextmanager
def failing_fast(test_function: Any) -> Iterator[None]:
    """Within the block, Hypothesis runs ``test_function`` and any state machine it runs
    without shrinking or explaining, stops at the first failing example, and tries at
    least :data:`FAIL_FAST_MIN_EXAMPLES` examples before giving up on finding one.

    The current profile is replaced by :data:`FAIL_FAST_PROFILE` (state machines read it
    when they start) and a ``@given`` test's own settings by a fast copy; both are put
    back on exit.

    Example:
        >>> with failing_fast(lambda: None):
        ...     pass
    """
    from hypothesis import Phase, settings

    def fast(parent: Any) -> Any:
        phases = tuple(p for p in parent.phases if p not in (Phase.shrink, Phase.explain))
        examples = max(parent.max_examples, FAIL_FAST_MIN_EXAMPLES)
        return settings(parent, phases=phases, report_multiple_bugs=False, max_examples=examples)

    previous_profile = _current_profile_name(settings)
    settings.register_profile(FAIL_FAST_PROFILE, fast(settings()))
    settings.load_profile(FAIL_FAST_PROFILE)
    own = getattr(test_function, _SETTINGS_ATTR, None)
    if own is not None:
        setattr(test_function, _SETTINGS_ATTR, fast(own))
    try:
        yield
    finally:
        if own is not None:
            setattr(test_function, _SETTINGS_ATTR, own)
        settings.load_profile(previous_profile)


def _current_profile_name(settings: Any) -> str:
    getter = getattr(settings, "get_current_profile_name", None)
    if getter is not None:
        return str(getter())
    return str(getattr(settings, "_current_profile", "default"))


def pinned_failure_mismatch(finding: Any, error: BaseException) -> str | None:
    """Why ``error`` is not the failure ``finding`` pins (None when it is).

    A pinned test must fail with the finding's own failure: every distinct failure
    Hypothesis reports (an ``ExceptionGroup`` holds several) must be a
    :class:`~kvcheck.properties.PropertyFailure` whose signature the finding matches.

    Example:
        >>> from kvcheck.failures import FailureSignature, PropertyFailure
        >>> from kvcheck.targets.findings import Finding
        >>> n2 = Finding("N2", "no-op move signature", call="move_kv_cache")
        >>> pinned_failure_mismatch(n2, PropertyFailure("x", signature=FailureSignature(
        ...     call="move_kv_cache"))) is None
        True
        >>> pinned_failure_mismatch(n2, TypeError("boom"))
        'TypeError: boom is not finding N2 (no-op move signature)'
    """
    from kvcheck.failures import PropertyFailure, leaf_exceptions

    leaves = list(leaf_exceptions(error))
    for leaf in leaves:
        if not isinstance(leaf, PropertyFailure) or not finding.matches(leaf.signature):
            first = str(leaf).splitlines()[0] if str(leaf) else ""
            return f"{type(leaf).__name__}: {first} is not finding {finding.id} ({finding.summary})"
    return None
