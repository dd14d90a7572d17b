"""The built-in target ``kvcheck``: this package's own pools and serving layer.

torch, :mod:`kvcheck.pools` and :mod:`kvcheck.serving` are imported when a method first
needs them, so resolving the target (which the pytest plugin does for every run, to
print its name and version) stays cheap.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> target = KVCheckTarget()
    >>> pool = target.make_pool(PoolSpec(family="mha", size=8, page_size=4, layer_num=2,
    ...                                  dtype="bfloat16"), device="cpu")
    >>> type(pool).__name__, len(pool.k_buffer)
    ('MHATokenToKVPool', 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import kvcheck
from kvcheck.specs import POOL_FAMILIES, LinearHybridSpec, PoolSpec, SWAPoolSpec
from kvcheck.surface import Surface
from kvcheck.targets.base import PoolArguments, ScriptRecipe, swa_pool_arguments
from kvcheck.tiers import ALLOCATOR_KINDS, HOST_LAYOUTS, AllocatorSpec, HostPoolSpec

#: Pool class name -> family, most specific first (NoOp derives from MHA, DSA from MLA).
_FAMILY_OF_CLASS: tuple[tuple[str, str], ...] = (
    ("NoOpMHATokenToKVPool", "noop"),
    ("DSATokenToKVPool", "dsa"),
    ("MLATokenToKVPool", "mla"),
    ("MHATokenToKVPool", "mha"),
)

#: PoolSpec.kv_quant -> the quant method of kvcheck's QuantizedMHATokenToKVPool (SGLang's names).
_QUANT_METHODS: Mapping[str, str] = MappingProxyType(
    {"cpu_fp8": "cpu_fp8_e4m3", "fp4_mx_block16": "fp4_mx_block16", "nvfp4": "nvfp4"}
)

#: Small pool used to ask pool selection which family it picks (built on "meta": no memory).
_PROBE_TOKENS = 64
_PROBE_PAGE_SIZE = 64


class KVCheckTarget:
    """kvcheck's own pools (:mod:`kvcheck.pools`) and serving rules (:mod:`kvcheck.serving`).

    Subclass it to check a variant: override :meth:`make_pool` (and ``name``/``version``)
    and keep the serving side, as ``examples/downstream`` does; declare the ``surface`` your
    pools build when it is narrower than kvcheck's.
    """

    name: str = "kvcheck"
    version: str = kvcheck.__version__
    unsupported: Mapping[str, str] = MappingProxyType({})
    #: Every family and every variant kvcheck models; a subclass inherits it unless it
    #: declares its own (``surface = KVCheckTarget.surface.replace(dsa=None)``, say).
    surface: Surface = Surface.everything().with_tiers(
        allocators=ALLOCATOR_KINDS, host_layouts=HOST_LAYOUTS
    )

    #: The linear-attention hybrid's classes (``None``: kvcheck's own); twins swap one.
    linear_kv_pool_cls: Any = None
    linear_req_pool_cls: Any = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, version={self.version!r})"

    # --- pools ----------------------------------------------------------------------------

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """Build the pool ``spec`` describes on ``device`` ("cpu", "cuda:0", "meta", ...)."""
        return self.pool_arguments(spec, device=device).build()

    def pool_arguments(self, spec: PoolSpec, *, device: str) -> PoolArguments:
        """The kvcheck pool class and constructor arguments for ``spec`` on ``device``.

        Only what differs from the pools' defaults for the spec's family and variant is
        passed (no ``kv_layout`` for NHD, no DCP fields for one rank), so a printed call
        stays short; the built pool is the same either way.

        Example:
            >>> args = KVCheckTarget().pool_arguments(
            ...     PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16"),
            ...     device="cpu")
            >>> args.pool_class, sorted(args.kwargs)[:3]
            ('kvcheck.pools:MLATokenToKVPool', ['device', 'dtype', 'kv_lora_rank'])
        """
        if not isinstance(spec, PoolSpec):
            raise ValueError(f"spec={spec!r} is not a kvcheck.specs.PoolSpec")
        if spec.family not in POOL_FAMILIES:
            raise ValueError(f"spec.family={spec.family!r} not in {POOL_FAMILIES}")
        import torch

        from kvcheck.geometry import latent_row_bytes

        dtype = getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"spec.dtype={spec.dtype!r} is not a torch dtype name")
        kwargs: dict[str, Any] = {
            "size": spec.size,
            "page_size": spec.page_size,
            "dtype": dtype,
            "layer_num": spec.layer_num,
            "device": device,
            "start_layer": spec.start_layer,
        }
        if spec.family in ("mha", "noop"):
            kwargs.update(
                head_num=spec.head_num, head_dim=spec.head_dim, v_head_dim=spec.v_head_dim
            )
            if spec.kv_layout != "nhd":
                kwargs["kv_layout"] = spec.kv_layout
            if not spec.kv_page_padding:
                kwargs["kv_page_padding"] = False
            name = "MHATokenToKVPool" if spec.family == "mha" else "NoOpMHATokenToKVPool"
            if spec.kv_quant == "mxfp8":
                name = "MHATokenToKVPoolMXFP8"
            elif spec.quantized:
                name = "QuantizedMHATokenToKVPool"
                kwargs["quant_method"] = _QUANT_METHODS[spec.kv_quant]
                if spec.kv_quant == "nvfp4":
                    kwargs["nvfp4_layout"] = spec.nvfp4_layout
            return PoolArguments(f"kvcheck.pools:{name}", kwargs)
        kwargs.update(kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim)
        if spec.kv_quant == "fp4":
            return PoolArguments("kvcheck.pools:MLATokenToKVPoolFP4", kwargs)
        if spec.dcp_size > 1:
            kwargs.update(dcp_size=spec.dcp_size, dcp_rank=spec.dcp_rank)
        if spec.family == "mla":
            return PoolArguments("kvcheck.pools:MLATokenToKVPool", kwargs)
        kwargs.update(
            index_head_dim=spec.index_head_dim,
            skip_topk_layers=(
                None if spec.skip_topk_layers is None else list(spec.skip_topk_layers)
            ),
            index_buf_size=spec.index_buf_size,
        )
        if spec.latent_layout != "raw":
            kwargs["kv_cache_dim"] = latent_row_bytes(spec)
        if spec.index_kpool != 1:
            kwargs.update(
                index_kpool=spec.index_kpool,
                index_kpool_compress=spec.index_kpool_compress,
                tail_extra_slots=spec.tail_extra_slots,
                max_running_requests=spec.max_running_requests,
            )
        return PoolArguments("kvcheck.pools:DSATokenToKVPool", kwargs)

    def script_recipe(self, spec: PoolSpec, ops: Sequence[Any] = ()) -> ScriptRecipe | None:
        """A reproduction script builds the pool from :meth:`pool_arguments` itself, unless a
        subclass builds its pools in its own ``make_pool`` (then the script calls that).

        Example:
            >>> spec = PoolSpec(family="mha", size=8, page_size=4, layer_num=1, dtype="bfloat16")
            >>> KVCheckTarget().script_recipe(spec).target_imports
            ('from kvcheck.pools import MHATokenToKVPool',)
        """
        if type(self).make_pool is not KVCheckTarget.make_pool:
            return None
        arguments = self.pool_arguments(spec, device="cpu")
        package = arguments.module.partition(".")[0]
        return ScriptRecipe(
            needs=f"torch and {package} (its pools)",
            imports=(),
            # A subclass may name a pool class of its own module.
            target_imports=(f"from {arguments.module} import {arguments.class_name}",),
            build=tuple(arguments.call_source("pool").splitlines()),
        )

    # --- sliding-window hybrid pools ---------------------------------------------------------

    def make_swa_pool(self, spec: SWAPoolSpec, *, device: str) -> Any:
        """kvcheck's :class:`~kvcheck.pools.swa.SWAKVPool` for ``spec``: each side is the pool
        :meth:`pool_arguments` gives for it (its class and arguments, less the size, dtype and
        layer count the hybrid passes itself).

        Example:
            >>> spec = SWAPoolSpec(PoolSpec(family="mla", size=4, page_size=1, layer_num=2,
            ...                             dtype="bfloat16"), size_swa=2,
            ...                    swa_layers=(False, True))
            >>> pool = KVCheckTarget().make_swa_pool(spec, device="cpu")
            >>> type(pool.swa_kv_pool).__name__, pool.swa_kv_pool.size
            ('MLATokenToKVPool', 2)
        """
        if not isinstance(spec, SWAPoolSpec):
            raise ValueError(f"spec={spec!r} is not a kvcheck.specs.SWAPoolSpec")
        from kvcheck.pools.swa import SWAKVPool

        full = self.pool_arguments(spec.full_spec, device=device)
        swa = self.pool_arguments(spec.swa_spec, device=device)
        return SWAKVPool(**swa_pool_arguments(full, swa, spec, device=device))

    def swa_write_loc(self, loc: Any, swa_loc: Any) -> Any:
        """What a hybrid pool's ``set_kv_buffer`` takes as its location: the full-side
        ``loc`` and its translation ``swa_loc`` (SGLang's ``KVWriteLoc``)."""
        from kvcheck.pools.swa import SWAWriteLoc

        return SWAWriteLoc(loc, swa_loc)

    # --- allocators and host pools (kvcheck.targets.tier_support) -------------------------------

    def make_allocator(self, spec: AllocatorSpec, *, device: str, kvcache: Any = None) -> Any:
        """kvcheck's allocator of ``spec.kind`` (:mod:`kvcheck.allocators`)."""
        import torch

        from kvcheck import allocators

        if spec.kind == "token":
            return allocators.TokenToKVPoolAllocator(
                spec.size, torch.bfloat16, device, kvcache, spec.need_sort
            )
        if spec.kind == "paged":
            return allocators.PagedTokenToKVPoolAllocator(
                spec.size, spec.page_size, torch.bfloat16, device, kvcache, spec.need_sort
            )
        if spec.kind == "pure_swa":
            return allocators.PureSWATokenToKVPoolAllocator(
                spec.size, spec.page_size, torch.bfloat16, device, kvcache, spec.need_sort
            )
        return allocators.SWATokenToKVPoolAllocator(
            spec.size,
            spec.size_swa,
            spec.page_size,
            torch.bfloat16,
            device,
            kvcache,
            spec.need_sort,
        )

    def make_host_pool(
        self, spec: HostPoolSpec, device_pool: Any, *, device: str
    ) -> tuple[Any, ...]:
        """kvcheck's host tier for ``device_pool`` (:mod:`kvcheck.host_pools`): the MHA or MLA
        host pool of its main buffers (and of a quantized pool's scale buffers, which travel
        with their payload) and, when the pool has other per-layer buffers (a DSA pool's
        index-K pages), a :class:`DSAIndexerPoolHost` for them."""
        from kvcheck import host_pools

        main = ("k_buffer", "v_buffer") if spec.kind == "mha" else ("kv_buffer",)
        cls = (
            host_pools.MHATokenToKVPoolHost
            if spec.kind == "mha"
            else host_pools.MLATokenToKVPoolHost
        )
        anchor = cls(
            device_pool, 2.0, 0, spec.page_size, spec.layout, host_token_capacity=spec.host_size
        )
        kept = {*main, *host_pools.scale_buffer_names(device_pool)}
        others = tuple(name for name in _layer_buffers(device_pool) if name not in kept)
        if not others:
            return (anchor,)
        return (anchor, host_pools.DSAIndexerPoolHost(device_pool, anchor, buffer_names=others))

    def pd_registration(self, pool: Any) -> dict[str, tuple[list[int], list[int], list[int]]]:
        """What kvcheck's PD registers for ``pool``: its contiguous KV description as
        ``"kv"``, and every other transfer description it offers (``get_*buf_infos``) as a
        state component of that name: kvcheck's pools keep nothing a description leaves out.

        Example:
            >>> import torch
            >>> from kvcheck.pools import MHATokenToKVPool
            >>> pool = MHATokenToKVPool(size=4, page_size=2, dtype=torch.float16, head_num=1,
            ...                         head_dim=2, layer_num=1, device="cpu")
            >>> list(KVCheckTarget().pd_registration(pool))
            ['kv']
        """
        from kvcheck.census.descriptions import description_methods

        components = {"kv": pool.get_contiguous_buf_infos()}
        for name in description_methods(pool):
            if name != "get_contiguous_buf_infos":
                with contextlib.suppress(AttributeError):  # a side without that description
                    components[f"state:{name}"] = getattr(pool, name)()
        return components

    def make_linear_hybrid(self, spec: LinearHybridSpec, *, device: str) -> tuple[Any, Any]:
        """kvcheck's linear-attention hybrid for ``spec``: ``(kv_pool, req_to_token_pool)``,
        a :class:`~kvcheck.pools.hybrid_linear.HybridLinearKVPool` over the mamba pool of a
        :class:`~kvcheck.pools.mamba.HybridReqToTokenPool` (a subclass swaps either class
        through ``linear_kv_pool_cls`` / ``linear_req_pool_cls``).

        Example:
            >>> kv_pool, req_pool = KVCheckTarget().make_linear_hybrid(
            ...     LinearHybridSpec(full_layer_ids=(1,), mamba_layer_ids=(0, 2)), device="cpu")
            >>> kv_pool.mamba_pool is req_pool.mamba_pool, req_pool.mamba_map
            (True, {0: 0, 2: 1})
        """
        import torch

        from kvcheck.pools.hybrid_linear import HybridLinearKVPool
        from kvcheck.pools.mamba import HybridReqToTokenPool

        req_cls = self.linear_req_pool_cls or HybridReqToTokenPool
        kv_cls = self.linear_kv_pool_cls or HybridLinearKVPool
        req_pool = req_cls(
            size=spec.rows,
            max_context_len=spec.max_context_len,
            device=device,
            mamba_size=spec.mamba_size,
            conv_shapes=spec.conv_shapes,
            temporal_shape=spec.temporal_shape,
            mamba_layer_ids=spec.mamba_layer_ids,
            speculative_num_draft_tokens=spec.draft_tokens,
        )
        kv_pool = kv_cls(
            size=spec.size,
            dtype=torch.float32,
            page_size=spec.page_size,
            head_num=spec.head_num,
            head_dim=spec.head_dim,
            full_attention_layer_ids=spec.full_layer_ids,
            device=device,
            mamba_pool=req_pool.mamba_pool,
        )
        return kv_pool, req_pool

    def write_index_k(
        self, pool: Any, layer_id: int, loc: Any, index_k: Any, index_k_scale: Any
    ) -> None:
        """DSA index-K write through ``pool.set_index_k_scale_buffer``."""
        pool.set_index_k_scale_buffer(layer_id, loc, index_k, index_k_scale)

    # --- serving --------------------------------------------------------------------------

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        """Build ``ServerArgs(**flags)``, which resolves defaults and applies the flag rules."""
        from kvcheck.serving import ServerArgs

        ServerArgs(**_checked_flags(flags))

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        """Run pool selection on ``meta`` and report the family of the pool it builds.

        The flags are taken as given (``ServerArgs.unchecked``): validation is
        :meth:`validate_server_args`' job, so each property checks one rule set.
        """
        from kvcheck.serving import ServerArgs, select_kv_pool

        server_args = ServerArgs.unchecked(**_checked_flags(flags))
        pool = select_kv_pool(
            server_args,
            model,
            max_total_num_tokens=_PROBE_TOKENS,
            page_size=_PROBE_PAGE_SIZE,
            dtype="bfloat16",
            device="meta",
            is_draft_worker=is_draft,
        )
        return pool_family(pool)

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        """Bytes one token costs across all layers (:func:`kvcheck.serving.cell_size_bytes`)."""
        from kvcheck.serving import cell_size_bytes

        return cell_size_bytes(
            model, dtype=dtype, is_draft_worker=is_draft, enable_hisparse=enable_hisparse
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
        """Token capacity of a budget (:func:`kvcheck.serving.max_total_num_tokens`)."""
        from kvcheck.serving import max_total_num_tokens

        return max_total_num_tokens(
            model,
            budget_bytes=budget_bytes,
            dtype=dtype,
            page_size=page_size,
            is_draft_worker=is_draft,
            enable_hisparse=enable_hisparse,
        )

    def dsa_layer_skips_topk(self, model: Any, layer_id: int) -> bool:
        """Whether DSA layer ``layer_id`` reuses the previous layer's top-k."""
        from kvcheck.serving import dsa_layer_skips_topk

        return dsa_layer_skips_topk(model, layer_id)

    def skip_topk_layers(self, model: Any) -> Sequence[bool]:
        """The skip mask a DSA pool for ``model`` is built with (a normal worker)."""
        from kvcheck.serving import skip_topk_layers

        return skip_topk_layers(model)


def pool_family(pool: Any) -> str:
    """The family ("mha", "noop", "mla", "dsa") of a kvcheck pool, by its class.

    Example:
        >>> class NoOpMHATokenToKVPool: ...
        >>> pool_family(NoOpMHATokenToKVPool())
        'noop'
    """
    names = {cls.__name__ for cls in type(pool).__mro__}
    for class_name, family in _FAMILY_OF_CLASS:
        if class_name in names:
            return family
    raise ValueError(f"pool={pool!r} is not one of kvcheck's pool families {POOL_FAMILIES}")


def _layer_buffers(pool: Any) -> list[str]:
    """The public per-layer buffers of a kvcheck pool (``*_buffer`` lists of tensors, one per
    layer): what its host tier mirrors, whatever the variant adds."""
    import torch

    names = []
    for name, value in vars(pool).items():
        if name.startswith("_") or not name.endswith("_buffer") or not isinstance(value, list):
            continue
        if len(value) == pool.layer_num and all(isinstance(t, torch.Tensor) for t in value):
            names.append(name)
    return names


def _checked_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Unknown flag names are bad input (ValueError), not the TypeError a dataclass raises."""
    from kvcheck.serving import ServerArgs

    if not isinstance(flags, Mapping):
        raise ValueError(f"flags={flags!r} must be a mapping of ServerArgs field names to values")
    known = {f.name for f in dataclasses.fields(ServerArgs)}
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ValueError(f"flags: {unknown} are not ServerArgs fields; known: {sorted(known)}")
    return dict(flags)
