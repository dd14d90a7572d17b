"""The two tiers around a device pool, as plain data: the allocators that hand out its slots
and the host pools that keep copies of its pages.

SGLang's server takes a request's slot ids from a token allocator
(``srt/mem_cache/allocator/``: ``token`` for page size 1, ``paged`` above it, ``swa`` for
sliding-window models: a full side and a sliding-window side) and backs pages up to a host
pool (``srt/mem_cache/pool_host/``) for hierarchical caching, from which it loads them back.
:class:`AllocatorSpec` and :class:`HostPoolSpec` describe one of each; a target builds them
(``make_allocator``, ``make_host_pool``) for the kinds and layouts its surface declares
(:meth:`kvcheck.surface.Surface.with_tiers`). Data only, like :mod:`kvcheck.specs`.

Example:
    >>> AllocatorSpec(kind="paged", size=16, page_size=4).num_pages
    4
    >>> from kvcheck.specs import PoolSpec
    >>> device = PoolSpec(family="mla", size=8, page_size=4, layer_num=2, dtype="bfloat16")
    >>> host = HostPoolSpec(device=device, layout="page_first", io_backend="kernel", host_pages=3)
    >>> host.host_size, host.kind
    (12, 'mla')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvcheck.specs import PoolSpec

__all__ = [
    "ALLOCATOR_KINDS",
    "ALLOCATOR_PAGE_SIZES",
    "HOST_FAMILIES",
    "HOST_IO_BACKENDS",
    "HOST_LAYOUTS",
    "AllocatorSpec",
    "HostPoolSpec",
    "allocator_page_sizes",
    "host_layouts_for",
    "host_layouts_refused",
    "unchecked_host_pool_spec",
]

#: The allocators SGLang builds: page size 1, pages, sliding-window (two sides) and pure
#: sliding-window (every layer sliding-window: one pool, page size 1).
ALLOCATOR_KINDS: tuple[str, ...] = ("token", "paged", "swa", "pure_swa")
#: The page sizes SGLang builds each allocator kind at, as ``(least, most)`` (None: no bound),
#: as its configurator picks them (``srt/mem_cache/kv_cache_configurator.py``,
#: ``_build_token_to_kv_pool_allocator``): ``token`` at 1 only (its constructor passes 1);
#: ``paged`` at 2 and up (``--page-size 1`` gets the token allocator, and with decode context
#: parallelism the paged one at ``page_size * dcp_size``); ``swa`` at any (token sides at 1,
#: paged sides above); ``pure_swa`` at 1 only (its constructor asserts it).
ALLOCATOR_PAGE_SIZES: Mapping[str, tuple[int, int | None]] = MappingProxyType(
    {"token": (1, 1), "paged": (2, None), "swa": (1, None), "pure_swa": (1, 1)}
)

#: Host layouts, by the family of the device pool a host pool mirrors (SGLang 0.5.23's
#: ``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``; a DSA model's host tier is an MLA host
#: for the latent rows plus an indexer host for the index-K pages, in the MLA layouts).
HOST_LAYOUTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mha": ("layer_first", "page_first", "page_first_direct", "page_head"),
        "mla": ("layer_first", "page_first", "page_first_direct"),
        "dsa": ("layer_first", "page_first", "page_first_direct"),
    }
)
#: Families that have a host pool (the no-op pool holds nothing to back up).
HOST_FAMILIES: tuple[str, ...] = tuple(HOST_LAYOUTS)
#: The io backends each host layout transfers with (SGLang normalises any other pair).
HOST_IO_BACKENDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "layer_first": ("kernel", "direct"),
        "page_first": ("kernel",),
        "page_first_direct": ("direct",),
        "page_head": ("kernel",),
    }
)
#: An MHA pool whose V head dim differs from K's keeps K and V in two host buffers, in the
#: page-first layouts only (SGLang's ``AsymmetricMHATokenToKVPoolHost``).
ASYMMETRIC_MHA_LAYOUTS: tuple[str, ...] = ("page_first", "page_first_direct")


def _positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return value


@dataclass(frozen=True)
class AllocatorSpec:
    """One token-to-KV allocator.

    ``size`` is the token capacity (for ``swa``, the full side's); the allocator hands out
    slots ``1 .. size + page_size - 1`` (slot 0, page 0 for a paged allocator, is SGLang's
    padding page and is never handed out). ``token`` takes ``page_size=1``; ``paged`` and
    ``swa`` take whole pages (``size`` a multiple of ``page_size``), ``paged`` of 2 slots and
    up (:data:`ALLOCATOR_PAGE_SIZES`: what SGLang builds each kind at); ``swa`` at page size 1
    uses token sides (``alloc`` only), above it paged sides (``alloc_extend`` /
    ``alloc_decode``). ``size_swa`` is the sliding-window side's capacity (``swa`` only).
    ``pure_swa`` (a model whose every layer is sliding-window) takes ``page_size=1``: its one
    pool of ``size`` slots serves as both sides.
    ``need_sort`` defers freed pages to a sorted merge (SGLang: PD disaggregation).

    Example:
        >>> AllocatorSpec(kind="token", size=4, page_size=2)
        Traceback (most recent call last):
        ...
        ValueError: kind='token' takes page_size=1, got page_size=2
    """

    kind: str
    size: int
    page_size: int
    size_swa: int = 0
    need_sort: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ALLOCATOR_KINDS:
            raise ValueError(f"kind={self.kind!r} not in {ALLOCATOR_KINDS}")
        _positive_int(self.size, "size")
        _positive_int(self.page_size, "page_size")
        if self.page_size not in allocator_page_sizes(self.kind, max_page_size=self.page_size):
            raise ValueError(
                f"kind={self.kind!r} takes {_describe_page_sizes(self.kind)}, "
                f"got page_size={self.page_size}"
            )
        if self.size % self.page_size:
            raise ValueError(f"size={self.size} must be whole pages of page_size={self.page_size}")
        if self.kind == "swa":
            _positive_int(self.size_swa, "size_swa")
            if self.size_swa % self.page_size:
                raise ValueError(
                    f"size_swa={self.size_swa} must be whole pages of page_size={self.page_size}"
                )
        elif self.size_swa:
            raise ValueError(f"size_swa={self.size_swa} needs kind='swa', got {self.kind!r}")
        if not isinstance(self.need_sort, bool):
            raise ValueError(f"need_sort={self.need_sort!r} must be a bool")

    @property
    def num_pages(self) -> int:
        """Pages the (full side's) allocator hands out: ``size // page_size``."""
        return self.size // self.page_size

    @property
    def paged(self) -> bool:
        """Whether the allocator takes ``alloc_extend`` / ``alloc_decode`` (page size > 1)."""
        return self.page_size > 1


@dataclass(frozen=True)
class HostPoolSpec:
    """A host pool mirroring the device pool ``device`` (an MHA, MLA or DSA pool of one
    rank, token-major): ``host_pages`` pages of ``device.page_size`` host slots, in
    ``layout``, transferred with ``io_backend`` (a pair of :data:`HOST_IO_BACKENDS`).

    Example:
        >>> device = PoolSpec(family="mha", size=8, page_size=2, layer_num=1,
        ...                   dtype="float16", head_dim=4, v_head_dim=8)
        >>> HostPoolSpec(device=device, layout="layer_first", io_backend="kernel", host_pages=2)
        Traceback (most recent call last):
        ...
        ValueError: layout='layer_first' not in ('page_first', 'page_first_direct') for an mha \
device pool with v_head_dim != head_dim
    """

    device: PoolSpec
    layout: str
    io_backend: str
    host_pages: int

    def __post_init__(self) -> None:
        if not isinstance(self.device, PoolSpec):
            raise ValueError(f"device={self.device!r} is not a kvcheck.specs.PoolSpec")
        if self.device.family not in HOST_LAYOUTS:
            raise ValueError(
                f"device.family={self.device.family!r} has no host pool; families: "
                f"{', '.join(HOST_FAMILIES)}"
            )
        if self.device.kv_layout != "nhd" or self.device.dcp_size != 1:
            raise ValueError(
                f"a host pool mirrors a token-major pool of one rank, got "
                f"kv_layout={self.device.kv_layout!r}, dcp_size={self.device.dcp_size}"
            )
        layouts = host_layouts_for(self.device)
        if self.layout not in layouts:
            raise ValueError(f"layout={self.layout!r} not in {layouts} for {self._describe()}")
        backends = HOST_IO_BACKENDS[self.layout]
        if self.io_backend not in backends:
            raise ValueError(
                f"io_backend={self.io_backend!r} not in {backends} for layout={self.layout!r}"
            )
        _positive_int(self.host_pages, "host_pages")

    def _describe(self) -> str:
        if self.asymmetric:
            return "an mha device pool with v_head_dim != head_dim"
        return f"a {self.device.family} device pool"

    @property
    def kind(self) -> str:
        """The device pool's family (``mha``, ``mla``, ``dsa``): which host pools mirror it."""
        return self.device.family

    @property
    def asymmetric(self) -> bool:
        """An MHA pool whose V head dim differs from K's (two host buffers)."""
        return self.device.family == "mha" and (
            self.device.effective_v_head_dim != self.device.head_dim
        )

    @property
    def page_size(self) -> int:
        """Host slots per page: the device pool's page size."""
        return self.device.page_size

    @property
    def host_size(self) -> int:
        """Host slots (SGLang's ``host_token_capacity``): ``host_pages * page_size``."""
        return self.host_pages * self.device.page_size


def allocator_page_sizes(kind: str, *, max_page_size: int) -> tuple[int, ...]:
    """The page sizes up to ``max_page_size`` that SGLang builds allocators of ``kind`` at
    (:data:`ALLOCATOR_PAGE_SIZES`), smallest first.

    Example:
        >>> allocator_page_sizes("paged", max_page_size=4)
        (2, 3, 4)
        >>> allocator_page_sizes("swa", max_page_size=2)
        (1, 2)
    """
    if kind not in ALLOCATOR_PAGE_SIZES:
        raise ValueError(f"kind={kind!r} not in {ALLOCATOR_KINDS}")
    _positive_int(max_page_size, "max_page_size")
    least, most = ALLOCATOR_PAGE_SIZES[kind]
    top = max_page_size if most is None else min(most, max_page_size)
    return tuple(range(least, top + 1))


def _describe_page_sizes(kind: str) -> str:
    least, most = ALLOCATOR_PAGE_SIZES[kind]
    if least == most:
        return f"page_size={least}"
    return f"page_size >= {least}" if most is None else f"page_size {least} to {most}"


def host_layouts_for(device: PoolSpec) -> tuple[str, ...]:
    """The host layouts a host pool mirroring ``device`` takes.

    Example:
        >>> host_layouts_for(PoolSpec(family="dsa", size=4, page_size=2, layer_num=1,
        ...                           dtype="bfloat16"))
        ('layer_first', 'page_first', 'page_first_direct')
    """
    layouts = HOST_LAYOUTS.get(device.family, ())
    if device.family == "mha" and device.effective_v_head_dim != device.head_dim:
        return tuple(layout for layout in layouts if layout in ASYMMETRIC_MHA_LAYOUTS)
    return layouts


#: A layout name no host pool takes, asked of every family by the refusal checks.
FOREIGN_HOST_LAYOUT = "layer_last"


def host_layouts_refused(device: PoolSpec) -> tuple[str, ...]:
    """The host layouts a host pool mirroring ``device`` must refuse: every layout of
    :data:`HOST_LAYOUTS` it does not take, then one no host pool takes.

    Example:
        >>> host_layouts_refused(PoolSpec(family="mla", size=4, page_size=2, layer_num=1,
        ...                               dtype="bfloat16"))
        ('page_head', 'layer_last')
    """
    taken = host_layouts_for(device)
    known = dict.fromkeys(layout for layouts in HOST_LAYOUTS.values() for layout in layouts)
    return (*(layout for layout in known if layout not in taken), FOREIGN_HOST_LAYOUT)


def unchecked_host_pool_spec(
    device: PoolSpec, layout: str, io_backend: str, host_pages: int
) -> HostPoolSpec:
    """A :class:`HostPoolSpec` built without its checks, for refusal checks only: it hands a
    target a layout (or io backend) the target must refuse at construction.

    Example:
        >>> device = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> unchecked_host_pool_spec(device, "page_head", "kernel", 1).layout
        'page_head'
    """
    spec = object.__new__(HostPoolSpec)
    for name, value in (
        ("device", device),
        ("layout", layout),
        ("io_backend", io_backend),
        ("host_pages", host_pages),
    ):
        object.__setattr__(spec, name, value)  # frozen: skip __post_init__'s checks on purpose
    return spec
