"""What a failure is: its signature, the exception a property raises, the calls that show it.

A :class:`PropertyFailure` is the ``AssertionError`` every property raises. Its
:class:`FailureSignature` (which check failed, on which call, what kind of difference, which
pool family) is what a target's declared findings match against, and its optional
:class:`Reproduction` (a pool spec and the operations run on it, the failing one last) is
what the runner stores beside the results (:func:`reproduction_to_json`) and renders as a
standalone script.

Example:
    >>> from kvcheck.specs import Move, PoolSpec
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16",
    ...                 head_num=1, head_dim=1)
    >>> rep = Reproduction(spec=spec, ops=(Move(tgt=(3,), src=(1,)),), note="got 0")
    >>> error = PropertyFailure("got 0 but should be 64", reproduction=rep,
    ...                         signature=FailureSignature(check="bytes", call="move_kv_cache"))
    >>> reproduction_from_json(reproduction_to_json(error.reproduction)) == rep
    True
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvcheck.specs import Op, PoolSpec

__all__ = [
    "FORMAT_VERSION",
    "FailureSignature",
    "PropertyFailure",
    "Reproduction",
    "leaf_exceptions",
    "reproduction_from_json",
    "reproduction_to_json",
]


@dataclass(frozen=True)
class FailureSignature:
    """What kind of failure this is, so a declared finding can match exactly its own.

    ``check`` names the property that failed (``"bytes"``, ``"read_api"``,
    ``"raises"``, ``"caller_tensors"``, ``"accounting"``, ...), ``call`` the method of
    the pool or target whose result was wrong (``"load_cpu_copy"``), ``kind`` the kind of
    difference (``"no exception"``, ``"wrong exception"``, ``"bytes differ"``, ...) and
    ``family`` the pool family, when there is one. Empty strings mean "not known".
    """

    check: str = ""
    call: str = ""
    kind: str = ""
    family: str = ""


class PropertyFailure(AssertionError):
    """A property did not hold. The message names what was compared and the call.

    ``signature`` says which check failed on which call (see :class:`FailureSignature`);
    ``reproduction`` optionally carries the minimal calls (a
    :class:`kvcheck.specs.OpSequence` plus context) for a standalone script.
    """

    def __init__(
        self,
        message: str,
        *,
        signature: FailureSignature | None = None,
        reproduction: Any = None,
    ) -> None:
        super().__init__(message)
        self.signature = signature if signature is not None else FailureSignature()
        self.reproduction = reproduction


#: Version of the JSON form; bumped when a field changes meaning.
FORMAT_VERSION = 1

_OP_CLASSES: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Op)}


@dataclass(frozen=True)
class Reproduction:
    """A failure kvcheck found, as the pool and the calls that show it.

    ``ops`` are every operation run on a fresh pool built from ``spec``, in order, the
    failing one last (``failing_op`` names another index when the failure showed earlier).
    ``note`` is what kvcheck reported, ``check`` the property that failed and ``test`` the
    test id; all three only annotate the script.

    Example:
        >>> from kvcheck.specs import Move, PoolSpec
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> Reproduction(spec=spec, ops=(Move(tgt=(1,), src=(2,)),)).failing_index
        0
    """

    spec: PoolSpec
    ops: tuple[Op, ...]
    note: str = ""
    failing_op: int | None = None
    check: str = ""
    test: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, PoolSpec):
            raise ValueError(f"spec={self.spec!r} is not a kvcheck.specs.PoolSpec")
        # Callers may pass a list of the ops run so far; equality and hashing need a tuple.
        object.__setattr__(self, "ops", tuple(self.ops))
        for op in self.ops:
            if type(op).__name__ not in _OP_CLASSES:
                raise ValueError(f"op={op!r} is not an operation from kvcheck.specs")
        if self.failing_op is not None and not 0 <= self.failing_op < len(self.ops):
            raise ValueError(
                f"failing_op={self.failing_op!r} not in [0, {len(self.ops)}) (len(ops))"
            )

    @property
    def failing_index(self) -> int | None:
        """Index of the op after which kvcheck saw the failure (the last one by default)."""
        if self.failing_op is not None:
            return self.failing_op
        return len(self.ops) - 1 if self.ops else None


# --- JSON -----------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_encode(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _decode(value: Any, hint: Any, where: str) -> Any:
    """Rebuild a value of type ``hint`` (as annotated in kvcheck.specs) from its JSON form."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        return _decode(value, options[0], where)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"{where}={value!r}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(item, args[0], f"{where}[{i}]") for i, item in enumerate(value))
        return tuple(_decode(item, arg, where) for item, arg in zip(value, args, strict=True))
    if hint is bytes:
        try:
            return bytes.fromhex(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}={value!r}: expected a hex string") from None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, value, where)
    return value


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}={data!r}: expected an object for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names - {"op"}
    if unknown:
        raise ValueError(f"{where}: unknown {cls.__name__} fields {sorted(unknown)}")
    kwargs = {
        name: _decode(data[name], hints[name], f"{where}.{name}") for name in names if name in data
    }
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{where}: cannot build {cls.__name__}: {exc}") from None


