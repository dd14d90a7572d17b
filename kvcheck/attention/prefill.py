"""One layer's prefill attention as SGLang's flash-attention backend runs it.

With ``fa_skip_kv_cache`` (embedding mode, unchunked prefill, no radix cache, MHA) the
backend neither writes nor reads the KV cache: it attends over the raw K/V of the
forward. That is what makes ``NoOpMHATokenToKVPool`` safe. Otherwise it writes K/V into
the pool and attends over what it reads back by page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvcheck.attention._arguments import AttentionOptions, check_option_names
from kvcheck.attention.paged import paged_attention, write_kv_by_page
from kvcheck.attention.varlen import Backend, varlen_attention
from kvcheck.validation import check_bool

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; never evaluated at run time
    from typing import Unpack


def uses_raw_kv(server_args: Any, model: Any) -> bool:
    """Whether the FA backend takes the raw-K/V (``fa_skip_kv_cache``) path.

    True for embedding mode with ``chunked_prefill_size == -1`` and the radix cache
    disabled, on a non-MLA model; read with ``getattr`` so any object with SGLang's field
    names works.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> uses_raw_kv(NS(is_embedding=True, chunked_prefill_size=-1,
        ...                disable_radix_cache=True), NS(attention_arch="mha"))
        True
    """
    return (
        bool(getattr(server_args, "is_embedding", False))
        and getattr(server_args, "chunked_prefill_size", None) == -1
        and bool(getattr(server_args, "disable_radix_cache", False))
        and getattr(model, "attention_arch", "mha") == "mha"
    )


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    pool: Any,
    layer_id: int,
    page_table: torch.Tensor,
    skip_kv_cache: bool,
    backend: Backend = "auto",
    **options: Unpack[AttentionOptions],
) -> torch.Tensor:
    """One layer's prefill attention: raw K/V when ``skip_kv_cache``, else through ``pool``.

    ``skip_kv_cache=False`` writes K/V with ``set_kv_buffer`` (a no-op pool refuses with
    ``RuntimeError``) and attends over the tokens read back through ``page_table``.
    ``options`` are ``paged_attention``'s (:class:`~kvcheck.attention.AttentionOptions`).

    Example:
        >>> from kvcheck.attention.batch import VarlenBatch, scrambled_layout
        >>> from kvcheck.properties.attention import paged_case
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> case = paged_case(batch, scrambled_layout((3, 2), page_size=2),
        ...                   dtype=torch.float32, device="cpu")
        >>> args = (case.q, case.k, case.v, case.cu_seqlens, batch.max_seqlen)
        >>> options = {"pool": case.pool, "layer_id": 0, "page_table": case.page_table}
        >>> raw = prefill_attention(*args, **options, skip_kv_cache=True, causal=True)
        >>> cached = prefill_attention(*args, **options, skip_kv_cache=False, causal=True)
        >>> torch.equal(raw, cached)
        True
    """
    check_option_names("prefill_attention", options, AttentionOptions)
    check_bool(skip_kv_cache, "skip_kv_cache", error=ValueError)
    if skip_kv_cache:
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend=backend, **options)
    write_kv_by_page(
        pool, layer_id=layer_id, k=k, v=v, cu_seqlens=cu_seqlens, page_table=page_table
    )
    return paged_attention(
        q,
        pool,
        cu_seqlens,
        max_seqlen,
        layer_id=layer_id,
        page_table=page_table,
        backend=backend,
        **options,
    )
