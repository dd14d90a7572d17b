"""Which sglang release is installed, and what the target can do with it.

The ``sglang`` target follows the installed release instead of assuming one. Three things
say what a release offers, in this order:

1. **Capabilities, per piece** (:data:`NEEDS`). Each row names one piece of sglang (a
   module, the names it must define) and the target capabilities that need it. :func:`load`
   imports every module on its own: a piece the installed release lacks turns off only the
   capabilities of its row, each with a reason naming the release and the piece ("sglang
   0.5.22 has no DSA index-K kernel module ..."). A module that exists but fails to import
   (a broken dependency) is a setup error and raises.
2. **Layouts, by inspection** (:func:`probe`, once the modules are loaded): the pool
   constructors' parameters, the DSA layouts the constructor's asserts accept (built on CPU),
   whether it pools index keys, its default index-K buffer under decode context parallel,
   whether MHA pads fused K/V halves to whole pages, which serving context entry points
   and CPU kernel bodies exist. :meth:`ReleaseFacts.surface` narrows the target's declared
   surface to what the release builds, with a note saying why.
3. **What only running it can tell** (whether a release has a bug): the release range
   beside each finding and expected failure in :mod:`.findings`.

To add a capability that needs a new sglang class (a quantized or host pool, an
allocator), add a :class:`Need` row naming its module, the names it uses and the
capabilities (or ``family`` pool capability) it serves; :attr:`SGLangTarget.unsupported
<kvcheck.targets.sglang.target.SGLangTarget.unsupported>` then switches them off on a
release without it. If the class also takes constructor parameters that an older release
lacks, add them to :data:`OPTIONAL_PARAMETERS` with the surface they narrow.

Nothing here imports sglang at module import time.

The releases kvcheck is checked against are listed once, in ``releases.txt`` beside this
module (:data:`KNOWN_RELEASES` reads it; so does ``scripts/install_sglang.sh``).

Example:
    >>> Releases(last="0.5.22").describe(), "0.5.21" in Releases(last="0.5.22")
    ('0.5.21-0.5.22', True)
    >>> describe_release("0.5.22")
    'a release kvcheck is checked against (0.5.21, 0.5.22, ...)'
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from itertools import pairwise
from types import MappingProxyType, SimpleNamespace
from typing import Any

from packaging.version import InvalidVersion, Version

from kvcheck.surface import Surface

__all__ = [
    "KNOWN_RELEASES",
    "NEEDS",
    "OPTIONAL_PARAMETERS",
    "Need",
    "ReleaseFacts",
    "Releases",
    "describe_release",
    "installed_release",
    "load",
    "probe",
]


def release_key(release: str) -> Version:
    """``release`` as a comparable version (``ValueError`` if it is not one).

    Example:
        >>> release_key("0.5.9") < release_key("0.5.23") < release_key("0.5.23.post1")
        True
    """
    try:
        return Version(release)
    except InvalidVersion:
        raise ValueError(f"release={release!r} is not a version number") from None


#: The file that lists the releases kvcheck is checked against (package data).
RELEASES_FILE = "releases.txt"


def read_releases(text: str) -> tuple[str, ...]:
    """The releases a ``releases.txt`` text lists: one a line, ``#`` starting a comment,
    blank lines skipped; ``ValueError`` unless each is a version and they run oldest first.

    ``scripts/install_sglang.sh`` reads the same file with the same rules.

    Example:
        >>> read_releases("# oldest first\\n0.5.21\\n\\n0.5.22  # the newest\\n")
        ('0.5.21', '0.5.22')
    """
    releases = tuple(
        stripped for line in text.splitlines() if (stripped := line.split("#", 1)[0].strip())
    )
    if not releases:
        raise ValueError(f"{RELEASES_FILE} lists no release")
    keys = [release_key(release) for release in releases]
    if any(older >= newer for older, newer in pairwise(keys)):
        raise ValueError(f"{RELEASES_FILE} must list releases oldest first, once each: {releases}")
    return releases


#: The sglang releases kvcheck's target is checked against, oldest first, as
#: ``releases.txt`` lists them (CI installs each with
#: ``KVCHECK_SGLANG_VERSION=<release> bash scripts/install_sglang.sh``).
KNOWN_RELEASES: tuple[str, ...] = read_releases(
    files("kvcheck.targets.sglang").joinpath(RELEASES_FILE).read_text(encoding="utf-8")
)

INSTALL_HINT = (
    "install it with `bash scripts/install_sglang.sh` (sglang "
    f"{KNOWN_RELEASES[-1]} by default; KVCHECK_SGLANG_VERSION picks another of "
    f"{', '.join(KNOWN_RELEASES)})"
)


@dataclass(frozen=True)
class Releases:
    """The sglang releases something holds for: ``first`` to ``last``, both included;
    ``None`` leaves that end open (``first=None``: since before the oldest checked release).

    Example:
        >>> Releases().describe(), Releases(first="0.5.23").describe()
        ('0.5.21-', '0.5.23-')
        >>> "0.5.30" in Releases(first="0.5.23"), "0.5.22" in Releases(first="0.5.23")
        (True, False)
    """

    first: str | None = None
    last: str | None = None

    def __post_init__(self) -> None:
        for end in (self.first, self.last):
            if end is not None:
                release_key(end)
        if self.first and self.last and release_key(self.first) > release_key(self.last):
            raise ValueError(f"Releases(first={self.first!r}, last={self.last!r}) is empty")

    def __contains__(self, release: object) -> bool:
        if not isinstance(release, str):
            return False
        key = release_key(release)
        if self.first is not None and key < release_key(self.first):
            return False
        return self.last is None or key <= release_key(self.last)

    def describe(self) -> str:
        """``first-last`` (``first-`` when open-ended; an open start reads as the oldest
        checked release, the first one kvcheck can vouch for)."""
        first = self.first or KNOWN_RELEASES[0]
        if self.last is None:
            return f"{first}-"
        return first if first == self.last else f"{first}-{self.last}"


def installed_release() -> str:
    """The installed sglang's version, from its distribution metadata (no import).

    Raises ``ModuleNotFoundError`` saying how to install it when it is absent.
    """
    try:
        return version("sglang")
    except PackageNotFoundError:
        raise ModuleNotFoundError(f"sglang is not installed; {INSTALL_HINT}") from None


def describe_release(release: str) -> str:
    """A short note on ``release``: whether kvcheck is checked against it, and if not, what
    the target does with it (printed after the target's name and version).

    Example:
        >>> describe_release("0.5.99")  # doctest: +NORMALIZE_WHITESPACE
        'newer than every release kvcheck is checked against (0.5.21, ...): the target
        follows what it reads from it and expects the findings of ...'
    """
    known = ", ".join(KNOWN_RELEASES)
    if release in KNOWN_RELEASES:
        return f"a release kvcheck is checked against ({known})"
    try:
        key = release_key(release)
    except ValueError:
        return f"not a version kvcheck can place among the ones it is checked against ({known})"
    if key > release_key(KNOWN_RELEASES[-1]):
        return (
            f"newer than every release kvcheck is checked against ({known}): the target "
            f"follows what it reads from it and expects the findings of {KNOWN_RELEASES[-1]}"
        )
    where = "older than" if key < release_key(KNOWN_RELEASES[0]) else "not one of"
    return (
        f"{where} the releases kvcheck is checked against ({known}): the target follows "
        "what it reads from it"
    )


# --- 1. capabilities, per piece ---------------------------------------------------------------

_POOL = "sglang.srt.mem_cache.memory_pool"
_POOL_CAPABILITIES = ("mha_pool", "noop_pool", "mla_pool", "dsa_pool")
#: The MHA ``kv_quant`` values a release builds without sglang's quant methods (the plain
#: pool: unquantized, or fp8 with per-tensor scales).
_WITHOUT_QUANT_METHODS = ("none", "fp8_scaled")
#: The MHA ``kv_quant`` values a release builds without the MXFP8 pool or its kernels.
_WITHOUT_MXFP8 = ("none", "fp8_scaled", "cpu_fp8", "fp4_mx_block16")
_CONTEXT = ("create_context", "use_context")
#: 0.5.21's only way to publish server arguments: the process-wide context, saved and put back.
_PROCESS_CONTEXT = ("publish", "snapshot_context", "restore_context")


@dataclass(frozen=True)
class Need:
    """One piece of sglang some capabilities need.

    The piece is the module ``module`` (else the first of ``or_modules`` the release has:
    where sglang moved a module whose code stays), or, with ``found_in=(need, name)``, the
    module that need's module imported ``name`` from or as (sglang moves kernels between
    modules from release to release; the pool module's own import finds them). It must
    define every
    name of ``names``, or else every name of ``or_names`` (a release that offers the same
    through other entry points). Without it, ``capabilities`` are unsupported and
    ``narrows`` (``"family.field" -> values``) limits the surface.
    """

    name: str
    what: str
    module: str = ""
    or_modules: tuple[str, ...] = ()
    found_in: tuple[str, str] | None = None
    names: tuple[str, ...] = ()
    or_names: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    narrows: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def where(self) -> str:
        """Where the piece is looked for, for a reason."""
        if self.found_in is not None:
            need, name = self.found_in
            return f"the module {need} takes {name} from"
        return self.module


#: The needs the allocator tier takes: every one of them, or no allocator is built. (What
#: one allocator kind needs beyond them, the paged allocator's torch path, is a row of the
#: declaration: ``declaration._RELEASE_ROWS``.)
ALLOCATOR_NEEDS: tuple[str, ...] = ("allocators", "swa_allocator", "swa_pool")
#: The needs each family's host pools take: without one, that family's host pools are off
#: and the other families' stay (a DSA pool's host tier is an MLA host of its latent rows
#: plus the index-K host). ``device_pool_info`` and ``dsa_indexer_decl`` only pick the
#: adapter (declaration.HOST_POOL_ADAPTERS).
HOST_FAMILY_NEEDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"mha": ("host_mha",), "mla": ("host_mla",), "dsa": ("host_mla", "host_dsa")}
)

#: Every piece the target uses, and what it serves. Keys of the loaded namespace are the
#: ``name`` of each row (``_sglang().memory_pool``).
NEEDS: tuple[Need, ...] = (
    Need("memory_pool", "pool module", _POOL, capabilities=_POOL_CAPABILITIES),
    Need("mha_class", "MHA pool", _POOL, names=("MHATokenToKVPool",), capabilities=("mha_pool",)),
    Need(
        "noop_class",
        "no-op MHA pool",
        _POOL,
        names=("NoOpMHATokenToKVPool",),
        capabilities=("noop_pool",),
    ),
    Need("mla_class", "MLA pool", _POOL, names=("MLATokenToKVPool",), capabilities=("mla_pool",)),
    Need("dsa_class", "DSA pool", _POOL, names=("DSATokenToKVPool",), capabilities=("dsa_pool",)),
    # The MLA FP4 pool and its scale-row kernel (a CPU body on CPU): checked on 0.5.23.
    Need(
        "mla_fp4_class",
        "MLA FP4 pool",
        _POOL,
        names=("MLATokenToKVPoolFP4",),
        narrows={"mla.kv_quant": ("none",)},
    ),
    # The MXFP8 MHA pool: the configurator's MXFP8 cell is checked against what it refuses
    # to build (head dims that are not whole 32-value blocks).
    Need(
        "mxfp8_class",
        "MXFP8 MHA pool",
        _POOL,
        names=("MHATokenToKVPoolMXFP8",),
        capabilities=("quantized_configurator",),
    ),
    Need(
        "mla_fp4_scale_kernel",
        "MLA FP4 scale-row kernel module",
        "sglang.kernels.ops.kvcache.mla_buffer",
        names=("set_mla_kv_scale_buffer_kernel",),
        narrows={"mla.kv_quant": ("none",)},
    ),
    # The MHA quant methods (cpu_fp8, fp4_mx_block16: quant_methods.py), passed to
    # MHATokenToKVPool as quant_method (OPTIONAL_PARAMETERS); all torch code.
    Need(
        "kv_quant_methods",
        "KV-cache quant-method module",
        "sglang.srt.layers.quantization.fp4_kv_cache_quant_method",
        names=("get_kv_cache_quant_method", "CPUFP8KVCacheMethod", "FP4MXBlock16KVCacheMethod"),
        narrows={"mha.kv_quant": _WITHOUT_QUANT_METHODS},
    ),
    # The MXFP8 MHA pool and the Triton kernels its writes, moves and reloads launch (CPU
    # bodies on CPU: mxfp8_kernels.py); 0.5.21 and 0.5.22 keep the same kernels in
    # kernels/ops/quantization/.
    Need(
        "mxfp8_class",
        "MXFP8 MHA pool",
        _POOL,
        names=("MHATokenToKVPoolMXFP8",),
        narrows={"mha.kv_quant": _WITHOUT_MXFP8},
    ),
    Need(
        "mxfp8_interleave",
        "MXFP8 interleaved-scale kernel module",
        "sglang.kernels.ops.kvcache.mxfp8_interleave_sf",
        or_modules=("sglang.kernels.ops.quantization.mxfp8_interleave_sf",),
        names=("store_sf_interleaved", "_store_sf_interleaved_kernel"),
        narrows={"mha.kv_quant": _WITHOUT_MXFP8},
    ),
    Need(
        "mxfp8_quant_store",
        "MXFP8 quant-store kernel module",
        "sglang.kernels.ops.kvcache.mxfp8_quant_store_kv",
        or_modules=("sglang.kernels.ops.quantization.mxfp8_quant",),
        names=("quant_store_kv_mxfp8", "_mxfp8_quant_store_qkv_kernel"),
        narrows={"mha.kv_quant": _WITHOUT_MXFP8},
    ),
    # MLA/DSA pools read their parallel widths from here (env.dcp_parallel).
    Need(
        "runtime_context",
        "runtime context module",
        "sglang.srt.runtime_context",
        names=("get_parallel",),
        capabilities=("mla_pool", "dsa_pool"),
    ),
    Need(
        "index_key_cache",
        "DSA index-K cache module",
        "sglang.srt.mem_cache.index_key_cache",
        names=("IndexKeyCache",),
        capabilities=("index_k_write",),
    ),
    Need(
        "index_k_kernels",
        "DSA index-K kernel module",
        found_in=("index_key_cache", "_set_k_and_s_triton_kernel"),
        names=("_set_k_and_s_triton_kernel",),
        capabilities=("index_k_write",),
    ),
    Need(
        "dsa_quant_kernels",
        "scaled fp8 DSA quantizer module",
        found_in=("memory_pool", "_quantize_k_cache_fast_kernel"),
        names=("_quantize_k_cache_fast_kernel",),
        narrows={"dsa.latent_layout": ("raw",)},
    ),
    # Latent reads (and, where a release has no torch body, writes) run CPU kernel bodies.
    Need(
        "mla_buffer",
        "MLA buffer kernel module",
        "sglang.kernels.ops.kvcache.mla_buffer",
        names=("get_mla_kv_buffer_kernel", "get_mla_kv_buffer_kernel_norope"),
        capabilities=("mla_write",),
    ),
    Need(
        "mla_set_path",
        "CPU path of set_mla_kv_buffer",
        "sglang.kernels.ops.kvcache.mla_buffer",
        names=("set_mla_kv_buffer_naive",),
        or_names=("set_mla_kv_buffer_kernel", "set_mla_kv_buffer_kernel_norope"),
        capabilities=("mla_write",),
    ),
    # Serving: server arguments, the published context, the hooks, the configurators.
    Need(
        "server_args",
        "ServerArgs module",
        "sglang.srt.server_args",
        names=("ServerArgs",),
        capabilities=("server_args", "pool_selection", "configurator", "skip_rule"),
    ),
    Need(
        "arg_utils",
        "argument record helpers",
        "sglang.srt.arg_groups.arg_utils",
        names=("record_fields",),
        capabilities=("server_args", "pool_selection", "configurator", "skip_rule"),
    ),
    Need(
        "published_context",
        "way to publish server arguments",
        "sglang.srt.runtime_context",
        names=_CONTEXT,
        or_names=_PROCESS_CONTEXT,
        capabilities=("pool_selection", "configurator", "skip_rule"),
    ),
    Need(
        "schedule",
        "published schedule config",
        "sglang.srt.runtime_context",
        names=("get_schedule",),
        capabilities=("pool_selection",),
    ),
    Need(
        "kv_cache_hook",
        "--prefill-only-disable-kv-cache hooks",
        "sglang.srt.arg_groups.kv_cache_hook",
        names=(
            "validate_prefill_only_disable_kv_cache_args",
            "handle_prefill_only_disable_kv_cache",
        ),
        capabilities=("server_args",),
    ),
    Need(
        "overrides",
        "attention backend resolution passes",
        "sglang.srt.arg_groups.overrides",
        names=(
            "_attention_backend_default",
            "_attention_backend_fa3_fp8_fallback",
            "declare_resolution",
            "run_post_process_pass",
        ),
        capabilities=("server_args",),
    ),
    Need(
        "model_override_base",
        "resolved server-argument view",
        "sglang.srt.arg_groups.model_override_base",
        names=("resolved_view",),
        capabilities=("server_args",),
    ),
    Need(
        "platform_hook",
        "CPU backend hook",
        "sglang.srt.arg_groups.platform_hook",
        names=("handle_cpu_backends",),
        capabilities=("server_args",),
    ),
    Need(
        "configurator",
        "KV cache configurator",
        "sglang.srt.mem_cache.kv_cache_configurator",
        names=("KVCacheConfigurator",),
        capabilities=("pool_selection",),
    ),
    Need(
        "dsa_elision",
        "DSA index-K elision rule",
        "sglang.srt.mem_cache.kv_cache_configurator",
        names=("_should_elide_dsa_index_k",),
        capabilities=("skip_rule",),
    ),
    Need(
        "pool_configurator",
        "pool configurator",
        "sglang.srt.model_executor.pool_configurator",
        names=("create_memory_pool_configurator",),
        capabilities=("configurator",),
    ),
    Need(
        "model_config",
        "model config module",
        "sglang.srt.configs.model_config",
        names=("is_deepseek_dsa", "dsa_layer_skips_topk"),
        capabilities=("pool_selection", "skip_rule"),
    ),
    Need(
        "platforms",
        "platform module",
        "sglang.srt.platforms",
        names=("current_platform",),
        capabilities=("pool_selection",),
    ),
    Need(
        "spec_info",
        "speculative algorithm enum",
        "sglang.srt.speculative.spec_info",
        names=("SpeculativeAlgorithm",),
        capabilities=("pool_selection", "configurator"),
    ),
    # The tiers around the pools (SGLangTarget.make_allocator, make_host_pool): without one
    # of these a release builds no allocators or no host pools (ReleaseFacts.surface).
    Need(
        "allocators",
        "token and paged allocators",
        "sglang.srt.mem_cache.allocator",
        names=("TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"),
    ),
    Need(
        "swa_allocator",
        "SWA allocator",
        "sglang.srt.mem_cache.allocator.swa",
        names=("SWATokenToKVPoolAllocator",),
    ),
    Need("swa_pool", "SWA pool", "sglang.srt.mem_cache.swa_memory_pool", names=("SWAKVPool",)),
    # 0.5.21's paged allocator hands out extend and decode slots with Triton kernels only
    # (a GPU); 0.5.22 added torch bodies for both, which a CPU host runs.
    Need(
        "paged_alloc_torch",
        "torch path of the paged allocator (alloc_decode_naive)",
        "sglang.srt.mem_cache.allocator.paged",
        names=("alloc_decode_naive",),
    ),
    Need(
        "host_mha",
        "MHA host pool module",
        "sglang.srt.mem_cache.pool_host.mha",
        names=("MHATokenToKVPoolHost", "get_mha_host_pool_cls"),
    ),
    Need(
        "host_mla",
        "MLA host pool module",
        "sglang.srt.mem_cache.pool_host.mla",
        names=("MLATokenToKVPoolHost",),
    ),
    Need(
        "host_dsa",
        "DSA index-K host pool module",
        "sglang.srt.mem_cache.pool_host.dsa",
        names=("DSAIndexerPoolHost",),
    ),
    # 0.5.22 on: the index-K host pool is built from a declaration of the device pool's
    # index buffers; 0.5.21's takes the device pool and the host layout itself (the adapter,
    # declaration.HOST_POOL_ADAPTERS).
    Need(
        "dsa_indexer_decl",
        "declaration the DSA index-K host pool is built from",
        "sglang.srt.mem_cache.pool_host.dsa",
        names=("make_dsa_indexer_pool_decl",),
    ),
    # The target builds host pools from the device pool's buffer info, as sglang 0.5.23's
    # cache controller does; without it (0.5.21, 0.5.22) from the device pool itself, which
    # those releases' host pools take (declaration.HOST_POOL_ADAPTERS).
    Need(
        "device_pool_info",
        "device-pool buffer infos host pools are built from",
        "sglang.srt.mem_cache.device_pool_info",
        names=("MHABufferInfo",),
    ),
    # The MXFP8 host pool and the JIT HiCache kernels it transfers with (CPU bodies on CPU:
    # hicache_jit.py); without them the target builds no host tier for MXFP8 pools
    # (SGLangTarget.declaration says why).
    Need(
        "host_mxfp8",
        "MXFP8 MHA host pool module",
        "sglang.srt.mem_cache.pool_host.mha_mxfp8",
        names=("MHATokenToKVPoolMXFP8Host",),
    ),
    Need(
        "hicache_jit",
        "JIT HiCache transfer kernels",
        "sglang.kernels.ops.kvcache.hicache",
        names=(
            "transfer_hicache_one_layer",
            "transfer_hicache_all_layer_staged_lf_pf",
            "transfer_hicache_one_layer_mla",
            "transfer_hicache_all_layer_mla_staged_lf_pf",
            "_tiles_across_lanes",
            "_default_unroll",
        ),
    ),
)


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` found: ``modules`` by need name (``None`` where missing) and, per
    missing need, why."""

    release: str
    modules: SimpleNamespace
    missing: Mapping[str, str]

    def unsupported(self) -> dict[str, str]:
        """Capability -> why, for every capability a missing piece turns off."""
        reasons: dict[str, str] = {}
        for need in NEEDS:
            if need.name in self.missing:
                for capability in need.capabilities:
                    reasons.setdefault(capability, self.missing[need.name])
        return reasons


def load(release: str, needs: Sequence[Need] = NEEDS) -> Loaded:
    """Import each need's module on its own; record what the installed release lacks.

    Call it with sglang's import-time requirements in place (the torchvision stand-in). A
    module the release does not have, or one without the names its row needs, is missing
    (with a reason naming ``release``); any other import error is a setup error and raises.
    """
    modules: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for need in needs:
        module, why = _find(need, modules, release)
        if module is not None:
            module, why = _with_names(need, module, release)
        modules[need.name] = module
        if why is not None:
            missing[need.name] = why
    return Loaded(release, SimpleNamespace(**modules), MappingProxyType(missing))


def _find(need: Need, found: Mapping[str, Any], release: str) -> tuple[Any, str | None]:
    if need.found_in is None:
        candidates = (need.module, *need.or_modules)
        for candidate in candidates:
            try:
                return importlib.import_module(candidate), None
            except ModuleNotFoundError as exc:
                if exc.name is None or not candidate.startswith(exc.name):
                    raise  # a dependency of the module is missing: a setup error
        return None, f"sglang {release} has no {need.what} ({' or '.join(candidates)})"
    source_name, wanted = need.found_in
    source = found.get(source_name)
    if source is None:
        return None, f"sglang {release} has no {need.what} (no {source_name} to find it from)"
    for module in _modules_named_in(source):
        if hasattr(module, wanted):
            return module, None
    return None, (
        f"sglang {release} has no {need.what} (no module {source_name} imports defines {wanted})"
    )


def _modules_named_in(module: Any) -> Iterator[types.ModuleType]:
    """The modules ``module`` imported, or imported a name from, in definition order."""
    seen: set[str] = set()
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            candidate: Any = value
        else:
            owner = getattr(value, "__module__", None)
            candidate = sys.modules.get(owner) if isinstance(owner, str) else None
        if isinstance(candidate, types.ModuleType) and candidate.__name__ not in seen:
            seen.add(candidate.__name__)
            yield candidate


def _with_names(need: Need, module: Any, release: str) -> tuple[Any, str | None]:
    lacking = [name for name in need.names if not hasattr(module, name)]
    if not lacking:
        return module, None
    if need.or_names and all(hasattr(module, name) for name in need.or_names):
        return module, None
    instead = f" (nor {', '.join(need.or_names)})" if need.or_names else ""
    return None, (
        f"sglang {release} has no {need.what}: {module.__name__} lacks "
        f"{', '.join(lacking)}{instead}"
    )


# --- 2. layouts, by inspection -----------------------------------------------------------------

#: Constructor parameters kvcheck passes only for a variant: pool class -> parameter -> the
#: surface a release whose constructor lacks it is limited to (the pool is then built
#: without the parameter). Any other parameter kvcheck passes and a constructor lacks turns
#: the family off.
OPTIONAL_PARAMETERS: Mapping[str, Mapping[str, Mapping[str, tuple[Any, ...]]]] = {
    "DSATokenToKVPool": {
        "index_kpool": {"dsa.index_kpool": (1,)},
        "index_kpool_compress": {"dsa.index_kpool": (1,)},
        "tail_extra_slots": {"dsa.index_kpool": (1,)},
        "max_running_requests": {"dsa.index_kpool": (1,)},
        "kv_cache_dim": {"dsa.latent_layout": ("raw",)},
        "index_buf_size": {"dsa.dcp_size": (1,)},
    },
    "MHATokenToKVPool": {
        "enable_kv_cache_copy": {},
        "v_head_dim": {},
        "quant_method": {"mha.kv_quant": _WITHOUT_QUANT_METHODS},
    },
    "NoOpMHATokenToKVPool": {"enable_kv_cache_copy": {}, "v_head_dim": {}},
}

#: Pool class -> the family it serves.
POOL_CLASSES: Mapping[str, str] = {
    "MHATokenToKVPool": "mha",
    "NoOpMHATokenToKVPool": "noop",
    "MLATokenToKVPool": "mla",
    "DSATokenToKVPool": "dsa",
}


@dataclass(frozen=True)
class ReleaseFacts:
    """What :func:`probe` read from the installed release (``None``: could not be read,
    because the piece it needs is missing).

    ``parameters``: each pool class's constructor parameters. ``dsa_layouts``: the
    ``(index_page_size, index_kpool, index_head_dim)`` its DSA constructor accepts and builds
    with pooled index keys (``page_size // index_kpool`` slots per index row).
    ``dsa_dcp_index_widened``: whether its default index-K buffer under decode context
    parallel holds a key for every widened id. ``kv_page_padding``: whether fused MHA K/V
    halves are padded to whole pages. ``hnd_layout``: whether ``SGLANG_USE_HND_KVCACHE``
    builds head-major MHA buffers. ``private_context``: ``create_context``/``use_context``
    (else only the process-wide ``publish``). ``cpu_mla_set``: whether ``set_mla_kv_buffer``
    has a torch body (``set_mla_kv_buffer_naive``) for platforms without Triton.
    """

    loaded: Loaded
    parameters: Mapping[str, frozenset[str]]
    dsa_layouts: tuple[tuple[int, int, int], ...] | None
    dsa_dcp_index_widened: bool | None
    kv_page_padding: bool | None
    hnd_layout: bool | None
    private_context: bool
    cpu_mla_set: bool

    @property
    def release(self) -> str:
        return self.loaded.release

    def unsupported(self) -> dict[str, str]:
        """Capability -> why, for what this release cannot serve (missing pieces, pool
        constructors without a parameter kvcheck always passes)."""
        reasons = self.loaded.unsupported()
        for class_name, family in POOL_CLASSES.items():
            lacking = self.lacking_parameters(class_name)
            if lacking and f"{family}_pool" not in reasons:
                reasons[f"{family}_pool"] = (
                    f"sglang {self.release}'s {class_name} takes no {', '.join(lacking)} "
                    "parameter, which kvcheck passes for every pool of the family"
                )
        return reasons

    def lacking_parameters(self, class_name: str) -> list[str]:
        """Parameters kvcheck always passes that ``class_name``'s constructor lacks."""
        have = self.parameters.get(class_name)
        if have is None:
            return []
        optional = OPTIONAL_PARAMETERS.get(class_name, {})
        return sorted(_ALWAYS_PASSED[POOL_CLASSES[class_name]] - have - set(optional))

    def surface(self, declared: Surface) -> Surface:
        """``declared`` narrowed to what this release builds, each narrowing with a note
        that names the release and the piece."""
        families = {family: dict(fields) for family, fields in declared.families.items()}
        notes: dict[str, str] = dict(declared.notes)
        unsupported = self.unsupported()
        for family in list(families):
            why = unsupported.get(f"{family}_pool")
            if why is not None:
                del families[family]
                notes[family] = why
        for key, values, why in self._narrowings():
            family, _, name = key.partition(".")
            if family not in families:
                continue
            current = declared.values(family, name)
            kept = tuple(v for v in (current or values) if v in values) or values
            families[family][name] = kept
            if notes.get(key) == declared.notes.get(key) is not None:
                # The declared note says why other values are left out; say this one first.
                notes[key] = f"{why}; {notes[key]}"
            notes.setdefault(key, why)
        allocators, host_layouts = declared.allocators, dict(declared.host_layouts)
        off = self.tiers_off()
        if allocators and "allocators" in off:
            allocators, notes["allocators"] = (), off["allocators"]
        for family, why in self.host_families_off().items():
            if host_layouts.pop(family, None) is not None:
                notes[f"host_pools.{family}"] = why
        if declared.host_layouts and not host_layouts:
            notes["host_pools"] = off["host_pools"]
        return dataclasses.replace(
            declared,
            families=families,
            notes=notes,
            allocators=allocators,
            host_layouts=host_layouts,
        )

    def tiers_off(self) -> dict[str, str]:
        """Tier (``allocators``, ``host_pools``) -> why this release builds none: the first
        piece of :data:`ALLOCATOR_NEEDS` it lacks; the first family's reason when it builds
        the host pools of no family (:meth:`host_families_off`)."""
        off: dict[str, str] = {}
        missing = [self.loaded.missing[n] for n in ALLOCATOR_NEEDS if n in self.loaded.missing]
        if missing:
            off["allocators"] = missing[0]
        families_off = self.host_families_off()
        if len(families_off) == len(HOST_FAMILY_NEEDS):
            off["host_pools"] = next(iter(families_off.values()))
        return off

    def host_families_off(self) -> dict[str, str]:
        """Host family -> why this release builds no host pool for its device pools: the
        first piece of :data:`HOST_FAMILY_NEEDS` it lacks (the other families stay)."""
        off: dict[str, str] = {}
        for family, needs in HOST_FAMILY_NEEDS.items():
            missing = [self.loaded.missing[name] for name in needs if name in self.loaded.missing]
            if missing:
                off[family] = missing[0]
        return off

    def _narrowings(self) -> Iterator[tuple[str, tuple[Any, ...], str]]:
        release = self.release
        for need in NEEDS:
            if need.name in self.loaded.missing:
                for key, values in need.narrows.items():
                    yield key, values, self.loaded.missing[need.name]
        for class_name, optional in OPTIONAL_PARAMETERS.items():
            have = self.parameters.get(class_name)
            if have is None:
                continue
            for parameter, narrows in optional.items():
                if parameter not in have:
                    why = f"sglang {release}'s {class_name} takes no {parameter} parameter"
                    for key, values in narrows.items():
                        yield key, values, why
        yield from self._dsa_narrowings()
        if self.kv_page_padding is False:
            why = (
                f"sglang {release} allocates MHA K and V separately, size + page_size rows "
                "each, without padding them to whole pages"
            )
            yield "mha.kv_page_padding", (False,), why
            yield "noop.kv_page_padding", (False,), why
        if self.hnd_layout is False:
            yield (
                "mha.kv_layout",
                ("nhd",),
                f"sglang {release}'s MHATokenToKVPool builds no head-major (HND) layout",
            )

    def _dsa_narrowings(self) -> Iterator[tuple[str, tuple[Any, ...], str]]:
        release = self.release
        layouts = self.dsa_layouts
        if layouts is not None:
            pages = sorted({page for page, kpool, _ in layouts if kpool == 1})
            dims = sorted({dim for page, kpool, dim in layouts if kpool == 1})
            kpools = sorted({kpool for _, kpool, _ in layouts})
            if pages:
                yield (
                    "dsa.index_page_size",
                    tuple(pages),
                    f"sglang {release}'s DSATokenToKVPool asserts these index pages",
                )
                yield (
                    "dsa.index_head_dim",
                    tuple(dims),
                    f"sglang {release}'s DSATokenToKVPool asserts these index key sizes",
                )
            if kpools == [1]:
                yield (
                    "dsa.index_kpool",
                    (1,),
                    f"sglang {release}'s DSATokenToKVPool pools no index keys: it takes "
                    "index_kpool but keeps a key per token (no index_page_size; its assert "
                    "wants 64-token pages whatever the kpool)",
                )
            elif kpools:
                yield (
                    "dsa.index_kpool",
                    tuple(kpools),
                    f"the index kpools sglang {release}'s DSATokenToKVPool builds",
                )
        if self.dsa_dcp_index_widened is False:
            yield (
                "dsa.dcp_size",
                (1,),
                f"sglang {release}'s DSATokenToKVPool sizes its default index-K buffer for "
                "physical tokens under decode context parallel while writes carry widened "
                "ids (finding D21)",
            )

    def fit_arguments(self, kwargs: Mapping[str, Any], class_name: str) -> dict[str, Any]:
        """``kwargs`` for ``class_name`` without the optional parameters this release's
        constructor lacks (the surface keeps those at their defaults)."""
        have = self.parameters.get(class_name)
        if have is None:
            return dict(kwargs)
        optional = OPTIONAL_PARAMETERS.get(class_name, {})
        return {k: v for k, v in kwargs.items() if k in have or k not in optional}


#: Parameters kvcheck's pool_arguments passes for every pool of a family.
_COMMON = frozenset(
    {"size", "page_size", "dtype", "layer_num", "device", "enable_memory_saver", "start_layer"}
)
_ALWAYS_PASSED: Mapping[str, frozenset[str]] = {
    "mha": _COMMON | {"end_layer", "head_num", "head_dim"},
    "noop": _COMMON | {"end_layer", "head_num", "head_dim"},
    "mla": _COMMON | {"end_layer", "kv_lora_rank", "qk_rope_head_dim"},
    "dsa": _COMMON
    | {"end_layer", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "skip_topk_layers"},
}

#: DSA layouts probed: index pages (tokens of one index page) and index key sizes; each
#: index kpool of the declared surface is tried at each page.
_PROBE_INDEX_PAGES = (16, 32, 64, 128)
_PROBE_INDEX_DIMS = (64, 128)


def probe(loaded: Loaded, *, declared: Surface, env: Any) -> ReleaseFacts:
    """Read :class:`ReleaseFacts` from the loaded release (builds a few tiny pools on CPU).

    ``env`` is :mod:`kvcheck.targets.sglang.env` (its scopes: the parallel widths, the
    native move, the HND variable); ``declared`` bounds the kpools tried.
    """
    modules = loaded.modules
    pool_module = modules.memory_pool
    parameters: dict[str, frozenset[str]] = {}
    for class_name in POOL_CLASSES:
        cls = getattr(pool_module, class_name, None) if pool_module is not None else None
        if cls is not None:
            parameters[class_name] = frozenset(inspect.signature(cls.__init__).parameters)
    dsa = (
        getattr(pool_module, "DSATokenToKVPool", None)
        if "dsa_class" not in loaded.missing
        else None
    )
    latent_ready = dsa is not None and "runtime_context" not in loaded.missing
    mha = (
        getattr(pool_module, "MHATokenToKVPool", None)
        if "mha_class" not in loaded.missing
        else None
    )
    runtime = modules.runtime_context
    kpools = declared.values("dsa", "index_kpool") or (1,)
    facts = ReleaseFacts(
        loaded=loaded,
        parameters=MappingProxyType(parameters),
        dsa_layouts=_dsa_layouts(dsa, parameters, kpools, env) if latent_ready else None,
        dsa_dcp_index_widened=_dsa_dcp_widened(dsa, parameters, env) if latent_ready else None,
        kv_page_padding=_kv_page_padding(mha, env) if mha is not None else None,
        hnd_layout=_hnd_layout(mha, env) if mha is not None else None,
        private_context=runtime is not None and all(hasattr(runtime, n) for n in _CONTEXT),
        cpu_mla_set=hasattr(modules.mla_buffer, "set_mla_kv_buffer_naive"),
    )
    return facts


def _dsa_kwargs(parameters: Mapping[str, frozenset[str]], **kwargs: Any) -> dict[str, Any]:
    import torch

    base: dict[str, Any] = {
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "dtype": torch.bfloat16,
        "layer_num": 1,
        "device": "cpu",
        "enable_memory_saver": False,
        "start_layer": 0,
        "end_layer": 1,
        "kv_cache_dim": 24,
        **kwargs,
    }
    have = parameters.get("DSATokenToKVPool", frozenset())
    return {k: v for k, v in base.items() if k in have}


def _dsa_layouts(
    dsa: Any, parameters: Mapping[str, frozenset[str]], kpools: Sequence[int], env: Any
) -> tuple[tuple[int, int, int], ...]:
    """The (index page, kpool, index key size) the DSA constructor accepts and pools."""
    accepted = []
    have = parameters.get("DSATokenToKVPool", frozenset())
    for kpool in kpools if "index_kpool" in have else (1,):
        for index_page in _PROBE_INDEX_PAGES:
            for dim in _PROBE_INDEX_DIMS:
                page = index_page * kpool
                kwargs = _dsa_kwargs(
                    parameters, size=page, page_size=page, index_head_dim=dim, index_kpool=kpool
                )
                try:
                    with env.dcp_parallel(1, 0):
                        pool = dsa(**kwargs)
                except AssertionError:
                    continue  # the constructor's own check refuses this layout
                # Pooled: one index slot per kpool tokens (the release says so itself).
                if kpool == 1 or getattr(pool, "index_page_size", None) == index_page:
                    accepted.append((index_page, kpool, dim))
    return tuple(accepted)


def _dsa_dcp_widened(dsa: Any, parameters: Mapping[str, frozenset[str]], env: Any) -> bool | None:
    """Whether the default index-K buffer of rank 0 of ``--dcp-size 2`` holds a key for every
    widened id (kvcheck's model: ``(size + page) * 2 - page`` slots)."""
    page = 64
    kwargs = _dsa_kwargs(parameters, size=page, page_size=page, index_head_dim=128)
    try:
        with env.dcp_parallel(2, 0):
            pool = dsa(**kwargs)
    except AssertionError:
        return None
    buffer = pool.index_k_with_scale_buffer[0]
    slots = int(buffer.shape[0]) * page
    return bool(slots >= (page + page) * 2 - page)


def _kv_page_padding(mha: Any, env: Any) -> bool | None:
    """Whether a 3-token pool of 2-token pages keeps K and V as halves of one allocation
    padded to whole pages (one storage holding 2 x 3 pages' rows)."""
    pool = _tiny_mha(mha, env, nullcontext())
    if pool is None:
        return None
    k, v = pool.k_buffer[0], pool.v_buffer[0]
    halves = 2 if k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() else 1
    rows = k.untyped_storage().nbytes() // (halves * k.stride(0) * k.element_size())
    return rows > 3 + 2  # size + page_size rows, rounded up to whole pages: 6


def _hnd_layout(mha: Any, env: Any) -> bool | None:
    """Whether the HND variable gives head-major buffers ``[pages, heads, page, dim]``."""
    pool = _tiny_mha(mha, env, env.hnd_kv_layout(), size=4)
    return None if pool is None else pool.k_buffer[0].dim() == 4


def _tiny_mha(mha: Any, env: Any, scope: Any, size: int = 3) -> Any:
    import torch

    try:
        with env.native_kv_move(), scope:
            return mha(
                size=size,
                page_size=2,
                dtype=torch.bfloat16,
                head_num=1,
                head_dim=4,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
            )
    except (AssertionError, TypeError, ValueError):
        return None
