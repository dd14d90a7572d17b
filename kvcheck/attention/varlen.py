"""``varlen_attention``: one entry point that picks flash-attn or the torch reference.

``backend="auto"`` uses flash-attn when it is installed and can serve the call (CUDA,
fp16/bf16, supported head dims) and the torch reference otherwise, so the same property
runs everywhere and uses the production kernel where one exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

from kvcheck.attention._arguments import check_varlen_call
from kvcheck.attention.flash import attend_flash, flash_unsupported_reason
from kvcheck.attention.reference import attend_varlen

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; never evaluated at run time
    from typing import Unpack

    from kvcheck.attention._arguments import VarlenOptions

Backend = Literal["auto", "torch", "flash"]
BACKENDS: tuple[Backend, ...] = ("auto", "torch", "flash")


def resolve_backend(backend: str, *, q: torch.Tensor, v: torch.Tensor) -> Literal["torch", "flash"]:
    """The backend that will serve a call: ``"torch"`` or ``"flash"``.

    ``"auto"`` picks flash-attn when it can serve ``q``/``v`` and torch otherwise;
    ``"torch"`` and ``"flash"`` are returned as asked (``flash_varlen_attention`` then
    says why flash-attn cannot serve a call).

    Example:
        >>> resolve_backend("auto", q=torch.zeros(1, 1, 8), v=torch.zeros(1, 1, 8))
        'torch'
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
    if backend == "torch" or backend == "flash":
        return backend
    reason = flash_unsupported_reason(
        device_type=q.device.type, dtype=q.dtype, head_dim=q.shape[-1], v_head_dim=v.shape[-1]
    )
    return "flash" if reason is None else "torch"


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    backend: Backend = "auto",
    **options: Unpack[VarlenOptions],
) -> torch.Tensor:
    """Varlen attention on raw K/V with ``flash_attn_varlen_func``'s semantics.

    q ``[total, H, d]``, k ``[total, Hkv, d]``, v ``[total, Hkv, dv]``; int32
    ``cu_seqlens`` shared by q and k unless ``cu_seqlens_k`` is given. ``options`` are
    flash-attn's keyword-only ``causal`` (required), ``softmax_scale``, ``window``,
    ``softcap``, ``cu_seqlens_k`` and ``max_seqlen_k``
    (:class:`~kvcheck.attention.VarlenOptions`). See ``kvcheck.attention.reference``
    for the exact semantics (bottom-right causal mask, windows with -1 unbounded,
    softcap, GQA grouping, default scale ``1/sqrt(d)``). Returns ``[total, H, dv]`` in
    q's dtype. Bad input raises ``ValueError`` naming the argument, whichever backend
    serves the call: it is validated once, before either sees it.

    Example:
        >>> q = torch.randn(4, 2, 8); kv = torch.randn(4, 1, 8)
        >>> cu = torch.tensor([0, 1, 4], dtype=torch.int32)
        >>> varlen_attention(q, kv, kv, cu, 3, causal=True).shape
        torch.Size([4, 2, 8])
    """
    call = check_varlen_call(q, k, v, cu_seqlens, max_seqlen, **options)
    if resolve_backend(backend, q=q, v=v) == "flash":
        return attend_flash(q, k, v, call)
    return attend_varlen(q, k, v, call)
