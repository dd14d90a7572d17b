"""kvcheck: property-based verification of LLM-serving KV-cache memory pools.

See README.md for how to run it; ``kvcheck.strategies`` for the public Hypothesis
strategies; ``kvcheck.targets`` for pointing the suite at another implementation.
"""

__version__ = "0.1.0"
