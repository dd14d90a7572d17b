"""Standalone reproduction scripts (kvcheck.runner.repro): JSON round trip, targets, and the twins.

For each pool-side failing twin that a short op sequence shows, a hand-picked minimal
reproduction is rendered for a ``module:attr`` target serving the broken pool (it must
exit 1 with ``REPRODUCED``) and for the ``kvcheck`` target (it must exit 0). Each script
runs as ``__main__`` in a fresh interpreter; to keep the cost of importing torch low, the
scripts of one kind share one interpreter (run one after another with ``runpy``), and one
twin is also run as ``python repro_<test>.py`` on its own.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kvcheck.failures import Reproduction, reproduction_from_json, reproduction_to_json
from kvcheck.runner.repro import _recipe, _ScriptWriter, render_script, script_name, write_script
from kvcheck.specs import (
    HostCopy,
    HostReload,
    Move,
    Payload,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.strategies import op_sequences, pool_specs

TESTS_DIR = Path(__file__).resolve().parent
WORKTREE = TESTS_DIR.parent

# --- minimal reproductions of the twins --------------------------------------------------------

MHA = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16", head_dim=2)
NOOP = PoolSpec(family="noop", size=4, page_size=2, layer_num=1, dtype="bfloat16", head_dim=2)
MLA = PoolSpec(
    family="mla",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="float8_e4m3fn",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
)
DSA = PoolSpec(
    family="dsa",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
)
KEY = bytes(range(1, 129))
SCALE = np.float32(0.5).tobytes()


def _write(*locs: int, v_bytes: int = 4) -> WriteKV:
    """An MHA write of distinct non-zero rows (4 bytes of K, ``v_bytes`` of V per slot)."""
    k = tuple(bytes([16 * loc + i + 1 for i in range(4)]) for loc in locs)
    v = tuple(bytes([16 * loc + i + 9 for i in range(v_bytes)]) for loc in locs)
    return WriteKV(layer_id=0, locs=locs, k_rows=k, v_rows=v)


#: twin id -> (attribute of tests/repro_targets.py, reproduction, part of the REPRODUCED line)
TWINS: dict[str, tuple[str, Reproduction, str]] = {
    "MoveIgnoresV": (
        "MOVE_IGNORES_V",
        Reproduction(MHA, (_write(3), Move(tgt=(5,), src=(3,))), note="v_buffer differs"),
        "pool.v_buffer[0] (layer_id 0) row 5 byte 0",
    ),
    "SequentialMoveMLA": (
        "SEQUENTIAL_MOVE_MLA",
        Reproduction(
            MLA,
            (
                WriteKV(layer_id=0, locs=(1, 2), k_rows=(b"\x01\x02\x03", b"\x04\x05\x06")),
                Move(tgt=(2, 3), src=(1, 2)),
            ),
        ),
        "pool.kv_buffer[0] (layer_id 0) row 3 byte 0",
    ),
    "PageRowMoveDSA": (
        "PAGE_ROW_MOVE_DSA",
        Reproduction(
            DSA,
            (
                WriteIndexK(layer_id=0, locs=(1,), key_rows=(KEY,), scale_rows=(SCALE,)),
                Move(tgt=(2,), src=(1,)),
            ),
        ),
        "pool.index_k_with_scale_buffer[0] (layer_id 0) row 1 byte 0",
    ),
    "HostCopyDropsIndexK": (
        "HOST_COPY_DROPS_INDEX_K",
        Reproduction(
            DSA,
            (
                WriteIndexK(layer_id=0, locs=(2,), key_rows=(KEY,), scale_rows=(SCALE,)),
                HostCopy(name="a", indices=(2, 3)),
                HostReload(name="a", indices=(4, 5)),
            ),
        ),
        "pool.index_k_with_scale_buffer[0] (layer_id 0) row 2 byte 0",
    ),
    "SilentNoOp": (
        "SILENT_NOOP",
        Reproduction(NOOP, (_write(1),)),
        "set_kv_buffer(layer_id=0, loc=[1]) returned, but should raise RuntimeError",
    ),
    "LocSortingMHA": (
        "LOC_SORTING_MHA",
        Reproduction(MHA, (_write(2, 1),)),
        "set_kv_buffer(layer_id=0, loc=[2, 1]) changed the caller's tensor args[1]: "
        "[2, 1] -> [1, 2]",
    ),
    "HalfApplyingMHA": (
        "HALF_APPLYING_MHA",
        Reproduction(MHA, (_write(1, v_bytes=2),)),
        "pool.k_buffer[0] (layer_id 0) row 1 byte 0",
    ),
    "ValidatingMoveNoOp": (
        "VALIDATING_MOVE_NOOP",
        Reproduction(NOOP, (Move(tgt=(3,), src=(1,)),)),
        "move_kv_cache(tgt_loc=[3], src_loc=[1]) raised ValueError",
    ),
    "FullSizeNoOp": (
        "FULL_SIZE_NOOP",
        Reproduction(NOOP, ()),
        "pool.k_buffer[0] (layer_id 0) is (6, 4) [rows, bytes per row] but should be (2, 4)",
    ),
    "factory": (
        "broken_factory",
        Reproduction(MHA, (_write(3), Move(tgt=(5,), src=(3,)))),
        "pool.v_buffer[0] (layer_id 0) row 5 byte 0",
    ),
}

#: Runs each script path given as an argument as ``__main__``; prints one JSON result each.
_BATCH_RUNNER = """
import contextlib, io, json, runpy, sys, traceback
if sys.argv[1] == "block-kvcheck":
    sys.modules["kvcheck"] = None  # any `import kvcheck...` now raises ImportError
