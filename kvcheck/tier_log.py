"""The recorder of a tier failure's calls: :class:`TierLog` and the checks' two hooks.

:class:`TierLog` wraps the objects a target built for one example (:meth:`TierLog.wrap`: an
allocator, host pools) so that every call on them, by the driver or by a check, is kept as
a :class:`~kvcheck.tier_calls.TierCall`: its arguments and its answer as plain data. A check
says what it expected of the latest call with :func:`expect` and marks its own calls with
:func:`checking`; both do nothing on an object no log wraps, so the checks run on any
object. :meth:`TierLog.attached_to_failures` gives a failure the calls as a note (the
example a person reads) and, when its failing check is one the log recorded, a
:class:`~kvcheck.tier_calls.TierReproduction` for a standalone script.

Example:
    >>> import torch
    >>> from kvcheck.allocators import TokenToKVPoolAllocator
    >>> from kvcheck.tiers import AllocatorSpec
    >>> log = TierLog("allocator", AllocatorSpec(kind="token", size=4, page_size=1))
    >>> allocator = log.wrap(TokenToKVPoolAllocator(4, torch.bfloat16, "cpu", None, False),
    ...                      "allocator")
    >>> allocator.alloc(2).tolist()
    [1, 2]
    >>> allocator.free(torch.tensor([1, 2]))
    >>> _ = allocator.available_size()
    >>> expect(allocator, "available_size", equals=4)
    >>> log.listing()[-2:]
    ['  allocator.free([1, 2])', '  allocator.available_size()  # -> 4']
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from kvcheck.tier_calls import (
    CALLS_HEADING,
    TIER_KINDS,
    TierCall,
    TierReproduction,
    discrepancy,
    plain,
    tier_listing,
)
from kvcheck.tiers import AllocatorSpec, HostPoolSpec

__all__ = ["TierLog", "checking", "expect", "expecting", "recorded"]

#: A tensor of ints travels as its list of values up to this many elements; a larger one, or
#: one of another dtype, as its raw bytes (an argument, up to this many bytes) or as its
#: dtype and shape only (an answer, which no script passes on).
_MAX_VALUES = 4096
_MAX_RAW_BYTES = 1 << 16


class TierLog:
    """The calls made on the tier objects of one example (see the module).

    ``kind`` and ``spec`` are the :class:`TierReproduction`'s: what the target was asked to
    build. Objects the calls take that the target built too (the device pool) are named
    with :meth:`name`.
    """

    def __init__(
        self, kind: str, spec: AllocatorSpec | HostPoolSpec, *, device: str = "cpu"
    ) -> None:
        if kind not in TIER_KINDS:
            raise ValueError(f"kind={kind!r} not in {TIER_KINDS}")
        self.kind = kind
        self.spec = spec
        self.device = device
        #: the calls so far (mutable while they are made; :attr:`calls` freezes them)
        self._entries: list[_Entry] = []
        #: id -> name of the objects calls may take; the objects are kept, so that no id
        #: is reused while the log lives
        self._names: dict[int, str] = {}
        self._kept: list[Any] = []
        self._checking = 0
        #: the first call whose answer differed from what kvcheck expected of it
        self.failing: int | None = None
        #: the names of the objects wrapped, in order (the host pools: host, host_1, ...)
        self.wrapped: list[str] = []

    def wrap(self, obj: Any, name: str) -> Any:
        """``obj`` behind a recorder: every call on it (and on its members) is logged under
        ``name``."""
        self.name(obj, name)
        self.wrapped.append(name)
        return _Recorded(obj, self, name)

    def name(self, obj: Any, name: str) -> None:
        """Write ``obj`` as ``name`` where a call takes it (the device pool)."""
        self._names[id(obj)] = name
        self._kept.append(obj)

    def checking(self) -> contextlib.AbstractContextManager[None]:
        """Calls made inside the block are kvcheck's checks (the listing leaves them out)."""
        return _Checking(self)

    @property
    def calls(self) -> tuple[TierCall, ...]:
        """Every call made so far, as data."""
        return tuple(entry.frozen() for entry in self._entries)

    def expect(self, on: str | None, method: str | None, expectation: Mapping[str, Any]) -> None:
        """Add ``expectation`` to the latest call of ``method`` on ``on`` (``None``: the
        latest call on ``on``; both ``None``: the latest call); the first one it does not
        hold for becomes the failing call."""
        index = next(
            (
                i
                for i in range(len(self._entries) - 1, -1, -1)
                if on in (None, self._entries[i].on) and method in (None, self._entries[i].method)
            ),
            None,
        )
        if index is None:
            return
        entry = self._entries[index]
        # A copy: the caller's lists (a request's row) may grow after the check.
        entry.expect = {**(entry.expect or {}), **_copied(dict(expectation))}
        problem = discrepancy(plain(entry.live), entry.error, entry.expect)
        if self.failing is None and problem is not None:
            self.failing = index

    def __len__(self) -> int:
        return len(self._entries)

    def record(
        self,
        on: str,
        method: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        attribute: bool = False,
        arg_names: Sequence[str] = (),
    ) -> int:
        """Log a call about to be made (its arguments encoded now, before the callee can
        change them; ``arg_names``: the parameters they go to, where known);
        :meth:`answered` completes it. Returns its index."""
        self._entries.append(
            _Entry(
                on=on,
                method=method,
                args=tuple(_encoded(arg, self._names, data=True) for arg in args),
                kwargs=tuple(
                    (key, _encoded(value, self._names, data=True))
                    for key, value in (kwargs or {}).items()
                ),
                checking=self._checking > 0,
                attribute=attribute,
                arg_names=tuple(arg_names),
            )
        )
        return len(self._entries) - 1

    def answered(self, index: int, answer: Any = None, error: BaseException | None = None) -> None:
        """What call ``index`` answered, or the exception it raised."""
        entry = self._entries[index]
        if error is not None:
            entry.answer, entry.raised, entry.error = str(error), type(error).__name__, error
        else:
            entry.answer, entry.live = _encoded(answer, self._names, data=False), answer

    # -- on a failure ----------------------------------------------------------------------

    def _failing_index(self) -> int | None:
        if self.failing is not None:
            return self.failing
        last = self._entries[-1] if self._entries else None
        if last is not None and last.raised is not None and not (last.expect or {}).get("raises"):
            return len(self._entries) - 1  # the target raised where it should not
        return None

    def reproduction(self, *, note: str = "", check: str = "") -> TierReproduction | None:
        """The failure's reproduction: the calls up to the one whose answer kvcheck found
        wrong. None when that call is not one this log recorded (the failing check compared
        something else, such as bytes), or a call took an argument no script can rebuild."""
        failing = self._failing_index()
        if failing is None:
            return None
        calls = self.calls[: failing + 1]
        if not all(call.replayable for call in calls):
            return None
        return TierReproduction(
            self.kind, self.spec, calls, failing_call=failing, note=note, check=check
        )

    def listing(self) -> list[str]:
        """The calls as Python, one a line: building the tier objects, every call the suite
        made (kvcheck's checks left out, but for the failing one), each answer as a comment."""
        return tier_listing(
            self.kind,
            self.spec,
            self.calls,
            self._failing_index(),
            device=self.device,
            parts=tuple(self.wrapped),
        )

    def attach(self, error: BaseException) -> None:
        """Give ``error`` (a failure raised while the calls were made) the listing as a note
        and, when a script can replay it, the reproduction (once per error; Hypothesis's own
        control flow is no failure)."""
        if getattr(error, "_kvcheck_calls_noted", False) or type(error).__module__.startswith(
            "hypothesis"
        ):
            return
        error.add_note("\n".join([CALLS_HEADING, *self.listing()]))
        signature = getattr(error, "signature", None)
        if getattr(error, "reproduction", None) is None:
            rep = self.reproduction(note=str(error), check=str(getattr(signature, "check", "")))
            if rep is not None:
                error.reproduction = rep  # type: ignore[attr-defined]
        error._kvcheck_calls_noted = True  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def attached_to_failures(self) -> Iterator[TierLog]:
        """Attach the log to whatever the block raises (:meth:`attach`)."""
        try:
            yield self
        except Exception as error:
            self.attach(error)
            raise


