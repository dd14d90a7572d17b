"""sglang 0.5.23: a head-major (HND) MHA pool cannot be offloaded to the host.

With ``SGLANG_USE_HND_KVCACHE=1`` each layer of ``MHATokenToKVPool`` is
``[pages, head_num, page_size, head_dim]``. Writes, moves and reads handle that layout;
``get_cpu_copy`` / ``load_cpu_copy`` (retraction's offload) index the buffer by token
slot as for the token-major layout, and refuse with ``assert not self.use_hnd`` ("not
supported with CPU offload yet"). The only caller that offloads is a PD-disaggregation
decode server's retraction, and such a server already stops at startup on HND
(``get_contiguous_buf_infos`` asserts the same way), so no server gets here today; the
variable's definition says nothing of it.

What goes wrong when the precondition is broken: the call raises ``AssertionError``, and
under ``python -O`` (the assertion gone) it runs the slot indexing on HND pages: the
host copy of token 1 takes page 1 instead, and the reload writes page 1 back, so token 1
is not restored. This script runs the offload of token 1 (page 0, offset 1) once as is
and once under ``-O`` in a child interpreter. Exit 1 and "BUG PRESENT: ..." while either
run fails to restore token 1; exit 0 and "fixed" once both restore it.
"""

import importlib.abc
import importlib.machinery
import os
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
import subprocess  # noqa: E402


def offload_and_reload():
    """Token 1's K row after writing it, offloading it, clearing the pool and reloading
    (run in a child interpreter, which imports sglang with the variable set)."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(
        size=8,
        page_size=4,
        dtype=torch.bfloat16,
        head_num=2,
        head_dim=2,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    assert pool.use_hnd or not __debug__, "SGLANG_USE_HND_KVCACHE=1 did not select HND"
    layer = SimpleNamespace(layer_id=0)
    row = torch.arange(1, 5, dtype=torch.bfloat16).view(1, 2, 2)
    pool.set_kv_buffer(layer, torch.tensor([1]), row, row)
    copy = pool.get_cpu_copy(torch.tensor([1]))
    for buffer in (*pool.k_buffer, *pool.v_buffer):
        buffer.zero_()  # the pages are reused while the request waits
    pool.load_cpu_copy(copy, torch.tensor([1]))
    page, offset = 0, 1
    return pool.k_buffer[0][page, :, offset, :].flatten().tolist()


if len(sys.argv) > 1 and sys.argv[1] == "--child":
    print(f"RESTORED {offload_and_reload()}")
    sys.exit(0)

runs = {}
for label, flags in (("python", []), ("python -O", ["-O"])):
    child = subprocess.run(
        [sys.executable, *flags, __file__, "--child"],
        capture_output=True,
        text=True,
        env={**os.environ, "SGLANG_USE_HND_KVCACHE": "1"},
        check=False,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESTORED ")]
    if lines:
        runs[label] = lines[-1].removeprefix("RESTORED ")
    else:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        runs[label] = f"raised ({last[:160]})"

expected = str([1.0, 2.0, 3.0, 4.0])
if any(result != expected for result in runs.values()):
    print(
        "BUG PRESENT: an HND pool cannot offload token 1 and get it back: "
        + "; ".join(f"{label}: {result}" for label, result in runs.items())
        + f" (token 1 held {expected})"
    )
    sys.exit(1)
print("fixed: the HND pool's host copy restores token 1, with and without -O")
sys.exit(0)
