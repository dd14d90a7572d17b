"""sglang 0.5.23's linear-attention hybrid pools for the ``sglang`` target.

Builds ``HybridReqToTokenPool`` (request rows, its ``MambaPool`` and ``MambaSlotAllocator``)
and ``HybridLinearKVPool`` over it, from a :class:`kvcheck.specs.LinearHybridSpec`, as
sglang's pool assembler does for a Qwen3-Next-style model: Mamba2 state shapes from the
model fields (``Mamba2StateShape.create``, one group, no tensor parallelism), fp32 states,
the full-attention KV as an MHA pool. On CPU the full pool moves K/V with sglang's torch
move (:func:`.env.native_kv_move`, as every MHA pool of this target); the mamba slot
operations take their per-tensor Python path (sglang fuses them only for bf16 CUDA conv
states); nothing else is stood in.

QSA (``QSATokenToKVPool``, :func:`build_qsa_hybrid`) is the same hybrid with a compressed
index cache and a per-request pending ring; only the census runs on it.

Left out, with why: the ping-pong tracking buffers (``enable_mamba_extra_buffer``; they need
a scheduler's request fields beyond the pool), the ReplaySSM rings and the envelope layout
(CUDA-only paths, asserted as such), the int8 checkpoint pool and the PLE side states
(model-specific, built disabled).

Example, where sglang is installed::

    from kvcheck.specs import LinearHybridSpec
    kv_pool, req_pool = build_linear_hybrid(
        LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0,)), device="cpu")
    type(req_pool.mamba_pool).__name__  # 'MambaPool'
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from kvcheck.specs import LinearHybridSpec
from kvcheck.targets.sglang import env

MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
MAMBA_UTILS = "sglang.srt.configs.mamba_utils"


def _module(name: str) -> Any:
    with env.torchvision_stand_in():
        return importlib.import_module(name)


def cache_params(spec: LinearHybridSpec) -> Any:
    """sglang's ``Mamba2CacheParams`` for ``spec``'s mamba layers (fp32 conv and SSM)."""
    utils = _module(MAMBA_UTILS)
    shape = utils.Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=spec.mamba_heads * spec.mamba_head_dim,
        n_groups=1,
        num_heads=spec.mamba_heads,
        head_dim=spec.mamba_head_dim,
        state_size=spec.state_size,
        conv_kernel=spec.conv_kernel,
    )
    return utils.Mamba2CacheParams(
        shape=shape,
        layers=list(spec.mamba_layer_ids),
        dtype=utils.Mamba2StateDType(conv=torch.float32, temporal=torch.float32),
    )


def _request_pool(spec: LinearHybridSpec, *, device: str) -> Any:
    """sglang's ``HybridReqToTokenPool`` (its MambaPool and slot allocator) for ``spec``."""
    pools = _module(MEMORY_POOL)
    return pools.HybridReqToTokenPool(
        size=spec.rows,
        mamba_size=spec.mamba_size,
        mamba_spec_state_size=spec.mamba_size,
        max_context_len=spec.max_context_len,
        device=device,
        enable_memory_saver=False,
        cache_params=cache_params(spec),
        mamba_layer_ids=list(spec.mamba_layer_ids),
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=spec.draft_tokens,
    )


def _hybrid(
    pool_class: Any, spec: LinearHybridSpec, *, device: str, dtype: torch.dtype, **extra: Any
) -> tuple[Any, Any]:
    """``(pool_class(...), its HybridReqToTokenPool)``: the hybrid KV pool over the request
    pool's mamba pool, with ``extra`` arguments of its own."""
    req_pool = _request_pool(spec, device=device)
    with env.native_kv_move():
        kv_pool = pool_class(
            size=spec.size,
            dtype=dtype,
            page_size=spec.page_size,
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            full_attention_layer_ids=list(spec.full_layer_ids),
            device=device,
            mamba_pool=req_pool.mamba_pool,
            **extra,
        )
    return kv_pool, req_pool


def build_linear_hybrid(spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
    """``(HybridLinearKVPool, HybridReqToTokenPool)`` of sglang for ``spec`` on ``device``."""
    pools = _module(MEMORY_POOL)
    return _hybrid(pools.HybridLinearKVPool, spec, device=device, dtype=torch.float32)


#: QSA's index geometry the target builds with (a spec has no QSA fields: only the census
#: runs on QSA, and it needs no model of them): one index head of 4 values, two tokens per
#: compressed key, a top-k of one group.
QSA_ARGUMENTS: dict[str, int] = {
    "qsa_index_kv_heads": 1,
    "qsa_index_head_dim": 4,
    "qsa_compress_ratio": 2,
    "qsa_token_topk": 2,
}


def build_qsa_hybrid(spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
    """``(QSATokenToKVPool, HybridReqToTokenPool)`` of sglang for ``spec`` on ``device``:
    the linear hybrid with QSA's compressed index keys (one row per
    ``qsa_compress_ratio`` token slots) and per-request pending ring
    (:data:`QSA_ARGUMENTS`), a ring row set per request row of ``spec``, bf16 KV as
    sglang's configurator builds it for a bf16 model. sglang refuses (ValueError) a page
    size that is not a multiple of the compress ratio above 1."""
    qsa = _module("sglang.srt.mem_cache.qsa_kv_pool")
    return _hybrid(
        qsa.QSATokenToKVPool,
        spec,
        device=device,
        dtype=torch.bfloat16,
        num_request_slots=spec.rows,
        **QSA_ARGUMENTS,
    )
