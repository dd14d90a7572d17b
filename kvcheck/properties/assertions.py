"""One failure vocabulary for every property: ``got … but should be … [call]``.

Public so that a downstream project's own properties fail the way kvcheck's do (with a
:class:`kvcheck.failures.FailureSignature` a declared finding can match). Comparisons run in
bulk first; only when they fail do we walk the data to name the first difference (layer,
row, byte), so the happy path stays cheap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kvcheck.failures import FailureSignature, PropertyFailure


def failure(message: str, *, signature: FailureSignature | None = None) -> Exception:
    """The exception to raise when a property fails with ``message``: a
    :class:`PropertyFailure`, unless the failure is one the target under test declared
    as a known finding and a Hypothesis example is running; then the example is
    rejected instead (:func:`kvcheck.targets.findings.steer_around`), so the property
    keeps looking for every other bug. Always ``raise failure(...)``.

    Example:
        >>> str(failure("got 1 but should be 0 [poke]"))
        'got 1 but should be 0 [poke]'
    """
    from kvcheck.targets.findings import steer_around

    error = PropertyFailure(message, signature=signature)
    return steer_around(error)


def fail(
    *,
    got: Any,
    expected: Any,
    call: str,
    detail: str = "",
    signature: FailureSignature | None = None,
) -> Exception:
    """Build (not raise) the failure for ``got`` differing from ``expected`` in ``call``
    (see :func:`failure`).

    Example:
        >>> str(fail(got=3, expected=4, call="pool.get_kv_size_bytes()"))
        'got 3 but should be 4 [pool.get_kv_size_bytes()]'
    """
    message = f"got {got!r} but should be {expected!r} [{call}]"
    if detail:
        message = f"{message}\n{detail}"
    return failure(message, signature=signature)


def assert_equal(
    got: Any,
    expected: Any,
    *,
    call: str,
    detail: str = "",
    signature: FailureSignature | None = None,
) -> None:
    """Raise :class:`PropertyFailure` unless ``got == expected``.

    Example:
        >>> assert_equal((0, 0), (0, 0), call="noop.get_kv_size_bytes()")
    """
    __tracebackhide__ = True
    if got != expected:
        raise fail(got=got, expected=expected, call=call, detail=detail, signature=signature)


def first_difference(got: np.ndarray, expected: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first element where two same-shaped arrays differ, or None.

    Example:
        >>> first_difference(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 5]]))
        (1, 1)
    """
    if got.shape != expected.shape:
        raise ValueError(f"shapes differ: got.shape={got.shape}, expected.shape={expected.shape}")
    mismatch = np.argwhere(got != expected)
    if mismatch.size == 0:
        return None
    return tuple(int(i) for i in mismatch[0])


def assert_bytes_equal(
    got: np.ndarray,
    expected: np.ndarray,
    *,
    what: str,
    call: str,
    signature: FailureSignature | None = None,
) -> None:
    """Byte-for-byte equality of two uint8 arrays; names the first differing (row, byte)
    in the words a reproduction script uses: ``row 1 byte 2 is 0x01 but should be 0x00``.

    Example:
        >>> a = np.zeros((2, 4), dtype=np.uint8)
        >>> assert_bytes_equal(a, a.copy(), what="k_buffer[layer 0]", call="set_kv_buffer")
        >>> b = a.copy(); b[1, 2] = 1
        >>> try:
        ...     assert_bytes_equal(b, a, what="k_buffer[layer 0]", call="set_kv_buffer")
        ... except PropertyFailure as error:
        ...     print(error)
        k_buffer[layer 0] row 1 byte 2 is 0x01 but should be 0x00 [set_kv_buffer]
        1 byte differs
    """
    __tracebackhide__ = True
    if got.shape != expected.shape:
        raise fail(
            got=got.shape,
            expected=expected.shape,
            call=call,
            detail=f"shape of {what}",
            signature=signature,
        )
    if np.array_equal(got, expected):
        return
    index = first_difference(got, expected)
    assert index is not None
    names = ("row", "byte", "col") if len(index) > 1 else ("byte",)
    where = " ".join(f"{name} {i}" for name, i in zip(names, index, strict=False))
    if signature is not None and signature.kind.endswith("differs") and len(index) > 1:
        # The first differing row (slot, or page for index-K) tells findings apart.
        signature = dataclasses.replace(signature, kind=f"{signature.kind} at row {index[0]}")
    count = int(np.count_nonzero(got != expected))
    # One wording with the reproduction script's (kvcheck.runner.repro.expect_bytes).
    raise failure(
        f"{what} {where} is 0x{int(got[index]):02x} but should be "
        f"0x{int(expected[index]):02x} [{call}]\n"
        f"{count} {'byte differs' if count == 1 else 'bytes differ'}",
        signature=signature,
    )
