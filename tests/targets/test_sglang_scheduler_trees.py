"""The prefix caches the sglang scheduler-memory driver builds
(`kvcheck.targets.sglang.scheduler_trees`): the scheduler's own ``UnifiedRadixCache`` (on
the tree core sglang selects: the compiled Rust one here), the same on sglang's Python
tree core, and the plain ``RadixCache``. The Rust core's tree is read without node objects
(pages from its slot walk); that reading agrees with the Python core's nodes on the same
steps, and the laws catch a lock no request holds on every cache. Runs only with
``KVCHECK_TARGET=sglang``."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from kvcheck.scheduler.drivers import memory_factory, memory_skip_reason
from kvcheck.scheduler.laws import LawBroken, check_laws
from kvcheck.scheduler.snapshot import Snapshot

pytestmark = pytest.mark.kvcheck_target("sglang")

CACHES = ("unified", "unified-python", "radix")


def _memory(prefix_cache: str, page_size: int = 1) -> Any:
    from kvcheck.targets import resolve_target

    target = resolve_target("sglang")
    reason = memory_skip_reason(target, paging="token" if page_size == 1 else "paged")
    if reason is not None:
        pytest.skip(reason)
    return memory_factory(target)(
        total=12 * page_size,
        page_size=page_size,
        rows=3,
        max_len=24,
        eviction="lru",
        prefix_cache=prefix_cache,
    )


def _steps(memory: Any) -> None:
    """Two requests sharing a prefix, one cached and one live, one chunked."""
    assert memory.admit("a", [1, 2, 0, 1, 2], first_chunk=5)
    assert memory.decode("a", [0], draft=0)
    memory.finish("a")
    assert memory.admit("b", [1, 2, 0, 1, 1, 2], first_chunk=5)
    assert memory.admit("c", [2, 2, 1, 0], first_chunk=2)
    assert memory.prefill_chunk("c", 2)


def _per_slot(snap: Snapshot) -> dict[int, tuple[tuple[int, ...], bool]]:
    """Each cached slot: the tokens of its path up to it, and whether it is locked."""
    by_id = {node.node_id: node for node in snap.nodes}
    found = {}
    for node in snap.nodes:
        path, walk = [], node
        while walk is not None:
            path.insert(0, walk)
            walk = by_id[walk.parent_id] if walk.parent_id is not None else None
        tokens = [t for n in path for t in n.tokens]
        start = len(tokens) - len(node.tokens)
        for offset, slot in enumerate(node.slots):
            found[slot] = (tuple(tokens[: start + offset + 1]), node.lock_ref > 0)
    return found


@pytest.mark.parametrize(
    ("prefix_cache", "built", "core"),
    [
        ("unified", "UnifiedRadixCache", "RustUnifiedTreeCore"),
        ("unified-python", "UnifiedRadixCache", "UnifiedTreeCore"),
        ("radix", "RadixCache", None),
    ],
)
def test_each_prefix_cache_is_the_class_it_names(
    prefix_cache: str, built: str, core: str | None
) -> None:
    """sglang's registry gives a plain model the unified cache on the Rust core here."""
    tree = _memory(prefix_cache).tree
    assert type(tree).__name__ == built
    assert (type(tree.tree_core).__name__ if core else None) == core


@pytest.mark.parametrize("page_size", [1, 2])
def test_the_rust_reading_agrees_with_the_python_cores_nodes(page_size: int) -> None:
    """Same steps, same allocator: every cached slot has the same path and lock state,
    and each request locks the same slots, whichever core holds the tree."""
    snaps = {}
    for cache in ("unified", "unified-python"):
        memory = _memory(cache, page_size)
        _steps(memory)
        snaps[cache] = memory.snapshot()
        check_laws(snaps[cache])
    rust, python = snaps["unified"], snaps["unified-python"]
    assert _per_slot(rust) == _per_slot(python) and _per_slot(rust)
    assert (rust.evictable, rust.protected) == (python.evictable, python.protected)
    assert [(r.rid, r.protected, r.row_slots) for r in rust.requests] == [
        (r.rid, r.protected, r.row_slots) for r in python.requests
    ]


@pytest.mark.parametrize("prefix_cache", CACHES)
def test_the_laws_catch_a_lock_no_request_holds(prefix_cache: str) -> None:
    """A lock taken behind the scheduler's back on a cached node breaks bookkeeping."""
    memory = _memory(prefix_cache)
    assert memory.admit("a", [1, 2, 0], first_chunk=3)
    memory.finish("a")
    check_laws(memory.snapshot())
    tree = memory.tree
    node = tree.match_prefix(_match_params([1, 2, 0])).last_device_node
    tree.inc_lock_ref(node)
    with pytest.raises(LawBroken) as broken:
        check_laws(memory.snapshot())
    assert broken.value.law in ("bookkeeping", "conservation")


def _match_params(tokens: list[int]) -> Any:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return MatchPrefixParams(key=RadixKey(array("q", tokens)))
