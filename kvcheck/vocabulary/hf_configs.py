"""A Hugging Face ``config.json`` as a :class:`~kvcheck.vocabulary.ModelConfig`, and where a
model id's config lies in the local Hugging Face cache (never the network).

:func:`model_from_hf_config` reads the fields the KV pools depend on, for the families
kvcheck models: plain attention (Llama, Qwen, Mistral: ``num_key_value_heads`` and
``head_dim``, else ``hidden_size / num_attention_heads``), MLA (DeepSeek-V2/V3/R1:
``kv_lora_rank``) and DSA (DeepSeek-V3.2: MLA plus ``index_head_dim``). A multimodal config
is read through its ``text_config``. A config whose KV pool the configurator cannot size
(sliding-window layers, linear-attention or Mamba layers) raises :class:`UnsizedModel`
saying which and why, rather than giving a cell size that would be wrong.

:func:`hf_config_path` turns a model id (``meta-llama/Llama-3.1-8B``) into the
``config.json`` of its newest snapshot under ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``; :func:`load_model_config` takes a file, a folder holding one,
or a model id.

Example:
    >>> cfg = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096},
    ...     name="Llama-3.1-8B")
    >>> cfg.attention_arch, cfg.num_key_value_heads, cfg.head_dim
    ('mha', 8, 128)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvcheck.vocabulary.models import ModelConfig

__all__ = [
    "UnsizedModel",
    "hf_cache_roots",
    "hf_config_path",
    "load_model_config",
    "model_from_hf_config",
]

#: Why the configurator cannot size a model, by the layer kind that makes it so.
_SWA_REASON = (
    "its sliding-window layers keep a separate SWA KV pool (sglang's hybrid SWA pool), "
    "which kvcheck's configurator does not size yet"
)
_LINEAR_REASON = (
    "its linear-attention or Mamba layers keep state outside the KV pool (sglang's hybrid "
    "linear pool), which kvcheck's configurator does not size yet"
)
#: ``layer_types`` / ``layers_block_type`` entries that are not full attention.
_LINEAR_LAYER_KINDS = frozenset({"linear_attention", "mamba", "mamba2", "linear"})


class UnsizedModel(ValueError):
    """A model whose KV pool kvcheck's configurator cannot size; the message says why."""


def model_from_hf_config(config: Mapping[str, Any], *, name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face ``config.json`` (already parsed).

    Raises :class:`UnsizedModel` for a sliding-window or linear-attention model, and
    ``ValueError`` naming the field for a config that lacks what the KV pools need.

    Example:
        >>> model_from_hf_config({"num_hidden_layers": 61, "num_attention_heads": 128,
        ...     "kv_lora_rank": 512, "qk_rope_head_dim": 64}, name="DeepSeek-V3").attention_arch
        'mla'
        >>> model_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
        ...     "hidden_size": 256, "sliding_window": 128,
        ...     "layer_types": ["sliding_attention", "full_attention"]}, name="swa")
        Traceback (most recent call last):
        ...
        kvcheck.vocabulary.hf_configs.UnsizedModel: swa: sliding_window=128 on 1 of 2 layers: ...
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config={config!r} must be a mapping (a parsed config.json)")
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in config:
        config = {**config, **text}  # a multimodal checkpoint: the language model's fields
    layers = _required_int(config, "num_hidden_layers", name)
    heads = _required_int(config, "num_attention_heads", name)
    _refuse_unsized(config, name=name, layers=layers)
    if config.get("kv_lora_rank"):
        return _latent_model(config, name=name, layers=layers, heads=heads)
    head_dim = config.get("head_dim")
    if head_dim is None:
        hidden = _required_int(config, "hidden_size", name)
        head_dim = hidden // heads
    return ModelConfig(
        name=name,
        attention_arch="mha",
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        v_head_dim=config.get("v_head_dim"),
    )


