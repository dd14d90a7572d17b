"""A pytest plugin for ``tools/reach.py``: ``--reach-shard K/N`` keeps every N-th test of
the collection, starting at the K-th, so N processes under coverage.py share the suite
(one coverage process per shard, no xdist: see ``reach.measure``).

Example::

    python -m pytest -p reach_shard --reach-shard 0/2 --pyargs kvcheck.suite
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reach-shard",
        metavar="K/N",
        default=None,
        help="keep tests K, K+N, K+2N, ... of the collection (0 <= K < N)",
    )


def _shard(value: str) -> tuple[int, int]:
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--reach-shard={value!r} must be K/N (two ints)") from None
    if not 0 <= k < n:
        raise pytest.UsageError(f"--reach-shard={value!r} needs 0 <= K < N")
    return k, n


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    value = config.getoption("--reach-shard")
    if value is None:
        return
    k, n = _shard(value)
    # Every N-th in the final order: neighbours (a test's parametrizations, the slow
    # machines the runner puts first) go to different shards.
    kept = [item for i, item in enumerate(items) if i % n == k]
    dropped = [item for i, item in enumerate(items) if i % n != k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
