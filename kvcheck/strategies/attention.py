"""Hypothesis strategies for varlen attention batches and their page layouts.

Every strategy takes keyword-only arguments (the "what" argument, where there is one,
is positional), validates them first with :mod:`kvcheck.validation` (``InvalidArgument``
naming the bad value), and says in its docstring what its examples shrink towards. The
batches and layouts are :mod:`kvcheck.attention`'s values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvcheck.attention.batch import PagedLayout, VarlenBatch
from kvcheck.validation import (
    check_bool,
    check_int_sequence,
    check_valid_integer,
    check_valid_interval,
)

__all__ = ["page_layouts", "query_lengths", "varlen_batches"]

#: softcap values drawn when softcaps are enabled (Gemma 2 uses 50, Grok 30).
SOFTCAP_VALUES: tuple[float, ...] = (1.0, 5.0, 30.0, 50.0)


def varlen_batches(
    *,
    min_num_seqs: int = 1,
    max_num_seqs: int = 4,
    min_seq_len: int = 1,
    max_seq_len: int = 16,
    max_kv_heads: int = 2,
    max_group_size: int = 4,
    head_dims: Sequence[int] = (8, 16),
    v_head_dims: Sequence[int] | None = None,
    causal: bool | None = None,
    windows: bool = True,
    softcaps: bool = True,
) -> st.SearchStrategy[VarlenBatch]:
    """Packed batches of sequences with the options ``flash_attn_varlen_func`` takes.

    Draws ``min_num_seqs..max_num_seqs`` sequences of ``min_seq_len..max_seq_len``
    tokens; ``1..max_kv_heads`` KV heads and ``1..max_group_size`` query heads per KV
    head (GQA; 1 is plain MHA); a head dim from ``head_dims``; a V head dim from
    ``v_head_dims`` (``None``: V uses the head dim, as flash-attn 2 requires);
    causal or bidirectional (``causal=None`` draws both); sliding windows with each side
    -1 (unbounded) or ``0..max_seq_len`` when ``windows``; a softcap from
    ``SOFTCAP_VALUES`` when ``softcaps``; and a seed for the tensor values.

    Shrinks towards one sequence of ``min_seq_len`` tokens, one KV head, no GQA, the
    first head dim, bidirectional (when drawn), no window, no softcap, seed 0.

    Example (the minimal batch):
        >>> from hypothesis import find
        >>> batch = find(varlen_batches(min_seq_len=2, head_dims=(32, 64)), lambda b: True)
        >>> batch.seq_lens, batch.num_heads, batch.head_dim, batch.causal, batch.window
        ((2,), 1, 32, False, (-1, -1))
    """
    check_valid_integer(min_num_seqs, "min_num_seqs", min_value=1)
    check_valid_integer(max_num_seqs, "max_num_seqs", min_value=1)
    check_valid_interval(min_num_seqs, max_num_seqs, "min_num_seqs", "max_num_seqs")
    check_valid_integer(min_seq_len, "min_seq_len", min_value=0)
    check_valid_integer(max_seq_len, "max_seq_len", min_value=1)
    check_valid_interval(min_seq_len, max_seq_len, "min_seq_len", "max_seq_len")
    check_valid_integer(max_kv_heads, "max_kv_heads", min_value=1)
    check_valid_integer(max_group_size, "max_group_size", min_value=1)
    dims = check_int_sequence(head_dims, "head_dims", min_value=1)
    v_dims = (
        None if v_head_dims is None else check_int_sequence(v_head_dims, "v_head_dims", min_value=1)
    )
    if causal is not None:
        check_bool(causal, "causal")
    check_bool(windows, "windows")
    check_bool(softcaps, "softcaps")

    window_sides = st.just(-1)
    if windows:
        window_sides = st.one_of(st.just(-1), st.integers(0, max_seq_len))
    return st.builds(
        _batch,
        seq_lens=st.lists(
            st.integers(min_seq_len, max_seq_len), min_size=min_num_seqs, max_size=max_num_seqs
        ),
        num_kv_heads=st.integers(1, max_kv_heads),
        group_size=st.integers(1, max_group_size),
        head_dim=st.sampled_from(dims),
        v_head_dim=st.none() if v_dims is None else st.sampled_from(v_dims),
        causal=st.booleans() if causal is None else st.just(causal),
        window=st.tuples(window_sides, window_sides),
        softcap=st.sampled_from((0.0, *SOFTCAP_VALUES)) if softcaps else st.just(0.0),
        seed=st.integers(0, 2**32 - 1),
    )


def _batch(*, seq_lens: list[int], group_size: int, **fields: Any) -> VarlenBatch:
    num_heads = fields["num_kv_heads"] * group_size
    return VarlenBatch(seq_lens=tuple(seq_lens), num_heads=num_heads, **fields)


def page_layouts(
    seq_lens: Sequence[int],
    *,
    page_sizes: Sequence[int] = (1, 2, 4, 16),
    max_spare_pages: int = 3,
) -> st.SearchStrategy[PagedLayout]:
    """Page layouts in a pool for sequences of ``seq_lens`` tokens.

    Draws a page size from ``page_sizes``, ``0..max_spare_pages`` pages no sequence uses,
    and a permutation of all pages ``1..num_pages``, handed to the sequences in order, so
    a sequence's pages are generally scattered and out of order in the pool.

    Shrinks towards the first page size, no spare pages and pages handed out in
    ascending order (each sequence contiguous).

    Example (the minimal layout, and one with pages out of order):
        >>> from hypothesis import find
        >>> find(page_layouts((3, 1), page_sizes=(2,)), lambda layout: True).page_tables
        ((1, 2), (3,))
        >>> find(page_layouts((3, 1), page_sizes=(2,)),
        ...      lambda layout: layout.page_tables[0][0] > 1).page_tables
        ((2, 1), (3,))
    """
    lens = check_int_sequence(seq_lens, "seq_lens", min_value=0)
    sizes = check_int_sequence(page_sizes, "page_sizes", min_value=1)
    check_valid_integer(max_spare_pages, "max_spare_pages", min_value=0)
    return _layouts(lens, sizes, max_spare_pages)


@st.composite
def _layouts(
    draw: st.DrawFn, seq_lens: tuple[int, ...], page_sizes: tuple[int, ...], max_spare_pages: int
) -> PagedLayout:
    page_size = draw(st.sampled_from(page_sizes), label="page size")
    needed = [math.ceil(n / page_size) for n in seq_lens]
    spare = draw(st.integers(0, max_spare_pages), label="spare pages")
    num_pages = max(sum(needed) + spare, 1)
    order = iter(draw(st.permutations(range(1, num_pages + 1)), label="page order"))
    tables = tuple(tuple(next(order) for _ in range(count)) for count in needed)
    return PagedLayout(page_size=page_size, num_pages=num_pages, page_tables=tables)


def query_lengths(seq_lens: Sequence[int]) -> st.SearchStrategy[tuple[int, ...]]:
    """For each sequence, how many of its last tokens are queries (1..its length).

    Used to check the bottom-right alignment of the causal mask: the last ``m`` queries
    against all ``n`` keys must equal the last ``m`` rows of full self-attention. Empty
    sequences get 0.

    Shrinks towards one query per sequence.

    Example:
        >>> from hypothesis import find
        >>> find(query_lengths((3, 1)), lambda lens: True)
        (1, 1)
    """
    lens = check_int_sequence(seq_lens, "seq_lens", min_value=0)
    return st.tuples(*(st.integers(min(1, n), n) for n in lens))
