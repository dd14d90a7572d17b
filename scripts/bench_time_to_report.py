#!/usr/bin/env python
"""Time to report: how long the shipped suite takes to find, shrink and report each bug.

Every failing twin (each broken pool of ``tests/broken_pools.py`` served by
``BrokenTarget``, each broken serving rule of ``tests/broken_serving.py``) is run through
the shipped suite exactly as a user would run it::

    python -m pytest --pyargs kvcheck.suite -p no:cacheprovider -x \\
        --kvcheck-target twin_<bug>:target --kvcheck-profile kvcheck-ci \\
        --hypothesis-seed <seed> --kvcheck-results results.json

single process, in a fresh temporary directory with an empty ``KVCHECK_DB``, once per seed.
Python's bytecode caches are warm, as on any run after the first: the script collects the
suite once before timing and lets the runs write bytecode even where
``PYTHONDONTWRITEBYTECODE`` is set (without caches, pytest recompiles and assertion-rewrites
every kvcheck and Hypothesis module on each run: 13 s against 31 s to collect on a loaded
2-core machine). ``--cold`` keeps the environment's setting and skips the warm-up.
The twin's target lives in a small module generated into that directory. A tiny pytest
plugin (also generated there) notes when each test starts, when Hypothesis first sees a
failing example and when it finishes shrinking; the failing test, its phases and its
final example come from kvcheck's own results file (:mod:`kvcheck.runner.results`).

Per bug it prints, as median and max over the seeds:

- ``first``: seconds from launching pytest to the first failing example,
- ``shrunk``: seconds from launching pytest to the end of shrinking,
- ``total``: seconds from launching pytest until it stopped (what a user waits),
- ``in test``: the failing test's own time (find, shrink, explain, report),
- the size of the final example: steps, operations and layers (``-`` where the example
  has none of these).

A bug that the suite does not report within ``--timeout`` seconds, or that the suite
passes, is MISSED; the script then exits with status 1. Nothing is asserted on time.

Usage::

    python scripts/bench_time_to_report.py                      # every twin, 5 seeds
    python scripts/bench_time_to_report.py --bugs move-ignores-v,silent-noop --seeds 2
    python scripts/bench_time_to_report.py --target sglang --json out.json
    python scripts/bench_time_to_report.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS_DIR = REPO_ROOT / "tests"

#: The nine --prefill-only-disable-kv-cache rules, in order (kvcheck.serving's
#: PREFILL_ONLY_RULE_ORDER, spelled out so that listing twins needs no torch import).
RULES = (
    "is_embedding",
    "fp4_kv_cache_dtype",
    "mxfp8_kv_cache_dtype",
    "chunked_prefill_size",
    "disable_radix_cache",
    "attn_cp_size",
    "prefill_context_parallel",
    "hisparse",
    "fa_prefill_backend",
)
ADJACENT_SWAPS = (
    ("is_embedding", "fp4_kv_cache_dtype"),
    ("chunked_prefill_size", "disable_radix_cache"),
    ("attn_cp_size", "prefill_context_parallel"),
    ("hisparse", "fa_prefill_backend"),
)


@dataclass(frozen=True)
class Twin:
    """One deliberately broken target: ``setup`` is Python that binds ``target``."""

    name: str
    setup: str
    kind: str  # "pool" or "serving"


def _pool_twin(name: str, family: str, cls: str) -> Twin:
    setup = (
        f"from broken_pools import BrokenTarget, {cls}\ntarget = BrokenTarget({family!r}, {cls})"
    )
    return Twin(name, setup, "pool")


def _serving_twin(name: str, expression: str, names: str) -> Twin:
    return Twin(name, f"from broken_serving import {names}\ntarget = {expression}", "serving")


KVCHECK_TWINS: tuple[Twin, ...] = (
    _pool_twin("page-row-move-dsa", "dsa", "PageRowMoveDSA"),
    _pool_twin("move-ignores-v", "mha", "MoveIgnoresV"),
    _pool_twin("sequential-move-mla", "mla", "SequentialMoveMLA"),
    _pool_twin("host-copy-drops-index-k", "dsa", "HostCopyDropsIndexK"),
    _pool_twin("allocating-skip-dsa", "dsa", "AllocatingSkipDSA"),
    _pool_twin("skip-counting-dsa", "dsa", "SkipCountingDSA"),
    _pool_twin("decimal-gigabytes-mla", "mla", "DecimalGigabytesMLA"),
    _pool_twin("skip-describing-dsa", "dsa", "SkipDescribingDSA"),
    _pool_twin("silent-noop", "noop", "SilentNoOp"),
    _pool_twin("full-size-noop", "noop", "FullSizeNoOp"),
    _pool_twin("validating-move-noop", "noop", "ValidatingMoveNoOp"),
    _pool_twin("loc-sorting-mha", "mha", "LocSortingMHA"),
    _pool_twin("half-applying-mha", "mha", "HalfApplyingMHA"),
    _pool_twin("start-layer-blind-read-mha", "mha", "StartLayerBlindReadMHA"),
    _pool_twin("stale-view-mla", "mla", "StaleViewMLA"),
    _pool_twin("shifted-rows-read-dsa", "dsa", "ShiftedRowsReadDSA"),
    _pool_twin("end-layer-from-zero-mla", "mla", "EndLayerFromZeroMLA"),
    _pool_twin("page-granular-reload-mha", "mha", "PageGranularReloadMHA"),
    _pool_twin("rope-dropping-mla", "mla", "RopeDroppingMLA"),
    _pool_twin("uncommitted-writing-mha", "mha", "UncommittedWritingMHA"),
    _pool_twin("scale-dividing-mha", "mha", "ScaleDividingMHA"),
    _pool_twin("unpadded-report-mha", "mha", "UnpaddedReportMHA"),
    _pool_twin("token-major-move-mha", "mha", "TokenMajorMoveMHA"),
    _pool_twin("swapped-block-scales-dsa", "dsa", "SwappedBlockScalesDSA"),
    _pool_twin("raw-width-scaled-dsa", "dsa", "RawWidthScaledDSA"),
    _pool_twin("token-page-index-kpool-dsa", "dsa", "TokenPageIndexKpoolDSA"),
    _pool_twin("half-move-kpool-dsa", "dsa", "HalfMoveKpoolDSA"),
    _pool_twin("uncounted-tails-dsa", "dsa", "UncountedTailsDSA"),
    _pool_twin("whole-tail-item-dsa", "dsa", "WholeTailItemDSA"),
    _pool_twin("aliased-tail-copy-dsa", "dsa", "AliasedTailCopyDSA"),
    _pool_twin("ring-start-tail-dsa", "dsa", "RingStartTailDSA"),
    _pool_twin("owner-blind-dcp-mla", "mla", "OwnerBlindDcpMLA"),
    _pool_twin("unrefused-kv-write-dcp-mla", "mla", "UnrefusedKVWriteDcpMLA"),
    _pool_twin("uncollapsed-copy-dcp-dsa", "dsa", "UncollapsedCopyDcpDSA"),
    _pool_twin("narrow-index-dcp-dsa", "dsa", "NarrowIndexDcpDSA"),
    _pool_twin("owned-index-move-dcp-dsa", "dsa", "OwnedIndexMoveDcpDSA"),
    # Needs four draws at once: the default run misses it with some seeds (kvcheck campaign).
    _pool_twin("rare-combination-write-mha", "mha", "RareCombinationWriteMHA"),
    # Two bugs, one declared as a finding by the twin test: here both are undeclared.
    _pool_twin("silent-reload-moving-noop", "noop", "SilentReloadMovingNoOp"),
    _pool_twin("silent-reload-noop", "noop", "SilentReloadNoOp"),
    _pool_twin("override-blind-mha", "mha", "OverrideBlindMHA"),
    _pool_twin("page-table-blind-read-dsa", "dsa", "PageTableBlindReadDSA"),
    # Quantized pools: each is drawn by its variant's own machine run.
    _pool_twin("scale-leaving-move-fp4", "mha", "ScaleLeavingMoveFP4"),
    _pool_twin("scale-leaving-move-mla-fp4", "mla", "ScaleLeavingMoveMLAFP4"),
    _pool_twin("payload-only-reload-fp4", "mha", "PayloadOnlyReloadFP4"),
    _pool_twin("scale-uncounting-mla-fp4", "mla", "ScaleUncountingMLAFP4"),
    _pool_twin("scale-undescribing-fp4", "mha", "ScaleUndescribingFP4"),
    _pool_twin("swapped-interleave-mxfp8", "mha", "SwappedInterleaveMXFP8"),
    _pool_twin("v-shaped-by-k-fp4", "mha", "VShapedByKFP4"),
    _pool_twin("unscaled-cast-cpu-fp8", "mha", "UnscaledCastCPUFP8"),
    _pool_twin("payload-only-prefix-valid-fp4", "mha", "PayloadOnlyPrefixValidFP4"),
    _pool_twin("swapped-scale-read-fp4", "mha", "SwappedScaleReadFP4"),
    *(
        _serving_twin(f"forgets-{rule}", f"forgets_rule({rule!r})", "forgets_rule")
        for rule in RULES
    ),
    *(
        _serving_twin(f"swaps-{a}-{b}", f"swaps_rules({a!r}, {b!r})", "swaps_rules")
        for a, b in ADJACENT_SWAPS
    ),
    _serving_twin(
        "backend-rule-first", "swaps_rules('is_embedding', 'fa_prefill_backend')", "swaps_rules"
    ),
    _serving_twin(
        "message-only-swap",
        "MessageOnlyErrors(swaps_rules('chunked_prefill_size', 'disable_radix_cache'))",
        "MessageOnlyErrors, swaps_rules",
    ),
    _serving_twin("vague-errors", "VagueErrors()", "VagueErrors"),
    _serving_twin("off-by-one-skip-offset", "OffByOneSkipOffset()", "OffByOneSkipOffset"),
    _serving_twin(
        "cell-size-counts-skip-layers", "CellSizeCountsSkipLayers()", "CellSizeCountsSkipLayers"
    ),
    _serving_twin("forgets-padding-page", "ForgetsPaddingPage()", "ForgetsPaddingPage"),
    _serving_twin("two-pages-short", "TwoPagesShort()", "TwoPagesShort"),
    _serving_twin(
        "inverted-skip-mask-sizing", "InvertedSkipMaskSizing()", "InvertedSkipMaskSizing"
    ),
    _serving_twin("lets-mla-through", "LetsMLAThrough()", "LetsMLAThrough"),
    _serving_twin("draft-gets-noop-pool", "DraftGetsNoOpPool()", "DraftGetsNoOpPool"),
)

#: sglang's real pools with one bug patched into the instance the target builds: the bugs
#: of the kvcheck twins that sglang's pool classes can carry (moves). The patch replaces
#: ``move_kv_cache`` on the pool object only, so sglang itself is untouched.
_SGLANG_PRELUDE = textwrap.dedent(
    """\
    import torch
    from kvcheck.targets.sglang import SGLangTarget


    class _MoveBug(SGLangTarget):
        family = ""

        def make_pool(self, spec, *, device):
            pool = super().make_pool(spec, device=device)
            if spec.family == self.family:
                original = pool.move_kv_cache
                pool.move_kv_cache = lambda tgt, src: self.broken_move(pool, original, tgt, src)
            return pool
    """
)
SGLANG_TWINS: tuple[Twin, ...] = (
    Twin(
        "move-ignores-v",
        _SGLANG_PRELUDE
        + textwrap.dedent(
            """
            class MoveIgnoresV(_MoveBug):
                family = "mha"

                def broken_move(self, pool, original, tgt, src):
                    tgt, src = tgt.view(-1).long(), src.view(-1).long()
                    for k in pool.k_buffer:
                        k[tgt] = k[src]


            target = MoveIgnoresV()
            """
        ),
        "pool",
    ),
    Twin(
        "sequential-move-mla",
        _SGLANG_PRELUDE
        + textwrap.dedent(
            """
            class SequentialMoveMLA(_MoveBug):
                family = "mla"

                def broken_move(self, pool, original, tgt, src):
                    for t, s in zip(tgt.view(-1).tolist(), src.view(-1).tolist()):
                        for buffer in pool.kv_buffer:
                            buffer[t] = buffer[s]


            target = SequentialMoveMLA()
            """
        ),
        "pool",
    ),
    Twin(
        "page-row-move-dsa",
        _SGLANG_PRELUDE
        + textwrap.dedent(
            """
            class PageRowMoveDSA(_MoveBug):
                family = "dsa"

                def broken_move(self, pool, original, tgt, src):
                    # The seed's bug: latent rows move right, index-K page rows are
                    # indexed by token location.
                    original(tgt, src)
                    tgt, src = tgt.view(-1).long(), src.view(-1).long()
                    for i, index_k in enumerate(pool.index_k_with_scale_buffer):
                        if tgt.numel() and not pool.skip_topk_layers[i]:
                            index_k[tgt] = index_k[src]


            target = PageRowMoveDSA()
            """
        ),
        "pool",
    ),
)
TWINS = {"kvcheck": KVCHECK_TWINS, "sglang": SGLANG_TWINS}

#: Loaded into the pytest run with ``-p``: wall-clock marks per test, as JSON lines.
_CLOCK_PLUGIN = textwrap.dedent(
    '''\
    """Marks, per test, when it starts, when Hypothesis first holds a failing example,
    when shrinking ends and when the test ends (seconds since KVCHECK_BENCH_T0)."""
    import json
    import os
    import time

    import pytest

    _T0 = float(os.environ["KVCHECK_BENCH_T0"])
    _OUT = os.environ["KVCHECK_BENCH_CLOCK"]
    _CURRENT = {}


    def _mark(**entry):
        with open(_OUT, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\\n")


    def _patch_engine():
        from hypothesis.internal.conjecture import engine

        from hypothesis.internal.conjecture import shrinker

        runner = engine.ConjectureRunner
        if getattr(runner, "_kvcheck_bench", False):
            return
        test_function, run = runner.test_function, runner._run
        explain = shrinker.Shrinker.explain

        def timed_test_function(self, data):
            result = test_function(self, data)
            if self.interesting_test_cases and "first" not in _CURRENT:
                _CURRENT["first"] = time.time() - _T0
            return result

        def timed_explain(self):
            # The explain phase runs inside shrinking, after each shrink: not shrinking.
            started = time.time()
            try:
                return explain(self)
            finally:
                _CURRENT["explain"] = _CURRENT.get("explain", 0.0) + time.time() - started

        def timed_run(self):
            _CURRENT.pop("explain", None)
            try:
                return run(self)
            finally:
                if self.interesting_test_cases:
                    ended = time.time() - _T0
                    _CURRENT["shrunk"] = ended - _CURRENT.get("explain", 0.0)

        runner.test_function, runner._run = timed_test_function, timed_run
        shrinker.Shrinker.explain = timed_explain
        runner._kvcheck_bench = True


    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(item):
        _patch_engine()
        _CURRENT.clear()
        start = time.time() - _T0
        outcome = yield
        _mark(
            nodeid=item.nodeid,
            start=start,
            end=time.time() - _T0,
            failed=outcome.excinfo is not None,
            **_CURRENT,
        )
    '''
)


@dataclass
class Run:
    """One twin, one seed."""

    bug: str
    seed: int
    status: str  # "found" | "MISSED (timeout)" | "MISSED (passed)" | "error"
    failing_test: str | None = None
    first_s: float | None = None
    shrunk_s: float | None = None
    total_s: float = 0.0
    in_test_s: float | None = None
    steps: int | None = None
    ops: int | None = None
    layers: int | None = None
    phases: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def example_size(reproduction: str | None) -> tuple[int | None, int | None, int | None]:
    """(steps, operations, layers) of a falsifying example, ``None`` where it has none.

    Steps are the state machine's ``state.step(...)`` calls; operations are the drawn
    values labelled ``op`` / ``ops`` / ``call`` / ``bad call`` (a drawn sequence counts its
    operations); layers are the pool's ``layer_num`` or the model's ``num_hidden_layers``.

    Example:
        >>> example_size("state.step(data=data(...))\\nDraw 2 (op): Move(tgt=(0,), src=(1,))\\n"
        ...              "state.build_pool(spec=PoolSpec(family='mha', layer_num=1))")
        (1, 1, 1)
        >>> example_size(None)
        (None, None, None)
    """
    if not reproduction:
        return None, None, None
    steps = len(re.findall(r"^\s*state\.step\(", reproduction, flags=re.MULTILINE)) or None
    # A drawn value may span several lines: cut the example at each "Draw N (label):".
    chunks = re.split(r"^\s*Draw \d+ \(([^)]*)\): ", reproduction, flags=re.MULTILINE)
    ops = 0
    for label, value in zip(chunks[1::2], chunks[2::2], strict=True):
        if label in ("ops", "setup ops"):
            ops += len(re.findall(r"\b(?:WriteKV|WriteIndexK|Move|HostCopy|HostReload)\(", value))
        elif label in ("op", "call", "bad call", "move"):
            ops += 1
    layers = re.search(r"\b(?:layer_num|num_hidden_layers)=(\d+)", reproduction)
    return steps, ops if steps or ops else None, int(layers.group(1)) if layers else None


def _first_failure(results: dict[str, Any]) -> dict[str, Any] | None:
    for test in results.get("tests", []):
        if test.get("outcome") in ("failed", "error"):
            return test
    return None


def warm_bytecode_caches(args: argparse.Namespace) -> None:
    """Collect the suite once with bytecode writing on, so the timed runs start warm."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    command = [sys.executable, "-m", "pytest", "--pyargs", "kvcheck.suite", "--collect-only"]
    command += ["-q", "-p", "no:cacheprovider", "--kvcheck-device", args.device]
    subprocess.run(command, env=env, capture_output=True, check=False, timeout=args.timeout)


