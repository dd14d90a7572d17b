"""What ``python tools/reach.py --target sglang`` measures, and why each gap stays a gap.

:data:`SCOPES` names the parts of sglang 0.5.23 that the sglang target drives: the four pool
classes with their ``KVCache`` base and the index-K cache (the headline), the pool
configurator, the pool-family check and the ``--prefill-only-disable-kv-cache`` validation.
:data:`UNREACHED_CODE` and :data:`TIER_REASONS` explain the lines the shipped suite leaves
unreached, keyed by file, qualified method name (a glob) and, where only part of a method
is explained, a regular expression over the unreached lines and the header of the block
that holds them (see :class:`kvcheck.declaration.Reason`); they are rows of the target's
declaration (:data:`UNREACHED_ROWS`). No entry names a line number, so the table survives
sglang reformatting its code; a range no entry explains is reported as ``UNEXPLAINED``.

Example:
    >>> sorted({scope.file for scope in SCOPES if scope.headline})
    ['srt/mem_cache/index_key_cache.py', 'srt/mem_cache/memory_pool.py']
"""

from __future__ import annotations

from kvcheck.declaration import Reason
from kvcheck.targets.base import Scope

#: The package whose files the scopes name (paths below are relative to its directory).
PACKAGE = "sglang"

MEMORY_POOL = "srt/mem_cache/memory_pool.py"
INDEX_KEY_CACHE = "srt/mem_cache/index_key_cache.py"
POOL_CONFIGURATOR = "srt/model_executor/pool_configurator.py"
KV_CACHE_CONFIGURATOR = "srt/mem_cache/kv_cache_configurator.py"
KV_CACHE_HOOK = "srt/arg_groups/kv_cache_hook.py"
#: The allocators and host pools the sglang target builds (kvcheck.targets.sglang.allocators,
#: .host_pools), each file its own scope.
ALLOCATOR_FILES = tuple(
    f"srt/mem_cache/allocator/{name}.py" for name in ("base", "token", "paged", "swa")
)
HOST_POOL_FILES = tuple(
    f"srt/mem_cache/pool_host/{name}.py"
    for name in ("base", "common", "mha", "mla", "dsa", "mha_mxfp8")
)

POOL_CLASSES = (
    "KVCache",
    "MHATokenToKVPool",
    "NoOpMHATokenToKVPool",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolMXFP8",
    "DSATokenToKVPool",
)

SCOPES: tuple[Scope, ...] = (
    Scope(MEMORY_POOL, POOL_CLASSES, headline=True),
    Scope(INDEX_KEY_CACHE, None, headline=True),
    # What SGLangTarget.cell_size_bytes / max_total_num_tokens reach.
    Scope(
        POOL_CONFIGURATOR,
        (
            "MemoryPoolConfig",
            "MemoryPoolConfigurator",
            "DefaultPoolConfigurator",
            "create_memory_pool_configurator",
            "_dflash_draft_cell_size",
            "_get_dsa_cache_layer_ids",
        ),
    ),
    # What SGLangTarget.select_pool_family and skip_topk_layers reach.
    Scope(
        KV_CACHE_CONFIGURATOR,
        (
            "KVCacheConfigurator._validate_prefill_only_disable_kv_cache_pool_family",
            "_should_elide_dsa_index_k",
        ),
    ),
    # What SGLangTarget.validate_server_args reaches.
    Scope(
        KV_CACHE_HOOK,
        ("validate_prefill_only_disable_kv_cache_args", "handle_prefill_only_disable_kv_cache"),
    ),
    # What SGLangTarget.make_allocator and make_host_pool build (the allocator machine, the
    # host round trip, the lifecycle machine).
    *(Scope(path) for path in ALLOCATOR_FILES + HOST_POOL_FILES),
)

# Reasons, one vocabulary (the issue's): where a line can only run, or why it never does.
GPU_ONLY = "CUDA/HIP/XPU only: a GPU kernel (Triton, AITER, CUDA graph capture) or stream"
VARIANT = (
    "a pool mode kvcheck does not model (the vectorized_5d layout or an explicit "
    "kv_cache_layout label, DCP's write mask on MHA and its replicated and resolved-loc "
    "modes, unified pools, zero-layer or layer-sharded pools)"
)
POST_CAPTURE = (
    "CUDA only: post-capture VMM backing (KV buffers mapped after CUDA graph capture, "
    "post_capture_active), which a pool on a CPU torch never takes"
)
NVFP4_GPU = (
    "nvfp4 KV only: sglang quantizes its writes with flashinfer's nvfp4_kv_quantize, a CUDA "
    "kernel with no CPU build, so the target builds no nvfp4 pool; its global scales, "
    "TRT-LLM native scales and FlashInfer dequant workspaces feed those GPU attention "
    "backends of a launched server"
)
SERVING_ONLY = (
    "called only inside a launched server: layer-wise transfer waits, HiCache host-pool "
    "assembly, PD-disaggregation custom memory pools"
)
ABSTRACT = "unreachable: the abstract base's body, overridden by every pool"
DEAD = "unreachable: no caller anywhere in sglang 0.5.23"
MHA_FP4_UNBUILT = (
    "unreachable: nothing in sglang 0.5.23 builds MHATokenToKVPoolFP4 (its configurator "
    "builds FP4 MHA caches as MHATokenToKVPool with a quant method; only kv_canary's patch "
    "table names the class)"
)
FP4_NO_ROPE = (
    "an MLA FP4 latent without a rope part (qk_rope_head_dim 0): no MLA checkpoint has one, "
    "so kvcheck draws FP4 pools with a rope part (sglang's scale-row kernel call would then "
    "read the shape of None)"
)
FP4_STORE_DTYPE = (
    "unreachable: MLATokenToKVPoolFP4 always stores uint8 for its float4_e2m1fn_x2 dtype, "
    "so the branches for a pool storing its own dtype (or fp8 DSA rows) never run"
)
MXFP8_FLAT = (
    "steered around findings Q14 and Q15: a flat-scale MXFP8 pool (page_size != 128) refuses "
    "every write (Q14), and on a CPU torch its moves and reloads raise at these scale stores "
    "(Q15), so the suite draws no write, move or reload there, nor a fused (scale-less) write, "
    "which kvcheck's own pool refuses off 128-token pages as sglang does"
)
MXFP8_DIMS = (
    "the MXFP8 pool's construction refusals: the suite draws head dims that are multiples of "
    "32 on a torch with float8_e8m0fnu (kvcheck's own pool raises the same ValueError)"
)
STEERED_T3 = (
    "steered around finding T3: on CPU a host copy of a request's compress tails holds "
    "views of the pool, so the suite names no request slot in sglang's host copies"
)
NOT_SELECTION = (
    "configurator code outside what the target drives (KV sizing, pool building and "
    "allocators of a launched server; kvcheck calls the pool-family check, the skip-layer "
    "elision rule and DefaultPoolConfigurator's sizing)"
)
SPEC_DRAFT = (
    "speculative decoding (EAGLE/standalone/DFLASH draft sizing) or HiSparse draft scaling: "
    "the configurator kvcheck builds has no speculative algorithm"
)
OTHER_FAMILIES = (
    "a model family kvcheck's configurator cases do not build (hybrid SWA, Mamba/linear "
    "attention, DeepSeek V4, MiniMax sparse, QSA, NPU sparse offload, out-of-tree or Ascend "
    "platforms)"
)

