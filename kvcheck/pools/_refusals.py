"""Argument validation shared by every pool family.

One vocabulary and one exception type: every check raises ``ValueError`` with a message
of the form ``where: name=value ...`` so a caller sees which argument was wrong and why.
Checks only read their inputs; nothing here mutates a caller's tensor or a pool.

Example:
    >>> import torch
    >>> require_int("page_size", 4, minimum=1)
    4
    >>> check_locations("loc", torch.tensor([3, 1]), limit=8, device=torch.device("cpu"),
    ...                 distinct=True, where="set_kv_buffer")
    tensor([3, 1])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

LOCATION_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
ALLOWED_DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "meta")


def require_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum`` (bools are refused).

    Example:
        >>> require_int("head_num", 0, minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: head_num=0 must be an integer >= 1
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}, not a bool")
    try:
        as_int = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}") from None
    if as_int < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return as_int


def require_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; anything else is refused by name."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a bool")
    return value


def resolve_device(device: object) -> torch.device:
    """Parse ``device`` (str or ``torch.device``) into a concrete ``torch.device``.

    Only ``cpu``, ``cuda`` (with or without an index) and ``meta`` are accepted; a bare
    ``cuda`` resolves to the current CUDA device so tensor devices compare equal to it.

    Example:
        >>> resolve_device("meta")
        device(type='meta')
    """
    try:
        parsed = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device={device!r} is not a device; use one of {ALLOWED_DEVICE_TYPES}"
        ) from None
    if parsed.type not in ALLOWED_DEVICE_TYPES:
        raise ValueError(f"device={device!r} is not supported; use one of {ALLOWED_DEVICE_TYPES}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, which is not available here")
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r} does not exist; {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    return parsed


def describe(tensor: torch.Tensor) -> str:
    """Shape, dtype and device of ``tensor``, for error messages."""
    return f"shape={tuple(tensor.shape)}, dtype={tensor.dtype}, device={tensor.device}"


def _require_tensor(name: str, value: object, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_locations(
    name: str,
    loc: object,
    *,
    limit: int,
    device: torch.device,
    distinct: bool,
    where: str,
    limit_reason: str = "",
) -> torch.Tensor:
    """Validate a location tensor and return it as ``int64`` on ``device``.

    ``loc`` must be a 1-D ``int32``/``int64`` tensor on ``device`` or on the CPU, with
    every value in ``[0, limit)`` and, when ``distinct``, no value twice. Values are only
    checked where they can be read: a ``meta`` tensor passes on shape and dtype alone.
    ``limit_reason`` is appended to an out-of-range message to say where ``limit`` comes from.

    Example:
        >>> check_locations("tgt_loc", torch.tensor([2, 2]), limit=4,
        ...                 device=torch.device("cpu"), distinct=True, where="move_kv_cache")
        Traceback (most recent call last):
        ...
        ValueError: move_kv_cache: tgt_loc has value 2 at positions 0 and 1; ...
    """
    tensor = _require_tensor(name, loc, where)
    if tensor.dim() != 1:
        raise ValueError(f"{where}: {name} must be 1-D, got {describe(tensor)}")
    if tensor.dtype not in LOCATION_DTYPES:
        raise ValueError(f"{where}: {name} must have dtype int32 or int64, got {describe(tensor)}")
    if tensor.device != device and tensor.device.type != "cpu":
        raise ValueError(
            f"{where}: {name} must be on the pool's device {device} or on cpu,"
            f" got {describe(tensor)}"
        )
    if tensor.device.type != "meta" and tensor.numel() > 0:
        _check_range(name, tensor, limit, where, limit_reason)
        if distinct:
            _check_distinct(name, tensor, where)
    return tensor.to(device=device, dtype=torch.int64)


def _check_range(name: str, tensor: torch.Tensor, limit: int, where: str, reason: str) -> None:
    # Bulk test first (one reduction); locate the first offender only to word the error.
    bad = (tensor < 0) | (tensor >= limit)
    if bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        value = int(tensor[position])
        suffix = f" ({reason})" if reason else ""
        raise ValueError(f"{where}: {name}[{position}]={value} not in [0, {limit}){suffix}")


def _check_distinct(name: str, tensor: torch.Tensor, where: str) -> None:
    ordered, order = torch.sort(tensor, stable=True)
    repeats = (ordered[1:] == ordered[:-1]).nonzero()
    if repeats.numel() > 0:
        k = int(repeats[0, 0])
        first, second = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(
            f"{where}: {name} has value {int(ordered[k])} at positions {first} and {second};"
            f" {name} must not repeat a slot"
        )


def check_same_length(
    names: tuple[str, str], tensors: tuple[torch.Tensor, torch.Tensor], *, where: str
) -> None:
    """Raise if two validated location tensors differ in length."""
    (a, b), (ta, tb) = names, tensors
    if ta.numel() != tb.numel():
        raise ValueError(
            f"{where}: {a} and {b} must have the same length, got len({a})={ta.numel()}"
            f" and len({b})={tb.numel()}"
        )


def check_payload(
    name: str,
    value: object,
    *,
    shape: Sequence[int],
    dtypes: Sequence[torch.dtype],
    device: torch.device,
    where: str,
) -> torch.Tensor:
    """Validate a data tensor a caller wants written: exact shape, one of ``dtypes``, ``device``.

    Example:
        >>> check_payload("cache_k", torch.zeros(2, 1, 4), shape=(3, 1, 4),
        ...               dtypes=(torch.float32,), device=torch.device("cpu"), where="w")
        Traceback (most recent call last):
        ...
        ValueError: w: cache_k must have shape (3, 1, 4), got shape=(2, 1, 4), ...
    """
    tensor = _require_tensor(name, value, where)
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {describe(tensor)}")
    if tensor.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{where}: {name} must have dtype {allowed}, got {describe(tensor)}")
    if tensor.device != device:
        raise ValueError(
            f"{where}: {name} must be on the pool's device {device}, got {describe(tensor)}"
        )
    return tensor


#: Tensor dtypes a one-element scale may have (each converts exactly to float32).
SCALE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


def check_scale(name: str, value: object, *, device: torch.device, where: str) -> float | None:
    """Validate a dequantization scale (``k_scale``/``v_scale``) and return it as a float.

    ``None`` (no scale), a real number, or a one-element float32/float16/bfloat16 tensor on
    ``device`` or on the CPU; the value must be finite and ``> 0`` (dividing by it must give
    finite values). A meta tensor's value cannot be read; it passes as ``1.0``.

    Example:
        >>> check_scale("k_scale", torch.tensor([0.5]), device=torch.device("cpu"), where="w")
        0.5
        >>> check_scale("v_scale", 0, device=torch.device("cpu"), where="w")
        Traceback (most recent call last):
        ...
        ValueError: w: v_scale=0 must be a finite number > 0
    """
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype not in SCALE_DTYPES:
            raise ValueError(
                f"{where}: {name} must be a number or a one-element float32/float16/bfloat16"
                f" tensor, got {describe(value)}"
            )
        if value.device != device and value.device.type != "cpu":
            raise ValueError(
                f"{where}: {name} must be on the pool's device {device} or on cpu,"
                f" got {describe(value)}"
            )
        if value.device.type == "meta":
            return 1.0
        number = float(value.reshape(()).item())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"{where}: {name}={value!r} must be a number or a one-element tensor")
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{where}: {name}={value!r} must be a finite number > 0")
    return number


def _check_index_tensor(
    name: str, value: object, *, ndim: int, device: torch.device, where: str
) -> torch.Tensor:
    tensor = _require_tensor(name, value, where)
    if tensor.dim() != ndim:
        raise ValueError(f"{where}: {name} must be {ndim}-D, got {describe(tensor)}")
    if tensor.dtype not in LOCATION_DTYPES:
        raise ValueError(f"{where}: {name} must have dtype int32 or int64, got {describe(tensor)}")
    if tensor.device != device and tensor.device.type != "cpu":
        raise ValueError(
            f"{where}: {name} must be on the pool's device {device} or on cpu,"
            f" got {describe(tensor)}"
        )
    return tensor


def check_prefix_grid(
    loc_2d: object,
    commit_lens: object,
    *,
    limit: int,
    device: torch.device,
    where: str,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Validate a prefix-valid write grid and return ``(cells, locs)`` of committed cells.

    ``loc_2d``: 2-D ``[B, W]`` int32/int64; ``commit_lens``: 1-D ``[B]`` int32/int64 with
    values in ``[0, W]``. Row ``b`` commits its first ``commit_lens[b]`` cells. ``cells``
    are the committed cells' row-major positions (``b * W + w``, ascending) and ``locs``
    their locations, both ``int64`` on ``device``. Committed locations must be in
    ``[0, limit)`` and distinct; uncommitted cells are never read, so their values are free.
    Returns ``None`` when a tensor is on ``meta`` (shapes checked, values unreadable).

    Example:
        >>> cells, locs = check_prefix_grid(torch.tensor([[4, 5], [9, -1]]), torch.tensor([2, 1]),
        ...                                 limit=12, device=torch.device("cpu"), where="w")
        >>> cells.tolist(), locs.tolist()
        ([0, 1, 2], [4, 5, 9])
    """
    grid = _check_index_tensor("loc_2d", loc_2d, ndim=2, device=device, where=where)
    lens = _check_index_tensor("commit_lens", commit_lens, ndim=1, device=device, where=where)
    batch, width = grid.shape
    if lens.shape[0] != batch:
        raise ValueError(
            f"{where}: commit_lens must have one entry per row of loc_2d: len(commit_lens)="
            f"{lens.shape[0]} but loc_2d has shape {tuple(grid.shape)}"
        )
    if grid.device.type == "meta" or lens.device.type == "meta":
        return None
    lens = lens.to(grid.device, torch.int64)
    bad = (lens < 0) | (lens > width)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{where}: commit_lens[{b}]={int(lens[b])} not in [0, {width}]"
            f" (width of loc_2d, shape {tuple(grid.shape)})"
        )
    committed = torch.arange(width, device=grid.device)[None, :] < lens[:, None]
    cells = committed.reshape(-1).nonzero().flatten()
    values = grid.reshape(-1).index_select(0, cells).to(torch.int64)

    def cell(k: int) -> str:
        b, w = divmod(int(cells[k]), width)
        return f"loc_2d[{b}, {w}]"

    out_of_range = (values < 0) | (values >= limit)
    if bool(out_of_range.any()):
        k = int(out_of_range.nonzero()[0, 0])
        raise ValueError(f"{where}: committed {cell(k)}={int(values[k])} not in [0, {limit})")
    ordered, order = torch.sort(values, stable=True)
    repeats = (ordered[1:] == ordered[:-1]).nonzero()
    if repeats.numel() > 0:
        k = int(repeats[0, 0])
        first, second = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(
            f"{where}: committed cells {cell(first)} and {cell(second)} both hold slot"
            f" {int(ordered[k])}; committed locations must be distinct"
        )
    return cells.to(device), values.to(device)


