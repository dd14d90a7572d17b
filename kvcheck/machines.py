"""Differential state machines: a target's pool and the reference model, step by step.

:func:`pool_machine` builds one :class:`~hypothesis.stateful.RuleBasedStateMachine` class
per pool family. Each example draws a small pool spec, builds the target's pool and a
:class:`~kvcheck.reference.ReferencePool` from it, then runs the same random operations
on both: KV writes, DSA index-K writes, moves (sources repeated and overlapping targets),
host copies and reloads to other slots, and invalid operations. After every step an
invariant compares every buffer byte for byte, checks the byte accounting
(:mod:`kvcheck.properties.accounting`) and calls the pool's own ``check_valid()`` where
it has one. A pool must raise exactly when the reference says the contract demands it.

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

from typing import Any

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.properties import _op_draws as draws
from kvcheck.properties._assertions import PropertyFailure
from kvcheck.properties.accounting import assert_accounting
from kvcheck.properties.ops import apply_op_like_reference, describe_op
from kvcheck.properties.pool_state import assert_pool_matches_reference
from kvcheck.reference import ReferencePool
from kvcheck.specs import POOL_FAMILIES, HostCopy, Op, PoolSpec
from kvcheck.strategies import pool_specs
from kvcheck.targets.limits import within_target_limits

__all__ = [
    "MACHINE_CAPABILITIES",
    "MACHINE_FAMILIES",
    "PoolMachine",
    "default_machine_specs",
    "pool_machine",
]

MACHINE_FAMILIES = POOL_FAMILIES
#: Target capabilities the machines exercise beyond building a pool and writing to it.
MACHINE_CAPABILITIES: tuple[str, ...] = (
    "move",
    "host_copy",
    "index_k_write",
    "input_validation",
    "state_buf_infos",
)

#: Tiny pools keep every step cheap: few layers, small heads, at most 32 tokens.
_MAX_LAYERS = 3
_MAX_SIZE = 32
_MAX_PAGE_SIZE = 4


def default_machine_specs(family: str) -> st.SearchStrategy[PoolSpec]:
    """The small pool specs a machine for ``family`` draws when none are given.

    Any dtype; up to 3 layers starting at a global layer up to 3; at most 32 tokens in
    pages of up to 4; MHA/NoOp sometimes with a V head dim of its own; DSA with every kind
    of skip mask. Shrinks towards one bfloat16 layer at layer 0, page_size=1, one page.

    Example:
        >>> default_machine_specs("mha").example().family  # doctest: +SKIP
        'mha'
    """
    if family not in MACHINE_FAMILIES:
        raise ValueError(f"family={family!r} not in {MACHINE_FAMILIES}")
    return pool_specs(
        families=(family,),
        max_layers=_MAX_LAYERS,
        max_size=_MAX_SIZE,
        max_page_size=_MAX_PAGE_SIZE,
    )


class PoolMachine(RuleBasedStateMachine):
    """Drives ``target``'s pool and the reference with the same operations.

    Subclasses made by :func:`pool_machine` set ``target``, ``device``, ``family`` and
    ``skipped`` (capabilities whose operations are not drawn) and add the ``build_pool``
    initialize rule. Each step draws one operation kind (``write_kv``, ``move``,
    ``write_index_k``, ``host_copy``, ``host_reload``, ``invalid``, or ``pause``, a step
    that does nothing) and then the operation.
    """

    target: Any = None
    device: str = "cpu"
    family: str = "mha"
    skipped: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.pool: Any = None
        self.reference: ReferencePool | None = None
        self.spec: PoolSpec | None = None
        self.copies: dict[str, Any] = {}
        #: name -> tokens copied, for host copies the pool accepted
        self.copied_tokens: dict[str, int] = {}
        self.last_call = "pool construction"
        self.steps = 0
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
        self.last_call = describe_op(op)
        return apply_op_like_reference(
            self.target, self.pool, self.reference, op, device=self.device, copies=self.copies
        )

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
        wanted = [("pause", None), ("write_kv", None), ("move", "move")]
        if draws.indexed_layers(self.spec, skip=False):
            wanted.append(("write_index_k", "index_k_write"))
        wanted += [
            ("host_copy", "host_copy"),
            ("host_reload", "host_copy"),
            ("invalid", "input_validation"),
        ]
        return tuple(kind for kind, needs in wanted if needs not in self.skipped)

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
        kind = data.draw(draws.step_kinds(self._kinds()), label="kind")
        if kind != "pause":
            getattr(self, f"_{kind}")(data)

    def _write_kv(self, data: st.DataObject) -> None:
        """``set_kv_buffer`` of a few tokens on one layer."""
        assert self.spec is not None
        self._run(data.draw(draws.write_kv_ops(self.spec), label="op"))

    def _write_index_k(self, data: st.DataObject) -> None:
        """DSA index-K write of a few tokens on a layer that has index-K."""
        assert self.spec is not None
        layers = draws.indexed_layers(self.spec, skip=False)
        strategy = draws.write_index_k_ops(self.spec, layer_ids=layers)
        self._run(data.draw(strategy, label="op"))

    def _move(self, data: st.DataObject) -> None:
        """``move_kv_cache`` with overlapping, possibly repeated sources."""
        assert self.spec is not None
        self._run(data.draw(draws.move_ops(self.spec), label="op"))

    def _host_copy(self, data: st.DataObject) -> None:
        """``get_cpu_copy`` of a few slots (DSA: whole pages), kept for a later reload."""
        assert self.spec is not None
        strategy = draws.host_copy_ops(self.spec, self._next_copy_name())
        op = data.draw(strategy, label="op")
        if self._run(op):
            assert isinstance(op, HostCopy)
            self.copied_tokens[op.name] = len(op.indices)

    def _host_reload(self, data: st.DataObject) -> None:
        """``load_cpu_copy`` of an earlier copy to the same or other slots (a no-op step
        while nothing has been copied)."""
        assert self.spec is not None
        if self.copied_tokens:
            strategy = draws.host_reload_ops(self.spec, self.copied_tokens)
            self._run(data.draw(strategy, label="op"))

    def _invalid(self, data: st.DataObject) -> None:
        """An operation the contract rejects: it must raise and change nothing."""
        assert self.spec is not None
        strategy = draws.invalid_ops(self.spec, self.copied_tokens, skipped=self.skipped)
        op = data.draw(strategy, label="op")
        if self._run(op) and isinstance(op, HostCopy):
            self.copied_tokens[op.name] = len(op.indices)

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def pool_matches_reference(self) -> None:
        """Every buffer equals the reference byte for byte; accounting and check_valid hold."""
        if not self._built:
            return
        assert self.reference is not None and self.spec is not None
        assert_pool_matches_reference(self.pool, self.reference, call=self.last_call)
        assert_accounting(
            self.pool,
            self.spec,
            call=self.last_call,
            state_buf_infos="state_buf_infos" not in self.skipped,
        )
        check_valid = getattr(self.pool, "check_valid", None)
        if callable(check_valid):
            try:
                check_valid()
            except AssertionError as exc:
                raise PropertyFailure(
                    f"pool.check_valid() failed after {self.last_call}: {exc}"
                ) from exc


def _settle_rule_flags(machine: RuleBasedStateMachine, data: st.DataObject) -> None:
    """Draw Hypothesis's per-example rule flags now, in the initialize step.

    Hypothesis draws them (swarm testing) during the first step otherwise, which makes
    that step impossible to delete when shrinking: removing it would move the draw into
    the next step and shift everything after it. Drawn here, under the key Hypothesis
    itself uses, the first real step shrinks away like any other. If a future Hypothesis
    changes its internals this only costs shrink quality, never correctness.
    """
    try:
        from hypothesis.strategies._internal.featureflags import FeatureStrategy

        flags = st.shared(FeatureStrategy(at_least_one_of=["step"]), key=("enabled rules", machine))
    except (ImportError, TypeError):  # pragma: no cover - depends on Hypothesis internals
        return
    data.draw(flags, label="rule flags")


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
    (:func:`kvcheck.targets.limits.within_target_limits`). ``skip`` names capabilities (of
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
    if skip is None:
        unsupported = getattr(target, "unsupported", {}) or {}
        skip = {capability for capability in MACHINE_CAPABILITIES if capability in unsupported}
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
            "__module__": __name__,
            "__qualname__": name,
        },
    )
    machine.TestCase.settings = settings if settings is not None else Settings()
    return machine
