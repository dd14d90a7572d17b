"""Small pools, payloads and byte-level comparisons shared by the pool tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from kvcheck.pools import (
    DSATokenToKVPool,
    KVCache,
    MHATokenToKVPool,
    MLATokenToKVPool,
    NoOpMHATokenToKVPool,
)

CPU = torch.device("cpu")


def layer(layer_id: int) -> SimpleNamespace:
    """A stand-in for SGLang's RadixAttention: only ``layer_id`` is read."""
    return SimpleNamespace(layer_id=layer_id)


def locs(*values: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def make_mha(**overrides: Any) -> MHATokenToKVPool:
    kwargs: dict[str, Any] = dict(
        size=8,
        page_size=4,
        dtype=torch.float32,
        head_num=2,
        head_dim=4,
        layer_num=2,
        device="cpu",
    )
    kwargs.update(overrides)
    return MHATokenToKVPool(**kwargs)


def make_noop(**overrides: Any) -> NoOpMHATokenToKVPool:
    kwargs: dict[str, Any] = dict(
        size=8,
        page_size=4,
        dtype=torch.float32,
        head_num=2,
        head_dim=4,
        layer_num=2,
        device="cpu",
        v_head_dim=3,
    )
    kwargs.update(overrides)
    return NoOpMHATokenToKVPool(**kwargs)


def make_mla(**overrides: Any) -> MLATokenToKVPool:
    kwargs: dict[str, Any] = dict(
        size=8,
        page_size=4,
        dtype=torch.float32,
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        layer_num=2,
        device="cpu",
    )
    kwargs.update(overrides)
    return MLATokenToKVPool(**kwargs)


def make_dsa(**overrides: Any) -> DSATokenToKVPool:
    kwargs: dict[str, Any] = dict(
        size=8,
        page_size=4,
        kv_lora_rank=4,
        dtype=torch.float32,
        qk_rope_head_dim=2,
        layer_num=3,
        device="cpu",
        index_head_dim=128,
        skip_topk_layers=[False, True, False],
    )
    kwargs.update(overrides)
    return DSATokenToKVPool(**kwargs)


FACTORIES = {"mha": make_mha, "mla": make_mla, "dsa": make_dsa}


def all_buffers(pool: KVCache) -> list[torch.Tensor]:
    """Every storage tensor a pool owns, in a fixed order."""
    names = ("k_buffer", "v_buffer", "kv_buffer", "index_k_with_scale_buffer")
    return [t for name in names for t in getattr(pool, name, [])]


def snapshot(pool: KVCache) -> list[torch.Tensor]:
    return [t.clone() for t in all_buffers(pool)]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe): compare the raw bytes."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def assert_unchanged(pool: KVCache, before: list[torch.Tensor]) -> None:
    after = all_buffers(pool)
    assert len(after) == len(before)
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        assert same_bytes(old, new), f"buffer {i} changed"


def payload(shape: tuple[int, ...], dtype: torch.dtype, *, seed: int) -> torch.Tensor:
    """Deterministic finite values in ``dtype`` (fp8 via a float32 round trip)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=gen) * 4
    return values.to(dtype)


def random_bytes(shape: tuple[int, ...], *, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def fill_latent(pool: MLATokenToKVPool, *, seed: int = 0) -> None:
    """Give every slot of every layer distinct latent values."""
    slots = torch.arange(pool.num_slots)
    for i, layer_id in enumerate(pool.layer_ids):
        rows = payload((pool.num_slots, 1, pool.kv_cache_dim), pool.dtype, seed=seed + i)
        pool.set_kv_buffer(layer(layer_id), slots, rows, None)


def fill_mha(pool: MHATokenToKVPool, *, seed: int = 0) -> None:
    slots = torch.arange(pool.num_slots)
    for i, layer_id in enumerate(pool.layer_ids):
        k = payload((pool.num_slots, pool.head_num, pool.head_dim), pool.dtype, seed=seed + i)
        v = payload(
            (pool.num_slots, pool.head_num, pool.v_head_dim), pool.dtype, seed=seed + 100 + i
        )
        pool.set_kv_buffer(layer(layer_id), slots, k, v)


def index_tokens(pool: DSATokenToKVPool) -> int:
    """How many token ids (from 0) can hold index keys: slots that have an index page."""
    return min(pool.num_slots, pool.num_index_pages * pool.page_size)


def fill_index_k(pool: DSATokenToKVPool, *, seed: int = 0) -> None:
    """Random bytes in every non-skip layer's index buffer, written token by token."""
    tokens = torch.arange(index_tokens(pool))
    n = tokens.numel()
    for i, layer_id in enumerate(pool.layer_ids):
        if pool.skip_topk_layers[i]:
            continue
        key = random_bytes((n, pool.index_head_dim), seed=seed + i)
        scale = random_bytes((n, pool.index_layout.scale_bytes), seed=seed + 50 + i)
        pool.set_index_k_scale_buffer(layer_id, tokens, key, scale)


def fill(pool: KVCache, *, seed: int = 0) -> None:
    """Distinct data in every slot of every buffer of an MHA, MLA or DSA pool."""
    if isinstance(pool, MHATokenToKVPool):
        fill_mha(pool, seed=seed)
    else:
        assert isinstance(pool, MLATokenToKVPool)
        fill_latent(pool, seed=seed)
    if isinstance(pool, DSATokenToKVPool):
        fill_index_k(pool, seed=seed)


def token_index_bytes(pool: DSATokenToKVPool, local: int, token: int) -> tuple[bytes, bytes]:
    """(key bytes, scale bytes) of ``token`` in local layer ``local``, read from the page
    row by the documented column formulas (independent of the pool's own views)."""
    row = pool.index_k_with_scale_buffer[local][token // pool.page_size]
    offset = token % pool.page_size
    d, s = pool.index_head_dim, pool.index_head_dim // 128 * 4
    key = row[offset * d : (offset + 1) * d]
    base = pool.page_size * d
    scale = row[base + offset * s : base + (offset + 1) * s]
    return bytes(key.tolist()), bytes(scale.tolist())


def token_rows(pool: KVCache, token: int) -> list[bytes]:
    """The bytes every token-row buffer holds for ``token`` (K, V or latent rows)."""
    names = ("k_buffer", "v_buffer", "kv_buffer")
    return [
        bytes(t[token].contiguous().view(torch.uint8).flatten().tolist())
        for name in names
        for t in getattr(pool, name, [])
    ]


def token_state(pool: KVCache, token: int) -> list[bytes]:
    """All bytes a pool holds for ``token``: its rows, plus DSA index key and scale bytes."""
    state = token_rows(pool, token)
    if isinstance(pool, DSATokenToKVPool):
        for i, skip in enumerate(pool.skip_topk_layers):
            if not skip:
                state.extend(token_index_bytes(pool, i, token))
    return state
