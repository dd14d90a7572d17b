"""The ``sglang`` target: the installed sglang release's real pools and serving functions.

Pools are sglang's own classes (``MHATokenToKVPool``, ``NoOpMHATokenToKVPool``,
``MLATokenToKVPool``, ``DSATokenToKVPool``); validation, pool-family checks, KV sizing
and the DSA skip rule are sglang's own functions. What a launched sglang server would
have provided (a GPU, published parallel widths, resolved server arguments, a loaded
checkpoint) is supplied by the scoped workarounds in :mod:`kvcheck.targets.sglang.env`
and the translations in :mod:`kvcheck.targets.sglang.adapt`; each is documented where
it is used.

The target follows the installed release (:mod:`kvcheck.targets.sglang.release`): each
piece of sglang is imported on its own, and one a release lacks turns off only the
capabilities that need it; what the release builds (its surface) is read from it when the
target is prepared; its findings and expected failures are those whose release range holds
the installed release (:mod:`kvcheck.targets.sglang.findings`).

Importing this module does not import sglang (which takes seconds):
:meth:`SGLangTarget.prepare` (or the first method that needs it) does, once per process.
Install sglang with ``scripts/install_sglang.sh``.

Example, where sglang is installed::

    target = SGLangTarget()
    pool = target.make_pool(PoolSpec(family="mha", size=8, page_size=4, layer_num=2,
                                     dtype="bfloat16"), device="cpu")
    type(pool).__module__  # 'sglang.srt.mem_cache.memory_pool'

What the newest checked release builds is declared without importing it (an older
release narrows it when the target is prepared):

    >>> SURFACE.limits()["dsa"]
    {'index_kpool': (1, 2), 'index_page_size': (64,), 'index_head_dim': (128,)}
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from kvcheck.declaration import Declaration
from kvcheck.geometry import latent_row_bytes, latent_width
from kvcheck.specs import POOL_FAMILIES, LinearHybridSpec, PoolSpec, SWAPoolSpec
from kvcheck.steering import Steering
from kvcheck.surface import Surface
from kvcheck.targets.base import PoolArguments, ScriptRecipe, swa_pool_arguments
from kvcheck.targets.discovery import ClassEntry
from kvcheck.targets.sglang import adapt, env, mxfp8_kernels, release
from kvcheck.targets.sglang.classes import discover_classes
from kvcheck.targets.sglang.declaration import (
    BOUND,
    DECLARATION,
    HOST_STORAGE_STEER,
    TIER_GUARDS,
    declaration_for,
    host_pool_adapter,
)
from kvcheck.targets.sglang.findings import expected_failures_for, findings_for
from kvcheck.targets.sglang.quant_methods import built_kwargs, quant_method_call
from kvcheck.targets.sglang.release import INSTALL_HINT, ReleaseFacts
from kvcheck.tiers import AllocatorSpec, HostPoolSpec

_MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"

#: What the newest checked release builds: the bound surface without the variants the
#: declaration refuses (:data:`.declaration.DECLARATION`), each narrowing noted with why.
#: Once prepared, the target narrows it to what the installed release builds
#: (:meth:`.release.ReleaseFacts.surface`: its asserts, parameters and layouts).
SURFACE = DECLARATION.surface(BOUND)

#: Every stand-in, environment setting, guard and translation the target puts in place of
#: what a launched sglang server on a GPU provides, by the name under which the "CPU
#: stand-ins" table of docs/sglang-findings-appendix.md says what sglang does without it (a stand-in
#: must never hide a finding). tests/targets/test_sglang_findings_doc.py fails when one has
#: no row there, and when ``env`` gains a context manager or ``adapt`` a
#: ``*StandIn`` class that is not listed here.
SGLANG_STAND_INS: tuple[str, ...] = (
    # env: scoped patches and environment
    "torchvision_stand_in",
    "native_kv_move",
    "hnd_kv_layout",
    "dcp_parallel",
    "cpu_cuda_synchronize",
    "cpu_index_k_kernel",
    "cpu_dsa_quantize_kernel",
    "cpu_mla_read_kernels",
    "cpu_mla_write_kernels",
    "cpu_mla_scale_kernel",
    "guard_swig_exit_warning",
    # mxfp8_kernels: the MXFP8 pool's GPU-only store pieces
    "cpu_store_cache",
    "cpu_mxfp8_interleave_kernel",
    "cpu_mxfp8_quant_store_kernel",
    "cpu_kvcacheio",
    # hicache_jit: the MXFP8 host pool's JIT transfer kernels
    "cpu_hicache_jit",
    # this module
    "_refuse_zero_row_index_write",
    "_published",
    # adapt: objects and resolution steps a server would build from a checkpoint
    "ConfiguratorStandIn",
    "ModelConfigStandIn",
    "HFConfig",
    "resolve_attention_backend",
    "kv_cache_torch_dtype",
)

#: The MXFP8 pool's methods besides ``set_kv_buffer`` that launch one of its GPU-only store
#: pieces: moves and reloads store interleaved scales with ``store_sf_interleaved``.
_MXFP8_SCALE_STORING_METHODS: tuple[str, ...] = ("move_kv_cache", "load_cpu_copy")

#: Pool methods that read sglang's runtime context (parallel widths) or sync CUDA.
_MLA_SCOPED_METHODS: tuple[str, ...] = (
    "set_kv_buffer",
    "set_mla_kv_buffer",
    "get_mla_kv_buffer",
    "get_cpu_copy",
    "load_cpu_copy",
)
_DSA_SCOPED_METHODS: tuple[str, ...] = (
    *_MLA_SCOPED_METHODS,
    "set_index_k_scale_buffer",
    "get_index_k_scale_buffer",
)

#: Flags sglang's pool-family decision reads from its published config
#: (``get_schedule().prefill_only_disable_kv_cache``, ``get_exec().kernel.attention_backend``);
#: the KV dtype reaches it through the configurator instead.
_FAMILY_FLAGS: tuple[str, ...] = ("prefill_only_disable_kv_cache", "attention_backend")


@functools.cache
def _loaded() -> release.Loaded:
    """Import the sglang modules the target uses, each on its own (once per process)."""
    if importlib.util.find_spec("sglang") is None:
        raise ModuleNotFoundError(f"sglang is not installed; {INSTALL_HINT}")
    # sglang warns at import about CPU-only features (AWQ, GGUF) and triggers torch
    # deprecation warnings; they are about sglang's environment, not what kvcheck checks.
    with warnings.catch_warnings(), env.torchvision_stand_in():
        warnings.simplefilter("ignore")
        loaded = release.load(release.installed_release())
    env.guard_swig_exit_warning()
    return loaded


def _sglang() -> SimpleNamespace:
    """The sglang modules the target uses, by :data:`.release.NEEDS` name (``None`` where the
    installed release lacks one); imported once per process."""
    return _loaded().modules


@functools.cache
def _facts() -> ReleaseFacts:
    """What the installed release offers, read from it once per process (imports sglang)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return release.probe(_loaded(), declared=SURFACE, env=env)


