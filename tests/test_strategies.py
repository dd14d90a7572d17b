"""The public strategies: registry, signatures, argument validation and what they generate."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

from kvcheck import strategies
from kvcheck.reference import ReferencePool, reference_skips_topk, reference_violations
from kvcheck.specs import (
    DTYPE_ITEMSIZE,
    FP8_DTYPES,
    HostCopy,
    HostReload,
    Move,
    OpSequence,
    PoolSpec,
    WriteIndexK,
    WriteKV,
)
from kvcheck.strategies import attention, malformed_calls, ops, pools, sequences, serving

FAST = settings(max_examples=25, database=None, deadline=None)
#: find() searches longer, stops at the first hit and skips shrinking (speed); no database so
#: runs stay independent, derandomized so that every run searches the same examples.
SEARCH = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)

SMALL_SPEC = PoolSpec(family="mha", size=8, page_size=2, layer_num=2, dtype="bfloat16")
NOOP_SPEC = PoolSpec(family="noop", size=8, page_size=2, layer_num=2, dtype="float16")
#: Positional "what" argument of the strategies that take one.
WHAT: dict[str, Any] = {
    "token_locations": SMALL_SPEC,
    "op_sequences": SMALL_SPEC,
    "bad_calls": SMALL_SPEC,
    "noop_write_calls": NOOP_SPEC,
    "noop_move_arguments": NOOP_SPEC,
    "page_layouts": (3, 1),
    "query_lengths": (3, 1),
}
#: The modules of the package that hold strategies.
MODULES = (pools, sequences, serving, malformed_calls, attention)


def build(name: str, **kwargs: Any) -> st.SearchStrategy[Any]:
    factory = getattr(strategies, name)
    return factory(WHAT[name], **kwargs) if name in WHAT else factory(**kwargs)


# --- the registry ------------------------------------------------------------------------------


def test_registry_lists_every_public_strategy() -> None:
    """The package's __all__ names exactly the public functions of its strategy modules."""
    public = {
        name
        for module in MODULES
        for name in module.__all__
        if inspect.isfunction(getattr(module, name))
        and getattr(module, name).__module__ == module.__name__
    }
    assert set(strategies.__all__) == public


@pytest.mark.parametrize("name", strategies.__all__)
def test_docstring_has_example_and_shrink_target(name: str) -> None:
    """Each strategy documents a runnable example and what its examples shrink towards."""
    doc = inspect.getdoc(getattr(strategies, name)) or ""
    assert ">>> " in doc
    assert "Shrinks towards" in doc


@pytest.mark.parametrize("name", strategies.__all__)
def test_arguments_are_keyword_only_with_defaults(name: str) -> None:
    """Everything but the positional "what" argument is keyword-only and has a default."""
    parameters = list(inspect.signature(getattr(strategies, name)).parameters.values())
    if name in WHAT:
        assert parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = parameters[1:]
    for parameter in parameters:
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, parameter.name
        assert parameter.default is not inspect.Parameter.empty, parameter.name


@pytest.mark.parametrize("name", [n for n in strategies.__all__ if n != "model_configs"])
def test_defaults_build_a_strategy(name: str) -> None:
    """Called with defaults, each strategy returns a SearchStrategy that draws a value."""
    strategy = build(name)
    assert isinstance(strategy, st.SearchStrategy)
    assert find(strategy, lambda _: True, settings=SEARCH) is not None


SIMPLEST = [
    pytest.param("dtypes", "bfloat16", id="dtypes"),
    pytest.param("page_sizes", 1, id="page_sizes"),
    pytest.param("layer_masks", (False,), id="layer_masks"),
    pytest.param(
        "pool_specs",
        PoolSpec(family="mha", size=1, page_size=1, layer_num=1, dtype="bfloat16", head_dim=1),
        id="pool_specs",
    ),
    pytest.param("token_locations", (), id="token_locations"),
    pytest.param("op_sequences", OpSequence(spec=SMALL_SPEC, ops=()), id="op_sequences"),
]


