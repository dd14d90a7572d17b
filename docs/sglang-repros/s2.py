"""sglang 0.5.23 (S2): at page size 1, SWATokenToKVPoolAllocator.free puts the padding slot 0
into the sliding-window free list when a slot's window peer was already released.

`free(idx)` = `free_swa(idx)` + `free_full(idx)`. Above page size 1, `free_swa` reads the
full-to-window mapping and `_release_swa` drops entries that read 0 (peer already
released). At page size 1 it goes through `_free_swa_pages`, which releases `mapping[idx]`
as is: an entry already cleared reads 0, so slot 0 -- the padding slot padded tokens write
to -- joins the window side's free list and is later handed out. The only guard is the
`swa.peer_mapped` invariant, checked only when SGLANG_INVARIANT_CHECK is set. sglang's
callers free a request's out-of-window part with `free_full*` (the precondition).

One request's two tokens leave the window (`free_swa`), then the request finishes
(`free`), on a page-size-1 and a page-size-4 allocator. Exit 1 and "BUG PRESENT: ..." while
page size 1 frees slot 0; 0 and "fixed" once it does not; 2 and "CANNOT RUN: ..." without
sglang.
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


def run(page):
    pool = SWAKVPool(
        size=32,
        size_swa=16,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
        enable_memory_saver=False,
    )
    a = SWATokenToKVPoolAllocator(32, 16, page, torch.bfloat16, "cpu", pool, need_sort=False)
    grab = (
        (lambda n: a.alloc(n))
        if page == 1
        else (lambda n: a.alloc_extend(T(0), T(0), T(n), T(n), T(-1), n))
    )
    grab(12)  # another request holds most of the SWA side
    req = grab(2)  # the request under test
    a.free_swa(req)  # its tokens leave the sliding window: SWA side released
    a.free(req)  # the request finishes: free() releases both sides
    return a.swa_attn_allocator.free_pages.tolist(), a.swa_available_size()


free1, avail1 = run(1)
free4, avail4 = on_cpu(lambda: run(4))
print(
    f"page_size 1: SWA free list {free1} (available {avail1}); "
    f"page_size 4: {free4} (available {avail4})"
)
verdict(
    f"page_size 1: free() after free_swa() put the padding slot 0 into the SWA free list "
    f"{free1.count(0)} time(s) (SWA available {avail1}, 2 more than the slots truly free); "
    f"page_size 4 drops those entries"
    if 0 in free1
    else None
)
