"""The sglang target follows the installed release: a fake, minimal "sglang" package.

Runs in the default suite, without sglang: each test writes a small package named
``sglang`` (fake pool classes over kvcheck's own pools, fake serving modules) and reads it
with :mod:`kvcheck.targets.sglang.release`, while any real sglang the process imported is
put aside. Taking the pieces away one at a time switches the capabilities that need them
off one at a time, each with a reason that names the release and the piece.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcheck.surface import Surface
from kvcheck.targets.sglang import env, release
from kvcheck.targets.sglang.declaration import BOUND, declaration_for, host_pool_adapter
from kvcheck.targets.sglang.release import Releases, describe_release
from kvcheck.targets.sglang.target import SURFACE

RELEASE = "0.5.99"

_POOLS = """
import os

from kvcheck.pools import DSATokenToKVPool as _DSA
from kvcheck.pools import MHATokenToKVPool as _MHA
from kvcheck.pools import MLATokenToKVPool as _MLA
from kvcheck.pools import NoOpMHATokenToKVPool as _NoOp
from sglang.kernels.ops.quantization.quant import quantize_k_cache_separate
from sglang.srt.mem_cache import index_key_cache
from sglang.srt.runtime_context import WIDTHS


class MHATokenToKVPool(_MHA):
    def __init__(self, size, page_size, dtype, head_num, head_dim, layer_num, device,
                 enable_memory_saver, v_head_dim=None, start_layer=None, end_layer=None,
                 enable_kv_cache_copy=False, quant_method=None):
        hnd = os.environ.get("SGLANG_USE_HND_KVCACHE") == "1"
        super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device,
                         enable_memory_saver, v_head_dim, start_layer, end_layer,
                         "hnd" if hnd else "nhd")


class NoOpMHATokenToKVPool(_NoOp):
    def __init__(self, size, page_size, dtype, head_num, head_dim, layer_num, device,
                 enable_memory_saver, v_head_dim=None, start_layer=None, end_layer=None,
                 enable_kv_cache_copy=False):
        super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device,
                         enable_memory_saver, v_head_dim, start_layer, end_layer)


class MLATokenToKVPool(_MLA):
    def __init__(self, size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num,
                 device, enable_memory_saver, start_layer=None, end_layer=None):
        super().__init__(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num,
                         device, enable_memory_saver, start_layer, end_layer,
                         WIDTHS["attn_dcp_size"], WIDTHS["attn_dcp_rank"])


class MLATokenToKVPoolFP4(MLATokenToKVPool):
    pass


class MHATokenToKVPoolMXFP8(MHATokenToKVPool):
    pass


class DSATokenToKVPool(_DSA):
    def __init__(self, size, page_size, kv_lora_rank, dtype, qk_rope_head_dim, layer_num,
                 device, index_head_dim, enable_memory_saver, start_layer=None,
                 end_layer=None, skip_topk_layers=None, index_buf_size=None,
                 kv_cache_dim=None, KPOOL_PARAMETERS):
        KPOOL_DEFAULTS
        assert page_size // index_kpool == 64 and index_head_dim == 128
        super().__init__(size, page_size, kv_lora_rank, dtype, qk_rope_head_dim, layer_num,
                         device, index_head_dim, enable_memory_saver, start_layer, end_layer,
                         skip_topk_layers, index_buf_size, kv_cache_dim, index_kpool,
                         index_kpool_compress, tail_extra_slots, max_running_requests,
                         WIDTHS["attn_dcp_size"], WIDTHS["attn_dcp_rank"])
"""
_KPOOL = "index_kpool=1, index_kpool_compress=False, tail_extra_slots=0, max_running_requests=None"
#: An older constructor: no kpool parameters, one index key per token.
_NO_KPOOL_DEFAULTS = (
    "index_kpool, index_kpool_compress, tail_extra_slots, max_running_requests = 1, False, 0, None"
)

_RUNTIME = """
import contextlib

