"""sglang 0.5.21: under decode context parallel, the default DSA index-K buffer holds a key
per physical token while writes carry widened ids.

Under ``--dcp-size N`` a rank's latent rows hold every N-th token, and callers name tokens
by widened id (``(size + page_size) * N`` of them); the DSA indexer writes index keys at
``forward_batch.out_cache_loc``, widened ids, and index keys are not split by rank. Without
an explicit ``index_buf_size``, ``DSATokenToKVPool`` sizes its index-K buffer for ``size``
tokens, the physical ones: the keys of the widened ids past it go past the end of the
buffer (the Triton kernel has no bounds check). sglang 0.5.22 sizes it
``(size + page_size) * dcp_size - page_size``. Whether 0.5.21 serves DSA under
``--dcp-size > 1`` at all was not verified.

Rank 0 of ``--dcp-size 2`` with one 64-token page gets an index-K write for widened id
254 (one of rank 0's ids). sglang's kernel is replaced by one that records its launch (no
write happens). Exit 1 and "BUG PRESENT: ..." while the launch addresses a page past the
buffer; exit 0 and "fixed" once the buffer holds it.
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
from sglang.srt.mem_cache import index_key_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

# The kernel's module moves between releases: take the one the index-K cache uses.
kernels = next(
    module
    for module in vars(index_key_cache).values()
    if isinstance(module, types.ModuleType) and hasattr(module, "_set_k_and_s_triton_kernel")
)
PAGE, KEY = 64, 128
launches = []


class RecordingKernel:
    """Records each launch of the index-K kernel instead of running it."""

    def __getitem__(self, grid):
        def launch(buf_fp8, buf_fp32, loc, index_k, index_k_scale, row_stride, **meta):
            launches.append((buf_fp8, loc.clone(), meta))

        return launch


widths = dict(attn_dcp_size=2, dcp_size=2, dcp_enabled=True, attn_dcp_rank=0, dcp_rank=0)
with get_parallel().override(**widths):
    pool = DSATokenToKVPool(
        size=PAGE,
        page_size=PAGE,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=4,
        layer_num=1,
        device="cpu",
        index_head_dim=KEY,
        enable_memory_saver=False,
        kv_cache_dim=8,
    )
    widened = (PAGE + PAGE) * 2  # ids 0..255 name this rank's latent rows and the other's
    kernels._set_k_and_s_triton_kernel = RecordingKernel()
    key = torch.ones((1, KEY)).to(torch.float8_e4m3fn)
    pool.set_index_k_scale_buffer(0, torch.tensor([widened - 2]), key, torch.ones((1, 1)))

buffer, loc, meta = launches[0]
token = int(loc[0])
page = token // meta["PAGE_SIZE"]
pages = buffer.shape[0]
if page >= pages:
    print(
        f"BUG PRESENT: rank 0 of --dcp-size 2 (widened ids 0..{widened - 1}) launched the "
        f"index-K write of widened id {token} at page {page}, but the default index-K buffer "
        f"holds {pages} pages ({pages * PAGE} token slots): the kernel writes past its end"
    )
    sys.exit(1)
print(f"fixed: widened id {token} lands in page {page} of the {pages} the buffer holds")
sys.exit(0)
