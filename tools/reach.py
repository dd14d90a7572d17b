"""Reach: line coverage of a target's pool code under kvcheck's shipped suite.

``python tools/reach.py --target sglang`` runs ``pytest --pyargs kvcheck.suite
--kvcheck-target sglang`` under coverage.py (``coverage run``, ``--shards`` processes
sharing the tests: see :func:`measure`), restricted to the files the target declares, and
prints per class and per method how many executable lines the suite ran; the headline figure
(the share of the declared headline scopes' executable lines that ran); and every unreached
line range with the reason the target's reach table gives for it, or ``UNEXPLAINED``.

What is measured and why a range may stay unreached are data, kept per target beside its
adapter, in the module its ``reach_table`` member names (sglang's:
``kvcheck/targets/sglang/reach.py``): a list of :class:`Scope` and a list of
:class:`Reason`. A reason is keyed by file and qualified method name (a glob) and optionally
a regular expression over the range's source and the header of the block that encloses it,
never by line number, so the table survives reformatting of the target's code.

Exit status: 0; 1 when the headline is below ``--min-percent``, or with ``--strict`` when a
range is unexplained; 2 when the measurement itself failed (pytest could not run the suite,
or no data). Arguments after ``--`` go to pytest
unchanged. ``--save-data FILE`` keeps the coverage data; ``--from-data FILE`` analyzes it
again with an edited reach table; ``--json`` and ``--markdown`` write the report (the
Markdown block is what ``docs/sglang-reach.md`` publishes).

Example, where sglang is installed::

    report = measure("sglang")
    print(format_report(report))  # the headline, per class and method, unreached ranges
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcheck.declaration import Reason, declaration_of
from kvcheck.targets.base import Scope

__all__ = [
    "ClassReach",
    "FileReach",
    "Gap",
    "MethodReach",
    "ReachReport",
    "Reason",
    "Scope",
    "Span",
    "analyze",
    "analyze_data",
    "class_reaches",
    "explain",
    "find_spans",
    "format_map_markdown",
    "format_markdown",
    "format_report",
    "group_gaps",
    "main",
    "measure",
]

UNEXPLAINED = "UNEXPLAINED"
CLASS_BODY = "<class body>"
MODULE_BODY = "<module>"


@dataclass(frozen=True)
class Span:
    """Lines ``start``..``end`` (inclusive, decorators included) of a class or function."""

    qualname: str
    start: int
    end: int
    kind: str  # "class" or "function"


@dataclass(frozen=True)
class MethodReach:
    """Executable lines of one method (or class body, or module body) and how many ran."""

    file: str
    qualname: str
    lines: int
    covered: int

    @property
    def percent(self) -> float:
        """Covered share in percent (100.0 for a method with no executable lines)."""
        return 100.0 * self.covered / self.lines if self.lines else 100.0


@dataclass(frozen=True)
class Gap:
    """A run of unreached executable lines inside one method, with its reason."""

    file: str
    qualname: str
    start: int
    end: int
    lines: int
    reason: str = UNEXPLAINED
    first_line: str = ""

    @property
    def explained(self) -> bool:
        """Whether the reach table gives a reason for this range."""
        return self.reason != UNEXPLAINED


@dataclass(frozen=True)
class FileReach:
    """One measured file's figures: executable lines, lines that ran, and unreached lines
    whose reason needs hardware a CPU host lacks."""

    file: str
    lines: int
    covered: int
    off_cpu: int

    @property
    def percent(self) -> float:
        """Covered share of every executable line, in percent."""
        return 100.0 * self.covered / self.lines if self.lines else 100.0

    @property
    def cpu_percent(self) -> float:
        """Covered share of the lines a CPU host can run (the off-CPU ones left out)."""
        reachable = self.lines - self.off_cpu
        return 100.0 * self.covered / reachable if reachable else 100.0


@dataclass(frozen=True)
class ClassReach:
    """One discovered upstream class: its statements (its whole span, methods and class
    body) and how many ran, and whether the target builds it."""

    file: str
    name: str
    kind: str
    built: bool
    lines: int
    covered: int

    @property
    def percent(self) -> float:
        """Covered share in percent (100.0 for a class with no statements)."""
        return 100.0 * self.covered / self.lines if self.lines else 100.0


@dataclass(frozen=True)
class ReachReport:
    """What one reach measurement found.

    ``methods`` hold every measured method; ``headline_names`` are the qualified top-level
    names (``file:Name``) whose lines make the headline.
    """

    target: str
    methods: tuple[MethodReach, ...]
    gaps: tuple[Gap, ...]
    headline_names: tuple[str, ...]
    headline_lines: int
    headline_covered: int
    pytest_status: int | None = None
    command: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Reasons that say a range needs hardware a CPU host lacks (a GPU, an NPU, pinned
    #: memory): :meth:`by_file` leaves such lines out of what "on CPU" can reach.
    off_cpu_reasons: frozenset[str] = frozenset()
    #: Every file of the table's ``MAP_ROOT`` (``MAP_ASIDE`` aside), not only the scopes:
    #: the map figure (:attr:`map_percent`).
    map_files: tuple[FileReach, ...] = ()
    map_root: str = ""
    map_aside: str = ""
    #: Each pool class the target's discovery finds, with its reach.
    class_reach: tuple[ClassReach, ...] = ()

    @property
    def map_lines(self) -> int:
        """Statements of every mapped file."""
        return sum(item.lines for item in self.map_files)

    @property
    def map_covered(self) -> int:
        """Statements of the mapped files that ran."""
        return sum(item.covered for item in self.map_files)

    @property
    def map_percent(self) -> float:
        """The share of the mapped files' statements that ran, in percent."""
        return 100.0 * self.map_covered / self.map_lines if self.map_lines else 0.0

    def most_unreached(self, count: int = 10) -> list[FileReach]:
        """The ``count`` mapped files with the most statements that did not run.

        Example:
            >>> r = ReachReport("t", (), (), (), 0, 0, map_files=(
            ...     FileReach("a.py", 10, 9, 0), FileReach("b.py", 10, 2, 0)))
            >>> [item.file for item in r.most_unreached(1)], round(r.map_percent, 1)
            (['b.py'], 55.0)
        """
        if count < 1:
            raise ValueError(f"count={count} must be at least 1")
        ranked = sorted(self.map_files, key=lambda item: (item.covered - item.lines, item.file))
        return ranked[:count]

    @property
    def headline_percent(self) -> float:
        """The headline figure in percent."""
        if not self.headline_lines:
            return 0.0
        return 100.0 * self.headline_covered / self.headline_lines

    @property
    def unexplained(self) -> tuple[Gap, ...]:
        """Unreached ranges the reach table gives no reason for."""
        return tuple(gap for gap in self.gaps if not gap.explained)

    def by_class(self) -> dict[tuple[str, str], tuple[int, int]]:
        """``(file, top-level name) -> (lines, covered)`` summed over its methods."""
        totals: dict[tuple[str, str], tuple[int, int]] = {}
        for method in self.methods:
            key = (method.file, method.qualname.split(".")[0])
            lines, covered = totals.get(key, (0, 0))
            totals[key] = (lines + method.lines, covered + method.covered)
        return totals

    def by_file(self) -> dict[str, FileReach]:
        """Per measured file: its executable lines, how many ran, and how many of the
        unreached ones need hardware a CPU host lacks (:attr:`off_cpu_reasons`).

        Example:
            >>> r = ReachReport("t", (MethodReach("p.py", "P.f", 4, 1),),
            ...                 (Gap("p.py", "P.f", 2, 3, 2, "GPU"), Gap("p.py", "P.f", 4, 4, 1)),
            ...                 (), 0, 0, off_cpu_reasons=frozenset({"GPU"}))
            >>> r.by_file()["p.py"].cpu_percent
            50.0
        """
        files: dict[str, FileReach] = {}
        for method in self.methods:
            old = files.get(method.file, FileReach(method.file, 0, 0, 0))
            files[method.file] = dataclasses.replace(
                old, lines=old.lines + method.lines, covered=old.covered + method.covered
            )
        for gap in self.gaps:
            if gap.reason in self.off_cpu_reasons and gap.file in files:
                old = files[gap.file]
                files[gap.file] = dataclasses.replace(old, off_cpu=old.off_cpu + gap.lines)
        return files

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every field plus the derived figures."""
        data = dataclasses.asdict(self)
        data["off_cpu_reasons"] = sorted(self.off_cpu_reasons)
        data["map_percent"] = round(self.map_percent, 2)
        data["map_lines"] = self.map_lines
        data["map_covered"] = self.map_covered
        data["files"] = [
            {**dataclasses.asdict(item), "cpu_percent": round(item.cpu_percent, 2)}
            for item in self.by_file().values()
        ]
        data["headline_percent"] = round(self.headline_percent, 2)
        data["unexplained"] = len(self.unexplained)
        data["classes"] = [
            {"file": f, "name": n, "lines": lines, "covered": covered}
            for (f, n), (lines, covered) in self.by_class().items()
        ]
        return data


# --- source structure -----------------------------------------------------------------------


def find_spans(source: str) -> list[Span]:
    """Top-level classes and functions of ``source``, and each class's methods.

    Nested functions and classes count as part of the method that holds them.

    Example:
        >>> src = "class A:\\n    x = 1\\n    def f(self):\\n        return 1\\n"
        >>> src += "def g():\\n    pass\\n"
        >>> [(s.qualname, s.start, s.end) for s in find_spans(src)]
        [('A', 1, 4), ('A.f', 3, 4), ('g', 5, 6)]
    """
    spans: list[Span] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            spans.append(Span(node.name, _first_line(node), _last_line(node), "class"))
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    spans.append(
                        Span(
                            f"{node.name}.{child.name}",
                            _first_line(child),
                            _last_line(child),
                            "function",
                        )
                    )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append(Span(node.name, _first_line(node), _last_line(node), "function"))
    return spans


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]


def _last_line(node: ast.AST) -> int:
    return int(node.end_lineno or node.lineno)  # type: ignore[attr-defined]


def _owner(line: int, spans: Sequence[Span]) -> str:
    """Qualified name owning ``line``: a method, a class body, a function or the module."""
    best: Span | None = None
    for span in spans:
        if span.start <= line <= span.end and (best is None or span.start >= best.start):
            best = span
    if best is None:
        return MODULE_BODY
    return f"{best.qualname}.{CLASS_BODY}" if best.kind == "class" else best.qualname


def _in_scope(qualname: str, scope: Scope) -> bool:
    if scope.names is None:
        return True
    return any(qualname == name or qualname.startswith(name + ".") for name in scope.names)


def group_gaps(
    file: str, statements: Iterable[int], missing: Iterable[int], spans: Sequence[Span]
) -> list[Gap]:
    """Group ``missing`` statement lines into runs with no executed statement between them.

    A run never crosses from one method into another. Reasons are left ``UNEXPLAINED``.

    Example:
        >>> src = "def f(x):\\n    if x:\\n        a = 1\\n        b = 2\\n    return 3\\n"
        >>> [(g.qualname, g.start, g.end, g.lines)
        ...  for g in group_gaps("m.py", [1, 2, 3, 4, 5], [3, 4], find_spans(src))]
        [('f', 3, 4, 2)]
    """
    missing_set = set(missing)
    gaps: list[Gap] = []
    run: list[int] = []
    run_owner = ""
    for line in sorted(set(statements)):
        owner = _owner(line, spans)
        if line in missing_set and (not run or owner == run_owner):
            run.append(line)
            run_owner = owner
            continue
        if run:
            gaps.append(Gap(file, run_owner, run[0], run[-1], len(run)))
            run = []
        if line in missing_set:  # a new method starts with a missing line
            run, run_owner = [line], owner
    if run:
        gaps.append(Gap(file, run_owner, run[0], run[-1], len(run)))
    return gaps


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _blocks(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """``(body_first, body_last, header_first, header_last)`` for every statement block."""
    blocks = []
    for node in ast.walk(tree):
        # A def or class is not a block header: a range directly in a method body is
        # matched on its own first line, not on the method's signature.
        if not isinstance(node, ast.stmt) or isinstance(node, _DEFINITIONS):
            continue
        body = getattr(node, "body", None)
        header_last = body[0].lineno - 1 if isinstance(body, list) and body else node.lineno
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block:
                first = min(_first_line(stmt) for stmt in block)
                last = max(_last_line(stmt) for stmt in block)
                blocks.append((first, last, node.lineno, max(node.lineno, header_last)))
    return blocks


def _enclosing_header(
    blocks: Sequence[tuple[int, int, int, int]], line: int, lines: Sequence[str]
) -> str:
    """Source of the header of the innermost block whose body holds ``line``."""
    holding = [block for block in blocks if block[0] <= line <= block[1]]
    if not holding:
        return ""
    _, _, first, last = max(holding, key=lambda block: block[2])
    return "\n".join(lines[first - 1 : last])


def explain(gap: Gap, text: str, reasons: Sequence[Reason]) -> str:
    """The first reason in ``reasons`` that covers ``gap``, else ``UNEXPLAINED``.

    ``text`` is what patterns are matched against: the range's first line and the header
    of the block that holds it.

    Example:
        >>> gap = Gap("m.py", "P.write", 10, 12, 3)
        >>> explain(gap, "if self.use_hnd:\\n    pages = loc // 2",
        ...         [Reason("m.py", "P.*", "HND layout", pattern=r"use_hnd")])
        'HND layout'
        >>> explain(gap, "x = 1", [Reason("m.py", "P.*", "HND layout", pattern=r"use_hnd")])
        'UNEXPLAINED'
    """
    for reason in reasons:
        if reason.file != gap.file or not fnmatch.fnmatchcase(gap.qualname, reason.qualname):
            continue
        if reason.pattern is None or re.search(reason.pattern, text, re.MULTILINE):
            return reason.reason
    return UNEXPLAINED


def analyze(
    measured: Mapping[str, tuple[Iterable[int], Iterable[int]]],
    sources: Mapping[str, str],
    scopes: Sequence[Scope],
    reasons: Sequence[Reason],
    *,
    target: str = "",
) -> ReachReport:
    """Build a report from coverage data: ``measured[file] = (statements, missing)``.

    ``sources[file]`` is each file's source text; files are keyed as in ``scopes``. Pure:
    no coverage.py and no target needed.

    Example:
        >>> src = "class P:\\n    def f(self):\\n        return 1\\n"
        >>> src += "    def g(self):\\n        return 2\\n"
        >>> r = analyze({"p.py": ([1, 2, 3, 4, 5], [5])}, {"p.py": src},
        ...             [Scope("p.py", ("P",), headline=True)], [])
        >>> r.headline_covered, r.headline_lines, [g.qualname for g in r.unexplained]
        (4, 5, ['P.g'])
    """
    methods: list[MethodReach] = []
    gaps: list[Gap] = []
    headline_names: list[str] = []
    headline_lines = headline_covered = 0
    for scope in scopes:
        if scope.file not in measured:
            raise ValueError(f"file={scope.file!r} has no coverage data")
        statements, missing = (set(lines) for lines in measured[scope.file])
        source = sources[scope.file]
        spans = find_spans(source)
        per_method: dict[str, list[int]] = {}
        for line in sorted(statements):
            owner = _owner(line, spans)
            if _in_scope(owner, scope):
                per_method.setdefault(owner, []).append(line)
        for qualname, lines in per_method.items():
            covered = sum(1 for line in lines if line not in missing)
            methods.append(MethodReach(scope.file, qualname, len(lines), covered))
            if scope.headline:
                headline_lines += len(lines)
                headline_covered += covered
        if scope.headline:
            headline_names.extend(
                [f"{scope.file}:{name}" for name in scope.names] if scope.names else [scope.file]
            )
        in_scope = {line for lines in per_method.values() for line in lines}
        blocks = _blocks(ast.parse(source))
        source_lines = source.splitlines()
        for gap in group_gaps(scope.file, in_scope, missing & in_scope, spans):
            text = "\n".join(
                [
                    _enclosing_header(blocks, gap.start, source_lines),
                    source_lines[gap.start - 1],
                ]
            )
            gaps.append(
                dataclasses.replace(
                    gap,
                    reason=explain(gap, text, reasons),
                    first_line=source_lines[gap.start - 1].strip(),
                )
            )
    return ReachReport(
        target=target,
        methods=tuple(methods),
        gaps=tuple(gaps),
        headline_names=tuple(headline_names),
        headline_lines=headline_lines,
        headline_covered=headline_covered,
    )


# --- measuring ------------------------------------------------------------------------------


def _unreached_code(target: str) -> tuple[Reason, ...]:
    """Why each unreached range of ``target``'s code stays unreached: its declaration's
    :class:`~kvcheck.declaration.Unreached` rows of upstream code."""
    from kvcheck.targets import TargetError, resolve_target

    try:
        resolved = resolve_target(target, available=False)
    except TargetError as exc:
        raise ValueError(str(exc)) from exc
    return declaration_of(resolved).unreached_code()


def _reach_table(target: str) -> Any:
    """The module of ``target``'s reach table (``PACKAGE``, ``SCOPES``), which the target
    names in its ``reach_table`` (resolving a target does not import its code)."""
    from kvcheck.targets import TargetError, resolve_target

    try:
        resolved = resolve_target(target, available=False)
    except TargetError as exc:
        raise ValueError(str(exc)) from exc
    module = getattr(resolved, "reach_table", None)
    if not isinstance(module, str):
        raise ValueError(
            f"target={target!r} declares no reach_table: reach measures the code of a target "
            "that names its scopes and reasons (a module, as its reach_table member)"
        )
    return importlib.import_module(module)


def _package_dir(package: str) -> Path:
    """Directory of ``package`` without importing it (sglang's import takes seconds)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def suite_command(
    target: str, *, pytest_args: Sequence[str] = (), rcfile: str = ".coveragerc"
) -> list[str]:
    """The ``coverage run ... -m pytest`` command line that :func:`measure` runs.

    Example:
        >>> suite_command("sglang", rcfile="rc")[:6]
        ['python', '-m', 'coverage', 'run', '--rcfile=rc', '-m']
    """
    command = ["python", "-m", "coverage", "run", f"--rcfile={rcfile}", "-m", "pytest"]
    command += ["--pyargs", "kvcheck.suite", f"--kvcheck-target={target}"]
    return [*command, "-p", "no:cacheprovider", "-q", *pytest_args]


