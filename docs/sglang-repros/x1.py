"""sglang 0.5.21, 0.5.22: DSA move_kv_cache moves index-K page rows addressed by token ids.

``DSATokenToKVPool.move_kv_cache(tgt_loc, src_loc)`` moves the latent rows
(``MLATokenToKVPool.move_kv_cache``), then ``IndexKeyCache.move`` moves the index keys. Its
buffer has one row per 64-token page (each row: 64 fp8 keys, then their fp32 scales), but
the move does ``index_k[tgt_loc] = index_k[src_loc]`` with the token ids: it copies whole
page rows, the rows whose numbers are the token ids. A token's key does not move; the page
whose number is the target id is overwritten with another page's keys; a token id past
the number of pages raises ``IndexError`` after the latent rows already moved. Speculative
decoding's accepted-token move is the caller. sglang 0.5.23 moves each token's key and
scale bytes.

The pool has four 64-token pages of one layer. Token 1 (page 0) and token 69 (page 1) get
index keys; token 1 is moved to token 2, then to token 193. Exit 1 and "BUG PRESENT: ..."
while a move does not carry one token's key (or disturbs other pages, or raises); exit 0
and "fixed" once it does.
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

PAGE, KEY = 64, 128  # 64-token pages (sglang asserts them), 128-byte index keys

with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = DSATokenToKVPool(
        size=4 * PAGE,
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
    buffer = pool.index_k_with_scale_buffer[0]  # [pages, 64 * (128 + 4)] bytes

    def key(token):
        """Token ``token``'s key bytes, where the buffer's own layout puts them."""
        offset = token % PAGE
        return buffer[token // PAGE, offset * KEY : (offset + 1) * KEY]

    key(1).fill_(7)  # token 1, page 0
    key(PAGE + 5).fill_(9)  # token 69, page 1
    pool.move_kv_cache(torch.tensor([2]), torch.tensor([1]))
    moved = bool((key(2) == 7).all())
    clobbered = bool((key(2 * PAGE + 5) == 9).all())  # page 2 took page 1's keys?
    try:
        pool.move_kv_cache(torch.tensor([3 * PAGE + 1]), torch.tensor([1]))
        far = None
    except IndexError as error:
        far = f"IndexError: {error}"

problems = []
if not moved:
    problems.append("move_kv_cache(tgt=[2], src=[1]) left token 2's index key empty")
if clobbered:
    problems.append(
        "and overwrote page 2 (tokens 128..191) with page 1's row: token 133 now holds "
        "token 69's key"
    )
if far is not None:
    problems.append(f"move_kv_cache(tgt=[{3 * PAGE + 1}], src=[1]) raised {far}")
if problems:
    print("BUG PRESENT: " + "; ".join(problems))
    sys.exit(1)
print("fixed: move_kv_cache carries one token's index key and leaves other pages alone")
sys.exit(0)
