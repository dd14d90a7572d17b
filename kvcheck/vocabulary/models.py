"""What a model is, to the KV pools: :class:`ModelConfig`, and the named models kvcheck
knows (used by tests, the suite and the memory report).

A :class:`ModelConfig` carries only what the KV pools need: the attention architecture
(``"mha"``, ``"mla"`` or ``"dsa"``), the per-layer cache geometry, the DSA indexer fields
that decide which layers reuse the previous layer's top-k, and markers for the pool
families kvcheck does not implement (sliding window, hybrid linear/Mamba, FP4 KV cache) so
that pool selection can refuse them. It is the harness's vocabulary, shared by the serving
code under test (:mod:`kvcheck.serving`), its reference, the strategies and the targets.

For the named models only the fields the KV pools depend on are kept; every value is taken
from the model's HuggingFace ``config.json`` (cited beside each config), except where a
comment says the config is synthetic.

Example:
    >>> MODELS["deepseek-ai/DeepSeek-V3.2"].num_hidden_layers
    61
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvcheck.specs import DSA_QUANT_BLOCK

__all__ = [
    "ATTENTION_ARCHS",
    "DEEPSEEK_R1",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_2",
    "GLM_5_2_LIKE",
    "INDEXER_TYPES",
    "INDEX_TOPK_PATTERN_LETTERS",
    "LLAMA_3_1_8B",
    "LLAMA_3_1_70B",
    "MODELS",
    "QWEN3_8B",
    "QWEN3_EMBEDDING_8B",
    "UNSIZED_MODELS",
    "AttentionArch",
    "ModelConfig",
    "check_skip_fields",
]

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


# --- validation ---------------------------------------------------------------------------


def _check_positive_int(name: str, value: Any, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")


def check_skip_fields(config: Any) -> None:
    """Reject top-k sharing fields that SGLang asserts on or that would make layer 0 skip
    (``ValueError`` naming the field); ``config`` is read with ``getattr``.

    Example:
        >>> from types import SimpleNamespace
        >>> check_skip_fields(SimpleNamespace(index_topk_pattern="SF"))
        Traceback (most recent call last):
        ...
        ValueError: index_topk_pattern='SF' starts with 'S': layer 0 has no earlier top-k to reuse
    """
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
        check_skip_fields(cfg)
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


# --- named models -------------------------------------------------------------------------

# GLM-5.2-like: a SYNTHETIC config, not a published checkpoint. The attention and indexer
# geometry is GLM-5's (https://huggingface.co/zai-org/GLM-5/blob/main/config.json:
# "num_hidden_layers": 78, "num_attention_heads": 64, "kv_lora_rank": 512,
# "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 2048); the top-k sharing
# fields "index_topk_freq": 4 and "index_skip_topk_offset": 3 are added as kvcheck issue 2
# describes, so layers 0, 1, 2 and then every 4th layer from 6 (6, 10, ..., 74) run the
# indexer: 21 indexer layers out of 78.
GLM_5_2_LIKE = ModelConfig(
    name="GLM-5.2-like",
    attention_arch="dsa",
    num_hidden_layers=78,
    num_attention_heads=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,
    index_topk=2048,
    index_topk_freq=4,
    index_skip_topk_offset=3,
)

# DeepSeek-V3.2 (https://huggingface.co/deepseek-ai/DeepSeek-V3.2/blob/main/config.json:
# "num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512,
# "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 2048). The config sets no
# top-k sharing field, so every layer runs its indexer.
DEEPSEEK_V3_2 = ModelConfig(
    name="deepseek-ai/DeepSeek-V3.2",
    attention_arch="dsa",
    num_hidden_layers=61,
    num_attention_heads=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,
    index_topk=2048,
)

# Qwen3-Embedding-8B (https://huggingface.co/Qwen/Qwen3-Embedding-8B/blob/main/config.json:
# "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
# "head_dim": 128). A plain MHA (GQA) embedding model: the family the no-op pool serves.
QWEN3_EMBEDDING_8B = ModelConfig(
    name="Qwen/Qwen3-Embedding-8B",
    attention_arch="mha",
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)

# Llama 3.1 (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json:
# "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
# "hidden_size": 4096; .../Llama-3.1-70B: 80, 64, 8, 8192): GQA, head_dim 128.
# Llama 3.2 and 3.3 share these shapes at their sizes (3.3-70B is 3.1-70B's).
LLAMA_3_1_8B = ModelConfig(
    name="meta-llama/Llama-3.1-8B",
    attention_arch="mha",
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)
LLAMA_3_1_70B = ModelConfig(
    name="meta-llama/Llama-3.1-70B",
    attention_arch="mha",
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
)

# Qwen3-8B (https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json:
# "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
# "head_dim": 128, "use_sliding_window": false): the dense generative sibling of
# Qwen3-Embedding-8B, with the same cache geometry.
QWEN3_8B = ModelConfig(
    name="Qwen/Qwen3-8B",
    attention_arch="mha",
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)

# DeepSeek-V3 and R1 (https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
# and .../DeepSeek-R1: "num_hidden_layers": 61, "num_attention_heads": 128,
# "kv_lora_rank": 512, "qk_rope_head_dim": 64): MLA without V3.2's indexer.
DEEPSEEK_V3 = ModelConfig(
    name="deepseek-ai/DeepSeek-V3",
    attention_arch="mla",
    num_hidden_layers=61,
    num_attention_heads=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
DEEPSEEK_R1 = ModelConfig(
    name="deepseek-ai/DeepSeek-R1",
    attention_arch="mla",
    num_hidden_layers=61,
    num_attention_heads=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)

#: Every named config by its ``name``.
MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        GLM_5_2_LIKE,
        DEEPSEEK_V3_2,
        QWEN3_EMBEDDING_8B,
        LLAMA_3_1_8B,
        LLAMA_3_1_70B,
        QWEN3_8B,
        DEEPSEEK_V3,
        DEEPSEEK_R1,
    )
}

#: Models a user may name that kvcheck cannot size yet, and why (the memory report says
#: so instead of "unknown model"). openai/gpt-oss-20b
#: (https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json: 24 layers,
#: "sliding_window": 128, "layer_types" alternating sliding and full attention).
UNSIZED_MODELS: dict[str, str] = {
    "openai/gpt-oss-20b": (
        "an SWA model (sliding_window=128 on 12 of its 24 layers): its sliding-window layers "
        "keep a separate SWA KV pool (sglang's hybrid SWA pool), which kvcheck's "
        "configurator does not size yet"
    ),
}
