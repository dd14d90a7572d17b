"""sglang 0.5.23: MLATokenToKVPoolFP4.get_kv_size_bytes (and mem_usage) leave out kv_scale_buffer.

The MLA FP4 pool allocates, per layer, kv_buffer [rows, 1, (R+P)/2] and kv_scale_buffer
[rows, (R+P)/16] uint8. It inherits MLATokenToKVPool.get_kv_size_bytes, which sums
kv_buffer only, so the reported size (logged at startup, and mem_usage) is short by the
scale bytes, 1/9 of the pool. sglang's own configurator counts those scale bytes in the
cell size it sizes the pool with (DefaultPoolConfigurator._compute_cell_size, FP4 MLA
branch), and the quantized MHA pools count theirs (MHATokenToKVPool.get_kv_size_bytes adds
k_scale_buffer/v_scale_buffer; MHATokenToKVPoolMXFP8 likewise).

Runs on CPU against sglang and torch alone, in a few seconds. Exit 1 and "BUG PRESENT: ..."
while the report leaves the scales out; exit 0 and "fixed" once it equals the bytes held.
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

try:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPoolFP4
except ImportError as error:  # a release without the quantized pools (checked: 0.5.23)
    print(f"cannot show it here: this sglang has no FP4 KV pools ({error})")
    sys.exit(2)

pool = MLATokenToKVPoolFP4(
    size=64,
    page_size=16,
    dtype=torch.float4_e2m1fn_x2,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    layer_num=2,
    device="cpu",
    enable_memory_saver=False,
)
payload = sum(t.nbytes for t in pool.kv_buffer)
scales = sum(t.nbytes for t in pool.kv_scale_buffer)
reported = int(pool.get_kv_size_bytes())
mem_usage_bytes = round(pool.mem_usage * (1 << 30))
if reported != payload + scales:
    print(
        f"BUG PRESENT: get_kv_size_bytes() = {reported} (mem_usage {mem_usage_bytes} bytes) "
        f"for an MLA FP4 pool holding {payload} payload + {scales} scale bytes = "
        f"{payload + scales}; the configurator's cell size counts the scales "
        "((R+P)/2 + (R+P)/16 bytes per token per layer)"
    )
    sys.exit(1)
print("fixed: get_kv_size_bytes counts the FP4 scale buffers")
sys.exit(0)
