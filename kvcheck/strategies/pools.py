"""Pool shapes: dtypes, page sizes, DSA skip masks, whole pool specs and token slots.

Every strategy takes keyword-only arguments (the spec it draws for, where there is one,
is positional), validates them with :mod:`kvcheck.validation` and says what its examples
shrink towards. :func:`pool_specs` draws inside a target's surface when
given ``target=`` (:mod:`kvcheck.strategies.limits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.specs import (
    DCP_SIZES,
    DTYPE_ITEMSIZE,
    FP4_DTYPE,
    FP8_DTYPES,
    INDEX_KPOOLS,
    KV_LAYOUTS,
    KV_QUANTS,
    LATENT_LAYOUTS,
    MHA_KV_QUANTS,
    MLA_KV_QUANTS,
    MXFP8_INTERLEAVED_PAGE,
    NVFP4_LAYOUTS,
    POOL_FAMILIES,
    QUANT_DTYPES,
    SCALED_LATENT_DTYPE,
    SWA_FAMILIES,
    PoolSpec,
    SWAPoolSpec,
)
from kvcheck.strategies.limits import carrying_target, within_target_limits
from kvcheck.validation import (
    check_bool,
    check_choices,
    check_one_of,
    check_type,
    check_valid_integer,
    check_valid_interval,
)

__all__ = [
    "dtypes",
    "layer_masks",
    "page_sizes",
    "pool_specs",
    "swa_pool_specs",
    "token_locations",
]

#: dtype names in shrink order: the most common serving dtype first.
_DTYPE_ORDER: tuple[str, ...] = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
#: Which dtypes each family's pool accepts (today every family accepts all of them).
_FAMILY_DTYPES: dict[str, frozenset[str]] = {
    family: frozenset(_DTYPE_ORDER) for family in POOL_FAMILIES
}
#: DSA index keys are 128 channels wide everywhere SGLang runs them.
INDEX_HEAD_DIM = 128

# --- dtypes, page sizes, layer masks ---------------------------------------------------------


def dtypes(
    *, families: Sequence[str] | None = None, include_fp8: bool = True
) -> st.SearchStrategy[str]:
    """torch dtype names (``"bfloat16"``, ``"float8_e4m3fn"``, ...) that all ``families`` accept.

    ``families=None`` means all of :data:`kvcheck.specs.POOL_FAMILIES`. fp8 names are stored
    as uint8 by the pools; ``include_fp8=False`` leaves them out. Shrinks towards
    ``"bfloat16"``, then ``"float16"``, ``"float32"`` and the fp8 names.

    Example:
        >>> from hypothesis import find
        >>> find(dtypes(include_fp8=False), lambda name: True)
        'bfloat16'
        >>> find(dtypes(families=("dsa",)), lambda name: name.startswith("float8"))
        'float8_e4m3fn'
    """
    chosen = (
        POOL_FAMILIES if families is None else check_choices(families, "families", POOL_FAMILIES)
    )
    check_bool(include_fp8, "include_fp8")
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

    Example:
        >>> from hypothesis import find
        >>> find(page_sizes(family="dsa", min_page_size=3, max_page_size=64), lambda size: True)
        4
        >>> find(page_sizes(family="dsa", max_page_size=64), lambda size: size > 16)
        32
    """
    if family is not None:
        check_one_of(family, "family", POOL_FAMILIES)
    check_valid_integer(min_page_size, "min_page_size", min_value=1)
    check_valid_integer(max_page_size, "max_page_size", min_value=1)
    check_valid_interval(min_page_size, max_page_size, "min_page_size", "max_page_size")
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

    Example:
        >>> from hypothesis import find
        >>> find(layer_masks(layers=4), lambda mask: True)
        (False, False, False, False)
        >>> find(layer_masks(min_layers=2), lambda mask: any(mask))
        (True, True)
    """
    if layers is not None:
        check_valid_integer(layers, "layers", min_value=1)
        if min_layers is not None or max_layers is not None:
            raise InvalidArgument(
                f"Cannot pass layers={layers!r} together with min_layers={min_layers!r} "
                f"or max_layers={max_layers!r}"
            )
        return _layer_masks(layers, layers)
    low = 1 if min_layers is None else min_layers
    high = 8 if max_layers is None else max_layers
    check_valid_integer(low, "min_layers", min_value=1)
    check_valid_integer(high, "max_layers", min_value=1)
    check_valid_interval(low, high, "min_layers", "max_layers")
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
    kpools: tuple[int, ...],
    dcp_sizes: tuple[int, ...],
    quants: tuple[str, ...] = ("none",),
) -> PoolSpec:
    family = draw(st.sampled_from(families))
    quant = draw(_kv_quants(family, quants, dtype_names))
    if quant != "none":
        return draw(_quantized_specs(family, quant, dtype_names, max_layers, max_start_layer))
    dtype = draw(st.sampled_from(dtype_names))
    layer_num = draw(st.integers(1, max_layers))
    page_size = draw(page_sizes(family=family, max_page_size=min(max_page_size, max_size)))
    if family == "dsa" and 1 not in kpools:
        # Only pooled kpools: the page must hold at least one group of tokens.
        page_size = max(page_size, min(kpools))
    # Capacities are whole pages, as a scheduler hands them out; that also keeps every
    # token's DSA index page inside the index buffer. The other pools take any capacity
    # (a fused MHA allocation pads it to whole pages), so they sometimes get one.
    size = page_size * draw(st.integers(1, max_size // page_size))
    if family != "dsa" and page_size > 1:
        size -= draw(st.integers(0, page_size - 1), label="tokens short of whole pages")
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
        heads = {
            "head_num": draw(st.integers(1, 2)),
            "head_dim": draw(st.integers(1, 8)),
            "v_head_dim": draw(st.none() | st.integers(1, 8)),
        }
        # The head-major layout takes whole pages only (and MHA pools only).
        layouts = KV_LAYOUTS if family == "mha" and size % page_size == 0 else ("nhd",)
        return PoolSpec(**common, **heads, kv_layout=draw(st.sampled_from(layouts)))
    # SGLang 0.5.23's scaled fp8 latent row: fp8 e4m3 DSA pools only, whole blocks of 128
    # nope values and the rope widths its quantizer takes (64, or none).
    scaled_ok = family == "dsa" and dtype == SCALED_LATENT_DTYPE
    layout = draw(st.sampled_from(LATENT_LAYOUTS if scaled_ok else ("raw",)), label="latent")
    if layout == "scaled":
        latent: dict[str, Any] = {
            "kv_lora_rank": draw(st.sampled_from((128, 256))),
            "qk_rope_head_dim": draw(st.sampled_from((64, 0))),
            "latent_layout": layout,
        }
    else:
        latent = {
            "kv_lora_rank": draw(st.integers(1, 8)),
            "qk_rope_head_dim": draw(st.integers(1, 4)),
        }
    if family == "mla":
        dcp = draw(_dcp_fields(dcp_sizes))
        if dcp:
            common["size"] = -(-size // page_size) * page_size  # DCP takes whole pages
        return PoolSpec(**common, **latent, **dcp)
    extra_pages = draw(st.none() | st.integers(0, 2))
    kpool = draw(_index_kpools(page_size, kpools))
    skip_topk_layers = draw(layer_masks(layers=layer_num))
    dcp = draw(_dcp_fields(dcp_sizes))
    spec = PoolSpec(
        **common,
        **latent,
        **kpool,
        index_head_dim=INDEX_HEAD_DIM,
        skip_topk_layers=skip_topk_layers,
        **dcp,
    )
    if extra_pages is None:
        return spec
    # A page or two beyond SGLang's default index buffer (widened under DCP).
    extra = spec.effective_index_buf_size + extra_pages * page_size
    return dataclasses.replace(spec, index_buf_size=extra)


#: False three times in four; shrinks to False.
_QUARTER = (False, False, False, True)


def _family_quants(family: str, quants: tuple[str, ...], dtype_names: tuple[str, ...]) -> list[str]:
    """The quantized variants of ``quants`` that ``family`` has and ``dtype_names`` allows."""
    known = {"mha": MHA_KV_QUANTS, "mla": MLA_KV_QUANTS}.get(family, ("none",))
    return [
        quant
        for quant in known
        if quant in quants
        and (quant == "none" or set(QUANT_DTYPES[quant]) & (set(dtype_names) | {FP4_DTYPE}))
    ]


@st.composite
def _kv_quants(
    draw: Callable[..., Any], family: str, quants: tuple[str, ...], dtype_names: tuple[str, ...]
) -> str:
    """A quantized variant of ``family`` among ``quants``: "none" when that is the only
    one (nothing is drawn, so specs draw as before quantized pools existed), else any
    (shrinking to the first: "none" where it is one)."""
    choices = _family_quants(family, quants, dtype_names)
    if choices in ([], ["none"]):
        return "none"
    return str(draw(st.sampled_from(choices), label="kv_quant"))


@st.composite
def _quantized_specs(
    draw: Callable[..., Any],
    family: str,
    quant: str,
    dtype_names: tuple[str, ...],
    max_layers: int,
    max_start_layer: int,
) -> PoolSpec:
    """A small pool of quantized variant ``quant``, in shapes its blocks fit: MXFP8 on
    128-token pages (head dims 128: FA4's store kernel) or on pages of 1-4 tokens (head
    dims 32 or 64); FP4 head dims whose rows split into blocks of 16 (NVFP4 with native
    scales: 64, pages of 4 or 8); MLA FP4 ranks of 16 or 32 with a 16-value rope part.
    V head dims of their own where the variant allows one."""
    dtypes = [d for d in QUANT_DTYPES[quant] if d in dtype_names or d == FP4_DTYPE]
    common: dict[str, Any] = {
        "family": family,
        "kv_quant": quant,
        "dtype": draw(st.sampled_from(dtypes)),
        "layer_num": draw(st.integers(1, max_layers)),
        "start_layer": draw(st.integers(0, max_start_layer)),
    }
    page_size = draw(st.integers(1, 4))
    if family == "mla":
        return PoolSpec(
            **common,
            page_size=page_size,
            size=page_size * draw(st.integers(1, 3)),
            kv_lora_rank=draw(st.sampled_from((16, 32))),
            qk_rope_head_dim=16,
        )
    heads = draw(st.integers(1, 2))
    layout = NVFP4_LAYOUTS[0]
    dims: tuple[int, ...]
    if quant == "mxfp8" and draw(st.booleans(), label="interleaved scales"):
        page_size, dims = MXFP8_INTERLEAVED_PAGE, (128,)
    elif quant == "mxfp8":
        dims = (32, 64)
    elif quant == "nvfp4":
        layout = draw(st.sampled_from(NVFP4_LAYOUTS), label="nvfp4_layout")
        native = "native" in layout or layout.startswith("both")
        dims = (64,) if native else (16, 32)
        if native:
            page_size = draw(st.sampled_from((4, 8)))
    elif quant == "fp4_mx_block16":
        dims = (16, 32) if heads == 1 else (8, 16, 32)
    else:
        dims = tuple(range(1, 9))
    head_dim = draw(st.sampled_from(dims))
    v_head_dim = draw(st.none() | st.sampled_from(dims), label="v_head_dim")
    pages = 1 if page_size == MXFP8_INTERLEAVED_PAGE else draw(st.integers(1, 3))
    size = page_size * pages
    whole = page_size == MXFP8_INTERLEAVED_PAGE or "native" in _nvfp4(layout)
    if not whole and page_size > 1:
        size -= draw(st.integers(0, page_size - 1), label="tokens short of whole pages")
    extra: dict[str, Any] = {"nvfp4_layout": layout} if quant == "nvfp4" else {}
    if quant == "fp8_scaled" and size % page_size == 0:
        extra["kv_layout"] = draw(st.sampled_from(KV_LAYOUTS))
    return PoolSpec(
        **common,
        page_size=page_size,
        size=size,
        head_num=heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        **extra,
    )


def _nvfp4(layout: str) -> tuple[str, ...]:
    scales = layout.removesuffix("+dq")
    return ("linear", "native") if scales == "both" else (scales,)


@st.composite
def _dcp_fields(draw: Callable[..., Any], dcp_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Decode context parallel: none (the shrink target) or, in about a quarter of the
    examples, one of the widths above 1 in ``dcp_sizes`` at any rank (always, without 1
    in ``dcp_sizes``). Nothing is drawn when ``dcp_sizes`` has no width above 1, so such
    specs draw as before DCP existed."""
    wide = tuple(size for size in dcp_sizes if size > 1)
    if not wide:
        return {}
    if 1 in dcp_sizes and not draw(st.sampled_from(_QUARTER), label="decode context parallel"):
        return {}
    dcp_size = draw(st.sampled_from(wide), label="dcp_size")
    return {"dcp_size": dcp_size, "dcp_rank": draw(st.integers(0, dcp_size - 1), label="rank")}


