"""Differential state machines: a target's pool and the reference model, step by step.

:func:`pool_machine` builds one :class:`~hypothesis.stateful.RuleBasedStateMachine` class
per pool family. Each example draws a small pool spec, builds the target's pool and a
:class:`~kvcheck.reference.ReferencePool` from it, then runs the same random operations
on both, every one drawn from :mod:`kvcheck.strategies.ops`: KV writes in the pool's
dtype and in the caller's (with ``k_scale``/``v_scale``), ``set_mla_kv_buffer`` and
prefix-valid writes, DSA index-K and compress-tail writes, moves (sources repeated and
overlapping targets), host copies and reloads of request-shaped index sets, and invalid
operations. Every call must leave the caller's tensors unchanged. After every step an
invariant compares every buffer byte for byte, raw and through the read API (DSA compress
tails through ``get_compress_tail_buffers``), checks the layer range, the byte accounting
and transfer descriptors (:mod:`kvcheck.properties.accounting`) and calls the pool's own
``check_valid()`` where it has one. A pool must raise exactly when the
reference says the contract demands it. A failure carries the spec and every operation
so far (``PropertyFailure.reproduction``), from which ``kvcheck verify`` writes a
standalone script; a failure matching one of the target's declared findings is steered
around (:mod:`kvcheck.targets.findings`).

Run a machine with :func:`hypothesis.stateful.run_state_machine_as_test` (settings are on
``Machine.TestCase.settings``) or as a unittest ``TestCase``.

Example::

    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.machines import pool_machine
    from kvcheck.targets import resolve_target

    Machine = pool_machine(resolve_target("kvcheck"), device="cpu", family="dsa")
    run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.calls import describe_op, op_method
from kvcheck.failures import FailureSignature, PropertyFailure, Reproduction
from kvcheck.properties.accounting import (
    assert_accounting,
    assert_contiguous_buf_infos,
    assert_scale_buf_infos,
)
from kvcheck.properties.apply import apply_op_like_reference
from kvcheck.properties.assertions import failure
from kvcheck.properties.pool_state import (
    assert_compress_tails_match_reference,
    assert_layer_range,
    assert_pool_matches_reference,
    assert_read_api_matches_reference,
)
from kvcheck.reference import ReferencePool
from kvcheck.specs import (
    DCP_SIZES,
    INDEX_KPOOLS,
    POOL_FAMILIES,
    HostCopy,
    HostReload,
    Move,
    Op,
    PoolSpec,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.steering import Steering
from kvcheck.strategies import ops as draws
from kvcheck.strategies import pool_specs
from kvcheck.strategies.limits import within_target_limits
from kvcheck.targets import supports
from kvcheck.targets.findings import steered_tags
from kvcheck.variants import Variant, variants_of

__all__ = [
    "MACHINE_CAPABILITIES",
    "MACHINE_FAMILIES",
    "PoolMachine",
    "default_machine_specs",
    "pool_machine",
    "supported_op_kinds",
    "variant_machine_specs",
]

MACHINE_FAMILIES = POOL_FAMILIES
#: Target capabilities the machines exercise beyond building a pool and writing to it.
MACHINE_CAPABILITIES: tuple[str, ...] = (
    "move",
    "host_copy",
    "index_k_write",
    "input_validation",
    "state_buf_infos",
    "read_api",
    "cast_write",
    "mla_write",
    "prefix_valid_write",
    "contiguous_buf_infos",
    "compress_tail",
)

#: Step kind -> the capability it needs (None: every target), in shrink order.
_STEP_KINDS: tuple[tuple[str, str | None], ...] = (
    ("pause", None),
    ("write_kv", None),
    ("move", "move"),
    ("write_index_k", "index_k_write"),
    # Early: a step's kind favours the first kinds, and tails exist only on kpool pools.
    ("write_compress_tail", "compress_tail"),
    ("host_copy", "host_copy"),
    ("host_reload", "host_copy"),
    ("cast_write_kv", "cast_write"),
    ("write_mla", "mla_write"),
    ("write_prefix_valid", "prefix_valid_write"),
    ("invalid", "input_validation"),
)


@functools.lru_cache(maxsize=256)  # asked once per step, and the spec is fixed per example
def _favoured_kinds(spec: PoolSpec) -> tuple[str, ...]:
    """Kinds drawn twice as often for ``spec``: where a variant keeps extra state, and so
    where its bugs live. Host round trips (scales and tails get lost there; a reload needs
    a copy first), a latent pool's split nope/rope writes (the path MLA attention takes),
    index-K and compress-tail writes of a kpool pool, and a quantized pool's writes of
    another dtype, which carry the caller's scales."""
    favoured = ["host_reload"]
    if spec.family in ("mla", "dsa"):  # the write MLA attention makes: split nope and rope
        favoured.append("write_mla")
    if spec.index_kpool > 1:  # pooled index pages: what a kpool pool keeps of its own
        favoured.append("write_index_k")
    if spec.compress_tails:
        favoured.append("write_compress_tail")
    if spec.kv_quant != "none":
        favoured.append("cast_write_kv")
    return tuple(favoured)


#: Pool methods that can change a DSA pool's index keys.
_INDEX_CHANGING = frozenset({"set_index_k_scale_buffer", "move_kv_cache", "load_cpu_copy"})

#: Tiny pools keep every step cheap: few layers, small heads, at most 32 tokens.
_MAX_LAYERS = 3
_MAX_SIZE = 32
_MAX_PAGE_SIZE = 4


def supported_op_kinds(target: Any, family: str) -> tuple[str, ...]:
    """The :data:`kvcheck.strategies.ops.OP_KINDS` that ``target`` serves for ``family``
    and that none of its declared findings asks to steer around.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> supported_op_kinds(resolve_target("kvcheck"), "mla")[:3]
        ('write_kv', 'move', 'host_copy')
    """
    needs = dict(_STEP_KINDS)
    steer = steered_tags(target)

    def served(kind: str) -> bool:
        capability = needs[kind]
        return capability is None or supports(target, capability, family=family)

    return tuple(
        kind for kind in draws.OP_KINDS if served(kind) and not steer.avoids(kind, family=family)
    )


def default_machine_specs(
    family: str,
    *,
    index_kpools: tuple[int, ...] = INDEX_KPOOLS,
    dcp_sizes: tuple[int, ...] = DCP_SIZES,
    kv_quants: tuple[str, ...] = ("none",),
    dtype_names: tuple[str, ...] | None = None,
) -> st.SearchStrategy[PoolSpec]:
    """The small pool specs a machine for ``family`` draws when none are given.

    Any dtype (or ``dtype_names``); up to 3 layers starting at a global layer up to 3; at
    most 32 tokens in pages of up to 4; MHA/NoOp sometimes with a V head dim of its own; DSA
    with every kind of skip mask and an index kpool of ``index_kpools`` (``(2, 4)``: pooled
    ones only); MLA/DSA one rank of a decode-context-parallel width of ``dcp_sizes``
    (``(2, 4)``: always DCP); MHA/MLA a quantized variant of ``kv_quants``
    (``("mxfp8",)``: MXFP8 only). Shrinks towards one bfloat16 layer at layer 0,
    page_size=1, one page.

    Example:
        >>> from hypothesis import find, settings
        >>> find(default_machine_specs("mha"), lambda spec: True,
        ...      settings=settings(database=None)).layer_num
        1
    """
    if family not in MACHINE_FAMILIES:
        raise ValueError(f"family={family!r} not in {MACHINE_FAMILIES}")
    return pool_specs(
        families=(family,),
        dtype_names=dtype_names,
        max_layers=_MAX_LAYERS,
        max_size=_MAX_SIZE,
        max_page_size=_MAX_PAGE_SIZE,
        index_kpools=index_kpools,
        dcp_sizes=dcp_sizes,
        kv_quants=kv_quants,
    )


