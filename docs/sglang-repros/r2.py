"""sglang 0.5.23: under decode context parallel, move_kv_cache treats widened ids as rows.

With ``--dcp-size D`` the allocator hands out *widened* token ids and each rank keeps
the latent row of id ``w`` at row ``w // D`` when ``w % D`` is its rank:
``MLATokenToKVPool.set_mla_kv_buffer`` takes widened ids (its kernel applies that owner
rule) and ``get_cpu_copy`` / ``load_cpu_copy`` collapse them with
``maybe_dcp_kernel_indices``. ``move_kv_cache`` does neither: it bounds its ids by the
rank's own rows (``size + page_size``) and moves row ``tgt`` from row ``src``. Its callers
that move accepted speculative tokens (``move_accept_tokens_to_target_kvcache``, from tree
EAGLE and ngram decoding) pass ``batch.out_cache_loc``, the same widened ids the write
was given. (Whether a server reaches this with DCP on is not verified here.)

Rank 1 of ``--dcp-size 2`` (MLA, 4 tokens, pages of 2, so rows 0..5 and widened ids
0..11): widened id 3 is written (row 1), then moved to widened id 5 (row 2, same rank).
Exit 1 and "BUG PRESENT: ..." while row 2 does not hold the written row afterwards; exit
0 and "fixed" once it does.
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
from sglang.kernels.ops.kvcache import mla_buffer  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

RANK_1_OF_2 = {
    "attn_dcp_size": 2,
    "dcp_size": 2,
    "dcp_enabled": True,
    "attn_dcp_rank": 1,
    "dcp_rank": 1,
}

with get_parallel().override(**RANK_1_OF_2):
    pool = MLATokenToKVPool(
        size=4,
        page_size=2,
        dtype=torch.bfloat16,
        kv_lora_rank=2,
        qk_rope_head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    layer = types.SimpleNamespace(layer_id=0)
    nope = torch.tensor([[[1.0, 2.0]]], dtype=torch.bfloat16)
    rope = torch.tensor([[[3.0]]], dtype=torch.bfloat16)
    if hasattr(mla_buffer, "set_mla_kv_buffer_naive"):  # a torch path (sglang 0.5.22 on)
        pool.set_mla_kv_buffer(layer, torch.tensor([3]), nope, rope)  # widened id 3: row 1
    else:  # 0.5.21 launches Triton here: store the row where its kernel's owner rule puts it
        pool.kv_buffer[0][3 // 2] = torch.cat([nope, rope], dim=-1).view(pool.kv_buffer[0][1].shape)
    written = pool.kv_buffer[0][1].clone()
    try:
        pool.move_kv_cache(torch.tensor([5]), torch.tensor([3]))  # widened 3 -> widened 5
        outcome = "accepted"
    except Exception as exc:  # an id past the rows raises on some paths
        outcome = f"{type(exc).__name__}: {exc}"
    moved = torch.equal(pool.kv_buffer[0][2], written)

if not moved:
    print(
        "BUG PRESENT: after set_mla_kv_buffer at widened id 3 (rank 1's row 1), "
        f"move_kv_cache(tgt=[5], src=[3]) was {outcome} and row 2 (widened id 5) does not "
        "hold the row: the move took the widened ids as rows"
    )
    sys.exit(1)
print("fixed: the move carried widened id 3 to widened id 5")
sys.exit(0)
