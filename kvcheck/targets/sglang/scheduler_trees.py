"""The prefix caches the sglang scheduler-memory driver builds, and how each one's tree
is read for the laws (`kvcheck.targets.sglang.scheduler_memory`).

sglang's scheduler gets its tree cache from ``mem_cache/registry.py``: on every release in
``releases.txt`` a plain model (no sliding window, no mamba state, no storage backend)
gets a ``UnifiedRadixCache`` with one component, ``FULL``, over a tree core the registry
picks (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, default the compiled Rust core where it
loads, else the Python one). The plain ``RadixCache`` is what FlexKV builds on and what
the waiting queue simulates with. So the driver offers (`PREFIX_CACHES`):

- ``unified``: built by sglang's own ``create_tree_cache``, with the core it selects;
- ``unified-python``: the same, on sglang's Python tree core (its fallback for sessions,
  custom components and other platforms);
- ``radix``: the plain ``RadixCache``.

Reading the tree: the ``RadixCache`` and the Python core hold node objects, read as they
are (their id, parent, key, ``FULL`` slots, lock count). The Rust core lists no nodes; it
answers a walk of every cached slot (slot, position, previous slot on its path), which of
them are unlocked, and the slots on a node's root path. From these the reader makes one
node per page: its slots in path order, its parent the page of its first slot's previous
slot, its lock count 0 where the walk says unlocked and otherwise the live requests whose
locked path (the core's own) crosses it (at least 1, so a lock no request holds shows).
The Rust core does not hand out its keys: a cached slot's token is the one the driver
wrote there (``written``), so the bytes law checks that each slot's path is its writer's
prefix, not the core's key.

Example, where sglang is installed::

    tree = build_prefix_cache(modules, "unified", params)  # UnifiedRadixCache
    nodes, locked = read_nodes(tree, page_size=1, written={}, locks=[])  # ([], []) empty
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["PREFIX_CACHES", "build_prefix_cache", "lock_handle_id", "read_nodes"]

#: The prefix caches the driver builds; the first is the one the scheduler gets.
PREFIX_CACHES = ("unified", "unified-python", "radix")

#: What `build_prefix_cache` passes for each ``TreeCacheBuildContext`` field a release
#: defines: a plain single-rank model with the radix cache on and no HiCache.
_PLAIN_MODEL = dict(
    server_args=None,
    is_hybrid_swa=False,
    is_hybrid_ssm=False,
    enable_hierarchical_cache=False,
    disable_radix_cache=False,
    effective_chunked_prefill_size=None,
    tp_worker=None,
    model_config=None,
    tp_size=1,
    tp_rank=0,
    tp_group=None,
)


def build_prefix_cache(modules: Any, prefix_cache: str, params: Any) -> Any:
    """Build ``prefix_cache`` (one of `PREFIX_CACHES`) from sglang's ``CacheInitParams``
    ``params``, the way the scheduler does (call inside the runtime config)."""
    if prefix_cache == "radix":
        return modules.RadixCache(params)
    if prefix_cache == "unified-python":
        params = dataclasses.replace(params, tree_core_backend="python")
    context = modules.registry.TreeCacheBuildContext
    fields = {f.name for f in dataclasses.fields(context)}
    unknown = fields - set(_PLAIN_MODEL) - {"params", "full_tokens_per_layer", "is_dsa"}
    if unknown:
        raise RuntimeError(
            f"this sglang's TreeCacheBuildContext has fields the driver cannot fill: "
            f"{sorted(unknown)}"
        )
    offered = {name: value for name, value in _PLAIN_MODEL.items() if name in fields}
    return modules.registry.create_tree_cache(context(params=params, **offered))


def lock_handle_id(tree: Any, handle: Any) -> int | None:
    """The id of the node ``handle`` names (a node object or a ``NodeId``), ``None`` for
    the root or no node."""
    if handle is None:
        return None
    root = tree.root_node_handle()
    if handle is root or handle == root:
        return None
    return int(handle) if isinstance(handle, int) else int(handle.id)


def _is_rust(tree: Any) -> bool:
    core = getattr(tree, "tree_core", None)
    return core is not None and ".rust_tree_core." in type(core).__module__


def read_nodes(
    tree: Any, *, page_size: int, written: dict[int, tuple[int, ...]], locks: Sequence[Any]
) -> tuple[list[dict[str, Any]], list[int | None]]:
    """The tree's nodes as ``CachedNode`` fields, and for each lock handle in ``locks``
    (a node or ``NodeId``; ``None``: no lock) the id of the node that stands for it among
    them, ``None`` for the root or no lock (see the module docstring)."""
    if _is_rust(tree):
        return _rust_nodes(tree, page_size, written, locks)
    root = tree.root_node if not hasattr(tree, "tree_core") else tree.tree_core.root_node
    nodes, stack = [], list(root.children.values())
    while stack:
        node = stack.pop()
        stack += node.children.values()
        # A unified node keeps its slots and lock per component; FULL comes first.
        full = node.component(tree.tree_components[0]) if hasattr(node, "component") else None
        value = full.value if full is not None else node.value
        nodes.append(
            dict(
                node_id=int(node.id),
                parent_id=None if node.parent is root else int(node.parent.id),
                tokens=tuple(int(t) for t in node.key.token_ids),
                slots=tuple(int(s) for s in value.tolist()) if value is not None else (),
                lock_ref=int(full.lock_ref if full is not None else node.lock_ref),
            )
        )
    return nodes, [lock_handle_id(tree, handle) for handle in locks]


def _rust_nodes(
    tree: Any, page_size: int, written: dict[int, tuple[int, ...]], locks: Sequence[Any]
) -> tuple[list[dict[str, Any]], list[int | None]]:
    core = tree.tree_core
    walk = core.walk_for_kv_canary(False, False)
    slots = [int(s) for s in walk.slot_indices.tolist()]
    position = dict(zip(slots, (int(p) for p in walk.positions.tolist()), strict=True))
    previous = dict(zip(slots, (int(p) for p in walk.prev_slot_indices.tolist()), strict=True))
    unlocked = {int(s) for s in core.walk_for_kv_canary(True, False).slot_indices.tolist()}
    pages: dict[int, list[int]] = {}
    for slot in slots:
        pages.setdefault(slot // page_size, []).append(slot)

    def parent_page(page: int) -> int | None:
        first = min(pages[page], key=position.__getitem__)
        before = previous[first]
        return None if before < 0 else before // page_size

    def path_pages(page: int | None) -> list[int]:
        path = []
        while page is not None and page in pages and page not in path:
            path.append(page)
            page = parent_page(page)
        return path

    stands_for: list[int | None] = []
    held: Counter[int] = Counter()
    root = tree.root_node_handle()
    for handle in locks:
        on_path = (
            core.collect_full_device_indices(handle, root).tolist()
            if lock_handle_id(tree, handle) is not None
            else []
        )
        stands_for.append(int(on_path[-1]) // page_size if on_path else None)
        held.update(path_pages(stands_for[-1]))
    nodes = []
    for page, members in pages.items():
        members.sort(key=position.__getitem__)
        locked = any(s not in unlocked for s in members)
        nodes.append(
            dict(
                node_id=page,
                parent_id=parent_page(page),
                tokens=tuple(written[s][-1] if s in written else -1 for s in members),
                slots=tuple(members),
                lock_ref=max(held[page], 1) if locked else 0,
            )
        )
    return nodes, stands_for
