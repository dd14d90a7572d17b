"""Mamba state per request slot, and the request rows that own the slots.

Modeled on SGLang 0.5.23's ``MambaPool``, ``MambaSlotAllocator`` and
``HybridReqToTokenPool`` (``srt/mem_cache/memory_pool.py``, ``allocator/mamba.py``): a
linear-attention layer keeps no per-token KV but one fixed-size state per request, a conv
window list and a temporal (SSM) state, indexed ``[mamba layer, slot, ...]``. Slot 0 is
padding (a dummy target for padded batches), so slots ``1..size`` are handed out.

Under speculative decoding each slot also has scratch: the intermediate SSM state and conv
window of every draft token, which the verify step writes and the commit reads. Scratch is
not checkpoint state: slot copies (prefix forks), host copies and transfer descriptions
carry conv and temporal only, as SGLang's do.

Example:
    >>> import torch
    >>> pool = MambaPool(size=2, conv_shapes=[(3, 2)], temporal_shape=(1, 2, 2),
    ...                  mamba_layer_ids=[0, 2], device="cpu")
    >>> pool.mamba_cache.temporal.shape
    torch.Size([2, 3, 1, 2, 2])
    >>> pool.mamba2_layer_cache(1).temporal[1].fill_(7.0).sum().item()
    28.0
    >>> pool.copy_from(torch.tensor([1]), torch.tensor([2]))
    >>> pool.mamba_cache.temporal[1, 2].sum().item()
    28.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["HybridReqToTokenPool", "MambaPool", "MambaSlotAllocator"]


def _slots(indices: Any) -> torch.Tensor:
    return torch.as_tensor(indices, dtype=torch.int64).reshape(-1)


class MambaPool:
    """Conv and temporal state per (mamba layer, slot), plus speculative scratch."""

    @dataclass(frozen=True, kw_only=True)
    class State:
        """The state tensors, each ``[layers, slots, ...]`` (``conv`` one per conv shape)."""

        conv: list[torch.Tensor]
        temporal: torch.Tensor

        def at_layer_idx(self, layer: int) -> MambaPool.State:
            """The same fields, each at one dense mamba layer (views)."""
            values: dict[str, Any] = {}
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                values[f.name] = (
                    [t[layer] for t in value] if isinstance(value, list) else value[layer]
                )
            return type(self)(**values)

    @dataclass(frozen=True, kw_only=True)
    class SpeculativeState(State):
        """Adds the per-draft-token scratch, ``[layers, slots, draft_tokens, ...]``."""

        intermediate_ssm: torch.Tensor
        intermediate_conv_window: list[torch.Tensor]

    def __init__(
        self,
        *,
        size: int,
        conv_shapes: Sequence[tuple[int, ...]],
        temporal_shape: tuple[int, ...],
        mamba_layer_ids: Sequence[int],
        device: str | torch.device,
        spec_state_size: int | None = None,
        conv_dtype: torch.dtype = torch.float32,
        temporal_dtype: torch.dtype = torch.float32,
        speculative_num_draft_tokens: int | None = None,
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r} must be an int >= 1")
        self.size = size
        self.device = device
        self.mamba_layer_ids = list(mamba_layer_ids)
        self.num_mamba_layers = len(self.mamba_layer_ids)
        layers = self.num_mamba_layers
        spec_rows = (size if spec_state_size is None else spec_state_size) + 1
        conv = [
            torch.zeros((layers, size + 1, *shape), dtype=conv_dtype, device=device)
            for shape in conv_shapes
        ]
        temporal = torch.zeros(
            (layers, size + 1, *temporal_shape), dtype=temporal_dtype, device=device
        )
        self.mamba_cache: MambaPool.State
        if speculative_num_draft_tokens is None:
            self.mamba_cache = self.State(conv=conv, temporal=temporal)
        else:
            draft = speculative_num_draft_tokens
            self.mamba_cache = self.SpeculativeState(
                conv=conv,
                temporal=temporal,
                intermediate_ssm=torch.zeros(
                    (layers, spec_rows, draft, *temporal_shape),
                    dtype=temporal_dtype,
                    device=device,
                ),
                intermediate_conv_window=[
                    torch.zeros((layers, spec_rows, draft, *shape), dtype=conv_dtype, device=device)
                    for shape in conv_shapes
                ],
            )
        self.mem_usage = self.get_kv_size_bytes() / (1 << 30)

    def _checkpoint_tensors(self) -> list[torch.Tensor]:
        """The state a slot carries across owners and hosts (not the draft scratch)."""
        return [*self.mamba_cache.conv, self.mamba_cache.temporal]

    def mamba2_layer_cache(self, layer_id: int) -> MambaPool.State:
        """The state of dense mamba layer ``layer_id`` (views into the pool)."""
        return self.mamba_cache.at_layer_idx(layer_id)

    def get_speculative_mamba2_params_all_layers(self) -> MambaPool.SpeculativeState:
        """Every layer's state with its draft scratch (speculative pools only)."""
        if not isinstance(self.mamba_cache, self.SpeculativeState):
            raise RuntimeError("this MambaPool was built without speculative_num_draft_tokens")
        return self.mamba_cache

    def clear_slots(self, indices: Any) -> None:
        """Zero the checkpoint state of ``indices`` (a new owner starts from nothing)."""
        idx = _slots(indices).to(self.mamba_cache.temporal.device)
        for tensor in self._checkpoint_tensors():
            tensor.index_fill_(1, idx, 0)

    def copy_from(self, src_indices: Any, dst_indices: Any) -> None:
        """Copy the checkpoint state of slots ``src_indices`` into ``dst_indices``."""
        src, dst = _slots(src_indices), _slots(dst_indices)
        for tensor in self._checkpoint_tensors():
            tensor[:, dst] = tensor[:, src]

    def get_cpu_copy(self, indices: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Host copies of the checkpoint state of ``indices``: ``(conv list, temporal)``."""
        idx = _slots(indices)
        conv = [t[:, idx].to("cpu", copy=True) for t in self.mamba_cache.conv]
        return conv, self.mamba_cache.temporal[:, idx].to("cpu", copy=True)

    def load_cpu_copy(self, mamba_cache_cpu: Any, indices: Any) -> None:
        """Write a :meth:`get_cpu_copy` result back at slots ``indices``."""
        conv_cpu, temporal_cpu = mamba_cache_cpu
        idx = _slots(indices)
        for tensor, saved in zip(self.mamba_cache.conv, conv_cpu, strict=True):
            tensor[:, idx] = saved.to(tensor.device)
        self.mamba_cache.temporal[:, idx] = temporal_cpu.to(self.mamba_cache.temporal.device)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """One entry per checkpoint tensor and layer (conv tensors, then temporal):
        pointers, byte lengths and the bytes of one slot."""
        ptrs, lens, items = [], [], []
        for tensor in self._checkpoint_tensors():
            for layer in range(self.num_mamba_layers):
                ptrs.append(tensor[layer].data_ptr())
                lens.append(tensor[layer].nbytes)
                items.append(tensor[layer][0].nbytes)
        return ptrs, lens, items

    def get_kv_size_bytes(self) -> int:
        """Bytes of every state tensor, scratch included."""
        cache = self.mamba_cache
        tensors: list[torch.Tensor] = [*cache.conv, cache.temporal]
        if isinstance(cache, self.SpeculativeState):
            tensors += [cache.intermediate_ssm, *cache.intermediate_conv_window]
        return sum(t.numel() * t.element_size() for t in tensors)


class MambaSlotAllocator:
    """A free list of mamba slots ``1..size`` (slot 0 is padding)."""

    def __init__(self, size: int, device: str | torch.device) -> None:
        self.size = size
        self.device = device
        self.free_slots: torch.Tensor = torch.empty(0, dtype=torch.int64)
        self.clear()

    def available_size(self) -> int:
        """Free slots."""
        return int(self.free_slots.numel())

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots from the front of the free list, or ``None`` (nothing taken)."""
        if need_size > self.available_size():
            return None
        taken = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return taken

    def free(self, free_index: torch.Tensor) -> None:
        """Return slots to the back of the free list."""
        if free_index.numel():
            self.free_slots = torch.cat((self.free_slots, free_index.to(torch.int64)))

    def clear(self) -> None:
        """Every slot free again."""
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)


