"""kvcheck's shipped suite against this package: kvcheck verify --target downstream_pool:target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_kvcheck_verify_passes_and_skips_unsupported_families(tmp_path: Path) -> None:
    """Every suite property passes on the MHA pool or is skipped with the target's reason."""
    summary = tmp_path / "summary.json"
    env = {
        name: value
        for name, value in os.environ.items()
        # An outer xdist worker's variables would make the suite's pytest act as a worker.
        if not name.startswith(("PYTEST_XDIST_", "KVCHECK_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["KVCHECK_DB"] = str(tmp_path / "examples")
    command = [
        sys.executable,
        "-m",
        "kvcheck.runner.cli",
        "verify",
        "--target",
        "downstream_pool:target",
        "--device",
        "cpu",
        "--json",
        str(summary),
    ]
    finished = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )

    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    results = json.loads(summary.read_text())
    assert results["target"]["name"] == "downstream-pool"
    outcomes = {test["nodeid"]: test for test in results["tests"]}
    assert any(test["outcome"] == "passed" for test in outcomes.values())
    for test in outcomes.values():
        if test["outcome"] == "skipped":
            assert "downstream-pool" in test["skip_reason"] or "CUDA" in test["skip_reason"]
