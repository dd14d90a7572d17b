"""kvcheck.calls, the one encoder of an operation: the call the machines make and the call a
reproduction script makes are the same method with equal arguments.

Both paths start from :func:`kvcheck.calls.plan_call`: :func:`~kvcheck.calls.encode_op`
builds the tensors (run through :func:`~kvcheck.calls.run_call`, as the properties do) and
:mod:`kvcheck.runner.repro` renders source. Here both run against stand-ins that record
every call a pool or a target receives, for hand-picked ops of every kind and for op
sequences drawn by :mod:`kvcheck.strategies` over the pool variants (quantized MHA and MLA,
DSA with index keys, kpools and compress tails), and the two records must be equal.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcheck.calls import (
    HostCopyRef,
    Ints,
    Layer,
    OpEncodingError,
    Rows,
    build_call,
    encode_op,
    plan_call,
    run_call,
)
from kvcheck.failures import Reproduction
from kvcheck.reference import ReferencePool
from kvcheck.runner import repro
from kvcheck.specs import (
    HostCopy,
    HostReload,
    Move,
    Op,
    Payload,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.strategies import op_sequences, pool_specs
from kvcheck.targets import resolve_target

#: One recorded call: (receiver, method, positional arguments, keyword arguments).
Record = tuple[str, str, tuple[Any, ...], dict[str, Any]]


class _Result:
    """What a recorded call returns: the call's place in the record (a host copy's stand-in)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Result) and other.index == self.index

    def __hash__(self) -> int:
        return self.index

    def __repr__(self) -> str:
        return f"<result of call {self.index}>"


class _Recorder:
    """Stands in for a pool or a target: every method call it receives is appended to ``log``."""

    def __init__(self, role: str, log: list[Record]) -> None:
        self.role, self.log = role, log

    def __getattr__(self, method: str) -> Callable[..., _Result]:
        if method.startswith("__"):
            raise AttributeError(method)

        def record(*args: Any, **kwargs: Any) -> _Result:
            self.log.append((self.role, method, args, kwargs))
            return _Result(len(self.log) - 1)

        return record

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Recorder) and other.role == self.role

    def __hash__(self) -> int:
        return hash(self.role)

    def __repr__(self) -> str:
        return self.role


def _machine_calls(spec: PoolSpec, ops: tuple[Op, ...], target: Any) -> list[Record]:
    """The calls the machines make for ``ops``: encode_op and run_call, the reference's
    verdict deciding which host copies are kept (as apply_op_like_reference does)."""
    log: list[Record] = []
    pool = _Recorder("pool", log)
    reference, copies = ReferencePool(spec), {}
    for op in ops:
        expected = reference.expected_error(op)
        try:
            call = encode_op(spec, op, device="cpu", copies=copies)
        except ValueError:  # a reload of a copy never taken: there is nothing to call
            assert expected is not None, op
            continue
        result = run_call(target if target is not None else _Recorder("target", log), pool, call)
        if expected is None:
            if isinstance(op, HostCopy):
                copies[op.name] = result
            reference.apply(op)
    return log


def _script_calls(spec: PoolSpec, ops: tuple[Op, ...], target_name: str) -> list[Record]:
    """The calls a reproduction script for ``target_name`` makes for ``ops``: its rendered
    call lines run with the script's own helpers, stand-ins for the pool and target, and a
    ``call`` that only calls."""
    rep = Reproduction(spec, ops)
    writer = repro._ScriptWriter(rep, repro._recipe(target_name, rep))
    source = "\n".join(writer.op_lines())
    log: list[Record] = []
    namespace: dict[str, Any] = {"math": math, "torch": torch, "types": types}
    exec(repro._HELPERS, namespace)
    namespace.update(
        pool=_Recorder("pool", log),
        target=_Recorder("target", log),
        copies={},
        call=lambda what, method, *args, raises=None, **kwargs: method(*args, **kwargs),
    )
    exec(compile(source, "repro_calls.py", "exec"), namespace)
    return log


