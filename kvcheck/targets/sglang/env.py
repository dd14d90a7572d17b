"""Scoped workarounds that let sglang's real pools run outside an sglang server.

sglang expects a process that its launcher prepared: a GPU, a loadable ``torchvision``,
published parallel widths and Triton kernels. kvcheck checks sglang's pool code on a
plain CPU machine, so each gap is bridged here by a context manager that restores
exactly what it changed when the block ends. The one exception is an exit hook that keeps
a library sglang loads from crashing the interpreter at shutdown
(:func:`guard_swig_exit_warning`). Nothing in this module imports sglang at module import
time; each helper imports what it needs when it runs, or patches the module it is given
(sglang moves its kernels between modules from release to release: the target finds them
through the pool code that uses them, see :mod:`.release`).

Example, where sglang is installed::

    with torchvision_stand_in():
        import sglang.srt.mem_cache.memory_pool
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import torch

TORCHVISION = "torchvision"

#: Environment variable that makes sglang's MHA pool move K/V with plain tensor
#: indexing instead of its Triton copy kernel (read once, in the pool constructor).
NATIVE_MOVE_ENV = "SGLANG_NATIVE_MOVE_KV_CACHE"
HND_LAYOUT_ENV = "SGLANG_USE_HND_KVCACHE"

#: The stand-ins that change which path sglang takes, not only a kernel's body: name -> the
#: switch, the path sglang takes without it, and the path that runs instead. Every other
#: stand-in of the target replaces kernel callables (and, where sglang guards a GPU-only
#: kernel, answers the guard as a GPU server would) and sets no sglang environment switch;
#: tests/targets/test_sglang_stand_in_dispatch.py checks both. A path change is reported with
#: the target's CPU notes ("move") and in the findings document's stand-in table.
PATH_CHANGES: Mapping[str, str] = MappingProxyType(
    {
        "native_kv_move": (
            f"{NATIVE_MOVE_ENV}=1 while CPU MHA pools are built: move_kv_cache runs sglang's "
            "torch move (move_kv_cache_native). Without it a pool built as with speculative "
            "decoding (enable_kv_cache_copy=True) moves K/V with the Triton kernel "
            "copy_all_layer_kv_cache_tiled, and one built without asserts 'KV copy not "
            "initialized'. On the flat-scale MXFP8 pool the two paths fail differently: "
            "AttributeError (native_k_scale_buffer) after the Triton copy, NotImplementedError "
            "(index_put on float8_e8m0fnu) on the torch move (docs/sglang-repros/q15.py)"
        ),
    }
)
#: Switches a spec selects (a layout sglang offers on every device), not a CPU workaround.
SPEC_SWITCHES: Mapping[str, str] = MappingProxyType({"hnd_kv_layout": HND_LAYOUT_ENV})


#: Parallel widths for one process serving every attention head: what sglang's
#: launcher publishes for a single-GPU server without decode context parallelism.
def dcp_parallel_widths(dcp_size: int, dcp_rank: int) -> dict[str, Any]:
    """The parallel fields sglang's MLA/DSA pools read, for one rank of ``dcp_size``
    (1: a single-GPU server; the unprefixed ``dcp_*`` fields are set alike, as sglang's
    publish step derives them)."""
    return {
        "attn_dcp_size": dcp_size,
        "dcp_size": dcp_size,
        "dcp_enabled": dcp_size > 1,
        "attn_dcp_rank": dcp_rank,
        "dcp_rank": dcp_rank,
    }


class TorchvisionStandInError(RuntimeError):
    """Raised when sglang code actually uses the torchvision stand-in."""


class _TorchvisionStandIn(types.ModuleType):
    """A module whose every attribute is another stand-in and which raises when called.

    sglang's config package imports ``torchvision.transforms`` (and names such as
    ``InterpolationMode``) at module level for image models that kvcheck never builds.
    The stand-in satisfies those imports; any real use fails loudly instead of
    silently computing something.
    """

    def __getattr__(self, name: str) -> _TorchvisionStandIn:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _TorchvisionStandIn(f"{self.__name__}.{name}")
        setattr(self, name, child)  # one object per dotted name, like a real module
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise TorchvisionStandInError(
            f"{self.__name__} was called, but torchvision is kvcheck's import-time "
            "stand-in: the installed torchvision does not load beside this torch. "
            "Install a torchvision built for this torch to use image code."
        )

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # A class body that subclasses a torchvision type gets a plain base instead.
        return (object,)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchvision`` and every ``torchvision.*`` submodule with stand-ins."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TORCHVISION and not fullname.startswith(TORCHVISION + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _TorchvisionStandIn(spec.name)
        module.__path__ = []  # a package, so submodule imports reach this finder
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: attributes are created on first access."""


