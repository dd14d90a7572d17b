"""The benchmark scripts' own logic: twin registry, example sizes, the summary table, the
held-out user pools of scripts/time_to_first_report.

Light by design: nothing here runs the suite or times anything.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from script_modules import load_script

import kvcheck.serving as serving
from kvcheck.runner.profiles import CI, DEV, REPLAY, THOROUGH, explain_requested, profile_options


@pytest.fixture(scope="module")
def ttr() -> ModuleType:
    return load_script("bench_time_to_report")


def test_rule_list_matches_the_serving_rules(ttr: ModuleType) -> None:
    """The script's copy of the rule order is kvcheck's (it avoids importing torch)."""
    assert ttr.RULES == serving.PREFILL_ONLY_RULE_ORDER


@pytest.mark.parametrize("target", ["kvcheck", "sglang"])
def test_every_twin_setup_compiles_and_names_are_unique(ttr: ModuleType, target: str) -> None:
    """Each twin's generated module is valid Python binding ``target``; names are unique."""
    twins = ttr.TWINS[target]
    assert len({twin.name for twin in twins}) == len(twins)
    for twin in twins:
        code = compile(twin.setup, f"twin_{twin.name}", "exec")
        assert "target" in code.co_names, twin.name


def test_kvcheck_twins_build_their_targets(ttr: ModuleType) -> None:
    """Every built-in twin's module runs and yields a target with a name."""
    for twin in ttr.KVCHECK_TWINS:
        namespace: dict[str, Any] = {}
        exec(compile(twin.setup, twin.name, "exec"), namespace)
        assert namespace["target"].name, twin.name


def test_every_broken_pool_class_has_a_twin(ttr: ModuleType) -> None:
    """No broken pool of tests/broken_pools.py is left out of the benchmark."""
    import broken_pools

    classes = {
        name
        for name, value in vars(broken_pools).items()
        if isinstance(value, type)
        and value.__module__ == "broken_pools"
        and name != "BrokenTarget"
        and not name.startswith("_")  # a helper of a twin, not a pool
    }
    setups = "\n".join(twin.setup for twin in ttr.KVCHECK_TWINS)
    assert {name for name in classes if name not in setups} == set()


MACHINE_EXAMPLE = """\
state = MHAPoolMachine()
state.build_pool(spec=PoolSpec(family='mha', size=1, layer_num=2), data=data(...))
Draw 2 (kind): 'write_kv'
Draw 3 (op): WriteKV(layer_id=0, locs=(0,))
state.step(data=data(...))
Draw 4 (kind): 'move'
Draw 5 (op): Move(tgt=(0,), src=(1,))
state.step(data=data(...))
"""


@pytest.mark.parametrize(
    ("reproduction", "size"),
    [
        (MACHINE_EXAMPLE, (2, 2, 2)),
        (
            "Draw 1 (ops): OpSequence(ops=(WriteKV(...),\n Move(...),\n HostCopy(...)))\n"
            "Draw 2 (label): Move(...)",
            (None, 3, None),
        ),
        ("test(model=ModelConfig(num_hidden_layers=3))", (None, None, 3)),
        (None, (None, None, None)),
    ],
    ids=["machine", "sequence", "model", "none"],
)
def test_example_size(ttr: ModuleType, reproduction: str | None, size: tuple[Any, ...]) -> None:
    """Steps, operations and layers are read off a falsifying example."""
    assert ttr.example_size(reproduction) == size


def test_summary_flags_a_missed_bug(ttr: ModuleType) -> None:
    """A seed that did not find the bug marks the row MISSED; figures use the found seeds."""
    runs = [
        ttr.Run("b", 0, "found", failing_test="t", first_s=1.0, shrunk_s=2.0, total_s=3.0),
        ttr.Run("b", 1, "found", failing_test="t", first_s=3.0, shrunk_s=4.0, total_s=9.0),
        ttr.Run("b", 2, "MISSED (timeout)", total_s=300.0),
    ]
    (row,) = ttr.summarize(runs)
    assert row["found"] == 2 and row["status"].startswith("MISSED")
    assert row["total_s"] == {"median": "6.0", "max": "9.0"}


def test_searching_profiles_leave_out_explain_unless_asked() -> None:
    """Explain is opt-in; replay keeps its own phases; dev/ci report one bug per property."""
    from hypothesis import Phase

    for name in (DEV, CI, THOROUGH):
        assert Phase.explain not in profile_options(name, explain=False)["phases"]
        assert Phase.explain in profile_options(name, explain=True)["phases"]
        assert Phase.shrink in profile_options(name)["phases"] or explain_requested()
    assert profile_options(REPLAY, explain=True)["phases"] == (Phase.explicit, Phase.reuse)
    assert profile_options(CI)["report_multiple_bugs"] is False
    with pytest.raises(ValueError, match="explain='yes'"):
        profile_options(CI, explain="yes")  # type: ignore[arg-type]


def test_campaign_bench_table_gives_each_worker_count_its_speed_up() -> None:
    """bench_campaign prints examples per second per worker count and the ratio to the first."""
    bench = load_script("bench_campaign")
    rows = [
        bench.Measurement(1, 0, 8, 4000, 100.0, 130.0),
        bench.Measurement(2, 0, 8, 4000, 50.0, 70.0),
    ]
    lines = bench.table(rows)
    assert lines[0].split()[:3] == ["workers", "exit", "shards"]
    assert [line.split()[5:7] for line in lines[1:]] == [["40.0", "1.00"], ["80.0", "2.00"]]


def test_the_held_out_user_pools_each_break_one_thing() -> None:
    """scripts/time_to_first_report's user pools: one leaves V behind on a move, the other
    drops a write to the last of several layers; each target builds kvcheck's other pools."""
    import torch

    from kvcheck.specs import PoolSpec

    pools = load_script("time_to_first_report/user_pools")
    spec = PoolSpec(family="mha", size=8, page_size=4, layer_num=2, dtype="float32", head_num=1)
    kv = torch.ones(1, 1, spec.head_dim)
    moving = pools.k_only_move.make_pool(spec, device="cpu")
    moving.set_kv_buffer(None, torch.tensor([1]), kv, kv, layer_id_override=0)
    moving.move_kv_cache(torch.tensor([3]), torch.tensor([1]))
    assert moving.k_buffer[0][3].sum() == spec.head_dim and moving.v_buffer[0][3].sum() == 0
    writing = pools.last_layer_write.make_pool(spec, device="cpu")
    for layer_id in (0, 1):
        writing.set_kv_buffer(None, torch.tensor([1]), kv, kv, layer_id_override=layer_id)
    assert writing.k_buffer[0][1].sum() == spec.head_dim and writing.k_buffer[1][1].sum() == 0
    mla = PoolSpec(family="mla", size=8, page_size=4, layer_num=1, dtype="float32")
    for target in (pools.k_only_move, pools.last_layer_write):
        assert type(target.make_pool(mla, device="cpu")).__name__ == "MLATokenToKVPool"
