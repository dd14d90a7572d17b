"""memory-report takes any model kvcheck can size (issue 36, "What was seen" item 5): a
Hugging Face ``config.json`` (``--config``), a model id from the local Hugging Face cache
(no network), the named Llama 3.1, Qwen3, DeepSeek-V3/R1 models, and a refusal with the
reason for a model whose pool it cannot size (an SWA model).

The config files under ``tests/data/hf_configs/`` hold the published configs' fields (the
Llama and Qwen3 ones whole). The cells they give here are the named models' cells, which
the shipped suite's ``test_named_cell_sizes`` checks against sglang's own configurator on
the sglang target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvcheck.runner.cli import main
from kvcheck.runner.memory_report import memory_rows
from kvcheck.vocabulary import (
    DEEPSEEK_V3,
    LLAMA_3_1_8B,
    QWEN3_8B,
    ModelConfig,
    UnsizedModel,
    load_model_config,
    model_from_hf_config,
)
from kvcheck.vocabulary.hf_configs import hf_config_path

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
_GEOMETRY = (
    "attention_arch",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "v_head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
)


@pytest.fixture(autouse=True)
def no_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own Hugging Face cache never decides a result here."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _geometry(model: ModelConfig) -> tuple[object, ...]:
    return tuple(getattr(model, field) for field in _GEOMETRY)


@pytest.mark.parametrize(
    ("folder", "named"),
    [("Llama-3.1-8B", LLAMA_3_1_8B), ("Qwen3-8B", QWEN3_8B), ("DeepSeek-V3", DEEPSEEK_V3)],
)
def test_a_config_json_reads_as_the_named_model(folder: str, named: ModelConfig) -> None:
    """Each published config.json gives the geometry of the named model kvcheck keeps."""
    model = load_model_config(str(CONFIGS / folder / "config.json"))
    assert model.name == folder
    assert _geometry(model) == _geometry(named)


@pytest.mark.parametrize(
    ("folder", "cell"),
    [("Llama-3.1-8B", "131,072"), ("Qwen3-8B", "147,456"), ("DeepSeek-V3", "70,272")],
)
def test_memory_report_takes_a_config_json(
    capsys: pytest.CaptureFixture[str], folder: str, cell: str
) -> None:
    """--config sizes the model its config.json describes (file or folder), the built pool
    equal to the formula: Llama-3.1-8B 32 layers * 8 heads * 256 * 2 bytes, Qwen3-8B 36 * 8
    * 256 * 2, DeepSeek-V3 61 * 576 * 2."""
    for source in (CONFIGS / folder / "config.json", CONFIGS / folder):
        assert main(["memory-report", "--config", str(source)]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(folder))
        assert cell in row and "built == formula" in row


def test_config_cells_equal_the_named_cells() -> None:
    """A config.json's rows equal its named model's rows in every column but the name."""
    for folder, named in (("Llama-3.1-8B", LLAMA_3_1_8B), ("Qwen3-8B", QWEN3_8B)):
        sizing = {"budget_bytes": 8 << 30, "dtype": "bfloat16", "page_size": 64}
        from_file = memory_rows([load_model_config(str(CONFIGS / folder))], **sizing)
        from_name = memory_rows([named.name], **sizing)
        strip = [(r.variant, r.cell_bytes, r.tokens, r.built_bytes) for r in from_file]
        assert strip == [(r.variant, r.cell_bytes, r.tokens, r.built_bytes) for r in from_name]


def test_an_swa_config_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b's config (sliding layers) is refused saying the SWA pool is not sized,
    by --config and by name; never sized as if every layer were full attention."""
    assert main(["memory-report", "--config", str(CONFIGS / "gpt-oss-20b")]) == 2
    error = capsys.readouterr().err
    assert "sliding_window=128 on 12 of 24 layers" in error and "SWA KV pool" in error
    assert main(["memory-report", "--model", "gpt-oss-20b"]) == 2
    assert "cannot be sized" in capsys.readouterr().err


def test_a_linear_attention_config_is_refused_with_the_reason() -> None:
    """A hybrid linear-attention config is refused naming its linear layers."""
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "hidden_size": 512,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    with pytest.raises(UnsizedModel, match="3 of 4 layers are 'linear_attention'"):
        model_from_hf_config(config, name="hybrid")


def test_a_config_missing_a_field_names_it() -> None:
    """A JSON that is not a decoder's config names the missing field."""
    with pytest.raises(ValueError, match="num_hidden_layers=None must be a positive int"):
        model_from_hf_config({"model_type": "bert"}, name="x")


def test_a_multimodal_config_reads_its_text_config() -> None:
    """A config whose language model sits in text_config is read from there."""
    text = json.loads((CONFIGS / "Qwen3-8B" / "config.json").read_text())
    model = model_from_hf_config({"model_type": "vl", "text_config": text}, name="vl")
    assert _geometry(model) == _geometry(QWEN3_8B)


def _cache_model(hub: Path, model_id: str, config: Path, *, snapshot: str = "abc123") -> Path:
    org, name = model_id.split("/")
    repo = hub / f"models--{org}--{name}"
    (repo / "snapshots" / snapshot).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot)
    copied = repo / "snapshots" / snapshot / "config.json"
    copied.write_text(config.read_text())
    return copied


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_model_id_resolves_from_the_local_cache(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    """--model and --config take a model id whose config.json the local Hugging Face cache
    holds (HF_HUB_CACHE, or HF_HOME/hub), at the snapshot refs/main names."""
    root = tmp_path / "cache"
    hub = root if variable == "HF_HUB_CACHE" else root / "hub"
    monkeypatch.setenv(variable, str(root))
    model_id = "meta-llama/Llama-3.1-8B-Instruct"
    cached = _cache_model(hub, model_id, CONFIGS / "Llama-3.1-8B" / "config.json")
    assert hf_config_path(model_id) == cached
    for option in ("--model", "--config"):
        assert main(["memory-report", option, model_id]) == 0
        out = capsys.readouterr().out
        assert model_id in out and "131,072" in out


def test_an_uncached_model_id_says_where_it_looked(capsys: pytest.CaptureFixture[str]) -> None:
    """A model id neither named nor cached gets the nearest name and how to pass a config;
    nothing is downloaded."""
    assert main(["memory-report", "--model", "meta-llama/Llama-3.1-8B-Instruct"]) == 2
    error = capsys.readouterr().err
    assert "did you mean 'meta-llama/Llama-3.1-8B'" in error and "--config" in error
    assert main(["memory-report", "--config", "meta-llama/Llama-3.1-8B-Instruct"]) == 2
    error = capsys.readouterr().err
    assert "no Hugging Face cache" in error and os.fspath("empty-hub") in error


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("llama-3.1-70b", "meta-llama/Llama-3.1-70B"),
        ("Qwen3-8B", "Qwen/Qwen3-8B"),
        ("DeepSeek-V3", "deepseek-ai/DeepSeek-V3"),
        ("DeepSeek-R1", "deepseek-ai/DeepSeek-R1"),
    ],
)
def test_the_common_families_are_named(
    capsys: pytest.CaptureFixture[str], name: str, full: str
) -> None:
    """Llama 3.1, Qwen3 dense and DeepSeek-V3/R1 are named models, built == formula."""
    assert main(["memory-report", "--model", name]) == 0
    out = capsys.readouterr().out
    assert full in out and "built == formula" in out and "MISMATCH" not in out