def _same(a: Any, b: Any) -> bool:
    """Equal values: tensors of one dtype and shape holding the same bytes, layers of one id."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
            return False
        return bool(torch.equal(_raw(a), _raw(b)))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, SimpleNamespace) and isinstance(b, SimpleNamespace):
        return vars(a) == vars(b)
    return type(a) is type(b) and bool(a == b)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _assert_paths_agree(spec: PoolSpec, ops: tuple[Op, ...], target_name: str) -> None:
    """The machine's calls and the script's calls for ``ops`` are equal, call by call."""
    # kvcheck's script writes index keys with the pool's method, as kvcheck's target does;
    # a module target's script calls the target's write_index_k, as the machines do.
    target = resolve_target("kvcheck") if target_name == "kvcheck" else None
    machine = _machine_calls(spec, ops, target)
    script = _script_calls(spec, ops, target_name)
    assert [call[:2] for call in script] == [call[:2] for call in machine], (spec, ops)
    for index, (made, written) in enumerate(zip(machine, script, strict=True)):
        assert _same(made[2], written[2]), (index, ops[index:], made, written)
        assert _same(made[3], written[3]), (index, ops[index:], made, written)


MHA = PoolSpec(
    family="mha", size=6, page_size=2, layer_num=2, dtype="bfloat16", head_num=2, head_dim=2
)
MXFP8 = PoolSpec(
    family="mha",
    size=8,
    page_size=4,
    layer_num=1,
    dtype="float8_e4m3fn",
    head_num=1,
    head_dim=32,
    kv_quant="mxfp8",
)
DSA = PoolSpec(
    family="dsa",
    size=8,
    page_size=4,
    layer_num=2,
    dtype="bfloat16",
    kv_lora_rank=2,
    qk_rope_head_dim=1,
    index_kpool=2,
    index_kpool_compress=True,
    max_running_requests=1,
    skip_topk_layers=(False, True),
)
_BF16_ROW = b"\x80\x3f" * 2  # two bf16 values of 1.0
#: Every op kind, and each argument form: an override, per-tensor and e8m0 scales, a
#: float prefix write to a quantized pool, rows of the wrong size, a reload of a copy
#: never taken, a rejected copy under a name already taken.
HAND_PICKED: dict[str, tuple[PoolSpec, tuple[Op, ...]]] = {
    "mha": (
        MHA,
        (
            WriteKV(0, (3, 1), (_BF16_ROW * 2,) * 2, (_BF16_ROW * 2,) * 2),
            WriteKV(1, (4,), (_BF16_ROW * 2,), (_BF16_ROW * 2,), override=True),
            WriteKV(0, (5,), (_BF16_ROW * 3,), (_BF16_ROW * 2,)),  # K one value a head too long
            WriteKV(
                0,
                (2,),
                (),
                payload=Payload("float32", (bytes(16),), (bytes(16),), k_scale=0.5),
            ),
            WritePrefixValid(
                0, ((2, 3), (4, 5)), (1, 2), (_BF16_ROW * 2,) * 4, (_BF16_ROW * 2,) * 4
            ),
            Move(tgt=(6, 7), src=(3, 3)),
            HostCopy("a", (2, 3, 4, 5)),
            HostCopy("a", (99,)),  # rejected: the copy kept under "a" is the first one
            HostReload("a", (4, 5, 6, 7)),
            HostReload("never", (1,)),
        ),
    ),
    "mxfp8": (
        MXFP8,
        (
            WriteKV(
                0,
                (3, 5),
                (),
                payload=Payload(
                    "float8_e4m3fn",
                    (b"\x38" * 32,) * 2,
                    (b"\x40" * 32,) * 2,
                    k_scale_rows=(b"\x7f",) * 2,
                    v_scale_rows=(b"\x80",) * 2,
                ),
            ),
            WritePrefixValid(
                0, ((6, 7),), (1,), (_BF16_ROW * 16,) * 2, (_BF16_ROW * 16,) * 2, "bfloat16"
            ),
            Move(tgt=(9,), src=(3,)),
        ),
    ),
    "dsa": (
        DSA,
        (
            WriteKV(0, (5,), (b"\x80\x3f" * 3,)),
            WriteMLA(1, (6,), (_BF16_ROW,), (b"\x80\x3f",), override=True),
            WriteIndexK(0, (2, 3), (bytes(range(128)),) * 2, (b"\0\0\0\x3f",) * 2),
            WriteIndexK(1, (2,), (bytes(128),), (bytes(4),)),  # a skip layer: rejected
            WriteCompressTail(0, 1, (b"\x80\x3f" * 128,) * 2, (b"\x00\x40" * 128,) * 2, start=1),
            HostCopy("a", (4, 5, 6, 7), req_pool_index=1),
            HostReload("a", (8, 9, 10, 11), req_pool_index=0),
        ),
    ),
}


@pytest.mark.parametrize("target_name", ["kvcheck", "pkg.mod:Target"])
@pytest.mark.parametrize("case", sorted(HAND_PICKED))
def test_machine_and_script_make_the_same_calls(case: str, target_name: str) -> None:
    """For every op kind and argument form the script calls what the machine calls: the
    same method (a target's write_index_k where the machines call it) with equal
    arguments, byte for byte."""
    spec, ops = HAND_PICKED[case]
    _assert_paths_agree(spec, ops, target_name)


#: Pool variants the drawn sequences cover, as pool_specs arguments.
DRAWN: dict[str, dict[str, Any]] = {
    "mha-noop": {"families": ("mha", "noop")},
    "mha-fp8": {"families": ("mha",), "kv_quants": ("fp8_scaled", "cpu_fp8")},
    "mha-mxfp8": {"families": ("mha",), "kv_quants": ("mxfp8",)},
    "mha-fp4": {"families": ("mha",), "kv_quants": ("fp4_mx_block16", "nvfp4")},
    "mla": {"families": ("mla",), "kv_quants": ("none", "fp4")},
    "dsa": {"families": ("dsa",)},
    "dsa-kpool": {"families": ("dsa",), "index_kpools": (2, 4)},
}


@pytest.mark.parametrize("variants", sorted(DRAWN))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawn_sequences_make_the_same_calls_on_both_paths(
    variants: str, data: st.DataObject
) -> None:
    """Op sequences drawn by kvcheck.strategies, invalid ops included, make the same calls
    through the machine's encoder and through a rendered script, for kvcheck's script
    (index keys through the pool) and a module target's (through the target)."""
    specs = pool_specs(max_layers=2, max_size=16, **DRAWN[variants])
    sequence = data.draw(op_sequences(specs, max_ops=6, include_invalid=True), label="ops")
    for target_name in ("kvcheck", "pkg.mod:Target"):
        _assert_paths_agree(sequence.spec, sequence.ops, target_name)


def test_the_check_fails_when_a_script_drops_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renderer that loses an argument (as the scripts once dropped MXFP8's scales) is
    caught."""
    bound = repro._bound_arguments

    def dropping(plan: Any) -> tuple[list[str], list[str]]:
        lines, args = bound(plan)
        return lines, args[:-1] if plan.method == "set_kv_buffer" else args

    monkeypatch.setattr(repro, "_bound_arguments", dropping)
    spec, ops = HAND_PICKED["mxfp8"]
    with pytest.raises(AssertionError):
        _assert_paths_agree(spec, ops, "kvcheck")


def test_the_plan_describes_each_argument() -> None:
    """An override write passes layer None and layer_id_override; an MXFP8 write its e8m0
    scale rows; a reload the copy by name."""
    write = plan_call(MHA, HAND_PICKED["mha"][1][1])
    assert [(arg.name, arg.value, arg.keyword) for arg in write.args] == [
        ("layer", None, False),
        ("loc", Ints((4,)), False),
        ("cache_k", Rows("bfloat16", (2, 2), (_BF16_ROW * 2,)), False),
        ("cache_v", Rows("bfloat16", (2, 2), (_BF16_ROW * 2,)), False),
        ("layer_id_override", 1, True),
    ]
    scaled = plan_call(MXFP8, HAND_PICKED["mxfp8"][1][0])
    assert scaled.args[4].value == Rows("float8_e8m0fnu", (1, 1), (b"\x7f",) * 2)
    reload = plan_call(DSA, HostReload("a", (1,), req_pool_index=0))
    assert reload.args[0].value == HostCopyRef("a") and reload.args[-1].keyword
    assert plan_call(MHA, WritePrefixValid(0, (), (), (), ())).args[0].value == Layer(0)


def test_building_refuses_what_it_cannot_build() -> None:
    """A reload of a copy never taken is a ValueError (what the reference expects); rows
    that hold no whole value, or a pool passed for its spec, are the harness's errors."""
    with pytest.raises(ValueError, match="never copied"):
        encode_op(MHA, HostReload("gone", (1,)), device="cpu", copies={})
    odd = plan_call(MHA, WriteKV(0, (1,), (b"\x00",), (b"\x00",)))
    with pytest.raises(OpEncodingError):
        build_call(odd, device="cpu", copies={})
    with pytest.raises(TypeError, match="PoolSpec"):
        encode_op(object(), Move((), ()), device="cpu", copies={})  # type: ignore[arg-type]
