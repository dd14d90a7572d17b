"""Deliberately broken serving targets: each one carries one plausible bug.

Every class is the built-in target with one method overridden, so a property that fails on
it fails because of that bug and nothing else. ``tests/test_serving_properties_fail.py``
proves each serving property catches its bug and that Hypothesis shrinks it small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kvcheck.serving import (
    PREFILL_ONLY_RULE_ORDER,
    ServerArgs,
    index_k_bytes_per_token,
    skip_topk_layers,
)

# The real rule functions, in PREFILL_ONLY_RULE_ORDER: broken validations reuse them so that
# only their order or their selection differs from the real one.
from kvcheck.serving.server_args import _PREFILL_ONLY_RULES
from kvcheck.specs import DTYPE_ITEMSIZE
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.vocabulary import ModelConfig

_RULES: dict[str, Callable[[ServerArgs, ServerArgs], Any]] = dict(
    zip(PREFILL_ONLY_RULE_ORDER, _PREFILL_ONLY_RULES, strict=True)
)


# --- validation ---------------------------------------------------------------------------


class RuleListValidation(KVCheckTarget):
    """Validation that applies the real rules listed in ``rule_ids``, in that order."""

    def __init__(self, rule_ids: Sequence[str], *, name: str) -> None:
        unknown = [rule for rule in rule_ids if rule not in _RULES]
        if unknown:
            raise ValueError(f"rule_ids={list(rule_ids)!r}: {unknown} are not rule ids")
        self.rule_ids = tuple(rule_ids)
        self.name = name

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        raw = ServerArgs.unchecked(**flags)
        if not raw.prefill_only_disable_kv_cache:
            return
        resolved = raw.resolved()
        for rule_id in self.rule_ids:
            error = _RULES[rule_id](raw, resolved)
            if error is not None:
                raise error


def forgets_rule(rule_id: str) -> RuleListValidation:
    """Validation that never checks ``rule_id``; every other rule is checked in order."""
    kept = [rule for rule in PREFILL_ONLY_RULE_ORDER if rule != rule_id]
    if len(kept) == len(PREFILL_ONLY_RULE_ORDER):
        raise ValueError(f"rule_id={rule_id!r} not in {PREFILL_ONLY_RULE_ORDER}")
    return RuleListValidation(kept, name=f"forgets-{rule_id}")


def swaps_rules(first: str, second: str) -> RuleListValidation:
    """Validation that checks ``second`` where ``first`` belongs, and the other way round."""
    order = list(PREFILL_ONLY_RULE_ORDER)
    i, j = order.index(first), order.index(second)
    order[i], order[j] = order[j], order[i]
    return RuleListValidation(order, name=f"swaps-{first}-{second}")


class MessageOnlyErrors(KVCheckTarget):
    """Validation whose errors are plain ValueErrors: no rule id, the same messages.

    Not broken by itself (the property must identify the rule from the message); with
    ``inner`` a broken validation, its bug must still be caught without rule ids.
    """

    def __init__(self, inner: KVCheckTarget | None = None) -> None:
        self.inner = inner if inner is not None else KVCheckTarget()
        self.name = f"message-only-{self.inner.name}"

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        try:
            self.inner.validate_server_args(flags)
        except ValueError as error:
            raise ValueError(str(error)) from None


class VagueErrors(KVCheckTarget):
    """The right rule at the right time, but a message that never names the conflicting flag."""

    name = "vague-errors"

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        try:
            super().validate_server_args(flags)
        except ValueError as error:
            error.args = ("--prefill-only-disable-kv-cache: unsupported server arguments",)
            raise


# --- the skip rule ------------------------------------------------------------------------


class OffByOneSkipOffset(KVCheckTarget):
    """Reads ``index_skip_topk_offset`` one layer late: ``max(i - offset, 0) % freq``."""

    name = "off-by-one-skip-offset"

    def dsa_layer_skips_topk(self, model: Any, layer_id: int) -> bool:
        offset = getattr(model, "index_skip_topk_offset", None)
        if offset is None:
            return super().dsa_layer_skips_topk(model, layer_id)
        return super().dsa_layer_skips_topk(
            _with(model, index_skip_topk_offset=offset + 1), layer_id
        )

    def skip_topk_layers(self, model: Any) -> Sequence[bool]:
        return [self.dsa_layer_skips_topk(model, layer) for layer in range(model.num_hidden_layers)]


# --- the configurator ---------------------------------------------------------------------


class CellSizeCountsSkipLayers(KVCheckTarget):
    """Charges every layer an indexer, as if no layer reused an earlier top-k (what a draft
    worker pays)."""

    name = "cell-size-counts-skip-layers"

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        return super().cell_size_bytes(
            model, dtype=dtype, is_draft=True, enable_hisparse=enable_hisparse
        )


class RawFp8DsaRow(KVCheckTarget):
    """Sizes an fp8 e4m3 DSA latent row raw (``kv_lora_rank + qk_rope_head_dim`` bytes),
    not as the scaled row SGLang builds; a narrow latent gets a raw size, not a refusal."""

    name = "raw-fp8-dsa-row"

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        if model.attention_arch != "dsa" or dtype != "float8_e4m3fn":
            return super().cell_size_bytes(
                model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
            )
        # e5m2 has the same itemsize and keeps the raw row.
        return super().cell_size_bytes(
            model, dtype="float8_e5m2", is_draft=is_draft, enable_hisparse=enable_hisparse
        )


class HiSparseIndexOnce(KVCheckTarget):
    """Charges a HiSparse pool one index slot per token, as if its index buffer did not span
    the host-expanded logical ids."""

    name = "hisparse-index-once"

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        cell = super().cell_size_bytes(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
        if not (enable_hisparse and model.attention_arch == "dsa"):
            return cell
        layers = model.num_hidden_layers
        return cell - layers * index_k_bytes_per_token(model.index_head_dim)


class ForgetsPaddingPage(KVCheckTarget):
    """Sizes the pool as ``budget // cell_size``, forgetting the padding page (and DSA rounding)."""

    name = "forgets-padding-page"

    def max_total_num_tokens(
        self,
        model: Any,
        *,
        budget_bytes: int,
        dtype: str,
        page_size: int,
        is_draft: bool,
        enable_hisparse: bool,
    ) -> int:
        cell = self.cell_size_bytes(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
        return budget_bytes // cell // page_size * page_size


class TwoPagesShort(KVCheckTarget):
    """Keeps two pages in reserve: safe, but more conservative than the contract allows."""

    name = "two-pages-short"

    def max_total_num_tokens(self, model: Any, **options: Any) -> int:
        return max(0, super().max_total_num_tokens(model, **options) - 2 * options["page_size"])


class InvertedSkipMaskSizing(KVCheckTarget):
    """Sizes DSA pools with the skip mask inverted: skip layers pay for the indexer."""

    name = "inverted-skip-mask-sizing"

    def max_total_num_tokens(
        self,
        model: Any,
        *,
        budget_bytes: int,
        dtype: str,
        page_size: int,
        is_draft: bool,
        enable_hisparse: bool,
    ) -> int:
        if model.attention_arch != "dsa":
            return super().max_total_num_tokens(
                model,
                budget_bytes=budget_bytes,
                dtype=dtype,
                page_size=page_size,
                is_draft=is_draft,
                enable_hisparse=enable_hisparse,
            )
        charged_layers = sum(skip_topk_layers(model))  # the bug: count(True), not count(False)
        latent_row = (model.kv_lora_rank + model.qk_rope_head_dim) * DTYPE_ITEMSIZE[dtype]
        index_page = page_size * index_k_bytes_per_token(model.index_head_dim)

        def held(pages: int) -> int:
            tokens = (pages + 1) * page_size
            index_pages = (pages * page_size + page_size + 1) // page_size
            return model.num_hidden_layers * tokens * latent_row + (
                charged_layers * index_pages * index_page
            )

        pages = 0
        while held(pages + 1) <= budget_bytes:
            pages += 1
        return pages * page_size


# --- pool selection -----------------------------------------------------------------------


class LetsMLAThrough(KVCheckTarget):
    """With the flag on, builds the MLA pool for an MLA model instead of refusing it."""

    name = "lets-mla-through"

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        if flags.get("prefill_only_disable_kv_cache") and model.attention_arch == "mla":
            return "mla"
        return super().select_pool_family(flags, model, is_draft=is_draft)


class DraftGetsNoOpPool(KVCheckTarget):
    """Forgets that the worker is a draft: the draft gets the no-op pool (or a refusal)."""

    name = "draft-gets-noop-pool"

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        return super().select_pool_family(flags, model, is_draft=False)


def _with(model: Any, **changes: Any) -> Any:
    """``model`` with ``changes``: a ModelConfig stays one; other configs become namespaces."""
    if isinstance(model, ModelConfig):
        return dataclasses.replace(model, **changes)
    return SimpleNamespace(**{**vars(model), **changes})


class QuantizedCellWithoutScales(KVCheckTarget):
    """Sizes a quantized --kv-cache-dtype by its payload alone, leaving out the scale
    buffers (and NVFP4's workspace); the capacity divides the budget by that cell."""

    name = "quantized-cell-without-scales"

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        from kvcheck.serving.quantized import is_quantized_kv_cache_dtype, quantized_cell_bytes

        if not is_quantized_kv_cache_dtype(dtype):
            return super().cell_size_bytes(
                model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
            )
        return quantized_cell_bytes(model, dtype, layer_num=model.num_hidden_layers).payload

    def max_total_num_tokens(
        self,
        model: Any,
        *,
        budget_bytes: int,
        dtype: str,
        page_size: int,
        is_draft: bool,
        enable_hisparse: bool,
    ) -> int:
        cell = self.cell_size_bytes(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
        return budget_bytes // cell // page_size * page_size
