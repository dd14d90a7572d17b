"""Smoke tests of the ``sglang`` target against the installed sglang release, on CPU.

These pin that the adapter reaches sglang's real code and leaves the process as it found
it; whether sglang satisfies kvcheck's contracts is the property suite's question.

Marked ``sglang``: they run only when the kvcheck target is sglang
(``KVCHECK_TARGET=sglang python -m pytest tests/targets``), so kvcheck's default run never
pays for importing sglang (10-15 s); then the plugin has already imported it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from kvcheck.specs import PoolSpec
from kvcheck.targets import CAPABILITIES, Target, check_target
from kvcheck.targets.sglang import env
from kvcheck.targets.sglang.target import SGLangTarget, _sglang
from kvcheck.vocabulary import GLM_5_2_LIKE, QWEN3_EMBEDDING_8B

pytestmark = pytest.mark.kvcheck_target("sglang")

NATIVE_MOVE_BEFORE = os.environ.get(env.NATIVE_MOVE_ENV)
DSA_PAGE = 64  # every checked sglang release asserts 64-token DSA pages on CPU and CUDA
INDEX_DIM = 128
SCALE_BYTES = 4
VALID_FLAGS = {
    "is_embedding": True,
    "prefill_only_disable_kv_cache": True,
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
    "attention_backend": "fa3",
}


class Layer:
    """The one attribute sglang's set_kv_buffer reads from a RadixAttention layer."""

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def spec_for(family: str) -> PoolSpec:
    """A small pool of ``family`` serving global layers 2, 3, 4."""
    page = DSA_PAGE if family == "dsa" else 4
    return PoolSpec(
        family=family,  # type: ignore[arg-type]
        size=2 * page,
        page_size=page,
        layer_num=3,
        dtype="bfloat16",
        start_layer=2,
        head_num=2,
        head_dim=8,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        skip_topk_layers=(False, True, False) if family == "dsa" else None,
    )


