"""A pool's accounting agrees with the bytes it holds.

``get_kv_size_bytes()`` and ``mem_usage`` equal the reference formulas and the bytes the
buffers' storages hold (NoOp: ``(0, 0)`` and ``0.0`` over its placeholders); for DSA,
``get_state_buf_infos()`` describes each layer's real index buffer, ``(0, 0, 0)`` for skip
layers. Checked on the test device and on ``meta``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.properties.accounting import (
    assert_held_bytes,
    assert_kv_size_bytes,
    assert_mem_usage,
    assert_state_buf_infos,
)
from kvcheck.specs import PoolSpec
from kvcheck.strategies import pool_specs

FAMILIES = ("mha", "mla", "dsa", "noop")


def meta_specs(family: str, target: Any) -> st.SearchStrategy[PoolSpec]:
    """Large pools of one family that ``target`` takes, for meta (nothing is allocated)."""
    return pool_specs(
        families=(family,),
        max_layers=96,
        max_size=1 << 22,
        max_page_size=64,
        max_start_layer=8,
        target=target,
    )


def _per_family(*capabilities: str) -> list[Any]:
    return [
        pytest.param(
            family,
            marks=pytest.mark.kvcheck_needs(f"{family}_pool", *capabilities),
            id=family,
        )
        for family in FAMILIES
    ]


@pytest.mark.parametrize("family", _per_family())
@given(data=st.data())
def test_reported_bytes_equal_bytes_held(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """get_kv_size_bytes and mem_usage equal the formulas and the storages held."""
    spec = data.draw(pool_specs(families=(family,), target=kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_held_bytes(pool, spec)
    assert_kv_size_bytes(pool, spec)
    assert_mem_usage(pool, spec)


@pytest.mark.kvcheck_needs("dsa_pool", "state_buf_infos", family="dsa")
@given(data=st.data())
def test_state_buf_infos_describe_the_index_buffers(
    kvcheck_target: Any, kvcheck_device: str, data: st.DataObject
) -> None:
    """One entry per layer: the real pointer and bytes, (0, 0, 0) for skip layers."""
    spec = data.draw(pool_specs(families=("dsa",), target=kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    assert_state_buf_infos(pool, spec)


@pytest.mark.parametrize("family", _per_family("meta_device"))
@given(data=st.data())
def test_accounting_on_meta_at_scale(kvcheck_target: Any, family: str, data: st.DataObject) -> None:
    """On meta, large pools report exactly the bytes their shapes span (DSA descriptors too)."""
    spec = data.draw(meta_specs(family, kvcheck_target), label="spec")
    pool = kvcheck_target.make_pool(spec, device="meta")
    assert_held_bytes(pool, spec)
    assert_kv_size_bytes(pool, spec)
    assert_mem_usage(pool, spec)
    if family == "dsa" and "state_buf_infos" not in kvcheck_target.unsupported:
        assert_state_buf_infos(pool, spec)
