"""What the sglang target builds, refuses and cannot reach, as one table of typed rows.

The rows are about the newest checked release; reasons that name the release say
``{release}``, filled in with the installed one. What an installed release lacks (a
module, a class, a parameter) is read by :mod:`kvcheck.targets.sglang.release` and laid
over these rows when the target is prepared. Variants without a row here are built as
the bound surface (:data:`BOUND`) allows: the plain pool class of their family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from kvcheck.declaration import Builds, Declaration, Key, Refuses, Row
from kvcheck.specs import NVFP4_LAYOUTS
from kvcheck.steering import Steer, Steering
from kvcheck.surface import Surface
from kvcheck.targets.sglang.classes import CLASS_ROWS
from kvcheck.targets.sglang.reach import UNREACHED_ROWS
from kvcheck.tiers import ALLOCATOR_KINDS, HOST_LAYOUTS

__all__ = [
    "BOUND",
    "DECLARATION",
    "FP4_UNSIZED",
    "HOST_POOL_ADAPTERS",
    "HOST_STORAGE_STEER",
    "MHA_ON_META",
    "TIER_GUARDS",
    "declaration_for",
    "host_pool_adapter",
]

MHA_ON_META = (
    "sglang {release}'s {cls} calls torch.get_device_module(device) in its constructor, "
    "which raises for 'meta' (MLATokenToKVPool and DSATokenToKVPool do build on meta; "
    "docs/sglang-findings-appendix.md#d3)"
)

#: Why the target does not size the FP4 ``--kv-cache-dtype`` choices with sglang's
#: configurator on CPU.
FP4_UNSIZED = (
    "sglang's configurator counts FP4 payload halves, scales and dequant workspace only "
    "where is_float4_e2m1fn_x2(dtype) holds, which is `is_cuda() and ...`: without CUDA it "
    "sizes an FP4 cache at a byte per value with no scales; standing in for it would also "
    "have to choose the attention backends whose scale layouts and workspace the NVFP4 cell "
    "counts, so kvcheck would be checking its own choice rather than sglang's"
)
_NVFP4_GPU_ONLY = (
    "its writes quantize with flashinfer's nvfp4_kv_quantize (GPU only), whose bytes a CPU "
    "stand-in could only assume"
)

#: The outer bound of what the target draws: every family and variant kvcheck models,
#: inside the layouts sglang's DSA pool asserts: 64-token index pages ("DSA requires
#: 64-token physical pages": ``page_size // index_kpool == 64``) and 128-byte index keys.
#: DSA index kpools 1 and 2 only: 2 already takes 128-token pages; 4 (256) only makes
#: every example slower without reaching other code. The declaration's refused variants
#: and the installed release narrow it further.
BOUND = Surface.everything(
    dsa={"index_page_size": (64,), "index_head_dim": (128,), "index_kpool": (1, 2)},
    mha={"nvfp4_layout": (NVFP4_LAYOUTS[0],)},
).with_tiers(
    allocators=ALLOCATOR_KINDS,
    host_layouts=HOST_LAYOUTS,
    # sgl-kernel's kvcacheio ops check item_size % 8 == 0 (a row the kernel io cannot move).
    host_kernel_alignment=8,
)


def _variant(name: str, status: Builds | Refuses) -> Row:
    return Row(Key.variant(name), status)


def _host(of: str, status: Builds | Refuses) -> Row:
    return Row(Key.tier("host", of), status)


def _allocator(kind: str, status: Builds | Refuses) -> Row:
    return Row(Key.tier("allocator", kind), status)


def _capability(name: str, of: str, status: Builds | Refuses) -> Row:
    return Row(Key.capability(name, of), status)


_ROWS: tuple[Row, ...] = (
    # --- variants: how each quantized or re-laid-out pool is built, or why it is not
    _variant(
        "mha:fp8_scaled",
        Builds("MHATokenToKVPool with an fp8 dtype; writes carry k_scale/v_scale"),
    ),
    _variant(
        "mha:hnd",
        Builds("MHATokenToKVPool with SGLANG_USE_HND_KVCACHE=1 (env.hnd_kv_layout)"),
    ),
    _variant(
        "mha:cpu_fp8",
        Builds(
            "MHATokenToKVPool with quant_method get_kv_cache_quant_method('cpu_fp8_e4m3'), "
            "as sglang's configurator builds it on a CPU platform; all torch code"
        ),
    ),
    _variant(
        "mha:fp4_mx_block16",
        Builds(
            "MHATokenToKVPool with quant_method get_kv_cache_quant_method('fp4_mx_block16', "
            "num_layers=, device=, page_size=); its quantizer is torch code (torch.compile)"
        ),
    ),
    _variant(
        "mha:mxfp8",
        Builds(
            "MHATokenToKVPoolMXFP8 (interleaved scales at page size 128); on CPU its CUDA "
            "store_cache and Triton store_sf_interleaved and MXFP8 quant-store kernels run as "
            "CPU bodies (mxfp8_kernels), around the pool's own methods only"
        ),
    ),
    _variant(
        "mha:mxfp8:flat",
        Builds("MHATokenToKVPoolMXFP8 off 128-token pages (flat scales), CPU bodies as above"),
    ),
    _variant("mha:nvfp4", Refuses(_NVFP4_GPU_ONLY)),
    _variant("mha:nvfp4:native", Refuses(_NVFP4_GPU_ONLY)),
    _variant(
        "mla:fp4",
        Builds(
            "MLATokenToKVPoolFP4; on CPU set_mla_kv_buffer's scale-row Triton kernel runs "
            "as a CPU body (env.cpu_mla_scale_kernel)"
        ),
    ),
    _variant(
        "dsa:scaled",
        Builds(
            "DSATokenToKVPool with an fp8 dtype (scaled latent rows); set_mla_kv_buffer runs "
            "sglang's Python path with its quantizing Triton kernel replaced by a CPU body "
            "that transcribes it in IEEE float32 (the GPU's own rounding is not checked)"
        ),
    ),
    # --- host tiers of device variants that sglang 0.5.23 builds in fewer layouts than
    # the family's. Where it builds none, the refusal is a clear error at construction,
    # which a server with --enable-hierarchical-cache meets at startup
    # (hybrid_pool_assembler._mha_host_inputs, get_mha_host_pool_cls), not a defect.
    _host(
        "mha:mxfp8",
        Builds(
            "MHATokenToKVPoolMXFP8Host takes the page_first layout only "
            "(NotImplementedError otherwise), its scales moved as whole-page rows by the "
            "staged JIT kernels",
            only=("page_first",),
        ),
    ),
    _host(
        "mha:mxfp8:asymmetric",
        Refuses(
            "get_mha_host_pool_cls: 'MXFP8 HiCache does not support asymmetric K/V head "
            "dimensions yet' (NotImplementedError)"
        ),
    ),
    _host(
        "mha:mxfp8:flat",
        Refuses(
            "MHATokenToKVPoolHost refuses any KV scale layout but MXFP8_INTERLEAVED "
            "(ValueError: 'MHA host transfers do not support KV scale layout'); the MXFP8 "
            "host pool requires the interleaved (page_size=128) layout"
        ),
    ),
    _host(
        "mha:fp4_mx_block16",
        Refuses(
            "MHATokenToKVPoolHost refuses the pool's token-major FP4 scales (ValueError: "
            "'MHA host transfers do not support KV scale layout 'token''), at construction"
        ),
    ),
    _host(
        "mla:fp4",
        Refuses(
            "MLATokenToKVPoolHost refuses FP4 (ValueError: 'MLA host cache does not support "
            "target FP4 KV: packed payload and separate block scales cannot be restored')"
        ),
    ),
    # --- allocators: how each kind is built, at the page sizes sglang's configurator builds
    # it at (kv_cache_configurator._build_token_to_kv_pool_allocator: kvcheck.tiers.
    # ALLOCATOR_PAGE_SIZES). What a release lacks narrows these (_RELEASE_ROWS).
    _allocator(
        "token",
        Builds(
            "TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort), page size 1 (its "
            "constructor passes it): the configurator's pick for --page-size 1 without decode "
            "context parallelism, and each side of an SWA allocator at page size 1"
        ),
    ),
    _allocator(
        "paged",
        Builds(
            "PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort) at "
            "page sizes 2 and up: the configurator builds it at --page-size x attn_dcp_size "
            "when that is above 1 (and at DeepSeek V4's, HiSparse's and the SWA sides' pages), "
            "never at page size 1 on CUDA or CPU; on CPU alloc_extend and alloc_decode run "
            "their torch bodies (alloc_extend_naive, alloc_decode_naive)"
        ),
    ),
    _allocator(
        "swa",
        Builds(
            "SWATokenToKVPoolAllocator(size, size_swa, page_size, ...) over a small SWAKVPool, "
            "at the --page-size the configurator passes as it is: at page size 1 its two sides "
            "are TokenToKVPoolAllocators (alloc), above it PagedTokenToKVPoolAllocators "
            "(alloc_extend, alloc_decode)"
        ),
    ),
    _allocator(
        "pure_swa",
        Builds(
            "PureSWATokenToKVPoolAllocator over a small SWAKVPool, at page size 1 only: its "
            "constructor asserts page_size == 1, while the configurator passes --page-size as "
            "it is (a model whose every layer is sliding-window fails there at startup above "
            "page size 1)",
            only=(1,),
        ),
    ),
    # --- capabilities: what the target cannot serve on any release, and how it serves
    # on CPU what needs a GPU in sglang
    _capability("meta_device", "mha", Refuses(MHA_ON_META.replace("{cls}", "MHATokenToKVPool"))),
    _capability(
        "meta_device", "noop", Refuses(MHA_ON_META.replace("{cls}", "NoOpMHATokenToKVPool"))
    ),
    # Declared rather than expected to fail, so that the differential machines still
    # compare sglang's pools byte for byte on valid operations; each missing check is
    # pinned as a strict expected failure in tests/targets/test_sglang_findings.py.
    _capability(
        "input_validation",
        "",
        Refuses(
            "sglang {release} pools do not validate their arguments (negative or "
            "out-of-range locations, duplicate targets, wrong shapes or dtypes, skip-layer "
            "index writes: findings I1-I9 and I10 in docs/sglang-findings-appendix.md#i)"
        ),
    ),
    # Contract differences that are not filed: nothing in sglang says a quantized dtype
    # must be refused there; kvcheck simply has no such pool to compare with.
    _capability(
        "quantized_configurator",
        "mla",
        Refuses(
            "sglang {release} serves --kv-cache-dtype mxfp8 on an MLA model with its plain "
            "fp8 MLATokenToKVPool (no block scales), where kvcheck has no MXFP8 MLA pool and "
            f"its reference refuses; and FP4 is not sized ({FP4_UNSIZED})"
        ),
    ),
    _capability(
        "quantized_configurator",
        "dsa",
        Refuses(
            "sglang {release} sizes --kv-cache-dtype mxfp8 on a DSA model as its scaled fp8 "
            "DSA row (no block scales), where kvcheck has no quantized DSA pool and its "
            f"reference refuses; and FP4 is not sized ({FP4_UNSIZED})"
        ),
    ),
    _capability("quantized_configurator", "nvfp4", Refuses(FP4_UNSIZED)),
    _capability("quantized_configurator", "fp4_mx_block16", Refuses(FP4_UNSIZED)),
    _capability(
        "quantized_configurator",
        "mxfp8",
        Builds(
            "sized as on an SM100+ server: sglang's server-args hook "
            "(handle_mxfp8_kv_cache_compatibility) refuses it on any other machine, but the "
            "configurator and the MXFP8 pool's constructor do not read the GPU"
        ),
    ),
    _capability(
        "index_k_write",
        "",
        Builds(
            "set_index_k_scale_buffer runs sglang's Python checks, but its Triton kernel is "
            "replaced by a CPU body that writes the documented byte layout (key bytes at "
            "offset*128 of the page row, fp32 scale after the page's keys)"
        ),
    ),
    _capability(
        "mla_write",
        "",
        Builds(
            "set_mla_kv_buffer runs sglang's own torch body (set_mla_kv_buffer_naive, its "
            "path for platforms without Triton); get_mla_kv_buffer runs sglang's Python path "
            "with the two Triton gather kernels replaced by a CPU body that gathers the same "
            "rows"
        ),
    ),
    _capability(
        "move",
        "",
        Builds(
            "MHA pools are built with SGLANG_NATIVE_MOVE_KV_CACHE=1, sglang's tensor-indexing "
            "move; on CUDA the Triton copy (enable_kv_cache_copy=True) is used"
        ),
    ),
    _capability(
        "host_copy",
        "",
        Builds(
            "DSA host copies call torch.cuda.synchronize(), which is a no-op during the call "
            "on a CPU-only torch"
        ),
    ),
    _capability(
        "swa_pool",
        "",
        Builds(
            "SWAKVPool(full_kv_pool_class=, swa_kv_pool_class=, *_kv_pool_kwargs=) with each "
            "side built as make_pool builds that family (MHA: native move; MLA: latent scope), "
            "over the target's SWATokenToKVPoolAllocator, which registers its mapping"
        ),
    ),
    _capability(
        "swa_machine",
        "dsa",
        Refuses(
            "sglang {release}'s DSA sub-pools assert 64-token index pages, and a hybrid of "
            "them is too slow for a state machine's examples on CPU; the MHA and MLA hybrids "
            "run the same SWAKVPool code (the DSA hybrid's census runs)"
        ),
    ),
    _capability(
        "pool_selection",
        "",
        Builds(
            "sglang's FP4 check (is_float4_e2m1fn_x2) is False without CUDA, so on CPU an FP4 "
            "KV dtype does not make the pool-family check reject the no-op pool"
        ),
    ),
)

#: Host tiers without flat storage (L3) pages: ``MHATokenToKVPoolMXFP8Host`` raises
#: NotImplementedError from get_data_page, set_from_flat_data_page,
#: get_dummy_flat_data_page and get_page_buffer_meta ("does not expose flat storage (L3)
#: pages yet: a page's UE8M0 scales live outside kv_buffer"); those checks are left out.
HOST_STORAGE_STEER = Steering({Steer("host:storage_pages", "mha:mxfp8")})

#: How the target builds host pools on each release: adapter -> the constructor it calls
#: (:func:`.host_pools.make_host_pool`). The installed release's adapter is the first whose
#: need (a :data:`.release.NEEDS` name, or none) it has (:func:`host_pool_adapter`).
HOST_POOL_ADAPTERS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "buffer_info": (
            "device_pool_info",
            "0.5.23 on: each host pool class takes the device pool's buffer info "
            "(get_device_pool_infos()[0].buffer_info), host_token_capacity and the device "
            "geometry, as the cache controller builds it",
        ),
        "device_pool": (
            "dsa_indexer_decl",
            "0.5.22: each host pool class takes the device pool itself and sizes itself as "
            "int(capacity * host_to_device_ratio) // page_size + 1 pages; the ratio is chosen "
            "to give the spec's host pages; DSAIndexerPoolHost takes "
            "make_dsa_indexer_pool_decl(device_pool) and its MLA anchor host",
        ),
        "device_pool_dsa_layout": (
            "",
            "0.5.21: as device_pool, but DSAIndexerPoolHost takes the DSA device pool, its "
            "MLA anchor host and the host layout itself (pool_host/dsa.py has no "
            "make_dsa_indexer_pool_decl), as 0.5.21's hybrid_pool_assembler builds it",
        ),
    }
)


def host_pool_adapter(missing: Mapping[str, str]) -> str:
    """The adapter of :data:`HOST_POOL_ADAPTERS` for a release that lacks ``missing``
    (need name -> why).

    Example:
        >>> host_pool_adapter({}), host_pool_adapter({"device_pool_info": "no module"})
        ('buffer_info', 'device_pool')
        >>> host_pool_adapter({"device_pool_info": "no module", "dsa_indexer_decl": "no decl"})
        'device_pool_dsa_layout'
    """
    return next(
        name for name, (need, _) in HOST_POOL_ADAPTERS.items() if not need or need not in missing
    )


#: The contracts sglang's allocators and host pools guard themselves, with the guard (an
#: ``assert``, on every call, not only under SGLANG_DEBUG_MEMORY_POOL): though the target
#: declares no input validation, each is checked for every input of its kind
#: (:mod:`kvcheck.properties.guards`), on every checked release.
TIER_GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "segment_start": "BaseTokenToKVPoolAllocator.free_segment / free_full_segment and "
        "the paged and SWA overrides assert start_pos % page_size == 0",
        "nested_free_group": "free_group_begin asserts 'free groups cannot be nested'",
        "segments_share_page": "free_segments / free_full_segments assert (_page_disjoint) "
        "that no two segments share a page (after freeing the segments before: F1)",
        "host_partial_page": "HostKVCache.alloc asserts need_size is a multiple of the page size",
        "host_double_free": "HostKVCache.free asserts every slot is allocated ('Double-free "
        "detected')",
    }
)

#: The sglang target's declaration (its findings are added by the target, per release):
#: the rows above, the upstream code ranges the suite cannot reach
#: (:data:`.reach.UNREACHED_ROWS`), and every pool class of ``srt/mem_cache``, built or not
#: (:data:`.classes.CLASS_ROWS`).
DECLARATION = Declaration(rows=(*_ROWS, *UNREACHED_ROWS, *CLASS_ROWS))


def _token_sides_only(why: str) -> Builds:
    return Builds(
        "SWATokenToKVPoolAllocator at page size 1 only, whose two sides are "
        "TokenToKVPoolAllocators (plain torch): above it its sides are "
        f"PagedTokenToKVPoolAllocators, whose extend and decode slots need Triton ({why})",
        only=(1,),
    )


#: Pieces of the release (:data:`.release.NEEDS` names) rows need, and what each row says
#: without the first one missing (given why it is missing): a refusal quoting why, or fewer
#: page sizes.
_RELEASE_ROWS: tuple[tuple[Key, tuple[str, ...], Callable[[str], Builds | Refuses]], ...] = (
    (Key.tier("host", "mha:mxfp8"), ("host_mxfp8", "hicache_jit"), Refuses),
    # 0.5.21's paged allocator hands out extend and decode slots with Triton kernels only.
    (Key.tier("allocator", "paged"), ("paged_alloc_torch",), Refuses),
    (Key.tier("allocator", "swa"), ("paged_alloc_torch",), _token_sides_only),
)


def declaration_for(findings: tuple[object, ...], missing: Mapping[str, str]) -> Declaration:
    """:data:`DECLARATION` with ``findings``, and in place of each row whose pieces the
    installed release lacks (``missing``: need name -> why, as the release probe reads it)
    what it says then (:data:`_RELEASE_ROWS`).

    Example:
        >>> declared = declaration_for((), {"hicache_jit": "no JIT kernels"})
        >>> declared.why_not(Key.tier("host", "mha:mxfp8"))
        'no JIT kernels'
        >>> declared = declaration_for((), {"paged_alloc_torch": "Triton only"})
        >>> declared.why_not(Key.tier("allocator", "paged"))
        'Triton only'
        >>> declared.allocator_page_sizes()["swa"][0]
        (1,)
    """
    declared = Declaration(rows=DECLARATION.rows, findings=findings)
    overlaid = [
        Row(key, without(why))
        for key, needs, without in _RELEASE_ROWS
        if (why := next((missing[need] for need in needs if need in missing), None))
    ]
    return declared.overlaid(*overlaid)
