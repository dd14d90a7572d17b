"""ServerArgs: default resolution, the --prefill-only-disable-kv-cache rules, and the CLI."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from kvcheck.serving import (
    PREFILL_ONLY_RULE_ORDER,
    PrefillOnlyFlagError,
    ServerArgs,
    default_attention_backend,
    default_chunked_prefill_size,
)
from kvcheck.serving.server_args import build_parser
from kvcheck.vocabulary import DEEPSEEK_V3_2, GLM_5_2_LIKE

FLAG = "--prefill-only-disable-kv-cache"
#: The smallest flag set the no-op pool accepts (Hopper, MHA model by default).
VALID: dict[str, Any] = {
    "is_embedding": True,
    "prefill_only_disable_kv_cache": True,
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
}


def test_valid_minimal_config_constructs_and_resolves() -> None:
    """The minimal valid flag set constructs; defaults resolve to fa3 and page size 1."""
    args = ServerArgs(**VALID)
    assert (args.attention_backend, args.page_size, args.attention_arch) == ("fa3", 1, "mha")
    assert args.chunked_prefill_size == -1


# --- each rule alone ------------------------------------------------------------------------

RULE_CASES = [
    # (rule, change to VALID, conflicting flag, fix)
    ("is_embedding", {"is_embedding": False}, "--is-embedding", "add --is-embedding"),
    (
        "fp4_kv_cache_dtype",
        {"kv_cache_dtype": "nvfp4"},
        "--kv-cache-dtype",
        "--kv-cache-dtype auto",
    ),
    ("fp4_kv_cache_dtype", {"kv_cache_dtype": "fp4_mx_block16"}, "--kv-cache-dtype", "auto"),
    ("mxfp8_kv_cache_dtype", {"kv_cache_dtype": "mxfp8"}, "--kv-cache-dtype", "auto"),
    (
        "chunked_prefill_size",
        {"chunked_prefill_size": None},
        "--chunked-prefill-size",
        "set --chunked-prefill-size -1",
    ),
    (
        "chunked_prefill_size",
        {"chunked_prefill_size": 8192},
        "--chunked-prefill-size",
        "set --chunked-prefill-size -1",
    ),
    (
        "disable_radix_cache",
        {"disable_radix_cache": False},
        "--disable-radix-cache",
        "add --disable-radix-cache",
    ),
    ("attn_cp_size", {"attn_cp_size": 2}, "--attn-cp-size", "set --attn-cp-size 1"),
    (
        "prefill_context_parallel",
        {"enable_prefill_context_parallel": True},
        "--enable-prefill-context-parallel",
        "drop --enable-prefill-context-parallel",
    ),
    ("hisparse", {"enable_hisparse": True}, "--enable-hisparse", "drop --enable-hisparse"),
    (
        "fa_prefill_backend",
        {"attention_backend": "triton"},
        "--attention-backend",
        "set --attention-backend fa3",
    ),
    (
        "fa_prefill_backend",
        {"prefill_attention_backend": "flashinfer"},
        "--prefill-attention-backend",
        "set --prefill-attention-backend fa3",
    ),
    ("fa_prefill_backend", {"device": "cpu"}, "--attention-backend", "fa3"),
    ("fa_prefill_backend", {"gpu_arch": "sm100"}, "--attention-backend", "fa4"),
    ("fa_prefill_backend", {"kv_cache_dtype": "fp8_e5m2"}, "--attention-backend", "fa3"),
    ("fa_prefill_backend", {"model_path": DEEPSEEK_V3_2.name}, "--attention-backend", "fa3"),
]


@pytest.mark.parametrize(
    ("rule", "change", "flag", "fix"),
    RULE_CASES,
    ids=[
        f"{rule}-{'-'.join(f'{k}={v}' for k, v in change.items())}"
        for rule, change, *_ in RULE_CASES
    ],
)
def test_each_rule_rejects_alone(rule: str, change: dict[str, Any], flag: str, fix: str) -> None:
    """One violated rule raises its own error naming the flag, the conflicting flag and the fix."""
    with pytest.raises(PrefillOnlyFlagError) as caught:
        ServerArgs(**{**VALID, **change})
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.rule == rule
    assert error.flag == flag
    message = str(error)
    assert message.startswith(FLAG)
    assert flag in message
    assert "Fix: " in message
    assert fix in error.fix and fix in message


def test_rules_cover_all_nine_ids_in_order() -> None:
    """PREFILL_ONLY_RULE_ORDER lists nine distinct rules, each exercised above."""
    assert len(PREFILL_ONLY_RULE_ORDER) == len(set(PREFILL_ONLY_RULE_ORDER)) == 9
    assert {case[0] for case in RULE_CASES} == set(PREFILL_ONLY_RULE_ORDER)


def test_several_violations_raise_in_rule_order() -> None:
    """With every rule violated, fixing them one by one reveals the rules in documented order."""
    flags: dict[str, Any] = {
        "prefill_only_disable_kv_cache": True,
        "kv_cache_dtype": "nvfp4",
        "attn_cp_size": 4,
        "enable_prefill_context_parallel": True,
        "enable_hisparse": True,
        "attention_backend": "flashinfer",
    }
    fixes: dict[str, dict[str, Any]] = {
        "is_embedding": {"is_embedding": True},
        "fp4_kv_cache_dtype": {"kv_cache_dtype": "mxfp8"},
        "mxfp8_kv_cache_dtype": {"kv_cache_dtype": "auto"},
        "chunked_prefill_size": {"chunked_prefill_size": -1},
        "disable_radix_cache": {"disable_radix_cache": True},
        "attn_cp_size": {"attn_cp_size": 1},
        "prefill_context_parallel": {"enable_prefill_context_parallel": False},
        "hisparse": {"enable_hisparse": False},
        "fa_prefill_backend": {"attention_backend": "fa4"},
    }
    seen = []
    for _ in PREFILL_ONLY_RULE_ORDER:
        with pytest.raises(PrefillOnlyFlagError) as caught:
            ServerArgs(**flags)
        seen.append(caught.value.rule)
        flags.update(fixes[caught.value.rule])
    assert tuple(seen) == PREFILL_ONLY_RULE_ORDER
    assert ServerArgs(**flags).attention_backend == "fa4"


def test_flag_off_accepts_any_combination() -> None:
    """Without the flag none of the rules apply."""
    args = ServerArgs(
        kv_cache_dtype="nvfp4", attn_cp_size=4, enable_hisparse=True, attention_backend="triton"
    )
    assert args.prefill_only_disable_kv_cache is False


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"attention_backend": "fa4"}, id="fa4"),
        pytest.param(
            {"attention_backend": "triton", "prefill_attention_backend": "fa3"}, id="fa3-prefill"
        ),
        pytest.param({"kv_cache_dtype": "fp8_e4m3"}, id="fp8-e4m3"),
        pytest.param({"model_path": "Qwen/Qwen3-Embedding-8B"}, id="qwen"),
    ],
)
def test_valid_variants_construct(change: dict[str, Any]) -> None:
    """Other accepted combinations: FA4, an FA prefill override, fp8_e4m3, a named MHA model."""
    args = ServerArgs(**{**VALID, **change})
    assert args.resolved_prefill_attention_backend in ("fa3", "fa4")


# --- unchecked / resolved / validate -------------------------------------------------------


def test_unchecked_keeps_raw_values_and_validate_raises_later() -> None:
    """unchecked() neither resolves nor validates; validate() then applies the rules."""
    raw = ServerArgs.unchecked(prefill_only_disable_kv_cache=True)
    assert raw.attention_backend is None and raw.chunked_prefill_size is None
    with pytest.raises(PrefillOnlyFlagError, match="--is-embedding"):
        raw.validate()


def test_resolved_returns_a_new_unvalidated_instance() -> None:
    """resolved() fills defaults in a copy, leaving the original raw, and does not validate."""
    raw = ServerArgs.unchecked(prefill_only_disable_kv_cache=True, gpu_memory_gb=80)
    resolved = raw.resolved()
    assert resolved is not raw and raw.page_size is None
    assert (resolved.attention_backend, resolved.chunked_prefill_size) == ("fa3", 8192)
    assert resolved.resolved() == resolved


def test_construction_equals_unchecked_then_resolved() -> None:
    """ServerArgs(**flags) holds the same values as unchecked(**flags).resolved()."""
    flags = {"device": "cuda", "gpu_arch": "sm100", "gpu_memory_gb": 192.0}
    assert ServerArgs(**flags) == ServerArgs.unchecked(**flags).resolved()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"attn_cp_size": 0}, "attn_cp_size=0", id="cp-0"),
        pytest.param({"page_size": 0}, "page_size=0", id="page-0"),
        pytest.param({"chunked_prefill_size": 0}, "chunked_prefill_size=0", id="chunk-0"),
        pytest.param({"kv_cache_dtype": "int4"}, "kv_cache_dtype='int4'", id="dtype"),
        pytest.param({"attention_backend": "magic"}, "attention_backend='magic'", id="backend"),
        pytest.param({"device": "tpu"}, "device='tpu'", id="device"),
        pytest.param({"is_embedding": "yes"}, "is_embedding='yes'", id="bool"),
        pytest.param({"gpu_memory_gb": -1.0}, "gpu_memory_gb=-1.0", id="memory"),
        pytest.param({"attention_arch": "gqa"}, "attention_arch='gqa'", id="arch"),
    ],
)
def test_bad_field_values_raise_even_unchecked(kwargs: dict[str, Any], message: str) -> None:
    """Field values are checked by both constructors, naming the field and value."""
    with pytest.raises(ValueError, match=re.escape(message)):
        ServerArgs(**kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        ServerArgs.unchecked(**kwargs)


# --- resolution -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "gpu_arch", "arch", "expected"),
    [
        ("cuda", "sm90", "mha", "fa3"),
        ("cuda", "sm100", "mha", "trtllm_mha"),
        ("cuda", "sm80", "mha", "flashinfer"),
        ("cuda", "sm120", "mha", "flashinfer"),
        ("cuda", "sm90", "mla", "fa3"),
        ("cuda", "sm100", "mla", "flashinfer"),
        ("cuda", "sm80", "mla", "triton"),
        ("cuda", "sm90", "dsa", "dsa"),
        ("cpu", "sm90", "mha", "intel_amx"),
        ("cpu", "sm100", "dsa", "intel_amx"),
    ],
)
def test_default_attention_backend_table(
    device: str, gpu_arch: str, arch: str, expected: str
) -> None:
    """The documented default backend for each device, GPU architecture and model family."""
    assert (
        default_attention_backend(device=device, gpu_arch=gpu_arch, attention_arch=arch) == expected
    )
    resolved = ServerArgs(device=device, gpu_arch=gpu_arch, attention_arch=arch)
    assert resolved.attention_backend == expected


@pytest.mark.parametrize(
    ("memory_gb", "expected"),
    [(None, 4096), (16, 2048), (24, 4096), (48, 4096), (80, 8192), (141, 8192), (192, 16384)],
)
def test_chunked_prefill_default_follows_gpu_memory(memory_gb: float | None, expected: int) -> None:
    """The chunked-prefill default steps with device memory; unknown memory gives 4096."""
    assert default_chunked_prefill_size(memory_gb) == expected
    assert ServerArgs(gpu_memory_gb=memory_gb).chunked_prefill_size == expected


@pytest.mark.parametrize(
    ("flags", "page_size"),
    [
        pytest.param({}, 1, id="default-1"),
        pytest.param({"page_size": 16}, 16, id="explicit-kept"),
        pytest.param({"attention_arch": "dsa", "page_size": 1}, 64, id="dsa-cuda-forced-64"),
        pytest.param({"attention_arch": "dsa", "device": "cpu"}, 1, id="dsa-cpu-default"),
        pytest.param({"gpu_arch": "sm100"}, 64, id="trtllm-mha-64"),
        pytest.param({"gpu_arch": "sm100", "page_size": 32}, 32, id="trtllm-mha-keeps-32"),
        pytest.param({"attention_backend": "flashmla", "page_size": 32}, 64, id="flashmla"),
        pytest.param({"gpu_arch": "sm100", "attention_backend": "fa4"}, 128, id="fa4-sm100"),
        pytest.param({"attention_backend": "fa4"}, 1, id="fa4-sm90"),
    ],
)
def test_page_size_resolution(flags: dict[str, Any], page_size: int) -> None:
    """page_size defaults to 1 and follows the model's and backends' constraints."""
    assert ServerArgs(**flags).page_size == page_size


def test_equal_prefill_and_decode_backends_replace_attention_backend() -> None:
    """Setting the same prefill and decode backend makes it the attention backend."""
    args = ServerArgs(
        attention_backend="triton", prefill_attention_backend="fa4", decode_attention_backend="fa4"
    )
    assert args.attention_backend == "fa4"


def test_fa3_with_fp8_e5m2_falls_back_to_triton() -> None:
    """FA3 reads only fp8_e4m3, so fp8_e5m2 moves the default backend to triton."""
    assert ServerArgs(kv_cache_dtype="fp8_e5m2").attention_backend == "triton"


def test_attention_arch_comes_from_a_named_model() -> None:
    """A model_path naming a kvcheck config supplies its architecture; for_model does too."""
    args = ServerArgs(model_path=GLM_5_2_LIKE.name)
    assert (args.attention_arch, args.attention_backend, args.page_size) == ("dsa", "dsa", 64)
    assert ServerArgs.for_model(DEEPSEEK_V3_2) == ServerArgs(model_path=DEEPSEEK_V3_2.name)


def test_resolution_is_deterministic() -> None:
    """The same flags always resolve to the same values (no hardware probing)."""
    assert ServerArgs(device="cuda") == ServerArgs(device="cuda")
    assert ServerArgs().resolved() == ServerArgs()


# --- CLI ------------------------------------------------------------------------------------


def test_from_cli_parses_flags_and_aliases() -> None:
    """from_cli reads every kind of flag, including SGLang's --enable-prefill-cp spelling."""
    args = ServerArgs.from_cli(
        [
            "--model",
            "m",
            "--chunked-prefill-size",
            "2048",
            "--enable-prefill-cp",
            "--page-size",
            "16",
        ]
    )
    assert args.model_path == "m"
    assert args.chunked_prefill_size == 2048
    assert args.enable_prefill_context_parallel is True
    assert args.page_size == 16


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param({}, id="defaults"),
        pytest.param(VALID, id="prefill-only"),
        pytest.param(
            {"device": "cpu", "gpu_memory_gb": 141.5, "kv_cache_dtype": "fp8_e4m3"}, id="cpu"
        ),
        pytest.param({"model_path": GLM_5_2_LIKE.name, "enable_hisparse": True}, id="glm"),
    ],
)
def test_cli_round_trip(flags: dict[str, Any]) -> None:
    """from_cli(args.to_cli()) rebuilds the same resolved arguments."""
    args = ServerArgs(**flags)
    assert ServerArgs.from_cli(args.to_cli()) == args
    assert ServerArgs.from_cli(ServerArgs.unchecked(**flags).to_cli()) == args


