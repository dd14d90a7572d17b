"""Attention through the target's paged pool equals attention on raw K/V.

This is the premise that lets ``--prefill-only-disable-kv-cache`` give embedding
prefill the no-op pool: the FA backend then attends over the forward's raw K/V
instead of writing them to the cache and reading them back by page. Both properties
draw small varlen batches (GQA, sliding windows, softcap, causal or not) and page
layouts whose pages are scattered and out of order (:mod:`kvcheck.strategies.attention`),
a ``start_layer`` and a dtype, and compare outputs exactly for fp32 on the CPU and within
``kvcheck.attention.tolerances`` otherwise:

- through an MHA pool from ``target.make_pool``, written with ``set_kv_buffer`` and read
  back only through ``get_key_buffer``/``get_value_buffer`` and ``get_kv_buffer``, with
  decoy K/V in the layers on either side
  (:func:`~kvcheck.properties.attention.check_paged_matches_raw`);
- through the serving configuration: ``target.select_pool_family`` must give a worker the
  no-op pool under the flag (and the MHA pool without it), the no-op pool from
  ``target.make_pool`` must refuse the write, and the raw-K/V outputs must equal the full
  pool's (:func:`~kvcheck.properties.attention.check_noop_pool_matches_full_pool`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.attention.batch import PagedLayout, VarlenBatch
from kvcheck.properties.attention import (
    check_noop_pool_matches_full_pool,
    check_paged_matches_raw,
    target_pool_factory,
)
from kvcheck.strategies import page_layouts, varlen_batches

#: dtypes drawn; fp32 first, so examples shrink to the exact comparison.
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
#: Global id of the pool's first layer: 0, or later as under pipeline parallelism.
MAX_START_LAYER = 3

#: A few tokens and heads keep one example to milliseconds; V may be wider or narrower
#: than K, as pools take their own ``v_head_dim``.
BATCHES = varlen_batches(
    max_num_seqs=3,
    max_seq_len=8,
    max_kv_heads=2,
    max_group_size=2,
    head_dims=(8, 16),
    v_head_dims=(8, 16, 4),
)


@dataclass(frozen=True)
class PagedCase:
    """One example: a batch, where its pages lie, the pool's first layer and the dtype."""

    batch: VarlenBatch
    layout: PagedLayout
    start_layer: int
    dtype: str

    def check(self, check_fn: Callable[..., None], device: str, **pools: Any) -> None:
        """``check_fn`` (a check of :mod:`kvcheck.properties.attention`) on this case."""
        where = {"dtype": getattr(torch, self.dtype), "device": device, **pools}
        check_fn(self.batch, self.layout, start_layer=self.start_layer, **where)


@st.composite
def paged_cases(draw: st.DrawFn) -> PagedCase:
    """Batches with their page layouts; shrinks towards one short fp32 sequence at layer 0."""
    batch = draw(BATCHES, label="batch")
    layout = draw(page_layouts(batch.seq_lens, page_sizes=(1, 2, 4, 16)), label="page layout")
    start_layer = draw(st.integers(0, MAX_START_LAYER), label="start_layer")
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    return PagedCase(batch=batch, layout=layout, start_layer=start_layer, dtype=dtype)


PAGED_CASES = paged_cases()


@pytest.fixture(autouse=True, scope="module")
def _single_intra_op_thread() -> Iterator[None]:
    """Run this module's tiny CPU attention on one intra-op thread, then restore the count.

    Why: each op touches a few hundred numbers, so a thread pool only adds hand-off cost;
    on a busy 2-core machine that made an example 15x slower (0.4 s instead of 0.03 s).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def check_paged_case(target: Any, device: str, case: PagedCase) -> None:
    """:func:`check_paged_matches_raw` on ``case`` with pools from ``target.make_pool``."""
    case.check(
        check_paged_matches_raw, device, make_pool=target_pool_factory(target, device=device)
    )


def check_noop_case(target: Any, device: str, case: PagedCase) -> None:
    """:func:`check_noop_pool_matches_full_pool` on ``case`` through ``target``."""
    case.check(check_noop_pool_matches_full_pool, device, target=target)


@pytest.mark.kvcheck_needs("mha_pool")
@given(case=PAGED_CASES)
def test_paged_attention_matches_raw_kv(
    kvcheck_target: Any, kvcheck_device: str, case: PagedCase
) -> None:
    """K/V written to the target's MHA pool and read back by page attend like the raw K/V."""
    check_paged_case(kvcheck_target, kvcheck_device, case)


@pytest.mark.kvcheck_needs("mha_pool", "noop_pool", "pool_selection")
@given(case=PAGED_CASES)
def test_noop_pool_matches_full_pool(
    kvcheck_target: Any, kvcheck_device: str, case: PagedCase
) -> None:
    """Under the flag the target picks the no-op pool, which refuses writes; raw K/V
    attention then equals attention through the target's full pool."""
    check_noop_case(kvcheck_target, kvcheck_device, case)
