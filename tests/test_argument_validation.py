"""kvcheck.validation: one message shape, both exception flavours."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.errors import InvalidArgument

from kvcheck import validation as v

BAD = {
    "type": (
        lambda e: v.check_type(int, "3", "layers", error=e),
        "layers='3' must be an instance of int",
    ),
    "bool": (lambda e: v.check_bool(1, "unique", error=e), "unique=1 must be a bool"),
    "int-type": (lambda e: v.check_valid_integer(True, "n", error=e), "n=True must be an int"),
    "int-min": (lambda e: v.check_valid_integer(0, "n", min_value=1, error=e), "n=0 must be >= 1"),
    "interval": (
        lambda e: v.check_valid_interval(4, 2, "min_size", "max_size", error=e),
        "Cannot have max_size=2 < min_size=4",
    ),
    "one-of": (lambda e: v.check_one_of("x", "family", ("mha",), error=e), "family='x' not in"),
    "choices-str": (lambda e: v.check_choices("mha", "families", ("mha",), error=e), "sequence"),
    "choices-empty": (lambda e: v.check_choices((), "families", ("mha",), error=e), "not be empty"),
    "choices-unknown": (
        lambda e: v.check_choices(("gqa",), "families", ("mha",), error=e),
        "['gqa'] not in ('mha',)",
    ),
    "int-sequence": (
        lambda e: v.check_int_sequence((1, 0), "dims", min_value=1, error=e),
        "dims entry=0 must be >= 1",
    ),
}


@pytest.mark.parametrize("error", [InvalidArgument, ValueError])
@pytest.mark.parametrize(("call", "fragment"), BAD.values(), ids=list(BAD))
def test_bad_values_raise_the_given_error_naming_the_argument(
    call: Any, fragment: str, error: type[Exception]
) -> None:
    """Each check raises the exception class it is given, with a ``name=value`` message."""
    with pytest.raises(error) as info:
        call(error)
    assert fragment in str(info.value)


def test_good_values_come_back() -> None:
    """Checks return what they accept, choices in the caller's order without repeats."""
    assert v.check_valid_integer(3, "n", min_value=1) == 3
    assert v.check_bool(False, "unique") is False
    assert v.check_choices(["dsa", "mha", "dsa"], "families", ("mha", "dsa")) == ("dsa", "mha")
    assert v.check_int_sequence([8, 16], "dims", min_value=1) == (8, 16)
    assert v.check_one_of("mha", "family", ("mha",)) == "mha"