class HybridReqToTokenPool:
    """Request rows (``req_to_token``) plus one mamba slot per request.

    ``alloc(reqs)`` takes SGLang-shaped requests (``req.kv.req_pool_idx``,
    ``req.kv.mamba_pool_idx``; a request that holds a row or a slot keeps it) and records
    each row's mamba slot; ``free(req)`` returns the row, ``free_mamba_cache(req)`` the
    slot; ``clear()`` frees every row and slot (a flush).
    """

    mamba_pool_cls = MambaPool

    def __init__(
        self,
        *,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        mamba_size: int,
        conv_shapes: Sequence[tuple[int, ...]],
        temporal_shape: tuple[int, ...],
        mamba_layer_ids: Sequence[int],
        speculative_num_draft_tokens: int | None = None,
        conv_dtype: torch.dtype = torch.float32,
        temporal_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        # Row 0 is padding, as in SGLang: padded batches point their dummy rows there.
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=device
        )
        self.free_slots = list(range(1, size + 1))
        self.mamba_pool = self.mamba_pool_cls(
            size=mamba_size,
            conv_shapes=conv_shapes,
            temporal_shape=temporal_shape,
            mamba_layer_ids=mamba_layer_ids,
            device=device,
            conv_dtype=conv_dtype,
            temporal_dtype=temporal_dtype,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
        )
        self.mamba_allocator = MambaSlotAllocator(mamba_size, device)
        self.mamba_map = {layer_id: i for i, layer_id in enumerate(mamba_layer_ids)}
        self.req_index_to_mamba_index_mapping = torch.zeros(
            size + 1, dtype=torch.int32, device=device
        )

    def write(self, indices: Any, values: Any) -> None:
        """``req_to_token[indices] = values``."""
        self.req_to_token[indices] = values

    def available_size(self) -> int:
        """Free request rows."""
        return len(self.free_slots)

    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:
        """A row for every request without one and a mamba slot for every request without
        one; ``None`` (nothing taken) when rows or slots run out."""
        new_rows = [r for r in reqs if r.kv.req_pool_idx is None]
        new_slots = [r for r in reqs if r.kv.mamba_pool_idx is None]
        if len(new_rows) > len(self.free_slots):
            return None
        if len(new_slots) > self.mamba_allocator.available_size():
            return None
        for req in new_rows:
            req.kv.req_pool_idx = self.free_slots.pop()
        for req in new_slots:
            slot = self.mamba_allocator.alloc(1)
            assert slot is not None  # checked above
            req.kv.mamba_pool_idx = slot[0]
            req.kv.mamba_needs_clear = True
        rows = [r.kv.req_pool_idx for r in reqs]
        for req in reqs:
            self.req_index_to_mamba_index_mapping[req.kv.req_pool_idx] = int(req.kv.mamba_pool_idx)
        return rows

    def get_mamba_indices(self, req_indices: torch.Tensor) -> torch.Tensor:
        """The mamba slot of each request row."""
        return self.req_index_to_mamba_index_mapping[req_indices]

    def mamba2_layer_cache(self, layer_id: int) -> MambaPool.State:
        """The state of global mamba layer ``layer_id``."""
        if layer_id not in self.mamba_map:
            raise ValueError(f"layer_id={layer_id} is not a mamba layer: {sorted(self.mamba_map)}")
        return self.mamba_pool.mamba2_layer_cache(self.mamba_map[layer_id])

    def get_speculative_mamba2_params_all_layers(self) -> MambaPool.SpeculativeState:
        """Every mamba layer's state and draft scratch."""
        return self.mamba_pool.get_speculative_mamba2_params_all_layers()

    def copy_mamba_state(self, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
        """Fork: copy the checkpoint state of mamba slots ``src_index`` into ``dst_index``."""
        if src_index.numel():
            self.mamba_pool.copy_from(src_index, dst_index)

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The mamba pool's transfer description (PD state registration)."""
        return self.mamba_pool.get_contiguous_buf_infos()

    def free(self, req: Any) -> None:
        """Return the request's row."""
        if req.kv.req_pool_idx is None:
            raise ValueError("free(req): the request holds no row (double free?)")
        self.free_slots.append(req.kv.req_pool_idx)
        req.kv.req_pool_idx = None

    def free_mamba_cache(self, req: Any) -> None:
        """Return the request's mamba slot."""
        if req.kv.mamba_pool_idx is None:
            raise ValueError("free_mamba_cache(req): the request holds no mamba slot")
        self.mamba_allocator.free(torch.as_tensor(req.kv.mamba_pool_idx).reshape(1))
        req.kv.mamba_pool_idx = None

    def clear(self) -> None:
        """A flush: every row and every mamba slot free, the row-to-slot mapping zeroed."""
        self.free_slots = list(range(1, self.size + 1))
        self.mamba_allocator.clear()
        self.req_index_to_mamba_index_mapping.zero_()
