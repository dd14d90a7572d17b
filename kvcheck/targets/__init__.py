"""Choosing what the suite checks: one resolver shared by the pytest plugin and the CLI.

A target is named by ``--kvcheck-target`` / ``KVCHECK_TARGET`` (or ``kvcheck verify
--target``). Built-in names are ``kvcheck`` (this package's pools, the default) and
``sglang`` (the installed sglang package, through an adapter); anything else is
``module:attr``, where ``attr`` is a target instance, a class or a zero-argument factory.

Example:
    >>> target = resolve_target("kvcheck")
    >>> target.name
    'kvcheck'
    >>> capability_skip_reason(target, ["mha_pool"]) is None
    True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from kvcheck.targets.base import CAPABILITIES, Target

__all__ = [
    "BUILTIN_TARGETS",
    "CAPABILITIES",
    "DEFAULT_TARGET",
    "TARGET_ENV_VAR",
    "Target",
    "TargetError",
    "capability_skip_reason",
    "check_target",
    "resolve_target",
    "target_spec",
]

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


def resolve_target(name: str | None = None) -> Target:
    """Turn a target name into a target, or raise :class:`TargetError` saying why not.

    ``None`` means ``KVCHECK_TARGET``, then ``kvcheck``. ``module:attr`` imports
    ``module`` and looks up ``attr`` (dots allowed: ``pkg.mod:Factory.default``).

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
        raise TargetError(f"unknown target {spec!r}; {_VALID_NAMES_HINT}")
    obj = _import_attr(spec, module_name.strip(), attr_path.strip())
    target = _instantiate(spec, obj)
    problems = check_target(target)
    if problems:
        raise TargetError(
            f"target {spec!r} resolved to {target!r}, which does not satisfy the kvcheck "
            f"Target protocol: {'; '.join(problems)}"
        )
    return target


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
    for capability, reason in unsupported.items():
        if capability not in CAPABILITIES:
            problems.append(
                f"unsupported: unknown capability {capability!r} (known: {', '.join(CAPABILITIES)})"
            )
        if not isinstance(reason, str) or not reason.strip():
            problems.append(
                f"unsupported[{capability!r}]: reason {reason!r} must be a non-empty str"
            )
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


def capability_skip_reason(target: Target, capabilities: Iterable[str]) -> str | None:
    """Why a test needing ``capabilities`` must be skipped on ``target``; ``None`` if it can run.

    Unknown capability names are a bug in the test, so they raise ``ValueError``.

    Example:
        >>> capability_skip_reason(resolve_target("kvcheck"), ["dsa_pool", "move"]) is None
        True
    """
    wanted = list(capabilities)
    unknown = [capability for capability in wanted if capability not in CAPABILITIES]
    if unknown:
        raise ValueError(
            f"capabilities={unknown!r} are not kvcheck capabilities; "
            f"known: {', '.join(CAPABILITIES)}"
        )
    missing = [
        f"{capability} ({target.unsupported[capability]})"
        for capability in dict.fromkeys(wanted)
        if capability in target.unsupported
    ]
    if not missing:
        return None
    return f"target {target.name!r} does not support {'; '.join(missing)}"


def _import_attr(spec: str, module_name: str, attr_path: str) -> Any:
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is reported with the target name
        raise TargetError(
            f"target {spec!r}: importing module {module_name!r} failed with "
            f"{type(exc).__name__}: {exc}; {_VALID_NAMES_HINT}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise TargetError(
                f"target {spec!r}: module {module_name!r} has no attribute {attr_path!r} "
                f"({exc}); {_VALID_NAMES_HINT}"
            ) from exc
    return obj


def _instantiate(spec: str, obj: Any) -> Any:
    """A class or factory is called with no arguments; an instance is used as it is."""
    if not isinstance(obj, type) and not check_target(obj):
        return obj
    if not callable(obj):
        return obj  # check_target reports what is missing
    try:
        return obj()
    except Exception as exc:  # construction failures carry the target name
        raise TargetError(
            f"target {spec!r}: calling {obj!r} with no arguments failed with "
            f"{type(exc).__name__}: {exc}"
        ) from exc
