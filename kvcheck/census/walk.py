"""Every tensor an object holds, by the dotted path that reaches it.

The walk goes through attributes, lists, tuples, dicts and nested plain objects (a
sub-pool, a frozen dataclass of states), never into modules, functions, classes or
``torch.nn.Module`` s, and visits each object once, so a sub-pool that points back at
its parent ends the walk there. A tensor reached twice keeps its first path; the other
paths are its aliases.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> shared = torch.zeros(2)
    >>> pool = SimpleNamespace(k=[shared, torch.ones(3)], sub=SimpleNamespace(same=shared))
    >>> [(found.path, found.aliases) for found in walk_tensors(pool)]
    [('k[0]', ('sub.same',)), ('k[1]', ())]
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FoundTensor", "walk_tensors"]

#: How deep the walk goes below the pool (sub-pools of sub-pools are three or four deep).
MAX_DEPTH = 8
#: Leaf types that hold no tensor.
_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


@dataclass(frozen=True)
class FoundTensor:
    """A tensor, the first path that reaches it, its other paths, and the context of the
    object that holds it (what ``enter`` made of the pool or sub-pool it sits in)."""

    path: str
    tensor: torch.Tensor = dataclasses.field(repr=False, compare=False)
    context: Any = dataclasses.field(repr=False, compare=False, default=None)
    aliases: tuple[str, ...] = ()


def _skipped(value: object) -> bool:
    return (
        isinstance(value, _LEAVES)
        or inspect.ismodule(value)
        or inspect.isroutine(value)
        or inspect.isclass(value)
        or isinstance(value, torch.nn.Module)
    )


def _children(value: object) -> Iterator[tuple[str, object]]:
    """(path suffix, child) for each item or attribute of ``value``."""
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield f"[{index}]", item
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"[{key!r}]", item
    else:
        try:
            attributes = dict(vars(value))
        except TypeError:
            return
        for name, item in attributes.items():
            yield f".{name}", item


def walk_tensors(
    obj: object,
    *,
    context: Any = None,
    enter: Callable[[object, Any], Any] | None = None,
) -> list[FoundTensor]:
    """Every tensor reachable from ``obj``, in the order its attributes were set, each
    once (see the module docstring). Each plain object the walk enters below ``obj`` gets
    ``enter(value, context of its holder)`` as its own context (the census reads a
    sub-pool's geometry there); ``obj``'s is ``context``."""
    found: dict[int, FoundTensor] = {}
    seen: set[int] = {id(obj)}

    def visit(value: object, path: str, held_in: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            earlier = found.get(id(value))
            if earlier is None:
                found[id(value)] = FoundTensor(path, value, held_in)
            else:
                found[id(value)] = dataclasses.replace(earlier, aliases=(*earlier.aliases, path))
            return
        if _skipped(value) or depth > MAX_DEPTH or id(value) in seen:
            return
        seen.add(id(value))
        inner = held_in
        if not isinstance(value, (list, tuple, dict)) and enter is not None:
            inner = enter(value, held_in)
        for suffix, child in _children(value):
            visit(child, f"{path}{suffix}", inner, depth + 1)

    for suffix, child in _children(obj):
        visit(child, suffix.lstrip("."), context, 1)
    return list(found.values())
