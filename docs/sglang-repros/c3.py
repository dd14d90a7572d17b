"""sglang 0.5.23: pools sized by the configurator exceed the memory budget by a page.

``DefaultPoolConfigurator.calculate_pool_sizes(available_bytes, page_size)`` answers
``available_bytes // cell_size`` tokens, rounded down to whole pages. Every pool it is
then built with holds ``size + page_size`` rows (the padding page that absorbs padded
tokens' writes; DSA index buffers round up further), so the pool takes
``page_size * cell_size`` bytes more than the budget it was sized for. The budget is
the memory sglang measured as free after reserving its other headroom.

Shown with a plain MHA model (2 layers, 2 KV heads, head dim 8, bf16): its cell size, as
``_compute_cell_size`` computes it for MHA (layers * heads * (head_dim + v_head_dim) *
itemsize), is checked against the built pool's own bytes per row. The configurator
object is created without its constructor and given that cell size (its constructor
needs a loaded model); ``calculate_pool_sizes`` itself is sglang's.

Exit 1 and "BUG PRESENT: ..." while the pool exceeds the budget; exit 0 and "fixed"
once it fits.
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
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator  # noqa: E402

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 8, 16
cell_size = LAYERS * HEADS * (HEAD_DIM + HEAD_DIM) * torch.bfloat16.itemsize  # 128 bytes
budget = 64 * cell_size  # room for exactly 64 tokens

configurator = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)
configurator._cell_size = cell_size
configurator._fixed_overhead_bytes = 0  # no KV-shard scratch
tokens = configurator.calculate_pool_sizes(budget, PAGE).max_total_num_tokens

pool = MHATokenToKVPool(
    size=tokens,
    page_size=PAGE,
    dtype=torch.bfloat16,
    head_num=HEADS,
    head_dim=HEAD_DIM,
    layer_num=LAYERS,
    device="cpu",
    enable_memory_saver=False,
)
k_bytes, v_bytes = pool.get_kv_size_bytes()
pool_bytes = int(k_bytes + v_bytes)
rows = pool.k_buffer[0].shape[0]
assert pool_bytes == rows * cell_size, "the cell size must match the pool's bytes per row"

if pool_bytes > budget:
    print(
        f"BUG PRESENT: calculate_pool_sizes({budget}, page_size={PAGE}) -> "
        f"max_total_num_tokens={tokens}, but MHATokenToKVPool(size={tokens}) holds {rows} "
        f"rows = {pool_bytes} bytes, {pool_bytes - budget} over the budget of {budget}"
    )
    sys.exit(1)
print(f"fixed: the pool for {tokens} tokens takes {pool_bytes} <= {budget} bytes")
sys.exit(0)
