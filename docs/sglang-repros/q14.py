"""sglang 0.5.23: an MXFP8 pool off 128-token pages (flat scales) cannot be written.

MHATokenToKVPoolMXFP8 (--kv-cache-dtype mxfp8) builds its scale buffers in FA4's
interleaved layout on 128-token pages and "flat per slot otherwise" ([rows, H, D/32]); its
_write_scales, move_kv_cache, load_cpu_copy and get_kv_scale_buf_infos all serve the flat
layout. Its set_kv_buffer refuses it: with caller scales it asserts "MXFP8 KV cache
requires the page_size=128 interleaved scale layout", without them (the fused path) it
raises ValueError. Nothing refuses the page size before: the constructor builds the pool,
and a server's first write to it fails (serving, not verified: --kv-cache-dtype mxfp8
with a --page-size other than 128).

Runs on CPU against sglang and torch alone. set_kv_buffer first asserts CUDA and a
loadable store_cache kernel; the script stands in for those two (the module's _is_cuda and
can_use_store_cache) and for the CUDA store_cache itself (a row copy), so the call reaches
the layout check. Exit 1 and "BUG PRESENT: ..." while a flat pool refuses every write; exit
0 and "fixed" once it stores one; "not applicable" on a release without the MXFP8 pool.
"""

import importlib.abc
import os

# sglang's MHA pool moves K/V with a Triton kernel unless this asks for its torch move.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
import sys
import types
import warnings
from types import SimpleNamespace


def torchvision_stand_in():
    """sglang's config package imports torchvision at module level (for image models).

    Where the installed torch has no loadable torchvision, serve stand-in modules for
    that import; nothing here uses them.
    """
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
    try:  # let transformers cache "torchvision unavailable" before the stand-in exists
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
    except Exception:
        pass

    class StandIn(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return StandIn(f"{self.__name__}.{name}")

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"{self.__name__} is a torchvision stand-in")

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
warnings.simplefilter("ignore")  # sglang warns at import about CPU-only features
import torch  # noqa: E402

try:
    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolMXFP8
except ImportError as error:  # a release without the MXFP8 pool cannot have it
    print(f"not applicable: this sglang has no MHATokenToKVPoolMXFP8 ({error})")
    sys.exit(0)


def mxfp8_pool(page_size, size, head_dim):
    """The pool --kv-cache-dtype mxfp8 builds, for one layer and one KV head."""
    return MHATokenToKVPoolMXFP8(
        size=size,
        page_size=page_size,
        dtype=torch.float8_e4m3fn,
        head_num=1,
        head_dim=head_dim,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )


def store_rows(k, v, k_cache, v_cache, indices, **_sizes):
    """Stand-in for the CUDA store_cache: rows i of k and v to rows indices[i]."""
    k_cache[indices] = k
    v_cache[indices] = v


memory_pool._is_cuda = True  # what set_kv_buffer asserts first, and has on a GPU
memory_pool.can_use_store_cache = lambda *sizes: True
memory_pool.store_cache = store_rows

pool = mxfp8_pool(page_size=4, size=8, head_dim=32)
layer = SimpleNamespace(layer_id=0)
rows = torch.ones(1, 1, 32).to(torch.float8_e4m3fn)
scales = torch.full((1, 1, 1), 8.0).to(torch.float8_e8m0fnu)
refusals = []
try:
    pool.set_kv_buffer(layer, torch.tensor([5]), rows, rows, scales, scales)
except AssertionError as error:
    refusals.append(f"with scales: AssertionError: {error}")
try:  # the fused path: float rows the pool quantizes itself
    pool.set_kv_buffer(layer, torch.tensor([5]), rows.float(), rows.float())
except (ValueError, AssertionError) as error:
    refusals.append(f"without: {type(error).__name__}: {error}")
if len(refusals) == 2:
    print(
        "BUG PRESENT: MHATokenToKVPoolMXFP8 at page_size=4 built flat scale buffers "
        f"{tuple(pool.k_scale_buffer[0].shape)}, then refused every write ("
        + "; ".join(refusals)
        + ")"
    )
    sys.exit(1)
print(f"fixed: a flat-scale MXFP8 pool stores a write (refused only: {refusals})")
sys.exit(0)
