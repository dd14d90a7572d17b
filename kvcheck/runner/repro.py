"""Standalone reproduction scripts: a failure as a plain Python file a maintainer can run.

A :class:`kvcheck.failures.Reproduction` is a pool spec, the operations run on it (the
failing one last) and what kvcheck reported. :func:`kvcheck.failures.reproduction_to_json`
stores it beside the results (bytes as hex) and :func:`render_script` turns that JSON into
a script that imports only torch and the target's own package, builds the pool, makes the
calls in order and compares every buffer with the bytes kvcheck's reference model expects.
Its exit status says what happened, so it can be pasted into an upstream issue as it is:

- 0 (:data:`SCRIPT_OK`): ``OK: no discrepancy``, the pool behaves (the bug is fixed);
- 1 (:data:`SCRIPT_REPRODUCED`): ``REPRODUCED: ...`` naming the first discrepancy;
- 2 (:data:`SCRIPT_CANNOT_RUN`): ``CANNOT RUN: ...``, the script never reached its checks:
  an import failed (torch, kvcheck, sglang, the target's module), sglang's CPU setup
  failed, or building the pool raised (kvcheck built it without error).

The expected behaviour (which calls must raise, what every buffer must hold) comes from
:class:`kvcheck.reference.ReferencePool` when the script is rendered; the script itself
does not need kvcheck (except ``module:attr`` targets, which take a ``PoolSpec``). A
``module:attr`` script carries the directory kvcheck imported the target's module from
(``import_root``) and puts it first on ``sys.path``, so it runs from any directory.

Example:
    >>> from kvcheck.failures import Reproduction, reproduction_to_json
    >>> from kvcheck.specs import Move, PoolSpec, WriteKV
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1, dtype="float16",
    ...                 head_num=1, head_dim=1)
    >>> rep = Reproduction(spec=spec, ops=(
    ...     WriteKV(layer_id=0, locs=(3,), k_rows=(b"\\x00<",), v_rows=(b"\\x00@",)),
    ...     Move(tgt=(5,), src=(3,))), note="got 0 but should be 64")
    >>> data = reproduction_to_json(rep)
    >>> script = render_script(data, target="kvcheck")
    >>> "pool.move_kv_cache" in script and "from kvcheck.pools import MHATokenToKVPool" in script
    True
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvcheck.calls import ArgValue, CallPlan, HostCopyRef, Ints, Layer, Rows, plan_call
from kvcheck.failures import Reproduction, reproduction_from_json
from kvcheck.geometry import COMPRESS_TAIL_BUFFERS
from kvcheck.reference import ReferencePool
from kvcheck.specs import Op, PoolSpec
from kvcheck.targets import BUILTIN_TARGETS, TargetError, resolve_target
from kvcheck.targets.base import ScriptRecipe
from kvcheck.tier_calls import TIER_KINDS

__all__ = [
    "SCRIPT_CANNOT_RUN",
    "SCRIPT_OK",
    "SCRIPT_REPRODUCED",
    "import_root",
    "render_script",
    "script_name",
    "write_script",
]

#: Exit status of a script whose pool behaves.
SCRIPT_OK = 0
#: Exit status of a script that reproduced the discrepancy.
SCRIPT_REPRODUCED = 1
#: Exit status of a script that could not reach its checks (import or setup failed).
SCRIPT_CANNOT_RUN = 2

# --- targets --------------------------------------------------------------------------------

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _checked_target_name(target: str) -> str:
    if not isinstance(target, str):
        raise ValueError(f"target={target!r} is not a str")
    name = target.strip()
    module, sep, attr = name.partition(":")
    if name in BUILTIN_TARGETS or (sep and _DOTTED.fullmatch(module) and _DOTTED.fullmatch(attr)):
        return name
    raise ValueError(
        f"target={target!r}: expected a built-in target ({', '.join(BUILTIN_TARGETS)}) or "
        "'module:attr'"
    )


def _recipe(target: str, rep: Reproduction) -> ScriptRecipe:
    """The target's own recipe (built-in targets; a ``module:attr`` target whose module is
    already imported, as it is after a run), else one that calls its ``make_pool``."""
    module, _, attr = target.partition(":")
    resolved: Any = None
    if target in BUILTIN_TARGETS or module in sys.modules:
        try:
            resolved = resolve_target(target, available=False)
        except TargetError:
            resolved = None
    offer = getattr(resolved, "script_recipe", None)
    recipe = offer(rep.spec, rep.ops) if callable(offer) else None
    if isinstance(recipe, ScriptRecipe):
        return recipe
    if not attr:
        raise ValueError(f"target={target!r} offers no script recipe")
    fields = ", ".join(_changed_fields(rep.spec))
    return ScriptRecipe(
        needs=f"torch, {module}, and kvcheck for the PoolSpec that the target's make_pool takes",
        # A private alias, so that no module name can shadow the script's own names.
        imports=("from kvcheck.specs import PoolSpec",),
        target_imports=(f"import {module} as target_module",),
        build=(
            f"target = target_module.{attr}",
            "if isinstance(target, type) or not hasattr(target, 'make_pool'):",
            "    target = target()  # a class or factory: kvcheck calls it with no arguments",
            f'pool = target.make_pool(PoolSpec({fields}), device="cpu")',
        ),
        index_k_write="target.write_index_k",
    )


# --- rendering helpers ----------------------------------------------------------------------


def _wrapped(text: str, indent: str) -> str:
    """A string literal of ``text`` (no quotes or backslashes in it), split over lines of
    64 characters when long."""
    if len(text) <= 64:
        return f'"{text}"'
    chunks = [text[i : i + 64] for i in range(0, len(text), 64)]
    inner = "".join(f'\n{indent}    "{chunk}"' for chunk in chunks)
    return f"({inner}\n{indent})"


def _rows_expr(value: Rows) -> str:
    """A :class:`~kvcheck.calls.Rows` tensor as a call of the script's ``rows`` helper (the
    shape the encoder gives: rows of the wrong size are part of the call)."""
    shape = repr(tuple(value.shape))  # (4,) and (1, -1), as the source writes them
    rows = value.rows
    if not rows:
        return f"rows(torch.{value.dtype}, {shape})"
    if len(rows) == 1 and len(rows[0]) <= 24:
        return f"rows(torch.{value.dtype}, {shape}, {_wrapped(rows[0].hex(), '')})"
    items = "".join(f"\n    {_wrapped(row.hex(), '    ')}," for row in rows)
    return f"rows(torch.{value.dtype}, {shape},{items}\n)"


def _is_run(values: Sequence[int]) -> bool:
    return len(values) >= 4 and list(values) == list(range(values[0], values[0] + len(values)))


def _locs(values: Sequence[int]) -> str:
    """Locations as an int64 tensor expression (Python ints make int64 tensors)."""
    if not values:
        return "torch.tensor([], dtype=torch.int64)"
    if _is_run(values):
        return f"torch.arange({values[0]}, {values[0] + len(values)})"
    return f"torch.tensor({list(values)!r})"


def _list(values: Sequence[int]) -> str:
    """Locations as a label shows them: a list, or a range when they are consecutive."""
    return (
        f"range({values[0]}, {values[0] + len(values)})" if _is_run(values) else str(list(values))
    )


def _nested(values: tuple[Any, ...]) -> list[Any]:
    return [list(v) if isinstance(v, tuple) else v for v in values]


def _value_source(value: ArgValue) -> str:
    """An argument's value (as the encoder describes it) as source."""
    if isinstance(value, Rows):
        return _rows_expr(value)
    if isinstance(value, Ints):
        if value.locations:
            return _locs(_nested(value.values))
        return f"torch.tensor({_nested(value.values)!r}, dtype=torch.{value.dtype})"
    if isinstance(value, Layer):
        return f"layer({value.layer_id})"
    if isinstance(value, HostCopyRef):
        return f"copies[{value.name!r}]"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