def real_torchvision_loads() -> bool:
    """Whether ``import torchvision`` succeeds in this process (imports it if so).

    A failed attempt leaves no half-imported ``torchvision`` modules behind.

    Example:
        >>> isinstance(real_torchvision_loads(), bool)
        True
    """
    loaded = sys.modules.get(TORCHVISION)
    if loaded is not None:
        return not isinstance(loaded, _TorchvisionStandIn)
    if importlib.util.find_spec(TORCHVISION) is None:
        return False
    try:
        importlib.import_module(TORCHVISION)
    except Exception:  # a CUDA-only or mismatched build fails in many ways
        _drop_modules(lambda name, module: _is_torchvision_name(name))
        return False
    return True


def _is_torchvision_name(name: str) -> bool:
    return name == TORCHVISION or name.startswith(TORCHVISION + ".")


def _drop_modules(predicate: Any) -> None:
    for name, module in list(sys.modules.items()):
        if predicate(name, module):
            del sys.modules[name]


def _settle_torchvision_probes() -> None:
    """Let transformers record, before the stand-in exists, that torchvision is absent.

    transformers caches ``is_torchvision_available()`` for the life of the process and
    decides it with ``importlib.util.find_spec``, which would see the stand-in. Asking
    first caches the true answer, so no transformers code, now or after the block,
    mistakes the stand-in for a usable torchvision.
    """
    try:
        from transformers.utils import import_utils
    except Exception:  # transformers absent or broken: nothing to settle
        return
    for probe_name in ("is_torchvision_available", "is_torchvision_v2_available"):
        probe = getattr(import_utils, probe_name, None)
        if callable(probe):
            probe()


@contextmanager
def torchvision_stand_in() -> Iterator[bool]:
    """Let ``import torchvision...`` succeed inside the block when the real one cannot load.

    Yields True when the stand-in is active. On exit the import hook and every stand-in
    module are removed from ``sys.modules``; modules imported inside the block keep
    the stand-in objects they bound, which raise :class:`TorchvisionStandInError` if
    called. When the real torchvision loads, nothing is changed.

    Example:
        >>> with torchvision_stand_in() as active:
        ...     import torchvision.transforms as T
        >>> active == ("torchvision" not in sys.modules)
        True
    """
    if real_torchvision_loads():
        yield False
        return
    _settle_torchvision_probes()
    finder = _StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield True
    finally:
        sys.meta_path.remove(finder)
        _drop_modules(lambda name, module: isinstance(module, _TorchvisionStandIn))