@pytest.mark.parametrize(("name", "simplest"), SIMPLEST)
def test_simplest_example_is_the_documented_shrink_target(name: str, simplest: Any) -> None:
    """The first, simplest example is what the docstring says examples shrink towards."""
    assert find(build(name), lambda _: True, settings=SEARCH) == simplest


BAD_ARGUMENTS = [
    ("dtypes", {"families": ("mha", "gqa")}, "families="),
    ("dtypes", {"families": ()}, "families=()"),
    ("dtypes", {"include_fp8": "yes"}, "include_fp8='yes'"),
    ("page_sizes", {"family": "paged"}, "family='paged'"),
    ("page_sizes", {"min_page_size": 0}, "min_page_size=0"),
    ("page_sizes", {"min_page_size": 8, "max_page_size": 4}, "max_page_size=4 < min_page_size=8"),
    ("page_sizes", {"family": "dsa", "min_page_size": 5, "max_page_size": 7}, "max_page_size=7"),
    ("layer_masks", {"layers": 0}, "layers=0"),
    ("layer_masks", {"layers": 3, "max_layers": 4}, "layers=3"),
    ("layer_masks", {"min_layers": 5, "max_layers": 2}, "max_layers=2 < min_layers=5"),
    ("layer_masks", {"max_layers": 2.5}, "max_layers=2.5"),
    ("pool_specs", {"families": ["mha", "swa"]}, "families="),
    ("pool_specs", {"dtype_names": ("int8",)}, "dtype_names="),
    ("pool_specs", {"max_layers": 0}, "max_layers=0"),
    ("pool_specs", {"max_size": True}, "max_size=True"),
    ("pool_specs", {"max_start_layer": -1}, "max_start_layer=-1"),
    ("token_locations", {"min_size": -1}, "min_size=-1"),
    ("token_locations", {"min_size": 11}, "min_size=11"),
    ("token_locations", {"min_size": 3, "max_size": 2}, "max_size=2 < min_size=3"),
    ("token_locations", {"unique": 1}, "unique=1"),
    ("op_sequences", {"max_ops": -1}, "max_ops=-1"),
    ("op_sequences", {"include_invalid": None}, "include_invalid=None"),
    ("model_configs", {"archs": ("mha", "gqa")}, "archs="),
    ("model_configs", {"min_layers": 0}, "min_layers=0"),
    ("model_configs", {"min_layers": 9, "max_layers": 3}, "max_layers=3 < min_layers=9"),
    ("model_configs", {"archs": ("mha",), "allow_invalid": True}, "allow_invalid=True"),
    ("server_flags", {"prefill_only_disable_kv_cache": "on"}, "prefill_only_disable_kv_cache="),
    ("server_flags", {"min_violations": 4, "max_violations": 1}, "max_violations=1"),
    ("server_flags", {"max_violations": 9}, "max_violations=9"),
    (
        "pool_specs",
        {"target": SimpleNamespace(name="bad", pool_spec_limits={"dsa": {"page": (64,)}})},
        "target 'bad'",
    ),
    ("bad_calls", {"device": 0}, "device=0"),
    ("noop_write_calls", {"methods": ("move_kv_cache",)}, "methods=('move_kv_cache',)"),
    ("noop_write_calls", {"methods": ()}, "methods=()"),
    ("page_layouts", {"max_spare_pages": -1}, "max_spare_pages=-1"),
    ("varlen_batches", {"min_seq_len": 3, "max_seq_len": 2}, "max_seq_len=2 < min_seq_len=3"),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "fragment"),
    BAD_ARGUMENTS,
    ids=[f"{name}-{'-'.join(kwargs)}" for name, kwargs, _ in BAD_ARGUMENTS],
)
def test_bad_arguments_raise_invalid_argument(name: str, kwargs: dict, fragment: str) -> None:
    """A bad argument raises InvalidArgument at once, naming the argument and its value."""
    with pytest.raises(InvalidArgument) as info:
        build(name, **kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        "not a spec",
        PoolSpec(
            family="dsa",
            size=4,
            page_size=2,
            layer_num=2,
            dtype="bfloat16",
            skip_topk_layers=(True,),
        ),
    ],
    ids=["not-a-spec", "mask-length"],
)
def test_op_sequences_refuses_bad_specs(spec: Any) -> None:
    """op_sequences names a spec it cannot use."""
    with pytest.raises(InvalidArgument, match="spec"):
        strategies.op_sequences(spec)


