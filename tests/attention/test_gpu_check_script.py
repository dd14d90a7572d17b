"""scripts/gpu_check.py reads pytest's JUnit report into per-test outcomes and examples."""

from __future__ import annotations

import base64
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


STATISTICS = """tests/attention/test_gpu.py::test_flash_matches_torch_reference:

  - during generate phase (1.20 seconds):
    - Typical runtimes: ~ 5ms, of which < 1ms in data generation
    - 38 passing examples, 0 failing examples, 1 invalid examples

  - during shrink phase (0.10 seconds):
    - 2 passing examples, 1 failing examples, 0 invalid examples
"""


def _junit() -> str:
    encoded = base64.b64encode(STATISTICS.encode()).decode()
    return f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<properties><property name="hypothesis-statistics-tests/attention/test_gpu.py::\
test_flash_matches_torch_reference" value="{encoded}"/></properties>
<testcase classname="tests.attention.test_gpu" name="test_flash_matches_torch_reference"
 time="1.334"><failure message="AssertionError: got 1 but should be 2">trace</failure></testcase>
<testcase classname="tests.attention.test_gpu" name="test_raw_equals_paged_on_cuda_torch"
 time="0.1"><skipped type="pytest.skip" message="needs a CUDA device">skip</skipped></testcase>
<testcase classname="tests.attention.test_padding" name="test_no_padding_leaves_offsets_unchanged"
 time="0.01"/>
</testsuite></testsuites>"""


def test_examples_are_counted_over_every_phase(gpu_check):
    """Passing plus failing examples of all phases make the example count."""
    assert gpu_check.examples_from_statistics(STATISTICS) == 41


def test_junit_cases_become_results_with_outcomes_and_examples(gpu_check):
    """Each test case yields its node id, outcome, time, message and Hypothesis examples."""
    failed, skipped, passed = gpu_check.parse_junit(_junit(), suite="attention")
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
