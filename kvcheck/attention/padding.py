"""Padding a varlen batch the way a captured CUDA-graph bucket does.

A piecewise CUDA graph is captured for a fixed token count, so a smaller batch is padded
up to that bucket. ``flash_attn_varlen_func`` reads exactly ``cu_seqlens[-1]`` rows;
rows beyond it would share a boundary block with the last real sequence and corrupt it.
The fix SGLang applies (``fa_skip_kv_cache``) is to give the padded tail a segment of its
own, which attends only to itself.
"""

from __future__ import annotations

import torch

from kvcheck.attention._arguments import segment_bounds
from kvcheck.validation import check_valid_integer


def append_padding_segment(
    cu_seqlens: torch.Tensor, max_seqlen: int, *, num_tokens: int
) -> tuple[torch.Tensor, int]:
    """Extend ``cu_seqlens`` so rows ``cu_seqlens[-1]:num_tokens`` form their own segment.

    Returns ``(cu_seqlens, max_seqlen)`` for the padded batch: unchanged when there is
    no padding; otherwise one more offset (``num_tokens``) and ``max_seqlen`` raised to
    the padding length if that is longer. ``num_tokens`` below ``cu_seqlens[-1]`` is a
    ``ValueError``.

    Example:
        >>> cu, m = append_padding_segment(torch.tensor([0, 3, 5], dtype=torch.int32), 3,
        ...                                num_tokens=9)
        >>> cu.tolist(), m
        ([0, 3, 5, 9], 4)
    """
    bounds = segment_bounds(
        cu_seqlens,
        name="cu_seqlens",
        num_tokens=int(cu_seqlens[-1]) if isinstance(cu_seqlens, torch.Tensor) else 0,
        tokens_name="cu_seqlens[-1]",
    )
    check_valid_integer(max_seqlen, "max_seqlen", min_value=0, error=ValueError)
    check_valid_integer(num_tokens, "num_tokens", error=ValueError)
    num_real = bounds[-1][1] if bounds else 0
    if num_tokens < num_real:
        raise ValueError(
            f"num_tokens={num_tokens} < cu_seqlens[-1]={num_real}: a bucket cannot hold "
            "fewer rows than the real tokens"
        )
    if num_tokens == num_real:
        return cu_seqlens, max_seqlen
    padded = torch.cat([cu_seqlens, cu_seqlens.new_tensor([num_tokens])])
    return padded, max(max_seqlen, num_tokens - num_real)
