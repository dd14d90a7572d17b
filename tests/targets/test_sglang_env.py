"""The sglang target's scoped workarounds restore what they change (no sglang needed)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from kvcheck.targets.sglang import env

VARIABLE = "KVCHECK_TEST_SCOPED_VARIABLE"


@pytest.mark.parametrize("before", [None, "old"], ids=["unset-before", "set-before"])
def test_scoped_environ_restores_the_previous_state(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    """A variable set for a block is back to its old value, or absent, afterwards."""
    if before is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, before)
    with env.scoped_environ(**{VARIABLE: "inside"}):
        assert os.environ[VARIABLE] == "inside"
    assert os.environ.get(VARIABLE) == before


def test_native_kv_move_sets_sglangs_variable_only_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLANG_NATIVE_MOVE_KV_CACHE is "1" inside native_kv_move() and gone after it."""
    monkeypatch.delenv(env.NATIVE_MOVE_ENV, raising=False)
    with env.native_kv_move():
        assert os.environ[env.NATIVE_MOVE_ENV] == "1"
    assert env.NATIVE_MOVE_ENV not in os.environ


@pytest.fixture
def stand_in_needed() -> None:
    if env.real_torchvision_loads():
        pytest.skip("a real torchvision loads here, so the stand-in is never installed")


@pytest.mark.usefixtures("stand_in_needed")
def test_torchvision_stand_in_serves_imports_only_inside_the_block() -> None:
    """Submodule imports work in the block; afterwards no stand-in module or finder remains."""
    finders_before = list(sys.meta_path)
    with env.torchvision_stand_in() as active:
        import torchvision.transforms.functional as functional

        interpolation = functional.InterpolationMode.BICUBIC
    assert active is True
    assert interpolation is functional.InterpolationMode.BICUBIC
    assert [name for name in sys.modules if name.split(".")[0] == "torchvision"] == []
    assert sys.meta_path == finders_before


@pytest.mark.usefixtures("stand_in_needed")
def test_torchvision_stand_in_raises_when_used() -> None:
    """Calling anything from the stand-in raises, naming what was called."""
    with env.torchvision_stand_in():
        import torchvision.transforms as transforms
    with pytest.raises(env.TorchvisionStandInError, match=r"torchvision\.transforms\.Resize"):
        transforms.Resize(224)


@pytest.mark.usefixtures("stand_in_needed")
def test_torchvision_stand_in_can_be_subclassed() -> None:
    """A class body subclassing a stand-in type still defines a class (based on object)."""
    with env.torchvision_stand_in():
        import torchvision.transforms as transforms

        class Pipeline(transforms.Compose):  # type: ignore[misc,name-defined]
            pass

    assert Pipeline.__mro__ == (Pipeline, object)


def test_cpu_cuda_synchronize_is_scoped() -> None:
    """torch.cuda.synchronize is harmless inside the block and the original object after it."""
    original = torch.cuda.synchronize
    with env.cpu_cuda_synchronize():
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is original


PAGE, KEY, SCALE = 2, 4, 4
ROW = PAGE * (KEY + SCALE)


def launch(buffer: torch.Tensor, loc: list[int], keys: torch.Tensor, scales: torch.Tensor) -> None:
    """Launch the CPU index-K body the way sglang launches its Triton kernel."""
    env._CpuIndexKKernel()[(len(loc),)](
        buffer.view(torch.float8_e4m3fn),
        buffer.view(torch.float32),
        torch.tensor(loc),
        keys.view(torch.float8_e4m3fn),
        scales,
        keys.stride(0),
        PAGE_SIZE=PAGE,
        BUF_NUMEL_PER_PAGE=ROW,
        NUM_K_ELEMS_PER_TOKEN=KEY,
        S_OFFSET_NBYTES_IN_PAGE=PAGE * KEY,
        PRESHUFFLE_TILE=0,
    )


def test_cpu_index_k_kernel_writes_the_documented_layout() -> None:
    """Token 3 (page 1, offset 1): key at row bytes 4..8, fp32 scale at bytes 12..16."""
    buffer = torch.zeros(2, ROW, dtype=torch.uint8)
    keys = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    launch(buffer, [3], keys, torch.tensor([[2.0]]))
    assert buffer[1, KEY : 2 * KEY].tolist() == [1, 2, 3, 4]
    assert float(buffer[1, PAGE * KEY + SCALE :].view(torch.float32)) == 2.0
    assert int(buffer[0].count_nonzero()) == 0
    assert int(buffer[1, :KEY].count_nonzero()) == 0


def test_cpu_index_k_kernel_rejects_out_of_range_tokens_unchanged() -> None:
    """A location past the buffer raises IndexError and writes nothing."""
    buffer = torch.zeros(1, ROW, dtype=torch.uint8)
    keys = torch.ones(2, KEY, dtype=torch.uint8)
    with pytest.raises(IndexError, match="no bounds check"):
        launch(buffer, [0, 2], keys, torch.ones(2, 1))
    assert int(buffer.count_nonzero()) == 0