# --- generated values ----------------------------------------------------------------------


@FAST
@given(st.data())
def test_dtypes_and_page_sizes_respect_arguments(data: st.DataObject) -> None:
    """dtypes honours include_fp8; DSA page sizes are powers of two within the bounds."""
    name = data.draw(strategies.dtypes(include_fp8=False), label="dtype")
    assert name in DTYPE_ITEMSIZE and name not in FP8_DTYPES
    page_size = data.draw(
        strategies.page_sizes(family="dsa", min_page_size=2, max_page_size=64), label="page size"
    )
    assert 2 <= page_size <= 64 and page_size & (page_size - 1) == 0


@FAST
@given(st.data())
def test_layer_masks_have_the_requested_length(data: st.DataObject) -> None:
    """layer_masks honours layers, min_layers and max_layers."""
    assert len(data.draw(strategies.layer_masks(layers=5), label="mask")) == 5
    mask = data.draw(strategies.layer_masks(min_layers=2, max_layers=3), label="mask")
    assert 2 <= len(mask) <= 3 and all(isinstance(skip, bool) for skip in mask)


@FAST
@given(strategies.pool_specs(max_layers=3, max_size=16, max_page_size=4))
def test_pool_specs_are_usable(spec: PoolSpec) -> None:
    """Specs lie within the bounds (DSA in whole pages), DSA masks fit, and the reference
    accepts them."""
    assert 1 <= spec.layer_num <= 3
    assert 1 <= spec.size <= 16 and spec.page_size <= 4
    if spec.family == "dsa":
        assert spec.size % spec.page_size == 0
        assert len(spec.skip_mask) == spec.layer_num and spec.index_head_dim == 128
        assert spec.effective_index_buf_size >= spec.size
    ReferencePool(spec)


def test_pool_specs_reach_the_head_major_layout_on_whole_pages_only() -> None:
    """MHA specs sometimes take kv_layout='hnd', always with whole pages; others never do."""
    spec = _find(strategies.pool_specs(families=("mha",)), lambda s: s.kv_layout == "hnd")
    assert spec.size % spec.page_size == 0
    with pytest.raises(NoSuchExample):
        _find(strategies.pool_specs(), lambda s: s.kv_layout == "hnd" and s.family != "mha")
    with pytest.raises(NoSuchExample):
        _find(
            strategies.pool_specs(families=("mha",)),
            lambda s: s.kv_layout == "hnd" and s.size % s.page_size != 0,
        )


def test_pool_specs_reach_capacities_short_of_whole_pages() -> None:
    """MHA, no-op and MLA specs sometimes end in a partial page; DSA specs never do."""
    for family in ("mha", "noop", "mla"):
        spec = _find(strategies.pool_specs(families=(family,)), lambda s: s.size % s.page_size != 0)
        assert spec.size % spec.page_size
    with pytest.raises(NoSuchExample):
        _find(strategies.pool_specs(families=("dsa",)), lambda s: s.size % s.page_size != 0)


