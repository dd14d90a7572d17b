"""Module-level targets for the tier reproduction scripts' tests (``module:attr`` names a
script imports, with ``tests/`` on ``PYTHONPATH``).

:data:`LEAKY` is a user's own target, written as ``examples/own_pool`` writes one: an MHA pool,
a token allocator and a ``layer_first`` host pool, declared with ``Surface.with_tiers``; its
allocator's and its host pool's ``free`` each forget the last slot they are given.
:data:`FIXED` is the same target with both fixed. The others serve kvcheck's own broken
tiers (``broken_tiers.py``) under names a script can import.
"""

from __future__ import annotations

from typing import Any

import torch
from broken_tiers import (
    AnyBackendHost,
    BrokenTierTarget,
    DriftingPagedAllocator,
    FullSideCapacitySWAAllocator,
    OnceDestroyedHost,
    PageKeepingHost,
    TrustingPagedAllocator,
    TwiceHandingTokenAllocator,
    UnderstatingHost,
)

from kvcheck import allocators, host_pools, pools
from kvcheck.surface import Surface
from kvcheck.targets.builtin import KVCheckTarget


class ForgetfulFreeAllocator(allocators.TokenToKVPoolAllocator):
    """``free`` of two or more slots gives back all but the last (the bug)."""

    def free(self, free_index: torch.Tensor) -> None:
        if len(free_index) > 1:
            free_index = free_index[:-1]
        super().free(free_index)


class ForgetfulFreeHost(host_pools.MHATokenToKVPoolHost):
    """``free`` of two or more host slots gives back all but the last (the bug)."""

    def free(self, indices: torch.Tensor) -> int:
        ids = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        return super().free(ids[:-1] if len(ids) > 1 else ids)


class UserTarget(KVCheckTarget):
    """My pool, allocator and host pool (kvcheck's classes stand in for mine)."""

    surface = Surface.of(mha={}).with_tiers(
        allocators=("token",), host_layouts={"mha": ("layer_first",)}
    )

    def __init__(self, name: str, allocator: type, host: type) -> None:
        self.name = name
        self.allocator_class = allocator
        self.host_class = host

    def make_pool(self, spec: Any, *, device: str) -> Any:
        return self.pool_arguments(spec, device=device).build(pools.MHATokenToKVPool)

    def make_allocator(self, spec: Any, *, device: str, kvcache: Any = None) -> Any:
        return self.allocator_class(spec.size, torch.bfloat16, device, kvcache, spec.need_sort)

    def make_host_pool(self, spec: Any, device_pool: Any, *, device: str) -> tuple[Any, ...]:
        host = self.host_class(
            device_pool, 2.0, 0, spec.page_size, spec.layout, host_token_capacity=spec.host_size
        )
        return (host,)


LEAKY = UserTarget("user-leaky", ForgetfulFreeAllocator, ForgetfulFreeHost)
FIXED = UserTarget("user-fixed", allocators.TokenToKVPoolAllocator, host_pools.MHATokenToKVPoolHost)

TWICE_HANDING = BrokenTierTarget(TwiceHandingTokenAllocator)
DRIFTING = BrokenTierTarget(DriftingPagedAllocator)
TRUSTING = BrokenTierTarget(TrustingPagedAllocator)
FULL_SIDE_CAPACITY = BrokenTierTarget(FullSideCapacitySWAAllocator)
UNDERSTATING = BrokenTierTarget(UnderstatingHost)
ANY_BACKEND = BrokenTierTarget(AnyBackendHost)
PAGE_KEEPING = BrokenTierTarget(PageKeepingHost)
ONCE_DESTROYED = BrokenTierTarget(OnceDestroyedHost)