@st.composite
def _index_kpools(
    draw: Callable[..., Any], page_size: int, kpools: tuple[int, ...]
) -> dict[str, Any]:
    """The DSA index kpool fields: kpool 1 (nothing else; the shrink target), or, more
    often, one of ``kpools`` above 1 dividing ``page_size``, two in three of those with
    per-request compress tails (most of the variant's code)."""
    pooled = [k for k in kpools if k > 1 and page_size % k == 0]
    # Each pooled kpool twice: a page that allows one draws it in two examples of three.
    first = 0 if 1 in kpools or not pooled else 1
    choice = draw(st.integers(first, 2 * len(pooled)), label="kpool")
    if choice == 0:
        return {}
    kpool = pooled[(choice - 1) % len(pooled)]
    if not draw(st.sampled_from((False, True, True)), label="compress tails"):
        return {"index_kpool": kpool}
    return {
        "index_kpool": kpool,
        "index_kpool_compress": True,
        "max_running_requests": draw(st.integers(0, 3), label="max_running_requests"),
        "tail_extra_slots": draw(st.integers(0, 2), label="tail_extra_slots"),
    }


def pool_specs(
    *,
    families: Sequence[str] = POOL_FAMILIES,
    dtype_names: Sequence[str] | None = None,
    max_layers: int = 4,
    max_size: int = 64,
    max_page_size: int = 8,
    max_start_layer: int = 3,
    index_kpools: Sequence[int] = INDEX_KPOOLS,
    dcp_sizes: Sequence[int] = DCP_SIZES,
    kv_quants: Sequence[str] = ("none",),
    target: object | None = None,
) -> st.SearchStrategy[PoolSpec]:
    """Small :class:`~kvcheck.specs.PoolSpec` values for any of ``families``.

    ``dtype_names=None`` means every dtype the chosen families accept. ``size`` is up to
    ``max_size`` tokens: whole pages for DSA, sometimes a partial last page for the other
    families (shrinking to whole pages); MHA specs of whole pages may take the head-major
    ``kv_layout="hnd"`` (shrinking to ``"nhd"``); DSA specs take an ``index_kpool`` of
    ``index_kpools`` (default 1, 2 and 4): above 1 (dividing the page size) in about two
    examples of three where the page allows, two in three of those with compress tails for
    up to 4 requests (shrinking to kpool 1; without 1 in ``index_kpools``, pages of at
    least the smallest kpool); MLA and DSA specs run decode context parallel in about a
    quarter of the examples (every one without 1 in ``dcp_sizes``), at a width of
    ``dcp_sizes`` above 1 (default 2 and 4) and any rank, with whole pages (shrinking to
    ``dcp_size=1``); MHA and MLA specs take a quantized variant of ``kv_quants`` (default
    "none" only: each quantized variant has a machine run of its own), in small shapes its
    blocks fit (:data:`kvcheck.specs.KV_QUANTS`; the quantized dtype it needs, shrinking to
    "none" where that is one of them); float8_e4m3fn DSA specs may take
    SGLang's scaled latent row, ``latent_layout="scaled"`` with ``kv_lora_rank`` 128 or
    256 and ``qk_rope_head_dim`` 64 or 0 (shrinking to ``"raw"``); ``page_size`` is at most
    ``min(max_page_size, max_size)`` (powers of two for DSA). MHA/NoOp specs may carry a
    V head dim of their own; any family may start at a global layer above 0; DSA specs carry
    a skip mask from :func:`layer_masks`, ``index_head_dim=128`` and sometimes an
    ``index_buf_size`` a page or two larger than ``size``. Shapes stay tiny so tests run
    fast. Shrinks towards the first family, bfloat16, one layer, page_size=1, one page,
    start_layer=0, one head of dim 1, no separate V head dim and a mask without skips.

    ``target`` (a :class:`kvcheck.targets.Target`, e.g. the suite's ``kvcheck_target``)
    moves every spec inside the target's surface (:mod:`kvcheck.surface`), which wins over
    ``max_size`` and ``max_page_size``; see
    :func:`kvcheck.strategies.limits.within_target_limits`. None (or a target without
    limits) draws the specs unchanged.

    Example:
        >>> from types import SimpleNamespace
        >>> from hypothesis import find
        >>> spec = find(pool_specs(families=("mha",), max_layers=2), lambda s: s.layer_num == 2)
        >>> spec.family, spec.layer_num, 1 <= spec.size <= 32
        ('mha', 2, True)
        >>> from kvcheck.surface import Surface
        >>> target = SimpleNamespace(name="t", surface=Surface.of(dsa={"page_size": (64,)}))
        >>> spec = find(pool_specs(families=("dsa",), target=target), lambda s: True)
        >>> spec.page_size, spec.size
        (64, 64)
    """
    chosen = check_choices(families, "families", POOL_FAMILIES)
    if dtype_names is None:
        accepted = frozenset.intersection(*(_FAMILY_DTYPES[family] for family in chosen))
        names = tuple(name for name in _DTYPE_ORDER if name in accepted)
    else:
        names = check_choices(dtype_names, "dtype_names", tuple(DTYPE_ITEMSIZE))
    check_valid_integer(max_layers, "max_layers", min_value=1)
    check_valid_integer(max_size, "max_size", min_value=1)
    check_valid_integer(max_page_size, "max_page_size", min_value=1)
    check_valid_integer(max_start_layer, "max_start_layer", min_value=0)
    kpools = check_choices(index_kpools, "index_kpools", INDEX_KPOOLS)
    widths = check_choices(dcp_sizes, "dcp_sizes", DCP_SIZES)
    quants = check_choices(kv_quants, "kv_quants", KV_QUANTS)
    specs = _pool_specs(
        chosen,
        names,
        max_layers,
        max_size,
        max_page_size,
        max_start_layer,
        tuple(kpools),
        tuple(widths),
        tuple(quants),
    )
    if target is None:
        return specs
    # Both are built by this call (composites), so they may carry the target.
    return carrying_target(target, within_target_limits(target, specs))


