"""How often one run calls each cell of the pool surface: variant x method x argument.

As variants multiply, a shared run spreads its examples over more of them, and a variant
can end up called a handful of times while the run still passes. This module counts what
the suite really hands each pool: for every pool a target builds, it wraps the pool's
surface methods (:data:`SURFACE_ARGUMENTS`, docs/checks.md's table "The surface it calls")
so that each call the suite makes adds one to the cell (variant, method, ``(call)``) and one to
(variant, method, argument) for each counted argument it passes other than ``None``. Calls
a pool makes on itself (sglang's ``get_kv_buffer`` calling ``get_key_buffer``) are not
counted: only the outermost call on a pool is. A cell is *offered* when a pool built in the
run has the method (and, for an argument, a parameter of that name), so a cell the run never
calls is listed with 0 rather than missing.

A developer tool, run from a clone's root (kvcheck installed, ``pip install -e .``)::

    python tools/call_counts.py --out calls.md [--floor N] [-- PYTEST_ARGS]

runs the shipped suite (``python -m pytest --pyargs kvcheck.suite PYTEST_ARGS``) with this
module as a pytest plugin (``-p tools.call_counts --call-counts-dir DIR``: each pytest
process, xdist workers included, writes its counts to DIR), merges the processes' counts and
writes the table to ``--out``; ``--floor N`` exits 1 when an offered cell is called fewer
than N times, except the cells :data:`NOT_CALLED` explains. Exit status: pytest's when it
is not 0 (1: a test failed; the counts are still written), else 1 below the floor, else 0.

Example:
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> target = resolve_target("kvcheck")
    >>> counter = CallCounter()
    >>> counter.install(target)
    >>> spec = PoolSpec(family="mha", size=4, page_size=1, layer_num=1, dtype="bfloat16")
    >>> pool = target.make_pool(spec, device="cpu")
    >>> _ = pool.get_key_buffer(0)
    >>> counts = counter.counts()
    >>> counts.calls("mha", "get_key_buffer", "layer_id"), counts.calls("mha", "move_kv_cache")
    (1, 0)
    >>> counter.uninstall(target)
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvcheck.variants import variants_of

__all__ = [
    "CALL",
    "NOT_CALLED",
    "SURFACE_ARGUMENTS",
    "CallCounter",
    "CallCounts",
    "Cell",
    "main",
]

#: The clone's root: on the pytest processes' path, so that ``-p tools.call_counts`` imports.
_ROOT = Path(__file__).resolve().parents[1]
#: The pytest option (this module as a plugin) naming the folder each process writes to.
_DIR_OPTION = "--call-counts-dir"

#: The argument column of the cell that counts every call of a method.
CALL = "(call)"

#: Pool method -> the arguments whose passing is counted: what SGLang's callers pass
#: (docs/checks.md's surface table). A method a pool lacks, or an argument its signature
#: lacks, is not a cell of that pool's variant.
SURFACE_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "set_kv_buffer": (
        "layer",
        "loc",
        "cache_k",
        "cache_v",
        "k_scale",
        "v_scale",
        "layer_id_override",
    ),
    "set_mla_kv_buffer": ("layer", "loc", "cache_k_nope", "cache_k_rope", "layer_id_override"),
    "get_mla_kv_buffer": ("layer", "loc"),
    "set_kv_buffer_prefix_valid": ("layer", "loc_2d", "commit_lens", "cache_k", "cache_v"),
    "set_index_k_scale_buffer": ("layer_id", "loc", "index_k", "index_k_scale"),
    "set_compress_tail_for_request": (
        "layer_id",
        "req_pool_idx",
        "key_tail",
        "score_tail",
        "n_remain",
        "dst_logical_start",
    ),
    "get_compress_tail_buffers": ("layer_id",),
    "get_compress_tail_buf_infos": (),
    "move_kv_cache": ("tgt_loc", "src_loc"),
    "get_cpu_copy": ("indices", "req_pool_index"),
    "load_cpu_copy": ("kv_cache_cpu", "indices", "req_pool_index"),
    "get_key_buffer": ("layer_id",),
    "get_value_buffer": ("layer_id",),
    "get_kv_buffer": ("layer_id",),
    "get_index_k_with_scale_buffer": ("layer_id",),
    "get_index_k_scale_buffer": ("layer_id", "seq_len_tensor", "page_indices"),
    "get_kv_size_bytes": (),
    "get_state_buf_infos": (),
    "get_contiguous_buf_infos": (),
}

#: The DSA variants without an index kpool, hence without compress tails.
_TAILLESS_DSA = tuple(v.name for v in variants_of("dsa") if v.axis_values["index_kpool"] == (1,))
#: The DSA variants with scaled latent rows (each a pattern of itself).
_SCALED_DSA = tuple(
    v.name for v in variants_of("dsa") if "scaled" in v.axis_values["latent_layout"]
)

#: (variant pattern, method, argument) -> why the suite does not call that cell; the
#: pattern is an ``fnmatch`` pattern over :attr:`kvcheck.specs.PoolSpec.variant`. Such a
#: cell is reported with its reason and is exempt from the floor.
NOT_CALLED: Mapping[tuple[str, str, str], str] = {
    **{
        (pattern, "set_kv_buffer", "cache_v"): "a latent pool stores cache_k's row and never "
        "reads cache_v (sglang 0.5.23 MLATokenToKVPool.set_kv_buffer); the suite passes None"
        for pattern in ("mla*", "dsa*")
    },
    **{
        (pattern, method, argument): "only a DSA pool with an index kpool keeps compress "
        "tails (kpool_use_compress): this pool has no tail to write or read"
        for pattern in _TAILLESS_DSA
        for method in ("set_compress_tail_for_request", "get_compress_tail_buffers")
        for argument in (CALL, *SURFACE_ARGUMENTS[method])
    },
    **{
        (pattern, method, "req_pool_index"): "only a DSA pool with an index kpool keeps "
        "compress tails; a host copy's req_pool_index names the request whose tails travel"
        for pattern in _TAILLESS_DSA
        for method in ("get_cpu_copy", "load_cpu_copy")
    },
    **{
        (pattern, "set_kv_buffer", argument): "a scaled latent row is written only "
        "from its bf16 parts, through set_mla_kv_buffer (sglang 0.5.23 "
        "MLATokenToKVPool.set_kv_buffer asserts not dsa_kv_cache_store_fp8); the suite "
        "calls set_kv_buffer on it only as a bad call"
        for pattern in _SCALED_DSA
        for argument in (CALL, *SURFACE_ARGUMENTS["set_kv_buffer"])
    },
    **{
        (pattern, "get_mla_kv_buffer", argument): "a scaled latent row (fp8 nope blocks "
        "with their fp32 scales, bf16 rope) is not values of one dtype, so get_mla_kv_buffer's "
        "output has no bytes to compare; the raw-layout variants read it"
        for pattern in _SCALED_DSA
        for argument in (CALL, *SURFACE_ARGUMENTS["get_mla_kv_buffer"])
    },
}


@dataclass(frozen=True, order=True)
class Cell:
    """One cell: a variant (:attr:`kvcheck.specs.PoolSpec.variant`), a method, an argument
    (:data:`CALL` for the call itself)."""

    variant: str
    method: str
    argument: str = CALL

    def reason_not_called(self) -> str | None:
        """Why the suite does not call this cell (:data:`NOT_CALLED`), or None."""
        for (pattern, method, argument), reason in NOT_CALLED.items():
            if (method, argument) == (self.method, self.argument) and fnmatch.fnmatchcase(
                self.variant, pattern
            ):
                return reason
        return None


@dataclass
class CallCounts:
    """Calls per offered cell, merged over the processes of a run.

    Example:
        >>> counts = CallCounts({Cell("mla", "move_kv_cache"): 3, Cell("mla", "get_cpu_copy"): 0})
        >>> counts.calls("mla", "move_kv_cache"), [str(c.method) for c in counts.below(1)]
        (3, ['get_cpu_copy'])
    """

    cells: dict[Cell, int] = field(default_factory=dict)

    def calls(self, variant: str, method: str, argument: str = CALL) -> int:
        """Calls of one cell (0 when not offered)."""
        return self.cells.get(Cell(variant, method, argument), 0)

    def below(self, floor: int) -> list[Cell]:
        """Offered cells called fewer than ``floor`` times, except those :data:`NOT_CALLED`
        explains, in table order."""
        return sorted(
            cell
            for cell, calls in self.cells.items()
            if calls < floor and cell.reason_not_called() is None
        )

    def merge(self, other: CallCounts) -> CallCounts:
        """Both runs' counts summed cell by cell (a cell offered by either is offered)."""
        merged = dict(self.cells)
        for cell, calls in other.cells.items():
            merged[cell] = merged.get(cell, 0) + calls
        return CallCounts(merged)

    def to_json(self) -> list[list[Any]]:
        """One ``[variant, method, argument, calls]`` row per cell (:meth:`from_json`)."""
        return [[c.variant, c.method, c.argument, n] for c, n in sorted(self.cells.items())]

    @classmethod
    def from_json(cls, rows: Iterable[Any]) -> CallCounts:
        """The counts :meth:`to_json` wrote."""
        cells: dict[Cell, int] = {}
        for row in rows:
            variant, method, argument, calls = row
            cells[Cell(str(variant), str(method), str(argument))] = int(calls)
        return cls(cells)

    @classmethod
    def read_folder(cls, folder: Path) -> CallCounts:
        """The merged counts of every process's file in ``folder``."""
        merged = cls()
        for path in sorted(folder.glob("calls-*.json")):
            merged = merged.merge(cls.from_json(json.loads(path.read_text())))
        return merged

    def summary(self, *, floor: int | None = None) -> str:
        """One line: cells, variants, and the cells below ``floor`` (or the least called).

        Example:
            >>> move = "move_kv_cache"
            >>> counts = CallCounts({Cell("mla", move): 3, Cell("mha", move): 40})
            >>> counts.summary(floor=20)
            '2 cells of 2 variants; 1 below 20'
            >>> counts.summary()
            '2 cells of 2 variants; least called: mla move_kv_cache (call) 3'
        """
        if not self.cells:
            return "no pool was built, so nothing was counted"
        variants = {cell.variant for cell in self.cells}
        exempt = sum(1 for cell in self.cells if cell.reason_not_called() is not None)
        head = f"{len(self.cells)} cells of {len(variants)} variants"
        if exempt:
            head += f" ({exempt} not called by design)"
        if floor is not None:
            return f"{head}; {len(self.below(floor))} below {floor}"
        counted = [c for c in self.cells if c.reason_not_called() is None] or list(self.cells)
        least = min(counted, key=lambda cell: (self.cells[cell], cell))
        return (
            f"{head}; least called: {least.variant} {least.method} {least.argument} "
            f"{self.cells[least]}"
        )

    def report(self, *, floor: int | None = None) -> str:
        """The markdown report ``python tools/call_counts.py`` writes: the summary line,
        what a cell is, and the table (its last column gives the reason for each cell not
        called by design)."""
        return "\n".join(
            [
                "# Calls per surface cell (python tools/call_counts.py)",
                "",
                self.summary(floor=floor) + ".",
                "",
                "A cell is a pool variant, a method of docs/checks.md's surface table, and an "
                f"argument passed (not None), or `{CALL}` for every call of the method; only "
                "the suite's own calls on a pool count, not those a pool makes on itself.",
                "",
                self.table(floor=floor),
            ]
        )

    def table(self, *, floor: int | None = None) -> str:
        """A markdown table, one row per cell; the last column flags a cell below ``floor``
        or gives the reason it is not called.

        Example:
            >>> print(CallCounts({Cell("mha", "get_key_buffer", "layer_id"): 2}).table(floor=20))
            | variant | method | argument | calls | |
            |---|---|---|---:|---|
            | mha | get_key_buffer | layer_id | 2 | below 20 |
        """
        lines = ["| variant | method | argument | calls | |", "|---|---|---|---:|---|"]
        for cell, calls in sorted(self.cells.items()):
            note = cell.reason_not_called() or (
                f"below {floor}" if floor is not None and calls < floor else ""
            )
            lines.append(f"| {cell.variant} | {cell.method} | {cell.argument} | {calls} | {note} |")
        return "\n".join(lines)