def _label(plan: CallPlan) -> str:
    """The call as the script's messages name it: SGLang's method with the layer, the
    locations and the plain values (tensors of row bytes and ``None`` left out)."""
    shown = []
    for arg in plan.args:
        value = arg.value
        if isinstance(value, Layer):
            shown.append(f"layer_id={value.layer_id}")
        elif isinstance(value, HostCopyRef):
            shown.append(_value_source(value))
        elif isinstance(value, Ints):
            values = _nested(value.values)
            shown.append(f"{arg.name}={_list(values) if value.locations else values}")
        elif value is not None and not isinstance(value, Rows):
            shown.append(f"{arg.name}={value!r}")
    return f"{plan.pool_method}({', '.join(shown)})"


def _bound_arguments(plan: CallPlan) -> tuple[list[str], list[str]]:
    """Lines binding the call's arguments to their parameter names, and the arguments as
    source. A call with a tensor of row bytes, a grid or lengths binds each of its tensors
    (its locations too) and each argument the encoder remarks on; everything else is
    written in the call itself, and its remark as a comment before it. A name the script
    uses for itself (``pool``, ``layer``, ...) is bound with ``_arg`` added."""
    bind = any(
        isinstance(arg.value, Rows) or (isinstance(arg.value, Ints) and not arg.value.locations)
        for arg in plan.args
    )
    lines, notes, args = [], [], []
    for arg in plan.args:
        source = _value_source(arg.value)
        if bind and (isinstance(arg.value, Rows | Ints) or arg.note):
            name = f"{arg.name}_arg" if arg.name in _SCRIPT_NAMES else arg.name
            if not arg.note:
                lines.append(f"{name} = {source}")
            elif "\n" in source:
                lines += [f"# {arg.note}", f"{name} = {source}"]
            else:
                lines.append(f"{name} = {source}  # {arg.note}")
            source = name
        elif arg.note:
            notes.append(f"# {arg.name}: {arg.note}")
        args.append(f"{arg.name}={source}" if arg.keyword else source)
    return [*lines, *notes], args