def _run_shards(
    command: list[str], *, shards: int, env: dict[str, str], quiet: bool, tmp: Path
) -> int:
    """Run ``command`` as ``shards`` processes at once (``--reach-shard K/N``), print each
    one's output when it ends, and return the first non-zero exit status (else 0)."""
    if shards > 1:
        command = [*command, "-p", "reach_shard"]
    running = []
    for k in range(shards):
        log = (tmp / f"shard-{k}.log").open("w+")
        shard = [*command, f"--reach-shard={k}/{shards}"] if shards > 1 else command
        process = subprocess.Popen(shard, stdout=log, stderr=subprocess.STDOUT, env=env)
        running.append((process, log))
    statuses = []
    try:
        for k, (process, log) in enumerate(running):
            statuses.append(process.wait())
            log.seek(0)
            if not quiet:
                print(f"--- reach: shard {k + 1} of {shards} (pytest exit {statuses[-1]})")
                print(log.read(), end="", flush=True)
    finally:  # an interrupted measurement leaves no shard running
        for process, log in running:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return next((status for status in statuses if status != 0), 0)


def measure(
    target: str,
    *,
    pytest_args: Sequence[str] = (),
    quiet: bool = False,
    save_data: str | os.PathLike[str] | None = None,
    shards: int = 2,
) -> ReachReport:
    """Run the shipped suite against ``target`` under coverage.py and analyze what it reached.

    ``shards`` processes run at once, each under its own ``coverage run`` and each running
    every ``shards``-th test (``tools/reach_shard.py``); their data files are combined.
    Not pytest-xdist: under it (tried with coverage's subprocess patch) one worker's data
    went missing in two runs of two on sglang 0.5.23, so the figure undercounted. Each
    shard's output is printed when it ends. ``save_data`` keeps the combined coverage data
    for :func:`analyze_data`, so the reach table can be revised without rerunning the suite.

    Example, where sglang is installed (takes minutes)::

        measure("sglang").headline_percent  # 72.5 on sglang 0.5.23
    """
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"shards={shards!r} must be an int >= 1")
    table = _reach_table(target)
    files = {**_scope_files(table), **_map_files(table)}
    with tempfile.TemporaryDirectory(prefix="kvcheck-reach-") as tmp:
        rcfile = Path(tmp) / "coveragerc"
        data_file = Path(tmp) / ".coverage"
        include = "\n".join(f"    {path}" for path in sorted(set(files.values())))
        rcfile.write_text(
            f"[run]\nsigterm = true\nparallel = true\ndata_file = {data_file}\n"
            f"include =\n{include}\n"
        )
        command = suite_command(target, pytest_args=pytest_args, rcfile=str(rcfile))
        command[0] = sys.executable
        env = {
            **os.environ,
            "KVCHECK_TARGET": target,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
        }
        status = _run_shards(command, shards=shards, env=env, quiet=quiet, tmp=Path(tmp))
        import coverage

        combined = coverage.Coverage(data_file=str(data_file), config_file=str(rcfile))
        try:
            combined.combine(keep=False)
            combined.save()
        except coverage.exceptions.CoverageException:
            pass  # no shard wrote data: analyze_data says so

        if save_data is not None and data_file.exists():
            shutil.copyfile(data_file, save_data)
        report = analyze_data(target, data_file)
    return dataclasses.replace(
        report,
        pytest_status=status,
        command=tuple(suite_command(target, pytest_args=pytest_args)),
    )