def _call_signature(method: Any) -> inspect.Signature | None:
    """The parameters a call of ``method`` binds to. A wrapper a target set on the pool
    object (``functools.wraps`` of the class's function) reports the function's ``self``,
    which the caller does not pass: it is dropped."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if not inspect.ismethod(method) and parameters and parameters[0].name == "self":
        return signature.replace(parameters=parameters[1:])
    return signature


class CallCounter:
    """Counts the suite's calls on the pools a target builds (see the module docstring).

    :meth:`install` wraps the target's ``make_pool`` on the target object; every pool it
    returns has its surface methods wrapped on the pool object. :meth:`uninstall` puts the
    target's own ``make_pool`` back (pools already built keep counting).
    """

    def __init__(self) -> None:
        self._cells: Counter[Cell] = Counter()
        self._offered: set[Cell] = set()
        self._depth = threading.local()

    def install(self, target: Any) -> None:
        """Count the calls on every pool ``target.make_pool`` builds from now on."""
        make_pool = target.make_pool

        @functools.wraps(make_pool)
        def counted_make_pool(spec: Any, *args: Any, **kwargs: Any) -> Any:
            pool = make_pool(spec, *args, **kwargs)
            self.watch(pool, spec.variant)
            return pool

        target.make_pool = counted_make_pool

    def uninstall(self, target: Any) -> None:
        """Stop wrapping ``target``'s new pools."""
        if "make_pool" in vars(target):
            del target.make_pool

    def watch(self, pool: Any, variant: str) -> None:
        """Count the calls of ``pool``'s surface methods under ``variant``."""
        for method, arguments in SURFACE_ARGUMENTS.items():
            bound = getattr(pool, method, None)
            if not callable(bound):
                continue
            signature = _call_signature(bound)
            named = set() if signature is None else set(signature.parameters)
            counted = tuple(argument for argument in arguments if argument in named)
            self._offered.add(Cell(variant, method, CALL))
            self._offered.update(Cell(variant, method, argument) for argument in counted)
            wrapper = self._wrap(bound, variant, method, signature, counted)
            try:
                setattr(pool, method, wrapper)
            except (AttributeError, TypeError):  # a pool with slots: it stays uncounted
                self._offered.difference_update(Cell(variant, method, a) for a in (CALL, *counted))

    def _wrap(
        self,
        bound: Any,
        variant: str,
        method: str,
        signature: inspect.Signature | None,
        counted: tuple[str, ...],
    ) -> Any:
        @functools.wraps(bound)
        def counting(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "value", 0)
            if depth == 0:
                self._record(variant, method, signature, counted, args, kwargs)
            self._depth.value = depth + 1
            try:
                return bound(*args, **kwargs)
            finally:
                self._depth.value = depth

        return counting

    def _record(
        self,
        variant: str,
        method: str,
        signature: inspect.Signature | None,
        counted: tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._cells[Cell(variant, method, CALL)] += 1
        if signature is None or not counted:
            return
        try:
            passed = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # a bad call the suite makes on purpose: its arguments do not bind
            return
        for argument in counted:
            if passed.get(argument) is not None:
                self._cells[Cell(variant, method, argument)] += 1

    def counts(self) -> CallCounts:
        """Calls per offered cell so far."""
        return CallCounts({cell: self._cells.get(cell, 0) for cell in self._offered})

    def write(self, folder: Path, name: str) -> Path | None:
        """Write the counts to ``folder/calls-<name>.json`` (nothing when no pool was built)."""
        if not self._offered:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"calls-{name}.json"
        path.write_text(json.dumps(self.counts().to_json()))
        return path


# --- the pytest plugin (-p tools.call_counts) ------------------------------------------------

_COUNTER = pytest.StashKey[CallCounter]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        _DIR_OPTION,
        default=None,
        metavar="DIR",
        help="count the calls on every pool the kvcheck target builds, per variant x method "
        "x argument, and write each process's counts to DIR (tools/call_counts.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("call_counts_dir"):
        config.stash[_COUNTER] = CallCounter()


@pytest.fixture(scope="session", autouse=True)
def _count_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before the first test of this process, wrap the target's ``make_pool``."""
    counter = request.config.stash.get(_COUNTER, None)
    if counter is None:
        yield
        return
    target = request.getfixturevalue("kvcheck_target")
    counter.install(target)
    yield
    counter.uninstall(target)


def pytest_sessionfinish(session: pytest.Session) -> None:
    counter = session.config.stash.get(_COUNTER, None)
    if counter is not None:
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        counter.write(Path(session.config.getoption("call_counts_dir")), worker)


# --- the command ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/call_counts.py",
        description="Run kvcheck's shipped suite and count its calls per variant x method x "
        "argument of docs/checks.md's surface table.",
        epilog="Arguments after -- go to pytest (e.g. -n auto --hypothesis-seed=0 "
        "--kvcheck-target=sglang).",
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the markdown table")
    parser.add_argument(
        "--floor",
        type=int,
        default=None,
        metavar="N",
        help="exit 1 when a cell is called fewer than N times (cells the suite does not call "
        "by design are listed with their reason instead)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command (see the module docstring); return its exit status.

    Example (the error goes to stderr):
        >>> main(["--out", "calls.md", "--floor", "0"])
        2
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, pytest_args = arguments[:split], arguments[split + 1 :]
    options = _parser().parse_args(arguments)
    out = Path(options.out)
    problem = None
    if options.floor is not None and options.floor < 1:
        problem = f"--floor={options.floor}: give a number of calls >= 1"
    elif out.is_dir() or not out.resolve().parent.is_dir():
        problem = f"--out={options.out}: not a file in an existing directory"
    if problem:
        print(f"call_counts: error: {problem}", file=sys.stderr)
        return 2
    path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="kvcheck-call-counts-") as folder:
        command = [sys.executable, "-m", "pytest", "--pyargs", "kvcheck.suite", "-q"]
        command += ["-p", "no:cacheprovider", "-p", "tools.call_counts", f"{_DIR_OPTION}={folder}"]
        status = subprocess.run(
            [*command, *pytest_args], check=False, env={**os.environ, "PYTHONPATH": path}
        ).returncode
        counts = CallCounts.read_folder(Path(folder))
    if status not in (0, 1):
        print(f"call_counts: pytest exited {status}: the suite did not run", file=sys.stderr)
        return status
    out.write_text(counts.report(floor=options.floor) + "\n")
    print(f"call_counts: {counts.summary(floor=options.floor)}; table in {out}")
    below = [] if options.floor is None else counts.below(options.floor)
    for cell in below[:10]:
        print(
            f"  below {options.floor}: {cell.variant} {cell.method} {cell.argument}: "
            f"{counts.cells[cell]}"
        )
    if len(below) > 10:
        print(f"  ... and {len(below) - 10} more (see the table)")
    return max(status, 1) if below else status


if __name__ == "__main__":
    sys.exit(main())