def _runs(row: np.ndarray) -> str:
    """A row's non-zero bytes as ``"offset:hex ..."`` runs (zero gaps of 8+ bytes split runs)."""
    nonzero = np.flatnonzero(row)
    runs = np.split(nonzero, np.flatnonzero(np.diff(nonzero) > 8) + 1)
    return " ".join(f"{run[0]}:{row[run[0] : run[-1] + 1].tobytes().hex()}" for run in runs)


def _expected_layer(array: np.ndarray, indent: str) -> str:
    shape = f"({array.shape[0]}, {array.shape[1]})"
    rows = [int(r) for r in np.flatnonzero(array.any(axis=1))] if array.size else []
    if not rows:
        return f"{indent}({shape}, {{}}),"
    body = "".join(
        f"\n{indent}    {r}: {_wrapped(_runs(array[r]), indent + '    ')}," for r in rows
    )
    return f"{indent}({shape}, {{{body}\n{indent}}}),"


def _exception_name(error: type[Exception]) -> str:
    # Scripts name built-in exceptions only; anything else is caught as Exception.
    return error.__name__ if getattr(builtins, error.__name__, None) is error else "Exception"


def _indented(lines: Sequence[str]) -> list[str]:
    """``lines`` as the body of a block (blank lines stay blank)."""
    return [f"    {line}" if line.strip() else "" for line in lines]


def _comment(text: str, prefix: str = "# ") -> list[str]:
    lines = text.replace("\r", "").splitlines() or [""]
    return [f"{prefix}{line}".rstrip() for line in lines]


# --- the script's parts ---------------------------------------------------------------------

#: The first helper of every standalone script (pool and tier scripts alike).
SCRIPT_PRELUDE = '''
def cannot_run(what):
    """The script never reached its checks: exit 2, neither REPRODUCED (1) nor OK (0)."""
    traceback.print_exc()
    print(f"CANNOT RUN: {what}", file=sys.stderr)
    raise SystemExit(2)
'''

