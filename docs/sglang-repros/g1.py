"""sglang 0.5.23: MLATokenToKVPool.get_mla_kv_buffer needs Triton; its write has a torch path.

sglang's platform layer states what a device can do; ``supports_triton`` is False for
devices that cannot launch Triton (the CPU engine's ``CpuSRTPlatform`` among them), and
"core ... picks a code path the platform can serve" (``srt/platforms/interface.py``). The
MLA write honours it:
``set_mla_kv_buffer`` falls back to ``set_mla_kv_buffer_naive``, a torch scatter. The
read does not: ``get_mla_kv_buffer`` always calls ``get_mla_kv_buffer_triton``, so on
such a platform the first read through it raises. sglang's own DeepSeek caller guards
the call (``_get_mla_kv_buffer`` uses it only ``if _is_cuda or _use_aiter_gfx95`` and
reads ``get_key_buffer`` otherwise); the pool states no such requirement.

Run here on the platform sglang picks on a plain CPU machine (the CPU engine itself needs
sgl-kernel's CPU build): it declares ``supports_triton=False`` too.

Exit 1 and "BUG PRESENT: ..." while, on a platform without Triton, the write succeeds
and the read of the same rows raises; exit 0 and "fixed" once the read returns the rows
(on a platform with Triton there is nothing to show: exit 0 saying so; nor on sglang
0.5.21, whose write has no torch path either: exit 0, "not applicable").
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
from sglang.kernels.ops.kvcache import mla_buffer  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # noqa: E402
from sglang.srt.platforms import current_platform  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

if not hasattr(mla_buffer, "set_mla_kv_buffer_naive"):
    print(
        "not applicable: this sglang's set_mla_kv_buffer has no torch path either "
        "(set_mla_kv_buffer_naive came with 0.5.22): write and read both need Triton"
    )
    sys.exit(0)
if current_platform.capabilities.supports_triton:
    print("fixed: this platform launches Triton, so the read has its kernel (nothing to show)")
    sys.exit(0)

layer = SimpleNamespace(layer_id=0)
with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = MLATokenToKVPool(
        size=8,
        page_size=1,
        dtype=torch.bfloat16,
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    loc = torch.tensor([1, 2])
    nope = torch.full((2, 1, 4), 3.0, dtype=torch.bfloat16)
    rope = torch.full((2, 1, 2), 5.0, dtype=torch.bfloat16)
    pool.set_mla_kv_buffer(layer, loc, nope, rope)  # sglang's torch path
    try:
        got_nope, got_rope = pool.get_mla_kv_buffer(layer, loc)
    except Exception as error:
        print(
            f"BUG PRESENT: on {type(current_platform).__name__} (supports_triton=False) "
            "set_mla_kv_buffer wrote slots [1, 2] through its torch path, and "
            f"get_mla_kv_buffer of the same slots raised {type(error).__name__}: "
            f"{str(error)[:120]}"
        )
        sys.exit(1)

ok = torch.equal(got_nope, nope) and torch.equal(got_rope, rope)
print(f"fixed: get_mla_kv_buffer read the rows back{'' if ok else ' (but different bytes)'}")
sys.exit(0 if ok else 1)
