"""What the reproductions in this folder need to run sglang's pools on a plain CPU machine.

Only needed off a GPU server; imports sglang, torch and the standard library alone (no
kvcheck). Importing it, before sglang:

- serves stand-in modules for ``import torchvision`` when the installed torchvision does
  not load beside this torch (sglang's config package imports it at module level, for
  image models; nothing here uses it), and
- silences the warnings sglang prints at import about CPU-only features.

It never changes the path sglang takes: no sglang environment switch is set here. A script
that runs a Triton kernel on CPU sets ``TRITON_INTERPRET=1`` itself, before this import,
so Triton's interpreter runs sglang's own kernel body (see :func:`interpreted`). The rest
are shared steps: parallel widths a launched server publishes (:func:`one_rank`), pool
arguments, the two-layer Qwen3 configurator, child interpreters and the verdict.
"""

import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import signal
import subprocess
import sys
import tempfile
import types
import warnings


def torchvision_stand_in():
    """Serve stand-ins for ``torchvision`` imports where the real one does not load."""
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


def interpreted():
    """Whether Triton kernels run in Triton's interpreter here (``TRITON_INTERPRET=1`` set
    before Triton loaded): sglang's own kernel bodies, executed on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def verdict(bug, fixed):
    """Print ``BUG PRESENT: bug`` and exit 1 when ``bug``, else ``fixed`` and exit 0."""
    if bug:
        print(f"BUG PRESENT: {bug}")
        sys.exit(1)
    print(fixed if fixed.startswith(("fixed", "not applicable")) else f"fixed: {fixed}")
    sys.exit(0)


def differs(difference, same):
    """For a contract difference (not a defect): print ``CONTRACT DIFFERENCE PRESENT:
    difference`` and exit 1 when ``difference``, else ``same`` and exit 0."""
    if difference:
        print(f"CONTRACT DIFFERENCE PRESENT: {difference}")
        sys.exit(1)
    verdict(None, same)


def cannot_check(why):
    """Exit 3: this machine cannot run the check for the installed release."""
    print(f"cannot check here: {why}")
    sys.exit(3)


def ids(*values):
    """An int64 index tensor."""
    return torch.tensor(list(values), dtype=torch.int64)


def storage_bytes(tensors):
    """The bytes allocated behind ``tensors``, each storage counted once (K and V of a layer
    may be the two halves of one allocation)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def layer(layer_id=0):
    """What pools read of the ``RadixAttention`` layer sglang passes: its ``layer_id``."""
    return types.SimpleNamespace(layer_id=layer_id)


def one_rank(dcp_size=1, rank=0):
    """The parallel widths a launched server publishes, for rank ``rank`` of
    ``--dcp-size dcp_size`` (MLA and DSA pools read them): sglang's own scoped override."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(
        attn_dcp_size=dcp_size,
        dcp_size=dcp_size,
        dcp_enabled=dcp_size > 1,
        attn_dcp_rank=rank,
        dcp_rank=rank,
    )


#: A small DSA pool: one layer, bf16 latent rows, 128-byte index keys (sglang asserts them).
DSA = dict(
    kv_lora_rank=4,
    dtype=torch.bfloat16,
    qk_rope_head_dim=4,
    layer_num=1,
    device="cpu",
    index_head_dim=128,
    enable_memory_saver=False,
    kv_cache_dim=8,
)
#: A small MLA pool: one layer, bf16.
MLA = dict(dtype=torch.bfloat16, layer_num=1, device="cpu", enable_memory_saver=False)
#: A small MHA pool: one layer, one KV head.
MHA = dict(head_num=1, layer_num=1, device="cpu", enable_memory_saver=False)


def kpool_page():
    """The page size of an ``index_kpool=2`` DSA pool this release builds: 128 tokens (the
    64-token index pages sglang 0.5.22 on asserts), else 64 (0.5.21 asserts 64-token pages
    whatever the kpool, and keeps an index key per token)."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    for page in (128, 64):
        try:
            with one_rank():
                DSATokenToKVPool(size=page, page_size=page, index_kpool=2, **DSA)
        except AssertionError:
            continue
        return page
    print("cannot show it here: this release builds no index_kpool=2 pool of 64 or 128 tokens")
    sys.exit(2)


