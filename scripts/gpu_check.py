#!/usr/bin/env python3
"""One-shot GPU check of kvcheck: every CUDA claim, in one invocation, with a report.

On a machine with one CUDA GPU (the device tool's H200; see scripts/fetch_gpu_wheels.sh
for the one ``run`` command line that carries sglang's wheels there)::

    python3 scripts/gpu_check.py --device cuda --out "$OUT"

On any machine, the dry run (CI runs it, so the script cannot rot)::

    python3 scripts/gpu_check.py --device cpu --out /tmp/gpu_check

Stages, each with its own time budget, recorded as passed / failed / skipped with a
reason (on ``--device cpu`` every stage that needs CUDA is skipped saying so, and the
rest run at a small size so the dry run takes well under 2 minutes):

1. ``memory-report``: the GLM-5.2-like pools of ``kvcheck memory-report`` at a 60 GiB
   budget, built on ``meta``: their shape bytes equal the configurator's formula;
2. ``memory-cuda``: the same pools built on the GPU hold exactly the predicted bytes
   (storage bytes exactly; ``torch.cuda.memory_allocated`` delta within the caching
   allocator's rounding), with and without skip layers; the no-op pool allocates exactly
   its placeholders; plus every ``gpu``-marked test (allocator deltas for skip layers and
   the no-op pool, pools on CUDA, the attention properties);
3. ``attention-flash``: flash-attn if importable, otherwise torch's flash SDPA backend,
   in fp16 and bf16, against kvcheck's torch reference: max and 99.9th-percentile error;
4. ``move-throughput``: ``MHATokenToKVPool.move_kv_cache`` on a >= 8 GiB pool in GB/s, as
   a ratio to a plain device-to-device copy of the same bytes in the same run;
5. ``xdist-two-workers``: ``pytest -n 2`` maps both workers onto the one GPU;
6. ``suite-kvcheck`` and 7. ``suite-sglang``: the shipped suite with
   ``--kvcheck-device cuda`` against the built-in target and against sglang 0.5.23.

It writes ``gpu_check.json`` and ``gpu_check.md`` under ``--out`` (default ``$OUT``, else
``./gpu_check_out``) and prints one verdict line. Exit status: 0 nothing failed (skips
are not failures), 1 a stage failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SUITE = "kvcheck/suite"
#: pytest's exit status when it collected no test (an empty or absent suite)
NO_TESTS_COLLECTED = 5
#: seconds a suite gets after SIGINT to write its report before it is killed
INTERRUPT_GRACE_S = 20
_GIB = 1 << 30
#: the caching allocator rounds a large request up to 2 MiB and may hand out a block up
#: to 1 MiB larger than asked for without splitting it (CUDACachingAllocator.cpp)
LARGE_BLOCK_SLACK = 2 << 20
STATUSES = ("passed", "failed", "skipped")


@dataclass
class CaseResult:
    """One test's outcome as read from kvcheck's results file."""

    suite: str
    nodeid: str
    outcome: str  # passed | failed | error | skipped | xfailed | xpassed
    time_s: float
    examples: int | None = None
    message: str | None = None


@dataclass
class SuiteResult:
    """One pytest run."""

    name: str
    command: list[str]
    status: str  # passed | failed | absent | timed_out | crashed
    exit_code: int | None
    duration_s: float
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[CaseResult] = field(default_factory=list)
    note: str | None = None


@dataclass
class StageResult:
    """One stage of the check: its status, why, its figures and how long it took."""

    name: str
    status: str  # passed | failed | skipped
    reason: str
    seconds: float = 0.0
    budget_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


class StageSkipped(Exception):
    """Raised by a stage that cannot run here; the message is the reason."""


# --- environment ------------------------------------------------------------------------


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip().splitlines()[0] if result.returncode == 0 else None


def describe_environment() -> dict[str, object]:
    """Python, torch, CUDA, driver, GPU and the packages the stages use.

    Example:
        >>> "python" in describe_environment()
        True
    """
    info: dict[str, object] = {
        "python": sys.version.split()[0],
        "hypothesis": _package_version("hypothesis"),
        "pytest": _package_version("pytest"),
        "pytest_xdist": _package_version("pytest-xdist"),
        "triton": _package_version("triton"),
        "sglang": _package_version("sglang"),
        "flash_attn": _package_version("flash-attn") or _package_version("flash_attn"),
        "driver": _driver_version(),
    }
    try:
        import torch
    except Exception as exc:
        info["torch"] = f"not importable: {exc}"
        return info
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
        info["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / _GIB)
    return info


# --- running pytest ---------------------------------------------------------------------


def _plugin_registered() -> bool:
    return any(
        ep.value.startswith("kvcheck.runner.plugin")
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def plugin_arguments(device: str) -> list[str]:
    """pytest arguments that run kvcheck's plugin on ``device``; the plugin is loaded
    explicitly when kvcheck is not installed (a bare checkout on a GPU machine).

    Example:
        >>> plugin_arguments("cpu")[-2:]
        ['--kvcheck-device', 'cpu']
    """
    load = [] if _plugin_registered() else ["-p", "kvcheck.runner.plugin"]
    return [*load, "--kvcheck-device", device]


def _pythonpath(*extra: Path) -> str:
    parts = [str(REPO_ROOT), *map(str, extra)]
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*parts, existing] if existing else parts)


def run_suite(
    name: str,
    pytest_args: list[str],
    *,
    timeout_s: float,
    plugin_args: list[str],
    env: dict[str, str] | None = None,
    extra_path: tuple[Path, ...] = (),
) -> SuiteResult:
    """Run pytest with ``pytest_args`` in a subprocess and read kvcheck's results file."""
    from kvcheck.runner.results import load_results

    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "results.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            *pytest_args,
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            f"--kvcheck-results={results}",
            *plugin_args,
        ]
        full_env = {
            **os.environ,
            # a fresh example database per run: a stored failure from another run must
            # not decide this one
            "KVCHECK_DB": str(Path(scratch) / "db"),
            **(env or {}),
            "PYTHONPATH": _pythonpath(*extra_path),
            "PYTHONUNBUFFERED": "1",
        }
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=full_env)
        timed_out = False
        try:
            exit_code: int | None = process.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGINT lets pytest stop cleanly and still write the results file.
            process.send_signal(signal.SIGINT)
            try:
                exit_code = process.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                exit_code = process.wait()
        duration = time.monotonic() - started
        try:
            tests = cases_from_results(load_results(results), suite=name)
        except ValueError:  # pytest stopped before the plugin wrote the file
            tests = []
    counts = {
        o: sum(t.outcome == o for t in tests) for o in ("passed", "failed", "error", "skipped")
    }
    if timed_out:
        status = "timed_out"
    elif exit_code == NO_TESTS_COLLECTED:
        status = "absent"
    elif exit_code == 0:
        status = "passed"
    elif counts["failed"] or counts["error"]:
        status = "failed"
    else:
        status = "crashed"
    display = [Path(command[0]).name, *command[1:]]
    display = [
        "--kvcheck-results=<tmp>" if a.startswith("--kvcheck-results=") else a for a in display
    ]
    return SuiteResult(name, display, status, exit_code, round(duration, 1), counts, tests)


