"""Naive reference models of the KV pools.

Everything here is written to be obviously right rather than fast: pools are per-layer
dicts from token slot to bytes, expected buffers are built row by row with loops, and byte
counts come straight from the formulas. Nothing is imported from ``kvcheck.pools``: a bug
there cannot leak into the model it is checked against.

Example:
    >>> from kvcheck.specs import PoolSpec, WriteKV, Move
    >>> spec = PoolSpec(family="mha", size=4, page_size=2, layer_num=1,
    ...                 dtype="float8_e4m3fn", head_num=1, head_dim=2)
    >>> ref = ReferencePool(spec)
    >>> ref.apply(WriteKV(layer_id=0, locs=(3,), k_rows=(b"\\x01\\x02",), v_rows=(b"\\x03\\x04",)))
    >>> ref.apply(Move(tgt=(5,), src=(3,)))
    >>> ref.expected_k_buffer(0)[5].tobytes()
    b'\\x01\\x02'
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcheck.reference import quant
from kvcheck.specs import (
    COMPRESS_TAIL_ITEMSIZE,
    DSA_QUANT_BLOCK,
    DTYPE_ITEMSIZE,
    HostCopy,
    HostReload,
    Move,
    Op,
    PoolSpec,
    WriteCompressTail,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)

__all__ = [
    "ReferencePool",
    "expected_buffer_bytes",
    "expected_compress_tail_buf_infos",
    "expected_kv_size_bytes",
    "expected_mem_usage",
    "expected_num_index_pages",
    "expected_scale_buf_infos",
    "expected_state_buf_infos",
    "fp8_e4m3fn_byte",
    "index_k_row_bytes",
    "index_scale_row_bytes",
    "reference_scaled_latent_row",
]

_GIB = 1 << 30
#: Dtypes a quantized pool encodes from.
_FLOAT_PAYLOADS: tuple[str, ...] = ("bfloat16", "float16", "float32")


# --- per-token row sizes -----------------------------------------------------------------


def index_k_row_bytes(index_head_dim: int) -> int:
    """fp8 key bytes one token occupies in a DSA index-K page (one byte per channel).

    Example:
        >>> index_k_row_bytes(128)
        128
    """
    return index_head_dim


def index_scale_row_bytes(index_head_dim: int) -> int:
    """fp32 scale bytes one token occupies: one float per block of 128 channels.

    Example:
        >>> index_scale_row_bytes(128)
        4
    """
    return index_head_dim // DSA_QUANT_BLOCK * 4


def _k_row_bytes(spec: PoolSpec) -> int:
    if spec.quantized:
        return quant.payload_row_bytes(spec, "k")
    return spec.head_num * spec.head_dim * spec.itemsize


def _v_row_bytes(spec: PoolSpec) -> int:
    if spec.quantized:
        return quant.payload_row_bytes(spec, "v")
    return spec.head_num * spec.effective_v_head_dim * spec.itemsize


def _mha_allocated_rows(spec: PoolSpec) -> int:
    # When K and V rows have the same shape, SGLang 0.5.23 allocates them as the two halves
    # of one tensor per layer and pads each half to a whole number of pages (earlier
    # releases allocate each separately: kv_page_padding=False; the quantized pools allocate
    # their buffers one by one).
    rows = spec.size + spec.page_size
    if spec.head_dim != spec.effective_v_head_dim or not spec.kv_page_padding or spec.quantized:
        return rows
    pages = rows // spec.page_size + (1 if rows % spec.page_size else 0)
    return pages * spec.page_size


def _latent_row_bytes(spec: PoolSpec) -> int:
    if spec.quantized:
        return quant.payload_row_bytes(spec, "k")
    if spec.latent_layout == "scaled":
        # fp8 values, one fp32 scale per 128 of them, then the rope values as bf16.
        return spec.kv_lora_rank + spec.kv_lora_rank // 128 * 4 + spec.qk_rope_head_dim * 2
    return (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.itemsize


# --- the scaled fp8 latent row ---------------------------------------------------------------

_FP8_E4M3_MAX = 448.0


def fp8_e4m3fn_byte(value: float) -> int:
    """The float8_e4m3fn byte nearest to ``value`` (ties to even), for ``|value| <= 448``.

    Written out from the format (1 sign bit, 4 exponent bits with bias 7, 3 mantissa
    bits; subnormals in steps of ``2**-9``), so that it shares nothing with torch's cast.

    Example:
        >>> [hex(fp8_e4m3fn_byte(v)) for v in (1.0, -448.0, 2.0**-9, 0.3)]
        ['0x38', '0xfe', '0x1', '0x2a']
    """
    if not math.isfinite(value) or abs(value) > _FP8_E4M3_MAX:
        raise ValueError(f"value={value!r} is not a finite number in [-448, 448]")
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if magnitude < 2.0**-6:  # subnormal: a multiple of 2**-9 (8 reaches the first normal)
        return sign | round(magnitude * 2.0**9)
    mantissa, exponent = math.frexp(magnitude)  # magnitude = mantissa * 2**exponent
    exponent -= 1  # now magnitude = m * 2**exponent with m in [1, 2)
    steps = round((mantissa * 2.0 - 1.0) * 8)  # Python rounds exact halves to even
    if steps == 8:
        steps, exponent = 0, exponent + 1
    return sign | (exponent + 7) << 3 | steps


def _bf16_values(data: bytes) -> list[float]:
    """bf16 bytes (little-endian) as Python floats, exactly: the high half of an fp32."""
    out = []
    for i in range(0, len(data), 2):
        bits = (data[i] | data[i + 1] << 8) << 16
        out.append(float(np.array([bits], dtype=np.uint32).view(np.float32)[0]))
    return out


def _f32(value: float) -> np.float32:
    return np.float32(value)


def reference_scaled_latent_row(nope: bytes, rope: bytes) -> bytes:
    """The stored bytes of one token's scaled fp8 latent row, from its bf16 parts.

    For each block of 128 nope values, in float32 as SGLang 0.5.23's
    ``quantize_k_cache_separate`` computes it: ``scale = max|x| / 448``, each value
    becomes ``clamp(x * (1 / scale), -448, 448)`` rounded to fp8 e4m3 (ties to even). A
    zero value stays that zero (with its sign), also in an all-zero block (scale 0) or
    where ``1 / scale`` overflows to inf: kvcheck's rule, where sglang's kernel has no
    guard and computes ``0 * inf``. The row is the fp8 values, the block scales as
    little-endian fp32, then the rope bytes unchanged.

    Example:
        >>> nope = bytes.fromhex("803f") * 127 + bytes.fromhex("0040")  # 1.0 x127, 2.0
        >>> row = reference_scaled_latent_row(nope, bytes([1, 2]))
        >>> len(row), hex(row[0]), hex(row[127]), row[128:132].hex(), list(row[132:])
        (134, '0x76', '0x7e', '2549923b', [1, 2])
    """
    values = _bf16_values(nope)
    if len(values) % 128:
        raise ValueError(f"len(nope)={len(nope)} bytes is not whole blocks of 128 bf16 values")
    quantized = bytearray()
    scales = bytearray()
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for start in range(0, len(values), 128):
            block = values[start : start + 128]
            largest = 0.0
            for value in block:
                largest = max(largest, abs(value))
            scale = _f32(largest) / _f32(_FP8_E4M3_MAX)
            for value in block:
                if value == 0:  # a zero stays the zero it is, whatever the scale
                    quantized.append(fp8_e4m3fn_byte(value))
                    continue
                inverse = _f32(1.0) / scale  # inf when the scale is tiny: then +-448
                scaled = float(_f32(value) * inverse)
                scaled = min(max(scaled, -_FP8_E4M3_MAX), _FP8_E4M3_MAX)
                quantized.append(fp8_e4m3fn_byte(scaled))
            scales += np.array([scale], dtype="<f4").tobytes()
    return bytes(quantized) + bytes(scales) + bytes(rope)


def _has_non_finite_bf16(data: bytes) -> bool:
    # A bf16 value is inf or NaN when its 8 exponent bits (bits 7-14) are all ones.
    return any(data[i + 1] & 0x7F == 0x7F and data[i] & 0x80 for i in range(0, len(data), 2))


def _index_page_row_bytes(spec: PoolSpec) -> int:
    # A page row holds the page's index slots: one per index_kpool tokens.
    d = spec.index_head_dim
    return spec.index_page_size * (index_k_row_bytes(d) + index_scale_row_bytes(d))


def _index_slot_limit(spec: PoolSpec) -> int:
    """Index slots the pool's tokens map to: slot ``t // index_kpool`` for token ``t``
    (under DCP, for every widened id ``t``: index keys are not split across ranks)."""
    return -(-(spec.num_slots * spec.dcp_size) // spec.index_kpool)


def _tail_row_bytes(spec: PoolSpec) -> int:
    return spec.index_head_dim * COMPRESS_TAIL_ITEMSIZE


def _tail_bytes_per_layer(spec: PoolSpec) -> list[int]:
    """Bytes of one layer's key tail (the score tail is the same size); 0 on skip layers."""
    full = spec.tail_requests * spec.tail_width * _tail_row_bytes(spec)
    return [0 if skip else full for skip in spec.skip_mask] if spec.compress_tails else []


