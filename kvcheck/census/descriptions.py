"""Which transfer descriptions a pool offers: its ``get_*buf_infos`` methods (what PD and
HiCache read a pool's memory through); the census properties judge what they describe.

Example:
    >>> class Pool:
    ...     def get_state_buf_infos(self): ...
    >>> description_methods(Pool())
    ('get_state_buf_infos',)
"""

from __future__ import annotations

from typing import Any

__all__ = ["description_methods"]


def description_methods(pool: Any) -> tuple[str, ...]:
    """The transfer descriptions ``pool`` offers: its ``get_*buf_infos`` methods.

    Example:
        >>> class Pool:
        ...     def get_contiguous_buf_infos(self): ...
        ...     def get_state_buf_infos(self): ...
        >>> description_methods(Pool())
        ('get_contiguous_buf_infos', 'get_state_buf_infos')
    """
    return tuple(
        name
        for name in sorted(dir(type(pool)))
        if name.startswith("get_") and name.endswith("buf_infos") and callable(getattr(pool, name))
    )
