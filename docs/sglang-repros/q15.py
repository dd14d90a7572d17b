"""sglang 0.5.23: flat-scale MXFP8 moves and reloads need index_put on float8_e8m0fnu.

MHATokenToKVPoolMXFP8 (--kv-cache-dtype mxfp8) off 128-token pages keeps one UE8M0 scale
byte per 32 values per slot (k_scale_buffer [rows, H, D/32], dtype float8_e8m0fnu).
move_kv_cache (after moving the fp8 rows) and load_cpu_copy (after reloading them) store
those scales by tensor index assignment on the float8_e8m0fnu buffers, an index_put that
a CPU torch (2.13 here) does not implement: NotImplementedError, with the fp8 payload
already moved or reloaded and the scales not. Nothing states that the pool needs a torch
with that kernel; the interleaved layout (128-token pages) stores its scales through u32
views instead. Latent: MXFP8 KV needs a Blackwell GPU (whether CUDA's index_put takes
float8_e8m0fnu is not checked here).

Runs on CPU against sglang and torch alone: the token is placed straight into the pool's
buffers (the write path needs CUDA's store_cache, and refuses this layout: Q14). Exit 1
and "BUG PRESENT: ..." while a move or reload raises after the payload moved; exit 0 and
"fixed" once both carry the scales; "not applicable" on a release without the MXFP8 pool.
"""

import importlib.abc
import os

# sglang's MHA pool moves K/V with a Triton kernel unless this asks for its torch move.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
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
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolMXFP8
except ImportError as error:  # a release without the MXFP8 pool cannot have it
    print(f"not applicable: this sglang has no MHATokenToKVPoolMXFP8 ({error})")
    sys.exit(0)


def mxfp8_pool(page_size, size, head_dim):
    """The pool --kv-cache-dtype mxfp8 builds, for one layer and one KV head."""
    return MHATokenToKVPoolMXFP8(
        size=size,
        page_size=page_size,
        dtype=torch.float8_e4m3fn,
        head_num=1,
        head_dim=head_dim,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )


pool = mxfp8_pool(page_size=4, size=8, head_dim=32)
pool.k_buffer[0][1] = torch.ones(1, 32).to(torch.float8_e4m3fn)
pool.k_scale_buffer[0].view(torch.uint8)[1] = 130  # x8, through a uint8 view


def token(slot):
    """(fp8 bytes of K, K scale bytes) of ``slot``."""
    return (
        pool.k_buffer[0][slot].view(torch.uint8).flatten().tolist(),
        pool.k_scale_buffer[0][slot].view(torch.uint8).flatten().tolist(),
    )


def move():
    pool.move_kv_cache(torch.tensor([2]), torch.tensor([1]))


def reload():
    pool.load_cpu_copy(pool.get_cpu_copy(torch.tensor([1])), torch.tensor([3]))


failures = []
for what, call, slot in (("move 1 -> 2", move, 2), ("host copy of 1 reloaded to 3", reload, 3)):
    try:
        call()
    except NotImplementedError as error:
        failures.append(
            f"the {what} raised NotImplementedError ({error}) with the fp8 payload moved "
            f"({token(slot)[0] == token(1)[0]}) and the scales not ({token(slot)[1]}, "
            f"token 1 {token(1)[1]})"
        )
        continue
    if token(slot) != token(1):
        print(f"control failed: the {what} ran but did not carry token 1 ({token(slot)})")
        sys.exit(2)
if failures:
    print("BUG PRESENT: MHATokenToKVPoolMXFP8 at page_size=4: " + "; ".join(failures))
    sys.exit(1)
print("fixed: flat-scale MXFP8 moves and reloads carry the payload and its scales")
sys.exit(0)
