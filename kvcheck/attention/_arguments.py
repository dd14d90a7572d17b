"""Argument validation shared by every varlen attention entry point.

Every backend (torch reference, flash-attn, paged) validates through here first, so
a bad call gets the same ``ValueError`` whichever backend would have served it, and
no backend ever sees offsets it could silently misread. The attention options' names
and types (:class:`AttentionOptions`, :class:`VarlenOptions`) and their defaults
(:func:`check_varlen_call`) live here too, once for every entry point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import torch

from kvcheck.validation import check_bool, check_valid_integer

if TYPE_CHECKING:  # typing.Required is Python 3.11+; never evaluated at run time
    from typing import Required

#: dtypes the attention paths accept for q, k and v (fp8 caches are not attended directly).
ATTENTION_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


class AttentionOptions(TypedDict, total=False):
    """The options every attention entry point takes, under flash-attn's keyword names.

    Entry points take them as ``**options: Unpack[AttentionOptions]``, so a type checker
    sees the same keyword-only parameters everywhere; ``causal`` is required and the
    defaults (``softmax_scale=None``: ``1/sqrt(head_dim)``, ``window=(-1, -1)``,
    ``softcap=0.0``) live in :func:`check_varlen_call` alone.

    Example:
        >>> options: AttentionOptions = {"causal": True, "window": (4, 0)}
        >>> sorted(AttentionOptions.__annotations__)
        ['causal', 'softcap', 'softmax_scale', 'window']
    """

    causal: Required[bool]
    softmax_scale: float | None
    window: tuple[int, int]
    softcap: float


class VarlenOptions(AttentionOptions, total=False):
    """:class:`AttentionOptions` and the keys' own offsets (cross-attention, query suffixes).

    ``cu_seqlens_k`` / ``max_seqlen_k`` default to the query's (self-attention).

    Example:
        >>> sorted(set(VarlenOptions.__annotations__) - set(AttentionOptions.__annotations__))
        ['cu_seqlens_k', 'max_seqlen_k']
    """

    cu_seqlens_k: torch.Tensor | None
    max_seqlen_k: int | None


def check_option_names(function: str, options: Mapping[str, object], allowed: type) -> None:
    """Raise ``TypeError``, as explicit keyword-only parameters would, on a missing
    ``causal`` or an option ``allowed`` (a TypedDict above) lacks.

    For entry points that forward ``**options`` to a callee that takes more of them, or
    that act (write a pool) before the callee would see them.

    Example:
        >>> check_option_names("paged_attention", {"causal": True}, AttentionOptions)
    """
    if "causal" not in options:  # Required[...] is not visible at run time
        raise TypeError(f"{function}() missing 1 required keyword-only argument: 'causal'")
    for name in options:
        if name not in allowed.__annotations__:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


@dataclass(frozen=True)
class VarlenCall:
    """A validated varlen call, with the segment bounds read once as Python ints."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    #: the keys' offsets and longest segment (the query's unless given)
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int
    q_bounds: tuple[tuple[int, int], ...]
    k_bounds: tuple[tuple[int, int], ...]
    softmax_scale: float
    window: tuple[int, int]
    softcap: float
    causal: bool
    #: query heads per KV head: query head h reads KV head h // group_size
    group_size: int


def _check_rank3(name: str, tensor: object, layout: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}={type(tensor).__name__} must be a torch.Tensor {layout}")
    if tensor.dim() != 3:
        raise ValueError(f"{name}.shape={tuple(tensor.shape)} must have 3 dimensions {layout}")
    return tensor