def reproduction_to_json(rep: Reproduction) -> dict[str, Any]:
    """``rep`` as JSON-serializable data; row bytes become hex strings. Its ``kind`` is
    ``"pool"`` (a tier failure's: :func:`kvcheck.tier_calls.tier_reproduction_to_json`).

    Example:
        >>> from kvcheck.specs import HostCopy, PoolSpec
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> reproduction_to_json(Reproduction(spec, (HostCopy("a", (2, 3)),)))["ops"]
        [{'op': 'HostCopy', 'name': 'a', 'indices': [2, 3], 'req_pool_index': None}]
    """
    if not isinstance(rep, Reproduction):
        raise ValueError(f"rep={rep!r} is not a Reproduction")
    return {
        "format": FORMAT_VERSION,
        "kind": "pool",
        "spec": _encode(rep.spec),
        "ops": [{"op": type(op).__name__, **_encode(op)} for op in rep.ops],
        "note": rep.note,
        "failing_op": rep.failing_op,
        "check": rep.check,
        "test": rep.test,
    }


def reproduction_from_json(data: Mapping[str, Any]) -> Reproduction:
    """The :class:`Reproduction` that :func:`reproduction_to_json` wrote (an exact round trip).

    Raises ``ValueError`` naming the offending field for data it cannot read.

    Example:
        >>> from kvcheck.specs import Move, PoolSpec
        >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> rep = Reproduction(spec, (Move((1,), (2,)),), note="x")
        >>> reproduction_from_json(reproduction_to_json(rep)) == rep
        True
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"data={data!r} is not a mapping")
    version = data.get("format", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(f"format={version!r}: this kvcheck reads format {FORMAT_VERSION}")
    kind = data.get("kind", "pool")
    if kind != "pool":
        raise ValueError(
            f"kind={kind!r}: not a pool reproduction (kvcheck.tier_calls reads a tier one)"
        )
    if "spec" not in data or "ops" not in data:
        raise ValueError(f"data has keys {sorted(data)}; 'spec' and 'ops' are required")
    spec = _decode_dataclass(PoolSpec, data["spec"], "spec")
    ops = []
    for i, item in enumerate(data["ops"]):
        name = item.get("op") if isinstance(item, Mapping) else None
        if name not in _OP_CLASSES:
            raise ValueError(f"ops[{i}].op={name!r} not in {sorted(_OP_CLASSES)}")
        ops.append(_decode_dataclass(_OP_CLASSES[name], item, f"ops[{i}]"))
    return Reproduction(
        spec=spec,
        ops=tuple(ops),
        note=str(data.get("note", "")),
        failing_op=data.get("failing_op"),
        check=str(data.get("check", "")),
        test=str(data.get("test", "")),
    )


def leaf_exceptions(error: BaseException) -> Iterator[BaseException]:
    """The failures inside ``error``: the leaves of nested exception groups (Hypothesis
    reports several distinct failures of one test as an ``ExceptionGroup``), else ``error``.

    Example (an exception group's shape, without Python 3.11's ``ExceptionGroup``):
        >>> class Group(Exception):
        ...     def __init__(self, *exceptions):
        ...         self.exceptions = exceptions
        >>> group = Group(ValueError(), Group(KeyError()))
        >>> [type(leaf).__name__ for leaf in leaf_exceptions(group)]
        ['ValueError', 'KeyError']
    """
    nested = getattr(error, "exceptions", None)
    if isinstance(nested, tuple | list) and nested:
        for inner in nested:
            yield from leaf_exceptions(inner)
    else:
        yield error
