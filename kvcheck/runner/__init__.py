"""The runner: what turns kvcheck's library into a tool.

- :mod:`~kvcheck.runner.plugin`: the pytest plugin (``--kvcheck-target``, fixtures,
  profiles, findings, results);
- :mod:`~kvcheck.runner.cli`: ``kvcheck verify | replay | memory-report | ...``;
- :mod:`~kvcheck.runner.results` and :mod:`~kvcheck.runner.summary`: the JSON results and
  the short report;
- :mod:`~kvcheck.runner.profiles` and :mod:`~kvcheck.runner.db`: Hypothesis profiles and
  the example databases that must never fail silently;
- :mod:`~kvcheck.runner.devices`: which device each xdist worker uses;
- :mod:`~kvcheck.runner.repro`: standalone reproduction scripts;
- :mod:`~kvcheck.runner.memory_report`: bytes per token and capacity, per model;

Nothing in the library (``kvcheck.specs`` up to ``kvcheck.machines``) imports the runner.
"""
