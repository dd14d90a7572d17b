"""sglang 0.5.23: DSA host copies lose index keys unless the indices are one page-aligned run.

``DSATokenToKVPool.get_cpu_copy(indices)`` copies the latent KV token by token, but the
index-K cache (``IndexKeyCache.cpu_copy``) copies whole pages, choosing them as
``indices[::page_size] // page_size``: the page of every 64th listed token. That is every
page the indices touch only when they are one run that starts on a page boundary (one
request's slots, as ``ScheduleBatch``'s retraction passes them). For any other index set,
pages are skipped and ``load_cpu_copy`` silently does not restore those tokens' index keys
(and the reload rewrites whole pages, including tokens that were not listed).

Shown for two index sets:
  A. two requests' slots concatenated: 64..133 (a full page and 6 tokens) then 192..201;
  B. one run that does not start on a page boundary: 120..200 (pages 1, 2 and 3).

The index buffer is filled directly in its documented layout (page row: 64 keys of 128
bytes, then 64 fp32 scales), then copied, cleared (as when retracted pages are reused)
and reloaded. Exit 1 and "BUG PRESENT: ..." while a listed token's index key is not
restored; exit 0 and "fixed" once every listed token round-trips.
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

PAGE = 64  # sglang asserts 64-token DSA pages
INDEX_DIM = 128  # and 128-byte index keys
KEY_BYTES = PAGE * INDEX_DIM

if not torch.cuda.is_available():
    # The DSA host copy calls torch.cuda.synchronize() unconditionally (finding G2); CPU work is
    # already synchronous, so on a CPU-only torch the call is made a no-op.
    torch.cuda.synchronize = lambda device=None: None


def token_bytes(buffer, token):
    """The index key (128 bytes) and scale (4 bytes) of ``token`` in a page-row buffer."""
    page, offset = token // PAGE, token % PAGE
    key = buffer[page, offset * INDEX_DIM : (offset + 1) * INDEX_DIM]
    scale = buffer[page, KEY_BYTES + 4 * offset : KEY_BYTES + 4 * (offset + 1)]
    return torch.cat([key, scale])


def lost_tokens(pool, indices):
    """Listed tokens whose index bytes do not survive copy, clear and reload."""
    buffer = pool.index_k_with_scale_buffer[0]
    generator = torch.Generator().manual_seed(0)
    buffer.copy_(torch.randint(1, 256, buffer.shape, dtype=torch.uint8, generator=generator))
    original = buffer.clone()
    copy = pool.get_cpu_copy(indices)
    buffer.zero_()  # the pages are reused by other requests while this one is offloaded
    pool.load_cpu_copy(copy, indices)
    return [
        token
        for token in indices.tolist()
        if not torch.equal(token_bytes(buffer, token), token_bytes(original, token))
    ]


with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
    pool = DSATokenToKVPool(
        size=5 * PAGE,
        page_size=PAGE,
        kv_lora_rank=4,
        dtype=torch.bfloat16,
        qk_rope_head_dim=4,
        layer_num=1,
        device="cpu",
        index_head_dim=INDEX_DIM,
        enable_memory_saver=False,
        kv_cache_dim=8,
    )
    cases = {
        "two requests 64..133 + 192..201": torch.cat(
            [torch.arange(64, 134), torch.arange(192, 202)]
        ),
        "one run 120..200 (not page-aligned)": torch.arange(120, 201),
    }
    found = {name: lost_tokens(pool, indices) for name, indices in cases.items()}

problems = [
    f"{name}: index keys of {len(lost)} listed tokens not restored "
    f"(tokens {lost[0]}..{lost[-1]}, page(s) {sorted({t // PAGE for t in lost})})"
    for name, lost in found.items()
    if lost
]
if problems:
    print("BUG PRESENT: DSA get_cpu_copy/load_cpu_copy lose index keys; " + "; ".join(problems))
    sys.exit(1)
print("fixed: every listed token's index key round-trips through the host copy")
sys.exit(0)