@FAST
@given(st.data())
def test_token_locations_are_in_range(data: st.DataObject) -> None:
    """Locations lie in [0, size + page_size) and are unique unless asked otherwise."""
    locs = data.draw(strategies.token_locations(SMALL_SPEC, min_size=3), label="locs")
    assert len(locs) >= 3 and len(set(locs)) == len(locs)
    assert all(0 <= loc < SMALL_SPEC.num_slots for loc in locs)
    repeated = data.draw(
        strategies.token_locations(SMALL_SPEC, max_size=20, unique=False), label="locs"
    )
    assert all(0 <= loc < SMALL_SPEC.num_slots for loc in repeated)


def _replay(sequence: OpSequence) -> list[type[Exception] | None]:
    """Apply every op the reference accepts; return the expected error of each op."""
    reference = ReferencePool(sequence.spec)
    errors = []
    for op in sequence.ops:
        error = reference.expected_error(op)
        errors.append(error)
        if error is None:
            reference.apply(op)
    return errors


@FAST
@given(strategies.op_sequences(strategies.pool_specs(), max_ops=6))
def test_valid_op_sequences_are_accepted(sequence: OpSequence) -> None:
    """Without include_invalid every op is valid, except NoOp writes, which must raise."""
    assert len(sequence.ops) <= 6
    for op, error in zip(sequence.ops, _replay(sequence), strict=True):
        if sequence.spec.family == "noop" and not isinstance(op, Move | HostCopy):
            assert error is RuntimeError
        else:
            assert error is None, op


@FAST
@given(strategies.op_sequences(strategies.pool_specs(), include_invalid=True))
def test_invalid_op_sequences_raise_contract_errors(sequence: OpSequence) -> None:
    """With include_invalid, ops are valid or rejected with ValueError/RuntimeError."""
    assert set(_replay(sequence)) <= {None, ValueError, RuntimeError}


@FAST
@given(strategies.op_sequences(strategies.pool_specs(families=("mha", "mla", "dsa"))))
def test_write_payloads_are_finite(sequence: OpSequence) -> None:
    """Every written row decodes to finite values of the pool's dtype."""
    dtype = getattr(torch, sequence.spec.dtype)
    for op in sequence.ops:
        if isinstance(op, WriteKV):
            for row in (*op.k_rows, *op.v_rows):
                values = torch.frombuffer(bytearray(row), dtype=torch.uint8).view(dtype)
                assert torch.isfinite(values.float()).all()


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float16", "bfloat16"])
def test_finite_encoding_covers_every_bit_pattern(dtype: str) -> None:
    """Every 8- and 16-bit pattern maps to a finite value; finite patterns stay as they are."""
    width = DTYPE_ITEMSIZE[dtype]
    raw = np.arange(1 << (8 * width), dtype=f"<u{width}").tobytes()
    fixed = ops._finite(raw, dtype)
    before = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype))
    after = torch.frombuffer(bytearray(fixed), dtype=torch.uint8).view(getattr(torch, dtype))
    assert torch.isfinite(after.float()).all()
    finite = torch.isfinite(before.float())
    assert torch.equal(
        after.view(torch.uint8)[finite.repeat_interleave(width)],
        before.view(torch.uint8)[finite.repeat_interleave(width)],
    )


@FAST
@given(strategies.server_flags())
def test_server_flags_set_every_flag_the_rules_read(flags: dict[str, Any]) -> None:
    """Every dict names every field validation reads, with a bool flag."""
    assert set(flags) >= {
        "prefill_only_disable_kv_cache",
        "is_embedding",
        "kv_cache_dtype",
        "chunked_prefill_size",
        "disable_radix_cache",
        "attn_cp_size",
        "enable_prefill_context_parallel",
        "enable_hisparse",
        "attention_backend",
        "prefill_attention_backend",
    }
    assert isinstance(flags["prefill_only_disable_kv_cache"], bool)