def cases_from_results(payload: dict, *, suite: str) -> list[CaseResult]:
    """Each test of a kvcheck results file (``--kvcheck-results``), with its example count.

    Example:
        >>> cases_from_results({"tests": [{"nodeid": "t.py::x", "outcome": "passed",
        ...     "duration_s": 0.5, "statistics": {"examples": 40}}]}, suite="s")[0].examples
        40
    """
    return [
        CaseResult(
            suite=suite,
            nodeid=test["nodeid"],
            outcome=test["outcome"],
            time_s=round(float(test.get("duration_s", 0.0)), 2),
            examples=(test.get("statistics") or {}).get("examples"),
            message=(test.get("message") or test.get("skip_reason") or "")[:300] or None,
        )
        for test in payload.get("tests", [])
    ]


def suite_figures(suite: SuiteResult) -> dict[str, Any]:
    """The counts, exit status and slowest properties of a pytest run, for the report.

    Example:
        >>> suite_figures(SuiteResult("s", [], "passed", 0, 1.0, {"passed": 2}))["counts"]
        {'passed': 2}
    """
    slowest = sorted(suite.tests, key=lambda t: t.time_s, reverse=True)[:5]
    return {
        "counts": suite.counts,
        "exit_code": suite.exit_code,
        "pytest_seconds": suite.duration_s,
        "command": " ".join(suite.command),
        "slowest": [f"{t.nodeid} ({t.time_s} s, {t.examples} examples)" for t in slowest],
    }