WIDTHS = {"attn_dcp_size": 1, "attn_dcp_rank": 0}


class _Parallel:
    @contextlib.contextmanager
    def override(self, **widths):
        saved = dict(WIDTHS)
        WIDTHS.update(widths)
        try:
            yield
        finally:
            WIDTHS.clear()
            WIDTHS.update(saved)


def get_parallel():
    return _Parallel()


def get_schedule():
    return None
"""
_PRIVATE_CONTEXT = "\ndef create_context(*a, **k): pass\n\ndef use_context(*a, **k): pass\n"
_PROCESS_CONTEXT = (
    "\ndef publish(*a, **k): pass\n\ndef snapshot_context(): pass\n\n"
    "def restore_context(state): pass\n"
)


_QUANT_METHODS = """
class CPUFP8KVCacheMethod:
    pass

class FP4MXBlock16KVCacheMethod:
    pass

def get_kv_cache_quant_method(name, **kwargs):
    pass
"""


def _package(
    *, kpool: bool = True, private_context: bool = True, process_context: bool = True
) -> dict[str, str]:
    """Module path -> source of a complete fake sglang (every piece the target uses)."""
    constructor = _KPOOL if kpool else ""
    defaults = "pass" if kpool else _NO_KPOOL_DEFAULTS
    runtime = _RUNTIME + (_PRIVATE_CONTEXT if private_context else "")
    runtime += _PROCESS_CONTEXT if process_context else ""
    return {
        "srt/mem_cache/memory_pool.py": _POOLS.replace("KPOOL_PARAMETERS", constructor).replace(
            "KPOOL_DEFAULTS", defaults
        ),
        "srt/mem_cache/index_key_cache.py": (
            "from sglang.kernels.ops.kvcache import index_k\n\nclass IndexKeyCache:\n    pass\n"
        ),
        "kernels/ops/kvcache/index_k.py": "def _set_k_and_s_triton_kernel(): pass\n",
        "kernels/ops/quantization/quant.py": (
            "def _quantize_k_cache_fast_kernel(): pass\n\ndef quantize_k_cache_separate(): pass\n"
        ),
        "kernels/ops/kvcache/mla_buffer.py": (
            "def get_mla_kv_buffer_kernel(): pass\n\ndef get_mla_kv_buffer_kernel_norope(): pass\n"
            "\ndef set_mla_kv_buffer_naive(): pass\n\ndef set_mla_kv_scale_buffer_kernel(): pass\n"
        ),
        "kernels/ops/kvcache/mxfp8_interleave_sf.py": (
            "def store_sf_interleaved(): pass\n\ndef _store_sf_interleaved_kernel(): pass\n"
        ),
        "kernels/ops/kvcache/mxfp8_quant_store_kv.py": (
            "def quant_store_kv_mxfp8(): pass\n\ndef _mxfp8_quant_store_qkv_kernel(): pass\n"
        ),
        "srt/runtime_context.py": runtime,
        "srt/layers/quantization/fp4_kv_cache_quant_method.py": _QUANT_METHODS,
        "srt/server_args.py": "class ServerArgs:\n    pass\n",
        "srt/arg_groups/arg_utils.py": "def record_fields(cls): return ()\n",
        "srt/arg_groups/kv_cache_hook.py": (
            "def validate_prefill_only_disable_kv_cache_args(a): pass\n\n"
            "def handle_prefill_only_disable_kv_cache(a): pass\n"
        ),
        "srt/arg_groups/overrides.py": (
            "def _attention_backend_default(): pass\n\n"
            "def _attention_backend_fa3_fp8_fallback(): pass\n\n"
            "def declare_resolution(): pass\n\ndef run_post_process_pass(): pass\n"
        ),
        "srt/arg_groups/model_override_base.py": "def resolved_view(a): pass\n",
        "srt/arg_groups/platform_hook.py": "def handle_cpu_backends(a): pass\n",
        "srt/mem_cache/kv_cache_configurator.py": (
            "class KVCacheConfigurator:\n    pass\n\ndef _should_elide_dsa_index_k(**k): pass\n"
        ),
        "srt/model_executor/pool_configurator.py": "def create_memory_pool_configurator(c): pass\n",
        "srt/configs/model_config.py": (
            "def is_deepseek_dsa(c): pass\n\ndef dsa_layer_skips_topk(c, i): pass\n"
        ),
        "srt/platforms.py": "current_platform = None\n",
        "srt/speculative/spec_info.py": "class SpeculativeAlgorithm:\n    NONE = None\n",
        "srt/mem_cache/allocator/__init__.py": (
            "class TokenToKVPoolAllocator:\n    pass\n\n"
            "class PagedTokenToKVPoolAllocator:\n    pass\n"
        ),
        "srt/mem_cache/allocator/paged.py": "def alloc_decode_naive(*args): pass\n",
        "srt/mem_cache/allocator/swa.py": "class SWATokenToKVPoolAllocator:\n    pass\n",
        "srt/mem_cache/swa_memory_pool.py": "class SWAKVPool:\n    pass\n",
        "srt/mem_cache/pool_host/mha.py": (
            "class MHATokenToKVPoolHost:\n    pass\n\ndef get_mha_host_pool_cls(i): pass\n"
        ),
        "srt/mem_cache/pool_host/mla.py": "class MLATokenToKVPoolHost:\n    pass\n",
        "srt/mem_cache/pool_host/dsa.py": (
            "class DSAIndexerPoolHost:\n    pass\n\ndef make_dsa_indexer_pool_decl(p): pass\n"
        ),
        "srt/mem_cache/device_pool_info.py": "class MHABufferInfo:\n    pass\n",
        "srt/mem_cache/pool_host/mha_mxfp8.py": "class MHATokenToKVPoolMXFP8Host:\n    pass\n",
        "kernels/ops/kvcache/hicache.py": "".join(
            f"def {name}(*a, **k): pass\n"
            for name in (
                "transfer_hicache_one_layer",
                "transfer_hicache_all_layer_staged_lf_pf",
                "transfer_hicache_one_layer_mla",
                "transfer_hicache_all_layer_mla_staged_lf_pf",
                "_tiles_across_lanes",
                "_default_unroll",
            )
        ),
    }


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Iterator[Path]:
    """A directory first on sys.path, for a fake ``sglang`` written by :func:`_write`; a real
    sglang the process imported is put back afterwards."""
    real = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_sglang(name)}
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if _is_sglang(name)]:
            del sys.modules[name]
        sys.modules.update(real)


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


def _write(root: Path, modules: dict[str, str]) -> None:
    """Write ``modules`` as the package ``sglang`` under ``root`` (fresh: old modules go)."""
    for name in [name for name in sys.modules if _is_sglang(name)]:
        del sys.modules[name]
    package = root / "sglang"
    if package.exists():
        for path in sorted(package.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    for relative, source in {"__init__.py": "", **modules}.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(package).parents:
            (package / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source), encoding="utf-8")


def _read(root: Path, modules: dict[str, str]) -> release.ReleaseFacts:
    _write(root, modules)
    return release.probe(release.load(RELEASE), declared=SURFACE, env=env)


def test_a_complete_release_serves_everything(fake_sglang: Path) -> None:
    """With every piece present nothing is switched off, and the surface is the declared
    one with the layouts read from the fake's own asserts and buffers."""
    facts = _read(fake_sglang, _package())
    assert facts.loaded.missing == {}
    assert facts.unsupported() == {}
    assert facts.private_context and facts.cpu_mla_set and facts.kv_page_padding
    assert facts.dsa_layouts == ((64, 1, 128), (64, 2, 128))
    assert facts.dsa_dcp_index_widened is True
    assert facts.surface(SURFACE).limits() == SURFACE.limits()


