"""sglang 0.5.23: an index-K write to a DSA skip layer launches its kernel into a 0-row buffer.

DSATokenToKVPool gives each layer in ``skip_topk_layers`` an index-K buffer with 0 pages
(the layer reuses the previous layer's top-k and stores no index keys).
``set_index_k_scale_buffer(layer_id, ...)`` does not check this: for a skip layer it
passes every Python check and launches ``_set_k_and_s_triton_kernel`` against the empty
buffer. The kernel has no bounds check, so on a GPU it writes the token's 128 key bytes
and 4 scale bytes at offsets computed from the page layout, outside the (empty)
allocation, instead of the call raising an error that names the skip layer.

On CPU Triton cannot launch, so this script replaces the kernel symbol with a recorder
(everything before the launch is sglang's own code) and computes, from the layout the
kernel documents (page row = 64 keys of 128 bytes, then 64 fp32 scales; token ``loc`` at
page ``loc // 64``, offset ``loc % 64``), the bytes the launch would write. It does not
show what a GPU does with those writes.

Exit 1 and "BUG PRESENT: ..." while the launch happens; exit 0 and "fixed" once the call
raises before launching.
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
from sglang.kernels.ops.kvcache import dsa_index_k_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

PAGE = 64  # sglang asserts 64-token DSA pages
INDEX_DIM = 128  # and 128-byte index keys

launches = []


class RecordingKernel:
    """Stands in for the Triton kernel: records each launch instead of running it."""

    def __getitem__(self, grid):
        def launch(buf_fp8, buf_fp32, loc, index_k, index_k_scale, row_stride, **meta):
            launches.append((buf_fp8.view(torch.uint8), loc.clone(), meta))

        return launch


# A single-GPU server publishes these parallel widths; a bare process must supply them.
with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = DSATokenToKVPool(
        size=PAGE,
        page_size=PAGE,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
        index_head_dim=INDEX_DIM,
        enable_memory_saver=False,
        kv_cache_dim=8,
        skip_topk_layers=[True, False],  # layer 0 reuses a top-k: no index keys
    )
    print("index-K buffer shapes:", [tuple(b.shape) for b in pool.index_k_with_scale_buffer])

    dsa_index_k_cache._set_k_and_s_triton_kernel = RecordingKernel()
    loc = torch.tensor([1])
    index_k = torch.ones((1, INDEX_DIM), dtype=torch.float32).to(torch.float8_e4m3fn)
    index_k_scale = torch.ones((1, 1), dtype=torch.float32)
    try:
        pool.set_index_k_scale_buffer(0, loc, index_k, index_k_scale)
    except Exception as error:  # refused before the launch: what a fix looks like
        print(f"set_index_k_scale_buffer(layer 0) raised {type(error).__name__}: {error}")

if launches:
    buf, loc, meta = launches[0]
    token = int(loc[0])
    page, offset = token // meta["PAGE_SIZE"], token % meta["PAGE_SIZE"]
    key_start = page * meta["BUF_NUMEL_PER_PAGE"] + offset * meta["NUM_K_ELEMS_PER_TOKEN"]
    scale_start = page * meta["BUF_NUMEL_PER_PAGE"] + meta["S_OFFSET_NBYTES_IN_PAGE"] + 4 * offset
    print(
        "BUG PRESENT: set_index_k_scale_buffer(layer_id=0, loc=[1]) on a skip layer launched "
        f"the index-K kernel into a buffer of {buf.numel()} bytes (shape "
        f"{tuple(buf.shape)}); by the kernel's layout it writes key bytes "
        f"[{key_start}, {key_start + meta['NUM_K_ELEMS_PER_TOKEN']}) and scale bytes "
        f"[{scale_start}, {scale_start + 4}) with no bounds check"
    )
    sys.exit(1)
print("fixed: an index-K write to a skip layer is refused before any kernel launch")
sys.exit(0)