def test_from_cli_raises_on_a_rejected_combination() -> None:
    """A flag combination the rules reject raises PrefillOnlyFlagError from from_cli too."""
    with pytest.raises(PrefillOnlyFlagError, match="--is-embedding"):
        ServerArgs.from_cli([FLAG])


def test_help_lists_every_flag_with_help_text(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and lists a flag with its help text for every ServerArgs field."""
    with pytest.raises(SystemExit) as exited:
        ServerArgs.from_cli(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(ServerArgs):
        flag = "--" + field.name.replace("_", "-")
        assert flag in out, flag
        first_words = " ".join(field.metadata["help"].split()[:3])
        assert first_words in " ".join(out.split()), field.name


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(["--attn-cp-size", "0"], "--attn-cp-size", id="cp-0"),
        pytest.param(["--attn-cp-size", "two"], "--attn-cp-size", id="cp-text"),
        pytest.param(["--kv-cache-dtype", "int4"], "--kv-cache-dtype", id="dtype"),
        pytest.param(["--page-size", "-4"], "--page-size", id="page"),
        pytest.param(["--chunked-prefill-size", "0"], "--chunked-prefill-size", id="chunk"),
        pytest.param(["--attention-backend", "magic"], "--attention-backend", id="backend"),
        pytest.param(["--gpu-memory-gb", "0"], "--gpu-memory-gb", id="memory"),
        pytest.param(["--no-such-flag"], "unrecognized arguments", id="unknown"),
    ],
)
def test_bad_cli_values_get_argparse_errors(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad values exit with status 2 and an argparse error naming the flag."""
    with pytest.raises(SystemExit) as exited:
        ServerArgs.from_cli(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and flag in err


def test_parser_defaults_are_left_to_the_dataclass() -> None:
    """An empty command line parses to no values, so the dataclass defaults apply."""
    assert vars(build_parser().parse_args([])) == {}


@pytest.mark.parametrize(
    ("change", "origin"),
    [
        pytest.param({"device": "cpu"}, "'intel_amx' (the default for --device cpu)", id="cpu"),
        pytest.param({"attention_backend": "triton"}, "(from --attention-backend)", id="flag"),
        pytest.param({"chunked_prefill_size": None}, "it is 4096 by default", id="chunk"),
    ],
)
def test_messages_tell_a_default_from_a_flag(change: dict[str, Any], origin: str) -> None:
    """A rejected value says whether it came from a flag or from default resolution."""
    with pytest.raises(PrefillOnlyFlagError) as caught:
        ServerArgs(**{**VALID, **change})
    assert origin in str(caught.value)
