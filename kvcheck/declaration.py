"""A target's declaration: one typed row per thing it builds, refuses or cannot reach.

Each row is keyed by one of four kinds of :class:`Key`:

- a **variant** (:data:`kvcheck.variants.VARIANTS`, generated from the variant axes: a row
  can only name a variant that exists);
- a **tier**: an allocator kind (``Key.tier("allocator", "swa")``) or the host tier of a
  device variant (``Key.tier("host", "mha:mxfp8")``);
- a **capability** (:data:`CAPABILITIES`), optionally for one pool family or one
  ``--kv-cache-dtype`` choice (``Key.capability("meta_device", "mha")``);
- an **upstream** class or function the target drives (``Key.upstream("pkg.mod:Name")``).

and says exactly one thing about it: :class:`Builds` (how, and where it builds fewer values
than the key's own, which ones), :class:`Refuses` (why, and on which releases) or
:class:`Unreached` (why the suite cannot get there). A target's known discrepancies are
its :class:`~kvcheck.targets.findings.Finding` values, beside the rows.

Everything that needs to know why something is not built reads the declaration: the
surface a target draws in (:meth:`Declaration.surface`, whose notes the variant skips of
:func:`kvcheck.strategies.limits.unbuilt_variant_reason` quote), the host tiers of a
variant (:mod:`kvcheck.targets.tier_support`), the capabilities a target leaves out
(:meth:`Declaration.unsupported`), reach's unreached code
(:meth:`Declaration.unreached_code`). A target without a ``declaration`` member gets the
rows its surface implies (:func:`declaration_of`).

Example:
    >>> declaration = Declaration(rows=(
    ...     Row(Key.variant("mha:nvfp4"), Refuses("writes need a GPU kernel")),
    ...     Row(Key.capability("meta_device", "mha"), Refuses("the constructor reads the GPU")),
    ... ))
    >>> declaration.why_not(Key.variant("mha:nvfp4"))
    'writes need a GPU kernel'
    >>> dict(declaration.unsupported())
    {'meta_device:mha': 'the constructor reads the GPU'}
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from kvcheck.specs import POOL_FAMILIES
from kvcheck.surface import Surface, surface_of
from kvcheck.tiers import ALLOCATOR_KINDS
from kvcheck.variants import VARIANTS, Variant, variant_named, variants_of

__all__ = [
    "ASYMMETRIC",
    "CAPABILITIES",
    "Builds",
    "Declaration",
    "Key",
    "Reason",
    "Refuses",
    "Row",
    "Status",
    "Unreached",
    "declaration_of",
    "surface_refusal",
]

#: Capability names a target may declare in ``unsupported`` (what declaring each skips is
#: said beside it). The suite marks each test with the capabilities it needs
#: (``@pytest.mark.kvcheck_needs("host_copy")``).
CAPABILITIES: tuple[str, ...] = (
    "mha_pool",
    "noop_pool",
    "mla_pool",
    "dsa_pool",
    "meta_device",  # pools build on torch's meta device
    "move",  # move_kv_cache: no move steps
    "host_copy",  # get_cpu_copy / load_cpu_copy: no host copy or reload steps
    "index_k_write",  # DSA set_index_k_scale_buffer: no index-K write steps
    "compress_tail",  # DSA kpool compress tails: no tail writes, reads or tail infos
    "state_buf_infos",  # DSA get_state_buf_infos: not compared with the buffers
    "read_api",  # get_key_buffer / get_value_buffer / get_kv_buffer (and DSA index-K reads)
    "cast_write",  # set_kv_buffer with the caller's payload in another dtype (+ k/v scales)
    "mla_write",  # MLA/DSA set_mla_kv_buffer and get_mla_kv_buffer
    "prefix_valid_write",  # MHA set_kv_buffer_prefix_valid
    "contiguous_buf_infos",  # get_contiguous_buf_infos (transfer descriptors of KV buffers)
    "input_validation",  # bad locations/shapes/dtypes raise and leave the pool unchanged
    "server_args",  # validate_server_args
    "pool_selection",  # select_pool_family
    "configurator",  # cell_size_bytes / max_total_num_tokens
    # the configurator sizes quantized --kv-cache-dtype choices (mxfp8, nvfp4,
    # fp4_mx_block16) passed as ``dtype``, scale buffers included
    "quantized_configurator",
    "skip_rule",  # dsa_layer_skips_topk
    # the sliding-window hybrid pool (make_swa_pool), per family of its sub-pools: refused,
    # nothing about the hybrid runs
    "swa_pool",
    # the hybrid's state machine, per family: refused, the hybrid is still built and its
    # census taken (for a hybrid too slow to drive through a machine's examples)
    "swa_machine",
)

#: The suffix of a host-tier key about the variant's pools with asymmetric K/V head dims.
ASYMMETRIC = ":asymmetric"

KeyKind = Literal["variant", "tier", "capability", "upstream"]
_TIERS = ("allocator", "host")


@dataclass(frozen=True, order=True)
class Key:
    """What a row is about (build one with :meth:`variant`, :meth:`tier`,
    :meth:`capability` or :meth:`upstream`)."""

    kind: KeyKind
    name: str
    of: str = ""

    @classmethod
    def variant(cls, name: str) -> Key:
        """A pool variant (``ValueError`` for a name :data:`VARIANTS` does not have).

        Example:
            >>> Key.variant("dsa:kpool")
            Key(kind='variant', name='dsa:kpool', of='')
        """
        variant_named(name)
        return cls("variant", name)

    @classmethod
    def tier(cls, tier: str, of: str) -> Key:
        """An allocator kind (``tier="allocator"``) or a device variant's host tier
        (``tier="host"``, ``of`` a variant name; ``<variant>:asymmetric`` for its pools with
        a V head dim of their own).

        Example:
            >>> Key.tier("host", "mla:fp4").of
            'mla:fp4'
        """
        if tier not in _TIERS:
            raise ValueError(f"tier={tier!r} not in {_TIERS}")
        if tier == "host":
            variant_named(of.removesuffix(ASYMMETRIC))
        elif of not in ALLOCATOR_KINDS:
            raise ValueError(f"allocator kind {of!r} not in {ALLOCATOR_KINDS}")
        return cls("tier", tier, of)

    @classmethod
    def capability(cls, capability: str, of: str = "") -> Key:
        """A capability, for every family or for one (``of``: a family or a KV dtype).

        Example:
            >>> Key.capability("meta_device", "mha").label
            'meta_device:mha'
        """
        if capability not in CAPABILITIES:
            raise ValueError(f"capability={capability!r} not in {CAPABILITIES}")
        return cls("capability", capability, of)

    @classmethod
    def upstream(cls, qualified_name: str, *, lines: str = "") -> Key:
        """An upstream class or function, as ``module:qualified.name`` (a file path and a
        glob of qualified names for code ranges), and, for some of its lines only, the
        regular expression that finds them.

        Example:
            >>> Key.upstream("sglang.srt.mem_cache.memory_pool:SWAKVPool").name
            'sglang.srt.mem_cache.memory_pool:SWAKVPool'
        """
        if qualified_name.count(":") != 1:
            raise ValueError(f"upstream name {qualified_name!r} is not 'module:qualified.name'")
        return cls("upstream", qualified_name, lines)

    @property
    def label(self) -> str:
        """The key as one word: ``mha:nvfp4``, ``allocator.swa``, ``meta_device:mha``."""
        if self.kind == "tier":
            return f"{self.name}.{self.of}"
        return f"{self.name}:{self.of}" if self.of else self.name


@dataclass(frozen=True)
class Builds:
    """The target builds it: ``how`` (the class and arguments, or the path it takes on this
    platform); ``only``: the values it builds where fewer than the key's own (a host tier
    in some layouts only), None for all of them."""

    how: str
    only: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Refuses:
    """The target does not build or serve it, for ``why``, on ``releases`` (anything that
    answers ``release in releases``; None: every release)."""

    why: str
    releases: Container[str] | None = None


@dataclass(frozen=True)
class Unreached:
    """The target builds it, but the suite cannot drive it on this platform, for ``why``."""

    why: str


Status = Builds | Refuses | Unreached


@dataclass(frozen=True)
class Row:
    """One key and what the target says about it."""

    key: Key
    status: Status


@dataclass(frozen=True)
class Declaration:
    """A target's rows, at most one per key, and its findings.

    Example:
        >>> Declaration(rows=(Row(Key.variant("mha"), Builds("a")),) * 2)
        Traceback (most recent call last):
        ...
        ValueError: declaration: two rows for variant mha
    """

    rows: tuple[Row, ...] = ()
    findings: tuple[Any, ...] = ()
    _by_key: Mapping[Key, Status] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_key: dict[Key, Status] = {}
        for row in self.rows:
            if not isinstance(row, Row) or not isinstance(row.status, Builds | Refuses | Unreached):
                raise ValueError(f"declaration: {row!r} is not a Row with a status")
            if row.key in by_key:
                raise ValueError(f"declaration: two rows for {row.key.kind} {row.key.label}")
            by_key[row.key] = row.status
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "findings", tuple(self.findings))
        object.__setattr__(self, "_by_key", MappingProxyType(by_key))

    def status(self, key: Key) -> Status | None:
        """What the declaration says about ``key`` (None: nothing)."""
        return self._by_key.get(key)

    def why_not(self, key: Key, release: str | None = None) -> str | None:
        """Why ``key`` is refused (on ``release``, where given, which fills a ``{release}``
        in the reason) or unreached; None when it is built or not declared."""
        status = self._by_key.get(key)
        if isinstance(status, Refuses):
            if release is None:
                return status.why
            if status.releases is None or release in status.releases:
                return status.why.replace("{release}", release)
            return None
        if isinstance(status, Unreached):
            return status.why
        return None

    def of_kind(self, kind: KeyKind) -> Iterator[Row]:
        """The rows whose key is of ``kind``, in declaration order."""
        return (row for row in self.rows if row.key.kind == kind)

    def unsupported(self, release: str | None = None) -> Mapping[str, str]:
        """Capability label (``"input_validation"``, ``"meta_device:mha"``) -> why, for each
        capability refused (on ``release``) for every family or for one: the target
        protocol's ``unsupported``."""
        return MappingProxyType(
            {
                row.key.label: why
                for row in self.of_kind("capability")
                if row.key.of in ("", *POOL_FAMILIES)
                and (why := self.why_not(row.key, release)) is not None
            }
        )

    def refused_choices(self, capability: str, release: str | None = None) -> Mapping[str, str]:
        """Choice -> why, for each choice other than a family (a ``--kv-cache-dtype``) that
        ``capability`` is refused for.

        Example:
            >>> Declaration(rows=(Row(Key.capability("quantized_configurator", "nvfp4"),
            ...                       Refuses("GPU only")),)).refused_choices(
            ...     "quantized_configurator")
            mappingproxy({'nvfp4': 'GPU only'})
        """
        return MappingProxyType(
            {
                row.key.of: why
                for row in self.of_kind("capability")
                if row.key.name == capability
                and row.key.of not in ("", *POOL_FAMILIES)
                and (why := self.why_not(row.key, release)) is not None
            }
        )

    def surface(self, bound: Surface) -> Surface:
        """``bound`` without the axis values only refused variants take, each family's
        narrowed field noted with the refusals' reasons (``variant why``, joined by ``;``),
        and without the allocator kinds the declaration refuses (noted with why).

        Example:
            >>> declaration = Declaration(rows=(
            ...     Row(Key.variant("mla:dcp"), Refuses("no parallel widths here")),))
            >>> surface = declaration.surface(Surface.everything())
            >>> surface.values("mla", "dcp_size"), surface.note("mla", "dcp_size")
            ((1,), 'dcp: no parallel widths here')
        """
        families = {family: dict(fields) for family, fields in bound.families.items()}
        notes = dict(bound.notes)
        for family in families:
            refused = {
                variant.name: why
                for variant in variants_of(family)
                if (why := self.why_not(Key.variant(variant.name))) is not None
            }
            if not refused:
                continue
            kept = [v for v in variants_of(family) if v.name not in refused]
            for axis_field in variants_of(family)[0].axis_values:
                current = bound.values(family, axis_field) or ()
                taken = {value for v in kept for value in v.axis_values[axis_field]}
                narrowed = tuple(value for value in current if value in taken)
                if narrowed == tuple(current):
                    continue
                families[family][axis_field] = narrowed
                dropped = set(current) - set(narrowed)
                named: dict[str, list[str]] = {}
                for name, why in refused.items():
                    if dropped & set(variant_named(name).axis_values[axis_field]):
                        named.setdefault(why, []).append(name.partition(":")[2])
                reasons = [f"{', '.join(names)}: {why}" for why, names in named.items()]
                notes.setdefault(f"{family}.{axis_field}", "; ".join(reasons))
        allocators = bound.allocators
        for kind, (page_sizes, why) in self.allocator_page_sizes().items():
            if not page_sizes and kind in allocators:
                allocators = tuple(other for other in allocators if other != kind)
                notes.setdefault(f"allocators.{kind}", why)
        return Surface(
            families,
            notes=notes,
            allocators=allocators,
            host_layouts=bound.host_layouts,
            host_kernel_alignment=bound.host_kernel_alignment,
        )

    def unreached_code(self) -> tuple[Reason, ...]:
        """Each upstream code range the declaration says the suite cannot reach, with why
        (what ``tools/reach.py`` explains unreached lines with), in declaration order."""
        reasons = []
        for row in self.of_kind("upstream"):
            if isinstance(row.status, Unreached):
                file, _, qualname = row.key.name.partition(":")
                reasons.append(Reason(file, qualname, row.status.why, row.key.of or None))
        return tuple(reasons)

    def host_variant_layouts(self) -> Mapping[str, tuple[tuple[str, ...], str]]:
        """Device variant -> (the host layouts built for it, why not the family's), for each
        variant whose host tier the declaration narrows or refuses."""
        return self._narrowed_tier("host")

    def allocator_page_sizes(self) -> Mapping[str, tuple[tuple[int, ...], str]]:
        """Allocator kind -> (the page sizes it is built at, why not all its kind's), for
        each kind the declaration narrows (``Builds(how, only=page_sizes)``) or refuses
        (no page size).

        Example:
            >>> row = Row(Key.tier("allocator", "swa"), Builds("token sides", only=(1,)))
            >>> dict(Declaration(rows=(row,)).allocator_page_sizes())
            {'swa': ((1,), 'token sides')}
        """
        return self._narrowed_tier("allocator")

    def _narrowed_tier(self, tier: str) -> Mapping[str, tuple[tuple[Any, ...], str]]:
        """Of ``tier``'s rows (``"host"``, ``"allocator"``): what each narrows to and why
        (``Builds(how, only=...)``), or nothing and why (refused, unreached)."""
        narrowed: dict[str, tuple[tuple[Any, ...], str]] = {}
        for row in self.of_kind("tier"):
            if row.key.name != tier:
                continue
            status = row.status
            if isinstance(status, Builds) and status.only is not None:
                narrowed[row.key.of] = (tuple(status.only), status.how)
            elif isinstance(status, Refuses | Unreached):
                narrowed[row.key.of] = ((), status.why)
        return MappingProxyType(narrowed)

    def overlaid(self, *rows: Row) -> Declaration:
        """This declaration with ``rows`` in place of its rows for the same keys (what an
        installed release says over what the target declares).

        Example:
            >>> base = Declaration(rows=(Row(Key.variant("mla:fp4"), Builds("pool")),))
            >>> base.overlaid(Row(Key.variant("mla:fp4"), Refuses("absent"))).why_not(
            ...     Key.variant("mla:fp4"))
            'absent'
        """
        replaced = {row.key for row in rows}
        kept = tuple(row for row in self.rows if row.key not in replaced)
        return Declaration(rows=(*kept, *rows), findings=self.findings)