def check_page_table(
    seq_len_tensor: object,
    page_indices: object,
    seq_len_sum: object,
    max_seq_len: object,
    *,
    page_size: int,
    num_pages: int,
    device: torch.device,
    where: str,
) -> torch.Tensor | None:
    """Validate a paged read and return the token ids it reads, in output order.

    Sequence ``b`` reads its first ``seq_len_tensor[b]`` tokens; token ``j`` is token id
    ``page_indices[b, j // page_size] * page_size + j % page_size``. ``seq_len_sum`` must
    be ``sum(seq_len_tensor)``, ``max_seq_len >= max(seq_len_tensor)``, every sequence
    needs at most ``page_indices.shape[1]`` pages, and used page ids lie in
    ``[0, num_pages)``. Returns ``None`` when a tensor is on ``meta`` (values unreadable).

    Example:
        >>> check_page_table(torch.tensor([3, 1]), torch.tensor([[5, 2], [0, 9]]), 4, 3,
        ...                  page_size=2, num_pages=6, device=torch.device("cpu"),
        ...                  where="w").tolist()
        [10, 11, 4, 0]
    """
    lens = _check_index_tensor("seq_len_tensor", seq_len_tensor, ndim=1, device=device, where=where)
    table = _check_index_tensor("page_indices", page_indices, ndim=2, device=device, where=where)
    total = require_int("seq_len_sum", seq_len_sum, minimum=0)
    longest = require_int("max_seq_len", max_seq_len, minimum=0)
    batch, width = table.shape
    if lens.shape[0] != batch:
        raise ValueError(
            f"{where}: page_indices must have one row per sequence: len(seq_len_tensor)="
            f"{lens.shape[0]} but page_indices has shape {tuple(table.shape)}"
        )
    if lens.device.type == "meta" or table.device.type == "meta":
        return None
    lens = lens.to(table.device, torch.int64)
    if bool((lens < 0).any()):
        b = int((lens < 0).nonzero()[0, 0])
        raise ValueError(f"{where}: seq_len_tensor[{b}]={int(lens[b])} must be >= 0")
    if int(lens.sum()) != total:
        raise ValueError(
            f"{where}: seq_len_sum={seq_len_sum!r} but sum(seq_len_tensor)={int(lens.sum())}"
        )
    if batch > 0 and int(lens.max()) > longest:
        raise ValueError(
            f"{where}: max_seq_len={max_seq_len!r} but max(seq_len_tensor)={int(lens.max())}"
        )
    pages_needed = (lens + page_size - 1) // page_size
    if bool((pages_needed > width).any()):
        b = int((pages_needed > width).nonzero()[0, 0])
        raise ValueError(
            f"{where}: seq_len_tensor[{b}]={int(lens[b])} needs {int(pages_needed[b])} pages"
            f" of page_size={page_size} but page_indices has {width} columns"
        )
    used = torch.arange(width, device=table.device)[None, :] < pages_needed[:, None]
    pages = table.to(torch.int64)
    bad = used & ((pages < 0) | (pages >= num_pages))
    if bool(bad.any()):
        b, w = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"{where}: page_indices[{b}, {w}]={int(pages[b, w])} not in [0, {num_pages})"
            " (index-K pages)"
        )
    # Built from Python ints: torch's repeat_interleave stalls on a busy CPU's thread pool.
    counts = lens.tolist()
    seq = torch.tensor(
        [b for b, count in enumerate(counts) for _ in range(count)],
        dtype=torch.int64,
        device=table.device,
    )
    starts = torch.cumsum(lens, 0) - lens
    j = torch.arange(total, device=table.device) - starts[seq]
    tokens = pages[seq, j // page_size] * page_size + j % page_size
    return tokens.to(device)
