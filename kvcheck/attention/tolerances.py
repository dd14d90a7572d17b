"""The one table of tolerances for comparing attention outputs.

Keyed by (comparison, device type, dtype). Why each entry is what it is:

* ``paged_vs_raw``: both paths run the same kernel on equal values; on the CPU that
  is bit for bit in fp32. fp16/bf16 (and fp32 on CUDA, where the library may pick a
  different GEMM for another buffer) get one rounding step of the output dtype.
* ``padding``: real sequences are computed alone whether or not a padding segment
  follows, by the same backend: exact.
* ``flash_vs_torch``: flash-attn rounds the softmax probabilities to fp16/bf16 before
  the P.V product and uses a fast tanh for softcap; the torch reference stays in fp32.
  A few output ulps, scaled to the dtype.
* ``suffix_vs_full``: the bottom-right-alignment property compares a suffix of queries
  against full self-attention: different GEMM shapes, so fp32 rounding may differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kvcheck.failures import FailureSignature


@dataclass(frozen=True)
class Tolerance:
    """``torch.testing.assert_close`` tolerances: ``|a - e| <= atol + rtol * |e|``."""

    rtol: float
    atol: float


EXACT = Tolerance(rtol=0.0, atol=0.0)
_ONE_ROUNDING = {
    torch.float32: Tolerance(rtol=1.3e-6, atol=1e-5),
    torch.float16: Tolerance(rtol=1e-3, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-5),
}
_FLASH = {
    torch.float16: Tolerance(rtol=4e-3, atol=4e-3),
    torch.bfloat16: Tolerance(rtol=2e-2, atol=3e-2),
}

#: What the table compares: paged read-back against raw K/V, padded against unpadded,
#: flash against the torch reference, a query suffix against full attention.
COMPARISONS: tuple[str, ...] = ("paged_vs_raw", "padding", "flash_vs_torch", "suffix_vs_full")

_DEVICES = ("cpu", "cuda")
TOLERANCES: dict[tuple[str, str, torch.dtype], Tolerance] = {
    **{("paged_vs_raw", dev, dt): tol for dev in _DEVICES for dt, tol in _ONE_ROUNDING.items()},
    ("paged_vs_raw", "cpu", torch.float32): EXACT,
    **{("padding", dev, dt): EXACT for dev in _DEVICES for dt in _ONE_ROUNDING},
    # flash-attn never runs on the CPU: the CPU entries serve kvcheck's stand-in kernels.
    **{("flash_vs_torch", dev, dt): tol for dev in _DEVICES for dt, tol in _FLASH.items()},
    **{("suffix_vs_full", dev, torch.float32): _ONE_ROUNDING[torch.float32] for dev in _DEVICES},
    **{("suffix_vs_full", "cuda", dt): tol for dt, tol in _FLASH.items()},
}


def tolerance(comparison: str, *, dtype: torch.dtype, device: torch.device | str) -> Tolerance:
    """The tolerance for ``comparison`` of ``dtype`` outputs on ``device``.

    Example:
        >>> tolerance("paged_vs_raw", dtype=torch.float32, device="cpu")
        Tolerance(rtol=0.0, atol=0.0)
    """
    if comparison not in COMPARISONS:
        raise ValueError(f"comparison={comparison!r} not in {COMPARISONS}")
    device_type = torch.device(device).type
    key = (comparison, device_type, dtype)
    if key not in TOLERANCES:
        known = sorted({(c, d, str(t)) for c, d, t in TOLERANCES})
        raise ValueError(
            f"no tolerance for comparison={comparison!r}, device={device_type!r}, "
            f"dtype={dtype}; the table holds {known}"
        )
    return TOLERANCES[key]


def assert_outputs_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    comparison: str,
    context: str = "",
    signature: FailureSignature | None = None,
) -> None:
    """Assert two attention outputs agree within the table's tolerance.

    Raises :class:`kvcheck.properties.PropertyFailure` (an ``AssertionError``) carrying
    ``signature``; the message has the shape ``got ... but should be ... [context]`` and
    names the first differing token and head.

    Example:
        >>> x = torch.ones(2, 1, 4)
        >>> assert_outputs_close(x, x.clone(), comparison="paged_vs_raw")
    """
    __tracebackhide__ = True
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise _failure(
            f"got shape {tuple(actual.shape)} {actual.dtype} but should be "
            f"{tuple(expected.shape)} {expected.dtype} [{comparison}] {context}",
            signature,
        )
    tol = tolerance(comparison, dtype=expected.dtype, device=expected.device)
    close = torch.isclose(
        actual.float(), expected.float(), rtol=tol.rtol, atol=tol.atol, equal_nan=False
    )
    if bool(close.all()):
        return
    bad = (~close).nonzero()
    token, head = (int(x) for x in bad[0][:2])
    diff = (actual.float() - expected.float()).abs()
    raise _failure(
        f"got {actual[token, head].tolist()} but should be {expected[token, head].tolist()} "
        f"at token {token}, head {head} ({bad.shape[0]} of {actual.numel()} values differ, "
        f"max |diff|={float(diff.nan_to_num(float('inf')).max()):.3g}, "
        f"{tol}) [{comparison}] {context}",
        signature,
    )


def _failure(message: str, signature: FailureSignature | None) -> AssertionError:
    # Imported here: kvcheck.properties loads the pool-side modules, which the attention
    # code does not otherwise need.
    from kvcheck.failures import PropertyFailure

    return PropertyFailure(message, signature=signature)
