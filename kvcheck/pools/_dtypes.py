"""Which dtypes a pool accepts, and how each is stored.

fp8 pools keep their bytes in ``uint8`` tensors (as SGLang does: ``index_put`` is not
implemented for every fp8 dtype) and hand out ``.view(fp8)`` to readers. Everything a
pool copies is copied on the storage tensor, so every copy is byte-exact.

Example:
    >>> import torch
    >>> storage_dtype(torch.float8_e4m3fn)
    torch.uint8
    >>> storage_dtype(torch.bfloat16)
    torch.bfloat16
"""

from __future__ import annotations

import torch

#: Cache dtypes every pool family accepts.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
FP8_DTYPES: frozenset[torch.dtype] = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


def check_pool_dtype(dtype: object) -> torch.dtype:
    """Return ``dtype`` if a pool can hold it, else raise ``ValueError`` naming the choices.

    Example:
        >>> check_pool_dtype(torch.float16)
        torch.float16
    """
    if not isinstance(dtype, torch.dtype) or dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {allowed}")
    return dtype


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a pool's tensors are allocated with: ``uint8`` for fp8, else ``dtype``."""
    return torch.uint8 if dtype in FP8_DTYPES else dtype


def payload_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """Dtypes a caller may write into a pool of ``dtype``: the dtype, or raw ``uint8`` for fp8.

    Example:
        >>> payload_dtypes(torch.float8_e5m2)
        (torch.float8_e5m2, torch.uint8)
    """
    return (dtype, torch.uint8) if dtype in FP8_DTYPES else (dtype,)


def as_storage(tensor: torch.Tensor, store_dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret an already-validated payload as the pool's storage dtype (no copy)."""
    return tensor if tensor.dtype == store_dtype else tensor.view(store_dtype)