def test_pieces_taken_away_switch_capabilities_off_one_by_one(fake_sglang: Path) -> None:
    """Each piece taken away (cumulatively) adds exactly its capabilities to what the
    release cannot serve, each with a reason naming the release and the piece."""
    modules = _package()
    steps = [
        (
            "kernels/ops/kvcache/index_k.py",
            {"index_k_write"},
            f"sglang {RELEASE} has no DSA index-K kernel module",
        ),
        (
            "kernels/ops/kvcache/mla_buffer.py",
            {"mla_write"},
            f"sglang {RELEASE} has no MLA buffer kernel module",
        ),
        (
            "srt/arg_groups/kv_cache_hook.py",
            {"server_args"},
            f"sglang {RELEASE} has no --prefill-only-disable-kv-cache hooks",
        ),
        (
            "srt/model_executor/pool_configurator.py",
            {"configurator"},
            f"sglang {RELEASE} has no pool configurator",
        ),
    ]
    off: set[str] = set()
    for path, capabilities, reason in steps:
        del modules[path]
        if path.endswith("index_k.py"):  # the cache no longer imports a kernel module
            modules["srt/mem_cache/index_key_cache.py"] = "class IndexKeyCache:\n    pass\n"
        unsupported = _read(fake_sglang, modules).unsupported()
        assert set(unsupported) == off | capabilities, path
        off |= capabilities
        for capability in capabilities:
            assert unsupported[capability].startswith(reason), unsupported[capability]


