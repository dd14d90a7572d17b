"""What a target builds, declared once as data: the pool families, and per family the
variants and the values it takes.

kvcheck's pools vary along a few *axes* (:data:`kvcheck.specs.AXES`): a PoolSpec
field whose values name a variant, such as MHA's buffer layout or DSA's index kpool. Every
target builds each axis's first value (the baseline); anything beyond it is opt-in, so a
target written before a variant existed is never handed a spec it would silently build as
another. A target states what it builds in one :class:`Surface`: the families, and per
family the values of each axis it takes beyond the baseline and the values it accepts for
any other field (an implementation that asserts a layout, such as sglang's 64-token DSA
index pages). The strategies draw inside it (:mod:`kvcheck.strategies.limits`), the
suite skips a family it leaves out, and ``kvcheck verify`` prints it in one line.

A subclass of a target inherits its surface unless it declares its own.

A surface also says which tiers around a pool the target builds (:meth:`Surface.with_tiers`):
the token-to-KV allocators (:data:`kvcheck.tiers.ALLOCATOR_KINDS`) and, per device family,
the host-pool layouts (:data:`kvcheck.tiers.HOST_LAYOUTS`). Neither is part of the baseline:
a target that declares none is never handed an allocator or a host pool.

Adding a variant along a new axis is one row of :data:`kvcheck.specs.AXES`, beside its
``PoolSpec`` field; a target opts in by naming the axis in its surface.

Example:
    >>> surface = Surface.of(mha={"kv_layout": ("nhd", "hnd")}, dsa={"index_head_dim": (128,)})
    >>> surface.describe()
    'mha (kv_layout nhd/hnd), dsa (index_head_dim 128)'
    >>> surface.values("mha", "kv_layout"), surface.values("dsa", "latent_layout")
    (('nhd', 'hnd'), ('raw',))
    >>> surface.builds("mla")
    False
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvcheck.specs import AXES, POOL_FAMILIES, Axis, PoolSpec
from kvcheck.tiers import ALLOCATOR_KINDS, HOST_LAYOUTS

__all__ = [
    "AXES",
    "LIMIT_NAMES",
    "Axis",
    "FieldValues",
    "Surface",
    "surface_of",
]

#: PoolSpec field (or a derived name a limit may use) -> the values a target accepts.
FieldValues = Mapping[str, tuple[Any, ...]]


_AXIS_BY_FIELD = {axis.field: axis for axis in AXES}
_SPEC_FIELDS = frozenset(field.name for field in dataclasses.fields(PoolSpec)) - {"family"}
#: What a surface may name besides an axis: a PoolSpec field, or ``index_page_size``
#: (``page_size // index_kpool``, the tokens of one DSA index page, which SGLang fixes at 64).
LIMIT_NAMES: frozenset[str] = _SPEC_FIELDS | {"index_page_size"}


@dataclass(frozen=True)
class Surface:
    """The families a target builds and, per family, the values it takes.

    ``families`` maps each family the target builds to its declaration: PoolSpec field ->
    the values it accepts. For an axis (:data:`AXES`) a field left out means the baseline
    only; any other field left out is unrestricted. Build one with :meth:`of`,
    :meth:`everything` or :meth:`baseline`; validated on construction (``ValueError``
    naming the family and field).

    ``notes`` says why a family is left out (key ``"dsa"``) or a field narrowed (key
    ``"dsa.index_kpool"``), where the target can say so (an installed release that lacks
    a piece): a test skipped for the surface quotes it (:meth:`note`).

    Example:
        >>> Surface.everything().values("dsa", "index_kpool")
        (1, 2, 4)
        >>> Surface.of(dsa={"index_kpool": (2,)})
        Traceback (most recent call last):
        ...
        ValueError: surface['dsa']['index_kpool']=(2,) must include the baseline 1, of (1, 2, 4)
    """

    families: Mapping[str, FieldValues]
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    #: The allocator kinds the target builds (``make_allocator``), of ALLOCATOR_KINDS.
    allocators: tuple[str, ...] = ()
    #: Device family -> the host layouts its host pools take (``make_host_pool``).
    host_layouts: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Bytes a token's row (per layer and component) must be a multiple of for its host
    #: pools to transfer it with the ``kernel`` io backend (SGLang's sgl-kernel transfer ops
    #: check ``item_size % 8 == 0``); 1: any row.
    host_kernel_alignment: int = 1

    def __post_init__(self) -> None:
        problems = (
            surface_problems(self.families)
            + _note_problems(self.notes)
            + tier_problems(self.allocators, self.host_layouts)
        )
        alignment = self.host_kernel_alignment
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
            problems.append(f"host_kernel_alignment={alignment!r} must be an int >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        object.__setattr__(self, "allocators", tuple(self.allocators))
        object.__setattr__(self, "host_layouts", MappingProxyType(dict(self.host_layouts)))
        frozen = {
            family: MappingProxyType(dict(self.families[family]))
            for family in POOL_FAMILIES
            if family in self.families
        }
        object.__setattr__(self, "families", MappingProxyType(frozen))
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))

    @classmethod
    def of(cls, **families: FieldValues) -> Surface:
        """A surface of the families named, each with its declaration.

        Example:
            >>> Surface.of(mha={}, noop={}).describe()
            'mha, noop'
        """
        return cls(families)

    @classmethod
    def everything(cls, **limits: FieldValues) -> Surface:
        """Every family with every value of every axis; ``limits`` adds, per family, the
        values the target accepts for other fields.

        Example:
            >>> Surface.everything(dsa={"index_head_dim": (128,)}).values("dsa", "index_head_dim")
            (128,)
        """
        families: dict[str, dict[str, tuple[Any, ...]]] = {f: {} for f in POOL_FAMILIES}
        for axis in AXES:
            for family in axis.families:
                families[family][axis.field] = axis.values_for(family)
        for family, fields in limits.items():
            families.setdefault(family, {}).update(fields)
        return cls(families)

    @classmethod
    def baseline(cls) -> Surface:
        """Every family, each axis at its baseline: what a target that declares nothing builds.

        Example:
            >>> Surface.baseline().values("mha", "kv_layout")
            ('nhd',)
        """
        return cls({family: {} for family in POOL_FAMILIES})

    def builds(self, family: str) -> bool:
        """Whether the target builds pools of ``family``."""
        return family in self.families

    def values(self, family: str, field: str) -> tuple[Any, ...] | None:
        """The values of ``field`` the target accepts for ``family`` (``None``: any).

        Example:
            >>> Surface.baseline().values("dsa", "page_size") is None
            True
        """
        declared = self.families.get(family, {})
        if field in declared:
            return declared[field]
        axis = _AXIS_BY_FIELD.get(field)
        if axis is not None and family in axis.families:
            return axis.values_for(family)[:1]
        return None

    def limits(self) -> dict[str, dict[str, tuple[Any, ...]]]:
        """Per family, the fields the target narrows below what kvcheck draws: the axes it
        does not take in full and every other field it declares.

        Example:
            >>> Surface.baseline().limits()["mla"]
            {'dcp_size': (1,), 'kv_quant': ('none',)}
        """
        narrowed: dict[str, dict[str, tuple[Any, ...]]] = {}
        for family in self.families:
            fields: dict[str, tuple[Any, ...]] = {}
            for axis in AXES:
                if family in axis.families:
                    values = self.values(family, axis.field)
                    if values is not None and set(values) != set(axis.values_for(family)):
                        fields[axis.field] = values
            for field, values in self.families[family].items():
                if field not in _AXIS_BY_FIELD:
                    fields[field] = values
            if fields:
                narrowed[family] = fields
        return narrowed

    def replace(self, **families: FieldValues | None) -> Surface:
        """This surface with the named families' declarations replaced (``None`` drops one);
        its notes are kept.

        Example:
            >>> Surface.everything().replace(mha=None, mla=None, dsa=None).describe()
            'noop'
        """
        merged: dict[str, FieldValues] = dict(self.families)
        for family, declaration in families.items():
            if declaration is None:
                merged.pop(family, None)
            else:
                merged[family] = declaration
        return dataclasses.replace(self, families=merged)

    def with_tiers(
        self,
        *,
        allocators: tuple[str, ...] | None = None,
        host_layouts: Mapping[str, tuple[str, ...]] | None = None,
        host_kernel_alignment: int | None = None,
    ) -> Surface:
        """This surface with the allocator kinds and host layouts the target builds, and the
        row alignment its kernel host transfers need (None: keep what it declares).

        Example:
            >>> surface = Surface.of(mha={}).with_tiers(allocators=("token", "paged"),
            ...                                         host_layouts={"mha": ("layer_first",)})
            >>> surface.describe_tiers()
            'allocators token/paged; host pools mha (layer_first)'
        """
        return dataclasses.replace(
            self,
            allocators=self.allocators if allocators is None else allocators,
            host_layouts=self.host_layouts if host_layouts is None else host_layouts,
            host_kernel_alignment=(
                self.host_kernel_alignment
                if host_kernel_alignment is None
                else host_kernel_alignment
            ),
        )

    def describe_tiers(self) -> str:
        """One line: the allocator kinds and host layouts declared ("" when none).

        Example:
            >>> Surface.baseline().describe_tiers()
            ''
        """
        parts = []
        if self.allocators:
            parts.append(f"allocators {'/'.join(self.allocators)}")
        if self.host_layouts:
            hosts = ", ".join(
                f"{family} ({'/'.join(layouts)})" for family, layouts in self.host_layouts.items()
            )
            parts.append(f"host pools {hosts}")
        if self.host_kernel_alignment > 1:
            parts.append(f"kernel host io on rows of {self.host_kernel_alignment}-byte multiples")
        return "; ".join(parts)

    def with_notes(self, notes: Mapping[str, str]) -> Surface:
        """This surface with ``notes`` added (key ``family`` or ``family.field``, see
        :class:`Surface`).

        Example:
            >>> surface = Surface.baseline().with_notes({"dsa.index_kpool": "no kpool here"})
            >>> surface.note("dsa", "index_kpool")
            'no kpool here'
        """
        return dataclasses.replace(self, notes={**self.notes, **notes})

    def note(self, family: str, field: str | None = None) -> str | None:
        """Why ``family`` is left out, or its ``field`` narrowed, when the target said so.

        Example:
            >>> Surface.baseline().note("dsa", "dcp_size") is None
            True
        """
        return self.notes.get(family if field is None else f"{family}.{field}")

    def describe(self) -> str:
        """One line: each family, with what it takes beyond the baseline and its limits."""
        parts = []
        for family, fields in self.families.items():
            declared = [
                f"{field} {'/'.join(map(str, values))}"
                for field, values in fields.items()
                if field not in _AXIS_BY_FIELD or tuple(values) != _AXIS_BY_FIELD[field].values[:1]
            ]
            parts.append(f"{family} ({', '.join(declared)})" if declared else family)
        return ", ".join(parts) or "no pool family"


def surface_problems(families: object) -> list[str]:
    """What is wrong with ``families`` as a surface declaration (empty when it is fine).

    Example:
        >>> surface_problems({"mha": {"kv_layout": ("hnd",)}})
        ["surface['mha']['kv_layout']=('hnd',) must include the baseline 'nhd', of ('nhd', 'hnd')"]
    """
    if not isinstance(families, Mapping):
        return [f"surface: {families!r} (expected a mapping family -> field -> values)"]
    problems: list[str] = []
    for family, fields in families.items():
        where = f"surface[{family!r}]"
        if family not in POOL_FAMILIES:
            problems.append(f"{where}: not a pool family; known: {', '.join(POOL_FAMILIES)}")
            continue
        if not isinstance(fields, Mapping):
            problems.append(f"{where}: {fields!r} (expected a mapping field -> values)")
            continue
        for field, values in fields.items():
            problem = _field_problem(family, field, values)
            if problem:
                problems.append(f"{where}[{field!r}]{problem}")
    return problems


def tier_problems(allocators: object, host_layouts: object) -> list[str]:
    """What is wrong with a surface's allocator kinds and host layouts (empty when fine).

    Example:
        >>> tier_problems(("token", "buddy"), {"mha": ("page_head",)})
        ["surface allocators: 'buddy' not in ('token', 'paged', 'swa', 'pure_swa')"]
    """
    problems: list[str] = []
    if not isinstance(allocators, tuple):
        problems.append(f"surface allocators={allocators!r} must be a tuple")
    else:
        problems.extend(
            f"surface allocators: {kind!r} not in {ALLOCATOR_KINDS}"
            for kind in allocators
            if kind not in ALLOCATOR_KINDS
        )
    if not isinstance(host_layouts, Mapping):
        return [*problems, f"surface host_layouts={host_layouts!r} must be a mapping"]
    for family, layouts in host_layouts.items():
        known = HOST_LAYOUTS.get(family)
        if known is None:
            problems.append(
                f"surface host_layouts[{family!r}]: no host pool; of {tuple(HOST_LAYOUTS)}"
            )
        elif not isinstance(layouts, tuple) or not layouts or set(layouts) - set(known):
            problems.append(
                f"surface host_layouts[{family!r}]={layouts!r} must be a non-empty tuple of {known}"
            )
    return problems


#: Note keys for the tiers: why a target builds no allocator, no allocator of one kind, no
#: host pool, or no host pool for one family's device pools (a release without the module or
#: the path a CPU can run).
TIER_NOTE_KEYS: frozenset[str] = frozenset(
    {
        "allocators",
        "host_pools",
        *(f"allocators.{kind}" for kind in ALLOCATOR_KINDS),
        *(f"host_pools.{family}" for family in HOST_LAYOUTS),
    }
)


def _note_problems(notes: object) -> list[str]:
    if not isinstance(notes, Mapping):
        return [f"notes: {notes!r} (expected a mapping 'family' or 'family.field' -> why)"]
    problems = []
    for key, why in notes.items():
        family, _, field = str(key).partition(".")
        tier = key in TIER_NOTE_KEYS
        if not tier and (family not in POOL_FAMILIES or (field and field not in LIMIT_NAMES)):
            problems.append(f"notes[{key!r}]: not a pool family or 'family.field'")
        elif not isinstance(why, str) or not why:
            problems.append(f"notes[{key!r}]={why!r} must be a non-empty str")
    return problems


def _field_problem(family: str, field: object, values: object) -> str | None:
    if field not in LIMIT_NAMES:
        return f": not a PoolSpec field (or index_page_size); axes: {', '.join(_AXIS_BY_FIELD)}"
    if not isinstance(values, tuple) or not values:
        return f"={values!r} must be a non-empty tuple"
    axis = _AXIS_BY_FIELD.get(str(field))
    if axis is None:
        return None
    if family not in axis.families:
        return f": {field} varies only for {', '.join(axis.families)} pools"
    known = axis.values_for(family)
    baseline = known[0]
    if baseline not in values or set(values) - set(known):
        return f"={values!r} must include the baseline {baseline!r}, of {known}"
    return None


def surface_of(target: object) -> Surface:
    """The surface ``target`` declares (its ``surface``; default :meth:`Surface.baseline`),
    with the members that declared parts of it before surfaces existed laid over it, where
    the target has them: ``pool_spec_limits`` and the opt-in tuples ``kv_layouts``,
    ``latent_layouts``, ``index_kpools`` and ``dcp_sizes``. A malformed declaration raises
    ``ValueError`` naming the target.

    Example:
        >>> from types import SimpleNamespace
        >>> surface_of(SimpleNamespace(kv_layouts=("nhd", "hnd"))).values("mha", "kv_layout")
        ('nhd', 'hnd')
        >>> surface_of(object()) == Surface.baseline()
        True
    """
    name = getattr(target, "name", target)
    declared = getattr(target, "surface", None)
    if declared is None:
        declared = Surface.baseline()
    elif not isinstance(declared, Surface):
        raise ValueError(f"target {name!r}: surface={declared!r} is not a kvcheck.surface.Surface")
    legacy: dict[str, dict[str, Any]] = {}
    limits = getattr(target, "pool_spec_limits", None)
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise ValueError(f"target {name!r}: pool_spec_limits={limits!r} is not a mapping")
        for family, fields in limits.items():
            if not isinstance(fields, Mapping):
                raise ValueError(
                    f"target {name!r}: pool_spec_limits[{family!r}]={fields!r} is not a "
                    "mapping field -> values"
                )
            legacy.setdefault(family, {}).update(fields)
    for axis in AXES:
        values = getattr(target, axis.legacy_attribute, None)
        if values is not None:
            for family in axis.families:
                legacy.setdefault(family, {})[axis.field] = values
    if not legacy:
        return declared
    families = {family: dict(fields) for family, fields in declared.families.items()}
    for family, fields in legacy.items():
        families.setdefault(family, {}).update(fields)
    try:
        return dataclasses.replace(declared, families=families)
    except ValueError as exc:
        raise ValueError(f"target {name!r}: {exc}") from exc
