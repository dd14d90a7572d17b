"""The target resolver (kvcheck.targets) and the built-in target (kvcheck.targets.builtin)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvcheck import serving
from kvcheck.specs import PoolSpec
from kvcheck.targets import (
    CAPABILITIES,
    TargetError,
    capability_skip_reason,
    check_target,
    resolve_target,
    target_spec,
)
from kvcheck.targets.builtin import KVCheckTarget, pool_family

# A complete third-party target, written as a module the resolver imports.
_TARGET_MODULE = """
    from kvcheck.targets.builtin import KVCheckTarget

    class MyTarget(KVCheckTarget):
        name = "mine"
        version = "9.9"

    instance = MyTarget()

    def factory():
        return MyTarget()

    def broken_factory():
        raise RuntimeError("GPU driver too old")

    class Namespace:
        target = MyTarget()

    not_a_target = 42

    class PoolOnly:
        name = "pool-only"
        version = "1"
        unsupported = {cap: "pools only" for cap in (
            "index_k_write", "server_args", "pool_selection", "configurator", "skip_rule")}

        def make_pool(self, spec, *, device):
            return None

    class MissingServing:
        name = "half"
        version = "1"
        unsupported = {}

        def make_pool(self, spec, *, device):
            return None
"""


@pytest.fixture
def target_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Write the third-party target module under a unique name and make it importable."""
    name = "third_party_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_TARGET_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


# --- resolution -----------------------------------------------------------------------------


def test_default_is_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    """No name and no KVCHECK_TARGET resolve to the built-in kvcheck target."""
    monkeypatch.delenv("KVCHECK_TARGET", raising=False)
    target = resolve_target()
    assert isinstance(target, KVCheckTarget)
    assert (target.name, target.version) == ("kvcheck", "0.1.0")


def test_env_var_names_target(monkeypatch: pytest.MonkeyPatch, target_module: str) -> None:
    """KVCHECK_TARGET is used when no name is given, and an explicit name beats it."""
    monkeypatch.setenv("KVCHECK_TARGET", f"{target_module}:instance")
    assert resolve_target().name == "mine"
    assert resolve_target("kvcheck").name == "kvcheck"
    assert target_spec(None) == f"{target_module}:instance"


@pytest.mark.parametrize("attr", ["instance", "MyTarget", "factory", "Namespace.target"], ids=str)
def test_module_attr_accepts_instance_class_factory(target_module: str, attr: str) -> None:
    """module:attr may name an instance, a class, a zero-argument factory or a dotted path."""
    target = resolve_target(f"{target_module}:{attr}")
    assert (target.name, target.version) == ("mine", "9.9")


def test_instance_is_used_as_is(target_module: str) -> None:
    """An instance is returned itself, not called or copied."""
    module = __import__(target_module)
    assert resolve_target(f"{target_module}:instance") is module.instance


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("bogus", "unknown target 'bogus'"),
        ("module:", "unknown target 'module:'"),
        (":attr", "unknown target ':attr'"),
        ("no_such_module_kvcheck:thing", "No module named 'no_such_module_kvcheck'"),
    ],
    ids=["bare-name", "no-attr", "no-module", "missing-module"],
)
def test_bad_names_raise_with_name_and_valid_names(spec: str, expected: str) -> None:
    """A bad name raises TargetError naming it, the valid names and the underlying error."""
    with pytest.raises(TargetError) as excinfo:
        resolve_target(spec)
    message = str(excinfo.value)
    assert expected in message
    assert "'kvcheck'" in message and "module:attr" in message
    assert isinstance(excinfo.value, ValueError)


def test_missing_attribute_is_reported(target_module: str) -> None:
    """An attribute the module lacks is named in the error."""
    with pytest.raises(TargetError, match="has no attribute 'nope'"):
        resolve_target(f"{target_module}:nope")


def test_failing_factory_is_reported(target_module: str) -> None:
    """A factory that raises is reported with the target name and its error."""
    with pytest.raises(TargetError, match=r"broken_factory.*GPU driver too old"):
        resolve_target(f"{target_module}:broken_factory")


