"""Server arguments: CLI flags, SGLang's defaults, and the --prefill-only-disable-kv-cache rules.

:class:`ServerArgs` keeps SGLang 0.5.23's field and flag names for the flags that decide
which KV pool is built. Like SGLang's, construction resolves defaults and validates:
``ServerArgs(**flags)`` raises :class:`PrefillOnlyFlagError` (a ``ValueError``) on a
rejected combination. :meth:`ServerArgs.unchecked` builds one without resolving or
validating (field values are still type- and range-checked), for tests and for code that
wants to call :meth:`~ServerArgs.resolved` and :meth:`~ServerArgs.validate` itself.

Resolution
----------
SGLang fills defaults from the hardware it finds (GPU memory, compute capability) and from
the checkpoint's config.json. kvcheck never probes hardware: the machine is described by
explicit fields, so the same flags resolve the same way on any machine, CPU-only included.

* ``device`` ("cuda" or "cpu"), ``gpu_arch`` ("sm80" Ampere, "sm90" Hopper, "sm100"
  Blackwell B200, "sm120"; default "sm90", an H100/H200; only read for ``device="cuda"``),
  ``gpu_memory_gb`` (device memory in GiB; default None: unknown) and ``attention_arch``
  (the served model's "mha"/"mla"/"dsa"; default None: from :data:`MODELS` when
  ``model_path`` names a known config, else "mha").

Steps, in SGLang's order ("(None)" marks a step that only fills an unset value; the
others override, as SGLang's do):

1. ``attention_arch`` as above.
2. ``chunked_prefill_size`` (None) from ``gpu_memory_gb``: < 20 -> 2048, < 60 -> 4096,
   < 160 -> 8192, else 16384; unknown memory -> 4096 (SGLang's fallback). ``-1`` disables
   chunking and is kept.
3. ``device="cpu"``: ``attention_backend`` (None) -> "intel_amx" (SGLang on an x86 host;
   arm64 hosts, which get "torch_native", are not modeled).
4. DSA model on CUDA: ``attention_backend`` (None) -> "dsa", and ``page_size`` -> 64
   whatever was asked (SGLang's DeepSeek-DSA override forces it).
5. ``prefill_attention_backend == decode_attention_backend`` (both set) replaces
   ``attention_backend``.
6. ``attention_backend`` (None) from :func:`default_attention_backend`: on CUDA an MHA
   model gets "fa3" on sm90, "trtllm_mha" on sm100, "flashinfer" otherwise; an MLA model
   "fa3" on sm90, "flashinfer" on sm100, "triton" otherwise (no speculative decoding is
   modeled).
7. Page-size constraints of the chosen backends: trtllm_mha needs 16/32/64/128,
   trtllm_mla and cutedsl_mla 32/64, flashmla 64; anything else (None included) -> 64.
8. ``attention_backend="fa3"`` with ``kv_cache_dtype="fp8_e5m2"`` -> "triton" (FA3 only
   reads fp8_e4m3).
9. fa4 for an MHA model on sm100 -> ``page_size`` 128.
10. ``page_size`` (None) -> 1.

--prefill-only-disable-kv-cache rules
-------------------------------------
When the flag is on, the rules below run in this order on the resolved values and the first
one violated raises; :data:`PREFILL_ONLY_RULE_ORDER` lists their ids in the same order, and
the error's ``.rule`` is the id. Each message names --prefill-only-disable-kv-cache, the
conflicting flag and the fix.

1. ``is_embedding``: requires --is-embedding.
2. ``fp4_kv_cache_dtype``: rejects --kv-cache-dtype nvfp4 / fp4_mx_block16.
3. ``mxfp8_kv_cache_dtype``: rejects --kv-cache-dtype mxfp8.
4. ``chunked_prefill_size``: requires --chunked-prefill-size -1 (the resolved value, so an
   unset flag, which resolves to a chunk size, is rejected).
5. ``disable_radix_cache``: requires --disable-radix-cache.
6. ``attn_cp_size``: rejects --attn-cp-size > 1.
7. ``prefill_context_parallel``: rejects --enable-prefill-context-parallel.
8. ``hisparse``: rejects --enable-hisparse.
9. ``fa_prefill_backend``: requires the resolved prefill backend
   (``prefill_attention_backend``, else ``attention_backend``) to be fa3 or fa4.

Not modeled: SGLang's automatic embedding-mode settings for a few architectures
(EmbeddingGemma), speculative decoding, and checks unrelated to the KV pool.

Example:
    >>> args = ServerArgs(is_embedding=True, prefill_only_disable_kv_cache=True,
    ...                   chunked_prefill_size=-1, disable_radix_cache=True)
    >>> args.attention_backend, args.page_size
    ('fa3', 1)
    >>> try:
    ...     ServerArgs(prefill_only_disable_kv_cache=True, is_embedding=True)
    ... except PrefillOnlyFlagError as error:
    ...     print(error.rule, error.flag, error.fix, sep=" | ")
    chunked_prefill_size | --chunked-prefill-size | set --chunked-prefill-size -1
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvcheck.vocabulary.flags import (
    ATTENTION_BACKEND_CHOICES,
    DEVICE_CHOICES,
    FA_PREFILL_BACKENDS,
    FP4_KV_CACHE_DTYPES,
    GPU_ARCH_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
)
from kvcheck.vocabulary.models import ATTENTION_ARCHS, MODELS, ModelConfig

PREFILL_ONLY_RULE_ORDER: tuple[str, ...] = (
    "is_embedding",
    "fp4_kv_cache_dtype",
    "mxfp8_kv_cache_dtype",
    "chunked_prefill_size",
    "disable_radix_cache",
    "attn_cp_size",
    "prefill_context_parallel",
    "hisparse",
    "fa_prefill_backend",
)

_FLAG = "--prefill-only-disable-kv-cache"


class PrefillOnlyFlagError(ValueError):
    """A combination that --prefill-only-disable-kv-cache rejects.

    ``rule`` is the id from :data:`PREFILL_ONLY_RULE_ORDER`, ``flag`` the conflicting CLI
    flag, ``fix`` what to change.
    """

    def __init__(self, rule: str, flag: str, reason: str, fix: str) -> None:
        self.rule = rule
        self.flag = flag
        self.fix = fix
        super().__init__(f"{reason} Fix: {fix}.")


# --- field value checks (shared by argparse and __post_init__) ----------------------------


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")


def _chunk_size(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise ValueError(f"{name}={value!r} must be -1 (no chunking) or an int >= 1")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a number > 0")


def _non_empty_str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}={value!r} must be a non-empty string")


def _arg(
    default: Any,
    help: str,
    *,
    check: Callable[[str, Any], None] | None = None,
    parse: Callable[[str], Any] = str,
    choices: tuple[str, ...] | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field that is also a CLI flag (``--field-name``, plus ``aliases``)."""
    return field(
        default=default,
        metadata={"help": help, "check": check, "parse": parse, "choices": choices,
                  "aliases": aliases},
    )  # fmt: skip


