"""The allocators' own refusal of bad calls: ``ValueError`` naming the argument, raised before
anything changes (the same treatment kvcheck's pools give a bad pool call).

Example:
    >>> import torch
    >>> slot_ids("free", "free_index", torch.tensor([3, 1]))
    [3, 1]
    >>> slot_ids("free", "free_index", torch.tensor([[3]]))
    Traceback (most recent call last):
    ...
    ValueError: free: free_index must be a 1-D integer tensor, got shape (1, 1) dtype torch.int64
"""

from __future__ import annotations

import operator

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)


def count(where: str, name: str, value: object) -> int:
    """``value`` as a non-negative int (bools refused)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: {name}={value!r} must be an integer >= 0, not a bool")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{where}: {name}={value!r} must be an integer >= 0") from None
    if number < 0:
        raise ValueError(f"{where}: {name}={value!r} must be an integer >= 0")
    return number


def slot_ids(where: str, name: str, value: object) -> list[int]:
    """The ids of a 1-D int32/int64 tensor, as a list."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: {name}={value!r} must be a 1-D integer tensor")
    if value.dim() != 1 or value.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"{where}: {name} must be a 1-D integer tensor, got shape {tuple(value.shape)} "
            f"dtype {value.dtype}"
        )
    return [int(x) for x in value.tolist()]


def same_values(where: str, name: str, first: list[int], second: object) -> None:
    """``second`` (a caller's CPU copy) holds the ids ``first`` holds."""
    values = slot_ids(where, name, second)
    if values != first:
        raise ValueError(f"{where}: {name}={values} differs from its device tensor {first}")


def distinct(where: str, name: str, ids: list[int]) -> None:
    """No id of ``ids`` repeats."""
    seen: set[int] = set()
    for slot in ids:
        if slot in seen:
            raise ValueError(f"{where}: {name} lists slot {slot} twice (a double free)")
        seen.add(slot)
