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
    """Writes to every slot, converted and partial writes, an overlapping move and a
    token-granular host copy round trip."""
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
    first = pool.layer_ids[0]
    if isinstance(pool, MHATokenToKVPool):
        # A payload in another dtype, scaled (one scale a CPU tensor), then a prefix-valid write.
        shape = (3, pool.head_num, pool.head_dim)
        k = payload(shape, torch.float32, seed=7).to(device)
        v = payload((3, pool.head_num, pool.v_head_dim), torch.float32, seed=8).to(device)
        pool.set_kv_buffer(
            layer(first), torch.tensor([5, 0, 7], device=device), k, v, 0.37, torch.tensor([3.1])
        )
        grid = torch.tensor([[10, 11], [6, -1]], device=device)
        lens = torch.tensor([2, 1], dtype=torch.int32)
        k4 = payload((4, pool.head_num, pool.head_dim), torch.bfloat16, seed=9).to(device)
        v4 = payload((4, pool.head_num, pool.v_head_dim), torch.bfloat16, seed=10).to(device)
        pool.set_kv_buffer_prefix_valid(layer(first), grid, lens, k4, v4, k_scale=2.5)
    else:
        nope = payload((2, 1, pool.kv_lora_rank), torch.float32, seed=11).to(device)
        rope = payload((2, 1, pool.qk_rope_head_dim), torch.float32, seed=12).to(device)
        pool.set_mla_kv_buffer(None, torch.tensor([6, 1], device=device), nope, rope, first)
    tgt = torch.tensor([2, 3, 4, 9], device=device)
    src = torch.tensor([1, 2, 3, 1], device=device, dtype=torch.int32)
    pool.move_kv_cache(tgt, src)
    copy = pool.get_cpu_copy(torch.tensor([4, 5, 6, 7, 9], device=device))  # 1.25 pages
    assert all(t.device.type == "cpu" for part in copy.parts.values() for t in part)
    pool.load_cpu_copy(copy, torch.tensor([8, 10, 11, 0, 3]))  # CPU indices are accepted too


def reads(pool) -> list[torch.Tensor]:
    """What the read-only entry points return, on the CPU."""
    if isinstance(pool, MHATokenToKVPool):
        return []
    loc = torch.tensor([3, 3, 8], device=pool.device)
    nope, rope = pool.get_mla_kv_buffer(layer(pool.layer_ids[-1]), loc, torch.float32)
    out = [nope.cpu(), rope.cpu()]
    if isinstance(pool, DSATokenToKVPool):
        table = torch.tensor([[2, 0], [1, 1]], device=pool.device)
        lens = torch.tensor([6, 2], device=pool.device)
        out.extend(t.cpu() for t in pool.get_index_k_scale_buffer(0, lens, table, 8, 6))
    return out


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
    for cpu_read, cuda_read in zip(reads(on_cpu), reads(on_cuda), strict=True):
        assert same_bytes(cpu_read, cuda_read)
    assert on_cpu.get_contiguous_buf_infos()[1:] == on_cuda.get_contiguous_buf_infos()[1:]


def test_cuda_pool_refuses_payloads_on_the_cpu():
    """A CUDA pool takes payloads only on its device (locations may be on the CPU)."""
    pool = FACTORIES["mla"](device="cuda")
    with pytest.raises(ValueError, match="cache_k must be on the pool's device cuda"):
        pool.set_kv_buffer(layer(0), torch.tensor([1]), torch.zeros(1, 1, 6), None)
    assert not pool.kv_buffer[0].any()
