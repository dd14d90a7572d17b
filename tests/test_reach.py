"""Tests of ``tools/reach.py``: span finding, range grouping and reason matching.

All run on a small synthetic source file with hand-made coverage data: no sglang and no
coverage.py run is needed. One test reads sglang's installed sources (without importing
sglang) to check that the sglang reach table names methods that exist.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.declaration import declaration_of
from kvcheck.targets import resolve_target
from tools import reach
from tools.reach import (
    UNEXPLAINED,
    Gap,
    MethodReach,
    ReachReport,
    Reason,
    Scope,
    analyze,
    explain,
    find_spans,
    format_report,
    group_gaps,
)

ROOT = Path(__file__).resolve().parents[1]
FILE = "pkg/pool.py"
SOURCE = """\
import os


class Pool:
    flag = True

    def write(self, loc):
        if self.use_hnd:
            pages = loc // 4
            return pages
        return loc

    @staticmethod
    def helper():
        return 1

    def never(self):
        x = 1
        return x


def free_function():
    return 2
"""
STATEMENTS = (1, 4, 5, 7, 8, 9, 10, 11, 13, 14, 15, 17, 18, 19, 22, 23)
MISSING = (9, 10, 15, 18, 19, 23)
REASONS = (
    Reason(FILE, "Pool.write", "HND layout", pattern=r"use_hnd"),
    Reason(FILE, "Pool.nev*", "never called"),
)


def _analyze(source: str = SOURCE, shift: int = 0, reasons=REASONS) -> ReachReport:
    statements = [line + shift for line in STATEMENTS]
    missing = [line + shift for line in MISSING]
    return analyze(
        {FILE: (statements, missing)},
        {FILE: source},
        [Scope(FILE, ("Pool",), headline=True)],
        reasons,
        target="synthetic",
    )


def test_find_spans_gives_classes_methods_and_functions_with_decorators():
    """Spans cover each class and method, a method's span starting at its decorator."""
    spans = {span.qualname: (span.start, span.end, span.kind) for span in find_spans(SOURCE)}
    assert spans == {
        "Pool": (4, 19, "class"),
        "Pool.write": (7, 11, "function"),
        "Pool.helper": (13, 15, "function"),
        "Pool.never": (17, 19, "function"),
        "free_function": (22, 23, "function"),
    }


def test_group_gaps_joins_consecutive_missing_statements_per_method():
    """Missing statements with no executed statement between them form one range."""
    gaps = group_gaps(FILE, STATEMENTS, MISSING, find_spans(SOURCE))
    assert [(g.qualname, g.start, g.end, g.lines) for g in gaps] == [
        ("Pool.write", 9, 10, 2),
        ("Pool.helper", 15, 15, 1),
        ("Pool.never", 18, 19, 2),
        ("free_function", 23, 23, 1),
    ]


def test_group_gaps_never_crosses_a_method_boundary():
    """Two methods' missing lines stay two ranges even with nothing executed between."""
    gaps = group_gaps(FILE, STATEMENTS, (15, 17, 18), find_spans(SOURCE))
    assert [(g.qualname, g.start, g.end) for g in gaps] == [
        ("Pool.helper", 15, 15),
        ("Pool.never", 17, 18),
    ]


def test_group_gaps_splits_at_an_executed_statement():
    """An executed statement between two missing ones splits the range."""
    gaps = group_gaps(FILE, STATEMENTS, (8, 10), find_spans(SOURCE))
    assert [(g.start, g.end) for g in gaps] == [(8, 8), (10, 10)]


def test_analyze_counts_only_the_scoped_names():
    """Lines outside the scope's names (free_function) count nowhere."""
    report = _analyze()
    assert {m.qualname for m in report.methods} == {
        "Pool.<class body>",
        "Pool.write",
        "Pool.helper",
        "Pool.never",
    }
    assert (report.headline_lines, report.headline_covered) == (13, 8)
    assert report.headline_percent == pytest.approx(100 * 8 / 13)
    assert report.by_class() == {(FILE, "Pool"): (13, 8)}


def test_a_pattern_matches_the_header_of_the_enclosing_block():
    """A range inside `if self.use_hnd:` is explained by a pattern on that header."""
    reasons = {(g.qualname, g.start): g.reason for g in _analyze().gaps}
    assert reasons == {
        ("Pool.write", 9): "HND layout",
        ("Pool.helper", 15): UNEXPLAINED,
        ("Pool.never", 18): "never called",
    }


def test_reasons_survive_reformatting():
    """Shifting every line (new lines above) leaves every range with the same reason."""
    shifted = "# a new header comment\n\n\n" + SOURCE
    before = [(g.qualname, g.reason) for g in _analyze().gaps]
    after = [(g.qualname, g.reason) for g in _analyze(shifted, shift=3).gaps]
    assert after == before


