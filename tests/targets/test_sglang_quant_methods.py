"""The sglang target passes sglang's KV-cache quant methods as the calls that build them
(no sglang needed: nothing here builds one)."""

from __future__ import annotations

import pytest
import torch

from kvcheck.specs import PoolSpec
from kvcheck.targets.sglang import SGLangTarget
from kvcheck.targets.sglang.quant_methods import IMPORT_LINE, QuantMethodCall, built_kwargs
from kvcheck.targets.sglang.target import pool_arguments


def _mha(kv_quant: str, dtype: str) -> PoolSpec:
    return PoolSpec(family="mha", size=8, page_size=4, layer_num=3, head_num=2, head_dim=16,
                    dtype=dtype, kv_quant=kv_quant)  # fmt: skip


@pytest.mark.parametrize(
    ("kv_quant", "dtype", "source"),
    [
        ("cpu_fp8", "float8_e4m3fn", "get_kv_cache_quant_method('cpu_fp8_e4m3')"),
        (
            "fp4_mx_block16",
            "float4_e2m1fn_x2",
            "get_kv_cache_quant_method('fp4_mx_block16', num_layers=3, device='cpu', page_size=4)",
        ),
    ],
)
def test_quant_method_variants_pass_the_configurators_call(
    kv_quant: str, dtype: str, source: str
) -> None:
    """cpu_fp8 and fp4_mx_block16 build MHATokenToKVPool in the pool dtype with the
    quant_method call sglang's configurator makes, printed as that call."""
    arguments = pool_arguments(_mha(kv_quant, dtype), device="cpu")
    assert arguments.class_name == "MHATokenToKVPool"
    assert arguments.kwargs["dtype"] == getattr(torch, dtype)
    assert repr(arguments.kwargs["quant_method"]) == source
    assert f"quant_method={source}," in arguments.call_source("pool")


@pytest.mark.parametrize(
    ("kv_quant", "dtype"), [("none", "bfloat16"), ("fp8_scaled", "float8_e4m3fn")]
)
def test_plain_pools_take_no_quant_method(kv_quant: str, dtype: str) -> None:
    """The unquantized and per-tensor-scaled fp8 pools are the plain pool: no quant_method."""
    assert "quant_method" not in pool_arguments(_mha(kv_quant, dtype), device="cpu").kwargs


def test_a_script_imports_the_quant_method_factory_before_the_pool() -> None:
    """A reproduction script of a quant-method pool imports get_kv_cache_quant_method right
    before the constructor call that prints it."""
    recipe = SGLangTarget().script_recipe(_mha("fp4_mx_block16", "float4_e2m1fn_x2"), ())
    assert recipe.build[0] == IMPORT_LINE
    assert recipe.build[1] == "pool = memory_pool.MHATokenToKVPool("


def test_built_kwargs_leave_other_values_alone() -> None:
    """Only QuantMethodCall values are replaced by what they build."""
    kwargs = {"size": 8, "dtype": torch.bfloat16}
    assert built_kwargs(kwargs) == kwargs
    assert QuantMethodCall("cpu_fp8_e4m3") == QuantMethodCall("cpu_fp8_e4m3", ())
