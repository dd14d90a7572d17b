"""Standalone scripts of tier failures: the calls kvcheck made on an allocator or a host pool,
made again, each answer checked as kvcheck checked it.

A :class:`kvcheck.tier_calls.TierReproduction` (stored as
:func:`~kvcheck.tier_calls.tier_reproduction_to_json`'s data, ``kind`` ``"allocator"`` or
``"host_pool"``) becomes a script that resolves the target as kvcheck did (a ``module:attr``
target from the directory kvcheck imported it from, ``import_root``), has it build the
allocator (``make_allocator(AllocatorSpec(...), device="cpu")``) or the device pool and its
host pools (``make_pool(PoolSpec(...))``, ``make_host_pool(HostPoolSpec(...), device_pool)``)
and makes every call with the arguments kvcheck's run made it with, as literals. After each
it checks the answer against what kvcheck expected, also as literals, with the functions of
:data:`kvcheck.tier_calls.SCRIPT_CHECKS`, copied in. The exit status is a pool script's
(:mod:`kvcheck.runner.repro`): 0 ``OK: no discrepancy``, 1 ``REPRODUCED: ...``, 2
``CANNOT RUN: ...``.

Example:
    >>> from kvcheck.tier_calls import TierCall, TierReproduction, tier_reproduction_to_json
    >>> from kvcheck.tiers import AllocatorSpec
    >>> spec = AllocatorSpec(kind="token", size=2, page_size=1)
    >>> rep = TierReproduction("allocator", spec, (
    ...     TierCall("allocator", "available_size", answer=1, expect={"equals": 2}),))
    >>> script = render_tier_script(tier_reproduction_to_json(rep), target="kvcheck")
    >>> "call('allocator.available_size()', lambda: allocator.available_size()," in script
    True
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from kvcheck.runner.repro import SCRIPT_PRELUDE
from kvcheck.tier_calls import (
    SCRIPT_CHECKS,
    TierCall,
    TierReproduction,
    call_text,
    construction_lines,
    host_part_names,
    tier_reproduction_from_json,
)

__all__ = ["render_tier_script", "value_source"]

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


_HELPERS = '''
def reproduced(message):
    raise SystemExit(f"REPRODUCED: {message}")


def raw(dtype, shape, hex_bytes):
    """A tensor of dtype and shape holding these raw bytes."""
    data = bytearray(bytes.fromhex(hex_bytes))
    if not data:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def call(what, make, expect=None):
    """Make one call (make()); its answer, or the exception it raises, must be what kvcheck
    expected of it (no exception, when it expected nothing)."""
    answer, error = None, None
    try:
        answer = make()
    except Exception as exc:
        error = exc
    problem = discrepancy(plain(answer), error, expect or {})
    if problem is not None:
        reproduced(f"{what} {problem}")
    return answer
'''


def value_source(value: Any) -> str:
    """An encoded value (:class:`~kvcheck.tier_calls.TierCall`'s) as the source that
    rebuilds it.

    Example:
        >>> value_source({"tensor": "int32", "shape": [2], "values": [4, 5]})
        'torch.tensor([4, 5], dtype=torch.int32)'
        >>> value_source({"tuple": [{"tensor": "int64", "shape": [1], "values": [3]}, 0]})
        '(torch.tensor([3]), 0)'
    """
    if isinstance(value, list):
        return "[" + ", ".join(value_source(item) for item in value) + "]"
    if isinstance(value, dict):
        if "tuple" in value:
            items = [value_source(item) for item in value["tuple"]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if "object" in value and isinstance(value["object"], str):
            return value["object"]
        if "float" in value:
            return f"float({value['float']!r})"
        if "tensor" in value:
            return _tensor_source(value)
        raise ValueError(f"value={value!r}: no script can rebuild it")
    return repr(value)


def _tensor_source(value: Mapping[str, Any]) -> str:
    dtype, shape = str(value["tensor"]), list(value["shape"])
    if not _DOTTED.fullmatch(dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype name")
    if "hex" in value:
        return f"raw(torch.{dtype}, {tuple(shape)!r}, {value['hex']!r})"
    if "values" not in value:
        raise ValueError(f"a {dtype} tensor of shape {shape} whose values were not kept")
    values = value["values"]
    if dtype == "int64" and values:  # Python ints make int64 tensors
        source = f"torch.tensor({values!r})"
    else:
        source = f"torch.tensor({values!r}, dtype=torch.{dtype})"
    if isinstance(values, list) and not values and shape != [0]:
        source += f".reshape({tuple(shape)!r})"
    return source


def _call_source(call: TierCall) -> str:
    """The call as source: ``allocator.free(torch.tensor([4, 5]))``."""
    if call.attribute:
        return f"{call.on}.{call.method}"
    args = [value_source(arg) for arg in call.args]
    args += [f"{name}={value_source(value)}" for name, value in call.kwargs]
    return f"{call.on}.{call.method}({', '.join(args)})"


def _header(
    rep: TierReproduction, target: str, needs: str, failing: int | None, test: str
) -> list[str]:
    from kvcheck import __version__

    what = "allocator" if rep.kind == "allocator" else "host pools"
    made = sum(not call.checking for call in rep.calls)
    lines = [
        f"# Reproduction written by kvcheck {__version__} for target {target!r}.",
        "#",
        *(f"# {line}" for line in _describe(rep)),
        f"# Calls: {len(rep.calls)} on the {what} ({made} made to drive it, the others",
        "# kvcheck's checks), made in order below with the arguments kvcheck's run made them",
        "# with; after each, expect= is what kvcheck checked of its answer, as literals.",
        "# The slot numbers are those the target answered in kvcheck's run: for a",
        "# deterministic allocator or host pool (its answers depend only on the calls made on",
        "# it) the recorded slot numbers replay exactly.",
    ]
    if test or rep.test:
        lines.append(f"# Test: {test or rep.test}")
    if rep.check:
        lines.append(f"# Check: {rep.check}")
    if rep.note:
        lines.append("# kvcheck reported:")
        lines += [f"#   {line}".rstrip() for line in rep.note.replace("\r", "").splitlines()]
    if failing is not None:
        lines.append(f"# kvcheck saw the failure at call {failing + 1}.")
    return [
        *lines,
        "#",
        "# Run: python <this file>, from any directory",
        f"# Needs: {needs}.",
        "# Exit status:",
        '#   0  "OK: no discrepancy": every answer is what kvcheck expected (fixed);',
        '#   1  "REPRODUCED: ..." naming the first answer that is not;',
        '#   2  "CANNOT RUN: ...": an import, or building the target\'s objects, failed, so',
        "#      the calls were never made (not a reproduction).",
    ]


def _describe(rep: TierReproduction) -> list[str]:
    if rep.kind == "allocator":
        return [f"Allocator: {rep.spec!r}, from the target's make_allocator."]
    return [
        f"Host pools: {rep.spec!r},",
        "from the target's make_host_pool around the device pool its make_pool builds.",
        "kvcheck wrote into the device pool first; the writes are left out here: the",
        "checks replayed are of the host pools' answers, which they do not change.",
    ]


def _imports(rep: TierReproduction, target: str, import_root: str | None) -> list[str]:
    specs = "AllocatorSpec" if rep.kind == "allocator" else "HostPoolSpec"
    guarded = [
        "import torch",
        "from kvcheck.specs import PoolSpec" if rep.kind == "host_pool" else "",
        f"from kvcheck.tiers import {specs}",
        "from kvcheck.targets import prepare_target, resolve_target",
    ]
    lines = ["import builtins", "import sys", "import traceback", ""]
    if import_root is not None:
        lines += [
            "# Where kvcheck imported the target's module from.",
            f"TARGET_IMPORT_ROOT = {import_root!r}",
            "",
        ]
        # After kvcheck's own imports, so that a folder there named like an installed
        # package cannot shadow it.
        guarded += [
            "if TARGET_IMPORT_ROOT not in sys.path:",
            "    sys.path.insert(0, TARGET_IMPORT_ROOT)",
        ]
    guarded.append(f"target = resolve_target({target!r})  # as kvcheck resolved it")
    lines += ["", *SCRIPT_PRELUDE.strip("\n").splitlines(), "", ""]
    return [
        *lines,
        "try:",
        *(f"    {line}" for line in guarded if line),
        "    prepare_target(target)",
        "except Exception as exc:  # an import error, or whatever the module raised importing",
        '    cannot_run(f"importing the target failed with {type(exc).__name__}: {exc}")',
    ]


def _build(rep: TierReproduction) -> list[str]:
    names = host_part_names(rep.calls)
    built = construction_lines(rep.kind, rep.spec, device="cpu", parts=names)
    what = "the allocator" if rep.kind == "allocator" else "the host pools"
    return [
        "try:",
        *(f"    {line}" for line in built),
        "except Exception as exc:  # kvcheck built these: not the discrepancy reported",
        f'    cannot_run(f"building {what} raised {{type(exc).__name__}}: {{exc}}")',
    ]


def _calls(rep: TierReproduction, failing: int | None) -> list[str]:
    lines: list[str] = []
    for index, call in enumerate(rep.calls):
        if not call.checking:
            lines.append("")
        if index == failing:
            lines.append(f"# call {index + 1}: kvcheck saw the failure here")
        expected = "" if not call.expect else f", expect={dict(call.expect)!r}"
        lines.append(f"call({call_text(call)!r}, lambda: {_call_source(call)}{expected})")
    return lines


def _script_source(function: Any) -> str:
    """``function``'s source as a script carries it: without the type checker's comments."""
    return re.sub(r"  # type: ignore\[[^\]]*\]", "", inspect.getsource(function)).strip()


def render_tier_script(
    data: Mapping[str, Any], *, target: str, import_root: str | None = None, test: str = ""
) -> str:
    """The standalone script that replays ``data`` (a tier reproduction's JSON) on
    ``target``: a built-in target's name or ``"module:attr"``, resolved as kvcheck resolves
    it, with ``import_root`` (the directory kvcheck imported a ``module:attr`` target's
    module from) first on ``sys.path``. ``test`` names the failing test in the header.
    Raises ``ValueError`` for data it cannot read or calls no script can make.

    Example:
        >>> from kvcheck.tier_calls import TierCall, TierReproduction, tier_reproduction_to_json
        >>> from kvcheck.tiers import AllocatorSpec
        >>> rep = TierReproduction("allocator", AllocatorSpec(kind="token", size=2, page_size=1),
        ...                        (TierCall("allocator", "clear"),))
        >>> "TARGET_IMPORT_ROOT = '/src'" in render_tier_script(
        ...     tier_reproduction_to_json(rep), target="mine:target", import_root="/src")
        True
    """
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target={target!r} is not a target name")
    if import_root is not None and not isinstance(import_root, str):
        raise ValueError(f"import_root={import_root!r} is not a str")
    rep = tier_reproduction_from_json(data)
    failing = rep.failing_index
    module = target.partition(":")[0].strip() if ":" in target else ""
    needs = f"torch, kvcheck and {module}" if module else "torch and kvcheck"
    checks = "\n\n\n".join(_script_source(function) for function in SCRIPT_CHECKS)
    what = "allocator" if rep.kind == "allocator" else "host pools"
    body = [
        f"# --- the {what} and the calls " + "-" * 60,
        *_build(rep),
        *_calls(rep, failing),
        "",
        'print("OK: no discrepancy")',
    ]
    blocks = [
        "\n".join(_imports(rep, target.strip(), import_root)),
        checks,
        _HELPERS.strip("\n"),
        "\n".join(body),
    ]
    head = "\n".join(_header(rep, target.strip(), needs, failing, test))
    return head + "\n\n" + "\n\n\n".join(blocks) + "\n"