def test_a_pattern_that_does_not_match_leaves_the_range_unexplained():
    """A rule for the right method but a pattern found nowhere explains nothing."""
    report = _analyze(reasons=(Reason(FILE, "Pool.write", "x", pattern=r"no_such_thing"),))
    assert all(gap.reason == UNEXPLAINED for gap in report.gaps)
    assert len(report.unexplained) == 3


def test_explain_requires_the_same_file_and_takes_the_first_match():
    """A reason for another file never applies; the first matching reason wins."""
    gap = Gap(FILE, "Pool.write", 9, 10, 2)
    assert explain(gap, "x", [Reason("other.py", "*", "elsewhere")]) == UNEXPLAINED
    assert explain(gap, "x", [Reason(FILE, "*", "first"), Reason(FILE, "*", "second")]) == ("first")


def test_analyze_refuses_a_scope_without_data():
    """A scoped file missing from the coverage data is an error naming the file."""
    with pytest.raises(ValueError, match=r"file='pkg/pool.py'"):
        analyze({}, {FILE: SOURCE}, [Scope(FILE)], [])


def test_report_text_and_json():
    """The text names each unexplained range and the headline; the JSON round-trips."""
    report = _analyze()
    text = format_report(report)
    assert "pkg/pool.py:15 Pool.helper (1 lines): UNEXPLAINED" in text
    assert text.splitlines()[-1].startswith("headline: 8/13 lines = 61.5%")
    data = json.loads(json.dumps(report.to_json()))
    assert data["headline_percent"] == 61.54
    assert data["unexplained"] == 1


def _fake_report(percent_covered: int, *, unexplained: bool, status: int = 0) -> ReachReport:
    gaps = (Gap(FILE, "Pool.write", 9, 9, 1, reason=UNEXPLAINED if unexplained else "r"),)
    return ReachReport(
        "sglang",
        (MethodReach(FILE, "Pool.write", 100, percent_covered),),
        gaps,
        (f"{FILE}:Pool",),
        100,
        percent_covered,
        pytest_status=status,
    )


@pytest.mark.parametrize(
    ("args", "report", "status"),
    [
        pytest.param(["--min-percent", "85"], _fake_report(90, unexplained=True), 0, id="ok"),
        pytest.param(["--min-percent", "85"], _fake_report(80, unexplained=False), 1, id="low"),
        pytest.param(["--strict"], _fake_report(90, unexplained=True), 1, id="strict"),
        pytest.param(["--strict"], _fake_report(90, unexplained=False), 0, id="strict-ok"),
        pytest.param([], _fake_report(90, unexplained=False, status=4), 2, id="no-run"),
    ],
)
def test_main_exit_status(monkeypatch, capsys, args, report, status):
    """Exit 1 below --min-percent or, with --strict, on an unexplained range; 2 if no run."""
    seen = {}

    def fake_measure(target, *, pytest_args, save_data, shards):
        seen.update(target=target, pytest_args=pytest_args)
        return report

    monkeypatch.setattr(reach, "measure", fake_measure)
    assert reach.main(["--target", "sglang", *args, "--", "-k", "mha"]) == status
    assert seen == {"target": "sglang", "pytest_args": ["-k", "mha"]}
    assert "headline:" in capsys.readouterr().out