_HELPERS = '''
def reproduced(message):
    raise SystemExit(f"REPRODUCED: {message}")


def layer(layer_id):
    """What pools read from an attention layer: its global id."""
    return types.SimpleNamespace(layer_id=layer_id)


def rows(dtype, inner, *hex_rows):
    """A [len(hex_rows), *inner] tensor of dtype holding each row's raw bytes."""
    if not hex_rows:
        return torch.zeros((0, *inner), dtype=dtype)
    data = bytearray(bytes.fromhex("".join(hex_rows)))
    if not data:  # rows of no bytes (a zero-width rope part)
        return torch.zeros((len(hex_rows), *(max(n, 0) for n in inner)), dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(len(hex_rows), *inner)


def as_bytes(tensor):
    """A tensor's bytes as [rows, bytes per row] uint8, whatever its dtype. A head-major
    K/V buffer [pages, heads, page_size, dim] (the HND layout) reads as one row per slot."""
    tensor = tensor.detach().cpu()
    if tensor.dim() == 4:
        tensor = tensor.permute(0, 2, 1, 3).reshape(-1, tensor.shape[1], tensor.shape[3])
    tensor = tensor.contiguous()
    num_rows = tensor.shape[0] if tensor.dim() else 1
    width = math.prod(tensor.shape[1:]) * tensor.element_size()
    return tensor.reshape(-1).view(torch.uint8).reshape(num_rows, width)


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def call(what, method, *args, raises=None, **kwargs):
    """Run one call: it must raise `raises` (or nothing) and leave the caller's tensors as
    they were."""
    inputs = [(i, t) for i, arg in enumerate(args) for t in tensors_in(arg)]
    before = [(t.shape, t.dtype, t.clone()) for _, t in inputs]
    result, error = None, None
    try:
        result = method(*args, **kwargs)
    except Exception as exc:
        error = exc
    for (i, tensor), (shape, dtype, copy) in zip(inputs, before):
        if (tensor.shape, tensor.dtype) != (shape, dtype) or not torch.equal(
            as_bytes(tensor), as_bytes(copy)
        ):
            change = f": {copy.tolist()} -> {tensor.tolist()}" if copy.numel() <= 8 else ""
            reproduced(f"{what} changed the caller's tensor args[{i}]{change}")
    if error is not None and (raises is None or not isinstance(error, raises)):
        wanted = "no exception" if raises is None else raises.__name__
        reproduced(f"{what} raised {type(error).__name__}: {error}, but should be {wanted}")
    if error is None and raises is not None:
        reproduced(f"{what} returned, but should raise {raises.__name__}")
    return result


def expect_bytes(what, tensor, shape, nonzero):
    """`tensor` holds `shape` bytes: the `nonzero` runs ({row: "offset:hex ..."}) and
    zeros everywhere else."""
    got = as_bytes(tensor)
    if tuple(got.shape) != shape:
        reproduced(f"{what} is {tuple(got.shape)} [rows, bytes per row] but should be {shape}")
    want = torch.zeros(shape, dtype=torch.uint8)
    for row, runs in nonzero.items():
        for run in runs.split():
            offset, digits = run.split(":")
            data = torch.tensor(list(bytes.fromhex(digits)), dtype=torch.uint8)
            want[row, int(offset) : int(offset) + len(data)] = data
    differ = (got != want).nonzero()
    if len(differ):
        row, byte = differ[0].tolist()
        reproduced(
            f"{what} row {row} byte {byte} is 0x{int(got[row, byte]):02x} but should be "
            f"0x{int(want[row, byte]):02x} ({len(differ)} bytes differ)"
        )


def check_pool(pool):
    """Every buffer, and every read API, holds exactly the expected bytes."""
    for name, layers in EXPECTED.items():
        buffers = getattr(pool, name)
        if len(buffers) != len(layers):
            reproduced(f"pool.{name} has {len(buffers)} layers but should have {len(layers)}")
        for i, (layer_id, (shape, nonzero)) in enumerate(zip(LAYER_IDS, layers)):
            expect_bytes(f"pool.{name}[{i}] (layer_id {layer_id})", buffers[i], shape, nonzero)
    for read, layers in READS.items():
        if hasattr(pool, read):
            for layer_id, (shape, nonzero) in zip(LAYER_IDS, layers):
                got = getattr(pool, read)(layer_id)
                expect_bytes(f"pool.{read}({layer_id})", got, shape, nonzero)
'''


#: Names a script defines for itself, which a call's bound arguments must not take.
_SCRIPT_NAMES = frozenset(
    {
        "pool",
        "target",
        "copies",
        "torch",
        *re.findall(r"^def (\w+)", SCRIPT_PRELUDE + _HELPERS, re.M),
    }
)