def no_cuda_synchronize():
    """DSA host copies call ``torch.cuda.synchronize()`` whatever the device (finding G2): on
    a torch without CUDA, make it the no-op it is for CPU work, which changes no result."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda device=None: None


def mxfp8_pool(page_size, size, head_dim, **kwargs):
    """The pool ``--kv-cache-dtype mxfp8`` builds, for one layer and one KV head; exits 0
    ("not applicable") on a release without it."""
    try:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolMXFP8
    except ImportError as error:
        print(f"not applicable: this sglang has no MHATokenToKVPoolMXFP8 ({error})")
        sys.exit(0)
    return MHATokenToKVPoolMXFP8(
        size=size, page_size=page_size, dtype=torch.float8_e4m3fn, head_dim=head_dim,
        **MHA, **kwargs,
    )  # fmt: skip


def swa_allocator(full, window, page):
    """sglang's ``SWATokenToKVPoolAllocator`` of ``full`` and ``window`` tokens in pages of
    ``page``, over an ``SWAKVPool`` of one sliding-window layer and one full layer (bf16)."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = SWAKVPool(
        size=full,
        size_swa=window,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
        enable_memory_saver=False,
    )
    return SWATokenToKVPoolAllocator(
        full, window, page, torch.bfloat16, "cpu", pool, need_sort=False
    )


def on_cpu(call):
    """Run ``call``; where it launches a Triton kernel this machine cannot run (no driver,
    no interpreter), exit 3 saying so."""
    try:
        return call()
    except RuntimeError as error:
        if "active drivers" not in str(error):
            raise
        cannot_check(f"this sglang launches a Triton kernel here ({error}); run it on a GPU")


def child(script, *args, flags=(), **environ):
    """Run ``script`` again in a child interpreter with ``args`` (and interpreter ``flags``,
    extra ``environ``): the finished process."""
    return subprocess.run(
        [sys.executable, *flags, script, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **environ},
        check=False,
    )


def ended(run):
    """How a child from :func:`child` ended, in a few words."""
    if run.returncode < 0:
        return f"it was killed by {signal.Signals(-run.returncode).name}"
    lines = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()
    where = " inside a Triton kernel" if "/triton/" in run.stderr else ""
    return f"it exited {run.returncode}{where}: {lines[-1][:200]}"


#: A two-layer Qwen3 (plain MHA) ``config.json``: building KV pools needs no weights.
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
def qwen3_configurator(*, page_size=1, draft=False, pool_config=None, **flags):
    """sglang's ``KVCacheConfigurator`` for the two-layer Qwen3 on a CPU server launched
    with ``flags`` (``ServerArgs`` fields), as ``ModelRunner.alloc_memory_pool`` builds it,
    with the server arguments published as a launched server would (a private runtime
    context from sglang 0.5.22 on, else the process-wide one, put back after). ``draft``:
    an EAGLE draft worker's configurator."""
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components import layer_setup, spec_aux_hidden_state
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the config is local
    with tempfile.TemporaryDirectory() as model_dir, contextlib.ExitStack() as stack:
        with open(os.path.join(model_dir, "config.json"), "w") as config_file:
            json.dump(QWEN3, config_file)
        server_args = ServerArgs(model_path=model_dir, device="cpu", page_size=page_size, **flags)
        if hasattr(runtime_context, "create_context"):
            context = runtime_context.create_context(server_args, role="test")
            stack.enter_context(runtime_context.use_context(context))
        else:
            state = runtime_context.snapshot_context()
            stack.callback(runtime_context.restore_context, state)
            runtime_context.publish(server_args, role="test")
        model_config = ModelConfig(
            model_path=model_dir, is_embedding=flags.get("is_embedding"), is_draft_model=draft
        )
        yield KVCacheConfigurator(
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
            page_size=page_size,
            sliding_window_size=None,
            spec_algorithm=SpeculativeAlgorithm.from_string(flags.get("speculative_algorithm")),
            is_draft_worker=draft,
            post_capture_kv_active=False,
            spec_aux_config=spec_aux_hidden_state.SpecAuxHiddenStateConfig(),
            is_hybrid_swa=False,
            is_hybrid_swa_compress=False,
            use_mla_backend=False,
            layer_info=layer_setup.ModelLayerInfo(
                start_layer=0, end_layer=2, num_effective_layers=2
            ),
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=pool_config,
        )


