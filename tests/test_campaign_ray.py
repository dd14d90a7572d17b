"""kvcheck campaign on a real local Ray cluster, sharing a real Redis example database.

The twin is ``RareCombinationWriteMHA`` (``broken_pools.py``): its bug needs four draws at
once, and the default run (100 examples, ``kvcheck-ci``) misses it with
``--hypothesis-seed`` 2, 3 and 5 (found with 0, 1 and 4). The campaign starts at seed 2, so
its first two shards search where a default run finds nothing; 2 workers, a 2-minute
budget as the upper bound (the campaign ends as soon as its one selected test has failed),
then ``kvcheck replay`` from the shared database.

Skipped, with a reason, where ray (the ``campaign`` extra) or ``redis-server`` is missing;
CI installs both (``.ci/run``, stage "campaign").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip(
    "ray", reason="ray is kvcheck's [campaign] extra: pip install 'kvcheck[campaign]'"
)
from test_redis_db import _SERVER, redis_url  # noqa: F401  (the throwaway server fixture)

pytestmark = pytest.mark.skipif(
    _SERVER is None, reason="redis-server is not installed (apt-get install redis-server)"
)

TESTS_DIR = Path(__file__).resolve().parent
TWIN = (
    "from broken_pools import BrokenTarget, RareCombinationWriteMHA\n"
    "target = BrokenTarget('mha', RareCombinationWriteMHA)\n"
)
#: The one test that catches the twin: the MHA state machine.
MACHINE = "test_pool_matches_reference_after_every_step and mha"
#: Generous: a campaign normally ends within its budget plus a minute of setup and merge.
_TIMEOUT_S = 420


@pytest.fixture
def campaign_env(tmp_path: Path, redis_url: str) -> dict[str, str]:  # noqa: F811
    """A working directory holding the twin's module; KVCHECK_DB the Redis server."""
    (tmp_path / "twin_rare.py").write_text(TWIN, encoding="utf-8")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("KVCHECK_", "PYTEST_", "RAY_")) and name != "CI"
    }
    python_path = [str(tmp_path), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in python_path if p)
    env["KVCHECK_DB"] = redis_url
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no report home from a test's cluster
    return env


def _kvcheck(*arguments: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcheck.runner.cli", *arguments],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )


def test_a_two_worker_campaign_finds_what_default_seeds_miss_and_replay_reads_it(
    campaign_env: dict[str, str], tmp_path: Path
) -> None:
    """A 2-worker campaign from seed 2 finds the twin's bug, stores it once in Redis, writes
    the merged results, JUnit and a repro script; kvcheck replay finds it still failing."""
    campaign = _kvcheck(
        "campaign", "--target", "twin_rare:target", "-k", MACHINE, "--workers", "2",
        "--minutes", "2", "--seed", "2",
        env=campaign_env, cwd=tmp_path,
    )  # fmt: skip
    out = campaign.stdout
    assert campaign.returncode == 1, out + campaign.stderr
    assert "2 shards at a time" in out
    assert "FAILED test_pool_machines.py::test_pool_matches_reference_after_every_step[mha]" in out
    assert "kvcheck replay --target twin_rare:target" in out
    results = json.loads((tmp_path / ".kvcheck/campaign/results.json").read_text())
    (test,) = [t for t in results["tests"] if t["outcome"] == "failed"]
    assert test["nodeid"].endswith("test_pool_matches_reference_after_every_step[mha]")
    assert test["failing_seeds"] and min(test["seeds"]) == 2
    assert results["campaign"]["workers"] == 2 and not results["campaign"]["shard_errors"]
    assert "redis" in results["database"]
    junit = ET.parse(tmp_path / ".kvcheck/campaign/junit.xml").getroot()
    assert junit.get("failures") == "1"
    (failure,) = test["failures"]
    script = tmp_path / failure["script"]
    repro = subprocess.run(
        [sys.executable, str(script)], env=campaign_env, cwd=tmp_path, capture_output=True,
        text=True, timeout=_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert repro.returncode != 0, repro.stdout + repro.stderr

    replay = _kvcheck(
        "replay", "--target", "twin_rare:target", "-k", MACHINE, env=campaign_env, cwd=tmp_path
    )
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "still failing" in replay.stdout


def test_sigint_stops_the_campaign_and_exits_130_after_the_summary(
    campaign_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGINT while shards run: every shard is stopped, the summary of what ran is printed
    and the exit status is 130."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kvcheck.runner.cli", "campaign", "--target", "kvcheck",
         "-k", MACHINE, "--workers", "2", "--minutes", "2", "--seed", "0"],
        env=campaign_env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # until the shards run (the first progress line)
        seen.append(line)
        if line.startswith("campaign 00:"):
            break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=_TIMEOUT_S)
    out = "".join(seen) + rest
    assert process.returncode == 130, out
    assert "interrupted: stopping 2 running shard(s)" in out
    assert "INTERRUPTED (Ctrl-C or SIGTERM)" in out and out.rstrip().endswith("exit 130")
    results = json.loads((tmp_path / ".kvcheck/campaign/results.json").read_text())
    assert results["campaign"]["interrupted"] and results["exit_status"] == 130
