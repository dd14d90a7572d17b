"""Serving-side properties: flag validation, pool selection, the skip rule and pool sizing.

Each ``check_*`` function takes a target (:class:`kvcheck.targets.Target`) and one input,
asks the target, compares its answer with the naive models in :mod:`kvcheck.reference`,
and raises :class:`~kvcheck.failures.PropertyFailure` (an ``AssertionError``)
in the ``got … but should be … [call]`` vocabulary when they disagree. Bad arguments to a
check raise ``ValueError``. Exceptions the contract does not allow for (a ``TypeError``
from the target, say) propagate unchanged, so they fail a test as themselves.

The checks run the same on any target; downstream suites call them from their own
Hypothesis tests:

Example::

    from hypothesis import given
    from kvcheck.properties.serving import check_validation_agrees
    from kvcheck.strategies import server_flags

    @given(flags=server_flags(min_violations=2))
    def test_first_violated_rule_wins(kvcheck_target, flags):
        check_validation_agrees(kvcheck_target, flags)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from kvcheck.failures import FailureSignature
from kvcheck.geometry import FAMILY_BUFFERS, SCALE_BUFFERS, WORKSPACE_BUFFERS
from kvcheck.properties.assertions import assert_equal, fail
from kvcheck.reference import (
    FP4_KV_CACHE_DTYPES,
    HISPARSE_INDEX_RATIO,
    PREFILL_ONLY_FLAG_DEFAULTS,
    PREFILL_ONLY_RULES,
    QUANTIZED_KV_DTYPES,
    SCALED_DSA_DTYPE,
    reference_cell_size_bytes,
    reference_first_violation,
    reference_max_total_num_tokens,
    reference_pool_bytes,
    reference_pool_family,
    reference_skip_mask,
    reference_skips_topk,
    reference_unsupported_family,
)
from kvcheck.specs import DTYPE_ITEMSIZE, QUANT_DTYPES, PoolSpec
from kvcheck.validation import check_bool, check_one_of, check_valid_integer

__all__ = [
    "CapacityCheck",
    "check_capacity_fits_budget",
    "check_cell_size",
    "check_more_skips_never_lower_capacity",
    "check_pool_selection",
    "check_skip_rule",
    "check_validation_agrees",
    "rules_named_by",
]

PREFILL_ONLY_FLAG = "--prefill-only-disable-kv-cache"

#: Other spellings a message may use for a rule's conflicting flag (SGLang's own names).
_FLAG_ALIASES: Mapping[str, tuple[str, ...]] = {
    "--attn-cp-size": ("--attention-context-parallel-size",),
    "--enable-prefill-context-parallel": ("--enable-prefill-cp",),
}
_RULES_BY_ID = {rule.rule_id: rule for rule in PREFILL_ONLY_RULES}
_BACKEND_RULE = "fa_prefill_backend"
_BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend")
_KV_DTYPE_RULES = ("fp4_kv_cache_dtype", "mxfp8_kv_cache_dtype")

#: The machine a flags dict describes when it leaves these out (ServerArgs' defaults).
_MACHINE_DEFAULTS: Mapping[str, Any] = {
    "device": "cuda",
    "gpu_arch": "sm90",
    "attention_arch": None,
    "model_path": "dummy",
    "decode_attention_backend": None,
}

# --- validation ---------------------------------------------------------------------------


def check_validation_agrees(target: Any, flags: Mapping[str, Any]) -> str | None:
    """The target accepts ``flags`` exactly when the reference rules do, else fails right.

    The reference is :data:`kvcheck.reference.PREFILL_ONLY_RULES`, read top to bottom on
    the flags after the defaults the rules depend on are filled in (see
    :func:`_rule_inputs`). A rejection must be a ``ValueError`` for the *first* violated
    rule whose message names both ``--prefill-only-disable-kv-cache`` and the conflicting
    flag. The rule is read from the error's ``rule`` attribute (kvcheck's
    ``PrefillOnlyFlagError``; its ``flag`` attribute, when present, must be the conflicting
    flag too); for errors without one it is identified from the flags the message names
    (:func:`rules_named_by`).

    Returns the id of the rule the flags were rejected for, or None when accepted.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> target = resolve_target("kvcheck")
        >>> check_validation_agrees(target, {"prefill_only_disable_kv_cache": True,
        ...     "is_embedding": True, "chunked_prefill_size": 4096, "attn_cp_size": 2})
        'chunked_prefill_size'
    """
    _require_methods(target, "validate_server_args")
    flags = _checked_flags(flags)
    expected = reference_first_violation(_rule_inputs(flags))
    call = f"target.validate_server_args({flags!r})"
    try:
        target.validate_server_args(dict(flags))
    except ValueError as error:
        if expected is None:
            raise fail(
                got=f"{type(error).__name__}: {error}",
                expected="accepted",
                call=call,
                signature=_validation_signature("rejected instead of accepted"),
            ) from error
        _check_rejection(error, expected, flags, call)
        return expected
    if expected is not None:
        raise fail(
            got="accepted",
            expected=f"ValueError for rule {expected!r} naming {_expected_flag(expected, flags)}",
            call=call,
            signature=_validation_signature(f"accepted instead of {_rule(expected, flags)}"),
        )
    return None


def _validation_signature(kind: str) -> FailureSignature:
    return FailureSignature(check="validation", call="validate_server_args", kind=kind)


def _rule(rule_id: str, flags: Mapping[str, Any]) -> str:
    """A rule as a failure's kind names it; the KV dtype rules also name the dtype."""
    if rule_id in _KV_DTYPE_RULES:
        return f"rule {rule_id} (kv_cache_dtype={flags.get('kv_cache_dtype')!r})"
    return f"rule {rule_id}"


