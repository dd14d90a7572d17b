"""sglang 0.5.23: MHA get_kv_size_bytes and mem_usage leave out the fused K/V page padding.

When K and V rows have one shape, ``MHATokenToKVPool._create_buffers_normal`` allocates
each layer's K and V as the two halves of one ``[2, padded, head_num, head_dim]`` tensor,
``padded`` being ``size + page_size`` rounded up to whole pages, and keeps views of
``size + page_size`` rows. ``get_kv_size_bytes`` (and ``mem_usage``, and the allocation
log) add up the views, so a pool whose size is not a whole number of pages holds more
bytes than it reports. The pool below (size 3, pages of 2, head_dim 4, bf16, one layer)
is asked for its bytes and its tensors' storages are measured.

Exit 1 and "BUG PRESENT: ..." while the reported bytes are fewer than the bytes
allocated; exit 0 and "fixed" once they match.
"""

import importlib.abc
import importlib.machinery
import sys
import types
import warnings


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
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

pool = MHATokenToKVPool(
    size=3,
    page_size=2,
    dtype=torch.bfloat16,
    head_num=1,
    head_dim=4,
    layer_num=1,
    device="cpu",
    enable_memory_saver=False,
)
k_reported, v_reported = (int(n) for n in pool.get_kv_size_bytes())
storages = {}
for tensor in (*pool.k_buffer, *pool.v_buffer):
    storage = tensor.untyped_storage()
    storages[storage.data_ptr()] = storage.nbytes()
allocated = sum(storages.values())
reported = k_reported + v_reported
if reported < allocated:
    print(
        f"BUG PRESENT: get_kv_size_bytes() reports K {k_reported} + V {v_reported} = "
        f"{reported} bytes (mem_usage {pool.mem_usage:.9f} GB), but the pool's K/V "
        f"storage holds {allocated} bytes: {allocated - reported} bytes of page padding "
        "are not counted"
    )
    sys.exit(1)
print(f"fixed: the pool reports {reported} bytes and holds {allocated}")
sys.exit(0)