def token_locations(
    spec: PoolSpec, *, min_size: int = 0, max_size: int | None = None, unique: bool = True
) -> st.SearchStrategy[tuple[int, ...]]:
    """Token slots inside ``spec``'s buffers, ``[0, size + page_size)`` (padding page included).

    ``max_size=None`` means ``spec.num_slots``. With ``unique=True`` (as writes and move
    targets need) no slot repeats, so ``min_size`` may not exceed ``spec.num_slots``.
    Shrinks towards ``min_size`` copies of the lowest slots.

    Example:
        >>> from hypothesis import find
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> find(token_locations(spec, min_size=2), lambda locs: True)
        (0, 1)
        >>> find(token_locations(spec, unique=False), lambda locs: max(locs, default=0) == 5)
        (5,)
    """
    check_type(PoolSpec, spec, "spec", what="a kvcheck.specs.PoolSpec")
    check_valid_integer(min_size, "min_size", min_value=0)
    check_bool(unique, "unique")
    high = spec.num_slots if max_size is None else max_size
    check_valid_integer(high, "max_size", min_value=0)
    check_valid_interval(min_size, high, "min_size", "max_size")
    if unique and min_size > spec.num_slots:
        raise InvalidArgument(
            f"Cannot draw min_size={min_size!r} unique locations from "
            f"spec.num_slots={spec.num_slots!r} slots"
        )
    slots = st.integers(0, spec.num_slots - 1)
    return st.lists(slots, min_size=min_size, max_size=high, unique=unique).map(tuple)