def segment_bounds(
    cu_seqlens: object, *, name: str, num_tokens: int, tokens_name: str
) -> tuple[tuple[int, int], ...]:
    """Validate cumulative sequence offsets and return each segment's ``(start, end)``.

    ``cu_seqlens`` must be a 1-D int32 tensor that starts at 0, never decreases and ends
    exactly at ``num_tokens`` (rows beyond the last offset would be read by no segment,
    which flash-attn does not check).

    Example:
        >>> segment_bounds(torch.tensor([0, 2, 5], dtype=torch.int32), name="cu_seqlens",
        ...                num_tokens=5, tokens_name="q.shape[0]")
        ((0, 2), (2, 5))
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"{name}={type(cu_seqlens).__name__} must be a torch.Tensor")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(
            f"{name}.dtype={cu_seqlens.dtype} must be torch.int32 "
            "(flash-attn's varlen kernels read 32-bit offsets)"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() == 0:
        raise ValueError(
            f"{name}.shape={tuple(cu_seqlens.shape)} must be 1-D with at least one entry "
            "([num_seqs + 1])"
        )
    offsets = [int(x) for x in cu_seqlens.tolist()]
    if offsets[0] != 0:
        raise ValueError(f"{name}[0]={offsets[0]} must be 0")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ValueError(
                f"{name} must be non-decreasing: {name}[{i}]={offsets[i]} < "
                f"{name}[{i - 1}]={offsets[i - 1]} (offsets={offsets})"
            )
    if offsets[-1] < num_tokens:
        raise ValueError(
            f"{name}[-1]={offsets[-1]} < {tokens_name}={num_tokens}: "
            f"{num_tokens - offsets[-1]} row(s) lie beyond the last sequence; append them "
            "as a segment of their own (kvcheck.attention.append_padding_segment) instead "
            "of leaving them uncovered"
        )
    if offsets[-1] > num_tokens:
        raise ValueError(
            f"{name}[-1]={offsets[-1]} > {tokens_name}={num_tokens}: the offsets describe "
            "more tokens than the tensor holds"
        )
    return tuple(itertools.pairwise(offsets))


def _segments(
    cu_name: str,
    cu_seqlens: object,
    max_name: str,
    max_seqlen: object,
    x: torch.Tensor,
    x_name: str,
) -> tuple[tuple[tuple[int, int], ...], int]:
    """Segment bounds of ``cu_seqlens`` over ``x``'s tokens, and the checked ``max_seqlen``."""
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device != x.device:
        # x is q or k, which were checked to share q's device.
        raise ValueError(f"{cu_name}.device={cu_seqlens.device} != q.device={x.device}")
    bounds = segment_bounds(
        cu_seqlens, name=cu_name, num_tokens=x.shape[0], tokens_name=f"{x_name}.shape[0]"
    )
    limit = check_valid_integer(max_seqlen, max_name, min_value=0, error=ValueError)
    longest = max((end - start for start, end in bounds), default=0)
    if longest > limit:
        raise ValueError(
            f"{max_name}={max_seqlen} < {longest}, the longest segment in {cu_name}; "
            "flash-attn would skip the rows beyond max_seqlen"
        )
    return bounds, limit


def check_softcap(softcap: object) -> float:
    """Validate a flash-attn ``softcap``: a finite float >= 0 (0.0 disables it).

    Example:
        >>> check_softcap(30)
        30.0
    """
    if isinstance(softcap, bool) or not isinstance(softcap, int | float):
        raise ValueError(f"softcap={softcap!r} must be a float (0.0 disables it)")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap={softcap!r} must be finite and >= 0 (0.0 disables it)")
    return float(softcap)


def check_window(window: object) -> tuple[int, int]:
    """Validate a flash-attn ``window_size``: two ints, each -1 (unbounded) or >= 0.

    Example:
        >>> check_window((4, -1))
        (4, -1)
    """
    if not isinstance(window, tuple | list) or len(window) != 2:
        raise ValueError(f"window={window!r} must be a pair (left, right)")
    left, right = window
    for side, value in (("left", left), ("right", right)):
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise ValueError(
                f"window={tuple(window)!r}: {side}={value!r} must be an int >= -1 "
                "(-1 means unbounded)"
            )
    return (left, right)


