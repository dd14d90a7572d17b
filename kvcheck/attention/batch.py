"""Plain descriptions of a varlen attention batch and of its page layout in a pool.

They are data (hashable, printable in a Hypothesis failure); tensors are built from
them on demand with an explicit ``dtype`` and ``device``, from a seeded generator, so a
failing example reproduces from its printed form alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvcheck.attention._arguments import AttentionOptions, check_softcap, check_window
from kvcheck.validation import check_bool, check_valid_integer


def _positive(name: str, value: object) -> None:
    check_valid_integer(value, name, min_value=1, error=ValueError)


@dataclass(frozen=True)
class VarlenBatch:
    """Shapes and attention options of one packed batch of sequences.

    ``seq_lens`` are the token counts of the sequences (0 allowed); q has ``num_heads``
    heads, K/V ``num_kv_heads`` (GQA when fewer); V has ``v_head_dim`` channels.
    ``seed`` fixes the tensor values.

    Example:
        >>> batch = VarlenBatch(seq_lens=(1, 3), num_heads=4, num_kv_heads=2, head_dim=8)
        >>> batch.cu_seqlens, batch.max_seqlen, batch.total_tokens
        ((0, 1, 4), 3, 4)
    """

    seq_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int | None = None
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.seq_lens, tuple) or not self.seq_lens:
            raise ValueError(f"seq_lens={self.seq_lens!r} must be a non-empty tuple")
        for i, n in enumerate(self.seq_lens):
            check_valid_integer(n, f"seq_lens[{i}]", min_value=0, error=ValueError)
        for name in ("num_heads", "num_kv_heads", "head_dim"):
            _positive(name, getattr(self, name))
        if self.v_head_dim is not None:
            _positive("v_head_dim", self.v_head_dim)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}"
            )
        check_window(self.window)
        check_bool(self.causal, "causal", error=ValueError)
        check_softcap(self.softcap)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def max_seqlen(self) -> int:
        return max(self.seq_lens)

    @property
    def cu_seqlens(self) -> tuple[int, ...]:
        """Offsets of the sequences in the packed token dimension."""
        return (0, *itertools.accumulate(self.seq_lens))

    @property
    def effective_v_head_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def attention_options(self) -> AttentionOptions:
        """The keyword options every attention entry point takes for this batch."""
        return {"causal": self.causal, "window": self.window, "softcap": self.softcap}

    def cu_seqlens_tensor(self, *, device: torch.device | str) -> torch.Tensor:
        """``cu_seqlens`` as the int32 tensor flash-attn expects."""
        return torch.tensor(self.cu_seqlens, dtype=torch.int32, device=device)

    def attention_args(
        self, *, dtype: torch.dtype, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """``(q, k, v, cu_seqlens, max_seqlen)``: the positional arguments of a varlen call.

        Example:
            >>> batch = VarlenBatch(seq_lens=(1, 3), num_heads=4, num_kv_heads=2, head_dim=8)
            >>> q, k, v, cu, max_seqlen = batch.attention_args(dtype=torch.float32, device="cpu")
            >>> tuple(q.shape), cu.tolist(), max_seqlen
            ((4, 4, 8), [0, 1, 4], 3)
        """
        q, k, v = self.make_qkv(dtype=dtype, device=device)
        return q, k, v, self.cu_seqlens_tensor(device=device), self.max_seqlen

    def make_qkv(
        self, *, dtype: torch.dtype, device: torch.device | str, salt: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Seeded q ``[T, H, d]``, k ``[T, Hkv, d]``, v ``[T, Hkv, dv]``.

        Values are drawn in fp32 on the CPU and then converted, so every device and dtype
        sees the same numbers up to rounding. ``salt`` gives an independent draw (decoy
        data for other layers, padding rows).
        """
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + salt)
        total = self.total_tokens
        shapes = (
            (total, self.num_heads, self.head_dim),
            (total, self.num_kv_heads, self.head_dim),
            (total, self.num_kv_heads, self.effective_v_head_dim),
        )
        q, k, v = (torch.randn(shape, generator=generator) for shape in shapes)
        return (
            q.to(dtype=dtype, device=device),
            k.to(dtype=dtype, device=device),
            v.to(dtype=dtype, device=device),
        )


