"""Public Hypothesis strategies for KV-cache pools and the serving configuration around them.

Downstream suites import these to drive their own pools with kvcheck's vocabulary
(:mod:`kvcheck.specs`). Every strategy takes keyword-only arguments, validates them when it
is called (raising :class:`hypothesis.errors.InvalidArgument` with ``name=value``
messages), and documents what its examples shrink towards. ``__all__`` is the registry:
kvcheck's own tests walk it.

Example::

    from hypothesis import given, strategies as st
    from kvcheck.strategies import op_sequences, pool_specs

    @given(st.data())
    def test_pool_matches_reference(data):
        spec = data.draw(pool_specs(families=("dsa",)), label="pool spec")
        sequence = data.draw(op_sequences(spec, max_ops=6), label="ops")
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.reference import FP4_KV_CACHE_DTYPES
from kvcheck.specs import (
    DTYPE_ITEMSIZE,
    FP8_DTYPES,
    POOL_FAMILIES,
    HostCopy,
    Op,
    OpSequence,
    PoolSpec,
)
from kvcheck.strategies import ops as _ops

__all__ = [
    "dtypes",
    "layer_masks",
    "model_configs",
    "op_sequences",
    "page_sizes",
    "pool_specs",
    "server_flags",
    "token_locations",
]

#: dtype names in shrink order: the most common serving dtype first.
_DTYPE_ORDER: tuple[str, ...] = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
#: Which dtypes each family's pool accepts (today every family accepts all of them).
_FAMILY_DTYPES: dict[str, frozenset[str]] = {
    family: frozenset(_DTYPE_ORDER) for family in POOL_FAMILIES
}
_ARCHS: tuple[str, ...] = ("mha", "mla", "dsa")
#: DSA index keys are 128 channels wide everywhere SGLang runs them.
_INDEX_HEAD_DIM = 128

# --- argument validation -----------------------------------------------------------------


def _check_int(name: str, value: Any, *, min_value: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if min_value is not None and value < min_value:
        raise InvalidArgument(f"{name}={value!r} must be at least {min_value}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be a bool")


def _check_order(low_name: str, low: int, high_name: str, high: int) -> None:
    if high < low:
        raise InvalidArgument(f"Cannot have {high_name}={high!r} < {low_name}={low!r}")


def _check_choices(name: str, values: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence | frozenset | set):
        raise InvalidArgument(f"{name}={values!r} must be a sequence drawn from {allowed!r}")
    chosen = tuple(values)
    if not chosen:
        raise InvalidArgument(f"{name}={values!r} must not be empty")
    unknown = [value for value in chosen if value not in allowed]
    if unknown:
        raise InvalidArgument(f"{name}={values!r}: {unknown!r} not in {allowed!r}")
    # Keep the caller's order (it is the shrink order) but drop repeats.
    return tuple(dict.fromkeys(chosen))


# --- dtypes, page sizes, layer masks ---------------------------------------------------------


def dtypes(
    *, families: Sequence[str] | None = None, include_fp8: bool = True
) -> st.SearchStrategy[str]:
    """torch dtype names (``"bfloat16"``, ``"float8_e4m3fn"``, ...) that all ``families`` accept.

    ``families=None`` means all of :data:`kvcheck.specs.POOL_FAMILIES`. fp8 names are stored
    as uint8 by the pools; ``include_fp8=False`` leaves them out. Shrinks towards
    ``"bfloat16"``, then ``"float16"``, ``"float32"`` and the fp8 names.

    Example::

        @given(st.data())
        def test_itemsize(data):
            name = data.draw(dtypes(include_fp8=False), label="dtype")
            assert getattr(torch, name).itemsize in (2, 4)
    """
    chosen = (
        POOL_FAMILIES if families is None else _check_choices("families", families, POOL_FAMILIES)
    )
    _check_bool("include_fp8", include_fp8)
    accepted = frozenset.intersection(*(_FAMILY_DTYPES[family] for family in chosen))
    names = [
        name
        for name in _DTYPE_ORDER
        if name in accepted and (include_fp8 or name not in FP8_DTYPES)
    ]
    if not names:
        raise InvalidArgument(
            f"No dtype fits families={families!r} with include_fp8={include_fp8!r}"
        )
    return st.sampled_from(names)


def _powers_of_two(low: int, high: int) -> list[int]:
    return [1 << bit for bit in range(high.bit_length()) if low <= 1 << bit <= high]


def page_sizes(
    *, family: str | None = None, min_page_size: int = 1, max_page_size: int = 16
) -> st.SearchStrategy[int]:
    """Page sizes (tokens per page) in ``[min_page_size, max_page_size]``.

    ``family="dsa"`` keeps to powers of two, as the DSA index-K kernels need (pass
    ``max_page_size=64`` to reach SGLang's CUDA page size); other families, or
    ``family=None``, take any integer in range. Shrinks towards the smallest allowed size.

    Example::

        @given(st.data())
        def test_pages(data):
            page_size = data.draw(page_sizes(family="dsa", max_page_size=64), label="page size")
            assert page_size & (page_size - 1) == 0
    """
    if family is not None and family not in POOL_FAMILIES:
        raise InvalidArgument(f"family={family!r} not in {POOL_FAMILIES!r}")
    _check_int("min_page_size", min_page_size, min_value=1)
    _check_int("max_page_size", max_page_size, min_value=1)
    _check_order("min_page_size", min_page_size, "max_page_size", max_page_size)
    if family != "dsa":
        return st.integers(min_page_size, max_page_size)
    sizes = _powers_of_two(min_page_size, max_page_size)
    if not sizes:
        raise InvalidArgument(
            f"No power of two in [min_page_size={min_page_size!r}, "
            f"max_page_size={max_page_size!r}] for family='dsa'"
        )
    return st.sampled_from(sizes)


_MASK_SHAPES = ("none_skip", "all_skip", "first_skips", "mixed")


@st.composite
def _layer_masks(draw: Callable[..., Any], min_layers: int, max_layers: int) -> tuple[bool, ...]:
    count = draw(st.integers(min_layers, max_layers))
    # The corner cases are drawn by name so each shows up about a quarter of the time,
    # instead of waiting for random booleans to line up.
    shape = draw(st.sampled_from(_MASK_SHAPES))
    if shape == "none_skip":
        return (False,) * count
    if shape == "all_skip":
        return (True,) * count
    rest = draw(st.lists(st.booleans(), min_size=count - 1, max_size=count - 1))
    first = True if shape == "first_skips" else draw(st.booleans())
    return (first, *rest)


def layer_masks(
    *, min_layers: int | None = None, max_layers: int | None = None, layers: int | None = None
) -> st.SearchStrategy[tuple[bool, ...]]:
    """Per-layer skip masks (True = the layer skips its DSA index-K buffer).

    ``layers`` fixes the length; otherwise it lies in ``[min_layers, max_layers]``, which
    default (when None) to 1 and 8. All-skip, none-skip and first-layer-skips masks each
    come up about a quarter of the time; the rest are mixed. Shrinks towards a single
    layer that does not skip.

    Example::

        @given(st.data())
        def test_mask(data):
            mask = data.draw(layer_masks(layers=4), label="skip mask")
            assert len(mask) == 4
    """
    if layers is not None:
        _check_int("layers", layers, min_value=1)
        if min_layers is not None or max_layers is not None:
            raise InvalidArgument(
                f"Cannot pass layers={layers!r} together with min_layers={min_layers!r} "
                f"or max_layers={max_layers!r}"
            )
        return _layer_masks(layers, layers)
    low = 1 if min_layers is None else min_layers
    high = 8 if max_layers is None else max_layers
    _check_int("min_layers", low, min_value=1)
    _check_int("max_layers", high, min_value=1)
    _check_order("min_layers", low, "max_layers", high)
    return _layer_masks(low, high)


# --- pool specs and token locations ------------------------------------------------------------


@st.composite
def _pool_specs(
    draw: Callable[..., Any],
    families: tuple[str, ...],
    dtype_names: tuple[str, ...],
    max_layers: int,
    max_size: int,
    max_page_size: int,
    max_start_layer: int,
) -> PoolSpec:
    family = draw(st.sampled_from(families))
    dtype = draw(st.sampled_from(dtype_names))
    layer_num = draw(st.integers(1, max_layers))
    page_size = draw(page_sizes(family=family, max_page_size=min(max_page_size, max_size)))
    # Capacities are whole pages, as a scheduler hands them out; that also keeps every
    # token's DSA index page inside the index buffer.
    size = page_size * draw(st.integers(1, max_size // page_size))
    start_layer = draw(st.integers(0, max_start_layer))
    common: dict[str, Any] = {
        "family": family,
        "size": size,
        "page_size": page_size,
        "layer_num": layer_num,
        "dtype": dtype,
        "start_layer": start_layer,
    }
    if family in ("mha", "noop"):
        return PoolSpec(
            **common,
            head_num=draw(st.integers(1, 2)),
            head_dim=draw(st.integers(1, 8)),
            v_head_dim=draw(st.none() | st.integers(1, 8)),
        )
    latent = {
        "kv_lora_rank": draw(st.integers(1, 8)),
        "qk_rope_head_dim": draw(st.integers(1, 4)),
    }
    if family == "mla":
        return PoolSpec(**common, **latent)
    extra_pages = draw(st.none() | st.integers(0, 2))
    return PoolSpec(
        **common,
        **latent,
        index_head_dim=_INDEX_HEAD_DIM,
        skip_topk_layers=draw(layer_masks(layers=layer_num)),
        index_buf_size=None if extra_pages is None else size + extra_pages * page_size,
    )


def pool_specs(
    *,
    families: Sequence[str] = POOL_FAMILIES,
    dtype_names: Sequence[str] | None = None,
    max_layers: int = 4,
    max_size: int = 64,
    max_page_size: int = 8,
    max_start_layer: int = 3,
) -> st.SearchStrategy[PoolSpec]:
    """Small :class:`~kvcheck.specs.PoolSpec` values for any of ``families``.

    ``dtype_names=None`` means every dtype the chosen families accept. ``size`` is a whole
    number of pages up to ``max_size`` tokens; ``page_size`` is at most
    ``min(max_page_size, max_size)`` (powers of two for DSA). MHA/NoOp specs may carry a
    V head dim of their own; any family may start at a global layer above 0; DSA specs carry
    a skip mask from :func:`layer_masks`, ``index_head_dim=128`` and sometimes an
    ``index_buf_size`` a page or two larger than ``size``. Shapes stay tiny so tests run
    fast. Shrinks towards the first family, bfloat16, one layer, page_size=1, one page,
    start_layer=0, one head of dim 1, no separate V head dim and a mask without skips.

    Example::

        @given(st.data())
        def test_spec(data):
            spec = data.draw(pool_specs(families=("mha",), max_layers=2), label="spec")
            assert spec.size % spec.page_size == 0
    """
    chosen = _check_choices("families", families, POOL_FAMILIES)
    if dtype_names is None:
        accepted = frozenset.intersection(*(_FAMILY_DTYPES[family] for family in chosen))
        names = tuple(name for name in _DTYPE_ORDER if name in accepted)
    else:
        names = _check_choices("dtype_names", dtype_names, tuple(DTYPE_ITEMSIZE))
    _check_int("max_layers", max_layers, min_value=1)
    _check_int("max_size", max_size, min_value=1)
    _check_int("max_page_size", max_page_size, min_value=1)
    _check_int("max_start_layer", max_start_layer, min_value=0)
    return _pool_specs(chosen, names, max_layers, max_size, max_page_size, max_start_layer)


def token_locations(
    spec: PoolSpec, *, min_size: int = 0, max_size: int | None = None, unique: bool = True
) -> st.SearchStrategy[tuple[int, ...]]:
    """Token slots inside ``spec``'s buffers, ``[0, size + page_size)`` (padding page included).

    ``max_size=None`` means ``spec.num_slots``. With ``unique=True`` (as writes and move
    targets need) no slot repeats, so ``min_size`` may not exceed ``spec.num_slots``.
    Shrinks towards ``min_size`` copies of the lowest slots.

    Example::

        @given(st.data())
        def test_locs(data):
            locs = data.draw(token_locations(spec, min_size=1), label="loc")
            assert all(0 <= loc < spec.num_slots for loc in locs)
    """
    if not isinstance(spec, PoolSpec):
        raise InvalidArgument(f"spec={spec!r} must be a kvcheck.specs.PoolSpec")
    _check_int("min_size", min_size, min_value=0)
    _check_bool("unique", unique)
    high = spec.num_slots if max_size is None else max_size
    _check_int("max_size", high, min_value=0)
    _check_order("min_size", min_size, "max_size", high)
    if unique and min_size > spec.num_slots:
        raise InvalidArgument(
            f"Cannot draw min_size={min_size!r} unique locations from "
            f"spec.num_slots={spec.num_slots!r} slots"
        )
    slots = st.integers(0, spec.num_slots - 1)
    return st.lists(slots, min_size=min_size, max_size=high, unique=unique).map(tuple)


# --- op sequences ------------------------------------------------------------------------------


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

    Example::

        @given(st.data())
        def test_ops(data):
            sequence = data.draw(op_sequences(pool_specs(), max_ops=4), label="ops")
            reference = ReferencePool(sequence.spec)
            for op in sequence.ops:
                if reference.expected_error(op) is None:  # NoOp writes must raise
                    reference.apply(op)
    """
    _check_int("max_ops", max_ops, min_value=0)
    _check_bool("include_invalid", include_invalid)
    chosen = None if kinds is None else _check_choices("kinds", kinds, _ops.OP_KINDS)
    if isinstance(spec, st.SearchStrategy):
        return spec.flatmap(
            lambda drawn: _op_sequences(_valid_spec(drawn), max_ops, include_invalid, chosen)
        )
    return _op_sequences(_valid_spec(spec), max_ops, include_invalid, chosen)


def _valid_spec(spec: Any) -> PoolSpec:
    if not isinstance(spec, PoolSpec):
        raise InvalidArgument(f"spec={spec!r} must be a PoolSpec or a strategy for one")
    if spec.family not in POOL_FAMILIES:
        raise InvalidArgument(f"spec.family={spec.family!r} not in {POOL_FAMILIES!r}")
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


# --- model configs -----------------------------------------------------------------------------

#: DSA skip-topk fields in precedence order; "default" sets none of them.
_SKIP_MODES = ("default", "index_topk_freq", "index_topk_pattern", "cli_factor", "indexer_types")
_INVALID_FIELDS = ("cli_factor", "index_topk_freq", "index_skip_topk_offset")


def _skip_fields(draw: Callable[..., Any], mode: str, layers: int) -> dict[str, Any]:
    """The deciding skip field for ``mode`` plus, sometimes, shadowed lower-precedence ones."""
    fields: dict[str, Any] = {}
    if mode == "default":
        return fields
    order = _SKIP_MODES[1:]
    for lower in order[: order.index(mode) + 1]:
        # Lower-precedence fields are present only sometimes: they must not matter.
        if lower != mode and not draw(st.booleans()):
            continue
        # Layer 0 always computes its own top-k: it has no earlier one to reuse.
        if lower == "indexer_types":
            kinds = st.sampled_from(("full", "shared"))
            rest = draw(st.lists(kinds, min_size=layers - 1, max_size=layers - 1))
            fields[lower] = ("full", *rest)
        elif lower == "cli_factor":
            # 1 falls through to the next rule, so it is only a deciding value when shadowed.
            fields[lower] = draw(st.integers(2 if lower == mode else 1, 4))
        elif lower == "index_topk_pattern":
            letters = st.lists(st.sampled_from("FS"), min_size=layers - 1, max_size=layers - 1)
            fields[lower] = "F" + "".join(draw(letters))
        else:
            fields["index_topk_freq"] = draw(st.integers(1, 4))
            fields["index_skip_topk_offset"] = draw(st.none() | st.integers(1, 4))
    return fields


@st.composite
def _model_configs(
    draw: Callable[..., Any],
    archs: tuple[str, ...],
    min_layers: int,
    max_layers: int,
    include_markers: bool,
    allow_invalid: bool,
    model_config: type,
) -> Any:
    arch = draw(st.sampled_from(archs))
    layers = draw(st.integers(min_layers, max_layers))
    fields: dict[str, Any] = {
        "name": f"generated-{arch}-{layers}l",
        "attention_arch": arch,
        "num_hidden_layers": layers,
    }
    if arch == "mha":
        kv_heads = draw(st.integers(1, 4))
        fields |= {
            "num_key_value_heads": kv_heads,
            "num_attention_heads": kv_heads * draw(st.integers(1, 2)),
            "head_dim": draw(st.sampled_from((128, 64, 8))),
            "v_head_dim": draw(st.none() | st.sampled_from((128, 64, 8))),
        }
    else:
        fields |= {
            "num_attention_heads": draw(st.integers(1, 4)),
            "kv_lora_rank": draw(st.sampled_from((512, 64, 16))),
            "qk_rope_head_dim": draw(st.sampled_from((64, 8))),
        }
    if arch == "dsa":
        fields |= {
            "index_head_dim": _INDEX_HEAD_DIM,
            "index_topk": draw(st.sampled_from((2048, 64))),
        }
        fields |= _skip_fields(draw, draw(st.sampled_from(_SKIP_MODES)), layers)
    if include_markers:
        if draw(st.booleans()):
            fields["sliding_window"] = draw(st.sampled_from((4096, 128)))
        if draw(st.booleans()):
            fields["is_hybrid_linear"] = True
        if draw(st.booleans()):
            fields["kv_cache_quant_algo"] = draw(st.sampled_from(("NVFP4", "FP8")))
    if arch == "dsa" and allow_invalid and draw(st.booleans()):
        # The bad field is the deciding one (no higher-precedence field shadows it), so the
        # skip rule must raise for every layer.
        for name in ("indexer_types", "cli_factor", "index_topk_pattern", "index_topk_freq"):
            fields.pop(name, None)
        fields.pop("index_skip_topk_offset", None)
        bad_field = draw(st.sampled_from(_INVALID_FIELDS))
        if bad_field == "index_skip_topk_offset":
            fields["index_topk_freq"] = draw(st.integers(1, 4))
        fields[bad_field] = draw(st.integers(-2, 0))
        return SimpleNamespace(**fields)
    return model_config(**fields)


def model_configs(
    *,
    archs: Sequence[str] = _ARCHS,
    min_layers: int = 1,
    max_layers: int = 16,
    include_markers: bool = True,
    allow_invalid: bool = False,
) -> st.SearchStrategy[Any]:
    """:class:`kvcheck.serving.ModelConfig` values for the attention ``archs`` given.

    DSA configs set each skip-topk field in turn (none; ``index_topk_freq`` with or without
    ``index_skip_topk_offset``; ``index_topk_pattern``; ``cli_factor > 1``;
    ``indexer_types``), often with lower-precedence fields present but shadowed; patterns
    and ``indexer_types`` have one entry per layer, and layer 0 never skips.
    ``include_markers`` adds, each about half the time, the markers pool selection reads:
    ``sliding_window``, ``is_hybrid_linear`` and ``kv_cache_quant_algo`` ("NVFP4" or "FP8").
    ``allow_invalid=True`` makes about half the DSA examples invalid (``cli_factor``,
    ``index_topk_freq`` or ``index_skip_topk_offset`` <= 0, as the deciding field): those
    are :class:`types.SimpleNamespace` objects with the same fields, because ``ModelConfig``
    refuses them. Shrinks towards a one-layer MHA model with one KV head of dim 128 and no
    markers.

    Example::

        @given(st.data())
        def test_skip_rule(data):
            config = data.draw(model_configs(archs=("dsa",), max_layers=80), label="model")
            assert len(skip_topk_layers(config)) == config.num_hidden_layers
    """
    chosen = _check_choices("archs", archs, _ARCHS)
    _check_int("min_layers", min_layers, min_value=1)
    _check_int("max_layers", max_layers, min_value=1)
    _check_order("min_layers", min_layers, "max_layers", max_layers)
    _check_bool("include_markers", include_markers)
    _check_bool("allow_invalid", allow_invalid)
    if allow_invalid and "dsa" not in chosen:
        raise InvalidArgument(
            f"allow_invalid=True needs 'dsa' in archs={archs!r}: only DSA configs can be invalid"
        )
    from kvcheck.serving import ModelConfig  # here, so kvcheck.strategies imports without it

    return _model_configs(
        chosen, min_layers, max_layers, include_markers, allow_invalid, ModelConfig
    )


# --- server flags ------------------------------------------------------------------------------

#: The combination --prefill-only-disable-kv-cache accepts with the fewest changes.
_VALID_MINIMAL_FLAGS: dict[str, Any] = {
    "prefill_only_disable_kv_cache": True,
    "is_embedding": True,
    "kv_cache_dtype": "auto",
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
    "attn_cp_size": 1,
    "enable_prefill_context_parallel": False,
    "enable_hisparse": False,
    "attention_backend": "fa3",
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "page_size": None,
}

#: One entry per flag that can break a rule; the FP4 and MXFP8 rules share --kv-cache-dtype,
#: so at most one of them is broken at a time.
_VIOLATION_GROUPS: tuple[str, ...] = (
    "is_embedding",
    "kv_cache_dtype",
    "chunked_prefill_size",
    "disable_radix_cache",
    "attn_cp_size",
    "enable_prefill_context_parallel",
    "enable_hisparse",
    "prefill_backend",
)


def _violating_values(draw: Callable[..., Any], group: str) -> dict[str, Any]:
    if group == "is_embedding":
        return {"is_embedding": False}
    if group == "kv_cache_dtype":
        return {"kv_cache_dtype": draw(st.sampled_from((*sorted(FP4_KV_CACHE_DTYPES), "mxfp8")))}
    if group == "chunked_prefill_size":
        # None is left for resolution to fill with SGLang's (positive) default.
        return {"chunked_prefill_size": draw(st.sampled_from((8192, 2048, None)))}
    if group == "disable_radix_cache":
        return {"disable_radix_cache": False}
    if group == "attn_cp_size":
        return {"attn_cp_size": draw(st.integers(2, 8))}
    if group == "enable_prefill_context_parallel":
        return {"enable_prefill_context_parallel": True}
    if group == "enable_hisparse":
        return {"enable_hisparse": True}
    shared, prefill = draw(
        st.sampled_from(
            (
                ("triton", None),
                ("flashinfer", None),
                ("fa3", "triton"),
                ("torch_native", "flashinfer"),
            )
        )
    )
    return {"attention_backend": shared, "prefill_attention_backend": prefill}


def _harmless_values(draw: Callable[..., Any]) -> dict[str, Any]:
    """Variation that breaks no rule: other KV dtypes, backend spellings, page sizes."""
    shared, prefill = draw(
        st.sampled_from((("fa3", None), ("fa4", None), ("triton", "fa3"), ("fa3", "fa4")))
    )
    return {
        # Not fp8_e5m2: resolution moves fa3 to triton for it, which breaks the backend rule.
        "kv_cache_dtype": draw(st.sampled_from(("auto", "bfloat16", "bf16", "fp8_e4m3"))),
        "attention_backend": shared,
        "prefill_attention_backend": prefill,
        "decode_attention_backend": draw(st.sampled_from((None, "triton", "fa3", "flashinfer"))),
        "page_size": draw(st.sampled_from((None, 1, 16, 64))),
    }


@st.composite
def _server_flags(
    draw: Callable[..., Any], flag_on: bool | None, min_violations: int, max_violations: int
) -> dict[str, Any]:
    flags = dict(_VALID_MINIMAL_FLAGS)
    flags["prefill_only_disable_kv_cache"] = (
        draw(st.sampled_from((True, False))) if flag_on is None else flag_on
    )
    if draw(st.booleans()):
        flags |= _harmless_values(draw)
    if min_violations == 0 and draw(st.booleans()):
        return flags  # accepted as often as rejected, not only when the list draws empty
    groups = draw(
        st.lists(
            st.sampled_from(_VIOLATION_GROUPS),
            min_size=min_violations,
            max_size=max_violations,
            unique=True,
        )
    )
    for group in groups:
        flags |= _violating_values(draw, group)
    return flags


def server_flags(
    *,
    prefill_only_disable_kv_cache: bool | None = None,
    min_violations: int = 0,
    max_violations: int | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts of ``ServerArgs`` field names to values around ``--prefill-only-disable-kv-cache``.

    Every dict sets every field the validation reads (``prefill_only_disable_kv_cache``,
    ``is_embedding``, ``kv_cache_dtype``, ``chunked_prefill_size``, ``disable_radix_cache``,
    ``attn_cp_size``, ``enable_prefill_context_parallel``, ``enable_hisparse``,
    ``attention_backend``, ``prefill_attention_backend``) plus ``decode_attention_backend``
    and ``page_size``. It starts from the valid minimal combination (``is_embedding=True``,
    ``chunked_prefill_size=-1``, ``disable_radix_cache=True``, ``attention_backend="fa3"``),
    sometimes varies it harmlessly, then breaks between ``min_violations`` and
    ``max_violations`` rules (None: 8, one per flag; the FP4 and MXFP8 rules share
    ``--kv-cache-dtype``), often several at once. ``prefill_only_disable_kv_cache=None``
    draws the flag; True or False fixes it. ``chunked_prefill_size=None`` is left for
    resolution to fill, so compare against ``kvcheck.reference.reference_first_violation``
    on the resolved arguments. Shrinks towards the valid minimal combination with the flag on.

    Example::

        @given(st.data())
        def test_validation(data):
            flags = data.draw(server_flags(min_violations=2), label="flags")
            with pytest.raises(ValueError):
                ServerArgs(**flags)
    """
    if prefill_only_disable_kv_cache is not None:
        _check_bool("prefill_only_disable_kv_cache", prefill_only_disable_kv_cache)
    most = len(_VIOLATION_GROUPS)
    high = most if max_violations is None else max_violations
    _check_int("min_violations", min_violations, min_value=0)
    _check_int("max_violations", high, min_value=0)
    _check_order("min_violations", min_violations, "max_violations", high)
    if high > most:
        raise InvalidArgument(
            f"max_violations={high!r} exceeds the {most} rules that can be broken together"
        )
    return _server_flags(prefill_only_disable_kv_cache, min_violations, high)
