"""Model configurations for pool sizing and selection, and the DSA top-k sharing rule.

A :class:`ModelConfig` carries only what the KV pools need: the attention architecture
(``"mha"``, ``"mla"`` or ``"dsa"``), the per-layer cache geometry, the DSA indexer fields
that decide which layers reuse the previous layer's top-k, and markers for the pool
families kvcheck does not implement (sliding window, hybrid linear/Mamba, FP4 KV cache) so
that pool selection can refuse them.

:func:`dsa_layer_skips_topk` follows SGLang 0.5.23 (``configs/model_config.py``). The first
field that is set decides, in this order:

1. ``indexer_types``: layer ``i`` skips when ``indexer_types[i] == "shared"`` (layers past
   the end compute a fresh top-k);
2. ``cli_factor > 1`` (LongCat): layer ``i`` skips unless ``i % cli_factor == 0``;
3. ``index_topk_pattern``: layer ``i`` skips when ``pattern[i] == "S"`` (past the end: fresh);
4. ``index_topk_freq`` (default 1) with optional ``index_skip_topk_offset``: layer ``i``
   skips when ``max(i - offset + 1, 0) % freq != 0``, or without an offset when
   ``max(i - 1, 0) % freq != 0``.

A skip layer reuses the top-k of an earlier layer, so layer 0 can never skip: configs that
would make it skip (``index_skip_topk_offset <= 0``, a pattern starting with ``"S"``,
``indexer_types[0] == "shared"``) are rejected, as are ``index_topk_freq <= 0`` and
``cli_factor <= 0``.

Example:
    >>> cfg = ModelConfig(name="toy-dsa", attention_arch="dsa", num_hidden_layers=8,
    ...                   kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
    ...                   index_topk=2048, index_topk_freq=4, index_skip_topk_offset=3)
    >>> [layer for layer, skip in enumerate(skip_topk_layers(cfg)) if not skip]
    [0, 1, 2, 6]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvcheck.specs import DSA_QUANT_BLOCK

AttentionArch = Literal["mha", "mla", "dsa"]
ATTENTION_ARCHS: tuple[AttentionArch, ...] = ("mha", "mla", "dsa")

#: ``indexer_types`` entries: "full" computes a fresh top-k, "shared" reuses the previous one.
INDEXER_TYPES: frozenset[str] = frozenset({"full", "shared"})
#: ``index_topk_pattern`` letters: "F" computes a fresh top-k, "S" reuses the previous one.
INDEX_TOPK_PATTERN_LETTERS: frozenset[str] = frozenset({"F", "S"})

_SKIP_FIELDS = (
    "indexer_types",
    "cli_factor",
    "index_topk_pattern",
    "index_topk_freq",
    "index_skip_topk_offset",
)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The KV-cache geometry of one model, with markers for pool families kvcheck refuses.

    Fields follow the HuggingFace ``config.json`` names. MHA models use
    ``num_key_value_heads``, ``head_dim`` and ``v_head_dim`` (``None``: same as
    ``head_dim``); MLA and DSA models use ``kv_lora_rank`` and ``qk_rope_head_dim``; DSA
    adds the indexer (``index_head_dim``, a multiple of 128 because each 128-channel block
    of an index key has one fp32 scale, and ``index_topk``) and the top-k sharing fields
    described in the module docstring, which other architectures must leave unset.

    Markers (they change only which pool can serve the model): ``sliding_window`` (an SWA
    model), ``is_hybrid_linear`` (hybrid linear attention / Mamba) and
    ``kv_cache_quant_algo`` (the KV-cache quantization a checkpoint ships, e.g. "NVFP4").

    Example:
        >>> cfg = ModelConfig(name="toy", attention_arch="mha", num_hidden_layers=2,
        ...                   num_key_value_heads=2, head_dim=64)
        >>> cfg.effective_v_head_dim
        64
    """

    name: str
    attention_arch: AttentionArch
    num_hidden_layers: int
    num_attention_heads: int = 1
    # MHA
    num_key_value_heads: int = 1
    head_dim: int = 128
    v_head_dim: int | None = None
    # MLA / DSA
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # DSA indexer
    index_head_dim: int = 0
    index_topk: int = 0
    index_topk_freq: int | None = None
    index_skip_topk_offset: int | None = None
    index_topk_pattern: str | None = None
    indexer_types: tuple[str, ...] | None = None
    cli_factor: int | None = None
    # markers for pool families kvcheck does not implement
    sliding_window: int | None = None
    is_hybrid_linear: bool = False
    kv_cache_quant_algo: str | None = None

    def __post_init__(self) -> None:
        if self.indexer_types is not None and not isinstance(self.indexer_types, tuple):
            # A JSON list is the natural spelling; store a tuple so the config stays hashable.
            object.__setattr__(self, "indexer_types", tuple(self.indexer_types))
        _check_model_fields(self)

    @property
    def effective_v_head_dim(self) -> int:
        """The V head dim of an MHA model: ``v_head_dim``, or ``head_dim`` when unset."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def uses_latent_cache(self) -> bool:
        """True for MLA and DSA models, whose cache holds one latent row per token."""
        return self.attention_arch in ("mla", "dsa")

    @property
    def is_dsa(self) -> bool:
        """True for DeepSeek-sparse-attention models (MLA plus an indexer)."""
        return self.attention_arch == "dsa"


def dsa_layer_skips_topk(config: Any, layer_id: int) -> bool:
    """Whether DSA layer ``layer_id`` reuses the previous layer's top-k (see module docstring).

    ``config`` is duck-typed: a :class:`ModelConfig` or any object with HuggingFace-style
    attributes, read with ``getattr``. It is a DSA config when its ``attention_arch`` is
    ``"dsa"``, or, for objects without ``attention_arch``, when it has an ``index_topk``.
    Every top-k sharing field that is present is checked, not only the one that decides.

    Raises ValueError for a non-DSA config, a negative ``layer_id`` or an invalid field.

    Example:
        >>> from kvcheck.serving.models import GLM_5_2_LIKE
        >>> [dsa_layer_skips_topk(GLM_5_2_LIKE, layer) for layer in (2, 3, 6)]
        [False, True, False]
    """
    _require_dsa(config)
    if isinstance(layer_id, bool) or not isinstance(layer_id, int) or layer_id < 0:
        raise ValueError(f"layer_id={layer_id!r} must be an int >= 0")
    _check_skip_fields(config)

    indexer_types = getattr(config, "indexer_types", None)
    if indexer_types is not None:
        return layer_id < len(indexer_types) and indexer_types[layer_id] == "shared"

    cli_factor = _int_or_default(config, "cli_factor", 1)
    if cli_factor > 1:
        return layer_id % cli_factor != 0

    pattern = getattr(config, "index_topk_pattern", None)
    if pattern is not None:
        return layer_id < len(pattern) and pattern[layer_id] == "S"

    freq = _int_or_default(config, "index_topk_freq", 1)
    offset = getattr(config, "index_skip_topk_offset", None)
    if offset is not None:
        return max(layer_id - offset + 1, 0) % freq != 0
    return max(layer_id - 1, 0) % freq != 0


def skip_topk_layers(
    config: Any,
    *,
    is_draft_worker: bool = False,
    enable_hisparse: bool = False,
    start_layer: int = 0,
    layer_num: int | None = None,
) -> list[bool]:
    """The skip mask a DSA pool is built with, one entry per local layer.

    Layers ``start_layer .. start_layer + layer_num - 1`` (``layer_num=None``: up to the
    model's last layer). A draft worker and HiSparse allocate every layer's index-K buffer
    (SGLang does not elide it there), so their mask is all False.

    Example:
        >>> from kvcheck.serving.models import GLM_5_2_LIKE
        >>> sum(not skip for skip in skip_topk_layers(GLM_5_2_LIKE))
        21
        >>> any(skip_topk_layers(GLM_5_2_LIKE, is_draft_worker=True))
        False
    """
    _require_dsa(config)
    layers = layer_window(config, start_layer=start_layer, layer_num=layer_num)
    if is_draft_worker or enable_hisparse:
        return [False] * len(layers)
    return [dsa_layer_skips_topk(config, layer_id) for layer_id in layers]


def layer_window(config: Any, *, start_layer: int = 0, layer_num: int | None = None) -> range:
    """Global ids of the layers ``start_layer .. start_layer + layer_num - 1`` of ``config``.

    ``layer_num=None`` means every layer from ``start_layer`` to the model's last one. The
    window must lie inside ``[0, config.num_hidden_layers)`` and hold at least one layer.

    Example:
        >>> from kvcheck.serving.models import DEEPSEEK_V3_2
        >>> layer_window(DEEPSEEK_V3_2, start_layer=60)
        range(60, 61)
    """
    num_layers = config.num_hidden_layers
    if isinstance(start_layer, bool) or not isinstance(start_layer, int):
        raise ValueError(f"start_layer={start_layer!r} must be an int")
    if not 0 <= start_layer < num_layers:
        raise ValueError(f"start_layer={start_layer!r} not in [0, {num_layers})")
    if layer_num is None:
        layer_num = num_layers - start_layer
    if isinstance(layer_num, bool) or not isinstance(layer_num, int) or layer_num < 1:
        raise ValueError(f"layer_num={layer_num!r} must be an int >= 1 (or None)")
    if start_layer + layer_num > num_layers:
        raise ValueError(
            f"start_layer={start_layer} + layer_num={layer_num} exceeds "
            f"num_hidden_layers={num_layers} of {getattr(config, 'name', 'the model')!r}"
        )
    return range(start_layer, start_layer + layer_num)


def is_dsa_config(config: Any) -> bool:
    """Whether ``config`` describes a DSA model (see :func:`dsa_layer_skips_topk`).

    Example:
        >>> from types import SimpleNamespace
        >>> is_dsa_config(SimpleNamespace(index_topk=2048, num_hidden_layers=4))
        True
    """
    arch = getattr(config, "attention_arch", None)
    if arch is None:
        return getattr(config, "index_topk", None) is not None
    return arch == "dsa"


# --- validation ---------------------------------------------------------------------------


def _require_dsa(config: Any) -> None:
    if not is_dsa_config(config):
        name = getattr(config, "name", type(config).__name__)
        arch = getattr(config, "attention_arch", None)
        raise ValueError(
            f"config {name!r} (attention_arch={arch!r}) is not a DSA model; the top-k "
            "sharing rule applies only to DSA configs"
        )


def _int_or_default(config: Any, field: str, default: int) -> int:
    value = getattr(config, field, None)
    return default if value is None else value


def _check_positive_int(name: str, value: Any, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")


def _check_skip_fields(config: Any) -> None:
    """Reject top-k sharing fields that SGLang asserts on or that would make layer 0 skip."""
    for field in ("cli_factor", "index_topk_freq"):
        value = getattr(config, field, None)
        if value is not None:
            _check_positive_int(field, value)
    offset = getattr(config, "index_skip_topk_offset", None)
    if offset is not None and (
        isinstance(offset, bool) or not isinstance(offset, int) or offset <= 0
    ):
        raise ValueError(
            f"index_skip_topk_offset={offset!r} must be an int >= 1: an offset <= 0 makes "
            "layer 0 a skip layer with no earlier top-k to reuse"
        )
    pattern = getattr(config, "index_topk_pattern", None)
    if pattern is not None:
        if not isinstance(pattern, str) or not set(pattern) <= INDEX_TOPK_PATTERN_LETTERS:
            raise ValueError(
                f"index_topk_pattern={pattern!r} must be a string of 'F' (fresh top-k) and "
                "'S' (shared top-k)"
            )
        if pattern.startswith("S"):
            raise ValueError(
                f"index_topk_pattern={pattern!r} starts with 'S': layer 0 has no earlier "
                "top-k to reuse"
            )
    indexer_types = getattr(config, "indexer_types", None)
    if indexer_types is not None:
        if isinstance(indexer_types, str) or not isinstance(indexer_types, Sequence):
            raise ValueError(f"indexer_types={indexer_types!r} must be a sequence of strings")
        unknown = sorted(set(indexer_types) - INDEXER_TYPES)
        if unknown:
            raise ValueError(
                f"indexer_types={indexer_types!r} holds {unknown}; entries must be "
                "'full' or 'shared'"
            )
        if len(indexer_types) > 0 and indexer_types[0] == "shared":
            raise ValueError(
                f"indexer_types={indexer_types!r} starts with 'shared': layer 0 has no "
                "earlier top-k to reuse"
            )


def _check_model_fields(cfg: ModelConfig) -> None:
    if not isinstance(cfg.name, str) or not cfg.name:
        raise ValueError(f"name={cfg.name!r} must be a non-empty string")
    if cfg.attention_arch not in ATTENTION_ARCHS:
        raise ValueError(f"attention_arch={cfg.attention_arch!r} not in {ATTENTION_ARCHS}")
    for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
        _check_positive_int(field, getattr(cfg, field))
    if cfg.v_head_dim is not None:
        _check_positive_int("v_head_dim", cfg.v_head_dim)
    for field in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "index_topk"):
        _check_positive_int(field, getattr(cfg, field), minimum=0)

    if cfg.uses_latent_cache:
        _check_positive_int("kv_lora_rank", cfg.kv_lora_rank)
    if cfg.is_dsa:
        _check_positive_int("index_head_dim", cfg.index_head_dim)
        _check_positive_int("index_topk", cfg.index_topk)
        if cfg.index_head_dim % DSA_QUANT_BLOCK != 0:
            raise ValueError(
                f"index_head_dim={cfg.index_head_dim} must be a multiple of "
                f"{DSA_QUANT_BLOCK}: each {DSA_QUANT_BLOCK}-channel block of an index key "
                "carries one fp32 scale"
            )
        _check_skip_fields(cfg)
    else:
        set_fields = [f for f in _SKIP_FIELDS if getattr(cfg, f) is not None]
        if set_fields:
            raise ValueError(
                f"{set_fields[0]}={getattr(cfg, set_fields[0])!r} is a DSA top-k sharing "
                f"field but attention_arch={cfg.attention_arch!r}"
            )

    if cfg.sliding_window is not None:
        _check_positive_int("sliding_window", cfg.sliding_window)
    if not isinstance(cfg.is_hybrid_linear, bool):
        raise ValueError(f"is_hybrid_linear={cfg.is_hybrid_linear!r} must be a bool")
    if cfg.kv_cache_quant_algo is not None and (
        not isinstance(cfg.kv_cache_quant_algo, str) or not cfg.kv_cache_quant_algo
    ):
        raise ValueError(
            f"kv_cache_quant_algo={cfg.kv_cache_quant_algo!r} must be a non-empty string or None"
        )
