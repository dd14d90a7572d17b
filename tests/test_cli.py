"""The kvcheck command (kvcheck.runner.cli) and its summaries (kvcheck.runner.summary).

Settings errors are checked in-process (they stop before pytest starts); verify and replay
run their pytest subprocess on small temporary suites.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcheck.runner.cli import main, pytest_command
from kvcheck.runner.summary import (
    exit_code_for,
    render_replay,
    render_verify,
    replay_verdicts,
    short_name,
)

_LIB = "def clamp(x):\n    return x  # bug: no upper bound\n"
_FIXED_LIB = "def clamp(x):\n    return min(x, 100)\n"
_SUITE = """
    import pytest
    from hypothesis import given, strategies as st

    import mylib

    @given(st.integers(0, 10_000))
    def test_clamp_at_most_100(x):
        assert mylib.clamp(x) <= 100

    @given(st.integers(0, 10**6))
    def test_clamp_never_grows(x):
        assert mylib.clamp(x) <= x

    @pytest.mark.kvcheck_needs("move")
    def test_needs_move(kvcheck_target):
        pass
"""
_FAKE_TARGET = """
    from types import MappingProxyType
    from kvcheck.targets.builtin import KVCheckTarget

    class FakeTarget(KVCheckTarget):
        name = "fake"
        unsupported = MappingProxyType({"move": "no move kernel"})
"""


#: Settings of the outer run that must not reach inner runs (an outer xdist worker's
#: PYTEST_XDIST_* would make inner runs think they are xdist workers too).
_LEAKY_PREFIXES = ("KVCHECK_", "PYTEST_XDIST_")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No KVCHECK_*/CI/xdist settings from the outer run leak into the command."""
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in ("CI", "GITHUB_ACTIONS"):
            monkeypatch.delenv(name)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A small suite with one buggy property, and a target module, importable by subprocesses."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "mylib.py").write_text(_LIB)
    (root / "test_clamp.py").write_text(textwrap.dedent(_SUITE))
    (root / "fake_target.py").write_text(textwrap.dedent(_FAKE_TARGET))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(root))
    yield root
    sys.modules.pop("fake_target", None)


