"""sglang 0.5.23: a draft worker under --prefill-only-disable-kv-cache gets the no-op KV pool.

KVCacheConfigurator exempts draft workers from the flag twice:
``_validate_prefill_only_disable_kv_cache_pool_family`` returns early for
``is_draft_worker``, and ``_init_pools``'s closing check demands NoOpMHATokenToKVPool only
``not self.is_draft_worker``. But ``_build_mha_kv_pool`` picks NoOpMHATokenToKVPool from
``get_schedule().prefill_only_disable_kv_cache`` alone, so a draft MHA worker gets the pool
whose every write raises. (SWA and hybrid-linear drafts keep their normal pools.)

Runs sglang's own builder and check on a minimal stand-in for the configurator (the
fields those two methods read), with the flag published in a private runtime context.
Exit 1 and "BUG PRESENT: ..." while the draft gets the no-op pool; exit 0 and "fixed"
once it gets a pool it can write.
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
from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.platforms import current_platform  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

server_args = ServerArgs(
    model_path="dummy",
    is_embedding=True,
    prefill_only_disable_kv_cache=True,
    chunked_prefill_size=-1,
    disable_radix_cache=True,
    attention_backend="fa3",
)
# What _validate_prefill_only_disable_kv_cache_pool_family and _build_mha_kv_pool read
# from a KVCacheConfigurator, for a one-layer MHA draft model.
draft = SimpleNamespace(
    is_draft_worker=True,
    use_mla_backend=False,
    is_hybrid_swa=False,
    mambaish_config=None,
    kv_cache_dtype=torch.bfloat16,
    kv_cache_dtype_str="auto",
    post_capture_kv_active=False,
    kv_shard_rank=None,
    pool_page_size=1,
    device="cpu",
    model_config=SimpleNamespace(
        head_dim=8, v_head_dim=8, get_num_kv_heads=lambda tp_size, dcp_size=1: 1
    ),
    layer_info=SimpleNamespace(num_effective_layers=1, start_layer=0, end_layer=1),
)

context = runtime_context.create_context(server_args, role="test")
with runtime_context.use_context(context):
    # The draft is exempt from the family check: this returns without raising.
    KVCacheConfigurator._validate_prefill_only_disable_kv_cache_pool_family(
        draft, False, False, current_platform
    )
    pool = KVCacheConfigurator._build_mha_kv_pool(
        draft, max_total_num_tokens=8, mha_pool_class=MHATokenToKVPool
    )

layer = SimpleNamespace(layer_id=0)
row = torch.zeros((1, 1, 8), dtype=torch.bfloat16)
try:
    pool.set_kv_buffer(layer, torch.tensor([1]), row, row)
except RuntimeError as error:
    print(
        f"BUG PRESENT: the draft worker (exempt from the flag's checks) got "
        f"{type(pool).__name__}, whose first KV write raises: {str(error)[:90]}..."
    )
    sys.exit(1)
print(f"fixed: the draft worker got {type(pool).__name__}, which accepts KV writes")
sys.exit(0)