def analyze_data(
    target: str, data_file: str | os.PathLike[str], *, classes: bool = True
) -> ReachReport:
    """Analyze a coverage data file from an earlier :func:`measure` with today's reach table.

    With ``classes``, the target's class discovery (its optional ``classes()``, which
    imports the target's package) gives the per-class reach.

    Example:
        >>> analyze_data("sglang", "no-such.coverage")
        Traceback (most recent call last):
        ...
        ValueError: data_file='no-such.coverage' does not exist
    """
    import coverage

    table = _reach_table(target)
    if not Path(data_file).exists():
        raise ValueError(f"data_file={str(data_file)!r} does not exist")
    files = _scope_files(table)
    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    measured_files = {os.path.realpath(f) for f in cov.get_data().measured_files()}
    measured: dict[str, tuple[list[int], list[int]]] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    for name, path in files.items():
        sources[name] = path.read_text()
        _, statements, _, missing, _ = cov.analysis2(str(path))
        if os.path.realpath(path) not in measured_files:
            notes.append(f"{name}: no line ran (never imported?)")
        measured[name] = (list(statements), list(missing))
    report = analyze(measured, sources, table.SCOPES, _unreached_code(target), target=target)
    off_cpu = frozenset(getattr(table, "OFF_CPU_REASONS", ()))
    map_files = []
    map_measured: dict[str, tuple[set[int], set[int]]] = {}
    for name, path in _map_files(table).items():
        _, statements, _, missing, _ = cov.analysis2(str(path))
        map_measured[name] = (set(statements), set(missing))
        map_files.append(FileReach(name, len(statements), len(statements) - len(missing), 0))
    class_reach: list[ClassReach] = []
    if classes and map_measured:
        entries, problem = _discovered(target)
        if problem:
            notes.append(f"class discovery failed: {problem}")
        class_reach = class_reaches(
            entries, table.PACKAGE, map_measured, _package_dir(table.PACKAGE)
        )
    return dataclasses.replace(
        report,
        notes=tuple(notes),
        off_cpu_reasons=off_cpu,
        map_files=tuple(map_files),
        map_root=getattr(table, "MAP_ROOT", ""),
        map_aside=", ".join(getattr(table, "MAP_ASIDE", ())),
        class_reach=tuple(class_reach),
    )


