"""The campaign's JUnit XML: one test case per test of the suite, over all its shards.

CI systems read JUnit, not kvcheck's results file, so the merged results
(:mod:`kvcheck.runner.campaign.merge`) are written as one ``<testsuite>``: per test its
time, a ``<failure>`` (error, minimal example, ``@reproduce_failure`` line, seed and
standalone script) per distinct failure, an ``<error>``, or a ``<skipped>`` with its
reason, and ``<properties>`` with its examples, shards and seeds.

Example:
    >>> xml = junit_xml({"tests": [{"nodeid": "s/test_a.py::test_x", "outcome": "passed",
    ...                             "duration_s": 2.0, "statistics": {"examples": 900},
    ...                             "seeds": [1, 2]}]})
    >>> print(xml.splitlines()[1])
    <testsuites name="kvcheck campaign" tests="1" failures="0" errors="0" skipped="0" time="2.000">
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

__all__ = ["junit_xml"]

_FAILED = ("failed", "xpassed")
_NOT_RUN = ("skipped", "xfailed", "interrupted")


def junit_xml(results: Mapping[str, Any]) -> str:
    """The JUnit XML of a (merged) results dict, as text."""
    tests = list(results.get("tests", ()))
    counts = {
        "tests": str(len(tests)),
        "failures": str(sum(t.get("outcome") in _FAILED for t in tests)),
        "errors": str(sum(t.get("outcome") == "error" for t in tests)),
        "skipped": str(sum(t.get("outcome") in _NOT_RUN for t in tests)),
        "time": f"{sum(float(t.get('duration_s') or 0.0) for t in tests):.3f}",
    }
    root = ET.Element("testsuites", {"name": "kvcheck campaign", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "kvcheck campaign", **counts})
    target = results.get("target") or {}
    _properties(
        suite,
        {
            "target": target.get("name"),
            "profile": results.get("profile"),
            "database": results.get("database"),
        },
    )
    for test in tests:
        _testcase(suite, test)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


def _testcase(suite: ET.Element, test: Mapping[str, Any]) -> None:
    path, _, name = str(test["nodeid"]).rpartition("::")
    case = ET.SubElement(
        suite,
        "testcase",
        {
            "classname": path.removesuffix(".py").replace("/", ".") or "suite",
            "name": name or str(test["nodeid"]),
            "time": f"{float(test.get('duration_s') or 0.0):.3f}",
        },
    )
    statistics = test.get("statistics") or {}
    _properties(
        case,
        {
            "examples": statistics.get("examples"),
            "shards": len(test.get("shards") or test.get("seeds") or ()),
            "seeds": " ".join(map(str, test.get("seeds") or ())),
        },
    )
    outcome = test.get("outcome")
    if outcome in _FAILED:
        failures = test.get("failures") or [{"error": test.get("message") or outcome}]
        for failure in failures:
            element = ET.SubElement(
                case, "failure", {"message": str(failure.get("error")).splitlines()[0]}
            )
            element.text = _failure_text(failure)
    elif outcome == "error":
        ET.SubElement(case, "error", {"message": str(test.get("message") or "error")})
    elif outcome in _NOT_RUN:
        reason = test.get("skip_reason") or (
            "not finished within the campaign" if outcome == "interrupted" else outcome
        )
        ET.SubElement(case, "skipped", {"message": str(reason)})


def _failure_text(failure: Mapping[str, Any]) -> str:
    lines = [str(failure.get("error"))]
    if failure.get("reproduction"):
        lines.append(str(failure["reproduction"]))
    if failure.get("blob"):
        lines.append(f"reproduce with: {failure['blob']}")
    if failure.get("seed") is not None:
        lines.append(f"found with --hypothesis-seed={failure['seed']}")
    if failure.get("script"):
        lines.append(f"standalone script: python {failure['script']}")
    return "\n".join(lines)


def _properties(parent: ET.Element, values: Mapping[str, Any]) -> None:
    element = ET.SubElement(parent, "properties")
    for name, value in values.items():
        if value is not None and value != "":
            ET.SubElement(element, "property", {"name": name, "value": str(value)})
