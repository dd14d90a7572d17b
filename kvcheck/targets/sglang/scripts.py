"""What a standalone reproduction script needs to build sglang's pools on a CPU machine.

The script imports only torch and sglang: the scoped CPU stand-ins of
:mod:`kvcheck.targets.sglang.env` are written out as plain code (the torchvision stand-in,
sglang's native K/V move, the parallel widths a launched server publishes, and the CPU bodies
of the Triton kernels the calls reach), and the pool is built from the target's
:meth:`~kvcheck.targets.sglang.target.SGLangTarget.pool_arguments`.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets.sglang import SGLangTarget
    >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
    >>> recipe = SGLangTarget().script_recipe(spec, ())
    >>> recipe.build[0]
    'pool = memory_pool.MLATokenToKVPool('
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from kvcheck.specs import PoolSpec, WriteIndexK, WriteMLA
from kvcheck.targets.base import PoolArguments, ScriptRecipe
from kvcheck.targets.sglang import mxfp8_kernels
from kvcheck.targets.sglang.env import dcp_parallel_widths
from kvcheck.targets.sglang.quant_methods import IMPORT_LINE, QuantMethodCall

__all__ = ["script_recipe"]

_SGLANG_SETUP = '''
# --- what a launched sglang server would have provided (kvcheck's CPU workarounds) ---
# A path change, not a kernel body (kvcheck's env.PATH_CHANGES): sglang's MHA pool moves K/V
# with a Triton kernel unless this variable asks for its torch move, read in its constructor.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"


def torchvision_stand_in():
    """sglang's config package imports torchvision at import time (for image models this
    script never builds). Without a loadable torchvision, serve stand-in modules that
    raise if anything actually calls them."""
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
    try:  # transformers caches whether torchvision exists: let it see the truth first
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
        import_utils.is_torchvision_v2_available()
    except Exception:
        pass

    class StandIn(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            child = StandIn(f"{self.__name__}.{name}")
            setattr(self, name, child)
            return child

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"{self.__name__}: torchvision is a stand-in in this script")

        def __mro_entries__(self, bases):
            return (object,)

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] != "torchvision":
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = StandIn(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


torchvision_stand_in()
with warnings.catch_warnings():  # sglang warns about CPU-only features at import
    warnings.simplefilter("ignore")
    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.runtime_context import get_parallel

# MLA/DSA pools read parallel widths that a launched server publishes: RANK_WIDTHS.
get_parallel().override_permanently(PARALLEL_WIDTHS)
if not torch.cuda.is_available():
    # DSA host copies call torch.cuda.synchronize(); CPU work has nothing to wait for.
    torch.cuda.synchronize = lambda device=None: None
'''


def _setup(spec: PoolSpec) -> str:
    """The sglang script's setup, publishing the parallel widths of the spec's DCP rank."""
    ranks, rank = spec.dcp_size, spec.dcp_rank
    widths = ", ".join(
        f"{name}={value!r}" for name, value in dcp_parallel_widths(ranks, rank).items()
    )
    which = "one rank here" if ranks == 1 else f"rank {rank} of --dcp-size {ranks} here"
    setup = _SGLANG_SETUP.strip("\n").replace("PARALLEL_WIDTHS", widths)
    return setup.replace("RANK_WIDTHS", which)


_SGLANG_INDEX_K = '''

def cpu_set_k_and_s(buf_fp8, buf_fp32, loc, index_k, index_k_scale, index_k_row_stride, *,
                    PAGE_SIZE, BUF_NUMEL_PER_PAGE, NUM_K_ELEMS_PER_TOKEN,
                    S_OFFSET_NBYTES_IN_PAGE, PRESHUFFLE_TILE, **launch_options):
    """CPU body of sglang's Triton _set_k_and_s_triton_kernel, with the byte layout that
    kernel documents: token t sits in page t // PAGE_SIZE at offset o = t % PAGE_SIZE; its
    fp8 key fills bytes [o*K, (o+1)*K) of the page row, its fp32 scale the 4 bytes at
    S_OFFSET + 4*o."""
    token = loc.view(-1).long()
    if token.numel() == 0:
        return
    page, offset = token // PAGE_SIZE, token % PAGE_SIZE
    columns = torch.arange(NUM_K_ELEMS_PER_TOKEN)
    key_at = (page * BUF_NUMEL_PER_PAGE + offset * NUM_K_ELEMS_PER_TOKEN)[:, None] + columns
    keys = torch.as_strided(index_k.view(torch.uint8), (token.numel(), NUM_K_ELEMS_PER_TOKEN),
                            (index_k_row_stride, 1))
    buf_fp8.view(torch.uint8).view(-1)[key_at.reshape(-1)] = keys.reshape(-1)
    scale_at = page * (BUF_NUMEL_PER_PAGE // 4) + S_OFFSET_NBYTES_IN_PAGE // 4 + offset
    buf_fp32.view(-1)[scale_at] = index_k_scale.reshape(-1)[: token.numel()].float()


class CpuKernel:
    def __getitem__(self, grid):  # launched as kernel[grid](...)
        return cpu_set_k_and_s


# The kernel's module moves between sglang releases: take the one the index-K cache uses.
from sglang.srt.mem_cache import index_key_cache  # noqa: E402

index_k_kernels = next(
    module
    for module in vars(index_key_cache).values()
    if isinstance(module, types.ModuleType) and hasattr(module, "_set_k_and_s_triton_kernel")
)
index_k_kernels._set_k_and_s_triton_kernel = CpuKernel()
'''


_SGLANG_SCALED_QUANT = '''

def cpu_quantize_k_cache(out_q, out_s, out_rope, k_nope, k_rope, *strides, NUM_NOPE_BLOCKS,
                         GROUP_SIZE, DIM_NOPE, DIM_ROPE, FP8_MIN, FP8_MAX, **launch_options):
    """CPU body of sglang's Triton _quantize_k_cache_fast_kernel (scaled fp8 DSA rows), in
    float32: per block, scale = max|y| / FP8_MAX, value clamp(y * (1 / scale)) to fp8
    (tl.clamp propagates no NaN: fmax/fmin), then the rope values unchanged."""
    for block in range(NUM_NOPE_BLOCKS):
        cols = slice(block * GROUP_SIZE, min((block + 1) * GROUP_SIZE, DIM_NOPE))
        y = k_nope[:, cols].float()
        y_s = y.abs().amax(dim=1) / FP8_MAX
        y_q = torch.fmin(torch.fmax(y * (1.0 / y_s)[:, None], torch.tensor(FP8_MIN)),
                         torch.tensor(FP8_MAX))
        out_q[:, cols] = y_q.to(out_q.dtype)
        out_s[:, block] = y_s
    if DIM_ROPE:
        out_rope[:, :DIM_ROPE] = k_rope[:, :DIM_ROPE].to(out_rope.dtype)


class CpuQuantizeKernel:
    def __getitem__(self, grid):  # launched as kernel[grid](...)
        return cpu_quantize_k_cache


# The quantizer's module moves between sglang releases: take the one the pool module uses.
quantizer = sys.modules[memory_pool.quantize_k_cache_separate.__module__]
quantizer._quantize_k_cache_fast_kernel = CpuQuantizeKernel()
'''


_SGLANG_MLA_SET = """

