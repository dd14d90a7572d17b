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
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvcheck.calls import request_kwargs
from kvcheck.failures import Reproduction, reproduction_from_json
from kvcheck.geometry import COMPRESS_TAIL_BUFFERS, latent_width
from kvcheck.reference import ReferencePool
from kvcheck.specs import (
    DSA_QUANT_BLOCK,
    DTYPE_ITEMSIZE,
    HostCopy,
    HostReload,
    Move,
    Op,
    Payload,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)
from kvcheck.targets import BUILTIN_TARGETS, TargetError, resolve_target
from kvcheck.targets.base import ScriptRecipe

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


def _rows_expr(dtype: str, inner: Sequence[int], rows: Sequence[bytes], indent: str) -> str:
    itemsize = DTYPE_ITEMSIZE.get(dtype, 1)
    if rows and any(len(row) != itemsize * int(np.prod(inner)) for row in rows):
        # Rows of the wrong size are part of the call (the pool must refuse them).
        inner = (*inner[:-1], -1)
    shape = "(" + ", ".join(str(n) for n in inner) + ("," if len(inner) == 1 else "") + ")"
    if not rows:
        return f"rows(torch.{dtype}, {shape})"
    if len(rows) == 1 and len(rows[0]) <= 24:
        return f"rows(torch.{dtype}, {shape}, {_wrapped(rows[0].hex(), indent)})"
    items = "".join(f"\n{indent}    {_wrapped(row.hex(), indent + '    ')}," for row in rows)
    return f"rows(torch.{dtype}, {shape},{items}\n{indent})"


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