def _discovered(target: str) -> tuple[list[Any], str]:
    """The target's discovered classes (its optional ``classes()``), or why there are none."""
    from kvcheck.targets import TargetError, resolve_target

    try:
        discover = getattr(resolve_target(target), "classes", None)
        return (list(discover()), "") if callable(discover) else ([], "")
    except (TargetError, ImportError, RuntimeError) as error:
        return [], f"{type(error).__name__}: {error}"


def class_reaches(
    entries: Iterable[Any],
    package: str,
    measured: Mapping[str, tuple[set[int], set[int]]],
    package_dir: Path,
) -> list[ClassReach]:
    """Per discovered class (``entries``: :class:`kvcheck.targets.discovery.ClassEntry`),
    the statements of its span in ``measured[file] = (statements, missing)`` and how many
    ran. A class whose file is not measured, or whose name is not a top-level class of it,
    is left out.

    Example:
        >>> import tempfile
        >>> from kvcheck.targets.discovery import ClassEntry
        >>> root = Path(tempfile.mkdtemp())
        >>> _ = (root / "m.py").write_text("class P:\\n    def f(self):\\n        return 1\\n")
        >>> [(c.name, c.lines, c.covered) for c in class_reaches(
        ...     [ClassEntry("pkg.m:P", "KV pool", True, "P()")], "pkg",
        ...     {"m.py": ({1, 2, 3}, {3})}, root)]
        [('P', 3, 2)]
    """
    reaches = []
    spans_of: dict[str, dict[str, Span]] = {}
    for entry in entries:
        module, _, name = entry.qualified.partition(":")
        if not name or not module.startswith(package + "."):
            continue
        relative = module.removeprefix(package + ".").replace(".", "/")
        file = next(
            (f for f in (f"{relative}.py", f"{relative}/__init__.py") if f in measured), None
        )
        if file is None:
            continue
        if file not in spans_of:
            source = (package_dir / file).read_text()
            spans_of[file] = {s.qualname: s for s in find_spans(source) if s.kind == "class"}
        span = spans_of[file].get(name)
        if span is None:
            continue
        statements, missing = measured[file]
        inside = {line for line in statements if span.start <= line <= span.end}
        covered = len(inside - missing)
        reaches.append(ClassReach(file, name, entry.kind, entry.built, len(inside), covered))
    return reaches


