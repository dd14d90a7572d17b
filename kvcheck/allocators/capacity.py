"""The hooks SGLang 0.5.23's scheduler calls around an allocator's allocations.

Before a decode step the scheduler asks ``check_decode_capacity(num_tokens=..., tree_cache=...)``
(evicting reclaimable prefix-cache entries first, ``evict_to_free_tokens``) and retracts
requests while it answers False; at idle it asks ``verify_byte_accounting()`` for violations;
the PD transfer engine addresses slots by ``translate_kv_indices_for_transfer`` (a sliding-
window allocator's window side by ``translate_swa_indices_for_transfer``); PD decode's
admission asks ``prealloc_fits`` (each side against its own budget: separate buffers),
``prealloc_ceiling_fits`` (None: no ceiling beyond the caller's capacity) and
``request_slot_reserve`` (0: a static pool reserves no workspace per request). kvcheck models no
prefix cache: a tree cache that shares prefixes (``supports_prefix_sharing()``) is refused
with ``ValueError``; ``None`` or a cache that shares none needs no eviction.

:class:`CapacityHooks` adds them to an allocator with ``available_size``, ``page_size`` and
a ``_problems()`` self-check (the accounting violations it finds, empty when healthy).

Example:
    >>> import torch
    >>> from kvcheck.allocators import PagedTokenToKVPoolAllocator
    >>> allocator = PagedTokenToKVPoolAllocator(8, 4, torch.bfloat16, "cpu", None, False)
    >>> allocator.check_decode_capacity(num_tokens=8, tree_cache=None)
    True
    >>> allocator.check_decode_capacity(num_tokens=9, tree_cache=None)
    False
    >>> allocator.verify_byte_accounting()
    []
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvcheck.allocators import _refusals

__all__ = ["CapacityHooks"]


class CapacityHooks:
    """``check_decode_capacity``, ``evict_to_free_tokens``, ``verify_byte_accounting``,
    ``translate_kv_indices_for_transfer``."""

    if TYPE_CHECKING:  # provided by the allocator class the mixin is part of

        def available_size(self) -> int: ...

        def _problems(self) -> list[str]: ...

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """Nothing to evict without a prefix-sharing cache (kvcheck models none)."""
        where = f"{type(self).__name__}.evict_to_free_tokens"
        _refusals.count(where, "num_tokens", num_tokens)
        sharing = getattr(tree_cache, "supports_prefix_sharing", None)
        if tree_cache is not None and (not callable(sharing) or sharing()):
            raise ValueError(
                f"{where}: tree_cache={type(tree_cache).__name__} shares prefixes; kvcheck's "
                "allocators model no prefix cache (pass None or a cache that shares none)"
            )

    def check_decode_capacity(
        self,
        *,
        num_tokens: int,
        tree_cache: Any,
        requests: Any = None,
        spec_algorithm: Any = None,
    ) -> bool:
        """Whether an allocation of ``num_tokens`` slots fits (after evicting what the tree
        cache can give back: nothing, here)."""
        self.evict_to_free_tokens(tree_cache, num_tokens)
        return int(num_tokens) <= self.available_size()

    def verify_byte_accounting(self) -> list[str]:
        """The accounting violations found (empty when healthy): a free page listed twice, a
        free page also held, a size that disagrees with the free pages."""
        return self._problems()

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        """Slots a request needs beyond its prefill: none (no per-request workspace)."""
        _refusals.count(
            f"{type(self).__name__}.request_slot_reserve", "prefill_tokens", prefill_tokens
        )
        return 0

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """None: no ceiling of its own (the caller's token capacity is the bound)."""
        return None

    def prealloc_fits(
        self,
        tree_cache: Any,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_budget_tokens: int,
        swa_budget_tokens: int | None = None,
    ) -> bool:
        """Whether a preallocation fits: each side within its own budget (no budget for the
        window side: only the full side counts)."""
        return full_tokens <= full_budget_tokens and (
            swa_budget_tokens is None or swa_tokens <= swa_budget_tokens
        )

    def translate_kv_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The slot ids themselves (a static pool's ids index its buffers directly)."""
        _refusals.slot_ids("translate_kv_indices_for_transfer", "kv_indices", kv_indices)
        return kv_indices