def test_argument_validation():
    """Unknown targets, targets without a reach table and bad percentages are refused,
    naming the target or the argument."""
    with pytest.raises(ValueError, match=r"unknown target 'nope'"):
        reach._reach_table("nope")
    with pytest.raises(ValueError, match=r"target='kvcheck' declares no reach_table"):
        reach._reach_table("kvcheck")
    assert reach.main(["--min-percent", "101"]) == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--json", "no/such/dir/reach.json"], "--json='no/such/dir/reach.json'"),
        (["--markdown", "."], "--markdown='.' is a directory"),
        (["--from-data", "missing.coverage"], "--from-data='missing.coverage' does not exist"),
        (["--shards", "0"], "--shards=0 must be >= 1"),
    ],
)
def test_bad_paths_stop_the_run_before_it_measures(monkeypatch, capsys, tmp_path, args, named):
    """Unwritable report paths and a missing data file exit 2 before minutes of measuring."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reach, "measure", lambda *a, **k: pytest.fail("the suite ran"))
    assert reach.main(args) == 2
    assert named in capsys.readouterr().err


def test_a_failed_measurement_is_an_error_not_a_traceback(monkeypatch, capsys):
    """A ValueError from the measurement (a bad target table, say) exits 2 with its message."""

    def refuse(*args, **kwargs):
        raise ValueError("target='x' has no reach table")

    monkeypatch.setattr(reach, "measure", refuse)
    assert reach.main([]) == 2
    assert "target='x' has no reach table" in capsys.readouterr().err


def test_shards_split_the_collection_between_them(tmp_path):
    """``--reach-shard K/N`` (tools/reach_shard.py) keeps every N-th test from the K-th: the
    shards of a collection are disjoint and together are all of it; a malformed value is a
    usage error naming it."""
    (tmp_path / "test_five.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(5))\ndef test_i(i):\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}

    def collected(*args):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "reach_shard", "--collect-only", "-q",
             "-p", "no:cacheprovider", "-p", "no:randomly", *args, "test_five.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        return run, [line for line in run.stdout.splitlines() if "::" in line]

    _, every = collected()
    _, first = collected("--reach-shard=0/2")
    _, second = collected("--reach-shard=1/2")
    assert len(every) == 5 and len(first) == 3 and len(second) == 2
    assert sorted(first + second) == sorted(every)
    refused, _ = collected("--reach-shard=2/2")
    assert refused.returncode == 4 and "--reach-shard='2/2' needs 0 <= K < N" in refused.stderr


def test_suite_command_runs_the_shipped_suite_under_coverage():
    """The measured command is the shipped suite against the target (each shard runs it)."""
    command = reach.suite_command("sglang", pytest_args=["-x"], rcfile="rc")
    assert command[:7] == ["python", "-m", "coverage", "run", "--rcfile=rc", "-m", "pytest"]
    assert command[7:] == [
        "--pyargs",
        "kvcheck.suite",
        "--kvcheck-target=sglang",
        "-p",
        "no:cacheprovider",
        "-q",
        "-x",
    ]


def test_sglang_reach_table_is_well_formed():
    """Every sglang reason names a scoped file and a valid pattern (no sglang needed)."""
    from kvcheck.targets.sglang import reach as table

    files = {scope.file for scope in table.SCOPES}
    for entry in declaration_of(resolve_target("sglang", available=False)).unreached_code():
        assert entry.file in files, entry
        if entry.pattern is not None:
            re.compile(entry.pattern)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")
def test_sglang_reach_table_names_existing_methods():
    """Every sglang reason's method glob matches a method in sglang's source (read, not imported).

    A reason that matches nothing is stale: sglang renamed or removed the method.
    """
    import fnmatch

    from kvcheck.targets.sglang import reach as table

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    names: dict[str, set[str]] = {}
    for scope in table.SCOPES:
        spans = find_spans((root / scope.file).read_text())
        names[scope.file] = {s.qualname for s in spans} | {
            f"{s.qualname}.{reach.CLASS_BODY}" for s in spans if s.kind == "class"
        }
    reasons = declaration_of(resolve_target("sglang", available=False)).unreached_code()
    stale = [entry for entry in reasons if not fnmatch.filter(names[entry.file], entry.qualname)]
    assert stale == []


def test_a_pattern_on_a_later_line_of_the_range_does_not_explain_it():
    """Only the range's first line (and its block header) is matched, not its later lines."""
    report = _analyze(reasons=(Reason(FILE, "Pool.never", "x", pattern=r"return x"),))
    never = next(g for g in report.gaps if g.qualname == "Pool.never")
    assert never.reason == UNEXPLAINED
    report = _analyze(reasons=(Reason(FILE, "Pool.never", "x", pattern=r"x = 1"),))
    never = next(g for g in report.gaps if g.qualname == "Pool.never")
    assert never.reason == "x"


def test_main_from_data_reanalyzes_without_running(monkeypatch, capsys, tmp_path):
    """--from-data analyzes a saved data file with today's table; the suite does not run."""
    monkeypatch.chdir(tmp_path)
    Path("saved.coverage").write_text("")
    monkeypatch.setattr(reach, "measure", lambda *a, **k: pytest.fail("the suite ran"))
    monkeypatch.setattr(
        reach, "analyze_data", lambda target, path: _fake_report(90, unexplained=False)
    )
    assert reach.main(["--from-data", "saved.coverage", "--min-percent", "85"]) == 0
    assert "headline: 90/100" in capsys.readouterr().out


def test_analyze_data_refuses_a_missing_file(tmp_path):
    """A data file that does not exist is an error naming it."""
    with pytest.raises(ValueError, match=r"data_file="):
        reach.analyze_data("sglang", tmp_path / "none.coverage")


def test_markdown_block_lists_unexplained_ranges_and_reasons():
    """The published block has the headline, a class table and each unexplained range."""
    text = reach.format_markdown(_analyze())
    assert text.splitlines()[0].startswith(
        "**Headline: 61.5 %** (8 of 13 executable lines of Pool)"
    )
    assert "| `pkg/pool.py` | `Pool` | 13 | 8 | 61.5 |" in text
    assert "- `pkg/pool.py:15` `Pool.helper` (1): `return 1`" in text
    assert "| HND layout | 1 | 2 |" in text