def test_a_missing_pool_class_drops_its_family_with_a_note(fake_sglang: Path) -> None:
    """A release without DSATokenToKVPool serves no DSA pool: the capability is off and the
    surface leaves the family out, saying why."""
    modules = _package()
    source = modules["srt/mem_cache/memory_pool.py"]
    modules["srt/mem_cache/memory_pool.py"] = source.replace("class DSATokenToKVPool", "class _X")
    facts = _read(fake_sglang, modules)
    assert set(facts.unsupported()) == {"dsa_pool"}
    surface = facts.surface(SURFACE)
    assert not surface.builds("dsa") and surface.builds("mla")
    assert surface.note("dsa") == (
        f"sglang {RELEASE} has no DSA pool: sglang.srt.mem_cache.memory_pool lacks DSATokenToKVPool"
    )


def test_an_older_constructor_narrows_the_surface(fake_sglang: Path) -> None:
    """A DSA constructor without the kpool parameters keeps the DSA pool, narrowed to one
    index key per token, with a note naming the missing parameter."""
    facts = _read(fake_sglang, _package(kpool=False))
    assert facts.unsupported() == {}
    surface = facts.surface(SURFACE)
    assert surface.values("dsa", "index_kpool") == (1,)
    assert surface.note("dsa", "index_kpool") == (
        f"sglang {RELEASE}'s DSATokenToKVPool takes no index_kpool parameter"
    )
    assert "index_kpool" not in facts.fit_arguments({"index_kpool": 1}, "DSATokenToKVPool")


@pytest.mark.parametrize("missing", ["module", "parameter"])
def test_a_release_without_quant_methods_keeps_mha_unquantized_or_fp8(
    fake_sglang: Path, missing: str
) -> None:
    """Without sglang's KV-cache quant methods, or an MHA constructor that takes none, the
    MHA pool stays, narrowed to the kv_quant values the plain pool builds, with a note
    naming the missing piece; nothing is switched off."""
    modules = _package()
    if missing == "module":
        del modules["srt/layers/quantization/fp4_kv_cache_quant_method.py"]
        why = f"sglang {RELEASE} has no KV-cache quant-method module"
    else:
        source = modules["srt/mem_cache/memory_pool.py"]
        modules["srt/mem_cache/memory_pool.py"] = source.replace(
            "enable_kv_cache_copy=False, quant_method=None):", "enable_kv_cache_copy=False):"
        )
        why = f"sglang {RELEASE}'s MHATokenToKVPool takes no quant_method parameter"
    facts = _read(fake_sglang, modules)
    assert facts.unsupported() == {}
    surface = facts.surface(SURFACE)
    assert surface.values("mha", "kv_quant") == ("none", "fp8_scaled")
    assert (surface.note("mha", "kv_quant") or "").startswith(why), surface.note("mha", "kv_quant")