def test_import_error_inside_module_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception raised while importing the module carries its type and message."""
    (tmp_path / "kvcheck_exploding_target.py").write_text("raise ImportError('needs cuda 13')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetError, match=r"ImportError: needs cuda 13"):
        resolve_target("kvcheck_exploding_target:target")


def test_non_target_object_lists_problems(target_module: str) -> None:
    """An object that is no target is rejected with what it lacks."""
    with pytest.raises(TargetError, match=r"does not satisfy.*name: missing"):
        resolve_target(f"{target_module}:not_a_target")


def test_methods_may_be_left_out_for_unsupported_capabilities(target_module: str) -> None:
    """A pool-only target that declares the serving side unsupported resolves; others fail."""
    assert resolve_target(f"{target_module}:PoolOnly").name == "pool-only"
    with pytest.raises(TargetError, match=r"validate_server_args: missing"):
        resolve_target(f"{target_module}:MissingServing")


def test_sglang_target_is_imported_only_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming sglang imports its adapter; where that fails the error names the target."""
    monkeypatch.setitem(sys.modules, "kvcheck.targets.sglang", None)  # import fails
    with pytest.raises(TargetError, match=r"target 'sglang': importing module"):
        resolve_target("sglang")


def test_check_target_flags_bad_unsupported_entries() -> None:
    """Unknown capability names and empty reasons in unsupported are reported."""
    target = KVCheckTarget()
    target.unsupported = {"teleport": "no", "move": ""}  # type: ignore[misc]
    problems = check_target(target)
    assert any("unknown capability 'teleport'" in p for p in problems)
    assert any("unsupported['move']" in p for p in problems)


# --- capability skips -------------------------------------------------------------------------


def test_skip_reason_none_when_supported() -> None:
    """Every capability of the built-in target is supported: no skip."""
    assert capability_skip_reason(KVCheckTarget(), CAPABILITIES) is None


def test_skip_reason_quotes_target_and_reason() -> None:
    """An unsupported capability yields a reason naming the target, capability and reason."""
    target = SimpleNamespace(
        name="t", unsupported={"move": "no move kernel", "mla_pool": "MHA only"}
    )
    reason = capability_skip_reason(target, ["mha_pool", "move", "mla_pool", "move"])
    assert reason == "target 't' does not support move (no move kernel); mla_pool (MHA only)"


def test_skip_reason_rejects_unknown_capability() -> None:
    """A misspelled capability is a ValueError naming it."""
    with pytest.raises(ValueError, match=r"\['hostcopy'\]"):
        capability_skip_reason(KVCheckTarget(), ["hostcopy"])


# --- the built-in target ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "buffers"),
    [
        (
            PoolSpec("mha", size=8, page_size=4, layer_num=2, dtype="bfloat16", v_head_dim=4),
            ("k_buffer", "v_buffer"),
        ),
        (
            PoolSpec("noop", size=8, page_size=4, layer_num=2, dtype="float16"),
            ("k_buffer", "v_buffer"),
        ),
        (
            PoolSpec("mla", size=8, page_size=4, layer_num=2, dtype="float8_e4m3fn", start_layer=3),
            ("kv_buffer",),
        ),
        (
            PoolSpec(
                "dsa",
                size=8,
                page_size=4,
                layer_num=3,
                dtype="bfloat16",
                skip_topk_layers=(False, True, False),
            ),
            ("kv_buffer", "index_k_with_scale_buffer"),
        ),
    ],
    ids=lambda value: value.family if isinstance(value, PoolSpec) else None,
)
def test_make_pool_builds_each_family(spec: PoolSpec, buffers: tuple[str, ...]) -> None:
    """make_pool builds the family's pool with the spec's geometry."""
    pool = KVCheckTarget().make_pool(spec, device="cpu")
    assert pool_family(pool) == spec.family
    assert (pool.size, pool.page_size, pool.start_layer) == (
        spec.size,
        spec.page_size,
        spec.start_layer,
    )
    for name in buffers:
        assert len(getattr(pool, name)) == spec.layer_num
    if spec.family == "dsa":
        assert list(pool.skip_topk_layers) == [False, True, False]
        assert pool.index_k_with_scale_buffer[1].numel() == 0


def test_make_pool_rejects_non_spec() -> None:
    """A non-PoolSpec is a ValueError naming the argument."""
    with pytest.raises(ValueError, match="spec="):
        KVCheckTarget().make_pool({"family": "mha"}, device="cpu")  # type: ignore[arg-type]