def _latent_model(config: Mapping[str, Any], *, name: str, layers: int, heads: int) -> ModelConfig:
    """An MLA model, or a DSA one when the config has an indexer (``index_head_dim``)."""
    fields: dict[str, Any] = {
        "name": name,
        "attention_arch": "mla",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "kv_lora_rank": config["kv_lora_rank"],
        "qk_rope_head_dim": _required_int(config, "qk_rope_head_dim", name),
    }
    if config.get("index_head_dim"):
        fields["attention_arch"] = "dsa"
        fields["index_head_dim"] = config["index_head_dim"]
        fields["index_topk"] = _required_int(config, "index_topk", name)
        for field in (
            "index_topk_freq",
            "index_skip_topk_offset",
            "index_topk_pattern",
            "indexer_types",
            "cli_factor",
        ):
            if config.get(field) is not None:
                fields[field] = config[field]
    return ModelConfig(**fields)


def _refuse_unsized(config: Mapping[str, Any], *, name: str, layers: int) -> None:
    kinds = config.get("layer_types") or config.get("layers_block_type") or []
    linear = [kind for kind in kinds if str(kind).lower() in _LINEAR_LAYER_KINDS]
    if linear:
        raise UnsizedModel(
            f"{name}: {len(linear)} of {len(kinds)} layers are {linear[0]!r}: {_LINEAR_REASON}"
        )
    window = config.get("sliding_window")
    sliding = [kind for kind in kinds if "sliding" in str(kind).lower()]
    if window and (sliding or (not kinds and config.get("use_sliding_window", True))):
        count = len(sliding) if sliding else layers
        raise UnsizedModel(
            f"{name}: sliding_window={window} on {count} of {len(kinds) or layers} layers: "
            f"{_SWA_REASON}"
        )


def _required_int(config: Mapping[str, Any], field: str, name: str) -> int:
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}: config.json field {field}={value!r} must be a positive int; is this a "
            "Hugging Face config.json of a decoder model?"
        )
    return value


def hf_cache_roots() -> list[Path]:
    """The folders a Hugging Face hub cache may live in, in the order the hub library
    looks: ``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache/huggingface/hub``.

    Example:
        >>> hf_cache_roots()[-1].name
        'hub'
    """
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(roots))


def hf_config_path(model_id: str) -> Path | None:
    """The cached ``config.json`` of ``model_id`` (``org/name``), or None when no cache
    holds one: the snapshot ``refs/main`` names, else the newest. Reads files only.

    Example:
        >>> hf_config_path("no-such-org/no-such-model") is None
        True
    """
    org, slash, model = model_id.strip().partition("/")
    if not slash or not org or not model or "/" in model:
        return None
    for root in hf_cache_roots():
        repo = root / f"models--{org}--{model}"
        if not repo.is_dir():
            continue
        main = repo / "refs" / "main"
        if main.is_file():
            pinned = repo / "snapshots" / main.read_text().strip() / "config.json"
            if pinned.is_file():
                return pinned
        found = sorted(
            (repo / "snapshots").glob("*/config.json"), key=lambda path: path.stat().st_mtime
        )
        if found:
            return found[-1]
    return None


def load_model_config(source: str) -> ModelConfig:
    """The model a ``config.json`` describes: ``source`` is the file, a folder holding
    it, or a Hugging Face model id found in the local cache. The model is named after its
    folder (the model id for a cached one).

    Raises ``ValueError`` saying what was looked for and where, :class:`UnsizedModel` for
    a model the configurator cannot size.

    Example:
        >>> load_model_config("no-such-org/no-such-model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: config='no-such-org/no-such-model': no such file, and no Hugging Face ...
    """
    path = Path(source).expanduser()
    name = path.parent.name if path.name == "config.json" else path.name
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        cached = hf_config_path(source)
        if cached is None:
            raise ValueError(
                f"config={source!r}: no such file, and no Hugging Face cache "
                f"({', '.join(str(root) for root in hf_cache_roots())}) holds that model id; "
                "pass the path of a config.json (kvcheck never downloads)"
            )
        path, name = cached, source.strip()
    try:
        parsed = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"config={source!r}: cannot read {str(path)!r} as JSON ({exc})") from exc
    return model_from_hf_config(parsed, name=name)
