"""Varlen attention in plain torch, with flash-attn's ``flash_attn_varlen_func`` semantics.

Written to be obviously right rather than fast: one sequence at a time, explicit masks,
fp32 arithmetic. The semantics follow flash-attn's documentation:

* tokens of all sequences are packed along dim 0; ``cu_seqlens`` holds the offsets;
* GQA: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``;
* scores are ``softmax_scale * q.k`` (default ``1 / sqrt(head_dim)``), then, when
  ``softcap > 0``, ``softcap * tanh(scores / softcap)``, then masked;
* the causal mask is aligned to the bottom-right corner: query ``i`` of a sequence with
  ``seqlen_q`` queries and ``seqlen_k`` keys may read key ``j`` iff
  ``j <= i + seqlen_k - seqlen_q``;
* ``window=(left, right)`` keeps keys in
  ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]``; -1 is unbounded
  on that side; ``causal=True`` sets ``right`` to 0;
* a query row with no key left to read outputs zeros;
* output dtype is q's dtype; accumulation is fp32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvcheck.attention._arguments import VarlenCall, check_varlen_call

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; never evaluated at run time
    from typing import Unpack

    from kvcheck.attention._arguments import VarlenOptions


def attention_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Boolean ``[seqlen_q, seqlen_k]`` mask, True where the query may read the key.

    Example (flash-attn's documented causal example, seqlen_q=2, seqlen_k=5):
        >>> attention_mask(2, 5, causal=True).int().tolist()
        [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    """
    if seqlen_q < 0 or seqlen_k < 0:
        raise ValueError(f"seqlen_q={seqlen_q}, seqlen_k={seqlen_k} must be >= 0")
    left, right = window
    if causal:
        right = 0
    # Row i's diagonal sits at key i + (seqlen_k - seqlen_q): the bottom-right alignment.
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    keys = torch.arange(seqlen_k, device=device)[None, :]
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= keys >= diagonal - left
    if right >= 0:
        allowed &= keys <= diagonal + right
    return allowed


def attend_one_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    window: tuple[int, int],
    softcap: float,
) -> torch.Tensor:
    """Attention for one sequence: q ``[n, H, d]``, k ``[m, Hkv, d]``, v ``[m, Hkv, dv]``.

    Arguments are assumed valid (``reference_varlen_attention`` checks them). Returns
    ``[n, H, dv]`` in fp32.

    Example:
        >>> q = torch.ones(1, 2, 4); kv = torch.ones(3, 1, 4)
        >>> attend_one_sequence(q, kv, kv, causal=True, softmax_scale=0.5,
        ...                     window=(-1, -1), softcap=0.0).shape
        torch.Size([1, 2, 4])
    """
    group_size = q.shape[1] // k.shape[1]
    # Fresh fp32 copies: the result then does not depend on where the caller's slice
    # lived in memory, so two paths that hold equal values agree bit for bit.
    qf = q.to(torch.float32, copy=True)
    kf = k.to(torch.float32).repeat_interleave(group_size, dim=1)
    vf = v.to(torch.float32).repeat_interleave(group_size, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qf, kf) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = attention_mask(q.shape[0], k.shape[0], causal=causal, window=window, device=q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # A row that may read no key is all -inf, which softmax turns into NaN; flash-attn
    # defines its output as zero. Masking by row keeps NaNs that come from the inputs.
    probs = probs.masked_fill(~allowed.any(dim=-1)[None, :, None], 0.0)
    return torch.einsum("hqk,khd->qhd", probs, vf)


def reference_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    **options: Unpack[VarlenOptions],
) -> torch.Tensor:
    """Varlen attention in plain torch (see the module docstring for the semantics).

    q ``[total_q, H, d]``, k ``[total_k, Hkv, d]``, v ``[total_k, Hkv, dv]``; int32
    ``cu_seqlens`` (``cu_seqlens_k`` defaults to it). ``options`` are flash-attn's
    keyword-only ``causal`` (required), ``softmax_scale``, ``window``, ``softcap``,
    ``cu_seqlens_k`` and ``max_seqlen_k`` (:class:`~kvcheck.attention.VarlenOptions`).
    Returns ``[total_q, H, dv]`` in q's dtype. Bad input raises ``ValueError`` naming
    the argument.

    Example:
        >>> q = torch.randn(5, 4, 8); k = torch.randn(5, 2, 8); v = torch.randn(5, 2, 8)
        >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        >>> reference_varlen_attention(q, k, v, cu, 3, causal=True).shape
        torch.Size([5, 4, 8])
    """
    return attend_varlen(q, k, v, check_varlen_call(q, k, v, cu_seqlens, max_seqlen, **options))


def attend_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: VarlenCall
) -> torch.Tensor:
    """The torch reference on a call :func:`check_varlen_call` has validated.

    Example:
        >>> q = torch.randn(3, 2, 8); kv = torch.randn(3, 1, 8)
        >>> cu = torch.tensor([0, 3], dtype=torch.int32)
        >>> attend_varlen(q, kv, kv, check_varlen_call(q, kv, kv, cu, 3, causal=False)).shape
        torch.Size([3, 2, 8])
    """
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    for (q_start, q_end), (k_start, k_end) in zip(call.q_bounds, call.k_bounds, strict=True):
        if q_end == q_start:
            continue
        out[q_start:q_end] = attend_one_sequence(
            q[q_start:q_end],
            k[k_start:k_end],
            v[k_start:k_end],
            causal=call.causal,
            softmax_scale=call.softmax_scale,
            window=call.window,
            softcap=call.softcap,
        ).to(q.dtype)
    return out
