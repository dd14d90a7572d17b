"""The kvcheck target for this package: ``--kvcheck-target downstream_pool:target``.

It reuses kvcheck's built-in target for the serving side and swaps in the package's pool.
What its pools build is declared in ``surface`` (MHA only) and what it does not implement
in ``unsupported``, so kvcheck's suite skips those properties with a reason instead of
passing them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kvcheck.specs import PoolSpec
from kvcheck.surface import Surface
from kvcheck.targets.builtin import KVCheckTarget

from downstream_pool.pool import CountingMHAPool

_ONLY_MHA = "downstream_pool implements the MHA pool only"


class DownstreamTarget(KVCheckTarget):
    """kvcheck's serving rules with :class:`CountingMHAPool` as the MHA pool."""

    name = "downstream-pool"
    version = "0.1.0"
    #: What this package's pools build: MHA only, token-major (kvcheck's surface would
    #: also hand it head-major specs, which CountingMHAPool does not take).
    surface = Surface.of(mha={})
    unsupported = MappingProxyType({"index_k_write": _ONLY_MHA, "state_buf_infos": _ONLY_MHA})

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """Build a :class:`CountingMHAPool`; other families are declared unsupported."""
        if spec.family != "mha":
            raise ValueError(f"spec.family={spec.family!r}: {_ONLY_MHA}")
        import torch

        return CountingMHAPool(
            size=spec.size,
            page_size=spec.page_size,
            dtype=getattr(torch, spec.dtype),
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            v_head_dim=spec.v_head_dim,
            layer_num=spec.layer_num,
            start_layer=spec.start_layer,
            device=device,
        )


#: What ``--kvcheck-target downstream_pool:target`` resolves to.
target = DownstreamTarget()
