"""sglang 0.5.23 (B2): MLATokenToKVPoolHost.get_contiguous_buf_infos describes token rows or
pages, not layers, outside the layer_first layout.

"Return (data_ptrs, data_lens, item_lens) in the same format as device pool": per layer i,
`data_refs[i].data_ptr()`, `kv_buffer[i].nbytes`, `token_stride_size * page_size`. The host
buffer's first dimension is the layer only in layer_first; in page_first `data_refs` is a
transposed view (so `kv_buffer[i]` is token i's row over all layers) and in
page_first_direct `data_refs[i] = kv_buffer[i]` is host page i (so a pool with fewer host
pages than layers fails to build at all, IndexError). A transfer engine registered with
these descriptors would read and write the wrong bytes.

An MLA host pool (3 layers, 36 slots, 4-token pages) in each layout. Exit 1 and
"BUG PRESENT: ..." while the descriptors do not cover each layer's bytes; 0 and "fixed"
once they do; 2 and "CANNOT RUN: ..." without sglang.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings


def torchvision_stand_in():
    """sglang's config package imports torchvision at module level (image models).
    Where no loadable torchvision exists, serve inert stand-in modules for that import."""
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
os.environ.setdefault("SGLANG_NATIVE_MOVE_KV_CACHE", "1")  # MHA pools built on CPU
import torch  # noqa: E402

T = lambda *xs: torch.tensor(list(xs), dtype=torch.int64)  # noqa: E731


def verdict(problem):
    if problem:
        print(f"BUG PRESENT: {problem}")
        sys.exit(1)
    print("fixed")
    sys.exit(0)


try:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.runtime_context import get_parallel
except ImportError as exc:  # no sglang (or not this release's modules)
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

if not hasattr(MLATokenToKVPool, "get_device_pool_infos"):
    # sglang 0.5.21 and 0.5.22 describe device pools otherwise; this script uses 0.5.23's API.
    print(
        "cannot check here: this sglang's MLA pool has no get_device_pool_infos "
        "(0.5.23's host-pool API, which this script drives)"
    )
    sys.exit(3)

LAYERS, PAGE = 3, 4
with get_parallel().override(
    attn_dcp_size=1, dcp_size=1, dcp_enabled=False, attn_dcp_rank=0, dcp_rank=0
):
    dev = MLATokenToKVPool(
        size=16,
        page_size=PAGE,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        start_layer=0,
        end_layer=LAYERS,
    )
    info = dev.get_device_pool_infos()[0].buffer_info
    problems = []
    for layout in ("layer_first", "page_first", "page_first_direct"):
        host = MLATokenToKVPoolHost(
            info,
            2.0,
            0,
            PAGE,
            layout,
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=16,
            start_layer=0,
            end_layer=LAYERS,
            target_layer_num=LAYERS,
            override_kv_cache_dim=dev.kv_cache_dim,
        )
        ptrs, lens, items = host.get_contiguous_buf_infos()
        base, total = host.kv_buffer.data_ptr(), host.kv_buffer.nbytes
        per_layer = total // LAYERS
        print(
            f"{layout:17s} buffer {tuple(host.kv_buffer.shape)} "
            f"({total} B, {per_layer} B per layer): "
            f"offsets {[p - base for p in ptrs]}, lens {lens}, item lens {items}"
        )
        if lens != [per_layer] * LAYERS or sum(lens) != total:
            problems.append(
                f"{layout}: descriptors cover {sum(lens)} of {total} bytes "
                f"(lens {lens}, items {items[0]}) instead of {LAYERS} layers of {per_layer}"
            )
verdict("; ".join(problems) if problems else None)
