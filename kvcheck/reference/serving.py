"""Naive reference models of the serving rules that size, select and validate the pools.

The ``--prefill-only-disable-kv-cache`` rules are a table read top to bottom; the skip-topk
rule, cell sizes, pool bytes and capacities come straight from the formulas. Nothing is
imported from ``kvcheck.serving``: a bug there cannot leak into the model it is checked
against.

Example:
    >>> flags = {**PREFILL_ONLY_FLAG_DEFAULTS, "prefill_only_disable_kv_cache": True}
    >>> reference_first_violation(flags)
    'is_embedding'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from kvcheck.reference.pools import index_k_row_bytes, index_scale_row_bytes
from kvcheck.specs import DTYPE_ITEMSIZE

__all__ = [
    "FP4_KV_CACHE_DTYPES",
    "HISPARSE_INDEX_RATIO",
    "PREFILL_ONLY_FLAG_DEFAULTS",
    "PREFILL_ONLY_RULES",
    "SCALED_DSA_DTYPE",
    "PrefillOnlyRule",
    "reference_cell_size_bytes",
    "reference_first_violation",
    "reference_max_total_num_tokens",
    "reference_pool_bytes",
    "reference_pool_family",
    "reference_skip_mask",
    "reference_skips_topk",
    "reference_unsupported_family",
    "reference_violations",
]

# --- serving: --prefill-only-disable-kv-cache ----------------------------------------------

#: FP4 ``--kv-cache-dtype`` values the flag rejects (rule 2): SGLang 0.5.23's two FP4 choices.
FP4_KV_CACHE_DTYPES: frozenset[str] = frozenset({"nvfp4", "fp4_mx_block16"})
_FA_PREFILL_BACKENDS = frozenset({"fa3", "fa4"})

#: Values the rules assume for ``ServerArgs`` fields missing from a flags mapping.
PREFILL_ONLY_FLAG_DEFAULTS: Mapping[str, Any] = {
    "prefill_only_disable_kv_cache": False,
    "is_embedding": False,
    "kv_cache_dtype": "auto",
    "chunked_prefill_size": None,
    "disable_radix_cache": False,
    "attn_cp_size": 1,
    "enable_prefill_context_parallel": False,
    "enable_hisparse": False,
    "attention_backend": None,
    "prefill_attention_backend": None,
}


class PrefillOnlyRule(NamedTuple):
    """One precondition of ``--prefill-only-disable-kv-cache``."""

    rule_id: str
    #: the CLI flag that conflicts when the rule is violated
    conflicting_flag: str
    #: True when the (resolved) flags violate the rule
    violated: Callable[[Mapping[str, Any]], bool]


def _prefill_backend(flags: Mapping[str, Any]) -> Any:
    # The split prefill backend wins when set; otherwise the shared one applies.
    return flags["prefill_attention_backend"] or flags["attention_backend"]


#: The rules in the order validation checks them; the first violated one raises. Ids match
#: ``kvcheck.serving.PREFILL_ONLY_RULE_ORDER``. Rule ``fa_prefill_backend`` names
#: ``--attention-backend``, or ``--prefill-attention-backend`` when that one is set.
PREFILL_ONLY_RULES: tuple[PrefillOnlyRule, ...] = (
    PrefillOnlyRule("is_embedding", "--is-embedding", lambda f: not f["is_embedding"]),
    PrefillOnlyRule(
        "fp4_kv_cache_dtype",
        "--kv-cache-dtype",
        lambda f: f["kv_cache_dtype"] in FP4_KV_CACHE_DTYPES,
    ),
    PrefillOnlyRule(
        "mxfp8_kv_cache_dtype", "--kv-cache-dtype", lambda f: f["kv_cache_dtype"] == "mxfp8"
    ),
    PrefillOnlyRule(
        "chunked_prefill_size",
        "--chunked-prefill-size",
        lambda f: f["chunked_prefill_size"] != -1,
    ),
    PrefillOnlyRule(
        "disable_radix_cache",
        "--disable-radix-cache",
        lambda f: not f["disable_radix_cache"],
    ),
    PrefillOnlyRule("attn_cp_size", "--attn-cp-size", lambda f: f["attn_cp_size"] > 1),
    PrefillOnlyRule(
        "prefill_context_parallel",
        "--enable-prefill-context-parallel",
        lambda f: bool(f["enable_prefill_context_parallel"]),
    ),
    PrefillOnlyRule("hisparse", "--enable-hisparse", lambda f: bool(f["enable_hisparse"])),
    PrefillOnlyRule(
        "fa_prefill_backend",
        "--attention-backend",
        lambda f: _prefill_backend(f) not in _FA_PREFILL_BACKENDS,
    ),
)


def reference_violations(resolved_flags: Mapping[str, Any]) -> tuple[str, ...]:
    """Ids of every violated rule, in precedence order (empty when the flag is off).

    ``resolved_flags`` maps ``ServerArgs`` field names to values after defaults are filled;
    missing fields take :data:`PREFILL_ONLY_FLAG_DEFAULTS`.

    Example:
        >>> reference_violations({"prefill_only_disable_kv_cache": True, "is_embedding": True,
        ...                       "chunked_prefill_size": -1, "attention_backend": "fa3"})
        ('disable_radix_cache',)
    """
    flags = {**PREFILL_ONLY_FLAG_DEFAULTS, **resolved_flags}
    if not flags["prefill_only_disable_kv_cache"]:
        return ()
    return tuple(rule.rule_id for rule in PREFILL_ONLY_RULES if rule.violated(flags))


def reference_first_violation(resolved_flags: Mapping[str, Any]) -> str | None:
    """Id of the rule validation must raise for, or None when the flags are accepted.

    Example:
        >>> reference_first_violation({"prefill_only_disable_kv_cache": True,
        ...                            "enable_hisparse": True})
        'is_embedding'
        >>> reference_first_violation({"enable_hisparse": True}) is None
        True
    """
    violations = reference_violations(resolved_flags)
    return violations[0] if violations else None


# --- serving: skip-topk rule, cell size, pool bytes ----------------------------------------

#: With HiSparse a DSA pool's index-K buffer spans the host-expanded logical ids:
#: ``host_to_device_ratio`` index slots per token the pool holds (SGLang 0.5.23:
#: ``HiSparseDSATokenToKVPool`` passes ``index_buf_size=size * host_to_device_ratio``, and
#: ``parse_hisparse_config`` defaults the ratio to 2).
HISPARSE_INDEX_RATIO = 2
#: The KV dtype whose DSA latent rows SGLang stores scaled (fp8 values, fp32 block scales,
#: bf16 rope: ``calculate_mla_kv_cache_dim``).
SCALED_DSA_DTYPE = "float8_e4m3fn"


def _require_dsa(config: Any) -> None:
    arch = getattr(config, "attention_arch", "dsa")
    if arch != "dsa":
        raise ValueError(f"attention_arch={arch!r}: the skip-topk rule applies to DSA models")


def reference_skips_topk(config: Any, layer_id: int) -> bool:
    """Whether DSA layer ``layer_id`` reuses the previous layer's top-k (no indexer of its own).

    Reads ``config`` with getattr, so any object with the fields works (a config without
    ``attention_arch`` is taken as DSA). The first field that is set decides:

    1. ``indexer_types``: the layer skips iff it is listed as ``"shared"``;
    2. ``cli_factor > 1``: only every ``cli_factor``-th layer computes top-k;
    3. ``index_topk_pattern``: the layer skips iff its letter is ``"S"``;
    4. ``index_topk_freq`` (default 1) with ``index_skip_topk_offset``:
       ``max(layer_id - offset + 1, 0) % freq != 0``, or ``max(layer_id - 1, 0) % freq != 0``
       without an offset.

    Fields are checked only when reached, as upstream does: ``cli_factor <= 0``,
    ``index_topk_freq <= 0`` and ``index_skip_topk_offset <= 0`` raise ValueError there.

    Example:
        >>> from types import SimpleNamespace
        >>> glm = SimpleNamespace(index_topk_freq=4, index_skip_topk_offset=3)
        >>> [reference_skips_topk(glm, layer) for layer in range(8)]
        [False, False, False, True, True, True, False, True]
    """
    _require_dsa(config)
    indexer_types = getattr(config, "indexer_types", None)
    if indexer_types is not None:
        return 0 <= layer_id < len(indexer_types) and indexer_types[layer_id] == "shared"

    cli_factor = getattr(config, "cli_factor", None)
    cli_factor = 1 if cli_factor is None else cli_factor
    if cli_factor <= 0:
        raise ValueError(f"cli_factor={cli_factor!r} must be positive")
    if cli_factor > 1:
        return layer_id % cli_factor != 0

    pattern = getattr(config, "index_topk_pattern", None)
    if pattern is not None:
        return layer_id < len(pattern) and pattern[layer_id] == "S"

    freq = getattr(config, "index_topk_freq", None)
    freq = 1 if freq is None else freq
    if freq <= 0:
        raise ValueError(f"index_topk_freq={freq!r} must be positive")
    offset = getattr(config, "index_skip_topk_offset", None)
    if offset is None:
        return max(layer_id - 1, 0) % freq != 0
    if offset <= 0:
        raise ValueError(
            f"index_skip_topk_offset={offset!r} must be positive: layer 0 has no top-k to reuse"
        )
    return max(layer_id - offset + 1, 0) % freq != 0


def reference_skip_mask(
    config: Any,
    *,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> tuple[bool, ...]:
    """The skip mask a DSA pool for ``config`` is built with, for local layers.

    ``layer_num=None`` means ``num_hidden_layers - start_layer``. A draft worker or HiSparse
    allocates every layer's index-K, so its mask is all False.

    Example:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(num_hidden_layers=4, cli_factor=2)
        >>> reference_skip_mask(cfg)
        (False, True, False, True)
        >>> reference_skip_mask(cfg, is_draft_worker=True)
        (False, False, False, False)
    """
    _require_dsa(config)
    if layer_num is None:
        layer_num = config.num_hidden_layers - start_layer
    layers = range(start_layer, start_layer + layer_num)
    if is_draft_worker or enable_hisparse:
        return tuple(False for _ in layers)
    return tuple(reference_skips_topk(config, layer) for layer in layers)


def _num_indexer_layers(config: Any, *, is_draft_worker: bool, enable_hisparse: bool) -> int:
    mask = reference_skip_mask(
        config, is_draft_worker=is_draft_worker, enable_hisparse=enable_hisparse
    )
    return sum(1 for skip in mask if not skip)


def _index_bytes_per_token(config: Any) -> int:
    d = config.index_head_dim
    return index_k_row_bytes(d) + index_scale_row_bytes(d)


def _index_tokens_per_token(enable_hisparse: bool) -> int:
    """Index-K slots a DSA pool keeps per token it holds: ``HISPARSE_INDEX_RATIO`` with
    HiSparse (its index buffer spans the host-expanded logical ids), else one."""
    return HISPARSE_INDEX_RATIO if enable_hisparse else 1


def _check_dtype(dtype: Any) -> int:
    if dtype not in DTYPE_ITEMSIZE:
        raise ValueError(f"dtype={dtype!r} not in {sorted(DTYPE_ITEMSIZE)}")
    return DTYPE_ITEMSIZE[dtype]


#: The ``--kv-cache-dtype`` choices whose pools keep block scales (SGLang 0.5.23).
QUANTIZED_KV_DTYPES: tuple[str, ...] = ("mxfp8", "nvfp4", "fp4_mx_block16")


def _quantized_token_bytes(config: Any, dtype: str) -> tuple[int, int]:
    """(bytes per token per layer, bytes per token once) of the pool a quantized
    ``--kv-cache-dtype`` selects, scales included, written out per variant:

    - MHA ``mxfp8``: an fp8 byte per value and an e8m0 byte per 32 values of a head;
    - MHA ``fp4_mx_block16``: half a byte per value, an exponent byte per 16 values of the
      flattened heads;
    - MHA ``nvfp4``: half a byte per value, an e4m3 byte per 16 values of a head, and once
      per token (shared by the layers) the fp8 dequant workspace, a byte per value;
    - MLA with an FP4 dtype: half a byte per latent value and a scale byte per 16.

    ValueError for DSA, MXFP8 MLA, and shapes that are not whole blocks.
    """
    arch = config.attention_arch
    if arch == "mha":
        heads, k_dim = config.num_key_value_heads, config.head_dim
        v_dim = k_dim if config.v_head_dim is None else config.v_head_dim
        values = heads * (k_dim + v_dim)
        if dtype == "mxfp8":
            _require_blocks(dtype, 32, k_dim, v_dim)
            return values + values // 32, 0
        if dtype == "fp4_mx_block16":
            _require_blocks(dtype, 16, heads * k_dim, heads * v_dim)
            return values // 2 + heads * k_dim // 16 + heads * v_dim // 16, 0
        _require_blocks(dtype, 16, k_dim, v_dim)
        return values // 2 + values // 16, values
    if arch == "mla" and dtype != "mxfp8":
        _require_blocks(dtype, 16, config.kv_lora_rank, config.qk_rope_head_dim)
        latent = config.kv_lora_rank + config.qk_rope_head_dim
        return latent // 2 + latent // 16, 0
    raise ValueError(f"dtype={dtype!r} has no quantized {arch} pool")


def _require_blocks(dtype: str, block: int, *sizes: int) -> None:
    if any(size % block for size in sizes):
        raise ValueError(f"dtype={dtype!r} needs {sizes} to be whole blocks of {block}")


def _token_row_bytes(config: Any, dtype: str) -> int:
    """Bytes one token costs in one layer's main buffers (K+V, or the latent row).

    A DSA latent row in ``float8_e4m3fn`` is SGLang's scaled row: ``kv_lora_rank`` fp8
    values, one fp32 scale per 128 of them, the rope values in bf16. A ``kv_lora_rank``
    that is not a multiple of 128 has no such row: ValueError naming it.
    """
    itemsize = _check_dtype(dtype)
    if config.attention_arch == "mha":
        v_head_dim = config.head_dim if config.v_head_dim is None else config.v_head_dim
        return config.num_key_value_heads * (config.head_dim + v_head_dim) * itemsize
    if config.attention_arch == "dsa" and dtype == SCALED_DSA_DTYPE:
        rank = config.kv_lora_rank
        if rank % 128:
            raise ValueError(
                f"kv_lora_rank={rank} is not a multiple of 128: an fp8 (float8_e4m3fn) DSA "
                "latent row is stored scaled, one fp32 scale per 128 values"
            )
        return rank + rank // 128 * 4 + config.qk_rope_head_dim * 2
    if config.attention_arch in ("mla", "dsa"):
        return (config.kv_lora_rank + config.qk_rope_head_dim) * itemsize
    raise ValueError(f"attention_arch={config.attention_arch!r} is not mha, mla or dsa")


def reference_cell_size_bytes(
    config: Any, *, dtype: str, is_draft_worker: bool = False, enable_hisparse: bool = False
) -> int:
    """Bytes one token costs across all layers, for a pool of KV dtype ``dtype``.

    MHA: ``layers * kv_heads * (head_dim + v_head_dim) * itemsize``; MLA:
    ``layers * (kv_lora_rank + qk_rope_head_dim) * itemsize``; DSA: the same, except that
    in ``float8_e4m3fn`` the row is SGLang's scaled one (``kv_lora_rank + kv_lora_rank //
    128 * 4 + qk_rope_head_dim * 2`` bytes; ValueError when ``kv_lora_rank`` is not a
    multiple of 128), plus ``indexer_layers * (index_head_dim + index_head_dim // 128 * 4)``
    where indexer layers are the non-skip ones (every layer for a draft worker or
    HiSparse), times :data:`HISPARSE_INDEX_RATIO` with HiSparse. A quantized ``dtype``
    (:data:`QUANTIZED_KV_DTYPES`) costs its payload and scales per layer
    (:func:`_quantized_token_bytes`), plus NVFP4's workspace once.

    Example:
        >>> from types import SimpleNamespace
        >>> glm = SimpleNamespace(attention_arch="dsa", num_hidden_layers=78, kv_lora_rank=512,
        ...                       qk_rope_head_dim=64, index_head_dim=128,
        ...                       index_topk_freq=4, index_skip_topk_offset=3)
        >>> reference_cell_size_bytes(glm, dtype="float8_e5m2")
        47700
        >>> reference_cell_size_bytes(glm, dtype="float8_e4m3fn")
        53940
    """
    if dtype in QUANTIZED_KV_DTYPES:
        per_layer, once = _quantized_token_bytes(config, dtype)
        return config.num_hidden_layers * per_layer + once
    cell = config.num_hidden_layers * _token_row_bytes(config, dtype)
    if config.attention_arch == "dsa":
        indexers = _num_indexer_layers(
            config, is_draft_worker=is_draft_worker, enable_hisparse=enable_hisparse
        )
        cell += indexers * _index_bytes_per_token(config) * _index_tokens_per_token(enable_hisparse)
    return cell


def reference_pool_bytes(
    config: Any,
    *,
    num_tokens: int,
    dtype: str,
    page_size: int,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
) -> int:
    """Bytes the (non-NoOp) pools for ``num_tokens`` tokens hold, padding page included.

    Main buffers hold ``num_tokens + page_size`` rows per layer (rows as in
    :func:`reference_cell_size_bytes`); each DSA indexer layer holds
    ``(index_buf_size + page_size + 1) // page_size`` pages, where ``index_buf_size`` is
    ``num_tokens`` (times :data:`HISPARSE_INDEX_RATIO` with HiSparse).

    Example:
        >>> from types import SimpleNamespace
        >>> mha = SimpleNamespace(attention_arch="mha", num_hidden_layers=2,
        ...                       num_key_value_heads=1, head_dim=4, v_head_dim=None)
        >>> reference_pool_bytes(mha, num_tokens=6, dtype="bfloat16", page_size=2)
        256
    """
    layers = config.num_hidden_layers
    if dtype in QUANTIZED_KV_DTYPES:
        per_layer, once = _quantized_token_bytes(config, dtype)
        return (num_tokens + page_size) * (layers * per_layer + once)
    total = layers * (num_tokens + page_size) * _token_row_bytes(config, dtype)
    if config.attention_arch == "dsa":
        indexers = _num_indexer_layers(
            config, is_draft_worker=is_draft_worker, enable_hisparse=enable_hisparse
        )
        index_buf_size = num_tokens * _index_tokens_per_token(enable_hisparse)
        num_pages = (index_buf_size + page_size + 1) // page_size
        total += indexers * num_pages * page_size * _index_bytes_per_token(config)
    return total


def reference_max_total_num_tokens(
    config: Any,
    *,
    budget_bytes: int,
    dtype: str,
    page_size: int,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
) -> int:
    """The largest page-aligned token count whose pools fit in ``budget_bytes`` (0 if none).

    Found by bisection over :func:`reference_pool_bytes`, which grows with the token count.

    Example:
        >>> from types import SimpleNamespace
        >>> mha = SimpleNamespace(attention_arch="mha", num_hidden_layers=2,
        ...                       num_key_value_heads=1, head_dim=4, v_head_dim=None)
        >>> reference_max_total_num_tokens(mha, budget_bytes=300, dtype="bfloat16",
        ...                                page_size=2)
        6
    """

    def fits(pages: int) -> bool:
        used = reference_pool_bytes(
            config,
            num_tokens=pages * page_size,
            dtype=dtype,
            page_size=page_size,
            is_draft_worker=is_draft_worker,
            enable_hisparse=enable_hisparse,
        )
        return used <= budget_bytes

    if not fits(0):
        return 0
    low, high = 0, 1
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:  # fits(low) and not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low * page_size


def _is_fp4_kv(flags: Mapping[str, Any], config: Any) -> bool:
    # Only an explicit FP4 --kv-cache-dtype selects the FP4 pool: "auto" takes an FP8
    # checkpoint declaration and nothing else (SGLang 0.5.23 configure_kv_cache_dtype).
    return (flags.get("kv_cache_dtype") or "auto") in FP4_KV_CACHE_DTYPES


def reference_unsupported_family(
    flags: Mapping[str, Any], config: Any, *, is_draft_worker: bool = False
) -> str | None:
    """The pool family that keeps ``--prefill-only-disable-kv-cache`` from using the NoOp pool.

    None when the flag is off, for a draft worker (it keeps its normal pool), and for plain
    MHA. Otherwise, first match wins: ``"hybrid DSA/MLA-SWA KV pool"`` (MLA/DSA with a
    sliding window), ``"DSA/MLA KV pool"``, ``"MLA KV pool"`` (MLA without hybrid linear
    layers), ``"SWA KV pool"``, ``"hybrid linear/Mamba KV pool"``, ``"FP4 MHA KV pool"``
    (an FP4 ``kv_cache_dtype``; ``"auto"`` never selects FP4, whatever KV quantization the
    checkpoint declares).

    Example:
        >>> from types import SimpleNamespace
        >>> mla = SimpleNamespace(attention_arch="mla", sliding_window=None,
        ...                       is_hybrid_linear=False, kv_cache_quant_algo=None)
        >>> reference_unsupported_family({"prefill_only_disable_kv_cache": True}, mla)
        'MLA KV pool'
    """
    if not flags.get("prefill_only_disable_kv_cache") or is_draft_worker:
        return None
    arch = getattr(config, "attention_arch", "mha")
    latent = arch in ("mla", "dsa")
    swa = getattr(config, "sliding_window", None) is not None
    hybrid_linear = bool(getattr(config, "is_hybrid_linear", False))
    if latent and swa:
        return "hybrid DSA/MLA-SWA KV pool"
    if arch == "dsa":
        return "DSA/MLA KV pool"
    if arch == "mla" and not hybrid_linear:
        return "MLA KV pool"
    if swa:
        return "SWA KV pool"
    if hybrid_linear:
        return "hybrid linear/Mamba KV pool"
    if _is_fp4_kv(flags, config):
        return "FP4 MHA KV pool"
    return None


def reference_pool_family(
    flags: Mapping[str, Any], config: Any, *, is_draft_worker: bool = False
) -> str:
    """The family (``"mha"``, ``"noop"``, ``"mla"``, ``"dsa"``) pool selection must build.

    Raises RuntimeError where :func:`reference_unsupported_family` names a family.

    Example:
        >>> from types import SimpleNamespace
        >>> mha = SimpleNamespace(attention_arch="mha")
        >>> reference_pool_family({"prefill_only_disable_kv_cache": True}, mha)
        'noop'
        >>> reference_pool_family({"prefill_only_disable_kv_cache": True}, mha,
        ...                       is_draft_worker=True)
        'mha'
    """
    unsupported = reference_unsupported_family(flags, config, is_draft_worker=is_draft_worker)
    if unsupported is not None:
        raise RuntimeError(f"--prefill-only-disable-kv-cache cannot serve a {unsupported}")
    arch = getattr(config, "attention_arch", "mha")
    if arch == "mha" and flags.get("prefill_only_disable_kv_cache") and not is_draft_worker:
        return "noop"
    return str(arch)