def variant_machine_specs(variant: Variant) -> st.SearchStrategy[PoolSpec]:
    """The small pool specs a machine draws for ``variant`` alone: :func:`default_machine_specs`
    narrowed to the variant's axis values (and, for an unquantized variant that takes fewer
    dtypes than its family, such as DSA's fp8 scaled latent rows, to those dtypes), keeping
    the specs that bear its name.

    Example:
        >>> from hypothesis import find, settings
        >>> from kvcheck.variants import variant_named
        >>> find(variant_machine_specs(variant_named("dsa:kpool")), lambda spec: True,
        ...      settings=settings(database=None)).variant
        'dsa:kpool'
    """
    family, values = variant.family, variant.axis_values
    family_dtypes = variants_of(family)[0].dtypes
    narrower = variant.kv_quant == "none" and set(variant.dtypes) < set(family_dtypes)
    specs = default_machine_specs(
        family,
        index_kpools=values.get("index_kpool", INDEX_KPOOLS),
        dcp_sizes=values.get("dcp_size", DCP_SIZES),
        kv_quants=(variant.kv_quant,),
        dtype_names=variant.dtypes if narrower else None,
    )
    return specs.filter(lambda spec: spec.variant == variant.name)


class PoolMachine(RuleBasedStateMachine):
    """Drives ``target``'s pool and the reference with the same operations.

    Subclasses made by :func:`pool_machine` set ``target``, ``device``, ``family``,
    ``skipped`` (capabilities whose operations and checks do not run) and ``steer`` (what
    the target's findings ask to avoid: :class:`kvcheck.steering.Steering`) and add the
    ``build_pool`` initialize rule. Each step draws one operation kind (``pause``, a step that does
    nothing, first) and then the operation; every call's tensors must be unchanged after
    it. A failure carries the operations so far (``PropertyFailure.reproduction``).
    """

    target: Any = None
    device: str = "cpu"
    family: str = "mha"
    skipped: frozenset[str] = frozenset()
    steer: Steering = Steering()

    def __init__(self) -> None:
        super().__init__()
        self.pool: Any = None
        self.reference: ReferencePool | None = None
        self.spec: PoolSpec | None = None
        self.copies: dict[str, Any] = {}
        #: name -> (tokens copied, layout), for host copies the pool accepted
        self.copied: dict[str, tuple[int, draws.CopyLayout]] = {}
        self.history: list[Op] = []
        self.last_call = "pool construction"
        self.last_method = ""
        self.steps = 0
        #: ``steps`` when the invariant last checked the pool: a pause changes nothing
        self.checked_at = -1
        self.copies_attempted = 0

    # -- setting up ----------------------------------------------------------------------

    def _build(self, spec: PoolSpec) -> None:
        if spec.family != self.family:
            raise ValueError(
                f"spec.family={spec.family!r} drawn by a {self.family!r} machine: pass specs "
                f"of family {self.family!r} to pool_machine"
            )
        self.spec = spec
        self.reference = ReferencePool(spec)
        self.pool = self.target.make_pool(spec, device=self.device)

    # -- running one operation on both sides ---------------------------------------------

    def _run(self, op: Op) -> bool:
        assert self.reference is not None
        self.steps += 1
        self.history.append(op)
        self.last_call = describe_op(op)
        self.last_method = op_method(op)
        with self._reproducible():
            accepted = apply_op_like_reference(
                self.target, self.pool, self.reference, op, device=self.device, copies=self.copies
            )
        if accepted and isinstance(op, HostCopy):
            assert self.spec is not None
            self.copied[op.name] = (len(op.indices), draws.copy_layout(self.spec, op.indices))
        return accepted

    @contextlib.contextmanager
    def _reproducible(self) -> Iterator[None]:
        """Attach the spec and every operation so far to a failure raised in the block."""
        try:
            yield
        except PropertyFailure as exc:
            if exc.reproduction is None and self.spec is not None:
                exc.reproduction = make_reproduction(
                    self.spec, tuple(self.history), str(exc), check=exc.signature.check
                )
            raise

    def _next_copy_name(self) -> str:
        # Numbered by copies attempted, not by steps, so deleting an unrelated step while
        # shrinking leaves the names (and the order reloads choose them in) alone.
        self.copies_attempted += 1
        return f"copy{self.copies_attempted}"

    @property
    def _built(self) -> bool:
        return self.pool is not None

    def _kinds(self) -> tuple[str, ...]:
        """Operation kinds this example draws from; ``pause`` first, as the shrink target."""
        assert self.spec is not None
        # The spec's own op kinds, plus moves even where the pool refuses them (a kpool
        # pool: the refusal must change nothing), set_kv_buffer under DCP (refused too),
        # the do-nothing step and invalid ops.
        applies = {*draws.family_op_kinds(self.spec), "pause", "move", "invalid"}
        if self.spec.dcp_size > 1 and self.spec.latent_layout == "raw":
            applies.add("write_kv")
        return tuple(
            kind
            for kind, needs in _STEP_KINDS
            if needs not in self.skipped
            and kind in applies
            and (kind == "pause" or not self.steer.avoids(kind, variant=self.spec.variant))
        )

    # -- the one rule --------------------------------------------------------------------
    #
    # Shrinking deletes steps only a few choices at a time, so a step it cannot shorten
    # first cannot be deleted at all. Hence one rule that draws the kind of operation
    # itself, with ``pause`` (no further choices) as the simplest kind: an unneeded step
    # first shrinks to a pause, then is deleted. (With one Hypothesis rule per kind,
    # Hypothesis also draws an enable flag the first time each rule comes up, which pins
    # those steps in place.)

    @precondition(lambda self: self._built)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One operation of a drawn kind, run on the pool and on the reference."""
        assert self.spec is not None
        kinds = self._kinds()
        if len(kinds) < 2:
            # Only pause: every kind that applies to this spec needs a skipped capability
            # (a scaled pool whose layers all skip index-K, checked for reads alone, say).
            return
        kinds = (*kinds, *(kind for kind in _favoured_kinds(self.spec) if kind in kinds))
        kind = data.draw(draws.step_kinds(kinds), label="kind")
        if kind == "pause":
            return
        op = self._draw_op(kind, data)
        if op is not None:
            self._run(op)

    def _draw_op(self, kind: str, data: st.DataObject) -> Op | None:
        """The operation of ``kind`` (a host copy for a reload while nothing has been
        copied; None: a write the target's finding steers off slot 0)."""
        spec = self.spec
        assert spec is not None
        steer, variant = self.steer, spec.variant
        requests = not steer.avoids("host_copy:request", variant=variant)
        # A reload with nothing to reload yet takes the copy it needs instead of a wasted step.
        if kind == "host_copy" or (kind == "host_reload" and not self.copied):
            whole = steer.avoids("host_copy:partial_pages", variant=variant)
            strategy: st.SearchStrategy[Any] = draws.host_copy_ops(
                spec, self._next_copy_name(), whole_pages=whole, requests=requests
            )
        elif kind == "host_reload":
            strategy = draws.host_reload_ops(spec, self.copied, requests=requests)
        elif kind == "invalid":
            counts = {name: count for name, (count, _) in self.copied.items()}
            strategy = draws.invalid_ops(spec, counts, skipped=self.skipped)
        elif kind == "write_index_k":
            layers = draws.indexed_layers(spec, skip=False)
            strategy = draws.write_index_k_ops(spec, layer_ids=layers)
        elif kind == "cast_write_kv":
            scales = not steer.avoids("cast_write:scales")
            strategy = draws.cast_write_kv_ops(spec, scales=scales)
        elif kind == "write_mla":
            padding_slot = not steer.avoids("write_mla:slot0")
            strategy = draws.write_mla_ops(spec, padding_slot=padding_slot)
        else:
            strategy = getattr(draws, f"{kind}_ops")(spec)
        op: Op = data.draw(strategy, label="op")
        if steer.avoids("slot0", variant=variant) and 0 in written_slots(op):
            return None  # the target's finding: slot 0 is its padding sink
        if getattr(op, "override", False) and steer.avoids("layer_id_override", variant=variant):
            op = dataclasses.replace(op, override=False)  # type: ignore[type-var,arg-type]
        return op

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def pool_matches_reference(self) -> None:
        """Every buffer equals the reference byte for byte, read raw and through the read
        API; layer range, accounting, transfer descriptors and check_valid hold."""
        if not self._built or self.checked_at == self.steps:
            return  # nothing ran since the last check (a pause): the same state, checked
        assert self.reference is not None and self.spec is not None
        with self._reproducible():
            self._check_state()
        self.checked_at = self.steps

    def _check_state(self) -> None:
        assert self.reference is not None and self.spec is not None
        call, spec, skipped, steer = self.last_call, self.spec, self.skipped, self.steer
        # Rendered once per step: both the raw and the read-API checks compare against it.
        expected = self.reference.expected_buffers()
        assert_pool_matches_reference(
            self.pool, self.reference, call=call, method=self.last_method, expected=expected
        )
        if "read_api" not in skipped:
            assert_read_api_matches_reference(
                self.pool,
                self.reference,
                call=call,
                # get_mla_kv_buffer reads values of one dtype: not a scaled row's bytes.
                mla_reads="mla_write" not in skipped
                and spec.family in ("mla", "dsa")
                and spec.latent_layout == "raw",
                expected=expected,
                skip_methods=frozenset({"get_value_buffer"})
                if steer.avoids("read:get_value_buffer", variant=spec.variant)
                else frozenset(),
                # The paged gather is the costly read: after the steps that change index keys.
                paged_index_reads=self.steps == 0 or self.last_method in _INDEX_CHANGING,
            )
        assert_layer_range(self.pool, spec, call=call)
        assert_accounting(
            self.pool,
            spec,
            call=call,
            state_buf_infos="state_buf_infos" not in skipped,
            compress_tails="compress_tail" not in skipped,
            tails_counted=not steer.avoids("accounting:compress_tails", variant=spec.variant),
            scales_counted=not steer.avoids("accounting:scales", variant=spec.variant),
        )
        if spec.compress_tails and "compress_tail" not in skipped:
            assert_compress_tails_match_reference(self.pool, self.reference, call=call)
        if "contiguous_buf_infos" not in skipped and not steer.avoids(
            "contiguous_buf_infos", variant=spec.variant
        ):
            assert_contiguous_buf_infos(self.pool, spec, call=call)
        if (
            spec.quantized
            and "contiguous_buf_infos" not in skipped
            and not steer.avoids("scale_buf_infos", variant=spec.variant)
        ):
            assert_scale_buf_infos(self.pool, spec, call=call)
        check_valid = getattr(self.pool, "check_valid", None)
        if callable(check_valid):
            try:
                check_valid()
            except AssertionError as exc:
                raise failure(
                    f"pool.check_valid() failed after {call}: {exc}",
                    signature=FailureSignature(
                        check="check_valid",
                        call="check_valid",
                        kind="invariant broken",
                        family=spec.variant,
                    ),
                ) from exc


def _steer_v_head_dim(spec: PoolSpec, *, steer: Steering) -> PoolSpec:
    """``spec`` with V shaped like K where a finding steers its variant off its own V dim."""
    if steer.avoids("v_head_dim", variant=spec.variant) and spec.v_head_dim is not None:
        return dataclasses.replace(spec, v_head_dim=None)
    return spec


def written_slots(op: Op) -> frozenset[int]:
    """The slots an operation writes: write locations, move and reload targets.

    Example:
        >>> from kvcheck.specs import Move
        >>> sorted(written_slots(Move(tgt=(3, 0), src=(1, 1))))
        [0, 3]
    """
    if isinstance(op, WriteKV | WriteMLA):
        return frozenset(op.locs)
    if isinstance(op, WritePrefixValid):
        return frozenset(slot for row in op.loc_grid for slot in row)
    if isinstance(op, Move):
        return frozenset(op.tgt)
    if isinstance(op, HostReload):
        return frozenset(op.indices)
    return frozenset()


def make_reproduction(spec: PoolSpec, ops: tuple[Op, ...], note: str, *, check: str = "") -> Any:
    """The reproduction a failure carries: the pool ``spec`` and the ``ops`` run so far
    (a :class:`kvcheck.failures.Reproduction`), for a standalone script.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> spec = PoolSpec(family="mha", size=2, page_size=1, layer_num=1, dtype="float16")
        >>> make_reproduction(spec, (), "got 1 but should be 0 [poke]").ops
        ()
    """
    return Reproduction(spec=spec, ops=ops, note=note, check=check)


def _settle_rule_flags(machine: RuleBasedStateMachine, data: st.DataObject) -> None:
    """Draw Hypothesis's per-example rule flags now, in the initialize step.

    Hypothesis draws them (swarm testing) during the first step otherwise, which makes
    that step impossible to delete when shrinking: removing it would move the draw into
    the next step and shift everything after it. Drawn here, under the key Hypothesis
    itself uses, the first real step shrinks away like any other. They are drawn without a
    ``Draw N`` note: the steps of a failing example already show which rules ran, and the
    note was an empty ``FeatureFlags(enabled=[], disabled=[])`` line in every report. If a
    future Hypothesis changes its internals this only costs shrink quality or that line,
    never correctness.
    """
    try:
        from hypothesis.strategies._internal.featureflags import FeatureStrategy

        flags = st.shared(FeatureStrategy(at_least_one_of=["step"]), key=("enabled rules", machine))
    except (ImportError, TypeError):  # pragma: no cover - depends on Hypothesis internals
        return
    conjecture = getattr(data, "conjecture_data", None)
    if conjecture is None:  # pragma: no cover - depends on Hypothesis internals
        data.draw(flags, label="rule flags")
    else:
        conjecture.draw(flags)


def pool_machine(
    target: Any,
    *,
    device: str,
    family: str,
    specs: st.SearchStrategy[PoolSpec] | None = None,
    skip: frozenset[str] | set[str] | None = None,
    settings: Settings | None = None,
) -> type[PoolMachine]:
    """A state machine class that checks ``target``'s ``family`` pool against the reference.

    ``specs`` draws the pool of each example (default :func:`default_machine_specs`); every
    spec must be of ``family``, and is moved inside the target's ``pool_spec_limits``
    (:func:`kvcheck.strategies.limits.within_target_limits`). ``skip`` names capabilities (of
    :data:`MACHINE_CAPABILITIES`) whose rules or checks do not run; ``None`` means those
    the target declares unsupported, so a target without host copies is still checked on
    writes and moves. ``settings``
    (default: the current profile's) go on ``Machine.TestCase.settings``. The class is named
    after the family (``DSAPoolMachine``), which also keys its examples in the database.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> Machine = pool_machine(resolve_target("kvcheck"), device="cpu", family="mla")
        >>> Machine.__name__
        'MLAPoolMachine'
    """
    if family not in MACHINE_FAMILIES:
        raise ValueError(f"family={family!r} not in {MACHINE_FAMILIES}")
    if not callable(getattr(target, "make_pool", None)):
        raise ValueError(f"target={target!r} has no make_pool method")
    if not isinstance(device, str) or not device:
        raise ValueError(f"device={device!r} must be a device string such as 'cpu'")
    chosen_specs = default_machine_specs(family) if specs is None else specs
    if not isinstance(chosen_specs, st.SearchStrategy):
        raise ValueError(f"specs={specs!r} must be a Hypothesis strategy of PoolSpec")
    chosen_specs = within_target_limits(target, chosen_specs)
    steer = steered_tags(target)
    if steer.mentions("v_head_dim"):
        chosen_specs = chosen_specs.map(functools.partial(_steer_v_head_dim, steer=steer))
    if skip is None:
        skip = {
            capability
            for capability in MACHINE_CAPABILITIES
            if not supports(target, capability, family=family)
        }
    unknown = sorted(set(skip) - set(MACHINE_CAPABILITIES))
    if unknown:
        raise ValueError(f"skip={sorted(skip)!r}: {unknown} not in {MACHINE_CAPABILITIES}")

    @initialize(spec=chosen_specs, data=st.data())
    def build_pool(self: PoolMachine, spec: PoolSpec, data: st.DataObject) -> None:
        """Build the target's pool and the reference from one spec."""
        _settle_rule_flags(self, data)
        self._build(spec)

    name = f"{family.upper()}PoolMachine" if family != "noop" else "NoOpPoolMachine"
    machine: type[PoolMachine] = type(
        name,
        (PoolMachine,),
        {
            "build_pool": build_pool,
            "target": target,
            "device": device,
            "family": family,
            "skipped": frozenset(skip),
            "steer": steer,
            "__module__": __name__,
            "__qualname__": name,
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine
