"""Which shards a campaign runs, in what order, and when it has run enough.

A shard is one pytest run of a few of the suite's tests (a property, or one parameter of a
state machine) against the target with a seed of its own and the campaign's example count.
The planner hands out shards round after round: in each round every property still worth
searching gets as many shards as its weight (:data:`SEARCH_WEIGHTS`), each with the next
seed of the campaign, so no two shards repeat each other's search and a default run's
100 examples become ``rounds x weight x examples`` per property.

A property leaves the plan when searching it more can tell nothing new:

- it failed (its minimal example is in the shared database: searching again would only
  find and shrink the same bug a second time),
- it is not a Hypothesis test (a plain test is deterministic: one run says it all),
- Hypothesis exhausted its search space, or it was skipped.

The planner stops at the example budget: the examples the finished shards ran plus those
the running ones may run reach it (a test that is not a Hypothesis test runs none, so it
costs nothing). The time budget is the driver's.

Example:
    >>> props = [Property("m.py::test_a", "m", "test_a"),
    ...          Property("m.py::test_b[x]", "m", "test_b")]
    >>> planner = Planner(props, seed=100, examples_per_test=500)
    >>> [(shard.nodeids, shard.seed) for shard in (planner.next_shard(), planner.next_shard())]
    [(('m.py::test_a',), 100), (('m.py::test_b[x]',), 101)]
    >>> planner.record("m.py::test_a", outcome="failed", searched=True, exhausted=False)
    >>> planner.next_shard().nodeids  # the second round: test_a failed, only test_b is left
    ('m.py::test_b[x]',)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_EXAMPLES_PER_TEST",
    "SEARCH_WEIGHTS",
    "Planner",
    "Property",
    "Shard",
]

#: Examples per test in a shard: ten times a default run's 100 (the kvcheck-campaign profile).
DEFAULT_EXAMPLES_PER_TEST = 1000

#: Shards per round of a suite module's properties (1 if unlisted). A weight above 1 also
#: runs each parameter of the module's properties in a shard of its own (the machine of
#: each family, the kpool and decode-context-parallel machines on their own), so the
#: variants a default run reaches least (one DSA pool in three has a kpool, one in four is
#: DCP) get the same share of the search as the rest. The state machines weigh most: their
#: call sequences are where a bug that needs a rare combination of steps hides.
SEARCH_WEIGHTS: Mapping[str, int] = {
    "test_pool_machines": 4,
    "test_inputs": 2,
}


@dataclass(frozen=True)
class Property:
    """One collected test of the suite.

    ``nodeid`` is pytest's id (what results and a parametrized property's database key
    name), ``module`` the module's short name (weights) and ``function`` the test function
    (a property; its parameters share it). ``skip`` is the reason it is skipped at
    collection (the target lacks a capability, no GPU), if it is.
    """

    nodeid: str
    module: str
    function: str
    skip: str | None = None


@dataclass(frozen=True)
class Shard:
    """One pytest run: the tests ``nodeids`` with ``seed``, ``examples`` per test."""

    number: int
    nodeids: tuple[str, ...]
    seed: int
    examples: int

    def planned_examples(self) -> int:
        """The examples this shard may run: ``examples`` per test.

        Example:
            >>> Shard(1, ("a", "b"), seed=0, examples=10).planned_examples()
            20
        """
        return self.examples * len(self.nodeids)


class Planner:
    """Hands out the campaign's shards (see the module docstring).

    ``properties`` are the collected tests (those with ``skip`` are never run), ``seed`` the
    first shard's seed (each shard takes the next), ``examples_per_test`` each shard's
    ``max_examples``, ``max_examples`` the campaign's example budget (``None``: none; see
    :meth:`shard_done`) and
    ``weights`` the shards per round by module.
    """

    def __init__(
        self,
        properties: Sequence[Property],
        *,
        seed: int,
        examples_per_test: int = DEFAULT_EXAMPLES_PER_TEST,
        max_examples: int | None = None,
        weights: Mapping[str, int] = SEARCH_WEIGHTS,
    ) -> None:
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an integer >= 0")
        if not isinstance(examples_per_test, int) or examples_per_test < 1:
            raise ValueError(f"examples_per_test={examples_per_test!r} must be an integer >= 1")
        if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
            raise ValueError(f"max_examples={max_examples!r} must be None or an integer >= 1")
        bad = {module: w for module, w in weights.items() if not isinstance(w, int) or w < 1}
        if bad:
            raise ValueError(f"weights={dict(weights)!r}: {bad} must be integers >= 1")
        self.properties = tuple(properties)
        self.examples_per_test = examples_per_test
        self.max_examples = max_examples
        self.weights = dict(weights)
        #: Examples the finished shards ran, and those the running ones may still run.
        self.spent = 0
        self._running: dict[int, int] = {}
        self._next_seed = seed
        self._number = 0
        #: nodeid -> why it left the plan ("failed", "exhausted", ...)
        self.finished: dict[str, str] = {
            p.nodeid: "skipped" for p in self.properties if p.skip is not None
        }
        self._rounds = self._shards()

    def next_shard(self) -> Shard | None:
        """The next shard, or ``None`` when every test left the plan or the example budget
        is spent or promised to the running shards."""
        promised = self.spent + sum(self._running.values())
        if self.max_examples is not None and promised >= self.max_examples:
            return None
        shard = next(self._rounds, None)
        if shard is not None:
            self._running[shard.number] = shard.planned_examples()
        return shard

    def shard_done(self, shard: Shard, *, examples: int) -> None:
        """``shard`` finished (or was lost) having run ``examples``: they count against the
        budget instead of what it might have run.

        Example:
            >>> planner = Planner([Property("t", "m", "t")], seed=0, examples_per_test=10,
            ...                   max_examples=15)
            >>> shard = planner.next_shard()
            >>> planner.next_shard() is None  # 10 of 15 promised: one more shard
            False
            >>> planner.shard_done(shard, examples=0)  # a plain test: it ran no examples
            >>> planner.spent
            0
        """
        self._running.pop(shard.number, None)
        self.spent += examples

    def record(self, nodeid: str, *, outcome: str, searched: bool, exhausted: bool) -> None:
        """What one shard found for test ``nodeid``: its ``outcome``, whether Hypothesis
        ``searched`` (it is a Hypothesis test) and whether it ``exhausted`` the search space.

        Example:
            >>> planner = Planner([Property("t", "m", "t")], seed=0)
            >>> planner.record("t", outcome="passed", searched=False, exhausted=False)
            >>> planner.finished, planner.next_shard()
            ({'t': 'not a Hypothesis test'}, None)
        """
        if nodeid in self.finished:
            return
        if outcome in ("failed", "error", "xpassed") or outcome in ("skipped", "xfailed"):
            self.finished[nodeid] = outcome
        elif outcome == "passed" and not searched:
            self.finished[nodeid] = "not a Hypothesis test"
        elif exhausted:
            self.finished[nodeid] = "search space exhausted"

    def searching(self) -> list[str]:
        """The tests still being searched.

        Example:
            >>> Planner([Property("t", "m", "t", skip="no GPU")], seed=0).searching()
            []
        """
        return [p.nodeid for p in self.properties if p.nodeid not in self.finished]

    def round_examples(self) -> int:
        """The examples one round of the plan hands out: for every test to be searched (not
        skipped, and not found to be a plain test), its module's weight in shards of
        ``examples_per_test``.

        Example:
            >>> props = [Property("a", "test_pool_machines", "a"), Property("b", "m", "b"),
            ...          Property("c", "m", "c", skip="no GPU")]
            >>> Planner(props, seed=0, examples_per_test=10).round_examples()
            50
        """
        return sum(
            self.weights.get(p.module, 1) * self.examples_per_test
            for p in self.properties
            if p.skip is None and self.finished.get(p.nodeid) != "not a Hypothesis test"
        )

    def _groups(self) -> list[tuple[int, list[Property]]]:
        """(weight, tests run together): a property's parameters together, or each on its
        own where its module weighs more than 1; heaviest first, then in suite order."""
        groups: dict[tuple[str, str], list[Property]] = {}
        for prop in self.properties:
            weight = self.weights.get(prop.module, 1)
            key = (prop.module, prop.nodeid if weight > 1 else prop.function)
            groups.setdefault(key, []).append(prop)
        ordered = [(self.weights.get(module, 1), tests) for (module, _), tests in groups.items()]
        return sorted(ordered, key=lambda entry: -entry[0])

    def _shards(self) -> Iterator[Shard]:
        """Round after round; within a round, pass ``k`` runs the groups weighing more than
        ``k``, so the heavy ones are interleaved rather than queued one behind another."""
        groups = self._groups()
        while True:
            handed_out = False
            for rank in range(max((weight for weight, _ in groups), default=0)):
                for weight, tests in groups:
                    live = [p for p in tests if p.nodeid not in self.finished]
                    if weight <= rank or not live:
                        continue
                    self._number += 1
                    yield Shard(
                        self._number,
                        tuple(p.nodeid for p in live),
                        seed=self._next_seed,
                        examples=self.examples_per_test,
                    )
                    self._next_seed += 1
                    handed_out = True
            if not handed_out:
                return
