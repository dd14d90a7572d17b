"""The device the suite runs on: ``--kvcheck-device`` / ``KVCHECK_DEVICE`` and xdist GPU sharing.

Specs are ``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu``, ``cuda`` and ``cuda:N``.
Under ``pytest -n N`` on a machine with several GPUs, each xdist worker is pinned to one
GPU, round-robin, by narrowing ``CUDA_VISIBLE_DEVICES`` before CUDA initializes in that
worker; :func:`worker_visible_devices` is the pure rule, :func:`count_gpus` looks without
initializing CUDA.

Example:
    >>> parse_device_spec(" CUDA:1 ")
    'cuda:1'
    >>> worker_visible_devices(worker_id="gw3", device_spec="auto", visible_devices=None,
    ...                        gpu_count=2, cuda_initialized=False)
    '1'
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

__all__ = [
    "DEVICE_ENV_VAR",
    "DEVICE_SPECS",
    "assign_worker_gpu",
    "count_gpus",
    "cuda_initialized",
    "cuda_problem",
    "parse_device_spec",
    "resolve_device",
    "visible_device_entries",
    "worker_visible_devices",
]

DEVICE_ENV_VAR = "KVCHECK_DEVICE"
DEVICE_SPECS = ("auto", "cpu", "cuda", "cuda:N")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")
#: One entry per GPU the NVIDIA driver knows, readable without touching CUDA (Linux).
_NVIDIA_PROC_GPUS = Path("/proc/driver/nvidia/gpus")


def parse_device_spec(spec: str | None) -> str:
    """Normalize a device spec; ``None`` or empty means ``auto``.

    Raises ``ValueError`` naming the value and the accepted forms.

    Example:
        >>> parse_device_spec(None)
        'auto'
    """
    text = (spec or "").strip().lower()
    if not text:
        return "auto"
    if text in ("auto", "cpu", "cuda") or _CUDA_INDEX.fullmatch(text):
        return text
    raise ValueError(
        f"device={spec!r} is not a kvcheck device; expected one of {', '.join(DEVICE_SPECS)} "
        f"(--kvcheck-device or {DEVICE_ENV_VAR})"
    )


def resolve_device(spec: str) -> str:
    """The torch device string a spec means on this machine: ``"cpu"`` or ``"cuda:N"``.

    Imports torch. ``cuda``/``cuda:N`` without a usable GPU raise ``ValueError`` saying so.

    Example:
        >>> resolve_device("cpu")
        'cpu'
    """
    normalized = parse_device_spec(spec)
    if normalized == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if normalized == "auto":
        return "cuda:0" if available else "cpu"
    if not available:
        raise ValueError(
            f"device={spec!r} needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
            "use auto or cpu"
        )
    index = 0 if normalized == "cuda" else int(normalized.split(":")[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"device={spec!r}: only {count} CUDA device(s) visible")
    return f"cuda:{index}"


def cuda_problem(spec: str) -> str | None:
    """Why ``spec`` (``cuda`` or ``cuda:N``) cannot run on this machine, or None.

    Fast where torch is a CPU build by its version tag (``2.13.0+cpu``): that is known
    from its installed metadata without importing torch. Otherwise torch is imported and
    asked (:func:`resolve_device`).

    Example:
        >>> cuda_problem("cpu") is None
        True
    """
    normalized = parse_device_spec(spec)
    if not normalized.startswith("cuda"):
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torch")
    except PackageNotFoundError:
        return f"device={spec!r} needs torch with CUDA, but torch is not installed"
    if installed.endswith("+cpu"):
        return (
            f"device={spec!r} needs CUDA, but the installed torch {installed} is a CPU build; "
            "use auto or cpu (or install a CUDA build of torch)"
        )
    try:
        resolve_device(normalized)
    except ValueError as exc:
        return str(exc)
    return None


def visible_device_entries(visible_devices: str | None, gpu_count: int) -> list[str]:
    """The GPUs a process may use: ``CUDA_VISIBLE_DEVICES`` entries, else ``0..gpu_count-1``.

    Example:
        >>> visible_device_entries("2,3", gpu_count=8)
        ['2', '3']
        >>> visible_device_entries("-1", gpu_count=8)
        []
    """
    if visible_devices is None:
        return [str(index) for index in range(max(gpu_count, 0))]
    entries = (entry.strip() for entry in visible_devices.split(","))
    # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
    return list(itertools.takewhile(lambda entry: entry and not entry.startswith("-"), entries))


def worker_visible_devices(
    *,
    worker_id: str | None,
    device_spec: str,
    visible_devices: str | None,
    gpu_count: int,
    cuda_initialized: bool,
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` an xdist worker should use, or ``None`` to change nothing.

    Worker ``gwK`` gets visible GPU ``K mod len(visible)``. Nothing changes outside xdist,
    for ``cpu`` or an explicit ``cuda:N``, once CUDA is initialized (too late to narrow),
    or with fewer than two visible GPUs.

    Example:
        >>> worker_visible_devices(worker_id="gw1", device_spec="cuda",
        ...                        visible_devices="4,5,6", gpu_count=8,
        ...                        cuda_initialized=False)
        '5'
    """
    if worker_id is None or cuda_initialized:
        return None
    if parse_device_spec(device_spec) not in ("auto", "cuda"):
        return None
    match = re.fullmatch(r"gw(\d+)", worker_id.strip())
    if match is None:
        raise ValueError(f"worker_id={worker_id!r} is not an xdist worker id like 'gw0'")
    entries = visible_device_entries(visible_devices, gpu_count)
    if len(entries) < 2:
        return None
    return entries[int(match.group(1)) % len(entries)]


def count_gpus() -> int:
    """GPUs on this machine, counted without initializing CUDA (0 when unknown).

    Reads the NVIDIA driver's ``/proc`` listing; elsewhere asks torch only if it is
    already imported (its NVML-based count does not initialize CUDA either).

    Example:
        >>> count_gpus() >= 0
        True
    """
    try:
        return sum(1 for _ in _NVIDIA_PROC_GPUS.iterdir())
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    return int(torch.cuda.device_count())


def cuda_initialized() -> bool:
    """Whether this process has initialized CUDA (never true if torch is not imported)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def assign_worker_gpu(worker_id: str | None, device_spec: str) -> str | None:
    """Narrow ``CUDA_VISIBLE_DEVICES`` for this xdist worker; return the new value (or None).

    Example:
        >>> assign_worker_gpu(None, "auto") is None
        True
    """
    chosen = worker_visible_devices(
        worker_id=worker_id,
        device_spec=device_spec,
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        gpu_count=count_gpus() if worker_id is not None else 0,
        cuda_initialized=cuda_initialized(),
    )
    if chosen is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen
