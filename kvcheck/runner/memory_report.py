"""``kvcheck memory-report``: what the KV pools of real model configs cost.

For each named config in :data:`kvcheck.serving.MODELS`: bytes per token (cell size), the
token capacity of a memory budget, and the bytes of the pools actually built for that
capacity on torch's ``meta`` device (shapes without memory, so production scale fits on a
laptop), checked against the configurator's formula. DSA models are reported twice: with
their skip layers (the indexer buffer only on non-skip layers) and with every layer
allocated (what a draft worker gets; ``--enable-hisparse`` does too, with twice the index
slots), which shows what the skip layers save. Where the dtype and the family make a
difference, it also prints the fp8 DSA latent layouts side by side, DSA index kpools, and
one decode-context-parallel rank's bytes per widened token.

Example:
    >>> rows = memory_rows(["GLM-5.2-like"], budget_bytes=8 << 30, dtype="bfloat16",
    ...                    page_size=64)
    >>> [row.variant for row in rows]
    ['skip layers honoured', 'every layer allocated']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryRow", "memory_rows", "render_memory_report"]

_GIB = 1 << 30


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


def memory_rows(
    model_names: Sequence[str] | None,
    *,
    budget_bytes: int,
    dtype: str,
    page_size: int,
) -> list[MemoryRow]:
    """Rows for ``model_names`` (None: every model in :data:`kvcheck.serving.MODELS`).

    Raises ``ValueError`` naming an unknown model or a bad budget, dtype or page size.
    """
    from kvcheck.memory import shape_bytes
    from kvcheck.serving import (
        MODELS,
        ServerArgs,
        cell_size_bytes,
        max_total_num_tokens,
        pool_bytes,
        select_kv_pool,
    )

    if not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a positive int")
    names = list(MODELS) if not model_names else list(model_names)
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise ValueError(f"model={unknown[0]!r} is not a kvcheck model; known: {', '.join(MODELS)}")
    rows: list[MemoryRow] = []
    for name in names:
        model = MODELS[name]
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
                )
            )
    return rows


def render_memory_report(
    rows: Sequence[MemoryRow], *, budget_bytes: int, dtype: str, page_size: int
) -> str:
    """The report as text: a table, then the skip-layer saving for each DSA model."""
    lines = [
        f"KV pools for a {budget_bytes / _GIB:.1f} GiB budget, dtype {dtype}, "
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
    from kvcheck.serving import MODELS

    lines = []
    for row in rows:
        model = MODELS[row.model]
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
    from kvcheck.serving import MODELS

    lines = []
    for row in rows:
        model = MODELS[row.model]
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
    from kvcheck.serving import MODELS, latent_kv_cache_dim

    if dtype != "float8_e4m3fn":
        return []
    lines = []
    for row in rows:
        model = MODELS[row.model]
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
