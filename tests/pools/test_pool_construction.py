"""Construction: buffer shapes, dtypes, byte accounting and layer mapping per family."""

from __future__ import annotations

import time

import pytest
import torch
from _pools_support import layer, locs, make_dsa, make_mha, make_mla, make_noop, payload

from kvcheck.pools import (
    DSATokenToKVPool,
    KVCache,
    MHATokenToKVPool,
    MLATokenToKVPool,
    NoOpMHATokenToKVPool,
)
from kvcheck.pools.base import GIB

ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def test_public_names_are_exported():
    """kvcheck.pools exports the abstract base and the four families, all KVCache subclasses."""
    for cls in (MHATokenToKVPool, NoOpMHATokenToKVPool, MLATokenToKVPool, DSATokenToKVPool):
        assert issubclass(cls, KVCache)
    assert issubclass(NoOpMHATokenToKVPool, MHATokenToKVPool)
    assert issubclass(DSATokenToKVPool, MLATokenToKVPool)


def test_kvcache_is_abstract():
    """KVCache cannot be instantiated on its own."""
    with pytest.raises(TypeError):
        KVCache(size=8, page_size=4, dtype=torch.float32, layer_num=1, device="cpu")  # type: ignore[abstract]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_mha_shapes_dtype_and_bytes(dtype):
    """MHA: K/V per layer [size+page_size, head_num, dim], zero-filled, bytes summed per side."""
    pool = make_mha(
        dtype=dtype, size=10, page_size=3, head_num=2, head_dim=4, v_head_dim=6, layer_num=3
    )
    store = torch.uint8 if dtype in FP8 else dtype
    assert pool.store_dtype == store
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    for k, v in zip(pool.k_buffer, pool.v_buffer, strict=True):
        assert k.shape == (13, 2, 4) and v.shape == (13, 2, 6)
        assert k.dtype == v.dtype == store
        assert not k.any() and not v.any()
    item = torch.empty((), dtype=store).element_size()
    assert pool.get_kv_size_bytes() == (3 * 13 * 2 * 4 * item, 3 * 13 * 2 * 6 * item)
    assert pool.mem_usage == sum(pool.get_kv_size_bytes()) / GIB
    pool.check_valid()


def test_mha_v_head_dim_defaults_to_head_dim():
    """Without v_head_dim, V buffers use head_dim."""
    pool = make_mha(head_dim=5)
    assert pool.v_head_dim == 5 and pool.v_buffer[0].shape[-1] == 5


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_mla_shapes_and_bytes_follow_sglang(dtype):
    """MLA: one latent buffer [size+page_size, 1, rank+rope] per layer; bytes are one int."""
    pool = make_mla(
        dtype=dtype, size=6, page_size=2, kv_lora_rank=8, qk_rope_head_dim=3, layer_num=4
    )
    item = 1 if dtype in FP8 else torch.empty((), dtype=dtype).element_size()
    assert [tuple(b.shape) for b in pool.kv_buffer] == [(8, 1, 11)] * 4
    size_bytes = pool.get_kv_size_bytes()
    assert isinstance(size_bytes, int) and size_bytes == 4 * 8 * 11 * item
    assert pool.mem_usage == size_bytes / GIB
    pool.check_valid()


def test_mla_value_buffer_is_the_lora_part_of_the_latent_row():
    """get_value_buffer is the first kv_lora_rank channels of the key (latent) buffer."""
    pool = make_mla(kv_lora_rank=4, qk_rope_head_dim=2)
    row = torch.arange(6, dtype=torch.float32).view(1, 1, 6)
    pool.set_kv_buffer(layer(1), locs(3), row, None)
    k, v = pool.get_kv_buffer(1)
    assert k.shape == (12, 1, 6) and v.shape == (12, 1, 4)
    assert v[3].tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert v.data_ptr() == k.data_ptr()


def test_mla_accepts_zero_rope_dim():
    """qk_rope_head_dim=0 (no rope part) is accepted, as in SGLang."""
    pool = make_mla(qk_rope_head_dim=0, kv_lora_rank=4)
    assert pool.kv_buffer[0].shape == (12, 1, 4)


