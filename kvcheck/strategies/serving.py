"""The serving configuration around a pool: model configs and ``ServerArgs`` flag sets.

:func:`model_configs` draws models of each attention architecture with every way a DSA
model names its skip-topk layers; :func:`server_flags` draws flag combinations around
``--prefill-only-disable-kv-cache`` that break chosen rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.reference import FP4_KV_CACHE_DTYPES
from kvcheck.strategies.pools import INDEX_HEAD_DIM
from kvcheck.validation import check_bool, check_choices, check_valid_integer, check_valid_interval
from kvcheck.vocabulary import MINIMAL_VALID_FLAGS

__all__ = ["model_configs", "server_flags"]

_ARCHS: tuple[str, ...] = ("mha", "mla", "dsa")

# --- model configs -----------------------------------------------------------------------------

#: DSA skip-topk fields in precedence order; "default" sets none of them.
_SKIP_MODES = ("default", "index_topk_freq", "index_topk_pattern", "cli_factor", "indexer_types")
_INVALID_FIELDS = ("cli_factor", "index_topk_freq", "index_skip_topk_offset")


def _skip_fields(draw: Callable[..., Any], mode: str, layers: int) -> dict[str, Any]:
    """The deciding skip field for ``mode`` plus, sometimes, shadowed lower-precedence ones."""
    fields: dict[str, Any] = {}
    if mode == "default":
        return fields
    order = _SKIP_MODES[1:]
    for lower in order[: order.index(mode) + 1]:
        # Lower-precedence fields are present only sometimes: they must not matter.
        if lower != mode and not draw(st.booleans()):
            continue
        # Layer 0 always computes its own top-k: it has no earlier one to reuse.
        if lower == "indexer_types":
            kinds = st.sampled_from(("full", "shared"))
            rest = draw(st.lists(kinds, min_size=layers - 1, max_size=layers - 1))
            fields[lower] = ("full", *rest)
        elif lower == "cli_factor":
            # 1 falls through to the next rule, so it is only a deciding value when shadowed.
            fields[lower] = draw(st.integers(2 if lower == mode else 1, 4))
        elif lower == "index_topk_pattern":
            letters = st.lists(st.sampled_from("FS"), min_size=layers - 1, max_size=layers - 1)
            fields[lower] = "F" + "".join(draw(letters))
        else:
            fields["index_topk_freq"] = draw(st.integers(1, 4))
            fields["index_skip_topk_offset"] = draw(st.none() | st.integers(1, 4))
    return fields


@st.composite
def _model_configs(
    draw: Callable[..., Any],
    archs: tuple[str, ...],
    min_layers: int,
    max_layers: int,
    include_markers: bool,
    allow_invalid: bool,
    model_config: type,
) -> Any:
    arch = draw(st.sampled_from(archs))
    layers = draw(st.integers(min_layers, max_layers))
    fields: dict[str, Any] = {
        "name": f"generated-{arch}-{layers}l",
        "attention_arch": arch,
        "num_hidden_layers": layers,
    }
    if arch == "mha":
        kv_heads = draw(st.integers(1, 4))
        fields |= {
            "num_key_value_heads": kv_heads,
            "num_attention_heads": kv_heads * draw(st.integers(1, 2)),
            "head_dim": draw(st.sampled_from((128, 64, 8))),
            "v_head_dim": draw(st.none() | st.sampled_from((128, 64, 8))),
        }
    else:
        fields |= {
            "num_attention_heads": draw(st.integers(1, 4)),
            "kv_lora_rank": draw(st.sampled_from((512, 64, 16))),
            "qk_rope_head_dim": draw(st.sampled_from((64, 8))),
        }
    if arch == "dsa":
        fields |= {
            "index_head_dim": INDEX_HEAD_DIM,
            "index_topk": draw(st.sampled_from((2048, 64))),
        }
        fields |= _skip_fields(draw, draw(st.sampled_from(_SKIP_MODES)), layers)
    if include_markers:
        if draw(st.booleans()):
            fields["sliding_window"] = draw(st.sampled_from((4096, 128)))
        if draw(st.booleans()):
            fields["is_hybrid_linear"] = True
        if draw(st.booleans()):
            fields["kv_cache_quant_algo"] = draw(st.sampled_from(("NVFP4", "FP8")))
    if arch == "dsa" and allow_invalid and draw(st.booleans()):
        # The bad field is the deciding one (no higher-precedence field shadows it), so the
        # skip rule must raise for every layer.
        for name in ("indexer_types", "cli_factor", "index_topk_pattern", "index_topk_freq"):
            fields.pop(name, None)
        fields.pop("index_skip_topk_offset", None)
        bad_field = draw(st.sampled_from(_INVALID_FIELDS))
        if bad_field == "index_skip_topk_offset":
            fields["index_topk_freq"] = draw(st.integers(1, 4))
        fields[bad_field] = draw(st.integers(-2, 0))
        return SimpleNamespace(**fields)
    return model_config(**fields)


def model_configs(
    *,
    archs: Sequence[str] = _ARCHS,
    min_layers: int = 1,
    max_layers: int = 16,
    include_markers: bool = True,
    allow_invalid: bool = False,
) -> st.SearchStrategy[Any]:
    """:class:`kvcheck.vocabulary.ModelConfig` values for the attention ``archs`` given.

    DSA configs set each skip-topk field in turn (none; ``index_topk_freq`` with or without
    ``index_skip_topk_offset``; ``index_topk_pattern``; ``cli_factor > 1``;
    ``indexer_types``), often with lower-precedence fields present but shadowed; patterns
    and ``indexer_types`` have one entry per layer, and layer 0 never skips.
    ``include_markers`` adds, each about half the time, the markers pool selection reads:
    ``sliding_window``, ``is_hybrid_linear`` and ``kv_cache_quant_algo`` ("NVFP4" or "FP8").
    ``allow_invalid=True`` makes about half the DSA examples invalid (``cli_factor``,
    ``index_topk_freq`` or ``index_skip_topk_offset`` <= 0, as the deciding field): those
    are :class:`types.SimpleNamespace` objects with the same fields, because ``ModelConfig``
    refuses them. Shrinks towards a one-layer MHA model with one KV head of dim 128 and no
    markers.

    Example:
        >>> from hypothesis import find
        >>> config = find(model_configs(archs=("dsa",)), lambda c: c.num_hidden_layers == 4)
        >>> config.attention_arch, config.num_hidden_layers, config.index_head_dim
        ('dsa', 4, 128)
    """
    chosen = check_choices(archs, "archs", _ARCHS)
    check_valid_integer(min_layers, "min_layers", min_value=1)
    check_valid_integer(max_layers, "max_layers", min_value=1)
    check_valid_interval(min_layers, max_layers, "min_layers", "max_layers")
    check_bool(include_markers, "include_markers")
    check_bool(allow_invalid, "allow_invalid")
    if allow_invalid and "dsa" not in chosen:
        raise InvalidArgument(
            f"allow_invalid=True needs 'dsa' in archs={archs!r}: only DSA configs can be invalid"
        )
    from kvcheck.vocabulary import ModelConfig  # here, so kvcheck.strategies imports without it

    return _model_configs(
        chosen, min_layers, max_layers, include_markers, allow_invalid, ModelConfig
    )


# --- server flags ------------------------------------------------------------------------------

#: The combination --prefill-only-disable-kv-cache accepts with the fewest changes, with
#: every other flag a rule reads at its default, so each draw names all of them.
_VALID_MINIMAL_FLAGS: dict[str, Any] = {
    **MINIMAL_VALID_FLAGS,
    "kv_cache_dtype": "auto",
    "attn_cp_size": 1,
    "enable_prefill_context_parallel": False,
    "enable_hisparse": False,
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "page_size": None,
}

#: One entry per flag that can break a rule; the FP4 and MXFP8 rules share --kv-cache-dtype,
#: so at most one of them is broken at a time.
_VIOLATION_GROUPS: tuple[str, ...] = (
    "is_embedding",
    "kv_cache_dtype",
    "chunked_prefill_size",
    "disable_radix_cache",
    "attn_cp_size",
    "enable_prefill_context_parallel",
    "enable_hisparse",
    "prefill_backend",
)


def _violating_values(draw: Callable[..., Any], group: str) -> dict[str, Any]:
    if group == "is_embedding":
        return {"is_embedding": False}
    if group == "kv_cache_dtype":
        return {"kv_cache_dtype": draw(st.sampled_from((*sorted(FP4_KV_CACHE_DTYPES), "mxfp8")))}
    if group == "chunked_prefill_size":
        # None is left for resolution to fill with SGLang's (positive) default.
        return {"chunked_prefill_size": draw(st.sampled_from((8192, 2048, None)))}
    if group == "disable_radix_cache":
        return {"disable_radix_cache": False}
    if group == "attn_cp_size":
        return {"attn_cp_size": draw(st.integers(2, 8))}
    if group == "enable_prefill_context_parallel":
        return {"enable_prefill_context_parallel": True}
    if group == "enable_hisparse":
        return {"enable_hisparse": True}
    shared, prefill = draw(
        st.sampled_from(
            (
                ("triton", None),
                ("flashinfer", None),
                ("fa3", "triton"),
                ("torch_native", "flashinfer"),
            )
        )
    )
    return {"attention_backend": shared, "prefill_attention_backend": prefill}


def _harmless_values(draw: Callable[..., Any]) -> dict[str, Any]:
    """Variation that breaks no rule: other KV dtypes, backend spellings, page sizes."""
    shared, prefill = draw(
        st.sampled_from((("fa3", None), ("fa4", None), ("triton", "fa3"), ("fa3", "fa4")))
    )
    return {
        # Not fp8_e5m2: resolution moves fa3 to triton for it, which breaks the backend rule.
        "kv_cache_dtype": draw(st.sampled_from(("auto", "bfloat16", "bf16", "fp8_e4m3"))),
        "attention_backend": shared,
        "prefill_attention_backend": prefill,
        "decode_attention_backend": draw(st.sampled_from((None, "triton", "fa3", "flashinfer"))),
        "page_size": draw(st.sampled_from((None, 1, 16, 64))),
    }


@st.composite
def _server_flags(
    draw: Callable[..., Any], flag_on: bool | None, min_violations: int, max_violations: int
) -> dict[str, Any]:
    flags = dict(_VALID_MINIMAL_FLAGS)
    flags["prefill_only_disable_kv_cache"] = (
        draw(st.sampled_from((True, False))) if flag_on is None else flag_on
    )
    if draw(st.booleans()):
        flags |= _harmless_values(draw)
    if min_violations == 0 and draw(st.booleans()):
        return flags  # accepted as often as rejected, not only when the list draws empty
    groups = draw(
        st.lists(
            st.sampled_from(_VIOLATION_GROUPS),
            min_size=min_violations,
            max_size=max_violations,
            unique=True,
        )
    )
    for group in groups:
        flags |= _violating_values(draw, group)
    return flags


def server_flags(
    *,
    prefill_only_disable_kv_cache: bool | None = None,
    min_violations: int = 0,
    max_violations: int | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts of ``ServerArgs`` field names to values around ``--prefill-only-disable-kv-cache``.

    Every dict sets every field the validation reads (``prefill_only_disable_kv_cache``,
    ``is_embedding``, ``kv_cache_dtype``, ``chunked_prefill_size``, ``disable_radix_cache``,
    ``attn_cp_size``, ``enable_prefill_context_parallel``, ``enable_hisparse``,
    ``attention_backend``, ``prefill_attention_backend``) plus ``decode_attention_backend``
    and ``page_size``. It starts from the valid minimal combination (``is_embedding=True``,
    ``chunked_prefill_size=-1``, ``disable_radix_cache=True``, ``attention_backend="fa3"``),
    sometimes varies it harmlessly, then breaks between ``min_violations`` and
    ``max_violations`` rules (None: 8, one per flag; the FP4 and MXFP8 rules share
    ``--kv-cache-dtype``), often several at once. ``prefill_only_disable_kv_cache=None``
    draws the flag; True or False fixes it. ``chunked_prefill_size=None`` is left for
    resolution to fill, so compare against ``kvcheck.reference.reference_first_violation``
    on the resolved arguments. Shrinks towards the valid minimal combination with the flag on.

    Example:
        >>> from hypothesis import find
        >>> flags = find(server_flags(max_violations=1), lambda flags: not flags["is_embedding"])
        >>> flags["prefill_only_disable_kv_cache"], flags["is_embedding"], flags["attn_cp_size"]
        (True, False, 1)
    """
    if prefill_only_disable_kv_cache is not None:
        check_bool(prefill_only_disable_kv_cache, "prefill_only_disable_kv_cache")
    most = len(_VIOLATION_GROUPS)
    high = most if max_violations is None else max_violations
    check_valid_integer(min_violations, "min_violations", min_value=0)
    check_valid_integer(high, "max_violations", min_value=0)
    check_valid_interval(min_violations, high, "min_violations", "max_violations")
    if high > most:
        raise InvalidArgument(
            f"max_violations={high!r} exceeds the {most} rules that can be broken together"
        )
    return _server_flags(prefill_only_disable_kv_cache, min_violations, high)
