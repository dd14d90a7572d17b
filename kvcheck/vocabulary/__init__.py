"""The harness's vocabulary: what a model is to the KV pools, the named models kvcheck knows,
and the serving flags' choices. Shared by the serving code under test (:mod:`kvcheck.serving`),
the references, the strategies, the properties and the targets; it checks nothing itself.

Example:
    >>> MODELS["deepseek-ai/DeepSeek-V3.2"].attention_arch, MINIMAL_VALID_FLAGS["is_embedding"]
    ('dsa', True)
"""

from kvcheck.vocabulary.flags import (
    ATTENTION_BACKEND_CHOICES,
    DEVICE_CHOICES,
    FA_PREFILL_BACKENDS,
    FP4_KV_CACHE_DTYPES,
    GPU_ARCH_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    KV_CACHE_POOL_DTYPES,
    MINIMAL_VALID_FLAGS,
)
from kvcheck.vocabulary.hf_configs import UnsizedModel, load_model_config, model_from_hf_config
from kvcheck.vocabulary.models import (
    ATTENTION_ARCHS,
    DEEPSEEK_R1,
    DEEPSEEK_V3,
    DEEPSEEK_V3_2,
    GLM_5_2_LIKE,
    INDEX_TOPK_PATTERN_LETTERS,
    INDEXER_TYPES,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    MODELS,
    QWEN3_8B,
    QWEN3_EMBEDDING_8B,
    UNSIZED_MODELS,
    AttentionArch,
    ModelConfig,
)

__all__ = [
    "ATTENTION_ARCHS",
    "ATTENTION_BACKEND_CHOICES",
    "DEEPSEEK_R1",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_2",
    "DEVICE_CHOICES",
    "FA_PREFILL_BACKENDS",
    "FP4_KV_CACHE_DTYPES",
    "GLM_5_2_LIKE",
    "GPU_ARCH_CHOICES",
    "INDEXER_TYPES",
    "INDEX_TOPK_PATTERN_LETTERS",
    "KV_CACHE_DTYPE_CHOICES",
    "KV_CACHE_POOL_DTYPES",
    "LLAMA_3_1_8B",
    "LLAMA_3_1_70B",
    "MINIMAL_VALID_FLAGS",
    "MODELS",
    "QWEN3_8B",
    "QWEN3_EMBEDDING_8B",
    "UNSIZED_MODELS",
    "AttentionArch",
    "ModelConfig",
    "UnsizedModel",
    "load_model_config",
    "model_from_hf_config",
]