@dataclass
class ServerArgs:
    """The server flags that decide the KV pool, resolved and validated as SGLang does.

    See the module docstring for how defaults resolve and the rule order. Fields after
    ``device`` are kvcheck's explicit description of the machine and model, which SGLang
    reads from the hardware and the checkpoint.

    Example:
        >>> ServerArgs(device="cuda", gpu_arch="sm100").attention_backend
        'trtllm_mha'
        >>> ServerArgs.unchecked(prefill_only_disable_kv_cache=True).attention_backend is None
        True
    """

    model_path: str = _arg(
        "dummy",
        "Model path or id; a name in kvcheck.serving.MODELS also sets --attention-arch.",
        check=_non_empty_str,
        aliases=("--model",),
    )
    is_embedding: bool = _arg(False, "Serve the model as an embedding model.")
    prefill_only_disable_kv_cache: bool = _arg(
        False,
        "Skip the physical KV cache for embedding prefill (no-op KV pool). Requires "
        "--is-embedding, --chunked-prefill-size -1, --disable-radix-cache and an fa3/fa4 "
        "prefill backend; rejects FP4/MXFP8 KV dtypes, --attn-cp-size > 1, "
        "--enable-prefill-context-parallel and --enable-hisparse.",
    )
    chunked_prefill_size: int | None = _arg(
        None,
        "Tokens per prefill chunk; -1 disables chunking. Default: from --gpu-memory-gb.",
        check=_chunk_size,
        parse=int,
    )
    disable_radix_cache: bool = _arg(False, "Disable the radix (prefix) cache.")
    kv_cache_dtype: str = _arg(
        "auto",
        "KV-cache storage dtype; 'auto' uses the model dtype.",
        choices=KV_CACHE_DTYPE_CHOICES,
    )
    attn_cp_size: int = _arg(
        1,
        "Attention context-parallel size.",
        check=_positive_int,
        parse=int,
        aliases=("--attention-context-parallel-size",),
    )
    enable_prefill_context_parallel: bool = _arg(
        False,
        "Enable context parallelism for prefill (SGLang 0.5.23 spells it --enable-prefill-cp).",
        aliases=("--enable-prefill-cp",),
    )
    enable_hisparse: bool = _arg(False, "Enable HiSparse (host-offloaded sparse attention).")
    attention_backend: str | None = _arg(
        None,
        "Attention backend for prefill and decode. Default: from the device, --gpu-arch "
        "and --attention-arch.",
        choices=ATTENTION_BACKEND_CHOICES,
    )
    prefill_attention_backend: str | None = _arg(
        None, "Prefill attention backend (overrides --attention-backend for prefill).",
        choices=ATTENTION_BACKEND_CHOICES,
    )  # fmt: skip
    decode_attention_backend: str | None = _arg(
        None, "Decode attention backend (overrides --attention-backend for decode).",
        choices=ATTENTION_BACKEND_CHOICES,
    )  # fmt: skip
    page_size: int | None = _arg(
        None,
        "Tokens per KV page. Default: 1, or what the model and backend require.",
        check=_positive_int,
        parse=int,
    )
    device: str = _arg("cuda", "Device the server runs on.", choices=DEVICE_CHOICES)
    # kvcheck's explicit machine and model description (SGLang detects these).
    gpu_arch: str = _arg(
        "sm90",
        "kvcheck: the GPU's compute capability, used for --device cuda defaults "
        "(sm90 = Hopper H100/H200).",
        choices=GPU_ARCH_CHOICES,
    )
    gpu_memory_gb: float | None = _arg(
        None,
        "kvcheck: device memory in GiB, used for the --chunked-prefill-size default "
        "(default: unknown, which resolves as SGLang does without a reading).",
        check=_positive_float,
        parse=float,
    )
    attention_arch: str | None = _arg(
        None,
        "kvcheck: the served model's attention architecture (default: from --model-path "
        "when it names a kvcheck config, else mha).",
        choices=ATTENTION_ARCHS,
    )

    def __post_init__(self) -> None:
        _check_field_values(self)
        if _BUILDING_UNCHECKED.get():
            return
        # Validate before resolving in place, so errors can tell a flag from a default.
        self.validate()
        for name, value in _resolution(self).items():
            setattr(self, name, value)

    # --- constructors -------------------------------------------------------------------

    @classmethod
    def unchecked(cls, **flags: Any) -> ServerArgs:
        """Build from field values without resolving defaults or applying the flag rules.

        Field values are still checked (types, ranges, choices).

        Example:
            >>> raw = ServerArgs.unchecked(prefill_only_disable_kv_cache=True)
            >>> raw.chunked_prefill_size is None
            True
        """
        with _unchecked_construction():
            return cls(**flags)

    @classmethod
    def for_model(cls, model: ModelConfig, **flags: Any) -> ServerArgs:
        """Server arguments for serving ``model``: its name and attention architecture.

        Example:
            >>> from kvcheck.vocabulary import DEEPSEEK_V3_2
            >>> ServerArgs.for_model(DEEPSEEK_V3_2).attention_backend
            'dsa'
        """
        flags.setdefault("model_path", model.name)
        flags.setdefault("attention_arch", model.attention_arch)
        return cls(**flags)

    @classmethod
    def from_cli(cls, argv: Sequence[str] | None = None) -> ServerArgs:
        """Parse command-line flags (``sys.argv[1:]`` when ``argv`` is None), then resolve.

        Bad values exit with argparse's usage error (status 2); a rejected flag
        combination raises :class:`PrefillOnlyFlagError`, as construction does.

        Example:
            >>> ServerArgs.from_cli(["--device", "cpu"]).attention_backend
            'intel_amx'
        """
        namespace = build_parser().parse_args(argv)
        return cls(**vars(namespace))

    # --- views ----------------------------------------------------------------------------

    def resolved(self) -> ServerArgs:
        """A new instance with every default filled in as SGLang fills it (not validated).

        Example:
            >>> ServerArgs.unchecked(gpu_memory_gb=141).resolved().chunked_prefill_size
            8192
        """
        values = {**_field_values(self), **_resolution(self)}
        return type(self).unchecked(**values)

    @property
    def resolved_prefill_attention_backend(self) -> str | None:
        """The prefill backend: ``prefill_attention_backend``, else ``attention_backend``."""
        return self.prefill_attention_backend or self.attention_backend

    def to_cli(self) -> list[str]:
        """The flags that reproduce this instance's values (defaults omitted).

        ``ServerArgs.from_cli(args.to_cli())`` equals ``args.resolved()`` for valid flags.

        Example:
            >>> ServerArgs.unchecked(is_embedding=True, page_size=64).to_cli()
            ['--is-embedding', '--page-size', '64']
        """
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = _flag_name(f.name)
            if isinstance(f.default, bool):
                argv.append(flag)
            else:
                argv += [flag, str(value)]
        return argv

    # --- validation -----------------------------------------------------------------------

    def validate(self) -> None:
        """Apply the --prefill-only-disable-kv-cache rules to the resolved values, in order.

        Raises :class:`PrefillOnlyFlagError` for the first rule violated; does nothing when
        the flag is off.

        Example:
            >>> raw = ServerArgs.unchecked(prefill_only_disable_kv_cache=True)
            >>> try:
            ...     raw.validate()
            ... except PrefillOnlyFlagError as error:
            ...     print(error.rule)
            is_embedding
        """
        if not self.prefill_only_disable_kv_cache:
            return
        resolved = self.resolved()
        for rule in _PREFILL_ONLY_RULES:
            error = rule(self, resolved)
            if error is not None:
                raise error


