"""sglang 0.5.23: FP4 pools describe only their payload to the KV transfer path, never their scales.

PD disaggregation registers and ships a pool's get_contiguous_buf_infos() (plus state
components from setup_state_kv_args). For MHATokenToKVPool built with an FP4 quant
method (fp4_mx_block16, nvfp4) those descriptors cover k_buffer/v_buffer (packed FP4)
only, and for MLATokenToKVPoolFP4 kv_buffer only; no descriptor and no state component
covers k_scale_buffer/v_scale_buffer/kv_scale_buffer. The decode side therefore receives
FP4 payload whose block scales stay as it allocated them (zeros) and dequantizes garbage.
MHATokenToKVPoolMXFP8 shows the intended contract: get_kv_scale_buf_infos(), shipped as
StateType.BLOCK_SCALE. sglang refuses PD only for SM100 native-layout NVFP4 with
trtllm_mha (kv_cache_hook.handle_kv4_compatibility).

Runs on CPU against sglang and torch alone, in a few seconds (pools are only built).
Exit 1 and "BUG PRESENT: ..." while a scale buffer is outside every described range;
exit 0 and "fixed" once every scale buffer is described.
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
    from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import (
        NVFP4KVCacheMethod,
        get_kv_cache_quant_method,
    )
    from sglang.srt.mem_cache.memory_pool import (
        MHATokenToKVPool,
        MLATokenToKVPoolFP4,
    )
except ImportError as error:  # a release without the quantized pools (checked: 0.5.23)
    print(f"cannot show it here: this sglang has no FP4 KV pools ({error})")
    sys.exit(2)

FP4 = torch.float4_e2m1fn_x2
common = dict(size=16, page_size=4, dtype=FP4, layer_num=2, device="cpu",
              enable_memory_saver=False)  # fmt: skip
nvfp4 = NVFP4KVCacheMethod(num_layers=2, device="cpu", page_size=4, native_scale_layout=False)
nvfp4.configure_attention_backends("flashinfer", "trtllm_mha")  # the default NVFP4 pair
pools = {
    "MHA fp4_mx_block16": MHATokenToKVPool(
        **common, head_num=2, head_dim=64,
        quant_method=get_kv_cache_quant_method("fp4_mx_block16"),
    ),
    "MHA nvfp4": MHATokenToKVPool(**common, head_num=2, head_dim=64, quant_method=nvfp4),
    "MLA FP4": MLATokenToKVPoolFP4(**common, kv_lora_rank=512, qk_rope_head_dim=64),
}  # fmt: skip


def described(ptr, nbytes, infos):
    ptrs, lens, _ = infos
    return any(p <= ptr and ptr + nbytes <= p + n for p, n in zip(ptrs, lens, strict=True))


missing = []
for name, pool in pools.items():
    infos = pool.get_contiguous_buf_infos()
    scale_lists = [
        getattr(pool, attr, None)
        for attr in ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer")
    ]
    scales = [t for lst in scale_lists if lst is not None for t in lst]
    undescribed = [t for t in scales if not described(t.data_ptr(), t.nbytes, infos)]
    extra = hasattr(pool, "get_kv_scale_buf_infos")
    if undescribed:
        missing.append(
            f"{name}: {len(infos[0])} descriptors ({sum(infos[1])} bytes), "
            f"{len(undescribed)} of {len(scales)} scale buffers "
            f"({sum(t.nbytes for t in undescribed)} bytes) outside them, "
            f"get_kv_scale_buf_infos: {extra}"
        )
if missing:
    print("BUG PRESENT: FP4 scale buffers are not described for KV transfer: " + "; ".join(missing))
    sys.exit(1)
print("fixed: every FP4 scale buffer is described for KV transfer")
sys.exit(0)
