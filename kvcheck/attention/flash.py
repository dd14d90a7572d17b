"""The flash-attn backend, behind the same signature as the torch reference.

flash-attn is an optional extra (``pip install kvcheck[flash-attn]``): it is imported
lazily, on first use, and only ``flash_attn_available()`` ever asks for it otherwise.
Tests on CPU pass a fake ``flash_fn`` to check what this module hands to the kernel.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kvcheck.attention._arguments import VarlenCall, check_varlen_call

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; never evaluated at run time
    from typing import Unpack

    from kvcheck.attention._arguments import VarlenOptions

#: dtypes flash-attn's kernels accept.
FLASH_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
#: the largest head dim flash-attn 2 compiles kernels for.
FLASH_MAX_HEAD_DIM = 256

FlashVarlenFn = Callable[..., Any]


@functools.cache
def _load_flash_varlen_func() -> tuple[FlashVarlenFn | None, str]:
    """Import flash-attn once; return ``(flash_attn_varlen_func, "")`` or ``(None, why)``."""
    try:
        module = importlib.import_module("flash_attn")
    except Exception as exc:  # an installed but broken CUDA build raises more than ImportError
        return None, f"flash-attn is not importable ({type(exc).__name__}: {exc})"
    func = getattr(module, "flash_attn_varlen_func", None)
    if func is None:
        return None, "the installed flash_attn has no flash_attn_varlen_func"
    return func, ""


def flash_attn_available() -> bool:
    """Whether flash-attn is installed and importable (the import is done once, lazily).

    Example:
        >>> isinstance(flash_attn_available(), bool)
        True
    """
    return _load_flash_varlen_func()[0] is not None


def flash_attn_version() -> str | None:
    """The installed flash-attn's version, or None when it is not importable.

    Example:
        >>> flash_attn_version() is None or isinstance(flash_attn_version(), str)
        True
    """
    if not flash_attn_available():
        return None
    return str(getattr(importlib.import_module("flash_attn"), "__version__", "unknown"))


def flash_unsupported_reason(
    *,
    device_type: str,
    dtype: torch.dtype,
    head_dim: int,
    v_head_dim: int,
    installed: bool | None = None,
) -> str | None:
    """Why flash-attn cannot serve a call with these properties, or None when it can.

    ``installed=None`` asks ``flash_attn_available()``; tests pass a bool to check the
    decision without a GPU.

    Example:
        >>> flash_unsupported_reason(device_type="cpu", dtype=torch.float16, head_dim=64,
        ...                          v_head_dim=64, installed=True)
        "flash-attn needs CUDA tensors, got device type 'cpu'"
    """
    if installed is None:
        installed = flash_attn_available()
    if not installed:
        return "flash-attn is not installed (pip install 'kvcheck[flash-attn]')"
    if device_type != "cuda":
        return f"flash-attn needs CUDA tensors, got device type {device_type!r}"
    if dtype not in FLASH_DTYPES:
        return f"flash-attn needs float16 or bfloat16, got {dtype}"
    if head_dim > FLASH_MAX_HEAD_DIM:
        return f"flash-attn supports head_dim <= {FLASH_MAX_HEAD_DIM}, got {head_dim}"
    if v_head_dim != head_dim:
        return f"flash-attn 2 needs v_head_dim == head_dim, got {v_head_dim} != {head_dim}"
    return None


def flash_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    flash_fn: FlashVarlenFn | None = None,
    **options: Unpack[VarlenOptions],
) -> torch.Tensor:
    """Varlen attention through ``flash_attn_varlen_func``, validated like the reference.

    Takes the reference's arguments and options
    (:func:`~kvcheck.attention.reference_varlen_attention`). ``flash_fn=None`` uses the
    installed flash-attn and requires CUDA fp16/bf16 tensors with
    ``v_head_dim == head_dim <= 256`` (else ``ValueError`` saying why). Any other
    ``flash_fn`` is called with flash-attn's keyword names, whatever the device: tests
    inject a fake to check the plumbing on CPU. The softmax scale is resolved here
    (``1/sqrt(head_dim)`` by default) so both backends use the same number.

    Example:
        >>> def fake(q, k, v, **kw): return torch.zeros_like(q)
        >>> q = torch.randn(3, 2, 8); kv = torch.randn(3, 1, 8)
        >>> cu = torch.tensor([0, 3], dtype=torch.int32)
        >>> flash_varlen_attention(q, kv, kv, cu, 3, causal=True, flash_fn=fake).shape
        torch.Size([3, 2, 8])
    """
    call = check_varlen_call(q, k, v, cu_seqlens, max_seqlen, **options)
    return attend_flash(q, k, v, call, flash_fn=flash_fn)


def attend_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    call: VarlenCall,
    *,
    flash_fn: FlashVarlenFn | None = None,
) -> torch.Tensor:
    """flash-attn (or ``flash_fn``) on a call :func:`check_varlen_call` has validated.

    Example:
        >>> def fake(q, k, v, **kw): return torch.zeros_like(q)
        >>> q = torch.randn(3, 2, 8); kv = torch.randn(3, 1, 8)
        >>> call = check_varlen_call(q, kv, kv, torch.tensor([0, 3], dtype=torch.int32), 3,
        ...                          causal=True)
        >>> attend_flash(q, kv, kv, call, flash_fn=fake).shape
        torch.Size([3, 2, 8])
    """
    if flash_fn is None:
        reason = flash_unsupported_reason(
            device_type=q.device.type, dtype=q.dtype, head_dim=q.shape[2], v_head_dim=v.shape[2]
        )
        if reason is not None:
            raise ValueError(f"backend='flash' cannot serve this call: {reason}")
        flash_fn = _load_flash_varlen_func()[0]
        assert flash_fn is not None  # guaranteed by the reason check above
    result = flash_fn(
        q,
        k,
        v,
        cu_seqlens_q=call.cu_seqlens,
        cu_seqlens_k=call.cu_seqlens_k,
        max_seqlen_q=call.max_seqlen,
        max_seqlen_k=call.max_seqlen_k,
        softmax_scale=call.softmax_scale,
        causal=call.causal,
        window_size=call.window,
        softcap=call.softcap,
    )
    # Some flash-attn builds return (out, softmax_lse); the output always comes first.
    out = result[0] if isinstance(result, tuple | list) else result
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"flash_fn returned {type(out).__name__}, expected a torch.Tensor")
    return out
