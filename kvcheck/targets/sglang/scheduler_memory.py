"""sglang's own scheduler memory code, driven step by step for the scheduler-memory
machine (`kvcheck.scheduler`): ``mem_cache/allocation.py`` (``alloc_for_extend``,
``alloc_for_decode``) and ``mem_cache/common.py`` (the prefix match through
``Req.init_next_round_input``, as the scheduler makes it; the chunk checkpoint;
``release_kv_cache``; ``backup_kv_cache`` / ``restore_kv_cache``;
``evict_from_tree_cache``) over the prefix cache sglang's scheduler gets
(``UnifiedRadixCache``, built by sglang's own registry; see
`kvcheck.targets.sglang.scheduler_trees` for the three the driver offers and how each
tree is read), ``ReqToTokenPool``, token or paged allocator and an
``MHATokenToKVPool`` (float32, one layer, one head of width 1: the KV value a step
writes is one exact number per slot). Requests are sglang's own ``Req``.
Every function is called, none copied. What the releases spell differently (the prefix
lock, the chunk checkpoint, the request's prefix fields) goes through
`kvcheck.targets.sglang.scheduler_api`, which reads the spelling off the installed
release: every release in ``releases.txt`` is driven.

Stand-ins (what each replaces, why it is faithful):

- `_Batch` replaces ``ScheduleBatch``: it carries only the fields the allocation
  functions read (``reqs``, the pools, ``tree_cache``, ``device``, ``prefix_lens``,
  ``extend_lens``, ``extend_num_tokens``, ``seq_lens`` and their CPU copies,
  ``req_pool_indices``), filled from the requests as ``ScheduleBatch.prepare_for_extend``
  / ``prepare_for_decode`` fill them; ``maybe_evict_swa`` does nothing (no SWA pool
  here), ``is_dllm`` is false, no HiSparse coordinator, not encoder-decoder.
- The runtime config is published with ``override_server_args(attention_backend=
  "torch_native", speculative_algorithm="EAGLE")``: the torch-native backend takes
  sglang's own loop writer of the req-to-token rows instead of its Triton kernel, and a
  speculative algorithm makes ``release_kv_cache`` free over-allocated tail slots as
  sglang does under speculative decoding.
- The forward pass is replaced by writing `kv_value` of each position's prefix into the
  pool through ``set_kv_buffer`` at the slots sglang allocated.
- Speculative drafts (``alloc_for_spec_decode``) need sglang's Triton kernel
  ``assign_req_to_token_pool`` on a non-CPU build: a decode with drafts is refused here.

Example, where sglang is installed::

    memory = SglangSchedulerMemory(total=8, page_size=1, rows=2, max_len=8)
    memory.admit("a", [1, 2, 3], first_chunk=3)  # True
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import torch

from kvcheck.targets.sglang import env
from kvcheck.targets.sglang.scheduler_api import (
    SchedulerApi,
    missing_for_every_api,
    scheduler_api,
)
from kvcheck.targets.sglang.scheduler_checker import SglangInvariantChecker, why_not_checked
from kvcheck.targets.sglang.scheduler_trees import PREFIX_CACHES, build_prefix_cache, read_nodes

__all__ = [
    "PREFIX_CACHES",
    "REFUSED_POLICIES",
    "SglangSchedulerMemory",
    "eviction_policies",
    "why_not_driven",
]


def _kv_value(tokens: tuple[int, ...]) -> int:
    # The same formula as kvcheck.scheduler.snapshot.kv_value, kept here because the
    # targets layer sits below the scheduler package (a test holds the two equal).
    value = 7
    for token in tokens:
        value = (value * 31 + token + 1) % 65521
    return value


#: What the driver calls in sglang's own code on every release, by module; what the
#: releases spell differently is in `kvcheck.targets.sglang.scheduler_api`.
DRIVEN_API: dict[str, tuple[str, ...]] = {
    "allocation": ("alloc_for_extend", "alloc_for_decode"),
    "common": ("backup_kv_cache", "restore_kv_cache", "evict_from_tree_cache"),
    "RadixCache": ("evictable_size", "protected_size", "reset"),
}


def why_not_driven() -> str | None:
    """Why the installed sglang cannot be driven (a release whose scheduler memory API
    fits none of the spellings `scheduler_api` knows), or None.

    Example, where sglang is installed::

        why_not_driven()  # None on every release in releases.txt
    """
    try:
        found = _modules()
    except ImportError as error:
        return f"sglang's scheduler memory modules do not import here: {error}"
    missing = [
        f"{owner}.{name}"
        for owner, names in DRIVEN_API.items()
        for name in names
        if not hasattr(getattr(found, owner), name)
    ]
    if missing:
        return "this sglang's scheduler memory API lacks what the driver calls: " + ", ".join(
            missing
        )
    if scheduler_api(found) is None:
        return (
            "this sglang spells the scheduler's prefix locks and chunk checkpoints in none "
            "of the ways the driver knows (" + missing_for_every_api(found) + ")"
        )
    return None


#: ``--radix-eviction-policy`` choices the plain ``RadixCache`` is refused, and why (the
#: driver draws every other choice the installed release offers; the unified caches take
#: every one).
REFUSED_POLICIES: dict[str, str] = {
    "tlru": "sglang's cache registry (mem_cache/registry.py) refuses "
    "--radix-eviction-policy tlru unless the cache is a UnifiedRadixCache",
}


def eviction_policies(prefix_cache: str = PREFIX_CACHES[0]) -> tuple[str, ...]:
    """The eviction policies the driver's ``prefix_cache`` (one of `PREFIX_CACHES`) is
    drawn with: the installed release's ``--radix-eviction-policy`` choices, ``lru`` first
    (what examples shrink towards), less `REFUSED_POLICIES` for the plain ``RadixCache``.

    Example, where sglang is installed::

        eviction_policies("radix")  # ('lru', 'lfu', 'slru', 'priority') on 0.5.21 to 0.5.23
    """
    with env.torchvision_stand_in():
        from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    refused = REFUSED_POLICIES if prefix_cache == "radix" else {}
    offered = [p for p in RADIX_EVICTION_POLICY_CHOICES if p not in refused]
    return tuple(sorted(offered, key=lambda policy: policy != "lru"))


def _modules() -> SimpleNamespace:
    with env.torchvision_stand_in():
        from sglang.srt.managers import schedule_batch
        from sglang.srt.mem_cache import (
            allocation,
            cache_init_params,
            common,
            memory_pool,
            radix_cache,
            registry,
        )
        from sglang.srt.runtime_context import get_context
        from sglang.srt.sampling import sampling_params
    return SimpleNamespace(
        Req=schedule_batch.Req,
        allocation=allocation,
        common=common,
        CacheInitParams=cache_init_params.CacheInitParams,
        MHATokenToKVPool=memory_pool.MHATokenToKVPool,
        ReqToTokenPool=memory_pool.ReqToTokenPool,
        RadixCache=radix_cache.RadixCache,
        registry=registry,
        get_context=get_context,
        SamplingParams=sampling_params.SamplingParams,
    )


class _Batch:
    """The fields of ``ScheduleBatch`` the allocation functions read (see the module)."""

    def __init__(self, memory: SglangSchedulerMemory, reqs: list[Any]) -> None:
        self.reqs = reqs
        self.req_to_token_pool = memory.req_to_token_pool
        self.tree_cache = memory.tree
        self.device = "cpu"
        self.hisparse_coordinator = None
        self.model_config = SimpleNamespace(is_encoder_decoder=False)
        self.out_cache_loc_dsv4 = None

    def maybe_evict_swa(self) -> None:
        """No SWA pool here."""

    def is_dllm(self) -> bool:
        return False

    def for_extend(self, api: SchedulerApi) -> _Batch:
        self.prefix_lens = [api.prefix_len(r) for r in self.reqs]
        self.extend_lens = [api.extend_end(r) - api.prefix_len(r) for r in self.reqs]
        self.extend_num_tokens = sum(self.extend_lens)
        ends = [api.extend_end(r) for r in self.reqs]
        self.seq_lens_cpu = torch.tensor(ends, dtype=torch.int64)
        self.seq_lens = self.seq_lens_cpu.clone()
        return self

    def for_decode(self) -> _Batch:
        self.seq_lens_cpu = torch.tensor(
            [r.kv.kv_committed_len for r in self.reqs], dtype=torch.int64
        )
        self.seq_lens = self.seq_lens_cpu.clone()
        self.req_pool_indices_cpu = torch.tensor(
            [r.kv.req_pool_idx for r in self.reqs], dtype=torch.int64
        )
        self.req_pool_indices = self.req_pool_indices_cpu.clone()
        return self


class SglangSchedulerMemory:
    """sglang's scheduler memory with ``total`` KV slots in pages of ``page_size``,
    ``rows`` req-to-token rows of ``max_len`` positions, ``prefix_cache`` (one of
    `PREFIX_CACHES`) and ``eviction`` (one of `eviction_policies`); the same steps and
    `snapshot` as kvcheck's reference."""

    def __init__(
        self,
        *,
        total: int,
        page_size: int,
        rows: int,
        max_len: int,
        eviction: str = "lru",
        prefix_cache: str = PREFIX_CACHES[0],
    ) -> None:
        self.m = _modules()
        api = scheduler_api(self.m)
        if api is None:
            raise RuntimeError(str(why_not_driven()))
        self.api = api
        self.total, self.page_size, self.max_len = total, page_size, max_len
        self._config = self.m.get_context().override_server_args(
            attention_backend="torch_native", speculative_algorithm="EAGLE"
        )
        self.pool = self.m.MHATokenToKVPool(
            size=total,
            page_size=page_size,
            dtype=torch.float32,
            head_num=1,
            head_dim=1,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        from kvcheck.targets.sglang.allocators import make_allocator
        from kvcheck.tiers import AllocatorSpec

        kind = "token" if page_size == 1 else "paged"
        self.allocator = make_allocator(
            AllocatorSpec(kind=kind, size=total, page_size=page_size),
            device="cpu",
            kvcache=self.pool,
        )
        self.req_to_token_pool = self.m.ReqToTokenPool(
            size=rows, max_context_len=max_len, device="cpu", enable_memory_saver=False
        )
        params = self.m.CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page_size,
            eviction_policy=eviction,
        )
        self.prefix_cache = prefix_cache
        self.tree = self._run(build_prefix_cache, self.m, prefix_cache, params)
        # The token each written slot holds the KV of, as the last of its prefix (the
        # Rust tree core hands out no keys: see scheduler_trees).
        self.written: dict[int, tuple[int, ...]] = {}
        self.requests: dict[str, Any] = {}
        self.backups: dict[str, Any] = {}
        # sglang's own invariant checker, asked after every step beside kvcheck's laws.
        self.checker = SglangInvariantChecker(self) if why_not_checked() is None else None

    def _run(self, step: Any, *args: Any, **kwargs: Any) -> Any:
        self._config.install()
        try:
            return step(*args, **kwargs)
        finally:
            self._config.restore()

    # -- steps -------------------------------------------------------------------

    def _room(self, tokens: int) -> bool:
        return self.allocator.available_size() + self.tree.evictable_size() >= tokens

    def _write(self, req: Any, start: int, end: int) -> None:
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        for position in range(start, end):
            value = float(_kv_value(tuple(tokens[: position + 1])))
            self.written[int(row[position])] = tuple(tokens[: position + 1])
            self.pool.k_buffer[0][int(row[position])] = value
            self.pool.v_buffer[0][int(row[position])] = value

    def admit(self, rid: str, tokens: list[int], *, first_chunk: int) -> bool:
        return bool(self._run(self._admit, rid, tokens, first_chunk))

    def _admit(self, rid: str, tokens: list[int], first_chunk: int) -> bool:
        if self.req_to_token_pool.available_size() == 0 or len(tokens) > self.max_len:
            return False
        req = self.m.Req(rid, "", array("q", tokens), self.m.SamplingParams(max_new_tokens=64))
        # The scheduler's own match: Req.init_next_round_input calls match_kv_cache
        # and marks the match as the tree-protected prefix.
        req.init_next_round_input(self.tree)
        api = self.api
        api.lock_match(self.tree, req)
        api.set_extend_end(req, min(len(tokens), api.prefix_len(req) + first_chunk))
        if not self._room(self._extend_need(req)):
            api.unlock_match(self.tree, req)
            return False
        self.m.allocation.alloc_for_extend(_Batch(self, [req]).for_extend(api))
        self._write(req, api.prefix_len(req), api.extend_end(req))
        self.requests[rid] = req
        return True

    def _extend_need(self, req: Any) -> int:
        return self.api.extend_end(req) - self.api.prefix_len(req) + self.page_size

    def prefill_chunk(self, rid: str, tokens: int) -> bool:
        return bool(self._run(self._prefill_chunk, rid, tokens))

    def _prefill_chunk(self, rid: str, tokens: int) -> bool:
        req = self.requests[rid]
        api = self.api
        api.checkpoint(req, self.tree)
        start = api.prefix_len(req)
        end = min(len(req.origin_input_ids), start + tokens)
        # A refused chunk leaves the extend's end alone: the next checkpoint reads it.
        if not self._room(end - start + self.page_size):
            return False
        api.set_extend_end(req, end)
        self.m.allocation.alloc_for_extend(_Batch(self, [req]).for_extend(api))
        self._write(req, start, end)
        return True

    def decode(self, rid: str, accepted: list[int], *, draft: int) -> bool:
        return bool(self._run(self._decode, rid, accepted, draft))

    def _decode(self, rid: str, accepted: list[int], draft: int) -> bool:
        req = self.requests[rid]
        if draft or req.kv.kv_committed_len + 1 > self.max_len:
            return False  # drafts: see the module docstring
        if not self._room(self.page_size):
            return False
        req.output_ids.append(accepted[0])
        start = req.kv.kv_committed_len
        self.m.allocation.alloc_for_decode(_Batch(self, [req]).for_decode(), 1)
        self._write(req, start, start + 1)
        return True

    def finish(self, rid: str) -> None:
        req = self.requests.pop(rid)
        req.finished_len = len(req.output_ids)
        self._run(self.api.release, req, self.tree, cache=True)

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid)
        self._run(self.api.release, req, self.tree, cache=False)

    def retract(self, rid: str) -> bool:
        return bool(self._run(self._retract, rid))

    def _retract(self, rid: str) -> bool:
        req = self.requests.pop(rid)
        c = self.m.common
        c.backup_kv_cache(req, self.tree, self.req_to_token_pool, self.allocator, "cpu_tensor")
        self.api.release(req, self.tree, cache=False)
        self.backups[rid] = req
        return True

    def restore(self, rid: str) -> bool:
        return bool(self._run(self._restore, rid))

    def _restore(self, rid: str) -> bool:
        old = self.backups[rid]
        if self.req_to_token_pool.available_size() == 0:
            return False
        committed = len(old.origin_input_ids) + len(old.output_ids)
        req = self.m.Req(
            rid,
            "",
            array("q", list(old.origin_input_ids) + list(old.output_ids)),
            self.m.SamplingParams(max_new_tokens=64),
        )
        self.api.start_unmatched(req, self.tree)
        self.api.set_extend_end(req, committed)
        if not self._room(self._extend_need(req)):
            return False
        self.m.allocation.alloc_for_extend(_Batch(self, [req]).for_extend(self.api))
        req.kv.retraction_backup = old.kv.retraction_backup
        self.m.common.restore_kv_cache(
            req, self.tree, self.req_to_token_pool, self.allocator, "cpu_tensor"
        )
        self._write(req, committed - 1, committed)  # the backup holds seqlen - 1 positions
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        tokens = tuple(req.origin_input_ids) + tuple(req.output_ids)
        for position in range(committed - 1):  # what the restore copied back
            self.written[int(row[position])] = tokens[: position + 1]
        del self.backups[rid]
        self.requests[rid] = req
        return True

    def evict(self, tokens: int) -> int:
        before = self.allocator.available_size()
        self._run(
            self.m.common.evict_from_tree_cache, self.tree, self.allocator.available_size() + tokens
        )
        return int(self.allocator.available_size() - before)

    def flush(self) -> bool:
        if self.requests:
            return False
        self.tree.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
        return True

    # -- what the laws read ----------------------------------------------------------

    def raw_state(self) -> dict[str, Any]:
        """The fields of ``kvcheck.scheduler.snapshot.Snapshot``, read off sglang's
        objects (nodes and requests as plain dicts); the scheduler package builds the
        snapshot from them (it sits above this layer)."""
        allocator, ps = self.allocator, self.page_size
        # Both allocators keep free pages (a page is a slot at page size 1), some of
        # them parked in release_pages until the next merge.
        pages = [
            p
            for part in (allocator.free_pages, allocator.release_pages)
            if part is not None
            for p in part.tolist()
        ]
        free = {int(p) * ps + off for p in pages for off in range(ps)}
        nodes, locked_nodes = read_nodes(
            self.tree,
            page_size=ps,
            written=self.written,
            locks=[self.api.locked_node(req) for req in self.requests.values()],
        )
        requests = []
        for (rid, req), locked_node in zip(self.requests.items(), locked_nodes, strict=True):
            kv = req.kv
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
            requests.append(
                dict(
                    rid=rid,
                    row=int(kv.req_pool_idx),
                    row_slots=tuple(int(s) for s in row[: kv.kv_allocated_len].tolist()),
                    protected=int(kv.cache_protected_len),
                    committed=int(kv.kv_committed_len),
                    allocated=int(kv.kv_allocated_len),
                    tokens=tuple(int(t) for t in list(req.origin_input_ids) + list(req.output_ids)),
                    locked_node=locked_node,
                )
            )
        return dict(
            page_size=ps,
            total=self.total,
            available=int(allocator.available_size()),
            evictable=int(self.tree.evictable_size()),
            protected=int(self.tree.protected_size()),
            free_slots=frozenset(free),
            nodes=nodes,
            requests=requests,
            req_rows_total=int(self.req_to_token_pool.size),
            req_rows_free=int(self.req_to_token_pool.available_size()),
            read_slot=lambda slot: int(self.pool.k_buffer[0][slot].item()),
            own_checks=self._own_checks(),
        )

    def _own_checks(self) -> list[dict[str, Any]]:
        if self.checker is None:
            return []
        checker = self.checker
        return list(self._run(lambda: checker.verdicts(live=list(self.requests.values()))))
