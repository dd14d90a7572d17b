"""Translate kvcheck's vocabulary into the objects sglang 0.5.23's own functions read.

kvcheck describes a server with a flags dict (its ``ServerArgs`` field names plus an
explicit description of the machine) and a model with :class:`kvcheck.vocabulary.ModelConfig`.
sglang reads its own ``ServerArgs`` record, a HuggingFace config, its ``ModelConfig`` and a
``KVCacheConfigurator``. This module builds those inputs and nothing else: every decision
is left to sglang's code, except the few resolution steps that sglang takes from hardware
or a checkpoint, which are translated here from sglang's source and say so.

All functions import sglang lazily; call them only after :func:`kvcheck.targets.sglang`
has loaded it.

Example:
    >>> sglang_flag_values({"enable_prefill_context_parallel": True, "gpu_arch": "sm90"})
    {'enable_prefill_cp': True}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

#: kvcheck flag name -> sglang 0.5.23 ``ServerArgs`` field name, where they differ.
FLAG_RENAMES: Mapping[str, str] = {"enable_prefill_context_parallel": "enable_prefill_cp"}

#: kvcheck-only fields describing the machine and model; sglang detects these instead.
MACHINE_FIELDS: frozenset[str] = frozenset({"gpu_arch", "gpu_memory_gb", "attention_arch"})

#: The HF architecture name sglang keys each kvcheck attention family on: DSA needs one
#: of sglang's DeepSeek-DSA names (plus ``index_topk``), MLA a DeepSeek name without it.
ARCHITECTURE_OF: Mapping[str, str] = {
    "mha": "Qwen3ForCausalLM",
    "mla": "DeepseekV3ForCausalLM",
    "dsa": "DeepseekV32ForCausalLM",
}

#: Model fields copied onto the HF config when set (sglang reads them with getattr).
_HF_FIELDS: tuple[str, ...] = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "v_head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
    "index_topk",
    "index_topk_freq",
    "index_skip_topk_offset",
    "index_topk_pattern",
    "indexer_types",
    "cli_factor",
    "sliding_window",
)

#: KV-cache dtype names kvcheck uses for pools -> torch dtypes.
_POOL_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1fn_x2": torch.float4_e2m1fn_x2,
}

#: The model dtype sglang's "auto" KV dtype falls back to for the configs kvcheck names.
MODEL_DTYPE = torch.bfloat16


def sglang_flag_values(flags: Mapping[str, Any]) -> dict[str, Any]:
    """kvcheck flags -> keyword arguments for sglang's ``ServerArgs``.

    kvcheck names are renamed to sglang's (:data:`FLAG_RENAMES`) and the machine fields
    (:data:`MACHINE_FIELDS`) are dropped.

    ``model_path`` is left out: sglang would try to load it. Callers pass "dummy".

    Example:
        >>> sglang_flag_values({"is_embedding": True, "model_path": "x"})
        {'is_embedding': True}
    """
    if not isinstance(flags, Mapping):
        raise ValueError(f"flags={flags!r} must be a mapping of ServerArgs field names to values")
    values: dict[str, Any] = {}
    for name, value in flags.items():
        if name in MACHINE_FIELDS or name == "model_path":
            continue
        values[FLAG_RENAMES.get(name, name)] = value
    return values


def sglang_server_args(flags: Mapping[str, Any]) -> Any:
    """An unresolved sglang ``ServerArgs`` for ``flags`` (model_path "dummy").

    Unknown names raise ``ValueError`` listing them, instead of sglang's TypeError.
    """
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.server_args import ServerArgs

    values = sglang_flag_values(flags)
    known = {f.name for f in record_fields(ServerArgs)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"flags: {unknown} have no sglang ServerArgs field (renames applied: "
            f"{dict(FLAG_RENAMES)}; kvcheck machine fields ignored: {sorted(MACHINE_FIELDS)})"
        )
    return ServerArgs(model_path="dummy", **values)


def described_attention_arch(flags: Mapping[str, Any]) -> str:
    """The attention family the flags describe.

    ``attention_arch``, else the family of a kvcheck model named by ``model_path``, else mha.
    """
    arch = flags.get("attention_arch")
    if arch is not None:
        return str(arch)
    from kvcheck.vocabulary import MODELS

    known = MODELS.get(str(flags.get("model_path", "dummy")))
    return known.attention_arch if known is not None else "mha"


def platform_default_attention_backend(flags: Mapping[str, Any]) -> str:
    """sglang's ``get_default_attn_backend`` for the machine the flags describe.

    sglang reads the installed GPU; kvcheck describes it (``gpu_arch``, default sm90).
    Translated from sglang 0.5.23 ``arg_groups/model_override_base.py``: MHA gets fa3 on
    Hopper, trtllm_mha on sm100, else flashinfer; MLA/DSA fa3 on Hopper, flashinfer on
    sm100, else triton (no speculative decoding, CUDA >= 12.3, flashinfer installed).

    Example:
        >>> platform_default_attention_backend({"gpu_arch": "sm100"})
        'trtllm_mha'
    """
    gpu_arch = flags.get("gpu_arch") or "sm90"
    latent = described_attention_arch(flags) in ("mla", "dsa")
    if gpu_arch == "sm90":
        return "fa3"
    if gpu_arch == "sm100":
        return "flashinfer" if latent else "trtllm_mha"
    return "triton" if latent else "flashinfer"


def resolve_attention_backend(server_args: Any, flags: Mapping[str, Any]) -> None:
    """Declare on ``server_args`` the attention backend sglang's pipeline settles before
    ``handle_prefill_only_disable_kv_cache`` (which asserts that one is set).

    Steps, in sglang's pipeline order: the real ``handle_cpu_backends`` hook; the
    DeepSeek-DSA model override (``dsa`` when no backend is set; translated, it needs the
    checkpoint); the platform default (translated, see
    :func:`platform_default_attention_backend`) when nothing set one; then sglang's own
    ``_attention_backend_default`` pass, which lets an equal prefill/decode pair win, and
    its ``_attention_backend_fa3_fp8_fallback`` pass (fa3 becomes triton with an
    fp8_e5m2 KV cache), both as ``handle_attention_backend_compatibility`` runs them. The
    other passes of that hook read the installed GPU and cannot change an FA backend.
    """
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.arg_groups.overrides import (
        _attention_backend_default,
        _attention_backend_fa3_fp8_fallback,
        declare_resolution,
        run_post_process_pass,
    )
    from sglang.srt.arg_groups.platform_hook import handle_cpu_backends

    handle_cpu_backends(server_args)
    view = resolved_view(server_args)
    unset = (
        view.attention_backend is None
        and view.prefill_attention_backend is None
        and view.decode_attention_backend is None
    )
    if unset and described_attention_arch(flags) == "dsa":
        declare_resolution(server_args, "kvcheck: sglang's DeepSeek-DSA override", **_dsa())
    view = resolved_view(server_args)
    pair_wins = (
        view.prefill_attention_backend is not None
        and view.prefill_attention_backend == view.decode_attention_backend
    )
    if view.attention_backend is None and not pair_wins:
        declare_resolution(
            server_args,
            "kvcheck: sglang's platform default",
            attention_backend=platform_default_attention_backend(flags),
        )
    run_post_process_pass(server_args, _attention_backend_default)
    run_post_process_pass(server_args, _attention_backend_fa3_fp8_fallback)


def _dsa() -> dict[str, str]:
    return {"attention_backend": "dsa"}


class HFConfig(SimpleNamespace):
    """The HuggingFace config attributes sglang reads, as plain attributes."""

    def get_text_config(self, *args: Any, **kwargs: Any) -> HFConfig:
        return self


def attention_family(model: Any) -> str:
    """``model.attention_arch``; for a duck-typed config without one, "dsa" if it sets
    ``index_topk`` (as kvcheck's ``is_dsa_config`` decides), else "mha".

    Example:
        >>> from types import SimpleNamespace
        >>> attention_family(SimpleNamespace(index_topk=2048))
        'dsa'
    """
    arch: Any = getattr(model, "attention_arch", None)
    if arch is None:
        return "dsa" if getattr(model, "index_topk", None) is not None else "mha"
    if not isinstance(arch, str) or arch not in ARCHITECTURE_OF:
        raise ValueError(
            f"model.attention_arch={arch!r} not in {tuple(ARCHITECTURE_OF)} (model={model!r})"
        )
    return arch


def hf_config_for(model: Any) -> HFConfig:
    """A HuggingFace-style config for a kvcheck model (duck-typed: read with getattr).

    The architecture name is the one sglang recognises for the model's attention family
    (:data:`ARCHITECTURE_OF`); unset (None) fields are left out, as a checkpoint would.

    Example:
        >>> from kvcheck.vocabulary import GLM_5_2_LIKE
        >>> hf = hf_config_for(GLM_5_2_LIKE)
        >>> hf.architectures, hf.index_topk_freq
        (['DeepseekV32ForCausalLM'], 4)
    """
    arch = attention_family(model)
    values: dict[str, Any] = {"architectures": [ARCHITECTURE_OF[arch]]}
    for name in _HF_FIELDS:
        value = getattr(model, name, None)
        if value is not None:
            values[name] = list(value) if isinstance(value, tuple) else value
    if arch != "dsa":
        values.pop("index_topk", None)  # sglang treats a DeepSeek config with it as DSA
    return HFConfig(**values)


def pool_dtype(name: str) -> torch.dtype:
    """The torch dtype for a kvcheck dtype name ("bfloat16", "float8_e4m3fn", ...).

    Example:
        >>> pool_dtype("float8_e4m3fn")
        torch.float8_e4m3fn
    """
    if isinstance(name, torch.dtype) and name in _POOL_DTYPES.values():
        return name
    if name not in _POOL_DTYPES:
        raise ValueError(f"dtype={name!r} not in {sorted(_POOL_DTYPES)}")
    return _POOL_DTYPES[name]


def kv_cache_torch_dtype(kv_cache_dtype: str, model: Any) -> torch.dtype:
    """The pool dtype sglang derives from ``--kv-cache-dtype`` for ``model``.

    Translated from sglang 0.5.23 ``mem_cache/kv_cache_dtype.configure_kv_cache_dtype``
    (which also needs the loaded model): "auto" is the model dtype unless the checkpoint
    declares an FP8 KV cache; a checkpoint's NVFP4 KV declaration does not select FP4;
    unknown names raise ``ValueError`` as sglang's does.

    Example:
        >>> kv_cache_torch_dtype("nvfp4", None)
        torch.float4_e2m1fn_x2
    """
    if kv_cache_dtype == "auto":
        algo = getattr(model, "kv_cache_quant_algo", None)
        if isinstance(algo, str) and algo.upper() == "FP8":
            return torch.float8_e4m3fn
        return MODEL_DTYPE
    table: dict[str, torch.dtype] = {
        "fp8_e5m2": torch.float8_e5m2,
        "fp8_e4m3": torch.float8_e4m3fn,
        "mxfp8": torch.float8_e4m3fn,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "nvfp4": torch.float4_e2m1fn_x2,
        "fp4_mx_block16": torch.float4_e2m1fn_x2,
    }
    if kv_cache_dtype not in table:
        raise ValueError(f"Unsupported kv_cache_dtype: {kv_cache_dtype}.")
    return table[kv_cache_dtype]


@dataclass
class ModelConfigStandIn:
    """The attributes of sglang's ``ModelConfig`` that its KV sizing and pool choice read."""

    hf_config: HFConfig
    head_dim: int = 0
    v_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_key_value_heads: int = 1
    context_len: int = 4096
    is_draft_model: bool = False
    quantization: str | None = None
    linear_attn_registry_result: Any = None
    has_attention_sinks: bool = False

    @property
    def hf_text_config(self) -> HFConfig:
        return self.hf_config

    @property
    def has_asymmetric_kv(self) -> bool:
        return self.head_dim != self.v_head_dim

    def get_num_kv_heads(self, tensor_parallel_size: int, dcp_size: int = 1) -> int:
        """KV heads per rank, as sglang's ModelConfig computes them (at least one)."""
        return max(1, self.num_key_value_heads // tensor_parallel_size)


def model_config_for(model: Any, *, is_draft: bool = False) -> ModelConfigStandIn:
    """sglang-``ModelConfig``-shaped view of a kvcheck model."""
    head_dim = int(getattr(model, "head_dim", 0) or 0)
    v_head_dim = getattr(model, "v_head_dim", None)
    return ModelConfigStandIn(
        hf_config=hf_config_for(model),
        head_dim=head_dim,
        v_head_dim=head_dim if v_head_dim is None else int(v_head_dim),
        kv_lora_rank=int(getattr(model, "kv_lora_rank", 0) or 0),
        qk_rope_head_dim=int(getattr(model, "qk_rope_head_dim", 0) or 0),
        num_key_value_heads=int(getattr(model, "num_key_value_heads", 1) or 1),
        is_draft_model=is_draft,
    )


@dataclass
class ConfiguratorStandIn:
    """The fields of sglang's ``KVCacheConfigurator`` its sizing and validation read.

    The real configurator is built by a model runner from a loaded model; kvcheck has
    no model, so the fields are filled from the kvcheck model and flags.
    """

    model_config: ModelConfigStandIn
    kv_cache_dtype: torch.dtype
    kv_cache_dtype_str: str | None
    is_draft_worker: bool
    use_mla_backend: bool
    layer_info: Any
    server_args: Any
    spec_algorithm: Any
    device: str = "cpu"
    page_size: int = 1
    pp_size: int = 1
    is_hybrid_swa: bool = False
    mambaish_config: Any = None
    spec_aux_config: Any = field(default_factory=lambda: SimpleNamespace(
        eagle_draft_num_layers=None, dflash_draft_num_layers=None, draft_model_config=None
    ))  # fmt: skip
    kv_shard_rank: int | None = None
    token_to_kv_pool_allocator: Any = None  # a draft shares none: no sharded target pool
    req_to_token_pool: Any = None

    def fused_entry_bytes(self, sub_pool_name: str) -> int | None:
        """No fused draft region: kvcheck sizes a plain target or draft pool."""
        return None


def configurator_for(
    model: Any,
    *,
    server_args: Any,
    kv_cache_dtype: torch.dtype,
    kv_cache_dtype_str: str | None,
    is_draft: bool,
    page_size: int = 1,
) -> ConfiguratorStandIn:
    """A ``KVCacheConfigurator`` stand-in for ``model`` serving every layer on one rank."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    layers = int(model.num_hidden_layers)
    return ConfiguratorStandIn(
        model_config=model_config_for(model, is_draft=is_draft),
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_dtype_str=kv_cache_dtype_str,
        is_draft_worker=is_draft,
        use_mla_backend=attention_family(model) in ("mla", "dsa"),
        layer_info=SimpleNamespace(
            start_layer=0,
            end_layer=layers,
            num_effective_layers=layers,
            swa_attention_layer_ids=None,
            full_attention_layer_ids=None,
            is_hybrid_swa_mtp_draft=False,
        ),
        server_args=server_args,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        page_size=page_size,
        is_hybrid_swa=getattr(model, "sliding_window", None) is not None,
        mambaish_config=(
            SimpleNamespace(full_attention_layer_ids=list(range(layers)))
            if getattr(model, "is_hybrid_linear", False)
            else None
        ),
    )
