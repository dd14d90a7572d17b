"""Calls on an allocator or a host pool as plain data, with what kvcheck expected of each.

A tier failure (the allocator machine's, the host-pool checks') is a sequence of calls on
objects the target built: ``allocator.alloc(3)``, ``allocator.free([4, 5])``,
``host.available_size()``. :class:`TierCall` is one of them (arguments and answer as plain
data: a tensor as its dtype and its list of ints), with what kvcheck expected of its answer;
:class:`TierReproduction` is a failure as those calls, which the runner stores beside the
results (:func:`tier_reproduction_to_json`, its ``kind`` telling it from a pool
reproduction) and renders as a standalone script. The script judges each answer with
:func:`discrepancy`, whose source it carries (:data:`SCRIPT_CHECKS`), and a failure's
example lists the calls as Python (:func:`tier_listing`). :mod:`kvcheck.tier_log` records
them.

Expectations (:data:`EXPECTATIONS`), each a key of a call's ``expect``:

- ``raises``: the name of the built-in exception the call must raise (else it must not);
- ``refused``: an allocation answers ``None`` (True) or slots (False);
- ``equals`` / ``sorted`` / ``truth``: the answer (tensors as lists), the answer sorted, or
  its truth equals the value;
- ``slots``: the answer is slots a correct allocator may hand out (:func:`slots_problem`).

Example:
    >>> call = TierCall("allocator", "available_size", answer=1, expect={"equals": 2})
    >>> discrepancy(1, None, call.expect)
    'answered 1, but should answer 2'
    >>> call_text(TierCall("allocator", "free", ({"tensor": "int64", "shape": [2],
    ...                                            "values": [4, 5]},)))
    'allocator.free([4, 5])'
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcheck.failures import FORMAT_VERSION, _decode_dataclass, _encode
from kvcheck.tiers import AllocatorSpec, HostPoolSpec

__all__ = [
    "CALLS_HEADING",
    "EXPECTATIONS",
    "SCRIPT_CHECKS",
    "TIER_KINDS",
    "TierCall",
    "TierReproduction",
    "call_text",
    "construction_lines",
    "discrepancy",
    "host_part_names",
    "plain",
    "shown",
    "slots_problem",
    "tier_listing",
    "tier_reproduction_from_json",
    "tier_reproduction_to_json",
]

#: What a tier reproduction is about: the JSON's ``kind`` (a pool reproduction's is "pool").
TIER_KINDS: tuple[str, ...] = ("allocator", "host_pool")
#: The keys a call's ``expect`` may hold (see the module).
EXPECTATIONS: tuple[str, ...] = ("raises", "refused", "equals", "sorted", "truth", "slots")
#: The first line of the note that lists a failure's calls.
CALLS_HEADING = "calls, in order:"


# --- what a script checks (each function's source is copied into the script) ----------------


def plain(value: object) -> object:
    """``value`` as plain data: a tensor or an array as nested lists, a tuple as a list.

    Example:
        >>> import torch
        >>> plain((torch.tensor([1, 2]), 3))
        [[1, 2], 3]
    """
    if hasattr(value, "tolist") and not isinstance(value, list):
        return value.tolist()  # type: ignore[attr-defined]
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def slots_problem(
    slots: list[int], count: int, free_pages: list[int], page_size: int, plan: list[int | str]
) -> str | None:
    """What is wrong with ``slots``, an allocator's answer, when it must be ``count`` slots
    that follow ``plan``, one rule per slot: ``"page"`` (the first slot of a page that was
    free, ``free_pages``, and not taken earlier in this answer), ``"next"`` (the slot after
    the one before it) or a slot number ``s`` (the slot after ``s``: a request's last).
    None when nothing is.

    Example:
        >>> slots_problem([2, 3], 2, [1], 2, ["page", "next"]) is None  # page 1, whole
        True
        >>> slots_problem([2, 3, 4], 3, [2], 2, [7, "page", "next"])
        'slot 2 (position 0) should be 8, after 7'
    """
    if len(slots) != count:
        return f"{len(slots)} slots, not {count}"
    taken: set[int] = set()
    previous = 0
    for position, (slot, rule) in enumerate(zip(slots, plan, strict=False)):
        if rule == "page":
            page = slot // page_size
            if slot % page_size or page not in free_pages or page in taken:
                return (
                    f"slot {slot} (position {position}) should start a free page; free "
                    f"pages were {sorted(set(free_pages) - taken)}"
                )
            taken.add(page)
        else:
            after = previous if rule == "next" else int(rule)
            if slot != after + 1:
                return f"slot {slot} (position {position}) should be {after + 1}, after {after}"
        previous = slot
    return None


def discrepancy(answer: object, error: BaseException | None, expect: dict) -> str | None:
    """What differs between a call's ``answer`` (plain data) or the exception it raised
    (``error``) and what kvcheck expected of it (``expect``); None when nothing does.

    Example:
        >>> discrepancy([4, 2], None, {"sorted": [2, 4]}) is None
        True
        >>> discrepancy(None, None, {"raises": "ValueError"})
        'answered None, but should raise ValueError'
    """
    wanted = expect.get("raises")
    if error is not None:
        if wanted is not None and isinstance(error, getattr(builtins, wanted)):
            return None
        should = f"should raise {wanted}" if wanted else "should not raise"
        return f"raised {type(error).__name__}: {error}, but {should}"
    if wanted is not None:
        return f"answered {answer!r}, but should raise {wanted}"
    if "refused" in expect and (answer is None) != expect["refused"]:
        got = "None (refused)" if answer is None else f"{answer!r}"
        should = "None (the free pages do not cover it)" if expect["refused"] else "slots"
        return f"answered {got}, but should answer {should}"
    if answer is None and expect.get("refused"):
        return None
    if "equals" in expect and answer != expect["equals"]:
        return f"answered {answer!r}, but should answer {expect['equals']!r}"
    if "sorted" in expect and sorted(answer or []) != expect["sorted"]:  # type: ignore[call-overload]
        return f"answered {answer!r}, but should answer {expect['sorted']!r} in any order"
    if "truth" in expect and bool(answer) != expect["truth"]:
        return f"answered {answer!r}, but should answer something {expect['truth']}-like"
    if "slots" in expect:
        problem = slots_problem(answer, **expect["slots"])  # type: ignore[arg-type]
        if problem is not None:
            return f"answered {answer!r}: {problem}"
    return None


#: The functions a script carries, in the order it defines them.
SCRIPT_CHECKS = (plain, slots_problem, discrepancy)


# --- recorded calls, as data -------------------------------------------------------------------


@dataclass(frozen=True)
class TierCall:
    """One call on a tier object, as plain data.

    ``on`` names the object (``"allocator"``, ``"host"``, ``"host_1"``, or a path to one of
    its members, ``"allocator.full_attn_allocator"``); ``attribute`` marks a read of
    ``method`` rather than a call. ``args`` and ``kwargs`` are encoded values (ints,
    strings, lists; ``{"tensor": dtype, "shape": ..., "values": ...}`` or ``"hex"`` for a
    tensor; ``{"tuple": [...]}``; ``{"object": name}`` for an object the log was told of,
    such as the device pool). ``answer`` is the answer encoded the same way, or the message
    of the exception named by ``raised``. ``expect`` is what kvcheck expected of it
    (:data:`EXPECTATIONS`); ``checking`` marks a call kvcheck made to check.
    ``arg_names`` are the names of the parameters ``args`` went to, where known.
    """

    on: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    answer: Any = None
    raised: str | None = None
    expect: Mapping[str, Any] | None = None
    checking: bool = False
    attribute: bool = False
    #: the parameter names of ``args`` where the callee's signature gave them (the listing
    #: shows them; a script passes ``args`` as the suite did, by position)
    arg_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in self.expect or {}:
            if key not in EXPECTATIONS:
                raise ValueError(f"expect key {key!r} not in {EXPECTATIONS}")
        wanted = (self.expect or {}).get("raises")
        if wanted is not None and not _is_builtin_exception(wanted):
            raise ValueError(f"expect raises={wanted!r} is not a built-in exception name")

    @property
    def replayable(self) -> bool:
        """Whether a script can make this call: every argument is plain data."""
        return not any(_opaque(value) for value in (*self.args, *(v for _, v in self.kwargs)))


@dataclass(frozen=True)
class TierReproduction:
    """A tier failure as the calls that show it: on the allocator (``kind="allocator"``,
    ``spec`` an :class:`~kvcheck.tiers.AllocatorSpec`) or the host pools
    (``kind="host_pool"``, ``spec`` a :class:`~kvcheck.tiers.HostPoolSpec`; the calls may
    take the device pool the target built for ``spec.device``), built by the target, in
    order. ``failing_call`` is the index of the call whose answer kvcheck found wrong (the
    last); ``note`` is what kvcheck reported, ``check`` the property, ``test`` the test id.

    Example:
        >>> spec = AllocatorSpec(kind="token", size=2, page_size=1)
        >>> rep = TierReproduction("allocator", spec, (TierCall("allocator", "clear"),))
        >>> rep.failing_index
        0
    """

    kind: str
    spec: AllocatorSpec | HostPoolSpec
    calls: tuple[TierCall, ...]
    failing_call: int | None = None
    note: str = ""
    check: str = ""
    test: str = ""

    def __post_init__(self) -> None:
        wanted = {"allocator": AllocatorSpec, "host_pool": HostPoolSpec}.get(self.kind)
        if wanted is None:
            raise ValueError(f"kind={self.kind!r} not in {TIER_KINDS}")
        if not isinstance(self.spec, wanted):
            raise ValueError(f"spec={self.spec!r} is not a {wanted.__name__} (kind={self.kind!r})")
        object.__setattr__(self, "calls", tuple(self.calls))
        if not all(isinstance(call, TierCall) for call in self.calls):
            raise ValueError("calls must be TierCall values")
        if self.failing_call is not None and not 0 <= self.failing_call < len(self.calls):
            raise ValueError(
                f"failing_call={self.failing_call!r} not in [0, {len(self.calls)}) (len(calls))"
            )

    @property
    def failing_index(self) -> int | None:
        """Index of the call kvcheck found wrong (the last one by default)."""
        if self.failing_call is not None:
            return self.failing_call
        return len(self.calls) - 1 if self.calls else None


def tier_reproduction_to_json(rep: TierReproduction) -> dict[str, Any]:
    """``rep`` as JSON-serializable data, with ``kind`` telling it from a pool reproduction.

    Example:
        >>> spec = AllocatorSpec(kind="token", size=2, page_size=1)
        >>> data = tier_reproduction_to_json(
        ...     TierReproduction("allocator", spec, (TierCall("allocator", "alloc", (1,)),)))
        >>> data["kind"], data["calls"][0]["method"], data["calls"][0]["args"]
        ('allocator', 'alloc', [1])
    """
    if not isinstance(rep, TierReproduction):
        raise ValueError(f"rep={rep!r} is not a TierReproduction")
    return {
        "format": FORMAT_VERSION,
        "kind": rep.kind,
        "spec": _encode(rep.spec),
        "calls": [
            {
                "on": call.on,
                "method": call.method,
                "args": list(call.args),
                "kwargs": {name: value for name, value in call.kwargs},
                "answer": call.answer,
                "raised": call.raised,
                "expect": None if call.expect is None else dict(call.expect),
                "checking": call.checking,
                "attribute": call.attribute,
                "arg_names": list(call.arg_names),
            }
            for call in rep.calls
        ],
        "failing_call": rep.failing_call,
        "note": rep.note,
        "check": rep.check,
        "test": rep.test,
    }


def tier_reproduction_from_json(data: Mapping[str, Any]) -> TierReproduction:
    """The :class:`TierReproduction` that :func:`tier_reproduction_to_json` wrote; raises
    ``ValueError`` naming the field it cannot read.

    Example:
        >>> spec = AllocatorSpec(kind="paged", size=4, page_size=2)
        >>> rep = TierReproduction("allocator", spec, (
        ...     TierCall("allocator", "alloc", (2,), answer=[2, 3], expect={"refused": False}),))
        >>> tier_reproduction_from_json(tier_reproduction_to_json(rep)) == rep
        True
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"data={data!r} is not a mapping")
    version = data.get("format", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(f"format={version!r}: this kvcheck reads format {FORMAT_VERSION}")
    kind = data.get("kind")
    if kind not in TIER_KINDS:
        raise ValueError(f"kind={kind!r} not in {TIER_KINDS}")
    if "spec" not in data or "calls" not in data:
        raise ValueError(f"data has keys {sorted(data)}; 'spec' and 'calls' are required")
    spec_class = AllocatorSpec if kind == "allocator" else HostPoolSpec
    spec = _decode_dataclass(spec_class, data["spec"], "spec")
    calls = []
    for i, item in enumerate(data["calls"]):
        if not isinstance(item, Mapping) or not {"on", "method"} <= set(item):
            raise ValueError(f"calls[{i}]={item!r}: 'on' and 'method' are required")
        try:
            calls.append(
                TierCall(
                    on=str(item["on"]),
                    method=str(item["method"]),
                    args=tuple(item.get("args") or ()),
                    kwargs=tuple((item.get("kwargs") or {}).items()),
                    answer=item.get("answer"),
                    raised=item.get("raised"),
                    expect=item.get("expect"),
                    checking=bool(item.get("checking", False)),
                    attribute=bool(item.get("attribute", False)),
                    arg_names=tuple(str(name) for name in item.get("arg_names") or ()),
                )
            )
        except ValueError as exc:
            raise ValueError(f"calls[{i}]: {exc}") from None
    return TierReproduction(
        kind=kind,
        spec=spec,
        calls=tuple(calls),
        failing_call=data.get("failing_call"),
        note=str(data.get("note", "")),
        check=str(data.get("check", "")),
        test=str(data.get("test", "")),
    )


# --- encoding values -----------------------------------------------------------------------------


def _is_builtin_exception(name: object) -> bool:
    found = getattr(builtins, name, None) if isinstance(name, str) else None
    return isinstance(found, type) and issubclass(found, BaseException)


def _opaque(value: Any) -> bool:
    """An encoded value a script cannot rebuild: an unknown object, or a tensor of floats
    whose bytes were not kept."""
    if isinstance(value, list):
        return any(_opaque(item) for item in value)
    if isinstance(value, dict):
        if "tuple" in value:
            return any(_opaque(item) for item in value["tuple"])
        if "object" in value:
            return value["object"] is None
        if "tensor" in value:
            return "values" not in value and "hex" not in value
    return False


def shown(value: Any) -> str:
    """An encoded value as the listing shows it: a tensor of ints as its list, an object by
    name.

    Example:
        >>> shown({"tuple": [{"tensor": "int64", "shape": [2], "values": [4, 5]}, 0]})
        '([4, 5], 0)'
    """
    if isinstance(value, list):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    if isinstance(value, dict):
        if "tuple" in value:
            items = [shown(item) for item in value["tuple"]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if "object" in value:
            return str(value["object"] or f"<{value.get('type', 'object')}>")
        if "tensor" in value:
            if "values" in value:
                return repr(value["values"])
            return f"<{value['tensor']} tensor {value['shape']}>"
        if "float" in value:
            return f"float({value['float']!r})"
    return repr(value)


def call_text(call: TierCall) -> str:
    """The call as the listing writes it: ``allocator.free([4, 5])``; a call of more than
    two arguments names them, where their names are known.

    Example:
        >>> call_text(TierCall("host", "free", ({"tensor": "int64", "shape": [1], "values": [3]},)))
        'host.free([3])'
        >>> call_text(TierCall("allocator", "alloc_decode", (3, 4, 5), arg_names=("a", "b", "c")))
        'allocator.alloc_decode(a=3, b=4, c=5)'
    """
    if call.attribute:
        return f"{call.on}.{call.method}"
    named = len(call.args) + len(call.kwargs) > 2 and len(call.arg_names) == len(call.args)
    parts = [
        f"{name}={shown(arg)}" if named else shown(arg)
        for name, arg in zip(call.arg_names or [""] * len(call.args), call.args, strict=True)
    ]
    parts += [f"{name}={shown(value)}" for name, value in call.kwargs]
    return f"{call.on}.{call.method}({', '.join(parts)})"


# --- the listing a failure's example is --------------------------------------------------------


def tier_listing(
    kind: str,
    spec: AllocatorSpec | HostPoolSpec,
    calls: Sequence[TierCall],
    failing: int | None,
    *,
    device: str = "cpu",
    parts: Sequence[str] = (),
) -> list[str]:
    """The lines :meth:`kvcheck.tier_log.TierLog.listing` writes, for ``calls``
    (``failing``: the index of the call kvcheck found wrong, or None) made on the tier
    objects built on ``device`` (host pools: named ``parts``, default those the calls name).

    Example:
        >>> spec = AllocatorSpec(kind="token", size=2, page_size=1)
        >>> calls = [TierCall("allocator", "alloc", (2,), answer=[1, 2]),
        ...          TierCall("allocator", "available_size", answer=1, expect={"equals": 0},
        ...                   checking=True)]
        >>> for line in tier_listing("allocator", spec, calls, 1)[1:]:
        ...     print(line)
          allocator.alloc(2)  # -> [1, 2]
          allocator.available_size()  # answered 1, but should answer 0  <- the failure
    """
    names = tuple(parts) or host_part_names(calls)
    lines = [f"  {line}" for line in construction_lines(kind, spec, device=device, parts=names)]
    for index, call in enumerate(calls):
        if index == failing:
            answer = call.answer if call.raised is None else None
            error = None if call.raised is None else _rebuilt(call.raised, call.answer)
            problem = discrepancy(
                _plain_encoded(answer), error, dict(call.expect or {})
            ) or _answer_comment(call)
            lines.append(f"  {call_text(call)}  # {problem}  <- the failure")
            break
        if call.checking:
            continue
        comment = _answer_comment(call)
        lines.append(f"  {call_text(call)}" + (f"  # {comment}" if comment else ""))
    return lines


def host_part_names(calls: Sequence[TierCall]) -> tuple[str, ...]:
    """The host pools ``calls`` name, ``host`` (the first, which hands out host slots) then
    ``host_1`` ... up to the last one named.

    Example:
        >>> host_part_names([TierCall("host_2.kv_buffer", "clone")])
        ('host', 'host_1', 'host_2')
    """
    last = 0
    for call in calls:
        root = call.on.split(".")[0]
        if root.startswith("host_") and root[5:].isdigit():
            last = max(last, int(root[5:]))
    return ("host", *(f"host_{number}" for number in range(1, last + 1)))


def construction_lines(
    kind: str,
    spec: AllocatorSpec | HostPoolSpec,
    *,
    device: str = "cpu",
    parts: Sequence[str] = ("host",),
) -> list[str]:
    """How the suite had the target build the tier objects, as Python.

    Example:
        >>> spec = AllocatorSpec(kind="token", size=2, page_size=1)
        >>> construction_lines("allocator", spec, device="cuda:0")[0].split(", size=")[0]
        "allocator = target.make_allocator(AllocatorSpec(kind='token'"
    """
    if kind == "allocator":
        return [f"allocator = target.make_allocator({_spec_repr(spec)}, device={device!r})"]
    assert isinstance(spec, HostPoolSpec)
    names = list(parts) or ["host"]
    taken = "[0]" if len(names) == 1 else f"[:{len(names)}]"
    return [
        f"spec = {_spec_repr(spec)}",
        f"device_pool = target.make_pool(spec.device, device={device!r})",
        f"{', '.join(names)} = target.make_host_pool(spec, device_pool, device={device!r}){taken}",
    ]


def _spec_repr(spec: Any) -> str:
    """``spec`` as its constructor call, fields at their defaults left out (a nested
    spec's too)."""
    shown_fields = [
        f"{field.name}={_spec_repr(getattr(spec, field.name))}"
        if dataclasses.is_dataclass(getattr(spec, field.name))
        else f"{field.name}={getattr(spec, field.name)!r}"
        for field in dataclasses.fields(spec)
        if field.default is dataclasses.MISSING or getattr(spec, field.name) != field.default
    ]
    return f"{type(spec).__name__}({', '.join(shown_fields)})"


def _answer_comment(call: TierCall) -> str:
    if call.raised is not None:
        if (call.expect or {}).get("raises") is not None:
            return f"raised {call.raised}, as it should"
        return f"raised {call.raised}: {call.answer}"
    if call.answer is None:
        return ""
    return f"-> {shown(call.answer)}"


def _plain_encoded(value: Any) -> Any:
    """An encoded answer as :func:`plain` gives the live one (a tensor's values, a list)."""
    if isinstance(value, list):
        return [_plain_encoded(item) for item in value]
    if isinstance(value, dict):
        if "tuple" in value:
            return [_plain_encoded(item) for item in value["tuple"]]
        if "tensor" in value:
            return value.get("values")
    return value


def _rebuilt(name: str, message: Any) -> BaseException:
    """The exception a recorded call raised, rebuilt from its name and message (a built-in
    one as itself, so that an expected ``raises`` still matches)."""
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        with contextlib.suppress(Exception):
            return found(message)
    return type(name, (Exception,), {})(message)
