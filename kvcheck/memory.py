"""Bytes held by a pool, measured three ways.

1. **Storages** (any device): the distinct tensor storages behind a pool's KV buffers.
   Counting storages rather than shapes catches a zero-row view cut from a full
   allocation, which has the right shape but still pins the memory.
2. **The CUDA caching allocator** (CUDA only): ``torch.cuda.memory_allocated`` before and
   after building a pool. The allocator hands out blocks, not bytes: a request of ``n``
   bytes up to 1 MiB takes ``n`` rounded up to a multiple of 512, and a zero-byte tensor
   takes nothing. :func:`expected_cuda_allocation_bytes` predicts the delta exactly.
3. **Shapes on ``meta``** (any scale): a pool built on ``meta`` has shapes and no memory,
   so production configurations (78 layers, millions of tokens) can be accounted for on
   a laptop. :func:`production_dsa_spec` builds such specs from a model config.

Example:
    >>> from kvcheck.geometry import buffer_bytes
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="dsa", size=8, page_size=4, layer_num=2, dtype="bfloat16",
    ...                 skip_topk_layers=(False, True))
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> storage_bytes(pool), shape_bytes(pool), buffer_bytes(spec)
    (2736, 2736, 2736)
    >>> cuda_block_bytes(0), cuda_block_bytes(1), cuda_block_bytes(513)
    (0, 512, 1024)
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import torch

from kvcheck.geometry import KV_BUFFER_ATTRIBUTES, tensor_nbytes
from kvcheck.reference import reference_skip_mask
from kvcheck.specs import PoolSpec

__all__ = [
    "CUDA_BLOCK_BYTES",
    "CUDA_SMALL_REQUEST_BYTES",
    "BufferStorage",
    "BufferTensor",
    "buffer_storages",
    "buffer_tensors",
    "cuda_allocator_config_problem",
    "cuda_block_bytes",
    "expected_cuda_allocation_bytes",
    "measure_cuda_allocation",
    "production_dsa_spec",
    "shape_bytes",
    "storage_bytes",
]

#: The caching allocator rounds every request up to a multiple of this (``kMinBlockSize``).
CUDA_BLOCK_BYTES = 512
#: Requests up to this size (``kSmallSize``) come from 2 MiB segments that are always split
#: at the rounded size, so the allocated bytes are exactly the rounded request. Larger
#: requests may be given a whole unsplit block (up to 1 MiB more), which no formula predicts.
CUDA_SMALL_REQUEST_BYTES = 1 << 20

_T = TypeVar("_T")


@dataclass(frozen=True)
class BufferStorage:
    """One KV buffer tensor and the storage behind it.

    ``storage_nbytes`` is the whole storage's size (more than ``nbytes`` for a view);
    ``shared_with`` names the first buffer seen on the same storage, or is None.
    """

    name: str
    layer: int
    nbytes: int
    storage_nbytes: int
    shared_with: str | None


class BufferTensor(NamedTuple):
    """One KV buffer tensor of a pool: attribute name, local layer, the tensor."""

    name: str
    layer: int
    tensor: torch.Tensor


def buffer_tensors(pool: Any) -> list[BufferTensor]:
    """Every KV buffer tensor of ``pool`` (:data:`kvcheck.geometry.KV_BUFFER_ATTRIBUTES`),
    in attribute order.

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool = MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                         kv_lora_rank=2, qk_rope_head_dim=2, layer_num=1,
        ...                         device="meta")
        >>> [(item.name, item.layer) for item in buffer_tensors(pool)]
        [('kv_buffer', 0)]
    """
    found = []
    for name in KV_BUFFER_ATTRIBUTES:
        held = getattr(pool, name, None)
        if isinstance(held, torch.Tensor):  # one tensor every layer shares (a workspace)
            held = [held]
        for layer, tensor in enumerate(held or ()):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"pool.{name}[{layer}]={tensor!r} is not a torch.Tensor")
            found.append(BufferTensor(name, layer, tensor))
    return found


def _storage_key(tensor: torch.Tensor) -> int:
    # The address of the storage object itself: unlike data_ptr() it tells storages apart
    # on "meta" (every data pointer is 0 there) and for empty tensors.
    return int(tensor.untyped_storage()._cdata)


def buffer_storages(pool: Any) -> list[BufferStorage]:
    """Every KV buffer tensor of ``pool`` with the storage it lives in, in attribute order.

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool = MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                         kv_lora_rank=2, qk_rope_head_dim=2, layer_num=1,
        ...                         device="meta")
        >>> buffer_storages(pool)
        [BufferStorage(name='kv_buffer', layer=0, nbytes=24, storage_nbytes=24, shared_with=None)]
    """
    seen: dict[int, str] = {}
    found: list[BufferStorage] = []
    for name, layer, tensor in buffer_tensors(pool):
        key = _storage_key(tensor)
        storage_nbytes = int(tensor.untyped_storage().nbytes())
        found.append(
            BufferStorage(
                name=name,
                layer=layer,
                nbytes=tensor.numel() * tensor.element_size(),
                storage_nbytes=storage_nbytes,
                shared_with=seen.get(key),
            )
        )
        seen.setdefault(key, f"{name}[{layer}]")
    return found


def storage_bytes(pool: Any) -> int:
    """Bytes of the distinct storages behind ``pool``'s KV buffers (works on any device).

    Example:
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> storage_bytes(MHATokenToKVPool(size=3, page_size=1, dtype=torch.float32,
        ...                                head_num=1, head_dim=2, layer_num=2, device="cpu"))
        128
    """
    return sum(item.storage_nbytes for item in buffer_storages(pool) if item.shared_with is None)


def shape_bytes(pool: Any) -> int:
    """Bytes ``pool``'s KV buffers span by their shapes (``numel * itemsize``, any device).

    Example:
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> shape_bytes(MHATokenToKVPool(size=1 << 20, page_size=64, dtype=torch.bfloat16,
        ...                              head_num=8, head_dim=128, layer_num=36, device="meta"))
        154628259840
    """
    return sum(tensor.numel() * tensor.element_size() for _, _, tensor in buffer_tensors(pool))


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes ``torch.cuda.memory_allocated`` grows by for one tensor of ``nbytes`` bytes.

    Zero bytes allocate nothing; otherwise the request is rounded up to a multiple of
    :data:`CUDA_BLOCK_BYTES`. Only requests up to :data:`CUDA_SMALL_REQUEST_BYTES` are
    exact; larger ones raise ``ValueError``.

    Example:
        >>> [cuda_block_bytes(n) for n in (0, 1, 512, 513, 1 << 20)]
        [0, 512, 512, 1024, 1048576]
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be a non-negative int")
    if nbytes > CUDA_SMALL_REQUEST_BYTES:
        raise ValueError(
            f"nbytes={nbytes} exceeds {CUDA_SMALL_REQUEST_BYTES} (kSmallSize): the caching "
            "allocator may hand out an unsplit larger block, so the delta is not predictable"
        )
    if nbytes == 0:
        return 0
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def expected_cuda_allocation_bytes(spec: PoolSpec) -> int:
    """What building a pool from ``spec`` on CUDA adds to ``torch.cuda.memory_allocated``.

    One block per KV tensor (:func:`cuda_block_bytes`); skip layers' empty index buffers
    add 0.

    Example:
        >>> expected_cuda_allocation_bytes(PoolSpec(family="dsa", size=2, page_size=2,
        ...     layer_num=2, dtype="bfloat16", kv_lora_rank=4, qk_rope_head_dim=2,
        ...     skip_topk_layers=(True, False)))
        2048
    """
    return sum(
        cuda_block_bytes(nbytes) for sizes in tensor_nbytes(spec).values() for nbytes in sizes
    )


def cuda_allocator_config_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why the allocator's rounding cannot be predicted here, or None when it can.

    ``PYTORCH_CUDA_ALLOC_CONF`` (or its ``PYTORCH_ALLOC_CONF`` spelling) may enable
    expandable segments or power-of-two rounding, which change block sizes.

    Example:
        >>> cuda_allocator_config_problem({})
        >>> cuda_allocator_config_problem({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' changes the caching allocator's ..."
    """
    env = dict(os.environ) if environ is None else environ
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = env.get(name, "").strip()
        if value:
            return (
                f"{name}={value!r} changes the caching allocator's block sizes; the exact "
                "allocation check assumes the default configuration"
            )
    return None


