"""Allocators and host pools to check: :class:`kvcheck.tiers.AllocatorSpec` and
:class:`kvcheck.tiers.HostPoolSpec` values, inside a target's surface.

Example:
    >>> from hypothesis import find
    >>> find(allocator_specs(kinds=("paged",)), lambda spec: True)
    AllocatorSpec(kind='paged', size=2, page_size=2, size_swa=0, need_sort=False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.declaration import declaration_of
from kvcheck.geometry import row_bytes
from kvcheck.specs import PoolSpec
from kvcheck.steering import Steer, Steering
from kvcheck.strategies.limits import carrying_target, within_target_limits
from kvcheck.strategies.pools import pool_specs
from kvcheck.surface import surface_of
from kvcheck.tiers import (
    ALLOCATOR_KINDS,
    HOST_FAMILIES,
    HOST_IO_BACKENDS,
    AllocatorSpec,
    HostPoolSpec,
    allocator_page_sizes,
    host_layouts_for,
)
from kvcheck.validation import check_choices, check_type, check_valid_integer

__all__ = ["allocator_specs", "host_pool_specs"]


def allocator_specs(
    *,
    kinds: Sequence[str] = ALLOCATOR_KINDS,
    max_pages: int = 8,
    max_page_size: int = 4,
    target: object | None = None,
) -> st.SearchStrategy[AllocatorSpec]:
    """Small allocators of ``kinds`` (those the ``target``'s surface declares, when given), at
    each page size up to ``max_page_size`` SGLang builds the kind at
    (:data:`kvcheck.tiers.ALLOCATOR_PAGE_SIZES`; those the ``target``'s declaration narrows
    it to, when given): ``token`` and ``pure_swa`` at page size 1; ``paged`` at 2 and up;
    ``swa`` at 1 (token sides) or above (paged sides), its sliding-window side up to as large
    as its full side; 1 to ``max_pages`` pages a side, sometimes with ``need_sort``.
    Shrinks towards the first kind, page size 2 where the kind takes it (the smallest whole
    pages) else 1, one page, no ``need_sort``.

    Example:
        >>> from hypothesis import find
        >>> find(allocator_specs(kinds=("swa",)), lambda spec: spec.page_size > 1).size_swa
        2
    """
    chosen = check_choices(kinds, "kinds", ALLOCATOR_KINDS)
    check_valid_integer(max_pages, "max_pages", min_value=1)
    check_valid_integer(max_page_size, "max_page_size", min_value=2)
    page_sizes = {kind: allocator_page_sizes(kind, max_page_size=max_page_size) for kind in chosen}
    if target is not None:
        declared = surface_of(target).allocators
        chosen = tuple(kind for kind in chosen if kind in declared)
        if not chosen:
            raise InvalidArgument(
                f"target={getattr(target, 'name', target)!r} declares none of "
                f"kinds={tuple(kinds)!r}"
            )
        narrowed = declaration_of(target).allocator_page_sizes()
        for kind in chosen:
            if kind in narrowed:
                page_sizes[kind] = tuple(p for p in page_sizes[kind] if p in narrowed[kind][0])
        chosen = tuple(kind for kind in chosen if page_sizes[kind])
        if not chosen:
            raise InvalidArgument(
                f"target={getattr(target, 'name', target)!r} builds none of "
                f"kinds={tuple(kinds)!r} at a page size up to max_page_size={max_page_size}"
            )
    ordered = {kind: _whole_pages_first(page_sizes[kind]) for kind in chosen}
    specs = _allocator_specs(tuple(chosen), ordered, max_pages)
    return specs if target is None else carrying_target(target, specs)


def _whole_pages_first(page_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Page size 2 first where it is one of ``page_sizes``: the smallest whole pages, where a
    paged allocator's rounding shows, are what a failure shrinks to."""
    return (*(p for p in page_sizes if p == 2), *(p for p in page_sizes if p != 2))


@st.composite
def _allocator_specs(
    draw: st.DrawFn,
    kinds: tuple[str, ...],
    page_sizes: dict[str, tuple[int, ...]],
    max_pages: int,
) -> AllocatorSpec:
    kind = draw(st.sampled_from(kinds), label="allocator kind")
    offered = page_sizes[kind]
    page_size = (
        offered[0] if len(offered) == 1 else draw(st.sampled_from(offered), label="page_size")
    )
    pages = draw(st.integers(1, max_pages), label="pages")
    swa_pages = draw(st.integers(1, max_pages), label="swa pages") if kind == "swa" else 0
    need_sort = draw(st.booleans(), label="need_sort")
    return AllocatorSpec(
        kind=kind,
        size=pages * page_size,
        page_size=page_size,
        size_swa=swa_pages * page_size,
        need_sort=need_sort,
    )


def host_pool_specs(
    *,
    families: Sequence[str] = HOST_FAMILIES,
    max_host_pages: int = 4,
    max_layers: int = 3,
    max_size: int = 24,
    max_page_size: int = 4,
    kv_quants: Sequence[str] = ("none",),
    target: object | None = None,
    steer: Iterable[Steer] = (),
) -> st.SearchStrategy[HostPoolSpec]:
    """Host pools mirroring small token-major device pools of ``families`` (any variant
    :func:`kvcheck.strategies.pool_specs` draws of one decode-context-parallel rank, inside the
    ``target``'s surface), in a layout the pool and the target take, with an io backend the
    layout transfers with, and 1 to ``max_host_pages`` host pages. Families the target
    declares no host layout for are left out. ``kv_quants``: the quantized variants the
    device pools take (:func:`kvcheck.strategies.pool_specs`'s; default unquantized only:
    each quantized variant has a run of its own), whose scale buffers the host tier keeps
    too; a variant whose host tier the target builds in fewer layouts
    (:func:`kvcheck.targets.tier_support.host_variant_layouts`) is drawn in those only, and not at
    all where it builds none. ``steer``: what the target's findings ask to avoid
    (:class:`kvcheck.steering.Steer` values: a device pool's ``v_head_dim``, the host tier's
    ``host:few_pages`` and ``host:indexer_skip_layers``).
    Shrinks towards the first family's smallest pool, the first layout, one host page.

    Example:
        >>> from hypothesis import find
        >>> spec = find(host_pool_specs(families=("mla",)), lambda spec: True)
        >>> spec.layout, spec.io_backend, spec.host_pages
        ('layer_first', 'kernel', 1)
    """
    chosen = check_choices(families, "families", HOST_FAMILIES)
    check_valid_integer(max_host_pages, "max_host_pages", min_value=1)
    layouts: dict[str, tuple[str, ...]] = {}
    alignment = 1
    if target is not None:
        alignment = surface_of(target).host_kernel_alignment
        declared = surface_of(target).host_layouts
        chosen = tuple(family for family in chosen if family in declared)
        layouts = dict(declared)
        if not chosen:
            raise InvalidArgument(
                f"target={getattr(target, 'name', target)!r} declares no host pool for "
                f"families={tuple(families)!r}"
            )
    devices = pool_specs(
        families=chosen,
        max_layers=max_layers,
        max_size=max_size,
        max_page_size=max_page_size,
        dcp_sizes=(1,),
        kv_quants=kv_quants,
    ).map(lambda spec: dataclasses.replace(spec, kv_layout="nhd"))
    variant_layouts: dict[str, tuple[str, ...]] = {}
    if target is not None:
        devices = within_target_limits(target, devices)
        narrowed = declaration_of(target).host_variant_layouts()
        variant_layouts = {variant: layouts for variant, (layouts, _) in narrowed.items()}
        devices = devices.filter(lambda spec: variant_layouts.get(spec.variant, (None,)) != ())
    specs = _host_pool_specs(
        devices,
        layouts,
        max_host_pages,
        alignment,
        steer=Steering(steer),
        variant_layouts=variant_layouts,
    )
    return specs if target is None else carrying_target(target, specs)


@st.composite
def _host_pool_specs(
    draw: st.DrawFn,
    devices: st.SearchStrategy[PoolSpec],
    layouts: dict[str, tuple[str, ...]],
    max_host_pages: int,
    alignment: int = 1,
    *,
    steer: Steering,
    variant_layouts: dict[str, tuple[str, ...]] | None = None,
) -> HostPoolSpec:
    device = check_type(PoolSpec, draw(devices, label="device pool"), "device")
    if device.family == "dsa" and device.skip_topk_layers and all(device.skip_topk_layers):
        # A DSA pool whose every layer skips top-k holds no index keys, and SGLang builds
        # no index-K host pool for it (DSATokenToKVPool.host_pool_decls): one layer keeps them.
        device = dataclasses.replace(device, skip_topk_layers=(False, *device.skip_topk_layers[1:]))
    skips = device.skip_topk_layers if device.family == "dsa" else None
    if skips and steer.avoids("host:indexer_skip_layers", family="dsa"):
        # Steered: the target's finding on index-K host pools over skip-topk layers; every
        # layer keeps its index keys.
        device = dataclasses.replace(device, skip_topk_layers=tuple(False for _ in skips))
    if steer.avoids("v_head_dim", variant=device.variant) and device.v_head_dim is not None:
        # Steered: the target's finding on V head dims of the variant's own; the symmetric
        # pool.
        device = dataclasses.replace(device, v_head_dim=None)
    asymmetric = device.family == "mha" and device.effective_v_head_dim != device.head_dim
    if asymmetric and (variant_layouts or {}).get(f"{device.variant}:asymmetric") == ():
        # The target builds no host tier for this variant with a V head dim of its own:
        # the symmetric pool.
        device = dataclasses.replace(device, v_head_dim=None)
    offered = host_layouts_for(device)
    if device.family in layouts:
        offered = tuple(layout for layout in offered if layout in layouts[device.family])
    narrowed = (variant_layouts or {}).get(device.variant)
    if narrowed is not None:
        offered = tuple(layout for layout in offered if layout in narrowed)
    if not offered:
        # An asymmetric MHA pool on a target without its layouts: the symmetric pool.
        device = dataclasses.replace(device, v_head_dim=None)
        offered = tuple(
            layout for layout in host_layouts_for(device) if layout in layouts.get("mha", ())
        )
    backends = {layout: HOST_IO_BACKENDS[layout] for layout in offered}
    if any(size % alignment for size in row_bytes(device) if size):
        # The target's kernel transfers take no such row (SGLang: item_size % 8): the
        # layouts that transfer it another way.
        backends = {
            layout: tuple(io for io in ios if io != "kernel")
            for layout, ios in backends.items()
            if any(io != "kernel" for io in ios)
        } or backends
    layout = draw(st.sampled_from(tuple(backends)), label="host layout")
    io_backend = draw(st.sampled_from(backends[layout]), label="io backend")
    fewest = 1
    if (layout, device.family) in (
        ("page_first_direct", "mla"),
        ("page_first_direct", "dsa"),
        ("page_first_direct", "mha"),  # sglang 0.5.22's MHA host (finding B2)
        ("page_head", "mha"),
    ) and steer.avoids("host:few_pages", where="page_major"):
        fewest = min(device.layer_num, max_host_pages)
    pages = draw(st.integers(fewest, max_host_pages), label="host pages")
    return HostPoolSpec(device=device, layout=layout, io_backend=io_backend, host_pages=pages)