from sglang.kernels.ops.kvcache import mla_buffer  # noqa: E402

if not hasattr(mla_buffer, "set_mla_kv_buffer_naive"):
    # Releases before 0.5.22 have no torch body for set_mla_kv_buffer: it launches Triton.
    # These are the CPU bodies of its two scatter kernels, transcribed.
    def cpu_set_mla(kv_buffer, cache_k_nope, *rest, **meta):
        if len(rest) >= 8:  # set_mla_kv_buffer_kernel: with rope, DCP owner rule, skip slot
            cache_k_rope, loc, skip, _, nope_stride, rope_stride, nope_dim, rope_dim = rest[:8]
            world, rank = meta.get("DCP_WORLD_SIZE", 1), meta.get("DCP_RANK", 0)
        else:  # set_mla_kv_buffer_kernel_norope
            loc, _, nope_stride, nope_dim = rest[:4]
            cache_k_rope, rope_stride, rope_dim, skip, world, rank = None, 0, 0, None, 1, 0
        token = loc.view(-1).long()
        valid = token % world == rank
        if skip is not None:
            valid &= token != int(skip)
        rows = kv_buffer.view(kv_buffer.shape[0], -1)
        nope = torch.as_strided(cache_k_nope, (token.numel(), nope_dim), (nope_stride, 1))
        rows[token[valid] // world, :nope_dim] = nope[valid].to(rows.dtype)
        if cache_k_rope is not None and rope_dim:
            rope = torch.as_strided(cache_k_rope, (token.numel(), rope_dim), (rope_stride, 1))
            rows[token[valid] // world, nope_dim : nope_dim + rope_dim] = rope[valid].to(
                rows.dtype
            )

    class CpuSetMlaKernel:
        def __getitem__(self, grid):  # launched as kernel[grid](...)
            return cpu_set_mla

    mla_buffer.set_mla_kv_buffer_kernel = CpuSetMlaKernel()
    mla_buffer.set_mla_kv_buffer_kernel_norope = CpuSetMlaKernel()
"""


_SGLANG_MXFP8 = """

# MHATokenToKVPoolMXFP8 stores through three GPU-only pieces (the CUDA store_cache behind a
# CUDA guard, two Triton kernels). These are kvcheck's CPU bodies of them (the target's
# listed stand-ins), installed only while the pool's own writes, moves and reloads run.
def _first_module(*names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


interleave_module = _first_module(
    "sglang.kernels.ops.kvcache.mxfp8_interleave_sf",
    "sglang.kernels.ops.quantization.mxfp8_interleave_sf",
)
quant_store_module = _first_module(
    "sglang.kernels.ops.kvcache.mxfp8_quant_store_kv",
    "sglang.kernels.ops.quantization.mxfp8_quant",
)


def _mxfp8_on_cpu(method, store_cache):
    def run(self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            if store_cache:
                stack.enter_context(cpu_store_cache(memory_pool))
            if interleave_module is not None:
                stack.enter_context(cpu_mxfp8_interleave_kernel(interleave_module))
            if quant_store_module is not None:
                stack.enter_context(cpu_mxfp8_quant_store_kernel(quant_store_module))
            return method(self, *args, **kwargs)

    return run


mxfp8_class = memory_pool.MHATokenToKVPoolMXFP8
mxfp8_class.set_kv_buffer = _mxfp8_on_cpu(mxfp8_class.set_kv_buffer, True)
for name in ("move_kv_cache", "load_cpu_copy"):
    setattr(mxfp8_class, name, _mxfp8_on_cpu(getattr(mxfp8_class, name), False))
"""


def _mxfp8_stand_ins() -> list[str]:
    """The lines that give a script kvcheck's MXFP8 stand-ins: the module's own source (one
    home for the CPU bodies, which import only torch and the standard library), without its
    docstring, ``__future__`` and torch imports and ``__all__``, then their installation."""
    tree = inspect.getsource(mxfp8_kernels).splitlines()
    start = next(i for i, line in enumerate(tree) if line.startswith("from collections.abc"))
    body: list[str] = []
    skipping = False
    for line in tree[start:]:
        if line.startswith("__all__"):
            skipping = True
        # The script imports torch at its top: a local import would shadow it in the setup.
        if not skipping and line != "import torch":
            body.append(line)
        if skipping and line.startswith("]"):
            skipping = False
    return ["", *body, *_SGLANG_MXFP8.rstrip("\n").splitlines()]


def script_recipe(spec: PoolSpec, ops: Sequence[Any], *, arguments: PoolArguments) -> ScriptRecipe:
    """How a script builds sglang's pool for ``spec`` and runs ``ops`` on it on a CPU
    machine: the setup a launched server would have provided, then the constructor call of
    ``arguments`` (the target's :meth:`~kvcheck.targets.sglang.target.SGLangTarget.pool_arguments`
    on ``"cpu"``)."""
    setup = _setup(spec).splitlines()
    if any(isinstance(op, WriteIndexK) for op in ops):
        setup += _SGLANG_INDEX_K.rstrip("\n").splitlines()
    if spec.latent_layout == "scaled":
        setup += _SGLANG_SCALED_QUANT.rstrip("\n").splitlines()
    if spec.family in ("mla", "dsa") and any(isinstance(op, WriteMLA) for op in ops):
        setup += _SGLANG_MLA_SET.rstrip("\n").splitlines()
    if spec.kv_quant == "mxfp8":
        setup += _mxfp8_stand_ins()
    body = "\n".join(f"    {line}" if line else "" for line in setup)
    build = arguments.call_source("pool", qualifier="memory_pool").splitlines()
    if any(isinstance(value, QuantMethodCall) for value in arguments.kwargs.values()):
        # The pool's quant_method argument prints as the sglang call that builds it.
        build = [IMPORT_LINE, *build]
    if spec.kv_layout == "hnd":
        # sglang picks the HND layout from this variable, read in the constructor.
        build = [
            'os.environ["SGLANG_USE_HND_KVCACHE"] = "1"',
            *build,
            'del os.environ["SGLANG_USE_HND_KVCACHE"]',
        ]
    return ScriptRecipe(
        needs="torch and sglang (any release kvcheck is checked against; runs on CPU)",
        imports=(),
        modules=(
            "contextlib",
            "importlib",
            "importlib.abc",
            "importlib.machinery",
            "os",
            "sys",
            "types",
            "warnings",
        ),
        setup=(
            "def sglang_setup():\n"
            '    """Import sglang\'s pools as a launched server would have set them up."""\n'
            f"{body}\n"
            "    return memory_pool\n\n\n"
            "memory_pool = sglang_setup()"
        ),
        build=tuple(build),
    )
