"""Pool selection: SGLang's ``_init_pools`` step for the pool families kvcheck implements.

:func:`select_kv_pool` builds the pool a worker would get:

* ``--prefill-only-disable-kv-cache`` on a plain MHA model: :class:`NoOpMHATokenToKVPool`;
* a quantized ``--kv-cache-dtype`` (``mxfp8``, ``nvfp4``, ``fp4_mx_block16``, from
  ``server_args`` or passed as ``dtype``): the quantized pool it selects, with its scale
  buffers (:func:`~kvcheck.serving.quantized.quantized_pool_spec`: ``mha:mxfp8``,
  ``mha:nvfp4``, ``mha:fp4_mx_block16``, ``mla:fp4``);
* otherwise the model's own pool: MHA, MLA, or DSA (with the skip mask of
  :func:`~kvcheck.serving.skip_topk_layers`: every layer allocated for a draft worker or
  with ``--enable-hisparse``).

With the flag on, a model that needs another pool family raises ``RuntimeError`` naming
that family and listing what is supported. The families are checked in SGLang's order
(:data:`UNSUPPORTED_POOL_FAMILIES`). A draft worker is never affected by the flag: it
keeps its normal pool. Families kvcheck does not implement at all (SWA, hybrid
linear/Mamba, quantized DSA) raise ``ValueError`` when the flag is off, and so does a model
whose shapes a quantized pool cannot hold.

Example:
    >>> import torch
    >>> from kvcheck.serving import QWEN3_EMBEDDING_8B, ServerArgs
    >>> args = ServerArgs(is_embedding=True, prefill_only_disable_kv_cache=True,
    ...                   chunked_prefill_size=-1, disable_radix_cache=True)
    >>> pool = select_kv_pool(args, QWEN3_EMBEDDING_8B, max_total_num_tokens=4096,
    ...                       page_size=64, dtype=torch.bfloat16, device="meta")
    >>> type(pool).__name__, pool.size
    ('NoOpMHATokenToKVPool', 4096)
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.serving.configurator import index_buf_size, kv_torch_dtype, latent_kv_cache_dim
from kvcheck.serving.model_config import ModelConfig, layer_window, skip_topk_layers
from kvcheck.serving.quantized import is_quantized_kv_cache_dtype, quantized_pool_spec
from kvcheck.serving.server_args import FP4_KV_CACHE_DTYPES, ServerArgs

#: Pool families that rule out the no-op pool, in the order SGLang checks them.
UNSUPPORTED_POOL_FAMILIES: tuple[str, ...] = (
    "hybrid DSA/MLA-SWA KV pool",
    "DSA/MLA KV pool",
    "MLA KV pool",
    "SWA KV pool",
    "hybrid linear/Mamba KV pool",
    "FP4 MHA KV pool",
)

SUPPORTED_NOOP_FAMILY = (
    "plain MHA models (no sliding window, not hybrid linear/Mamba, no FP4 KV cache) "
    "served with --is-embedding, --chunked-prefill-size -1, --disable-radix-cache, an "
    "fa3/fa4 prefill backend, --attn-cp-size 1, no --enable-prefill-context-parallel "
    "and no --enable-hisparse"
)


def unsupported_pool_family(
    server_args: ServerArgs,
    model: ModelConfig,
    *,
    is_draft_worker: bool = False,
    dtype: torch.dtype | str | None = None,
) -> str | None:
    """The pool family that keeps ``model`` from the no-op pool, or None when it is fine.

    None also when ``--prefill-only-disable-kv-cache`` is off or for a draft worker (which
    keeps its normal pool). ``dtype``, when given, is the KV dtype the pool would be built
    with; an FP4 dtype counts as an FP4 KV cache.

    Example:
        >>> from kvcheck.serving import DEEPSEEK_V3_2
        >>> flagged = ServerArgs.unchecked(prefill_only_disable_kv_cache=True)
        >>> unsupported_pool_family(flagged, DEEPSEEK_V3_2)
        'DSA/MLA KV pool'
        >>> unsupported_pool_family(flagged, DEEPSEEK_V3_2, is_draft_worker=True) is None
        True
    """
    _check_inputs(server_args, model)
    if not server_args.prefill_only_disable_kv_cache or is_draft_worker:
        return None
    return _non_mha_family(server_args, model, dtype)


def select_kv_pool(
    server_args: ServerArgs,
    model: ModelConfig,
    *,
    max_total_num_tokens: int,
    page_size: int,
    dtype: torch.dtype | str,
    device: str | torch.device,
    is_draft_worker: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> Any:
    """Build the KV pool a worker serving ``model`` with ``server_args`` gets.

    The pool holds ``max_total_num_tokens`` tokens in pages of ``page_size`` for layers
    ``start_layer .. start_layer + layer_num - 1`` (default: from ``start_layer`` to the
    last layer). Raises RuntimeError when ``--prefill-only-disable-kv-cache`` is on and the
    model needs a family other than plain MHA (see the module docstring); ValueError for a
    family kvcheck has no pool for, and for bad arguments.

    Example:
        >>> from kvcheck.serving import GLM_5_2_LIKE
        >>> pool = select_kv_pool(ServerArgs.for_model(GLM_5_2_LIKE), GLM_5_2_LIKE,
        ...                       max_total_num_tokens=1024, page_size=64,
        ...                       dtype="bfloat16", device="meta")
        >>> type(pool).__name__, pool.skip_topk_layers.count(False)
        ('DSATokenToKVPool', 21)
    """
    # Imported on use: the sizing and flag checks in kvcheck.serving serve strategies and
    # the memory report without loading the pool implementations.
    from kvcheck.pools import (
        DSATokenToKVPool,
        MHATokenToKVPool,
        MLATokenToKVPool,
        NoOpMHATokenToKVPool,
    )

    family = unsupported_pool_family(
        server_args, model, is_draft_worker=is_draft_worker, dtype=dtype
    )
    if family is not None:
        raise RuntimeError(
            f"--prefill-only-disable-kv-cache is not supported for the {family} that "
            f"{model.name!r} needs: the no-op pool only replaces the plain MHA pool. "
            f"Supported today: {SUPPORTED_NOOP_FAMILY}."
        )
    missing = _non_mha_family(server_args, model, dtype)
    if missing is not None and missing not in ("DSA/MLA KV pool", "MLA KV pool", "FP4 MHA KV pool"):
        raise ValueError(
            f"{model.name!r} needs the {missing}, which kvcheck does not implement; "
            "kvcheck builds MHA, no-op MHA, MLA and DSA pools and their quantized variants"
        )

    layers = layer_window(model, start_layer=start_layer, layer_num=layer_num)
    use_noop = server_args.prefill_only_disable_kv_cache and not is_draft_worker
    quantized = _quantized_kv_cache_dtype(server_args, dtype)
    # With the flag on, flag validation refuses every quantized dtype first; taken as given,
    # the flag keeps its no-op pool (kvcheck's contract, not SGLang's MXFP8-first order).
    if quantized is not None and not (use_noop and model.attention_arch == "mha"):
        return _quantized_pool(
            model,
            quantized,
            num_tokens=max_total_num_tokens,
            page_size=page_size,
            layer_num=len(layers),
            start_layer=start_layer,
            device=device,
        )
    common: dict[str, Any] = {
        "size": max_total_num_tokens,
        "page_size": page_size,
        "dtype": kv_torch_dtype(dtype),
        "layer_num": len(layers),
        "device": device,
        "start_layer": start_layer,
    }
    if model.is_dsa:
        return DSATokenToKVPool(
            kv_lora_rank=model.kv_lora_rank,
            qk_rope_head_dim=model.qk_rope_head_dim,
            index_head_dim=model.index_head_dim,
            skip_topk_layers=skip_topk_layers(
                model,
                is_draft_worker=is_draft_worker,
                enable_hisparse=server_args.enable_hisparse,
                start_layer=start_layer,
                layer_num=len(layers),
            ),
            # SGLang's row: scaled for float8_e4m3fn (the pool takes the layout from it).
            kv_cache_dim=latent_kv_cache_dim(model, dtype=dtype),
            index_buf_size=index_buf_size(
                max_total_num_tokens, enable_hisparse=server_args.enable_hisparse
            ),
            **common,
        )
    if model.uses_latent_cache:
        return MLATokenToKVPool(
            kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim, **common
        )
    pool_class = NoOpMHATokenToKVPool if use_noop else MHATokenToKVPool
    return pool_class(
        head_num=model.num_key_value_heads,
        head_dim=model.head_dim,
        v_head_dim=model.effective_v_head_dim,
        **common,
    )


def _quantized_kv_cache_dtype(server_args: ServerArgs, dtype: torch.dtype | str) -> str | None:
    """The quantized ``--kv-cache-dtype`` the pool is built for: ``dtype`` when it names
    one, else ``server_args.kv_cache_dtype`` when that does; None for a plain pool."""
    for name in (dtype, server_args.kv_cache_dtype):
        if is_quantized_kv_cache_dtype(name):
            return str(name)
    return None


def _quantized_pool(
    model: ModelConfig,
    kv_cache_dtype: str,
    *,
    num_tokens: int,
    page_size: int,
    layer_num: int,
    start_layer: int,
    device: str | torch.device,
) -> Any:
    """kvcheck's pool of the variant ``kv_cache_dtype`` selects for ``model``."""
    from kvcheck.pools import MHATokenToKVPoolMXFP8, MLATokenToKVPoolFP4, QuantizedMHATokenToKVPool

    spec = quantized_pool_spec(
        model,
        kv_cache_dtype,
        num_tokens=num_tokens,
        page_size=page_size,
        layer_num=layer_num,
        start_layer=start_layer,
    )
    common: dict[str, Any] = {
        "size": spec.size,
        "page_size": spec.page_size,
        "dtype": getattr(torch, spec.dtype),
        "layer_num": spec.layer_num,
        "device": device,
        "start_layer": spec.start_layer,
    }
    if spec.family == "mla":
        return MLATokenToKVPoolFP4(
            kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim, **common
        )
    heads: dict[str, Any] = {
        "head_num": spec.head_num,
        "head_dim": spec.head_dim,
        "v_head_dim": spec.v_head_dim,
    }
    if spec.kv_quant == "mxfp8":
        return MHATokenToKVPoolMXFP8(**heads, **common)
    return QuantizedMHATokenToKVPool(
        **heads, **common, quant_method=spec.kv_quant, nvfp4_layout=spec.nvfp4_layout
    )


