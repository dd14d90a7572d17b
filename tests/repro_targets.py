"""Module-level targets serving the broken pools, for reproduction scripts to import.

A reproduction rendered for ``repro_targets:MOVE_IGNORES_V`` imports this module (with
``tests/`` on ``PYTHONPATH``) and builds its pool through the target, as a user's
``module:attr`` target would be used.
"""

from __future__ import annotations

from typing import Any

from broken_pools import (
    BrokenTarget,
    FullSizeNoOp,
    HalfApplyingMHA,
    HostCopyDropsIndexK,
    LocSortingMHA,
    MoveIgnoresV,
    PageRowMoveDSA,
    SequentialMoveMLA,
    SilentNoOp,
    ValidatingMoveNoOp,
)

MOVE_IGNORES_V = BrokenTarget("mha", MoveIgnoresV)
SEQUENTIAL_MOVE_MLA = BrokenTarget("mla", SequentialMoveMLA)
PAGE_ROW_MOVE_DSA = BrokenTarget("dsa", PageRowMoveDSA)
HOST_COPY_DROPS_INDEX_K = BrokenTarget("dsa", HostCopyDropsIndexK)
SILENT_NOOP = BrokenTarget("noop", SilentNoOp)
LOC_SORTING_MHA = BrokenTarget("mha", LocSortingMHA)
HALF_APPLYING_MHA = BrokenTarget("mha", HalfApplyingMHA)
VALIDATING_MOVE_NOOP = BrokenTarget("noop", ValidatingMoveNoOp)
FULL_SIZE_NOOP = BrokenTarget("noop", FullSizeNoOp)


def broken_factory() -> BrokenTarget:
    """A zero-argument factory, as ``module:attr`` may name instead of an instance."""
    return BrokenTarget("mha", MoveIgnoresV)


class _UnbuildableTarget(BrokenTarget):
    """A target whose make_pool raises, as one missing a dependency on this machine would."""

    def make_pool(self, spec: Any, *, device: str) -> Any:
        raise RuntimeError("this pool needs a GPU")


UNBUILDABLE = _UnbuildableTarget("mha", MoveIgnoresV)