def expected_num_index_pages(spec: PoolSpec) -> int:
    """Rows of each non-skip DSA index-K buffer: ``(index_buf_size + page_size + 1) // page_size``.

    Example:
        >>> expected_num_index_pages(PoolSpec(family="dsa", size=8, page_size=2,
        ...                                   layer_num=1, dtype="bfloat16"))
        5
    """
    return (spec.effective_index_buf_size + spec.page_size + 1) // spec.page_size


# --- byte accounting -----------------------------------------------------------------------


def _index_bytes_per_layer(spec: PoolSpec) -> list[int]:
    full = expected_num_index_pages(spec) * _index_page_row_bytes(spec)
    return [0 if skip else full for skip in spec.skip_mask]


def expected_kv_size_bytes(spec: PoolSpec) -> tuple[int, int] | int:
    """What ``get_kv_size_bytes()`` must return for a pool built from ``spec``.

    MHA: ``(k_bytes, v_bytes)`` allocated over all layers (when ``v_head_dim`` is
    ``head_dim`` K and V share one allocation per layer, each half padded to whole pages,
    and the padding is allocated too); NoOp: ``(0, 0)`` (its placeholders are not
    counted); MLA: the latent bytes as one int; DSA: latent bytes plus the index-K bytes of
    every non-skip layer, plus both compress tails of every layer where the pool keeps
    them, as one int (SGLang 0.5.23 returns a single int, without the tails).

    Example:
        >>> expected_kv_size_bytes(PoolSpec(family="mha", size=2, page_size=2, layer_num=3,
        ...                                 dtype="bfloat16", head_num=1, head_dim=4))
        (96, 96)
        >>> expected_kv_size_bytes(PoolSpec(family="mha", size=3, page_size=2, layer_num=1,
        ...                                 dtype="bfloat16", head_num=1, head_dim=4))
        (48, 48)
    """
    if spec.family == "noop":
        return (0, 0)
    if spec.quantized:
        return quant.quantized_kv_size_bytes(spec)
    if spec.family == "mha":
        rows = spec.layer_num * _mha_allocated_rows(spec)
        return (rows * _k_row_bytes(spec), rows * _v_row_bytes(spec))
    latent = spec.layer_num * spec.num_slots * _latent_row_bytes(spec)
    if spec.family == "mla":
        return latent
    return latent + sum(_index_bytes_per_layer(spec)) + 2 * sum(_tail_bytes_per_layer(spec))


def expected_compress_tail_buf_infos(spec: PoolSpec) -> tuple[list[int], list[int]]:
    """``(lens, item_lens)`` of ``get_compress_tail_buf_infos()``: every layer's key tail,
    then every layer's score tail; a skip layer's entries are ``0, 0``; ``([], [])`` when
    the pool keeps no tails. An item is one request's ring.

    Example:
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=2, dtype="bfloat16",
        ...                 skip_topk_layers=(False, True), index_kpool=2,
        ...                 index_kpool_compress=True, max_running_requests=1)
        >>> expected_compress_tail_buf_infos(spec)
        ([1024, 0, 1024, 0], [512, 0, 512, 0])
    """
    lens = _tail_bytes_per_layer(spec)
    item = spec.tail_width * _tail_row_bytes(spec)
    item_lens = [0 if skip else item for skip in spec.skip_mask] if spec.compress_tails else []
    return lens * 2, item_lens * 2


def expected_buffer_bytes(spec: PoolSpec) -> int:
    """Bytes the pool's tensors actually hold, all buffers of all layers.

    Equal to the sum of :func:`expected_kv_size_bytes` except for NoOp, whose
    ``[page_size, head_num, head_dim]`` placeholders are held but reported as zero.

    Example:
        >>> expected_buffer_bytes(PoolSpec(family="noop", size=64, page_size=2, layer_num=3,
        ...                                dtype="bfloat16", head_num=1, head_dim=4))
        96
    """
    if spec.family == "noop":
        return spec.layer_num * spec.page_size * (_k_row_bytes(spec) + _v_row_bytes(spec))
    reported = expected_kv_size_bytes(spec)
    return sum(reported) if isinstance(reported, tuple) else reported


def expected_mem_usage(spec: PoolSpec) -> float:
    """``mem_usage`` in GiB: the reported bytes over ``1 << 30`` (``0.0`` for NoOp).

    Example:
        >>> expected_mem_usage(PoolSpec(family="mla", size=0, page_size=1, layer_num=1,
        ...                             dtype="float32", kv_lora_rank=(1 << 28) - 8,
        ...                             qk_rope_head_dim=8))
        1.0
    """
    reported = expected_kv_size_bytes(spec)
    total = sum(reported) if isinstance(reported, tuple) else reported
    return total / _GIB


def expected_scale_buf_infos(spec: PoolSpec) -> tuple[list[int], list[int]]:
    """``(lens, item_lens)`` of a quantized pool's ``get_kv_scale_buf_infos()``
    (:func:`kvcheck.reference.quant.quantized_scale_buf_infos`); ``([], [])`` for a pool
    without scale buffers.

    Example:
        >>> expected_scale_buf_infos(PoolSpec(family="mla", size=2, page_size=2, layer_num=2,
        ...     dtype="float4_e2m1fn_x2", kv_quant="fp4", kv_lora_rank=16, qk_rope_head_dim=16))
        ([8, 8], [4, 4])
    """
    if not spec.quantized:
        return [], []
    return quant.quantized_scale_buf_infos(spec)


