"""sglang 0.5.23: NoOpMHATokenToKVPool.get_contiguous_buf_infos raises AttributeError.

The no-op pool (``--prefill-only-disable-kv-cache``) inherits MHA's
``get_contiguous_buf_infos``, the transfer descriptors that PD disaggregation
(``srt/disaggregation/prefill.py``, ``decode.py``) and HiCache host pools
(``mem_cache/pool_host/group.py``) register at startup. MHA's method reads
``self._kv_buffer_descs``, which MHA's ``_create_buffers`` builds and the no-op pool's
override does not, so the call crashes instead of describing the placeholders (or
refusing with an error that says why).

Exit 1 and "BUG PRESENT: ..." while the no-op pool's call raises AttributeError (the MHA
pool of the same shape is asked too, to show the method itself works); exit 0 and
"fixed" once it returns descriptors or raises an error other than AttributeError.
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
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, NoOpMHATokenToKVPool  # noqa: E402

shape = {
    "size": 16,
    "page_size": 4,
    "dtype": torch.bfloat16,
    "head_num": 1,
    "head_dim": 8,
    "layer_num": 2,
    "device": "cpu",
    "enable_memory_saver": False,
}
ptrs, lens, items = MHATokenToKVPool(**shape).get_contiguous_buf_infos()
noop = NoOpMHATokenToKVPool(**shape)
try:
    noop.get_contiguous_buf_infos()
except AttributeError as error:
    print(
        "BUG PRESENT: NoOpMHATokenToKVPool.get_contiguous_buf_infos() raised "
        f"AttributeError: {error} (the MHA pool of the same shape describes {len(ptrs)} "
        f"buffers of {lens[0]} bytes)"
    )
    sys.exit(1)
except Exception as error:  # a deliberate refusal is a fix too
    print(f"fixed: the no-op pool refuses with {type(error).__name__}: {error}")
    sys.exit(0)
print("fixed: the no-op pool describes its buffers")
sys.exit(0)