def check_suite(suite: SuiteResult) -> StageResult:
    """A stage result from a pytest run: failed unless pytest passed; exit 5 (nothing
    collected) and a timeout are failures too, never a silent pass.

    Example:
        >>> check_suite(SuiteResult("s", [], "absent", 5, 0.1)).status
        'failed'
    """
    figures = suite_figures(suite)
    failures = [
        f"{t.outcome} {t.nodeid}: {(t.message or '').splitlines()[0] if t.message else ''}"
        for t in suite.tests
        if t.outcome in ("failed", "error", "xpassed")
    ]
    counts = ", ".join(f"{n} {o}" for o, n in suite.counts.items() if n) or "no tests"
    if suite.status == "passed":
        return StageResult(suite.name, "passed", counts, figures=figures)
    reason = {
        "absent": "pytest collected no test (exit 5)",
        "timed_out": f"timed out after {suite.duration_s} s ({counts} so far)",
        "crashed": f"pytest exited {suite.exit_code} without a failed test ({counts})",
        "failed": counts,
    }[suite.status]
    return StageResult(suite.name, "failed", reason, figures=figures, failures=failures)


# --- stages -----------------------------------------------------------------------------


@dataclass
class Context:
    """What every stage may read: the device, whether this is the dry run, the budget."""

    device: str
    dry_run: bool
    deadline: float  # time.monotonic() by which everything must end
    plugin_args: list[str]
    workers: int

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def _needs_cuda(ctx: Context) -> None:
    if ctx.dry_run:
        raise StageSkipped(f"needs CUDA (--device {ctx.device})")


def _torch_device(ctx: Context) -> Any:
    import torch

    return torch.device("cpu" if ctx.dry_run else "cuda:0")


def stage_memory_report(ctx: Context, budget_s: float) -> StageResult:
    """GLM-5.2-like pools at 60 GiB, built on ``meta``: shape bytes equal the formula."""
    from kvcheck.runner.memory_report import memory_rows

    rows = memory_rows(["GLM-5.2-like"], budget_bytes=60 * _GIB, dtype="bfloat16", page_size=64)
    figures = {
        row.variant: {
            "tokens": row.tokens,
            "cell_bytes": row.cell_bytes,
            "formula_bytes": row.formula_bytes,
            "meta_built_bytes": row.built_bytes,
        }
        for row in rows
    }
    bad = [r.variant for r in rows if r.built_bytes != r.formula_bytes]
    result = StageResult("memory-report", "passed", "meta bytes == formula", figures=figures)
    if bad:
        result.status, result.reason = "failed", f"meta bytes != formula for {bad}"
    return result


def _glm_pool_builder(every_layer: bool, tokens: int, device: str) -> Callable[[], Any]:
    from kvcheck.serving import ServerArgs, select_kv_pool
    from kvcheck.vocabulary import MODELS

    def build() -> Any:
        return select_kv_pool(
            ServerArgs.unchecked(enable_hisparse=every_layer),
            MODELS["GLM-5.2-like"],
            max_total_num_tokens=tokens,
            page_size=64,
            dtype="bfloat16",
            device=device,
        )

    return build


