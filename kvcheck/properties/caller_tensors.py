"""The caller's tensors: no pool call may change a tensor it was given.

Core contract on valid input, checked on every call the state machines make: locations,
payloads and the tensors inside a host copy keep their shape, strides, dtype, device and
every byte, whether the call succeeds or raises. (SGLang 0.5.23's ``set_kv_buffer``
divides a caller's payload by ``k_scale`` in place when it converts it.)

Example:
    >>> loc = torch.tensor([2, 1])
    >>> before = snapshot_tensors(collect_tensors((loc,)))
    >>> assert_tensors_unchanged(collect_tensors((loc,)), before, call="sorted(loc)")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import assert_bytes_equal, fail

__all__ = ["TensorSnapshot", "assert_tensors_unchanged", "collect_tensors", "snapshot_tensors"]


@dataclass(frozen=True)
class TensorSnapshot:
    """Everything about a tensor a call could change: layout, dtype, device and bytes."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str
    data: np.ndarray | None  # None on meta, which has no bytes


def collect_tensors(value: Any, path: str = "args") -> dict[str, torch.Tensor]:
    """Every tensor reachable from ``value`` through tuples, lists, mappings, dataclasses
    and namespaces, keyed by where it was found.

    Example:
        >>> sorted(collect_tensors((torch.zeros(1), {"k": [torch.ones(2)]})))
        ['args[0]', "args[1]['k'][0]"]
    """
    found: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        found[path] = value
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            found |= collect_tensors(item, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            found |= collect_tensors(item, f"{path}[{key!r}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            found |= collect_tensors(getattr(value, item.name), f"{path}.{item.name}")
    elif isinstance(value, SimpleNamespace):
        for key, item in vars(value).items():
            found |= collect_tensors(item, f"{path}.{key}")
    return found


def _bytes_of(tensor: torch.Tensor) -> np.ndarray | None:
    if tensor.device.type == "meta":
        return None
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).cpu().numpy().copy().reshape(1, -1)


def snapshot_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, TensorSnapshot]:
    """Copies of what :func:`assert_tensors_unchanged` compares, taken before a call.

    Example:
        >>> snapshot_tensors({"loc": torch.tensor([1, 2])})["loc"].shape
        (2,)
    """
    return {
        name: TensorSnapshot(
            shape=tuple(tensor.shape),
            stride=tuple(tensor.stride()),
            dtype=tensor.dtype,
            device=str(tensor.device),
            data=_bytes_of(tensor),
        )
        for name, tensor in tensors.items()
    }


def assert_tensors_unchanged(
    tensors: Mapping[str, torch.Tensor],
    before: Mapping[str, TensorSnapshot],
    *,
    call: str,
    method: str = "",
    family: str = "",
) -> None:
    """Each tensor still matches its snapshot: shape, strides, dtype, device, bytes.

    ``method`` and ``family`` name the pool call and family in the failure's signature.

    Example:
        >>> loc = torch.tensor([2, 1])
        >>> before = snapshot_tensors({"loc": loc})
        >>> _ = loc.sort()
        >>> assert_tensors_unchanged({"loc": loc}, before, call="loc.sort()")
    """
    __tracebackhide__ = True
    for name, snapshot in before.items():
        tensor = tensors[name]
        now = snapshot_tensors({name: tensor})[name]
        for field in ("shape", "stride", "dtype", "device", "data"):
            got, expected = getattr(now, field), getattr(snapshot, field)
            if field == "data":
                same = got is None or expected is None or np.array_equal(got, expected)
            else:
                same = got == expected
            if same:
                continue
            signature = FailureSignature(
                check="caller_tensors", call=method, kind=f"{field} changed", family=family
            )
            if field != "data":
                raise fail(
                    got=got,
                    expected=expected,
                    call=call,
                    detail=f"the call changed the {field} of the caller's tensor {name}",
                    signature=signature,
                )
            assert_bytes_equal(
                got,
                expected,
                what=f"the caller's tensor {name} (row 0 = all)",
                call=call,
                signature=signature,
            )
