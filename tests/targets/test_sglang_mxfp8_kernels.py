"""The CPU bodies of the MXFP8 pool's GPU-only pieces (kvcheck/targets/sglang/mxfp8_kernels.py)
against what they stand in for.

The two Triton kernels are checked against sglang's own kernels run by Triton's interpreter
(``TRITON_INTERPRET=1``, in a child Python, since Triton reads it at import): the same
wrapper call, once with sglang's kernel and once with the CPU body, must leave the same
bytes. ``store_cache`` (a CUDA JIT kernel, which no interpreter runs) is checked against
its documented contract. The interpreter comparison runs with the sglang target only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvcheck.targets.sglang import mxfp8_kernels

ROOT = Path(__file__).resolve().parents[2]

#: Run in a child under Triton's interpreter: each wrapper with sglang's kernel, then with the
#: CPU body, on the same inputs; prints whether the buffers came out byte-identical.
_COMPARE = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch
from kvcheck.targets.sglang import env, mxfp8_kernels
from kvcheck.targets.sglang.release import installed_release, load
with env.torchvision_stand_in():  # the kernel modules where the installed release has them
    modules = load(installed_release()).modules
interleave, quant_store = modules.mxfp8_interleave, modules.mxfp8_quant_store

torch.manual_seed(0)
heads, pages = 2, 2
loc = torch.tensor([0, 1, 33, 127, 128, 200, 255])  # slot 0 (skipped), both pages, all groups
scales = torch.randint(0, 255, (loc.numel(), heads, 4), dtype=torch.uint8)


def interleaved():
    return torch.zeros(pages, heads, 32, 4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def run_interleave(cpu):
    out = interleaved()
    if cpu:
        with mxfp8_kernels.cpu_mxfp8_interleave_kernel(interleave):
            interleave.store_sf_interleaved(scales.view(torch.float8_e8m0fnu), out, loc)
    else:
        interleave.store_sf_interleaved(scales.view(torch.float8_e8m0fnu), out, loc)
    return out.view(torch.uint8)


k = torch.randn(loc.numel(), heads, 128) * 100
v = torch.randn(loc.numel(), heads, 128) / 100
k[1, 0, :32] = 0.0  # an all-zero block


def run_quant_store(cpu):
    caches = [torch.zeros(pages * 128, heads, 128, dtype=torch.float8_e4m3fn) for _ in "kv"]
    sfs = [interleaved() for _ in "kv"]
    call = lambda: quant_store.quant_store_kv_mxfp8(k, v, loc, *caches, *sfs, page_size=128)
    if cpu:
        with mxfp8_kernels.cpu_mxfp8_quant_store_kernel(quant_store):
            call()
    else:
        call()
    return [t.view(torch.uint8) for t in (*caches, *sfs)]


kernel_q, body_q = run_quant_store(False), run_quant_store(True)
carried = other = 0
for a, b in zip(kernel_q[:2], body_q[:2]):
    differ = a != b
    ours = b[differ].view(torch.float8_e4m3fn).float()
    theirs = a[differ].view(torch.float8_e4m3fn).float()
    # A value rounded up into the next binade: torch gives 2^e, the interpreter 2^(e-1).
    halved = (theirs * 2 == ours) & (ours.abs().log2() == ours.abs().log2().round())
    carried += int(halved.sum())
    other += int((~halved).sum())
print(json.dumps({
    "interleave": torch.equal(run_interleave(False), run_interleave(True)),
    "quant_store_scales": all(torch.equal(a, b) for a, b in zip(kernel_q[2:], body_q[2:])),
    "payload_bytes_written": 2 * int((loc != 0).sum()) * heads * 128,
    "payload_differing_by_the_interpreters_carry": carried,
    "payload_differing_otherwise": other,
    "slot0_untouched": all(int(t[0].sum()) == 0 for t in body_q[:2]),
}))
"""


@pytest.mark.kvcheck_target("sglang")
def test_cpu_bodies_store_the_bytes_sglangs_kernels_store() -> None:
    """Under Triton's interpreter, sglang's store_sf_interleaved and quant_store_kv_mxfp8
    leave the same scale bytes as their CPU bodies, skip slot 0 alike, and store the same
    fp8 payload but where the interpreter's fp8 cast halves a value rounded up into the
    next power of two (see the DSA quantizer's note in docs/sglang-findings-appendix.md)."""
    child_env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _COMPARE],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["interleave"], report
    assert report["quant_store_scales"], report
    assert report["slot0_untouched"], report
    # Where a value rounds up into the next power of two (127.05 -> 128), Triton's
    # interpreter stores half of it (64): its fp8 cast, not the kernel, is wrong there (a
    # GPU's cvt rounds to nearest even, as torch does). Every other byte is equal.
    assert report["payload_differing_otherwise"] == 0, report


def test_store_cache_body_copies_rows_and_skips_the_reserved_slot() -> None:
    """The store_cache body copies row i to row indices[i] byte for byte, skips slot 0,
    and raises IndexError where the kernel's device assert would fire."""
    k = torch.arange(12, dtype=torch.uint8).view(3, 4).view(torch.float8_e4m3fn)
    v = (torch.arange(6, dtype=torch.uint8) + 100).view(3, 2).view(torch.float8_e4m3fn)
    k_cache = torch.zeros(5, 4, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros(5, 2, dtype=torch.float8_e4m3fn)
    mxfp8_kernels._cpu_store_cache_body(k, v, k_cache, v_cache, torch.tensor([0, 4, 2]))
    assert k_cache.view(torch.uint8)[0].tolist() == [0, 0, 0, 0]
    assert k_cache.view(torch.uint8)[4].tolist() == [4, 5, 6, 7]
    assert v_cache.view(torch.uint8)[2].tolist() == [104, 105]
    with pytest.raises(IndexError):
        mxfp8_kernels._cpu_store_cache_body(
            k, v, k_cache, v_cache, torch.tensor([1, 2, 3]), size_limit=3
        )
    with pytest.raises(RuntimeError):  # the host check: one dtype for all four tensors
        mxfp8_kernels._cpu_store_cache_body(
            k.view(torch.uint8), v, k_cache, v_cache, torch.tensor([1, 2, 3])
        )


def test_quantizer_maps_each_block_maximum_onto_448() -> None:
    """quantize_mxfp8_blocks: a block whose maximum is 896 gets exponent byte 128 (x2) and
    its maximum stored as 448; an all-zero block gets the exponent of the kernel's floor
    amax 1e-30, ceil(log2(1e-30 / 448)) + 127 = 19, and zeros."""
    rows = torch.zeros(1, 2, 32)
    rows[0, 0, 0], rows[0, 0, 1] = 896.0, 2.0
    data, exponents = mxfp8_kernels.quantize_mxfp8_blocks(rows)
    assert exponents.tolist() == [[128, 19]]
    values = data.view(torch.float8_e4m3fn).float()
    assert values[0, 0, :2].tolist() == [448.0, 1.0]
    assert int(data[0, 1].sum()) == 0