# --- sliding-window hybrids ------------------------------------------------------------------


@st.composite
def _swa_pool_specs(
    draw: Callable[..., Any],
    families: tuple[str, ...],
    page_sizes: tuple[int, ...],
    max_layers: int,
) -> SWAPoolSpec:
    family = draw(st.sampled_from(families))
    page_size = draw(st.sampled_from(page_sizes))
    full_pages = draw(st.integers(2, 6))
    # Two window pages at least, so that one can leave the window while a request lives.
    swa_pages = draw(st.integers(2, full_pages))
    layers = draw(st.integers(2, max_layers))
    # One full layer and one window layer at least; the rest either way.
    rest = draw(st.lists(st.booleans(), min_size=layers - 2, max_size=layers - 2))
    mask = draw(st.permutations([False, True, *rest]))
    sub = PoolSpec(
        family=family,  # type: ignore[arg-type]
        size=full_pages * page_size,
        page_size=page_size,
        layer_num=layers,
        dtype="bfloat16",
        head_num=draw(st.integers(1, 2)),
        head_dim=draw(st.sampled_from((2, 4))),
        kv_lora_rank=4,
        qk_rope_head_dim=2,
    )
    return SWAPoolSpec(sub, size_swa=swa_pages * page_size, swa_layers=tuple(mask))


