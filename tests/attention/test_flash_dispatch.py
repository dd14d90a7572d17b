"""flash-attn stays optional: lazy import, backend choice, and the arguments it is handed."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest
import torch

from kvcheck.attention import (
    append_padding_segment,
    flash_attn_available,
    flash_unsupported_reason,
    flash_varlen_attention,
    reference_varlen_attention,
    resolve_backend,
    varlen_attention,
)
from kvcheck.attention import flash as flash_module


class RecordingFlash:
    """A stand-in for flash_attn_varlen_func: records its arguments, answers with the reference."""

    def __init__(self, *, return_tuple: bool = False) -> None:
        self.calls: list[dict] = []
        self.return_tuple = return_tuple

    def __call__(self, q, k, v, **kwargs):
        self.calls.append({"q": q, "k": k, "v": v, **kwargs})
        out = reference_varlen_attention(
            q,
            k,
            v,
            kwargs["cu_seqlens_q"],
            kwargs["max_seqlen_q"],
            causal=kwargs["causal"],
            softmax_scale=kwargs["softmax_scale"],
            window=kwargs["window_size"],
            softcap=kwargs["softcap"],
            cu_seqlens_k=kwargs["cu_seqlens_k"],
            max_seqlen_k=kwargs["max_seqlen_k"],
        )
        return (out, torch.zeros(1)) if self.return_tuple else out


@pytest.fixture
def qkv():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 16, generator=generator)
    k = torch.randn(6, 2, 16, generator=generator)
    v = torch.randn(6, 2, 16, generator=generator)
    return q, k, v, torch.tensor([0, 1, 6], dtype=torch.int32)


def test_flash_call_receives_flash_attn_keyword_arguments(qkv):
    """Every argument reaches the kernel under flash-attn's keyword name, scale resolved."""
    q, k, v, cu = qkv
    fake = RecordingFlash()
    flash_varlen_attention(q, k, v, cu, 5, causal=True, window=(3, -1), softcap=30.0, flash_fn=fake)
    (call,) = fake.calls
    assert call["q"] is q and call["k"] is k and call["v"] is v
    assert call["cu_seqlens_q"] is cu and call["cu_seqlens_k"] is cu
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (5, 5)
    assert call["softmax_scale"] == pytest.approx(1 / 4)
    assert (call["causal"], call["window_size"], call["softcap"]) == (True, (3, -1), 30.0)


def test_flash_output_is_taken_from_a_tuple_result(qkv):
    """Builds that return (out, softmax_lse) still yield the output tensor."""
    q, k, v, cu = qkv
    out = flash_varlen_attention(
        q, k, v, cu, 5, causal=False, flash_fn=RecordingFlash(return_tuple=True)
    )
    expected = reference_varlen_attention(q, k, v, cu, 5, causal=False)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_padding_segment_reaches_the_kernel(qkv):
    """A padded bucket hands the kernel the padding segment; real rows are unchanged."""
    q, k, v, cu = qkv
    pad = 9
    qp, kp, vp = (torch.cat([x, torch.full((pad, *x.shape[1:]), 50.0)]) for x in (q, k, v))
    cu_padded, max_padded = append_padding_segment(cu, 5, num_tokens=qp.shape[0])
    fake = RecordingFlash()
    out = flash_varlen_attention(qp, kp, vp, cu_padded, max_padded, causal=True, flash_fn=fake)
    (call,) = fake.calls
    assert call["cu_seqlens_q"].tolist() == [0, 1, 6, 15]
    assert call["max_seqlen_q"] == 9
    real = reference_varlen_attention(q, k, v, cu, 5, causal=True)
    torch.testing.assert_close(out[:6], real, rtol=0, atol=0)
    assert not out.isnan().any()


