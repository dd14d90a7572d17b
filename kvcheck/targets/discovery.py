"""Discovery: every pool class a target's package defines, and whether the target builds it.

A target that drives an upstream package (sglang) declares which of its classes it builds
and why it leaves the others out, as :class:`~kvcheck.declaration.Key.upstream` rows of
its declaration (``Builds`` or ``Refuses``). That list goes stale the day the package adds
a class, so it is checked against the package itself: :func:`discover` walks the package's
modules, imports each one on its own (a module that fails to import is reported with its
error, never dropped) and picks the classes that derive from one of the pool bases the
target names, or whose name says they are a pool. :func:`census` joins what it found with
the declaration: each class is built (how), not built (why), or, when the declaration has
no row for it, ``not built: new in <release>``. So a new class is never silently absent.

Example:
    >>> from kvcheck.declaration import Builds, Declaration, Key, Row
    >>> found = (Found("pkg.pool", "Pool", "KV pool"), Found("pkg.pool", "NewPool", "KV pool"))
    >>> declared = Declaration(rows=(Row(Key.upstream("pkg.pool:Pool"), Builds("Pool(...)")),))
    >>> for entry in census(Discovery(found), declared, release="1.1"):
    ...     print(entry.line())
    pkg.pool:Pool (KV pool): built (Pool(...))
    pkg.pool:NewPool (KV pool): not built: new in 1.1
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kvcheck.declaration import Builds, Declaration, Key, Refuses, Unreached

__all__ = [
    "ClassEntry",
    "Discovery",
    "Found",
    "census",
    "census_line",
    "discover",
    "format_census",
]

#: The kind a class gets when a module fails to import (its classes are unknown).
IMPORT_FAILED = "module"


@dataclass(frozen=True, order=True)
class Found:
    """A class the package defines: its module, its name, and what kind of pool it is."""

    module: str
    name: str
    kind: str

    @property
    def qualified(self) -> str:
        """``module:Name``, as an upstream key spells it."""
        return f"{self.module}:{self.name}"


@dataclass(frozen=True)
class Discovery:
    """What :func:`discover` found: the classes, and each module that failed to import
    (module name -> the error, as ``Type: message``)."""

    classes: tuple[Found, ...] = ()
    import_errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ClassEntry:
    """One discovered class (or one module that failed to import) and what the target says
    about it: ``built`` with how, or not built with why."""

    qualified: str
    kind: str
    built: bool
    why: str

    def line(self) -> str:
        """The entry as one line: ``module:Name (kind): built (how)`` or ``...: not built
        (why)``; a class the declaration does not know reads ``not built: new in X``."""
        if self.built:
            verdict = f"built ({self.why})"
        elif self.why.startswith("new in "):
            verdict = f"not built: {self.why}"
        else:
            verdict = f"not built ({self.why})"
        return f"{self.qualified} ({self.kind}): {verdict}"


def discover(
    package: str,
    bases: Mapping[type, str],
    *,
    name_suffixes: Mapping[str, str] = MappingProxyType({}),
    aside: Sequence[str] = (),
    importer: Callable[[str], object] = importlib.import_module,
) -> Discovery:
    """The pool classes ``package`` (a dotted name, imported) and its subpackages define.

    A class is picked when it is defined in the module being read (not merely imported
    there) and either derives from one of ``bases`` (base -> kind; the first base it
    derives from, in order, gives its kind) or its name ends with one of
    ``name_suffixes`` (suffix -> kind; for standalone pools with no shared base). Modules
    whose dotted name starts with one of ``aside`` are not read. Each module is imported on
    its own with ``importer``; one that raises is reported in
    :attr:`Discovery.import_errors` and the walk goes on.

    Example:
        >>> import json
        >>> found = discover("json", {json.JSONDecodeError: "error"},
        ...                  name_suffixes={"Decoder": "decoder"})
        >>> [(f.qualified, f.kind) for f in found.classes]
        [('json.decoder:JSONDecodeError', 'error'), ('json.decoder:JSONDecoder', 'decoder')]
    """
    if not isinstance(package, str) or not package:
        raise ValueError(f"package={package!r} is not a dotted module name")
    if not bases and not name_suffixes:
        raise ValueError("bases={} and name_suffixes={}: nothing would be picked")
    root = importer(package)
    paths = getattr(root, "__path__", None)
    if paths is None:
        raise ValueError(f"package={package!r} is a module, not a package")
    names = [package]
    names += [info.name for info in pkgutil.walk_packages(paths, f"{package}.", onerror=_skip)]
    found: list[Found] = []
    errors: dict[str, str] = {}
    for name in sorted(set(names)):
        if name.startswith(tuple(aside)):
            continue
        try:
            module = importer(name)
        except Exception as error:  # any failure is reported, and the walk goes on
            errors[name] = f"{type(error).__name__}: {error}"
            continue
        found += _pool_classes(module, name, bases, name_suffixes)
    return Discovery(tuple(sorted(found)), MappingProxyType(errors))


def _skip(name: str) -> None:
    """walk_packages' onerror: a subpackage that fails to import is met again, and
    reported, when :func:`discover` imports it by name."""


def _pool_classes(
    module: object, name: str, bases: Mapping[type, str], suffixes: Mapping[str, str]
) -> Iterable[Found]:
    for attribute, value in vars(module).items():
        if not inspect.isclass(value) or value.__module__ != name or attribute != value.__name__:
            continue
        kind = next((kind for base, kind in bases.items() if issubclass(value, base)), None)
        if kind is None:
            kind = next(
                (kind for suffix, kind in suffixes.items() if value.__name__.endswith(suffix)),
                None,
            )
        if kind is not None:
            yield Found(name, value.__name__, kind)


def census(discovery: Discovery, declaration: Declaration, *, release: str) -> list[ClassEntry]:
    """Each discovered class with what ``declaration`` says about it on ``release``, and
    each module that failed to import, in the order found.

    A class with a :class:`~kvcheck.declaration.Builds` row is built (its ``how``); with a
    ``Refuses`` or ``Unreached`` row, not built (its reason, ``{release}`` filled in);
    with no row, not built, ``new in {release}``: the declaration predates it.

    Example:
        >>> census(Discovery((), {"pkg.gpu": "ImportError: no CUDA"}),
        ...        Declaration(), release="1.0")[0].line()
        'pkg.gpu (module): not built (import failed: ImportError: no CUDA)'
    """
    if not isinstance(release, str) or not release:
        raise ValueError(f"release={release!r} is not a release name")
    entries = []
    for found in discovery.classes:
        status = declaration.status(Key.upstream(found.qualified))
        if isinstance(status, Builds):
            entries.append(ClassEntry(found.qualified, found.kind, True, status.how))
        elif isinstance(status, Refuses | Unreached):
            why = status.why.replace("{release}", release)
            entries.append(ClassEntry(found.qualified, found.kind, False, why))
        else:
            entries.append(ClassEntry(found.qualified, found.kind, False, f"new in {release}"))
    for module, error in discovery.import_errors.items():
        entries.append(ClassEntry(module, IMPORT_FAILED, False, f"import failed: {error}"))
    return entries


def census_line(entries: Sequence[ClassEntry], *, listed_by: str = "") -> str:
    """The counts in one line, for a run's header or summary, naming the command that lists
    them where given.

    Example:
        >>> census_line([ClassEntry("m:A", "KV pool", True, "A()"),
        ...              ClassEntry("m:B", "KV pool", False, "new in 2")], listed_by="ls")
        '2 pool classes: 1 built, 1 not built (1 new: m:B); ls lists them'
    """
    built = sum(1 for entry in entries if entry.built)
    classes = [entry for entry in entries if entry.kind != IMPORT_FAILED]
    new = [entry.qualified for entry in entries if entry.why.startswith("new in ")]
    failed = len(entries) - len(classes)
    text = f"{len(classes)} pool classes: {built} built, {len(classes) - built} not built"
    details = []
    if new:
        details.append(f"{len(new)} new: {', '.join(new)}")
    if failed:
        details.append(f"{failed} modules failed to import")
    if details:
        text += f" ({'; '.join(details)})"
    return f"{text}; {listed_by} lists them" if listed_by else text


def format_census(entries: Sequence[ClassEntry]) -> str:
    """Every entry on its own line, built ones first, then the others by kind.

    Example:
        >>> print(format_census([ClassEntry("m:B", "allocator", False, "GPU only"),
        ...                      ClassEntry("m:A", "KV pool", True, "A()")]))
        built:
          m:A (KV pool): built (A())
        not built:
          m:B (allocator): not built (GPU only)
    """
    out = []
    for title, wanted in (("built:", True), ("not built:", False)):
        chosen = sorted(
            (entry for entry in entries if entry.built is wanted),
            key=lambda entry: (entry.kind, entry.qualified),
        )
        if chosen:
            out.append(title)
            out += [f"  {entry.line()}" for entry in chosen]
    return "\n".join(out)
