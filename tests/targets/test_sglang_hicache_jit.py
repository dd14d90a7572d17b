"""The CPU bodies of sglang's JIT HiCache kernels (kvcheck/targets/sglang/hicache_jit.py)
against their documented contract (``relayout.cuh``, ``staged_write_back.cuh``): no
interpreter runs a CUDA JIT kernel, so each body is checked on bytes written by hand."""

from __future__ import annotations

import importlib

import pytest
import torch

from kvcheck.targets.sglang import hicache_jit, kvcacheio


def _pointer_table(layers: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([layer.data_ptr() for layer in layers], dtype=torch.int64)


def test_staged_write_back_copies_whole_pages_from_each_pages_first_index() -> None:
    """Host rows ``dst[dst_indices[i*ps] + o, l]`` take device row ``src_indices[i*ps] + o``
    of layer ``l``; the other indices of a page are not read."""
    page_size, layers, width = 2, 2, 16
    device = [
        torch.arange(8 * width, dtype=torch.uint8).reshape(8, width) + 100 * layer
        for layer in range(layers)
    ]
    host = torch.zeros(6, layers, width, dtype=torch.uint8)
    staging = torch.zeros(page_size, layers, width, dtype=torch.uint8)
    with kvcacheio.registered(device, host):
        hicache_jit.transfer_hicache_all_layer_mla_staged_lf_pf(
            _pointer_table(device),
            torch.tensor([4, 99]),  # 99 is never read: the page's first index is 4
            torch.tensor([2, 77]),
            staging,
            host,
            page_size=page_size,
        )
    for layer in range(layers):
        assert torch.equal(host[2:4, layer], device[layer][4:6])
    assert not host[:2].any() and not host[4:].any()


def test_staged_write_back_refuses_bytes_outside_the_registered_buffers() -> None:
    """Where the GPU kernel would read outside every buffer, the body raises IndexError."""
    device = [torch.zeros(2, 16, dtype=torch.uint8)]
    host = torch.zeros(4, 1, 16, dtype=torch.uint8)
    with kvcacheio.registered(device, host), pytest.raises(IndexError):
        hicache_jit.transfer_hicache_all_layer_mla_staged_lf_pf(
            _pointer_table(device),
            torch.tensor([6]),
            torch.tensor([0]),
            torch.zeros(1, 1, 16, dtype=torch.uint8),
            host,
            page_size=1,
        )


def test_one_layer_load_copies_pair_by_pair() -> None:
    """``dst[indices_dst[k]]`` takes ``src[indices_src[k]]``, K and V alike."""
    src_k, src_v = torch.arange(8.0).reshape(4, 2), -torch.arange(8.0).reshape(4, 2)
    dst_k, dst_v = torch.zeros(4, 2), torch.zeros(4, 2)
    hicache_jit.transfer_hicache_one_layer(
        dst_k, dst_v, torch.tensor([0, 3]), src_k, src_v, torch.tensor([2, 1]), element_dim=2
    )
    assert dst_k.tolist() == [[4.0, 5.0], [0.0, 0.0], [0.0, 0.0], [2.0, 3.0]]
    assert torch.equal(dst_v, -dst_k)


def test_the_stand_in_undoes_itself() -> None:
    """After the block, sglang's host pool modules hold their own names again."""
    from kvcheck.targets.sglang.target import SGLangTarget

    target = SGLangTarget()
    if target.unavailable:
        pytest.skip(target.unavailable)
    target.prepare()  # imports sglang under the target's stand-ins, once per process
    from kvcheck.targets.sglang.target import _facts
    from kvcheck.targets.tier_support import host_pool_skip_reason

    # A release without host pools (or without the MXFP8 host tier) never installs the
    # stand-in, and its modules may lack what it patches.
    missing = [_facts().loaded.missing.get(n) for n in ("host_mxfp8", "hicache_jit")]
    why = host_pool_skip_reason(target, "mha") or next((m for m in missing if m), None)
    if why is not None:
        pytest.skip(why)
    modules = [importlib.import_module(name) for name in hicache_jit.MODULES]
    before = [
        {name: module.__dict__.get(name) for name in (*hicache_jit.JIT_NAMES, "_is_cuda")}
        for module in modules
    ]
    with hicache_jit.cpu_hicache_jit():
        assert modules[0].__dict__["_is_cuda"] is True or torch.cuda.is_available()
    after = [
        {name: module.__dict__.get(name) for name in (*hicache_jit.JIT_NAMES, "_is_cuda")}
        for module in modules
    ]
    assert before == after