def run_twin(twin: Twin, seed: int, args: argparse.Namespace) -> Run:
    """Run the shipped suite once against ``twin`` with Hypothesis seed ``seed``."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-ttr-") as tmp_name:
        tmp = Path(tmp_name)
        module = "twin_" + re.sub(r"\W", "_", twin.name)
        (tmp / f"{module}.py").write_text(twin.setup + "\n", encoding="utf-8")
        (tmp / "kvcheck_bench_clock.py").write_text(_CLOCK_PLUGIN, encoding="utf-8")
        results_path, clock_path = tmp / "results.json", tmp / "clock.jsonl"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "kvcheck.suite",
            "-p",
            "no:cacheprovider",
            "-p",
            "kvcheck_bench_clock",
            "-x",
            "-q",
            "--kvcheck-target",
            f"{module}:target",
            "--kvcheck-profile",
            args.profile,
            "--kvcheck-device",
            args.device,
            f"--hypothesis-seed={seed}",
            "--kvcheck-results",
            str(results_path),
            *args.pytest_args,
        ]
        # The kvcheck under test is whichever the caller's environment imports (PYTHONPATH
        # or the installed one); only the twin's module and the broken classes are added.
        python_path = [str(tmp), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in python_path if p),
            "KVCHECK_DB": str(tmp / "examples"),
            "KVCHECK_BENCH_CLOCK": str(clock_path),
        }
        env.pop("KVCHECK_TARGET", None)
        env.pop("KVCHECK_PROFILE", None)
        if not args.cold:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        started = time.time()
        env["KVCHECK_BENCH_T0"] = repr(started)
        try:
            finished = subprocess.run(
                command,
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=args.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            marks = _load_marks(clock_path)
            failed = [nodeid.split("::")[-1] for nodeid, mark in marks.items() if mark["failed"]]
            last = list(marks)[-1].split("::")[-1] if marks else "none"
            return Run(
                twin.name,
                seed,
                "MISSED (timeout)",
                total_s=time.time() - started,
                note=f"{len(marks)} tests finished, the last {last}; failed: {failed or 'none'}",
            )
        total = time.time() - started
        results = _load_json(results_path)
        marks = _load_marks(clock_path)
        if finished.returncode == 0:
            return Run(twin.name, seed, "MISSED (passed)", total_s=total)
        failing = _first_failure(results) if results else None
        if failing is None:
            tail = (finished.stdout + finished.stderr).strip().splitlines()[-5:]
            return Run(twin.name, seed, "error", total_s=total, note=" | ".join(tail))
        mark = marks.get(failing["nodeid"], {})
        failures = failing.get("failures") or []
        reproduction = failures[0].get("reproduction") if failures else None
        steps, ops, layers = example_size(reproduction)
        return Run(
            twin.name,
            seed,
            "found",
            failing_test=failing["nodeid"],
            first_s=mark.get("first"),
            shrunk_s=mark.get("shrunk"),
            total_s=total,
            in_test_s=(mark["end"] - mark["start"]) if "end" in mark else None,
            steps=steps,
            ops=ops,
            layers=layers,
            phases=(failing.get("statistics") or {}).get("phases", {}),
        )


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _load_marks(path: Path) -> dict[str, dict[str, Any]]:
    marks: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            marks[entry["nodeid"]] = entry
    return marks


# --- the table ----------------------------------------------------------------------------


def _stat(values: Sequence[float | int | None], how: str, digits: int = 1) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    value = statistics.median(present) if how == "median" else max(present)
    return f"{value:.{digits}f}" if digits else f"{value:g}"


def summarize(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per bug: status, failing test and median/max figures over its seeds."""
    rows = []
    for bug in dict.fromkeys(run.bug for run in runs):
        mine = [run for run in runs if run.bug == bug]
        found = [run for run in mine if run.status == "found"]
        missed = [run for run in mine if run.status != "found"]
        row: dict[str, Any] = {
            "bug": bug,
            "seeds": len(mine),
            "found": len(found),
            "status": "found" if not missed else f"{missed[0].status} x{len(missed)}",
            "failing_test": found[0].failing_test if found else None,
        }
        for key in ("first_s", "shrunk_s", "total_s", "in_test_s"):
            values = [getattr(run, key) for run in found]
            row[key] = {"median": _stat(values, "median"), "max": _stat(values, "max")}
        for key in ("steps", "ops", "layers"):
            values = [getattr(run, key) for run in found]
            row[key] = {"median": _stat(values, "median", 0), "max": _stat(values, "max", 0)}
        rows.append(row)
    return rows