def rows_for(spec: PoolSpec, count: int, start: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Distinct K (and V) rows for ``count`` tokens of ``spec``'s pool."""
    if spec.family in ("mla", "dsa"):
        width = spec.kv_lora_rank + spec.qk_rope_head_dim
        k = torch.arange(count * width, dtype=torch.float32).view(count, 1, width) + start
        return k.to(torch.bfloat16), None
    shape = (count, spec.head_num, spec.head_dim)
    k = torch.arange(count * spec.head_num * spec.head_dim, dtype=torch.float32).view(shape)
    return (k + start).to(torch.bfloat16), (k - start).to(torch.bfloat16)


@pytest.fixture(scope="module")
def target() -> SGLangTarget:
    """A fresh target instance (the plugin's session target imported sglang already)."""
    return SGLangTarget()


def expect_finding(
    request: pytest.FixtureRequest, target: SGLangTarget, finding_id: str, raises: type
) -> None:
    """Where the installed release has finding ``finding_id`` (the target declares it),
    this smoke test must fail with ``raises``, strictly; elsewhere it must pass."""
    if finding_id in {finding.id for finding in target.findings}:
        reason = f"sglang {target.version} has finding {finding_id} (docs/sglang-findings.md)"
        request.applymarker(pytest.mark.xfail(strict=True, raises=raises, reason=reason))


def test_importing_the_target_module_leaves_sglang_unimported() -> None:
    """Importing kvcheck.targets.sglang and building the target does not import sglang."""
    code = (
        "import sys, kvcheck.targets.sglang as m; m.SGLangTarget(); "
        "print(any(n == 'sglang' or n.startswith('sglang.') for n in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"


def test_target_satisfies_the_protocol(target: SGLangTarget) -> None:
    """The target passes the resolver's protocol check, names the installed release and
    only known capabilities."""
    assert isinstance(target, Target)
    assert check_target(target) == []
    assert target.version == version("sglang")
    assert target.describe().startswith(("a release kvcheck is checked", "newer than", "older"))
    assert {key.partition(":")[0] for key in target.unsupported} <= set(CAPABILITIES)
    assert {"meta_device:mha", "meta_device:noop"} <= set(target.unsupported)
    assert "meta_device" not in target.unsupported  # MLA and DSA build on meta


@pytest.mark.parametrize("family", ["mha", "noop", "mla", "dsa"])
def test_make_pool_builds_sglangs_own_class(target: SGLangTarget, family: str) -> None:
    """Each family is built as sglang's pool class from sglang.srt.mem_cache.memory_pool."""
    expected = {
        "mha": "MHATokenToKVPool",
        "noop": "NoOpMHATokenToKVPool",
        "mla": "MLATokenToKVPool",
        "dsa": "DSATokenToKVPool",
    }[family]
    pool = target.make_pool(spec_for(family), device="cpu")
    assert type(pool) is getattr(_sglang().memory_pool, expected)
    assert (pool.start_layer, pool.layer_num) == (2, 3)


@pytest.mark.parametrize("family", ["mha", "mla", "dsa"])
def test_write_move_and_host_copy_round_trip(
    request: pytest.FixtureRequest, target: SGLangTarget, family: str
) -> None:
    """Written rows read back, move to new slots, and survive a host copy and reload (a DSA
    move before sglang 0.5.23 indexes page rows by token id: X1)."""
    if family == "dsa":
        expect_finding(request, target, "X1", IndexError)
    spec = spec_for(family)
    pool = target.make_pool(spec, device="cpu")
    page = spec.page_size
    source = torch.arange(page, 2 * page)  # one whole page (DSA host copies need pages)
    k, v = rows_for(spec, page, start=1.0)
    pool.set_kv_buffer(Layer(3), source, k, v)
    assert torch.equal(pool.get_key_buffer(3)[source], k)

    moved = torch.tensor([2 * page, 2 * page + 1])
    pool.move_kv_cache(moved, source[:2])
    assert torch.equal(pool.get_key_buffer(3)[moved], k[:2])

    copy = pool.get_cpu_copy(source)
    reload_at = torch.arange(2 * page, 3 * page)
    pool.load_cpu_copy(copy, reload_at)
    assert torch.equal(pool.get_key_buffer(3)[reload_at], k)
    if v is not None:
        assert torch.equal(pool.get_value_buffer(3)[reload_at], v)


def test_noop_pool_rejects_writes_and_ignores_moves(target: SGLangTarget) -> None:
    """The no-op pool raises RuntimeError on set_kv_buffer and moves nothing."""
    spec = spec_for("noop")
    pool = target.make_pool(spec, device="cpu")
    k, v = rows_for(spec, 1, start=1.0)
    with pytest.raises(RuntimeError, match="NoOpMHATokenToKVPool"):
        pool.set_kv_buffer(Layer(2), torch.tensor([1]), k, v)
    pool.move_kv_cache(torch.tensor([0]), torch.tensor([1]))
    assert pool.get_kv_size_bytes() == (0, 0)
    assert all(int(buffer.count_nonzero()) == 0 for buffer in pool.k_buffer)


def index_k_rows(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys = (torch.arange(count * INDEX_DIM) % 251 + 1).to(torch.uint8).view(count, INDEX_DIM)
    scales = torch.arange(1, count + 1, dtype=torch.float32).view(count, 1) / 2
    return keys, scales


def key_bytes_of(pool: object, layer_id: int, token: int) -> torch.Tensor:
    buffer = pool.get_index_k_with_scale_buffer(layer_id)  # type: ignore[attr-defined]
    page, offset = divmod(token, DSA_PAGE)
    return buffer[page, offset * INDEX_DIM : (offset + 1) * INDEX_DIM]


def scale_of(pool: object, layer_id: int, token: int) -> float:
    buffer = pool.get_index_k_with_scale_buffer(layer_id)  # type: ignore[attr-defined]
    page, offset = divmod(token, DSA_PAGE)
    start = DSA_PAGE * INDEX_DIM + offset * SCALE_BYTES
    return float(buffer[page, start : start + SCALE_BYTES].view(torch.float32))


def test_index_k_write_lands_at_the_documented_bytes(target: SGLangTarget) -> None:
    """write_index_k puts key bytes at offset*128 of the page row and the scale after the keys."""
    pool = target.make_pool(spec_for("dsa"), device="cpu")
    keys, scales = index_k_rows(2)
    tokens = torch.tensor([DSA_PAGE + 1, DSA_PAGE + 5])
    target.write_index_k(pool, 2, tokens, keys, scales)
    assert torch.equal(key_bytes_of(pool, 2, DSA_PAGE + 5), keys[1])
    assert scale_of(pool, 2, DSA_PAGE + 1) == 0.5
    assert int(key_bytes_of(pool, 2, DSA_PAGE + 2).count_nonzero()) == 0


def test_dsa_move_and_host_copy_carry_index_k(
    request: pytest.FixtureRequest, target: SGLangTarget
) -> None:
    """A DSA move copies one token's index-K bytes; a page host copy reloads them elsewhere
    (before sglang 0.5.23 the move indexes page rows by token id: X1)."""
    expect_finding(request, target, "X1", IndexError)
    pool = target.make_pool(spec_for("dsa"), device="cpu")
    keys, scales = index_k_rows(1)
    target.write_index_k(pool, 4, torch.tensor([DSA_PAGE + 3]), keys, scales)
    pool.move_kv_cache(torch.tensor([7]), torch.tensor([DSA_PAGE + 3]))
    assert torch.equal(key_bytes_of(pool, 4, 7), keys[0])
    assert int(key_bytes_of(pool, 4, 6).count_nonzero()) == 0

    copy = pool.get_cpu_copy(torch.arange(DSA_PAGE, 2 * DSA_PAGE))
    pool.load_cpu_copy(copy, torch.arange(2 * DSA_PAGE, 3 * DSA_PAGE))
    assert torch.equal(key_bytes_of(pool, 4, 2 * DSA_PAGE + 3), keys[0])
    assert scale_of(pool, 4, 2 * DSA_PAGE + 3) == 0.5


def test_dsa_skip_layer_holds_no_index_k(target: SGLangTarget) -> None:
    """A skip layer gets a zero-row index-K buffer and a (0, 0, 0) transfer entry."""
    pool = target.make_pool(spec_for("dsa"), device="cpu")
    ptrs, lens, item_lens = pool.get_state_buf_infos()
    assert pool.get_index_k_with_scale_buffer(3).shape[0] == 0
    assert (ptrs[1], lens[1], item_lens[1]) == (0, 0, 0)
    assert lens[0] == pool.get_index_k_with_scale_buffer(2).numel()


@pytest.mark.parametrize("family", ["mla", "dsa"])
def test_latent_pools_build_on_meta(target: SGLangTarget, family: str) -> None:
    """MLA and DSA pools build on the meta device (shapes without memory)."""
    pool = target.make_pool(spec_for(family), device="meta")
    assert pool.kv_buffer[0].device.type == "meta"


@pytest.mark.parametrize("family", ["mha", "noop"])
def test_mha_pools_fail_on_meta_as_declared(target: SGLangTarget, family: str) -> None:
    """MHA and no-op pools fail on meta, which is why meta_device is declared unsupported."""
    with pytest.raises(RuntimeError, match="meta"):
        target.make_pool(spec_for(family), device="meta")


def test_valid_prefill_only_flags_pass_validation(target: SGLangTarget) -> None:
    """A flag set meeting every precondition passes sglang's two validation steps."""
    target.validate_server_args(VALID_FLAGS)
    target.validate_server_args({**VALID_FLAGS, "attention_backend": None, "gpu_arch": "sm90"})
    assert target.validate_server_args({}) is None  # type: ignore[func-returns-value]


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"is_embedding": False}, "--is-embedding"),
        ({"kv_cache_dtype": "nvfp4"}, "nvfp4"),
        ({"chunked_prefill_size": 4096}, "--chunked-prefill-size"),
        ({"enable_prefill_context_parallel": True}, "--enable-prefill-cp"),
        ({"attention_backend": "triton"}, "fa3/fa4"),
    ],
    ids=["not-embedding", "nvfp4", "chunked", "prefill-cp", "triton-backend"],
)
def test_invalid_prefill_only_flags_are_rejected(
    target: SGLangTarget, change: dict[str, object], flag: str
) -> None:
    """A violated precondition raises sglang's ValueError naming the flag."""
    with pytest.raises(ValueError, match="--prefill-only-disable-kv-cache") as error:
        target.validate_server_args({**VALID_FLAGS, **change})
    assert flag in str(error.value)