def _scope_files(table: Any) -> dict[str, Path]:
    package_dir = _package_dir(table.PACKAGE)
    return {scope.file: package_dir / scope.file for scope in table.SCOPES}


def _map_files(table: Any) -> dict[str, Path]:
    """Every Python file under the table's ``MAP_ROOT`` but those under ``MAP_ASIDE``
    (``{}`` for a table without a map): the whole directory the map figure is over."""
    root = getattr(table, "MAP_ROOT", None)
    if root is None:
        return {}
    package_dir = _package_dir(table.PACKAGE)
    aside = tuple(getattr(table, "MAP_ASIDE", ()))
    files = {}
    for path in sorted((package_dir / root).rglob("*.py")):
        name = path.relative_to(package_dir).as_posix()
        if not name.startswith(aside):
            files[name] = path
    return files


# --- output ---------------------------------------------------------------------------------


def format_report(report: ReachReport, *, methods: bool = True) -> str:
    """The report as text: per class and method, the headline, then every unreached range.

    Example:
        >>> r = ReachReport("t", (MethodReach("p.py", "P.f", 4, 3),), (), ("p.py:P",), 4, 3)
        >>> print(format_report(r).splitlines()[-1])
        headline: 3/4 lines = 75.0% (p.py:P)
    """
    out: list[str] = []
    by_class = report.by_class()
    width = max((len(m.qualname) for m in report.methods), default=10) + 2
    current: tuple[str, str] | None = None
    for method in sorted(report.methods, key=lambda m: (m.file, m.qualname.split(".")[0])):
        key = (method.file, method.qualname.split(".")[0])
        if key != current:
            current = key
            lines, covered = by_class[key]
            percent = 100.0 * covered / lines if lines else 100.0
            out.append(f"{key[0]}  {key[1]}: {covered}/{lines} = {percent:.1f}%")
        if methods:
            out.append(
                f"    {method.qualname:<{width}} {method.covered:>4}/{method.lines:<4} "
                f"{method.percent:5.1f}%"
            )
    if report.gaps:
        out.append("")
        out.append("unreached ranges:")
        for gap in report.gaps:
            where = f"{gap.file}:{gap.start}" + (f"-{gap.end}" if gap.end != gap.start else "")
            out.append(f"  {where} {gap.qualname} ({gap.lines} lines): {gap.reason}")
            out.append(f"      {gap.first_line}")
    out.append("")
    for note in report.notes:
        out.append(f"note: {note}")
    if report.pytest_status not in (None, 0):
        out.append(f"note: the suite's pytest exited {report.pytest_status}")
    for item in sorted(report.by_file().values(), key=lambda item: item.file):
        out.append(
            f"file {item.file}: {item.covered}/{item.lines} = {item.percent:.1f}%; "
            f"on CPU {item.covered}/{item.lines - item.off_cpu} = {item.cpu_percent:.1f}%"
        )
    out.append(
        f"unexplained ranges: {len(report.unexplained)} of {len(report.gaps)} "
        f"({sum(g.lines for g in report.unexplained)} lines)"
    )
    for klass in report.class_reach:
        state = "built" if klass.built else "not built"
        out.append(
            f"class {klass.file}:{klass.name} ({klass.kind}, {state}): "
            f"{klass.covered}/{klass.lines} = {klass.percent:.1f}%"
        )
    for item in report.most_unreached() if report.map_files else ():
        out.append(f"most unreached: {item.file}: {item.lines - item.covered} of {item.lines}")
    if report.map_files:
        out.append(
            f"map: {report.map_covered}/{report.map_lines} statements = "
            f"{report.map_percent:.1f}% ({len(report.map_files)} files)"
        )
    out.append(
        f"headline: {report.headline_covered}/{report.headline_lines} lines = "
        f"{report.headline_percent:.1f}% ({', '.join(report.headline_names)})"
    )
    return "\n".join(out)