class _ScriptWriter:
    """Builds one script from a reproduction, the reference's verdicts and a target's recipe."""

    def __init__(
        self, rep: Reproduction, recipe: ScriptRecipe, *, import_root: str | None = None
    ) -> None:
        self.rep = rep
        self.spec = rep.spec
        self.recipe = recipe
        self.import_root = import_root
        self.reference = ReferencePool(rep.spec)
        #: The host copies the script has taken so far (by name).
        self.copies: set[str] = set()

    # -- header and setup -------------------------------------------------------------------

    def header(self, target: str) -> list[str]:
        from kvcheck import __version__

        rep, spec = self.rep, self.spec
        lines = [
            f"# Reproduction written by kvcheck {__version__} for target {target!r}.",
            "#",
            f"# Pool: {_describe_spec(spec)}",
            f"# Calls: {len(rep.ops)}, made in order below; the expected results come from",
            "# kvcheck's reference model (kvcheck.reference.ReferencePool).",
        ]
        if rep.test:
            lines += _comment(f"Test: {rep.test}")
        if rep.check:
            lines += _comment(f"Check: {rep.check}")
        if rep.note:
            lines += ["# kvcheck reported:", *_comment(rep.note, "#   ")]
        lines += [
            "#",
            "# Run: python <this file>, from any directory",
            f"# Needs: {self.recipe.needs}.",
            "# Exit status:",
            f'#   {SCRIPT_OK}  "OK: no discrepancy": the pool behaves (fixed);',
            f'#   {SCRIPT_REPRODUCED}  "REPRODUCED: ..." naming the first discrepancy;',
            f'#   {SCRIPT_CANNOT_RUN}  "CANNOT RUN: ...": an import, the setup or building the '
            "pool failed,",
            "#      so the checks never ran (not a reproduction).",
        ]
        return lines

    def imports(self) -> list[str]:
        """The imports and the target's setup, each failure a ``cannot_run``."""
        recipe = self.recipe
        names = sorted({"math", "sys", "traceback", "types", *recipe.modules})
        lines = [*(f"import {name}" for name in names), ""]
        guarded = ["import torch", "", *recipe.imports]
        if self.import_root is not None:
            lines.append("# Where kvcheck imported the target's module from.")
            lines += [f"TARGET_IMPORT_ROOT = {self.import_root!r}", ""]
            # After the other imports (kvcheck's own among them), so that a folder named
            # like an installed package there cannot shadow it.
            guarded += [
                "if TARGET_IMPORT_ROOT not in sys.path:",
                "    sys.path.insert(0, TARGET_IMPORT_ROOT)",
            ]
        guarded += recipe.target_imports
        lines += ["", *SCRIPT_PRELUDE.strip("\n").splitlines(), "", ""]
        lines += [
            "try:",
            *_indented(guarded),
            "except Exception as exc:  # an import error, or whatever the module raised importing",
            '    cannot_run(f"importing failed with {type(exc).__name__}: {exc}")',
        ]
        if recipe.setup:
            lines += [
                "",
                "try:",
                *_indented(recipe.setup.splitlines()),
                "except Exception as exc:",
                '    cannot_run(f"the target\'s setup failed with {type(exc).__name__}: {exc}")',
            ]
        return lines

    def build_pool(self) -> list[str]:
        """The lines building the pool; if that raises, the script cannot run."""
        return [
            "try:",
            *_indented(self.recipe.build),
            "except Exception as exc:  # kvcheck built this pool: not the discrepancy reported",
            '    cannot_run(f"building the pool raised {type(exc).__name__}: {exc}")',
        ]

    # -- operations -------------------------------------------------------------------------

    def op_lines(self) -> list[str]:
        lines: list[str] = []
        failing = self.rep.failing_index
        for index, op in enumerate(self.rep.ops):
            error = self.reference.expected_error(op)
            marker = "  <- kvcheck saw the failure here" if index == failing else ""
            verdict = f"must raise {error.__name__}" if error is not None else "accepted"
            lines.append(f"# call {index + 1} of {len(self.rep.ops)} ({verdict}){marker}")
            lines += self._call_lines(op, error)
            lines.append("")
            if error is None:
                self.reference.apply(op)
        return lines

    def _call_lines(self, op: Op, error: type[Exception] | None) -> list[str]:
        """The call ``op`` stands for (:func:`kvcheck.calls.plan_call`, the encoder the
        machines use), as the lines preparing its tensors and the checked call."""
        plan = plan_call(self.spec, op)
        missing = [
            arg.value.name
            for arg in plan.args
            if isinstance(arg.value, HostCopyRef) and arg.value.name not in self.copies
        ]
        if missing:
            return [
                f"# {plan.pool_method} of copy {missing[0]!r}, which was never taken: "
                "nothing to call"
            ]
        lines, args = _bound_arguments(plan)
        method = f"pool.{plan.method}"
        if plan.via_target:
            # How the script reaches a target's method: the recipe's (a pool method, or the
            # target's own, which takes the pool first).
            if plan.method == "write_index_k":
                method = self.recipe.index_k_write
            else:
                method = f"target.{plan.method}"
            if not method.startswith("pool."):
                args = ["pool", *args]
        raises = "" if error is None else f", raises={_exception_name(error)}"
        text = f"call({_label(plan)!r}, {method}, {', '.join(args)}{raises})"
        if plan.keeps is not None and error is None:
            self.copies.add(plan.keeps)
            text = f"copies[{plan.keeps!r}] = {text}"
        return [*lines, text]

    # -- the expected end state -------------------------------------------------------------

    def expected(self) -> list[str]:
        buffers = self.reference.expected_buffers()
        lines = [
            f"LAYER_IDS = {list(self.spec.layer_ids)!r}",
            "# Expected bytes of each buffer, one ((rows, bytes per row), {row: runs}) per layer:",
            '# a run "offset:hex" gives the bytes from that offset; every other byte is zero.',
            "EXPECTED = {",
        ]
        checked = dict(buffers)
        if self.spec.compress_tails:
            # The pool's per-request compress tails (keys, then scores), under SGLang's names.
            tails = [self.reference.expected_compress_tails(i) for i in self.spec.layer_ids]
            for part, name in enumerate(COMPRESS_TAIL_BUFFERS):
                checked[name] = [pair[part] for pair in tails]
        for name, layers in checked.items():
            lines.append(f'    "{name}": [')
            lines += [_expected_layer(layer, "        ") for layer in layers]
            lines.append("    ],")
        lines.append("}")
        lines += self._reads(buffers)
        return lines

    def _reads(self, buffers: Mapping[str, list[np.ndarray]]) -> list[str]:
        """The read APIs and the expected bytes they return (views of the raw buffers)."""
        spec = self.spec
        if spec.family in ("mha", "noop"):
            return [
                'READS = {"get_key_buffer": EXPECTED["k_buffer"], '
                '"get_value_buffer": EXPECTED["v_buffer"]}'
            ]
        width = spec.kv_lora_rank * spec.itemsize
        values = [layer[:, :width] for layer in buffers["kv_buffer"]]
        lines = [
            "READS = {",
            '    "get_key_buffer": EXPECTED["kv_buffer"],',
            f"    # the first kv_lora_rank={spec.kv_lora_rank} values of each latent row",
            '    "get_value_buffer": [',
            *[_expected_layer(layer, "        ") for layer in values],
            "    ],",
        ]
        if spec.family == "dsa":
            lines.append(
                '    "get_index_k_with_scale_buffer": EXPECTED["index_k_with_scale_buffer"],'
            )
        return [*lines, "}"]


