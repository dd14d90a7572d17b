"""A user target's tiers are first-class (issue 36): an allocator or host-pool failure carries
the calls that show it, reads as those calls, and gets a standalone script.

End to end, a user's own target (``tier_repro_targets:LEAKY``, whose allocator and host pool
each forget a slot on ``free``) through ``kvcheck verify --target module:attr``: each failure
reads as calls and has a script that reproduces it (exit 1) and, rendered for the fixed
target, passes (exit 0). Then kvcheck's own broken tiers: each script stops at the call the
failure named, on the twin, and passes on kvcheck's allocators and host pools; a failure of a
check no script replays (host bytes) still lists its calls but carries no reproduction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from broken_tiers import (
    AnyBackendHost,
    DriftingPagedAllocator,
    FullSideCapacitySWAAllocator,
    OnceDestroyedHost,
    PageKeepingHost,
    ShiftedPageHost,
    TrustingPagedAllocator,
    TwiceHandingTokenAllocator,
    UnderstatingHost,
)
from test_repro import _run_batch
from test_tier_properties_fail import allocator_failure, host_failure, storage_failure

from kvcheck.runner.repro import render_script, script_name, write_script
from kvcheck.runner.results import failures_from_exception
from kvcheck.tier_calls import (
    TierCall,
    TierReproduction,
    call_text,
    discrepancy,
    slots_problem,
    tier_reproduction_from_json,
    tier_reproduction_to_json,
)
from kvcheck.tiers import AllocatorSpec

TESTS_DIR = Path(__file__).parent
WORKTREE = TESTS_DIR.parent
#: The tests verify runs: one machine of the allocator, one check of the host pool.
SELECTED = "test_allocator_matches_reference_after_every_call or test_host_storage_queries"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVCHECK_", "PYTEST_"))}
    paths = [str(TESTS_DIR), str(WORKTREE), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(KVCHECK_PROFILE="kvcheck-smoke", KVCHECK_DB=str(tmp / "db"))
    return env


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``kvcheck verify --target tier_repro_targets:LEAKY`` on the allocator machine and the
    host-pool storage check, from an empty directory; its results, and each failure's
    script run as written and rendered for the fixed target."""
    tmp = tmp_path_factory.mktemp("verify")
    command = [sys.executable, "-m", "kvcheck.runner.cli", "verify"]
    command += ["--target", "tier_repro_targets:LEAKY", "--device", "cpu", "--quiet"]
    command += ["--results-dir", str(tmp / "results"), "-k", SELECTED]
    completed = subprocess.run(
        command, cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr
    results = json.loads((tmp / "results" / "results.json").read_text())
    failures = {
        test["nodeid"]: failure
        for test in results["tests"]
        for failure in test["failures"]
        if test["outcome"] == "failed"
    }
    fixed = {
        nodeid: write_script(
            {**failure["reproduction_data"], "test": nodeid},
            target="tier_repro_targets:FIXED",
            directory=tmp / "fixed",
            test=f"{nodeid}_fixed",  # a name of its own: the batch runner keys by name
            import_root=str(TESTS_DIR),
        )
        for nodeid, failure in failures.items()
        if failure.get("reproduction_data")
    }
    # results.json is written before the scripts: they are named after their tests.
    written = {nodeid: tmp / "results" / "repros" / script_name(nodeid) for nodeid in fixed}
    runs = _run_batch([*written.values(), *fixed.values()]) if written else {}
    return {"failures": failures, "written": written, "fixed": fixed, "runs": runs}


def _of(found: dict[str, Any], test: str) -> Any:
    """The value for the test named ``test`` (its id after the file)."""
    (value,) = [value for nodeid, value in found.items() if nodeid.endswith(f"::{test}")]
    return value


@pytest.mark.parametrize(
    ("test", "first_call"),
    [
        ("test_allocator_matches_reference_after_every_call[token]", "allocator = target."),
        ("test_host_storage_queries_and_teardown[mha]", "spec = HostPoolSpec("),
    ],
    ids=["allocator", "host_pool"],
)
def test_a_user_tier_failure_has_a_script_that_reproduces_it(
    verified: dict[str, Any], test: str, first_call: str
) -> None:
    """verify writes a script for the user's leaky allocator and host pool: it exits 1 with
    REPRODUCED on the leaky target and, rendered for the fixed one, prints OK and exits 0;
    the failure's example is the calls, not Hypothesis's draws."""
    example = _of(verified["failures"], test)["reproduction"]
    assert first_call in example and "Draw " not in example, example
    assert "<- the failure" in example.splitlines()[-1], example
    broken = verified["runs"][_of(verified["written"], test).stem]
    assert broken["code"] == 1 and "REPRODUCED: " in broken["message"], broken
    fixed = verified["runs"][_of(verified["fixed"], test).stem]
    assert fixed["code"] == 0 and "OK: no discrepancy" in fixed["message"], fixed


def test_the_fixed_script_differs_only_in_its_target(verified: dict[str, Any]) -> None:
    """The script rendered for the fixed target is the written one with the target's name
    changed: the same calls, the same literal checks."""
    assert len(verified["written"]) == 2, verified["failures"]
    for nodeid, path in verified["written"].items():
        written = path.read_text()
        fixed = verified["fixed"][nodeid].read_text()
        changed = {
            line
            for line in set(written.splitlines()) ^ set(fixed.splitlines())
            if "tier_repro_targets:" not in line
        }
        assert changed == set(), changed


# --- kvcheck's own broken tiers --------------------------------------------------------------

#: twin -> (the module attribute serving it, how its failure is found)
TWINS: dict[str, tuple[str, Any]] = {
    "slot_twice": ("TWICE_HANDING", lambda: allocator_failure(TwiceHandingTokenAllocator, "token")),
    "size_drift": ("DRIFTING", lambda: allocator_failure(DriftingPagedAllocator, "paged")),
    "double_free": ("TRUSTING", lambda: allocator_failure(TrustingPagedAllocator, "paged")),
    "decode_hook": (
        "FULL_SIDE_CAPACITY",
        lambda: allocator_failure(FullSideCapacitySWAAllocator, "swa"),
    ),
    "size_per_token": ("UNDERSTATING", lambda: host_failure(UnderstatingHost, "mla")),
    "any_backend": ("ANY_BACKEND", lambda: host_failure(AnyBackendHost, "mla")),
    "page_kept": ("PAGE_KEEPING", lambda: storage_failure(PageKeepingHost, "mla")),
    "destroy_twice": ("ONCE_DESTROYED", lambda: storage_failure(OnceDestroyedHost, "mla")),
}


@pytest.fixture(scope="module")
def twin_scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each twin's failure, its script run on the twin and on kvcheck's own tiers."""
    directory = tmp_path_factory.mktemp("tier_twins")
    failures, paths = {}, []
    for twin, (attr, find) in TWINS.items():
        error = find()
        failures[twin] = error
        data = json.loads(json.dumps(tier_reproduction_to_json(error.reproduction)))
        target = f"tier_repro_targets:{attr}"
        paths.append(write_script(data, target=target, directory=directory, test=f"broken_{twin}"))
        paths.append(write_script(data, target="kvcheck", directory=directory, test=twin))
    return {"failures": failures, "runs": _run_batch(paths)}


@pytest.mark.parametrize("twin", list(TWINS))
def test_a_twin_script_stops_at_the_call_the_failure_named(
    twin_scripts: dict[str, Any], twin: str
) -> None:
    """On the twin the script exits 1 at the call whose answer kvcheck found wrong (the last
    it recorded); on kvcheck's own tiers every answer is as expected (exit 0)."""
    rep = twin_scripts["failures"][twin].reproduction
    assert rep.failing_call == len(rep.calls) - 1
    broken = twin_scripts["runs"][f"repro_broken_{twin}"]
    assert broken["code"] == 1, broken
    assert broken["message"].startswith(f"REPRODUCED: {call_text(rep.calls[-1])} "), broken
    fixed = twin_scripts["runs"][f"repro_{twin}"]
    assert fixed["code"] == 0 and "OK: no discrepancy" in fixed["message"], fixed


def test_a_byte_failure_lists_its_calls_without_a_script() -> None:
    """A host pool whose bytes land a page off fails a check no script replays (bytes): the
    failure still reads as the calls made on the host pool, and carries no reproduction."""
    error = host_failure(ShiftedPageHost, "mha")
    assert getattr(error, "reproduction", None) is None
    (entry,) = failures_from_exception(error)
    assert entry["example"].splitlines()[1].startswith("device_pool = target.make_pool(")
    assert "host.backup_from_device_all_layer(device_pool=device_pool, " in entry["example"]
    assert entry["draws"] == [] and "reproduction_data" not in entry


# --- the data and its checks -------------------------------------------------------------------


def test_json_round_trip_is_exact() -> None:
    """A tier reproduction survives JSON unchanged, and the pool reader refuses it by kind."""
    spec = AllocatorSpec(kind="paged", size=4, page_size=2)
    tensor = {"tensor": "int32", "shape": [2], "values": [2, 3]}
    calls = (
        TierCall("allocator", "alloc", (2,), answer=tensor, expect={"refused": False}),
        TierCall("allocator", "free", ({"tuple": [tensor, 0]},), arg_names=("free_index",)),
        TierCall("allocator", "free", (tensor,), answer="no", raised="ValueError"),
        TierCall("allocator", "size_full", answer=4, attribute=True, checking=True),
    )
    rep = TierReproduction("allocator", spec, calls, failing_call=2, note="n", check="c")
    data = json.loads(json.dumps(tier_reproduction_to_json(rep)))
    assert tier_reproduction_from_json(data) == rep
    with pytest.raises(ValueError, match="kind='allocator'"):
        from kvcheck.failures import reproduction_from_json

        reproduction_from_json(data)
    assert "torch.tensor([2, 3], dtype=torch.int32)" in render_script(data, target="kvcheck")


@pytest.mark.parametrize(
    ("answer", "error", "expect", "wrong"),
    [
        (3, None, {"equals": 3}, False),
        (2, None, {"equals": 3}, True),
        ([3, 1], None, {"sorted": [1, 3]}, False),
        (None, None, {"sorted": []}, False),
        (1, None, {"truth": False}, True),
        (None, None, {"refused": True}, False),
        ([1], None, {"refused": True}, True),
        (None, ValueError("bad"), {"raises": "ValueError"}, False),
        (None, KeyError("k"), {"raises": "ValueError"}, True),
        (None, KeyError("k"), {}, True),
        (0, None, {"raises": "ValueError"}, True),
    ],
)
def test_discrepancy_judges_as_kvcheck_judged(
    answer: Any, error: BaseException | None, expect: dict[str, Any], wrong: bool
) -> None:
    """Each expectation holds exactly for the answers kvcheck's checks accept."""
    assert (discrepancy(answer, error, expect) is not None) == wrong


@pytest.mark.parametrize(
    ("slots", "plan", "wrong"),
    [
        ([4, 5], ["page", "next"], False),  # a free page, whole
        ([2, 3], ["page", "next"], True),  # page 1 is held
        ([5, 4], ["page", "next"], True),  # not from the page's first slot
        ([7, 8, 9], [6, "page", "next"], False),  # the request's page, then a fresh one
        ([8, 9], [6, "next"], True),  # does not follow the request's last slot
        ([4, 5, 4, 5], ["page", "next", "page", "next"], True),  # page 2 twice
        ([4], ["page", "next"], True),  # too few
    ],
)
def test_slots_problem_follows_the_reference(
    slots: list[int], plan: list[Any], wrong: bool
) -> None:
    """An answer is wrong where the reference allocator would object (pages 2..4 free)."""
    problem = slots_problem(slots, len(plan), [2, 3, 4], 2, plan)
    assert (problem is not None) == wrong, problem
