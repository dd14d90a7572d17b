"""Argument validation shared by every pool family.

One vocabulary and one exception type: every check raises ``ValueError`` with a message
of the form ``where: name=value ...`` so a caller sees which argument was wrong and why.
Checks only read their inputs; nothing here mutates a caller's tensor or a pool.

Example:
    >>> import torch
    >>> require_int("page_size", 4, minimum=1)
    4
    >>> check_locations("loc", torch.tensor([3, 1]), limit=8, device=torch.device("cpu"),
    ...                 distinct=True, where="set_kv_buffer")
    tensor([3, 1])
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

LOCATION_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
ALLOWED_DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "meta")


def require_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum`` (bools are refused).

    Example:
        >>> require_int("head_num", 0, minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: head_num=0 must be an integer >= 1
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}, not a bool")
    try:
        as_int = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}") from None
    if as_int < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return as_int


def require_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; anything else is refused by name."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a bool")
    return value


def resolve_device(device: object) -> torch.device:
    """Parse ``device`` (str or ``torch.device``) into a concrete ``torch.device``.

    Only ``cpu``, ``cuda`` (with or without an index) and ``meta`` are accepted; a bare
    ``cuda`` resolves to the current CUDA device so tensor devices compare equal to it.

    Example:
        >>> resolve_device("meta")
        device(type='meta')
    """
    try:
        parsed = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device={device!r} is not a device; use one of {ALLOWED_DEVICE_TYPES}"
        ) from None
    if parsed.type not in ALLOWED_DEVICE_TYPES:
        raise ValueError(f"device={device!r} is not supported; use one of {ALLOWED_DEVICE_TYPES}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, which is not available here")
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r} does not exist; {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    return parsed


def describe(tensor: torch.Tensor) -> str:
    """Shape, dtype and device of ``tensor``, for error messages."""
    return f"shape={tuple(tensor.shape)}, dtype={tensor.dtype}, device={tensor.device}"


def _require_tensor(name: str, value: object, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_locations(
    name: str,
    loc: object,
    *,
    limit: int,
    device: torch.device,
    distinct: bool,
    where: str,
    limit_reason: str = "",
) -> torch.Tensor:
    """Validate a location tensor and return it as ``int64`` on ``device``.

    ``loc`` must be a 1-D ``int32``/``int64`` tensor on ``device`` or on the CPU, with
    every value in ``[0, limit)`` and, when ``distinct``, no value twice. Values are only
    checked where they can be read: a ``meta`` tensor passes on shape and dtype alone.
    ``limit_reason`` is appended to an out-of-range message to say where ``limit`` comes from.

    Example:
        >>> check_locations("tgt_loc", torch.tensor([2, 2]), limit=4,
        ...                 device=torch.device("cpu"), distinct=True, where="move_kv_cache")
        Traceback (most recent call last):
        ...
        ValueError: move_kv_cache: tgt_loc has value 2 at positions 0 and 1; ...
    """
    tensor = _require_tensor(name, loc, where)
    if tensor.dim() != 1:
        raise ValueError(f"{where}: {name} must be 1-D, got {describe(tensor)}")
    if tensor.dtype not in LOCATION_DTYPES:
        raise ValueError(f"{where}: {name} must have dtype int32 or int64, got {describe(tensor)}")
    if tensor.device != device and tensor.device.type != "cpu":
        raise ValueError(
            f"{where}: {name} must be on the pool's device {device} or on cpu,"
            f" got {describe(tensor)}"
        )
    if tensor.device.type != "meta" and tensor.numel() > 0:
        _check_range(name, tensor, limit, where, limit_reason)
        if distinct:
            _check_distinct(name, tensor, where)
    return tensor.to(device=device, dtype=torch.int64)


def _check_range(name: str, tensor: torch.Tensor, limit: int, where: str, reason: str) -> None:
    # Bulk test first (one reduction); locate the first offender only to word the error.
    bad = (tensor < 0) | (tensor >= limit)
    if bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        value = int(tensor[position])
        suffix = f" ({reason})" if reason else ""
        raise ValueError(f"{where}: {name}[{position}]={value} not in [0, {limit}){suffix}")


def _check_distinct(name: str, tensor: torch.Tensor, where: str) -> None:
    ordered, order = torch.sort(tensor, stable=True)
    repeats = (ordered[1:] == ordered[:-1]).nonzero()
    if repeats.numel() > 0:
        k = int(repeats[0, 0])
        first, second = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(
            f"{where}: {name} has value {int(ordered[k])} at positions {first} and {second};"
            f" {name} must not repeat a slot"
        )


def check_same_length(
    names: tuple[str, str], tensors: tuple[torch.Tensor, torch.Tensor], *, where: str
) -> None:
    """Raise if two validated location tensors differ in length."""
    (a, b), (ta, tb) = names, tensors
    if ta.numel() != tb.numel():
        raise ValueError(
            f"{where}: {a} and {b} must have the same length, got len({a})={ta.numel()}"
            f" and len({b})={tb.numel()}"
        )


def check_payload(
    name: str,
    value: object,
    *,
    shape: Sequence[int],
    dtypes: Sequence[torch.dtype],
    device: torch.device,
    where: str,
) -> torch.Tensor:
    """Validate a data tensor a caller wants written: exact shape, one of ``dtypes``, ``device``.

    Example:
        >>> check_payload("cache_k", torch.zeros(2, 1, 4), shape=(3, 1, 4),
        ...               dtypes=(torch.float32,), device=torch.device("cpu"), where="w")
        Traceback (most recent call last):
        ...
        ValueError: w: cache_k must have shape (3, 1, 4), got shape=(2, 1, 4), ...
    """
    tensor = _require_tensor(name, value, where)
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {describe(tensor)}")
    if tensor.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{where}: {name} must have dtype {allowed}, got {describe(tensor)}")
    if tensor.device != device:
        raise ValueError(
            f"{where}: {name} must be on the pool's device {device}, got {describe(tensor)}"
        )
    return tensor