def stage_memory_cuda(ctx: Context, budget_s: float) -> StageResult:
    """Real-budget DSA pools and the no-op pool on the GPU hold exactly the predicted bytes;
    then every gpu-marked test (allocator deltas, pools on CUDA, attention on CUDA)."""
    _needs_cuda(ctx)
    import gc

    import torch

    from kvcheck.geometry import KV_BUFFER_ATTRIBUTES
    from kvcheck.memory import (
        cuda_allocator_config_problem,
        expected_cuda_allocation_bytes,
        measure_cuda_allocation,
        storage_bytes,
    )
    from kvcheck.runner.memory_report import memory_rows
    from kvcheck.specs import PoolSpec
    from kvcheck.targets import resolve_target

    started = time.monotonic()
    figures: dict[str, Any] = {}
    failures: list[str] = []
    problem = cuda_allocator_config_problem()
    if problem is not None:
        raise StageSkipped(problem)
    rows = memory_rows(["GLM-5.2-like"], budget_bytes=60 * _GIB, dtype="bfloat16", page_size=64)
    deltas: dict[str, int] = {}
    for row in rows:
        every_layer = row.variant == "every layer allocated"
        build = _glm_pool_builder(every_layer, row.tokens, "cuda:0")
        pool, delta = measure_cuda_allocation(build, device="cuda:0")
        held = storage_bytes(pool)
        tensors = sum(len(getattr(pool, name, None) or ()) for name in KV_BUFFER_ATTRIBUTES)
        slack = delta - int(row.built_bytes or 0)
        deltas[row.variant] = delta
        figures[f"GLM-5.2-like, {row.variant}"] = {
            "predicted_bytes": row.built_bytes,
            "storage_bytes": held,
            "allocator_delta_bytes": delta,
            "allocator_minus_predicted": slack,
            "kv_tensors": tensors,
        }
        if held != row.built_bytes:
            failures.append(f"{row.variant}: storage {held} B != predicted {row.built_bytes} B")
        if not 0 <= slack < tensors * LARGE_BLOCK_SLACK:
            failures.append(
                f"{row.variant}: allocator delta {delta} B is {slack} B from predicted "
                f"{row.built_bytes} B (allowed 0 to {tensors} x 2 MiB of block rounding)"
            )
        del pool
        gc.collect()
        torch.cuda.empty_cache()
    by_variant = {row.variant: row for row in rows}
    predicted_saving = int(by_variant["every layer allocated"].built_bytes or 0) - int(
        by_variant["skip layers honoured"].built_bytes or 0
    )
    figures["skip-layer saving"] = {
        "predicted_bytes": predicted_saving,
        "allocator_bytes": deltas["every layer allocated"] - deltas["skip layers honoured"],
    }
    # The no-op pool at a real size: only its page_size-row placeholders, to the byte.
    target = resolve_target("kvcheck")
    noop = PoolSpec(
        family="noop", size=1 << 20, page_size=64, layer_num=36, dtype="bfloat16",
        head_num=8, head_dim=128,
    )  # fmt: skip
    _, noop_delta = measure_cuda_allocation(
        lambda: target.make_pool(noop, device="cuda:0"), device="cuda:0"
    )
    figures["no-op pool, 1M tokens, 36 layers"] = {
        "allocator_delta_bytes": noop_delta,
        "expected_bytes": expected_cuda_allocation_bytes(noop),
    }
    if noop_delta != expected_cuda_allocation_bytes(noop):
        failures.append(
            f"no-op pool: allocator delta {noop_delta} B != placeholders "
            f"{expected_cuda_allocation_bytes(noop)} B"
        )
    gc.collect()
    torch.cuda.empty_cache()
    # The gpu-marked tests: allocator deltas for skip layers and the no-op pool, the
    # pools on CUDA against the CPU, and the attention properties on CUDA.
    left = budget_s - (time.monotonic() - started)
    suite = run_suite(
        "memory-cuda",
        [SHIPPED_SUITE, "tests", "-m", "gpu"],
        timeout_s=min(left, ctx.remaining()),
        plugin_args=ctx.plugin_args,
    )
    checked = check_suite(suite)
    figures["gpu-marked tests"] = checked.figures
    failures += checked.failures if checked.failures else []
    if checked.status == "failed" and not checked.failures:
        failures.append(f"gpu-marked tests: {checked.reason}")
    status = "failed" if failures else "passed"
    reason = "; ".join(failures[:3]) if failures else f"pools exact; gpu-marked: {checked.reason}"
    return StageResult("memory-cuda", status, reason, figures=figures, failures=failures)


