"""``kvcheck campaign``: the shipped suite in shards on a Ray cluster, one shared database.

A default ``kvcheck verify`` spends 100 examples per property on one machine. A campaign
spends a time or example budget on many: it collects the suite once, splits it into
shards (a property, or one family's state machine, x a seed of its own, ten times the
examples), runs them as Ray tasks (one GPU each where the cluster has GPUs) on a local
cluster or one it joins, and merges their results into one ``results.json`` and JUnit file.
Every shard reads and writes the example database ``KVCHECK_DB`` names, keyed by target,
so a failure found anywhere is shrunk once and replays with ``kvcheck replay``.

===================  ======================================================================
``plan``             which shards, in what order; when a test leaves the plan
``pytest_plugin``    the pytest side: collect the plan, select a shard's tests, its examples
``collect``          the suite's tests for this target, collected once
``shard``            one shard on its worker: a pytest subprocess (no Ray)
``driver``           the loop: workers busy until the budget; stops, interrupts
``ray_executor``     shards as Ray tasks (the only module that imports ray)
``merge``            the shards' results as one results file
``junit``            the merged results as JUnit XML
``progress``         the live progress line
``command``          the command line and the run from settings to summary
===================  ======================================================================

Ray is the ``campaign`` extra (``pip install 'kvcheck[campaign]'``); nothing else in kvcheck
needs it, and only ``ray_executor`` imports it.
"""

from kvcheck.runner.campaign.command import add_campaign_parser, run_campaign

__all__ = ["add_campaign_parser", "run_campaign"]
