"""The ``sglang`` target: everything kvcheck knows about sglang lives in this package.

=================  =========================================================================
``target``         :class:`SGLangTarget`: sglang's pools and serving functions behind the
                   target protocol, and its one declaration (surface, unsupported, findings)
``adapt``          translations from kvcheck's vocabulary to the objects sglang builds from
                   a checkpoint and server arguments
``env``            the scoped CPU stand-ins for what a launched GPU server provides
``release``        which release is installed: its pieces per capability, the layouts read
                   from it, the releases kvcheck is checked against
``findings``       the declared findings, their pins and the releases each holds for
``reach``          the scopes of sglang's code the reach measurement reads, and why each
                   unreached range stays unreached
``scripts``        what a standalone reproduction script needs to build sglang's pools
=================  =========================================================================

Importing the package does not import sglang (which takes seconds); the target's first
method that needs it does, once per process.

Example:
    >>> SGLangTarget().name
    'sglang'
"""

from kvcheck.targets.sglang.release import KNOWN_RELEASES
from kvcheck.targets.sglang.target import SURFACE, SGLangTarget

__all__ = ["KNOWN_RELEASES", "SURFACE", "SGLangTarget"]
