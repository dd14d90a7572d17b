"""The DSA top-k sharing rule, and the layers a pool of a model serves.

A model is described by :class:`kvcheck.vocabulary.ModelConfig` (re-exported here): what
the KV pools need to know of it. :func:`dsa_layer_skips_topk` follows SGLang 0.5.23
(``configs/model_config.py``). The first field that is set decides, in this order:

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

from typing import Any

from kvcheck.vocabulary.models import (
    ATTENTION_ARCHS,
    INDEX_TOPK_PATTERN_LETTERS,
    INDEXER_TYPES,
    ModelConfig,
    check_skip_fields,
)

__all__ = [
    "ATTENTION_ARCHS",
    "INDEXER_TYPES",
    "INDEX_TOPK_PATTERN_LETTERS",
    "ModelConfig",
    "dsa_layer_skips_topk",
    "is_dsa_config",
    "layer_window",
    "skip_topk_layers",
]


def dsa_layer_skips_topk(config: Any, layer_id: int) -> bool:
    """Whether DSA layer ``layer_id`` reuses the previous layer's top-k (see module docstring).

    ``config`` is duck-typed: a :class:`ModelConfig` or any object with HuggingFace-style
    attributes, read with ``getattr``. It is a DSA config when its ``attention_arch`` is
    ``"dsa"``, or, for objects without ``attention_arch``, when it has an ``index_topk``.
    Every top-k sharing field that is present is checked, not only the one that decides.

    Raises ValueError for a non-DSA config, a negative ``layer_id`` or an invalid field.

    Example:
        >>> from kvcheck.vocabulary.models import GLM_5_2_LIKE
        >>> [dsa_layer_skips_topk(GLM_5_2_LIKE, layer) for layer in (2, 3, 6)]
        [False, True, False]
    """
    _require_dsa(config)
    if isinstance(layer_id, bool) or not isinstance(layer_id, int) or layer_id < 0:
        raise ValueError(f"layer_id={layer_id!r} must be an int >= 0")
    check_skip_fields(config)

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
        >>> from kvcheck.vocabulary.models import GLM_5_2_LIKE
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
        >>> from kvcheck.vocabulary.models import DEEPSEEK_V3_2
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
