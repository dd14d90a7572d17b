"""sglang 0.5.23: a draft MHA worker under --prefill-only-disable-kv-cache gets the no-op pool.

sglang's pool-family check (``_validate_prefill_only_disable_kv_cache_pool_family``) and
``_init_pools``' closing check both exempt the draft worker: a draft keeps its normal
pool, as SWA and hybrid-linear drafts do. ``_build_mha_kv_pool`` picks
``NoOpMHATokenToKVPool`` from the published flag alone, draft or not, so a speculative
draft worker gets a pool whose every KV write raises: its first forward fails.

This script builds the draft's pools the way ``ModelRunner.alloc_memory_pool`` does, with
sglang's own ``ModelConfig`` (from a two-layer Qwen3 ``config.json``; no weights are
needed) and ``KVCacheConfigurator.configure``, for a CPU server with ``--is-embedding
--prefill-only-disable-kv-cache --chunked-prefill-size -1 --disable-radix-cache
--attention-backend fa3 --speculative-algorithm EAGLE`` (``ServerArgs`` accepts the
combination), then writes one token as the draft's attention would.

The MHA pool of a speculative server warms up a KV copy kernel in its constructor: on
sglang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) that is sgl-kernel's CPU build, elsewhere
a Triton kernel. Neither launches on a plain CPU machine, so the script sets
``TRITON_INTERPRET=1``: Triton's own interpreter runs sglang's kernel on the CPU.

Exit 1 and "BUG PRESENT: ..." while the draft's pool refuses the write; exit 0 and
"fixed" once the draft gets a pool that stores it.
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
from types import SimpleNamespace

# Before Triton loads: run its kernels in its interpreter (see the docstring).
os.environ.setdefault("TRITON_INTERPRET", "1")
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
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

#: A two-layer Qwen3 (plain MHA) config: the checkpoint directory holds no weights, which
#: building the KV pools does not need.
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


def draft_worker_pool(model_dir, **flags):
    """The KV pool sglang's KVCacheConfigurator.configure builds for an EAGLE draft worker
    on the CPU, as ModelRunner.alloc_memory_pool asks for it (the draft takes the target's
    MemoryPoolConfig: 64 tokens, 4 requests)."""
    server_args = ServerArgs(
        model_path=model_dir, device="cpu", speculative_algorithm="EAGLE", **flags
    )
    model_config = ModelConfig(
        model_path=model_dir, is_embedding=flags.get("is_embedding"), is_draft_model=True
    )
    with published(server_args):
        configurator = KVCacheConfigurator(
            device="cpu",
            gpu_id=0,
            attn_dp_size=1,
            pp_size=1,
            pp_group=None,
            model=None,
            model_config=model_config,
            server_args=server_args,
            kv_cache_dtype=torch.bfloat16,
            kv_cache_dtype_str="auto",
            model_dtype=torch.bfloat16,
            page_size=1,
            sliding_window_size=None,
            spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"),
            is_draft_worker=True,
            post_capture_kv_active=False,
            spec_aux_config=SpecAuxHiddenStateConfig(),
            is_hybrid_swa=False,
            is_hybrid_swa_compress=False,
            use_mla_backend=False,
            layer_info=ModelLayerInfo(start_layer=0, end_layer=2, num_effective_layers=2),
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=MemoryPoolConfig(max_total_num_tokens=64, max_running_requests=4),
        )
        return configurator.configure(pre_model_load_memory=0).token_to_kv_pool


with tempfile.TemporaryDirectory() as model_dir:
    with open(os.path.join(model_dir, "config.json"), "w") as config_file:
        json.dump(QWEN3, config_file)
    pool = draft_worker_pool(
        model_dir,
        is_embedding=True,
        prefill_only_disable_kv_cache=True,
        chunked_prefill_size=-1,
        disable_radix_cache=True,
        attention_backend="fa3",
    )

row = torch.ones((1, 1, 32), dtype=torch.bfloat16)
try:
    pool.set_kv_buffer(SimpleNamespace(layer_id=0), torch.tensor([1]), row, row)
except RuntimeError as error:
    print(
        "BUG PRESENT: KVCacheConfigurator.configure gave the draft worker (exempt from the "
        f"flag's checks) a {type(pool).__name__}, and the draft's first KV write raised "
        f"RuntimeError: {str(error)[:80]}..."
    )
    sys.exit(1)
print(f"fixed: the draft worker got {type(pool).__name__}, which stores its KV writes")
sys.exit(0)