def test_write_index_k_goes_through_set_index_k_scale_buffer() -> None:
    """write_index_k writes a token's key bytes into its page row."""
    target = KVCheckTarget()
    spec = PoolSpec("dsa", size=8, page_size=4, layer_num=1, dtype="bfloat16")
    pool = target.make_pool(spec, device="cpu")
    key = torch.full((1, 128), 7, dtype=torch.uint8)
    scale = torch.ones(1, 1, dtype=torch.float32)
    target.write_index_k(pool, 0, torch.tensor([5]), key, scale)
    row = pool.get_index_k_with_scale_buffer(0)[1]  # token 5 is page 1, offset 1
    assert bool((row[128:256] == 7).all())


def test_validate_server_args_accepts_and_rejects() -> None:
    """Valid flags pass; a rejected combination raises the serving layer's ValueError."""
    target = KVCheckTarget()
    target.validate_server_args({"is_embedding": True})
    with pytest.raises(ValueError, match="--prefill-only-disable-kv-cache"):
        target.validate_server_args({"prefill_only_disable_kv_cache": True})


def test_unknown_flag_is_value_error() -> None:
    """A flag name ServerArgs does not have is a ValueError naming it."""
    with pytest.raises(ValueError, match="not_a_flag"):
        KVCheckTarget().validate_server_args({"not_a_flag": 1})


_NOOP_FLAGS = {
    "is_embedding": True,
    "prefill_only_disable_kv_cache": True,
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
}


@pytest.mark.parametrize(
    ("flags", "model", "is_draft", "family"),
    [
        ({}, serving.QWEN3_EMBEDDING_8B, False, "mha"),
        (_NOOP_FLAGS, serving.QWEN3_EMBEDDING_8B, False, "noop"),
        (_NOOP_FLAGS, serving.QWEN3_EMBEDDING_8B, True, "mha"),
        ({}, serving.GLM_5_2_LIKE, False, "dsa"),
        (_NOOP_FLAGS, serving.DEEPSEEK_V3_2, True, "dsa"),
    ],
    ids=["mha", "noop", "draft-keeps-mha", "dsa", "draft-keeps-dsa"],
)
def test_select_pool_family(flags: dict, model: object, is_draft: bool, family: str) -> None:
    """Pool selection reports the family of the pool it builds."""
    assert KVCheckTarget().select_pool_family(flags, model, is_draft=is_draft) == family


def test_select_pool_family_raises_for_unsupported_family() -> None:
    """The flag on a DSA model (not a draft) raises RuntimeError listing what is supported."""
    with pytest.raises(RuntimeError, match="DSA/MLA KV pool"):
        KVCheckTarget().select_pool_family(_NOOP_FLAGS, serving.DEEPSEEK_V3_2, is_draft=False)


def test_sizing_and_skip_rule_delegate_to_serving() -> None:
    """Cell size, capacity, skip rule and skip mask equal kvcheck.serving's answers."""
    target, model = KVCheckTarget(), serving.GLM_5_2_LIKE
    assert target.cell_size_bytes(
        model, dtype="bfloat16", is_draft=False, enable_hisparse=False
    ) == serving.cell_size_bytes(model, dtype="bfloat16")
    assert target.cell_size_bytes(
        model, dtype="bfloat16", is_draft=True, enable_hisparse=False
    ) == serving.cell_size_bytes(model, dtype="bfloat16", is_draft_worker=True)
    assert target.max_total_num_tokens(
        model,
        budget_bytes=1 << 30,
        dtype="bfloat16",
        page_size=64,
        is_draft=False,
        enable_hisparse=True,
    ) == serving.max_total_num_tokens(
        model, budget_bytes=1 << 30, dtype="bfloat16", page_size=64, enable_hisparse=True
    )
    assert [target.dsa_layer_skips_topk(model, i) for i in range(8)] == [
        serving.dsa_layer_skips_topk(model, i) for i in range(8)
    ]
    assert list(target.skip_topk_layers(model)) == serving.skip_topk_layers(model)


def test_pool_family_rejects_foreign_objects() -> None:
    """pool_family names only kvcheck's families."""
    with pytest.raises(ValueError, match="pool="):
        pool_family(object())
