"""sglang 0.5.23: MLATokenToKVPoolFP4 moves and host-copies its FP4 payload without its scales.

MLATokenToKVPoolFP4 (--kv-cache-dtype fp4_mx_block16/nvfp4 on an MLA model) keeps per
layer a packed FP4 latent buffer kv_buffer [rows, 1, (R+P)/2] and one scale byte per 16
values in kv_scale_buffer [rows, (R+P)/16]. It inherits move_kv_cache, get_cpu_copy and
load_cpu_copy from MLATokenToKVPool, which touch kv_buffer only. A moved or reloaded
token keeps the target slot's old scales and dequantizes (get_key_buffer) to other
values. Callers: move_accept_tokens_to_target_kvcache (speculative decoding, EAGLE
tree drafts with topk > 1, spec v2), and PD decode retraction (cpu_tensor backup).

Runs on CPU against sglang and torch alone (set_kv_buffer's quantizer is torch code under
torch.compile; the first call compiles, ~30 s). Exit 1 and "BUG PRESENT: ..." while the
scales stay behind; exit 0 and "fixed" once moved and reloaded tokens read back equal.
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
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPoolFP4
except ImportError as error:  # a release without the quantized pools (checked: 0.5.23)
    print(f"cannot show it here: this sglang has no FP4 KV pools ({error})")
    sys.exit(2)
from sglang.srt.runtime_context import get_parallel  # noqa: E402

# MLA pools read the decode-context-parallel width a launched server publishes: one rank.
ONE_RANK = get_parallel().override(
    attn_dcp_size=1, dcp_size=1, dcp_enabled=False, attn_dcp_rank=0, dcp_rank=0
)
ONE_RANK.__enter__()  # kept for the life of the script

pool = MLATokenToKVPoolFP4(
    size=16,
    page_size=4,
    dtype=torch.float4_e2m1fn_x2,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    layer_num=1,
    device="cpu",
    enable_memory_saver=False,
)
layer = SimpleNamespace(layer_id=0)

# One latent row (nope 32 + rope 16 values); block maxima 24, 12, 6 -> scales 129, 128, 127.
row = torch.cat(
    [torch.linspace(-24, 24, 16), torch.linspace(-12, 12, 16), torch.linspace(-6, 6, 16)]
).to(torch.bfloat16)
pool.set_kv_buffer(layer, torch.tensor([5]), row.view(1, 1, 48), None)

pool.move_kv_cache(torch.tensor([9]), torch.tensor([5]))  # e.g. an accepted draft token
copy = pool.get_cpu_copy(torch.tensor([5]))
pool.load_cpu_copy(copy, torch.tensor([13]))  # e.g. a retracted request resumed

scales = {slot: pool.kv_scale_buffer[0][slot].tolist() for slot in (5, 9, 13)}
reads = {slot: pool.get_key_buffer(0)[slot].float().flatten() for slot in (5, 9, 13)}
payload = {slot: torch.equal(pool.kv_buffer[0][slot], pool.kv_buffer[0][5]) for slot in (9, 13)}
broken = [s for s in (9, 13) if scales[s] != scales[5] or not torch.equal(reads[s], reads[5])]
if broken:
    print(
        "BUG PRESENT: MLATokenToKVPoolFP4 moved (5 -> 9) and host-copied (5 -> 13) the "
        f"packed payload (equal: {payload}) but not kv_scale_buffer: scales {scales}; "
        f"get_key_buffer reads {reads[5][:3].tolist()}... at slot 5, "
        f"{reads[9][:3].tolist()}... at 9, {reads[13][:3].tolist()}... at 13"
    )
    sys.exit(1)
print("fixed: moved and reloaded FP4 latent rows carry their scales")
sys.exit(0)
