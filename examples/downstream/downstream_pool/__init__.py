"""An example downstream KV pool, and the kvcheck target that exposes it.

``kvcheck verify --target downstream_pool:target`` runs kvcheck's shipped suite against it;
``tests/`` shows the other two ways of use: kvcheck's public strategies in your own
properties, and the ``kvcheck_target`` fixture of the kvcheck pytest plugin.
"""

from downstream_pool.pool import CountingMHAPool
from downstream_pool.target import DownstreamTarget, target

__version__ = "0.1.0"
__all__ = ["CountingMHAPool", "DownstreamTarget", "__version__", "target"]
