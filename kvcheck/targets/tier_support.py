"""What the suite asks of a target's allocators and host pools.

A target that builds them declares so in its surface (:meth:`kvcheck.surface.Surface.with_tiers`)
and has two optional members:

``make_allocator(spec: AllocatorSpec, *, device: str, kvcache=None)``
    the allocator ``spec`` describes (SGLang's API: ``alloc``, ``alloc_extend``,
    ``alloc_decode``, ``free``, ``free_full``, ``free_segment(s)``, ``free_full_segment(s)``,
    ``free_group_begin``/``end``, ``clear``, ``available_size``, ``size_full``, the
    scheduler's hooks ``check_decode_capacity``, ``prealloc_fits``, ``prealloc_ceiling_fits``,
    ``request_slot_reserve``, ``verify_byte_accounting``,
    ``translate_kv_indices_for_transfer``, and ``get_all_free_pages`` where it keeps a page
    list; SWA and pure SWA also ``free_swa``, ``free_swa_segment``, ``full_available_size``,
    ``swa_available_size``, ``size``, ``size_swa``, ``translate_loc_from_full_to_swa``,
    ``translate_swa_indices_for_transfer``, their sides as ``full_attn_allocator`` /
    ``swa_attn_allocator``; SWA above page size 1 ``alloc_extend_swa_tail``), handing out
    slots of ``kvcache`` (the device pool, when the caller has one; the target builds
    whatever its allocator needs otherwise);
``make_host_pool(spec: HostPoolSpec, device_pool, *, device: str)``
    the host tier mirroring ``device_pool``: a tuple of host pools, the first of which
    allocates host slots (``alloc``, ``free``, ``available_size``) and every one of which backs
    up and loads with the same host indices (``backup_from_device_all_layer``,
    ``load_to_device_per_layer``, ``get_data_page``, ``set_from_flat_data_page``,
    ``get_dummy_flat_data_page``, ``get_page_buffer_meta``, ``get_size_per_token``): SGLang's
    ``MHATokenToKVPoolHost`` or ``MLATokenToKVPoolHost``, and for a DSA pool the MLA host of
    the latent rows plus the ``DSAIndexerPoolHost`` of its index-K pages.

and, in its declaration (:class:`kvcheck.declaration.Declaration`), an allocator row
(``Key.tier("allocator", kind)``) for each kind it builds at fewer page sizes than the kind's
own (``Builds(how, only=page_sizes)``) or not at all (``Refuses(why)``), a host-tier row
(``Key.tier("host", variant)``) for each device pool variant whose host tier it builds in
fewer layouts than its family's (``Builds(how, only=layouts)``) or not at all
(``Refuses(why)``), and one optional datum:

``host_storage_steer: Collection[Steer]``
    ``Steer("host:storage_pages", variant)`` (:class:`kvcheck.steering.Steer`) for variants
    whose host pools have no flat storage pages (``get_data_page``,
    ``get_page_buffer_meta``): those checks are left out.

The suite never hands a target an allocator kind or host layout its surface leaves out;
such tests skip, saying why.

Example:
    >>> from kvcheck.targets import resolve_target
    >>> allocator_skip_reason(resolve_target("kvcheck"), "swa") is None
    True
    >>> from types import SimpleNamespace
    >>> print(allocator_skip_reason(SimpleNamespace(name="t"), "paged"))
    target 't' builds no paged allocator (its surface declares allocators: none)

A note of the target's surface on why (a release without the piece) is quoted:

    >>> from kvcheck.surface import Surface
    >>> surface = Surface.baseline().with_tiers(allocators=("token",)).with_notes(
    ...     {"allocators.paged": "no torch path"})
    >>> print(allocator_skip_reason(SimpleNamespace(name="t", surface=surface), "paged"))
    target 't' builds no paged allocator (its surface declares allocators: token): no torch path
"""

from __future__ import annotations

from typing import Any

from kvcheck.declaration import declaration_of
from kvcheck.surface import surface_of
from kvcheck.tiers import AllocatorSpec, HostPoolSpec

__all__ = [
    "allocator_page_sizes",
    "allocator_skip_reason",
    "build_allocator",
    "build_host_pool",
    "host_pool_skip_reason",
    "host_variant_layouts",
    "host_variant_skip_reason",
]


def _name(target: Any) -> str:
    return str(getattr(target, "name", target))


def allocator_skip_reason(target: Any, kind: str) -> str | None:
    """Why ``target`` cannot be handed an allocator of ``kind`` (None: it can)."""
    surface = surface_of(target)
    if kind not in surface.allocators:
        declared = "/".join(surface.allocators) or "none"
        why = surface.notes.get(f"allocators.{kind}") or surface.notes.get("allocators")
        return (
            f"target {_name(target)!r} builds no {kind} allocator "
            f"(its surface declares allocators: {declared})" + (f": {why}" if why else "")
        )
    if not callable(getattr(target, "make_allocator", None)):
        return f"target {_name(target)!r} declares {kind} allocators but has no make_allocator"
    page_sizes, why = declaration_of(target).allocator_page_sizes().get(kind, (None, ""))
    if page_sizes == ():
        return f"target {_name(target)!r} builds no {kind} allocator ({why})"
    return None


