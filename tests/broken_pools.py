"""Deliberately broken pools, each with one bug a kvcheck property must catch.

Every class subclasses a kvcheck pool and breaks exactly one rule of the pool contract;
:class:`BrokenTarget` serves one of them in place of the real pool of its family. The
proof-of-failure tests (``test_pool_properties_fail.py``) run each property against its
broken twin and require it to fail, with Hypothesis shrinking to a small example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from kvcheck.pools import (
    DSATokenToKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolMXFP8,
    MLATokenToKVPool,
    MLATokenToKVPoolFP4,
    NoOpMHATokenToKVPool,
    QuantizedMHATokenToKVPool,
    _quant,
)
from kvcheck.pools._dcp import owned_mask
from kvcheck.pools._dtypes import as_storage, payload_dtypes
from kvcheck.pools._host_copy import KVHostCopy
from kvcheck.pools._index_k import IndexKPageLayout
from kvcheck.pools._refusals import check_payload, require_int
from kvcheck.pools._rows import move_rows, scatter_rows
from kvcheck.pools._scaled_latent import quantize_rows
from kvcheck.specs import PoolSpec
from kvcheck.targets.builtin import KVCheckTarget

# --- moves ---------------------------------------------------------------------------------


class PageRowMoveDSA(DSATokenToKVPool):
    """The seed's bug: index-K rows are pages, but the move indexes them by token location,
    so it copies whole page rows (or runs past the buffer) instead of one token's bytes."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        MLATokenToKVPool.move_kv_cache(self, tgt_loc, src_loc)
        if tgt_loc.numel() == 0:
            return
        tgt, src = tgt_loc.view(-1).long(), src_loc.view(-1).long()
        for i, index_k in enumerate(self.index_k_with_scale_buffer):
            if not self.skip_topk_layers[i]:
                index_k[tgt] = index_k[src]


class MoveIgnoresV(MHATokenToKVPool):
    """Moves K and forgets V."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        tgt, src = self._move_locations(tgt_loc, src_loc)
        if tgt.numel():
            move_rows(self.k_buffer, tgt=tgt, src=src, page_size=self._slot_pages)


class SequentialMoveMLA(MLATokenToKVPool):
    """Copies one token at a time, so a source that is also an earlier target is read
    after it was overwritten (moves must gather every source first)."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        limit, reason = self._token_bound()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        self._check_move_owners(tgt, src)
        tgt, src = self._owned_move(tgt, src)
        for buffer in self.kv_buffer:
            for t, s in zip(tgt.tolist(), src.tolist(), strict=True):
                buffer[t] = buffer[s]


# --- host copies ---------------------------------------------------------------------------


class HostCopyDropsIndexK(DSATokenToKVPool):
    """Reloads a host copy's latent rows but not its index-K pages."""

    def load_cpu_copy(
        self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor, req_pool_index: Any = None
    ) -> None:
        where = "load_cpu_copy"
        idx = self._copy_indices(indices, distinct=True, where=where)
        if idx.numel() != kv_cache_cpu.num_tokens:
            raise ValueError(
                f"load_cpu_copy: {idx.numel()} indices for a copy of "
                f"{kv_cache_cpu.num_tokens} tokens"
            )
        self._check_run(idx, where=where)
        request = self._tail_request(req_pool_index, where=where)
        self._load_latent_rows(kv_cache_cpu.parts["kv"], self._run_rows(idx))
        tails = None if request is None else self._checked_tails(kv_cache_cpu, where=where)
        if tails is not None and request is not None:  # tails travel; only index-K is dropped
            self._load_tails(tails, request)


# --- skip layers and accounting ------------------------------------------------------------


class AllocatingSkipDSA(DSATokenToKVPool):
    """Allocates a full index buffer for skip layers too, and hands out a zero-row view of
    it: the shape looks right, the memory is gone."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        row_bytes = self.index_layout.row_bytes
        for i, skip in enumerate(self.skip_topk_layers):
            if skip:
                full = self._zeros((self.num_index_pages, row_bytes), torch.uint8)
                self.index_k_with_scale_buffer[i] = full[:0]


class SkipCountingDSA(DSATokenToKVPool):
    """``get_kv_size_bytes`` counts every layer's index buffer as full, skip layers too."""

    def get_kv_size_bytes(self) -> int:
        full = self.num_index_pages * self.index_layout.row_bytes
        return MLATokenToKVPool.get_kv_size_bytes(self) + self.layer_num * full


