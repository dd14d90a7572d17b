"""sglang 0.5.23's linear-attention hybrid pools for the ``sglang`` target.

Builds ``HybridReqToTokenPool`` (request rows, its ``MambaPool`` and ``MambaSlotAllocator``)
and ``HybridLinearKVPool`` over it, from a :class:`kvcheck.specs.LinearHybridSpec`, as
sglang's pool assembler does for a Qwen3-Next-style model: Mamba2 state shapes from the
model fields (``Mamba2StateShape.create``, one group, no tensor parallelism), fp32 states,
the full-attention KV as an MHA pool. On CPU the full pool moves K/V with sglang's torch
move (:func:`.env.native_kv_move`, as every MHA pool of this target); the mamba slot
operations take their per-tensor Python path (sglang fuses them only for bf16 CUDA conv
states); nothing else is stood in.

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


def build_linear_hybrid(spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
    """``(HybridLinearKVPool, HybridReqToTokenPool)`` of sglang for ``spec`` on ``device``."""
    pools = _module(MEMORY_POOL)
    req_pool = pools.HybridReqToTokenPool(
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
    with env.native_kv_move():
        kv_pool = pools.HybridLinearKVPool(
            size=spec.size,
            dtype=torch.float32,
            page_size=spec.page_size,
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            full_attention_layer_ids=list(spec.full_layer_ids),
            device=device,
            mamba_pool=req_pool.mamba_pool,
        )
    return kv_pool, req_pool
