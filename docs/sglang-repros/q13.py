"""sglang 0.5.23: the MXFP8 pool's moves and reloads into slot 0 carry the payload, not the scales.

MHATokenToKVPoolMXFP8 (--kv-cache-dtype mxfp8) keeps fp8 K/V rows in k_buffer/v_buffer and,
on 128-token pages, one UE8M0 scale byte per 32 values in FA4's interleaved layout
(k_scale_buffer [pages, H, 32, 4, D/32]: token t of a page at [page, h, t % 32, t // 32]).
Slot 0 is the CUDA-graph padding sink: set_kv_buffer's kernels (store_cache,
store_sf_interleaved, the fused quant-store) skip it. move_kv_cache and load_cpu_copy copy
the fp8 rows with torch indexing, which writes slot 0, and store the scales with
store_sf_interleaved, which skips it: a move or reload into slot 0 leaves the moved payload
beside slot 0's old scales, so slot 0 dequantizes to other values than its source.
Latent: no request is given slot 0.

Runs on CPU against sglang and torch alone: sglang's own Triton kernel runs under Triton's
interpreter (TRITON_INTERPRET=1); the source token is placed straight into the pool's
buffers (the write path needs CUDA's store_cache). Exit 1 and "BUG PRESENT: ..." while slot
0 gets the payload without its scales; exit 0 and "fixed" once both or neither arrive;
"not applicable" on a release without the MXFP8 pool.
"""

import importlib.abc
import os

# sglang's MHA pool moves K/V with a Triton kernel unless this asks for its torch move.
os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
# Triton's interpreter runs sglang's store_sf_interleaved kernel on CPU tensors.
os.environ["TRITON_INTERPRET"] = "1"
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


pool = mxfp8_pool(page_size=128, size=128, head_dim=128)
k_sf = pool.k_scale_buffer[0].view(torch.uint8)  # [pages, 1, 32, 4, 4]
# Token 1: fp8 rows of 1.0 with scale byte 130 (x8) in each block, at its documented
# interleaved place; token 2 (the control target) and slot 0 hold zeros.
pool.k_buffer[0][1] = torch.ones(1, 128).to(torch.float8_e4m3fn)
pool.v_buffer[0][1] = torch.ones(1, 128).to(torch.float8_e4m3fn)
k_sf[0, 0, 1 % 32, 1 // 32] = 130
pool.v_scale_buffer[0].view(torch.uint8)[0, 0, 1 % 32, 1 // 32] = 130


def token(slot):
    """(fp8 bytes of K, K scale bytes) of ``slot``."""
    page, offset = divmod(slot, 128)
    return (
        pool.k_buffer[0][slot].view(torch.uint8).flatten().tolist(),
        k_sf[page, 0, offset % 32, offset // 32].tolist(),
    )


try:
    pool.move_kv_cache(torch.tensor([2]), torch.tensor([1]))  # control: an ordinary slot
except RuntimeError as error:  # a triton without its interpreter
    print(f"cannot check here: store_sf_interleaved did not run on CPU ({error})")
    sys.exit(3)
if token(2) != token(1):
    print(f"control failed: the move 1 -> 2 did not carry token 1 ({token(2)[1]})")
    sys.exit(2)
pool.move_kv_cache(torch.tensor([0]), torch.tensor([1]))
moved = (token(0)[0] == token(1)[0], token(0)[1] == token(1)[1])
held = token(0)[1]
copy = pool.get_cpu_copy(torch.tensor([1]))
pool.k_buffer[0][0] = torch.zeros(1, 128).to(torch.float8_e4m3fn)  # slot 0 back to zeros
pool.load_cpu_copy(copy, torch.tensor([0]))  # and token 1 reloaded into it
reloaded = (token(0)[0] == token(1)[0], token(0)[1] == token(1)[1])
if moved[0] != moved[1] or reloaded[0] != reloaded[1]:
    print(
        "BUG PRESENT: MHATokenToKVPoolMXFP8 moved token 1 into slot 0 with its fp8 payload "
        f"(arrived: {moved[0]}) but not its scales (arrived: {moved[1]}; slot 0 holds "
        f"{held}, token 1 {token(1)[1]}); a reload into slot 0 the same (payload "
        f"{reloaded[0]}, scales {reloaded[1]}). The move 1 -> 2 carried both: "
        "store_sf_interleaved skips slot 0 while the payload copy writes it"
    )
    sys.exit(1)
print("fixed: a move or reload into slot 0 carries the payload and its scales alike")
sys.exit(0)