_PRELUDE = '''
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
        lines += ["", *_PRELUDE.strip("\n").splitlines(), "", ""]
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
        raises = "" if error is None else f", raises={_exception_name(error)}"
        if isinstance(op, HostReload) and op.name not in self.reference._host_copies:
            return [f"# load_cpu_copy of copy {op.name!r}, which was never taken: nothing to call"]
        prep, label, method, args = self._call_parts(op)
        text = f"call({label!r}, {method}, {', '.join(args)}{raises})"
        if isinstance(op, HostCopy):
            text = f"copies[{op.name!r}] = {text}"
        return [*prep, text]

    def _call_parts(self, op: Op) -> tuple[list[str], str, str, list[str]]:
        """Lines preparing tensors, the label, the bound method and its arguments."""
        if isinstance(op, WriteKV):
            return self._write_kv(op)
        if isinstance(op, WriteMLA):
            spec = self.spec
            dtype = spec.dtype if op.dtype is None else op.dtype  # bf16 for scaled rows
            prep = [
                f"loc = {_locs(op.locs)}",
                f"cache_k_nope = {_rows_expr(dtype, (1, spec.kv_lora_rank), op.nope_rows, '')}",
                f"cache_k_rope = {_rows_expr(dtype, (1, spec.qk_rope_head_dim), op.rope_rows, '')}",
            ]
            label = f"set_mla_kv_buffer(layer_id={op.layer_id}, loc={_list(op.locs)})"
            args = [f"layer({op.layer_id})", "loc", "cache_k_nope", "cache_k_rope"]
            return prep, label, "pool.set_mla_kv_buffer", args
        if isinstance(op, WritePrefixValid):
            heads, spec = self.spec.head_num, self.spec
            grid = [list(row) for row in op.loc_grid]
            prep = [
                f"loc_2d = torch.tensor({grid!r}, dtype=torch.int64)",
                f"commit_lens = torch.tensor({list(op.commit_lens)!r}, dtype=torch.int32)",
                f"cache_k = {_rows_expr(spec.dtype, (heads, spec.head_dim), op.k_rows, '')}",
                "cache_v = "
                f"{_rows_expr(spec.dtype, (heads, spec.effective_v_head_dim), op.v_rows, '')}",
            ]
            label = (
                f"set_kv_buffer_prefix_valid(layer_id={op.layer_id}, loc_2d={grid}, "
                f"commit_lens={list(op.commit_lens)})"
            )
            args = [f"layer({op.layer_id})", "loc_2d", "commit_lens", "cache_k", "cache_v"]
            return prep, label, "pool.set_kv_buffer_prefix_valid", args
        if isinstance(op, WriteIndexK):
            dim = self.spec.index_head_dim
            prep = [
                f"loc = {_locs(op.locs)}",
                f"index_k = {_rows_expr('float8_e4m3fn', (dim,), op.key_rows, '')}",
                "index_k_scale = "
                f"{_rows_expr('float32', (dim // DSA_QUANT_BLOCK,), op.scale_rows, '')}",
            ]
            label = f"set_index_k_scale_buffer(layer_id={op.layer_id}, loc={_list(op.locs)})"
            args = [str(op.layer_id), "loc", "index_k", "index_k_scale"]
            write = self.recipe.index_k_write
            if not write.startswith("pool."):
                args = ["pool", *args]  # a target's write_index_k takes the pool first
            return prep, label, write, args
        if isinstance(op, WriteCompressTail):
            dim = self.spec.index_head_dim
            prep = [
                f"key_tail = {_rows_expr('bfloat16', (dim,), op.key_rows, '')}",
                f"score_tail = {_rows_expr('bfloat16', (dim,), op.score_rows, '')}",
            ]
            label = (
                f"set_compress_tail_for_request(layer_id={op.layer_id}, "
                f"req_pool_idx={op.req_pool_idx}, n_remain={len(op.key_rows)}, "
                f"dst_logical_start={op.start})"
            )
            args = [
                str(op.layer_id),
                str(op.req_pool_idx),
                "key_tail",
                "score_tail",
                str(len(op.key_rows)),
                str(op.start),
            ]
            return prep, label, "pool.set_compress_tail_for_request", args
        if isinstance(op, Move):
            label = f"move_kv_cache(tgt_loc={_list(op.tgt)}, src_loc={_list(op.src)})"
            return [], label, "pool.move_kv_cache", [_locs(op.tgt), _locs(op.src)]
        if isinstance(op, HostCopy | HostReload):
            request = [f"{name}={value}" for name, value in request_kwargs(op)]
            shown = "".join(f", {argument}" for argument in request)
            if isinstance(op, HostCopy):
                label = f"get_cpu_copy(indices={_list(op.indices)}{shown})"
                return [], label, "pool.get_cpu_copy", [_locs(op.indices), *request]
            label = f"load_cpu_copy(copies[{op.name!r}], indices={_list(op.indices)}{shown})"
            args = [f"copies[{op.name!r}]", _locs(op.indices), *request]
            return [], label, "pool.load_cpu_copy", args
        raise ValueError(f"op={op!r} is not an operation from kvcheck.specs")

    def _write_kv(self, op: WriteKV) -> tuple[list[str], str, str, list[str]]:
        spec = self.spec
        latent = spec.family in ("mla", "dsa")
        payload: Payload | None = op.payload
        dtype = spec.dtype if payload is None else payload.dtype
        k_rows = op.k_rows if payload is None else payload.k_rows
        v_rows = op.v_rows if payload is None else payload.v_rows
        k_inner = (1, latent_width(spec)) if latent else (spec.head_num, spec.head_dim)
        prep = [f"loc = {_locs(op.locs)}", f"cache_k = {_rows_expr(dtype, k_inner, k_rows, '')}"]
        if latent:
            prep.append("cache_v = None  # the latent row holds both")
        else:
            v_inner = (spec.head_num, spec.effective_v_head_dim)
            prep.append(f"cache_v = {_rows_expr(dtype, v_inner, v_rows, '')}")
        args = [f"layer({op.layer_id})", "loc", "cache_k", "cache_v"]
        scales = ""
        if payload is not None and (payload.k_scale_rows or payload.v_scale_rows):
            # MXFP8's scaled write: the caller's e8m0 block scales, one row per token.
            for name, scale_rows in (("k", payload.k_scale_rows), ("v", payload.v_scale_rows)):
                rows_expr = _rows_expr("float8_e8m0fnu", (spec.head_num, -1), scale_rows, "")
                prep.append(f"{name}_scale = {rows_expr}")
            args += ["k_scale", "v_scale"]
            scales = ", e8m0 k_scale, v_scale"
        elif payload is not None and not latent:  # latent writes take no scales
            for name in ("k_scale", "v_scale"):
                value = getattr(payload, name)
                if value is not None:
                    args.append(f"{name}={value!r}")
                    scales += f", {name}={value!r}"
        label = f"set_kv_buffer(layer_id={op.layer_id}, loc={_list(op.locs)}{scales})"
        return prep, label, "pool.set_kv_buffer", args

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
    """The standalone script that replays ``data`` (:func:`reproduction_to_json`'s output).

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
