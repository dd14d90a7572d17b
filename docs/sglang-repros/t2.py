"""sglang 0.5.23: DSA get_kv_size_bytes and mem_usage leave out the kpool compress tails.

A ``DSATokenToKVPool`` with ``index_kpool > 1`` and ``index_kpool_compress`` allocates,
for each layer that computes top-k, a bf16 ring of keys and one of scores for every
request slot (``_compress_tail_k``, ``_compress_tail_score``: ``[max_running_requests + 1,
index_kpool + tail_extra_slots, index_head_dim]``) and describes them in
``get_compress_tail_buf_infos``. ``get_kv_size_bytes`` (and so ``mem_usage``) counts the
latent and index-K buffers only. At production scale (61 layers, 256 request slots,
kpool 4) that is 32 MiB a rank does not report.

The pool below (one layer, kpool 2 with compress tails, 8 request slots) is asked for its
bytes and every tensor it allocated is measured. Exit 1 and "BUG PRESENT: ..." while the
report leaves bytes out; exit 0 and "fixed" once it counts them.
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


PAGE = kpool_page()
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
        index_kpool=2,
        index_kpool_compress=True,
        max_running_requests=8,
    )

report = pool.get_kv_size_bytes()  # one number for a DSA pool (K and V for MHA)
reported = int(sum(report)) if isinstance(report, tuple) else int(report)
held = {
    name: sum(t.nbytes for t in getattr(pool, name))
    for name in (
        "kv_buffer",
        "index_k_with_scale_buffer",
        "_compress_tail_k",
        "_compress_tail_score",
    )
}
described = sum(pool.get_compress_tail_buf_infos()[1])
allocated = sum(held.values())
if reported < allocated:
    print(
        f"BUG PRESENT: get_kv_size_bytes() reports {reported} bytes "
        f"(mem_usage {pool.mem_usage:.9f} GB) but the pool holds {allocated}: the latent "
        f"({held['kv_buffer']}) and index-K ({held['index_k_with_scale_buffer']}) bytes are "
        f"counted, the compress tails "
        f"({held['_compress_tail_k'] + held['_compress_tail_score']} bytes, described by "
        f"get_compress_tail_buf_infos: {described}) are not"
    )
    sys.exit(1)
print(f"fixed: the pool reports {reported} bytes and holds {allocated}")
sys.exit(0)