def rules_named_by(message: str) -> tuple[str, ...]:
    """Ids of the rules whose conflicting flag ``message`` names, in precedence order.

    Flags count as named only as whole words (``--attention-backend`` is not named by
    ``--prefill-attention-backend``); SGLang's spellings (``--enable-prefill-cp``,
    ``--attention-context-parallel-size``) count too. The FP4 and MXFP8 rules share
    ``--kv-cache-dtype``; a message that names only dtypes of one kind keeps only its rule.

    Example:
        >>> rules_named_by("--prefill-only-disable-kv-cache requires --disable-radix-cache")
        ('disable_radix_cache',)
        >>> rules_named_by("no --kv-cache-dtype=mxfp8 with --prefill-only-disable-kv-cache")
        ('mxfp8_kv_cache_dtype',)
    """
    if not isinstance(message, str):
        raise ValueError(f"message={message!r} must be a str")
    named = [
        rule.rule_id
        for rule in PREFILL_ONLY_RULES
        if any(_names_flag(message, flag) for flag in _rule_flag_spellings(rule.rule_id))
    ]
    if all(rule in named for rule in _KV_DTYPE_RULES):
        names_fp4 = any(name in message for name in FP4_KV_CACHE_DTYPES)
        names_mxfp8 = "mxfp8" in message
        if names_fp4 != names_mxfp8:
            named.remove("mxfp8_kv_cache_dtype" if names_fp4 else "fp4_kv_cache_dtype")
    return tuple(named)


def _check_rejection(error: ValueError, expected: str, flags: Mapping[str, Any], call: str) -> None:
    __tracebackhide__ = True
    message = str(error)
    expected_flag = _expected_flag(expected, flags)
    rule_id = getattr(error, "rule", None)
    rule = _rule(expected, flags)
    if isinstance(rule_id, str):
        assert_equal(
            rule_id,
            expected,
            call=call,
            detail=f"the error's rule id; the first violated rule wins. Message: {message}",
            signature=_validation_signature(f"rule {rule_id} instead of {rule}"),
        )
        flag = getattr(error, "flag", None)
        if isinstance(flag, str) and flag not in _spellings(expected_flag):
            raise fail(
                got=flag,
                expected=expected_flag,
                call=call,
                detail="the error's .flag",
                signature=_validation_signature(f"flag {flag} instead of {expected_flag}"),
            )
    else:
        named = rules_named_by(message)
        if expected not in named:
            raise fail(
                got=f"an error naming the flags of rules {named}",
                expected=f"the error of rule {expected!r} (the first violated)",
                call=call,
                detail=f"message: {message}",
                signature=_validation_signature(f"an error naming rules {named} instead of {rule}"),
            )
    for flag in (PREFILL_ONLY_FLAG, expected_flag):
        if not any(_names_flag(message, spelling) for spelling in _spellings(flag)):
            raise fail(
                got=message,
                expected=f"a message that names {flag}",
                call=call,
                detail=f"rule {expected!r}: the message must name {PREFILL_ONLY_FLAG} and "
                f"{expected_flag}",
                signature=_validation_signature(f"{rule}'s message names no {flag}"),
            )


def _rule_inputs(flags: Mapping[str, Any]) -> dict[str, Any]:
    """``flags`` with what the rules read resolved as the serving contract describes.

    Missing fields take :data:`kvcheck.reference.PREFILL_ONLY_FLAG_DEFAULTS` (an unset
    ``chunked_prefill_size`` stays None, which is not -1, just as every default chunk size
    is not). Only the attention backend needs resolving: when neither backend flag is set
    it is the default of the machine the flags describe (``device``, ``gpu_arch``,
    ``attention_arch`` or the named model's); an equal prefill/decode pair replaces it;
    fa3 becomes triton with ``kv_cache_dtype="fp8_e5m2"`` (FA3 reads only e4m3 fp8).
    """
    resolved = {**_MACHINE_DEFAULTS, **PREFILL_ONLY_FLAG_DEFAULTS, **flags}
    backend = resolved["attention_backend"]
    prefill, decode = resolved["prefill_attention_backend"], resolved["decode_attention_backend"]
    if backend is None:
        backend = _default_attention_backend(resolved)
    if prefill is not None and prefill == decode:
        backend = prefill
    if backend == "fa3" and resolved["kv_cache_dtype"] == "fp8_e5m2":
        backend = "triton"
    resolved["attention_backend"] = backend
    return resolved