def format_map_markdown(report: ReachReport, *, root: str = "", aside: str = "") -> list[str]:
    """The map figure, the ten files with the most unreached statements and the per-class
    reach, as Markdown lines (none for a report without a map).

    Example:
        >>> r = ReachReport("t", (), (), (), 0, 0, map_files=(FileReach("a.py", 4, 1, 0),))
        >>> format_map_markdown(r)[0]
        '**Map: 25.0 %** (1 of 4 statements in 1 files).'
    """
    if not report.map_files:
        return []
    where = f" of `{root}`" if root else ""
    without = f", `{aside}` aside" if aside else ""
    out = [
        f"**Map: {report.map_percent:.1f} %** ({report.map_covered} of {report.map_lines} "
        f"statements{where} in {len(report.map_files)} files{without}).",
        "",
        "The ten files with the most unreached statements:",
        "",
        "| file | statements | reached | unreached | % |",
        "|---|---:|---:|---:|---:|",
    ]
    for item in report.most_unreached():
        out.append(
            f"| `{item.file}` | {item.lines} | {item.covered} | {item.lines - item.covered} "
            f"| {item.percent:.1f} |"
        )
    if report.class_reach:
        built = sum(1 for item in report.class_reach if item.built)
        out += [
            "",
            f"Per discovered class ({len(report.class_reach)}: {built} built, "
            f"{len(report.class_reach) - built} not built; why each is or is not built: "
            "`kvcheck classes --target "
            f"{report.target}`): the statements of its span and how many ran.",
            "",
            "| class | kind | built | statements | reached | % |",
            "|---|---|---|---:|---:|---:|",
        ]
        ordered = sorted(
            report.class_reach, key=lambda item: (not item.built, item.file, item.name)
        )
        for klass in ordered:
            out.append(
                f"| `{klass.name}` (`{klass.file}`) | {klass.kind} | "
                f"{'yes' if klass.built else 'no'} | {klass.lines} | {klass.covered} | "
                f"{klass.percent:.1f} |"
            )
    return [*out, ""]


