"""Public Hypothesis strategies for KV-cache pools, the calls on them and the serving around them.

Downstream suites import these to drive their own pools with kvcheck's vocabulary
(:mod:`kvcheck.specs`). Every strategy takes keyword-only arguments (the "what" it draws
for, where there is one, is positional), validates them when it is called (raising
:class:`hypothesis.errors.InvalidArgument` with ``name=value`` messages, through
:mod:`kvcheck.validation`), and documents what its examples shrink towards. ``__all__``
is the registry: kvcheck's own tests walk it.

One module per idea:

- :mod:`~kvcheck.strategies.pools`: dtypes, page sizes, skip masks, pool specs (inside a
  target's limits with ``target=``), token slots;
- :mod:`~kvcheck.strategies.limits`: a target's ``pool_spec_limits`` and drawing inside them;
- :mod:`~kvcheck.strategies.ops`: single pool operations, the one operation generator
  (the state machines draw from it too); :mod:`~kvcheck.strategies.sequences` composes
  them into :func:`op_sequences`;
- :mod:`~kvcheck.strategies.malformed_calls`: pool calls as tensors (malformed calls,
  no-op pool calls);
- :mod:`~kvcheck.strategies.serving`: model configs and ``ServerArgs`` flag sets;
- :mod:`~kvcheck.strategies.attention`: varlen attention batches and page layouts.

Example:
    >>> from hypothesis import find
    >>> from kvcheck.strategies import op_sequences, pool_specs
    >>> sequence = find(op_sequences(pool_specs(families=("dsa",)), max_ops=6),
    ...                 lambda sequence: len(sequence.ops) == 3)
    >>> sequence.spec.family, len(sequence.ops)
    ('dsa', 3)
"""

from __future__ import annotations

from kvcheck.strategies.attention import page_layouts, query_lengths, varlen_batches
from kvcheck.strategies.malformed_calls import bad_calls, noop_move_arguments, noop_write_calls
from kvcheck.strategies.pools import (
    dtypes,
    layer_masks,
    page_sizes,
    pool_specs,
    swa_pool_specs,
    token_locations,
)
from kvcheck.strategies.sequences import op_sequences
from kvcheck.strategies.serving import model_configs, server_flags

__all__ = [
    "bad_calls",
    "dtypes",
    "layer_masks",
    "model_configs",
    "noop_move_arguments",
    "noop_write_calls",
    "op_sequences",
    "page_layouts",
    "page_sizes",
    "pool_specs",
    "query_lengths",
    "server_flags",
    "swa_pool_specs",
    "token_locations",
    "varlen_batches",
]