class DecimalGigabytesMLA(MLATokenToKVPool):
    """Reports ``mem_usage`` in GB (10**9 bytes) instead of GiB."""

    @property
    def mem_usage(self) -> float:
        return self.get_kv_size_bytes() / 1e9


class SkipDescribingDSA(DSATokenToKVPool):
    """``get_state_buf_infos`` describes skip layers as if they had a full buffer."""

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        ptrs, lens, item_lens = super().get_state_buf_infos()
        full = self.num_index_pages * self.index_layout.row_bytes
        row = self.index_layout.row_bytes
        return ptrs, [full] * len(lens), [row] * len(item_lens)


# --- the no-op pool ------------------------------------------------------------------------


class SilentNoOp(NoOpMHATokenToKVPool):
    """``set_kv_buffer`` returns silently instead of raising."""

    def set_kv_buffer(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None


class FullSizeNoOp(NoOpMHATokenToKVPool):
    """Allocates full ``[size + page_size, ...]`` buffers instead of one-page placeholders."""

    def _buffer_rows(self) -> int:
        return self.num_slots


class ValidatingMoveNoOp(NoOpMHATokenToKVPool):
    """Validates and performs moves on its placeholders instead of ignoring them."""

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:  # type: ignore[override]
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=self.page_size)
        if tgt.numel():
            self.k_buffer[0][tgt] = self.k_buffer[0][src] + 1


# --- inputs --------------------------------------------------------------------------------


class LocSortingMHA(MHATokenToKVPool):
    """Sorts the caller's ``loc`` in place before writing (and writes rows in that order)."""

    def set_kv_buffer(self, layer: Any, loc: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if isinstance(loc, torch.Tensor) and loc.dim() == 1 and loc.numel() > 1:
            loc.copy_(loc.sort().values)
        super().set_kv_buffer(layer, loc, *args, **kwargs)


class HalfApplyingMHA(MHATokenToKVPool):
    """Writes K before it checks V, so a call rejected for its V has already written K."""

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: Any = None,
        v_scale: Any = None,
        layer_id_override: int | None = None,
    ) -> None:
        where = "set_kv_buffer"
        local = self._write_layer(layer, layer_id_override, where=where, reads_layer=True)
        idx = self._locations("loc", loc, distinct=True, where=where)
        n = idx.numel()
        k = self._native("cache_k", cache_k, (n, self.head_num, self.head_dim), where=where)
        # Either layout (the head-major one is addressed by page), as the real pool does.
        scatter_rows(self.k_buffer[local], idx, k, page_size=self._slot_pages)
        v = self._native("cache_v", cache_v, (n, self.head_num, self.v_head_dim), where=where)
        scatter_rows(self.v_buffer[local], idx, v, page_size=self._slot_pages)

    def _native(self, name: str, value: Any, shape: tuple[int, ...], *, where: str) -> Any:
        """``value`` checked as a payload in the pool's own dtype, viewed as storage."""
        tensor = check_payload(
            name,
            value,
            shape=shape,
            dtypes=payload_dtypes(self.dtype),
            device=self._torch_device,
            where=where,
        )
        return as_storage(tensor, self.store_dtype)


class TokenMajorMoveMHA(MHATokenToKVPool):
    """Moves buffer rows as if every layout were token-major: in the HND layout a row is a
    whole page, so a move copies the wrong bytes (or none)."""

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        tgt, src = self._move_locations(tgt_loc, src_loc)
        keep = (tgt < self.k_buffer[0].shape[0]) & (src < self.k_buffer[0].shape[0])
        move_rows(self.k_buffer + self.v_buffer, tgt=tgt[keep], src=src[keep])


class UnpaddedReportMHA(MHATokenToKVPool):
    """Reports the bytes of its K/V views, leaving out the page padding its fused
    allocation holds (as sglang 0.5.23 does, finding A1)."""

    def get_kv_size_bytes(self) -> tuple[int, int]:
        return sum(b.nbytes for b in self.k_buffer), sum(b.nbytes for b in self.v_buffer)


# --- the index kpool and compress tails (SGLang 0.5.23) -------------------------------------