def allocator_page_sizes(target: Any, kind: str) -> tuple[int, ...] | None:
    """The page sizes ``target`` builds allocators of ``kind`` at, when its declaration says
    fewer than the kind's own (:data:`kvcheck.tiers.ALLOCATOR_PAGE_SIZES`); None: the kind's.

    Example:
        >>> from types import SimpleNamespace
        >>> from kvcheck.declaration import Builds, Declaration, Key, Row
        >>> row = Row(Key.tier("allocator", "swa"), Builds("token sides", only=(1,)))
        >>> target = SimpleNamespace(declaration=Declaration(rows=(row,)))
        >>> allocator_page_sizes(target, "swa"), allocator_page_sizes(target, "paged")
        ((1,), None)
    """
    declared = declaration_of(target).allocator_page_sizes()
    return declared[kind][0] if kind in declared else None


def host_pool_skip_reason(target: Any, family: str, layout: str | None = None) -> str | None:
    """Why ``target`` cannot be handed a host pool for ``family`` pools (in ``layout``, when
    given); None: it can."""
    surface = surface_of(target)
    layouts = surface.host_layouts.get(family, ())
    if not layouts or (layout is not None and layout not in layouts):
        wanted = family if layout is None else f"{family} {layout}"
        declared = surface.describe_tiers() or "none"
        why = surface.notes.get(f"host_pools.{family}") or surface.notes.get("host_pools")
        return (
            f"target {_name(target)!r} builds no {wanted} host pool "
            f"(its surface declares: {declared})" + (f": {why}" if why else "")
        )
    if not callable(getattr(target, "make_host_pool", None)):
        return f"target {_name(target)!r} declares host pools but has no make_host_pool"
    return None


def host_variant_layouts(target: Any, variant: str) -> tuple[str, ...] | None:
    """The host layouts ``target`` builds for device pools of ``variant`` when its
    declaration says fewer than its family's; None: the family's.

    Example:
        >>> from types import SimpleNamespace
        >>> from kvcheck.declaration import Builds, Declaration, Key, Row
        >>> row = Row(Key.tier("host", "mha:mxfp8"), Builds("why", only=("page_first",)))
        >>> target = SimpleNamespace(declaration=Declaration(rows=(row,)))
        >>> host_variant_layouts(target, "mha:mxfp8"), host_variant_layouts(target, "mha")
        (('page_first',), None)
    """
    declared = declaration_of(target).host_variant_layouts()
    if variant not in declared:
        return None
    return tuple(declared[variant][0])


def host_variant_skip_reason(target: Any, variant: str) -> str | None:
    """Why ``target`` builds no host tier for device pools of ``variant`` (None: it does,
    in some layout)."""
    declared = declaration_of(target).host_variant_layouts()
    if variant in declared and not declared[variant][0]:
        return (
            f"target {_name(target)!r} builds no host pool for {variant} device pools "
            f"({declared[variant][1]})"
        )
    return None


def build_allocator(target: Any, spec: AllocatorSpec, *, device: str, kvcache: Any = None) -> Any:
    """``target.make_allocator(spec, device=device, kvcache=kvcache)``, after checking the
    target declares the kind at the spec's page size (``ValueError`` otherwise)."""
    reason = allocator_skip_reason(target, spec.kind)
    if reason is not None:
        raise ValueError(reason)
    page_sizes = allocator_page_sizes(target, spec.kind)
    if page_sizes is not None and spec.page_size not in page_sizes:
        why = declaration_of(target).allocator_page_sizes()[spec.kind][1]
        raise ValueError(
            f"target {_name(target)!r} builds {spec.kind} allocators at page_size in "
            f"{page_sizes} only, got page_size={spec.page_size} ({why})"
        )
    return target.make_allocator(spec, device=device, kvcache=kvcache)


def build_host_pool(
    target: Any, spec: HostPoolSpec, device_pool: Any, *, device: str
) -> tuple[Any, ...]:
    """The host tier ``target`` builds for ``spec`` around ``device_pool``: a non-empty tuple
    (``ValueError`` when the target does not declare the layout)."""
    reason = host_pool_skip_reason(target, spec.kind, spec.layout)
    if reason is not None:
        raise ValueError(reason)
    parts = target.make_host_pool(spec, device_pool, device=device)
    if not isinstance(parts, tuple) or not parts:
        raise ValueError(
            f"target {_name(target)!r}: make_host_pool returned {parts!r}, not a non-empty tuple"
        )
    return parts
