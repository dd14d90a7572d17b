"""kvcheck's sliding-window hybrid pool, with SGLang 0.5.23's ``SWAKVPool`` API.

A sliding-window model (gpt-oss, Gemma) has full-attention layers, which keep every
token, and sliding-window layers, which keep only the tokens inside the window. The
hybrid pool composes two pools of one family (MHA, MLA or DSA): the *full* sub-pool, of
``size`` token slots, for the full-attention layers, and the *SWA* sub-pool, of
``size_swa`` slots, for the sliding-window layers. A global layer id maps to one
sub-pool's local layer (``layers_mapping``).

Callers address tokens by their full-side slot. The SWA allocator hands the pool its
``full_to_swa_index_mapping`` (``register_mapping``): the SWA peer of each full slot, 0
for a slot without one (slot 0 is the SWA side's dummy row) and ``mapping[-1] == -1``.
Window eviction is the allocator's ``free_swa``, which zeroes the mapping of the slots
that left the window; the pool reads the live mapping, so from then on it neither copies
nor reloads those slots' SWA rows. Every whole-pool operation composes the sub-pools':

- a write to a sliding-window layer goes to the translated location the caller passes
  (``KVWriteLoc.swa_loc``), a write to a full layer to the full location;
- ``move_kv_cache`` moves the full side at the full locations and the SWA side at their
  translations;
- ``get_cpu_copy`` copies the full side at the slots and the SWA side at the peers of
  those slots that have one (remembering which); ``load_cpu_copy`` writes back the SWA
  rows of the tokens that had a peer when copied and have one now;
- accounting is the sum of the sub-pools'; the full side's buffers are the contiguous
  transfer descriptors, the SWA side's the state descriptors.

Example:
    >>> import torch
    >>> pool = SWAKVPool(size=8, size_swa=4, page_size=1, dtype=torch.bfloat16, head_num=1,
    ...                  head_dim=2, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
    ...                  device="cpu")
    >>> mapping = torch.tensor([0, 3, 0, 0, 0, 0, 0, 0, 0, -1])
    >>> pool.register_mapping(mapping)
    >>> pool.translate_loc_from_full_to_swa(torch.tensor([1, 2])).tolist()
    [3, 0]
    >>> k = torch.ones(1, 1, 2)
    >>> pool.set_kv_buffer(SWALayer(0), SWAWriteLoc(torch.tensor([1]), torch.tensor([3])), k, k)
    >>> pool.get_key_buffer(0)[3].tolist(), pool.get_key_buffer(1)[1].tolist()
    ([[1.0, 1.0]], [[0.0, 0.0]])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from kvcheck.pools.mha import MHATokenToKVPool
from kvcheck.pools.mla import MLATokenToKVPool

__all__ = ["SWAHostCopy", "SWAKVPool", "SWALayer", "SWAWriteLoc"]


@dataclass(frozen=True)
class SWALayer:
    """The part of SGLang's ``RadixAttention`` a pool reads: its global ``layer_id``."""

    layer_id: int


@dataclass(frozen=True)
class SWAWriteLoc:
    """SGLang's ``KVWriteLoc`` for a hybrid pool: the full-side ``loc`` and its SWA
    translation ``swa_loc`` (computed once per forward by the attention backend)."""

    loc: torch.Tensor
    swa_loc: torch.Tensor | None = None


@dataclass(frozen=True)
class SWAHostCopy:
    """A hybrid host copy: the full side's copy, the SWA side's copy of the tokens that had
    a peer (``None`` when none had) and which tokens those were (``swa_mask``)."""

    full: Any
    swa: Any
    swa_mask: torch.Tensor | None


