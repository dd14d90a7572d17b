"""On CUDA, every family gives the same bytes as on the CPU for the same operations."""

from __future__ import annotations

import pytest
import torch
from _pools_support import FACTORIES, all_buffers, layer, payload, random_bytes, same_bytes

from kvcheck.pools import DSATokenToKVPool, MHATokenToKVPool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none"
    ),
]


def run_ops(pool, device: str) -> None:
    """Writes to every slot, an overlapping move and a whole-page host copy round trip."""
    slots = torch.arange(pool.num_slots, device=device)
    for i, layer_id in enumerate(pool.layer_ids):
        if isinstance(pool, MHATokenToKVPool):
            shape_k = (pool.num_slots, pool.head_num, pool.head_dim)
            shape_v = (pool.num_slots, pool.head_num, pool.v_head_dim)
            k = payload(shape_k, pool.dtype, seed=i).to(device)
            v = payload(shape_v, pool.dtype, seed=50 + i).to(device)
            pool.set_kv_buffer(layer(layer_id), slots, k, v)
        else:
            rows = payload((pool.num_slots, 1, pool.kv_cache_dim), pool.dtype, seed=i)
            pool.set_kv_buffer(layer(layer_id), slots.int(), rows.to(device), None)
        if isinstance(pool, DSATokenToKVPool) and not pool.skip_topk_layers[i]:
            n = pool.num_slots
            key = random_bytes((n, pool.index_head_dim), seed=i).to(device)
            scale = torch.rand(n, 1, generator=torch.Generator().manual_seed(i)).to(device)
            pool.set_index_k_scale_buffer(layer_id, slots, key, scale)
    tgt = torch.tensor([2, 3, 4, 9], device=device)
    src = torch.tensor([1, 2, 3, 1], device=device, dtype=torch.int32)
    pool.move_kv_cache(tgt, src)
    copy = pool.get_cpu_copy(torch.arange(4, 8, device=device))
    assert all(t.device.type == "cpu" for part in copy.parts.values() for t in part)
    pool.load_cpu_copy(copy, torch.arange(8, 12))  # CPU indices are accepted too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("family", list(FACTORIES))
def test_cuda_pool_matches_cpu_pool_byte_for_byte(family, dtype):
    """The same operations leave identical bytes in a CUDA pool and a CPU pool."""
    on_cpu = FACTORIES[family](dtype=dtype)
    on_cuda = FACTORIES[family](dtype=dtype, device="cuda")
    assert on_cuda.device == "cuda"
    run_ops(on_cpu, "cpu")
    run_ops(on_cuda, "cuda")
    on_cuda.check_valid()
    for cpu_buffer, cuda_buffer in zip(all_buffers(on_cpu), all_buffers(on_cuda), strict=True):
        assert cuda_buffer.is_cuda
        assert same_bytes(cpu_buffer, cuda_buffer.cpu())


def test_cuda_pool_refuses_payloads_on_the_cpu():
    """A CUDA pool takes payloads only on its device (locations may be on the CPU)."""
    pool = FACTORIES["mla"](device="cuda")
    with pytest.raises(ValueError, match="cache_k must be on the pool's device cuda"):
        pool.set_kv_buffer(layer(0), torch.tensor([1]), torch.zeros(1, 1, 6), None)
    assert not pool.kv_buffer[0].any()
