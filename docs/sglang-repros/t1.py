"""sglang 0.5.21-0.5.23: a DSA move with index_kpool > 1 moves the latent rows, then fails.

``DSATokenToKVPool.move_kv_cache(tgt_loc, src_loc)`` first moves the latent KV rows
(``MLATokenToKVPool.move_kv_cache``), then asks the index-K cache to move the index keys.
With ``index_kpool > 1`` one index key serves ``index_kpool`` tokens, and sglang 0.5.23's
``IndexKeyCache.move`` asserts ``index_kpool == 1`` ("Moving pooled index keys requires
regrouping tokens"); 0.5.21 and 0.5.22 index the page rows with the token ids instead
(finding X1) and raise ``IndexError``. Either way the call raises with the latent rows
already moved: half a move done, the other half refused.

A pool with ``index_kpool=2`` (128-token pages, 64-token index pages as sglang 0.5.22 on
asserts; 64-token pages on 0.5.21, which asserts them whatever the kpool) gets one latent
row written at token 130 and a move of token 130 to token 140. Exit 1 and "BUG PRESENT:
..." while the refused move has changed the pool; exit 0 and "fixed" once the move either
succeeds whole or changes nothing.
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
if not torch.cuda.is_available():  # DSA calls torch.cuda.synchronize() anyway (finding G2)
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
        index_kpool=2,
    )
    pool.kv_buffer[0][130] = 1.0
    before = pool.kv_buffer[0].clone()
    try:
        pool.move_kv_cache(torch.tensor([140]), torch.tensor([130]))
        outcome = "accepted"
    except Exception as exc:  # the refusal is fine; what it left behind is the question
        outcome = f"{type(exc).__name__}: {exc}"
    changed = not torch.equal(pool.kv_buffer[0], before)

if outcome != "accepted" and changed:
    print(
        f"BUG PRESENT: move_kv_cache on an index_kpool=2 DSA pool raised ({outcome}) after"
        " moving the latent row of token 130 to token 140"
    )
    sys.exit(1)
print(f"fixed: the move was {'accepted' if outcome == 'accepted' else 'refused whole'}")
sys.exit(0)