@contextmanager
def scoped_environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block and restore the previous state on exit.

    Example:
        >>> with scoped_environ(KVCHECK_EXAMPLE="1"):
        ...     os.environ["KVCHECK_EXAMPLE"]
        '1'
        >>> "KVCHECK_EXAMPLE" in os.environ
        False
    """
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def native_kv_move() -> Iterator[None]:
    """Build MHA pools that move K/V with tensor indexing (sglang's torch move).

    A path change, not a kernel body (see :data:`PATH_CHANGES`): sglang's default move is a
    Triton kernel that needs a GPU and ``enable_kv_cache_copy=True``; the pool reads
    ``SGLANG_NATIVE_MOVE_KV_CACHE`` once, in its constructor, so the variable is set only
    while pools are constructed.
    """
    with scoped_environ(**{NATIVE_MOVE_ENV: "1"}):
        yield


@contextmanager
def hnd_kv_layout() -> Iterator[None]:
    """Build MHA pools in the head-major HND layout (``[pages, heads, page_size, dim]``),
    which sglang selects from ``SGLANG_USE_HND_KVCACHE`` in the pool's constructor."""
    with scoped_environ(**{HND_LAYOUT_ENV: "1"}):
        yield


@contextmanager
def dcp_parallel(dcp_size: int = 1, dcp_rank: int = 0) -> Iterator[None]:
    """Give sglang's MLA/DSA code the parallel widths of rank ``dcp_rank`` of a server
    with ``--dcp-size dcp_size`` (the defaults: a single-GPU server).

    The MLA and DSA pools read ``attn_dcp_size``, ``dcp_enabled`` and ``attn_dcp_rank``
    from sglang's runtime context, which only a launched server publishes. sglang's
    own scoped override supplies them and is undone on exit.
    """
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(**dcp_parallel_widths(dcp_size, dcp_rank)):
        yield


@contextmanager
def cpu_kvcacheio(*buffers: Any) -> Iterator[None]:
    """Give sglang's host pools (``pool_host.mha``, ``.mla``, ``.dsa``) CPU bodies of the
    ``sgl_kernel.kvcacheio`` transfer ops they call, resolving raw addresses inside
    ``buffers`` (the device pool's and the host pool's tensors), for the block only.

    On CPU sglang imports none of the ops (``sgl_kernel`` is CUDA/HIP only), so its host
    transfers raise ``NameError``; the bodies transcribe sgl-kernel's (see
    :mod:`kvcheck.targets.sglang.kvcacheio`). Where CUDA is available nothing is patched.
    """
    if torch.cuda.is_available():
        yield
        return
    from kvcheck.targets.sglang import kvcacheio

    modules = [importlib.import_module(name) for name in kvcacheio.HOST_POOL_MODULES]
    with kvcacheio.installed(modules, *buffers):
        yield


@contextmanager
def cpu_hicache_jit(*buffers: Any) -> Iterator[None]:
    """Give sglang's MXFP8 host pool (and the MHA host pool it runs through) CPU bodies of
    the JIT HiCache transfer kernels and their ``can_use_*`` probes, and let it take its
    CUDA branch, resolving raw addresses inside ``buffers``, for the block only.

    Without it, on CPU ``MHATokenToKVPoolMXFP8Host`` refuses to be built
    (``NotImplementedError``: it needs the staged JIT write-back kernel, CUDA or HIP). The
    bodies transcribe the kernels (see :mod:`kvcheck.targets.sglang.hicache_jit`). Where CUDA
    is available nothing is patched.
    """
    from kvcheck.targets.sglang import hicache_jit

    with hicache_jit.cpu_hicache_jit(*buffers):
        yield


def _no_cuda_synchronize(device: int | str | torch.device | None = None) -> None:
    """Stands in for ``torch.cuda.synchronize`` on CPU, where there is nothing to wait for."""


@contextmanager
def cpu_cuda_synchronize() -> Iterator[None]:
    """Make ``torch.cuda.synchronize()`` a no-op inside the block on a CPU-only torch.

    sglang's DSA host copies call ``torch.cuda.synchronize()`` unconditionally, which
    raises on a torch built without CUDA. CPU work is synchronous, so skipping the
    call changes no result. Where CUDA is available nothing is patched.
    """
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = _no_cuda_synchronize
    try:
        yield
    finally:
        torch.cuda.synchronize = original


#: The Triton kernel behind ``DSATokenToKVPool.set_index_k_scale_buffer`` (0.5.23 keeps it in
#: ``sglang.kernels.ops.kvcache.dsa_index_k_cache``, 0.5.21 and 0.5.22 in
#: ``sglang.kernels.ops.attention.dsa.index_buf_accessor``).
INDEX_K_KERNEL_NAME = "_set_k_and_s_triton_kernel"


class _CpuIndexKKernel:
    """CPU body of sglang's ``_set_k_and_s_triton_kernel``, launched as ``kernel[grid](...)``.

    Follows the byte layout that kernel documents (and that kvcheck's pool contract
    states): token ``loc`` lives in page ``loc // PAGE_SIZE`` at offset
    ``o = loc % PAGE_SIZE``; its fp8 key fills bytes ``[o*K, (o+1)*K)`` of the page row and
    its fp32 scale the 4 bytes at ``S_OFFSET + 4*o``. One difference is unavoidable: a
    location outside the buffer raises ``IndexError`` here, where the GPU kernel, which
    has no bounds check, writes outside the allocation.
    """

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    @staticmethod
    def _launch(
        buf_fp8: torch.Tensor,
        buf_fp32: torch.Tensor,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
        index_k_row_stride: int,
        *,
        PAGE_SIZE: int,
        BUF_NUMEL_PER_PAGE: int,
        NUM_K_ELEMS_PER_TOKEN: int,
        S_OFFSET_NBYTES_IN_PAGE: int,
        PRESHUFFLE_TILE: int,
        **launch_options: Any,
    ) -> None:
        if PRESHUFFLE_TILE:
            raise NotImplementedError("the preshuffled (ROCm AITER) index-K layout has no CPU body")
        count = loc.numel()
        if count == 0:
            return
        key_bytes = buf_fp8.view(torch.uint8).view(-1)
        scale_words = buf_fp32.view(-1)
        token = loc.view(-1).long()
        page, offset = token // PAGE_SIZE, token % PAGE_SIZE
        columns = torch.arange(NUM_K_ELEMS_PER_TOKEN, device=token.device)
        key_at = (page * BUF_NUMEL_PER_PAGE + offset * NUM_K_ELEMS_PER_TOKEN)[:, None] + columns
        rows = torch.as_strided(
            index_k.view(torch.uint8), (count, NUM_K_ELEMS_PER_TOKEN), (index_k_row_stride, 1)
        )
        scale_at = page * (BUF_NUMEL_PER_PAGE // 4) + S_OFFSET_NBYTES_IN_PAGE // 4 + offset
        # Check every location before writing, so a bad one leaves the buffer unchanged.
        for name, at, limit in (
            ("key", key_at, key_bytes.numel()),
            ("scale", scale_at, scale_words.numel()),
        ):
            if at.numel() and (int(at.min()) < 0 or int(at.max()) >= limit):
                raise IndexError(
                    f"index-K {name} write at element {int(at.max())} outside a buffer of "
                    f"{limit} (loc={token.tolist()}); sglang's GPU kernel has no bounds check"
                )
        key_bytes[key_at.reshape(-1)] = rows.reshape(-1)
        scale_words[scale_at] = index_k_scale.reshape(-1)[:count].to(scale_words.dtype)


#: The Triton kernel behind ``get_index_k_scale_buffer`` (sglang's ``GetKAndS``), where the
#: release has it.
INDEX_K_READ_KERNEL_NAME = "_get_k_and_s_triton_kernel"


class _CpuIndexKReadKernel:
    """CPU body of sglang's ``_get_k_and_s_triton_kernel``, launched as ``kernel[grid](...)``
    with keyword arguments: for each sequence of the batch, token ``t`` of it is read from
    page ``page_indices[seq, t // page_size]`` at offset ``t % page_size``: its key bytes at
    ``offset * index_head_dim`` of the page row, its 4 scale bytes at ``s_offset_in_page +
    offset * 4``, stored in order into ``k_out`` and ``s_out`` (transcribed from the kernel)."""

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(self, **arguments: Any) -> None:
        rows = arguments["buf_ptr"].view(torch.uint8)
        rows = rows.view(rows.shape[0], -1)
        page_indices, page_size = arguments["page_indices_ptr"], int(arguments["page_size"])
        head_dim = int(arguments["index_head_dim"])
        scale_start = int(arguments["s_offset_in_page"])
        keys_out, scales_out = arguments["k_out_ptr"], arguments["s_out_ptr"]
        start = 0
        for batch, length in enumerate(arguments["seq_len_ptr"].tolist()):
            token = torch.arange(int(length), device=rows.device)
            page = page_indices[batch, token // page_size].long()[:, None]
            offset = (token % page_size)[:, None]
            key_columns = offset * head_dim + torch.arange(head_dim, device=rows.device)
            scale_columns = scale_start + offset * 4 + torch.arange(4, device=rows.device)
            keys_out[start : start + int(length)] = rows[page, key_columns]
            scales_out[start : start + int(length)] = rows[page, scale_columns]
            start += int(length)


@contextmanager
def cpu_index_k_kernel(module: types.ModuleType) -> Iterator[None]:
    """Run sglang's index-K write and paged read on CPU: their Python paths, with the Triton
    kernels' bodies on CPU.

    ``set_index_k_scale_buffer`` checks shapes, dtypes and the page size in Python, then
    launches a Triton kernel that needs a GPU; ``get_index_k_scale_buffer`` (``GetKAndS``)
    gathers through another. Inside the block those kernel symbols of ``module`` (the
    release's index-K kernel module) are replaced by :class:`_CpuIndexKKernel` and
    :class:`_CpuIndexKReadKernel`; everything else that runs is sglang's.
    """
    replaced: dict[str, object] = {INDEX_K_KERNEL_NAME: _CpuIndexKKernel()}
    if hasattr(module, INDEX_K_READ_KERNEL_NAME):
        replaced[INDEX_K_READ_KERNEL_NAME] = _CpuIndexKReadKernel()
    originals = {name: getattr(module, name) for name in replaced}
    for name, body in replaced.items():
        setattr(module, name, body)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


#: The Triton kernel that quantizes a scaled fp8 DSA latent row (0.5.23 keeps it in
#: ``sglang.kernels.ops.quantization.dsa_quant_k_cache``, 0.5.21 and 0.5.22 in
#: ``sglang.kernels.ops.attention.dsa.quant_k_cache``).
DSA_QUANT_KERNEL_NAME = "_quantize_k_cache_fast_kernel"


class _CpuQuantizeKCacheKernel:
    """CPU body of sglang's ``_quantize_k_cache_fast_kernel``, launched as
    ``kernel[grid](...)``: the quantizer behind ``DSATokenToKVPool.set_mla_kv_buffer`` for
    the scaled fp8 latent row (``quantize_k_cache_separate``).

    Transcribed from the kernel, per token and block of ``GROUP_SIZE`` nope values, in
    float32: ``y_s = max|y| / FP8_MAX``, ``y_s_inv = 1.0 / y_s``, the stored value
    ``clamp(y * y_s_inv, FP8_MIN, FP8_MAX)`` cast to the output's fp8 dtype, ``y_s`` into
    the scale view; the rope values are copied into the bf16 rope view. ``tl.clamp``'s
    default (``PropagateNan.NONE``) does not propagate a NaN, so this clamps with
    ``fmax``/``fmin`` (a NaN from ``0 * inf`` in an all-zero block becomes ``FP8_MIN``).
    Two things this CPU body cannot show: Triton may lower float32 ``/`` to an
    approximate division on a GPU, and its symmetric-clamp lowering may give ``+FP8_MAX``
    for that NaN; both are unverified here (docs/sglang-findings.md#scaled).
    """

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    @staticmethod
    def _launch(
        output_nope_q: torch.Tensor,
        output_nope_s: torch.Tensor,
        output_rope: torch.Tensor,
        k_nope: torch.Tensor,
        k_rope: torch.Tensor,
        *strides: int,
        NUM_NOPE_BLOCKS: int,
        GROUP_SIZE: int,
        DIM_NOPE: int,
        DIM_ROPE: int,
        FP8_MIN: float,
        FP8_MAX: float,
        **launch_options: Any,
    ) -> None:
        for block in range(NUM_NOPE_BLOCKS):
            columns = slice(block * GROUP_SIZE, min((block + 1) * GROUP_SIZE, DIM_NOPE))
            y = k_nope[:, columns].to(torch.float32)
            y_s = y.abs().amax(dim=1) / FP8_MAX
            y_s_inv = 1.0 / y_s
            y_q = torch.fmin(
                torch.fmax(y * y_s_inv[:, None], torch.tensor(FP8_MIN)), torch.tensor(FP8_MAX)
            )
            output_nope_q[:, columns] = y_q.to(output_nope_q.dtype)
            output_nope_s[:, block] = y_s
        if DIM_ROPE:
            output_rope[:, :DIM_ROPE] = k_rope[:, :DIM_ROPE].to(output_rope.dtype)


@contextmanager
def cpu_dsa_quantize_kernel(module: types.ModuleType) -> Iterator[None]:
    """Run sglang's scaled fp8 DSA latent write on CPU: its Python path
    (``quantize_k_cache_separate``, then its write), with the quantizing Triton kernel of
    ``module`` (the release's quantizer module) run by a CPU body
    (:class:`_CpuQuantizeKCacheKernel`)."""
    original = getattr(module, DSA_QUANT_KERNEL_NAME)
    setattr(module, DSA_QUANT_KERNEL_NAME, _CpuQuantizeKCacheKernel())
    try:
        yield
    finally:
        setattr(module, DSA_QUANT_KERNEL_NAME, original)


class _CpuGetMlaKernel:
    """CPU body of sglang's ``get_mla_kv_buffer_kernel`` (``rope=True``) and its
    ``_norope`` twin, launched as ``kernel[grid](...)``.

    The Triton kernels gather row ``loc[i]`` of the latent buffer and store its first
    ``nope_dim`` values into ``cache_k_nope[i]`` and the next ``rope_dim`` into
    ``cache_k_rope[i]``, converting to the destination dtype on store; this does the same
    with torch indexing. (sglang's set path already has a torch body of its own,
    ``set_mla_kv_buffer_naive``, which it uses on platforms without Triton.)
    """

    def __init__(self, *, rope: bool) -> None:
        self.rope = rope

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(self, kv_buffer: torch.Tensor, cache_k_nope: torch.Tensor, *rest: Any) -> None:
        if self.rope:
            cache_k_rope, loc, _buffer_stride, _nope_stride, _rope_stride, nope_dim, rope_dim = (
                rest[:7]
            )
        else:
            cache_k_rope, rope_dim = None, 0
            loc, _buffer_stride, _nope_stride, nope_dim = rest[:4]
        rows = kv_buffer.reshape(kv_buffer.shape[0], -1)[loc.view(-1).long()]
        count = rows.shape[0]
        cache_k_nope.view(count, -1)[:, :nope_dim].copy_(rows[:, :nope_dim])
        if cache_k_rope is not None:
            cache_k_rope.view(count, -1)[:, :rope_dim].copy_(
                rows[:, nope_dim : nope_dim + rope_dim]
            )


class _CpuSetMlaKernel:
    """CPU body of sglang's ``set_mla_kv_buffer_kernel`` (``rope=True``) and its ``_norope``
    twin, launched as ``kernel[grid](...)``: what ``set_mla_kv_buffer`` runs on a release
    without a torch body of its own (``set_mla_kv_buffer_naive``, sglang 0.5.22 on).

    Transcribed from the kernels: the rope kernel stores row ``i`` of ``cache_k_nope`` then
    ``cache_k_rope`` into latent row ``loc[i] // DCP_WORLD_SIZE`` when ``loc[i]`` is not
    ``reserved_skip_index`` and ``loc[i] % DCP_WORLD_SIZE == DCP_RANK``; the norope kernel
    stores ``cache_k_nope`` at ``loc[i]``. Values are converted to the buffer's dtype on
    store, as Triton's ``tl.store`` does.
    """

    def __init__(self, *, rope: bool) -> None:
        self.rope = rope

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(
        self, kv_buffer: torch.Tensor, cache_k_nope: torch.Tensor, *rest: Any, **meta: Any
    ) -> None:
        world, rank, skip = 1, 0, None
        if self.rope:
            cache_k_rope, loc, skip, _, nope_stride, rope_stride, nope_dim, rope_dim = rest[:8]
            world, rank = int(meta.get("DCP_WORLD_SIZE", 1)), int(meta.get("DCP_RANK", 0))
        else:
            loc, _, nope_stride, nope_dim = rest[:4]
            cache_k_rope, rope_stride, rope_dim = None, 0, 0
        token = loc.view(-1).long()
        valid = token % world == rank
        if skip is not None:
            valid &= token != int(skip)
        rows = kv_buffer.view(kv_buffer.shape[0], -1)
        count = token.numel()
        nope = torch.as_strided(cache_k_nope, (count, nope_dim), (nope_stride, 1))
        target = token[valid] // world
        rows[target, :nope_dim] = nope[valid].to(rows.dtype)
        if cache_k_rope is not None and rope_dim:
            rope = torch.as_strided(cache_k_rope, (count, rope_dim), (rope_stride, 1))
            rows[target, nope_dim : nope_dim + rope_dim] = rope[valid].to(rows.dtype)


@contextmanager
def cpu_mla_write_kernels(module: types.ModuleType) -> Iterator[None]:
    """Run sglang's ``set_mla_kv_buffer`` on CPU where the release has no torch body for it:
    its Python path, with the two Triton scatter kernels of ``module`` (the release's MLA
    buffer kernel module) run by :class:`_CpuSetMlaKernel`. A release with
    ``set_mla_kv_buffer_naive`` takes that path on CPU itself, and nothing is patched."""
    if hasattr(module, "set_mla_kv_buffer_naive"):
        yield
        return
    names = {"set_mla_kv_buffer_kernel": True, "set_mla_kv_buffer_kernel_norope": False}
    originals = {name: getattr(module, name) for name in names}
    for name, rope in names.items():
        setattr(module, name, _CpuSetMlaKernel(rope=rope))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


@contextmanager
def cpu_mla_read_kernels(module: types.ModuleType) -> Iterator[None]:
    """Run sglang's ``get_mla_kv_buffer`` on CPU: its Python path, with the two Triton
    gather kernels of ``module`` (the release's MLA buffer kernel module) run by a CPU body
    (:class:`_CpuGetMlaKernel`)."""
    names = {"get_mla_kv_buffer_kernel": True, "get_mla_kv_buffer_kernel_norope": False}
    originals = {name: getattr(module, name) for name in names}
    for name, rope in names.items():
        setattr(module, name, _CpuGetMlaKernel(rope=rope))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


class _CpuMlaScaleKernel:
    """CPU body of sglang's ``set_mla_kv_scale_buffer_kernel`` (MLA FP4's scale rows),
    launched as ``kernel[grid](...)``.

    The Triton kernel writes, for each ``loc[i]`` other than ``reserved_skip_index``, the
    ``nope_dim`` scale bytes of ``cache_k_nope[i]`` then the ``rope_dim`` of
    ``cache_k_rope[i]`` to row ``loc[i]`` of the scale buffer; it skips the reserved slot
    (0) and, like the kernel, has no decode-context-parallel handling.
    """

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(
        self,
        kv_buffer: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
        loc: torch.Tensor,
        reserved_skip_index: int,
        _buffer_stride: int,
        _nope_stride: int,
        _rope_stride: int,
        nope_dim: int,
        rope_dim: int,
        **_block: Any,
    ) -> None:
        locs = loc.view(-1).long()
        keep = locs != int(reserved_skip_index)
        count = locs.numel()
        rows = kv_buffer.view(kv_buffer.shape[0], -1)
        nope = cache_k_nope.reshape(count, -1)[:, :nope_dim]
        rope = cache_k_rope.reshape(count, -1)[:, :rope_dim]
        rows[locs[keep], : nope_dim + rope_dim] = torch.cat((nope, rope), dim=1)[keep].to(
            rows.dtype
        )


@contextmanager
def cpu_mla_scale_kernel(module: types.ModuleType) -> Iterator[None]:
    """Run sglang's MLA FP4 ``set_mla_kv_buffer`` on CPU: its Python path, with the Triton
    scale-row kernel of ``module`` (the release's MLA buffer kernel module) run by
    :class:`_CpuMlaScaleKernel`. A release without that kernel is left as it is."""
    name = "set_mla_kv_scale_buffer_kernel"
    original = getattr(module, name, None)
    if original is None:
        yield
        return
    setattr(module, name, _CpuMlaScaleKernel())
    try:
        yield
    finally:
        setattr(module, name, original)


#: The DeprecationWarning SWIG 4 modules (sentencepiece, which sglang imports) emit while the
#: interpreter shuts down, when their runtime creates its ``swigvarlink`` type.
SWIG_EXIT_WARNING = "builtin type swigvarlink has no __module__ attribute"
_RESYNC_MESSAGE = "kvcheck: re-read the warning filters before interpreter shutdown"


@functools.cache
def guard_swig_exit_warning() -> None:
    """Keep sentencepiece's SWIG runtime from crashing the interpreter at exit (once per process).

    At shutdown SWIG creates a type whose creation warns (:data:`SWIG_EXIT_WARNING`); if the
    warning raises, SWIG goes on with a NULL type and the process dies with SIGSEGV, after
    every test has passed. It raises when the C warnings module still holds the filter list
    it saw last, which under pytest's ``filterwarnings = error`` is a test's list: by then
    ``warnings`` itself is unreachable, so the stale list is what it uses. An exit hook,
    which runs before modules are torn down, ignores that one message and warns once
    (silently) so the C side re-reads the process's real filters.
    """
    atexit.register(_ignore_swig_exit_warning)


def _ignore_swig_exit_warning() -> None:
    warnings.filterwarnings("ignore", message=SWIG_EXIT_WARNING, category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=_RESYNC_MESSAGE, category=UserWarning)
    with contextlib.suppress(Warning):  # whatever the filters, this call only re-syncs them
        warnings.warn(_RESYNC_MESSAGE, UserWarning, stacklevel=1)
