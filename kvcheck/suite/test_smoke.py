"""Smoke properties: each pool family the target supports builds, and reports its bytes.

A placeholder until the full property modules land: it checks only that the buffers of a
freshly built pool exist with one entry per layer and that ``get_kv_size_bytes`` and
``mem_usage`` agree with the bytes those buffers hold.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.strategies import pool_specs

_BUFFERS = {
    "mha": ("k_buffer", "v_buffer"),
    "noop": ("k_buffer", "v_buffer"),
    "mla": ("kv_buffer",),
    "dsa": ("kv_buffer", "index_k_with_scale_buffer"),
}


def _tensor_bytes(pool: Any, family: str) -> int:
    return sum(
        t.numel() * t.element_size() for name in _BUFFERS[family] for t in getattr(pool, name)
    )


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.kvcheck_needs(f"{family}_pool"))
        for family in _BUFFERS
    ],
)
@given(data=st.data())
def test_pool_buffers_match_reported_bytes(
    kvcheck_target: Any, kvcheck_device: str, family: str, data: st.DataObject
) -> None:
    """A new pool has one buffer per layer and reports exactly the bytes they hold."""
    spec = data.draw(pool_specs(families=(family,)), label="spec")
    pool = kvcheck_target.make_pool(spec, device=kvcheck_device)
    for name in _BUFFERS[family]:
        buffers = getattr(pool, name)
        assert len(buffers) == spec.layer_num, f"{name} has {len(buffers)} layers, spec {spec}"
    held = _tensor_bytes(pool, family)
    reported = pool.get_kv_size_bytes()
    reported_total = sum(reported) if isinstance(reported, tuple) else reported
    if family == "noop":
        assert reported == (0, 0), f"no-op pool reports {reported} bytes"
        assert pool.mem_usage == 0.0
        assert all(t.shape[0] == spec.page_size for t in pool.k_buffer), "placeholders only"
    else:
        assert reported_total == held, f"get_kv_size_bytes()={reported} but buffers hold {held}"
        assert pool.mem_usage == pytest.approx(held / (1 << 30))
