"""The attention strategies validate their arguments, document themselves and respect bounds."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvcheck.strategies import attention as attention_strategies
from kvcheck.strategies.attention import page_layouts, query_lengths, varlen_batches

#: strategies whose first argument is the "what" they describe (positional)
POSITIONAL_WHAT = {"page_layouts": "seq_lens", "query_lengths": "seq_lens"}


@pytest.mark.parametrize("name", attention_strategies.__all__)
def test_each_strategy_is_documented_and_keyword_only(name):
    """Every exported strategy has an example and a shrink note, and keyword-only options."""
    strategy = getattr(attention_strategies, name)
    doc = inspect.getdoc(strategy) or ""
    assert "Example" in doc and "Shrinks towards" in doc
    for parameter in inspect.signature(strategy).parameters.values():
        if parameter.name == POSITIONAL_WHAT.get(name):
            assert parameter.kind is parameter.POSITIONAL_OR_KEYWORD
        else:
            assert parameter.kind is parameter.KEYWORD_ONLY, parameter.name


BAD_ARGUMENTS = {
    "seqs-reversed": (
        varlen_batches,
        {"min_num_seqs": 3, "max_num_seqs": 2},
        r"max_num_seqs=2 < min_num_seqs=3",
    ),
    "no-seqs": (varlen_batches, {"min_num_seqs": 0}, r"min_num_seqs=0 must be >= 1"),
    "lens-reversed": (
        varlen_batches,
        {"min_seq_len": 5, "max_seq_len": 4},
        r"max_seq_len=4 < min_seq_len=5",
    ),
    "negative-len": (varlen_batches, {"min_seq_len": -1}, r"min_seq_len=-1 must be >= 0"),
    "kv-heads-zero": (varlen_batches, {"max_kv_heads": 0}, r"max_kv_heads=0 must be >= 1"),
    "group-float": (varlen_batches, {"max_group_size": 2.0}, r"max_group_size=2\.0 must be an int"),
    "head-dims-empty": (varlen_batches, {"head_dims": ()}, r"head_dims=\(\) must be a non-empty"),
    "head-dim-zero": (varlen_batches, {"head_dims": (8, 0)}, r"head_dims entry=0 must be >= 1"),
    "v-head-dims-str": (varlen_batches, {"v_head_dims": "8"}, r"v_head_dims='8' must be"),
    "causal-str": (varlen_batches, {"causal": "yes"}, r"causal='yes' must be a bool"),
    "windows-int": (varlen_batches, {"windows": 1}, r"windows=1 must be a bool"),
    "layout-no-seqs": (page_layouts, {"seq_lens": ()}, r"seq_lens=\(\) must be a non-empty"),
    "layout-page-zero": (
        page_layouts,
        {"seq_lens": (3,), "page_sizes": (0,)},
        r"page_sizes entry=0 must be >= 1",
    ),
    "layout-spare-negative": (
        page_layouts,
        {"seq_lens": (3,), "max_spare_pages": -1},
        r"max_spare_pages=-1 must be >= 0",
    ),
    "query-lens-negative": (query_lengths, {"seq_lens": (2, -1)}, r"seq_lens entry=-1"),
}


@pytest.mark.parametrize(
    ("strategy", "kwargs", "message"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS
)
def test_bad_arguments_raise_invalid_argument(strategy, kwargs, message):
    """Bad strategy arguments raise InvalidArgument naming the argument, at call time."""
    with pytest.raises(InvalidArgument, match=message):
        strategy(**kwargs)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_batches_respect_their_bounds(data):
    """Drawn batches stay within the requested counts, lengths, heads and dims."""
    batch = data.draw(
        varlen_batches(
            min_num_seqs=2,
            max_num_seqs=3,
            min_seq_len=1,
            max_seq_len=5,
            max_kv_heads=2,
            max_group_size=3,
            head_dims=(8, 32),
            v_head_dims=(4,),
            causal=True,
            windows=False,
            softcaps=False,
        ),
        label="batch",
    )
    assert 2 <= len(batch.seq_lens) <= 3 and all(1 <= n <= 5 for n in batch.seq_lens)
    assert batch.num_kv_heads <= 2 and batch.num_heads // batch.num_kv_heads <= 3
    assert batch.head_dim in (8, 32) and batch.v_head_dim == 4
    assert batch.causal and batch.window == (-1, -1) and batch.softcap == 0.0


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_layouts_give_each_sequence_its_own_pages(data):
    """Every sequence gets exactly the pages it needs, no page twice, all inside the pool."""
    seq_lens = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=4), label="lengths")
    layout = data.draw(page_layouts(seq_lens, page_sizes=(1, 3), max_spare_pages=2))
    layout.check_fits(seq_lens)
    pages = [p for table in layout.page_tables for p in table]
    assert len(set(pages)) == len(pages) and all(1 <= p <= layout.num_pages for p in pages)
    slots = layout.token_slots(seq_lens)
    assert len(set(slots)) == len(slots) == sum(seq_lens)


def test_batches_shrink_to_one_short_plain_sequence():
    """The minimal batch is one min-length sequence, MHA, first head dim, no window/softcap."""
    from hypothesis import Phase, find

    batch = find(
        varlen_batches(min_seq_len=1, head_dims=(16, 8)),
        lambda _: True,
        settings=settings(derandomize=True, phases=[Phase.generate, Phase.shrink]),
    )
    assert (batch.seq_lens, batch.num_heads, batch.num_kv_heads, batch.head_dim) == (
        (1,),
        1,
        1,
        16,
    )
    assert (batch.causal, batch.window, batch.softcap, batch.seed) == (False, (-1, -1), 0.0, 0)