NPU_ONLY = "Ascend NPU only (`_is_npu` branches)"
FP4_CPU = (
    "CUDA only: sglang's is_float4_e2m1fn_x2 is `is_cuda() and ...`, False on a CPU host "
    "(docs/sglang-findings.md, found by hand: FP4 MHA on CPU)"
)
CP_LAYER_SPLIT = "GLM DSA context-parallel layer split (shard_size > 1): one rank, one shard here"


def _guarded_by(regex: str) -> str:
    """A pattern found only in the header of the block holding a range, not its first line.

    Patterns are matched against the header followed by the range's first line; requiring a
    line break after the match keeps it off that last line. A method whose whole body went
    unreached starts its range at the guarding ``if`` itself and so is not explained by it.

    Example:
        >>> import re
        >>> bool(re.search(_guarded_by("use_hnd"), "if self.use_hnd:\\n    pages = loc"))
        True
        >>> bool(re.search(_guarded_by("use_hnd"), "if self.use_hnd:"))
        False
    """
    return rf"(?:{regex})[^\n]*\n"


_MP, _IKC, _PC, _KVC = MEMORY_POOL, INDEX_KEY_CACHE, POOL_CONFIGURATOR, KV_CACHE_CONFIGURATOR

UNREACHED_CODE: tuple[Reason, ...] = (
    # --- KVCache base ------------------------------------------------------------------------
    Reason(_MP, "KVCache.*", ABSTRACT, pattern=r"raise NotImplementedError"),
    Reason(_MP, "KVCache.host_pool_decls", SERVING_ONLY),
    Reason(_MP, "KVCache.register_layer_transfer_counter", SERVING_ONLY),
    Reason(_MP, "KVCache.maybe_get_custom_mem_pool", SERVING_ONLY),
    Reason(
        _MP, "KVCache._check_physical_write_loc", VARIANT, pattern=_guarded_by(r"requires_physical")
    ),
    Reason(_MP, "KVCache._finalize_allocation_log", POST_CAPTURE, pattern=r"post_capture_active"),
    # --- MHATokenToKVPool ---------------------------------------------------------------------
    Reason(
        _MP,
        "MHATokenToKVPool.__init__",
        VARIANT,
        pattern=_guarded_by(r"kv_cache_layout is not None"),
    ),
    Reason(_MP, "MHATokenToKVPool.__init__", GPU_ONLY, pattern=r"_init_kv_copy_and_warmup"),
    Reason(_MP, "MHATokenToKVPool._init_kv_copy_and_warmup", GPU_ONLY),
    Reason(_MP, "MHATokenToKVPool.get_device_pool_infos", SERVING_ONLY),
    Reason(_MP, "MHATokenToKVPool._mha_buffers", SERVING_ONLY),
    Reason(_MP, "MHATokenToKVPool._mha_scale_buffers", SERVING_ONLY),
    Reason(_MP, "MHATokenToKVPool._mha_buffer_info", SERVING_ONLY),
    # Reached by mha:cpu_fp8 and mha:fp4_mx_block16 up to the first return: neither method
    # declares a dequant workspace or native scales.
    Reason(
        _MP,
        "MHATokenToKVPool._check_quantized_buffer_access_requirements",
        "raises only for a quant method whose buffers disagree with the accesses it "
        "declares; the workspace checks after the first return are nvfp4's (not modelled)",
    ),
    Reason(_MP, "MHATokenToKVPool._assign_post_capture_tensors", POST_CAPTURE),
    Reason(_MP, "MHATokenToKVPool._alloc_post_capture_buffers", POST_CAPTURE),
    Reason(_MP, "MHATokenToKVPool._finalize_backing_tokens", POST_CAPTURE),
    Reason(_MP, "MHATokenToKVPool.finalize_backing", POST_CAPTURE),
    Reason(_MP, "MHATokenToKVPool.post_capture_backed_bytes", POST_CAPTURE),
    Reason(_MP, "MHATokenToKVPool._build_kv_buffer_descs", VARIANT, pattern=r"_kv_buffer_shapes\("),
    Reason(
        _MP,
        "MHATokenToKVPool._build_kv_buffer_descs",
        "unreachable: guards subclasses whose buffers do not lead with token or page rows",
        pattern=r"raise ValueError",
    ),
    Reason(_MP, "MHATokenToKVPool._clear_buffers", DEAD),
    Reason(_MP, "MHATokenToKVPool._quantized_scales", NVFP4_GPU, pattern=r"k_scales_gpu"),
    Reason(_MP, "MHATokenToKVPool._set_quantized_kv_buffer", NVFP4_GPU, pattern=r"native_"),
    Reason(
        _MP,
        "MHATokenToKVPool.get_raw_kv_buffer",
        "read only by attention backends that take packed FP4 with its scales (TRT-LLM MHA, "
        "the dequant workspaces); the suite reads FP4 pools dequantized (get_key_buffer) and "
        "compares the packed buffers and scales directly",
    ),
    Reason(_MP, "MHATokenToKVPool.get_dequant_workspace", NVFP4_GPU),
    Reason(_MP, "MHATokenToKVPool.get_flashinfer_*dequant_workspace_kv_buffer", NVFP4_GPU),
    Reason(_MP, "MHATokenToKVPool._to_cpu_int_list", NVFP4_GPU),
    Reason(_MP, "MHATokenToKVPool._prepare_dequant_*_workspace", NVFP4_GPU),
    Reason(_MP, "MHATokenToKVPool.set_kv_buffer", GPU_ONLY, pattern=r"masked_set_kv_buffer_kernel"),
    # On CPU the method returns through set_kv_buffer before its CUDA/HIP tail.
    Reason(
        _MP,
        "MHATokenToKVPool.set_kv_buffer_prefix_valid",
        GPU_ONLY,
        pattern=(
            r"if self\.v_row_dim != self\.row_dim|fused_[kv]_scale = "
            r"|cache_k\.dtype != self\.dtype\s*$"
        ),
    ),
    Reason(
        _MP, "MHATokenToKVPool._move_kv_cache_impl", GPU_ONLY, pattern=r"N = tgt_loc\.numel\(\)"
    ),
    Reason(_MP, "MHATokenToKVPool._move_native_fp4_scales", NVFP4_GPU, pattern=r"nvfp4"),
    # --- MLATokenToKVPool ---------------------------------------------------------------------
    Reason(_MP, "MLATokenToKVPool.get_device_pool_infos", SERVING_ONLY),
    Reason(_MP, "MLATokenToKVPool._mla_buffer_info", SERVING_ONLY),
    Reason(_MP, "MLATokenToKVPool._clear_buffers", DEAD),
    Reason(_MP, "MLATokenToKVPool._scatter_mla_rows", GPU_ONLY),
    Reason(
        _MP, "MLATokenToKVPool.get_mla_kv_buffer", GPU_ONLY, pattern=r"get_mla_kv_buffer_triton"
    ),
    Reason(_MP, "MLATokenToKVPool.*", VARIANT, pattern=_guarded_by(r"shape\[0\] == 0")),
    # --- DSATokenToKVPool ---------------------------------------------------------------------
    Reason(_MP, "MLATokenToKVPoolFP4._clear_buffers", DEAD),
    Reason(_MP, "MHATokenToKVPoolFP4.*", MHA_FP4_UNBUILT),
    # --- MHATokenToKVPoolMXFP8 (mha:mxfp8, mha:mxfp8:flat; reach not rerun) ---------------
    Reason(_MP, "MHATokenToKVPoolMXFP8._clear_buffers", DEAD),
    Reason(_MP, "MHATokenToKVPoolMXFP8._mha_scale_buffers", SERVING_ONLY),
    Reason(
        _MP,
        "MHATokenToKVPoolMXFP8._create_buffers",
        MXFP8_DIMS,
        pattern=r"raise (ValueError|RuntimeError)\(",
    ),
    Reason(
        _MP,
        "MHATokenToKVPoolMXFP8.*",
        MXFP8_FLAT,
        pattern=r"super\(\)\.move_kv_cache|self\.[kv]_scale_buffer\[idx\]\[(loc|tgt_loc)\] ="
        r"|requires K and V scale tensors",
    ),
    Reason(
        _MP, "MLATokenToKVPoolFP4.get_key_buffer", SERVING_ONLY, pattern=r"layer_transfer_counter"
    ),
    Reason(
        _MP,
        "MLATokenToKVPoolFP4.*",
        FP4_STORE_DTYPE,
        pattern=r"(return self\.kv_buffer\[layer_id - self\.start_layer\]|\[loc\] = cache_k)$",
    ),
    Reason(
        _MP,
        "MLATokenToKVPoolFP4.set_mla_kv_buffer",
        FP4_NO_ROPE,
        pattern=r"cache_k_rope_fp4 = None",
    ),
    Reason(
        _MP,
        "MLATokenToKVPoolFP4.set_mla_kv_buffer",
        FP4_STORE_DTYPE,
        pattern=_guarded_by(r"dsa_kv_cache_store_fp8"),
    ),
    Reason(_MP, "DSATokenToKVPool.host_pool_decls", SERVING_ONLY),
    Reason(_MP, "DSATokenToKVPool._clear_buffers", DEAD),
    Reason(_MP, "DSATokenToKVPool._should_allocate_index_layer", VARIANT),
    Reason(
        _MP,
        "DSATokenToKVPool.kpool_decode_update_index_cache",
        "runs sglang's kpool_fp8_index Triton kernels (decode-time compression of pooled "
        "index keys), which kvcheck neither models nor runs on CPU",
    ),
    Reason(
        _MP,
        "DSATokenToKVPool.*",
        STEERED_T3,
        pattern=r"tail_k_cpu = \[\]|for tail_k, tail_score",
    ),
    Reason(
        _MP,
        "DSATokenToKVPool.get_cpu_copy",
        STEERED_T3,
        pattern=_guarded_by(r"compress_tail is not None"),
    ),
    # --- IndexKeyCache ------------------------------------------------------------------------
    Reason(_IKC, "IndexKeyCache.*", GPU_ONLY, pattern=_guarded_by(r"_use_aiter_preshuffle")),
    Reason(_IKC, "IndexKeyCache.*", SERVING_ONLY, pattern=_guarded_by(r"layer_transfer_counter")),
    Reason(_IKC, "IndexKeyCache.clear", DEAD),
    # --- pool configurator --------------------------------------------------------------------
    Reason(_PC, "_dflash_draft_cell_size", SPEC_DRAFT),
    Reason(
        _PC,
        "DefaultPoolConfigurator.__init__",
        SPEC_DRAFT,
        pattern=_guarded_by(
            r"spec_algorithm|fused_full_entry|draft_num_layers|enable_hisparse|is_deepseek_dsa"
        ),
    ),
    Reason(
        _PC,
        "DefaultPoolConfigurator._compute_cell_size",
        OTHER_FAMILIES,
        pattern=_guarded_by(r"minimax|SPARSE_KV_OFFLOAD|offload_cell_size"),
    ),
    Reason(
        _PC,
        "DefaultPoolConfigurator._compute_cell_size",
        FP4_CPU,
        pattern=_guarded_by(r"float4"),
    ),
    Reason(_PC, "DefaultPoolConfigurator._compute_qsa_cell_size", OTHER_FAMILIES),
    Reason(
        _PC,
        "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
        SPEC_DRAFT,
        pattern=_guarded_by(r"allocate_all_layers|enable_hisparse"),
    ),
    Reason(
        _PC,
        "MemoryPoolConfig.__post_init__",
        "budget below one page: kvcheck's budgets always fit a page (finding 'too small a budget')",
    ),
    Reason(
        _PC,
        "_get_dsa_cache_layer_ids",
        SPEC_DRAFT,
        pattern=_guarded_by(r"len\(layer_ids\) != num_layers"),
    ),
    Reason(_PC, "DefaultPoolConfigurator.*", NPU_ONLY, pattern=_guarded_by(r"_is_npu")),
    Reason(
        _PC,
        "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
        CP_LAYER_SPLIT,
        pattern=_guarded_by(r"shard_size > 1"),
    ),
    Reason(_PC, "DefaultPoolConfigurator.calculate_pool_sizes_from_max_tokens", NOT_SELECTION),
    Reason(_PC, "MemoryPoolConfigurator.*", ABSTRACT, pattern=r"raise NotImplementedError"),
    Reason(_PC, "MemoryPoolConfigurator.finalize_with_max_running_requests", NOT_SELECTION),
    Reason(_PC, "MemoryPoolConfigurator.validate_swa_pool_size", OTHER_FAMILIES),
    Reason(
        _PC,
        "create_memory_pool_configurator",
        OTHER_FAMILIES,
        pattern=_guarded_by(r"is_deepseek_v4"),
    ),
    # --- pool-family check, skip-layer elision and the rest of KVCacheConfigurator ------------
    # Only the families kvcheck's model strategies never draw; MLA, SWA, hybrid MLA-SWA and
    # hybrid-linear models are drawn, so their lines stay UNEXPLAINED until reached.
    Reason(
        _KVC,
        "KVCacheConfigurator._validate_prefill_only_disable_kv_cache_pool_family",
        OTHER_FAMILIES,
        pattern=r"DeepSeekV4TokenToKVPool|out-of-tree platform|NPU/Ascend KV pool",
    ),
    Reason(_KVC, "_should_elide_dsa_index_k", NPU_ONLY, pattern=_guarded_by(r"_is_npu")),
    Reason(
        _KVC,
        "KVCacheConfigurator._validate_prefill_only_disable_kv_cache_pool_family",
        FP4_CPU,
        pattern=r"FP4 MHA KV pool",
    ),
    # --- steered findings, hardening and arguments the suite does not draw --------------------
    Reason(
        _MP,
        "MHATokenToKVPool.set_kv_buffer",
        "steered around finding W1 (the in-place division of the caller's tensor); reached by "
        "its pinned test tests/targets/test_sglang_findings.py::test_w1_*",
        pattern=r"\.div_\(",
    ),
    Reason(
        _MP,
        "MHATokenToKVPool.set_kv_buffer_prefix_valid",
        "hardening: sglang's own argument checks answer only malformed calls, which the suite "
        "does not make on a target without input_validation",
        pattern=r"raise ValueError",
    ),
    Reason(
        _MP,
        "MHATokenToKVPool.set_kv_buffer_prefix_valid",
        "argument conversions: the suite passes int64 slots and int32 lengths on the pool's "
        "device, so nothing is converted",
        pattern=r"\.to\(",
    ),
    Reason(
        _MP,
        "MHATokenToKVPool.set_kv_buffer_prefix_valid",
        "layer_id_override is not drawn: the suite passes a layer object",
        pattern=r"layer_id = layer_id_override",
    ),
    Reason(
        _MP,
        "MLATokenToKVPool._write_mla_kv_buffer",
        "set_mla_kv_buffer with a payload in another dtype is not drawn (writes of another "
        "dtype go through set_kv_buffer)",
        pattern=r"\.to\(self\.dtype\)",
    ),
    Reason(
        _MP,
        "MLATokenToKVPool.get_mla_kv_buffer",
        "qk_rope_head_dim == 0: the suite draws rope widths of 1 to 4",
        pattern=r"cache_k_rope = None",
    ),
    Reason(
        _MP,
        "KVCache.get_kv_buffer_shape",
        "read only by a launched server's eager runner (CUDA graph buffers); the shapes are "
        "those of get_kv_buffer(start_layer), which the read-API check compares",
    ),
    Reason(
        _MP,
        "KVCache.get_kv_cache_quant_method",
        "read only by a launched server's attention backends to find the pool's quant "
        "method; the suite passes the quant method itself",
    ),
    Reason(
        _MP,
        "MHATokenToKVPool.get_v_head_dim",
        "read only by the Triton attention backend for mamba2 configs served by a plain MHA "
        "pool, a model family kvcheck does not model",
    ),
    Reason(
        _MP,
        "DSATokenToKVPool.get_index_k_scale_buffer",
        "sglang's GetKAndS gathers keys and scales through a GPU kernel; not run on CPU",
    ),
    Reason(
        _IKC,
        "IndexKeyCache.get_buffer",
        "only GetKAndS (a GPU kernel) reads index keys through it",
    ),
    Reason(
        _IKC,
        "IndexKeyCache.get_k_and_scale",
        "sglang's GetKAndS gathers keys and scales through a GPU kernel; not run on CPU",
    ),
    Reason(_PC, "_get_dsa_cache_layer_ids", OTHER_FAMILIES, pattern=r"mambaish"),
    Reason(_PC, "DefaultPoolConfigurator.__init__", OTHER_FAMILIES, pattern=r"mambaish"),
    Reason(_PC, "create_memory_pool_configurator", OTHER_FAMILIES, pattern=r"is_hybrid_swa|DSV4"),
    # --- layout, quantization and GPU branches shared by every pool (after the specific
    # entries above, so that a method's own reason wins) ---------------------------------
    # vectorized_5d, and the HND lines the suite cannot reach on CPU (its CUDA write
    # kernel, the layout label that switches HND off): only the branches they guard
    # (`assert not self.use_hnd` opens methods every pool runs, so it must not explain them).
    Reason(_MP, "*", VARIANT, pattern=_guarded_by(r"use_hnd|vectorized_5d")),
    Reason(
        _MP,
        "*",
        GPU_ONLY,
        pattern=_guarded_by(r"_use_aiter|aiter_|\b_is_hip\b|\bis_xpu\(|\b_is_xpu\b"),
    ),
    Reason(_MP, "*", GPU_ONLY, pattern=_guarded_by(r"\b_is_cuda\b|get_is_capture_mode")),
    Reason(_MP, "*", POST_CAPTURE, pattern=_guarded_by(r"post_capture")),
    Reason(_MP, "*", NVFP4_GPU, pattern=_guarded_by(r"\bdq_[kv]_buffer|native_[kv]_scale")),
    Reason(
        _MP,
        "*",
        VARIANT,
        pattern=_guarded_by(r"dcp_kv_mask|dcp_replicated|write_loc_is_dcp_resolved"),
    ),
    Reason(_MP, "*", SERVING_ONLY, pattern=_guarded_by(r"layer_transfer_counter")),
    Reason(_MP, "*", VARIANT, pattern=_guarded_by(r"layer_num == 0|layer_shard")),
)