def print_table(rows: Sequence[dict[str, Any]], *, target: str, seeds: int) -> None:
    print(
        f"\ntime to report, target={target}, {seeds} seed(s) per bug; seconds since pytest "
        "was launched (median / max over seeds);\n'in test' is the failing test's own time; "
        "size = steps / ops / layers of the final example (median / max)"
    )
    header = (
        f"{'bug':<34} {'found':>5}  {'first':>11}  {'shrunk':>11}  {'total':>11}  "
        f"{'in test':>11}  {'steps':>5} {'ops':>5} {'layers':>6}  failing test"
    )
    print(header)
    print("-" * len(header))
    for row in rows:

        def pair(key: str, r: dict[str, Any] = row) -> str:
            return f"{r[key]['median']:>5}/{r[key]['max']:<5}"

        def size(key: str, r: dict[str, Any] = row) -> str:
            return f"{r[key]['median']}/{r[key]['max']}"

        found = f"{row['found']}/{row['seeds']}"
        test = (row["failing_test"] or row["status"]).split("/")[-1]
        print(
            f"{row['bug']:<34} {found:>5}  {pair('first_s')}  {pair('shrunk_s')}  "
            f"{pair('total_s')}  {pair('in_test_s')}  {size('steps'):>5} {size('ops'):>5} "
            f"{size('layers'):>6}  {test}"
        )
    missed = [row for row in rows if row["status"] != "found"]
    totals = [float(row["total_s"]["median"]) for row in rows if row["total_s"]["median"] != "-"]
    if totals:
        print(
            f"\nmedian of per-bug median totals: {statistics.median(totals):.1f} s; "
            f"worst max total: {max(float(r['total_s']['max']) for r in rows if r['found']):.1f} s"
        )
    if missed:
        print("\n" + "!" * 72)
        for row in missed:
            print(f"!! MISSED: {row['bug']}: {row['status']} ({row['found']}/{row['seeds']} found)")
        print("!" * 72)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(TWINS), default="kvcheck")
    parser.add_argument("--bugs", default="", help="comma-separated bug names (default: all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per bug (0, 1, 2, ...)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run: MISSED")
    parser.add_argument("--profile", default="kvcheck-ci")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as set and skip the warm-up collection",
    )
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    parser.add_argument(
        "pytest_args", nargs="*", help="after --: extra pytest arguments (e.g. -k machines)"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds={args.seeds} must be at least 1")
    twins = {twin.name: twin for twin in TWINS[args.target]}
    if args.list:
        for twin in twins.values():
            print(f"{twin.name:<34} {twin.kind}")
        return 0
    chosen = [name.strip() for name in args.bugs.split(",") if name.strip()] or list(twins)
    unknown = [name for name in chosen if name not in twins]
    if unknown:
        parser.error(f"--bugs: {unknown} not among {args.target} twins (see --list)")

    if not args.cold:
        warm_bytecode_caches(args)
    runs: list[Run] = []
    for name in chosen:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run = run_twin(twins[name], seed, args)
            runs.append(run)
            where = (run.failing_test or "").split("::")[-1]
            print(
                f"{name} seed={seed}: {run.status} total={run.total_s:.1f}s "
                f"first={run.first_s} shrunk={run.shrunk_s} {where} {run.note}",
                flush=True,
            )
    rows = summarize(runs)
    print_table(rows, target=args.target, seeds=args.seeds)
    if args.json is not None:
        payload = {
            "target": args.target,
            "profile": args.profile,
            "runs": [asdict(run) for run in runs],
            "rows": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    return 1 if any(row["status"] != "found" for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