@dataclass(frozen=True)
class Reason:
    """Why unreached lines stay unreached.

    Explains a range in ``file`` (relative to the upstream package, as in a reach ``Scope``)
    inside a method whose qualified name matches the glob ``qualname``
    (``"MHATokenToKVPool.get_raw_kv_buffer"``, ``"MHATokenToKVPool._*"``, ``"*"``) when
    ``pattern`` is ``None`` or the regular expression ``pattern`` is found (``re.search``,
    multiline) in the range's first source line joined with the header of the innermost
    block (``if``, ``for``, ``with``, ``try``) that holds it (``if self.use_hnd:``). Only
    the first line counts, so a pattern for a GPU-only tail of a method does not also
    explain a range that starts in its CPU part.
    """

    file: str
    qualname: str
    reason: str
    pattern: str | None = None

    @property
    def row(self) -> Row:
        """The declaration row that says this: the upstream code, :class:`Unreached`."""
        return Row(
            Key.upstream(f"{self.file}:{self.qualname}", lines=self.pattern or ""),
            Unreached(self.reason),
        )


def declaration_of(target: object) -> Declaration:
    """``target``'s ``declaration``, or the one its surface implies: a :class:`Builds` row
    for each variant its surface takes and a :class:`Refuses` row, quoting the surface's
    note, for each it leaves out.

    Example:
        >>> from types import SimpleNamespace
        >>> declaration = declaration_of(SimpleNamespace(name="t"))
        >>> declaration.why_not(Key.variant("mha:hnd"))
        'its surface lists no such kv_layout'
    """
    declared = getattr(target, "declaration", None)
    if isinstance(declared, Declaration):
        return declared
    if declared is not None:
        name = getattr(target, "name", target)
        raise ValueError(f"target {name!r}: declaration={declared!r} is not a Declaration")
    surface = surface_of(target)
    return Declaration(rows=tuple(_surface_row(surface, variant) for variant in VARIANTS))


def surface_refusal(surface: Surface, variant: Variant) -> str | None:
    """Why ``surface`` leaves out ``variant`` (its note, else which field it lacks), or None
    when it takes the variant.

    Example:
        >>> from kvcheck.variants import variant_named
        >>> surface_refusal(Surface.baseline(), variant_named("mha:hnd"))
        'its surface lists no such kv_layout'
    """
    family = variant.family
    if not surface.builds(family):
        return surface.note(family) or "its surface lists no such family"
    missing = variant.takes({name: surface.values(family, name) for name in variant.axis_values})
    if missing is None:
        return None
    return surface.note(family, missing) or f"its surface lists no such {missing}"


def _surface_row(surface: Surface, variant: Variant) -> Row:
    why = surface_refusal(surface, variant)
    status = Builds("inside its surface") if why is None else Refuses(why)
    return Row(Key.variant(variant.name), status)