def test_pool_selection_picks_noop_for_mha_and_rejects_dsa(target: SGLangTarget) -> None:
    """With the flag, an MHA model gets the no-op pool and a DSA model a RuntimeError."""
    assert target.select_pool_family(VALID_FLAGS, QWEN3_EMBEDDING_8B, is_draft=False) == "noop"
    assert target.select_pool_family({}, GLM_5_2_LIKE, is_draft=False) == "dsa"
    with pytest.raises(RuntimeError, match="DSA/MLA KV pool"):
        target.select_pool_family(VALID_FLAGS, GLM_5_2_LIKE, is_draft=False)


def test_skip_rule_on_glm_5_2_like(target: SGLangTarget) -> None:
    """GLM-5.2-like (78 layers, freq 4, offset 3) runs the indexer on 0, 1, 2, 6, ..., 74."""
    mask = target.skip_topk_layers(GLM_5_2_LIKE)
    indexer_layers = [layer for layer, skips in enumerate(mask) if not skips]
    assert len(mask) == 78
    assert indexer_layers == [0, 1, 2, *range(6, 78, 4)]
    assert target.dsa_layer_skips_topk(GLM_5_2_LIKE, 3) is True
    assert target.dsa_layer_skips_topk(GLM_5_2_LIKE, 6) is False


