"""Reusable properties: the checks behind kvcheck's suite, for downstream suites too.

Each property is a function that raises
:class:`~kvcheck.failures.PropertyFailure` (an ``AssertionError``) with a
``got … but should be … [call]`` message when it does not hold. They take a target or a
pool plus the input to check, so a downstream project calls them from its own Hypothesis
tests with kvcheck's strategies.

Pool side:

- :mod:`~kvcheck.properties.apply`: operations applied through a target, checked against the
  reference (the calls themselves are :mod:`kvcheck.calls`);
- :mod:`~kvcheck.properties.pool_state`: a pool's bytes against the reference model, raw
  and through the read API, and its layer range;
- :mod:`~kvcheck.properties.caller_tensors`: no call changes a tensor it was given;
- :mod:`~kvcheck.properties.skip_layers`: skip layers hold zero bytes (storage, CUDA
  allocator, meta at production scale);
- :mod:`~kvcheck.properties.noop`: the no-op pool raises on writes, holds placeholders only;
- :mod:`~kvcheck.properties.accounting`: reported bytes agree with bytes held;
- :mod:`~kvcheck.properties.attention`: attention read back through a pool equals attention on
  raw K/V (the premise of the no-op pool);
- :mod:`~kvcheck.properties.inputs`: callers' tensors untouched, rejected calls change nothing;
- :mod:`kvcheck.machines`: differential state machines built from all of the above.

Serving side: :mod:`~kvcheck.properties.serving` (validation, pool selection, skip rule,
configurator), re-exported here.

Example::

    from hypothesis import given
    from kvcheck.properties import assert_accounting
    from kvcheck.strategies import pool_specs

    @given(spec=pool_specs())
    def test_accounting(kvcheck_target, kvcheck_device, spec):
        assert_accounting(kvcheck_target.make_pool(spec, device=kvcheck_device), spec)
"""

from __future__ import annotations

from kvcheck.failures import FailureSignature, PropertyFailure
from kvcheck.properties import serving as _serving
from kvcheck.properties.accounting import (
    assert_accounting,
    assert_contiguous_buf_infos,
    assert_held_bytes,
    assert_kv_size_bytes,
    assert_mem_usage,
    assert_state_buf_infos,
    reported_total_bytes,
)
from kvcheck.properties.apply import apply_op, apply_op_like_reference
from kvcheck.properties.inputs import (
    assert_rejected_call_changes_nothing,
    assert_tensors_unchanged,
    check_sequence_inputs,
    run_checked_call,
)
from kvcheck.properties.noop import (
    assert_noop_holds_only_placeholders,
    assert_noop_move_changes_nothing,
    assert_noop_write_raises,
)
from kvcheck.properties.pool_state import (
    assert_layer_range,
    assert_pool_matches_reference,
    assert_read_api_matches_reference,
    assert_same_pool_bytes,
    read_pool_buffers,
)
from kvcheck.properties.serving import *  # noqa: F403  (its __all__ is re-exported below)
from kvcheck.properties.skip_layers import (
    assert_cuda_allocation_matches,
    assert_meta_pool_bytes,
    assert_skip_layers_hold_no_storage,
)

__all__ = [
    "FailureSignature",
    "PropertyFailure",
    "apply_op",
    "apply_op_like_reference",
    "assert_accounting",
    "assert_contiguous_buf_infos",
    "assert_cuda_allocation_matches",
    "assert_held_bytes",
    "assert_kv_size_bytes",
    "assert_mem_usage",
    "assert_meta_pool_bytes",
    "assert_noop_holds_only_placeholders",
    "assert_noop_move_changes_nothing",
    "assert_noop_write_raises",
    "assert_layer_range",
    "assert_pool_matches_reference",
    "assert_read_api_matches_reference",
    "assert_rejected_call_changes_nothing",
    "assert_same_pool_bytes",
    "assert_skip_layers_hold_no_storage",
    "assert_state_buf_infos",
    "assert_tensors_unchanged",
    "check_sequence_inputs",
    "read_pool_buffers",
    "reported_total_bytes",
    "run_checked_call",
    *_serving.__all__,
]
