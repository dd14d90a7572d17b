"""What a declared finding asks the generators to avoid, as typed values.

A target's :class:`~kvcheck.targets.findings.Finding` may ask the suite to stop drawing
what would only show that finding again (``Finding.steer``), so that little time goes to
examples the finding would have rejected. Each such request is a :class:`Steer`: what to
avoid (``what``, a kind of :data:`STEER_KINDS`, each documented there once) and where
(``where``): a pool variant of :mod:`kvcheck.variants`, a pool family (every variant of
it), ``""`` (everywhere), or, for a kind of the allocator or host tier, the allocators or
host pools it concerns. A target's steers together are a :class:`Steering`, which the
machines, strategies and properties ask :meth:`Steering.avoids`; none of them builds or
parses tag strings. ``str(steer)`` is the steer's tag text (``"dsa:kpool:move"``), as the
docs quote it.

Example:
    >>> steering = Steering({Steer.step("move", "dsa:kpool"), Steer("cast_write:scales")})
    >>> steering.avoids("move", variant="dsa:kpool"), steering.avoids("move", variant="dsa")
    (True, False)
    >>> steering.avoids("cast_write:scales")
    True
    >>> str(Steer.step("move", "dsa:kpool")), str(Steer("host:storage_pages", "mha:mxfp8"))
    ('dsa:kpool:move', 'host:mha:mxfp8:storage_pages')
    >>> Steer.step("move", "dsa:kpol")
    Traceback (most recent call last):
    ...
    ValueError: where='dsa:kpol' is not where a 'move' steer applies: a pool variant or family of kvcheck.variants, or '' for every pool: one of ('', 'mha', ...)
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvcheck.specs import POOL_FAMILIES
from kvcheck.variants import variant_names

__all__ = ["STEER_KINDS", "STEP_KINDS", "Steer", "SteerKind", "Steering"]

#: The operation kinds a pool machine draws a step of (besides ``pause``):
#: :data:`kvcheck.strategies.ops.OP_KINDS` and the machines' invalid operations.
STEP_KINDS: tuple[str, ...] = (
    "write_kv",
    "move",
    "write_index_k",
    "write_compress_tail",
    "host_copy",
    "host_reload",
    "cast_write_kv",
    "write_mla",
    "write_prefix_valid",
    "invalid",
)

_VARIANT = ("", *variant_names())
_FAMILY = ("", *POOL_FAMILIES)
_WHERE_VARIANT = "a pool variant or family of kvcheck.variants, or '' for every pool"
_WHERE_FAMILY = "a pool family, or '' for every pool"


@dataclass(frozen=True)
class SteerKind:
    """One kind of :class:`Steer`: the ``where`` values it takes (``wheres``, described by
    ``where``) and what the suite avoids there (``means``; ``WHERE`` stands for the steer's
    ``where``)."""

    wheres: tuple[str, ...]
    where: str
    means: str


#: Every kind of :class:`Steer`, with where it applies and what the suite then avoids.
STEER_KINDS: Mapping[str, SteerKind] = MappingProxyType(
    {
        # -- the pool machines (kvcheck.machines), and what the other tests draw from them
        **{
            kind: SteerKind(
                _VARIANT,
                _WHERE_VARIANT,
                f"no ``{kind}`` step is drawn for WHERE's pools (by the pool machines; "
                "for a family also the lifecycle machine's, round trips' and no-op "
                "tests' operations)",
            )
            for kind in STEP_KINDS
        },
        "contiguous_buf_infos": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "the machine's invariant does not ask WHERE's pools for transfer descriptors",
        ),
        "scale_buf_infos": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "the machine's invariant does not ask WHERE's pools for scale descriptors",
        ),
        "accounting:scales": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "``get_kv_size_bytes`` and ``mem_usage`` of WHERE's pools are expected to leave "
            "out the scale buffers (every other byte is still checked)",
        ),
        "read:get_value_buffer": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "the invariant does not read WHERE's pools through ``get_value_buffer``",
        ),
        "v_head_dim": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "WHERE's pools (a machine's, a host tier's device pool) keep "
            "``v_head_dim == head_dim``",
        ),
        "slot0": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "no operation writes slot 0 of WHERE's pools (writes, move and reload targets)",
        ),
        "layer_id_override": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "writes to WHERE's pools name their layer by ``layer.layer_id`` only",
        ),
        "host_copy:partial_pages": SteerKind(
            _FAMILY,
            _WHERE_FAMILY,
            "host copies and reloads of WHERE's pools take whole pages only",
        ),
        "host_copy:request": SteerKind(
            _FAMILY,
            _WHERE_FAMILY,
            "host copies and reloads of WHERE's pools never name a request slot (DSA "
            "compress tails)",
        ),
        "accounting:compress_tails": SteerKind(
            ("dsa",),
            "the family with compress tails",
            "``get_kv_size_bytes`` and ``mem_usage`` are expected to leave out the DSA "
            "compress tails (every other byte is still checked)",
        ),
        "cast_write:scales": SteerKind(
            ("",),
            "every pool",
            "writes of another dtype carry no ``k_scale``/``v_scale``",
        ),
        "write_mla:slot0": SteerKind(
            ("",),
            "every pool",
            "``set_mla_kv_buffer`` never targets slot 0 (the padding slot), in the machines "
            "and in the host tier's writes",
        ),
        # -- the allocator machine (kvcheck.allocator_machine)
        "allocator:one_side_refused": SteerKind(
            ("swa",),
            "the allocator kind with two sides",
            "no extend or decode that one side of a sliding-window allocator can serve and "
            "the other cannot",
        ),
        "allocator:free_dead_window": SteerKind(
            ("swa",),
            "the allocator kind with two sides",
            "a request whose window was freed is freed as SGLang's callers free it: "
            "``free_full`` (or ``free_full_segment(s)``) of the pages that left the window, "
            "``free`` (or ``free_segment(s)``) of the rest, never ``free`` of the row (a pure "
            "sliding-window allocator's such requests are always freed so: there ``free`` of "
            "the row is a double free, bad input)",
        ),
        # -- the linear-hybrid machine (kvcheck.linear_hybrid_machine)
        "linear_hybrid:refused_alloc": SteerKind(
            ("",),
            "every linear-attention hybrid",
            "``req_to_token_pool.alloc`` is never asked for a request while every mamba slot "
            "is held (the refusal's leftovers are not checked)",
        ),
        # -- the host tier (kvcheck.strategies.tier_specs, kvcheck.properties.host_pools)
        "host:few_pages": SteerKind(
            ("page_major",),
            "host layouts whose first dimension is the page",
            "no host pool with fewer host pages than layers in a layout whose first "
            "dimension is the page where the target's per-layer views expect the layer (MLA "
            "and DSA ``page_first_direct``, MHA ``page_head``)",
        ),
        "host:contiguous_buf_infos": SteerKind(
            ("latent",),
            "the MLA and DSA host pools",
            "an MLA or DSA host pool's transfer descriptors (``get_contiguous_buf_infos``) "
            "are not checked outside ``layer_first`` (its bytes, pages and page meta still "
            "are)",
        ),
        "host:indexer_bytes_held": SteerKind(
            ("dsa",),
            "the family with an index-K host pool",
            "the bytes a DSA index-K host pool holds are not compared with its declared "
            "size (its size per token and page meta still are)",
        ),
        "host:indexer_layer_first_page_meta": SteerKind(
            ("dsa",),
            "the family with an index-K host pool",
            "a DSA index-K host pool's page meta is not checked in ``layer_first``",
        ),
        "host:indexer_skip_layers": SteerKind(
            ("dsa",),
            "the family with an index-K host pool",
            "a host tier's DSA device pool has no skip-topk layer: every layer keeps index "
            "keys (as SGLang's configurator builds a DSA pool under HiCache before 0.5.22)",
        ),
        "host:storage_pages": SteerKind(
            _VARIANT,
            _WHERE_VARIANT,
            "the host tier of WHERE's device pools has no flat storage pages: "
            "``get_data_page``, ``set_from_flat_data_page`` and ``get_page_buffer_meta`` "
            "are not checked",
        ),
    }
)

#: Kinds of a tier, whose tag text puts ``where`` after the tier (``host:dsa:...``).
_TIERS = ("host", "allocator")


@dataclass(frozen=True, order=True)
class Steer:
    """One thing a finding asks the generators to avoid: ``what`` (a kind of
    :data:`STEER_KINDS`) where ``where`` says (a variant, a family, ``""`` for everywhere,
    or the kind's tier selector); both checked on construction.

    Example:
        >>> Steer("move")
        Steer(what='move', where='')
        >>> str(Steer("allocator:one_side_refused", "swa"))
        'allocator:swa:one_side_refused'
        >>> Steer("host:few_pages", "mha")
        Traceback (most recent call last):
        ...
        ValueError: where='mha' is not where a 'host:few_pages' steer applies: host layouts whose first dimension is the page: one of ('page_major',)
    """  # noqa: E501

    what: str
    where: str = ""

    def __post_init__(self) -> None:
        kind = STEER_KINDS.get(self.what) if isinstance(self.what, str) else None
        if kind is None:
            raise ValueError(f"what={self.what!r} is not a steer kind: one of {tuple(STEER_KINDS)}")
        if not isinstance(self.where, str) or self.where not in kind.wheres:
            raise ValueError(
                f"where={self.where!r} is not where a {self.what!r} steer applies: "
                f"{kind.where}: one of {kind.wheres}"
            )

    @classmethod
    def step(cls, kind: str, where: str = "") -> Steer:
        """Never draw a machine step of ``kind`` (one of :data:`STEP_KINDS`) for ``where``'s
        pools (a variant, a family, ``""``: every pool).

        Example:
            >>> Steer.step("host_reload", "noop")
            Steer(what='host_reload', where='noop')
            >>> Steer.step("slot0", "mha")
            Traceback (most recent call last):
            ...
            ValueError: kind='slot0' is not a step kind: one of ('write_kv', 'move', 'write_index_k', 'write_compress_tail', 'host_copy', 'host_reload', 'cast_write_kv', 'write_mla', 'write_prefix_valid', 'invalid')
        """  # noqa: E501
        if kind not in STEP_KINDS:
            raise ValueError(f"kind={kind!r} is not a step kind: one of {STEP_KINDS}")
        return cls(kind, where)

    def __str__(self) -> str:
        tier, _, rest = self.what.partition(":")
        if tier in _TIERS:
            return ":".join(part for part in (tier, self.where, rest) if part)
        return f"{self.where}:{self.what}" if self.where else self.what


def _not_a_steer(item: object) -> str:
    """Why ``item`` is no :class:`Steer`, naming the steer an old tag string stands for."""
    message = f"{item!r} is not a kvcheck.steering.Steer"
    if isinstance(item, str):
        named = [steer for steer in _every_steer() if str(steer) == item]
        if named:
            message += f" (the tag {item!r} is {named[0]!r})"
    return message


def _every_steer() -> tuple[Steer, ...]:
    return tuple(Steer(what, where) for what, kind in STEER_KINDS.items() for where in kind.wheres)


class Steering(frozenset[Steer]):
    """A target's steers: a frozenset of :class:`Steer` (anything else refused), asked
    what it avoids with :meth:`avoids`.

    Example:
        >>> Steering({"noop:host_reload"})
        Traceback (most recent call last):
        ...
        ValueError: steering: 'noop:host_reload' is not a kvcheck.steering.Steer (the tag 'noop:host_reload' is Steer(what='host_reload', where='noop'))
        >>> Steering([Steer("move", "dsa")]) | {Steer("slot0", "mha:mxfp8")}
        Steering({Steer(what='move', where='dsa'), Steer(what='slot0', where='mha:mxfp8')})
    """  # noqa: E501

    _wheres: Mapping[str, frozenset[str]]

    def __new__(cls, steers: Iterable[Steer] = ()) -> Steering:
        if type(steers) is cls:
            return steers
        if isinstance(steers, str | bytes) or not isinstance(steers, Iterable):
            raise ValueError(f"steering: {steers!r} is not a collection of kvcheck.steering.Steer")
        items = tuple(steers)
        for item in items:
            if not isinstance(item, Steer):
                raise ValueError(f"steering: {_not_a_steer(item)}")
        self = super().__new__(cls, items)
        wheres: dict[str, set[str]] = {}
        for steer in items:
            wheres.setdefault(steer.what, set()).add(steer.where)
        self._wheres = {what: frozenset(where) for what, where in wheres.items()}
        return self

    def __repr__(self) -> str:
        if not self:
            return f"{type(self).__name__}()"
        return f"{type(self).__name__}({{{', '.join(map(repr, sorted(self)))}}})"

    def __or__(self, other: Iterable[Steer]) -> Steering:  # type: ignore[override]
        return Steering((*self, *Steering(other)))

    __ror__ = __or__

    def avoids(
        self,
        what: str,
        *,
        variant: str | None = None,
        family: str | None = None,
        where: str | None = None,
    ) -> bool:
        """Whether a steer of kind ``what`` applies here: one whose ``where`` is ``""``, the
        pool ``variant``, its ``family`` (by default the variant's), or the tier selector
        ``where`` (an allocator kind, a host selector) the caller says applies.

        So a family's steer applies to every variant of it, a variant's to that variant
        only (``mha:mxfp8`` is not ``mha:mxfp8:flat``), and an asker that names only a
        family (what a whole family's test draws) is steered by the family's and the
        global steers only.

        Example:
            >>> steering = Steering({Steer.step("move", "dsa"), Steer.step("write_kv", "mha:hnd"),
            ...                      Steer("allocator:one_side_refused", "swa")})
            >>> steering.avoids("move", variant="dsa:kpool:dcp")
            True
            >>> steering.avoids("write_kv", variant="mha:hnd"), steering.avoids("write_kv", family="mha")
            (True, False)
            >>> steering.avoids("allocator:one_side_refused", where="swa")
            True
            >>> steering.avoids("moves", family="dsa")
            Traceback (most recent call last):
            ...
            ValueError: what='moves' is not a steer kind: one of ('write_kv', 'move', ...)
        """  # noqa: E501
        if what not in STEER_KINDS:
            raise ValueError(f"what={what!r} is not a steer kind: one of {tuple(STEER_KINDS)}")
        wheres = self._wheres.get(what)
        if not wheres:
            return False
        if family is None and variant is not None:
            family = variant.partition(":")[0]
        return "" in wheres or variant in wheres or family in wheres or where in wheres

    def mentions(self, what: str) -> bool:
        """Whether any steer of kind ``what`` is here, wherever it applies.

        Example:
            >>> Steering({Steer("v_head_dim", "mha:cpu_fp8")}).mentions("v_head_dim")
            True
        """
        if what not in STEER_KINDS:
            raise ValueError(f"what={what!r} is not a steer kind: one of {tuple(STEER_KINDS)}")
        return what in self._wheres