@pytest.mark.parametrize("count", [0, 3, 8])
def test_server_flags_break_the_requested_number_of_rules(count: int) -> None:
    """With the flag on and min_violations == max_violations == n, n rules are broken."""

    @FAST
    @given(
        strategies.server_flags(
            prefill_only_disable_kv_cache=True, min_violations=count, max_violations=count
        )
    )
    def check(flags: dict[str, Any]) -> None:
        assert len(reference_violations(flags)) == count

    check()


# --- corner cases come up (find() proves the strategy reaches them) ---------------------------


def _find(strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool]) -> Any:
    return find(strategy, condition, settings=SEARCH)


def test_layer_masks_reach_the_corner_cases() -> None:
    """All-skip, none-skip and first-layer-skips masks of several layers all come up."""
    masks = strategies.layer_masks(min_layers=3, max_layers=8)
    assert all(_find(masks, lambda m: len(m) >= 3 and all(m)))
    assert not any(_find(masks, lambda m: len(m) >= 3 and not any(m)))
    first_only = _find(masks, lambda m: m[0] and not all(m))
    assert first_only[0] and not all(first_only)


def test_op_sequences_reach_overlapping_moves() -> None:
    """Moves whose repeated sources overlap their targets come up."""

    def overlapping(sequence: OpSequence) -> bool:
        return any(
            isinstance(op, Move) and set(op.tgt) & set(op.src) and len(set(op.src)) < len(op.src)
            for op in sequence.ops
        )

    sequence = _find(strategies.op_sequences(SMALL_SPEC), overlapping)
    assert overlapping(sequence)


def test_op_sequences_reach_dsa_index_writes_and_page_reloads() -> None:
    """DSA sequences write index-K and reload whole pages after a copy."""
    spec = PoolSpec(
        family="dsa",
        size=8,
        page_size=4,
        layer_num=2,
        dtype="bfloat16",
        skip_topk_layers=(True, False),
    )

    def kinds(sequence: OpSequence) -> set[str]:
        return {type(op).__name__ for op in sequence.ops}

    sequence = _find(
        strategies.op_sequences(spec), lambda s: {"WriteIndexK", "HostReload"} <= kinds(s)
    )
    layouts = {
        op.name: ops.copy_layout(spec, op.indices)
        for op in sequence.ops
        if isinstance(op, HostCopy)
    }
    reloads = [op for op in sequence.ops if isinstance(op, HostReload)]
    # A request's copy goes back to page-aligned runs of the same lengths (two runs may
    # happen to be adjacent); arbitrary tokens go to any slots.
    for reload in reloads:
        layout = layouts[reload.name]
        if layout is None:
            continue
        start = 0
        for length in layout:
            run = reload.indices[start : start + length]
            assert run[0] % spec.page_size == 0
            assert list(run) == list(range(run[0], run[0] + length))
            start += length
        assert start == len(reload.indices)
    assert all(op.layer_id == 1 for op in sequence.ops if isinstance(op, WriteIndexK))


def test_host_copies_reach_partial_pages_and_several_requests() -> None:
    """Host copies come shaped as the scheduler passes them: a request whose last page is
    partial, and two requests at once."""
    spec = PoolSpec(family="dsa", size=16, page_size=4, layer_num=1, dtype="bfloat16")
    partial = _find(
        ops.host_copy_ops(spec, "c"),
        lambda op: (
            (layout := ops.copy_layout(spec, op.indices)) is not None
            and len(layout) == 1
            and layout[0] % 4 != 0
            and layout[0] > 4
        ),
    )
    assert partial.indices[0] % 4 == 0
    two = _find(
        ops.host_copy_ops(spec, "c"),
        lambda op: len(ops.copy_layout(spec, op.indices) or ()) == 2,
    )
    assert len(set(two.indices)) == len(two.indices)


@pytest.mark.parametrize("family", ["mha", "noop", "mla", "dsa"])
@FAST
@given(data=st.data())
def test_single_op_strategies_draw_what_the_reference_accepts(
    family: str, data: st.DataObject
) -> None:
    """Every valid single-op strategy draws an op the reference accepts (NoOp: writes
    raise RuntimeError), and a reload of a copy has its copy's shape."""
    spec = data.draw(strategies.pool_specs(families=(family,)), label="spec")
    reference = ReferencePool(spec)
    kind = data.draw(st.sampled_from(ops.family_op_kinds(spec)), label="kind")
    copies: dict[str, tuple[int, ops.CopyLayout]] = {}
    if kind == "host_reload":
        copy = data.draw(ops.host_copy_ops(spec, "c"), label="copy")
        reference.apply(copy)
        copies["c"] = (len(copy.indices), ops.copy_layout(spec, copy.indices))
        op = data.draw(ops.host_reload_ops(spec, copies), label="op")
    elif kind == "host_copy":
        op = data.draw(ops.host_copy_ops(spec, "c"), label="op")
    elif kind == "write_index_k":
        op = data.draw(
            ops.write_index_k_ops(spec, layer_ids=ops.indexed_layers(spec, skip=False)),
            label="op",
        )
    else:
        op = data.draw(getattr(ops, f"{kind}_ops")(spec), label="op")
    expected = reference.expected_error(op)
    writes = kind not in ("move", "host_copy")
    assert expected is (RuntimeError if family == "noop" and writes else None), op


def test_server_flags_reach_several_violations() -> None:
    """Flag combinations breaking three or more rules at once come up, flag on."""
    flags = _find(strategies.server_flags(), lambda f: len(reference_violations(f)) >= 3)
    assert flags["prefill_only_disable_kv_cache"] is True


def test_server_flags_shrink_to_the_valid_minimal_combination() -> None:
    """The simplest example is the accepted minimal combination with the flag on."""
    flags = _find(strategies.server_flags(), lambda f: True)
    assert reference_violations(flags) == ()
    assert flags["prefill_only_disable_kv_cache"] is True
    assert flags["chunked_prefill_size"] == -1 and flags["attention_backend"] == "fa3"


# --- model configs (needs kvcheck.serving) ------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "indexer_types",
        "cli_factor",
        "index_topk_pattern",
        "index_topk_freq",
        "index_skip_topk_offset",
    ],
)
def test_model_configs_reach_each_skip_field(field: str) -> None:
    """DSA configs set each skip-topk field; the result is a valid ModelConfig."""
    serving = pytest.importorskip("kvcheck.serving")
    configs = strategies.model_configs(archs=("dsa",), max_layers=6)
    config = _find(configs, lambda c: getattr(c, field) not in (None, 1))
    assert isinstance(config, serving.ModelConfig)
    assert len([reference_skips_topk(config, layer) for layer in range(6)]) == 6


def test_invalid_model_configs_break_the_skip_rule() -> None:
    """allow_invalid gives SimpleNamespace configs whose skip rule raises on every layer."""
    pytest.importorskip("kvcheck.serving")

    @FAST
    @given(strategies.model_configs(allow_invalid=True, max_layers=6))
    def check(config: Any) -> None:
        if isinstance(config, SimpleNamespace):
            for layer in range(config.num_hidden_layers):
                with pytest.raises(ValueError):
                    reference_skips_topk(config, layer)
        elif config.attention_arch == "dsa":
            assert not reference_skips_topk(config, 0)

    check()
    invalid = _find(
        strategies.model_configs(allow_invalid=True), lambda c: isinstance(c, SimpleNamespace)
    )
    assert invalid.attention_arch == "dsa"


def test_choice_keeps_equal_tuples_of_other_types_apart() -> None:
    """``(False, True) == (0, 1)``: a cache keyed by value alone hands layer ids out as
    booleans once a boolean choice was built first."""
    from kvcheck.strategies.ops import choice

    booleans = choice((False, True))
    drawn = find(choice((0, 1)), lambda value: value == 1, settings=settings(database=None))
    assert type(drawn) is int
    assert booleans is choice((False, True))
