"""sglang 0.5.21: on a platform without CUDA, set_kv_buffer_prefix_valid stores fp8 rows
converted twice.

``MHATokenToKVPool.set_kv_buffer_prefix_valid`` (the prefix-valid write of a batch whose
rows commit only their first tokens) first casts the K/V rows to the pool's fp8 dtype and
views them as the ``uint8`` store dtype. On a platform that is neither CUDA nor HIP (CPU,
XPU, NPU, ...) it then hands those ``uint8`` rows to ``set_kv_buffer``, which sees a dtype
that is not the pool's and converts them again, by value: the byte 0x30 (0.5 in e4m3) is
stored as the fp8 number 48.0. With ``k_scale`` the rows are also divided twice. sglang
0.5.22 converts after that branch.

An fp8 (e4m3) pool gets the row [0.5, -2.0] at slot 1 through a prefix-valid write that
commits it. Exit 1 and "BUG PRESENT: ..." while the slot holds anything else; exit 0 and
"fixed" once it holds the row.
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
import os  # noqa: E402

import torch  # noqa: E402

# sglang's MHA pool moves K/V with Triton unless this asks for its torch move.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

pool = MHATokenToKVPool(
    size=4,
    page_size=1,
    dtype=torch.float8_e4m3fn,
    head_num=1,
    head_dim=2,
    layer_num=1,
    device="cpu",
    enable_memory_saver=False,
)
row = torch.tensor([[[0.5, -2.0]]]).to(torch.float8_e4m3fn)
pool.set_kv_buffer_prefix_valid(
    SimpleNamespace(layer_id=0), torch.tensor([[1]]), torch.tensor([1]), row, row.clone()
)
stored = pool.get_key_buffer(0)[1].float().flatten().tolist()
if stored != [0.5, -2.0]:
    print(
        "BUG PRESENT: set_kv_buffer_prefix_valid(loc=[[1]], commit_lens=[1]) of the fp8 row "
        f"[0.5, -2.0] stored {stored} at slot 1: its uint8 bytes were converted to fp8 "
        "again, by value"
    )
    sys.exit(1)
print("fixed: the prefix-valid write stored the fp8 row as given")
sys.exit(0)