def expected_state_buf_infos(spec: PoolSpec) -> tuple[list[int], list[int]]:
    """``(lens, item_lens)`` of a DSA pool's ``get_state_buf_infos()``, one entry per local layer.

    A non-skip layer's buffer is ``num_pages`` rows of one page each; a skip layer keeps its
    entry with ``0, 0`` so layer offsets line up between peers. Pointers are not modeled.

    Example:
        >>> spec = PoolSpec(family="dsa", size=2, page_size=2, layer_num=2, dtype="bfloat16",
        ...                 skip_topk_layers=(False, True))
        >>> expected_state_buf_infos(spec)
        ([528, 0], [264, 0])
    """
    if spec.family != "dsa":
        raise ValueError(f"spec.family={spec.family!r}: only DSA pools have state buffers")
    row = _index_page_row_bytes(spec)
    lens = _index_bytes_per_layer(spec)
    item_lens = [0 if skip else row for skip in spec.skip_mask]
    return lens, item_lens


# --- the pool model ------------------------------------------------------------------------


@dataclass
class _LayerState:
    """Bytes written so far to one local layer; a missing slot reads as zeros."""

    k: dict[int, bytes] = field(default_factory=dict)  # MHA K, or MLA/DSA latent
    v: dict[int, bytes] = field(default_factory=dict)  # MHA V only
    # A quantized pool's block scales of the row above, per slot ([heads, blocks] bytes).
    k_scale: dict[int, bytes] = field(default_factory=dict)
    v_scale: dict[int, bytes] = field(default_factory=dict)
    index_key: dict[int, bytes] = field(default_factory=dict)  # DSA, per index slot
    index_scale: dict[int, bytes] = field(default_factory=dict)  # DSA, per index slot
    # DSA compress tails: (request slot, ring slot) -> one bf16 row
    tail_key: dict[tuple[int, int], bytes] = field(default_factory=dict)
    tail_score: dict[tuple[int, int], bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class _TokenSnapshot:
    """One token's bytes in every layer, as a host copy carries them."""

    k: tuple[bytes, ...]
    v: tuple[bytes, ...]
    index_key: tuple[bytes | None, ...]  # None where the layer skips index-K
    index_scale: tuple[bytes | None, ...]
    k_scale: tuple[bytes, ...] = ()  # a quantized pool's block scales, per layer
    v_scale: tuple[bytes, ...] = ()


#: One request's compress tails in every layer, as a host copy carries them: per layer
#: ``(key rows, score rows)`` by ring slot, or None where the layer has no tails.
_TailSnapshot = tuple[tuple[tuple[bytes | None, ...], tuple[bytes | None, ...]] | None, ...]


class ReferencePool:
    """A pool of any family modeled as per-layer ``slot -> bytes`` maps.

    ``apply(op)`` performs one :mod:`kvcheck.specs` operation, or raises the exception the
    contract demands (see :meth:`expected_error`) and changes nothing. ``expected_buffers()``
    renders the state with the pool's exact storage layout, as uint8 arrays.

    Example:
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=1, dtype="float8_e5m2",
        ...                 kv_lora_rank=1, qk_rope_head_dim=1)
        >>> ref = ReferencePool(spec)
        >>> ref.apply(WriteKV(layer_id=0, locs=(1,), k_rows=(b"ab",)))
        >>> ref.expected_kv_buffer(0).tolist()
        [[0, 0], [97, 98], [0, 0]]
    """

    def __init__(self, spec: PoolSpec) -> None:
        if spec.family == "dsa" and len(spec.skip_mask) != spec.layer_num:
            raise ValueError(
                f"spec.skip_topk_layers has {len(spec.skip_mask)} entries "
                f"but layer_num={spec.layer_num}"
            )
        if spec.kv_layout != "nhd" and not (spec.kv_layout == "hnd" and spec.family == "mha"):
            raise ValueError(
                f"spec.kv_layout={spec.kv_layout!r}: 'nhd' for every family, 'hnd' for 'mha' only"
            )
        if spec.kv_layout == "hnd" and spec.size % spec.page_size:
            raise ValueError(
                f"spec.kv_layout='hnd' needs whole pages: size={spec.size} is not a multiple "
                f"of page_size={spec.page_size}"
            )
        self.spec = spec
        self._layers = [_LayerState() for _ in range(spec.layer_num)]
        self._host_copies: dict[str, tuple[_TokenSnapshot, ...]] = {}
        self._tail_copies: dict[str, _TailSnapshot | None] = {}

    # -- validation: which exception the contract demands for an op ----------------------

    def expected_error(self, op: Op) -> type[Exception] | None:
        """The exception type the pool must raise for ``op`` in the current state, or None.

        - NoOp: every write (``WriteKV``, ``WriteMLA``, ``WritePrefixValid``,
          ``WriteIndexK``, ``HostReload``) -> RuntimeError, whatever its arguments; moves
          and host copies of valid locations are accepted and do nothing.
        - ValueError for bad input: layer id outside the pool, a location outside
          ``[0, size + page_size)`` or repeated where it is written (for a prefix-valid
          write: among the committed cells), rows of the wrong byte length or count (a
          payload in another dtype: the same number of values), ``tgt``/``src`` of
          different lengths, an index-K write to a DSA skip layer or to a family without
          index-K, a write method the family lacks, a reload whose length differs from its
          copy's, or a reload of a name never copied (the harness has nothing to pass).

        Host copies are token-granular on every family: any index set (a request's slots
        with a partial last page, several requests at once, runs crossing page
        boundaries) copies exactly the listed tokens, and a reload writes exactly them.

        DSA index kpool (``index_kpool > 1``): index-K writes address index slots in
        ``[0, ceil((size + page_size) / index_kpool))``; a token's host copy carries its
        slot ``t // index_kpool`` (a reload writes slots in order, the later token wins);
        a non-empty move -> ValueError (pooled keys would need regrouping) and changes
        nothing. Compress tails: a tail write to a pool without tails, to a skip layer, of
        a request outside ``[0, max_running_requests + 1)``, of more rows than the ring
        has slots, with a negative start or rows of the wrong length -> ValueError; so is a
        host copy or reload naming a request outside that range.

        Decode context parallel (``dcp_size = D > 1``; the pool is rank ``r``): every call
        names tokens by widened id ``w`` in ``[0, (size + page_size) * D)``. The rank keeps
        ``w``'s latent row at ``w // D`` when ``w % D == r``; writes of other ranks' ids
        are dropped. ``set_kv_buffer`` (whose locations are the rank's rows,
        ``[0, size + page_size)``) -> RuntimeError (it has no DCP-aware path) once its
        arguments are valid. A move pair whose target and source belong to different ranks
        -> ValueError (a rank cannot fetch another's row). A host copy or reload whose
        ``indices[j] % D != j % D`` for some position ``j`` -> ValueError: SGLang's
        precondition that each run starts page-aligned, which lets it take a rank's share
        as ``indices[r::D] // D``. Index keys stay whole: every rank writes, moves and
        copies every widened id's key.

        Example:
            >>> ref = ReferencePool(PoolSpec(family="noop", size=4, page_size=1, layer_num=1,
            ...                              dtype="float16"))
            >>> ref.expected_error(WriteKV(layer_id=0, locs=(), k_rows=()))
            <class 'RuntimeError'>
        """
        return None if (problem := self._problem(op)) is None else problem[0]

    def rejects(self, op: Op) -> bool:
        """Whether the pool must raise for ``op`` (see :meth:`expected_error`).

        Example:
            >>> ref = ReferencePool(PoolSpec(family="mha", size=4, page_size=1, layer_num=1,
            ...                              dtype="float16"))
            >>> ref.rejects(Move(tgt=(1, 1), src=(2, 3)))
            True
        """
        return self._problem(op) is not None

    def _problem(self, op: Op) -> tuple[type[Exception], str] | None:
        spec = self.spec
        writes = isinstance(
            op, WriteKV | WriteMLA | WritePrefixValid | WriteIndexK | WriteCompressTail | HostReload
        )
        if spec.family == "noop":
            if writes:
                return RuntimeError, f"NoOpMHATokenToKVPool rejects every write, got {op!r}"
            return self._noop_problem(op)
        if isinstance(op, WriteKV):
            return self._write_kv_problem(op)
        if isinstance(op, WriteMLA):
            return self._write_mla_problem(op)
        if isinstance(op, WritePrefixValid):
            return self._write_prefix_valid_problem(op)
        if isinstance(op, WriteIndexK):
            return self._write_index_k_problem(op)
        if isinstance(op, WriteCompressTail):
            return self._write_compress_tail_problem(op)
        if isinstance(op, Move):
            if len(op.tgt) != len(op.src):
                return ValueError, f"len(tgt)={len(op.tgt)} != len(src)={len(op.src)}"
            problem = self._locs_problem("tgt", op.tgt, distinct=True) or self._locs_problem(
                "src", op.src, distinct=False
            )
            if problem is None and op.tgt and spec.index_kpool > 1:
                return ValueError, (
                    f"index_kpool={spec.index_kpool}: moving pooled index keys needs"
                    " regrouping tokens, so a move is refused (and changes nothing)"
                )
            return problem or self._move_owner_problem(op)
        if isinstance(op, HostCopy):
            return (
                self._locs_problem("indices", op.indices, distinct=False)
                or self._rank_share_problem(op.indices)
                or self._request_problem("req_pool_index", op.req_pool_index)
            )
        if isinstance(op, HostReload):
            if op.name not in self._host_copies:
                return ValueError, f"name={op.name!r} was never copied"
            copied = len(self._host_copies[op.name])
            if len(op.indices) != copied:
                return ValueError, f"len(indices)={len(op.indices)} != copied tokens {copied}"
            return (
                self._locs_problem("indices", op.indices, distinct=True)
                or self._rank_share_problem(op.indices)
                or self._request_problem("req_pool_index", op.req_pool_index)
            )
        raise TypeError(f"op={op!r} is not an operation from kvcheck.specs")

    def _noop_problem(self, op: Op) -> tuple[type[Exception], str] | None:
        """The no-op pool's moves and copies do nothing, but still take valid locations."""
        if isinstance(op, Move):
            if len(op.tgt) != len(op.src):
                return ValueError, f"len(tgt)={len(op.tgt)} != len(src)={len(op.src)}"
            return self._locs_problem("tgt", op.tgt, distinct=True) or self._locs_problem(
                "src", op.src, distinct=False
            )
        if isinstance(op, HostCopy):
            return self._locs_problem("indices", op.indices, distinct=False)
        return None

    def _move_owner_problem(self, op: Move) -> tuple[type[Exception], str] | None:
        ranks = self.spec.dcp_size
        for tgt, src in zip(op.tgt, op.src, strict=True):
            if tgt % ranks != src % ranks:
                return ValueError, (
                    f"move {src} -> {tgt}: under dcp_size={ranks} the two ids belong to"
                    f" ranks {src % ranks} and {tgt % ranks}; a rank cannot fetch another's row"
                )
        return None

    def _rank_share_problem(self, indices: Sequence[int]) -> tuple[type[Exception], str] | None:
        """Under DCP, position ``j`` of a host copy's ids must belong to rank ``j % D``."""
        ranks = self.spec.dcp_size
        for position, token in enumerate(indices):
            if token % ranks != position % ranks:
                return ValueError, (
                    f"indices={tuple(indices)!r}: id {token} at position {position} is not"
                    f" rank {position % ranks}'s (dcp_size={ranks}): each run must start"
                    " page-aligned"
                )
        return None

    def _layer_problem(self, layer_id: int) -> tuple[type[Exception], str] | None:
        ids = self.spec.layer_ids
        if not isinstance(layer_id, int) or layer_id not in ids:
            return ValueError, f"layer_id={layer_id!r} not in [{ids.start}, {ids.stop})"
        return None

    def _locs_problem(
        self, name: str, locs: Sequence[int], *, distinct: bool, limit: int | None = None
    ) -> tuple[type[Exception], str] | None:
        # Callers name tokens by id: the pool's slots, or under DCP its widened ids.
        limit = self.spec.num_slots * self.spec.dcp_size if limit is None else limit
        for loc in locs:
            if not isinstance(loc, int) or not 0 <= loc < limit:
                return ValueError, f"{name}={tuple(locs)!r}: {loc!r} not in [0, {limit})"
        if distinct and len(set(locs)) != len(locs):
            return ValueError, f"{name}={tuple(locs)!r} repeats a location"
        return None

    @staticmethod
    def _rows_problem(
        name: str, rows: Sequence[bytes], count: int, length: int
    ) -> tuple[type[Exception], str] | None:
        if len(rows) != count:
            return ValueError, f"len({name})={len(rows)} != len(locs)={count}"
        for row in rows:
            if len(row) != length:
                return ValueError, f"{name} has a row of {len(row)} bytes, expected {length}"
        return None

    def _write_kv_problem(self, op: WriteKV) -> tuple[type[Exception], str] | None:
        spec = self.spec
        # set_kv_buffer addresses the pool's own rows (under DCP it is refused below).
        problem = self._layer_problem(op.layer_id) or self._locs_problem(
            "locs", op.locs, distinct=True, limit=spec.num_slots
        )
        if problem is not None:
            return problem
        if spec.quantized:
            return self._quantized_write_problem(op)
        if op.payload is not None:
            problem = self._payload_problem(op)
            if problem is not None:
                return problem
        if spec.family == "mha":
            return self._rows_problem(
                "k_rows", op.k_rows, len(op.locs), _k_row_bytes(spec)
            ) or self._rows_problem("v_rows", op.v_rows, len(op.locs), _v_row_bytes(spec))
        if spec.latent_layout == "scaled":
            return ValueError, (
                "set_kv_buffer cannot write a scaled latent row (latent_layout='scaled'):"
                " write it with set_mla_kv_buffer from bf16 nope and rope values"
            )
        # MLA/DSA: the latent row is the whole entry; v_rows are ignored like cache_v.
        problem = self._rows_problem("k_rows", op.k_rows, len(op.locs), _latent_row_bytes(spec))
        if problem is None and spec.dcp_size > 1:
            return RuntimeError, (
                f"set_kv_buffer has no decode-context-parallel path (dcp_size={spec.dcp_size}):"
                " its rows would land at widened ids; write with set_mla_kv_buffer"
            )
        return problem

    def _quantized_write_problem(self, op: WriteKV) -> tuple[type[Exception], str] | None:
        """A quantized pool takes float rows it encodes (bf16, fp16, fp32), or for MXFP8's
        scaled write fp8 rows with their e8m0 scales; MXFP8 encodes itself (no scales) on
        the interleaved layout (128-token pages) only."""
        spec, payload, count = self.spec, op.payload, len(op.locs)
        if payload is None:
            return ValueError, f"{spec.variant} pools are written from a float payload"
        parts = ("k",) if spec.family == "mla" else ("k", "v")
        if payload.k_scale_rows or payload.v_scale_rows:
            if spec.kv_quant != "mxfp8" or payload.dtype != "float8_e4m3fn":
                return ValueError, "only MXFP8 takes the caller's block scales, with fp8 rows"
            for part in parts:
                rows = payload.k_rows if part == "k" else payload.v_rows
                scales = payload.k_scale_rows if part == "k" else payload.v_scale_rows
                problem = self._rows_problem(
                    f"payload.{part}_rows", rows, count, quant.payload_row_bytes(spec, part)
                ) or self._rows_problem(
                    f"payload.{part}_scale_rows", scales, count, quant.scale_row_bytes(spec, part)
                )
                if problem is not None:
                    return problem
            return None
        if payload.dtype not in _FLOAT_PAYLOADS:
            return ValueError, f"payload.dtype={payload.dtype!r} is not one of {_FLOAT_PAYLOADS}"
        if spec.kv_quant == "mxfp8" and spec.page_size != 128:
            return ValueError, (
                "MXFP8 encodes a write itself only on the interleaved layout (page_size=128):"
                " other pages need the caller's K and V scales"
            )
        itemsize = DTYPE_ITEMSIZE[payload.dtype]
        for part in parts:
            rows = payload.k_rows if part == "k" else payload.v_rows
            width = _row_values(spec, part) * itemsize
            problem = self._rows_problem(f"payload.{part}_rows", rows, count, width)
            if problem is not None:
                return problem
        return None

    def _payload_problem(self, op: WriteKV) -> tuple[type[Exception], str] | None:
        """A payload in another dtype holds the same number of values as the stored rows."""
        assert op.payload is not None
        spec, payload = self.spec, op.payload
        if payload.dtype not in DTYPE_ITEMSIZE:
            return ValueError, f"payload.dtype={payload.dtype!r} not in {sorted(DTYPE_ITEMSIZE)}"
        scale = DTYPE_ITEMSIZE[payload.dtype] / spec.itemsize
        k_bytes = int(
            (_k_row_bytes(spec) if spec.family == "mha" else _latent_row_bytes(spec)) * scale
        )
        problem = self._rows_problem("payload.k_rows", payload.k_rows, len(op.locs), k_bytes)
        if problem is None and spec.family == "mha":
            v_bytes = int(_v_row_bytes(spec) * scale)
            problem = self._rows_problem("payload.v_rows", payload.v_rows, len(op.locs), v_bytes)
        return problem

    def _write_mla_problem(self, op: WriteMLA) -> tuple[type[Exception], str] | None:
        spec = self.spec
        if spec.family not in ("mla", "dsa"):
            return ValueError, f"family={spec.family!r} has no set_mla_kv_buffer"
        count = len(op.locs)
        scaled = spec.latent_layout == "scaled"
        dtype = spec.dtype if op.dtype is None else op.dtype
        if spec.quantized:
            if dtype not in _FLOAT_PAYLOADS:
                return ValueError, f"dtype={dtype!r}: an FP4 latent row is encoded from floats"
            itemsize = DTYPE_ITEMSIZE[dtype]
            return (
                self._layer_problem(op.layer_id)
                or self._locs_problem("locs", op.locs, distinct=True)
                or self._rows_problem(
                    "nope_rows", op.nope_rows, count, spec.kv_lora_rank * itemsize
                )
                or self._rows_problem(
                    "rope_rows", op.rope_rows, count, spec.qk_rope_head_dim * itemsize
                )
            )
        if scaled and dtype != "bfloat16":
            return ValueError, f"dtype={dtype!r}: a scaled latent row is written from bfloat16"
        if not scaled and dtype != spec.dtype:
            return ValueError, f"dtype={op.dtype!r}: raw latent rows are given in the pool's dtype"
        itemsize = DTYPE_ITEMSIZE[dtype]
        problem = (
            self._layer_problem(op.layer_id)
            or self._locs_problem("locs", op.locs, distinct=True)
            or self._rows_problem("nope_rows", op.nope_rows, count, spec.kv_lora_rank * itemsize)
            or self._rows_problem(
                "rope_rows", op.rope_rows, count, spec.qk_rope_head_dim * itemsize
            )
        )
        if problem is None and scaled:
            for row in op.nope_rows:
                if _has_non_finite_bf16(row):
                    return ValueError, "nope_rows holds a non-finite value: it cannot be scaled"
        return problem

    def _write_prefix_valid_problem(
        self, op: WritePrefixValid
    ) -> tuple[type[Exception], str] | None:
        spec = self.spec
        if spec.family != "mha":
            return ValueError, f"family={spec.family!r} has no set_kv_buffer_prefix_valid"
        widths = {len(row) for row in op.loc_grid}
        if len(widths) > 1:
            return ValueError, f"loc_grid={op.loc_grid!r} is not rectangular"
        width = widths.pop() if widths else 0
        if len(op.commit_lens) != len(op.loc_grid):
            return ValueError, (
                f"len(commit_lens)={len(op.commit_lens)} != rows of loc_grid {len(op.loc_grid)}"
            )
        for commit in op.commit_lens:
            if not 0 <= commit <= width:
                return ValueError, f"commit_lens={op.commit_lens!r}: {commit} not in [0, {width}]"
        cells = len(op.loc_grid) * width
        if spec.kv_quant == "mxfp8":
            return RuntimeError, "MXFP8 refuses prefix-valid writes (they would not carry scales)"
        k_bytes, v_bytes = _k_row_bytes(spec), _v_row_bytes(spec)
        if spec.quantized:
            if op.dtype not in _FLOAT_PAYLOADS:
                return ValueError, f"dtype={op.dtype!r}: {spec.variant} encodes float rows"
            itemsize = DTYPE_ITEMSIZE[op.dtype]
            k_bytes = _row_values(spec, "k") * itemsize
            v_bytes = _row_values(spec, "v") * itemsize
        return (
            self._layer_problem(op.layer_id)
            or self._locs_problem("committed locs", _committed(op), distinct=True)
            or self._rows_problem("k_rows", op.k_rows, cells, k_bytes)
            or self._rows_problem("v_rows", op.v_rows, cells, v_bytes)
        )

    def _write_index_k_problem(self, op: WriteIndexK) -> tuple[type[Exception], str] | None:
        spec = self.spec
        if spec.family != "dsa":
            return ValueError, f"family={spec.family!r} has no index-K buffer"
        problem = self._layer_problem(op.layer_id)
        if problem is not None:
            return problem
        if spec.skip_mask[op.layer_id - spec.start_layer]:
            return ValueError, f"layer_id={op.layer_id} is a skip-topk layer without index-K"
        d = spec.index_head_dim
        count = len(op.locs)
        return (
            self._locs_problem("locs", op.locs, distinct=True, limit=_index_slot_limit(spec))
            or self._rows_problem("key_rows", op.key_rows, count, index_k_row_bytes(d))
            or self._rows_problem("scale_rows", op.scale_rows, count, index_scale_row_bytes(d))
        )

    def _request_problem(
        self, name: str, request: int | None
    ) -> tuple[type[Exception], str] | None:
        """A request slot must name a row of the tails; without tails it is ignored."""
        if request is None or not self.spec.compress_tails:
            return None
        rows = self.spec.tail_requests
        if isinstance(request, bool) or not isinstance(request, int) or not 0 <= request < rows:
            return ValueError, f"{name}={request!r} not in [0, {rows}) (max_running_requests + 1)"
        return None

    def _write_compress_tail_problem(
        self, op: WriteCompressTail
    ) -> tuple[type[Exception], str] | None:
        spec = self.spec
        if not spec.compress_tails:
            return ValueError, (
                "the pool keeps no compress tails (they need family='dsa', index_kpool > 1"
                f" and index_kpool_compress=True; got {spec.variant!r},"
                f" index_kpool_compress={spec.index_kpool_compress})"
            )
        problem = self._layer_problem(op.layer_id)
        if problem is not None:
            return problem
        if spec.skip_mask[op.layer_id - spec.start_layer]:
            return ValueError, f"layer_id={op.layer_id} is a skip-topk layer without tails"
        problem = self._request_problem("req_pool_idx", op.req_pool_idx)
        if problem is not None:
            return problem
        count, width = len(op.key_rows), spec.tail_width
        if count > width:
            return ValueError, (
                f"n_remain={count} > the ring's {width} slots (index_kpool + tail_extra_slots):"
                " a slot would be written twice"
            )
        if isinstance(op.start, bool) or not isinstance(op.start, int) or op.start < 0:
            return ValueError, f"dst_logical_start={op.start!r} must be an int >= 0"
        row = _tail_row_bytes(spec)
        return self._rows_problem("key_rows", op.key_rows, count, row) or self._rows_problem(
            "score_rows", op.score_rows, count, row
        )

    # -- applying operations -----------------------------------------------------------------

    def apply(self, op: Op) -> None:
        """Perform ``op``, or raise :meth:`expected_error`'s type and leave the state unchanged.

        Example:
            >>> ref = ReferencePool(PoolSpec(family="mha", size=4, page_size=1, layer_num=1,
            ...                              dtype="float8_e5m2", head_dim=1))
            >>> ref.apply(Move(tgt=(9,), src=(0,)))
            Traceback (most recent call last):
            ...
            ValueError: tgt=(9,): 9 not in [0, 5)
        """
        problem = self._problem(op)
        if problem is not None:
            error, message = problem
            raise error(message)
        if self.spec.family == "noop":
            if isinstance(op, HostCopy):
                self._host_copies[op.name] = ()
            return
        if isinstance(op, WriteKV) and self.spec.quantized:
            self._apply_quantized_write(op)
        elif isinstance(op, WriteKV):
            layer = self._layer(op.layer_id)
            for i, loc in enumerate(op.locs):
                layer.k[loc] = bytes(op.k_rows[i])
                if self.spec.family == "mha":
                    layer.v[loc] = bytes(op.v_rows[i])
        elif isinstance(op, WriteMLA) and self.spec.quantized:
            for i, loc in enumerate(op.locs):
                latent = bytes(op.nope_rows[i]) + bytes(op.rope_rows[i])
                self._store_encoded(op.layer_id, loc, "k", latent, op.dtype or "bfloat16", None)
        elif isinstance(op, WriteMLA):
            layer = self._layer(op.layer_id)
            for i, loc in enumerate(op.locs):
                row = self._latent_row(loc)
                if row is None:
                    continue  # another DCP rank's token
                if self.spec.latent_layout == "scaled":
                    layer.k[row] = reference_scaled_latent_row(op.nope_rows[i], op.rope_rows[i])
                else:
                    layer.k[row] = bytes(op.nope_rows[i]) + bytes(op.rope_rows[i])
        elif isinstance(op, WritePrefixValid):
            layer = self._layer(op.layer_id)
            width = len(op.loc_grid[0]) if op.loc_grid else 0
            for row, (locs, commit) in enumerate(zip(op.loc_grid, op.commit_lens, strict=True)):
                for column in range(commit):
                    cell = row * width + column
                    if self.spec.quantized:
                        dtype = op.dtype or "bfloat16"
                        for part, rows in (("k", op.k_rows), ("v", op.v_rows)):
                            self._store_encoded(
                                op.layer_id, locs[column], part, rows[cell], dtype, None
                            )
                        continue
                    layer.k[locs[column]] = bytes(op.k_rows[cell])
                    layer.v[locs[column]] = bytes(op.v_rows[cell])
        elif isinstance(op, WriteIndexK):
            layer = self._layer(op.layer_id)
            for i, loc in enumerate(op.locs):
                layer.index_key[loc] = bytes(op.key_rows[i])
                layer.index_scale[loc] = bytes(op.scale_rows[i])
        elif isinstance(op, WriteCompressTail):
            layer = self._layer(op.layer_id)
            for i, (key, score) in enumerate(zip(op.key_rows, op.score_rows, strict=True)):
                ring_slot = (op.start + i) % self.spec.tail_width
                layer.tail_key[op.req_pool_idx, ring_slot] = bytes(key)
                layer.tail_score[op.req_pool_idx, ring_slot] = bytes(score)
        elif isinstance(op, Move):
            # Gather every source first, then scatter: a target that is also a source must
            # still give out its old bytes.
            gathered = [self._snapshot(src) for src in op.src]
            for tgt, snapshot in zip(op.tgt, gathered, strict=True):
                self._restore(tgt, snapshot)
        elif isinstance(op, HostCopy):
            self._host_copies[op.name] = tuple(self._snapshot(i) for i in op.indices)
            self._tail_copies[op.name] = self._tail_snapshot(op.req_pool_index)
        elif isinstance(op, HostReload):
            # In order: where two tokens share an index slot (index_kpool > 1), the later wins.
            for index, snapshot in zip(op.indices, self._host_copies[op.name], strict=True):
                self._restore(index, snapshot)
            tails = self._tail_copies[op.name]
            if tails is not None and op.req_pool_index is not None:
                self._restore_tails(op.req_pool_index, tails)

    def _layer(self, layer_id: int) -> _LayerState:
        return self._layers[layer_id - self.spec.start_layer]

    def _store_encoded(
        self, layer_id: int, slot: int, part: str, data: bytes, dtype: str, scale: float | None
    ) -> None:
        """Store one token's ``part`` row (given in ``dtype``) as the variant encodes it."""
        layer = self._layer(layer_id)
        stored, scales = quant.encode_row(self.spec, part, data, dtype, scale)
        getattr(layer, part)[slot] = stored
        if quant.scale_buffer_names(self.spec):
            getattr(layer, f"{part}_scale")[slot] = scales

    def _apply_quantized_write(self, op: WriteKV) -> None:
        """``set_kv_buffer`` on a quantized pool: MXFP8's scaled write stores the caller's
        fp8 bytes and e8m0 scales as given; every other write encodes the payload."""
        payload = op.payload
        assert payload is not None
        layer = self._layer(op.layer_id)
        parts = ("k",) if self.spec.family == "mla" else ("k", "v")
        for i, loc in enumerate(op.locs):
            for part in parts:
                rows = payload.k_rows if part == "k" else payload.v_rows
                if payload.k_scale_rows:  # MXFP8 scaled: stored as given
                    scale_rows = payload.k_scale_rows if part == "k" else payload.v_scale_rows
                    getattr(layer, part)[loc] = bytes(rows[i])
                    getattr(layer, f"{part}_scale")[loc] = bytes(scale_rows[i])
                    continue
                scale = payload.k_scale if part == "k" else payload.v_scale
                self._store_encoded(op.layer_id, loc, part, rows[i], payload.dtype, scale)

    def _latent_row(self, token: int) -> int | None:
        """The latent row holding ``token`` on this rank, or None (another DCP rank's)."""
        ranks = self.spec.dcp_size
        return token // ranks if token % ranks == self.spec.dcp_rank else None

    def _has_index_k(self, local: int) -> bool:
        return self.spec.family == "dsa" and not self.spec.skip_mask[local]

    def _snapshot(self, slot: int) -> _TokenSnapshot:
        keys: list[bytes | None] = []
        scales: list[bytes | None] = []
        index_slot = slot // self.spec.index_kpool
        for local, layer in enumerate(self._layers):
            indexed = self._has_index_k(local)
            keys.append(layer.index_key.get(index_slot) if indexed else None)
            scales.append(layer.index_scale.get(index_slot) if indexed else None)
        # Another DCP rank's token has no row here: its latent part is empty, and the
        # owner rules make sure it is only ever restored to another rank's token.
        row = self._latent_row(slot)
        return _TokenSnapshot(
            k=tuple(b"" if row is None else layer.k.get(row, b"") for layer in self._layers),
            v=tuple(b"" if row is None else layer.v.get(row, b"") for layer in self._layers),
            index_key=tuple(keys),
            index_scale=tuple(scales),
            k_scale=tuple(layer.k_scale.get(slot, b"") for layer in self._layers),
            v_scale=tuple(layer.v_scale.get(slot, b"") for layer in self._layers),
        )

    def _restore(self, slot: int, snapshot: _TokenSnapshot) -> None:
        # An empty or None entry means "never written": the slot goes back to zeros.
        index_slot = slot // self.spec.index_kpool
        row = self._latent_row(slot)
        for local, layer in enumerate(self._layers):
            if row is not None:
                _put(layer.k, row, snapshot.k[local])
                _put(layer.v, row, snapshot.v[local])
            if self.spec.quantized:  # scales travel with their payload
                _put(layer.k_scale, slot, snapshot.k_scale[local])
                _put(layer.v_scale, slot, snapshot.v_scale[local])
            if self._has_index_k(local):
                _put(layer.index_key, index_slot, snapshot.index_key[local])
                _put(layer.index_scale, index_slot, snapshot.index_scale[local])

    def _tail_snapshot(self, request: int | None) -> _TailSnapshot | None:
        """Request ``request``'s tails in every layer (None: nothing to copy)."""
        if request is None or not self.spec.compress_tails:
            return None
        ring = range(self.spec.tail_width)
        return tuple(
            (
                tuple(layer.tail_key.get((request, i)) for i in ring),
                tuple(layer.tail_score.get((request, i)) for i in ring),
            )
            if self._has_index_k(local)
            else None
            for local, layer in enumerate(self._layers)
        )

    def _restore_tails(self, request: int, tails: _TailSnapshot) -> None:
        for layer, saved in zip(self._layers, tails, strict=True):
            if saved is None:
                continue
            for i, (key, score) in enumerate(zip(*saved, strict=True)):
                _put(layer.tail_key, (request, i), key)
                _put(layer.tail_score, (request, i), score)

    # -- expected storage --------------------------------------------------------------------

    def _rows(self, values: Mapping[int, bytes], num_rows: int, row_bytes: int) -> np.ndarray:
        out = np.zeros((num_rows, row_bytes), dtype=np.uint8)
        for slot in range(num_rows):
            data = values.get(slot)
            if data:
                out[slot, :] = np.frombuffer(data, dtype=np.uint8)
        return out

    def _check_family(self, layer_id: int, families: tuple[str, ...], what: str) -> int:
        if self.spec.family not in families:
            raise ValueError(f"family={self.spec.family!r} has no {what}")
        problem = self._layer_problem(layer_id)
        if problem is not None:
            raise problem[0](problem[1])
        return layer_id - self.spec.start_layer

    def expected_k_buffer(self, layer_id: int) -> np.ndarray:
        """MHA/NoOp K storage of global layer ``layer_id``: ``[rows, head_num*head_dim*itemsize]``.

        Rows are ``size + page_size`` (NoOp: ``page_size`` placeholder rows, always zero).

        Example:
            >>> ref = ReferencePool(PoolSpec(family="noop", size=64, page_size=2, layer_num=1,
            ...                              dtype="float16", head_dim=2))
            >>> ref.expected_k_buffer(0).shape
            (2, 4)
        """
        local = self._check_family(layer_id, ("mha", "noop"), "K/V buffers")
        rows = self.spec.page_size if self.spec.family == "noop" else self.spec.num_slots
        return self._rows(self._layers[local].k, rows, _k_row_bytes(self.spec))

    def expected_v_buffer(self, layer_id: int) -> np.ndarray:
        """MHA/NoOp V storage: ``[rows, head_num*v_head_dim*itemsize]`` (see expected_k_buffer).

        Example:
            >>> ref = ReferencePool(PoolSpec(family="mha", size=2, page_size=1, layer_num=1,
            ...                              dtype="float16", head_dim=2, v_head_dim=3))
            >>> ref.expected_v_buffer(0).shape
            (3, 6)
        """
        local = self._check_family(layer_id, ("mha", "noop"), "K/V buffers")
        rows = self.spec.page_size if self.spec.family == "noop" else self.spec.num_slots
        return self._rows(self._layers[local].v, rows, _v_row_bytes(self.spec))

    def expected_kv_buffer(self, layer_id: int) -> np.ndarray:
        """MLA/DSA latent storage: ``[size + page_size, (kv_lora_rank + rope) * itemsize]``.

        Example:
            >>> ref = ReferencePool(PoolSpec(family="dsa", size=2, page_size=2, layer_num=1,
            ...                              dtype="bfloat16", kv_lora_rank=4,
            ...                              qk_rope_head_dim=2))
            >>> ref.expected_kv_buffer(0).shape
            (4, 12)
        """
        local = self._check_family(layer_id, ("mla", "dsa"), "latent buffer")
        return self._rows(self._layers[local].k, self.spec.num_slots, _latent_row_bytes(self.spec))

    def expected_index_k_buffer(self, layer_id: int) -> np.ndarray:
        """DSA index-K pages of one layer: ``[num_pages, page_size * (D + S)]`` uint8.

        Token ``t`` lives in page ``t // page_size`` at offset ``o = t % page_size``: its key
        bytes at columns ``[o*D, (o+1)*D)``, its scale bytes at
        ``[page_size*D + o*S, page_size*D + (o+1)*S)`` (``D = index_head_dim``,
        ``S = index_head_dim // 128 * 4``). A skip layer has zero rows.

        Example:
            >>> spec = PoolSpec(family="dsa", size=2, page_size=2, layer_num=1, dtype="bfloat16")
            >>> ReferencePool(spec).expected_index_k_buffer(0).shape
            (2, 264)
        """
        local = self._check_family(layer_id, ("dsa",), "index-K buffer")
        spec = self.spec
        d = index_k_row_bytes(spec.index_head_dim)
        s = index_scale_row_bytes(spec.index_head_dim)
        page_size = spec.index_page_size
        if spec.skip_mask[local]:
            return np.zeros((0, _index_page_row_bytes(spec)), dtype=np.uint8)
        layer = self._layers[local]
        num_pages = expected_num_index_pages(spec)
        out = np.zeros((num_pages, _index_page_row_bytes(spec)), dtype=np.uint8)
        for page in range(num_pages):
            for offset in range(page_size):
                token = page * page_size + offset
                key = layer.index_key.get(token)
                if key:
                    out[page, offset * d : (offset + 1) * d] = np.frombuffer(key, np.uint8)
                scale = layer.index_scale.get(token)
                if scale:
                    start = page_size * d + offset * s
                    out[page, start : start + s] = np.frombuffer(scale, np.uint8)
        return out

    def expected_compress_tails(self, layer_id: int) -> tuple[np.ndarray, np.ndarray]:
        """DSA compress tails of one layer, as ``get_compress_tail_buffers`` returns them:
        ``(key, score)``, each ``[max_running_requests + 1, width * index_head_dim * 2]``
        uint8 (a request's ring slots in order, bf16 values); zero rows on a skip layer.

        Example:
            >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1,
            ...                 dtype="bfloat16", index_kpool=2, index_kpool_compress=True,
            ...                 max_running_requests=1)
            >>> [tail.shape for tail in ReferencePool(spec).expected_compress_tails(0)]
            [(2, 512), (2, 512)]
        """
        local = self._check_family(layer_id, ("dsa",), "compress tails")
        spec = self.spec
        if not spec.compress_tails:
            raise ValueError(f"spec {spec.variant!r} keeps no compress tails")
        row, width = _tail_row_bytes(spec), spec.tail_width
        rows = 0 if spec.skip_mask[local] else spec.tail_requests
        layer = self._layers[local]
        tails = []
        for values in (layer.tail_key, layer.tail_score):
            out = np.zeros((rows, width * row), dtype=np.uint8)
            for (request, ring_slot), data in values.items():
                out[request, ring_slot * row : (ring_slot + 1) * row] = np.frombuffer(
                    data, np.uint8
                )
            tails.append(out)
        return tails[0], tails[1]

    def expected_scale_buffer(self, name: str, layer_id: int) -> np.ndarray:
        """A quantized pool's scale buffer ``name`` of global layer ``layer_id``, in its
        layout (:func:`kvcheck.reference.quant.render_scales`).

        Example:
            >>> spec = PoolSpec(family="mla", size=2, page_size=2, layer_num=1,
            ...                 dtype="float4_e2m1fn_x2", kv_quant="fp4", kv_lora_rank=16,
            ...                 qk_rope_head_dim=16)
            >>> ReferencePool(spec).expected_scale_buffer("kv_scale_buffer", 0).shape
            (4, 2)
        """
        if name not in quant.scale_buffer_names(self.spec):
            raise ValueError(f"spec {self.spec.variant!r} keeps no {name}")
        local = self._check_family(layer_id, ("mha", "mla"), "scale buffers")
        layer = self._layers[local]
        part = "v" if name.startswith(("v_", "native_v")) else "k"
        return quant.render_scales(self.spec, name, getattr(layer, f"{part}_scale"))

    def expected_dequantized(self, layer_id: int, part: str = "k") -> np.ndarray:
        """The values a block-16 FP4 pool's read API gives for every slot of one layer, as
        bf16 bytes ``[rows, values * 2]``: MHA ``fp4_mx_block16`` K (``part="k"``) or V, MLA
        FP4 latent rows (a slot never written holds zeros and reads zeros).

        Example:
            >>> spec = PoolSpec(family="mla", size=2, page_size=2, layer_num=1,
            ...                 dtype="float4_e2m1fn_x2", kv_quant="fp4", kv_lora_rank=16,
            ...                 qk_rope_head_dim=16)
            >>> ReferencePool(spec).expected_dequantized(0).shape
            (4, 64)
        """
        if self.spec.kv_quant not in ("fp4_mx_block16", "fp4"):
            raise ValueError(f"spec {self.spec.variant!r}: its read API returns stored bytes")
        local = self._check_family(layer_id, ("mha", "mla"), "dequantized reads")
        layer = self._layers[local]
        values = _row_values(self.spec, part)
        out = np.zeros((self.spec.num_slots, values * 2), dtype=np.uint8)
        stored, scales = getattr(layer, part), getattr(layer, f"{part}_scale")
        for slot, data in stored.items():
            out[slot] = np.frombuffer(_dequantized_row(data, scales[slot]), dtype=np.uint8)
        return out

    def expected_buffers(self) -> dict[str, list[np.ndarray]]:
        """Every expected buffer, keyed by the pool attribute that holds it, one per local layer.

        Keys: ``k_buffer``/``v_buffer`` (MHA, NoOp), ``kv_buffer`` (MLA, DSA),
        ``index_k_with_scale_buffer`` (DSA) and a quantized pool's scale buffers
        (:func:`kvcheck.reference.quant.scale_buffer_names`, in their layouts). Compare with
        ``pool.<key>[i].view(torch.uint8).reshape(rows, -1)``.

        Example:
            >>> spec = PoolSpec(family="dsa", size=2, page_size=2, layer_num=1, dtype="bfloat16")
            >>> sorted(ReferencePool(spec).expected_buffers())
            ['index_k_with_scale_buffer', 'kv_buffer']
        """
        ids = self.spec.layer_ids
        scales = {
            name: [self.expected_scale_buffer(name, i) for i in ids]
            for name in quant.scale_buffer_names(self.spec)
        }
        if self.spec.family in ("mha", "noop"):
            return {
                "k_buffer": [self.expected_k_buffer(i) for i in ids],
                "v_buffer": [self.expected_v_buffer(i) for i in ids],
                **scales,
            }
        buffers = {"kv_buffer": [self.expected_kv_buffer(i) for i in ids], **scales}
        if self.spec.family == "dsa":
            buffers["index_k_with_scale_buffer"] = [self.expected_index_k_buffer(i) for i in ids]
        return buffers


@functools.lru_cache(maxsize=4096)
def _dequantized_row(data: bytes, scales: bytes) -> bytes:
    """A block-16 FP4 row's values as bf16 bytes (rows repeat from step to step: cached)."""
    return quant.bf16_row_bytes(quant.fp4_block16_decode(data, scales))


def _row_values(spec: PoolSpec, part: str) -> int:
    """Values of one token's K (MLA: latent) or V row."""
    if spec.family == "mla":
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    return spec.head_num * (spec.head_dim if part == "k" else spec.effective_v_head_dim)


def _committed(op: WritePrefixValid) -> tuple[int, ...]:
    """The slots a prefix-valid write commits: row ``b``'s first ``commit_lens[b]`` cells."""
    return tuple(
        loc
        for locs, commit in zip(op.loc_grid, op.commit_lens, strict=False)
        for loc in locs[:commit]
    )


def _put(values: dict[Any, bytes], slot: object, data: bytes | None) -> None:
    if data:
        values[slot] = data
    else:
        values.pop(slot, None)
