"""The shards' results merged into one results file, per test.

Each shard returns the results file its pytest run wrote (:mod:`kvcheck.runner.results`).
The merged file has the same format, so ``kvcheck``'s summary renderers, repro scripts
and ``load_results`` read it as they read ``verify``'s; per test it adds the shards and
seeds that ran it. For one test over its shards:

- ``outcome``: failing (failed, error, xpassed) if any shard failed it; else passed if any
  shard passed it; else what its shards say (skipped, xfailed; ``interrupted`` only when
  every shard that ran it was stopped before it finished);
- ``statistics``: examples, failing, invalid, shrinks and per-phase counts added up;
- ``failures``: each distinct failure (error and minimal example) once, from the shards
  that failed it, each with its ``seed``;
- ``duration_s``, ``stored_examples`` added up; ``save_errors`` all of them.

Example:
    >>> a = {"nodeid": "t", "outcome": "passed", "statistics": {"examples": 900}}
    >>> b = {"nodeid": "t", "outcome": "failed", "statistics": {"examples": 40},
    ...      "failures": [{"error": "AssertionError: x", "example": "f(1)"}]}
    >>> merged = merge_tests([(1, 11, a), (2, 12, b)])
    >>> merged["outcome"], merged["statistics"]["examples"], merged["seeds"]
    ('failed', 940, [11, 12])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvcheck.runner.campaign.plan import Property
from kvcheck.runner.profiles import CAMPAIGN
from kvcheck.runner.results import RESULTS_FORMAT

__all__ = ["merge_results", "merge_statistics", "merge_tests"]

_FAILING = ("failed", "error", "xpassed")
#: When no shard failed or passed a test, the first of these its shards report.
_OTHERWISE = ("skipped", "xfailed", "interrupted")
_COUNTS = ("runs", "examples", "failing", "invalid", "shrinks")


def merge_tests(runs: Sequence[tuple[int, int, Mapping[str, Any]]]) -> dict[str, Any]:
    """One test's record over ``runs``: (shard number, seed, the shard's record), in order."""
    if not runs:
        raise ValueError("runs=[] must hold at least one shard's record of the test")
    records = [record for _, _, record in runs]
    outcomes = [str(record.get("outcome")) for record in records]
    failing = [(seed, r) for (_, seed, r), o in zip(runs, outcomes, strict=True) if o in _FAILING]
    if failing:
        chosen = failing[0][1]
    elif "passed" in outcomes:
        chosen = records[outcomes.index("passed")]
    else:
        chosen = next((records[outcomes.index(o)] for o in _OTHERWISE if o in outcomes), records[0])
    statistics = [r["statistics"] for r in records if r.get("statistics")]
    stored = [r["stored_examples"] for r in records if r.get("stored_examples") is not None]
    devices = sorted({str(r["device"]) for r in records if r.get("device")})
    return {
        "nodeid": chosen["nodeid"],
        "outcome": chosen.get("outcome"),
        "duration_s": round(sum(float(r.get("duration_s") or 0.0) for r in records), 3),
        "skip_reason": chosen.get("skip_reason"),
        "message": chosen.get("message"),
        "statistics": merge_statistics(statistics) if statistics else None,
        "failures": _distinct_failures(failing),
        "stored_examples": sum(stored) if stored else None,
        "device": ", ".join(devices) or None,
        "save_errors": [error for r in records for error in r.get("save_errors") or ()],
        "shards": [number for number, _, _ in runs],
        "seeds": [seed for _, seed, _ in runs],
        "failing_seeds": [seed for seed, _ in failing],
    }


def merge_statistics(statistics: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts of several runs of one test (:func:`kvcheck.runner.results.summarize_statistics`)
    added up, per phase too; ``stopped_because`` keeps each reason once.

    Example:
        >>> merge_statistics([{"examples": 3, "stopped_because": ["a"]},
        ...                   {"examples": 4, "stopped_because": ["a", "b"]}])["examples"]
        7
    """
    merged: dict[str, Any] = {name: 0 for name in _COUNTS}
    phases: dict[str, dict[str, float]] = {}
    stopped: list[str] = []
    for stats in statistics:
        for name in _COUNTS:
            merged[name] += int(stats.get(name) or 0)
        for phase, counts in (stats.get("phases") or {}).items():
            entry = phases.setdefault(phase, {})
            for key, value in counts.items():
                entry[key] = entry.get(key, 0) + value
        stopped += [r for r in stats.get("stopped_because") or () if r not in stopped]
    merged["phases"] = phases
    merged["stopped_because"] = stopped
    return merged


def merge_results(
    outcomes: Sequence[Mapping[str, Any]],
    *,
    properties: Sequence[Property],
    duration_s: float,
    campaign: Mapping[str, Any],
) -> dict[str, Any]:
    """The campaign's results file: the shards' ``outcomes`` (:func:`~kvcheck.runner.campaign.
    shard.run_shard`'s dicts) merged per test, in the order of ``properties``; a test skipped
    at collection is listed as skipped with its reason. ``campaign`` is kept under that key.

    Example:
        >>> results = merge_results([], properties=[Property("t", "m", "t", skip="no GPU")],
        ...                         duration_s=1.0, campaign={})
        >>> results["tests"][0]["outcome"], results["tests"][0]["skip_reason"]
        ('skipped', 'no GPU')
    """
    runs: dict[str, list[tuple[int, int, Mapping[str, Any]]]] = {}
    context: dict[str, Any] = {}
    collection_errors: list[Any] = []
    for outcome in outcomes:
        results = outcome.get("results") or {}
        if results and not context:
            context = {key: results.get(key) for key in ("target", "device", "database", "env")}
        collection_errors += [e for e in results.get("collection_errors") or () if e]
        for record in results.get("tests") or ():
            runs.setdefault(record["nodeid"], []).append(
                (int(outcome["shard"]), int(outcome["seed"]), record)
            )
    tests = []
    for prop in properties:
        if prop.nodeid in runs:
            tests.append(merge_tests(runs.pop(prop.nodeid)))
        elif prop.skip is not None:
            tests.append(_never_run(prop.nodeid, "skipped", prop.skip))
    tests += [merge_tests(rest) for rest in runs.values()]  # a test the plan did not list
    return {
        "format": RESULTS_FORMAT,
        **context,
        "profile": CAMPAIGN,
        "duration_s": round(duration_s, 3),
        "collection_errors": _distinct(collection_errors),
        "tests": tests,
        "campaign": dict(campaign),
    }


def _never_run(nodeid: str, outcome: str, reason: str | None) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "outcome": outcome,
        "duration_s": 0.0,
        "skip_reason": reason,
        "message": None,
        "statistics": None,
        "failures": [],
        "stored_examples": None,
        "device": None,
        "save_errors": [],
        "shards": [],
        "seeds": [],
        "failing_seeds": [],
    }


def _distinct_failures(failing: Sequence[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    seen: set[tuple[str, str]] = set()
    failures = []
    for seed, record in failing:
        for failure in record.get("failures") or ():
            key = (str(failure.get("error")), str(failure.get("example")))
            if key not in seen:
                seen.add(key)
                failures.append({**failure, "seed": seed})
    return failures


def _distinct(items: Sequence[Any]) -> list[Any]:
    kept: list[Any] = []
    for item in items:
        if item not in kept:
            kept.append(item)
    return kept
