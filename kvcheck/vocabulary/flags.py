"""The serving flags' choices, as SGLang 0.5.23 spells them, and the fewest flags with which
``--prefill-only-disable-kv-cache`` is accepted.

Example:
    >>> "fp8_e4m3" in KV_CACHE_DTYPE_CHOICES, KV_CACHE_POOL_DTYPES["bf16"]
    (True, 'bfloat16')
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "ATTENTION_BACKEND_CHOICES",
    "DEVICE_CHOICES",
    "FA_PREFILL_BACKENDS",
    "FP4_KV_CACHE_DTYPES",
    "GPU_ARCH_CHOICES",
    "KV_CACHE_DTYPE_CHOICES",
    "KV_CACHE_POOL_DTYPES",
    "MINIMAL_VALID_FLAGS",
]

#: ``--kv-cache-dtype`` choices.
KV_CACHE_DTYPE_CHOICES: tuple[str, ...] = (
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
)
#: KV-cache dtypes that select SGLang's FP4 pool (rule 2 rejects them): SGLang 0.5.23's two
#: FP4 ``--kv-cache-dtype`` choices.
FP4_KV_CACHE_DTYPES: tuple[str, ...] = ("nvfp4", "fp4_mx_block16")
#: The pool dtype (a torch dtype name) of each ``--kv-cache-dtype`` choice whose pool
#: stores plain elements, as SGLang's model runner maps them; ``auto`` is the model's own
#: dtype (``None`` here). The FP4 choices and ``mxfp8`` (fp8 values with block scales)
#: select pools that kvcheck does not model, so they have no entry.
KV_CACHE_POOL_DTYPES: Mapping[str, str | None] = MappingProxyType(
    {
        "auto": None,
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
        "fp8_e4m3": "float8_e4m3fn",
        "fp8_e5m2": "float8_e5m2",
    }
)
ATTENTION_BACKEND_CHOICES: tuple[str, ...] = (
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "trtllm_mha",
    "aiter",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
#: Prefill backends whose raw-K/V path never touches the paged KV cache.
FA_PREFILL_BACKENDS: tuple[str, ...] = ("fa3", "fa4")
DEVICE_CHOICES: tuple[str, ...] = ("cuda", "cpu")
GPU_ARCH_CHOICES: tuple[str, ...] = ("sm80", "sm90", "sm100", "sm120")

#: The fewest flags with which ``--prefill-only-disable-kv-cache`` is accepted: embedding
#: mode, unchunked prefill, no radix cache and a prefill backend that never reads the paged
#: cache. Everything else keeps its default.
MINIMAL_VALID_FLAGS: Mapping[str, Any] = MappingProxyType(
    {
        "prefill_only_disable_kv_cache": True,
        "is_embedding": True,
        "chunked_prefill_size": -1,
        "disable_radix_cache": True,
        "attention_backend": "fa3",
    }
)