def default_attention_backend(*, device: str, gpu_arch: str, attention_arch: str) -> str:
    """SGLang's default attention backend for a device and model (steps 3, 4 and 6 above).

    Example:
        >>> default_attention_backend(device="cuda", gpu_arch="sm90", attention_arch="mha")
        'fa3'
    """
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device={device!r} not in {DEVICE_CHOICES}")
    if gpu_arch not in GPU_ARCH_CHOICES:
        raise ValueError(f"gpu_arch={gpu_arch!r} not in {GPU_ARCH_CHOICES}")
    if attention_arch not in ATTENTION_ARCHS:
        raise ValueError(f"attention_arch={attention_arch!r} not in {ATTENTION_ARCHS}")
    if device == "cpu":
        return "intel_amx"
    if attention_arch == "dsa":
        return "dsa"
    if gpu_arch == "sm90":
        return "fa3"
    if attention_arch == "mha":
        return "trtllm_mha" if gpu_arch == "sm100" else "flashinfer"
    return "flashinfer" if gpu_arch == "sm100" else "triton"


def default_chunked_prefill_size(gpu_memory_gb: float | None) -> int:
    """SGLang's chunked-prefill default for a device with ``gpu_memory_gb`` GiB (step 2).

    Example:
        >>> default_chunked_prefill_size(80), default_chunked_prefill_size(None)
        (8192, 4096)
    """
    if gpu_memory_gb is None:
        return 4096
    _positive_float("gpu_memory_gb", gpu_memory_gb)
    for below_gb, chunk in ((20, 2048), (60, 4096), (160, 8192)):
        if gpu_memory_gb < below_gb:
            return chunk
    return 16384


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser behind :meth:`ServerArgs.from_cli`: one flag per field.

    Example:
        >>> "--prefill-only-disable-kv-cache" in build_parser().format_help()
        True
    """
    parser = argparse.ArgumentParser(
        prog="kvcheck-server-args",
        description="SGLang server flags that decide the KV pool, resolved as SGLang does.",
        argument_default=argparse.SUPPRESS,
    )
    for f in dataclasses.fields(ServerArgs):
        meta = f.metadata
        names = [_flag_name(f.name), *meta["aliases"]]
        if isinstance(f.default, bool):
            parser.add_argument(*names, dest=f.name, action="store_true", help=meta["help"])
            continue
        # None defaults are resolved; their help text says from what.
        help_text = meta["help"] if f.default is None else f"{meta['help']} (default: {f.default})"
        parser.add_argument(
            *names,
            dest=f.name,
            type=_argparse_type(f.name, meta["parse"], meta["check"]),
            choices=meta["choices"],
            help=help_text,
        )
    return parser


# --- resolution ---------------------------------------------------------------------------


def _resolution(args: ServerArgs) -> dict[str, Any]:
    """The resolved values of ``args``' fields (see the module docstring, steps 1-10)."""
    arch = args.attention_arch
    if arch is None:
        known = MODELS.get(args.model_path)
        arch = known.attention_arch if known is not None else "mha"
    chunk = args.chunked_prefill_size
    if chunk is None:
        chunk = default_chunked_prefill_size(args.gpu_memory_gb)
    backend = args.attention_backend
    page_size = args.page_size
    on_cuda = args.device == "cuda"

    if args.device == "cpu" and backend is None:
        backend = "intel_amx"
    if arch == "dsa" and on_cuda:
        backend = backend or "dsa"
        page_size = 64
    prefill, decode = args.prefill_attention_backend, args.decode_attention_backend
    if prefill is not None and prefill == decode:
        backend = prefill
    if backend is None:
        backend = default_attention_backend(
            device=args.device, gpu_arch=args.gpu_arch, attention_arch=arch
        )
    backends = {backend, prefill, decode}
    for constrained, allowed in _BACKEND_PAGE_SIZES.items():
        if constrained in backends and page_size not in allowed:
            page_size = 64
    if backend == "fa3" and args.kv_cache_dtype == "fp8_e5m2":
        backend = "triton"
    if "fa4" in backends and arch == "mha" and on_cuda and args.gpu_arch == "sm100":
        page_size = 128
    if page_size is None:
        page_size = 1
    return {
        "attention_arch": arch,
        "chunked_prefill_size": chunk,
        "attention_backend": backend,
        "page_size": page_size,
    }


