"""kvcheck.memory: bytes held by storages, by the CUDA allocator's blocks, and by meta shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings

from kvcheck.geometry import allocated_bytes, buffer_bytes, tensor_nbytes
from kvcheck.memory import (
    CUDA_BLOCK_BYTES,
    CUDA_SMALL_REQUEST_BYTES,
    buffer_storages,
    cuda_allocator_config_problem,
    cuda_block_bytes,
    expected_cuda_allocation_bytes,
    measure_cuda_allocation,
    production_dsa_spec,
    shape_bytes,
    storage_bytes,
)
from kvcheck.reference import expected_buffer_bytes
from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs
from kvcheck.targets import resolve_target
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE, QWEN3_EMBEDDING_8B


@pytest.mark.parametrize(
    ("nbytes", "block"),
    [
        pytest.param(0, 0, id="empty-allocates-nothing"),
        pytest.param(1, 512, id="one-byte"),
        pytest.param(512, 512, id="exact-block"),
        pytest.param(513, 1024, id="one-over"),
        pytest.param(CUDA_SMALL_REQUEST_BYTES, CUDA_SMALL_REQUEST_BYTES, id="small-limit"),
    ],
)
def test_cuda_block_bytes_rounds_up_to_512(nbytes: int, block: int) -> None:
    """Requests round up to a multiple of 512 bytes; zero bytes allocate nothing."""
    assert cuda_block_bytes(nbytes) == block
    assert block % CUDA_BLOCK_BYTES == 0


@pytest.mark.parametrize(
    "nbytes",
    [
        pytest.param(-1, id="negative"),
        pytest.param(True, id="bool"),
        pytest.param(1.0, id="float"),
        pytest.param(CUDA_SMALL_REQUEST_BYTES + 1, id="beyond-small-requests"),
    ],
)
def test_cuda_block_bytes_refuses_what_it_cannot_predict(nbytes: object) -> None:
    """Bad sizes and requests past kSmallSize raise ValueError naming nbytes."""
    with pytest.raises(ValueError, match="nbytes="):
        cuda_block_bytes(nbytes)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(spec=pool_specs())
def test_geometry_matches_a_built_pool_and_the_reference(spec: PoolSpec) -> None:
    """kvcheck.geometry's per-tensor bytes equal the built pool's tensors, and their sum
    equals the reference model's own formula (written independently on purpose)."""
    pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    expected = tensor_nbytes(spec)
    for name, sizes in expected.items():
        assert [t.numel() * t.element_size() for t in getattr(pool, name)] == sizes, name
    assert sum(map(sum, expected.values())) == buffer_bytes(spec) == shape_bytes(pool)
    assert allocated_bytes(spec) == expected_buffer_bytes(spec) == storage_bytes(pool)


def test_expected_cuda_allocation_counts_blocks_not_bytes() -> None:
    """Each non-empty tensor costs whole blocks; a skip layer's empty buffer costs none."""
    spec = PoolSpec(
        family="dsa",
        size=2,
        page_size=2,
        layer_num=2,
        dtype="bfloat16",
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        skip_topk_layers=(True, False),
    )
    # two 48-byte latent buffers and one 528-byte index buffer
    assert expected_cuda_allocation_bytes(spec) == 512 + 512 + 1024


def test_storage_bytes_counts_a_shared_storage_once() -> None:
    """Two views of one tensor are one storage; a zero-row view pins its whole storage."""
    full = torch.zeros(4, 8, dtype=torch.uint8)
    pool = SimpleNamespace(kv_buffer=[full[:2], full[2:]], index_k_with_scale_buffer=[full[:0]])
    assert storage_bytes(pool) == 32
    assert shape_bytes(pool) == 32
    shared = [item.shared_with for item in buffer_storages(pool)]
    assert shared == [None, "kv_buffer[0]", "kv_buffer[0]"]


def test_storage_bytes_tells_meta_storages_apart() -> None:
    """On meta every data pointer is 0, yet distinct storages are still counted apart."""
    pool = SimpleNamespace(
        k_buffer=[torch.empty(3, 4, device="meta"), torch.empty(3, 4, device="meta")]
    )
    assert storage_bytes(pool) == 96


