"""sglang 0.5.23: on a CPU pool, a reload restores another request's compress tails.

Retraction offloads a request with ``DSATokenToKVPool.get_cpu_copy(indices,
req_pool_index=r)`` and restores it with ``load_cpu_copy(copy, indices, req_pool_index=r)``.
The latent and index-K parts of the copy are gathered with advanced indexing (real
copies), but the request's compress tails are saved as ``tail_k[r].to("cpu",
non_blocking=True)``: on a GPU pool that copies; on a CPU pool it returns the pool's own
row ``r``. The request slot is handed to another request while the retracted one waits,
that request's tail writes land in the same row, and the reload then restores the new
request's tails as the retracted one's.

The pool: one DSA layer with index_kpool 2 and compress tails, four request slots.
Request slot 1 gets tails A (``set_compress_tail_for_request``), is copied to the host,
then slot 1 gets tails B (the slot reused), then the copy is reloaded. Exit 1 and "BUG
PRESENT: ..." while the reloaded tails are B; exit 0 and "fixed" once they are A.
(A DSA host copy calls ``torch.cuda.synchronize()`` unconditionally, finding G2; on a
torch without CUDA that one call is made a no-op here, which changes no result.)
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
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402


def kpool_page():
    """The page size of an index_kpool=2 pool this release builds: 128 tokens (the 64-token
    index pages sglang 0.5.22 on asserts), else 64 (0.5.21 asserts 64-token pages whatever
    the kpool, and keeps an index key per token)."""
    for page in (128, 64):
        try:
            with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
                DSATokenToKVPool(
                    size=page,
                    page_size=page,
                    kv_lora_rank=4,
                    dtype=torch.bfloat16,
                    qk_rope_head_dim=4,
                    layer_num=1,
                    device="cpu",
                    index_head_dim=128,
                    enable_memory_saver=False,
                    kv_cache_dim=8,
                    index_kpool=2,
                )
        except AssertionError:
            continue
        return page
    print("cannot show it here: this release builds no index_kpool=2 pool of 64 or 128 tokens")
    sys.exit(2)


PAGE, KPOOL, REQUEST = kpool_page(), 2, 1
if not torch.cuda.is_available():
    torch.cuda.synchronize = lambda device=None: None

with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = DSATokenToKVPool(
        size=2 * PAGE,
        page_size=PAGE,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=4,
        layer_num=1,
        device="cpu",
        index_head_dim=128,
        enable_memory_saver=False,
        kv_cache_dim=8,
        index_kpool=KPOOL,
        index_kpool_compress=True,
        max_running_requests=3,
    )

    def write_tails(value):
        tail = torch.full((KPOOL, 128), value, dtype=torch.bfloat16)
        pool.set_compress_tail_for_request(0, torch.tensor(REQUEST), tail, tail, KPOOL, 0)

    write_tails(1.0)  # request A's tails
    indices = torch.arange(PAGE, PAGE + 3)  # request A's tokens
    copy = pool.get_cpu_copy(indices, req_pool_index=REQUEST)
    write_tails(2.0)  # the slot is reused by request B while A is retracted
    pool.load_cpu_copy(copy, indices, req_pool_index=REQUEST)
    tail_k, _ = pool.get_compress_tail_buffers(0)
    restored = sorted(set(tail_k[REQUEST].float().flatten().tolist()))

if restored != [1.0]:
    print(
        "BUG PRESENT: request slot 1's compress tails were copied to the host as 1.0, the "
        f"slot was reused and written with 2.0, and load_cpu_copy restored {restored}: "
        "the host copy held a view of the pool, so the retracted request got the new "
        "request's tails"
    )
    sys.exit(1)
print("fixed: load_cpu_copy restored the tails that were copied")
sys.exit(0)