def test_flash_path_refuses_padding_without_its_segment(qkv):
    """Rows beyond cu_seqlens[-1] are refused before the kernel could corrupt the last sequence."""
    q, k, v, cu = qkv
    qp, kp, vp = (torch.cat([x, torch.zeros(2, *x.shape[1:])]) for x in (q, k, v))
    fake = RecordingFlash()
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\]=6 < q\.shape\[0\]=8"):
        flash_varlen_attention(qp, kp, vp, cu, 5, causal=True, flash_fn=fake)
    assert fake.calls == []


SUPPORT_CASES = {
    "cuda-fp16": (dict(device_type="cuda", dtype=torch.float16), None),
    "cuda-bf16": (dict(device_type="cuda", dtype=torch.bfloat16), None),
    "not-installed": (dict(installed=False), "not installed"),
    "cpu": (dict(device_type="cpu"), "needs CUDA tensors"),
    "fp32": (dict(dtype=torch.float32), "needs float16 or bfloat16"),
    "head-dim-512": (dict(head_dim=512, v_head_dim=512), "head_dim <= 256"),
    "v-head-dim-differs": (dict(v_head_dim=64), "v_head_dim == head_dim"),
}


@pytest.mark.parametrize(("overrides", "reason"), SUPPORT_CASES.values(), ids=SUPPORT_CASES)
def test_flash_is_used_only_where_it_can_serve(overrides, reason):
    """flash-attn serves only installed + CUDA + fp16/bf16 + equal head dims <= 256."""
    properties = dict(
        device_type="cuda", dtype=torch.float16, head_dim=128, v_head_dim=128, installed=True
    )
    got = flash_unsupported_reason(**{**properties, **overrides})
    if reason is None:
        assert got is None
    else:
        assert reason in got


def test_auto_backend_is_torch_on_cpu(qkv):
    """On CPU tensors "auto" resolves to the torch reference, whatever is installed."""
    q, _, v, _ = qkv
    assert resolve_backend("auto", q=q, v=v) == "torch"
    assert resolve_backend("flash", q=q, v=v) == "flash"


def test_forcing_flash_on_cpu_says_why(qkv):
    """backend="flash" where flash-attn cannot serve is a ValueError with the reason."""
    q, k, v, cu = qkv
    with pytest.raises(ValueError, match=r"backend='flash' cannot serve this call: "):
        varlen_attention(q, k, v, cu, 5, causal=True, backend="flash")


def test_auto_backend_uses_flash_when_it_can(monkeypatch, qkv):
    """When flash-attn can serve the call, varlen_attention dispatches to it."""
    q, k, v, cu = qkv
    fake = RecordingFlash()
    monkeypatch.setattr(flash_module, "flash_unsupported_reason", lambda **_: None)
    monkeypatch.setattr(flash_module, "_load_flash_varlen_func", lambda: (fake, ""))
    monkeypatch.setattr("kvcheck.attention.varlen.flash_unsupported_reason", lambda **_: None)
    out = varlen_attention(q, k, v, cu, 5, causal=True)
    assert len(fake.calls) == 1
    torch.testing.assert_close(
        out, reference_varlen_attention(q, k, v, cu, 5, causal=True), rtol=0, atol=0
    )


def test_missing_flash_attn_reads_as_unavailable(monkeypatch):
    """An absent (or broken) flash_attn import makes flash_attn_available() False, lazily."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # the import now raises ImportError
    flash_module._load_flash_varlen_func.cache_clear()
    try:
        assert flash_attn_available() is False
        assert "not installed" in flash_unsupported_reason(
            device_type="cuda", dtype=torch.float16, head_dim=64, v_head_dim=64
        )
    finally:
        flash_module._load_flash_varlen_func.cache_clear()


def test_no_module_imports_flash_attn_at_import_time():
    """flash-attn is imported on first use only, so kvcheck installs and imports without it."""
    package_dir = pathlib.Path(flash_module.__file__).parent
    eager = []
    for path in sorted(package_dir.glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            eager += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "flash_attn"]
    assert eager == []
