"""The ``sglang`` target: everything kvcheck knows about sglang lives in this package.

=================  =========================================================================
``target``         :class:`SGLangTarget`: sglang's pools and serving functions behind the
                   target protocol, and its one declaration (surface, unsupported, findings)
``adapt``          translations from kvcheck's vocabulary to the objects sglang builds from
                   a checkpoint and server arguments
``env``            the scoped CPU stand-ins for what a launched GPU server provides
``findings``       the declared findings and their pins
``reach``          the scopes of sglang's code the reach measurement reads, and why each
                   unreached range stays unreached
``scripts``        what a standalone reproduction script needs to build sglang's pools
=================  =========================================================================

Importing the package does not import sglang (7-15 s); the target's first method that needs
it does, once per process.

Example:
    >>> SGLangTarget().name
    'sglang'
"""

from kvcheck.targets.sglang.target import SGLANG_VERSION, SURFACE, SGLangTarget

__all__ = ["SGLANG_VERSION", "SURFACE", "SGLangTarget"]