# --- allocators and host pools (issue 24) ----------------------------------------------------
_AB, _AT, _AP, _AS = ALLOCATOR_FILES
_HB, _HC, _HMHA, _HMLA, _HDSA, _HMX = HOST_POOL_FILES

ALLOCATOR_HOOKS = (
    "scheduler hooks a launched server calls around the allocator (prefill budgets, "
    "reclaim before preallocation, eviction from a prefix-sharing tree cache, resize, debug "
    "prints, Mamba and shared-pool hooks, transfer events); the suite checks the allocation "
    "API and the decode-capacity, preallocation-fit, byte-accounting, size and transfer-id hooks"
)
DEBUG_MEMORY_POOL = "SGLANG_DEBUG_MEMORY_POOL only (debug-mode assertions and duplicate checks)"
HOST_PINNED = (
    "CUDA/HIP pinned host memory (cudaHostRegister, hipHostMalloc, device-accessible "
    "pointers): on CPU the target builds host pools with pin_memory=False"
)
HOST_SERVING = (
    "multi-rank or storage-backend setup of a launched server (torch.distributed host sizing, "
    "shared host layouts, host-memory budgets, L3 storage and shm allocators)"
)
HOST_JIT = (
    "CUDA/HIP only: the JIT HiCache transfer kernels and write-back staging (can_use_jit, "
    "hicache_device_kernels: False on CPU, where sglang takes the kvcacheio ops)"
)
HOST_OTHER_CLASSES = (
    "host pool classes the target does not build: MHATokenToKOnlyPoolHost (MiniMax index-K), "
    "HiSparseMHATokenToKVPoolHost (HiSparse), DSAIndexerHostPoolBuilder (the hybrid pool "
    "assembler's path to DSAIndexerPoolHost, which the target builds directly)"
)
HOST_MXFP8_REFUSALS = (
    "refusals of MXFP8 host tiers the target never asks for: other layouts, flat or "
    "asymmetric scales and drafts (the sglang declaration leaves them out: sglang refuses "
    "them at construction), a host page size of its own (the target's is the device's), "
    "another io backend (page_first transfers with 'kernel'), a device without the staged JIT "
    "kernel (their CPU bodies stand in), and loads of a layer the pool does not serve"
)
HOST_MXFP8_STORAGE = (
    "the MXFP8 host pool has no flat storage (L3) pages: each accessor raises "
    "NotImplementedError, and the suite leaves those checks out for it "
    "(SGLangTarget.host_storage_steer)"
)
HOST_XPU = (
    "Intel XPU only: `_is_xpu` checks the kvcacheio op table (`_kvcacheio_ops`) at construction"
)
HOST_PAGE_UNIFIED = (
    "the page_unified layout: the unified L3 byte order the unified host pool "
    "(pool_host/unified.py, not built) transfers with its JIT kernels; these host pools only "
    "allocate it, and their own transfers, data pages and page meta refuse it"
)
HOST_NPU_SPLIT = (
    "Ascend NPU only: the page_first_kv_split layout over MLASplitBuffers, which only "
    "NPUMLATokenToKVPool publishes (kernel_ascend transfers, indexer slots, split page meta)"
)
HOST_STRIDED_ROWS = (
    "strided device rows: only the unified pool's token-major per-layer views are "
    "non-contiguous; every device pool the target builds hands over packed rows"
)
HOST_LAYOUT_SETTLED = (
    "unreachable: the constructor already refused any other layout (the transfers, data "
    "pages and page meta of a pool built only in its own layouts)"
)
HOST_OVERRIDDEN = (
    "unreachable: the base's default, overridden by every host pool class the target builds"
)
HOST_MERGE_GUARD = (
    "unreachable: alloc merges released slots only when it needs more than the free list "
    "and no more than free plus released slots, so some are released"
)
HOST_SKIPPED_LAYER = (
    "a load of a layer this host pool holds no rows for (a layer-sharded rank's foreign "
    "layer, or an id outside the pool) returns silently; the suite loads held layers and "
    "sends bad input only to targets with input_validation"
)
HOST_BUFFER_INFO_REFUSALS = (
    "refusals of buffer infos no device pool the target builds publishes: an MHA KV scale "
    "layout other than MXFP8's (quantized host tiers), or K/V without pointer tables"
)
HOST_MEMORY_SHORT = (
    "a host pool larger than the host memory budget (the suite's pools take kilobytes)"
)
HOST_SOME_SEEDS = (
    "driven by the host storage check for some draws only, not seed 0's: the io-backend "
    "refusals of an asymmetric MHA pool in page_first, a flat data page set into a "
    "layer_first MHA pool of two or more host pages"
)
HOST_LAYER_SPLIT = (
    "layer-sharded host pools: only LayerSplitDSATokenToKVPool "
    "(srt/mem_cache/dsa_cache_layer_split.py) sets layer_shard_enabled, a device pool the "
    "target does not build yet (to do with it: the owned layer range, per-layer backups)"
)
HOST_TO_DO = (
    "reachable on CPU, not driven by the suite yet (to do): host-pool drafts (packed MTP "
    "draft layers and their refusals), decode-context-parallel and dummy (allocator-only) "
    "host pools, the FP4 MLA host refusal (quantized host tiers), the refusal of an "
    "unaligned host_token_capacity and DSA index-K transfers of part of a page (bad input, H1)"
)
SWA_REQ_RING = (
    "the per-request SWA ring mode: only DeepSeekV4TokenToKVPool sets swa_req_ring_size (its "
    "compressed-state ring), a pool the target does not build, and the mode counts window "
    "capacity in the scheduler's req_to_token_pool slots"
)
EMPTY_GUARD = (
    "an empty-index guard no allocator call reaches: every caller (free_swa, "
    "free_swa_segment, alloc_extend_swa_tail) returns on an empty index or passes a non-empty one"
)
PURE_SWA_GUARDS = (
    "the pure-SWA allocator's guards against its parent's paths: only alloc_extend and "
    "alloc_extend_swa_tail (which it refuses at page size 1, checked) call "
    "new_pages_available, and nothing of its own writes the identity full-to-window mapping"
)
COMPOSITE_CENSUS = (
    "the SWA composites keep no page list of their own (free_pages None): the suite takes "
    "the free-page census of each side (full_attn_allocator, swa_attn_allocator)"
)
ALLOCATORS_TO_DO = (
    "reachable on CPU, not driven by the suite yet (to do): the allocators' host-copy "
    "delegations (get_cpu_copy / load_cpu_copy forward to the device pool: the scheduler's "
    "retraction offload; the pools' own host copies are checked)"
)

