"""Every pool class sglang's ``srt/mem_cache`` defines, and whether the target builds it.

:data:`CLASS_ROWS` are rows of the target's declaration (upstream keys,
``module:ClassName``): :class:`~kvcheck.declaration.Builds` with how and in which
configurations, or :class:`~kvcheck.declaration.Refuses` with why. :func:`discover_classes`
walks the installed release (``srt/mem_cache`` and its subpackages, the storage connectors
aside: L3 backends, not pools) and joins what it finds with those rows
(:func:`kvcheck.targets.discovery.census`), so a class a newer release adds reads
``not built: new in <release>``. ``kvcheck classes --target sglang`` prints the list; the
run's summary prints the counts.

Example, where sglang is installed (imports every module of ``srt/mem_cache``)::

    entries = discover_classes()
    sum(entry.built for entry in entries)  # the classes the target builds
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from kvcheck.declaration import Builds, Key, Refuses, Row
from kvcheck.targets.discovery import ClassEntry, census, discover

__all__ = ["CLASS_ROWS", "PACKAGE", "discover_classes"]

#: The package walked, and the subpackage left aside.
PACKAGE = "sglang.srt.mem_cache"
ASIDE = ("sglang.srt.mem_cache.storage",)

_M = "sglang.srt.mem_cache."

#: Pool bases (``module:Name`` -> kind), in the order a class's kind is decided.
BASES: tuple[tuple[str, str], ...] = (
    (_M + "pool_host.base:HostKVCache", "host pool"),
    (_M + "allocator.base:BaseTokenToKVPoolAllocator", "allocator"),
    (_M + "memory_pool:ReqToTokenPool", "req-to-token pool"),
    (_M + "memory_pool:MambaPool", "state pool"),
    (_M + "memory_pool:KVCache", "KV pool"),
    (_M + "index_key_cache:IndexKeyCache", "KV pool"),
)
#: Standalone pools with no shared base, by how their names end (-> kind).
NAME_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("PoolHost", "host pool"),
    ("HostPool", "host pool"),
    ("HostPoolGroup", "host pool"),
    ("SlotAllocator", "allocator"),
    ("Pool", "pool"),
)


def _rows(module: str, names: Iterable[str], status: Builds | Refuses) -> tuple[Row, ...]:
    return tuple(Row(Key.upstream(f"{_M}{module}:{name}"), status) for name in names)


_SWA_BUILT = Builds(
    "make_swa_pool: full and sliding-window sides of MHA or MLA pools, run by the SWA "
    "machine with the target's SWA allocator's id mapping; the census on MHA, MLA and DSA "
    "hybrids (a DSA full side beside an MLA window side, on 64-token index pages: no "
    "machine, too slow for its examples on CPU)"
)
_LINEAR_BUILT = Builds(
    "make_linear_hybrid: HybridReqToTokenPool (its MambaPool and MambaSlotAllocator, fp32 "
    "Mamba2 states, one group, no tensor parallelism) under a HybridLinearKVPool over an MHA "
    "pool, run by the linear-hybrid machine; the census on both"
)
_UNIFIED = Refuses(
    "the unified pools carve every sub-pool (full, SWA, mamba) out of one byte arena with "
    "multi-ended allocators and are assembled only by a launched server's "
    "hybrid_pool_assembler (--enable-unified-kv-pool); kvcheck has no model of a shared "
    "arena, so nothing would be compared"
)
_UNIFIED_DRAFT = Refuses(
    "draft pools of the unified arena for speculative decoding, bound to a target model's "
    "unified pool (FusedDraftBinding) inside a launched server; no model in kvcheck"
)
_PAGE_INTERLEAVE = Refuses(
    "page-interleave pools shard each page across the ranks of a KV shard group and gather "
    "through it (GroupCoordinator collectives, NCCL symmetric scratch on CUDA); one CPU "
    "process has no shard group, and kvcheck has no model of the interleaved placement"
)
_DSV4 = Refuses(
    "DeepSeek-V4 pools (compressed C4/C128 caches, indexer, SWA ring and compress state) "
    "read the launched server's execution context at construction (get_exec().graph, "
    "get_schedule()) and write through DeepSeek-V4's fused quantizing kernels; kvcheck has "
    "no model of the V4 layout"
)
_HISPARSE = Refuses(
    "HiSparse keeps a small device pool and the full KV in host memory, paged in per "
    "decoding step by its sparse coordinator (--enable-hisparse); its gathers run sgl-kernel "
    "JIT kernels on CUDA, and kvcheck has no model of the sparse paging"
)
_MINIMAX = Refuses(
    "MiniMax-M3 sparse attention pools (NVFP4 index keys and main KV): nvfp4 writes need "
    "flashinfer's CUDA quantizer, as for the nvfp4 MHA variant; no model in kvcheck"
)
_QSA_BUILT = Builds(
    "make_qsa_hybrid: the linear hybrid's request pool under a QSATokenToKVPool (one index "
    "head of 4, compress ratio 2, pages of 4), the census only (no machine: kvcheck has no "
    "model of the compressed keys or the pending ring, and the census needs none)"
)
_HICACHE_BUILT = Builds(
    "hicache_assembly: the HiCache stack strategy sglang's hybrid_pool_assembler selects for "
    "the linear (and QSA) hybrid, run up to its cache controller; the census checks the "
    "group holds every pool the hybrid declares (test_linear_hybrid_hicache_assembly)"
)
_LAYER_SPLIT = Refuses(
    "GLM DSA's context-parallel layer split (shard_size > 1): each rank holds a shard of "
    "the layers and broadcasts them (torch.cuda.synchronize between steps); one CPU rank "
    "has no shard group"
)
_SERVING_STATE = Refuses(
    "per-request state pools a launched server keeps beside the KV pool (mamba checkpoints, "
    "ShortConv/NGram state, DeepSeek-V4 compress state, embeddings); outside the KV pool "
    "kvcheck models"
)
_NOT_BUILT_BY_SGLANG = Refuses(
    "nothing in sglang {release} builds it (FP4 MHA caches are MHATokenToKVPool with a "
    "quant method)"
)

CLASS_ROWS: tuple[Row, ...] = (
    # --- built: the pools, allocators and host pools the suite drives
    *_rows(
        "memory_pool",
        ("KVCache",),
        Builds("the base of every device pool the target builds; its methods run through them"),
    ),
    *_rows(
        "memory_pool",
        ("MHATokenToKVPool",),
        Builds(
            "make_pool for mha specs: head-major or HND layout, bf16/fp8 (scaled writes), "
            "cpu_fp8_e4m3 and fp4_mx_block16 quant methods, page sizes 1+"
        ),
    ),
    *_rows("memory_pool", ("NoOpMHATokenToKVPool",), Builds("make_pool for noop specs")),
    *_rows(
        "memory_pool",
        ("MLATokenToKVPool",),
        Builds("make_pool for mla specs, DCP widths 1, 2 and 4"),
    ),
    *_rows(
        "memory_pool",
        ("MLATokenToKVPoolFP4",),
        Builds("make_pool for the MLA FP4 variant (scale-row kernel as a CPU body)"),
    ),
    *_rows(
        "memory_pool",
        ("MHATokenToKVPoolMXFP8",),
        Builds("make_pool for the MXFP8 MHA variants: interleaved scales (page 128) and flat"),
    ),
    *_rows(
        "memory_pool",
        ("DSATokenToKVPool",),
        Builds("make_pool for dsa specs: raw and scaled latent rows, index kpools 1 and 2"),
    ),
    *_rows(
        "index_key_cache",
        ("IndexKeyCache",),
        Builds("inside every DSA pool (its index keys and scales)"),
    ),
    *_rows(
        "allocator.base",
        ("BaseTokenToKVPoolAllocator",),
        Builds("the base of every allocator the target builds"),
    ),
    *_rows(
        "allocator.token",
        ("TokenToKVPoolAllocator",),
        Builds("make_allocator, kind token (page size 1)"),
    ),
    *_rows(
        "allocator.paged",
        ("PagedTokenToKVPoolAllocator",),
        Builds("make_allocator, kind paged (page sizes above 1)"),
    ),
    *_rows(
        "allocator.swa",
        ("SWATokenToKVPoolAllocator",),
        Builds("make_allocator, kind swa, over a small SWAKVPool"),
    ),
    *_rows(
        "allocator.swa",
        ("PureSWATokenToKVPoolAllocator",),
        Builds("make_allocator, kind pure_swa, over a small SWAKVPool"),
    ),
    *_rows(
        "pool_host.base",
        ("HostKVCache",),
        Builds("the base of every host pool the target builds"),
    ),
    *_rows(
        "pool_host.mha",
        ("MHATokenToKVPoolHost",),
        Builds("make_host_pool for mha pools (get_mha_host_pool_cls), every host layout"),
    ),
    *_rows(
        "pool_host.mha",
        ("AsymmetricMHATokenToKVPoolHost",),
        Builds("make_host_pool for mha pools with a V head dim of their own"),
    ),
    *_rows(
        "pool_host.mha_mxfp8",
        ("MHATokenToKVPoolMXFP8Host",),
        Builds("make_host_pool for the interleaved MXFP8 MHA variant, page_first layout only"),
    ),
    *_rows(
        "pool_host.mla",
        ("MLATokenToKVPoolHost",),
        Builds("make_host_pool for mla and dsa pools (the latent rows)"),
    ),
    *_rows(
        "pool_host.dsa",
        ("DSAIndexerPoolHost",),
        Builds(
            "make_host_pool for dsa pools (the index keys), from make_dsa_indexer_pool_decl "
            "(0.5.21: from the device pool and the host layout)"
        ),
    ),
    # --- the hybrids
    *_rows("swa_memory_pool", ("SWAKVPool",), _SWA_BUILT),
    *_rows(
        "base_swa_memory_pool",
        ("BaseSWAKVPool",),
        Refuses("the abstract base of SWAKVPool and DeepSeekV4TokenToKVPool (see theirs)"),
    ),
    *_rows("memory_pool", ("HybridLinearKVPool", "MambaPool"), _LINEAR_BUILT),
    *_rows("memory_pool", ("HybridReqToTokenPool",), _LINEAR_BUILT),
    *_rows("allocator.mamba", ("MambaSlotAllocator",), _LINEAR_BUILT),
    *_rows("qsa_kv_pool", ("QSATokenToKVPool",), _QSA_BUILT),
    *_rows("pool_host.mamba", ("MambaPoolHost",), _HICACHE_BUILT),
    *_rows("pool_host.qsa", ("QSAIndexerPoolHost",), _HICACHE_BUILT),
    # --- not built, with why
    *_rows(
        "memory_pool",
        ("ReqToTokenPool",),
        Refuses(
            "the request-to-token table is the scheduler's, not a KV pool: the allocator "
            "and lifecycle machines keep their own request rows"
        ),
    ),
    *_rows("memory_pool", ("MHATokenToKVPoolFP4",), _NOT_BUILT_BY_SGLANG),
    *_rows(
        "memory_pool",
        ("PageMajorMHATokenToKVPool",),
        Refuses(
            "a page-major MHA layout chosen only by attention backends kvcheck does not "
            "model (its buffers are [pages, layers, ...]); no model in kvcheck"
        ),
    ),
    *_rows(
        "memory_pool",
        ("MHATokenToKOnlyPool",),
        Refuses("K-only MHA caches (models that reuse K as V); no model in kvcheck"),
    ),
    *_rows(
        "pool_host.mha",
        ("MHATokenToKOnlyPoolHost",),
        Refuses("the host pool of MHATokenToKOnlyPool, which the target does not build"),
    ),
    *_rows("memory_pool", ("MiniMaxSparseKVPool",), _MINIMAX),
    *_rows(
        "minimax_m3_nvfp4_pool",
        ("MiniMaxM3Nvfp4IndexKPool", "MiniMaxM3Nvfp4KVPool", "MiniMaxM3Nvfp4MainKVPool"),
        _MINIMAX,
    ),
    *_rows(
        "pool_host.minimax_m3_nvfp4",
        ("MiniMaxM3Nvfp4IndexKPoolHost", "MiniMaxM3Nvfp4MainKVPoolHost"),
        _MINIMAX,
    ),
    *_rows(
        "deepseek_v4_memory_pool",
        (
            "DeepSeekV4IndexerPool",
            "DeepSeekV4SingleKVPool",
            "DeepSeekV4TokenToKVPool",
            "DeepSeekV4UnifiedKVPool",
            "DeepSeekV4UniformFP8KVPool",
        ),
        _DSV4,
    ),
    *_rows("deepseek_v4_memory_pool", ("HiSparseC4DevicePool",), _HISPARSE),
    *_rows(
        "memory_pool_host",
        ("DeepSeekV4PagedHostPool", "DeepSeekV4StateHostPool"),
        _DSV4,
    ),
    *_rows(
        "memory_pool_host",
        ("LogicalHostPool",),
        Refuses("a launched server's view over host pools it assembles; not a pool of its own"),
    ),
    *_rows(
        "hisparse_memory_pool",
        ("HiSparseDSATokenToKVPool", "HiSparseMHAMainPool"),
        _HISPARSE,
    ),
    *_rows("pool_host.mha", ("HiSparseMHATokenToKVPoolHost",), _HISPARSE),
    *_rows(
        "allocator.hisparse",
        ("HiSparseTokenToKVPoolAllocator", "DeepSeekV4HiSparseTokenToKVPoolAllocator"),
        _HISPARSE,
    ),
    *_rows(
        "page_interleave_pool",
        (
            "PageInterleaveDSATokenToKVPool",
            "PageInterleaveMHATokenToKVPool",
            "PageInterleaveMLATokenToKVPool",
            "_PageInterleaveIndexKeyCache",
        ),
        _PAGE_INTERLEAVE,
    ),
    *_rows("allocator.page_interleave", ("PageInterleavePoolAllocator",), _PAGE_INTERLEAVE),
    *_rows("pool_host.page_interleave", ("PageInterleaveHostPool",), _PAGE_INTERLEAVE),
    *_rows(
        "unified_memory_pool",
        (
            "UnifiedHybridLinearKVPool",
            "UnifiedHybridReqToTokenPool",
            "UnifiedKVPool",
            "UnifiedMHATokenToKVPool",
            "UnifiedMLATokenToKVPool",
            "UnifiedMambaPool",
            "UnifiedMambaSlotAllocator",
            "UnifiedSWAKVPool",
        ),
        _UNIFIED,
    ),
    *_rows(
        "allocator.unified_hybrid_swa",
        (
            "UnifiedMambaSWATokenToKVPoolAllocator",
            "UnifiedSWAAllocatorBase",
            "UnifiedSWATokenToKVPoolAllocator",
        ),
        _UNIFIED,
    ),
    *_rows("allocator.unified_mamba", ("UnifiedMambaTokenToKVPoolAllocator",), _UNIFIED),
    *_rows(
        "allocator.unified_sub_pool",
        ("FloatMultiEndedAllocator", "MultiEndedAllocator"),
        _UNIFIED,
    ),
    *_rows("pool_host.unified", ("UnifiedPageEnvelopeHostPool",), _UNIFIED),
    *_rows(
        "unified_draft_pool",
        ("UnifiedDraftKVPool", "UnifiedDraftMambaPool", "UnifiedDraftSWAKVPool"),
        _UNIFIED_DRAFT,
    ),
    *_rows(
        "dsa_cache_layer_split",
        ("LayerSplitDSATokenToKVPool", "LayerSplitIndexKeyCache"),
        _LAYER_SPLIT,
    ),
    *_rows(
        "pool_host.group",
        ("HostPoolGroup",),
        Refuses(
            "the group of host pools the hybrid pool assembler builds for a hybrid pool's "
            "HiCache; its members are the host pools above"
        ),
    ),
    *_rows("mamba_checkpoint_pool", ("MambaCheckpointPool",), _SERVING_STATE),
    *_rows("ple_state_pool", ("NGramPool", "ShortConvPool"), _SERVING_STATE),
    *_rows("deepseek_v4_compress_state", ("CompressStatePool",), _SERVING_STATE),
    *_rows("embedding_cache_controller", ("EmbeddingPool",), _SERVING_STATE),
)


def _resolve(qualified: str) -> type:
    import importlib

    module, _, name = qualified.partition(":")
    value = getattr(importlib.import_module(module), name)
    if not isinstance(value, type):
        raise TypeError(f"{qualified} is not a class")
    return value


def discover_classes(*, release: str | None = None, declaration: object = None) -> list[ClassEntry]:
    """Every pool class the installed sglang's ``srt/mem_cache`` defines, with what the
    target's declaration says about it (``release``: the installed one by default; a class
    the declaration has no row for reads ``new in <release>``).

    Imports every module of the package under the target's import stand-ins (seconds, and
    sglang must be installed); a module that fails to import is listed with its error.
    """
    from kvcheck.declaration import Declaration
    from kvcheck.targets.sglang import env
    from kvcheck.targets.sglang.declaration import DECLARATION
    from kvcheck.targets.sglang.release import installed_release

    if declaration is None:
        declaration = DECLARATION
    if not isinstance(declaration, Declaration):
        raise ValueError(f"declaration={declaration!r} is not a Declaration")
    with warnings.catch_warnings(), env.torchvision_stand_in():
        warnings.simplefilter("ignore")
        bases = {}
        for qualified, kind in BASES:
            try:
                bases[_resolve(qualified)] = kind
            except (ImportError, AttributeError):
                continue  # a release without this base: its classes are found by name
        found = discover(PACKAGE, bases, name_suffixes=dict(NAME_SUFFIXES), aside=ASIDE)
    return census(found, declaration, release=release or installed_release())