def _default_attention_backend(flags: Mapping[str, Any]) -> str:
    """SGLang's default backend for the machine and model the flags describe."""
    if flags["device"] == "cpu":
        return "intel_amx"
    arch = flags["attention_arch"] or _named_model_arch(flags["model_path"])
    if arch == "dsa":
        return "dsa"
    if flags["gpu_arch"] == "sm90":
        return "fa3"
    if arch == "mha":
        return "trtllm_mha" if flags["gpu_arch"] == "sm100" else "flashinfer"
    return "flashinfer" if flags["gpu_arch"] == "sm100" else "triton"


def _named_model_arch(model_path: Any) -> str:
    from kvcheck.vocabulary import MODELS  # data only: the named configs

    known = MODELS.get(model_path)
    return known.attention_arch if known is not None else "mha"


def _expected_flag(rule_id: str, flags: Mapping[str, Any]) -> str:
    if rule_id == _BACKEND_RULE and flags.get("prefill_attention_backend") is not None:
        return "--prefill-attention-backend"
    return _RULES_BY_ID[rule_id].conflicting_flag


def _rule_flag_spellings(rule_id: str) -> tuple[str, ...]:
    if rule_id == _BACKEND_RULE:
        return _BACKEND_FLAGS
    return _spellings(_RULES_BY_ID[rule_id].conflicting_flag)


def _spellings(flag: str) -> tuple[str, ...]:
    return (flag, *_FLAG_ALIASES.get(flag, ()))