TIER_REASONS: tuple[Reason, ...] = (
    # --- allocators ---------------------------------------------------------------------------
    Reason(_AB, "BaseTokenToKVPoolAllocator.*", ABSTRACT, pattern=r"raise NotImplementedError"),
    Reason(_AB, "BaseTokenToKVPoolAllocator.available_size", ABSTRACT),
    Reason(_AB, "BaseTokenToKVPoolAllocator.get_all_free_pages", COMPOSITE_CENSUS),
    *(
        Reason(_AB, f"BaseTokenToKVPoolAllocator.{name}", ALLOCATOR_HOOKS)
        for name in (
            "create_prefill_budget",
            "check_decode_capacity",
            "evict_to_free_tokens",
            "get_extend_allocation_demand",
            "max_new_tokens_for_memory",
            "prealloc_*",
            "request_slot_reserve",
            "set_hicache_transfer_done_event",
            "verify_byte_accounting",
            "debug_print",
            "mamba_full_cache_donor",
            "translate_kv_indices_for_transfer",
            "get_kvcache",
            "resize",
            "size_full",
        )
    ),
    *(
        Reason(_AS, f"*SWATokenToKVPoolAllocator.{name}", ALLOCATOR_HOOKS)
        for name in (
            "create_prefill_budget",
            "evict_to_free_tokens",
            "reclaim_for_prealloc",
            "debug_print",
            "swa_capacity_and_available",
            "_conserve_*",
            "translate_swa_indices_for_transfer",
            "get_kvcache",
            "resize",
            "size",
            "size_full",
            "size_swa",
            "swa_req_ring",
            "swa_ring_cost_tokens",
        )
    ),
    Reason(_AP, "PagedTokenToKVPoolAllocator.__init__", GPU_ONLY, pattern=r"try:|_is_hip|unique"),
    Reason(_AP, "PagedTokenToKVPoolAllocator.alloc*", GPU_ONLY, pattern=r"_kernel\["),
    Reason(_AP, "PagedTokenToKVPoolAllocator.*", DEBUG_MEMORY_POOL, pattern=r"assert|_debug_"),
    Reason(_AP, "PagedTokenToKVPoolAllocator._debug_check_no_duplicate_pages", DEBUG_MEMORY_POOL),
    Reason(_AS, "*", NPU_ONLY, pattern=r"import torch_npu"),
    Reason(_AS, "SWATokenToKVPoolAllocator.__init__", NPU_ONLY, pattern=r"NPU|npu"),
    Reason(_AS, "SWATokenToKVPoolAllocator.__init__", GPU_ONLY, pattern=r"platform_allocator_cls"),
    Reason(_AS, "SWATokenToKVPoolAllocator._free_swa_pages_cuda", GPU_ONLY),
    Reason(_AS, "SWATokenToKVPoolAllocator._free_swa_pages", GPU_ONLY, pattern=r"_cuda\("),
    Reason(_AS, "SWATokenToKVPoolAllocator.alloc_decode", NPU_ONLY, pattern=r"indices_2d|npu"),
    Reason(
        _AS, "SWATokenToKVPoolAllocator.clear_full_to_swa_mapping", NPU_ONLY, pattern=r"_is_npu"
    ),
    Reason(_AS, "SWATokenToKVPoolAllocator.*", DEBUG_MEMORY_POOL, pattern=r"debug_mode"),
    Reason(_AS, "SWATokenToKVPoolAllocator.*", SWA_REQ_RING, pattern=r"_swa_req_ring"),
    Reason(_AS, "is_swa_req_ring", SWA_REQ_RING),
    Reason(_AS, "*.clear_full_to_swa_mapping", EMPTY_GUARD, pattern=r"numel\(\) == 0"),
    Reason(
        _AP, "PagedTokenToKVPoolAllocator.free_page_ids", EMPTY_GUARD, pattern=r"numel\(\) == 0"
    ),
    Reason(_AS, "PureSWATokenToKVPoolAllocator.new_pages_available", PURE_SWA_GUARDS),
    Reason(_AS, "PureSWATokenToKVPoolAllocator.*_full_to_swa_mapping", PURE_SWA_GUARDS),
    # --- host pools ---------------------------------------------------------------------------
    Reason(_HB, "HostKVCache.*", ABSTRACT, pattern=r"raise NotImplementedError\(\)"),
    Reason(_HB, "HostKVCache.destroy", HOST_PINNED),
    Reason(
        _HB,
        "*",
        HOST_SERVING,
        pattern=r"host_size|budget|distributed|ranks|domain|shared_host|sync_fixed",
    ),
    *(
        Reason(_HB, name, HOST_SERVING)
        for name in (
            "host_memory_budget_*",
            "ranks_per_host",
            "shared_host_layout_domains",
            "sync_fixed_hicache_size",
            "uses_shared_host_layout",
        )
    ),
    *(
        Reason(_HC, name, HOST_PINNED)
        for name in (
            "_alloc_hip_host_tensor",
            "_cuda_host_*",
            "_hip_*",
            "_log_hip_owned_host_pool",
            "_resolve_device_accessible_ptr_fn",
            "alloc_with_pin_memory*",
            "make_kernel_ptr_table",
        )
    ),
    Reason(_HC, "alloc_with_host_register", HOST_PINNED, pattern=r"register|assert"),
    Reason(_HC, "ShmHostTensorAllocator.*", HOST_SERVING),
    Reason(_HC, "get_allocator_*", HOST_SERVING),
    *(
        Reason(path, "*", GPU_ONLY, pattern=r"from sgl_kernel|_kvcacheio import|sgl_kernel_npu")
        for path in (_HMHA, _HMLA, _HDSA)
    ),
    *(
        Reason(path, "*", HOST_JIT, pattern=r"jit_|can_use_|staging|staged|_is_cuda|_is_hip")
        for path in (_HMHA, _HMLA, _HDSA)
    ),
    *(
        Reason(path, "*", NPU_ONLY, pattern=r"npu|ascend|memfabric|kernel_ascend|_is_npu")
        for path in (_HMHA, _HMLA, _HDSA)
    ),
    Reason(_HMLA, "MLATokenToKVPoolHost._ascendc_*", NPU_ONLY),
    Reason(_HMLA, "MLATokenToKVPoolHost._build_ascendc_component_meta", NPU_ONLY),
    Reason(_HMLA, "MLATokenToKVPoolHost._launch_ascendc_kv_exchange", NPU_ONLY),
    Reason(_HMLA, "MLATokenToKVPoolHost._rewrite_host_base_to_dva", NPU_ONLY),
    Reason(_HMLA, "MLATokenToKVPoolHost._transfer_ascendc_sparse_copy", NPU_ONLY),
    Reason(_HMLA, "MLATokenToKVPoolHost._npu_*", NPU_ONLY),
    Reason(_HMHA, "MHATokenToKVPoolHost._npu_*", NPU_ONLY),
    Reason(_HMHA, "prepare_mha_write_back_staging", HOST_JIT),
    Reason(_HMHA, "MHATokenToKOnlyPoolHost.*", HOST_OTHER_CLASSES),
    Reason(_HMHA, "HiSparseMHATokenToKVPoolHost.*", HOST_OTHER_CLASSES),
    Reason(_HDSA, "DSAIndexerHostPoolBuilder.*", HOST_OTHER_CLASSES),
    Reason(
        _HMX,
        "MHATokenToKVPoolMXFP8Host.*",
        HOST_MXFP8_REFUSALS,
        pattern=r"raise (NotImplementedError|ValueError)\(\s*$|has no draft layers|^\s*return$",
    ),
    Reason(
        _HMX,
        "MHATokenToKVPoolMXFP8Host.backup_from_device_all_layer",
        GPU_ONLY,
        pattern=r"\.cpu\(\)",
    ),
    Reason(_HMX, "MHATokenToKVPoolMXFP8Host.destroy", HOST_PINNED),
    Reason(_HMX, "MHATokenToKVPoolMXFP8Host._storage_pages_unsupported", HOST_MXFP8_STORAGE),
    *(
        Reason(_HMX, f"MHATokenToKVPoolMXFP8Host.{name}", HOST_MXFP8_STORAGE)
        for name in (
            "get_data_page",
            "get_dummy_flat_data_page",
            "set_from_flat_data_page",
            "get_page_buffer_meta",
            "get_split_heads_page_buffer_meta",
        )
    ),
    *(Reason(path, "*", HOST_XPU, pattern=r"_kvcacheio_ops") for path in (_HMHA, _HMLA, _HDSA)),
    *(
        Reason(path, "*", HOST_PAGE_UNIFIED, pattern=r"page_unified")
        for path in (_HMHA, _HMLA, _HDSA)
    ),
    Reason(_HMLA, "MLATokenToKVPoolHost.*", HOST_NPU_SPLIT, pattern=r"MLASplitBuffers|_native"),
    Reason(_HMLA, "MLATokenToKVPoolHost.*", HOST_NPU_SPLIT, pattern=r"page_first_kv_split"),
    Reason(_HMLA, "MLATokenToKVPoolHost._indexer_slot_range_for_layer", HOST_NPU_SPLIT),
    Reason(_HMLA, "MLATokenToKVPoolHost._warn_draft_indexer_skipped", HOST_NPU_SPLIT),
    Reason(_HMLA, "MLATokenToKVPoolHost.get_contiguous_buf_infos", HOST_NPU_SPLIT, r"x\.nbytes"),
    *(
        Reason(path, name, HOST_LAYOUT_SETTLED, pattern=r"Unsupported layout")
        for path, name in (
            (_HMHA, "MHATokenToKVPoolHost.get_data_page"),
            (_HMHA, "MHATokenToKVPoolHost.get_page_buffer_meta"),
            (_HMHA, "AsymmetricMHATokenToKVPoolHost.get_page_buffer_meta"),
            (_HMLA, "MLATokenToKVPoolHost.get_data_page"),
            (_HMLA, "MLATokenToKVPoolHost.set_from_flat_data_page"),
            (_HMLA, "MLATokenToKVPoolHost.get_page_buffer_meta"),
            (_HDSA, "DSAIndexerPoolHost.get_data_page"),
            (_HDSA, "DSAIndexerPoolHost.set_from_flat_data_page"),
            (_HDSA, "DSAIndexerPoolHost.get_page_buffer_meta"),
            (_HDSA, "DSAIndexerPoolHost.init_kv_buffer"),
        )
    ),
    Reason(_HMHA, "AsymmetricMHATokenToKVPoolHost.is_stride_page_aligned", HOST_LAYOUT_SETTLED),
    Reason(_HB, "HostKVCache._init_device_row_stride", HOST_STRIDED_ROWS),
    Reason(_HB, "HostKVCache.device_row_stride_bytes", HOST_STRIDED_ROWS),
    Reason(_HB, "HostKVCache._require_packed_device_rows", HOST_STRIDED_ROWS),
    Reason(_HB, "HostKVCache.is_stride_page_aligned", HOST_OVERRIDDEN),
    Reason(_HB, "HostKVCache._merge_release_slots", HOST_MERGE_GUARD, pattern=r"^\s*return$"),
    Reason(_HB, "HostKVCache._allocate_host_buffer", HOST_MEMORY_SHORT, r"available_bytes"),
    Reason(_HDSA, "DSAIndexerPoolHost.__init__", HOST_MEMORY_SHORT, r"available_bytes"),
    *(
        Reason(_HMHA, name, HOST_SKIPPED_LAYER, pattern=r"^\s*return$")
        for name in (
            "MHATokenToKVPoolHost.load_to_device_per_layer",
            "AsymmetricMHATokenToKVPoolHost.load_to_device_per_layer",
        )
    ),
    Reason(
        _HMLA, "MLATokenToKVPoolHost.load_to_device_per_layer", HOST_SKIPPED_LAYER, r"^\s*return$"
    ),
    Reason(
        _HMHA,
        "MHATokenToKVPoolHost.__init__",
        HOST_BUFFER_INFO_REFUSALS,
        pattern=r"scales|k_data_ptrs is None",
    ),
    Reason(_HMHA, "*._init_write_back_staging_buffers", HOST_JIT),
    Reason(
        _HMHA,
        "AsymmetricMHATokenToKVPoolHost.get_page_buffer_meta",
        HOST_LAYOUT_SETTLED,
        pattern=r"self\.layout not in",
    ),
    Reason(
        _HMHA,
        "MHATokenToKVPoolHost.set_from_flat_data_page",
        HOST_LAYOUT_SETTLED,
        pattern=r"Unsupported layout",
    ),
    Reason(
        _HMHA,
        "MHATokenToKVPoolHost.set_from_flat_data_page",
        HOST_SOME_SEEDS,
    ),
    *(
        Reason(
            _HMHA,
            f"AsymmetricMHATokenToKVPoolHost.{name}",
            HOST_SOME_SEEDS,
            r"!= .page_first_direct",
        )
        for name in ("load_to_device_per_layer", "backup_from_device_all_layer")
    ),
    Reason(_HMHA, "get_mha_host_pool_cls", HOST_MXFP8_REFUSALS, pattern=r"raise|asymmetric"),
    *(
        Reason(_HB, f"HostKVCache.{name}", HOST_LAYER_SPLIT)
        for name in (
            "_device_owned_layer_range",
            "_effective_host_layer_num",
            "_is_device_layer_owned",
            "_host_layer_index",
            "_owned_device_layer_ids",
        )
    ),
    Reason(_HMLA, "MLATokenToKVPoolHost._backup_from_device_per_layer", HOST_LAYER_SPLIT),
    Reason(_HDSA, "DSAIndexerPoolHost._backup_from_device_per_layer", HOST_LAYER_SPLIT),
    Reason(_HDSA, "DSAIndexerPoolHost._owned_device_layer_ids", HOST_LAYER_SPLIT),
    Reason(
        _HMLA,
        "MLATokenToKVPoolHost.backup_from_device_all_layer",
        HOST_LAYER_SPLIT,
        pattern=r"_target_layer_indices",
    ),
    Reason(
        _HDSA,
        "DSAIndexerPoolHost.backup_from_device_all_layer",
        HOST_LAYER_SPLIT,
        pattern=r"_owned_device_layer_ids",
    ),
    # What is left is the suite's to-do list, named as such.
    *(Reason(path, "*", ALLOCATORS_TO_DO) for path in ALLOCATOR_FILES),
    *(Reason(path, "*", HOST_TO_DO) for path in HOST_POOL_FILES),
)

#: Every unreached range and why, as rows of the target's declaration
#: (:data:`.declaration.DECLARATION`), which ``tools/reach.py`` reads.
UNREACHED_ROWS = tuple(reason.row for reason in (*UNREACHED_CODE, *TIER_REASONS))

#: Reasons that name hardware a CPU host lacks: the report's per-file "on CPU" figure leaves
#: their lines out (a CPU run cannot reach them, however thorough the suite).
OFF_CPU_REASONS: frozenset[str] = frozenset(
    {
        GPU_ONLY,
        POST_CAPTURE,
        NVFP4_GPU,
        NPU_ONLY,
        FP4_CPU,
        HOST_PINNED,
        HOST_JIT,
        HOST_XPU,
        HOST_NPU_SPLIT,
    }
)

#: The directory the map figure covers (every statement of it, not only the scopes above),
#: and what it leaves aside: the storage connectors (L3 backends for HiCache: file, Mooncake,
#: 3FS, NIXL and the like, each needing its own service), which are not pools.
MAP_ROOT = "srt/mem_cache"
MAP_ASIDE = ("srt/mem_cache/storage/",)
