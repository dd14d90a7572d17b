"""Which dtypes a pool accepts, how each is stored, and how other payload dtypes convert.

fp8 pools keep their bytes in ``uint8`` tensors (as SGLang does: ``index_put`` is not
implemented for every fp8 dtype) and hand out ``.view(fp8)`` to readers. Everything a
pool copies is copied on the storage tensor, so every copy is byte-exact.

A write payload is either *native* (the pool's dtype, or raw ``uint8`` bytes for an fp8
pool: stored bit for bit) or in another supported floating dtype, which is converted value
by value as SGLang's ``set_kv_buffer`` does (see :func:`convert_payload`).

Example:
    >>> import torch
    >>> storage_dtype(torch.float8_e4m3fn)
    torch.uint8
    >>> storage_dtype(torch.bfloat16)
    torch.bfloat16
    >>> convert_payload(torch.tensor([3.0, 5.0]), torch.bfloat16, scale=2.0)
    tensor([1.5000, 2.5000], dtype=torch.bfloat16)
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
#: Packed FP4 (two e2m1 values a byte): only the quantized pools take it, stored as uint8.
FP4_DTYPE: torch.dtype = torch.float4_e2m1fn_x2
#: Payload dtypes the quantized pools encode (what attention layers hand them).
FLOAT_PAYLOAD_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


def check_pool_dtype(
    dtype: object, allowed: tuple[torch.dtype, ...] = SUPPORTED_DTYPES
) -> torch.dtype:
    """Return ``dtype`` if a pool can hold it (one of ``allowed``), else raise
    ``ValueError`` naming the choices.

    Example:
        >>> check_pool_dtype(torch.float16)
        torch.float16
    """
    if not isinstance(dtype, torch.dtype) or dtype not in allowed:
        allowed_names = ", ".join(str(d) for d in allowed)
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {allowed_names}")
    return dtype


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a pool's tensors are allocated with: ``uint8`` for fp8 and FP4, else ``dtype``."""
    return torch.uint8 if dtype in FP8_DTYPES or dtype == FP4_DTYPE else dtype


def payload_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """Dtypes a caller may write into a pool of ``dtype``: the dtype, or raw ``uint8`` for fp8.

    Example:
        >>> payload_dtypes(torch.float8_e5m2)
        (torch.float8_e5m2, torch.uint8)
    """
    return (dtype, torch.uint8) if dtype in FP8_DTYPES else (dtype,)


def is_native(tensor_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """True when a payload of ``tensor_dtype`` is stored bit for bit in a pool of ``dtype``."""
    return tensor_dtype in payload_dtypes(dtype)


def accepted_payload_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """Every dtype a write payload may have: the native ones, then the other supported
    floating dtypes (converted on write).

    Example:
        >>> accepted_payload_dtypes(torch.float16)
        (torch.float16, torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    """
    native = payload_dtypes(dtype)
    return native + tuple(d for d in SUPPORTED_DTYPES if d not in native)


def convert_payload(tensor: torch.Tensor, dtype: torch.dtype, scale: float | None) -> torch.Tensor:
    """A new tensor: ``tensor`` divided by ``scale`` (when given), then ``.to(dtype)``.

    This is SGLang's ``cache_k.div_(k_scale); cache_k = cache_k.to(dtype)`` without its
    in-place division: the quotient is computed in float32 (``scale`` as a float32 scalar
    on the tensor's device), rounded to the payload's own dtype (where SGLang's in-place
    ``div_`` leaves it), then converted. fp8 payloads take the same route, although
    torch has no fp8 division (SGLang's ``div_`` raises there). ``tensor`` is only read.

    Example:
        >>> x = torch.tensor([1.0, 3.0], dtype=torch.bfloat16)
        >>> convert_payload(x, torch.float8_e4m3fn, scale=0.5).float().tolist(), x.tolist()
        ([2.0, 6.0], [1.0, 3.0])
    """
    if scale is not None:
        divisor = torch.tensor(scale, dtype=torch.float32, device=tensor.device)
        tensor = torch.div(tensor.to(torch.float32), divisor).to(tensor.dtype)
    # .to may return ``tensor`` itself when the dtypes agree; callers only read the result.
    return tensor.to(dtype)


def as_storage(tensor: torch.Tensor, store_dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret an already-validated payload as the pool's storage dtype (no copy)."""
    return tensor if tensor.dtype == store_dtype else tensor.view(store_dtype)