def swa_pool_specs(
    *,
    families: Sequence[str] | None = None,
    page_sizes: Sequence[int] = (1, 2),
    max_layers: int = 4,
) -> st.SearchStrategy[SWAPoolSpec]:
    """Small sliding-window hybrid pools (:class:`kvcheck.specs.SWAPoolSpec`) of
    ``families`` (default: every family in :data:`kvcheck.specs.SWA_FAMILIES`), on pages of
    ``page_sizes``, with 2 to ``max_layers`` layers, one of each kind at least, a full side
    of 2 to 6 pages and a window side of 2 pages up to the full side's. Shrinks towards an
    MHA hybrid of two layers (the first full, the second a window layer), one head of 2,
    page size 1, a full side of 2 slots and a window side of 2.

    Example:
        >>> from hypothesis import find
        >>> spec = find(swa_pool_specs(), lambda spec: True)
        >>> spec.sub.family, spec.swa_layers, spec.sub.size, spec.size_swa
        ('mha', (False, True), 2, 2)
    """
    chosen = tuple(SWA_FAMILIES if families is None else families)
    if not chosen or any(family not in SWA_FAMILIES for family in chosen):
        raise InvalidArgument(f"families={chosen!r} must be a non-empty subset of {SWA_FAMILIES}")
    pages = tuple(page_sizes)
    if not pages or any(not isinstance(p, int) or isinstance(p, bool) or p < 1 for p in pages):
        raise InvalidArgument(f"page_sizes={pages!r} must be a non-empty list of ints >= 1")
    check_valid_integer(max_layers, "max_layers", min_value=2)
    return _swa_pool_specs(chosen, pages, max_layers)
