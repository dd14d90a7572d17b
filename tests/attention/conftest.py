"""Shared settings for the attention tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_intra_op_thread():
    """Run these tiny-tensor tests on one intra-op thread, restoring the count afterwards.

    Why: each op here touches a few hundred numbers, so a thread pool only adds
    hand-off cost, and on a shared CI machine that cost is milliseconds per op.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
