"""Choosing what the suite checks: one resolver shared by the pytest plugin and the CLI.

A target is named by ``--kvcheck-target`` / ``KVCHECK_TARGET`` (or ``kvcheck verify
--target``). Built-in names are ``kvcheck`` (this package's pools, the default) and
``sglang`` (the installed sglang package, through an adapter); anything else is
``module:attr``, where ``attr`` is a target instance, a class or a zero-argument factory.

Besides resolving, this module answers what the suite asks of a target's declarations
(:data:`kvcheck.targets.base.OPTIONAL_MEMBERS`): which capabilities it lacks, per pool
family where it says so (:func:`capability_skip_reason`, :func:`supports`), which tests it
expects to fail (:func:`expected_failure_reason`), and its one-time setup
(:func:`prepare_target`). Spec limits are drawn by :mod:`kvcheck.strategies.limits`.

Example:
    >>> target = resolve_target("kvcheck")
    >>> target.name
    'kvcheck'
    >>> capability_skip_reason(target, ["mha_pool"]) is None
    True
    >>> expected_failure_reason(target, "kvcheck/suite/test_x.py::test_y") is None
    True
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvcheck.declaration import CAPABILITIES, declaration_of
from kvcheck.specs import POOL_FAMILIES
from kvcheck.surface import surface_of
from kvcheck.targets.base import FAMILY_SEPARATOR, OPTIONAL_MEMBERS, Target

__all__ = [
    "BUILTIN_TARGETS",
    "CAPABILITIES",
    "DEFAULT_TARGET",
    "OPTIONAL_MEMBERS",
    "TARGET_ENV_VAR",
    "Target",
    "TargetCodeError",
    "TargetError",
    "capability_skip_reason",
    "check_target",
    "expected_failure_reason",
    "nodeid_matches",
    "prepare_target",
    "resolve_target",
    "supports",
    "target_identity",
    "target_spec",
]

#: The capability that stands for building a family's pools -> the family.
_FAMILY_OF_POOL_CAPABILITY = {f"{family}_pool": family for family in POOL_FAMILIES}

TARGET_ENV_VAR = "KVCHECK_TARGET"
DEFAULT_TARGET = "kvcheck"

#: Built-in target names and where their classes live. Imported only when chosen, so
#: naming ``kvcheck`` never imports sglang.
BUILTIN_TARGETS: dict[str, str] = {
    "kvcheck": "kvcheck.targets.builtin:KVCheckTarget",
    "sglang": "kvcheck.targets.sglang:SGLangTarget",
}

_VALID_NAMES_HINT = (
    "valid targets: 'kvcheck' (built-in, default), 'sglang' (the installed sglang package), "
    "or 'module:attr' naming a Target instance, class or zero-argument factory"
)

#: Which capabilities each protocol method serves. A target may leave a method out when
#: it declares every capability the method serves unsupported (a pool-only target need
#: not stub the serving side).
_METHOD_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "make_pool": ("mha_pool", "noop_pool", "mla_pool", "dsa_pool"),
    "write_index_k": ("index_k_write",),
    "validate_server_args": ("server_args",),
    "select_pool_family": ("pool_selection",),
    "cell_size_bytes": ("configurator",),
    "max_total_num_tokens": ("configurator",),
    "dsa_layer_skips_topk": ("skip_rule",),
    "skip_topk_layers": ("skip_rule",),
}


class TargetError(ValueError):
    """A target name that cannot be turned into a working target.

    The message names the target that was tried, the valid names and the underlying error.
    """


class TargetCodeError(TargetError):
    """The target's own code raised while it was imported or built: its traceback, not
    only its message, is what the user needs (``kvcheck -v`` prints it; the exception
    is this error's ``__cause__``)."""


def target_spec(name: str | None = None) -> str:
    """The target name in effect: ``name``, else ``KVCHECK_TARGET``, else ``kvcheck``.

    Example:
        >>> target_spec("sglang")
        'sglang'
    """
    if name is not None and name.strip():
        return name.strip()
    from_env = os.environ.get(TARGET_ENV_VAR, "").strip()
    return from_env or DEFAULT_TARGET


def resolve_target(name: str | None = None, *, available: bool = True) -> Target:
    """Turn a target name into a target, or raise :class:`TargetError` saying why not.

    ``None`` means ``KVCHECK_TARGET``, then ``kvcheck``. ``module:attr`` imports
    ``module`` and looks up ``attr`` (dots allowed: ``pkg.mod:Factory.default``). A target
    that says it cannot run here (its ``unavailable`` reason: sglang not installed) is
    refused, unless ``available=False`` asks only for its declarations (what a reproduction
    script or the reach table needs).

    Example:
        >>> resolve_target("kvcheck").name
        'kvcheck'
        >>> try:
        ...     resolve_target("no_such_target")
        ... except TargetError as exc:
        ...     print(str(exc).split(";")[0])
        unknown target 'no_such_target'
    """
    spec = target_spec(name)
    location = BUILTIN_TARGETS.get(spec, spec)
    module_name, sep, attr_path = location.partition(":")
    if not sep or not module_name.strip() or not attr_path.strip():
        hint = _did_you_mean(spec, list(BUILTIN_TARGETS))
        raise TargetError(f"unknown target {spec!r}{hint}; {_VALID_NAMES_HINT}")
    obj = _import_attr(spec, module_name.strip(), attr_path.strip())
    target = _instantiate(spec, obj)
    problems = check_target(target)
    if problems:
        raise TargetError(
            f"target {spec!r} resolved to {target!r}, which does not satisfy the kvcheck "
            f"Target protocol: {'; '.join(problems)}"
        )
    reason = getattr(target, "unavailable", None)
    if available and reason:
        raise TargetError(f"target {spec!r}: {reason}")
    return target


def target_identity(target: object) -> str:
    """What a target is, whatever spelled it: the key of its stored examples.

    Its class's module and qualified name (``my_pkg.kv:MyTarget``), plus the parameters that
    change what it builds (``my_pkg.kv:MyTarget(bug='move')``): its ``identity_parameters``
    mapping when it declares one, else its ``name`` when an instance set one of its own (a
    class serving several broken pools), else none. So ``my_pkg.kv:buggy`` (an instance),
    ``my_pkg.kv:MyTarget`` (the class) and a factory returning the same target are one
    target. The built-in classes keep their short names, ``kvcheck`` and ``sglang``.

    Example:
        >>> target_identity(resolve_target("kvcheck"))
        'kvcheck'
        >>> from kvcheck.targets.builtin import KVCheckTarget
        >>> class Mine(KVCheckTarget):
        ...     identity_parameters = {"family": "mha"}
        >>> target_identity(Mine())
        "kvcheck.targets:Mine(family='mha')"
    """
    cls = type(target)
    location = f"{cls.__module__}:{cls.__qualname__}"
    parameters = getattr(target, "identity_parameters", None)
    if parameters is None:
        name = getattr(target, "name", None)
        parameters = {} if name == getattr(cls, "name", None) else {"name": name}
    if not isinstance(parameters, Mapping):
        raise TargetError(
            f"target {location}: identity_parameters={parameters!r} must be a mapping "
            "parameter name -> value"
        )
    if not parameters:
        builtin = {where: name for name, where in BUILTIN_TARGETS.items()}
        return builtin.get(location, location)
    shown = ", ".join(f"{key}={_identity_value(parameters[key])}" for key in sorted(parameters))
    return f"{location}({shown})"


def _identity_value(value: object) -> str:
    """A parameter as it keys examples: classes and functions by where they live."""
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", None)
        if module and qualname:
            return f"{module}:{qualname}"
    return repr(value).replace("\x00", "\\x00")


def check_target(target: object) -> list[str]:
    """List what keeps ``target`` from satisfying the protocol (empty when it does).

    Example:
        >>> check_target(object())[0]
        'name: missing (expected a non-empty str)'
    """
    problems: list[str] = []
    name = getattr(target, "name", None)
    if not isinstance(name, str) or not name:
        problems.append(
            f"name: {'missing' if name is None else repr(name)} (expected a non-empty str)"
        )
    version = getattr(target, "version", None)
    if not isinstance(version, str):
        problems.append(
            f"version: {'missing' if version is None else repr(version)} (expected a str)"
        )
    unsupported = getattr(target, "unsupported", None)
    if not isinstance(unsupported, Mapping):
        problems.append(f"unsupported: {unsupported!r} (expected a mapping capability -> reason)")
        unsupported = {}
    for key, reason in unsupported.items():
        problem = _unsupported_key_problem(key)
        if problem is not None:
            problems.append(f"unsupported: {problem}")
        if not isinstance(reason, str) or not reason.strip():
            problems.append(f"unsupported[{key!r}]: reason {reason!r} must be a non-empty str")
    problems.extend(_optional_member_problems(target))
    for method, capabilities in _METHOD_CAPABILITIES.items():
        if callable(getattr(target, method, None)):
            continue
        if all(capability in unsupported for capability in capabilities):
            continue
        problems.append(
            f"{method}: missing or not callable (needed unless unsupported declares "
            f"{', '.join(capabilities)})"
        )
    return problems


def capability_skip_reason(
    target: Target, capabilities: Iterable[str], *, family: str | None = None
) -> str | None:
    """Why a test needing ``capabilities`` must be skipped on ``target``; ``None`` if it can run.

    ``family`` names the pool family the test builds, when it knows it: then a per-family
    declaration such as ``"meta_device:mha"`` counts too. A capability may also carry its
    family itself (``"meta_device:mha"``). Unknown capability or family names are a bug in
    the test, so they raise ``ValueError``.

    Example:
        >>> capability_skip_reason(resolve_target("kvcheck"), ["dsa_pool", "move"]) is None
        True
    """
    if family is not None and family not in POOL_FAMILIES:
        raise ValueError(f"family={family!r} not in {POOL_FAMILIES}")
    entries = list(capabilities)
    unknown = [entry for entry in entries if _unsupported_key_problem(entry) is not None]
    if unknown:
        raise ValueError(
            f"capabilities={unknown!r} are not kvcheck capabilities (optionally "
            f"'capability{FAMILY_SEPARATOR}family'); known: {', '.join(CAPABILITIES)}; "
            f"families: {', '.join(POOL_FAMILIES)}"
        )
    wanted: list[tuple[str, str | None]] = []
    for entry in entries:
        capability, _, own_family = entry.partition(FAMILY_SEPARATOR)
        wanted.append((capability, own_family or family))
    unsupported = target.unsupported
    missing: list[str] = []
    surface = surface_of(target)
    for capability, capability_family in dict.fromkeys(wanted):
        family_built = _FAMILY_OF_POOL_CAPABILITY.get(capability)
        if family_built is not None and not surface.builds(family_built):
            why = surface.note(family_built) or f"its surface declares none: {surface.describe()}"
            missing.append(f"{capability} (no {family_built} pool: {why})")
        keys = [capability]
        if capability_family is not None:
            keys.append(f"{capability}{FAMILY_SEPARATOR}{capability_family}")
        missing.extend(f"{key} ({unsupported[key]})" for key in keys if key in unsupported)
    if not missing:
        return None
    return f"target {target.name!r} does not support {'; '.join(dict.fromkeys(missing))}"


def supports(target: Target, capability: str, *, family: str | None = None) -> bool:
    """Whether ``target`` serves ``capability`` (for pools of ``family``, when given).

    Example:
        >>> supports(resolve_target("kvcheck"), "meta_device", family="mha")
        True
    """
    return capability_skip_reason(target, [capability], family=family) is None


def expected_failure_reason(target: Target, nodeid: str) -> str | None:
    """The reason ``target`` declares for expecting test ``nodeid`` to fail, else ``None``.

    Keys of ``target.expected_failures`` are node-id patterns matched against the end of
    ``nodeid`` at a path boundary (``test_mod.py::test_f[case]`` matches
    ``kvcheck/suite/test_mod.py::test_f[case]``); ``*`` matches any run of characters and
    is the only wildcard (brackets are literal, as in parametrize ids). The first matching
    key wins.

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(expected_failures={"test_a.py::test_f[x-*]": "bug 1"})
        >>> expected_failure_reason(target, "pkg/suite/test_a.py::test_f[x-2]")
        'bug 1'
    """
    if not isinstance(nodeid, str):
        raise ValueError(f"nodeid={nodeid!r} must be a pytest node id (str)")
    declared = getattr(target, "expected_failures", None) or {}
    for pattern, reason in declared.items():
        if _nodeid_pattern(pattern).search(nodeid):
            return str(reason)
    return None


def prepare_target(target: Target) -> None:
    """Run ``target.prepare()`` when the target has one; failures become :class:`TargetError`.

    Example:
        >>> prepare_target(resolve_target("kvcheck"))
    """
    prepare = getattr(target, "prepare", None)
    if prepare is None:
        return
    try:
        prepare()
    except Exception as exc:  # any setup failure is reported with the target name
        raise TargetError(
            f"target {getattr(target, 'name', target)!r}: prepare() failed with "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def nodeid_matches(pattern: str, nodeid: str) -> bool:
    """Whether node-id ``pattern`` names test ``nodeid`` (the rule of
    :func:`expected_failure_reason`: a suffix at a path boundary, ``*`` any run).

    Example:
        >>> nodeid_matches("test_a.py::test_f[*]", "suite/test_a.py::test_f[x]")
        True
    """
    return _nodeid_pattern(pattern).search(nodeid) is not None


def _nodeid_pattern(pattern: str) -> re.Pattern[str]:
    body = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.compile(rf"(?:^|/){body}$")


def _unsupported_key_problem(key: object) -> str | None:
    """What is wrong with ``key`` as a capability or "capability:family" (None if fine)."""
    if not isinstance(key, str):
        return f"{key!r} is not a str"
    capability, separator, family = key.partition(FAMILY_SEPARATOR)
    if capability not in CAPABILITIES:
        return f"unknown capability {capability!r} in {key!r} (known: {', '.join(CAPABILITIES)})"
    if separator and family not in POOL_FAMILIES:
        return f"unknown pool family {family!r} in {key!r} (known: {', '.join(POOL_FAMILIES)})"
    return None


def _optional_member_problems(target: object) -> list[str]:
    """Problems with the optional members (:data:`OPTIONAL_MEMBERS`) the target has."""
    problems: list[str] = []
    for member in ("prepare", "describe", "pd_registration", "hicache_assembly"):
        value = getattr(target, member, None)
        if value is not None and not callable(value):
            problems.append(f"{member}: {value!r} is not callable")
    parameters = getattr(target, "identity_parameters", None)
    if parameters is not None and not (
        isinstance(parameters, Mapping) and all(isinstance(key, str) for key in parameters)
    ):
        problems.append(
            f"identity_parameters: {parameters!r} (expected a mapping parameter name -> value)"
        )
    expected = getattr(target, "expected_failures", None)
    if expected is not None:
        if not isinstance(expected, Mapping):
            problems.append(
                f"expected_failures: {expected!r} (expected a mapping pattern -> reason)"
            )
        else:
            for pattern, reason in expected.items():
                if not isinstance(pattern, str) or "::" not in pattern:
                    problems.append(
                        f"expected_failures: pattern {pattern!r} must be a str naming a "
                        "module and a test ('test_mod.py::test_name[...]')"
                    )
                if not isinstance(reason, str) or not reason.strip():
                    problems.append(
                        f"expected_failures[{pattern!r}]: reason {reason!r} must be a non-empty str"
                    )
    unsized = getattr(target, "unsized_kv_cache_dtypes", None)
    if unsized is not None and not (
        isinstance(unsized, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in unsized.items())
    ):
        problems.append(
            f"unsized_kv_cache_dtypes: {unsized!r} (expected a mapping --kv-cache-dtype -> "
            "a non-empty reason)"
        )
    findings = getattr(target, "findings", None)
    if findings is not None:
        from kvcheck.targets.findings import finding_problems

        problems.extend(finding_problems(findings))
    try:
        surface_of(target)
        declaration_of(target)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _import_attr(spec: str, module_name: str, attr_path: str) -> Any:
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{module_name}.".startswith(f"{exc.name}."):
            # The module exists and imports something missing: its traceback says where.
            raise TargetCodeError(
                f"target {spec!r}: importing module {module_name!r} failed with "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        raise TargetError(
            f"target {spec!r}: importing module {module_name!r} failed with "
            f"{type(exc).__name__}: {exc}; {_VALID_NAMES_HINT}"
        ) from exc
    except Exception as exc:  # any import-time failure is reported with the target name
        raise TargetCodeError(
            f"target {spec!r}: importing module {module_name!r} failed with "
            f"{type(exc).__name__}: {exc}; {_VALID_NAMES_HINT}"
        ) from exc
    owner = f"module {module_name!r}"
    found: list[str] = []
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            hint = _did_you_mean(part, [name for name in dir(obj) if not name.startswith("_")])
            raise TargetError(
                f"target {spec!r}: {owner} has no attribute {part!r}{hint}; {_VALID_NAMES_HINT}"
            ) from exc
        found.append(part)
        owner = repr(f"{module_name}:{'.'.join(found)}")
    return obj


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice nearest ``name`` (case-blind), or nothing."""
    lowered = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def _instantiate(spec: str, obj: Any) -> Any:
    """A class or factory is called with no arguments; an instance is used as it is."""
    if not isinstance(obj, type) and not check_target(obj):
        return obj
    if not callable(obj):
        return obj  # check_target reports what is missing
    try:
        return obj()
    except Exception as exc:  # construction failures carry the target name
        raise TargetCodeError(
            f"target {spec!r}: calling {obj!r} with no arguments failed with "
            f"{type(exc).__name__}: {exc}"
        ) from exc
