"""The order the shipped suite runs in: its cheapest properties first, so a bug reports fast.

The time to a report under ``pytest -x`` (and to the first failure ``kvcheck verify`` prints)
is the time of every passing test before the failing one. pytest runs the suite's modules
alphabetically, which put the serving properties, which take a few seconds together and
catch most serving bugs, behind a minute of state machines and input checks. This plugin
(loaded by :mod:`kvcheck.runner.plugin`) sorts the suite's tests along :data:`REPORT_ORDER`,
by module or, where an entry names one, by test function: serving properties, skip layers,
accounting, the no-op pool, the four family state machines, allocators and host pools, the
other machine runs (variants), the input checks, attention. Tests keep their order within an
entry, and tests that are not the suite's keep their places: a project's own tests are not
moved. It runs early (``tryfirst``), so pytest's own ``--ff`` and ``--nf``, which reorder
after every other plugin, still have the last word.

Example:
    >>> report_rank("kvcheck.suite.test_serving_validation") < report_rank(
    ...     "kvcheck.suite.test_pool_machines")
    True
    >>> report_rank("kvcheck.suite.test_pool_machines", "test_pool_matches_reference_after_"
    ...             "every_step") < report_rank("kvcheck.suite.test_allocators")
    True
    >>> report_rank("my_project.test_pools") is None
    True
"""

from __future__ import annotations

import pytest

__all__ = ["REPORT_ORDER", "SUITE_PACKAGE", "report_rank"]

SUITE_PACKAGE = "kvcheck.suite"

#: The suite's modules, cheapest first (single process on CPU, kvcheck-ci profile,
#: 2026-12-02: serving modules 0.5-2 s each, skip layers 2 s, accounting 6 s, no-op 8 s,
#: machines 26 s, inputs 24 s, attention 8 s; 2026-12-03, on a loaded machine: allocators
#: 12 s, host pools 14 s, lifecycle 9 s). The machines come before the input checks and
#: attention because they catch most pool bugs; the lifecycle machine, which runs the
#: allocator, the pool and the host tier together, right after them. The four family
#: machines (``module::function``), which catch a bug in a user's own MHA, MLA or DSA pool,
#: come before the tiers (2026-12-07, loaded: allocators and host pools 41-53 s, the four
#: machines 25-42 s). The census (2026-12-07, loaded: 46 s serial, 12 s of CPU) follows
#: the tiers: it catches a whole-pool operation that misses a tensor, on every variant.
#: The hybrid machines, the scheduler's memory law and the tiers' guards (2026-12-07:
#: 1-10 s each) come after the lifecycle machine. A module not listed runs last.
REPORT_ORDER: tuple[str, ...] = (
    "test_serving_validation",
    "test_serving_selection",
    "test_serving_skip_rule",
    "test_serving_configurator",
    "test_skip_layers",
    "test_accounting",
    "test_noop",
    "test_pool_machines::test_pool_matches_reference_after_every_step",
    "test_allocators",
    "test_host_pools",
    "test_census",
    "test_pool_machines",
    "test_lifecycle",
    "test_linear_hybrid",
    "test_swa_pool",
    "test_scheduler_memory",
    "test_tier_guards",
    "test_inputs",
    "test_attention",
)


def report_rank(module: str, function: str = "") -> int | None:
    """Where test ``function`` of the suite module ``module`` (dotted name) runs, or
    ``None`` if it is not the suite's: an index into :data:`REPORT_ORDER` (its function's
    entry, else its module's), or its length for an unlisted module."""
    package, _, name = module.rpartition(".")
    if package != SUITE_PACKAGE:
        return None
    for key in (f"{name}::{function}", name):
        if key in REPORT_ORDER:
            return REPORT_ORDER.index(key)
    return len(REPORT_ORDER)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sort the suite's tests along :data:`REPORT_ORDER` within the places they hold."""
    ranks = {index: rank for index, item in enumerate(items) if (rank := _rank(item)) is not None}
    # sorted() is stable: tests keep their order within a module.
    ordered = [items[index] for index in sorted(ranks, key=ranks.__getitem__)]
    for index, item in zip(ranks, ordered, strict=True):
        items[index] = item


def _rank(item: pytest.Item) -> int | None:
    module = getattr(item, "module", None)
    function = getattr(item, "originalname", "")
    return None if module is None else report_rank(module.__name__, function)