def test_dsa_shapes_and_bytes_follow_sglang():
    """DSA: latent buffers plus uint8 index pages; bytes = latent + index (one int)."""
    pool = make_dsa(size=8, page_size=4, index_head_dim=256, skip_topk_layers=[False, True, False])
    num_pages = (8 + 4 + 1) // 4
    row_bytes = 4 * (256 + 256 // 128 * 4)
    assert pool.num_index_pages == num_pages
    assert [tuple(b.shape) for b in pool.index_k_with_scale_buffer] == [
        (num_pages, row_bytes),
        (0, row_bytes),
        (num_pages, row_bytes),
    ]
    assert all(b.dtype == torch.uint8 for b in pool.index_k_with_scale_buffer)
    latent = 3 * 12 * (4 + 2) * 4
    assert pool.get_kv_size_bytes() == latent + 2 * num_pages * row_bytes
    assert pool.mem_usage == pool.get_kv_size_bytes() / GIB
    pool.check_valid()


def test_dsa_index_buf_size_sets_the_page_count():
    """index_buf_size, not size, decides how many index pages each layer has."""
    pool = make_dsa(size=8, page_size=4, index_buf_size=20)
    assert pool.index_buf_size == 20
    assert pool.index_k_with_scale_buffer[0].shape[0] == (20 + 4 + 1) // 4


def test_dsa_skip_mask_defaults_to_no_skips():
    """Without skip_topk_layers every layer gets an index buffer."""
    pool = make_dsa(skip_topk_layers=None, layer_num=2)
    assert pool.skip_topk_layers == [False, False]
    assert all(b.shape[0] > 0 for b in pool.index_k_with_scale_buffer)


@pytest.mark.parametrize("page_size", [1, 3, 64], ids=lambda p: f"page{p}")
def test_dsa_accepts_any_page_size(page_size):
    """DSA pools build for any page_size >= 1, not only SGLang's CUDA 64."""
    pool = make_dsa(page_size=page_size)
    assert pool.index_k_with_scale_buffer[0].shape[1] == page_size * 132
    pool.check_valid()


@pytest.mark.parametrize("start_layer", [0, 5])
def test_start_layer_maps_global_ids_to_local_buffers(start_layer):
    """Layer ids are global: id start_layer+i reads and writes local buffer i."""
    pool = make_mha(layer_num=2, start_layer=start_layer)
    assert pool.layer_ids == range(start_layer, start_layer + 2)
    assert pool.end_layer == start_layer + 1
    k = payload((1, 2, 4), torch.float32, seed=1)
    pool.set_kv_buffer(layer(start_layer + 1), locs(2), k, k)
    assert torch.equal(pool.k_buffer[1][2], k[0])
    assert not pool.k_buffer[0].any()
    assert pool.get_key_buffer(start_layer + 1).data_ptr() == pool.k_buffer[1].data_ptr()


@pytest.mark.parametrize("family", ["mha", "noop", "mla", "dsa"])
@pytest.mark.parametrize("bad_layer", [4, 7, -1], ids=lambda v: f"layer{v}")
def test_layer_outside_the_served_range_is_refused(family, bad_layer):
    """A global layer id outside [start_layer, start_layer+layer_num) raises ValueError."""
    make = {"mha": make_mha, "noop": make_noop, "mla": make_mla, "dsa": make_dsa}[family]
    pool = make(
        start_layer=5, layer_num=2, **({"skip_topk_layers": None} if family == "dsa" else {})
    )
    with pytest.raises(ValueError, match=rf"layer_id={bad_layer} not in \[5, 7\)"):
        pool.get_key_buffer(bad_layer)
    with pytest.raises(ValueError, match="layer_id"):
        pool.get_value_buffer(bad_layer)


def test_end_layer_is_kept_when_given():
    """An explicit end_layer is stored as given; mapping uses only start_layer/layer_num."""
    pool = make_mha(start_layer=2, layer_num=2, end_layer=4)
    assert pool.end_layer == 4 and pool.layer_ids == range(2, 4)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")], ids=["str", "torch.device"])
def test_device_is_stored_as_a_string(device):
    """device is kept as a string whether a str or a torch.device was given."""
    assert make_mha(device=device).device == "cpu"


@pytest.mark.parametrize(
    "make", [make_mha, make_noop, make_mla, make_dsa], ids=["mha", "noop", "mla", "dsa"]
)
def test_every_family_builds_on_meta(make):
    """Meta pools have the same shapes and byte counts as CPU pools, and no data."""
    on_cpu, on_meta = make(), make(device="meta")
    assert on_meta.device == "meta" and on_meta.is_meta
    for attr in ("k_buffer", "v_buffer", "kv_buffer", "index_k_with_scale_buffer"):
        cpu_shapes = [tuple(t.shape) for t in getattr(on_cpu, attr, [])]
        meta_buffers = getattr(on_meta, attr, [])
        assert [tuple(t.shape) for t in meta_buffers] == cpu_shapes
        assert all(t.is_meta for t in meta_buffers)
    assert on_meta.get_kv_size_bytes() == on_cpu.get_kv_size_bytes()
    on_meta.check_valid()


def test_production_scale_dsa_pool_builds_on_meta(record_property):
    """A 78-layer, 3,000,000-token DSA pool builds on meta with the formula's byte count."""
    start = time.perf_counter()
    pool = DSATokenToKVPool(
        size=3_000_000,
        page_size=64,
        kv_lora_rank=512,
        dtype=torch.float8_e4m3fn,
        qk_rope_head_dim=64,
        layer_num=78,
        device="meta",
        index_head_dim=128,
        skip_topk_layers=[i % 4 != 3 for i in range(78)],
    )
    # Build time goes to the junit report (not asserted: timing depends on the machine).
    record_property("meta_dsa_build_seconds", time.perf_counter() - start)
    latent = 78 * (3_000_000 + 64) * 576
    index_layers = sum(1 for i in range(78) if i % 4 == 3)
    index = index_layers * ((3_000_000 + 64 + 1) // 64) * 64 * 132
    assert pool.get_kv_size_bytes() == latent + index


BREAKAGES = {
    "mha-k-wrong-rows": (make_mha, lambda p: p.k_buffer.__setitem__(0, p.k_buffer[0][:-1])),
    "mha-v-wrong-dtype": (make_mha, lambda p: p.v_buffer.__setitem__(1, p.v_buffer[1].half())),
    "mha-missing-layer": (make_mha, lambda p: p.k_buffer.pop()),
    "noop-full-size-buffer": (
        make_noop,
        lambda p: p.k_buffer.__setitem__(0, torch.zeros(p.num_slots, p.head_num, p.head_dim)),
    ),
    "mla-wrong-width": (make_mla, lambda p: p.kv_buffer.__setitem__(0, p.kv_buffer[0][..., :5])),
    "mla-wrong-device": (
        make_mla,
        lambda p: p.kv_buffer.__setitem__(0, torch.empty_like(p.kv_buffer[0], device="meta")),
    ),
    "dsa-skip-layer-has-rows": (
        make_dsa,
        lambda p: p.index_k_with_scale_buffer.__setitem__(
            1, torch.zeros(3, 528, dtype=torch.uint8)
        ),
    ),
    "dsa-index-wrong-dtype": (
        make_dsa,
        lambda p: p.index_k_with_scale_buffer.__setitem__(
            0, p.index_k_with_scale_buffer[0].to(torch.int8)
        ),
    ),
    "dsa-mask-wrong-length": (make_dsa, lambda p: p.skip_topk_layers.append(False)),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_check_valid_catches_broken_invariants(breakage):
    """check_valid raises AssertionError once a buffer breaks the pool's invariants."""
    make, corrupt = BREAKAGES[breakage]
    pool = make()
    pool.check_valid()
    corrupt(pool)
    with pytest.raises(AssertionError):
        pool.check_valid()