def _names_flag(message: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", message) is not None


# --- pool selection -----------------------------------------------------------------------


def check_pool_selection(
    target: Any, flags: Mapping[str, Any], model: Any, *, is_draft: bool
) -> str:
    """Pool selection refuses exactly the families the flag cannot serve, and builds the rest.

    With ``--prefill-only-disable-kv-cache`` on, a non-draft worker must get the no-op pool
    for a plain MHA model and a ``RuntimeError`` naming the flag for every other family
    (:func:`kvcheck.reference.reference_unsupported_family`); a draft worker, or any worker
    with the flag off, must get the model's normal pool ("mha", "mla" or "dsa"). A target
    without a pool for a normal family (SWA, hybrid linear/Mamba, FP4 MHA) may answer that
    with a ``ValueError``, but never with the ``RuntimeError`` reserved for the flag.

    Returns the family built, ``"refused"`` (RuntimeError as expected) or ``"not built"``.

    Example:
        >>> from kvcheck.vocabulary import DEEPSEEK_V3_2, QWEN3_EMBEDDING_8B
        >>> from kvcheck.targets import resolve_target
        >>> target, flags = resolve_target("kvcheck"), {"prefill_only_disable_kv_cache": True}
        >>> check_pool_selection(target, flags, QWEN3_EMBEDDING_8B, is_draft=False)
        'noop'
        >>> check_pool_selection(target, flags, DEEPSEEK_V3_2, is_draft=False)
        'refused'
        >>> check_pool_selection(target, flags, DEEPSEEK_V3_2, is_draft=True)
        'dsa'
    """
    _require_methods(target, "select_pool_family")
    flags = _checked_flags(flags)
    _check_model(model)
    check_bool(is_draft, "is_draft", error=ValueError)
    unsupported = reference_unsupported_family(flags, model, is_draft_worker=is_draft)
    expected = (
        f"RuntimeError naming {PREFILL_ONLY_FLAG} ({unsupported})"
        if unsupported is not None
        else reference_pool_family(flags, model, is_draft_worker=is_draft)
    )
    call = f"target.select_pool_family({flags!r}, {model.name!r}, is_draft={is_draft})"
    wanted = f"refusing the {unsupported}" if unsupported is not None else expected
    worker = " for a draft worker" if is_draft else ""

    def signature(got: str) -> FailureSignature:
        # What was built instead of what, and for which worker, tells findings apart.
        return FailureSignature(
            check="selection", call="select_pool_family", kind=f"{got} instead of {wanted}{worker}"
        )

    try:
        family = target.select_pool_family(dict(flags), model, is_draft=is_draft)
    except RuntimeError as error:
        if unsupported is None or not _names_flag(str(error), PREFILL_ONLY_FLAG):
            raise fail(
                got=f"RuntimeError: {error}",
                expected=expected,
                call=call,
                detail=repr(model),
                signature=signature("RuntimeError"),
            ) from error
        return "refused"
    except ValueError as error:
        unbuilt = _families_without_builtin_pool(flags, model)
        if unsupported is not None or not unbuilt:
            raise fail(
                got=f"ValueError: {error}",
                expected=expected,
                call=call,
                detail=repr(model),
                signature=signature("ValueError"),
            ) from error
        return "not built"
    assert_equal(
        family, expected, call=call, detail=repr(model), signature=signature(f"built {family}")
    )
    return str(family)


def _families_without_builtin_pool(flags: Mapping[str, Any], model: Any) -> list[str]:
    """Markers of the normal families a target may have no pool for."""
    markers = []
    if getattr(model, "sliding_window", None) is not None:
        markers.append("SWA")
    if getattr(model, "is_hybrid_linear", False):
        markers.append("hybrid linear/Mamba")
    # Only an explicit FP4 --kv-cache-dtype makes an FP4 pool ("auto" keeps the model dtype
    # for a checkpoint's NVFP4 KV cache, as SGLang 0.5.23's configure_kv_cache_dtype does).
    if (flags.get("kv_cache_dtype") or "auto") in FP4_KV_CACHE_DTYPES:
        markers.append("FP4")
    return markers


# --- the DSA skip rule --------------------------------------------------------------------


def check_skip_rule(target: Any, model: Any) -> tuple[bool, ...] | None:
    """Every layer's skip decision, and the pool's skip mask, equal the reference's.

    For each layer ``target.dsa_layer_skips_topk(model, layer)`` must equal
    :func:`kvcheck.reference.reference_skips_topk`, and ``target.skip_topk_layers(model)``
    must equal :func:`kvcheck.reference.reference_skip_mask`. Where the reference raises
    ``ValueError`` (``cli_factor``, ``index_topk_freq`` or ``index_skip_topk_offset`` <= 0
    deciding the layer), the target must raise ``ValueError`` too.

    ``model`` is any DSA config object (``ModelConfig`` or one read with getattr, as
    :func:`kvcheck.strategies.model_configs` draws invalid ones). Returns the mask, or
    None for an invalid config.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> from kvcheck.targets import resolve_target
        >>> mask = check_skip_rule(resolve_target("kvcheck"), GLM_5_2_LIKE)
        >>> mask.count(False)
        21
    """
    _require_methods(target, "dsa_layer_skips_topk", "skip_topk_layers")
    _check_dsa_model("model", model)
    name = getattr(model, "name", "model")
    expected = [_outcome(reference_skips_topk, model, layer) for layer in _layers(model)]
    got = [_target_outcome(target.dsa_layer_skips_topk, model, layer) for layer in _layers(model)]
    for layer, (got_layer, expected_layer) in enumerate(zip(got, expected, strict=True)):
        assert_equal(
            got_layer,
            expected_layer,
            call=f"target.dsa_layer_skips_topk({name!r}, {layer})",
            detail=f"layer {layer} is the first of {len(got)} to differ; model: {model!r}",
            signature=FailureSignature(
                check="skip_rule",
                call="dsa_layer_skips_topk",
                kind=f"{got_layer} instead of {expected_layer}",
            ),
        )
    invalid = ValueError.__name__ in expected
    call = f"target.skip_topk_layers({name!r})"
    mask = _target_outcome(lambda: tuple(bool(skip) for skip in target.skip_topk_layers(model)))
    if invalid:
        assert_equal(
            mask,
            ValueError.__name__,
            call=call,
            detail=f"model: {model!r}",
            signature=FailureSignature(
                check="skip_rule", call="skip_topk_layers", kind=f"{mask} instead of ValueError"
            ),
        )
        return None
    reference_mask = reference_skip_mask(model)
    if mask != reference_mask and isinstance(mask, tuple) and len(mask) == len(reference_mask):
        first = next(i for i, (a, b) in enumerate(zip(mask, reference_mask, strict=True)) if a != b)
        raise fail(
            got=mask[first],
            expected=reference_mask[first],
            call=call,
            detail=f"entry {first} of the mask is the first to differ; model: {model!r}",
        )
    assert_equal(mask, reference_mask, call=call, detail=f"model: {model!r}")
    return reference_mask


def _target_outcome(function: Callable[..., Any], *args: Any) -> Any:
    """:func:`_outcome` of a target's call, where any other exception is an answer too
    (its type name): a wrong exception is a wrong answer, reported as one."""
    try:
        return _outcome(function, *args)
    except Exception as error:  # compared with the reference's answer by the caller
        return type(error).__name__


def _outcome(function: Callable[..., Any], *args: Any) -> Any:
    """``bool(function(*args))``, ``"ValueError"`` if it raised one, the value otherwise."""
    try:
        value = function(*args)
    except ValueError:
        return ValueError.__name__
    return bool(value) if isinstance(value, bool | int) else value


# --- the configurator ---------------------------------------------------------------------


class CapacityCheck(NamedTuple):
    """What :func:`check_capacity_fits_budget` found.

    ``pages_short`` says which of the accepted answers the target gave: 0 when
    ``max_total_num_tokens`` is the largest page-aligned count whose pools fit, 1 when it
    is one page short. ``measured_by`` is ``"meta pool"`` (the target built the pool on
    ``meta`` and its tensors were counted), ``"reference formula"``, or ``"nothing fits"``
    when the budget holds no page and the target said so.
    """

    max_total_num_tokens: int
    pool_bytes: int
    budget_bytes: int
    largest_fitting: int
    pages_short: int
    measured_by: str


def check_cell_size(
    target: Any,
    model: Any,
    *,
    dtype: str,
    is_draft: bool = False,
    enable_hisparse: bool = False,
) -> int | None:
    """``target.cell_size_bytes`` equals the reference formula.

    Per token over all layers: MHA ``layers * kv_heads * (head_dim + v_head_dim) *
    itemsize``; MLA ``layers * (kv_lora_rank + qk_rope_head_dim) * itemsize``; DSA the same
    (SGLang's scaled row in ``float8_e4m3fn``) plus ``(index_head_dim + index_head_dim //
    128 * 4)`` per indexer layer, where indexer layers are the non-skip ones, or every layer
    for a draft worker or HiSparse (times the HiSparse ratio)
    (:func:`kvcheck.reference.reference_cell_size_bytes`). Returns the cell size, or None
    for a configuration the reference refuses (an fp8 DSA latent whose ``kv_lora_rank`` is
    not a multiple of 128), which the target must refuse with ``ValueError`` too.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> from kvcheck.targets import resolve_target
        >>> check_cell_size(resolve_target("kvcheck"), GLM_5_2_LIKE, dtype="bfloat16")
        92628
    """
    _require_methods(target, "cell_size_bytes")
    _check_model(model)
    _itemsize(dtype)
    check_bool(is_draft, "is_draft", error=ValueError)
    check_bool(enable_hisparse, "enable_hisparse", error=ValueError)
    call = (
        f"target.cell_size_bytes({model.name!r}, dtype={dtype!r}, is_draft={is_draft}, "
        f"enable_hisparse={enable_hisparse})"
    )
    context = _configuration(model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse)
    refusal = _reference_refusal(
        reference_cell_size_bytes,
        model,
        dtype=dtype,
        is_draft_worker=is_draft,
        enable_hisparse=enable_hisparse,
    )
    if refusal is not None:
        _expect_refusal(
            lambda: target.cell_size_bytes(
                model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
            ),
            refusal,
            call=call,
            signature=lambda kind: FailureSignature(
                "cell_size", "cell_size_bytes", f"{kind} {context}"
            ),
        )
        return None
    expected = reference_cell_size_bytes(
        model, dtype=dtype, is_draft_worker=is_draft, enable_hisparse=enable_hisparse
    )
    try:
        got = target.cell_size_bytes(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
    except Exception as error:  # the formula has an answer for every valid model
        raise fail(
            got=f"{type(error).__name__}: {error}",
            expected=expected,
            call=call,
            signature=FailureSignature(
                "cell_size", "cell_size_bytes", f"raised {type(error).__name__} {context}"
            ),
        ) from error
    assert_equal(
        got,
        expected,
        call=call,
        detail=_indexer_detail(model, is_draft=is_draft, enable_hisparse=enable_hisparse),
        signature=FailureSignature("cell_size", "cell_size_bytes", f"differs {context}"),
    )
    return expected


def _reference_refusal(function: Callable[..., Any], *args: Any, **kwargs: Any) -> str | None:
    """The reference's ValueError message for a configuration it refuses, else None."""
    try:
        function(*args, **kwargs)
    except ValueError as error:
        return str(error)
    return None


def _expect_refusal(
    call_target: Callable[[], Any],
    refusal: str,
    *,
    call: str,
    signature: Callable[[str], FailureSignature],
) -> None:
    """The target refuses, as the reference does (``refusal``), with a ``ValueError``."""
    try:
        got = call_target()
    except ValueError:
        return
    except Exception as error:  # a refusal of another type is a different answer
        raise fail(
            got=f"{type(error).__name__}: {error}",
            expected=f"ValueError ({refusal})",
            call=call,
            signature=signature(f"raised {type(error).__name__}"),
        ) from error
    raise fail(
        got=got,
        expected=f"ValueError ({refusal})",
        call=call,
        signature=signature("accepted a refused configuration"),
    )


def _configuration(model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool) -> str:
    """``(arch dtype[, draft][, hisparse])``: the part of a configurator failure's kind that
    tells findings apart."""
    extras = "".join(
        f", {name}" for name, on in (("draft", is_draft), ("hisparse", enable_hisparse)) if on
    )
    return f"({getattr(model, 'attention_arch', '?')} {dtype}{extras})"


def check_capacity_fits_budget(
    target: Any,
    model: Any,
    budget_bytes: int,
    *,
    dtype: str,
    page_size: int,
    is_draft: bool = False,
    enable_hisparse: bool = False,
    device: str = "meta",
) -> CapacityCheck:
    """``max_total_num_tokens`` is page-aligned, its pools fit the budget, and it is maximal.

    The pools for the answer are measured by building them through ``target.make_pool`` on
    ``device`` (default ``meta``: shapes without memory, so production scale is free) and
    counting their tensors' bytes, when the target supports that device and the model's
    pool family (and the answer is not 0); otherwise by
    :func:`kvcheck.reference.reference_pool_bytes`. Either way
    the padding page and the DSA index pages count. The answer must be the largest
    page-aligned count that fits (:func:`kvcheck.reference.reference_max_total_num_tokens`)
    or at most one page short of it; the result says which. When not even one page fits,
    the target may raise ``ValueError`` or answer 0.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> from kvcheck.targets import resolve_target
        >>> found = check_capacity_fits_budget(resolve_target("kvcheck"), GLM_5_2_LIKE,
        ...                                    60 << 30, dtype="bfloat16", page_size=64)
        >>> found.max_total_num_tokens, found.pages_short, found.measured_by
        (695424, 0, 'meta pool')
    """
    _require_methods(target, "max_total_num_tokens")
    _check_model(model)
    check_valid_integer(budget_bytes, "budget_bytes", min_value=0, error=ValueError)
    _itemsize(dtype)
    check_valid_integer(page_size, "page_size", min_value=1, error=ValueError)
    check_bool(is_draft, "is_draft", error=ValueError)
    check_bool(enable_hisparse, "enable_hisparse", error=ValueError)
    if not isinstance(device, str) or not device:
        raise ValueError(f"device={device!r} must be a torch device string such as 'meta'")
    options = {"is_draft": is_draft, "enable_hisparse": enable_hisparse}
    call = (
        f"target.max_total_num_tokens({model.name!r}, budget_bytes={budget_bytes}, "
        f"dtype={dtype!r}, page_size={page_size}, is_draft={is_draft}, "
        f"enable_hisparse={enable_hisparse})"
    )
    context = _configuration(model, dtype=dtype, **options)

    def signature(kind: str) -> FailureSignature:
        return FailureSignature("capacity", "max_total_num_tokens", f"{kind} {context}")

    reference_options: dict[str, Any] = {
        "dtype": dtype,
        "page_size": page_size,
        "is_draft_worker": is_draft,
        "enable_hisparse": enable_hisparse,
    }
    refusal = _reference_refusal(
        reference_max_total_num_tokens, model, budget_bytes=budget_bytes, **reference_options
    )
    if refusal is not None:
        _expect_refusal(
            lambda: target.max_total_num_tokens(
                model, budget_bytes=budget_bytes, dtype=dtype, page_size=page_size, **options
            ),
            refusal,
            call=call,
            signature=signature,
        )
        return CapacityCheck(0, 0, budget_bytes, 0, 0, "refused")
    largest = reference_max_total_num_tokens(model, budget_bytes=budget_bytes, **reference_options)

    try:
        got = target.max_total_num_tokens(
            model, budget_bytes=budget_bytes, dtype=dtype, page_size=page_size, **options
        )
    except Exception as error:  # a refusal is right only when nothing fits, and as ValueError
        if isinstance(error, ValueError) and largest == 0:
            return CapacityCheck(0, 0, budget_bytes, 0, 0, "nothing fits")
        raise fail(
            got=f"{type(error).__name__}: {error}",
            expected=largest,
            call=call,
            signature=signature(f"raised {type(error).__name__}"),
        ) from error
    if isinstance(got, bool) or not isinstance(got, int) or got < 0:
        raise fail(got=got, expected="an int >= 0", call=call, signature=signature("not a count"))
    if largest == 0 and got == 0:
        return CapacityCheck(0, 0, budget_bytes, 0, 0, "nothing fits")
    if got % page_size:
        raise fail(
            got=got,
            expected=f"a multiple of page_size={page_size}",
            call=call,
            detail=f"{got % page_size} tokens past the last whole page",
            signature=signature("not whole pages"),
        )
    held, measured_by = _pool_bytes_for(
        target, model, num_tokens=got, dtype=dtype, page_size=page_size, device=device, **options
    )
    if held > budget_bytes:
        # Over by less than the padding page and index rounding of one page of tokens is
        # the classic off-by-a-page; by more is a different mistake.
        page_bytes = reference_pool_bytes(model, num_tokens=page_size, **reference_options)
        by = "less" if held - budget_bytes <= page_bytes else "more"
        raise fail(
            got=f"pools of {held} bytes for {got} tokens",
            expected=f"at most budget_bytes={budget_bytes}",
            call=call,
            detail=f"{held - budget_bytes} bytes over the budget (measured by {measured_by}); "
            f"the largest count that fits is {largest}",
            signature=signature(f"over the budget by {by} than a page"),
        )
    if got > largest:
        raise fail(
            got=got,
            expected=f"at most {largest}, the largest page-aligned count whose pools fit",
            call=call,
            detail=f"pools measured by {measured_by} hold {held} bytes, fewer than the "
            "reference formula gives",
            signature=signature("more than fits"),
        )
    pages_short = (largest - got) // page_size
    if pages_short > 1:
        raise fail(
            got=got,
            expected=f"{largest} (or one page fewer)",
            call=call,
            detail=f"{pages_short} pages short of the largest count that fits the budget",
            signature=signature("pages short"),
        )
    return CapacityCheck(got, held, budget_bytes, largest, pages_short, measured_by)


def check_more_skips_never_lower_capacity(
    target: Any,
    model_a: Any,
    model_b: Any,
    budget_bytes: int,
    *,
    dtype: str,
    page_size: int,
) -> tuple[int, int]:
    """Turning more layers into skip layers never lowers ``max_total_num_tokens``.

    ``model_a`` and ``model_b`` are DSA configs with the same geometry where ``model_b``
    skips every layer ``model_a`` skips (by the reference skip rule), and maybe more. The
    budget must hold at least one page of ``model_a``. Returns both capacities ``(a, b)``;
    fails when ``b < a`` or when ``model_b`` is refused a budget ``model_a`` fits in.

    Example:
        >>> import dataclasses
        >>> from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE
        >>> from kvcheck.targets import resolve_target
        >>> every_layer = dataclasses.replace(GLM_5_2_LIKE, index_topk_freq=None,
        ...                                   index_skip_topk_offset=None)
        >>> a, b = check_more_skips_never_lower_capacity(
        ...     resolve_target("kvcheck"), every_layer, GLM_5_2_LIKE, 60 << 30,
        ...     dtype="bfloat16", page_size=64)
        >>> a < b
        True
    """
    _require_methods(target, "max_total_num_tokens")
    _itemsize(dtype)
    check_valid_integer(page_size, "page_size", min_value=1, error=ValueError)
    check_valid_integer(budget_bytes, "budget_bytes", min_value=0, error=ValueError)
    for name, model in (("model_a", model_a), ("model_b", model_b)):
        _check_dsa_model(name, model)
    for field in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim"):
        if getattr(model_a, field) != getattr(model_b, field):
            raise ValueError(
                f"model_a.{field}={getattr(model_a, field)!r} != "
                f"model_b.{field}={getattr(model_b, field)!r}: only the skip layers may differ"
            )
    mask_a, mask_b = reference_skip_mask(model_a), reference_skip_mask(model_b)
    lost = [layer for layer, (a, b) in enumerate(zip(mask_a, mask_b, strict=True)) if a and not b]
    if lost:
        raise ValueError(
            f"model_b must skip every layer model_a skips, but layer_id={lost[0]} skips in "
            f"model_a only (masks {mask_a} and {mask_b})"
        )
    refusal = _reference_refusal(
        reference_pool_bytes, model_a, num_tokens=page_size, dtype=dtype, page_size=page_size
    )
    if refusal is not None:  # same geometry: both models are refused
        for name, model in (("model_a", model_a), ("model_b", model_b)):
            context = _configuration(model, dtype=dtype, is_draft=False, enable_hisparse=False)
            _expect_refusal(
                functools.partial(
                    target.max_total_num_tokens,
                    model,
                    budget_bytes=budget_bytes,
                    dtype=dtype,
                    page_size=page_size,
                    is_draft=False,
                    enable_hisparse=False,
                ),
                refusal,
                call=f"target.max_total_num_tokens({name}={getattr(model, 'name', name)!r}, "
                f"budget_bytes={budget_bytes}, dtype={dtype!r}, page_size={page_size})",
                signature=functools.partial(_skip_capacity_signature, context=context),
            )
        return 0, 0
    one_page = reference_pool_bytes(model_a, num_tokens=page_size, dtype=dtype, page_size=page_size)
    if budget_bytes < one_page:
        raise ValueError(
            f"budget_bytes={budget_bytes} is below the {one_page} bytes one page of model_a "
            f"needs with page_size={page_size}"
        )
    capacities = []
    for name, model in (("model_a", model_a), ("model_b", model_b)):
        call = (
            f"target.max_total_num_tokens({name}={getattr(model, 'name', name)!r}, "
            f"budget_bytes={budget_bytes}, dtype={dtype!r}, page_size={page_size})"
        )
        context = _configuration(model, dtype=dtype, is_draft=False, enable_hisparse=False)
        try:
            capacities.append(
                target.max_total_num_tokens(
                    model,
                    budget_bytes=budget_bytes,
                    dtype=dtype,
                    page_size=page_size,
                    is_draft=False,
                    enable_hisparse=False,
                )
            )
        except Exception as error:  # a refusal of a budget that fits is a wrong answer
            raise fail(
                got=f"{type(error).__name__}: {error}",
                expected=f"a capacity (one page needs {one_page} bytes at most)",
                call=call,
                signature=FailureSignature(
                    "skip_capacity",
                    "max_total_num_tokens",
                    f"raised {type(error).__name__} {context}",
                ),
            ) from error
    capacity_a, capacity_b = capacities
    if capacity_b < capacity_a:
        raise fail(
            got=f"{capacity_b} tokens for model_b",
            expected=f">= {capacity_a}, the capacity of model_a",
            call=f"target.max_total_num_tokens(..., budget_bytes={budget_bytes}, "
            f"dtype={dtype!r}, page_size={page_size})",
            detail=f"model_b skips layers {_skipped(mask_b)}, model_a only {_skipped(mask_a)}",
            signature=FailureSignature(
                "skip_capacity", "max_total_num_tokens", "more skips, fewer tokens"
            ),
        )
    return capacity_a, capacity_b


def _skip_capacity_signature(kind: str, *, context: str) -> FailureSignature:
    return FailureSignature("skip_capacity", "max_total_num_tokens", f"{kind} {context}")


def _pool_bytes_for(
    target: Any,
    model: Any,
    *,
    num_tokens: int,
    dtype: str,
    page_size: int,
    is_draft: bool,
    enable_hisparse: bool,
    device: str,
) -> tuple[int, str]:
    """Bytes of the pools for ``num_tokens``, and how they were measured."""
    from kvcheck.strategies.limits import pool_spec_limits_of
    from kvcheck.targets import supports

    family = model.attention_arch
    limits = pool_spec_limits_of(target).get(family, {})
    # A quantized --kv-cache-dtype: the pool of kvcheck's variant for it (mha:<dtype>, or
    # mla:fp4), built only where the target's surface lists that kv_quant.
    kv_quant = (dtype if family == "mha" else "fp4") if dtype in QUANTIZED_KV_DTYPES else "none"
    can_build = (
        # no kv_quant limit: the target builds every value (Surface.everything)
        kv_quant in limits.get("kv_quant", (kv_quant,))
        and num_tokens > 0  # a pool holds at least one token: there is nothing to build for 0
        and callable(getattr(target, "make_pool", None))
        and supports(target, f"{family}_pool")
        and (device != "meta" or supports(target, "meta_device", family=family))
        # A layout the target refuses (sglang asserts 64-token DSA pages) is measured by
        # the formula instead.
        # (pools built here have index kpool 1: their index pages are their pages)
        and page_size in limits.get("page_size", limits.get("index_page_size", (page_size,)))
        and model.index_head_dim in limits.get("index_head_dim", (model.index_head_dim,))
    )
    if not can_build:
        formula = reference_pool_bytes(
            model,
            num_tokens=num_tokens,
            dtype=dtype,
            page_size=page_size,
            is_draft_worker=is_draft,
            enable_hisparse=enable_hisparse,
        )
        return formula, "reference formula"
    mask = (
        reference_skip_mask(model, is_draft_worker=is_draft, enable_hisparse=enable_hisparse)
        if family == "dsa"
        else None
    )
    spec = PoolSpec(
        family=family,
        size=num_tokens,
        page_size=page_size,
        layer_num=model.num_hidden_layers,
        dtype=QUANT_DTYPES[kv_quant][0] if kv_quant != "none" else dtype,
        kv_quant=kv_quant,
        head_num=model.num_key_value_heads,
        head_dim=model.head_dim,
        v_head_dim=model.v_head_dim,
        kv_lora_rank=model.kv_lora_rank,
        qk_rope_head_dim=model.qk_rope_head_dim,
        index_head_dim=model.index_head_dim,
        skip_topk_layers=mask,
        # SGLang's DSA pool: a scaled fp8 latent row for float8_e4m3fn, and with HiSparse
        # index keys for the host-expanded logical ids.
        latent_layout="scaled" if family == "dsa" and dtype == SCALED_DSA_DTYPE else "raw",
        index_buf_size=(
            num_tokens * (HISPARSE_INDEX_RATIO if enable_hisparse else 1)
            if family == "dsa"
            else None
        ),
    )
    pool = target.make_pool(spec, device=device)
    # Only the family's own buffers: a pool may keep views of them under other names.
    buffers = FAMILY_BUFFERS[family] + (SCALE_BUFFERS if kv_quant != "none" else ())
    held = sum(
        tensor.numel() * tensor.element_size()
        for buffer in buffers
        for tensor in getattr(pool, buffer, None) or ()
    )
    # NVFP4's dequant workspace: one tensor per part, shared by the layers.
    held += sum(
        tensor.numel() * tensor.element_size()
        for buffer in WORKSPACE_BUFFERS
        if (tensor := getattr(pool, buffer, None)) is not None
    )
    return held, f"{device} pool"


def _indexer_detail(model: Any, *, is_draft: bool, enable_hisparse: bool) -> str:
    if model.attention_arch != "dsa":
        return f"model: {model!r}"
    mask = reference_skip_mask(model, is_draft_worker=is_draft, enable_hisparse=enable_hisparse)
    return (
        f"{mask.count(False)} of {len(mask)} layers hold an indexer (skip layers "
        f"{_skipped(mask)}); model: {model!r}"
    )


def _skipped(mask: Sequence[bool]) -> list[int]:
    return [layer for layer, skip in enumerate(mask) if skip]


# --- argument checks ----------------------------------------------------------------------


def _require_methods(target: Any, *methods: str) -> None:
    missing = [method for method in methods if not callable(getattr(target, method, None))]
    if missing:
        raise ValueError(f"target={target!r} has no callable {', '.join(missing)}")


def _checked_flags(flags: Any) -> Mapping[str, Any]:
    from kvcheck.serving import ServerArgs  # field names only: the flag vocabulary

    if not isinstance(flags, Mapping):
        raise ValueError(f"flags={flags!r} must be a mapping of ServerArgs field names to values")
    known = {field.name for field in dataclasses.fields(ServerArgs)}
    unknown = sorted(name for name in flags if name not in known)
    if unknown:
        raise ValueError(f"flags={dict(flags)!r} names {unknown}, which are not ServerArgs fields")
    return flags


def _check_model(model: Any) -> None:
    arch = getattr(model, "attention_arch", None)
    if arch not in ("mha", "mla", "dsa") or not isinstance(getattr(model, "name", None), str):
        raise ValueError(
            f"model={model!r} must be a ModelConfig (attention_arch 'mha', 'mla' or 'dsa')"
        )


def _check_dsa_model(name: str, model: Any) -> None:
    arch = getattr(model, "attention_arch", None)
    if arch != "dsa":
        raise ValueError(f"{name}={model!r} has attention_arch={arch!r}; a DSA config is needed")
    layers = getattr(model, "num_hidden_layers", None)
    check_valid_integer(layers, f"{name}.num_hidden_layers", min_value=1, error=ValueError)


def _layers(model: Any) -> range:
    return range(model.num_hidden_layers)


def _itemsize(dtype: Any) -> int:
    """Bytes per value of a pool dtype; 1 for a quantized ``--kv-cache-dtype`` (checked by
    name only: its bytes per token are the reference's)."""
    check_one_of(
        dtype, "dtype", sorted(DTYPE_ITEMSIZE) + list(QUANTIZED_KV_DTYPES), error=ValueError
    )
    return DTYPE_ITEMSIZE.get(dtype, 1)
