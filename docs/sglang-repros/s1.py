"""sglang 0.5.23 (S1): a refused SWATokenToKVPoolAllocator.alloc_decode leaks the full side's page.

`alloc`, `alloc_extend` and `alloc_extend_swa_tail` first ask whether BOTH sides have the
pages (`new_pages_available`), then allocate. `alloc_decode` (srt/mem_cache/allocator/swa.py)
calls `full_attn_allocator.alloc_decode` and `swa_attn_allocator.alloc_decode`
unconditionally and returns None if either returned None, so when only one side is short
the other side's new page is consumed, never mapped and never freed.

A page-size-4 SWA allocator (full side 16 tokens, sliding-window side 8) holds one request
of 8 tokens; its decode token 9 starts a new page on both sides, and the window side has
none left. Exit 1 and "BUG PRESENT: ..." while the refused decode changes the full side's
free tokens; 0 and "fixed" once it changes nothing; 2 and "CANNOT RUN: ..." without sglang.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings


def torchvision_stand_in():
    """sglang's config package imports torchvision at module level (image models).
    Where no loadable torchvision exists, serve inert stand-in modules for that import."""
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
os.environ.setdefault("SGLANG_NATIVE_MOVE_KV_CACHE", "1")  # MHA pools built on CPU
import torch  # noqa: E402

T = lambda *xs: torch.tensor(list(xs), dtype=torch.int64)  # noqa: E731


def verdict(problem):
    if problem:
        print(f"BUG PRESENT: {problem}")
        sys.exit(1)
    print("fixed")
    sys.exit(0)


try:
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
except ImportError as exc:  # no sglang (or not this release's modules)
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def on_cpu(call):
    """Run ``call``; where this release's paged allocator launches a Triton kernel (0.5.21:
    no torch path for alloc_extend), a CPU machine cannot check: say so and exit 3."""
    try:
        return call()
    except RuntimeError as exc:
        if "active drivers" not in str(exc):
            raise
        print(
            "cannot check here: this sglang's paged allocator launches a Triton kernel "
            f"({exc}); run it on a GPU"
        )
        sys.exit(3)


PAGE = 4
pool = SWAKVPool(
    size=16,
    size_swa=8,
    page_size=PAGE,
    dtype=torch.bfloat16,
    head_num=1,
    head_dim=8,
    swa_attention_layer_ids=[0],
    full_attention_layer_ids=[1],
    device="cpu",
    enable_memory_saver=False,
)
alloc = SWATokenToKVPoolAllocator(16, 8, PAGE, torch.bfloat16, "cpu", pool, need_sort=False)
# One request of 8 tokens: 2 pages on each side; the SWA side (8 tokens) is now full.
locs = on_cpu(lambda: alloc.alloc_extend(T(0), T(0), T(8), T(8), T(-1), 8))
full_before = alloc.full_available_size()
# Its next decode token (seq_len 9) starts a new page on both sides; the SWA side has none.
out = alloc.alloc_decode(T(9), T(9), T(int(locs[-1])))
full_after = alloc.full_available_size()
problem = None
if out is None and full_after != full_before:
    problem = (
        f"alloc_decode returned None (SWA side full) but the full side's free tokens went "
        f"{full_before} -> {full_after}: a page was taken and is now owned by nobody "
        f"(alloc_extend checks both sides first; alloc_decode does not)"
    )
elif out is not None:
    problem = None
verdict(problem)