def _changed_fields(spec: PoolSpec) -> list[str]:
    """``name=value`` for each field of ``spec`` that differs from its default."""
    return [
        f"{f.name}={getattr(spec, f.name)!r}"
        for f in dataclasses.fields(spec)
        if getattr(spec, f.name) != f.default
    ]


def _describe_spec(spec: PoolSpec) -> str:
    shown = [field for field in _changed_fields(spec) if not field.startswith("family=")]
    return f"{spec.family} ({', '.join(shown)})"


def render_script(data: Mapping[str, Any], *, target: str, import_root: str | None = None) -> str:
    """The standalone script that replays ``data`` (:func:`reproduction_to_json`'s output,
    or a tier failure's: :func:`kvcheck.runner.tier_scripts.render_tier_script` renders
    data whose ``kind`` is ``"allocator"`` or ``"host_pool"``).

    ``target`` is the target name given to kvcheck: a built-in one, or ``"module:attr"``.
    The pool is built as the target's ``script_recipe`` says (kvcheck's: its pool class
    from ``kvcheck.pools``; sglang's: torch and sglang only, with kvcheck's CPU stand-ins
    written out); a target without one is imported and its ``make_pool(PoolSpec(...),
    device="cpu")`` called. ``import_root`` (:func:`import_root` finds it) is the directory
    a ``module:attr`` target's module was imported from: the script puts it on ``sys.path``,
    so it runs from any directory. Raises ``ValueError`` for any other form of ``target``.

    Example:
        >>> from kvcheck.failures import Reproduction, reproduction_to_json
        >>> from kvcheck.specs import Move, PoolSpec
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> data = reproduction_to_json(Reproduction(spec, (Move((1,), (2,)),)))
        >>> "import mypkg.targets" in render_script(data, target="mypkg.targets:Mine")
        True
        >>> render_script(data, target="nonsense")
        Traceback (most recent call last):
        ...
        ValueError: target='nonsense': expected a built-in target (kvcheck, sglang) or 'module:attr'
    """
    name = _checked_target_name(target)
    if isinstance(data, Mapping) and data.get("kind") in TIER_KINDS:
        from kvcheck.runner.tier_scripts import render_tier_script

        return render_tier_script(data, target=name, import_root=import_root)
    rep = reproduction_from_json(data)
    if import_root is not None and not isinstance(import_root, str):
        raise ValueError(f"import_root={import_root!r} is not a str")
    writer = _ScriptWriter(rep, _recipe(name, rep), import_root=import_root)
    head = "\n".join(writer.header(name))
    setup = "\n".join(writer.imports())
    body = [
        "# --- the pool and the calls " + "-" * 60,
        *writer.build_pool(),
        "copies = {}  # host copies by name",
        "",
        *writer.op_lines(),
        *writer.expected(),
        "",
        "check_pool(pool)",
        'print("OK: no discrepancy")',
    ]
    blocks = [setup, _HELPERS.strip("\n"), "\n".join(body)]
    return head + "\n\n" + "\n\n\n".join(blocks) + "\n"