@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("kernels/ops/kvcache/mxfp8_interleave_sf.py", "MXFP8 interleaved-scale kernel module"),
        ("kernels/ops/kvcache/mxfp8_quant_store_kv.py", "MXFP8 quant-store kernel module"),
    ],
    ids=["interleave", "quant_store"],
)
def test_a_release_without_the_mxfp8_kernels_leaves_mxfp8_out(
    fake_sglang: Path, module: str, why: str
) -> None:
    """Without a kernel module the MXFP8 pool's writes launch (where 0.5.23 keeps it), the
    MHA pool stays with every other kv_quant value, and the note names the missing piece."""
    modules = _package()
    del modules[module]
    facts = _read(fake_sglang, modules)
    assert facts.unsupported() == {}
    surface = facts.surface(SURFACE)
    assert "mxfp8" not in surface.values("mha", "kv_quant")
    assert "fp4_mx_block16" in surface.values("mha", "kv_quant")
    assert (surface.note("mha", "kv_quant") or "").startswith(f"sglang {RELEASE} has no {why}")


def test_serving_follows_the_context_entry_points_the_release_has(fake_sglang: Path) -> None:
    """Without create_context the process-wide publish serves instead; with neither, the
    serving capabilities that publish server arguments are off."""
    facts = _read(fake_sglang, _package(private_context=False))
    assert facts.unsupported() == {} and not facts.private_context
    facts = _read(fake_sglang, _package(private_context=False, process_context=False))
    assert set(facts.unsupported()) == {"pool_selection", "configurator", "skip_rule"}
    assert facts.unsupported()["skip_rule"] == (
        f"sglang {RELEASE} has no way to publish server arguments: sglang.srt.runtime_context "
        "lacks create_context, use_context (nor publish, snapshot_context, restore_context)"
    )


def test_a_module_that_fails_to_import_is_a_setup_error(fake_sglang: Path) -> None:
    """A module of the release that exists but cannot import (a dependency is missing) is
    not a missing piece: loading raises."""
    modules = _package()
    modules["srt/platforms.py"] = "import kvcheck_no_such_dependency\n"
    _write(fake_sglang, modules)
    with pytest.raises(ModuleNotFoundError, match="kvcheck_no_such_dependency"):
        release.load(RELEASE)


def test_release_ranges_and_the_release_note() -> None:
    """Ranges hold their ends; the note says whether kvcheck is checked against a release."""
    assert "0.5.22" in Releases(last="0.5.22") and "0.5.23" not in Releases(last="0.5.22")
    assert "0.5.24" in Releases(first="0.5.23")
    assert describe_release("0.5.22").startswith("a release kvcheck is checked against")
    assert describe_release("0.5.99").startswith("newer than every release")
    assert describe_release("0.5.1").startswith("older than the releases")
    with pytest.raises(ValueError, match="empty"):
        Releases(first="0.5.23", last="0.5.22")


def _release_surface(facts: release.ReleaseFacts) -> Surface:
    """What the target builds on the fake release: the declaration as its missing pieces lay
    over it, narrowed by the release (as ``SGLangTarget.surface``)."""
    return facts.surface(declaration_for((), facts.loaded.missing).surface(BOUND))


