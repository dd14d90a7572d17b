"""``kvcheck memory-report``: what the KV pools of real model configs cost.

For each named config in :data:`kvcheck.vocabulary.MODELS`: bytes per token (cell size), the
token capacity of a memory budget, and the bytes of the pools actually built for that
capacity on torch's ``meta`` device (shapes without memory, so production scale fits on a
laptop), checked against the configurator's formula. DSA models are reported twice: with
their skip layers (the indexer buffer only on non-skip layers) and with every layer
allocated (what a draft worker gets; ``--enable-hisparse`` does too, with twice the index
slots), which shows what the skip layers save. Where the dtype and the family make a
difference, it also prints the fp8 DSA latent layouts side by side, DSA index kpools, and
one decode-context-parallel rank's bytes per widened token.

Models are named as in :data:`kvcheck.vocabulary.MODELS` or by their short name (the part
after the organisation: ``DeepSeek-V3.2``), in any case; dtypes as torch names
(``float8_e4m3fn``) or as sglang's ``--kv-cache-dtype`` spells them (``fp8_e4m3``, ``bf16``,
``auto``), :func:`pool_dtype` says which; a typo gets the nearest name. The quantized
``--kv-cache-dtype`` choices (``mxfp8``, ``nvfp4``, ``fp4_mx_block16``) size the quantized
pool each selects, and the report splits their cells into payload and scale bytes and shows,
beside each, why ``--prefill-only-disable-kv-cache`` refuses that dtype (the no-op pool
cannot stand in for a pool with scale buffers).

Example:
    >>> rows = memory_rows(["GLM-5.2-like"], budget_bytes=8 << 30, dtype="bfloat16",
    ...                    page_size=64)
    >>> [row.variant for row in rows]
    ['skip layers honoured', 'every layer allocated']
    >>> model_name("deepseek-v3.2"), pool_dtype("fp8_e4m3")
    ('deepseek-ai/DeepSeek-V3.2', 'float8_e4m3fn')
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcheck.vocabulary import ModelConfig

__all__ = [
    "MemoryRow",
    "memory_rows",
    "model_name",
    "pool_dtype",
    "render_memory_report",
    "resolve_model",
]

_GIB = 1 << 30
#: The dtype ``--kv-cache-dtype auto`` means for the models kvcheck names: each one's
#: checkpoint config says ``"torch_dtype": "bfloat16"``.
_MODELS_DTYPE = "bfloat16"


def pool_dtype(name: str) -> str:
    """The dtype the report sizes for ``name``: a torch dtype name, one of sglang's
    ``--kv-cache-dtype`` choices for plain pools (``auto`` is the models' own dtype,
    bfloat16), or a quantized ``--kv-cache-dtype`` (``mxfp8``, ``nvfp4``,
    ``fp4_mx_block16``), kept as it is: the serving model sizes its quantized pool. Raises
    ``ValueError`` for anything else, listing the accepted names, with the nearest one for
    a typo.

    Example:
        >>> pool_dtype("bf16"), pool_dtype("auto"), pool_dtype("float16"), pool_dtype("nvfp4")
        ('bfloat16', 'bfloat16', 'float16', 'nvfp4')
        >>> pool_dtype("fp8_e4m")
        Traceback (most recent call last):
        ...
        ValueError: dtype='fp8_e4m' is not a KV dtype (did you mean 'fp8_e4m3' or ...

    """
    from kvcheck.serving.quantized import QUANTIZED_KV_CACHE_DTYPES
    from kvcheck.specs import DTYPE_ITEMSIZE
    from kvcheck.vocabulary import KV_CACHE_POOL_DTYPES

    text = name.strip().removeprefix("torch.")
    if text in DTYPE_ITEMSIZE or text in QUANTIZED_KV_CACHE_DTYPES:
        return text
    if text in KV_CACHE_POOL_DTYPES:
        return KV_CACHE_POOL_DTYPES[text] or _MODELS_DTYPE
    choices = [*KV_CACHE_POOL_DTYPES, *QUANTIZED_KV_CACHE_DTYPES]
    accepted = (
        f"accepted: sglang's --kv-cache-dtype {', '.join(choices)} "
        f"(auto: the models' {_MODELS_DTYPE}), or the torch dtypes {', '.join(DTYPE_ITEMSIZE)}"
    )
    spellings = [*choices, *DTYPE_ITEMSIZE]
    raise ValueError(f"dtype={name!r} is not a KV dtype{_dtype_hint(text, spellings)}; {accepted}")


def _dtype_hint(text: str, spellings: Sequence[str]) -> str:
    """The dtypes ``text`` abbreviates (``fp8``: sglang's ``fp8_e4m3`` and ``fp8_e5m2``,
    with the torch names they mean), else the nearest spelling: a bare ``fp8`` is a
    family of dtypes, and the nearest string (``mxfp8``) is the wrong one."""
    from kvcheck.vocabulary import KV_CACHE_POOL_DTYPES

    lowered = text.strip().lower()
    widened = {
        spelling: None
        for spelling in spellings
        if lowered and spelling.lower().startswith(lowered) and spelling != "auto"
    }
    for spelling in list(widened):
        torch_name = KV_CACHE_POOL_DTYPES.get(spelling)
        if torch_name:
            widened[torch_name] = None
    if not widened:
        return _did_you_mean(text, spellings)
    names = [repr(spelling) for spelling in widened]
    if len(names) == 1:
        return f" (did you mean {names[0]}?)"
    return f" (did you mean {', '.join(names[:-1])} or {names[-1]}?)"


def model_name(name: str) -> str:
    """The :data:`kvcheck.vocabulary.MODELS` key ``name`` means: the key itself, or a model's
    short name (the part after ``/``), in any case. Raises ``ValueError`` listing the
    models, with the nearest name for a typo.

    Example:
        >>> model_name("Qwen3-Embedding-8B")
        'Qwen/Qwen3-Embedding-8B'
        >>> model_name("DeepSeek-V3")
        'deepseek-ai/DeepSeek-V3'
        >>> model_name("Lama-3.1-8B")
        Traceback (most recent call last):
        ...
        ValueError: model='Lama-3.1-8B' is not a kvcheck model (did you mean 'Llama-3.1-8B'?); ...
    """
    from kvcheck.vocabulary import MODELS, UNSIZED_MODELS

    found = _by_name(MODELS).get(name.strip().lower())
    if found is not None:
        return found
    unsized = _by_name(UNSIZED_MODELS).get(name.strip().lower())
    if unsized is not None:
        raise ValueError(f"model={name!r} ({unsized}) cannot be sized: {UNSIZED_MODELS[unsized]}")
    spellings = [*MODELS, *(key.rpartition("/")[2] for key in MODELS if "/" in key)]
    raise ValueError(
        f"model={name!r} is not a kvcheck model{_did_you_mean(name, spellings)}; "
        f"known: {', '.join(MODELS)} (or the part after the '/'); for any other model "
        "pass --config with its Hugging Face config.json"
    )


def _by_name(models: Any) -> dict[str, str]:
    """Each key of ``models`` by its lowered full and short (after ``/``) names."""
    by_name: dict[str, str] = {}
    for key in models:
        by_name.setdefault(key.lower(), key)
        by_name.setdefault(key.rpartition("/")[2].lower(), key)
    return by_name


def resolve_model(name: str) -> ModelConfig:
    """The model ``name`` means: a named model (:func:`model_name`), else a Hugging Face
    model id whose ``config.json`` the local cache holds (no network). Raises
    ``ValueError`` as :func:`model_name` does when neither is found.

    Example:
        >>> resolve_model("llama-3.1-8b").num_key_value_heads
        8
    """
    from kvcheck.vocabulary import MODELS
    from kvcheck.vocabulary.hf_configs import hf_config_path, load_model_config

    try:
        return MODELS[model_name(name)]
    except ValueError:
        if hf_config_path(name) is None:
            raise
    return load_model_config(name)


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice nearest ``name`` (case-blind), or nothing."""
    lowered = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(name.strip().lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


@dataclass(frozen=True)
class MemoryRow:
    """One model in one allocation variant."""

    model: str
    variant: str
    cell_bytes: int
    tokens: int
    formula_bytes: int
    built_bytes: int | None  # None when kvcheck has no pool for the model
    note: str = ""
    #: A quantized dtype's cell split: (payload, scales, workspace) bytes per token.
    quantized_cell: tuple[int, int, int] | None = None
    #: The model itself (a named one, or one read from a config.json).
    config: ModelConfig | None = field(default=None, repr=False, compare=False)


def memory_rows(
    model_names: Sequence[str | ModelConfig] | None,
    *,
    budget_bytes: int,
    dtype: str,
    page_size: int,
) -> list[MemoryRow]:
    """Rows for ``model_names`` (None: every model in :data:`kvcheck.vocabulary.MODELS`; a
    name may be a model's short name or a cached Hugging Face model id,
    :func:`resolve_model`; a :class:`~kvcheck.vocabulary.ModelConfig` is used as it is,
    e.g. one read from a ``config.json`` by :func:`kvcheck.vocabulary.load_model_config`).

    Raises ``ValueError`` naming an unknown model or a bad budget, dtype or page size.
    """
    from kvcheck.memory import shape_bytes
    from kvcheck.serving import (
        ServerArgs,
        cell_size_bytes,
        max_total_num_tokens,
        pool_bytes,
        select_kv_pool,
    )
    from kvcheck.serving.quantized import is_quantized_kv_cache_dtype
    from kvcheck.vocabulary import MODELS, ModelConfig

    if not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a positive int")
    models = (
        list(MODELS.values())
        if not model_names
        else [
            name if isinstance(name, ModelConfig) else resolve_model(name) for name in model_names
        ]
    )
    rows: list[MemoryRow] = []
    for model in models:
        name = model.name
        if is_quantized_kv_cache_dtype(dtype):
            rows.append(
                _quantized_row(model, budget_bytes=budget_bytes, dtype=dtype, page_size=page_size)
            )
            continue
        variants = [("skip layers honoured", False), ("every layer allocated", True)]
        if not model.is_dsa:
            variants = [("all layers", False)]
        for label, every_layer in variants:
            sizing: dict[str, Any] = {
                "dtype": dtype,
                "page_size": page_size,
                "is_draft_worker": every_layer,
            }
            tokens = max_total_num_tokens(model, budget_bytes=budget_bytes, **sizing)
            built: int | None = None
            note = ""
            try:
                pool = select_kv_pool(
                    ServerArgs.unchecked(),
                    model,
                    max_total_num_tokens=tokens,
                    page_size=page_size,
                    dtype=dtype,
                    device="meta",
                    is_draft_worker=every_layer,
                )
                built = shape_bytes(pool)
            except ValueError as exc:  # a family kvcheck does not build
                note = str(exc)
            rows.append(
                MemoryRow(
                    model=name,
                    variant=label,
                    cell_bytes=cell_size_bytes(model, dtype=dtype, is_draft_worker=every_layer),
                    tokens=tokens,
                    formula_bytes=pool_bytes(model, num_tokens=tokens, **sizing),
                    built_bytes=built,
                    note=note,
                    config=model,
                )
            )
    return rows


def _quantized_row(
    model: ModelConfig, *, budget_bytes: int, dtype: str, page_size: int
) -> MemoryRow:
    """The row of ``name`` in the quantized pool ``dtype`` selects, its cell split into
    payload, scales and workspace; a model kvcheck has no such pool for gets a note."""
    from kvcheck.memory import shape_bytes
    from kvcheck.serving import (
        ServerArgs,
        layer_window,
        max_total_num_tokens,
        pool_bytes,
        select_kv_pool,
    )
    from kvcheck.serving.quantized import quantized_cell_bytes

    name = model.name
    try:
        cell = quantized_cell_bytes(model, dtype, layer_num=len(layer_window(model)))
    except ValueError as exc:  # no quantized pool for this family in kvcheck
        return MemoryRow(name, "quantized pool", 0, 0, 0, None, note=str(exc), config=model)
    sizing: dict[str, Any] = {"dtype": dtype, "page_size": page_size}
    tokens = max_total_num_tokens(model, budget_bytes=budget_bytes, **sizing)
    pool = select_kv_pool(
        ServerArgs.unchecked(kv_cache_dtype=dtype),
        model,
        max_total_num_tokens=tokens,
        page_size=page_size,
        dtype=dtype,
        device="meta",
    )
    return MemoryRow(
        model=name,
        variant=f"{_pool_variant(pool)} pool",
        cell_bytes=cell.total,
        tokens=tokens,
        formula_bytes=pool_bytes(model, num_tokens=tokens, **sizing),
        built_bytes=shape_bytes(pool),
        quantized_cell=(cell.payload, cell.scales, cell.workspace),
        config=model,
    )


def _pool_variant(pool: Any) -> str:
    """kvcheck's variant name for a quantized pool built by serving (``mha:nvfp4``)."""
    from kvcheck.variants import variant_for

    quant = getattr(pool, "quant_method", None)
    if type(pool).__name__ == "MLATokenToKVPoolFP4":
        return variant_for("mla", kv_quant="fp4").name
    if type(pool).__name__ == "MHATokenToKVPoolMXFP8":
        return variant_for("mha", kv_quant="mxfp8").name
    return variant_for("mha", kv_quant=quant).name


def _noop_refusal(dtype: str) -> str:
    """Why ``--prefill-only-disable-kv-cache`` refuses ``--kv-cache-dtype dtype``: the
    seeds' rule (kvcheck.serving.server_args) and its message, with every other flag valid."""
    from kvcheck.serving import MINIMAL_VALID_FLAGS, PrefillOnlyFlagError, ServerArgs

    try:
        ServerArgs(**{**MINIMAL_VALID_FLAGS, "kv_cache_dtype": dtype})
    except PrefillOnlyFlagError as error:
        return f"rule {error.rule}: {error}"
    return "accepted"


def _quantized_cells(rows: Sequence[MemoryRow], dtype: str) -> list[str]:
    """Each quantized row's payload and scale bytes per token, beside the seeds' refusal
    of the no-op pool for ``dtype``."""
    lines = [
        f"  {row.model}: payload {row.quantized_cell[0]:,} + scales {row.quantized_cell[1]:,}"
        + (f" + dequant workspace {row.quantized_cell[2]:,}" if row.quantized_cell[2] else "")
        + f" = {row.cell_bytes:,} bytes/token ({row.variant})"
        for row in rows
        if row.quantized_cell is not None
    ]
    if not lines:
        return []
    return [
        *lines,
        f"  --prefill-only-disable-kv-cache with --kv-cache-dtype {dtype}: refused "
        f"({_noop_refusal(dtype)})",
    ]


def render_memory_report(
    rows: Sequence[MemoryRow],
    *,
    budget_bytes: int,
    dtype: str,
    page_size: int,
    spelled: str | None = None,
) -> str:
    """The report as text: a table, then the skip-layer saving for each DSA model.
    ``spelled`` is how the user named ``dtype`` (sglang's ``fp8_e4m3``), shown beside it."""
    named = dtype if spelled in (None, dtype) else f"{dtype} (--kv-cache-dtype {spelled})"
    lines = [
        f"KV pools for a {budget_bytes / _GIB:.1f} GiB budget, dtype {named}, "
        f"page size {page_size}; pools built on the meta device",
        "",
        f"{'MODEL':<28} {'VARIANT':<22} {'BYTES/TOKEN':>11} {'TOKENS':>11} {'POOL GiB':>9}  CHECK",
    ]
    for row in rows:
        if row.built_bytes is None:
            check = f"not built: {row.note}"
        elif row.built_bytes == row.formula_bytes:
            check = "built == formula"
        else:
            check = f"MISMATCH: built {row.built_bytes} B, formula {row.formula_bytes} B"
        shown = row.formula_bytes if row.built_bytes is None else row.built_bytes
        lines.append(
            f"{row.model:<28} {row.variant:<22} {row.cell_bytes:>11,} {row.tokens:>11,} "
            f"{shown / _GIB:>9.2f}  {check}"
        )
    quantized = _quantized_cells(rows, dtype)
    if any(row.variant.endswith("pool") for row in rows):
        # The latent, kpool and DCP sections describe plain pools only.
        rows = []
    if quantized:
        lines += [
            "",
            f"Quantized cells (--kv-cache-dtype {dtype}), bytes per token over all layers; the",
            "no-op pool cannot stand in for a pool that keeps scale buffers:",
        ]
        lines += quantized
    savings = _skip_savings(rows)
    if savings:
        lines += ["", "Skip-layer saving (skip layers honoured vs every layer allocated):"]
        lines += savings
    layouts = _fp8_latent_layouts(rows, dtype)
    if layouts:
        lines += [
            "",
            "fp8 DSA latent layouts, bytes/token (sglang 0.5.23 builds the scaled one by default,",
            "and so does kvcheck; the raw one is what its trtllm and tilelang DSA backends use):",
        ]
        lines += layouts
    kpools = _index_kpools(rows, dtype)
    if kpools:
        lines += [
            "",
            "DSA index kpool (one index key per k tokens), bytes/token with skip layers; the",
            "compress tails are per request slot, outside the cell size (as in sglang 0.5.23):",
        ]
        lines += kpools
    widths = _dcp_widths(rows, dtype)
    if widths:
        lines += [
            "",
            "Decode context parallel (--dcp-size D), one rank's bytes per widened token: the",
            "latent rows are split across the D ranks, the DSA index keys are not:",
        ]
        lines += widths
    return "\n".join(lines)


def _dcp_widths(rows: Sequence[MemoryRow], dtype: str) -> list[str]:
    """For MLA and DSA models (skip layers honoured), one rank's bytes per widened token
    at ``dcp_size`` 2 and 4: ``latent / D + index keys`` (each rank keeps every widened
    id's index key, and ``1 / D`` of the latent rows)."""
    from kvcheck.reference import reference_skip_mask

    lines = []
    for row in rows:
        model = _model_of(row)
        # MHA models split their heads by tensor parallel, not DCP.
        if not model.uses_latent_cache or row.variant == "every layer allocated":
            continue
        index = 0
        if model.is_dsa:
            index_token = _kpool_bytes(model.index_head_dim, dtype, 1)[0]
            index = reference_skip_mask(model).count(False) * index_token
        latent = row.cell_bytes - index
        parts = [f"dcp 1 {row.cell_bytes:,}"]
        for width in (2, 4):
            cell = -(-latent // width) + index
            change = 100 * (cell - row.cell_bytes) / row.cell_bytes
            parts.append(f"dcp {width} {cell:,} ({change:+.1f}%)")
        lines.append(f"  {row.model}: {'; '.join(parts)}")
    return lines


def _index_kpools(rows: Sequence[MemoryRow], dtype: str) -> list[str]:
    """For DSA models (skip layers honoured), the cell size with an index kpool of 2 and 4,
    and the compress tails one request slot adds (bf16 keys and scores, ``kpool`` ring
    slots per indexer layer, no draft slots). Sizes come from :mod:`kvcheck.geometry`."""
    from kvcheck.reference import reference_skip_mask

    lines = []
    for row in rows:
        model = _model_of(row)
        if not model.is_dsa or row.variant != "skip layers honoured":
            continue
        index_1, _ = _kpool_bytes(model.index_head_dim, dtype, 1)
        indexer_layers = reference_skip_mask(model).count(False)
        parts = [f"kpool 1 {row.cell_bytes:,}"]
        for kpool in (2, 4):
            index, tails = _kpool_bytes(model.index_head_dim, dtype, kpool)
            cell = row.cell_bytes - indexer_layers * (index_1 - index)
            change = 100 * (cell - row.cell_bytes) / row.cell_bytes
            parts.append(f"kpool {kpool} {cell:,} ({change:+.1f}%)")
        # The tails of the last (largest) kpool, per request slot.
        parts.append(f"kpool {kpool} tails {indexer_layers * tails:,} B per request slot")
        lines.append(f"  {row.model}: {'; '.join(parts)}")
    return lines


def _kpool_bytes(index_head_dim: int, dtype: str, kpool: int) -> tuple[int, int]:
    """(index-K bytes per token, compress-tail bytes per request slot) of one indexer
    layer with index kpool ``kpool``, from a one-page pool's geometry."""
    from kvcheck.geometry import COMPRESS_TAIL_BUFFERS, INDEX_BUFFER, tensor_nbytes
    from kvcheck.specs import PoolSpec

    spec = PoolSpec(
        family="dsa",
        size=0,
        page_size=64 * kpool,
        layer_num=1,
        dtype=dtype,
        index_head_dim=index_head_dim,
        index_buf_size=0,
        index_kpool=kpool,
        index_kpool_compress=kpool > 1,
        max_running_requests=0 if kpool > 1 else None,
    )
    nbytes = tensor_nbytes(spec)
    index = nbytes[INDEX_BUFFER][0] // spec.page_size  # one page row: index_buf_size 0
    tails = sum(nbytes[name][0] for name in COMPRESS_TAIL_BUFFERS if name in nbytes)
    return index, tails


def _fp8_latent_layouts(rows: Sequence[MemoryRow], dtype: str) -> list[str]:
    """For fp8 DSA models, the cell size in the scaled latent layout sglang 0.5.23 builds for
    ``float8_e4m3fn`` (the rows above) beside the raw layout of its trtllm and tilelang DSA
    backends."""
    from kvcheck.serving import latent_kv_cache_dim

    if dtype != "float8_e4m3fn":
        return []
    lines = []
    for row in rows:
        model = _model_of(row)
        if not model.is_dsa:
            continue
        raw = model.kv_lora_rank + model.qk_rope_head_dim
        scaled = latent_kv_cache_dim(model, dtype=dtype)
        cell = row.cell_bytes - model.num_hidden_layers * (scaled - raw)
        lines.append(
            f"  {row.model} ({row.variant}): raw {raw} B/layer {cell:,}; "
            f"scaled {scaled} B/layer (sglang 0.5.23's default) {row.cell_bytes:,} "
            f"({100 * (row.cell_bytes - cell) / cell:+.1f}%)"
        )
    return lines


def _model_of(row: MemoryRow) -> ModelConfig:
    """The model a row was sized for (a row built by hand may carry only the name)."""
    from kvcheck.vocabulary import MODELS

    return row.config if row.config is not None else MODELS[row.model]


def _skip_savings(rows: Sequence[MemoryRow]) -> list[str]:
    by_model: dict[str, dict[str, MemoryRow]] = {}
    for row in rows:
        by_model.setdefault(row.model, {})[row.variant] = row
    lines = []
    for model, variants in by_model.items():
        skip = variants.get("skip layers honoured")
        full = variants.get("every layer allocated")
        if skip is None or full is None:
            continue
        saved = full.cell_bytes - skip.cell_bytes
        gained = skip.tokens - full.tokens
        if saved == 0:
            lines.append(f"  {model}: no skip layers (every layer runs its indexer)")
            continue
        lines.append(
            f"  {model}: {saved:,} bytes/token saved ({100 * saved / full.cell_bytes:.1f}%), "
            f"{gained:+,} tokens ({100 * gained / max(full.tokens, 1):+.1f}%) in the same budget"
        )
    return lines