class _Entry:
    """A call while it is being made and checked (:class:`TierCall`'s fields, mutable), with
    its answer or exception as it came: judged when a check says what it expected (right
    after the call), as a script will judge it."""

    __slots__ = (
        "answer",
        "arg_names",
        "args",
        "attribute",
        "checking",
        "error",
        "expect",
        "kwargs",
        "live",
        "method",
        "on",
        "raised",
    )

    def __init__(
        self,
        *,
        on: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: tuple[tuple[str, Any], ...],
        checking: bool,
        attribute: bool,
        arg_names: tuple[str, ...],
    ) -> None:
        self.on, self.method, self.args, self.kwargs = on, method, args, kwargs
        self.checking, self.attribute, self.arg_names = checking, attribute, arg_names
        self.answer: Any = None
        self.raised: str | None = None
        self.expect: dict[str, Any] | None = None
        self.live: Any = None
        self.error: BaseException | None = None

    def frozen(self) -> TierCall:
        return TierCall(
            on=self.on,
            method=self.method,
            args=self.args,
            kwargs=self.kwargs,
            answer=self.answer,
            raised=self.raised,
            expect=self.expect,
            checking=self.checking,
            attribute=self.attribute,
            arg_names=self.arg_names,
        )


def _copied(value: Any) -> Any:
    """``value`` with every list and dict in it copied (an expectation is plain data)."""
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    return value


