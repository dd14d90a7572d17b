"""Whole operation sequences for one pool, composed from the single-op strategies.

:func:`op_sequences` draws every op from :mod:`kvcheck.strategies.ops` (the one operation
generator, which the state machines use too) and tracks which host copies exist, so
reloads name a copy made earlier in the same sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.specs import POOL_FAMILIES, HostCopy, Op, OpSequence, PoolSpec
from kvcheck.strategies import ops as _ops
from kvcheck.validation import (
    check_bool,
    check_choices,
    check_one_of,
    check_type,
    check_valid_integer,
)

__all__ = ["op_sequences"]


@st.composite
def _op_sequences(
    draw: Callable[..., Any],
    spec: PoolSpec,
    max_ops: int,
    include_invalid: bool,
    kinds: tuple[str, ...] | None,
) -> OpSequence:
    allowed = _ops.family_op_kinds(spec) if kinds is None else kinds
    copies: dict[str, tuple[int, _ops.CopyLayout]] = {}
    ops: list[Op] = []
    for number in range(draw(st.integers(0, max_ops))):
        available = [
            kind
            for kind in allowed
            if kind in _ops.family_op_kinds(spec) and (kind != "host_reload" or copies)
        ]
        if include_invalid:
            available.append("invalid")
        if not available:
            break
        kind = draw(st.sampled_from(available))
        ops.append(_draw_op(draw, spec, kind, f"copy{number}", copies))
    return OpSequence(spec=spec, ops=tuple(ops))


def _draw_op(
    draw: Callable[..., Any],
    spec: PoolSpec,
    kind: str,
    name: str,
    copies: dict[str, tuple[int, _ops.CopyLayout]],
) -> Op:
    """One op of ``kind`` from :mod:`kvcheck.strategies.ops`, tracking host copies."""
    if kind == "invalid":
        counts = {copy: count for copy, (count, _) in copies.items()}
        op = draw(_ops.invalid_ops(spec, counts))
    elif kind == "host_reload":
        op = draw(_ops.host_reload_ops(spec, copies))
    elif kind == "host_copy":
        op = draw(_ops.host_copy_ops(spec, name))
    elif kind == "write_index_k":
        op = draw(_ops.write_index_k_ops(spec, layer_ids=_ops.indexed_layers(spec, skip=False)))
    else:
        op = draw(getattr(_ops, f"{kind}_ops")(spec))
    if isinstance(op, HostCopy) and op.name not in copies:
        copies[op.name] = (len(op.indices), _ops.copy_layout(spec, op.indices))
    return op


def op_sequences(
    spec: PoolSpec | st.SearchStrategy[PoolSpec],
    *,
    max_ops: int = 8,
    include_invalid: bool = False,
    kinds: Sequence[str] | None = None,
) -> st.SearchStrategy[OpSequence]:
    """Operation sequences for one pool: writes, moves, host copies and their reloads.

    ``spec`` is a :class:`~kvcheck.specs.PoolSpec` or a strategy for one (e.g.
    :func:`pool_specs`). Up to ``max_ops`` ops, each touching at most 4 tokens:

    - ``WriteKV`` to distinct slots with payloads that encode finite values of the pool's
      dtype (MLA/DSA: the latent row, no V rows);
    - ``WriteKV`` with a payload in another dtype (``cast_write_kv``), with and without
      ``k_scale``/``v_scale``; ``WriteMLA`` (MLA/DSA); ``WritePrefixValid`` (MHA/NoOp);
    - ``WriteIndexK`` (DSA, non-skip layers) with fp8 keys and fp32 scales, both finite;
    - ``WriteCompressTail`` (DSA with compress tails, non-skip layers): bf16 ring rows;
    - ``Move`` with distinct targets; sources may repeat and overlap the targets;
    - ``HostCopy`` of one request's slots (whole pages plus a partial last page), of two
      requests at once or of arbitrary tokens, and later ``HostReload`` of an earlier copy
      to slots of the same shape.

    ``kinds`` restricts the drawn kinds to those named (of
    :data:`kvcheck.strategies.ops.OP_KINDS`; default all that apply to the family,
    :func:`kvcheck.strategies.ops.family_op_kinds`). Every op comes from
    :mod:`kvcheck.strategies.ops`, the generator the state machines use too.

    On the NoOp family the writes are generated too: raising RuntimeError is what is under
    test there. ``include_invalid=True`` adds ops the contract rejects with ValueError
    (out-of-range or repeated locations, K rows one head-dim element too long, layers
    outside the pool, mismatched or repeated move targets, index-K writes to skip layers,
    reloads of the wrong length); on NoOp such moves are accepted, and
    :meth:`kvcheck.reference.ReferencePool.expected_error` is the authority on each op.
    Shrinks towards no ops, then single-token ``WriteKV`` ops of zero bytes to the lowest
    layer and slot.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> sequence = find(op_sequences(spec, kinds=("move",)), lambda seq: len(seq.ops) == 2)
        >>> [type(op).__name__ for op in sequence.ops]
        ['Move', 'Move']
    """
    check_valid_integer(max_ops, "max_ops", min_value=0)
    check_bool(include_invalid, "include_invalid")
    chosen = None if kinds is None else check_choices(kinds, "kinds", _ops.OP_KINDS)
    if isinstance(spec, st.SearchStrategy):
        return spec.flatmap(
            lambda drawn: _op_sequences(_valid_spec(drawn), max_ops, include_invalid, chosen)
        )
    return _op_sequences(_valid_spec(spec), max_ops, include_invalid, chosen)


def _valid_spec(spec: Any) -> PoolSpec:
    check_type(PoolSpec, spec, "spec", what="a PoolSpec or a strategy for one")
    check_one_of(spec.family, "spec.family", POOL_FAMILIES)
    if spec.layer_num < 1 or spec.size < 0 or spec.page_size < 1:
        raise InvalidArgument(
            f"spec has layer_num={spec.layer_num!r}, size={spec.size!r}, "
            f"page_size={spec.page_size!r}; need at least one layer and one slot per page"
        )
    if spec.family == "dsa" and len(spec.skip_mask) != spec.layer_num:
        raise InvalidArgument(
            f"spec.skip_topk_layers={spec.skip_topk_layers!r} does not have "
            f"layer_num={spec.layer_num!r} entries"
        )
    return spec
