"""Deliberately broken linear-attention hybrid pools (helpers, not tests).

Each twin breaks one thing kvcheck's own hybrid does right, the way a real change could:
a fork that copies the conv windows but not the temporal state, a free that leaks the mamba
slot, an admission refused for want of a mamba slot that keeps the row it took (as sglang's
does, finding M2), a flush that forgets the mamba allocator, a clear that zeroes every
slot's draft scratch, a layer mapping off by one, a host copy that drops the mamba state,
accounting that forgets the draft scratch, a PD description that leaves out the conv state.
:class:`BrokenLinearTarget` builds kvcheck's hybrid with one twin class swapped in.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcheck.pools.hybrid_linear import HybridLinearKVPool
from kvcheck.pools.mamba import HybridReqToTokenPool, MambaPool
from kvcheck.targets.builtin import KVCheckTarget


class ForkWithoutTemporalMambaPool(MambaPool):
    """``copy_from`` copies the conv windows and forgets the temporal state."""

    def copy_from(self, src_indices: Any, dst_indices: Any) -> None:
        src = torch.as_tensor(src_indices).reshape(-1)
        dst = torch.as_tensor(dst_indices).reshape(-1)
        for conv in self.mamba_cache.conv:
            conv[:, dst] = conv[:, src]


class ScratchClobberingMambaPool(MambaPool):
    """``clear_slots`` also zeroes the draft scratch of every slot, not only its own."""

    def clear_slots(self, indices: Any) -> None:
        super().clear_slots(indices)
        cache = self.mamba_cache
        if isinstance(cache, MambaPool.SpeculativeState):
            cache.intermediate_ssm.zero_()


class ScratchBlindAccountingMambaPool(MambaPool):
    """``get_kv_size_bytes`` counts conv and temporal state but not the draft scratch."""

    def get_kv_size_bytes(self) -> int:
        cache = self.mamba_cache
        return sum(t.numel() * t.element_size() for t in (*cache.conv, cache.temporal))


class ConvlessDescriptionMambaPool(MambaPool):
    """``get_contiguous_buf_infos`` describes the temporal state only (PD sends no conv)."""

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        ptrs, lens, items = super().get_contiguous_buf_infos()
        skip = len(self.mamba_cache.conv) * self.num_mamba_layers
        return ptrs[skip:], lens[skip:], items[skip:]


class SlotLeakingReqPool(HybridReqToTokenPool):
    """``free_mamba_cache`` forgets the request's slot without returning it."""

    def free_mamba_cache(self, req: Any) -> None:
        req.kv.mamba_pool_idx = None


class RowKeepingRefusalReqPool(HybridReqToTokenPool):
    """``alloc`` takes the rows before it asks for mamba slots, and a refusal keeps them."""

    def alloc(self, reqs: Any) -> list[int] | None:
        for req in reqs:
            if req.kv.req_pool_idx is None and self.free_slots:
                req.kv.req_pool_idx = self.free_slots.pop()
        return super().alloc(reqs)


class MambaKeepingFlushReqPool(HybridReqToTokenPool):
    """``clear`` frees the rows but leaves the mamba allocator as it was."""

    def clear(self) -> None:
        self.free_slots = list(range(1, self.size + 1))
        self.req_index_to_mamba_index_mapping.zero_()


class OffByOneLayerKVPool(HybridLinearKVPool):
    """Maps global layer ``L`` to the dense full layer after its own (wrapping around)."""

    def _full_id(self, layer_id: int) -> int:
        dense = super()._full_id(layer_id)
        return (dense + 1) % len(self.full_attention_layer_id_mapping)


class MambaDroppingHostKVPool(HybridLinearKVPool):
    """``get_cpu_copy`` ignores ``mamba_indices``: a reload brings back K/V only."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> tuple[Any, Any]:
        return super().get_cpu_copy(indices, None)


def _req_pool_with(mamba_pool_cls: type) -> type:
    return type(
        f"ReqPoolWith{mamba_pool_cls.__name__}",
        (HybridReqToTokenPool,),
        {"mamba_pool_cls": mamba_pool_cls},
    )


class BrokenLinearTarget(KVCheckTarget):
    """kvcheck's target whose linear hybrid has ``broken`` in place of its own class."""

    def __init__(self, broken: type) -> None:
        self.name = f"broken-{broken.__name__}"
        if issubclass(broken, MambaPool):
            self.linear_req_pool_cls = _req_pool_with(broken)
        elif issubclass(broken, HybridReqToTokenPool):
            self.linear_req_pool_cls = broken
        else:
            self.linear_kv_pool_cls = broken
