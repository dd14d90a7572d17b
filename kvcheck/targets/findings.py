"""Declared findings: known discrepancies of a target that mask nothing else.

A target lists what the suite is known to find in it as :class:`Finding` values in its
optional ``findings`` member. A finding names its own failure (the property that fails,
the pool or target method, the kind of difference, the pool family) rather than a test
id, and the suite treats it in three ways:

- **Steering.** While a suite test runs, a :class:`~kvcheck.properties.PropertyFailure`
  that matches a declared finding does not fail the test: the Hypothesis example is
  rejected (:func:`steer_around`) and generation goes on, so the same property keeps
  checking everything else. Generators also avoid what the finding's ``steer`` names
  (:class:`kvcheck.steering.Steer` values, together :func:`steered_tags`) so that little
  time is spent on examples that would be rejected.
  Any other failure in the same test fails the run.
- **Pinning.** Each finding names the tests that pin its minimal case (``pinned``,
  node-id patterns as in :func:`kvcheck.targets.expected_failure_reason`). Those run as
  strict expected failures that must fail *with this finding's signature*: a pinned test
  that passes (the discrepancy was fixed) or fails differently fails the run.
- **Reporting.** Every steered example is counted as a Hypothesis event
  (``kvcheck: steered around finding N1``), visible in the statistics.

Example:
    >>> from kvcheck.failures import FailureSignature
    >>> n1 = Finding("N1", "no-op load_cpu_copy does not raise", check="raises",
    ...              call="load_cpu_copy", family="noop")
    >>> n1.matches(FailureSignature(check="raises", call="load_cpu_copy", family="noop",
    ...                             kind="no exception instead of RuntimeError"))
    True
    >>> n1.matches(FailureSignature(check="raises", call="set_kv_buffer", family="noop"))
    False
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvcheck.failures import FailureSignature, PropertyFailure
from kvcheck.steering import Steer, Steering

__all__ = [
    "SIGNATURE_FIELDS",
    "STEERED_EVENT",
    "Finding",
    "active_findings",
    "declared_findings",
    "finding_problems",
    "matching_finding",
    "pinned_finding",
    "steer_around",
    "steered_tags",
]

#: The Hypothesis event recorded for each example steered around a finding (then its id).
STEERED_EVENT = "kvcheck: steered around finding "

#: The fields of :class:`FailureSignature` a finding may constrain.
SIGNATURE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FailureSignature))


@dataclass(frozen=True)
class Finding:
    """One known discrepancy of a target, described by the failure it causes.

    ``check``, ``call``, ``kind`` and ``family`` must each equal the failure's
    :class:`FailureSignature` field where they are non-empty; a value may end in ``*`` to
    match a prefix, start with ``*`` to match a suffix, or both, to match what it
    contains (``family="*kpool*"``: every variant with an index kpool). ``steer`` says what
    the suite's generators avoid for this target (:class:`kvcheck.steering.Steer` values,
    their kinds in :data:`kvcheck.steering.STEER_KINDS`); ``pinned`` the tests that pin the
    minimal case. ``severity`` classes it (sglang's: serving bug, latent bug, precondition,
    contract difference) and ``releases`` says where it holds (anything that answers
    ``release in releases``; None: every release). A finding with no signature (no check,
    call, kind or family) is documentation only: it matches no failure.
    """

    id: str
    summary: str
    check: str = ""
    call: str = ""
    kind: str = ""
    family: str = ""
    steer: frozenset[Steer] = frozenset()
    pinned: tuple[str, ...] = ()
    severity: str = ""
    releases: Container[str] | None = None

    @property
    def signed(self) -> bool:
        """Whether the finding names the failure it causes (a check, call, kind or family)."""
        return any(getattr(self, name) for name in SIGNATURE_FIELDS)

    def matches(self, signature: FailureSignature) -> bool:
        """Whether a failure with ``signature`` is this finding's.

        Example:
            >>> Finding("X", "x", kind="no exception*").matches(
            ...     FailureSignature(kind="no exception instead of ValueError"))
            True
            >>> kpool = Finding("T", "t", family="*kpool*")
            >>> kpool.matches(FailureSignature(family="dsa:kpool:dcp"))
            True
        """
        if not self.signed:
            return False
        for name in SIGNATURE_FIELDS:
            wanted = getattr(self, name)
            got = getattr(signature, name)
            if not wanted:
                continue
            if len(wanted) > 1 and wanted[0] == wanted[-1] == "*" and wanted[1:-1] in got:
                continue
            if wanted.endswith("*") and got.startswith(wanted[:-1]):
                continue
            if wanted.startswith("*") and got.endswith(wanted[1:]):
                continue
            if got != wanted:
                return False
        return True


def declared_findings(target: Any) -> tuple[Finding, ...]:
    """The target's ``findings`` (empty when it declares none).

    Example:
        >>> declared_findings(object())
        ()
    """
    return tuple(getattr(target, "findings", None) or ())


def finding_problems(findings: object) -> list[str]:
    """What is wrong with a ``findings`` declaration (empty if fine).

    Example:
        >>> finding_problems([Finding("A", "a", call="move_kv_cache")])
        []
        >>> finding_problems(["A"])
        ["findings[0]: 'A' is not a kvcheck.targets.findings.Finding"]
        >>> finding_problems([Finding("A", "a", call="x", steer=frozenset({"noop:move"}))])
        ["findings[0] (A): steer: 'noop:move' is not a kvcheck.steering.Steer (the tag 'noop:move' is Steer(what='move', where='noop'))"]
    """  # noqa: E501
    if isinstance(findings, str | bytes) or not isinstance(findings, Sequence):
        return [f"findings: {findings!r} (expected a sequence of Finding)"]
    problems: list[str] = []
    seen: set[str] = set()
    for index, finding in enumerate(findings):
        if not isinstance(finding, Finding):
            problems.append(
                f"findings[{index}]: {finding!r} is not a kvcheck.targets.findings.Finding"
            )
            continue
        if not finding.id or finding.id in seen:
            problems.append(f"findings[{index}]: id {finding.id!r} is empty or repeated")
        seen.add(finding.id)
        if not any(getattr(finding, name) for name in SIGNATURE_FIELDS):
            problems.append(
                f"findings[{index}] ({finding.id}): names no check, call, kind or family, "
                "so it matches no failure"
            )
        try:
            Steering(finding.steer)
        except ValueError as exc:
            why = str(exc).removeprefix("steering: ")
            problems.append(f"findings[{index}] ({finding.id}): steer: {why}")
    return problems


def matching_finding(findings: Iterable[Finding], signature: FailureSignature) -> Finding | None:
    """The first of ``findings`` that ``signature`` matches, else None.

    Example:
        >>> matching_finding([Finding("A", "a", call="x")], FailureSignature(call="y")) is None
        True
    """
    for finding in findings:
        if finding.matches(signature):
            return finding
    return None


def steered_tags(target: Any) -> Steering:
    """Everything the target's findings ask the suite's generators to steer around.

    Example:
        >>> steered_tags(object())
        Steering()
    """
    return Steering(steer for finding in declared_findings(target) for steer in finding.steer)


def pinned_finding(target: Any, nodeid: str) -> Finding | None:
    """The finding whose ``pinned`` patterns name test ``nodeid``, else None.

    Example:
        >>> pinned_finding(object(), "tests/test_x.py::test_y") is None
        True
    """
    from kvcheck.targets import nodeid_matches

    for finding in declared_findings(target):
        if any(nodeid_matches(pattern, nodeid) for pattern in finding.pinned):
            return finding
    return None


_ACTIVE: contextvars.ContextVar[tuple[Finding, ...]] = contextvars.ContextVar(
    "kvcheck_active_findings", default=()
)


@contextlib.contextmanager
def active_findings(findings: Iterable[Finding]) -> Iterator[None]:
    """Within the block, failures matching ``findings`` are steered around.

    The pytest plugin wraps every test of a target that declares findings in this,
    except the tests that pin a finding (they must fail with it).

    Example:
        >>> with active_findings([]):
        ...     pass
    """
    token = _ACTIVE.set(tuple(findings))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def steer_around(error: PropertyFailure) -> Exception:
    """``error``, or, when it matches an active finding inside a running Hypothesis
    example, the rejection of that example (recorded as a Hypothesis event).

    Example:
        >>> steer_around(PropertyFailure("x")).args
        ('x',)
    """
    finding = matching_finding(_ACTIVE.get(), error.signature)
    if finding is None:
        return error
    from hypothesis import event
    from hypothesis.control import currently_in_test_context
    from hypothesis.errors import UnsatisfiedAssumption

    if not currently_in_test_context():
        return error
    event(f"{STEERED_EVENT}{finding.id}")
    return UnsatisfiedAssumption(f"kvcheck: known finding {finding.id}: {finding.summary}")
