"""scripts/gpu_check.py reads kvcheck's results file into per-test outcomes and examples."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

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


#: What kvcheck's plugin writes with --kvcheck-results (kvcheck.runner.results.ResultsCollector).
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


def test_bad_stage_and_workers_are_usage_errors(gpu_check, capsys):
    """An unknown --only stage or --workers below 1 is refused, naming the option."""
    for argv, named in ((["--only", "nope"], "--only=nope"), (["--workers", "0"], "--workers=0")):
        with pytest.raises(SystemExit) as exit_info:
            gpu_check.main(["--device", "cpu", *argv])
        assert exit_info.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_cuda_run_without_cuda_is_refused(gpu_check, tmp_path, capsys):
    """--device cuda where torch sees no GPU exits 2 and points at the dry run."""
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("status", "exit_code"), [("absent", 5), ("timed_out", None), ("crashed", 3)]
)
def test_a_suite_that_did_not_pass_is_a_failed_stage(gpu_check, status, exit_code):
    """No test collected (exit 5), a timeout or a crash is a failure, never a silent pass."""
    suite = gpu_check.SuiteResult("suite-kvcheck", ["pytest"], status, exit_code, 1.0)
    assert gpu_check.check_suite(suite).status == "failed"


def test_cpu_dry_run_runs_what_needs_no_cuda_and_reports(gpu_check, tmp_path, capsys):
    """The dry run's in-process stages pass on CPU, CUDA-only ones are skipped with the
    reason, and the JSON and Markdown reports and the verdict line are written."""
    stages = ["memory-report", "memory-cuda", "attention-flash", "move-throughput"]
    argv = ["--device", "cpu", "--out", str(tmp_path)]
    for name in stages:
        argv += ["--only", name]
    assert gpu_check.main(argv) == 0
    verdict = [line for line in capsys.readouterr().out.splitlines() if "verdict" in line]
    assert len(verdict) == 1 and "OK on cpu" in verdict[0]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    by_name = {stage["name"]: stage for stage in report["stages"]}
    assert list(by_name) == stages
    assert by_name["memory-cuda"]["status"] == "skipped"
    assert "needs CUDA" in by_name["memory-cuda"]["reason"]
    for name in ("memory-report", "attention-flash", "move-throughput"):
        assert by_name[name]["status"] == "passed", by_name[name]
    flash = by_name["attention-flash"]["figures"]
    assert {"float16", "bfloat16"} <= set(flash)
    assert flash["bfloat16"]["max_abs_error"] >= flash["bfloat16"]["p99_9_abs_error"] >= 0
    move = by_name["move-throughput"]["figures"]
    assert move["move_to_copy_ratio"] > 0 and move["moved_bytes"] > 0
    assert report["environment"]["torch"] == torch.__version__
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| memory-cuda | skipped |" in markdown


def test_sgl_kernel_stand_in_imports_and_raises_when_called(gpu_check, tmp_path):
    """The stand-in satisfies sglang's imports (submodules too) and any call raises."""
    gpu_check._sgl_kernel_stand_in(tmp_path)
    probe = (
        "from sgl_kernel.kvcacheio import transfer_kv_per_layer\n"
        "from sgl_kernel import moe_sum\n"
        "try:\n"
        "    transfer_kv_per_layer(1)\n"
        "except RuntimeError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.startswith("StandInCalled ")
    assert "sgl_kernel.kvcacheio.transfer_kv_per_layer" in result.stdout