@functools.cache
def _release_surface() -> Surface:
    """What the installed release builds: :data:`BOUND` narrowed by the declaration as the
    release's missing pieces lay over it (an allocator kind it refuses left out), then by
    the release's own asserts, parameters and layouts (imports sglang; once per process)."""
    facts = _facts()
    return facts.surface(declaration_for((), facts.loaded.missing).surface(BOUND))


def _prepared() -> ReleaseFacts | None:
    """The release's facts if this process has read them already, else None (no import)."""
    return _facts() if _facts.cache_info().currsize else None


def _installed_sglang_version() -> str | None:
    """The installed sglang's version, None where it is not installed (nothing imported)."""
    try:
        return release.installed_release()
    except ModuleNotFoundError:
        return None


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


class SGLangTarget:
    """The installed sglang release's pools and serving rules, adapted to the kvcheck target
    protocol.

    ``declaration`` says what it builds (and how, where a GPU is stood in for), refuses and
    cannot reach (:mod:`kvcheck.targets.sglang.declaration`), with the findings that hold
    for the installed release; ``unsupported`` and ``unsized_kv_cache_dtypes`` are read
    from it. ``version`` is the installed release (read without importing it); ``findings``
    and ``expected_failures`` are those that hold for it. ``surface`` and ``unsupported``
    are read from the release once it is loaded (:meth:`prepare`); before that (the pytest
    controller of an xdist run, which runs no test), they are the declared :data:`SURFACE`
    and the capabilities every release lacks.
    """

    name: str = "sglang"
    #: The scopes of sglang's code ``python tools/reach.py`` measures, and why each
    #: unreached range stays unreached.
    reach_table: str = "kvcheck.targets.sglang.reach"

    def __init__(self) -> None:
        installed = _installed_sglang_version()
        self.version: str = installed or "not installed"
        #: Why the target cannot run here (the resolver refuses it for a run, saying this);
        #: its declarations and script recipes are still there without sglang, as for the
        #: newest release kvcheck is checked against.
        self.unavailable: str | None = (
            None if installed else f"sglang is not installed; {INSTALL_HINT}"
        )
        self._declared_release: str = installed or release.KNOWN_RELEASES[-1]
        self.findings = findings_for(self._declared_release)
        self.expected_failures: Mapping[str, str] = expected_failures_for(self._declared_release)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, version={self.version!r})"

    @property
    def surface(self) -> Surface:
        """What the installed release builds (:data:`SURFACE` narrowed to it, each narrowing
        with a note), once prepared; :data:`SURFACE` before."""
        return SURFACE if _prepared() is None else _release_surface()

    #: Host tiers without flat storage pages (:data:`HOST_STORAGE_STEER`).
    host_storage_steer: Steering = HOST_STORAGE_STEER
    #: The contracts sglang guards itself (:data:`.declaration.TIER_GUARDS`), checked
    #: although it declares no input validation (:mod:`kvcheck.properties.guards`).
    tier_guards: frozenset[str] = frozenset(TIER_GUARDS)

    @property
    def declaration(self) -> Declaration:
        """:data:`.declaration.DECLARATION` with the findings of the installed release and,
        once prepared, what the release lacks laid over it: no MXFP8 host tier without the
        MXFP8 host pool or the JIT kernels it transfers with."""
        facts = _prepared()
        findings = findings_for(self._declared_release, documented=True)
        return declaration_for(findings, {} if facts is None else facts.loaded.missing)

    @property
    def unsupported(self) -> Mapping[str, str]:
        """Capability -> why the installed release cannot serve it: the declaration's
        refusals, and what the release lacks."""
        reasons = dict(DECLARATION.unsupported(self._declared_release))
        facts = _prepared()
        if facts is not None:
            reasons.update(facts.unsupported())
        return MappingProxyType(reasons)

    @property
    def unsized_kv_cache_dtypes(self) -> Mapping[str, str]:
        """The ``--kv-cache-dtype`` choices the target does not size -> why."""
        return DECLARATION.refused_choices("quantized_configurator", self._declared_release)

    def describe(self) -> str:
        """One line for the run's header: the installed release, and whether kvcheck is
        checked against it (:func:`.release.describe_release`)."""
        if self.unavailable is not None:
            return self.unavailable
        return release.describe_release(self._declared_release)

    def classes(self) -> list[ClassEntry]:
        """Every pool class the installed release's ``srt/mem_cache`` defines, built (how)
        or not (why; ``new in <release>`` for one the declaration has no row for):
        :func:`.classes.discover_classes` over this target's declaration. Imports every
        module of the package (seconds)."""
        if self.unavailable is not None:
            raise RuntimeError(self.unavailable)
        return discover_classes(release=self._declared_release, declaration=self.declaration)

    def prepare(self) -> None:
        """Import sglang and read what the installed release offers, now (seconds, once per
        process) rather than inside the first test.

        The kvcheck pytest plugin calls this before any test runs: a test must not pay for
        the import, and the strategies draw inside the release's surface, which is read
        here. Also guards the process's exit against a crash in a library sglang loads
        (:func:`.env.guard_swig_exit_warning`).
        """
        _facts()

    # --- pools ----------------------------------------------------------------------------

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """Build sglang's pool for ``spec`` on ``device`` ("cpu", "cuda", "cuda:N", "meta").

        ``end_layer`` is passed as ``start_layer + layer_num`` (exclusive), as sglang's
        configurator does. DSA pools get ``kv_cache_dim`` of the spec's latent row (raw:
        ``kv_lora_rank + qk_rope_head_dim``; scaled: the fp8 row's bytes, which makes
        sglang store scaled fp8 rows, as its configurator's ``calculate_mla_kv_cache_dim``
        does) and the spec's index kpool and compress-tail sizes (what the release's
        constructor takes of them), and need the index pages the release asserts (64 tokens:
        ``page_size == 64 * index_kpool``). On CPU, MHA pools use sglang's native move.
        MLA/DSA pools are built, and their methods run, with the parallel widths of rank
        ``dcp_rank`` of ``dcp_size`` (1 of 1 without DCP), as on a server launched with
        ``--dcp-size`` (see :mod:`.env`).
        """
        facts = _facts()  # sglang's modules, imported under their stand-ins, once per process
        arguments = self.pool_arguments(spec, device=device)
        if spec.family in ("mha", "noop"):
            on_cuda = _is_cuda(device)
            # On CUDA: the Triton move sglang uses with speculative decoding. Elsewhere:
            # sglang's own tensor-indexing move, selected by the variable it reads here.
            build_scope = nullcontext() if on_cuda else env.native_kv_move()
            # sglang takes the HND layout only from a variable its constructor reads.
            layout_scope = env.hnd_kv_layout() if spec.kv_layout == "hnd" else nullcontext()
            # A quant method is passed as the call that builds it (a script prints it).
            built = PoolArguments(arguments.pool_class, built_kwargs(arguments.kwargs))
            with build_scope, layout_scope:
                pool = built.build()
            if spec.kv_quant == "mxfp8" and not on_cuda:
                modules = facts.loaded.modules
                # Only the write stores through store_cache (behind its CUDA guard).
                write = functools.partial(_mxfp8_pool_scope, modules=modules, store_cache=True)
                scales = functools.partial(_mxfp8_pool_scope, modules=modules, store_cache=False)
                _run_methods_in_scope(pool, ("set_kv_buffer",), write)
                _run_methods_in_scope(pool, _MXFP8_SCALE_STORING_METHODS, scales)
            return pool
        with env.dcp_parallel(spec.dcp_size, spec.dcp_rank):
            pool = arguments.build()
        methods = _MLA_SCOPED_METHODS if spec.family == "mla" else _DSA_SCOPED_METHODS
        on_cpu = not _is_cuda(device)
        scope = functools.partial(
            _latent_pool_scope,
            cpu=on_cpu,
            modules=facts.loaded.modules,
            dcp_size=spec.dcp_size,
            dcp_rank=spec.dcp_rank,
        )
        _run_methods_in_scope(pool, methods, scope)
        return pool

    def pool_arguments(self, spec: PoolSpec, *, device: str) -> PoolArguments:
        """sglang's pool class and constructor arguments for ``spec`` on ``device``
        (:func:`pool_arguments`), without the optional parameters the installed release's
        constructor does not take, once it is loaded."""
        arguments = pool_arguments(spec, device=device)
        facts = _prepared()
        if facts is None:
            return arguments
        kwargs = facts.fit_arguments(arguments.kwargs, arguments.class_name)
        return PoolArguments(arguments.pool_class, kwargs)

    def script_recipe(self, spec: PoolSpec, ops: Sequence[Any] = ()) -> ScriptRecipe:
        """How a reproduction script builds this pool with sglang alone
        (:func:`kvcheck.targets.sglang.scripts.script_recipe`)."""
        from kvcheck.targets.sglang.scripts import script_recipe

        return script_recipe(spec, ops, arguments=self.pool_arguments(spec, device="cpu"))

    def write_index_k(
        self, pool: Any, layer_id: int, loc: Any, index_k: Any, index_k_scale: Any
    ) -> None:
        """``pool.set_index_k_scale_buffer``, with bytes given as uint8 reinterpreted.

        sglang takes fp8 keys and fp32 scales ([n, 1]); uint8 keys [n, D] and uint8
        scales [n, 4] carry the same bytes and are viewed as those dtypes. On CPU the
        write runs sglang's checks with a CPU kernel body (the declaration's
        ``index_k_write`` row). A write to a skip layer, which sglang would launch against
        a zero-row buffer (finding I10: out of bounds on a GPU), raises ``IndexError``
        here on every device instead.
        """
        _refuse_zero_row_index_write(pool, layer_id)
        if isinstance(index_k, torch.Tensor) and index_k.dtype == torch.uint8:
            index_k = index_k.view(torch.float8_e4m3fn)
        if isinstance(index_k_scale, torch.Tensor) and index_k_scale.dtype == torch.uint8:
            index_k_scale = index_k_scale.contiguous().view(torch.float32)
        pool.set_index_k_scale_buffer(layer_id, loc, index_k, index_k_scale)

    # --- sliding-window hybrid pools ---------------------------------------------------------

    def make_swa_pool(self, spec: SWAPoolSpec, *, device: str) -> Any:
        """sglang's ``SWAKVPool`` for ``spec`` on ``device``: each side's class and arguments
        are those :meth:`pool_arguments` gives for it (less the size, dtype and layer count
        the hybrid passes itself), built in :meth:`make_pool`'s scopes (MHA: sglang's native
        move on CPU; MLA: its methods run in the latent pool scope of one DCP rank)."""
        if not isinstance(spec, SWAPoolSpec):
            raise ValueError(f"spec={spec!r} is not a kvcheck.specs.SWAPoolSpec")
        facts = _facts()
        from kvcheck.targets.sglang.allocators import SWA_POOL_MODULE, _module

        pool_class = _module(SWA_POOL_MODULE).SWAKVPool
        full = self.pool_arguments(spec.full_spec, device=device)
        swa = self.pool_arguments(spec.swa_spec, device=device)
        mha = spec.sub.family == "mha"
        scope = env.native_kv_move() if mha and not _is_cuda(device) else nullcontext()
        with scope, env.dcp_parallel(1, 0):
            pool = pool_class(
                **swa_pool_arguments(full, swa, spec, device=device), enable_memory_saver=False
            )
        if not mha:
            methods = _MLA_SCOPED_METHODS if spec.sub.family == "mla" else _DSA_SCOPED_METHODS
            latent_scope = functools.partial(
                _latent_pool_scope,
                cpu=not _is_cuda(device),
                modules=facts.loaded.modules,
                dcp_size=1,
                dcp_rank=0,
            )
            for side in (pool.full_kv_pool, pool.swa_kv_pool):
                _run_methods_in_scope(side, methods, latent_scope)
        return pool

    def swa_write_loc(self, loc: Any, swa_loc: Any) -> Any:
        """sglang's ``KVWriteLoc(loc=loc, swa_loc=swa_loc)``: how its attention backends pass
        a hybrid pool the full location and its translation."""
        _facts()
        from kvcheck.targets.sglang.allocators import _module

        return _module(_MEMORY_POOL).KVWriteLoc(loc=loc, swa_loc=swa_loc)

    # --- allocators and host pools (kvcheck.targets.tier_support) ---------------------------------

    def make_allocator(self, spec: AllocatorSpec, *, device: str, kvcache: Any = None) -> Any:
        """sglang's allocator of ``spec.kind`` (:mod:`kvcheck.targets.sglang.allocators`)."""
        _sglang()
        from kvcheck.targets.sglang.allocators import make_allocator

        return make_allocator(spec, device=device, kvcache=kvcache)

    def make_host_pool(
        self, spec: HostPoolSpec, device_pool: Any, *, device: str
    ) -> tuple[Any, ...]:
        """sglang's host pools for ``device_pool`` (:mod:`kvcheck.targets.sglang.host_pools`)."""
        _sglang()
        from kvcheck.targets.sglang.host_pools import make_host_pool

        facts = _prepared()
        adapter = host_pool_adapter({} if facts is None else facts.loaded.missing)
        return make_host_pool(spec, device_pool, device=device, adapter=adapter)

    def pd_registration(self, pool: Any) -> dict[str, tuple[list[int], list[int], list[int]]]:
        """The components sglang's PD registers for ``pool``: its own
        ``get_kv_transfer_buf_infos`` and ``setup_state_kv_args``
        (:mod:`kvcheck.targets.sglang.pd`)."""
        _sglang()
        from kvcheck.targets.sglang.pd import pd_registration

        return pd_registration(pool)

    def hicache_assembly(self, pool: Any, req_to_token_pool: Any = None) -> list[str]:
        """What sglang's HiCache stack strategy for ``pool`` (with a linear hybrid's
        ``req_to_token_pool``) leaves out of the host pool group it assembles
        (:mod:`kvcheck.targets.sglang.hicache_assembly`)."""
        _sglang()
        from kvcheck.targets.sglang.hicache_assembly import hicache_assembly, missing_entries

        entries = hicache_assembly(pool, req_to_token_pool=req_to_token_pool)
        return missing_entries(pool, entries)

    def make_linear_hybrid(self, spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
        """sglang's ``(HybridLinearKVPool, HybridReqToTokenPool)`` for ``spec``
        (:mod:`kvcheck.targets.sglang.linear_hybrid`)."""
        _sglang()
        from kvcheck.targets.sglang.linear_hybrid import build_linear_hybrid

        return build_linear_hybrid(spec, device=device)

    def make_qsa_hybrid(self, spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
        """sglang's ``(QSATokenToKVPool, HybridReqToTokenPool)`` for ``spec``
        (:func:`kvcheck.targets.sglang.linear_hybrid.build_qsa_hybrid`)."""
        _sglang()
        from kvcheck.targets.sglang.linear_hybrid import build_qsa_hybrid

        return build_qsa_hybrid(spec, device=device)

    # --- serving --------------------------------------------------------------------------

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        """sglang's two --prefill-only-disable-kv-cache checks on an unresolved ``ServerArgs``.

        ``validate_prefill_only_disable_kv_cache_args`` runs first, as in sglang's
        pipeline; then the attention backend is resolved the way the pipeline would
        (:func:`.adapt.resolve_attention_backend`) and
        ``handle_prefill_only_disable_kv_cache`` checks it. kvcheck flag names are
        mapped to sglang's (``enable_prefill_context_parallel`` -> ``enable_prefill_cp``).
        """
        hooks = _sglang().kv_cache_hook
        server_args = adapt.sglang_server_args(flags)
        hooks.validate_prefill_only_disable_kv_cache_args(server_args)
        adapt.resolve_attention_backend(server_args, flags)
        hooks.handle_prefill_only_disable_kv_cache(server_args)

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        """The family sglang's ``_init_pools`` builds for ``flags`` and ``model``.

        Runs sglang's ``_validate_prefill_only_disable_kv_cache_pool_family`` (RuntimeError
        for families the flag cannot serve), then follows ``_build_token_to_kv_pool``:
        DSA, else MLA, else SWA / hybrid-linear pools over MHA pools (reported as "mha"),
        else the plain MHA builder, which picks ``NoOpMHATokenToKVPool`` whenever the flag
        is on, draft worker included (MXFP8 first takes its own pool); then sglang's
        closing check that a non-draft worker got the no-op pool. Flags are taken as given
        (not validated).
        """
        sg = _sglang()
        # Publish only what the family decision reads; other flags (attn_cp_size, say) would
        # need a parallel topology that one process cannot publish, and are not consulted.
        server_args = adapt.sglang_server_args(
            {name: flags[name] for name in _FAMILY_FLAGS if name in flags}
        )
        kv_dtype_name = str(flags.get("kv_cache_dtype", "auto"))
        with _published(server_args):
            configurator = adapt.configurator_for(
                model,
                server_args=server_args,
                kv_cache_dtype=adapt.kv_cache_torch_dtype(kv_dtype_name, model),
                kv_cache_dtype_str=kv_dtype_name,
                is_draft=is_draft,
            )
            is_dsa = sg.model_config.is_deepseek_dsa(configurator.model_config.hf_config)
            configurator_class = sg.configurator.KVCacheConfigurator
            configurator_class._validate_prefill_only_disable_kv_cache_pool_family(
                configurator, is_dsa, False, sg.platforms.current_platform
            )
            flag_on = bool(sg.runtime_context.get_schedule().prefill_only_disable_kv_cache)
        family = _built_family(configurator, is_dsa=is_dsa, flag_on=flag_on)
        if flag_on and not is_draft and family != "noop":
            raise RuntimeError(
                f"sglang {self.version} _init_pools: --prefill-only-disable-kv-cache expected "
                f"NoOpMHATokenToKVPool but the runtime pool would be the {family} family "
                f"(kv_cache_dtype={kv_dtype_name!r})"
            )
        return family

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        """Per-token bytes from sglang's pool configurator (``DefaultPoolConfigurator``).

        ``dtype`` is the pool dtype name ("bfloat16", "float8_e4m3fn", ...) or ``"mxfp8"``
        (the configurator is given it as ``kv_cache_dtype_str``, beside its fp8 storage
        dtype). An MXFP8 MHA model is then built as sglang's own MXFP8 pool for one token
        of one layer, as a launch builds it right after sizing: a model whose head dims
        are not whole 32-value blocks is refused there (``ValueError``), not by the
        sizing. FP4 dtypes raise ``NotImplementedError`` (``unsized_kv_cache_dtypes``).
        """
        configurator = self._pool_configurator(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
        return int(configurator._cell_size)

    def _build_mxfp8_pool(self, model: Any, *, size: int) -> Any:
        """sglang's ``MHATokenToKVPoolMXFP8`` of one layer holding ``size`` tokens on CPU,
        for ``model``'s heads; its constructor's ``ValueError`` is sglang's refusal."""
        spec = PoolSpec(
            family="mha",
            size=size,
            page_size=1,
            layer_num=1,
            dtype="float8_e4m3fn",
            head_num=int(model.num_key_value_heads),
            head_dim=int(model.head_dim),
            v_head_dim=int(model.head_dim if model.v_head_dim is None else model.v_head_dim),
        )
        with env.native_kv_move():
            return self.pool_arguments(spec, device="cpu").build(
                _sglang().memory_pool.MHATokenToKVPoolMXFP8
            )

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
        """sglang's ``calculate_pool_sizes(budget_bytes, page_size).max_total_num_tokens``
        (``dtype`` as for :meth:`cell_size_bytes`, with the same refusals)."""
        configurator = self._pool_configurator(
            model, dtype=dtype, is_draft=is_draft, enable_hisparse=enable_hisparse
        )
        with _published(_serving_args(enable_hisparse=enable_hisparse)):
            config = configurator.calculate_pool_sizes(budget_bytes, page_size)
        return int(config.max_total_num_tokens)

    def _pool_configurator(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> Any:
        """sglang's sizing object for ``model`` (``DefaultPoolConfigurator`` and its kin).

        For ``"mxfp8"`` on an MHA model it then builds sglang's MXFP8 pool for one token
        (:meth:`_build_mxfp8_pool`): a launch builds the pool right after sizing it, and
        the pool, not the sizing, refuses head dims that are not whole 32-value blocks.
        """
        unsized = self.unsized_kv_cache_dtypes
        if dtype in unsized:
            raise NotImplementedError(
                f"the sglang target does not size --kv-cache-dtype {dtype}: {unsized[dtype]}"
            )
        sg = _sglang()
        server_args = _serving_args(enable_hisparse=enable_hisparse)
        # A --kv-cache-dtype name reaches sglang's sizing as kv_cache_dtype_str beside the
        # storage dtype it resolves to; a pool dtype name has no such string (None).
        quantized = dtype == "mxfp8"
        kv_cache_dtype = (
            adapt.kv_cache_torch_dtype(dtype, model) if quantized else adapt.pool_dtype(dtype)
        )
        with _published(server_args):
            configurator = adapt.configurator_for(
                model,
                server_args=server_args,
                kv_cache_dtype=kv_cache_dtype,
                kv_cache_dtype_str=dtype if quantized else None,
                is_draft=is_draft,
            )
            sizing = sg.pool_configurator.create_memory_pool_configurator(configurator)
        if quantized and adapt.attention_family(model) == "mha":
            self._build_mxfp8_pool(model, size=1)
        return sizing

    def dsa_layer_skips_topk(self, model: Any, layer_id: int) -> bool:
        """sglang's ``dsa_layer_skips_topk`` on a HuggingFace-style config of ``model``."""
        config = adapt.hf_config_for(model)
        return bool(_sglang().model_config.dsa_layer_skips_topk(config, layer_id))

    def skip_topk_layers(self, model: Any) -> Sequence[bool]:
        """The mask sglang's ``_build_dsa_kv_pool`` passes for a normal (non-draft) worker."""
        sg = _sglang()
        config = adapt.hf_config_for(model)
        with _published(_serving_args(enable_hisparse=False)):
            if not sg.configurator._should_elide_dsa_index_k(is_draft_worker=False):
                return [False] * int(model.num_hidden_layers)
        return [
            bool(sg.model_config.dsa_layer_skips_topk(config, layer_id))
            for layer_id in range(int(model.num_hidden_layers))
        ]


# --- helpers ------------------------------------------------------------------------------


def pool_arguments(spec: PoolSpec, *, device: str) -> PoolArguments:
    """sglang's pool class and constructor arguments for ``spec`` on ``device``.

    What :meth:`SGLangTarget.make_pool` builds inside its scopes (the published parallel
    widths, the HND variable, the native move), and what a reproduction script prints. An
    MHA pool of a quant-method variant (``cpu_fp8``, ``fp4_mx_block16``) gets sglang's
    ``quant_method`` as the call that builds it (:mod:`.quant_methods`), in the pool dtype
    sglang's configurator passes with it (float8_e4m3fn, float4_e2m1fn_x2).

    Example:
        >>> spec = PoolSpec(family="mha", size=8, page_size=4, layer_num=2, dtype="bfloat16")
        >>> args = pool_arguments(spec, device="cpu")  # no sglang import
        >>> args.class_name, args.kwargs["end_layer"], args.kwargs["enable_kv_cache_copy"]
        ('MHATokenToKVPool', 2, False)
    """
    if not isinstance(spec, PoolSpec):
        raise ValueError(f"spec={spec!r} is not a kvcheck.specs.PoolSpec")
    if spec.family not in POOL_FAMILIES:
        raise ValueError(f"spec.family={spec.family!r} not in {POOL_FAMILIES}")
    kwargs: dict[str, Any] = {
        "size": spec.size,
        "page_size": spec.page_size,
        "dtype": adapt.pool_dtype(spec.dtype),
        "layer_num": spec.layer_num,
        "device": device,
        "enable_memory_saver": False,
        "start_layer": spec.start_layer,
        "end_layer": spec.start_layer + spec.layer_num,
    }
    if spec.family in ("mha", "noop"):
        name = "MHATokenToKVPool" if spec.family == "mha" else "NoOpMHATokenToKVPool"
        kwargs.update(
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            v_head_dim=spec.v_head_dim,
            enable_kv_cache_copy=_is_cuda(device),
        )
        quant_method = quant_method_call(spec, device=device)
        if quant_method is not None:
            kwargs["quant_method"] = quant_method
        if spec.kv_quant == "mxfp8":
            name = "MHATokenToKVPoolMXFP8"  # its own class; the configurator passes no method
        return PoolArguments(f"{_MEMORY_POOL}:{name}", kwargs)
    kwargs.update(kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim)
    if spec.family == "mla":
        name = "MLATokenToKVPoolFP4" if spec.kv_quant == "fp4" else "MLATokenToKVPool"
        return PoolArguments(f"{_MEMORY_POOL}:{name}", kwargs)
    kwargs.update(
        index_head_dim=spec.index_head_dim,
        kv_cache_dim=_kv_cache_dim(spec),
        index_buf_size=spec.index_buf_size,
        # The mask sglang's configurator builds: one entry per layer.
        skip_topk_layers=list(spec.skip_mask),
        index_kpool=spec.index_kpool,
        index_kpool_compress=spec.index_kpool_compress,
        tail_extra_slots=spec.tail_extra_slots,
        max_running_requests=spec.max_running_requests,
    )
    return PoolArguments(f"{_MEMORY_POOL}:DSATokenToKVPool", kwargs)


def _kv_cache_dim(spec: PoolSpec) -> int:
    """sglang's ``kv_cache_dim`` (elements of its store dtype, bytes for fp8) for ``spec``."""
    return latent_row_bytes(spec) if spec.latent_layout == "scaled" else latent_width(spec)


def _refuse_zero_row_index_write(pool: Any, layer_id: int) -> None:
    """Stop an index-K write that sglang would launch into a skip layer's zero-row buffer.

    sglang does not check this (docs/sglang-findings-appendix.md#i10); its kernel has no
    bounds check, so the launch writes through the empty buffer's null pointer. The error is an
    ``IndexError``, as the CPU kernel body raises, so the finding stays visible.
    """
    getter = getattr(pool, "get_index_k_with_scale_buffer", None)
    try:
        rows = int(getter(layer_id).shape[0]) if callable(getter) else None
    except Exception:  # a bad layer id: let sglang's own call report it
        return
    if rows == 0:
        raise IndexError(
            f"index-K write to layer {layer_id}, whose index-K buffer has 0 rows (a skip "
            "layer); kvcheck's sglang adapter refused to launch sglang's kernel into it"
        )


def _serving_args(*, enable_hisparse: bool) -> Any:
    return adapt.sglang_server_args({"enable_hisparse": enable_hisparse})


@contextmanager
def _published(server_args: Any) -> Iterator[Any]:
    """Run the block with ``server_args`` published in sglang's runtime context.

    sglang's configurator reads published config namespaces (``get_schedule()``,
    ``get_memory()``, ...). Where the release has them (0.5.22 on), ``create_context`` builds
    a context without touching the process-wide one and ``use_context`` activates it for the
    block only. Otherwise (0.5.21) the process-wide context is saved
    (``snapshot_context``), ``publish`` fills it, and ``restore_context`` puts it back, as
    sglang's launcher does after a failed launch.
    """
    runtime = _sglang().runtime_context
    if _facts().private_context:
        context = runtime.create_context(server_args, role="test")
        with runtime.use_context(context):
            yield context
        return
    state = runtime.snapshot_context()
    try:
        yield runtime.publish(server_args, role="test")
    finally:
        runtime.restore_context(state)


@contextmanager
def _latent_pool_scope(
    *, cpu: bool, modules: SimpleNamespace, dcp_size: int, dcp_rank: int
) -> Iterator[None]:
    """What one MLA/DSA pool call needs: the pool's parallel widths (its DCP rank); on
    CPU, CUDA sync and the CPU bodies of the kernels the release has (``modules``: the
    loaded pieces, ``None`` where the release lacks one)."""
    with ExitStack() as stack:
        stack.enter_context(env.dcp_parallel(dcp_size, dcp_rank))
        if cpu:
            stack.enter_context(env.cpu_cuda_synchronize())
            for stand_in, module in (
                (env.cpu_index_k_kernel, modules.index_k_kernels),
                (env.cpu_mla_read_kernels, modules.mla_buffer),
                (env.cpu_mla_write_kernels, modules.mla_set_path),
                (env.cpu_dsa_quantize_kernel, modules.dsa_quant_kernels),
                (env.cpu_mla_scale_kernel, modules.mla_fp4_scale_kernel),
            ):
                if module is not None:
                    stack.enter_context(stand_in(module))
        yield


@contextmanager
def _mxfp8_pool_scope(*, modules: SimpleNamespace, store_cache: bool) -> Iterator[None]:
    """What one MXFP8 pool call needs on CPU: the CPU bodies of the two Triton kernels
    (``modules``: the loaded pieces) and, for a write (``store_cache``), of the CUDA
    ``store_cache`` behind its CUDA guard."""
    with ExitStack() as stack:
        if store_cache:
            stack.enter_context(mxfp8_kernels.cpu_store_cache(modules.memory_pool))
        for stand_in, module in (
            (mxfp8_kernels.cpu_mxfp8_interleave_kernel, modules.mxfp8_interleave),
            (mxfp8_kernels.cpu_mxfp8_quant_store_kernel, modules.mxfp8_quant_store),
        ):
            if module is not None:
                stack.enter_context(stand_in(module))
        yield


def _run_methods_in_scope(
    pool: Any, names: Sequence[str], scope: Callable[[], AbstractContextManager[None]]
) -> None:
    """Make each named method of ``pool`` (this instance only) run inside ``scope()``."""
    for name in names:
        method = getattr(type(pool), name, None)
        if method is None:
            continue

        @functools.wraps(method)
        def scoped(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            with scope():
                return _method(pool, *args, **kwargs)

        setattr(pool, name, scoped)


def _built_family(configurator: Any, *, is_dsa: bool, flag_on: bool) -> str:
    """Which of kvcheck's families sglang's ``_build_token_to_kv_pool`` dispatch lands on."""
    if configurator.use_mla_backend:
        return "dsa" if is_dsa else "mla"
    if configurator.is_hybrid_swa or configurator.mambaish_config is not None:
        return "mha"  # SWAKVPool / HybridLinearKVPool over MHA pools; never the no-op pool
    if configurator.kv_cache_dtype_str == "mxfp8":
        return "mha"  # MHATokenToKVPoolMXFP8: chosen before the no-op pool is considered
    return "noop" if flag_on else "mha"
