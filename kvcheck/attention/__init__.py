"""Varlen attention on raw K/V and through a paged pool: the no-op pool's premise.

Embedding prefill with ``--prefill-only-disable-kv-cache`` never writes the KV cache: it
attends over the forward's raw K/V with ``flash_attn_varlen_func``. That is safe only if
raw-K/V attention equals attention read back from the paged cache. This package holds
both paths and the checks that compare them:

* ``varlen_attention``: flash-attn when installed and able (CUDA, fp16/bf16), else the
  torch reference with the same semantics (``reference_varlen_attention``); every entry
  point takes flash-attn's keyword options (``AttentionOptions``, ``VarlenOptions``),
  validated in one place;
* ``paged_attention`` / ``write_kv_by_page``: K/V through an MHA pool by page table,
  written with ``set_kv_buffer`` and read back only through the pool's read API
  (``get_key_buffer``/``get_value_buffer`` or ``get_kv_buffer``, see ``READ_APIS``);
* ``prefill_attention``: one layer's prefill as SGLang's FA backend runs it;
* ``append_padding_segment``: the CUDA-graph padding fix;
* ``kvcheck.properties.attention``: the reusable checks, which take their pools from a
  target (``make_pool``, ``select_pool_family``) and raise ``PropertyFailure``; the
  shipped suite runs them on any target (``kvcheck/suite/test_attention.py``);
  ``kvcheck.strategies.attention``: Hypothesis strategies for varlen batches.

Example:
    >>> import torch
    >>> q = torch.randn(4, 2, 8); kv = torch.randn(4, 1, 8)
    >>> cu = torch.tensor([0, 1, 4], dtype=torch.int32)
    >>> varlen_attention(q, kv, kv, cu, 3, causal=True).shape
    torch.Size([4, 2, 8])
"""

from kvcheck.attention._arguments import AttentionOptions, VarlenOptions
from kvcheck.attention.batch import PagedLayout, VarlenBatch, scrambled_layout
from kvcheck.attention.flash import (
    flash_attn_available,
    flash_attn_version,
    flash_unsupported_reason,
    flash_varlen_attention,
)
from kvcheck.attention.padding import append_padding_segment
from kvcheck.attention.paged import (
    READ_APIS,
    LayerRef,
    gather_kv_by_page,
    paged_attention,
    token_slots,
    write_kv_by_page,
)
from kvcheck.attention.prefill import prefill_attention, uses_raw_kv
from kvcheck.attention.reference import attention_mask, reference_varlen_attention
from kvcheck.attention.tolerances import TOLERANCES, Tolerance, assert_outputs_close, tolerance
from kvcheck.attention.varlen import BACKENDS, resolve_backend, varlen_attention

__all__ = [
    "BACKENDS",
    "READ_APIS",
    "TOLERANCES",
    "AttentionOptions",
    "LayerRef",
    "PagedLayout",
    "Tolerance",
    "VarlenBatch",
    "VarlenOptions",
    "append_padding_segment",
    "assert_outputs_close",
    "attention_mask",
    "flash_attn_available",
    "flash_attn_version",
    "flash_unsupported_reason",
    "flash_varlen_attention",
    "gather_kv_by_page",
    "paged_attention",
    "prefill_attention",
    "reference_varlen_attention",
    "resolve_backend",
    "scrambled_layout",
    "token_slots",
    "tolerance",
    "uses_raw_kv",
    "varlen_attention",
    "write_kv_by_page",
]