# --- values as plain data -------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _dtype_facts(dtype: Any) -> tuple[str, bool]:
    """A torch dtype's name (``int64``) and whether it holds integers (or bools)."""
    return str(dtype).removeprefix("torch."), not (dtype.is_floating_point or dtype.is_complex)


def _encoded(value: Any, names: Mapping[int, str], *, data: bool) -> Any:
    """``value`` as plain data (see :class:`TierCall`); ``data``: keep the bytes of a tensor
    that is not a short list of ints (an argument), else only its dtype and shape (an
    answer)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": str(value)}
    if id(value) in names:
        return {"object": names[id(value)]}
    if isinstance(value, _Recorded):
        return {"object": value._kvcheck_on}
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        dtype, integral = _dtype_facts(tensor.dtype)
        described: dict[str, Any] = {"tensor": dtype, "shape": list(tensor.shape)}
        if integral and tensor.numel() <= _MAX_VALUES:
            described["values"] = tensor.tolist()
        elif data and tensor.nbytes <= _MAX_RAW_BYTES:
            flat = tensor.contiguous().reshape(-1).view(torch.uint8)
            described["hex"] = bytes(flat.numpy().tobytes()).hex()
        return described
    if isinstance(value, tuple):
        return {"tuple": [_encoded(item, names, data=data) for item in value]}
    if isinstance(value, list):
        return [_encoded(item, names, data=data) for item in value]
    return {"object": None, "type": type(value).__name__}


# --- the recorder ------------------------------------------------------------------------------


class _Recorded:
    """Stands in for a tier object: every call on it goes through :meth:`TierLog.record`;
    a plain attribute read (an int, a string, None) is recorded too, a tensor or container
    is handed out as it is, any other member (a side of a sliding-window allocator) is
    wrapped in turn."""

    __slots__ = ("_kvcheck_log", "_kvcheck_on", "_kvcheck_target")

    def __init__(self, target: Any, log: TierLog, on: str) -> None:
        object.__setattr__(self, "_kvcheck_target", target)
        object.__setattr__(self, "_kvcheck_log", log)
        object.__setattr__(self, "_kvcheck_on", on)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._kvcheck_target, name)
        log, on = self._kvcheck_log, self._kvcheck_on
        if callable(value) and not isinstance(value, type):
            return functools.partial(_recorded_call, log, on, name, value)
        if value is None or isinstance(value, bool | int | float | str):
            log.answered(log.record(on, name, attribute=True), value)
            return value
        if _is_data(value):
            return value
        return _Recorded(value, log, f"{on}.{name}")

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._kvcheck_target, name, value)

    def __repr__(self) -> str:
        return repr(self._kvcheck_target)


def _is_data(value: Any) -> bool:
    """A tensor, an array or a container: handed out as it is, never wrapped."""
    if isinstance(value, list | tuple | dict | set | frozenset | bytes):
        return True
    return hasattr(value, "dtype") and hasattr(value, "shape")


def _recorded_call(
    log: TierLog, on: str, method: str, function: Any, *args: Any, **kwargs: Any
) -> Any:
    args = tuple(recorded(arg) for arg in args)
    kwargs = {name: recorded(value) for name, value in kwargs.items()}
    index = log.record(on, method, args, kwargs, arg_names=_parameter_names(function, len(args)))
    try:
        answer = function(*args, **kwargs)
    except Exception as error:
        log.answered(index, error=error)
        raise
    log.answered(index, answer)
    return answer


def _parameter_names(function: Any, count: int) -> tuple[str, ...]:
    """The names of the parameters the first ``count`` positional arguments of ``function``
    go to (none when its signature does not say them all)."""
    unbound = getattr(function, "__func__", None)
    if unbound is not None:  # a bound method: its first parameter is the object
        names = _positional_names(unbound)[1:]
    else:
        try:
            names = _positional_names(function)
        except TypeError:  # unhashable: not worth caching, nor naming
            return ()
    return names[:count] if len(names) >= count else ()


@functools.lru_cache(maxsize=512)
def _positional_names(function: Any) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in parameters if p.kind in kinds)


def expect(obj: Any, method: str | None = None, **expectation: Any) -> None:
    """Record that kvcheck expected ``expectation`` (keys of :data:`EXPECTATIONS`) of the
    latest call of ``method`` on ``obj`` (None: the latest call on it); nothing when no
    :class:`TierLog` wraps ``obj``.

    Example:
        >>> expect(object(), "available_size", equals=3)  # an object no log wraps
    """
    log = getattr(obj, "_kvcheck_log", None)
    if isinstance(log, TierLog):
        log.expect(obj._kvcheck_on, method, expectation)


def checking(obj: Any) -> contextlib.AbstractContextManager[None]:
    """Mark the calls made on ``obj`` inside the block as kvcheck's checks (nothing when no
    :class:`TierLog` wraps it).

    Example:
        >>> with checking(object()):
        ...     pass
    """
    log = getattr(obj, "_kvcheck_log", None)
    return _Checking(log) if isinstance(log, TierLog) else contextlib.nullcontext()


class _Checking:
    """The block of :meth:`TierLog.checking` (a class: checks run it thousands of times)."""

    __slots__ = ("log",)

    def __init__(self, log: TierLog) -> None:
        self.log = log

    def __enter__(self) -> None:
        self.log._checking += 1

    def __exit__(self, *exc: object) -> None:
        self.log._checking -= 1


@contextlib.contextmanager
def expecting(obj: Any, **expectation: Any) -> Iterator[None]:
    """Record that kvcheck expected ``expectation`` of the last call made inside the block
    on any object of ``obj``'s log (a bad call, expected to raise), said when the block
    ends, however it ends, before the caller judges it; nothing when no call was recorded
    there or no :class:`TierLog` wraps ``obj``.

    Example:
        >>> with expecting(object(), raises="ValueError"):
        ...     pass
    """
    log = getattr(obj, "_kvcheck_log", None)
    if not isinstance(log, TierLog):
        yield
        return
    before = len(log)
    try:
        yield
    finally:
        if len(log) > before:
            log.expect(None, None, expectation)


def recorded(obj: Any) -> Any:
    """The object a :class:`TierLog` wraps as ``obj`` (``obj`` itself when none does): for
    what reads an object's own state, never a call (``vars``).

    Example:
        >>> thing = object()
        >>> recorded(thing) is thing
        True
    """
    return obj._kvcheck_target if isinstance(obj, _Recorded) else obj