def _non_mha_family(
    server_args: ServerArgs, model: ModelConfig, dtype: torch.dtype | str | None
) -> str | None:
    """The first family in UNSUPPORTED_POOL_FAMILIES that ``model`` needs, if any."""
    latent = model.uses_latent_cache
    swa = model.sliding_window is not None
    if latent and swa:
        return "hybrid DSA/MLA-SWA KV pool"
    if model.is_dsa:
        return "DSA/MLA KV pool"
    if latent and not model.is_hybrid_linear:
        return "MLA KV pool"
    if swa:
        return "SWA KV pool"
    if model.is_hybrid_linear:
        return "hybrid linear/Mamba KV pool"
    if _uses_fp4_kv_cache(server_args, model, dtype):
        return "FP4 MHA KV pool"
    return None


def _uses_fp4_kv_cache(
    server_args: ServerArgs, model: ModelConfig, dtype: torch.dtype | str | None
) -> bool:
    # Only an explicit FP4 --kv-cache-dtype (or an FP4 pool dtype) selects the FP4 pool:
    # "auto" takes an FP8 checkpoint declaration and nothing else (SGLang 0.5.23
    # configure_kv_cache_dtype), so a checkpoint's NVFP4 KV cache does not make one.
    if server_args.kv_cache_dtype in FP4_KV_CACHE_DTYPES:
        return True
    dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else ""
    return dtype_name.startswith("float4")


def _check_inputs(server_args: Any, model: Any) -> None:
    if not isinstance(server_args, ServerArgs):
        raise ValueError(f"server_args={server_args!r} must be a ServerArgs")
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model={model!r} must be a ModelConfig")
