"""A stand-in replaces a kernel's body, never sglang's choice of path.

For the kernel stand-ins the target installs on CPU (``kvcheck/targets/sglang/env.py``,
``mxfp8_kernels.py``), a profiler records every sglang function a pool call enters, with and
without the stand-in: sglang's dispatch (which function, which kernel wrapper) is the same,
the run without it stopping where the GPU kernel is launched. The one stand-in that does
change the path, ``native_kv_move`` (``SGLANG_NATIVE_MOVE_KV_CACHE``), is declared in
``env.PATH_CHANGES``, and the test shows that it does change it. Statically, no other
stand-in module names an sglang environment switch.

Marked ``sglang``: runs only when the kvcheck target is sglang.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch

from kvcheck.targets.sglang import env, hicache_jit, kvcacheio, mxfp8_kernels

SWITCH = re.compile(r"\bSGLANG_[A-Z0-9_]+")


def test_only_declared_stand_ins_set_sglang_switches():
    """The stand-in modules name sglang environment switches only in env, for the path
    change and the spec switch they declare."""
    for module in (mxfp8_kernels, hicache_jit, kvcacheio):
        assert not SWITCH.findall(inspect.getsource(module)), module.__name__
    declared = {env.NATIVE_MOVE_ENV, *env.SPEC_SWITCHES.values()}
    assert set(SWITCH.findall(inspect.getsource(env))) <= declared
    for name, function in vars(env).items():
        if callable(function) and getattr(function, "__module__", "") == env.__name__:
            if name in env.PATH_CHANGES or name in env.SPEC_SWITCHES or name == "scoped_environ":
                continue
            source = inspect.getsource(function)
            assert "scoped_environ" not in source and "os.environ" not in source, name


on_sglang = pytest.mark.kvcheck_target("sglang")


def sglang_calls(call: Callable[[], Any]) -> tuple[list[str], BaseException | None]:
    """The sglang functions ``call`` enters, in order, and what it raised."""
    import sglang

    root, entered = os.path.dirname(sglang.__file__) + os.sep, []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            module = frame.f_code.co_filename[len(root) :]
            entered.append(f"{module}:{frame.f_code.co_qualname}")

    sys.setprofile(profile)
    try:
        call()
        raised = None
    except Exception as error:  # the GPU kernel's launch, without its stand-in
        raised = error
    finally:
        sys.setprofile(None)
    return entered, raised


def same_dispatch(
    build: Callable[[], Any],
    call: Callable[[Any], Any],
    stand_in: Callable[[], AbstractContextManager[Any]],
    scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[list[str], list[str], BaseException | None]:
    """The sglang calls of ``call(pool)`` without and with ``stand_in`` (after one warm-up
    call with it, so first-call caches fill alike), each on a fresh pool from ``build``."""
    with scope():
        with stand_in():
            call(build())
        bare, raised = sglang_calls(lambda: call(build()))
        with stand_in():
            patched, patched_raised = sglang_calls(lambda: call(build()))
    assert patched_raised is None, patched_raised
    return bare, patched, raised


def assert_prefix(bare: list[str], patched: list[str], raised: BaseException | None) -> None:
    """Without the stand-in sglang entered the functions it enters with it, in the same
    order, until the kernel launch raised; with no raise (a GPU), all of them."""
    __tracebackhide__ = True
    if raised is None:
        assert bare == patched
        return
    assert patched[: len(bare)] == bare, (bare, patched)


@pytest.fixture(scope="module")
def sglang() -> Iterator[Any]:
    if torch.cuda.is_available():
        pytest.skip("on CUDA the target installs no kernel stand-ins")
    from kvcheck.targets.sglang import target

    yield target._sglang()


@on_sglang
def test_index_k_stand_in_keeps_the_dispatch(sglang: Any) -> None:
    """cpu_index_k_kernel: set_index_k_scale_buffer takes the same sglang path."""
    pool_class = sglang.memory_pool.DSATokenToKVPool
    args = dict(kv_lora_rank=4, dtype=torch.bfloat16, qk_rope_head_dim=4, layer_num=1)
    args.update(device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=8)
    key = torch.ones((1, 128)).to(torch.float8_e4m3fn)
    bare, patched, raised = same_dispatch(
        lambda: pool_class(size=64, page_size=64, **args),
        lambda pool: pool.set_index_k_scale_buffer(0, torch.tensor([1]), key, torch.ones(1, 1)),
        lambda: env.cpu_index_k_kernel(sglang.index_k_kernels),
        env.dcp_parallel,
    )
    assert_prefix(bare, patched, raised)


@on_sglang
def test_mla_read_stand_in_keeps_the_dispatch(sglang: Any) -> None:
    """cpu_mla_read_kernels: get_mla_kv_buffer takes the same sglang path."""
    pool_class, layer = sglang.memory_pool.MLATokenToKVPool, type("Layer", (), {"layer_id": 0})()
    args = dict(dtype=torch.bfloat16, kv_lora_rank=4, qk_rope_head_dim=2, layer_num=1)
    bare, patched, raised = same_dispatch(
        lambda: pool_class(size=8, page_size=1, device="cpu", enable_memory_saver=False, **args),
        lambda pool: pool.get_mla_kv_buffer(layer, torch.tensor([1, 2])),
        lambda: env.cpu_mla_read_kernels(sglang.mla_buffer),
        env.dcp_parallel,
    )
    assert_prefix(bare, patched, raised)


@on_sglang
def test_cuda_synchronize_stand_in_keeps_the_dispatch(sglang: Any) -> None:
    """cpu_cuda_synchronize: a DSA host copy takes the same sglang path."""
    pool_class = sglang.memory_pool.DSATokenToKVPool
    args = dict(kv_lora_rank=4, dtype=torch.bfloat16, qk_rope_head_dim=4, layer_num=1)
    args.update(device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=8)
    bare, patched, raised = same_dispatch(
        lambda: pool_class(size=64, page_size=64, **args),
        lambda pool: pool.get_cpu_copy(torch.arange(8)),
        env.cpu_cuda_synchronize,
        env.dcp_parallel,
    )
    assert_prefix(bare, patched, raised)


@on_sglang
def test_mxfp8_interleave_stand_in_keeps_the_dispatch(sglang: Any) -> None:
    """cpu_mxfp8_interleave_kernel: an MXFP8 move on 128-token pages takes the same path."""
    pool_class = getattr(sglang.memory_pool, "MHATokenToKVPoolMXFP8", None)
    if pool_class is None or sglang.mxfp8_interleave is None:
        pytest.skip("this sglang has no MXFP8 pool")
    args = dict(dtype=torch.float8_e4m3fn, head_num=1, head_dim=128, layer_num=1)
    bare, patched, raised = same_dispatch(
        lambda: pool_class(
            size=128, page_size=128, device="cpu", enable_memory_saver=False, **args
        ),
        lambda pool: pool.move_kv_cache(torch.tensor([2]), torch.tensor([1])),
        lambda: mxfp8_kernels.cpu_mxfp8_interleave_kernel(sglang.mxfp8_interleave),
    )
    assert_prefix(bare, patched, raised)


@on_sglang
def test_native_kv_move_is_a_declared_path_change(sglang: Any) -> None:
    """native_kv_move changes sglang's path (the torch move instead of the Triton copy's
    assert), and env.PATH_CHANGES says so."""
    pool_class = sglang.memory_pool.MHATokenToKVPool
    args = dict(dtype=torch.bfloat16, head_num=1, head_dim=4, layer_num=1)
    bare, patched, raised = same_dispatch(
        lambda: pool_class(size=8, page_size=4, device="cpu", enable_memory_saver=False, **args),
        lambda pool: pool.move_kv_cache(torch.tensor([2]), torch.tensor([1])),
        env.native_kv_move,
    )
    assert "native_kv_move" in env.PATH_CHANGES
    assert any("move_kv_cache_native" in name for name in patched)
    assert not any("move_kv_cache_native" in name for name in bare), bare
    assert raised is not None  # sglang's default path, for a pool built without the copy