def test_configurator_sizes_glm_5_2_like(target: SGLangTarget) -> None:
    """bf16 cell size is 78 latent rows of 576 x 2 bytes plus 21 indexer rows of 132 bytes."""
    cell = target.cell_size_bytes(
        GLM_5_2_LIKE, dtype="bfloat16", is_draft=False, enable_hisparse=False
    )
    assert cell == 78 * 576 * 2 + 21 * 132
    tokens = target.max_total_num_tokens(
        GLM_5_2_LIKE,
        budget_bytes=100 * cell,
        dtype="bfloat16",
        page_size=DSA_PAGE,
        is_draft=False,
        enable_hisparse=False,
    )
    assert tokens == 64


def test_using_the_target_leaves_no_workaround_behind(target: SGLangTarget) -> None:
    """After pools and serving calls, no stand-in module, env var or patch is left in place."""
    for family in ("mha", "dsa"):
        pool = target.make_pool(spec_for(family), device="cpu")
        pool.get_cpu_copy(torch.arange(spec_for(family).page_size))
    target.validate_server_args(VALID_FLAGS)
    target.cell_size_bytes(GLM_5_2_LIKE, dtype="bfloat16", is_draft=False, enable_hisparse=False)
    stand_ins = [
        name for name, module in sys.modules.items() if isinstance(module, env._TorchvisionStandIn)
    ]
    assert stand_ins == []
    assert os.environ.get(env.NATIVE_MOVE_ENV) == NATIVE_MOVE_BEFORE
    assert torch.cuda.synchronize is not env._no_cuda_synchronize
    kernel = getattr(_sglang().index_k_kernels, env.INDEX_K_KERNEL_NAME)
    assert not isinstance(kernel, env._CpuIndexKKernel)
    for name in ("set_mla_kv_buffer_kernel", "get_mla_kv_buffer_kernel"):
        kernel = getattr(_sglang().mla_buffer, name)
        assert not isinstance(kernel, (env._CpuSetMlaKernel, env._CpuGetMlaKernel))


#: Leaves the C warnings module holding a list whose first filter is "error" (as the last
#: warning inside a pytest test under filterwarnings=error does), then lets Python exit.
_STALE_ERROR_FILTERS = """
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", message="kvcheck-probe")
    warnings.warn("kvcheck-probe")
"""
_IMPORT_THROUGH_TARGET = "from kvcheck.targets.sglang import SGLangTarget; SGLangTarget().prepare()"
_IMPORT_WITHOUT_GUARD = """
import importlib, warnings
from kvcheck.targets.sglang import env
with warnings.catch_warnings(), env.torchvision_stand_in():
    warnings.simplefilter("ignore")
    importlib.import_module("sglang.srt.mem_cache.memory_pool")
"""