def measure_cuda_allocation(
    build: Callable[[], _T], *, device: str | torch.device
) -> tuple[_T, int]:
    """Run ``build()`` and return its result with the bytes it left allocated on ``device``.

    Garbage is collected first and collection is paused while ``build`` runs, so freeing
    unrelated tensors cannot hide an allocation. Raises ``ValueError`` for a non-CUDA device.

    Example::

        pool, delta = measure_cuda_allocation(lambda: target.make_pool(spec, device="cuda:0"),
                                              device="cuda:0")
    """
    resolved = torch.device(device)
    if resolved.type != "cuda":
        raise ValueError(f"device={device!r} is not a CUDA device")
    gc.collect()
    torch.cuda.synchronize(resolved)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = torch.cuda.memory_allocated(resolved)
        result = build()
        torch.cuda.synchronize(resolved)
        after = torch.cuda.memory_allocated(resolved)
    finally:
        if was_enabled:
            gc.enable()
    return result, after - before


def production_dsa_spec(
    model: Any,
    *,
    num_tokens: int,
    page_size: int = 64,
    dtype: str = "float8_e4m3fn",
    honour_skip_layers: bool = True,
) -> PoolSpec:
    """A DSA :class:`PoolSpec` for ``model`` (a ``kvcheck.vocabulary.ModelConfig``) at scale.

    The skip mask comes from :func:`kvcheck.reference.reference_skip_mask`;
    ``honour_skip_layers=False`` allocates every layer (a draft worker or HiSparse).
    Build it on ``meta``: the buffers are far too large for host memory.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> spec = production_dsa_spec(GLM_5_2_LIKE, num_tokens=2_000_000)
        >>> spec.layer_num, sum(spec.skip_mask)
        (78, 57)
    """
    if getattr(model, "attention_arch", None) != "dsa":
        raise ValueError(f"model={getattr(model, 'name', model)!r} is not a DSA model")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens!r} must be a positive int")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size={page_size!r} must be a positive int")
    mask = reference_skip_mask(model, is_draft_worker=not honour_skip_layers)
    return PoolSpec(
        family="dsa",
        size=num_tokens,
        page_size=page_size,
        layer_num=model.num_hidden_layers,
        dtype=dtype,
        kv_lora_rank=model.kv_lora_rank,
        qk_rope_head_dim=model.qk_rope_head_dim,
        index_head_dim=model.index_head_dim,
        skip_topk_layers=mask,
    )
