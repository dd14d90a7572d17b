"""Tensors whose role their shape cannot tell: declared by path, each with its reason.

A buffer with a row per token slot may still hold no cache state of its own: a shared
dequant workspace that each prefill rewrites, or a second layout of scales that every
write rebuilds from the first. Shape alone would call them slot tensors, and the
census properties would then demand that moves and host copies carry them. A row here
says what such a tensor is and why; :func:`kvcheck.census.take_census` takes a table
like :data:`KNOWN_ROLES` through ``declared=``.

Example:
    >>> role_of("dq_k_buffer", KNOWN_ROLES).space.value
    'workspace'
    >>> role_of("k_buffer[0]", KNOWN_ROLES) is None
    True
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvcheck.census.classify import IndexSpace

__all__ = ["KNOWN_ROLES", "Role", "role_of"]


@dataclass(frozen=True)
class Role:
    """A declared index space (``WORKSPACE`` or ``MIRROR``) and why."""

    space: IndexSpace
    reason: str

    def __post_init__(self) -> None:
        if self.space not in (IndexSpace.WORKSPACE, IndexSpace.MIRROR):
            raise ValueError(f"space={self.space!r} must be IndexSpace.WORKSPACE or MIRROR")
        if not self.reason:
            raise ValueError("reason='' must say why the tensor holds no state of its own")


#: Path globs -> roles, for the pools kvcheck builds (its own and sglang's).
KNOWN_ROLES: Mapping[str, Role] = MappingProxyType(
    {
        "dq_[kv]_buffer": Role(
            IndexSpace.WORKSPACE,
            "NVFP4's shared fp8 dequant workspace: each prefill rewrites it, no operation"
            " carries it",
        ),
        "native_[kv]_scale_buffer[[]*[]]": Role(
            IndexSpace.MIRROR,
            "NVFP4's TRT-LLM layout of the linear scales: every write, move and reload"
            " rebuilds it from the token's linear scales",
        ),
        "*mamba*intermediate_*": Role(
            IndexSpace.WORKSPACE,
            "a mamba slot's speculative scratch (per-draft SSM states and conv windows):"
            " target verification rewrites it before a commit reads it; no copy, move or"
            " transfer description carries it (sglang's dense conv windows are views of"
            " one physical scratch, ``_intermediate_conv_window_phys``)",
        ),
        "qsa_compressed_flat": Role(
            IndexSpace.MIRROR,
            "QSA's one allocation of compressed keys, [layers, rows * heads * dim]: its"
            " per-layer views (qsa_compressed_k_buffer_pool) hold the state, one row per"
            " group of token slots",
        ),
    }
)


def role_of(path: str, roles: Mapping[str, Role]) -> Role | None:
    """The role of the first glob in ``roles`` that ``path`` matches, else None."""
    for glob, role in roles.items():
        if fnmatch.fnmatchcase(path, glob):
            return role
    return None
