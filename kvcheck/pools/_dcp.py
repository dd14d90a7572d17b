"""Decode context parallel (DCP): which widened token ids one rank's latent rows hold.

Under SGLang's ``--dcp-size D`` every rank ``r`` keeps its own latent buffers of
``size + page_size`` rows, and callers name tokens by *widened* id ``w`` in ``[0, (size +
page_size) * D)``. Rank ``r`` owns ``w`` when ``w % D == r`` and keeps its latent row at
physical row ``w // D``; the other ranks' ids are not its business (SGLang's write kernel
drops them). ``D == 1`` is the plain pool: every id is owned and is its own row.

Host copies follow SGLang's ``maybe_dcp_kernel_indices``: a run of ids *starts
page-aligned*, so position ``j`` holds an id with ``id % D == j % D`` and rank ``r``'s ids
are the positions ``r, r + D, ...``. :func:`check_run` refuses a run that breaks this
(SGLang silently copies the wrong rows).

Example:
    >>> import torch
    >>> run = torch.tensor([8, 9, 10, 11, 12])
    >>> check_run("indices", run, dcp_size=2, where="get_cpu_copy")
    >>> run_rows(run, dcp_size=2, dcp_rank=1).tolist(), run_count(5, dcp_size=2, dcp_rank=1)
    ([4, 5], 2)
    >>> owned_pairs(torch.tensor([3, 4]), torch.tensor([5, 6]), dcp_size=2, dcp_rank=1)
    (tensor([1]), tensor([2]))
"""

from __future__ import annotations

import torch

from kvcheck.pools._refusals import require_int


def check_dcp_args(
    size: int, page_size: int, dcp_size: object, dcp_rank: object
) -> tuple[int, int]:
    """Validated ``(dcp_size, dcp_rank)`` of a pool of ``size`` and ``page_size`` (both
    already validated): ``dcp_size`` an int ``>= 1``, ``dcp_rank`` in ``[0, dcp_size)``
    and, with ``dcp_size > 1``, ``size`` a multiple of ``page_size``.

    Example:
        >>> check_dcp_args(8, 4, 2, 2)
        Traceback (most recent call last):
        ...
        ValueError: dcp_rank=2 must be an integer in [0, dcp_size=2)
    """
    ranks = require_int("dcp_size", dcp_size, minimum=1)
    try:
        rank = require_int("dcp_rank", dcp_rank, minimum=0)
    except ValueError:
        rank = -1
    if not 0 <= rank < ranks:
        raise ValueError(f"dcp_rank={dcp_rank!r} must be an integer in [0, dcp_size={ranks})")
    if ranks > 1 and size % page_size:
        raise ValueError(
            f"size={size} must be a multiple of page_size={page_size} with dcp_size={ranks}"
            " (the allocator hands out widened pages of page_size * dcp_size ids)"
        )
    return ranks, rank


def bound_reason(size: int, page_size: int, dcp_size: int) -> str:
    """What an out-of-range message appends for the widened id bound (``""`` without DCP,
    so plain pools word their errors as before)."""
    if dcp_size == 1:
        return ""
    return f"widened token ids: (size + page_size) * dcp_size = ({size} + {page_size}) * {dcp_size}"


def owned_pairs(
    tgt: torch.Tensor, src: torch.Tensor, *, dcp_size: int, dcp_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The physical rows ``(tgt // D, src // D)`` of a move's pairs that this rank owns
    (pairs already checked by :func:`check_same_owner`, so ``tgt`` decides)."""
    if dcp_size == 1:
        return tgt, src
    owned = tgt % dcp_size == dcp_rank
    return tgt[owned] // dcp_size, src[owned] // dcp_size


def owned_mask(loc: torch.Tensor, *, dcp_size: int, dcp_rank: int) -> torch.Tensor:
    """``loc % dcp_size == dcp_rank``: which widened ids this rank owns.

    Example:
        >>> owned_mask(torch.tensor([2, 3, 5]), dcp_size=2, dcp_rank=1).tolist()
        [False, True, True]
    """
    return loc % dcp_size == dcp_rank


def check_same_owner(tgt: torch.Tensor, src: torch.Tensor, *, dcp_size: int, where: str) -> None:
    """Raise ``ValueError`` unless every ``(tgt[i], src[i])`` has one owner rank (a rank
    cannot fetch another rank's latent row). Meta tensors pass (no values to read).

    Example:
        >>> check_same_owner(torch.tensor([4, 5]), torch.tensor([6, 8]), dcp_size=2,
        ...                  where="move_kv_cache")
        Traceback (most recent call last):
        ...
        ValueError: move_kv_cache: tgt_loc[1]=5 and src_loc[1]=8 have different owners ...
    """
    if dcp_size == 1 or tgt.device.type == "meta" or tgt.numel() == 0:
        return
    bad = (tgt % dcp_size) != (src % dcp_size)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        t, s = int(tgt[i]), int(src[i])
        raise ValueError(
            f"{where}: tgt_loc[{i}]={t} and src_loc[{i}]={s} have different owners under"
            f" dcp_size={dcp_size} ({t} % {dcp_size} = {t % dcp_size}, {s} % {dcp_size} ="
            f" {s % dcp_size}); a rank cannot fetch another rank's latent row"
        )


def check_run(name: str, idx: torch.Tensor, *, dcp_size: int, where: str) -> None:
    """Raise ``ValueError`` unless ``idx[j] % dcp_size == j % dcp_size`` for every ``j``
    (SGLang's precondition: the run starts page-aligned). Meta tensors pass.

    Example:
        >>> check_run("indices", torch.tensor([4, 6]), dcp_size=2, where="get_cpu_copy")
        Traceback (most recent call last):
        ...
        ValueError: get_cpu_copy: indices[1]=6 but dcp_size=2 needs indices[j] % 2 == j % 2 ...
    """
    if dcp_size == 1 or idx.device.type == "meta" or idx.numel() == 0:
        return
    positions = torch.arange(idx.numel(), device=idx.device)
    bad = (idx % dcp_size) != (positions % dcp_size)
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{where}: {name}[{j}]={int(idx[j])} but dcp_size={dcp_size} needs"
            f" {name}[j] % {dcp_size} == j % {dcp_size} for every position j (a run of"
            " widened ids starts page-aligned, as SGLang's maybe_dcp_kernel_indices assumes)"
        )


def run_rows(idx: torch.Tensor, *, dcp_size: int, dcp_rank: int) -> torch.Tensor:
    """This rank's physical rows of a run checked by :func:`check_run`: ``idx[r::D] //
    D``, SGLang's ``maybe_dcp_kernel_indices`` (on ``meta`` only the shape is kept)."""
    if dcp_size == 1:
        return idx
    owned = idx[dcp_rank::dcp_size]
    # Meta tensors hold no values, and torch's meta floor division imports its refs.
    return owned if owned.device.type == "meta" else owned // dcp_size


def run_count(num_tokens: int, *, dcp_size: int, dcp_rank: int) -> int:
    """How many of a run's ``num_tokens`` positions this rank owns (positions ``r, r +
    D, ...``): the latent rows of its host copy.

    Example:
        >>> [run_count(n, dcp_size=4, dcp_rank=2) for n in range(8)]
        [0, 0, 0, 1, 1, 1, 1, 2]
    """
    return len(range(dcp_rank, num_tokens, dcp_size))