def _flash_kernel(device: Any) -> tuple[str, Callable[..., Any]]:
    """flash-attn's varlen kernel if importable, else torch SDPA's flash backend per
    sequence (on the CPU dry run, SDPA's math backend stands in)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kvcheck.attention import flash_attn_available, flash_varlen_attention

    if device.type == "cuda" and flash_attn_available():
        return "flash-attn flash_attn_varlen_func", flash_varlen_attention
    backend = SDPBackend.FLASH_ATTENTION if device.type == "cuda" else SDPBackend.MATH
    name = f"torch SDPA {backend.name}" + (
        " (CPU dry run, not flash)" if device.type != "cuda" else ""
    )

    def sdpa(q: Any, k: Any, v: Any, cu: Any, max_seqlen: int, *, causal: bool, **_: Any) -> Any:
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        bounds = cu.tolist()
        group = q.shape[1] // k.shape[1]
        for start, end in itertools.pairwise(bounds):
            if end == start:
                continue
            # [L, H, d] -> [1, H, L, d]; GQA by repeating K/V heads (same values)
            qs = q[start:end].transpose(0, 1)[None]
            ks = k[start:end].repeat_interleave(group, dim=1).transpose(0, 1)[None]
            vs = v[start:end].repeat_interleave(group, dim=1).transpose(0, 1)[None]
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            out[start:end] = o[0].transpose(0, 1)
        return out

    return name, sdpa


def stage_attention_flash(ctx: Context, budget_s: float) -> StageResult:
    """A flash kernel against kvcheck's torch reference in fp16 and bf16: max and 99.9th
    percentile absolute error, and whether every element is within the tolerance table."""
    import torch

    from kvcheck.attention import VarlenBatch, reference_varlen_attention, tolerance

    device = _torch_device(ctx)
    name, kernel = _flash_kernel(device)

    def lens(*tokens: int) -> tuple[int, ...]:
        # on the device: sequences past flash's 64/128-token blocks, up to 1024 tokens;
        # on the CPU dry run: a quarter of the base lengths, so the reference stays quick
        return tuple(max(1, n // 4) if ctx.dry_run else n * 8 for n in tokens)

    batches = [
        VarlenBatch(seq_lens=lens(7, 33, 1, 64), num_heads=8, num_kv_heads=8, head_dim=64,
                    seed=1),
        VarlenBatch(seq_lens=lens(128, 5, 97), num_heads=16, num_kv_heads=2, head_dim=128,
                    seed=2),
        VarlenBatch(seq_lens=lens(50, 50), num_heads=4, num_kv_heads=4, head_dim=128,
                    causal=False, seed=3),
    ]  # fmt: skip
    figures: dict[str, Any] = {"kernel": name}
    failures: list[str] = []
    for dtype in (torch.float16, torch.bfloat16):
        errors = []
        within = True
        tol = tolerance("flash_vs_torch", dtype=dtype, device=device)
        for batch in batches:
            q, k, v = batch.make_qkv(dtype=dtype, device=device)
            cu = batch.cu_seqlens_tensor(device=device)
            expected = reference_varlen_attention(
                q, k, v, cu, batch.max_seqlen, causal=batch.causal
            )
            actual = kernel(q, k, v, cu, batch.max_seqlen, causal=batch.causal)
            diff = (actual.float() - expected.float()).abs().flatten()
            errors.append(diff)
            allowed = tol.atol + tol.rtol * expected.float().abs().flatten()
            within = within and bool((diff <= allowed).all())
        every = torch.cat(errors)
        dtype_name = str(dtype).removeprefix("torch.")
        figures[dtype_name] = {
            "max_abs_error": float(every.max()),
            "p99_9_abs_error": float(torch.quantile(every[: 1 << 24].cpu(), 0.999)),
            "elements": int(every.numel()),
            "tolerance": {"rtol": tol.rtol, "atol": tol.atol},
            "within_tolerance": within,
        }
        if not within:
            failures.append(f"{dtype_name}: outside rtol={tol.rtol}, atol={tol.atol}")
    status = "failed" if failures else "passed"
    reason = "; ".join(failures) if failures else f"{name} within the flash tolerances"
    return StageResult("attention-flash", status, reason, figures=figures, failures=failures)


def _time_it(fn: Callable[[], Any], device: Any, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after one warm-up."""
    import torch

    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def stage_move_throughput(ctx: Context, budget_s: float) -> StageResult:
    """``move_kv_cache`` of half a >= 8 GiB MHA pool, against a device-to-device copy of
    the same bytes (each: bytes copied / median time; read+write traffic is twice that)."""
    import torch

    from kvcheck.pools import MHATokenToKVPool

    device = _torch_device(ctx)
    layers, heads, head_dim = 32, 8, 128
    row_bytes = 2 * heads * head_dim * 2  # K and V rows of one token in one layer, bf16
    tokens = (8 * _GIB if not ctx.dry_run else 8 << 20) // (layers * row_bytes)
    pool = MHATokenToKVPool(
        size=tokens, page_size=64, dtype=torch.bfloat16, head_num=heads,
        head_dim=head_dim, layer_num=layers, device=device,
    )  # fmt: skip
    pool_bytes = sum(t.numel() * t.element_size() for t in pool.k_buffer + pool.v_buffer)
    half = tokens // 2
    # Slots 1..half move to half+1..2*half: distinct targets, sources in another order.
    generator = torch.Generator().manual_seed(0)
    src = (torch.randperm(half, generator=generator) + 1).to(device)
    tgt = torch.arange(half + 1, 2 * half + 1).to(device)
    moved_bytes = half * layers * row_bytes
    repeats = 5 if not ctx.dry_run else 2
    move_s = _time_it(lambda move=pool.move_kv_cache: move(tgt, src), device, repeats)
    del pool  # free the pool before the copy's buffers are allocated
    if device.type == "cuda":
        torch.cuda.empty_cache()
    source = torch.empty(moved_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy_s = _time_it(lambda: target.copy_(source), device, repeats)
    move_gbs = moved_bytes / move_s / 1e9
    copy_gbs = moved_bytes / copy_s / 1e9
    figures = {
        "pool_bytes": pool_bytes,
        "pool_gib": round(pool_bytes / _GIB, 2),
        "moved_tokens": half,
        "moved_bytes": moved_bytes,
        "move_seconds": round(move_s, 6),
        "move_gb_per_s": round(move_gbs, 1),
        "copy_seconds": round(copy_s, 6),
        "copy_gb_per_s": round(copy_gbs, 1),
        "move_to_copy_ratio": round(move_gbs / copy_gbs, 3),
    }
    reason = (
        f"move {move_gbs:.1f} GB/s = {move_gbs / copy_gbs:.2f} x a plain copy "
        f"({copy_gbs:.1f} GB/s) on a {pool_bytes / _GIB:.2f} GiB pool"
    )
    if ctx.dry_run:
        reason += " (CPU dry run, small pool)"
    return StageResult("move-throughput", "passed", reason, figures=figures)


#: A test file run under ``pytest -n 2``: each test records where its worker ran.
XDIST_PROBE = """
import json, os, pathlib
import pytest
import torch

@pytest.mark.parametrize("case", range(4))
def test_worker_places_a_tensor(case, kvcheck_device):
    tensor = torch.ones(1024, device=kvcheck_device) * case
    assert float(tensor.sum()) == 1024 * case
    record = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "kvcheck_device": kvcheck_device,
        "tensor_device": str(tensor.device),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu": torch.cuda.get_device_name(tensor.device) if tensor.is_cuda else None,
    }
    out = pathlib.Path(os.environ["KVCHECK_GPU_CHECK_PROBE"]) / f"{record['worker']}-{case}.json"
    out.write_text(json.dumps(record))
"""


def stage_xdist_two_workers(ctx: Context, budget_s: float) -> StageResult:
    """``pytest -n 2`` with kvcheck's plugin: both workers run on the one device."""
    if importlib.util.find_spec("xdist") is None:
        raise StageSkipped("pytest-xdist is not installed")
    with tempfile.TemporaryDirectory() as scratch:
        probe_dir = Path(scratch) / "records"
        probe_dir.mkdir()
        test_file = Path(scratch) / "test_gpu_check_xdist_probe.py"
        test_file.write_text(textwrap.dedent(XDIST_PROBE))
        suite = run_suite(
            "xdist-two-workers",
            [
                str(test_file),
                "-n",
                "2",
                f"--rootdir={scratch}",
                "-c",
                str(REPO_ROOT / "pyproject.toml"),
            ],
            timeout_s=min(budget_s, ctx.remaining()),
            plugin_args=ctx.plugin_args,
            env={"KVCHECK_GPU_CHECK_PROBE": str(probe_dir)},
        )
        records = [json.loads(p.read_text()) for p in sorted(probe_dir.glob("*.json"))]
    result = check_suite(suite)
    workers = sorted({str(r["worker"]) for r in records})
    devices = sorted({str(r["tensor_device"]) for r in records})
    result.figures.update({"workers": workers, "devices": devices, "records": records})
    if result.status != "passed":
        return result
    want = "cpu" if ctx.dry_run else "cuda:0"
    if len(workers) != 2 or devices != [want]:
        result.status = "failed"
        result.reason = f"expected 2 workers on {want}, got workers {workers} on {devices}"
    else:
        result.reason = f"2 workers {workers} both on {want}"
    return result


def _sgl_kernel_stand_in(directory: Path) -> Path:
    """Write an import stand-in for ``sgl_kernel`` (sglang's CUDA kernel wheel, far over
    the device tool's carry limit) whose every attribute raises when called, so sglang's
    modules import on CUDA and any path that really needs a kernel fails loudly."""
    package = directory / "sgl_kernel"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """Stand-in written by kvcheck's scripts/gpu_check.py: every call raises."""
            import importlib.abc, importlib.machinery, sys, types

            class StandInCalled(RuntimeError):
                pass

            def _stand_in(qualname):
                def called(*args, **kwargs):
                    raise StandInCalled(
                        f"sgl_kernel stand-in: {qualname} was called; sglang-kernel is not "
                        "installed on this machine"
                    )
                called.__name__ = qualname.rsplit(".", 1)[-1]
                called.__qualname__ = qualname
                return called

            def _module_getattr(module_name):
                def __getattr__(name):
                    if name.startswith("__"):
                        raise AttributeError(name)
                    return _stand_in(f"{module_name}.{name}")
                return __getattr__

            class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
                def find_spec(self, fullname, path=None, target=None):
                    if fullname.startswith("sgl_kernel."):
                        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
                    return None
                def create_module(self, spec):
                    module = types.ModuleType(spec.name)
                    module.__path__ = []
                    module.__getattr__ = _module_getattr(spec.name)
                    return module
                def exec_module(self, module):
                    pass

            sys.meta_path.insert(0, _Finder())
            __getattr__ = _module_getattr("sgl_kernel")
            '''
        )
    )
    return directory


def _suite_args(ctx: Context, subset: list[str]) -> list[str]:
    if ctx.dry_run:
        return subset
    return ["--pyargs", "kvcheck.suite", "-n", str(ctx.workers), "--kvcheck-profile", "kvcheck-ci"]


#: The suite's subset on the CPU dry run: quick, and it exercises the target end to end.
DRY_RUN_SUBSET = [
    f"{SHIPPED_SUITE}/test_serving_skip_rule.py",
    "-k",
    "matches_reference or named_models or small_configs",
]


def stage_suite_kvcheck(ctx: Context, budget_s: float) -> StageResult:
    """The shipped suite on the device against the built-in target."""
    suite = run_suite(
        "suite-kvcheck",
        [*_suite_args(ctx, DRY_RUN_SUBSET), "--kvcheck-target", "kvcheck"],
        timeout_s=min(budget_s, ctx.remaining()),
        plugin_args=ctx.plugin_args,
    )
    return check_suite(suite)


def stage_suite_sglang(ctx: Context, budget_s: float) -> StageResult:
    """The shipped suite on the device against sglang 0.5.23 (its Triton kernels on CUDA)."""
    version = _package_version("sglang")
    if version is None:
        raise StageSkipped(
            "sglang is not installed (on the device: bash scripts/fetch_gpu_wheels.sh here, "
            "then carry .whl; on a CPU machine: bash scripts/install_sglang.sh)"
        )
    note = ""
    extra: tuple[Path, ...] = ()
    with contextlib.ExitStack() as stack:
        if not ctx.dry_run and importlib.util.find_spec("sgl_kernel") is None:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            extra = (_sgl_kernel_stand_in(scratch),)
            note = "sgl_kernel not installed: an import stand-in that raises on every call"
        suite = run_suite(
            "suite-sglang",
            [*_suite_args(ctx, DRY_RUN_SUBSET), "--kvcheck-target", "sglang"],
            timeout_s=min(budget_s, ctx.remaining()),
            plugin_args=ctx.plugin_args,
            extra_path=extra,
        )
    result = check_suite(suite)
    result.figures["sglang"] = version
    if note:
        result.figures["note"] = note
        result.reason += f" ({note})"
    return result


#: (name, function, seconds on the device); cheap stages first so a slow suite cannot
#: starve them. The budgets sum to 450 s, inside the 8 minutes the device run may take.
STAGES: list[tuple[str, Callable[[Context, float], StageResult], float]] = [
    ("memory-report", stage_memory_report, 15),
    ("memory-cuda", stage_memory_cuda, 60),
    ("attention-flash", stage_attention_flash, 25),
    ("move-throughput", stage_move_throughput, 25),
    ("xdist-two-workers", stage_xdist_two_workers, 45),
    ("suite-kvcheck", stage_suite_kvcheck, 130),
    ("suite-sglang", stage_suite_sglang, 150),
]


def run_stage(
    name: str, function: Callable[[Context, float], StageResult], budget_s: float, ctx: Context
) -> StageResult:
    """Run one stage; an exception becomes a failure (or a skip) with its reason."""
    started = time.monotonic()
    budget = max(min(budget_s, ctx.remaining()), 0.0)
    if budget <= 1:
        result = StageResult(name, "skipped", "no time left in the overall budget")
    else:
        print(f"--- {name} (budget {budget:.0f} s)", flush=True)
        try:
            result = function(ctx, budget)
        except StageSkipped as exc:
            result = StageResult(name, "skipped", str(exc))
        except Exception as exc:
            result = StageResult(
                name, "failed", f"{type(exc).__name__}: {exc}"[:500], failures=[repr(exc)[:2000]]
            )
    result.seconds = round(time.monotonic() - started, 1)
    result.budget_s = round(budget, 1)
    if result.status == "passed" and result.seconds > budget + INTERRUPT_GRACE_S:
        result.status = "failed"
        result.reason = f"took {result.seconds} s, over its {budget:.0f} s budget: {result.reason}"
    print(f"    {name}: {result.status} in {result.seconds} s: {result.reason}", flush=True)
    return result


# --- reporting --------------------------------------------------------------------------


def verdict_line(stages: list[StageResult], seconds: float, device: str) -> str:
    """The one line that says how the check went.

    Example:
        >>> verdict_line([StageResult("a", "passed", ""), StageResult("b", "skipped", "x")],
        ...              12.3, "cpu")
        'gpu_check verdict: OK on cpu in 12 s: 1 passed, 0 failed, 1 skipped'
    """
    counts = {s: sum(stage.status == s for stage in stages) for s in STATUSES}
    failed = [stage.name for stage in stages if stage.status == "failed"]
    head = "OK" if not failed else f"FAILED ({', '.join(failed)})"
    tally = ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    return f"gpu_check verdict: {head} on {device} in {seconds:.0f} s: {tally}"


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: environment, the stage table, then figures and failures.

    Example:
        >>> text = render_markdown({"verdict": "v", "environment": {"torch": "2"},
        ...     "stages": [asdict(StageResult("a", "passed", "ok"))], "args": {}})
        >>> "| a | passed |" in text
        True
    """
    lines = ["# kvcheck GPU check", "", report["verdict"], "", "## Environment", ""]
    lines += [f"- {key}: {value}" for key, value in report["environment"].items()]
    lines += ["", "## Stages", "", "| stage | status | seconds | budget | reason |"]
    lines += ["|---|---|---|---|---|"]
    for stage in report["stages"]:
        reason = str(stage["reason"]).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {stage['name']} | {stage['status']} | {stage['seconds']} | "
            f"{stage['budget_s']} | {reason} |"
        )
    for stage in report["stages"]:
        if not stage["figures"] and not stage["failures"]:
            continue
        lines += ["", f"### {stage['name']}", ""]
        if stage["figures"]:
            lines += ["```json", json.dumps(stage["figures"], indent=2, default=str), "```"]
        if stage["failures"]:
            lines += ["", "Failures:", ""]
            lines += [f"- {failure.splitlines()[0][:400]}" for failure in stage["failures"][:30]]
    return "\n".join(lines) + "\n"


def _default_out() -> Path:
    return Path(os.environ.get("OUT") or "gpu_check_out")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cuda: the device run; cpu: the dry run, every stage that needs no CUDA",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default $OUT, else ./gpu_check_out)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=450.0,
        help="seconds for all stages together (default 450; each stage has its own share)",
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="xdist workers for the suites on the device"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="run only this stage (repeatable): a rerun of what failed fits the device budget",
    )
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget={args.budget} must be > 0")
    if args.workers < 1:
        parser.error(f"--workers={args.workers} must be >= 1")
    names = [name for name, _, _ in STAGES]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"--only={unknown[0]} is not a stage; stages: {', '.join(names)}")
    out: Path = args.out or _default_out()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out={out}: {exc}")

    started = time.monotonic()
    environment = describe_environment()
    dry_run = args.device == "cpu"
    if not dry_run and not environment.get("cuda_available"):
        print(
            "gpu_check: --device cuda but torch sees no CUDA device; "
            "use --device cpu for the dry run",
            file=sys.stderr,
        )
        return 2
    ctx = Context(
        device=args.device,
        dry_run=dry_run,
        deadline=started + args.budget,
        plugin_args=plugin_arguments(args.device),
        workers=args.workers,
    )
    # The dry run's budgets are the device's: its subsets finish far inside them.
    stages = [
        run_stage(name, function, budget * args.budget / 450.0, ctx)
        for name, function, budget in STAGES
        if args.only is None or name in args.only
    ]
    seconds = time.monotonic() - started
    verdict = verdict_line(stages, seconds, str(environment.get("device") or args.device))
    report = {
        "verdict": verdict,
        "ok": all(stage.status != "failed" for stage in stages),
        "seconds": round(seconds, 1),
        "args": {k: str(v) for k, v in vars(args).items()},
        "environment": environment,
        "stages": [asdict(stage) for stage in stages],
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu_check.md").write_text(render_markdown(report))
    print(f"{verdict}; report: {out / 'gpu_check.md'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