def test_a_release_without_a_host_module_builds_no_host_pool_of_its_families(
    fake_sglang: Path,
) -> None:
    """Without its index-K host module a release builds no DSA host pools (the surface says
    why) and keeps the MHA and MLA ones and every allocator; without the MLA host module
    either (a DSA host tier anchors on it), no host pools at all."""
    modules = _package()
    del modules["srt/mem_cache/pool_host/dsa.py"]
    facts = _read(fake_sglang, modules)
    surface = _release_surface(facts)
    assert dict(surface.host_layouts) == {
        family: layouts for family, layouts in SURFACE.host_layouts.items() if family != "dsa"
    }
    assert surface.allocators == SURFACE.allocators
    assert "pool_host.dsa" in (surface.notes.get("host_pools.dsa") or "")
    assert facts.tiers_off() == {} and set(facts.host_families_off()) == {"dsa"}
    del modules["srt/mem_cache/pool_host/mla.py"]
    facts = _read(fake_sglang, modules)
    assert set(facts.host_families_off()) == {"mla", "dsa"}
    del modules["srt/mem_cache/pool_host/mha.py"]
    facts = _read(fake_sglang, modules)
    surface = _release_surface(facts)
    assert surface.host_layouts == {} and set(facts.tiers_off()) == {"host_pools"}
    assert "pool_host" in (surface.note("host_pools") or "")


def test_a_release_without_the_paged_torch_path_builds_page_size_1_allocators_only(
    fake_sglang: Path,
) -> None:
    """0.5.21's paged allocator has no torch body (Triton only): the paged kind is refused,
    and the SWA kind is built at page size 1 only (token sides), each with the reason; the
    token and pure-SWA allocators and the host pools stay."""
    modules = _package()
    modules["srt/mem_cache/allocator/paged.py"] = "def alloc_extend_naive(*args): pass\n"
    facts = _read(fake_sglang, modules)
    surface = _release_surface(facts)
    assert surface.allocators == tuple(kind for kind in SURFACE.allocators if kind != "paged")
    assert "alloc_decode_naive" in surface.notes["allocators.paged"]
    assert facts.tiers_off() == {} and surface.host_layouts == SURFACE.host_layouts
    declared = declaration_for((), facts.loaded.missing)
    page_sizes, why = declared.allocator_page_sizes()["swa"]
    assert page_sizes == (1,) and "alloc_decode_naive" in why
    assert declared.allocator_page_sizes()["paged"][0] == ()


def test_a_release_without_device_pool_infos_builds_host_pools_by_its_adapter(
    fake_sglang: Path,
) -> None:
    """0.5.22's host pools take the device pool itself, not 0.5.23's buffer infos, and 0.5.21's
    DSA index-K host pool the device pool and the layout (no make_dsa_indexer_pool_decl): the
    missing pieces only pick the release's adapter; host pools and every allocator stay."""
    modules = _package()
    del modules["srt/mem_cache/device_pool_info.py"]
    facts = _read(fake_sglang, modules)
    surface = _release_surface(facts)
    assert surface.host_layouts == SURFACE.host_layouts
    assert surface.allocators == SURFACE.allocators
    assert host_pool_adapter(facts.loaded.missing) == "device_pool"
    modules["srt/mem_cache/pool_host/dsa.py"] = "class DSAIndexerPoolHost:\n    pass\n"
    facts = _read(fake_sglang, modules)
    assert _release_surface(facts).host_layouts == SURFACE.host_layouts
    assert host_pool_adapter(facts.loaded.missing) == "device_pool_dsa_layout"


def test_a_release_without_the_mxfp8_host_pool_misses_only_it(fake_sglang: Path) -> None:
    """Without pool_host/mha_mxfp8.py the release misses that piece alone (the target then
    builds no host tier for MXFP8 pools, the sglang declaration) and turns no
    capability off."""
    modules = _package()
    del modules["srt/mem_cache/pool_host/mha_mxfp8.py"]
    facts = _read(fake_sglang, modules)
    assert set(facts.loaded.missing) == {"host_mxfp8"}
    assert facts.unsupported() == {} and facts.tiers_off() == {}