def hybrid_req_pool(rows, mamba_slots):
    """sglang's ``HybridReqToTokenPool`` (request rows plus mamba slots, as a linear-attention
    hybrid model's server builds it) of ``rows`` rows and ``mamba_slots`` slots, for one
    small Mamba2 layer (fp32 state), without the extra ping-pong buffer."""
    from sglang.srt.configs import mamba_utils as mamba
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    shape = mamba.Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=2, head_dim=2,
        state_size=3, conv_kernel=3,
    )  # fmt: skip
    dtype = mamba.Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    return HybridReqToTokenPool(
        size=rows, mamba_size=mamba_slots, mamba_spec_state_size=1, max_context_len=8,
        device="cpu", enable_memory_saver=False, cache_params=mamba.Mamba2CacheParams(
            shape=shape, layers=[0], dtype=dtype
        ), mamba_layer_ids=[0], enable_mamba_extra_buffer=False,
    )  # fmt: skip


def new_request(rid):
    """The fields of sglang's ``Req`` a request pool reads and sets: a new request holds no
    row, no mamba slot, no ping-pong buffer."""
    kv = types.SimpleNamespace(
        req_pool_idx=None, mamba_pool_idx=None, kv_allocated_len=0, holds_kv=False,
        holds_mamba=False, mamba_ping_pong_track_buffer=None,
    )  # fmt: skip
    return types.SimpleNamespace(rid=rid, kv=kv)


def dsa_swa_hybrid(page=64):
    """The ``SWAKVPool`` sglang's configurator builds for a DSA model with sliding-window
    layers (``_build_hybrid_mla_swa_kv_pool``): a one-layer DSA full side and a one-layer
    MLA window side, two pages of ``page`` tokens each (DSA: 64-token index pages)."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    side = dict(page_size=page, device="cpu", enable_memory_saver=False, kv_lora_rank=4)
    full = dict(side, qk_rope_head_dim=4, index_head_dim=128, kv_cache_dim=8)
    with one_rank():
        return SWAKVPool(
            size=2 * page, size_swa=2 * page, page_size=page, dtype=DSA["dtype"], head_num=0,
            head_dim=0, swa_attention_layer_ids=[1], full_attention_layer_ids=[0],
            device="cpu", full_kv_pool_class=DSATokenToKVPool,
            swa_kv_pool_class=MLATokenToKVPool, full_kv_pool_kwargs=full,
            swa_kv_pool_kwargs=dict(side, qk_rope_head_dim=4),
        )  # fmt: skip


def server_args(**fields):
    """The server arguments a launched server publishes, with ``fields`` set (sglang's own
    scoped override): what ``get_memory()`` and its siblings read."""
    from sglang.srt.runtime_context import get_context

    config = get_context().override_server_args(**fields)

    @contextlib.contextmanager
    def scope():
        config.install()
        try:
            yield
        finally:
            config.restore()

    return scope()


class Stopped(Exception):
    """Raised by :func:`stop_with` to end a build at the step this machine cannot run,
    carrying what had been built for it (``value``)."""

    def __init__(self, value):
        super().__init__("stopped")
        self.value = value


def stop_with(value):
    """Stop the build here, handing ``value`` back (see :class:`Stopped`)."""
    raise Stopped(value)
