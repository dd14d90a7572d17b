"""Argument checks for kvcheck's public functions: one vocabulary, one message shape.

Modelled on Hypothesis's ``hypothesis/internal/validation.py``: every public function
checks its arguments through these helpers before doing anything, so a bad argument gets
the same ``name=value`` message wherever it is passed. Strategies raise
:class:`hypothesis.errors.InvalidArgument` (the default ``error``), as Hypothesis's own
strategies do; other public functions pass ``error=ValueError``.

(The pools' rejection of bad calls, :mod:`kvcheck.pools._refusals`, is not argument
checking of kvcheck's API: it is behaviour of the system under test, modelled on SGLang
with SGLang's messages, and stays there.)

Example:
    >>> check_valid_integer(3, "max_layers", min_value=1)
    3
    >>> check_valid_interval(8, 4, "min_page_size", "max_page_size")
    Traceback (most recent call last):
        ...
    hypothesis.errors.InvalidArgument: Cannot have max_page_size=4 < min_page_size=8
    >>> check_bool("yes", "causal", error=ValueError)
    Traceback (most recent call last):
        ...
    ValueError: causal='yes' must be a bool
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from hypothesis.errors import InvalidArgument

__all__ = [
    "check_bool",
    "check_choices",
    "check_int_sequence",
    "check_one_of",
    "check_type",
    "check_valid_integer",
    "check_valid_interval",
]

T = TypeVar("T")


def check_type(
    typ: type[T] | tuple[type, ...],
    value: Any,
    name: str,
    *,
    what: str | None = None,
    error: type[Exception] = InvalidArgument,
) -> T:
    """``value`` if it is an instance of ``typ``, else ``error`` naming ``name=value``.

    ``what`` describes the expected type in the message (default: the type's name).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> check_type(PoolSpec, "mha", "spec", what="a kvcheck.specs.PoolSpec")
        Traceback (most recent call last):
            ...
        hypothesis.errors.InvalidArgument: spec='mha' must be a kvcheck.specs.PoolSpec
    """
    if not isinstance(value, typ):
        if what is None:
            names = typ if isinstance(typ, tuple) else (typ,)
            what = "an instance of " + " or ".join(t.__name__ for t in names)
        raise error(f"{name}={value!r} must be {what}")
    return value  # type: ignore[return-value]


def check_bool(value: Any, name: str, *, error: type[Exception] = InvalidArgument) -> bool:
    """``value`` if it is a bool (not merely truthy), else ``error``.

    Example:
        >>> check_bool(True, "unique")
        True
    """
    if not isinstance(value, bool):
        raise error(f"{name}={value!r} must be a bool")
    return value


def check_valid_integer(
    value: Any,
    name: str,
    *,
    min_value: int | None = None,
    error: type[Exception] = InvalidArgument,
) -> int:
    """``value`` if it is an int (bools are not) of at least ``min_value``, else ``error``.

    Example:
        >>> check_valid_integer(0, "max_layers", min_value=1)
        Traceback (most recent call last):
            ...
        hypothesis.errors.InvalidArgument: max_layers=0 must be >= 1
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name}={value!r} must be an int")
    if min_value is not None and value < min_value:
        raise error(f"{name}={value!r} must be >= {min_value}")
    return value


def check_valid_interval(
    lower: int,
    upper: int,
    lower_name: str,
    upper_name: str,
    *,
    error: type[Exception] = InvalidArgument,
) -> None:
    """``error`` unless ``lower <= upper`` (check each bound's type first).

    Example:
        >>> check_valid_interval(1, 1, "min_size", "max_size")
    """
    if upper < lower:
        raise error(f"Cannot have {upper_name}={upper!r} < {lower_name}={lower!r}")


def check_one_of(
    value: Any, name: str, allowed: Collection[Any], *, error: type[Exception] = InvalidArgument
) -> Any:
    """``value`` if it is one of ``allowed``, else ``error`` naming the allowed values.

    Example:
        >>> check_one_of("paged", "family", ("mha", "dsa"))
        Traceback (most recent call last):
            ...
        hypothesis.errors.InvalidArgument: family='paged' not in ('mha', 'dsa')
    """
    if value not in allowed:
        raise error(f"{name}={value!r} not in {allowed!r}")
    return value


def check_choices(
    values: Any, name: str, allowed: Sequence[T], *, error: type[Exception] = InvalidArgument
) -> tuple[T, ...]:
    """A non-empty sequence of ``allowed`` values, in the caller's order without repeats.

    The caller's order is kept because it is the shrink order of whatever samples them.

    Example:
        >>> check_choices(["dsa", "mha", "dsa"], "families", ("mha", "mla", "dsa"))
        ('dsa', 'mha')
        >>> check_choices(("gqa",), "families", ("mha", "dsa"))
        Traceback (most recent call last):
            ...
        hypothesis.errors.InvalidArgument: families=('gqa',): ['gqa'] not in ('mha', 'dsa')
    """
    if isinstance(values, str) or not isinstance(values, Sequence | frozenset | set):
        raise error(f"{name}={values!r} must be a sequence drawn from {allowed!r}")
    chosen = tuple(values)
    if not chosen:
        raise error(f"{name}={values!r} must not be empty")
    unknown = [value for value in chosen if value not in allowed]
    if unknown:
        raise error(f"{name}={values!r}: {unknown!r} not in {allowed!r}")
    return tuple(dict.fromkeys(chosen))


def check_int_sequence(
    values: Any, name: str, *, min_value: int, error: type[Exception] = InvalidArgument
) -> tuple[int, ...]:
    """A non-empty sequence of ints, each at least ``min_value``, as a tuple.

    Example:
        >>> check_int_sequence([8, 16], "head_dims", min_value=1)
        (8, 16)
        >>> check_int_sequence((8, 0), "head_dims", min_value=1)
        Traceback (most recent call last):
            ...
        hypothesis.errors.InvalidArgument: head_dims entry=0 must be >= 1
    """
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise error(f"{name}={values!r} must be a non-empty sequence of ints")
    for value in values:
        check_valid_integer(value, f"{name} entry", min_value=min_value, error=error)
    return tuple(values)
