"""The opaque host copy returned by ``get_cpu_copy`` and accepted by ``load_cpu_copy``.

A copy records which pool class made it and, per named part (``"k"``, ``"v"``, ``"kv"``,
``"index_k"``), one tensor per local layer. ``load_cpu_copy`` checks a copy against the
layout the loading pool expects before it writes anything.

Example:
    >>> import torch
    >>> copy = KVHostCopy(source="MLATokenToKVPool", num_tokens=2,
    ...                   parts={"kv": (torch.zeros(2, 1, 8),)})
    >>> check_host_copy(copy, source="MLATokenToKVPool", expected={"kv": [(2, 1, 8)]},
    ...                 dtypes={"kv": torch.float32}, where="load_cpu_copy").num_tokens
    2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from kvcheck.pools._refusals import describe


@dataclass(frozen=True, eq=False)
class KVHostCopy:
    """Token data copied out of a pool; pass it back to ``load_cpu_copy`` unchanged.

    ``parts[name][i]`` holds local layer ``i``'s rows of buffer group ``name`` in the order
    of the indices that were copied. Tensors are on the CPU (``meta`` for a meta pool).
    ``tails`` holds a DSA pool's per-request compress tails when the copy named a request.
    """

    source: str
    num_tokens: int
    parts: Mapping[str, tuple[torch.Tensor, ...]]
    #: DSA compress tails of one request (``"tail_k"``, ``"tail_score"``: one ``[tail_width,
    #: index_head_dim]`` tensor per local layer, ``None`` for a skip layer); empty when the
    #: copy was taken without a request or from a pool without tails.
    tails: Mapping[str, tuple[torch.Tensor | None, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )


def check_host_copy(
    value: object,
    *,
    source: str,
    expected: Mapping[str, Sequence[tuple[int, ...]]],
    dtypes: Mapping[str, torch.dtype],
    where: str,
    name: str = "kv_cache_cpu",
    num_tokens: int | None = None,
) -> KVHostCopy:
    """Raise ``ValueError`` unless ``value`` is a copy with exactly the ``expected`` layout.

    ``expected[part][i]`` is the shape local layer ``i`` of ``part`` must have and
    ``dtypes[part]`` its dtype. ``num_tokens``, when given, is ``len(indices)`` of the
    reload; a copy of another token count is refused by saying so.
    """
    if not isinstance(value, KVHostCopy):
        raise ValueError(
            f"{where}: {name} must be a host copy from get_cpu_copy, got {type(value).__name__}"
        )
    if value.source != source:
        raise ValueError(f"{where}: {name} was made by {value.source}, not by {source}")
    if num_tokens is not None and num_tokens != value.num_tokens:
        raise ValueError(
            f"{where}: len(indices)={num_tokens} but {name} holds {value.num_tokens} tokens"
        )
    if set(value.parts) != set(expected):
        raise ValueError(
            f"{where}: {name} holds parts {sorted(value.parts)}, expected {sorted(expected)}"
        )
    for part, shapes in expected.items():
        layers = value.parts[part]
        if len(layers) != len(shapes):
            raise ValueError(
                f"{where}: {name} has {len(layers)} layers of {part!r}, expected {len(shapes)}"
            )
        for i, (tensor, shape) in enumerate(zip(layers, shapes, strict=True)):
            if (
                not isinstance(tensor, torch.Tensor)
                or tuple(tensor.shape) != tuple(shape)
                or tensor.dtype != dtypes[part]
            ):
                got = describe(tensor) if isinstance(tensor, torch.Tensor) else type(tensor)
                raise ValueError(
                    f"{where}: {name} part {part!r} layer {i} must have shape {tuple(shape)}"
                    f" and dtype {dtypes[part]}, got {got}"
                )
    return value