def check_varlen_call(
    q: object,
    k: object,
    v: object,
    cu_seqlens: object,
    max_seqlen: object,
    *,
    causal: object,
    softmax_scale: object = None,
    window: object = (-1, -1),
    softcap: object = 0.0,
    cu_seqlens_k: object = None,
    max_seqlen_k: object = None,
) -> VarlenCall:
    """Validate a varlen attention call; raise ``ValueError`` naming the bad argument.

    The one home of the options' defaults (:class:`VarlenOptions`): ``cu_seqlens_k`` /
    ``max_seqlen_k`` default to the query's (self-attention, as in embedding prefill).

    Example:
        >>> q = torch.zeros(3, 4, 8); kv = torch.zeros(3, 2, 8)
        >>> cu = torch.tensor([0, 1, 3], dtype=torch.int32)
        >>> call = check_varlen_call(q, kv, kv, cu, 2, causal=True)
        >>> call.q_bounds, call.group_size, call.window
        (((0, 1), (1, 3)), 2, (-1, -1))
    """
    q = _check_rank3("q", q, "([total_q, num_heads, head_dim])")
    k = _check_rank3("k", k, "([total_k, num_kv_heads, head_dim])")
    v = _check_rank3("v", v, "([total_k, num_kv_heads, v_head_dim])")
    if q.dtype not in ATTENTION_DTYPES:
        allowed = ", ".join(str(d) for d in ATTENTION_DTYPES)
        raise ValueError(f"q.dtype={q.dtype} is not supported; use one of {allowed}")
    for name, tensor in (("k", k), ("v", v)):
        if tensor.dtype != q.dtype:
            raise ValueError(f"{name}.dtype={tensor.dtype} != q.dtype={q.dtype}")
        if tensor.device != q.device:
            raise ValueError(f"{name}.device={tensor.device} != q.device={q.device}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"v.shape[0]={v.shape[0]} != k.shape[0]={k.shape[0]} (tokens)")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"v.shape[1]={v.shape[1]} != k.shape[1]={k.shape[1]} (KV heads)")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k.shape[2]={k.shape[2]} != q.shape[2]={q.shape[2]} (head_dim)")
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q.shape[1]={num_heads} query heads is not divisible by "
            f"k.shape[1]={num_kv_heads} KV heads (GQA groups query heads per KV head)"
        )

    q_bounds, max_q = _segments("cu_seqlens", cu_seqlens, "max_seqlen", max_seqlen, q, "q")
    if cu_seqlens_k is None:
        if max_seqlen_k is not None:
            raise ValueError(f"max_seqlen_k={max_seqlen_k!r} given without cu_seqlens_k")
        # Same offsets, so the same longest segment: only k's token count is new.
        k_bounds, _ = _segments("cu_seqlens", cu_seqlens, "max_seqlen", max_q, k, "k")
        cu_seqlens_k, max_k = cu_seqlens, max_q
    else:
        max_seqlen_k = max_q if max_seqlen_k is None else max_seqlen_k
        k_bounds, max_k = _segments(
            "cu_seqlens_k", cu_seqlens_k, "max_seqlen_k", max_seqlen_k, k, "k"
        )
        if len(k_bounds) != len(q_bounds):
            raise ValueError(
                f"cu_seqlens_k has {len(k_bounds)} segments but cu_seqlens has "
                f"{len(q_bounds)}; they must describe the same sequences"
            )
    assert isinstance(cu_seqlens, torch.Tensor) and isinstance(cu_seqlens_k, torch.Tensor)
    is_causal = check_bool(causal, "causal", error=ValueError)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    else:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, int | float):
            raise ValueError(f"softmax_scale={softmax_scale!r} must be a float or None")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale={softmax_scale!r} must be finite")
        scale = float(softmax_scale)
    return VarlenCall(
        cu_seqlens=cu_seqlens,
        max_seqlen=max_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_k=max_k,
        q_bounds=q_bounds,
        k_bounds=k_bounds,
        softmax_scale=scale,
        softcap=check_softcap(softcap),
        window=check_window(window),
        causal=is_causal,
        group_size=num_heads // num_kv_heads,
    )