#: Backends that only run with some page sizes; others are replaced by 64 (step 7).
_BACKEND_PAGE_SIZES: dict[str, tuple[int, ...]] = {
    "flashmla": (64,),
    "trtllm_mla": (32, 64),
    "cutedsl_mla": (32, 64),
    "trtllm_mha": (16, 32, 64, 128),
}


# --- the --prefill-only-disable-kv-cache rules, in PREFILL_ONLY_RULE_ORDER ------------------

_Rule = Callable[[ServerArgs, ServerArgs], "PrefillOnlyFlagError | None"]


def _rule_is_embedding(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.is_embedding:
        return None
    return PrefillOnlyFlagError(
        "is_embedding",
        "--is-embedding",
        f"{_FLAG} requires --is-embedding: only embedding prefill runs without reading or "
        "writing the paged KV cache.",
        f"add --is-embedding, or drop {_FLAG}",
    )


def _rule_fp4(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.kv_cache_dtype not in FP4_KV_CACHE_DTYPES:
        return None
    return PrefillOnlyFlagError(
        "fp4_kv_cache_dtype",
        "--kv-cache-dtype",
        f"{_FLAG} does not support --kv-cache-dtype {res.kv_cache_dtype}: FP4 KV caches are "
        "allocated by a separate pool with scale buffers, not the no-op MHA pool.",
        "set --kv-cache-dtype auto (or bf16 / fp8_e4m3)",
    )


def _rule_mxfp8(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.kv_cache_dtype != "mxfp8":
        return None
    return PrefillOnlyFlagError(
        "mxfp8_kv_cache_dtype",
        "--kv-cache-dtype",
        f"{_FLAG} does not support --kv-cache-dtype mxfp8: the MXFP8 pool keeps separate "
        "scale-factor buffers.",
        "set --kv-cache-dtype auto (or bf16 / fp8_e4m3)",
    )


def _rule_chunked_prefill(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.chunked_prefill_size == -1:
        return None
    origin = "" if raw.chunked_prefill_size is not None else " by default"
    return PrefillOnlyFlagError(
        "chunked_prefill_size",
        "--chunked-prefill-size",
        f"{_FLAG} requires --chunked-prefill-size -1, but it is "
        f"{res.chunked_prefill_size}{origin}: a chunked prefill reuses K/V from the pool "
        "between chunks.",
        "set --chunked-prefill-size -1",
    )


def _rule_radix_cache(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.disable_radix_cache:
        return None
    return PrefillOnlyFlagError(
        "disable_radix_cache",
        "--disable-radix-cache",
        f"{_FLAG} requires --disable-radix-cache: the radix cache would index pool slots "
        "that hold no data.",
        "add --disable-radix-cache",
    )


def _rule_attn_cp(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if res.attn_cp_size <= 1:
        return None
    return PrefillOnlyFlagError(
        "attn_cp_size",
        "--attn-cp-size",
        f"{_FLAG} is incompatible with --attn-cp-size {res.attn_cp_size}: context-parallel "
        "attention writes K/V to the pool, which the no-op pool refuses.",
        "set --attn-cp-size 1",
    )


def _rule_prefill_cp(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if not res.enable_prefill_context_parallel:
        return None
    return PrefillOnlyFlagError(
        "prefill_context_parallel",
        "--enable-prefill-context-parallel",
        f"{_FLAG} is incompatible with --enable-prefill-context-parallel: prefill context "
        "parallelism stages K/V through the paged cache.",
        "drop --enable-prefill-context-parallel",
    )


def _rule_hisparse(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    if not res.enable_hisparse:
        return None
    return PrefillOnlyFlagError(
        "hisparse",
        "--enable-hisparse",
        f"{_FLAG} is incompatible with --enable-hisparse: HiSparse needs its own pool "
        "family, not the no-op MHA pool.",
        "drop --enable-hisparse",
    )


def _rule_fa_prefill(raw: ServerArgs, res: ServerArgs) -> PrefillOnlyFlagError | None:
    backend = res.resolved_prefill_attention_backend
    if backend in FA_PREFILL_BACKENDS:
        return None
    if raw.prefill_attention_backend is not None:
        flag, origin = "--prefill-attention-backend", "from --prefill-attention-backend"
    elif raw.attention_backend is not None:
        flag, origin = "--attention-backend", "from --attention-backend"
    else:
        flag = "--attention-backend"
        origin = f"the default for --device {res.device}"
        if res.device == "cuda":
            origin += f" --gpu-arch {res.gpu_arch} --attention-arch {res.attention_arch}"
    return PrefillOnlyFlagError(
        "fa_prefill_backend",
        flag,
        f"{_FLAG} requires an FA prefill backend (fa3 or fa4), but the prefill backend is "
        f"{backend!r} ({origin}): only FlashAttention's raw-K/V prefill skips the paged "
        "KV cache.",
        f"set {flag} fa3 (Hopper) or fa4 (Blackwell)",
    )


_PREFILL_ONLY_RULES: tuple[_Rule, ...] = (
    _rule_is_embedding,
    _rule_fp4,
    _rule_mxfp8,
    _rule_chunked_prefill,
    _rule_radix_cache,
    _rule_attn_cp,
    _rule_prefill_cp,
    _rule_hisparse,
    _rule_fa_prefill,
)


# --- helpers ------------------------------------------------------------------------------

_BUILDING_UNCHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kvcheck_server_args_unchecked", default=False
)


@contextmanager
def _unchecked_construction() -> Iterator[None]:
    token = _BUILDING_UNCHECKED.set(True)
    try:
        yield
    finally:
        _BUILDING_UNCHECKED.reset(token)


def _flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _field_values(args: ServerArgs) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


def _check_field_values(args: ServerArgs) -> None:
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        meta = f.metadata
        if isinstance(f.default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r} must be a bool")
            continue
        if value is None and f.default is None:
            continue
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ValueError(f"{f.name}={value!r} not in {meta['choices']}")
        if meta["check"] is not None:
            meta["check"](f.name, value)


def _argparse_type(
    name: str, parse: Callable[[str], Any], check: Callable[[str, Any], None] | None
) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = parse(text)
            if check is not None:
                check(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        return value

    convert.__name__ = parse.__name__
    return convert