class TokenPageIndexKpoolDSA(DSATokenToKVPool):
    """Maps an index slot to its page row and offset with ``page_size`` instead of
    ``index_page_size``: slot ``s`` lands at ``(s // page_size) * index_page_size + s %
    page_size`` (the right place only with a kpool of 1 or for ``s < page_size``)."""

    @dataclasses.dataclass(frozen=True)
    class Layout(IndexKPageLayout):
        """Rows of ``page_size`` index slots, addressed as if they held ``token_page_size``."""

        token_page_size: int = 1

        def _misplaced(self, slots: torch.Tensor) -> torch.Tensor:
            # Page and offset from the token page size; an offset past the row's slots runs
            # on into the next rows. Never beyond the slot itself, so never out of bounds.
            return (slots // self.token_page_size) * self.page_size + slots % self.token_page_size

        def write(
            self, buffer: torch.Tensor, tokens: torch.Tensor, key: torch.Tensor, scale: torch.Tensor
        ) -> None:
            super().write(buffer, self._misplaced(tokens), key, scale)

        def read(self, buffer: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            return super().read(buffer, self._misplaced(tokens))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index_layout = self.Layout(
            self.index_page_size, self.index_head_dim, token_page_size=self.page_size
        )


class HalfMoveKpoolDSA(DSATokenToKVPool):
    """With a kpool, moves the latent rows and only then refuses the index keys (SGLang
    0.5.23: ``super().move_kv_cache`` runs before ``IndexKeyCache.move`` asserts)."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        if self.index_kpool == 1:
            super().move_kv_cache(tgt_loc, src_loc)
            return
        limit, reason = self._index_token_limit()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        if tgt.numel() == 0:
            return
        if not self.is_meta:
            move_rows(self.kv_buffer, tgt=tgt, src=src)
        raise ValueError("move_kv_cache: moving pooled index keys requires regrouping tokens")


class UncountedTailsDSA(DSATokenToKVPool):
    """``get_kv_size_bytes`` leaves the compress tails out (SGLang 0.5.23 does)."""

    def get_kv_size_bytes(self) -> int:
        return MLATokenToKVPool.get_kv_size_bytes(self) + sum(
            buffer.nbytes for buffer in self.index_k_with_scale_buffer
        )


class WholeTailItemDSA(DSATokenToKVPool):
    """``get_compress_tail_buf_infos`` gives each layer's whole tail as the item, not one
    request's ring (a transfer would then move every request's tail per request)."""

    def get_compress_tail_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        ptrs, lens, _ = super().get_compress_tail_buf_infos()
        return ptrs, lens, list(lens)


class AliasedTailCopyDSA(DSATokenToKVPool):
    """The host copy's tails are views of the pool's tail rows (``.to("cpu")`` of a CPU
    tensor is the tensor itself), so later tail writes change the saved copy."""

    def _host_tail(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.is_meta else rows.to("cpu")


class RingStartTailDSA(DSATokenToKVPool):
    """``set_compress_tail_for_request`` ignores ``dst_logical_start``: row ``i`` goes to
    ring slot ``i`` (the right slot only when the start is a multiple of the width)."""

    def set_compress_tail_for_request(
        self,
        layer_id: int,
        req_pool_idx: Any,
        key_tail: torch.Tensor,
        score_tail: torch.Tensor,
        n_remain: int,
        dst_logical_start: int,
    ) -> None:
        require_int("dst_logical_start", dst_logical_start, minimum=0)
        super().set_compress_tail_for_request(
            layer_id, req_pool_idx, key_tail, score_tail, n_remain, 0
        )


# --- decode context parallel ----------------------------------------------------------------


class OwnerBlindDcpMLA(MLATokenToKVPool):
    """Under DCP, ``set_mla_kv_buffer`` keeps every widened id at row ``id // dcp_size``,
    other ranks' ids too (the owner rule forgotten: they overwrite this rank's rows)."""

    def set_mla_kv_buffer(self, *args: Any, **kwargs: Any) -> None:
        rank = self.dcp_rank
        try:
            for owner in range(self.dcp_size):
                self.dcp_rank = owner
                super().set_mla_kv_buffer(*args, **kwargs)
        finally:
            self.dcp_rank = rank


class UnrefusedKVWriteDcpMLA(MLATokenToKVPool):
    """Under DCP, ``set_kv_buffer`` writes its rows at the given rows instead of refusing
    (what SGLang does under ``python -O``, where its refusing assert is gone)."""

    def _refuse_dcp_write(self, where: str) -> None:
        return None


class UncollapsedCopyDcpDSA(DSATokenToKVPool):
    """Under DCP, a host copy takes the rank's share of the ids, ``indices[rank::D]``, but
    uses those widened ids as rows (the ``// D`` of SGLang's ``maybe_dcp_kernel_indices``
    left out): it reads and reloads the wrong rows."""

    def _run_rows(self, idx: torch.Tensor) -> torch.Tensor:
        return idx[self.dcp_rank :: self.dcp_size]


class NarrowIndexDcpDSA(DSATokenToKVPool):
    """Under DCP, index keys sized for this rank's rows (``index_buf_size = size``), not
    for every widened id (SGLang's ``(size + page_size) * dcp_size - page_size``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("index_buf_size") is None:
            kwargs["index_buf_size"] = kwargs["size"]
        super().__init__(*args, **kwargs)


class OwnedIndexMoveDcpDSA(DSATokenToKVPool):
    """Under DCP, a move carries the index keys of this rank's pairs only, so the index
    keys every rank keeps for every widened id drift apart between ranks."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        if self.dcp_size == 1:
            super().move_kv_cache(tgt_loc, src_loc)
            return
        limit, reason = self._index_token_limit()
        tgt, src = self._move_locations(tgt_loc, src_loc, limit=limit, limit_reason=reason)
        self._check_move_owners(tgt, src)
        owned = owned_mask(tgt, dcp_size=self.dcp_size, dcp_rank=self.dcp_rank)
        super().move_kv_cache(tgt[owned], src[owned])


# --- quantized pools: scales are state ----------------------------------------------------


class ScaleLeavingMoveFP4(QuantizedMHATokenToKVPool):
    """Moves the packed payload and leaves the block scales behind (SGLang's Q2, on MHA)."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        tgt, src = self._move_locations(tgt_loc, src_loc)
        for buffer in self.k_buffer + self.v_buffer:
            buffer.index_copy_(0, tgt, buffer.index_select(0, src))


class ScaleLeavingMoveMLAFP4(MLATokenToKVPoolFP4):
    """The MLA FP4 pool moving its latent rows but not ``kv_scale_buffer`` (SGLang's Q2)."""

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        tgt, src = self._move_locations(tgt_loc, src_loc)
        for buffer in self.kv_buffer:
            buffer.index_copy_(0, tgt, buffer.index_select(0, src))


class PayloadOnlyReloadFP4(QuantizedMHATokenToKVPool):
    """A reload that writes back the copied payload and not its scales (SGLang's Q6)."""

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        idx = self._locations("indices", indices, distinct=True, where="load_cpu_copy")
        if idx.numel() != kv_cache_cpu.num_tokens:  # the real pool's check: only scales drop
            raise ValueError(
                f"load_cpu_copy: {idx.numel()} indices for a copy of "
                f"{kv_cache_cpu.num_tokens} tokens"
            )
        for part in ("k", "v"):
            layers = zip(getattr(self, f"{part}_buffer"), kv_cache_cpu.parts[part], strict=True)
            for buffer, rows in layers:
                buffer.index_copy_(0, idx, rows)


class ScaleUncountingMLAFP4(MLATokenToKVPoolFP4):
    """``get_kv_size_bytes`` counts the payload and not the scale buffers (SGLang's Q3)."""

    def get_kv_size_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.kv_buffer)


class ScaleUndescribingFP4(QuantizedMHATokenToKVPool):
    """Describes its payload for transfer and no scale buffer (SGLang's Q4)."""

    def get_kv_scale_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        return [], [], []


class _SwappedInterleave(_quant.ScaleLayout):
    """FA4's interleave with the two token axes read the other way round: token offset
    ``o`` at ``[o // 4, o % 4]`` instead of ``[o % 32, o // 32]`` (a bijection: moves and
    copies within the pool stay consistent, the bytes are where FA4 does not read them)."""

    def _swapped(self, loc: torch.Tensor) -> torch.Tensor:
        offset = loc % self.page_size
        return (loc - offset) + (offset % 4) * 32 + offset // 4

    def gather(self, buffer: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        return super().gather(buffer, self._swapped(loc))

    def scatter(self, buffer: torch.Tensor, loc: torch.Tensor, scales: torch.Tensor) -> None:
        super().scatter(buffer, self._swapped(loc), scales)


class SwappedInterleaveMXFP8(MHATokenToKVPoolMXFP8):
    """Stores each token's e8m0 scales at the wrong place of the interleaved page."""

    def _create_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        buffers = super()._create_buffers()
        self._scale_layouts = {
            name: (
                part,
                _SwappedInterleave(**vars(layout)) if layout.kind == "interleaved" else layout,
            )
            for name, (part, layout) in self._scale_layouts.items()
        }
        return buffers


class VShapedByKFP4(QuantizedMHATokenToKVPool):
    """Shapes V and its scales by ``head_dim`` and ignores ``v_head_dim`` (SGLang's Q5)."""

    def _payload_dim(self, part: str) -> int:
        return self.head_dim


class UnscaledCastCPUFP8(QuantizedMHATokenToKVPool):
    """The CPU fp8 method storing the caller's values without dividing by its scales."""

    def set_kv_buffer(
        self, layer: Any, loc: Any, cache_k: Any, cache_v: Any, *args: Any, **kwargs: Any
    ) -> None:  # type: ignore[override]
        kwargs.pop("k_scale", None)
        kwargs.pop("v_scale", None)
        super().set_kv_buffer(layer, loc, cache_k, cache_v, None, None, **kwargs)


class PayloadOnlyPrefixValidFP4(QuantizedMHATokenToKVPool):
    """A prefix-valid write that stores the encoded payload and leaves the scales as they
    were (a write path that forgets its second buffer)."""

    def set_kv_buffer_prefix_valid(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        saved = {name: [b.clone() for b in getattr(self, name)] for name in self._scale_layouts}
        super().set_kv_buffer_prefix_valid(*args, **kwargs)
        for name, layers in saved.items():
            for buffer, before in zip(getattr(self, name), layers, strict=True):
                buffer.copy_(before)


class SwappedScaleReadFP4(QuantizedMHATokenToKVPool):
    """``get_key_buffer`` dequantizes K with V's block scales."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        local = self._local_layer(layer_id, where="get_key_buffer")
        rows = self.k_buffer[local].reshape(self.num_slots, -1)
        values = _quant.fp4_block16_dequantize(rows, self.v_scale_buffer[local])
        return values.reshape(self.num_slots, self.head_num, -1)


# --- serving them --------------------------------------------------------------------------


class BrokenTarget(KVCheckTarget):
    """kvcheck's target with one broken pool class in place of its family's pool, and
    optionally declared ``findings``."""

    unsupported: Mapping[str, str] = MappingProxyType({})

    def __init__(self, family: str, pool_class: type, findings: tuple[Any, ...] = ()) -> None:
        self.family = family
        self.pool_class = pool_class
        self.name = f"broken-{pool_class.__name__}"
        self.findings = findings

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """The broken class where kvcheck would build the pool it breaks (its family and,
        for a quantized pool, its variant); kvcheck's own pool for any other spec."""
        arguments = self.pool_arguments(spec, device=device)
        broken = next(c for c in self.pool_class.__mro__ if c.__module__.startswith("kvcheck."))
        if spec.family != self.family or arguments.resolve() is not broken:
            return super().make_pool(spec, device=device)
        return arguments.build(self.pool_class)


# --- reads, layer ranges and token-granular host copies -------------------------------------


class StartLayerBlindReadMHA(MHATokenToKVPool):
    """``get_key_buffer`` indexes its buffers by the global layer id, ignoring
    ``start_layer``: attention on a pool that starts above layer 0 reads another layer."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._as_read_dtype(self.k_buffer[layer_id % self.layer_num])


class StaleViewMLA(MLATokenToKVPool):
    """``get_key_buffer`` hands out a copy taken the first time a layer was read, so
    later writes never show through it."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        cache = self.__dict__.setdefault("_stale", {})
        if layer_id not in cache:
            cache[layer_id] = super().get_key_buffer(layer_id).clone()
        return cache[layer_id]


class ShiftedRowsReadDSA(DSATokenToKVPool):
    """``get_index_k_with_scale_buffer`` returns the page rows rolled by one."""

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        buffer = super().get_index_k_with_scale_buffer(layer_id)
        return buffer.roll(1, dims=0) if buffer.shape[0] > 1 else buffer


class OverrideBlindMHA(MHATokenToKVPool):
    """``set_kv_buffer`` writes the pool's first layer whenever ``layer_id_override`` is
    given (as if it read a local id), whatever global layer it names."""

    def set_kv_buffer(self, layer: Any, loc: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if kwargs.get("layer_id_override") is not None:
            kwargs["layer_id_override"] = self.start_layer
        super().set_kv_buffer(layer, loc, *args, **kwargs)


class PageTableBlindReadDSA(DSATokenToKVPool):
    """``get_index_k_scale_buffer`` reads each sequence's slots from pages 0, 1, ... in
    order, ignoring its page table (right only where the table happens to be 0, 1, ...)."""

    def get_index_k_scale_buffer(
        self, layer_id: int, seq_len_tensor: Any, page_indices: Any, *args: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        identity = torch.arange(page_indices.shape[1]).expand_as(page_indices)
        return super().get_index_k_scale_buffer(layer_id, seq_len_tensor, identity, *args)


class EndLayerFromZeroMLA(MLATokenToKVPool):
    """``end_layer`` defaults to ``layer_num - 1`` whatever ``start_layer`` is (SGLang's
    own default when a caller passes none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.end_layer = self.layer_num - 1


class PageGranularReloadMHA(MHATokenToKVPool):
    """Host copies carry whole pages: a reload rewrites every token of each page it
    touches, so the unlisted tokens of a partial last page are overwritten."""

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        idx = self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        rows = self._page_rows(idx)
        copy = super().get_cpu_copy(rows)
        return KVHostCopy(source=copy.source, num_tokens=idx.numel(), parts=copy.parts)

    def load_cpu_copy(self, kv_cache_cpu: KVHostCopy, indices: torch.Tensor) -> None:
        idx = self._locations("indices", indices, distinct=True, where="load_cpu_copy")
        rows = self._page_rows(idx)
        for buffer, part in zip(self.k_buffer, kv_cache_cpu.parts["k"], strict=True):
            buffer[rows] = part[: rows.numel()]
        for buffer, part in zip(self.v_buffer, kv_cache_cpu.parts["v"], strict=True):
            buffer[rows] = part[: rows.numel()]

    def _page_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Every slot of the pages ``idx`` touches (a last page cut at the pool's end)."""
        pages = torch.unique_consecutive(idx // self.page_size)
        rows = (pages[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)
        return rows[rows < self.num_slots]


class SilentReloadMovingNoOp(NoOpMHATokenToKVPool):
    """Two bugs: ``load_cpu_copy`` returns silently (declared as a finding in the twin) and
    ``move_kv_cache`` writes into its placeholders (not declared)."""

    def load_cpu_copy(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:  # type: ignore[override]
        if isinstance(tgt_loc, torch.Tensor) and tgt_loc.numel():
            self.k_buffer[0][0] += 1


class SilentReloadNoOp(NoOpMHATokenToKVPool):
    """Only the first of the two bugs above."""

    def load_cpu_copy(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None


# --- write paths that differ from set_kv_buffer -------------------------------------------


class RopeDroppingMLA(MLATokenToKVPool):
    """``set_mla_kv_buffer`` stores the nope part and leaves the rope part as it was."""

    def set_mla_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k_nope: Any,
        cache_k_rope: Any,
        *args: Any,
        layer_id_override: int | None = None,
    ) -> None:
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        local = layer_id - self.start_layer
        rank = self.kv_lora_rank
        rows = cache_k_nope.reshape(cache_k_nope.shape[0], -1).view(self.store_dtype)
        own, owned = _owned_rows(self, loc)
        self.kv_buffer[local][own, 0, :rank] = rows[owned]


def _owned_rows(pool: MLATokenToKVPool, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, mask)``: the pool's rows of the widened ids in ``loc`` its DCP rank owns
    (every id, as its own row, without DCP), so a twin breaks only its own rule."""
    loc = loc.long()
    owned = owned_mask(loc, dcp_size=pool.dcp_size, dcp_rank=pool.dcp_rank)
    return loc[owned] // pool.dcp_size, owned


class SwappedBlockScalesDSA(DSATokenToKVPool):
    """Scaled fp8 latent rows get their block scales in reverse order: block ``b``'s scale
    is stored where block ``blocks - 1 - b``'s belongs (invisible with one block)."""

    def set_mla_kv_buffer(self, layer: Any, loc: Any, *args: Any, **kwargs: Any) -> None:
        super().set_mla_kv_buffer(layer, loc, *args, **kwargs)
        if self.latent_layout != "scaled" or self.is_meta:
            return
        local = getattr(layer, "layer_id", kwargs.get("layer_id_override", 0)) - self.start_layer
        rank, blocks = self.kv_lora_rank, self.kv_lora_rank // 128
        own, _ = _owned_rows(self, loc)
        rows = self.kv_buffer[local][own, 0]
        scales = rows[:, rank : rank + 4 * blocks].reshape(-1, blocks, 4).flip(1)
        rows[:, rank : rank + 4 * blocks] = scales.reshape(-1, 4 * blocks)
        self.kv_buffer[local][own, 0] = rows


class RawWidthScaledDSA(DSATokenToKVPool):
    """Asked for scaled fp8 latent rows, allocates rows of the raw width
    (``kv_lora_rank + qk_rope_head_dim`` bytes) and stores each row cut to that width."""

    def _latent_row_width(self) -> int:
        width = super()._latent_row_width()
        return (
            self.kv_lora_rank + self.qk_rope_head_dim if self.latent_layout == "scaled" else width
        )

    def set_mla_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k_nope: Any,
        cache_k_rope: Any,
        *args: Any,
        layer_id_override: int | None = None,
    ) -> None:
        if self.latent_layout != "scaled":
            super().set_mla_kv_buffer(
                layer, loc, cache_k_nope, cache_k_rope, *args, layer_id_override=layer_id_override
            )
            return
        count = cache_k_nope.shape[0]
        rows = quantize_rows(cache_k_nope.reshape(count, -1), cache_k_rope.reshape(count, -1))
        width = self.kv_buffer[0].shape[-1]
        own, owned = _owned_rows(self, loc)
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        self.kv_buffer[layer_id - self.start_layer][own, 0] = rows[owned, :width]


class UncommittedWritingMHA(MHATokenToKVPool):
    """``set_kv_buffer_prefix_valid`` writes every cell of the grid, committed or not."""

    def set_kv_buffer_prefix_valid(
        self, layer: Any, loc_2d: Any, commit_lens: Any, cache_k: Any, cache_v: Any, *args: Any
    ) -> None:
        self.set_kv_buffer(layer, loc_2d.reshape(-1), cache_k, cache_v)


class ScaleDividingMHA(MHATokenToKVPool):
    """Divides the caller's tensors by ``k_scale``/``v_scale`` in place before converting,
    as SGLang 0.5.23 does (finding W1)."""

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: Any = None,
        v_scale: Any = None,
        *args: Any,
        layer_id_override: int | None = None,
    ) -> None:
        if isinstance(cache_k, torch.Tensor) and cache_k.dtype != self.dtype:
            if k_scale is not None:
                cache_k.div_(k_scale)
            if v_scale is not None:
                cache_v.div_(v_scale)
        super().set_kv_buffer(layer, loc, cache_k, cache_v, layer_id_override=layer_id_override)


# --- a bug that needs a rare combination (the kind a campaign is for) ----------------------


class RareCombinationWriteMHA(MHATokenToKVPool):
    """Drops a write of two or more tokens, but only in a pool that draws four things at once:
    the head-major layout, an fp8 dtype, a V head dim of its own and a first layer above 0.
    Each is common alone; together a default run's 100 examples reach them in some seeds
    only (``kvcheck campaign``'s test twin)."""

    def set_kv_buffer(self, layer: Any, loc: Any, *args: Any, **kwargs: Any) -> None:
        rare = (
            self.kv_layout == "hnd"
            and self.store_dtype == torch.uint8
            and self.v_head_dim != self.head_dim
            and self.start_layer > 0
        )
        if rare and isinstance(loc, torch.Tensor) and loc.numel() >= 2:
            return
        super().set_kv_buffer(layer, loc, *args, **kwargs)
