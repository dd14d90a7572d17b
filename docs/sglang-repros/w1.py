"""sglang 0.5.23: MHATokenToKVPool.set_kv_buffer divides the caller's K/V tensors in place.

When the K/V payload's dtype differs from the pool dtype and k_scale/v_scale are given,
set_kv_buffer runs ``cache_k.div_(k_scale)`` / ``cache_v.div_(v_scale)`` on the tensors the
caller passed, before casting them to the pool dtype. The caller's K and V are changed
as a side effect of storing them (sglang's Triton backend clones K and V before every
call "to protect k,v from in-place mutation in set_kv_buffer").

Runs on CPU against sglang alone. Exit 1 and "BUG PRESENT: ..." while the caller's tensor
is modified; exit 0 and "fixed" once it is left untouched.
"""

import importlib.abc
import importlib.machinery
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
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

pool = MHATokenToKVPool(
    size=8,
    page_size=4,
    dtype=torch.bfloat16,
    head_num=1,
    head_dim=4,
    layer_num=1,
    device="cpu",
    enable_memory_saver=False,
)
layer = SimpleNamespace(layer_id=0)

# A float32 payload for a bf16 pool, with per-layer scales (as attention backends pass
# layer.k_scale / layer.v_scale for a quantized KV cache).
cache_k = torch.full((1, 1, 4), 6.0, dtype=torch.float32)
cache_v = torch.full((1, 1, 4), 8.0, dtype=torch.float32)
k_before, v_before = cache_k.clone(), cache_v.clone()

pool.set_kv_buffer(layer, torch.tensor([1]), cache_k, cache_v, k_scale=2.0, v_scale=4.0)

stored_k = pool.get_key_buffer(0)[1].float()
if not (torch.equal(cache_k, k_before) and torch.equal(cache_v, v_before)):
    print(
        "BUG PRESENT: set_kv_buffer(..., k_scale=2.0, v_scale=4.0) changed the caller's "
        f"cache_k from {k_before.flatten().tolist()} to {cache_k.flatten().tolist()} and "
        f"cache_v from {v_before.flatten().tolist()} to {cache_v.flatten().tolist()} "
        f"(stored K row: {stored_k.flatten().tolist()})"
    )
    sys.exit(1)
print("fixed: set_kv_buffer left the caller's K/V tensors unchanged")
sys.exit(0)
