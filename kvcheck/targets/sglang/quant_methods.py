"""sglang's KV-cache quant methods, as the ``quant_method`` argument of its MHA pool.

sglang 0.5.21-0.5.23 build a quantized MHA pool as ``MHATokenToKVPool(...,
quant_method=...)``, where the quant method object owns the buffers' shapes and the
quantizing store. Its ``KVCacheConfigurator._build_mha_quant_method`` makes that object
with ``get_kv_cache_quant_method``: ``"cpu_fp8_e4m3"`` (no arguments) for an fp8 cache on
a CPU platform, else the FP4 recipe named by ``--kv-cache-dtype`` with the pool's layer
count, device and page size. :class:`QuantMethodCall` is that call as a constructor
argument: :func:`~kvcheck.targets.sglang.target.pool_arguments` passes it, the target
builds the object from it (:func:`built_kwargs`), and a reproduction script prints it as
the source that builds it (its ``repr``, with :data:`IMPORT_LINE` before the pool's
constructor call).

Example (no sglang import):
    >>> from kvcheck.specs import PoolSpec
    >>> spec = PoolSpec(family="mha", size=8, page_size=4, layer_num=2, head_num=2,
    ...                 head_dim=16, dtype="float4_e2m1fn_x2", kv_quant="fp4_mx_block16")
    >>> quant_method_call(spec, device="cpu")
    get_kv_cache_quant_method('fp4_mx_block16', num_layers=2, device='cpu', page_size=4)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvcheck.specs import PoolSpec

__all__ = [
    "IMPORT_LINE",
    "QUANT_METHOD_MODULE",
    "QUANT_METHOD_NAMES",
    "QuantMethodCall",
    "built_kwargs",
    "quant_method_call",
]

#: Where sglang keeps its KV-cache quant methods (the same module in 0.5.21-0.5.23).
QUANT_METHOD_MODULE = "sglang.srt.layers.quantization.fp4_kv_cache_quant_method"
#: The line a script runs (after sglang's setup) before printing a :class:`QuantMethodCall`.
IMPORT_LINE = f"from {QUANT_METHOD_MODULE} import get_kv_cache_quant_method"

#: kvcheck's ``PoolSpec.kv_quant`` -> sglang's quant-method name, for the variants the
#: target builds as ``MHATokenToKVPool`` with a quant method.
QUANT_METHOD_NAMES: Mapping[str, str] = MappingProxyType(
    {"cpu_fp8": "cpu_fp8_e4m3", "fp4_mx_block16": "fp4_mx_block16"}
)


@dataclass(frozen=True)
class QuantMethodCall:
    """``get_kv_cache_quant_method(name, **options)``: built by :meth:`build`, printed by
    ``repr`` as the call's source (so a reproduction script runs it as printed)."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    def __repr__(self) -> str:
        options = "".join(f", {key}={value!r}" for key, value in self.options)
        return f"get_kv_cache_quant_method({self.name!r}{options})"

    def build(self) -> Any:
        """sglang's quant method object (imports sglang's quant-method module)."""
        module = importlib.import_module(QUANT_METHOD_MODULE)
        return module.get_kv_cache_quant_method(self.name, **dict(self.options))


def quant_method_call(spec: PoolSpec, *, device: str) -> QuantMethodCall | None:
    """The quant method sglang's configurator gives ``spec``'s MHA pool, or None (a pool
    without one).

    As ``_build_mha_quant_method``: ``cpu_fp8_e4m3`` takes no argument; ``fp4_mx_block16``
    takes ``num_layers`` (the pool's layers), ``device`` and ``page_size``. The configurator
    then selects the attention accesses of the server's backends and loads checkpoint
    scales; neither changes an ``fp4_mx_block16`` pool (its accesses all read plain,
    dequantized KV, with no workspace and no native scales, and it has no global scales),
    so they are left out.
    """
    name = QUANT_METHOD_NAMES.get(spec.kv_quant) if spec.family == "mha" else None
    if name is None:
        return None
    if name == "cpu_fp8_e4m3":
        return QuantMethodCall(name)
    options = (("num_layers", spec.layer_num), ("device", device), ("page_size", spec.page_size))
    return QuantMethodCall(name, options)


def built_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with each :class:`QuantMethodCall` replaced by the object it builds."""
    return {
        key: value.build() if isinstance(value, QuantMethodCall) else value
        for key, value in kwargs.items()
    }
