"""kvcheck's own tests, in a shuffled order on request.

``TESTS_SHUFFLE_SEED=N pytest -n auto`` runs the collected tests in the order
``random.Random(N)`` shuffles them into (after every other reordering, the suite's report
order included), so a test that passes only after, or only before, another shows up; the
header names the seed, and the same ``N`` gives the same order again. Under xdist every
worker shuffles with the same seed, so they collect the same list, and which worker runs
what changes with the seed too. CI's lowest-versions stage runs the whole command this way,
with a seed it prints (``.ci/run``, "lowest: pytest -n auto, shuffled").

A variable rather than pytest-randomly: that plugin, once installed, shuffles every run
and reseeds ``random`` before each test; this shuffles only when asked, and changes
nothing else. Not a ``KVCHECK_*`` name: kvcheck warns about those it does not read.
"""

from __future__ import annotations

import os
import random

import pytest

#: Not collected as modules by --doctest-modules (they have no doctests): without
#: __init__.py files both would be imported as "conftest", and pytest refuses the second.
collect_ignore = ["conftest.py", "attention/conftest.py"]

#: The variable that asks for a shuffled order: an integer seed.
SHUFFLE_SEED = "TESTS_SHUFFLE_SEED"


def _seed() -> int | None:
    value = os.environ.get(SHUFFLE_SEED, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"{SHUFFLE_SEED}={value!r} must be an integer seed") from None


def pytest_configure(config: pytest.Config) -> None:
    _seed()  # a bad value is a usage error before anything runs


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = _seed()
    return None if seed is None else f"tests shuffled: {SHUFFLE_SEED}={seed}"


@pytest.hookimpl(trylast=True)  # after the plugins' own orders (the suite's report order)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = _seed()
    if seed is not None:
        random.Random(seed).shuffle(items)
