"""Plain descriptions of pools and operations, shared by strategies, reference and targets.

These are data only: no torch tensors are created here and no pool code is imported, so
the reference models, the Hypothesis strategies and every target can agree on one
vocabulary without depending on each other.

Example:
    >>> spec = PoolSpec(family="mha", size=16, page_size=4, layer_num=2,
    ...                 dtype="bfloat16", head_num=2, head_dim=8)
    >>> spec.num_slots
    20
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

PoolFamily = Literal["mha", "noop", "mla", "dsa"]
POOL_FAMILIES: tuple[PoolFamily, ...] = ("mha", "noop", "mla", "dsa")

#: dtype names as ``torch.<name>``; fp8 names are stored as uint8 by every pool.
DTYPE_ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
FP8_DTYPES: frozenset[str] = frozenset({"float8_e4m3fn", "float8_e5m2"})
#: Packed FP4 (two e2m1 values per byte): the dtype of SGLang's FP4 KV pools. Not a
#: :data:`DTYPE_ITEMSIZE` name: only a quantized pool (:data:`KV_QUANTS`) takes it.
FP4_DTYPE = "float4_e2m1fn_x2"

#: DSA index keys are fp8 with one fp32 scale per block of this many channels.
DSA_QUANT_BLOCK = 128
#: MHA buffer layouts: token-major (``nhd``) and head-major by page (``hnd``).
KV_LAYOUTS: tuple[str, ...] = ("nhd", "hnd")
#: DSA latent row layouts: ``raw`` (``kv_lora_rank + qk_rope_head_dim`` values in the pool's
#: dtype) and ``scaled`` (SGLang 0.5.23's fp8 DSA row: ``kv_lora_rank`` fp8 values, one fp32
#: scale per block of :data:`DSA_QUANT_BLOCK` of them, then the rope part in bf16).
LATENT_LAYOUTS: tuple[str, ...] = ("raw", "scaled")
#: The only dtype a ``scaled`` latent row takes (its values are e4m3 fp8).
SCALED_LATENT_DTYPE = "float8_e4m3fn"
#: Quantized KV caches (SGLang 0.5.23's ``--kv-cache-dtype``), per family, "none" first:
#: MHA fp8 whose writes carry per-tensor scales (``fp8_scaled``, SGLang's plain pool), the
#: CPU fp8 method (``cpu_fp8``: ``cpu_fp8_e4m3``), MXFP8 (fp8 values, one e8m0 scale per
#: 32; interleaved scales for 128-token pages, flat otherwise), FP4 with one exponent per
#: 16 values (``fp4_mx_block16``) and NVFP4 (e4m3 block scales, a global scale per layer,
#: linear and/or TRT-LLM native scale layouts: :data:`NVFP4_LAYOUTS`); MLA FP4 (``fp4``,
#: the block-16 encoding of its latent row).
MHA_KV_QUANTS: tuple[str, ...] = (
    "none",
    "fp8_scaled",
    "cpu_fp8",
    "mxfp8",
    "fp4_mx_block16",
    "nvfp4",
)
MLA_KV_QUANTS: tuple[str, ...] = ("none", "fp4")
KV_QUANTS: tuple[str, ...] = (*MHA_KV_QUANTS, *MLA_KV_QUANTS[1:])
#: The dtypes a pool of each quantized variant takes (the first is what strategies draw).
QUANT_DTYPES: dict[str, tuple[str, ...]] = {
    "fp8_scaled": ("float8_e4m3fn", "float8_e5m2"),
    "cpu_fp8": ("float8_e4m3fn",),
    "mxfp8": ("float8_e4m3fn",),
    "fp4_mx_block16": (FP4_DTYPE,),
    "nvfp4": (FP4_DTYPE,),
    "fp4": (FP4_DTYPE,),
}
#: NVFP4 scale layouts, as SGLang selects them from the attention backends: token-linear
#: e4m3 scales with the shared fp8 dequant workspace (FlashInfer prefill, SM120), both
#: layouts with it (SM100), linear only and TRT-LLM's native (swizzled, paged) only.
NVFP4_LAYOUTS: tuple[str, ...] = ("linear+dq", "both+dq", "linear", "native")
#: Values per scale of each block-scaled variant (``fp4`` and ``nvfp4``: 16; MXFP8: 32).
QUANT_BLOCKS: dict[str, int] = {"mxfp8": 32, "fp4_mx_block16": 16, "nvfp4": 16, "fp4": 16}
#: MXFP8 keeps its scales interleaved (FA4's layout) for this page size, flat otherwise.
MXFP8_INTERLEAVED_PAGE = 128
#: DSA index kpools the strategies draw (SGLang 0.5.23 takes any divisor of the page
#: size; its CUDA kernels need 64-token index pages, so a target like sglang pairs kpool
#: k with ``page_size = 64 * k`` through its surface).
INDEX_KPOOLS: tuple[int, ...] = (1, 2, 4)
#: Decode-context-parallel widths the strategies draw (SGLang's ``--dcp-size``; 1 is off).
DCP_SIZES: tuple[int, ...] = (1, 2, 4)
#: Compress-tail rows (one request's ring slot) are bf16: 2 bytes per index channel.
COMPRESS_TAIL_ITEMSIZE = 2


@dataclass(frozen=True)
class Axis:
    """One way pools of some families vary: a PoolSpec field and the values kvcheck models
    (the first is the baseline every target builds)."""

    field: str
    families: tuple[str, ...]
    values: tuple[Any, ...]
    #: The legacy target attribute that declared it before surfaces (still read).
    legacy_attribute: str
    #: Families whose values are a part of ``values`` (baseline first): (family, values).
    per_family: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def values_for(self, family: str) -> tuple[Any, ...]:
        """The values ``family``'s pools take along this axis.

        Example:
            >>> [axis.values_for("mla") for axis in AXES if axis.field == "kv_quant"]
            [('none', 'fp4')]
        """
        return dict(self.per_family).get(family, self.values)


#: Every variant axis, one row each. A new variant of an existing family is a new value
#: (or a new row) here, the PoolSpec field it names, and the target's surface.
AXES: tuple[Axis, ...] = (
    Axis("kv_layout", ("mha",), KV_LAYOUTS, "kv_layouts"),
    Axis("latent_layout", ("dsa",), LATENT_LAYOUTS, "latent_layouts"),
    Axis("index_kpool", ("dsa",), INDEX_KPOOLS, "index_kpools"),
    Axis("dcp_size", ("mla", "dsa"), DCP_SIZES, "dcp_sizes"),
    Axis(
        "kv_quant",
        ("mha", "mla"),
        KV_QUANTS,
        "kv_quants",
        per_family=(("mha", MHA_KV_QUANTS), ("mla", MLA_KV_QUANTS)),
    ),
    Axis("nvfp4_layout", ("mha",), NVFP4_LAYOUTS, "nvfp4_layouts"),
)
#: Which :class:`PoolSpec` fields describe a pool, by what it is: ``""`` for every pool, then
#: its family, then each part of its :attr:`PoolSpec.variant` after the family (``kpool``,
#: ``dcp``; a layout part such as ``hnd`` or ``scaled`` has its field in the family's row).
#: :meth:`PoolSpec.described_fields` reads it; a field in no row would never be shown.
SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    "": ("family", "size", "page_size", "layer_num", "dtype", "start_layer"),
    "mha": ("head_num", "head_dim", "v_head_dim", "kv_layout", "kv_page_padding"),
    "noop": ("head_num", "head_dim", "v_head_dim", "kv_page_padding"),
    "mla": ("kv_lora_rank", "qk_rope_head_dim"),
    "dsa": (
        "kv_lora_rank",
        "qk_rope_head_dim",
        "index_head_dim",
        "skip_topk_layers",
        "index_buf_size",
        "latent_layout",
    ),
    "kpool": ("index_kpool", "index_kpool_compress", "tail_extra_slots", "max_running_requests"),
    "dcp": ("dcp_size", "dcp_rank"),
    # A quantized variant names its kv_quant value; NVFP4 also its scale layouts.
    **{quant: ("kv_quant",) for quant in KV_QUANTS[1:]},
    "nvfp4": ("kv_quant", "nvfp4_layout"),
}


@dataclass(frozen=True)
class PoolSpec:
    """Everything needed to build one pool of any family.

    ``size`` is the token capacity the scheduler sees; buffers hold ``size + page_size``
    slots because slot row 0..page_size-1 is SGLang's padding page. Layer ids are global:
    the pool serves ``start_layer .. start_layer + layer_num - 1``.
    Fields that do not apply to ``family`` are ignored, and left out of its repr
    (:data:`SPEC_FIELDS` says which apply).
    """

    family: PoolFamily
    size: int
    page_size: int
    layer_num: int
    dtype: str
    start_layer: int = 0
    # MHA / NoOp
    head_num: int = 1
    head_dim: int = 8
    v_head_dim: int | None = None
    # MHA: "nhd" (a buffer row per token slot) or "hnd" (a row per page, heads before the
    # page's tokens: ``[pages, head_num, page_size, head_dim]``; whole pages only).
    kv_layout: str = "nhd"
    # MHA / NoOp: whether K and V rows of the same shape are allocated as the two halves of
    # one tensor per layer, each padded to whole pages (SGLang 0.5.23, kvcheck's pools);
    # False: each holds its ``size + page_size`` rows and no more (SGLang 0.5.22 and
    # earlier allocate K and V separately). A layout fact of the target, read from it.
    kv_page_padding: bool = True
    # MLA / DSA
    kv_lora_rank: int = 16
    qk_rope_head_dim: int = 8
    # DSA
    index_head_dim: int = 128
    skip_topk_layers: tuple[bool, ...] | None = None
    index_buf_size: int | None = None
    # DSA: "raw" or "scaled" (fp8 e4m3 only; kv_lora_rank a multiple of 128). A scaled
    # row is written from bf16 nope and rope values, quantized per token and block.
    latent_layout: str = "raw"
    # DSA index kpool (SGLang 0.5.23): one index key per ``index_kpool`` tokens, so a page
    # row holds ``page_size // index_kpool`` index slots. With ``index_kpool_compress``
    # the pool also keeps, per layer, a bf16 ring of ``index_kpool + tail_extra_slots``
    # keys and scores for each of ``max_running_requests + 1`` request slots.
    index_kpool: int = 1
    index_kpool_compress: bool = False
    tail_extra_slots: int = 0
    max_running_requests: int | None = None
    # MLA / DSA decode context parallel (SGLang's ``--dcp-size``): the pool is rank
    # ``dcp_rank`` of ``dcp_size``. Callers name tokens by widened id ``w`` in
    # ``[0, (size + page_size) * dcp_size)``; this rank keeps ``w``'s latent row at
    # ``w // dcp_size`` when ``w % dcp_size == dcp_rank``. DSA index keys are not split:
    # every rank keeps one per widened id.
    dcp_size: int = 1
    dcp_rank: int = 0
    # MHA / MLA quantized KV cache (:data:`KV_QUANTS`): the payload buffers hold encoded
    # values and scale buffers beside them hold each block's scale (see kvcheck.geometry).
    kv_quant: str = "none"
    # MHA NVFP4: which scale layouts the pool keeps (:data:`NVFP4_LAYOUTS`).
    nvfp4_layout: str = "linear+dq"

    def __post_init__(self) -> None:
        # Only the layout, kpool, DCP and quantization fields are checked here: the rest
        # stays plain data, checked by the reference and the pools, as before.
        self._check_kpool()
        self._check_dcp()
        _check_quant(self)
        if self.latent_layout not in LATENT_LAYOUTS:
            raise ValueError(f"latent_layout={self.latent_layout!r} not in {LATENT_LAYOUTS}")
        if self.latent_layout == "raw":
            return
        if self.family != "dsa" or self.dtype != SCALED_LATENT_DTYPE:
            raise ValueError(
                f"latent_layout='scaled' needs family='dsa' and dtype={SCALED_LATENT_DTYPE!r},"
                f" got family={self.family!r}, dtype={self.dtype!r}"
            )
        rank = self.kv_lora_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0 or rank % 128:
            raise ValueError(
                f"latent_layout='scaled' needs kv_lora_rank a positive multiple of"
                f" {DSA_QUANT_BLOCK} (one fp32 scale per block), got kv_lora_rank={rank!r}"
            )

    def _check_kpool(self) -> None:
        kpool = self.index_kpool
        if isinstance(kpool, bool) or not isinstance(kpool, int) or kpool < 1:
            raise ValueError(f"index_kpool={kpool!r} must be an int >= 1")
        if kpool > 1 and self.family != "dsa":
            raise ValueError(f"index_kpool={kpool} needs family='dsa', got {self.family!r}")
        page = self.page_size
        if kpool > 1 and (not isinstance(page, int) or page % kpool):
            raise ValueError(f"page_size={page!r} must be a multiple of index_kpool={kpool}")
        extra = self.tail_extra_slots
        if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
            raise ValueError(f"tail_extra_slots={extra!r} must be an int >= 0")
        requests = self.max_running_requests
        if self.compress_tails and (
            isinstance(requests, bool) or not isinstance(requests, int) or requests < 0
        ):
            raise ValueError(
                f"index_kpool_compress=True with index_kpool={kpool} needs"
                f" max_running_requests an int >= 0, got {requests!r}"
            )

    def _check_dcp(self) -> None:
        size, rank = self.dcp_size, self.dcp_rank
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"dcp_size={size!r} must be an int >= 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"dcp_rank={rank!r} must be an int in [0, dcp_size={size})")
        if size == 1:
            return
        if self.family not in ("mla", "dsa"):
            raise ValueError(f"dcp_size={size} needs family 'mla' or 'dsa', got {self.family!r}")
        if not isinstance(self.page_size, int) or not isinstance(self.size, int):
            return  # the reference and the pools report the bad size or page size
        if self.page_size < 1 or self.size % self.page_size:
            raise ValueError(
                f"dcp_size={size} needs whole pages: size={self.size!r} is not a multiple of"
                f" page_size={self.page_size!r} (the allocator hands out widened pages of"
                " page_size * dcp_size ids, and DSA sizes its index keys for whole pages)"
            )

    def described_fields(self) -> tuple[str, ...]:
        """The names of the fields that describe this pool, in declaration order: those
        :data:`SPEC_FIELDS` gives its family and variant, and any other field that differs
        from its default (ignored by the pool, but kept so that the repr rebuilds the spec).

        Example:
            >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
            >>> spec.described_fields()[6:]
            ('head_num', 'head_dim', 'v_head_dim', 'kv_layout', 'kv_page_padding')
            >>> spec
            PoolSpec(family='mha', size=4, page_size=2, layer_num=1, dtype='float16', \
start_layer=0, head_num=1, head_dim=8, v_head_dim=None, kv_layout='nhd', kv_page_padding=True)
        """
        family, *parts = self.variant.split(":")
        wanted = {name for key in ("", family, *parts) for name in SPEC_FIELDS.get(key, ())}
        return tuple(
            f.name for f in fields(self) if f.name in wanted or getattr(self, f.name) != f.default
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.described_fields())
        return f"PoolSpec({shown})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What Hypothesis (and IPython) print for a spec in an example: the fields of
        :meth:`described_fields`, one per line when long."""
        with printer.group(indent=4, open="PoolSpec(", close=")"):
            for index, name in enumerate(self.described_fields()):
                if index:
                    printer.text(",")
                    printer.breakable()
                printer.text(f"{name}=")
                printer.pretty(getattr(self, name))

    @property
    def token_slots(self) -> int:
        """Token ids callers may name: ``num_slots``, times ``dcp_size`` (widened ids)."""
        return self.num_slots * self.dcp_size

    @property
    def token_page_size(self) -> int:
        """Ids in one allocator page: ``page_size``, times ``dcp_size`` (a widened page)."""
        return self.page_size * self.dcp_size

    @property
    def compress_tails(self) -> bool:
        """Whether the pool keeps per-request compress tails (SGLang: kpool > 1 and
        ``index_kpool_compress``; the flag alone is ignored)."""
        return self.family == "dsa" and self.index_kpool > 1 and self.index_kpool_compress

    @property
    def index_page_size(self) -> int:
        """Index slots in one page row: ``page_size // index_kpool``."""
        return self.page_size // self.index_kpool

    @property
    def index_slots(self) -> int:
        """Index slots the pool's tokens map to (token ``t`` -> slot ``t // index_kpool``;
        under DCP every widened id has one)."""
        return -(-self.token_slots // self.index_kpool)

    @property
    def tail_requests(self) -> int:
        """Request slots of each compress-tail buffer: ``max_running_requests + 1``
        (SGLang keeps one for invalid request ids); 0 without tails."""
        if not self.compress_tails or self.max_running_requests is None:
            return 0
        return self.max_running_requests + 1

    @property
    def tail_width(self) -> int:
        """Ring slots per request: ``index_kpool + tail_extra_slots``."""
        return self.index_kpool + self.tail_extra_slots

    @property
    def num_slots(self) -> int:
        """Rows in each per-layer token buffer: capacity plus the padding page."""
        return self.size + self.page_size

    @property
    def layer_ids(self) -> range:
        """Global ids of the layers this pool serves."""
        return range(self.start_layer, self.start_layer + self.layer_num)

    @property
    def variant(self) -> str:
        """The family, with the buffer layout when it is not the default (``"mha:hnd"``,
        ``"dsa:scaled"``), ``kpool`` for a DSA index kpool above 1 (``"dsa:kpool"``) and
        ``dcp`` for decode context parallel (``"mla:dcp"``); a quantized pool names its
        :data:`KV_QUANTS` value, ``flat`` for MXFP8 scales off 128-token pages and
        ``native`` for NVFP4 with TRT-LLM's native scales (``"mha:mxfp8:flat"``):
        what a failure's signature names, so a finding can be about one variant only."""
        parts: list[str] = [self.family]
        if self.kv_quant != "none":
            parts.append(self.kv_quant)
            if self.kv_quant == "mxfp8" and self.page_size != MXFP8_INTERLEAVED_PAGE:
                parts.append("flat")
            if self.kv_quant == "nvfp4" and "native" in _nvfp4_scales(self.nvfp4_layout):
                parts.append("native")
        if self.latent_layout != "raw":
            parts.append(self.latent_layout)
        elif self.kv_layout != "nhd":
            parts.append(self.kv_layout)
        if self.index_kpool > 1:
            parts.append("kpool")
        if self.dcp_size > 1:
            parts.append("dcp")
        return ":".join(parts)

    @property
    def effective_v_head_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def itemsize(self) -> int:
        """Bytes per value of ``dtype``; for packed FP4, 1 (a storage byte holds two)."""
        return 1 if self.dtype == FP4_DTYPE else DTYPE_ITEMSIZE[self.dtype]

    @property
    def quantized(self) -> bool:
        """Whether the pool keeps encoded values with block scales (or, ``cpu_fp8``, the
        CPU fp8 method's own buffers): any :data:`KV_QUANTS` value but ``none`` and
        ``fp8_scaled`` (SGLang's plain pool, whose scales are per tensor, the caller's)."""
        return self.kv_quant not in ("none", "fp8_scaled")

    @property
    def nvfp4_scales(self) -> tuple[str, ...]:
        """The NVFP4 scale layouts the pool keeps (``("linear",)``, ``("native",)`` or
        both); ``()`` for other pools."""
        return _nvfp4_scales(self.nvfp4_layout) if self.kv_quant == "nvfp4" else ()

    @property
    def dequant_workspace(self) -> bool:
        """Whether an NVFP4 pool keeps the shared fp8 dequant workspace (FlashInfer prefill)."""
        return self.kv_quant == "nvfp4" and self.nvfp4_layout.endswith("+dq")

    @property
    def skip_mask(self) -> tuple[bool, ...]:
        """Per local layer: True where the DSA index-K buffer is skipped."""
        if self.skip_topk_layers is None:
            return (False,) * self.layer_num
        return tuple(self.skip_topk_layers)

    @property
    def effective_index_buf_size(self) -> int:
        """``index_buf_size``, by default SGLang's: ``(size + page_size) * dcp_size -
        page_size`` (``size`` without DCP)."""
        if self.index_buf_size is not None:
            return self.index_buf_size
        return self.token_slots - self.page_size


#: The families whose pools a sliding-window hybrid composes (SGLang's ``SWAKVPool`` takes
#: an MHA, MLA or DSA class for each side).
SWA_FAMILIES: tuple[str, ...] = ("mha", "mla", "dsa")


@dataclass(frozen=True)
class SWAPoolSpec:
    """A sliding-window hybrid pool: ``sub`` gives the family, geometry, dtype, page size and
    full-side ``size`` of both sub-pools (a DSA hybrid's window side is MLA);
    ``swa_layers[i]`` says whether global layer ``i`` (of ``sub.layer_num``) is a
    sliding-window layer; the SWA side holds ``size_swa`` slots.

    Example:
        >>> spec = SWAPoolSpec(PoolSpec(family="mha", size=8, page_size=1, layer_num=3,
        ...                             dtype="bfloat16"), size_swa=4,
        ...                    swa_layers=(True, False, True))
        >>> spec.swa_layer_ids, spec.full_layer_ids, spec.swa_spec.size
        ((0, 2), (1,), 4)
    """

    sub: PoolSpec
    size_swa: int
    swa_layers: tuple[bool, ...]

    def __post_init__(self) -> None:
        sub = self.sub
        if not isinstance(sub, PoolSpec) or sub.family not in SWA_FAMILIES:
            raise ValueError(f"sub={sub!r} must be a PoolSpec of a family in {SWA_FAMILIES}")
        plain = (sub.variant == sub.family) and sub.start_layer == 0
        if not plain or sub.skip_topk_layers is not None:
            raise ValueError(
                f"sub={sub!r}: a hybrid's sub-pools are the plain variant of their family "
                "(no quantization, layout, kpool or DCP; start_layer 0; no skip layers)"
            )
        if not isinstance(self.size_swa, int) or self.size_swa < 1:
            raise ValueError(f"size_swa={self.size_swa!r} must be an int >= 1")
        if (
            len(self.swa_layers) != sub.layer_num
            or all(self.swa_layers)
            or not any(self.swa_layers)
        ):
            raise ValueError(
                f"swa_layers={self.swa_layers!r} must mark each of sub.layer_num="
                f"{sub.layer_num} layers, at least one of each kind"
            )

    @property
    def swa_layer_ids(self) -> tuple[int, ...]:
        """The global ids of the sliding-window layers, ascending."""
        return tuple(i for i, swa in enumerate(self.swa_layers) if swa)

    @property
    def full_layer_ids(self) -> tuple[int, ...]:
        """The global ids of the full-attention layers, ascending."""
        return tuple(i for i, swa in enumerate(self.swa_layers) if not swa)

    @property
    def full_spec(self) -> PoolSpec:
        """The full side as a pool of its own (local layer ids)."""
        return replace(self.sub, layer_num=len(self.full_layer_ids))

    @property
    def swa_spec(self) -> PoolSpec:
        """The sliding-window side as a pool of its own (local layer ids). A DSA hybrid's
        window side is an MLA pool of the same geometry: SGLang's configurator keeps the
        indexer's keys on the full side only (``_build_hybrid_mla_swa_kv_pool``)."""
        family = "mla" if self.sub.family == "dsa" else self.sub.family
        return replace(
            self.sub, family=family, size=self.size_swa, layer_num=len(self.swa_layer_ids)
        )


def _nvfp4_scales(layout: str) -> tuple[str, ...]:
    scales = layout.removesuffix("+dq")
    return ("linear", "native") if scales == "both" else (scales,)


def _quant_geometry_problem(spec: PoolSpec) -> str | None:
    """Why ``spec``'s shapes cannot hold its quantized variant's blocks (None: they can)."""
    quant, dims = spec.kv_quant, (spec.head_dim, spec.effective_v_head_dim)
    if quant == "mxfp8":
        if any(dim % 32 for dim in dims):
            return f"head_dim={dims[0]} and v_head_dim={dims[1]} must be multiples of 32"
        if spec.page_size == MXFP8_INTERLEAVED_PAGE and spec.size % spec.page_size:
            return f"interleaved scales (page_size=128) need whole pages, got size={spec.size}"
    elif quant == "fp4_mx_block16":
        if any(spec.head_num * dim % 16 for dim in dims):
            return f"head_num * head_dim and head_num * v_head_dim ({dims}) must be multiples of 16"
    elif quant == "nvfp4":
        native = "native" in spec.nvfp4_scales
        block = 64 if native else 16
        if any(dim % block for dim in dims):
            return f"head_dim and v_head_dim ({dims}) must be multiples of {block}"
        if native and (spec.page_size % 4 or spec.size % spec.page_size):
            return (
                f"native NVFP4 scales need page_size % 4 == 0 and whole pages, got"
                f" page_size={spec.page_size}, size={spec.size}"
            )
    elif quant == "fp4":
        if spec.kv_lora_rank % 16 or spec.qk_rope_head_dim % 16:
            return (
                f"kv_lora_rank={spec.kv_lora_rank} and qk_rope_head_dim="
                f"{spec.qk_rope_head_dim} must be multiples of 16 (each part is quantized"
                " in blocks of 16)"
            )
        if spec.dcp_size > 1:
            return "no decode context parallel (SGLang's FP4 scale kernel has no DCP path)"
    return None


def _check_quant(spec: PoolSpec) -> None:
    """The quantization fields of ``spec`` agree with its family, dtype and shapes."""
    quant = spec.kv_quant
    allowed = {"mha": MHA_KV_QUANTS, "mla": MLA_KV_QUANTS}.get(spec.family, ("none",))
    if quant not in allowed:
        raise ValueError(f"kv_quant={quant!r} not in {allowed} for family={spec.family!r}")
    if spec.nvfp4_layout not in NVFP4_LAYOUTS:
        raise ValueError(f"nvfp4_layout={spec.nvfp4_layout!r} not in {NVFP4_LAYOUTS}")
    if spec.nvfp4_layout != NVFP4_LAYOUTS[0] and quant != "nvfp4":
        raise ValueError(f"nvfp4_layout={spec.nvfp4_layout!r} needs kv_quant='nvfp4'")
    if quant == "none":
        if spec.dtype == FP4_DTYPE:
            raise ValueError(f"dtype={FP4_DTYPE!r} needs a quantized kv_quant (fp4, nvfp4, ...)")
        return
    if spec.dtype not in QUANT_DTYPES[quant]:
        raise ValueError(
            f"kv_quant={quant!r} needs dtype in {QUANT_DTYPES[quant]}, got {spec.dtype!r}"
        )
    if spec.quantized and spec.kv_layout != "nhd":
        raise ValueError(f"kv_quant={quant!r} pools are token-major only (kv_layout='nhd')")
    if any(
        not isinstance(v, int) or isinstance(v, bool)
        for v in (
            spec.head_num,
            spec.head_dim,
            spec.effective_v_head_dim,
            spec.kv_lora_rank,
            spec.qk_rope_head_dim,
            spec.page_size,
            spec.size,
        )
    ):
        return  # the reference and the pools report malformed sizes
    problem = _quant_geometry_problem(spec)
    if problem is not None:
        raise ValueError(f"kv_quant={quant!r}: {problem}")


# --- the linear-attention hybrid (full KV + mamba state per request) --------------------


@dataclass(frozen=True)
class LinearHybridSpec:
    """A linear-attention hybrid (Qwen3-Next style): full-attention KV for some layers and
    per-request mamba state (conv windows, temporal SSM state) for the others.

    Layer ids are global model ids: ``full_layer_ids`` index the full KV pool through its
    layer mapping, ``mamba_layer_ids`` the mamba pool's dense layer axis. ``size`` token
    slots of full KV (plus one padding page), ``rows`` request rows, ``mamba_size`` mamba
    slots (slot 0 of each is padding). ``draft_tokens`` (speculative decoding) adds the
    per-slot scratch of intermediate SSM states and conv windows, one per draft token.

    Example:
        >>> spec = LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0, 2))
        >>> spec.layer_num, spec.conv_shapes, spec.temporal_shape
        (3, ((10, 2),), (2, 2, 3))
    """

    full_layer_ids: tuple[int, ...]
    mamba_layer_ids: tuple[int, ...]
    size: int = 16
    page_size: int = 1
    head_num: int = 1
    head_dim: int = 4
    rows: int = 4
    mamba_size: int = 4
    max_context_len: int = 8
    #: Mamba2's state shapes from its model fields (see :attr:`conv_shapes`).
    mamba_heads: int = 2
    mamba_head_dim: int = 2
    state_size: int = 3
    conv_kernel: int = 3
    draft_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("full_layer_ids", "mamba_layer_ids"):
            ids = getattr(self, name)
            if not ids or any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"{name}={ids!r} must be a non-empty tuple of ints >= 0")
            if len(set(ids)) != len(ids):
                raise ValueError(f"{name}={ids!r} has a layer id twice")
        if set(self.full_layer_ids) & set(self.mamba_layer_ids):
            raise ValueError(
                f"full_layer_ids={self.full_layer_ids!r} and "
                f"mamba_layer_ids={self.mamba_layer_ids!r} share a layer"
            )
        for name in (
            "size",
            "page_size",
            "head_num",
            "head_dim",
            "rows",
            "mamba_size",
            "max_context_len",
            "mamba_heads",
            "mamba_head_dim",
            "state_size",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be an int >= 1")
        if not isinstance(self.conv_kernel, int) or self.conv_kernel < 2:
            raise ValueError(f"conv_kernel={self.conv_kernel!r} must be an int >= 2")
        if self.draft_tokens is not None and (
            not isinstance(self.draft_tokens, int) or self.draft_tokens < 1
        ):
            raise ValueError(f"draft_tokens={self.draft_tokens!r} must be None or an int >= 1")

    @property
    def layer_num(self) -> int:
        """Layers of the model: every id below the largest one."""
        return max((*self.full_layer_ids, *self.mamba_layer_ids)) + 1

    @property
    def conv_shapes(self) -> tuple[tuple[int, int], ...]:
        """Mamba2's one conv window per layer and slot: ``(conv_dim, conv_kernel - 1)``
        with ``conv_dim = intermediate + 2 * state_size`` (one group)."""
        return (
            (self.mamba_heads * self.mamba_head_dim + 2 * self.state_size, self.conv_kernel - 1),
        )

    @property
    def temporal_shape(self) -> tuple[int, int, int]:
        """The SSM state per layer and slot: ``(heads, head_dim, state_size)``."""
        return (self.mamba_heads, self.mamba_head_dim, self.state_size)


# --- operations -------------------------------------------------------------------------
# Token payloads are raw bytes (numpy-free, hashable), row-major per token, so the
# reference can compare them without knowing any dtype semantics.


@dataclass(frozen=True)
class Payload:
    """What a caller passes when its tensors are not in the pool's dtype.

    ``k_rows``/``v_rows`` hold the caller's bytes in ``dtype`` (a torch dtype name); the
    pool converts them value by value (after dividing by ``k_scale``/``v_scale`` where
    given, as SGLang does) into the bytes the write op records as stored. Generators pick
    values that every dtype represents exactly, so the stored bytes are known up front.
    """

    dtype: str
    k_rows: tuple[bytes, ...]
    v_rows: tuple[bytes, ...] = ()
    k_scale: float | None = None
    v_scale: float | None = None
    #: MXFP8's scaled write: the caller's e8m0 block scales, one row of bytes per token
    #: (``[head_num, dim // 32]``) beside fp8 ``k_rows``/``v_rows``; stored as given.
    k_scale_rows: tuple[bytes, ...] = ()
    v_scale_rows: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class WriteKV:
    """``set_kv_buffer`` on one layer. ``k_rows[i]`` / ``v_rows[i]`` are slot ``locs[i]``'s bytes.

    For MLA/DSA ``v_rows`` is empty: the latent row is the whole cache entry. ``payload``
    (optional) is what the caller passes instead when it writes in another dtype; the
    rows are then what the pool must store. A quantized pool (:attr:`PoolSpec.quantized`)
    is always written from a ``payload``, with ``k_rows``/``v_rows`` empty: what it must
    store (encoded values and block scales) is the reference's encoding of it.
    ``override`` passes the layer as ``layer_id_override=layer_id`` with ``layer=None``.
    """

    layer_id: int
    locs: tuple[int, ...]
    k_rows: tuple[bytes, ...]
    v_rows: tuple[bytes, ...] = ()
    payload: Payload | None = None
    override: bool = False


@dataclass(frozen=True)
class WriteMLA:
    """MLA/DSA ``set_mla_kv_buffer``: the latent row given as its two parts.

    ``nope_rows[i]`` (``kv_lora_rank`` values) and ``rope_rows[i]`` (``qk_rope_head_dim``
    values) are slot ``locs[i]``'s bytes in ``dtype`` (``None``: the pool's dtype); in the
    raw layout the stored row is their concatenation. A ``scaled`` latent layout takes
    ``dtype="bfloat16"`` and stores each nope block of 128 values quantized to fp8 with
    its fp32 scale, then the rope bytes as given. ``override`` passes the layer as
    ``layer_id_override=layer_id`` with ``layer=None``, as SGLang's SWA pool does.
    """

    layer_id: int
    locs: tuple[int, ...]
    nope_rows: tuple[bytes, ...]
    rope_rows: tuple[bytes, ...]
    dtype: str | None = None
    override: bool = False


@dataclass(frozen=True)
class WritePrefixValid:
    """MHA ``set_kv_buffer_prefix_valid``: a ``[batch, width]`` grid of slots of which row
    ``b`` commits only its first ``commit_lens[b]``.

    ``k_rows``/``v_rows`` hold one row per grid cell, row-major; uncommitted cells are
    passed to the pool but must not be written. ``dtype`` names the rows' dtype when it is
    not the pool's (a quantized pool takes bf16 rows and stores their encoding).
    """

    layer_id: int
    loc_grid: tuple[tuple[int, ...], ...]
    commit_lens: tuple[int, ...]
    k_rows: tuple[bytes, ...]
    v_rows: tuple[bytes, ...]
    dtype: str | None = None


@dataclass(frozen=True)
class WriteIndexK:
    """DSA ``set_index_k_scale_buffer``: fp8 key bytes and fp32 scale bytes per index slot
    (a token id; with ``index_kpool > 1`` the slot of a group of ``index_kpool`` tokens)."""

    layer_id: int
    locs: tuple[int, ...]
    key_rows: tuple[bytes, ...]
    scale_rows: tuple[bytes, ...]


@dataclass(frozen=True)
class WriteCompressTail:
    """DSA ``set_compress_tail_for_request``: request ``req_pool_idx``'s ring takes
    ``key_rows[i]`` and ``score_rows[i]`` (bf16, ``index_head_dim`` values each) at slot
    ``(start + i) % tail_width``; ``n_remain`` is ``len(key_rows)``."""

    layer_id: int
    req_pool_idx: int
    key_rows: tuple[bytes, ...]
    score_rows: tuple[bytes, ...]
    start: int = 0


@dataclass(frozen=True)
class Move:
    """``move_kv_cache(tgt_loc, src_loc)``: every source is read before any target is written."""

    tgt: tuple[int, ...]
    src: tuple[int, ...]


@dataclass(frozen=True)
class HostCopy:
    """``get_cpu_copy(indices)``; the copy is remembered under ``name`` for a later reload.

    ``req_pool_index`` (DSA with compress tails) also copies that request's tails."""

    name: str
    indices: tuple[int, ...]
    req_pool_index: int | None = None


@dataclass(frozen=True)
class HostReload:
    """``load_cpu_copy(copy, indices)`` of the copy taken under ``name``; with
    ``req_pool_index``, tails the copy carries go back to that request slot."""

    name: str
    indices: tuple[int, ...]
    req_pool_index: int | None = None


Op = (
    WriteKV
    | WriteMLA
    | WritePrefixValid
    | WriteIndexK
    | WriteCompressTail
    | Move
    | HostCopy
    | HostReload
)


@dataclass(frozen=True)
class OpSequence:
    """A pool and the operations to run on it, in order."""

    spec: PoolSpec
    ops: tuple[Op, ...] = field(default_factory=tuple)