def test_buffer_storages_refuses_non_tensors() -> None:
    """A buffer list holding something else is reported with its name and layer."""
    with pytest.raises(ValueError, match=r"pool.kv_buffer\[0\]"):
        buffer_storages(SimpleNamespace(kv_buffer=[None]))


@pytest.mark.parametrize(
    ("model", "skips"),
    [pytest.param(GLM_5_2_LIKE, 57, id="GLM-5.2-like"), pytest.param(DEEPSEEK_V3_2, 0, id="V3.2")],
)
def test_production_dsa_spec_follows_the_skip_rule(model: object, skips: int) -> None:
    """Production specs take the reference skip mask, or allocate every layer on request."""
    honoured = production_dsa_spec(model, num_tokens=1_000_000)
    assert sum(honoured.skip_mask) == skips
    assert not any(production_dsa_spec(model, num_tokens=64, honour_skip_layers=False).skip_mask)


def test_production_pool_on_meta_spans_the_formula() -> None:
    """A 78-layer, 4M-token GLM-like pool on meta spans exactly the reference bytes."""
    spec = production_dsa_spec(GLM_5_2_LIKE, num_tokens=4_000_000)
    pool = resolve_target("kvcheck").make_pool(spec, device="meta")
    assert shape_bytes(pool) == storage_bytes(pool) == expected_buffer_bytes(spec)
    assert expected_buffer_bytes(spec) > 100 << 30


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        pytest.param(QWEN3_EMBEDDING_8B, {"num_tokens": 8}, "not a DSA model", id="mha-model"),
        pytest.param(GLM_5_2_LIKE, {"num_tokens": 0}, "num_tokens=0", id="no-tokens"),
        pytest.param(GLM_5_2_LIKE, {"num_tokens": 8, "page_size": 0}, "page_size=0", id="page"),
    ],
)
def test_production_dsa_spec_validates_its_arguments(
    model: object, kwargs: dict[str, int], match: str
) -> None:
    """Bad models and sizes raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=match):
        production_dsa_spec(model, **kwargs)


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        pytest.param({}, False, id="default"),
        pytest.param({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True, id="cuda"),
        pytest.param({"PYTORCH_ALLOC_CONF": "roundup_power2_divisions:4"}, True, id="alloc"),
        pytest.param({"PYTORCH_CUDA_ALLOC_CONF": "  "}, False, id="blank"),
    ],
)
def test_allocator_config_problem_names_the_variable(
    environ: dict[str, str], problem: bool
) -> None:
    """Any allocator configuration makes exact predictions unsafe, and says which variable."""
    found = cuda_allocator_config_problem(environ)
    assert (found is not None) == problem
    if problem:
        assert next(iter(environ)) in found


def test_measure_cuda_allocation_refuses_other_devices() -> None:
    """Measuring allocator deltas on a CPU device is a ValueError naming the device."""
    with pytest.raises(ValueError, match="device='cpu'"):
        measure_cuda_allocation(lambda: None, device="cpu")


@pytest.mark.gpu
def test_measure_cuda_allocation_sees_blocks(kvcheck_device: str) -> None:
    """A 1000-byte tensor adds one 1024-byte block; an empty one adds nothing."""
    if cuda_allocator_config_problem() is not None:
        pytest.skip(str(cuda_allocator_config_problem()))
    tensor, delta = measure_cuda_allocation(
        lambda: torch.zeros(1000, dtype=torch.uint8, device=kvcheck_device), device=kvcheck_device
    )
    assert delta == 1024 and tensor.numel() == 1000
    empty, delta = measure_cuda_allocation(
        lambda: torch.zeros(0, 4, device=kvcheck_device), device=kvcheck_device
    )
    assert delta == 0 and empty.numel() == 0


def test_scaled_fp8_latent_row_rejects_bad_widths() -> None:
    """The scaled layout's row size names a bad width; a zero rope part is allowed."""
    from kvcheck.geometry import scaled_fp8_latent_row_bytes

    assert scaled_fp8_latent_row_bytes(128, 0) == 132
    with pytest.raises(ValueError, match=r"kv_lora_rank=-1 must be an int >= 0"):
        scaled_fp8_latent_row_bytes(-1, 64)