def _unwrap(loc_info: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(loc_info, SWAWriteLoc):
        return loc_info.loc, loc_info.swa_loc
    return loc_info, None


class SWAKVPool:
    """SGLang's ``SWAKVPool(size, size_swa, page_size, dtype, head_num, head_dim,
    swa_attention_layer_ids, full_attention_layer_ids, device, ...)``.

    ``full_kv_pool_class`` / ``swa_kv_pool_class`` (default: ``token_to_kv_pool_class``,
    itself MHA by default) pick each side's family; ``full_kv_pool_kwargs`` /
    ``swa_kv_pool_kwargs`` replace the arguments each side gets besides ``size``,
    ``dtype`` and ``layer_num`` (default: ``page_size``, ``device``, ``head_num``,
    ``head_dim`` and any further keyword arguments).
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: list[int],
        full_attention_layer_ids: list[int],
        device: str,
        token_to_kv_pool_class: type = MHATokenToKVPool,
        full_kv_pool_class: type | None = None,
        swa_kv_pool_class: type | None = None,
        full_kv_pool_kwargs: dict[str, Any] | None = None,
        swa_kv_pool_kwargs: dict[str, Any] | None = None,
        enable_memory_saver: bool = False,
        **kwargs: Any,
    ) -> None:
        swa_ids, full_ids = list(swa_attention_layer_ids), list(full_attention_layer_ids)
        overlap = sorted(set(swa_ids) & set(full_ids))
        if overlap or len(set(swa_ids)) != len(swa_ids) or len(set(full_ids)) != len(full_ids):
            raise ValueError(
                f"swa_attention_layer_ids={swa_ids} and full_attention_layer_ids={full_ids} "
                "must name each layer once, on one side"
            )
        self.size, self.size_swa, self.page_size = size, size_swa, page_size
        self.dtype, self.head_num, self.head_dim = dtype, head_num, head_dim
        self.device = device
        self.swa_layer_nums, self.full_layer_nums = len(swa_ids), len(full_ids)
        self.layer_num = self.swa_layer_nums + self.full_layer_nums
        self.start_layer = 0
        common = {
            "page_size": page_size,
            "device": device,
            "head_num": head_num,
            "head_dim": head_dim,
            "enable_memory_saver": enable_memory_saver,
            **kwargs,
        }
        full_class = full_kv_pool_class or token_to_kv_pool_class
        swa_class = swa_kv_pool_class or token_to_kv_pool_class
        self.full_kv_pool = full_class(
            size=size,
            dtype=dtype,
            layer_num=self.full_layer_nums,
            **(common if full_kv_pool_kwargs is None else full_kv_pool_kwargs),
        )
        self.swa_kv_pool = swa_class(
            size=size_swa,
            dtype=dtype,
            layer_num=self.swa_layer_nums,
            **(common if swa_kv_pool_kwargs is None else swa_kv_pool_kwargs),
        )
        #: global layer id -> (the sub-pool's local layer id, whether it is a window layer)
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local, layer_id in enumerate(full_ids):
            self.layers_mapping[layer_id] = (local, False)
        for local, layer_id in enumerate(swa_ids):
            self.layers_mapping[layer_id] = (local, True)
        self.full_to_swa_index_mapping: torch.Tensor | None = None

    # --- layers and locations --------------------------------------------------------------

    def _side(self, layer_id: int, *, where: str) -> tuple[Any, int, bool]:
        if layer_id not in self.layers_mapping:
            raise ValueError(
                f"{where}: layer_id={layer_id} is not one of the pool's layers "
                f"{sorted(self.layers_mapping)}"
            )
        local, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local, is_swa

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Read SWA peers from ``full_to_swa_index_mapping`` (the allocator's live tensor)."""
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The SWA peers of full slots ``kv_indices`` (0: none; -1 stays -1)."""
        if self.full_to_swa_index_mapping is None:
            raise RuntimeError(
                "translate_loc_from_full_to_swa: no mapping registered (the SWA allocator "
                "registers it when it is built over this pool)"
            )
        return self.full_to_swa_index_mapping[kv_indices.long()]

    # --- reads -----------------------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s key buffer, from its sub-pool."""
        pool, local, _ = self._side(layer_id, where="get_key_buffer")
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Global layer ``layer_id``'s value buffer, from its sub-pool."""
        pool, local, _ = self._side(layer_id, where="get_value_buffer")
        return pool.get_value_buffer(local)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Both buffers of global layer ``layer_id``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    # --- writes ----------------------------------------------------------------------------

    def set_kv_buffer(
        self,
        layer: Any,
        loc_info: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Write one layer's rows: a full layer at ``loc``, a window layer at ``swa_loc``
        (required: the pool never translates a write itself)."""
        loc, swa_loc = _unwrap(loc_info)
        pool, local, is_swa = self._side(layer.layer_id, where="set_kv_buffer")
        if is_swa:
            if swa_loc is None:
                raise ValueError(
                    f"set_kv_buffer: layer {layer.layer_id} is a sliding-window layer; pass "
                    "its translated location as KVWriteLoc.swa_loc"
                )
            loc = swa_loc
        if isinstance(pool, MLATokenToKVPool):
            pool.set_kv_buffer(None, loc, cache_k, cache_v, layer_id_override=local)
        else:
            pool.set_kv_buffer(
                None, loc, cache_k, cache_v, k_scale, v_scale, layer_id_override=local
            )

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move full slots ``src_loc`` to ``tgt_loc`` on the full side, and their SWA peers
        on the SWA side."""
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)
        self.swa_kv_pool.move_kv_cache(
            self.translate_loc_from_full_to_swa(tgt_loc),
            self.translate_loc_from_full_to_swa(src_loc),
        )

    # --- host copies -----------------------------------------------------------------------

    def get_cpu_copy(self, indices: torch.Tensor) -> SWAHostCopy:
        """Copy full slots ``indices`` and the SWA rows of those with a peer."""
        full = self.full_kv_pool.get_cpu_copy(indices)
        if self.full_to_swa_index_mapping is None:
            return SWAHostCopy(full, None, None)
        peers = self.translate_loc_from_full_to_swa(indices)
        mask = peers > 0
        swa = self.swa_kv_pool.get_cpu_copy(peers[mask]) if bool(mask.any()) else None
        return SWAHostCopy(full, swa, mask.cpu())

    def load_cpu_copy(self, kv_cache_cpu: SWAHostCopy, indices: torch.Tensor) -> None:
        """Write a copy back at full slots ``indices``: the full side at every slot, the SWA
        side at the peers of the tokens that had one when copied and have one now."""
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu.full, indices)
        if kv_cache_cpu.swa is None or self.full_to_swa_index_mapping is None:
            return
        peers = self.translate_loc_from_full_to_swa(indices)
        old = kv_cache_cpu.swa_mask
        assert old is not None
        copied_peers = peers[old.to(peers.device)]
        keep = (copied_peers > 0).cpu()
        if not bool(keep.any()):
            return
        swa = kv_cache_cpu.swa
        if not bool(keep.all()):
            # The copy holds one row per copied token: keep the rows of those with a peer
            # now, by copying them out through a sub-pool of the same shape.
            swa = _filtered_host_copy(self.swa_kv_pool, swa, keep)
        self.swa_kv_pool.load_cpu_copy(swa, copied_peers[keep.to(peers.device)])

    # --- accounting and descriptors ---------------------------------------------------------

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)`` summed over both sub-pools (an MLA side counts as K)."""

        def split(pool: Any) -> tuple[int, int]:
            size = pool.get_kv_size_bytes()
            return size if isinstance(size, tuple) else (size, 0)

        (full_k, full_v), (swa_k, swa_v) = split(self.full_kv_pool), split(self.swa_kv_pool)
        return full_k + swa_k, full_v + swa_v

    @property
    def mem_usage(self) -> float:
        """GiB held by both sub-pools."""
        return sum(self.get_kv_size_bytes()) / (1 << 30)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The full side's transfer descriptors (PD sends the SWA side as state)."""
        infos: tuple[list[int], list[int], list[int]] = self.full_kv_pool.get_contiguous_buf_infos()
        return infos

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The SWA side's transfer descriptors, then each side's own state (a DSA side's
        index keys): PD sends this as the pool's state, so state a side keeps beside its KV
        rows must be in it too, or the decode side never receives it."""
        ptrs, lens, items = (list(part) for part in self.swa_kv_pool.get_contiguous_buf_infos())
        for side in (self.full_kv_pool, self.swa_kv_pool):
            side_state = getattr(side, "get_state_buf_infos", None)
            if callable(side_state):
                more_ptrs, more_lens, more_items = side_state()
                ptrs, lens, items = ptrs + more_ptrs, lens + more_lens, items + more_items
        return ptrs, lens, items


def _filtered_host_copy(pool: Any, copy: Any, keep: torch.Tensor) -> Any:
    """The rows ``keep`` selects of ``copy``, a sub-pool's host copy (its tensors carry one
    row per copied token in their first dimension)."""
    parts = {
        name: tuple(tensor[keep] for tensor in tensors) for name, tensors in copy.parts.items()
    }
    return dataclasses.replace(copy, parts=parts, num_tokens=int(keep.sum()))
