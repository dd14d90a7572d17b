"""sglang's host pools for the ``sglang`` target (``srt/mem_cache/pool_host/``), on every
checked release, through the adapter the release's constructors take
(:data:`.declaration.HOST_POOL_ADAPTERS`): from 0.5.23 on a host tier is built from the
device pool's own buffer info (``get_device_pool_infos()[0].buffer_info``, adapter
``buffer_info``); 0.5.21's and 0.5.22's host pools take the device pool itself (adapters
``device_pool_dsa_layout`` and ``device_pool``) and size themselves from
``host_to_device_ratio``. Either way, as sglang's cache controller builds it: MHA pools get
the class ``get_mha_host_pool_cls`` picks (``MHATokenToKVPoolHost``, or
``AsymmetricMHATokenToKVPoolHost`` for a V head dim of its own), MLA pools
``MLATokenToKVPoolHost`` (with the device pool's ``kv_cache_dim``), DSA pools that MLA host
for the latent rows plus ``DSAIndexerPoolHost`` for the index-K pages, sharing its slots
(built from ``make_dsa_indexer_pool_decl``; on 0.5.21 from the device pool and the layout).
Sizes come from ``host_token_capacity``. On CPU:

- every host pool is built with ``pin_memory=False`` (sglang's default registers the buffer
  with ``cudaHostRegister``);
- MXFP8 pools with interleaved scales get ``MHATokenToKVPoolMXFP8Host`` (sglang's pick, in
  ``page_first``), built and transferring with CPU bodies of sglang's JIT HiCache kernels
  (:func:`.env.cpu_hicache_jit`), its scales in ``k_scale_host`` / ``v_scale_host``;
- transfers (``backup_from_device_all_layer``, ``load_to_device_per_layer``) run with CPU
  bodies of the ``sgl_kernel.kvcacheio`` ops (:func:`.env.cpu_kvcacheio`), and MLA/DSA ones
  with a one-rank parallel context and a no-op ``torch.cuda.synchronize``
  (:func:`.env.dcp_parallel`, :func:`.env.cpu_cuda_synchronize`).

Example, where sglang is installed::

    parts = make_host_pool(spec, device_pool, device="cpu")
    [type(part).__name__ for part in parts]  # ['MLATokenToKVPoolHost', 'DSAIndexerPoolHost']
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from kvcheck.targets.sglang import env
from kvcheck.targets.sglang.declaration import HOST_POOL_ADAPTERS
from kvcheck.tiers import HostPoolSpec

MHA_HOST = "sglang.srt.mem_cache.pool_host.mha"
MLA_HOST = "sglang.srt.mem_cache.pool_host.mla"
DSA_HOST = "sglang.srt.mem_cache.pool_host.dsa"
#: The MXFP8 host pool (``pool_host/mha_mxfp8.py``), whose transfers run sglang's JIT
#: HiCache kernels: built and run with their CPU bodies (:func:`.env.cpu_hicache_jit`).
MXFP8_HOST_CLASS = "MHATokenToKVPoolMXFP8Host"
#: Host-pool methods that transfer bytes (and so need the ops and their buffers).
TRANSFER_METHODS: tuple[str, ...] = ("backup_from_device_all_layer", "load_to_device_per_layer")


def _module(name: str) -> Any:
    with env.torchvision_stand_in():
        return importlib.import_module(name)


def _common(device_pool: Any, spec: HostPoolSpec) -> dict[str, Any]:
    return {
        "host_to_device_ratio": 2.0,
        "host_size": 0,
        "page_size": spec.page_size,
        "layout": spec.layout,
        "pin_memory": False,
        "device": "cpu",
        "device_capacity_tokens": int(device_pool.size),
        "start_layer": int(device_pool.start_layer),
        "end_layer": int(device_pool.start_layer) + int(device_pool.layer_num),
        "host_token_capacity": spec.host_size,
    }


def _from_device_pool(device_pool: Any, spec: HostPoolSpec) -> dict[str, Any]:
    """The arguments 0.5.21's and 0.5.22's host pools take beside the device pool: they size
    themselves as ``int(capacity * host_to_device_ratio) // page_size + 1`` pages, so the
    ratio is chosen to give ``spec.host_pages`` (half a token over, against rounding)."""
    capacity = getattr(device_pool, "host_capacity_tokens", None) or int(device_pool.size)
    tokens = (spec.host_pages - 1) * spec.page_size
    return {
        "host_to_device_ratio": (tokens + 0.5) / capacity,
        "host_size": 0,
        "page_size": spec.page_size,
        "layout": spec.layout,
        "pin_memory": False,
        "device": "cpu",
    }


def _mla_host(mla: Any, device_pool: Any, spec: HostPoolSpec, adapter: str) -> Any:
    dim = int(device_pool.kv_cache_dim)
    if adapter != "buffer_info":
        return mla.MLATokenToKVPoolHost(
            device_pool, **_from_device_pool(device_pool, spec), override_kv_cache_dim=dim
        )
    info = device_pool.get_device_pool_infos()[0].buffer_info
    return mla.MLATokenToKVPoolHost(
        info,
        **_common(device_pool, spec),
        target_layer_num=int(device_pool.layer_num),
        override_kv_cache_dim=dim,
    )


def _indexer_host(device_pool: Any, anchor: Any, spec: HostPoolSpec, adapter: str) -> Any:
    """The DSA index-K host pool beside ``anchor`` (the MLA host of the latent rows), built
    as the release's constructor takes it."""
    dsa = _module(DSA_HOST)
    if adapter == "device_pool_dsa_layout":
        return dsa.DSAIndexerPoolHost(
            device_pool, anchor, spec.layout, pin_memory=False, device="cpu"
        )
    decl = dsa.make_dsa_indexer_pool_decl(device_pool)
    return dsa.DSAIndexerPoolHost(decl, anchor, pin_memory=False, device="cpu")


