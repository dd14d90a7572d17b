"""Naive reference models, written to be obviously right: of the KV pools
(:mod:`kvcheck.reference.pools`) and of the serving rules that size, select and validate
them (:mod:`kvcheck.reference.serving`). No code is shared with what they check.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> ReferencePool(PoolSpec(family="mla", size=4, page_size=2, layer_num=1,
    ...                        dtype="bfloat16")).spec.family
    'mla'
"""

from kvcheck.reference.pools import (
    ReferencePool,
    expected_buffer_bytes,
    expected_compress_tail_buf_infos,
    expected_kv_size_bytes,
    expected_mem_usage,
    expected_num_index_pages,
    expected_scale_buf_infos,
    expected_state_buf_infos,
    fp8_e4m3fn_byte,
    index_k_row_bytes,
    index_scale_row_bytes,
    reference_scaled_latent_row,
)
from kvcheck.reference.serving import (
    FP4_KV_CACHE_DTYPES,
    HISPARSE_INDEX_RATIO,
    PREFILL_ONLY_FLAG_DEFAULTS,
    PREFILL_ONLY_RULES,
    QUANTIZED_KV_DTYPES,
    SCALED_DSA_DTYPE,
    PrefillOnlyRule,
    reference_cell_size_bytes,
    reference_first_violation,
    reference_max_total_num_tokens,
    reference_pool_bytes,
    reference_pool_family,
    reference_skip_mask,
    reference_skips_topk,
    reference_unsupported_family,
    reference_violations,
)

__all__ = [
    "FP4_KV_CACHE_DTYPES",
    "HISPARSE_INDEX_RATIO",
    "PREFILL_ONLY_FLAG_DEFAULTS",
    "PREFILL_ONLY_RULES",
    "QUANTIZED_KV_DTYPES",
    "SCALED_DSA_DTYPE",
    "PrefillOnlyRule",
    "ReferencePool",
    "expected_buffer_bytes",
    "expected_compress_tail_buf_infos",
    "expected_kv_size_bytes",
    "expected_mem_usage",
    "expected_num_index_pages",
    "expected_scale_buf_infos",
    "expected_state_buf_infos",
    "fp8_e4m3fn_byte",
    "index_k_row_bytes",
    "index_scale_row_bytes",
    "reference_cell_size_bytes",
    "reference_first_violation",
    "reference_max_total_num_tokens",
    "reference_pool_bytes",
    "reference_pool_family",
    "reference_scaled_latent_row",
    "reference_skip_mask",
    "reference_skips_topk",
    "reference_unsupported_family",
    "reference_violations",
]
