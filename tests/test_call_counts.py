"""The per-cell call counts and their command, ``python tools/call_counts.py``."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvcheck.specs import PoolSpec
from kvcheck.targets.builtin import KVCheckTarget
from tools.call_counts import (
    CALL,
    NOT_CALLED,
    SURFACE_ARGUMENTS,
    CallCounter,
    CallCounts,
    Cell,
    main,
)

CHECKS_DOC = Path(__file__).resolve().parents[1] / "docs" / "checks.md"
MHA = PoolSpec(family="mha", size=4, page_size=1, layer_num=2, dtype="bfloat16", start_layer=3)


@pytest.fixture
def counted() -> tuple[CallCounter, Any]:
    """A counter installed on a fresh built-in target, and an MHA pool it built."""
    target = KVCheckTarget()
    counter = CallCounter()
    counter.install(target)
    return counter, target.make_pool(MHA, device="cpu")


def test_the_outer_call_counts_and_the_pools_own_calls_do_not(counted: Any) -> None:
    """get_kv_buffer reads through get_key_buffer/get_value_buffer: only the suite's call counts."""
    counter, pool = counted
    pool.get_kv_buffer(3)
    counts = counter.counts()
    assert counts.calls("mha", "get_kv_buffer") == 1
    assert counts.calls("mha", "get_kv_buffer", "layer_id") == 1
    assert counts.calls("mha", "get_key_buffer") == 0
    assert Cell("mha", "get_key_buffer") in counts.cells  # offered, so listed with 0


def test_an_argument_counts_only_when_passed_other_than_none(counted: Any) -> None:
    counter, pool = counted
    rows = torch.ones(1, pool.head_num, pool.head_dim, dtype=torch.bfloat16)
    pool.set_kv_buffer(None, torch.tensor([1]), rows, rows, layer_id_override=4)
    pool.set_kv_buffer(SimpleNamespace(layer_id=3), torch.tensor([2]), rows, rows)
    counts = counter.counts()
    assert counts.calls("mha", "set_kv_buffer") == 2
    assert counts.calls("mha", "set_kv_buffer", "layer_id_override") == 1
    assert counts.calls("mha", "set_kv_buffer", "layer") == 1
    assert counts.calls("mha", "set_kv_buffer", "k_scale") == 0


def test_a_call_whose_arguments_do_not_bind_still_counts_as_a_call(counted: Any) -> None:
    counter, pool = counted
    with pytest.raises(TypeError):
        pool.move_kv_cache(torch.tensor([1]))
    counts = counter.counts()
    assert counts.calls("mha", "move_kv_cache") == 1
    assert counts.calls("mha", "move_kv_cache", "src_loc") == 0


def test_a_wrapper_set_on_the_pool_object_counts_its_arguments() -> None:
    """A target may set a method on the pool object as a wrapper of the class's function
    (sglang's target does): its ``self`` is not an argument the caller passes."""

    def get_key_buffer(self: Any, layer_id: int) -> int:
        return layer_id

    pool = SimpleNamespace()
    pool.get_key_buffer = functools.wraps(get_key_buffer)(
        lambda *args, **kwargs: get_key_buffer(pool, *args, **kwargs)
    )
    counter = CallCounter()
    counter.watch(pool, "mha")
    assert pool.get_key_buffer(3) == 3
    assert counter.counts().calls("mha", "get_key_buffer", "layer_id") == 1


def test_uninstall_stops_counting_new_pools() -> None:
    target = KVCheckTarget()
    counter = CallCounter()
    counter.install(target)
    counter.uninstall(target)
    target.make_pool(MHA, device="cpu").get_key_buffer(3)
    assert counter.counts().cells == {}


def test_counts_written_per_process_merge_cell_by_cell(tmp_path: Path, counted: Any) -> None:
    counter, pool = counted
    pool.get_key_buffer(3)
    assert counter.write(tmp_path, "gw0") == tmp_path / "calls-gw0.json"
    assert counter.write(tmp_path, "gw1") == tmp_path / "calls-gw1.json"
    assert CallCounter().write(tmp_path, "main") is None  # built nothing: writes nothing
    merged = CallCounts.read_folder(tmp_path)
    assert merged.calls("mha", "get_key_buffer", "layer_id") == 2
    assert merged.cells.keys() == counter.counts().cells.keys()


def test_the_floor_skips_only_the_cells_not_called_by_design() -> None:
    by_design = Cell("mla", "set_kv_buffer", "cache_v")
    assert by_design.reason_not_called() is not None
    counts = CallCounts({by_design: 0, Cell("mla", "move_kv_cache"): 5, Cell("mha", "x"): 20})
    assert counts.below(20) == [Cell("mla", "move_kv_cache")]
    report = counts.report(floor=20)
    assert "| mla | move_kv_cache | (call) | 5 | below 20 |" in report
    assert f"| mla | set_kv_buffer | cache_v | 0 | {by_design.reason_not_called()} |" in report


def test_every_cell_not_called_by_design_names_a_surface_argument() -> None:
    for _, method, argument in NOT_CALLED:
        assert argument == CALL or argument in SURFACE_ARGUMENTS[method], (method, argument)


def test_the_docs_surface_table_and_the_counted_methods_agree() -> None:
    """Every method named in docs/checks.md's "The surface it calls" table is counted."""
    text = CHECKS_DOC.read_text()
    table = text.split("## The surface it calls", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    named -= {"start_layer", "layer_num", "end_layer", "mem_usage"}  # attributes, not calls
    assert named and named <= set(SURFACE_ARGUMENTS), named - set(SURFACE_ARGUMENTS)


def test_the_command_writes_the_table_and_fails_below_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run of a few tests of the shipped suite, with a floor no run reaches: the table
    counts the cells the run called, and the command names the cells below the floor."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    report = tmp_path / "calls.md"
    floor = "1000000000"
    pytest_args = ["--kvcheck-device=cpu", "-k", "test_accounting and mha"]
    assert main(["--out", str(report), "--floor", floor, "--", *pytest_args]) == 1
    table = report.read_text()
    assert re.search(r"\| mha \| get_kv_size_bytes \| \(call\) \| [1-9]\d* \|", table), table
    out = capsys.readouterr().out
    assert f"table in {report}" in out and f"below {floor}: mha" in out


def test_a_bad_floor_or_out_is_refused_before_the_suite_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path / "c.md"), "--floor", "0"]) == 2
    assert "--floor=0" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 2
    assert "not a file in an existing directory" in capsys.readouterr().err