def make_host_pool(
    spec: HostPoolSpec, device_pool: Any, *, device: str, adapter: str = "buffer_info"
) -> tuple[Any, ...]:
    """sglang's host tier for ``device_pool`` (see the module), built with ``adapter``
    (:data:`.declaration.HOST_POOL_ADAPTERS`: the constructor the installed release's host
    pools take)."""
    if adapter not in HOST_POOL_ADAPTERS:
        raise ValueError(f"adapter={adapter!r} not in {tuple(HOST_POOL_ADAPTERS)}")
    if spec.kind == "mha":
        mha = _module(MHA_HOST)
        if adapter != "buffer_info":
            cls = mha.get_mha_host_pool_cls(device_pool)
            jit = cls.__name__ == MXFP8_HOST_CLASS
            with env.cpu_hicache_jit(device_pool) if jit else contextlib.nullcontext():
                host = cls(device_pool, **_from_device_pool(device_pool, spec))
        else:
            info = device_pool.get_device_pool_infos()[0].buffer_info
            cls = mha.get_mha_host_pool_cls(info)
            jit = cls.__name__ == MXFP8_HOST_CLASS
            with env.cpu_hicache_jit(device_pool) if jit else contextlib.nullcontext():
                host = cls(info, **_common(device_pool, spec))
        _transfer_in_scope(host, device_pool, latent=False, jit=jit)
        return (host,)
    mla = _module(MLA_HOST)
    with env.dcp_parallel(1, 0):
        anchor = _mla_host(mla, device_pool, spec, adapter)
        parts: tuple[Any, ...] = (anchor,)
        if spec.kind == "dsa":
            parts = (anchor, _indexer_host(device_pool, anchor, spec, adapter))
    for part in parts:
        _transfer_in_scope(part, device_pool, latent=True)
    return parts


def _buffers(*objects: Any) -> list[Any]:
    """Every tensor (or list or tuple of tensors) an object holds: what the ops address."""
    found: list[Any] = []
    for obj in objects:
        for value in vars(obj).values():
            if isinstance(value, torch.Tensor) or (
                isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor)
            ):
                found.append(value)
    return found


@contextlib.contextmanager
def _transfer_scope(
    host: Any, device_pool: Any, *, latent: bool, jit: bool = False
) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if latent:
            stack.enter_context(env.dcp_parallel(1, 0))
            stack.enter_context(env.cpu_cuda_synchronize())
        stack.enter_context(env.cpu_kvcacheio(*_buffers(device_pool, host)))
        if jit:
            stack.enter_context(env.cpu_hicache_jit(*_buffers(device_pool, host)))
        yield


def _transfer_in_scope(host: Any, device_pool: Any, *, latent: bool, jit: bool = False) -> None:
    """Make the host pool's transfer methods (this instance only) run in their CPU scope."""
    for name in TRANSFER_METHODS:
        method = getattr(type(host), name)

        @functools.wraps(method)
        def scoped(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            with _transfer_scope(host, device_pool, latent=latent, jit=jit):
                return _method(host, *args, **kwargs)

        setattr(host, name, scoped)
