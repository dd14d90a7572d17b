"""sglang 0.5.23: DSA host copies call torch.cuda.synchronize() whatever the device.

``DSATokenToKVPool.get_cpu_copy`` / ``load_cpu_copy`` (retraction's offload and reload)
copy the latent rows through ``MLATokenToKVPool``, which waits with
``current_platform.synchronize()``, and then the index keys through
``IndexKeyCache.cpu_copy`` / ``load_cpu_copy`` and the pool itself, which call
``torch.cuda.synchronize()`` unconditionally. On a torch built without CUDA that call
raises, so a DSA pool on such a device cannot be offloaded at all, while its latent half
is written for any platform. Only GPU servers run DSA models today; nothing states that
the pool needs one.

Exit 1 and "BUG PRESENT: ..." while, on a torch without CUDA, the host copy of a CPU DSA
pool raises from torch.cuda; exit 0 and "fixed" once it copies (on a CUDA torch there is
nothing to show: exit 0 saying so).
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
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

if torch.backends.cuda.is_built():
    print("fixed: this torch has CUDA, so torch.cuda.synchronize() works (nothing to show)")
    sys.exit(0)

PAGE = 64  # sglang asserts 64-token DSA pages
with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = DSATokenToKVPool(
        size=2 * PAGE,
        page_size=PAGE,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=4,
        layer_num=1,
        device="cpu",
        index_head_dim=128,
        enable_memory_saver=False,
        kv_cache_dim=8,
    )
    try:
        copy = pool.get_cpu_copy(torch.arange(PAGE))
    except Exception as error:
        print(
            "BUG PRESENT: DSATokenToKVPool(device='cpu').get_cpu_copy(one page) raised "
            f"{type(error).__name__}: {error} (torch.cuda.synchronize() in the index-K "
            "copy; the latent copy waits with current_platform.synchronize())"
        )
        sys.exit(1)
print("fixed: the CPU DSA pool's host copy works on a torch without CUDA")
sys.exit(0)
