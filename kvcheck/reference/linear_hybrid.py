"""What a linear-attention hybrid pool must hold, written to be obviously right.

The reference keys everything by what the caller knows: full-attention K/V by (global layer
id, token slot), mamba state by (request, global mamba layer id). Slot numbers of the mamba
pool are the pool's business: the machine reads the pool at whatever slot it handed the
request. Every value is a small integer *seed*; the tensor a seed stands for is
:func:`pattern` (its position-dependent filling catches a copy that moves elements around).
Byte counts come from formulas here, not from the pools.

Example:
    >>> from kvcheck.specs import LinearHybridSpec
    >>> ref = ReferenceLinearHybrid(LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0,)))
    >>> ref.admit("a")
    >>> ref.write_temporal("a", 0, seed=5)
    >>> ref.fork("a", "b")
    >>> ref.requests["b"].temporal
    {0: 5}
    >>> pattern(2, (2, 2)).tolist()
    [[2000.0, 2001.0], [2002.0, 2003.0]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvcheck.specs import LinearHybridSpec

__all__ = ["ReferenceLinearHybrid", "ReferenceRequest", "pattern"]

_FLOAT32_BYTES = 4


def pattern(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 tensor seed ``seed`` stands for: element ``i`` (row-major) is
    ``seed * 1000 + i``; seed 0 is all zeros (a cleared state)."""
    count = 1
    for dim in shape:
        count *= dim
    values = []
    for i in range(count):
        values.append(0.0 if seed == 0 else float(seed * 1000 + i))
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


@dataclass
class ReferenceRequest:
    """One request's truth: its token slots and the seeds of its mamba state."""

    tokens: list[int] = field(default_factory=list)
    #: (global mamba layer, conv index) -> seed; absent means zero.
    conv: dict[tuple[int, int], int] = field(default_factory=dict)
    #: global mamba layer -> seed; absent means zero.
    temporal: dict[int, int] = field(default_factory=dict)
    #: (global mamba layer, draft step) -> seed of the draft SSM state verify wrote.
    draft_ssm: dict[tuple[int, int], int] = field(default_factory=dict)
    #: (global mamba layer, conv index, draft step) -> seed of the draft conv window.
    draft_conv: dict[tuple[int, int, int], int] = field(default_factory=dict)


class ReferenceLinearHybrid:
    """Full KV by (layer, slot) and mamba state by request, with the caller's operations."""

    def __init__(self, spec: LinearHybridSpec) -> None:
        self.spec = spec
        #: (global full layer, token slot) -> (K seed, V seed).
        self.kv: dict[tuple[int, int], tuple[int, int]] = {}
        self.requests: dict[str, ReferenceRequest] = {}

    # --- requests -----------------------------------------------------------------------

    def admit(self, name: str) -> None:
        """A new request: a row and a cleared mamba slot (no state, no drafts)."""
        self.requests[name] = ReferenceRequest()

    def release(self, name: str) -> None:
        """The request finished or was retracted: its row and mamba slot are free."""
        del self.requests[name]

    def flush(self) -> None:
        """Every request gone; K/V bytes stay where they were (a flush frees, not zeroes)."""
        self.requests = {}

    # --- full attention -----------------------------------------------------------------

    def write_kv(self, layer: int, slot: int, k_seed: int, v_seed: int) -> None:
        """K/V of one token at ``slot`` of global full layer ``layer``."""
        self.kv[(layer, slot)] = (k_seed, v_seed)

    def move_kv(self, tgt: list[int], src: list[int]) -> None:
        """Every full layer's K/V at ``src[i]`` copied to ``tgt[i]`` (sources read first)."""
        moved = {}
        for layer in self.spec.full_layer_ids:
            for t, s in zip(tgt, src, strict=True):
                moved[(layer, t)] = self.kv.get((layer, s), (0, 0))
        for key, value in moved.items():
            self.kv[key] = value

    def kv_at(self, layer: int, slot: int) -> tuple[int, int]:
        """The (K seed, V seed) at ``slot`` of ``layer`` (zeros if never written)."""
        return self.kv.get((layer, slot), (0, 0))

    # --- mamba state --------------------------------------------------------------------

    def write_conv(self, name: str, layer: int, index: int, seed: int) -> None:
        """The request's conv window ``index`` of mamba layer ``layer``."""
        self.requests[name].conv[(layer, index)] = seed

    def write_temporal(self, name: str, layer: int, seed: int) -> None:
        """The request's SSM state of mamba layer ``layer``."""
        self.requests[name].temporal[layer] = seed

    def write_drafts(self, name: str, layer: int, step: int, ssm_seed: int, conv_seed: int) -> None:
        """Verify wrote draft step ``step``'s SSM state and conv windows (every conv index
        gets ``conv_seed + index``)."""
        request = self.requests[name]
        request.draft_ssm[(layer, step)] = ssm_seed
        for index in range(len(self.spec.conv_shapes)):
            request.draft_conv[(layer, index, step)] = conv_seed + index

    def commit_draft(self, name: str, step: int) -> None:
        """The accepted step's draft state becomes the request's state, on every layer."""
        request = self.requests[name]
        for layer in self.spec.mamba_layer_ids:
            request.temporal[layer] = request.draft_ssm[(layer, step)]
            for index in range(len(self.spec.conv_shapes)):
                request.conv[(layer, index)] = request.draft_conv[(layer, index, step)]

    def fork(self, src: str, dst: str) -> None:
        """Prefix sharing: ``dst`` (a new request) starts from ``src``'s state; drafts stay."""
        request = ReferenceRequest()
        request.conv = dict(self.requests[src].conv)
        request.temporal = dict(self.requests[src].temporal)
        self.requests[dst] = request

    # --- sizes --------------------------------------------------------------------------

    def kv_bytes(self) -> tuple[int, int]:
        """Bytes of the full K and of the full V buffers."""
        spec = self.spec
        per_layer = (spec.size + spec.page_size) * spec.head_num * spec.head_dim * _FLOAT32_BYTES
        return per_layer * len(spec.full_layer_ids), per_layer * len(spec.full_layer_ids)

    def _elements(self, shape: tuple[int, ...]) -> int:
        count = 1
        for dim in shape:
            count *= dim
        return count

    def mamba_bytes(self) -> int:
        """Bytes of every mamba tensor: conv and temporal per slot, and the drafts' scratch."""
        spec = self.spec
        per_slot = self._elements(spec.temporal_shape)
        for shape in spec.conv_shapes:
            per_slot += self._elements(shape)
        slots = spec.mamba_size + 1
        total = per_slot * slots * len(spec.mamba_layer_ids)
        if spec.draft_tokens is not None:
            total += per_slot * slots * spec.draft_tokens * len(spec.mamba_layer_ids)
        return total * _FLOAT32_BYTES

    def state_descriptions(self) -> list[tuple[int, int]]:
        """PD's state registration, entry by entry: (byte length, bytes of one slot) for each
        conv tensor's layers, then the temporal state's layers; no draft scratch."""
        spec = self.spec
        entries = []
        for shape in (*spec.conv_shapes, spec.temporal_shape):
            item = self._elements(shape) * _FLOAT32_BYTES
            for _layer in spec.mamba_layer_ids:
                entries.append(((spec.mamba_size + 1) * item, item))
        return entries
