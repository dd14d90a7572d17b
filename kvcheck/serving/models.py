"""Named model configurations used by tests and by the memory report.

Only the fields the KV pools depend on are kept; every value is taken from the model's
HuggingFace ``config.json`` (cited beside each config), except where a comment says the
config is synthetic.

Example:
    >>> MODELS["deepseek-ai/DeepSeek-V3.2"].num_hidden_layers
    61
"""

from __future__ import annotations

from kvcheck.serving.model_config import ModelConfig

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

#: Every named config by its ``name``.
MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg for cfg in (GLM_5_2_LIKE, DEEPSEEK_V3_2, QWEN3_EMBEDDING_8B)
}
