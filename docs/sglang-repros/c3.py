"""sglang 0.5.23: pools sized by the configurator exceed the memory budget by a page.

``DefaultPoolConfigurator.calculate_pool_sizes(available_bytes, page_size)`` answers
``available_bytes // cell_size`` tokens, rounded down to whole pages. Every pool it is
then built with holds ``size + page_size`` rows (the padding page that absorbs padded
tokens' writes; DSA index buffers round up further), so the pools take
``page_size * cell_size`` bytes more than the budget they were sized for. The budget is
the memory sglang measured as free after reserving its other headroom.

Shown with sglang's own objects on the CPU: ``ModelConfig`` from a two-layer Qwen3
``config.json`` (no weights needed), ``KVCacheConfigurator``,
``create_memory_pool_configurator`` (which computes the cell size), and the steps
``KVCacheConfigurator.configure`` takes once it has measured the free memory
(``_derive_pool_sizes``, ``_init_pools``), for a budget of exactly 64 tokens' cells with
16-token pages.

Exit 1 and "BUG PRESENT: ..." while the pools exceed the budget; exit 0 and "fixed"
once they fit.
"""

import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the config is local


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
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.model_executor.model_runner_components.layer_setup import (  # noqa: E402
    ModelLayerInfo,
)
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # noqa: E402
    SpecAuxHiddenStateConfig,
)
from sglang.srt.model_executor.pool_configurator import (  # noqa: E402
    create_memory_pool_configurator,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402


@contextlib.contextmanager
def published(server_args):
    """``server_args`` published as a launched server would: in a private runtime context
    (``create_context``, sglang 0.5.22 on), else in the process-wide one, put back after
    (``snapshot_context`` / ``publish`` / ``restore_context``, sglang 0.5.21)."""
    if hasattr(runtime_context, "create_context"):
        with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
            yield
        return
    state = runtime_context.snapshot_context()
    try:
        runtime_context.publish(server_args, role="test")
        yield
    finally:
        runtime_context.restore_context(state)


PAGE, TOKENS = 16, 64
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}

with tempfile.TemporaryDirectory() as model_dir:
    with open(os.path.join(model_dir, "config.json"), "w") as config_file:
        json.dump(QWEN3, config_file)
    server_args = ServerArgs(model_path=model_dir, device="cpu", page_size=PAGE)
    with published(server_args):
        configurator = KVCacheConfigurator(
            device="cpu",
            gpu_id=0,
            attn_dp_size=1,
            pp_size=1,
            pp_group=None,
            model=None,
            model_config=ModelConfig(model_path=model_dir),
            server_args=server_args,
            kv_cache_dtype=torch.bfloat16,
            kv_cache_dtype_str="auto",
            model_dtype=torch.bfloat16,
            page_size=PAGE,
            sliding_window_size=None,
            spec_algorithm=SpeculativeAlgorithm.from_string(None),
            is_draft_worker=False,
            post_capture_kv_active=False,
            spec_aux_config=SpecAuxHiddenStateConfig(),
            is_hybrid_swa=False,
            is_hybrid_swa_compress=False,
            use_mla_backend=False,
            layer_info=ModelLayerInfo(start_layer=0, end_layer=2, num_effective_layers=2),
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=None,
        )
        sizer = create_memory_pool_configurator(configurator)
        budget = TOKENS * sizer._cell_size  # room for exactly 64 tokens
        config = sizer.calculate_pool_sizes(budget, PAGE)
        config.max_running_requests = 4
        sizes = configurator._derive_pool_sizes(config=config)
        pools = configurator._init_pools(
            sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None
        )

pool = pools.token_to_kv_pool
storages = {}  # K and V of a layer may be the two halves of one allocation
for tensor in (*pool.k_buffer, *pool.v_buffer):
    storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
held = sum(storages.values())
rows = pool.k_buffer[0].shape[0]
if held > budget:
    print(
        f"BUG PRESENT: calculate_pool_sizes({budget}, page_size={PAGE}) -> "
        f"max_total_num_tokens={config.max_total_num_tokens} (cell size {sizer._cell_size}), "
        f"but the {type(pool).__name__} built for it holds {rows} rows = {held} bytes, "
        f"{held - budget} over the budget of {budget}"
    )
    sys.exit(1)
print(f"fixed: the pool for {config.max_total_num_tokens} tokens takes {held} <= {budget} bytes")
sys.exit(0)
