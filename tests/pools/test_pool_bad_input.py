"""Bad input raises ValueError naming the argument and value, and leaves the pool unchanged;
valid calls never modify the tensors a caller passed in."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _pools_support import (
    FACTORIES,
    assert_unchanged,
    fill,
    layer,
    locs,
    make_dsa,
    make_mla,
    random_bytes,
    snapshot,
)

Op = Callable[[Any], object]


def f32(*shape: int) -> torch.Tensor:
    return torch.ones(shape)


def mha_write(loc: object = None, k: object = None, v: object = None, lyr: object = None) -> Op:
    """A set_kv_buffer call on the default MHA pool, with one argument replaced."""
    return lambda p: p.set_kv_buffer(
        layer(0) if lyr is None else lyr,
        locs(1) if loc is None else loc,
        f32(1, 2, 4) if k is None else k,
        f32(1, 2, 4) if v is None else v,
    )


def latent_write(loc: object = None, k: object = None, lyr: object = None) -> Op:
    """A set_kv_buffer call on the default MLA/DSA pool, with one argument replaced."""
    return lambda p: p.set_kv_buffer(
        layer(0) if lyr is None else lyr,
        locs(1) if loc is None else loc,
        f32(1, 1, 6) if k is None else k,
        None,
    )


def move(tgt: object, src: object) -> Op:
    return lambda p: p.move_kv_cache(tgt, src)


def reload(copied: object, indices: object) -> Op:
    """load_cpu_copy of a copy taken from ``copied`` (or of ``copied`` itself if not a
    tensor), written to ``indices``."""

    def op(pool: Any) -> None:
        copy = pool.get_cpu_copy(copied) if isinstance(copied, torch.Tensor) else copied
        pool.load_cpu_copy(copy, indices)

    return op


# Shared by every family: locations, layers, moves and host copies. Slots: [0, 12).
LOCATION_CASES: dict[str, tuple[Callable[[str], Op], str]] = {
    "loc-out-of-range": (lambda f: WRITE[f](loc=locs(2, 12)), "loc[1]=12 not in [0, 12)"),
    "loc-negative": (lambda f: WRITE[f](loc=locs(-1)), "loc[0]=-1 not in [0, 12)"),
    "loc-float": (lambda f: WRITE[f](loc=torch.tensor([1.0])), "loc must have dtype int32"),
    "loc-int16": (lambda f: WRITE[f](loc=locs(1, dtype=torch.int16)), "dtype=torch.int16"),
    "loc-2d": (lambda f: WRITE[f](loc=torch.tensor([[1]])), "loc must be 1-D"),
    "loc-list": (lambda f: WRITE[f](loc=[1]), "loc must be a torch.Tensor, got list"),
    "loc-meta-on-cpu-pool": (
        lambda f: WRITE[f](loc=torch.tensor([1], device="meta")),
        "loc must be on the pool's device cpu or on cpu",
    ),
    "loc-duplicate": (
        lambda f: WRITE[f](loc=locs(4, 3, 4)),
        "loc has value 4 at positions 0 and 2",
    ),
    "layer-missing-id": (lambda f: WRITE[f](lyr=object()), "layer must have a .layer_id"),
    "layer-out-of-range": (lambda f: WRITE[f](lyr=layer(7)), "layer.layer_id=7 not in [0, "),
    "layer-id-str": (lambda f: WRITE[f](lyr=layer("0")), "layer.layer_id='0'"),
    "move-length-mismatch": (
        lambda f: move(locs(1, 2), locs(3)),
        "len(tgt_loc)=2 and len(src_loc)=1",
    ),
    "move-duplicate-targets": (
        lambda f: move(locs(5, 5), locs(1, 2)),
        "tgt_loc has value 5 at positions 0 and 1",
    ),
    "move-src-out-of-range": (lambda f: move(locs(1), locs(99)), "src_loc[0]=99 not in [0, 12)"),
    "move-tgt-negative": (lambda f: move(locs(-3), locs(1)), "tgt_loc[0]=-3 not in [0, 12)"),
    "move-src-float": (lambda f: move(locs(1), torch.tensor([1.5])), "src_loc must have dtype"),
    "move-tgt-2d": (lambda f: move(torch.tensor([[1]]), locs(1)), "tgt_loc must be 1-D"),
    "copy-indices-out-of-range": (
        lambda f: lambda p: p.get_cpu_copy(torch.arange(9, 13)),
        "indices[3]=12 not in [0, 12)",
    ),
    "reload-duplicate-indices": (
        lambda f: reload(torch.arange(4, 8), locs(8, 9, 8, 9)),
        "indices has value 8",
    ),
    "reload-wrong-count": (
        lambda f: reload(torch.arange(4, 8), torch.arange(0, 8)),
        "kv_cache_cpu",
    ),
    "reload-not-a-copy": (
        lambda f: reload({"kv": []}, torch.arange(4, 8)),
        "kv_cache_cpu must be a host copy",
    ),
    "reload-other-family": (
        lambda f: reload(OTHER[f]().get_cpu_copy(torch.arange(4, 8)), torch.arange(4, 8)),
        "was made by",
    ),
}

WRITE: dict[str, Callable[..., Op]] = {"mha": mha_write, "mla": latent_write, "dsa": latent_write}
OTHER = {"mha": make_mla, "mla": make_dsa, "dsa": make_mla}


@pytest.mark.parametrize("family", list(FACTORIES))
@pytest.mark.parametrize("case", list(LOCATION_CASES))
def test_bad_locations_layers_and_copies_are_refused(family, case):
    """Each bad argument raises ValueError naming it and its value; the pool is unchanged."""
    make_op, fragment = LOCATION_CASES[case]
    pool = FACTORIES[family]()
    fill(pool, seed=1)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_op(family)(pool)
    assert_unchanged(pool, before)


PAYLOAD_CASES: dict[str, tuple[str, Op, str]] = {
    "mha-k-shape": ("mha", mha_write(k=f32(1, 2, 5)), "cache_k must have shape (1, 2, 4)"),
    "mha-v-shape": ("mha", mha_write(v=f32(2, 2, 4)), "cache_v must have shape (1, 2, 4)"),
    "mha-k-count": ("mha", mha_write(loc=locs(1, 2)), "cache_k must have shape (2, 2, 4)"),
    "mha-k-dtype": ("mha", mha_write(k=f32(1, 2, 4).double()), "cache_k must have dtype"),
    "mha-k-int": ("mha", mha_write(k=f32(1, 2, 4).int()), "cache_k must have dtype"),
    "mha-v-not-converted-with-native-k": (
        "mha",
        mha_write(v=f32(1, 2, 4).bfloat16()),
        "cache_v has dtype torch.bfloat16 but cache_k has the pool's dtype torch.float32",
    ),
    "mha-k-converted-v-other-dtype": (
        "mha",
        mha_write(k=f32(1, 2, 4).half(), v=f32(1, 2, 4).bfloat16()),
        "cache_v has dtype torch.bfloat16 but cache_k has dtype torch.float16",
    ),
    "mha-v-dtype": ("mha", mha_write(v=f32(1, 2, 4).to(torch.uint8)), "cache_v must have dtype"),
    "mha-k-device": (
        "mha",
        mha_write(k=torch.empty(1, 2, 4, device="meta")),
        "cache_k must be on the pool's device cpu",
    ),
    "mha-k-not-tensor": ("mha", mha_write(k=[[0.0]]), "cache_k must be a torch.Tensor"),
    "mla-k-shape": ("mla", latent_write(k=f32(1, 1, 5)), "cache_k must have shape (1, 1, 6)"),
    "mla-k-dtype": ("mla", latent_write(k=f32(1, 1, 6).double()), "cache_k must have dtype"),
    "mla-k-uint8": ("mla", latent_write(k=f32(1, 1, 6).to(torch.uint8)), "cache_k must have dtype"),
    "dsa-k-shape": ("dsa", latent_write(k=f32(1, 6)), "cache_k must have shape (1, 1, 6)"),
    "dsa-index-k-shape": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(0, locs(1), random_bytes((1, 64), seed=0), f32(1, 1)),
        "index_k must have shape (1, 128)",
    ),
    "dsa-index-k-dtype": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(0, locs(1), f32(1, 128), f32(1, 1)),
        "index_k must have dtype torch.float8_e4m3fn or torch.uint8",
    ),
    "dsa-index-k-e5m2": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(
            0, locs(1), f32(1, 128).to(torch.float8_e5m2), f32(1, 1)
        ),
        "index_k must have dtype",
    ),
    "dsa-scale-shape": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(0, locs(1), random_bytes((1, 128), seed=0), f32(1, 2)),
        "index_k_scale must have shape (1, 1)",
    ),
    "dsa-scale-dtype": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(
            0, locs(1), random_bytes((1, 128), seed=0), f32(1, 1).half()
        ),
        "index_k_scale must have dtype torch.float32",
    ),
    "dsa-scale-bytes-shape": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(
            0, locs(1), random_bytes((1, 128), seed=0), random_bytes((1, 3), seed=0)
        ),
        "index_k_scale must have shape (1, 4)",
    ),
    "dsa-index-loc-duplicate": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(
            0, locs(2, 2), random_bytes((2, 128), seed=0), f32(2, 1)
        ),
        "loc has value 2",
    ),
    "dsa-index-loc-out-of-range": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(
            0, locs(12), random_bytes((1, 128), seed=0), f32(1, 1)
        ),
        "loc[0]=12 not in [0, 12)",
    ),
    "dsa-index-layer-out-of-range": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(3, locs(1), random_bytes((1, 128), seed=0), f32(1, 1)),
        "layer_id=3 not in [0, 3)",
    ),
    "dsa-index-skip-layer": (
        "dsa",
        lambda p: p.set_index_k_scale_buffer(1, locs(1), random_bytes((1, 128), seed=0), f32(1, 1)),
        "layer_id=1 is a skip-topk layer",
    ),
}


@pytest.mark.parametrize("case", list(PAYLOAD_CASES))
def test_bad_payloads_are_refused(case):
    """Wrong shapes, dtypes, devices and skip-layer index writes raise ValueError; the pool
    is unchanged."""
    family, op, fragment = PAYLOAD_CASES[case]
    pool = FACTORIES[family]()
    fill(pool, seed=2)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        op(pool)
    assert_unchanged(pool, before)


@pytest.mark.parametrize("family", list(FACTORIES))
def test_meta_pools_still_check_shapes_and_dtypes(family):
    """On meta, values are unread but shapes, dtypes and lengths are still checked."""
    pool = FACTORIES[family](device="meta")
    meta_loc = torch.tensor([1, 2], device="meta")
    width = (2, 4) if family == "mha" else (1, 6)
    with pytest.raises(ValueError, match=re.escape("cache_k must have shape")):
        pool.set_kv_buffer(
            layer(0),
            meta_loc,
            torch.empty(3, *width, device="meta"),
            torch.empty(2, *width, device="meta"),
        )
    with pytest.raises(ValueError, match="loc must be 1-D"):
        pool.set_kv_buffer(layer(0), meta_loc.view(1, 2), None, None)
    with pytest.raises(ValueError, match=re.escape("len(tgt_loc)=2 and len(src_loc)=1")):
        pool.move_kv_cache(meta_loc, meta_loc[:1])
    with pytest.raises(ValueError, match=re.escape("src_loc[0]=12")):
        pool.move_kv_cache(locs(1), locs(12))  # CPU locations are readable even for meta


# --- caller tensors -----------------------------------------------------------------------


def test_valid_calls_leave_every_caller_tensor_unchanged():
    """set_kv_buffer, set_index_k_scale_buffer, moves and host copies only read their inputs."""
    pool = make_dsa()
    inputs = {
        "loc": locs(3, 1, dtype=torch.int32),
        "cache_k": torch.randn(2, 1, 6),
        "index_k": random_bytes((2, 128), seed=3).view(torch.float8_e4m3fn),
        "scale": torch.rand(2, 1),
        "tgt": locs(5, 6),
        "src": locs(6, 6),
        "pages": torch.arange(4, 8),
    }
    before = {k: v.clone() for k, v in inputs.items()}
    pool.set_kv_buffer(layer(0), inputs["loc"], inputs["cache_k"], None)
    pool.set_index_k_scale_buffer(0, inputs["loc"], inputs["index_k"], inputs["scale"])
    pool.move_kv_cache(inputs["tgt"], inputs["src"])
    copy = pool.get_cpu_copy(inputs["pages"])
    pool.load_cpu_copy(copy, inputs["pages"])
    for name, value in inputs.items():
        assert value.dtype == before[name].dtype, name
        assert torch.equal(value.view(torch.uint8), before[name].view(torch.uint8)), name