@pytest.mark.parametrize(
    ("prelude", "exit_code"),
    [(_IMPORT_THROUGH_TARGET, 0), (_IMPORT_WITHOUT_GUARD, -11)],
    ids=["through-the-target-exits-cleanly", "unguarded-import-crashes"],
)
def test_exit_after_stale_error_filters(prelude: str, exit_code: int) -> None:
    """Stale error filters crash the exit after importing sglang, unless the target guards it."""
    result = subprocess.run(
        [sys.executable, "-c", prelude + _STALE_ERROR_FILTERS],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert result.returncode == exit_code, result.stderr[-2000:]


def test_scaled_fp8_latent_layout_is_what_sglang_sizes(target: SGLangTarget) -> None:
    """kvcheck's fp8 DSA cell (the scaled row, as kvcheck.geometry lays it out) is sglang's
    own figure; the raw row would be 80 bytes a layer short."""
    from kvcheck.geometry import scaled_fp8_latent_row_bytes
    from kvcheck.serving import cell_size_bytes

    model = GLM_5_2_LIKE
    raw = model.kv_lora_rank + model.qk_rope_head_dim
    scaled = scaled_fp8_latent_row_bytes(model.kv_lora_rank, model.qk_rope_head_dim)
    ours = cell_size_bytes(model, dtype="float8_e4m3fn")
    sglangs = target.cell_size_bytes(
        model, dtype="float8_e4m3fn", is_draft=False, enable_hisparse=False
    )
    assert sglangs == ours == 53_940
    assert ours - model.num_hidden_layers * (scaled - raw) == 47_700


def test_kv_cache_dtype_choices_are_sglangs() -> None:
    """kvcheck's --kv-cache-dtype vocabulary is the installed sglang's choices, and its FP4
    names are sglang's FP4 choices (a name sglang refuses is no flag combination at all)."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.server_args import ServerArgs

    from kvcheck.vocabulary import FP4_KV_CACHE_DTYPES, KV_CACHE_DTYPE_CHOICES

    field = next(f for f in record_fields(ServerArgs) if f.name == "kv_cache_dtype")
    choices = next(arg.choices for arg in field.type.__metadata__ if hasattr(arg, "choices"))
    assert tuple(choices) == KV_CACHE_DTYPE_CHOICES
    assert set(FP4_KV_CACHE_DTYPES) == {name for name in choices if "fp4" in name}


def test_hisparse_ratio_is_sglangs_default() -> None:
    """kvcheck's HiSparse index ratio is parse_hisparse_config's default host_to_device_ratio."""
    from sglang.srt.mem_cache.sparsity import parse_hisparse_config

    from kvcheck.serving import HISPARSE_HOST_TO_DEVICE_RATIO
    from kvcheck.targets.sglang.target import _published, _serving_args

    with _published(_serving_args(enable_hisparse=True)):
        ratio = parse_hisparse_config().host_to_device_ratio
    assert ratio == HISPARSE_HOST_TO_DEVICE_RATIO == 2


def _scaled_write(target: SGLangTarget, nope: torch.Tensor, rope: torch.Tensor) -> tuple:
    """sglang's scaled fp8 DSA pool after writing one token at slot 5, and the reference."""
    from kvcheck.reference import ReferencePool
    from kvcheck.specs import WriteMLA

    spec = PoolSpec(
        family="dsa",
        size=DSA_PAGE,
        page_size=DSA_PAGE,
        layer_num=1,
        dtype="float8_e4m3fn",
        kv_lora_rank=nope.shape[-1],
        qk_rope_head_dim=rope.shape[-1],
        latent_layout="scaled",
    )
    pool = target.make_pool(spec, device="cpu")
    pool.set_mla_kv_buffer(Layer(0), torch.tensor([5]), nope.view(1, 1, -1), rope.view(1, 1, -1))
    reference = ReferencePool(spec)
    reference.apply(
        WriteMLA(
            layer_id=0,
            locs=(5,),
            nope_rows=(bytes(nope.view(torch.uint8).tolist()),),
            rope_rows=(bytes(rope.view(torch.uint8).tolist()),),
            dtype="bfloat16",
        )
    )
    got = pool.kv_buffer[0].view(torch.uint8).reshape(spec.num_slots, -1)
    return pool, got.numpy(), reference.expected_kv_buffer(0)


def test_scaled_fp8_latent_write_matches_the_reference(target: SGLangTarget) -> None:
    """sglang's pool built with the scaled kv_cache_dim (656 bytes for 512 + 64) stores
    scaled rows, and its quantizer (its Triton kernel's body on CPU) writes the
    reference's bytes: fp8 values, one fp32 scale per 128, the bf16 rope."""
    generator = torch.Generator().manual_seed(0)
    nope = (torch.randn(512, generator=generator) * 3).to(torch.bfloat16)
    rope = torch.randn(64, generator=generator).to(torch.bfloat16)
    pool, got, expected = _scaled_write(target, nope, rope)
    assert pool.dsa_kv_cache_store_fp8 and pool.kv_cache_dim == 656
    assert (got == expected).all()
    # restored after the call, in the module the release keeps it in
    kernel = getattr(_sglang().dsa_quant_kernels, env.DSA_QUANT_KERNEL_NAME)
    assert not isinstance(kernel, env._CpuQuantizeKCacheKernel)


def test_scaled_fp8_zero_block_is_stored_from_zero_times_inf(target: SGLangTarget) -> None:
    """An all-zero nope block: sglang's quantizer (no guard: ``0 * (1 / 0)``) stores scale
    0 with every value clamped from NaN, where kvcheck's contract stores zeros. On CPU its
    transcription clamps as tl.clamp documents (NaN not propagated: FP8_MIN, 0xfe); the
    bytes a GPU writes are unverified here. The other block and the rope agree."""
    nope = torch.cat([torch.zeros(128), torch.ones(128)]).to(torch.bfloat16)
    rope = torch.zeros(0, dtype=torch.bfloat16)
    _, got, expected = _scaled_write(target, nope, rope)
    row, want = got[5], expected[5]
    assert set(row[:128].tolist()) == {0xFE} and set(want[:128].tolist()) == {0}
    assert (row[128:] == want[128:]).all()
    assert row[256:260].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("page_size", [1, 128])  # the flat and the interleaved scale layouts
@pytest.mark.parametrize(("head_dim", "v_head_dim"), [(128, 128), (64, 96)])
def test_mxfp8_cell_is_what_sglangs_mxfp8_pool_allocates(
    target: SGLangTarget, page_size: int, head_dim: int, v_head_dim: int
) -> None:
    """sglang's MXFP8 cell (its configurator, given kv_cache_dtype_str="mxfp8") is the bytes
    a token costs in the MHATokenToKVPoolMXFP8 sglang builds for it: fp8 K and V rows and
    one e8m0 scale per 32 values, counted from the pool's own buffers on CPU."""
    import dataclasses

    model = dataclasses.replace(
        QWEN3_EMBEDDING_8B, num_hidden_layers=3, head_dim=head_dim, v_head_dim=v_head_dim
    )
    cell = target.cell_size_bytes(model, dtype="mxfp8", is_draft=False, enable_hisparse=False)
    spec = PoolSpec(
        family="mha",
        size=2 * page_size,
        page_size=page_size,
        layer_num=model.num_hidden_layers,
        dtype="float8_e4m3fn",
        head_num=model.num_key_value_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
    )
    with env.native_kv_move():
        pool = target.pool_arguments(spec, device="cpu").build(
            _sglang().memory_pool.MHATokenToKVPoolMXFP8
        )
    held = sum(
        tensor.numel() * tensor.element_size()
        for name in ("k_buffer", "v_buffer", "k_scale_buffer", "v_scale_buffer")
        for tensor in getattr(pool, name)
    )
    rows = spec.size + page_size  # sglang's pools keep one padding page
    values = model.num_key_value_heads * (head_dim + v_head_dim) * model.num_hidden_layers
    assert held == rows * cell
    assert cell == values + values // 32


def test_mxfp8_heads_that_are_not_whole_blocks_are_refused_by_sglangs_pool(
    target: SGLangTarget,
) -> None:
    """sglang's sizing accepts a 48-wide MXFP8 head; the pool a launch builds next refuses
    it, and the target passes that ValueError on from the sizing calls."""
    import dataclasses

    model = dataclasses.replace(QWEN3_EMBEDDING_8B, head_dim=48, v_head_dim=48)
    with pytest.raises(ValueError, match="divisible by 32"):
        target.cell_size_bytes(model, dtype="mxfp8", is_draft=False, enable_hisparse=False)
    with pytest.raises(ValueError, match="divisible by 32"):
        target.max_total_num_tokens(
            model,
            budget_bytes=1 << 30,
            dtype="mxfp8",
            page_size=128,
            is_draft=False,
            enable_hisparse=False,
        )


@pytest.mark.parametrize("dtype", ["nvfp4", "fp4_mx_block16"])
def test_fp4_kv_cache_dtypes_are_declared_unsized(target: SGLangTarget, dtype: str) -> None:
    """The FP4 dtypes are declared unsized, with the CPU reason, and sizing one says so
    instead of returning sglang's CPU figure (a byte per value, no scales)."""
    assert "is_float4_e2m1fn_x2" in target.unsized_kv_cache_dtypes[dtype]
    with pytest.raises(NotImplementedError, match="is_float4_e2m1fn_x2"):
        target.cell_size_bytes(
            QWEN3_EMBEDDING_8B, dtype=dtype, is_draft=False, enable_hisparse=False
        )
