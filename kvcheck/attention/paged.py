"""Attention through a paged KV pool: write K/V by page, gather them back, attend.

This is the path the no-op pool lets embedding prefill skip. Sequence ``s``'s token
``t`` lives at slot ``page_table[s, t // page_size] * page_size + t % page_size`` of
every layer's buffers, like SGLang's ``req_to_token`` mapping and flash-attn's
``block_table``. The pool is any object with SGLang's MHA pool API
(``set_kv_buffer``, ``get_key_buffer``, ``get_value_buffer``, ``get_kv_buffer``,
``page_size``), written and read with global layer ids; its buffers are reached only
through those read calls, never through attributes, so a pool whose read API is wrong
gives wrong attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from kvcheck.attention._arguments import AttentionOptions, check_option_names, segment_bounds
from kvcheck.attention.varlen import Backend, varlen_attention
from kvcheck.validation import check_valid_integer

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; never evaluated at run time
    from typing import Unpack

ReadApi = Literal["split", "kv"]
#: How K/V are read back: ``"split"`` with ``get_key_buffer`` and ``get_value_buffer``,
#: ``"kv"`` with ``get_kv_buffer`` (the pair at once); values name the calls.
READ_APIS: dict[str, str] = {
    "split": "get_key_buffer/get_value_buffer",
    "kv": "get_kv_buffer",
}


@dataclass(frozen=True)
class LayerRef:
    """The smallest "layer" ``set_kv_buffer`` accepts: it reads only ``layer_id``."""

    layer_id: int


def token_slots(
    page_table: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    page_size: int,
    num_slots: int | None = None,
) -> torch.Tensor:
    """Slot of every packed token (int64, on ``page_table``'s device), sequences in order.

    ``page_table`` is an int32 ``[num_seqs, max_pages]`` block table; entries past what a
    sequence needs are ignored. With ``num_slots`` (rows in the pool's buffers) every
    page a token uses must lie inside the buffers. Bad input raises ``ValueError``.

    Example:
        >>> table = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)
        >>> cu = torch.tensor([0, 3, 4], dtype=torch.int32)
        >>> token_slots(table, cu, page_size=2).tolist()
        [6, 7, 2, 4]
    """
    check_valid_integer(page_size, "page_size", min_value=1, error=ValueError)
    if not isinstance(page_table, torch.Tensor) or page_table.dtype != torch.int32:
        got = page_table.dtype if isinstance(page_table, torch.Tensor) else type(page_table)
        raise ValueError(f"page_table must be an int32 tensor, got {got}")
    if page_table.dim() != 2:
        raise ValueError(
            f"page_table.shape={tuple(page_table.shape)} must be [num_seqs, max_pages]"
        )
    total = int(cu_seqlens[-1]) if isinstance(cu_seqlens, torch.Tensor) else 0
    bounds = segment_bounds(
        cu_seqlens, name="cu_seqlens", num_tokens=total, tokens_name="cu_seqlens[-1]"
    )
    if page_table.shape[0] != len(bounds):
        raise ValueError(
            f"page_table.shape[0]={page_table.shape[0]} != {len(bounds)} sequences in cu_seqlens"
        )
    num_pages_in_pool = None if num_slots is None else num_slots // page_size
    offsets_in_page = torch.arange(page_size, device=page_table.device)
    per_sequence = []
    for s, (start, end) in enumerate(bounds):
        length = end - start
        pages_needed = -(-length // page_size)
        if pages_needed > page_table.shape[1]:
            raise ValueError(
                f"sequence {s} has {length} tokens and needs {pages_needed} pages at "
                f"page_size={page_size}, but page_table.shape[1]={page_table.shape[1]}"
            )
        pages = page_table[s, :pages_needed].to(torch.int64)
        if pages_needed and num_pages_in_pool is not None:
            low, high = int(pages.min()), int(pages.max())
            if low < 0 or high >= num_pages_in_pool:
                raise ValueError(
                    f"page_table[{s}] uses pages {pages.tolist()}, outside the pool's "
                    f"[0, {num_pages_in_pool}) pages"
                )
        slots = (pages[:, None] * page_size + offsets_in_page[None, :]).reshape(-1)
        per_sequence.append(slots[:length])
    if not per_sequence:
        return torch.zeros(0, dtype=torch.int64, device=page_table.device)
    return torch.cat(per_sequence)


def _check_pool(pool: Any, *, needs: tuple[str, ...] = ()) -> int:
    for attribute in ("page_size", "set_kv_buffer", "get_key_buffer", "get_value_buffer", *needs):
        if not hasattr(pool, attribute):
            raise ValueError(
                f"pool={type(pool).__name__} has no {attribute!r}; an MHA pool is needed"
            )
    return int(pool.page_size)


def write_kv_by_page(
    pool: Any,
    *,
    layer_id: int,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    page_table: torch.Tensor,
) -> torch.Tensor:
    """Store every token's K/V in ``pool`` layer ``layer_id`` at its paged slot.

    One ``set_kv_buffer`` call, as a prefill forward makes. Returns the slots written.
    The pool validates ``k``/``v`` against its own shapes and dtype.

    Example:
        >>> from kvcheck.attention.batch import VarlenBatch, scrambled_layout
        >>> from kvcheck.properties.attention import paged_case
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> case = paged_case(batch, scrambled_layout((3, 2), page_size=2),
        ...                   dtype=torch.float32, device="cpu")
        >>> slots = write_kv_by_page(case.pool, layer_id=0, k=case.k, v=case.v,
        ...                          cu_seqlens=case.cu_seqlens, page_table=case.page_table)
        >>> slots.tolist() == list(scrambled_layout((3, 2), page_size=2).token_slots((3, 2)))
        True
    """
    page_size = _check_pool(pool)
    # Bound pages by the pool's capacity, not its buffers: a no-op pool keeps one
    # placeholder page yet must get the write, so that it can refuse it.
    num_slots = int(pool.size) + page_size if hasattr(pool, "size") else None
    slots = token_slots(page_table, cu_seqlens, page_size=page_size, num_slots=num_slots)
    if isinstance(k, torch.Tensor) and k.shape[0] != slots.numel():
        raise ValueError(f"k.shape[0]={k.shape[0]} != {slots.numel()} tokens in cu_seqlens")
    pool.set_kv_buffer(LayerRef(layer_id), slots, k, v)
    return slots


def gather_kv_by_page(
    pool: Any,
    *,
    layer_id: int,
    cu_seqlens: torch.Tensor,
    page_table: torch.Tensor,
    read: ReadApi = "split",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read every token's K and V back from ``pool`` layer ``layer_id``, packed in order.

    ``read`` picks the pool's read API (:data:`READ_APIS`): ``"split"`` calls
    ``get_key_buffer`` and ``get_value_buffer``, ``"kv"`` calls ``get_kv_buffer``.

    Example:
        >>> from kvcheck.attention.batch import VarlenBatch, scrambled_layout
        >>> from kvcheck.properties.attention import paged_case
        >>> batch = VarlenBatch(seq_lens=(1, 4), num_heads=1, num_kv_heads=1, head_dim=2)
        >>> case = paged_case(batch, scrambled_layout((1, 4), page_size=4, spare_pages=2),
        ...                   dtype=torch.bfloat16, device="cpu")
        >>> pages = {"cu_seqlens": case.cu_seqlens, "page_table": case.page_table}
        >>> _ = write_kv_by_page(case.pool, layer_id=0, k=case.k, v=case.v, **pages)
        >>> got_k, got_v = gather_kv_by_page(case.pool, layer_id=0, read="kv", **pages)
        >>> torch.equal(got_k, case.k) and torch.equal(got_v, case.v)
        True
    """
    if read not in READ_APIS:
        raise ValueError(f"read={read!r} must be one of {tuple(READ_APIS)}")
    if read == "kv":
        page_size = _check_pool(pool, needs=("get_kv_buffer",))
        key_buffer, value_buffer = pool.get_kv_buffer(layer_id)
    else:
        page_size = _check_pool(pool)
        key_buffer = pool.get_key_buffer(layer_id)
        value_buffer = pool.get_value_buffer(layer_id)
    slots = token_slots(
        page_table, cu_seqlens, page_size=page_size, num_slots=key_buffer.shape[0]
    ).to(key_buffer.device)
    return key_buffer[slots], value_buffer[slots]


def paged_attention(
    q: torch.Tensor,
    pool: Any,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    layer_id: int,
    page_table: torch.Tensor,
    backend: Backend = "auto",
    read: ReadApi = "split",
    **options: Unpack[AttentionOptions],
) -> torch.Tensor:
    """Attention of ``q`` over K/V read back from ``pool`` through ``page_table``.

    Same semantics, validation and ``options`` (:class:`~kvcheck.attention.AttentionOptions`:
    ``causal``, ``softmax_scale``, ``window``, ``softcap``) as ``varlen_attention``; the
    keys of sequence ``s`` are its ``cu_seqlens`` tokens, read from layer ``layer_id`` by
    page with the read API ``read`` names (see :func:`gather_kv_by_page`).

    Example:
        >>> from kvcheck.attention.batch import VarlenBatch, scrambled_layout
        >>> from kvcheck.properties.attention import paged_case
        >>> batch = VarlenBatch(seq_lens=(2,), num_heads=4, num_kv_heads=2, head_dim=8)
        >>> case = paged_case(batch, scrambled_layout((2,), page_size=1),
        ...                   dtype=torch.float32, device="cpu")
        >>> table = case.page_table
        >>> _ = write_kv_by_page(case.pool, layer_id=1, k=case.k, v=case.v,
        ...                      cu_seqlens=case.cu_seqlens, page_table=table)
        >>> out = paged_attention(case.q, case.pool, case.cu_seqlens, 2, layer_id=1,
        ...                       page_table=table, causal=True)
        >>> tuple(out.shape)
        (2, 4, 8)
    """
    check_option_names("paged_attention", options, AttentionOptions)
    k, v = gather_kv_by_page(
        pool, layer_id=layer_id, cu_seqlens=cu_seqlens, page_table=page_table, read=read
    )
    return varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend=backend, **options)
