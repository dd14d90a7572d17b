"""sglang 0.5.23: MHA pools with a KV-cache quant method shape V by head_dim, not v_head_dim.

MHATokenToKVPool takes v_head_dim and keeps it (get_v_head_dim(), the buffer info it
reports); without a quant method it shapes V by it, and sglang serves MHA models whose V
rows are narrower than K's (ModelConfig.has_asymmetric_kv: MiMoV2, 192 / 128). With a
quant method (what KVCacheConfigurator._build_mha_quant_method passes: cpu_fp8_e4m3 for
an fp8 cache on a CPU server, fp4_mx_block16 for --kv-cache-dtype fp4_mx_block16),
_create_quantized_buffers hands the method head_dim only, so V and its scales are built
head_dim wide: V holds the wrong number of bytes per token, and a write of V rows of
v_head_dim values (what attention produces) raises.

Runs on CPU against sglang and torch alone (the fp4_mx_block16 write's quantizer is torch
code under torch.compile; the first call compiles, ~30 s). Exit 1 and "BUG PRESENT: ..."
while a quantized pool's V is not v_head_dim wide; exit 0 and "fixed" once V rows of
v_head_dim values are stored; "not applicable" on a release without the quant methods.
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

try:
    from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import (
        get_kv_cache_quant_method,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
except ImportError as error:  # a release without the quant methods cannot have it
    print(f"not applicable: this sglang has no KV-cache quant methods ({error})")
    sys.exit(0)

HEADS, K_DIM, V_DIM = 2, 32, 16  # K rows wider than V rows, as in MiMoV2
common = dict(size=8, page_size=4, head_num=HEADS, head_dim=K_DIM, v_head_dim=V_DIM,
              layer_num=1, device="cpu", enable_memory_saver=False)  # fmt: skip
layer = SimpleNamespace(layer_id=0)

# Control: the plain pool (bf16) keeps V rows of v_head_dim values.
plain = MHATokenToKVPool(dtype=torch.bfloat16, **common)
assert plain.v_buffer[0].shape[-1] == V_DIM, plain.v_buffer[0].shape

# The methods as the configurator builds them: (dtype, values per stored byte, arguments).
pools = {
    "cpu_fp8_e4m3": (torch.float8_e4m3fn, 1, {}),
    "fp4_mx_block16": (torch.float4_e2m1fn_x2, 2, dict(num_layers=1, device="cpu", page_size=4)),
}
broken = []
for name, (dtype, per_byte, arguments) in pools.items():
    method = get_kv_cache_quant_method(name, **arguments)
    pool = MHATokenToKVPool(dtype=dtype, quant_method=method, **common)
    v_bytes = pool.v_buffer[0][0].numel() * pool.v_buffer[0].element_size()
    want = HEADS * V_DIM // per_byte
    k = torch.ones(1, HEADS, K_DIM, dtype=torch.bfloat16)
    v = torch.ones(1, HEADS, V_DIM, dtype=torch.bfloat16)
    try:
        pool.set_kv_buffer(layer, torch.tensor([5]), k, v)
        write = "stored"
    except Exception as error:  # the V rows do not fit the buffer built for head_dim
        write = f"raises {type(error).__name__}: {str(error).splitlines()[0]}"
    if v_bytes != want or write != "stored":
        broken.append(
            f"{name}: get_v_head_dim()={pool.get_v_head_dim()} but v_buffer rows are "
            f"{tuple(pool.v_buffer[0].shape[1:])} ({v_bytes} bytes a token, {want} needed); "
            f"set_kv_buffer with V rows of {V_DIM} values {write}"
        )
if broken:
    print(
        f"BUG PRESENT: MHATokenToKVPool with a quant method ignores v_head_dim={V_DIM} "
        f"(head_dim={K_DIM}; the plain pool keeps V {V_DIM} wide): " + "; ".join(broken)
    )
    sys.exit(1)
print("fixed: quantized MHA pools keep V rows of v_head_dim values")
sys.exit(0)
