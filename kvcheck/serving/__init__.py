"""The serving layer around the KV pools, modeled on SGLang 0.5.23.

- :mod:`~kvcheck.serving.model_config`: the DSA top-k sharing rule
  (:func:`dsa_layer_skips_topk`, :func:`skip_topk_layers`).
- :mod:`~kvcheck.serving.configurator`: bytes per token (:func:`cell_size_bytes`), bytes of a
  built pool (:func:`pool_bytes`), the token capacity of a budget
  (:func:`max_total_num_tokens`), and the DSA geometry SGLang builds
  (:func:`latent_kv_cache_dim`, :func:`index_buf_size`).
- :mod:`~kvcheck.serving.server_args`: :class:`ServerArgs` (CLI flags, default resolution,
  the --prefill-only-disable-kv-cache rules in :data:`PREFILL_ONLY_RULE_ORDER`).
- :mod:`~kvcheck.serving.pool_selection`: :func:`select_kv_pool` and
  :func:`unsupported_pool_family`.

What a model is (:class:`~kvcheck.vocabulary.ModelConfig`), the named models and the flags'
choices are the harness's vocabulary, in :mod:`kvcheck.vocabulary`; the names are also
re-exported here, for code written before the split.

Example:
    >>> from kvcheck.serving import GLM_5_2_LIKE, max_total_num_tokens
    >>> max_total_num_tokens(GLM_5_2_LIKE, budget_bytes=60 << 30, dtype="bfloat16",
    ...                      page_size=64)
    695424
"""

from kvcheck.serving.configurator import (
    HISPARSE_HOST_TO_DEVICE_RATIO,
    cell_size_bytes,
    index_buf_size,
    index_k_bytes_per_token,
    kv_torch_dtype,
    latent_kv_cache_dim,
    max_total_num_tokens,
    num_indexer_layers,
    pool_bytes,
)
from kvcheck.serving.model_config import (
    dsa_layer_skips_topk,
    is_dsa_config,
    layer_window,
    skip_topk_layers,
)
from kvcheck.serving.pool_selection import (
    UNSUPPORTED_POOL_FAMILIES,
    select_kv_pool,
    unsupported_pool_family,
)
from kvcheck.serving.server_args import (
    PREFILL_ONLY_RULE_ORDER,
    PrefillOnlyFlagError,
    ServerArgs,
    default_attention_backend,
    default_chunked_prefill_size,
)
from kvcheck.vocabulary import (
    DEEPSEEK_V3_2,
    GLM_5_2_LIKE,
    KV_CACHE_POOL_DTYPES,
    MINIMAL_VALID_FLAGS,
    MODELS,
    QWEN3_EMBEDDING_8B,
    ModelConfig,
)

__all__ = [
    "DEEPSEEK_V3_2",
    "GLM_5_2_LIKE",
    "HISPARSE_HOST_TO_DEVICE_RATIO",
    "KV_CACHE_POOL_DTYPES",
    "MINIMAL_VALID_FLAGS",
    "MODELS",
    "PREFILL_ONLY_RULE_ORDER",
    "QWEN3_EMBEDDING_8B",
    "UNSUPPORTED_POOL_FAMILIES",
    "ModelConfig",
    "PrefillOnlyFlagError",
    "ServerArgs",
    "cell_size_bytes",
    "default_attention_backend",
    "default_chunked_prefill_size",
    "dsa_layer_skips_topk",
    "index_buf_size",
    "index_k_bytes_per_token",
    "is_dsa_config",
    "kv_torch_dtype",
    "latent_kv_cache_dim",
    "layer_window",
    "max_total_num_tokens",
    "num_indexer_layers",
    "pool_bytes",
    "select_kv_pool",
    "skip_topk_layers",
    "unsupported_pool_family",
]