def format_markdown(report: ReachReport) -> str:
    """The report as the Markdown block ``docs/sglang-reach.md`` publishes.

    Per class, then per method of the headline scopes, then the unreached ranges grouped
    by reason (explained ones folded), unexplained ones listed first.

    Example:
        >>> r = ReachReport("t", (MethodReach("p.py", "P.f", 4, 3),), (), ("p.py:P",), 4, 3)
        >>> print(format_markdown(r).splitlines()[0])
        **Headline: 75.0 %** (3 of 4 executable lines of P).
    """
    headline_files = {name.split(":")[0] for name in report.headline_names}
    out = [
        f"**Headline: {report.headline_percent:.1f} %** ({report.headline_covered} of "
        f"{report.headline_lines} executable lines of "
        f"{', '.join(name.split(':')[-1] for name in report.headline_names)}).",
        "",
        *format_map_markdown(report, root=report.map_root, aside=report.map_aside),
        "| file | class or function | lines | reached | % |",
        "|---|---|---:|---:|---:|",
    ]
    for (file, name), (lines, covered) in sorted(report.by_class().items()):
        percent = 100.0 * covered / lines if lines else 100.0
        out.append(f"| `{file}` | `{name}` | {lines} | {covered} | {percent:.1f} |")
    out += [
        "",
        "Per file: the executable lines in scope, and those a CPU host can run (lines whose "
        "reason needs a GPU, an NPU or pinned memory left out).",
        "",
        "| file | lines | reached | % | off CPU | % on CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for item in sorted(report.by_file().values(), key=lambda item: item.file):
        out.append(
            f"| `{item.file}` | {item.lines} | {item.covered} | {item.percent:.1f} | "
            f"{item.off_cpu} | {item.cpu_percent:.1f} |"
        )
    out += ["", "<details><summary>Per method (headline scopes)</summary>", ""]
    out += ["| method | lines | reached | % |", "|---|---:|---:|---:|"]
    for method in report.methods:
        if method.file in headline_files:
            out.append(
                f"| `{method.qualname}` | {method.lines} | {method.covered} | "
                f"{method.percent:.1f} |"
            )
    out += ["", "</details>", ""]
    unexplained = report.unexplained
    out.append(
        f"Unreached: {len(report.gaps)} ranges, {sum(g.lines for g in report.gaps)} lines; "
        f"unexplained: {len(unexplained)} ranges, {sum(g.lines for g in unexplained)} lines."
    )
    out += ["", "Unexplained (reachable on CPU, not reached by the suite):", ""]
    out += [
        f"- `{_where(gap)}` `{gap.qualname}` ({gap.lines}): `{gap.first_line}`"
        for gap in unexplained
    ] or ["- none"]
    by_reason: dict[str, list[Gap]] = {}
    for gap in report.gaps:
        if gap.explained:
            by_reason.setdefault(gap.reason, []).append(gap)
    out += ["", "| reason | ranges | lines |", "|---|---:|---:|"]
    for reason, gaps in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        out.append(f"| {reason} | {len(gaps)} | {sum(g.lines for g in gaps)} |")
    out += ["", "<details><summary>Every explained range</summary>", ""]
    for reason, gaps in sorted(by_reason.items()):
        out += ["", f"*{reason}*:", ""]
        out += [f"- `{_where(g)}` `{g.qualname}` ({g.lines}): `{g.first_line}`" for g in gaps]
    out += ["", "</details>"]
    return "\n".join(out)


def _where(gap: Gap) -> str:
    return f"{gap.file}:{gap.start}" + (f"-{gap.end}" if gap.end != gap.start else "")


def build_parser() -> argparse.ArgumentParser:
    """The ``python tools/reach.py`` argument parser.

    Example:
        >>> build_parser().parse_args(["--min-percent", "85"]).min_percent
        85.0
    """
    parser = argparse.ArgumentParser(
        prog="python tools/reach.py",
        description="Line coverage of a target's pool code under kvcheck's shipped suite.",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="a target that declares a reach table (default: KVCHECK_TARGET)",
    )
    parser.add_argument("--min-percent", type=float, default=0.0, metavar="P")
    parser.add_argument("--strict", action="store_true", help="fail on unexplained ranges")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument(
        "--markdown", metavar="FILE", help="also write the Markdown block the docs publish"
    )
    parser.add_argument("--save-data", metavar="FILE", help="keep the coverage data file")
    parser.add_argument(
        "--shards",
        type=int,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="coverage processes sharing the suite's tests at once (default: 2, or 1 on one CPU)",
    )
    parser.add_argument(
        "--from-data",
        metavar="FILE",
        help="analyze a data file saved by --save-data instead of running the suite",
    )
    parser.add_argument("--no-methods", action="store_true", help="per class only")
    return parser


def _usage_problem(options: argparse.Namespace) -> str | None:
    """What stops the run before it starts (checked first: a measurement takes minutes)."""
    if not 0.0 <= options.min_percent <= 100.0:
        return f"--min-percent={options.min_percent} not in [0, 100]"
    for flag, path in (("--json", options.json), ("--markdown", options.markdown)):
        if path and not Path(path).resolve().parent.is_dir():
            return f"{flag}={path!r}: its directory does not exist"
        if path and Path(path).is_dir():
            return f"{flag}={path!r} is a directory"
    if options.from_data and not Path(options.from_data).is_file():
        return f"--from-data={options.from_data!r} does not exist"
    if options.shards < 1:
        return f"--shards={options.shards} must be >= 1"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python tools/reach.py`` with ``argv``; return the exit status.

    Bad arguments are found before the (minutes-long) measurement starts.

    Example:
        >>> main(["--target", "sglang", "--min-percent", "120"])
        2
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, pytest_args = arguments[:split], arguments[split + 1 :]
    options = build_parser().parse_args(arguments)
    from kvcheck.targets import target_spec

    options.target = target_spec(options.target)
    problem = _usage_problem(options)
    if problem:
        print(f"reach: error: {problem}", file=sys.stderr)
        return 2
    try:
        if options.from_data:
            report = analyze_data(options.target, options.from_data)
        else:
            report = measure(
                options.target,
                pytest_args=pytest_args,
                save_data=options.save_data,
                shards=options.shards,
            )
    except ValueError as error:
        print(f"reach: error: {error}", file=sys.stderr)
        return 2
    print(format_report(report, methods=not options.no_methods))
    if options.json:
        Path(options.json).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if options.markdown:
        Path(options.markdown).write_text(format_markdown(report) + "\n")
    if report.pytest_status not in (None, 0, 1) or report.headline_lines == 0:
        print("reach: the suite did not run; the figure is not a measurement")
        return 2
    status = 0
    if report.headline_percent < options.min_percent:
        print(
            f"reach: headline {report.headline_percent:.1f}% is below "
            f"min_percent={options.min_percent}"
        )
        status = 1
    if options.strict and report.unexplained:
        print(f"reach: {len(report.unexplained)} unreached ranges have no reason")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