results = []
for path in sys.argv[2:]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(path, run_name="__main__")
        code, message = 0, out.getvalue()
    except SystemExit as exc:
        failed = (exc.code, err.getvalue())  # an int status; the script's message is on stderr
        code, message = failed if isinstance(exc.code, int) else (1, str(exc.code))
    except BaseException:
        code, message = "crashed", traceback.format_exc()
    results.append({"path": path, "code": code, "message": message})
print(json.dumps(results))
"""


def _env() -> dict[str, str]:
    """The test's environment with tests/ (for repro_targets) and the worktree importable."""
    paths = [str(TESTS_DIR), str(WORKTREE), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _run_batch(paths: list[Path], *, block_kvcheck: bool = False) -> dict[str, dict[str, Any]]:
    mode = "block-kvcheck" if block_kvcheck else "plain"
    completed = subprocess.run(
        [sys.executable, "-c", _BATCH_RUNNER, mode, *map(str, paths)],
        cwd=paths[0].parent,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    return {Path(item["path"]).stem: item for item in results}


@pytest.fixture(scope="module")
def twin_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every twin's script run against its broken pool and against kvcheck's own pool."""
    directory = tmp_path_factory.mktemp("repro")
    broken, fixed = [], []
    for twin, (attr, rep, _) in TWINS.items():
        data = json.loads(json.dumps(reproduction_to_json(rep)))  # as stored beside results
        broken.append(
            write_script(
                data, target=f"repro_targets:{attr}", directory=directory, test=f"broken_{twin}"
            )
        )
        fixed.append(write_script(data, target="kvcheck", directory=directory, test=twin))
    # Scripts that cannot reach their checks: a module that is gone, a pool that won't build.
    data = reproduction_to_json(TWINS["MoveIgnoresV"][1])
    unrunnable = [
        write_script(data, target=target, directory=directory, test=name)
        for name, target in (
            ("no_module", "no_such_module_for_kvcheck:target"),
            ("unbuildable", "repro_targets:UNBUILDABLE"),
        )
    ]
    return _run_batch(broken + fixed + unrunnable)


# --- JSON --------------------------------------------------------------------------------------


def _every_kind_of_op() -> Reproduction:
    payload = Payload(
        dtype="float32", k_rows=(bytes(8),), v_rows=(bytes(8),), k_scale=0.5, v_scale=None
    )
    ops = (
        WriteKV(
            layer_id=3, locs=(1,), k_rows=(b"\x01\x02",), v_rows=(b"\x03\x04",), payload=payload
        ),
        WriteMLA(layer_id=3, locs=(2,), nope_rows=(b"\x05",), rope_rows=(b"\x06",)),
        WritePrefixValid(
            layer_id=3,
            loc_grid=((1, 2), (3, 4)),
            commit_lens=(1, 2),
            k_rows=(b"\x01",) * 4,
            v_rows=(b"\x02",) * 4,
        ),
        WriteIndexK(layer_id=3, locs=(2,), key_rows=(KEY,), scale_rows=(SCALE,)),
        WriteCompressTail(
            layer_id=3, req_pool_idx=1, key_rows=(b"\x07",), score_rows=(b"\x08",), start=4
        ),
        Move(tgt=(1, 2), src=(2, 2)),
        HostCopy(name="a", indices=(), req_pool_index=1),
        HostReload(name="a", indices=(5, 6)),
    )
    spec = PoolSpec(
        family="dsa",
        size=4,
        page_size=2,
        layer_num=2,
        dtype="float8_e5m2",
        start_layer=3,
        skip_topk_layers=(False, True),
        index_buf_size=6,
    )
    return Reproduction(spec, ops, note="got 1\nbut should be 0", failing_op=5, check="c", test="t")


def test_json_round_trip_is_exact_for_every_op_kind() -> None:
    """Every op kind, payload, nested tuple and optional field survives JSON text exactly."""
    rep = _every_kind_of_op()
    text = json.dumps(reproduction_to_json(rep))
    assert reproduction_from_json(json.loads(text)) == rep
    assert "0102" in text  # bytes are stored as hex


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=op_sequences(pool_specs(), max_ops=4, include_invalid=True))
def test_json_round_trip_of_generated_sequences(sequence: Any) -> None:
    """Generated specs and op sequences, invalid ones included, round-trip through JSON."""
    rep = Reproduction(spec=sequence.spec, ops=sequence.ops)
    assert reproduction_from_json(json.loads(json.dumps(reproduction_to_json(rep)))) == rep


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=op_sequences(pool_specs(max_layers=2, max_size=8), max_ops=4, include_invalid=True))
def test_generated_sequences_replay_cleanly_on_kvcheck_pools(sequence: Any) -> None:
    """For any sequence, invalid calls included, the kvcheck script agrees with kvcheck's pools
    (run in this process: the script is plain Python)."""
    script = render_script(
        reproduction_to_json(Reproduction(sequence.spec, sequence.ops)), target="kvcheck"
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "repro.py", "exec"), {"__name__": "__main__"})
    assert out.getvalue() == "OK: no discrepancy\n"


@pytest.mark.parametrize(
    "change",
    [
        {"ops": [{"op": "Explode"}]},
        {"ops": [{"op": "Move", "tgt": [1], "src": [2], "speed": 3}]},
        {"ops": [{"op": "HostCopy", "name": "a", "indices": [1], "extra": 1}]},
        {
            "ops": [
                {
                    "op": "WriteIndexK",
                    "layer_id": 0,
                    "locs": [1],
                    "key_rows": ["zz"],
                    "scale_rows": ["00"],
                }
            ]
        },
        {"format": 99},
        {"failing_op": 5},
    ],
    ids=["unknown-op", "unknown-field", "extra-field", "bad-hex", "format", "failing-op"],
)
def test_from_json_refuses_what_it_cannot_read(change: dict[str, Any]) -> None:
    """Unknown ops or fields, bad hex, another format or an out-of-range index: ValueError."""
    data = {**reproduction_to_json(Reproduction(MHA, (Move((1,), (2,)),))), **change}
    with pytest.raises(ValueError):
        reproduction_from_json(data)


# --- targets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["", "nonsense", "sglang2", "pkg:", ":attr", "pkg:attr; import os", "pkg:a-b", "a:b:c"],
)
def test_unknown_target_forms_are_refused(target: str) -> None:
    """Anything but kvcheck, sglang or module:attr (Python names) raises ValueError."""
    data = reproduction_to_json(Reproduction(MHA, ()))
    with pytest.raises(ValueError, match="module:attr"):
        render_script(data, target=target)


def test_scripts_import_only_what_their_target_needs() -> None:
    """kvcheck scripts import kvcheck.pools, sglang scripts sglang alone, module:attr scripts
    the module and kvcheck.specs."""
    data = reproduction_to_json(TWINS["PageRowMoveDSA"][1])
    imported = {}
    for target in ("kvcheck", "sglang", "pkg.sub:Target"):
        tree = ast.parse(render_script(data, target=target))
        imported[target] = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        } - {"contextlib", "math", "types", "os", "sys", "importlib", "traceback", "warnings"}
    assert imported["kvcheck"] == {"torch", "kvcheck"}
    assert imported["sglang"] == {"torch", "sglang", "torchvision", "transformers"}
    assert imported["pkg.sub:Target"] == {"torch", "pkg", "kvcheck"}


def test_script_name_is_a_python_file_name() -> None:
    """Test ids with paths, brackets and colons become repro_<test name and parameters>.py,
    numbered when a name is taken."""
    assert script_name("a/b/test_x.py::T::test_y[mha-2]") == "repro_test_y_mha_2.py"
    assert script_name("") == "repro_failure.py"
    used = {"repro_test_y_mha_2.py"}
    assert script_name("c/test_z.py::test_y[mha-2]", used) == "repro_test_y_mha_2_2.py"
    assert used == {"repro_test_y_mha_2.py", "repro_test_y_mha_2_2.py"}


# --- the twins ---------------------------------------------------------------------------------


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_script_reproduces_the_twin_on_its_broken_pool(
    twin: str, twin_results: dict[str, dict[str, Any]]
) -> None:
    """Against the broken pool the script exits 1 naming the first discrepancy."""
    result = twin_results[f"repro_broken_{twin}"]
    assert result["code"] == 1, result["message"]
    assert result["message"].startswith("REPRODUCED: "), result["message"]
    assert TWINS[twin][2] in result["message"]


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_script_passes_on_kvcheck_pools(twin: str, twin_results: dict[str, dict[str, Any]]) -> None:
    """The same reproduction against kvcheck's own pools exits 0 and says so."""
    result = twin_results[f"repro_{twin}"]
    assert result["code"] == 0, result["message"]
    assert result["message"].strip() == "OK: no discrepancy"


@pytest.mark.parametrize(
    ("script", "why"),
    [
        (
            "repro_no_module",
            "importing failed with ModuleNotFoundError: No module named "
            "'no_such_module_for_kvcheck'",
        ),
        ("repro_unbuildable", "building the pool raised RuntimeError: this pool needs a GPU"),
    ],
)
def test_a_script_that_cannot_run_exits_2(
    script: str, why: str, twin_results: dict[str, dict[str, Any]]
) -> None:
    """An import or the pool's construction failing is exit 2 with CANNOT RUN, never the 1 of
    a reproduction nor the 0 of a fix."""
    result = twin_results[script]
    assert result["code"] == 2, result["message"]
    assert result["message"].strip().splitlines()[-1] == f"CANNOT RUN: {why}"


def test_the_script_header_says_what_each_exit_status_means() -> None:
    """Every script's header documents 0 (OK), 1 (REPRODUCED) and 2 (CANNOT RUN)."""
    data = reproduction_to_json(TWINS["MoveIgnoresV"][1])
    for target in ("kvcheck", "sglang", "pkg.sub:Target"):
        header = render_script(data, target=target).split("\n\n", 1)[0]
        for line in (
            '#   0  "OK: no discrepancy"',
            '#   1  "REPRODUCED: ..."',
            '#   2  "CANNOT RUN',
        ):
            assert line in header, (target, header)


def test_a_module_script_carries_the_directory_its_target_came_from(tmp_path: Path) -> None:
    """import_root is put first on sys.path (after kvcheck's import), so the script imports
    the target from where kvcheck did, whatever the directory it runs from."""
    data = reproduction_to_json(TWINS["MoveIgnoresV"][1])
    script = render_script(data, target="mypool:target", import_root=str(tmp_path))
    assert f"TARGET_IMPORT_ROOT = {str(tmp_path)!r}" in script
    assert (
        script.index("from kvcheck.specs import PoolSpec")
        < script.index("sys.path.insert(0, TARGET_IMPORT_ROOT)")
        < script.index("import mypool as target_module")
    )
    assert "TARGET_IMPORT_ROOT" not in render_script(data, target="mypool:target")


def test_script_runs_as_a_plain_python_file(tmp_path: Path) -> None:
    """`python repro_<test>.py`: exit 1 with REPRODUCED on stderr for the broken pool."""
    _, rep, expected = TWINS["MoveIgnoresV"]
    path = write_script(
        reproduction_to_json(rep),
        target="repro_targets:MOVE_IGNORES_V",
        directory=tmp_path,
        test="test_x.py::test_move",
    )
    completed = subprocess.run(
        [sys.executable, path.name],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.strip().splitlines()[-1].startswith("REPRODUCED: ")
    assert expected in completed.stderr


def test_new_write_ops_render_as_pool_calls() -> None:
    """set_mla_kv_buffer, set_kv_buffer_prefix_valid and payload writes render as valid
    calls with SGLang's argument order (the reference's verdict is not needed for this)."""
    payload = Payload(dtype="float32", k_rows=(bytes(8),), v_rows=(bytes(8),), k_scale=0.5)
    mha_ops = (
        WriteKV(layer_id=0, locs=(1,), k_rows=(bytes(4),), v_rows=(bytes(4),), payload=payload),
        WritePrefixValid(
            layer_id=0,
            loc_grid=((1, 2), (3, 4)),
            commit_lens=(1, 2),
            k_rows=(bytes(4),) * 4,
            v_rows=(bytes(4),) * 4,
        ),
    )
    mla_op = WriteMLA(layer_id=0, locs=(2,), nope_rows=(b"\x05\x06",), rope_rows=(b"\x07",))
    rendered = {}
    for spec, op in ((MHA, mha_ops[0]), (MHA, mha_ops[1]), (MLA, mla_op)):
        rep = Reproduction(spec, (op,))
        source = "\n".join(_ScriptWriter(rep, _recipe("kvcheck", rep))._call_lines(op, None))
        ast.parse(source)
        rendered[type(op).__name__] = source
    assert 'cache_k = rows(torch.float32, (1, 2), "0000000000000000")' in rendered["WriteKV"]
    assert (
        "k_scale=0.5)', pool.set_kv_buffer, layer(0), loc, cache_k, cache_v, 0.5, None)"
        in (rendered["WriteKV"])
    )
    assert 'cache_k_rope = rows(torch.float8_e4m3fn, (1, 1), "07")' in rendered["WriteMLA"]
    assert (
        "pool.set_mla_kv_buffer, layer(0), loc, cache_k_nope, cache_k_rope)"
        in (rendered["WriteMLA"])
    )
    assert (
        "loc_2d = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)"
        in (rendered["WritePrefixValid"])
    )
    assert (
        "pool.set_kv_buffer_prefix_valid, layer(0), loc_2d, commit_lens, cache_k, cache_v)"
        in (rendered["WritePrefixValid"])
    )


# --- sglang ------------------------------------------------------------------------------------

SGLANG_MHA = PoolSpec(
    family="mha",
    size=8,
    page_size=4,
    layer_num=2,
    dtype="bfloat16",
    head_num=1,
    head_dim=2,
    start_layer=1,
)
SGLANG_MLA = PoolSpec(
    family="mla",
    size=8,
    page_size=4,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
)
SGLANG_DSA = PoolSpec(
    family="dsa",
    size=64,
    page_size=64,
    layer_num=2,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
    skip_topk_layers=(False, True),
)


#: A scaled fp8 DSA pool (sglang's 64-token pages) and a write of two bf16 tokens, with
#: two 128-value blocks of different sizes and no rope.
SCALED_DSA = PoolSpec(
    family="dsa",
    size=64,
    page_size=64,
    layer_num=1,
    dtype="float8_e4m3fn",
    kv_lora_rank=256,
    qk_rope_head_dim=0,
    latent_layout="scaled",
)
SCALED_WRITE = WriteMLA(
    layer_id=0,
    locs=(1, 2),
    nope_rows=(b"\x80\x3f" * 128 + b"\xc0\xc0" * 128, b"\x00\x41" * 256),
    rope_rows=(b"", b""),
    dtype="bfloat16",
)
SCALED_OPS = (SCALED_WRITE, Move(tgt=(5,), src=(1,)), HostCopy("a", (2,)), HostReload("a", (9,)))


#: A DSA pool with index kpool 2 and compress tails (sglang's 64-token index pages): an
#: index-K write to slot 65, a tail write that wraps, a copy of a page and its reload.
KPOOL_DSA = PoolSpec(
    family="dsa",
    size=256,
    page_size=128,
    layer_num=1,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
    index_kpool=2,
    index_kpool_compress=True,
    tail_extra_slots=1,
    max_running_requests=1,
)
KPOOL_OPS = (
    WriteIndexK(layer_id=0, locs=(65,), key_rows=(KEY,), scale_rows=(SCALE,)),
    WriteCompressTail(
        layer_id=0,
        req_pool_idx=1,
        key_rows=(b"\x80\x3f" * 128, b"\x00\x40" * 128),
        score_rows=(b"\x40\x40" * 128, b"\x80\x40" * 128),
        start=2,
    ),
    HostCopy("a", tuple(range(128, 256))),
    HostReload("a", tuple(range(0, 128))),
)


def test_kpool_scripts_replay_on_kvcheck_pools() -> None:
    """A kpool DSA reproduction builds the pool with its kpool and tail sizes, writes a
    tail and checks the tails' bytes, and replays cleanly on kvcheck's pools."""
    script, output = _replay_on_kvcheck(Reproduction(KPOOL_DSA, KPOOL_OPS))
    assert "index_kpool=2" in script and '"_compress_tail_score": [' in script
    assert output == "OK: no discrepancy\n"


def _replay_on_kvcheck(rep: Reproduction) -> tuple[str, str]:
    """The kvcheck script of ``rep`` and what it prints, run in this process."""
    script = render_script(reproduction_to_json(rep), target="kvcheck")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "repro.py", "exec"), {"__name__": "__main__"})
    return script, out.getvalue()


def test_scaled_latent_scripts_replay_on_kvcheck_pools() -> None:
    """A scaled fp8 DSA reproduction passes the pool kv_cache_dim and bf16 parts and
    replays cleanly on kvcheck's pools."""
    script, output = _replay_on_kvcheck(Reproduction(SCALED_DSA, SCALED_OPS))
    assert "kv_cache_dim=264" in script and "rows(torch.bfloat16" in script
    assert output == "OK: no discrepancy\n"


@pytest.mark.kvcheck_target("sglang")
def test_sglang_scripts_run_without_kvcheck(tmp_path: Path) -> None:
    """MHA, MLA and DSA reproductions for sglang import sglang alone and pass on its pools;
    a known sglang finding (no check for repeated move targets) is reproduced."""
    latent = (b"\x80\x3f\x00\x40\x40\x40",)  # bfloat16 1.0, 2.0, 3.0
    mha_write = WriteKV(
        layer_id=2,
        locs=(3, 9),
        k_rows=(b"\x80\x3f\x00\x40",) * 2,
        v_rows=(b"\x40\x40\x80\x40",) * 2,
    )
    cases = {
        "mha": Reproduction(
            SGLANG_MHA,
            (
                mha_write,
                Move(tgt=(5, 3), src=(3, 9)),
                HostCopy("a", (4, 5)),
                HostReload("a", (8, 9)),
            ),
        ),
        "mla": Reproduction(
            SGLANG_MLA,
            (WriteKV(layer_id=0, locs=(6,), k_rows=latent), Move(tgt=(7,), src=(6,))),
        ),
        "dsa": Reproduction(
            SGLANG_DSA,
            (
                WriteKV(layer_id=1, locs=(70,), k_rows=latent),
                WriteIndexK(layer_id=0, locs=(70,), key_rows=(KEY,), scale_rows=(SCALE,)),
                Move(tgt=(65,), src=(70,)),
                HostCopy("a", tuple(range(64, 128))),
                HostReload("a", tuple(range(0, 64))),
            ),
        ),
        "dsa_scaled": Reproduction(SCALED_DSA, SCALED_OPS),
        "dsa_kpool": Reproduction(KPOOL_DSA, KPOOL_OPS),
    }
    paths = [
        write_script(reproduction_to_json(rep), target="sglang", directory=tmp_path, test=name)
        for name, rep in cases.items()
    ]
    # sglang 0.5.23 does not validate move targets (finding I-series): a known discrepancy.
    finding = Reproduction(SGLANG_MHA, (Move(tgt=(1, 1), src=(2, 3)),))
    paths.append(
        write_script(
            reproduction_to_json(finding), target="sglang", directory=tmp_path, test="finding"
        )
    )
    results = _run_batch(paths, block_kvcheck=True)
    for name in cases:
        result = results[f"repro_{name}"]
        assert (result["code"], result["message"].strip()) == (0, "OK: no discrepancy"), name
    result = results["repro_finding"]
    assert result["code"] == 1
    assert result["message"] == (
        "REPRODUCED: move_kv_cache(tgt_loc=[1, 1], src_loc=[2, 3]) returned, but should raise "
        "ValueError"
    )


def test_verify_writes_a_script_that_reproduces_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: `kvcheck verify` on a broken target writes repro_<test>.py from the state
    machine's own reproduction; the script fails on the broken pool, its kvcheck twin passes."""
    from kvcheck.runner.cli import main

    tests_dir = Path(__file__).parent
    monkeypatch.chdir(tests_dir)
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    results = tmp_path / "results"
    argv = [
        "verify",
        "--target",
        "repro_targets:MOVE_IGNORES_V",
        "--device",
        "cpu",
        "--quiet",
        "--results-dir",
        str(results),
        "-k",
        "test_pool_matches_reference_after_every_step and mha",
    ]
    assert main(argv) == 1
    scripts = sorted((results / "repros").glob("repro_*.py"))
    assert len(scripts) == 1, scripts
    broken = subprocess.run(
        [sys.executable, str(scripts[0])], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert broken.returncode == 1 and "REPRODUCED" in broken.stdout + broken.stderr
    stored = json.loads((results / "results.json").read_text())
    (failure,) = [f for t in stored["tests"] for f in t["failures"] if f.get("reproduction_data")]
    fixed = tmp_path / "fixed.py"
    fixed.write_text(render_script(failure["reproduction_data"], target="kvcheck"))
    passed = subprocess.run(
        [sys.executable, str(fixed)], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert passed.returncode == 0, passed.stdout + passed.stderr


#: An MXFP8 pool at sglang's interleaved page size (one 128-wide head: four e8m0 scales a
#: token): a scaled write (fp8 rows and the caller's scales), a fused write (bf16 rows the
#: pool quantizes), a move, and a host copy and reload.
MXFP8 = PoolSpec(
    family="mha",
    size=128,
    page_size=128,
    layer_num=1,
    dtype="float8_e4m3fn",
    head_num=1,
    head_dim=128,
    kv_quant="mxfp8",
)
MXFP8_SCALED_WRITE = WriteKV(
    layer_id=0,
    locs=(3, 5),
    k_rows=(),
    payload=Payload(
        dtype="float8_e4m3fn",
        k_rows=(b"\x38" * 128,) * 2,
        v_rows=(b"\x40" * 128,) * 2,
        k_scale_rows=(b"\x7f\x80\x7e\x7f",) * 2,
        v_scale_rows=(b"\x7f\x7f\x81\x7f",) * 2,
    ),
)
MXFP8_OPS = (
    MXFP8_SCALED_WRITE,
    WriteKV(
        layer_id=0,
        locs=(7,),
        k_rows=(),
        payload=Payload(dtype="bfloat16", k_rows=(b"\x80\x3f" * 128,), v_rows=(b"\x00\x40" * 128,)),
    ),
    Move(tgt=(9,), src=(3,)),
    HostCopy("a", (5, 7)),
    HostReload("a", (11, 12)),
)


def test_mxfp8_scaled_write_script_passes_the_callers_scales() -> None:
    """A script of an MXFP8 scaled write hands the pool the caller's e8m0 scales (without
    them the pool would take the fp8 rows for a fused write and refuse them)."""
    script, output = _replay_on_kvcheck(Reproduction(MXFP8, MXFP8_OPS))
    assert "k_scale = rows(torch.float8_e8m0fnu, (1, 4)" in script
    assert output == "OK: no discrepancy\n"


@pytest.mark.kvcheck_target("sglang")
def test_sglang_mxfp8_scripts_carry_the_cpu_stand_ins(tmp_path: Path) -> None:
    """An MXFP8 reproduction for sglang runs on CPU with kvcheck's stand-ins for the pool's
    GPU-only store pieces written into it (sglang and torch only): clean ops pass, and a
    move into slot 0 shows finding Q13 (the payload moves, its interleaved scales do not)."""
    clean = write_script(
        reproduction_to_json(Reproduction(MXFP8, MXFP8_OPS)),
        target="sglang",
        directory=tmp_path,
        test="mxfp8",
    )
    q13 = write_script(
        reproduction_to_json(Reproduction(MXFP8, (MXFP8_SCALED_WRITE, Move(tgt=(0,), src=(3,))))),
        target="sglang",
        directory=tmp_path,
        test="mxfp8_q13",
    )
    assert "def cpu_store_cache(" in clean.read_text()
    results = _run_batch([clean, q13], block_kvcheck=True)
    assert (results["repro_mxfp8"]["code"], results["repro_mxfp8"]["message"].strip()) == (
        0,
        "OK: no discrepancy",
    )
    assert results["repro_mxfp8_q13"]["code"] == 1
    assert "k_scale_buffer[0]" in results["repro_mxfp8_q13"]["message"]
