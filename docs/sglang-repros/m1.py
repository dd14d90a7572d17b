"""sglang 0.5.23: MLATokenToKVPool.set_mla_kv_buffer drops every write to slot 0.

An MLA pool has two write paths for the same latent rows: ``set_kv_buffer`` (the whole
row) and ``set_mla_kv_buffer`` (nope and rope parts, what the MLA attention backends
call). ``set_kv_buffer`` writes slot 0 like any other; ``set_mla_kv_buffer`` skips every
location equal to ``reserved_skip_index`` (0, kept for CUDA-graph padding), on every
path: its Triton kernels and ``set_mla_kv_buffer_naive``, the torch body sglang runs on
platforms without Triton (this one). So the two paths disagree on one slot, and a read of
slot 0 after ``set_mla_kv_buffer`` returns the bytes an earlier write left there.

The pool is one MLA layer (kv_lora_rank 4, rope 2, bf16). Row A goes to slot 0 through
``set_kv_buffer``; row B to slots 0 and 1 through ``set_mla_kv_buffer``; then
``get_key_buffer`` is read back. Exit 1 and "BUG PRESENT: ..." while slot 0 still holds
row A; exit 0 and "fixed" once both slots hold row B; exit 3 on a release whose
``set_mla_kv_buffer`` has no torch path (0.5.21: Triton only), where a CPU cannot run it.
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
from sglang.srt.runtime_context import get_parallel  # noqa: E402

if not hasattr(mla_buffer, "set_mla_kv_buffer_naive"):
    # sglang 0.5.21: set_mla_kv_buffer always launches its Triton kernel (which skips
    # reserved_skip_index too); with no torch path there is nothing to run on a CPU.
    print(
        "cannot check here: this sglang's set_mla_kv_buffer has no torch path "
        "(set_mla_kv_buffer_naive came with 0.5.22); run it on a GPU"
    )
    sys.exit(3)

RANK, ROPE = 4, 2
layer = SimpleNamespace(layer_id=0)

# A server publishes its parallel widths before it builds pools: one rank, no DCP.
with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = MLATokenToKVPool(
        size=8,
        page_size=1,
        dtype=torch.bfloat16,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    row_a = torch.full((1, 1, RANK + ROPE), 7.0, dtype=torch.bfloat16)
    pool.set_kv_buffer(layer, torch.tensor([0]), row_a, None)
    nope_b = torch.full((2, 1, RANK), 3.0, dtype=torch.bfloat16)
    rope_b = torch.full((2, 1, ROPE), 5.0, dtype=torch.bfloat16)
    pool.set_mla_kv_buffer(layer, torch.tensor([0, 1]), nope_b, rope_b)
    keys = pool.get_key_buffer(0)

row_b = [3.0] * RANK + [5.0] * ROPE
slot0, slot1 = keys[0].flatten().tolist(), keys[1].flatten().tolist()
if slot0 != row_b:
    print(
        "BUG PRESENT: set_mla_kv_buffer(loc=[0, 1]) wrote slot 1 "
        f"({slot1}) but not slot 0: get_key_buffer(0)[0] returns {slot0}, the row "
        "set_kv_buffer wrote there before, instead of the row just written"
    )
    sys.exit(1)
print("fixed: set_mla_kv_buffer wrote slot 0 like every other slot")
sys.exit(0)
