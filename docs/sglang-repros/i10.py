"""sglang 0.5.23: an index-K write to a DSA skip layer writes through a 0-byte buffer.

``DSATokenToKVPool`` gives every layer in ``skip_topk_layers`` an index-K buffer of 0
pages (the layer reuses the previous layer's top-k). ``set_index_k_scale_buffer`` does
not check for it: the shape checks in ``_set_k_and_s_triton`` pass for a ``(0, 8448)``
buffer, and ``_set_k_and_s_triton_kernel`` is launched. The kernel has no bounds check:
it stores the token's 128 key bytes and 4 scale bytes at offsets from the page layout,
relative to the buffer's data pointer, which torch leaves null for 0 elements. On a GPU
that is an illegal-address fault (the CUDA context is lost); here it is the process.

sglang has no torch body for this kernel, so the script runs sglang's own kernel under
Triton's interpreter (``TRITON_INTERPRET=1``), which executes it on CPU tensors, in child
interpreters: first a write to a layer that has index keys (the control: the bytes must
land where the page layout says), then the same write to the skip layer. Exit 1 and "BUG
PRESENT: ..." while the skip-layer write reaches the kernel (the child dies, or fails
inside the kernel); exit 0 and "fixed" once ``set_index_k_scale_buffer`` refuses it
before launching; exit 2 if the control cannot run here.
"""

import importlib.abc
import importlib.machinery
import os
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
import signal  # noqa: E402
import subprocess  # noqa: E402
import traceback  # noqa: E402

PAGE, TOKEN = 64, 1  # sglang asserts 64-token DSA pages; token 1 sits at offset 1 of page 0


def index_k_write(layer_id):
    """Write token 1's index key (128 bytes of fp8 1.0) and scale (1.0) to ``layer_id`` of
    a two-layer pool whose layer 0 is a skip layer; print what the page row holds."""
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_dcp_size=1, dcp_enabled=False, attn_dcp_rank=0):
        pool = DSATokenToKVPool(
            size=2 * PAGE,
            page_size=PAGE,
            kv_lora_rank=4,
            dtype=torch.bfloat16,
            qk_rope_head_dim=4,
            layer_num=2,
            device="cpu",
            index_head_dim=128,
            enable_memory_saver=False,
            kv_cache_dim=8,
            skip_topk_layers=[True, False],
        )
        buffers = pool.index_k_with_scale_buffer
        print(f"SHAPES {[tuple(b.shape) for b in buffers]}", flush=True)
        key = torch.ones((1, 128)).to(torch.float8_e4m3fn)
        scale = torch.ones((1, 1), dtype=torch.float32)
        try:
            pool.set_index_k_scale_buffer(layer_id, torch.tensor([TOKEN]), key, scale)
        except Exception as error:
            frames = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
            where = "KERNEL" if any("/triton/" in name for name in frames) else "REFUSED"
            print(f"{where} {type(error).__name__}: {error}", flush=True)
            return
        row = buffers[layer_id][0]
        key_bytes = row[TOKEN * 128 : (TOKEN + 1) * 128].tolist()
        scale_at = PAGE * 128 + 4 * TOKEN
        scale_bytes = row[scale_at : scale_at + 4].view(torch.float32).tolist()
        print(f"WROTE key {sorted(set(key_bytes))} scale {scale_bytes}", flush=True)


if len(sys.argv) > 2 and sys.argv[1] == "--child":
    index_k_write(int(sys.argv[2]))
    sys.exit(0)


def child(layer_id):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, __file__, "--child", str(layer_id)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    marks = {}
    for line in run.stdout.splitlines():
        head, _, rest = line.partition(" ")
        marks[head] = rest
    return run, marks


control, seen = child(1)
if seen.get("WROTE") != "key [56] scale [1.0]":  # 56 = 0x38, fp8 e4m3 1.0
    print(
        f"cannot show it here: the control write did not run as expected (exit "
        f"{control.returncode}): {seen or control.stderr.strip()[-300:]}"
    )
    sys.exit(2)

skipped, seen = child(0)
if "REFUSED" in seen:
    print(f"fixed: the skip-layer write is refused before the kernel: {seen['REFUSED']}")
    sys.exit(0)
if skipped.returncode < 0:
    outcome = f"the process was killed by {signal.Signals(-skipped.returncode).name}"
elif "KERNEL" in seen:
    outcome = f"it failed inside the kernel: {seen['KERNEL'][:120]}"
else:
    outcome = f"the launch returned (exit {skipped.returncode}): the bytes went somewhere"
print(
    f"BUG PRESENT: index-K buffers {seen.get('SHAPES')}; set_index_k_scale_buffer(layer_id=0, "
    f"loc=[{TOKEN}]) on the skip layer launched sglang's index-K kernel against the 0-byte "
    f"buffer (run by Triton's interpreter) and {outcome}; the same write to layer 1 "
    f"stored its key and scale where the page layout says"
)
sys.exit(1)