def test_the_on_cpu_figure_leaves_out_only_lines_whose_reason_needs_other_hardware():
    """A file's "on CPU" share drops the lines an off-CPU reason explains, and nothing else:
    an unexplained range and a CPU-side reason still count against it."""
    report = dataclasses.replace(_analyze(), off_cpu_reasons=frozenset({"HND layout"}))
    item = report.by_file()["pkg/pool.py"]
    assert (item.lines, item.covered, item.off_cpu) == (13, 8, 2)
    assert item.cpu_percent == pytest.approx(100 * 8 / 11)
    assert "on CPU 8/11 = 72.7%" in format_report(report)
    assert "| `pkg/pool.py` | 13 | 8 | 61.5 | 2 | 72.7 |" in reach.format_markdown(report)
    assert dataclasses.replace(report, off_cpu_reasons=frozenset()).by_file()[
        "pkg/pool.py"
    ].cpu_percent == pytest.approx(100 * 8 / 13)


def test_sglang_off_cpu_reasons_are_reasons_of_its_table():
    """Every reason the sglang table calls off-CPU explains some range (none stale)."""
    from kvcheck.targets.sglang import reach as table

    reasons = declaration_of(resolve_target("sglang", available=False)).unreached_code()
    used = {entry.reason for entry in reasons}
    assert not table.OFF_CPU_REASONS - used


def test_the_map_counts_every_file_and_ranks_the_most_unreached():
    files = tuple(
        reach.FileReach(f"f{index}.py", 100, covered, 0)
        for index, covered in enumerate((100, 0, 50, 90, 10, 60, 70, 80, 20, 30, 40, 95))
    )
    report = dataclasses.replace(_analyze(), map_files=files, map_root="pkg")
    assert (report.map_lines, report.map_covered) == (1200, 645)
    assert round(report.map_percent, 2) == 53.75
    ranked = [item.file for item in report.most_unreached()]
    assert ranked == [
        "f1.py",
        "f4.py",
        "f8.py",
        "f9.py",
        "f10.py",
        "f2.py",
        "f5.py",
        "f6.py",
        "f7.py",
        "f3.py",
    ]
    block = reach.format_markdown(report)
    assert "**Map: 53.8 %** (645 of 1200 statements of `pkg` in 12 files)." in block
    assert block.index("`f1.py` | 100 | 0 | 100") < block.index("`f3.py` | 100 | 90 | 10")
    assert "`f0.py`" not in block and "`f11.py`" not in block
    assert "map: 645/1200 statements = 53.8% (12 files)" in format_report(report)
    with pytest.raises(ValueError, match="count=0"):
        report.most_unreached(0)


def test_class_reach_counts_the_statements_of_each_discovered_class(tmp_path):
    from kvcheck.targets.discovery import ClassEntry

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pool.py").write_text(SOURCE)
    entries = [
        ClassEntry("pkg.sub.pool:Pool", "KV pool", False, "new in 1"),
        ClassEntry("pkg.sub.pool:Missing", "KV pool", True, "gone"),
        ClassEntry("pkg.sub.other:Pool", "KV pool", True, "no data"),
        ClassEntry("pkg.sub.gpu", "module", False, "import failed"),
    ]
    measured = {"sub/pool.py": (set(STATEMENTS), set(MISSING))}
    reaches = reach.class_reaches(entries, "pkg", measured, tmp_path)
    # Pool spans lines 4-19: 13 statements, 5 of them missing (9, 10, 15, 18, 19).
    assert [(r.file, r.name, r.lines, r.covered, r.built) for r in reaches] == [
        ("sub/pool.py", "Pool", 13, 8, False)
    ]
    report = dataclasses.replace(
        _analyze(),
        map_files=(reach.FileReach("sub/pool.py", 16, 10, 0),),
        class_reach=tuple(reaches),
    )
    assert "| `Pool` (`sub/pool.py`) | KV pool | no | 13 | 8 | 61.5 |" in reach.format_markdown(
        report
    )
    assert "class sub/pool.py:Pool (KV pool, not built): 8/13 = 61.5%" in format_report(report)


def test_sglang_map_covers_mem_cache_without_the_storage_connectors():
    table = reach._reach_table("sglang")
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    files = reach._map_files(table)
    assert "srt/mem_cache/memory_pool.py" in files
    assert all(f.startswith("srt/mem_cache/") for f in files)
    assert not any(f.startswith("srt/mem_cache/storage/") for f in files)
