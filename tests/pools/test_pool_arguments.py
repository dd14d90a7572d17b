"""Constructors refuse bad arguments with a ValueError that names the argument and value."""

from __future__ import annotations

import re

import pytest
import torch
from _pools_support import make_dsa, make_mha, make_mla, make_noop

MAKERS = {"mha": make_mha, "noop": make_noop, "mla": make_mla, "dsa": make_dsa}

COMMON_BAD = [
    ("size", 0, "size=0"),
    ("size", -3, "size=-3"),
    ("size", 2.5, "size=2.5"),
    ("size", True, "size=True"),
    ("page_size", 0, "page_size=0"),
    ("layer_num", 0, "layer_num=0"),
    ("start_layer", -1, "start_layer=-1"),
    ("dtype", torch.int32, "dtype=torch.int32"),
    ("dtype", "bfloat16", "dtype='bfloat16'"),
    ("dtype", torch.float64, "dtype=torch.float64"),
    ("device", "tpu", "device='tpu'"),
    ("device", "not a device", "device='not a device'"),
    ("enable_memory_saver", "yes", "enable_memory_saver='yes'"),
]


@pytest.mark.parametrize("family", list(MAKERS))
@pytest.mark.parametrize(
    ("argument", "value", "fragment"),
    COMMON_BAD,
    ids=[f"{a}={v!r}" for a, v, _ in COMMON_BAD],
)
def test_common_arguments_are_validated(family, argument, value, fragment):
    """Every family refuses bad common arguments, naming the argument and its value."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        MAKERS[family](**{argument: value})


def test_unsupported_dtype_message_lists_the_choices():
    """The dtype error lists every supported dtype."""
    with pytest.raises(ValueError, match=re.escape("allowed: torch.float32, torch.bfloat16")):
        make_mha(dtype=torch.int8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a CPU-only machine")
def test_cuda_device_without_cuda_is_refused():
    """device='cuda' without CUDA raises ValueError instead of failing inside torch."""
    with pytest.raises(ValueError, match="device='cuda' needs CUDA"):
        make_mha(device="cuda")


FAMILY_BAD = [
    ("mha", "head_num", 0),
    ("mha", "head_dim", 0),
    ("mha", "v_head_dim", 0),
    ("noop", "head_num", -2),
    ("noop", "v_head_dim", 1.5),
    ("mla", "kv_lora_rank", 0),
    ("mla", "qk_rope_head_dim", -1),
    ("dsa", "kv_lora_rank", 0),
    ("dsa", "index_head_dim", 0),
    ("dsa", "index_head_dim", 64),
    ("dsa", "index_head_dim", 192),
    ("dsa", "index_buf_size", 0),
]


@pytest.mark.parametrize(
    ("family", "argument", "value"),
    FAMILY_BAD,
    ids=[f"{f}-{a}={v!r}" for f, a, v in FAMILY_BAD],
)
def test_family_arguments_are_validated(family, argument, value):
    """Family-specific sizes are validated, naming the argument and its value."""
    with pytest.raises(ValueError, match=re.escape(f"{argument}={value!r}")):
        MAKERS[family](**{argument: value})


@pytest.mark.parametrize("index_head_dim", [128, 256, 512])
def test_dsa_accepts_multiples_of_128(index_head_dim):
    """index_head_dim may be any positive multiple of 128."""
    pool = make_dsa(index_head_dim=index_head_dim)
    assert pool.index_layout.scale_bytes == index_head_dim // 128 * 4


@pytest.mark.parametrize("mask", [[False, True], [False] * 4], ids=["short", "long"])
def test_dsa_skip_mask_of_wrong_length_names_both_lengths(mask):
    """A skip mask whose length is not layer_num raises, naming both lengths."""
    with pytest.raises(ValueError, match=rf"len\(skip_topk_layers\)={len(mask)}.*layer_num=3"):
        make_dsa(layer_num=3, skip_topk_layers=mask)


@pytest.mark.parametrize("mask", [[1, 0, 0], "FTF", 3], ids=["ints", "string", "scalar"])
def test_dsa_skip_mask_must_be_bools(mask):
    """A skip mask must be a sequence of bools."""
    with pytest.raises(ValueError, match="skip_topk_layers"):
        make_dsa(layer_num=3, skip_topk_layers=mask)


def test_dsa_skip_mask_tuple_is_accepted_and_stored_as_list():
    """A tuple skip mask is accepted and stored as a list of bools."""
    pool = make_dsa(layer_num=2, skip_topk_layers=(True, False))
    assert pool.skip_topk_layers == [True, False]