def _workdir(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / name
    path.mkdir()
    monkeypatch.chdir(path)
    return path


# --- usage and target errors (no pytest run) -----------------------------------------------------


def test_unknown_target_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    """verify --target with an unknown name exits 2 with the name and the valid names."""
    assert main(["verify", "--target", "bogus"]) == 2
    error = capsys.readouterr().err
    assert "unknown target 'bogus'" in error and "valid targets" in error


def test_target_import_failure_exits_2_with_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A module:attr whose import fails exits 2 quoting the import error."""
    assert main(["replay", "--target", "no_such_module_kv:target"]) == 2
    assert "No module named 'no_such_module_kv'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--device", "gpu"], "device='gpu'"),
        (["verify", "--profile", "fast"], "--profile='fast' is not a kvcheck profile"),
        (["verify", "--profile", "kvcheck-replay"], "not a kvcheck profile"),
        (["verify", "-n", "many"], "-n 'many'"),
        (["verify", "--no-such-option"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
        ([], "usage: kvcheck"),
        (["memory-report", "--model", "gpt-x"], "model='gpt-x' is not a kvcheck model"),
        (["memory-report", "--budget-gib", "0"], "--budget-gib=0.0 must be positive"),
        (["memory-report", "--page-size", "0"], "--page-size=0 must be at least 1"),
    ],
    ids=[
        "device",
        "profile",
        "replay-profile",
        "workers",
        "unknown-option",
        "unknown-command",
        "no-command",
        "unknown-model",
        "budget",
        "page-size",
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Every usage error exits 2 with a message naming the bad value."""
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_database_setting_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unusable KVCHECK_DB stops the command before pytest runs."""
    monkeypatch.setenv("KVCHECK_DB", "ftp://example/db")
    assert main(["verify"]) == 2
    assert "KVCHECK_DB='ftp://example/db'" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version and exits 0."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "kvcheck 0.1.0"


# --- memory report -------------------------------------------------------------------------------


def test_memory_report_shows_skip_layer_saving(capsys: pytest.CaptureFixture[str]) -> None:
    """The report covers every model, checks meta-built bytes, and shows the skip saving."""
    assert main(["memory-report", "--budget-gib", "8"]) == 0
    out = capsys.readouterr().out
    for name in ("GLM-5.2-like", "deepseek-ai/DeepSeek-V3.2", "Qwen/Qwen3-Embedding-8B"):
        assert name in out
    assert "MISMATCH" not in out and "built == formula" in out
    assert "GLM-5.2-like: " in out and "bytes/token saved" in out
    assert "deepseek-ai/DeepSeek-V3.2: no skip layers" in out


def test_memory_report_shows_both_fp8_dsa_latent_layouts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """At fp8 the report puts the raw latent layout beside sglang's scaled one, which it sizes
    (656 bytes a layer: GLM-5.2-like's 53,940 bytes/token, 47,700 raw); other dtypes have no
    such rows."""
    assert main(["memory-report", "--model", "GLM-5.2-like", "--dtype", "float8_e4m3fn"]) == 0
    out = capsys.readouterr().out
    assert "raw 576 B/layer 47,700; scaled 656 B/layer (sglang 0.5.23's default) 53,940" in out
    assert main(["memory-report", "--model", "GLM-5.2-like"]) == 0
    assert "scaled 656" not in capsys.readouterr().out


def test_memory_report_shows_index_kpools(capsys: pytest.CaptureFixture[str]) -> None:
    """DSA models get their cell size with an index kpool of 2 and 4 (61 indexer layers of
    DeepSeek-V3.2 at 132, 66, 33 index bytes, beside 61 scaled fp8 rows of 656 bytes) and the
    tails of one request slot."""
    assert (
        main(["memory-report", "--model", "deepseek-ai/DeepSeek-V3.2", "--dtype", "float8_e4m3fn"])
        == 0
    )
    out = capsys.readouterr().out
    assert "kpool 1 48,068; kpool 2 44,042 (-8.4%); kpool 4 42,029 (-12.6%)" in out
    assert "kpool 4 tails 124,928 B per request slot" in out  # 61 x 2 x 4 x 128 x 2
    assert main(["memory-report", "--model", "Qwen/Qwen3-Embedding-8B"]) == 0
    assert "kpool" not in capsys.readouterr().out


def test_memory_report_shows_decode_context_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    """MLA/DSA models get one rank's bytes per widened token at dcp 2 and 4: DeepSeek-V3.2
    at fp8 keeps 61 x 132 index bytes whole and splits 61 x 656 latent bytes."""
    args = ["memory-report", "--model", "deepseek-ai/DeepSeek-V3.2", "--dtype", "float8_e4m3fn"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "dcp 1 48,068; dcp 2 28,060 (-41.6%); dcp 4 18,056 (-62.4%)" in out
    assert main(["memory-report", "--model", "Qwen/Qwen3-Embedding-8B"]) == 0
    assert "dcp 2" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("dtype", "shown"),
    [
        ("fp8_e4m3", "dtype float8_e4m3fn (--kv-cache-dtype fp8_e4m3)"),
        ("fp8_e5m2", "dtype float8_e5m2 (--kv-cache-dtype fp8_e5m2)"),
        ("bf16", "dtype bfloat16 (--kv-cache-dtype bf16)"),
        ("auto", "dtype bfloat16 (--kv-cache-dtype auto)"),
        ("float16", "dtype float16,"),
    ],
)
def test_memory_report_takes_sglang_dtypes_and_short_model_names(
    capsys: pytest.CaptureFixture[str], dtype: str, shown: str
) -> None:
    """--dtype takes sglang's --kv-cache-dtype spellings (and torch names), --model a
    model's short name in any case; the report names the dtype it sized."""
    assert main(["memory-report", "--dtype", dtype, "--model", "deepseek-V3.2"]) == 0
    out = capsys.readouterr().out
    assert shown in out and "deepseek-ai/DeepSeek-V3.2" in out and "GLM" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtype", "fp4_e2m1"], "dtype='fp4_e2m1' is not a KV dtype"),
        (["--dtype", "fp8_e4m"], "(did you mean 'fp8_e4m3' or 'float8_e4m3fn'?)"),
        (["--model", "DeepSek-V3.2"], "(did you mean 'DeepSeek-V3.2'?)"),
        (["--model", "qwen3-embeding-8b"], "(did you mean 'Qwen3-Embedding-8B'?)"),
    ],
    ids=["fp4-without-recipe", "dtype-typo", "model-typo", "model-typo-case"],
)
def test_memory_report_refuses_what_it_cannot_size_naming_what_it_can(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """A dtype kvcheck builds no pool for is refused saying so, a typo gets the nearest name,
    and every refusal lists what is accepted."""
    assert main(["memory-report", *argv]) == 2
    error = capsys.readouterr().err
    assert message in error
    assert (
        "fp8_e4m3" in error and "float8_e4m3fn" in error
    ) or "deepseek-ai/DeepSeek-V3.2" in error


@pytest.mark.parametrize(
    ("dtype", "cell", "refusal"),
    [
        ("mxfp8", "payload 73,728 + scales 2,304 = 76,032", "rule mxfp8_kv_cache_dtype"),
        (
            "nvfp4",
            "payload 36,864 + scales 4,608 + dequant workspace 2,048 = 43,520",
            "rule fp4_kv_cache_dtype",
        ),
        ("fp4_mx_block16", "payload 36,864 + scales 4,608 = 41,472", "rule fp4_kv_cache_dtype"),
    ],
)
def test_memory_report_sizes_quantized_cells_beside_the_noop_refusal(
    capsys: pytest.CaptureFixture[str], dtype: str, cell: str, refusal: str
) -> None:
    """A quantized --kv-cache-dtype is sized with its scales (built pool == formula), and
    the seeds' refusal of --prefill-only-disable-kv-cache for it is shown beside the cell."""
    argv = ["memory-report", "--dtype", dtype, "--model", "Qwen3-Embedding-8B"]
    assert main([*argv, "--page-size", "128"]) == 0
    out = capsys.readouterr().out
    assert cell in out and refusal in out and "built == formula" in out


def test_memory_report_one_model(capsys: pytest.CaptureFixture[str]) -> None:
    """--model restricts the report to that model."""
    assert main(["memory-report", "--model", "Qwen/Qwen3-Embedding-8B", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen3-Embedding-8B" in out and "GLM" not in out and "float16" in out


# --- pieces of verify ----------------------------------------------------------------------------


def test_pytest_command_passes_options_through(tmp_path: Path) -> None:
    """Target, device, profile, workers, junit, -k and extra args reach pytest."""
    command = pytest_command(
        suite=str(tmp_path),
        target="m:t",
        device="cpu",
        profile="kvcheck-ci",
        workers="auto",
        junit_xml="j.xml",
        keyword="mha",
        results_path=tmp_path / "r.json",
        extra=["-x"],
    )
    assert command[:2] == [sys.executable, "-c"] and command[3] == str(tmp_path)
    for piece in (
        "--kvcheck-target=m:t",
        "--kvcheck-device=cpu",
        "--kvcheck-profile=kvcheck-ci",
        "--junit-xml=j.xml",
        f"--kvcheck-results={tmp_path / 'r.json'}",
    ):
        assert piece in command
    assert command[-1] == "-x"
    assert command[command.index("-n") + 1] == "auto" and command[command.index("-k") + 1] == "mha"
    assert pytest_command(
        suite="kvcheck.suite",
        target="kvcheck",
        device=None,
        profile=None,
        workers=None,
        junit_xml=None,
        keyword=None,
        results_path=tmp_path,
    )[3:5] == ["--pyargs", "kvcheck.suite"]


def test_pytest_command_names_plugins_without_autoload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With plugin autoloading off, kvcheck's, Hypothesis's and xdist's plugins are named."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    command = pytest_command(
        suite="kvcheck.suite",
        target="kvcheck",
        device=None,
        profile=None,
        workers="2",
        junit_xml=None,
        keyword=None,
        results_path=tmp_path / "r.json",
    )
    loaded = [command[i + 1] for i, arg in enumerate(command) if arg == "-p"]
    assert {"kvcheck.runner.plugin", "_hypothesis_pytestplugin", "xdist.plugin"} <= set(loaded)


@pytest.mark.parametrize(("status", "code"), [(0, 0), (1, 1), (2, 2), (3, 2), (4, 2), (5, 2)])
def test_exit_code_for_pytest_status(status: int, code: int) -> None:
    """0 passes, 1 is a property failure, anything else means the suite did not run as asked."""
    assert exit_code_for(status) == code


def test_short_name_drops_directories() -> None:
    """Node ids lose their directories but keep parameters."""
    assert short_name("a/b/test_x.py::test_y[mha-2]") == "test_x.py::test_y[mha-2]"
    assert short_name("test_x.py") == "test_x.py"


_RESULTS: dict[str, Any] = {
    "target": {"name": "fake", "version": "1.2"},
    "device": {"requested": "auto", "resolved": "cpu"},
    "profile": "kvcheck-dev",
    "database": "directory /tmp/db",
    "duration_s": 2.5,
    "tests": [
        {
            "nodeid": "s/test_a.py::test_ok",
            "outcome": "passed",
            "duration_s": 1.0,
            "statistics": {"examples": 100, "shrinks": 0},
            "stored_examples": 0,
        },
        {
            "nodeid": "s/test_a.py::test_skip",
            "outcome": "skipped",
            "duration_s": 0.0,
            "skip_reason": "target 'fake' does not support move (no move kernel)",
        },
        {
            "nodeid": "s/test_a.py::test_bad",
            "outcome": "failed",
            "duration_s": 1.5,
            "statistics": {"examples": 12, "shrinks": 30},
            "stored_examples": 2,
            "failures": [
                {
                    "error": "AssertionError: assert 101 <= 100",
                    "reproduction": "Minimal example: test_bad(\n    x=101,\n)",
                    "blob": "@reproduce_failure('6.155.2', b'AEFl')",
                }
            ],
        },
        {
            "nodeid": "s/test_a.py::test_plain_fail",
            "outcome": "failed",
            "duration_s": 0.0,
            "message": "assert 1 == 2",
            "stored_examples": 0,
        },
    ],
}


def test_render_verify_verbose_table_and_reproductions() -> None:
    """--verbose: a row per test, skip reasons, and each failure's reproduction."""
    text = render_verify(_RESULTS, exit_code=1, verbosity=1)
    assert "verify: target fake 1.2; device cpu; profile kvcheck-dev" in text
    assert "passed             100    1.0s  test_a.py::test_ok" in text
    assert "target 'fake' does not support move (no move kernel)" in text
    assert "found after 12 examples, 30 shrink steps" in text
    assert "    Minimal example: test_bad(\n        x=101,\n    )" in text
    assert "reproduce with: @reproduce_failure('6.155.2', b'AEFl')" in text
    assert "    assert 1 == 2" in text
    assert text.endswith("1 passed, 2 failed, 1 skipped in 2.5s; exit 1")


def test_render_verify_default_is_short() -> None:
    """Default: each failure once, passes collapsed, skips grouped, no per-test rows."""
    many = dict(_RESULTS)
    many["tests"] = [
        *[{**_RESULTS["tests"][0], "nodeid": f"s/test_a.py::test_ok[{i}]"} for i in range(128)],
        *[{**_RESULTS["tests"][1], "nodeid": f"s/test_a.py::test_skip[{i}]"} for i in range(3)],
        _RESULTS["tests"][2],
    ]
    text = render_verify(many, exit_code=1, locations={"results": ".kvcheck/results.json"})
    assert "test_ok[" not in text  # passes collapsed
    assert "128 properties passed" in text
    assert "3 skipped:\n    3 x target 'fake' does not support move (no move kernel)" in text
    assert text.count("test_a.py::test_bad") == 1
    assert "FAILED test_a.py::test_bad (found after 12 examples, 30 shrink steps)" in text
    assert "    Minimal example: test_bad(" in text
    assert "results: .kvcheck/results.json" in text
    assert len(text.splitlines()) <= 40
    quiet = render_verify(many, exit_code=1, verbosity=-1)
    assert "Minimal example" not in quiet and "FAILED test_a.py::test_bad" in quiet


def _failing_test(name: str, example_lines: int) -> dict[str, Any]:
    steps = "\n".join(f"    state.step_{i}()" for i in range(example_lines - 1))
    return {
        "nodeid": f"s/test_m.py::{name}",
        "outcome": "failed",
        "failures": [
            {
                "error": f"PropertyFailure: got 1 but should be 0 [{name}]\nsecond line",
                "reproduction": f"Minimal example:\n{steps}",
            }
        ],
    }


def test_several_failures_show_the_smallest_in_full_and_the_others_in_a_line() -> None:
    """With several failures the smallest example is printed in full and each other failure
    in one line (property, error headline, example size, where its report is); --verbose
    prints every one in full."""
    results = {
        "tests": [
            _failing_test("test_big", 40),
            _failing_test("test_small", 3),
            _failing_test("test_mid", 12),
            {"nodeid": "s/test_m.py::test_plain", "outcome": "failed", "message": "boom"},
        ]
    }
    where = {"results": ".kvcheck/results.json", "pytest log": ".kvcheck/pytest.log"}
    text = render_verify(results, exit_code=1, locations=where)
    assert "the smallest in full, the other 3 in a line each" in text
    assert text.count("state.step_") == 2  # test_small's example only
    assert text.index("FAILED test_m.py::test_small") < text.index("FAILED test_m.py::test_mid")
    report = "full report: .kvcheck/results.json, .kvcheck/pytest.log"
    assert (
        "FAILED test_m.py::test_mid: PropertyFailure: got 1 but should be 0 [test_mid] "
        f"(example: 12 lines; {report})"
    ) in text
    assert f"[test_big] (example: 40 lines; {report})" in text
    assert f"FAILED test_m.py::test_plain: boom (example: no example; {report})" in text
    assert "second line" in text and text.count("second line") == 1
    verbose = render_verify(results, exit_code=1, verbosity=1, locations=where)
    assert verbose.count("state.step_") == 2 + 39 + 11
    assert len(text.splitlines()) < len(verbose.splitlines()) - 40


def test_a_failure_printed_during_the_run_is_one_line_in_the_summary() -> None:
    """A failure the command printed in full while the run went on is not printed in full
    again: the summary gives it one line saying when it was printed, and prints no other
    in full in its place; failures not printed yet are summarized as before."""
    results = {"tests": [_failing_test("test_small", 3), _failing_test("test_mid", 12)]}
    printed = {"s/test_m.py::test_small": 31.4}
    text = render_verify(results, exit_code=1, printed=printed)
    assert "the smallest in full (printed above at 31 s), the other 1 in a line each" in text
    assert "state.step_" not in text  # neither example in full
    assert "[test_small] (example: 3 lines; full report: printed above at 31 s)" in text
    assert "[test_mid] (example: 12 lines; full report: results.json)" in text
    only = render_verify({"tests": results["tests"][:1]}, exit_code=1, printed=printed)
    assert "state.step_" not in only and "full report: printed above at 31 s" in only
    verbose = render_verify(results, exit_code=1, verbosity=1, printed=printed)
    assert verbose.count("state.step_") == 11  # test_mid's only
    assert "each with its reproduction (a line for each printed above)" in verbose
    later = render_verify(results, exit_code=1, printed={"s/test_m.py::test_mid": 50.0})
    assert later.count("state.step_") == 2  # the smallest, which was not printed yet
    assert "[test_mid] (example: 12 lines; full report: printed above at 50 s)" in later


def test_the_summary_time_is_the_command_wall_time() -> None:
    """render_verify shows wall_s (the kvcheck command's time, start-up included) when
    given, pytest's session time otherwise."""
    assert render_verify(_RESULTS, exit_code=1).endswith("in 2.5s; exit 1")
    assert render_verify(_RESULTS, exit_code=1, wall_s=17.25).endswith("in 17.2s; exit 1")


def test_replay_verdicts_and_render() -> None:
    """Stored examples that still fail are 'still failing'; failures without any are 'failed'."""
    verdicts = [(verdict, test["nodeid"]) for verdict, test in replay_verdicts(_RESULTS["tests"])]
    assert verdicts == [
        ("still failing", "s/test_a.py::test_bad"),
        ("failed", "s/test_a.py::test_plain_fail"),
    ]
    text = render_replay(_RESULTS, exit_code=1)
    assert "still failing         2  test_a.py::test_bad" in text
    assert text.endswith("1 still failing, 1 failed, 3 tests without stored examples; exit 1")


def test_render_replay_with_nothing_stored() -> None:
    """With no stored examples the replay summary says there was nothing to replay."""
    text = render_replay({"database": "directory /db", "tests": []}, exit_code=2)
    assert "nothing to replay: no stored examples in directory /db" in text
    assert text.endswith("exit 2")


# --- verify and replay end to end (pytest subprocesses) ------------------------------------------


def test_verify_reports_failure_with_reproduction(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A failing property exits 1; progress streams, the summary shows its reproduction."""
    _workdir(tmp_path, "run", monkeypatch)
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    argv = [
        "verify",
        "--suite",
        str(project),
        "--target",
        "fake_target:FakeTarget",
        "--device",
        "cpu",
        "--json",
        "summary.json",
        "--junit-xml",
        "junit.xml",
        "--",
        "-p",
        "no:randomly",
    ]
    assert main(argv) == 1
    out = capfd.readouterr().out
    assert "kvcheck verify: running 3 tests" in out  # kvcheck's own progress
    assert "PASSED" not in out  # not pytest's -v log: that is in the results directory
    assert "test_clamp_never_grows PASSED" in Path(".kvcheck/pytest.log").read_text()
    assert "FAILED test_clamp.py::test_clamp_at_most_100" in out
    assert "Minimal example: test_clamp_at_most_100(" in out and "x=101" in out
    assert "reproduce with: @reproduce_failure(" in out
    assert "1 x target 'fake' does not support move (no move kernel)" in out
    assert "1 property passed" in out
    assert "results: .kvcheck/results.json" in out
    summary = json.loads(Path("summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["command"] == "verify"
    passing = [t for t in summary["tests"] if t["nodeid"].endswith("test_clamp_never_grows")]
    assert passing[0]["statistics"]["examples"] == 100  # kvcheck-dev's max_examples
    assert "kvcheck_statistics" in Path("junit.xml").read_text()


@pytest.mark.parametrize("workers", [None, "2"], ids=["one-process", "xdist"])
def test_verify_reports_a_failure_while_the_run_goes_on(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    workers: str | None,
) -> None:
    """The failure is printed in full as soon as its test has finished, before the tests
    after it (one process) and before the summary, which refers to it in
    one line; under xdist the controller reports it when the worker's report arrives."""
    _workdir(tmp_path, "run", monkeypatch)
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    argv = ["verify", "--suite", str(project), "--target", "fake_target:FakeTarget"]
    argv += ["--device", "cpu", *(["-n", workers] if workers else []), "--", "-p", "no:randomly"]
    assert main(argv) == 1
    out = capfd.readouterr().out
    early = out.index("kvcheck verify: at ")
    assert ", a property failed; the run goes on (Ctrl-C stops it and keeps the results)" in out
    block = out.index("FAILED test_clamp.py::test_clamp_at_most_100 (found after")
    summary = out.index("kvcheck verify: target fake")
    assert early < block < summary
    if workers is None:  # the failing test runs first: the other two finish after its report
        assert block < out.index("[2/3]") < out.index("[3/3]") < summary
    assert out.count("Minimal example: test_clamp_at_most_100(") == 1
    assert out.count("reproduce with: @reproduce_failure(") == 1
    seconds = out[early:].split()[3]  # "kvcheck verify: at N s, ..."
    reference = out[summary:].split("FAILED test_clamp.py::test_clamp_at_most_100: ")[1]
    assert reference.splitlines()[0].endswith(f"; full report: printed above at {seconds} s)")


def test_verify_all_passing_exits_0(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """With -k selecting passing properties only, verify exits 0; --verbose streams pytest's
    -v log and adds the per-test table."""
    _workdir(tmp_path, "run", monkeypatch)
    argv = ["verify", "--suite", str(project), "--device", "cpu", "-k", "never_grows"]
    assert main([*argv, "--verbose"]) == 0
    out = capfd.readouterr().out
    assert out.rstrip().endswith("exit 0")
    assert "test_clamp.py::test_clamp_never_grows PASSED" in out  # pytest's own -v log
    assert "RESULT" in out and "test_clamp.py::test_clamp_never_grows" in out.split("RESULT")[1]


def test_verify_json_write_error_is_one_line_and_exit_2(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A --json file that cannot be written after the run: one error line, exit 2."""
    import kvcheck.runner.cli

    def refuse(path: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    _workdir(tmp_path, "run", monkeypatch)
    monkeypatch.setattr(kvcheck.runner.cli, "_write_json", refuse)
    argv = ["verify", "--suite", str(project), "--device", "cpu", "-k", "never_grows"]
    assert main([*argv, "--quiet", "--json", "out.json"]) == 2
    captured = capfd.readouterr()
    assert captured.err.strip() == "kvcheck: error: cannot write --json out.json: Permission denied"
    assert "running" not in captured.out  # --quiet: no progress


def test_verify_pytest_usage_error_exits_2(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A pytest argument pytest rejects exits 2 and says pytest stopped early."""
    _workdir(tmp_path, "run", monkeypatch)
    assert main(["verify", "--suite", str(project), "--", "--no-such-pytest-flag"]) == 2
    assert "pytest stopped before running the suite" in capfd.readouterr().err


def test_verify_collection_error_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A suite that cannot be imported exits 2 and the summary shows the collection error."""
    suite = tmp_path / "broken"
    suite.mkdir()
    (suite / "test_broken.py").write_text("import no_such_module_for_kvcheck\n")
    _workdir(tmp_path, "run", monkeypatch)
    assert main(["verify", "--suite", str(suite), "--device", "cpu"]) == 2
    out = capfd.readouterr().out
    assert "Collection errors" in out and "no_such_module_for_kvcheck" in out


@pytest.mark.parametrize(
    ("args", "given"),
    [(["-k", "no_such_test"], "-k 'no_such_test'"), (["--family", "noop"], "--family noop")],
    ids=["k", "family"],
)
def test_verify_selecting_no_test_says_so_in_one_line_and_exits_2(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    args: list[str],
    given: str,
) -> None:
    """A -k or --family that selects none of the suite's tests (pytest's exit 5): one error
    line naming what was given and how to list the tests, exit 2."""
    _workdir(tmp_path, "run", monkeypatch)
    assert main(["verify", "--suite", str(project), "--device", "cpu", "--quiet", *args]) == 2
    errors = [line for line in capfd.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"kvcheck: error: {given} selected no test of {project}; -k matches parts of test ids "
        "(pytest -k syntax: and, or, not, parentheses); list them with: pytest --collect-only "
        f"-q {project}"
    ]


def test_replay_round_trip_across_working_directories(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A failure saved by one run is replayed from another directory: still failing, then fixed."""
    first_db = tmp_path / "runner-db"  # e.g. a CI runner's database, downloaded as an artifact
    _workdir(tmp_path, "runner", monkeypatch)
    monkeypatch.setenv("KVCHECK_DB", str(first_db))
    assert main(["verify", "--suite", str(project), "--device", "cpu", "-k", "clamp"]) == 1
    capfd.readouterr()

    _workdir(tmp_path, "laptop", monkeypatch)
    monkeypatch.setenv("KVCHECK_DB", f"{tmp_path / 'local-db'}{os.pathsep}{first_db}")
    assert main(["replay", "--suite", str(project), "--device", "cpu", "--json", "r.json"]) == 1
    out = capfd.readouterr().out
    assert "still failing" in out and "test_clamp.py::test_clamp_at_most_100" in out
    assert "Example (not shrunk): test_clamp_at_most_100(" in out  # replay does not shrink
    verdicts = json.loads(Path("r.json").read_text())["verdicts"]
    assert [v["verdict"] for v in verdicts] == ["still failing"]

    (project / "mylib.py").write_text(_FIXED_LIB)
    assert main(["replay", "--suite", str(project), "--device", "cpu"]) == 0
    out = capfd.readouterr().out
    assert "fixed" in out and "test_clamp.py::test_clamp_at_most_100" in out
    assert "1 fixed" in out
