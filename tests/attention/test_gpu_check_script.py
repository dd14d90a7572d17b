"""scripts/gpu_check.py reads kvcheck's results file into per-test outcomes and examples."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve their annotations through sys.modules while the module loads
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


#: What kvcheck's plugin writes with --kvcheck-results (kvcheck.results.ResultsCollector).
RESULTS = {
    "format": 1,
    "tests": [
        {
            "nodeid": "tests/attention/test_gpu.py::test_flash_matches_torch_reference",
            "outcome": "failed",
            "duration_s": 1.334,
            "message": "AssertionError: got 1 but should be 2",
            "statistics": {"examples": 41, "failing": 1, "invalid": 1},
        },
        {
            "nodeid": "tests/attention/test_gpu.py::test_raw_equals_paged_on_cuda_torch",
            "outcome": "skipped",
            "duration_s": 0.1,
            "skip_reason": "needs a CUDA device",
            "statistics": None,
        },
        {
            "nodeid": "tests/attention/test_padding.py::test_no_padding_leaves_offsets_unchanged",
            "outcome": "passed",
            "duration_s": 0.01,
        },
    ],
}


def test_results_become_cases_with_outcomes_and_examples(gpu_check):
    """Each recorded test yields its node id, outcome, time, message and Hypothesis examples."""
    failed, skipped, passed = gpu_check.cases_from_results(RESULTS, suite="attention")
    assert failed.nodeid == "tests/attention/test_gpu.py::test_flash_matches_torch_reference"
    assert (failed.outcome, failed.time_s, failed.examples) == ("failed", 1.33, 41)
    assert failed.message == "AssertionError: got 1 but should be 2"
    assert (skipped.outcome, skipped.message, skipped.examples) == (
        "skipped",
        "needs a CUDA device",
        None,
    )
    assert passed.outcome == "passed" and passed.nodeid.startswith(
        "tests/attention/test_padding.py"
    )


def test_bad_budget_is_a_usage_error(gpu_check, capsys):
    """A non-positive --budget is refused before anything runs."""
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--budget", "0"])
    assert exit_info.value.code == 2 and "--budget=0.0" in capsys.readouterr().err
