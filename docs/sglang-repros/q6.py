"""sglang 0.5.23: MHA fp4_mx_block16 host copies carry the FP4 payload without its scales.

MHATokenToKVPool built with the fp4_mx_block16 quant method (--kv-cache-dtype
fp4_mx_block16 on an MHA model) keeps per layer packed FP4 K/V in k_buffer/v_buffer
[rows, H, D/2] and one exponent byte per 16 values in k_scale_buffer/v_scale_buffer
[rows, H*D/16]. Its move_kv_cache moves the scale buffers with the payload; its
get_cpu_copy and load_cpu_copy copy k_buffer and v_buffer only. A reloaded token keeps
the target slot's old scales and dequantizes (get_key_buffer) to other values. Caller:
PD decode retraction with the cpu_tensor backup (get_cpu_copy, then load_cpu_copy on
resume). MLATokenToKVPoolFP4 has the same gap (finding Q2).

Runs on CPU against sglang and torch alone (set_kv_buffer's quantizer is torch code under
torch.compile; the first call compiles, ~30 s). Exit 1 and "BUG PRESENT: ..." while a
reloaded token's scales stay behind; exit 0 and "fixed" once it reads back equal; "not
applicable" on a release without the quant methods.
"""

import importlib.abc
import os

# sglang's MHA pool moves K/V with a Triton kernel unless this asks for its torch move.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
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

try:
    from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import (
        get_kv_cache_quant_method,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
except ImportError as error:  # a release without the quant methods cannot have it
    print(f"not applicable: this sglang has no KV-cache quant methods ({error})")
    sys.exit(0)

# As KVCacheConfigurator._build_mha_quant_method builds it for --kv-cache-dtype fp4_mx_block16.
method = get_kv_cache_quant_method("fp4_mx_block16", num_layers=1, device="cpu", page_size=4)
pool = MHATokenToKVPool(
    size=16,
    page_size=4,
    dtype=torch.float4_e2m1fn_x2,
    head_num=1,
    head_dim=32,
    layer_num=1,
    device="cpu",
    enable_memory_saver=False,
    quant_method=method,
)
layer = SimpleNamespace(layer_id=0)

# One K and V row of 32 values; block maxima 24 and 6 -> scale bytes 129 and 127.
row = torch.cat([torch.linspace(-24, 24, 16), torch.linspace(-6, 6, 16)]).to(torch.bfloat16)
pool.set_kv_buffer(layer, torch.tensor([5]), row.view(1, 1, 32), row.view(1, 1, 32))

pool.move_kv_cache(torch.tensor([9]), torch.tensor([5]))  # control: moves carry the scales
copy = pool.get_cpu_copy(torch.tensor([5]))
pool.load_cpu_copy(copy, torch.tensor([13]))  # e.g. a retracted request resumed

scales = {slot: pool.k_scale_buffer[0][slot].tolist() for slot in (5, 9, 13)}
v_scales = {slot: pool.v_scale_buffer[0][slot].tolist() for slot in (5, 9, 13)}
reads = {slot: pool.get_key_buffer(0)[slot].float().flatten() for slot in (5, 9, 13)}
payload = torch.equal(pool.k_buffer[0][13], pool.k_buffer[0][5])
if scales[9] != scales[5] or not torch.equal(reads[9], reads[5]):
    print(f"control failed: the move 5 -> 9 did not carry the scales ({scales})")
    sys.exit(2)
if scales[13] != scales[5] or v_scales[13] != v_scales[5] or not torch.equal(reads[13], reads[5]):
    lost = 2 * len(scales[5])  # K and V scale bytes of the token, per layer
    print(
        "BUG PRESENT: MHATokenToKVPool (fp4_mx_block16) host-copied slot 5 and reloaded it "
        f"to 13 with the packed payload (equal: {payload}) but not its {lost} scale bytes: "
        f"k_scale_buffer {scales}, v_scale_buffer {v_scales} (the move 5 -> 9 carried them); "
        f"get_key_buffer reads {reads[5][:3].tolist()}... at slot 5, "
        f"{reads[13][:3].tolist()}... at 13"
    )
    sys.exit(1)
print("fixed: reloaded FP4 K/V rows carry their scales")
sys.exit(0)