def script_name(test: str, used: set[str] | None = None) -> str:
    """``repro_<test name and parameters>.py`` for test id ``test``; unique among ``used``,
    which it joins.

    Example:
        >>> script_name("kvcheck/suite/test_pool_machines.py::test_mha[cpu]")
        'repro_test_mha_cpu.py'
        >>> used = {"repro_test_mha_cpu.py"}
        >>> script_name("other/test_pool_machines.py::test_mha[cpu]", used)
        'repro_test_mha_cpu_2.py'
    """
    short = test.rpartition("::")[2] or test
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", short).strip("_")[:80] or "failure"
    name, number = f"repro_{stem}.py", 2
    while used is not None and name in used:
        name, number = f"repro_{stem}_{number}.py", number + 1
    if used is not None:
        used.add(name)
    return name


def import_root(module: str) -> str | None:
    """The ``sys.path`` entry the already imported ``module`` (a dotted name) came from:
    the directory that holds its top-level package. ``None`` when it is not imported or
    has no file (a namespace package).

    Example:
        >>> from pathlib import Path
        >>> Path(import_root("kvcheck.runner.repro")) == Path(__file__).parents[2]
        True
    """

    origin = getattr(getattr(sys.modules.get(module), "__spec__", None), "origin", None)
    if not isinstance(origin, str) or not Path(origin).is_file():
        return None
    path = Path(origin).absolute()
    depth = module.count(".") + (path.stem == "__init__")
    return str(path.parents[depth])


def write_script(
    data: Mapping[str, Any],
    *,
    target: str,
    directory: str | Path,
    test: str = "",
    import_root: str | None = None,
) -> Path:
    """Render ``data`` for ``target`` into ``directory`` (created if missing); return the path.

    The file is named by :func:`script_name` from ``test`` (else from ``data["test"]``);
    ``import_root`` is :func:`render_script`'s.

    Example:
        >>> import tempfile
        >>> from kvcheck.failures import Reproduction, reproduction_to_json
        >>> from kvcheck.specs import Move, PoolSpec
        >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="float16")
        >>> data = reproduction_to_json(Reproduction(spec, (Move((1,), (2,)),), test="t::x"))
        >>> write_script(data, target="kvcheck", directory=tempfile.mkdtemp()).name
        'repro_x.py'
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    out = path / script_name(test or str(data.get("test", "")))
    out.write_text(render_script(data, target=target, import_root=import_root), encoding="utf-8")
    return out