@dataclass(frozen=True)
class PagedLayout:
    """Where each sequence's tokens live in a paged pool.

    The pool holds ``num_pages`` pages of ``page_size`` slots after SGLang's padding
    page 0, so page ids run ``1..num_pages`` and the pool's ``size`` is
    ``num_pages * page_size``. Sequence ``s``'s token ``t`` is stored at slot
    ``page_tables[s][t // page_size] * page_size + t % page_size``.

    Example:
        >>> layout = PagedLayout(page_size=2, num_pages=3, page_tables=((3, 1), (2,)))
        >>> layout.token_slots((3, 1))
        (6, 7, 2, 4)
    """

    page_size: int
    num_pages: int
    page_tables: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        _positive("page_size", self.page_size)
        _positive("num_pages", self.num_pages)
        used: set[int] = set()
        for s, pages in enumerate(self.page_tables):
            for page in pages:
                if not 1 <= page <= self.num_pages:
                    raise ValueError(
                        f"page_tables[{s}] holds page {page} not in [1, {self.num_pages}]"
                    )
                if page in used:
                    raise ValueError(f"page {page} is given to two sequences (page_tables[{s}])")
                used.add(page)

    @property
    def pool_size(self) -> int:
        """The ``size`` (token capacity) of a pool that holds every page."""
        return self.num_pages * self.page_size

    def check_fits(self, seq_lens: Sequence[int]) -> None:
        """Raise ``ValueError`` unless each sequence has exactly the pages it needs."""
        if len(seq_lens) != len(self.page_tables):
            raise ValueError(
                f"layout has {len(self.page_tables)} page tables for {len(seq_lens)} sequences"
            )
        for s, (n, pages) in enumerate(zip(seq_lens, self.page_tables, strict=True)):
            needed = -(-n // self.page_size)
            if len(pages) != needed:
                raise ValueError(
                    f"page_tables[{s}] has {len(pages)} pages but seq_lens[{s}]={n} needs "
                    f"{needed} at page_size={self.page_size}"
                )

    def token_slots(self, seq_lens: Sequence[int]) -> tuple[int, ...]:
        """Slot of every token, sequences in order (the write locations)."""
        self.check_fits(seq_lens)
        return tuple(
            pages[t // self.page_size] * self.page_size + t % self.page_size
            for n, pages in zip(seq_lens, self.page_tables, strict=True)
            for t in range(n)
        )

    def page_table_tensor(self, *, device: torch.device | str) -> torch.Tensor:
        """``[num_seqs, max_pages]`` int32 block table; unused entries point at page 0."""
        width = max((len(pages) for pages in self.page_tables), default=0)
        rows = [list(pages) + [0] * (width - len(pages)) for pages in self.page_tables]
        return torch.tensor(rows, dtype=torch.int32, device=device).reshape(
            len(self.page_tables), width
        )


def scrambled_layout(
    seq_lens: Sequence[int], *, page_size: int, spare_pages: int = 1
) -> PagedLayout:
    """A layout whose pages are handed out from the top of the pool down.

    Consecutive pages of a sequence are never adjacent slots in the pool and no sequence
    starts at page 1, so a gather that assumes contiguity reads the wrong tokens.
    ``spare_pages`` extra pages stay free at the bottom.

    Example:
        >>> scrambled_layout((3, 1), page_size=2, spare_pages=1).page_tables
        ((4, 3), (2,))
    """
    _positive("page_size", page_size)
    check_valid_integer(spare_pages, "spare_pages", min_value=0, error=ValueError)
    needed = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(needed) + spare_pages
    order = iter(range(num_pages, 0, -1))
    tables = tuple(tuple(next(order) for _ in range(count)) for count in needed)
    return PagedLayout(page_size=page_size, num_pages=max(num_pages, 1), page_tables=tables)
