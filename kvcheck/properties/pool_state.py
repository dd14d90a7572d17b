"""Read a pool's buffers as bytes, in the reference model's layout, and compare them.

Every buffer becomes a ``[rows, row_bytes]`` ``uint8`` numpy array on the host: exactly
what :meth:`kvcheck.reference.ReferencePool.expected_buffers` renders, so a pool and its
reference compare byte for byte whatever the dtype (fp8 pools store ``uint8`` already;
``bfloat16`` rows become two bytes per value). Comparisons run in bulk and only walk the
data to name the first difference: buffer, layer (local and global), row and byte, and
for DSA index-K pages the token and whether the byte is part of its key or its scale.

Example:
    >>> from kvcheck.reference import ReferencePool
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> spec = PoolSpec(family="dsa", size=4, page_size=2, layer_num=2, dtype="bfloat16",
    ...                 skip_topk_layers=(False, True))
    >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
    >>> [a.shape for a in read_pool_buffers(pool)["index_k_with_scale_buffer"]]
    [(3, 264), (0, 264)]
    >>> assert_pool_matches_reference(pool, ReferencePool(spec), call="construction")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvcheck.failures import FailureSignature
from kvcheck.geometry import KV_BUFFER_ATTRIBUTES, index_k_row_bytes, index_scale_row_bytes
from kvcheck.properties.assertions import assert_bytes_equal, fail
from kvcheck.reference import ReferencePool
from kvcheck.specs import PoolSpec

__all__ = [
    "PoolBytes",
    "assert_compress_tails_match_reference",
    "assert_layer_range",
    "assert_pool_matches_reference",
    "assert_read_api_matches_reference",
    "assert_same_pool_bytes",
    "read_buffer",
    "read_pool_buffers",
    "read_slot_rows",
]

#: Buffer name -> one ``[rows, row_bytes]`` uint8 array per local layer.
PoolBytes = dict[str, list[np.ndarray]]


def read_buffer(tensor: torch.Tensor) -> np.ndarray:
    """A host copy of ``tensor``'s bytes as ``[rows, row_bytes]`` ``uint8`` (any dtype).

    Raises ``ValueError`` for a ``meta`` tensor, which holds no bytes to read.

    Example:
        >>> read_buffer(torch.ones(2, 1, dtype=torch.bfloat16)).tolist()
        [[128, 63], [128, 63]]
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor={tensor!r} is not a torch.Tensor")
    if tensor.device.type == "meta":
        raise ValueError(f"tensor on device {tensor.device} holds no bytes to read")
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor[0].numel() * tensor.element_size() if rows else _row_bytes(tensor)
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat.cpu().numpy().reshape(rows, row_bytes).copy()


def read_slot_rows(tensor: torch.Tensor, spec: PoolSpec) -> np.ndarray:
    """:func:`read_buffer` with one row per token slot, whatever the pool's ``kv_layout``:
    an HND buffer ``[pages, heads, page_size, dim]`` becomes ``[pages * page_size,
    heads * dim]`` bytes, the reference model's layout.

    Example:
        >>> spec = PoolSpec(family="mha", size=2, page_size=2, layer_num=1, dtype="float32",
        ...                 kv_layout="hnd")
        >>> hnd = torch.arange(8, dtype=torch.int8).view(2, 1, 2, 2)
        >>> read_slot_rows(hnd, spec).tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    if spec.kv_layout == "hnd" and isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
        heads, dim = tensor.shape[1], tensor.shape[3]
        tensor = tensor.permute(0, 2, 1, 3).reshape(-1, heads, dim)
    return read_buffer(tensor)


def _row_bytes(tensor: torch.Tensor) -> int:
    inner = 1
    for size in tensor.shape[1:]:
        inner *= size
    return inner * tensor.element_size()


def read_pool_buffers(pool: Any, names: Iterable[str] | None = None) -> PoolBytes:
    """Every per-layer buffer of ``pool`` as bytes; ``names=None`` means every buffer it has.

    Example:
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> pool = MHATokenToKVPool(size=2, page_size=1, dtype=torch.float8_e5m2,
        ...                         head_num=1, head_dim=2, layer_num=1, device="cpu")
        >>> sorted(read_pool_buffers(pool))
        ['k_buffer', 'v_buffer']
    """
    chosen = KV_BUFFER_ATTRIBUTES if names is None else tuple(names)
    return {
        name: [read_buffer(layer) for layer in getattr(pool, name)]
        for name in chosen
        if getattr(pool, name, None) is not None
    }


def _layer_label(name: str, local: int, start_layer: int) -> str:
    return f"{name}[{local}] (global layer {start_layer + local})"


def _index_k_position(reference: ReferencePool, page: int, column: int) -> str:
    """Which token and which part (key or scale) a byte of an index-K page row belongs to."""
    spec = reference.spec
    key = index_k_row_bytes(spec.index_head_dim)
    scale = index_scale_row_bytes(spec.index_head_dim)
    keys_end = spec.index_page_size * key
    if column < keys_end:
        offset, part, byte = column // key, "key", column % key
    else:
        offset, part, byte = (column - keys_end) // scale, "scale", (column - keys_end) % scale
    what = "token" if spec.index_kpool == 1 else "index slot"
    return f"{what} {page * spec.index_page_size + offset} {part} byte {byte}"


def _compare_layers(
    name: str,
    got: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    *,
    start_layer: int,
    call: str,
    describe_cell: Any = None,
    signature: FailureSignature | None = None,
) -> None:
    __tracebackhide__ = True
    if len(got) != len(expected):
        raise fail(
            got=len(got),
            expected=len(expected),
            call=call,
            detail=f"number of {name} layers",
            signature=signature,
        )
    for local, (got_layer, expected_layer) in enumerate(zip(got, expected, strict=True)):
        label = _layer_label(name, local, start_layer)
        if describe_cell is not None and got_layer.shape == expected_layer.shape:
            mismatch = np.argwhere(got_layer != expected_layer)
            if mismatch.size:
                row, column = (int(i) for i in mismatch[0])
                label = f"{label} ({describe_cell(row, column)})"
        assert_bytes_equal(got_layer, expected_layer, what=label, call=call, signature=signature)


def assert_pool_matches_reference(
    pool: Any,
    reference: ReferencePool,
    *,
    call: str,
    method: str = "",
    expected: PoolBytes | None = None,
) -> None:
    """Every buffer of ``pool`` equals ``reference``'s rendering of it, byte for byte.

    ``call`` names the operation just performed (``method`` its pool method, for the
    failure's signature); ``expected`` is ``reference.expected_buffers()`` when the caller
    rendered it already. A failure names the first differing
    buffer, layer, row and byte (for index-K pages also the token and key/scale part).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=1, dtype="float32")
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> pool.kv_buffer[0][1] = 1.0
        >>> try:
        ...     assert_pool_matches_reference(pool, ReferencePool(spec), call="poke")
        ... except Exception as error:
        ...     print(error)
        kv_buffer[0] (global layer 0) row 1 byte 2 is 0x80 but should be 0x00 [poke]
        48 bytes differ
    """
    __tracebackhide__ = True
    expected = reference.expected_buffers() if expected is None else expected
    start_layer = reference.spec.start_layer
    for name, expected_layers in expected.items():
        tensors = getattr(pool, name, None)
        if tensors is None:
            raise fail(
                got="missing",
                expected=f"{len(expected_layers)} layers",
                call=call,
                detail=f"pool attribute {name}",
            )
        got_layers = [read_slot_rows(layer, reference.spec) for layer in tensors]
        describe = None
        if name == "index_k_with_scale_buffer":

            def describe(row: int, column: int) -> str:
                return _index_k_position(reference, row, column)

        _compare_layers(
            name,
            got_layers,
            expected_layers,
            start_layer=start_layer,
            call=call,
            describe_cell=describe,
            signature=FailureSignature(
                check="bytes", call=method, kind=f"{name} differs", family=reference.spec.variant
            ),
        )


def assert_same_pool_bytes(
    got: Mapping[str, Sequence[np.ndarray]],
    expected: Mapping[str, Sequence[np.ndarray]],
    *,
    start_layer: int,
    call: str,
) -> None:
    """Two snapshots from :func:`read_pool_buffers` are identical (e.g. around a rejected call).

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool = MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                         kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1,
        ...                         device="cpu")
        >>> before = read_pool_buffers(pool)
        >>> assert_same_pool_bytes(read_pool_buffers(pool), before, start_layer=0, call="read")
    """
    __tracebackhide__ = True
    if sorted(got) != sorted(expected):
        raise fail(got=sorted(got), expected=sorted(expected), call=call, detail="buffer names")
    for name in expected:
        _compare_layers(name, got[name], expected[name], start_layer=start_layer, call=call)


# --- the read API attention uses ---------------------------------------------------------------


def _same_memory(view: torch.Tensor, raw: torch.Tensor) -> bool:
    """Whether ``view`` covers exactly ``raw``'s bytes (then it holds what ``raw`` holds)."""
    return (
        view.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
        and view.storage_offset() * view.element_size() == raw.storage_offset() * raw.element_size()
        and view.nbytes == raw.nbytes
        and view.is_contiguous()
        and raw.is_contiguous()
    )


@dataclass(frozen=True)
class _Read:
    """One read-API answer for one layer, what it must hold, and the raw buffer it views."""

    method: str
    label: str
    got: Any
    expected: np.ndarray
    raw: torch.Tensor | None


def _reads(
    pool: Any,
    spec: Any,
    expected: Mapping[str, Sequence[np.ndarray]],
    layer_id: int,
    reference: ReferencePool,
) -> list[_Read]:
    """Every read-API answer for global layer ``layer_id``."""
    local = layer_id - spec.start_layer
    mha = spec.family in ("mha", "noop")
    key_name, value_name = ("k_buffer", "v_buffer") if mha else ("kv_buffer", "kv_buffer")
    key_bytes = expected[key_name][local]
    value_bytes = (
        expected[value_name][local] if mha else key_bytes[:, : spec.kv_lora_rank * spec.itemsize]
    )
    raw_key = getattr(pool, key_name)[local]
    raw_value = getattr(pool, value_name)[local] if mha else None
    if spec.kv_quant in ("fp4_mx_block16", "fp4"):
        # Block-16 FP4 pools read back dequantized bf16 values, never their stored bytes.
        key_bytes = reference.expected_dequantized(layer_id, "k")
        value_bytes = (
            reference.expected_dequantized(layer_id, "v")
            if mha
            else key_bytes[:, : spec.kv_lora_rank * 2]
        )
        raw_key = raw_value = None
    key, value = pool.get_kv_buffer(layer_id)
    reads = [
        _Read(
            "get_key_buffer",
            f"pool.get_key_buffer({layer_id})",
            pool.get_key_buffer(layer_id),
            key_bytes,
            raw_key,
        ),
        _Read(
            "get_value_buffer",
            f"pool.get_value_buffer({layer_id})",
            pool.get_value_buffer(layer_id),
            value_bytes,
            raw_value,
        ),
        _Read("get_kv_buffer", f"pool.get_kv_buffer({layer_id})[0]", key, key_bytes, raw_key),
        _Read("get_kv_buffer", f"pool.get_kv_buffer({layer_id})[1]", value, value_bytes, raw_value),
    ]
    reads += _scale_reads(pool, spec, expected, layer_id)
    if spec.family == "dsa":
        name = "index_k_with_scale_buffer"
        reads.append(
            _Read(
                "get_index_k_with_scale_buffer",
                f"pool.get_index_k_with_scale_buffer({layer_id})",
                pool.get_index_k_with_scale_buffer(layer_id),
                expected[name][local],
                getattr(pool, name)[local],
            )
        )
    return reads


def _scale_reads(
    pool: Any, spec: Any, expected: Mapping[str, Sequence[np.ndarray]], layer_id: int
) -> list[_Read]:
    """The read API of a quantized pool's stored bytes: MXFP8 ``get_kv_scale_buffer`` (what
    FA4 reads) and FP4 ``get_raw_kv_buffer`` (payload and token-linear scales)."""
    local = layer_id - spec.start_layer
    if spec.kv_quant == "mxfp8":
        names: tuple[str, ...] = ("k_scale_buffer", "v_scale_buffer")
        answers = pool.get_kv_scale_buffer(layer_id)
        label = f"pool.get_kv_scale_buffer({layer_id})"
        method = "get_kv_scale_buffer"
    elif spec.kv_quant in ("fp4_mx_block16", "nvfp4") and "k_scale_buffer" in expected:
        names = ("k_buffer", "v_buffer", "k_scale_buffer", "v_scale_buffer")
        answers = pool.get_raw_kv_buffer(layer_id)
        label = f"pool.get_raw_kv_buffer({layer_id})"
        method = "get_raw_kv_buffer"
    else:
        return []
    return [
        _Read(method, f"{label}[{i}]", answer, expected[name][local], getattr(pool, name)[local])
        for i, (name, answer) in enumerate(zip(names, answers, strict=True))
    ]


def assert_compress_tails_match_reference(
    pool: Any, reference: ReferencePool, *, call: str
) -> None:
    """Every layer's compress tails, read through ``get_compress_tail_buffers`` (what the
    DSA indexer reads), equal the reference byte for byte: keys, then scores.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="dsa", size=4, page_size=4, layer_num=1, dtype="bfloat16",
        ...                 index_kpool=2, index_kpool_compress=True, max_running_requests=1)
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_compress_tails_match_reference(pool, ReferencePool(spec), call="construction")
    """
    __tracebackhide__ = True
    spec = reference.spec
    signature = FailureSignature(
        check="read_api", call="get_compress_tail_buffers", kind="bytes differ", family=spec.variant
    )
    for layer_id in spec.layer_ids:
        label = f"pool.get_compress_tail_buffers({layer_id})"
        tails = pool.get_compress_tail_buffers(layer_id)
        expected = reference.expected_compress_tails(layer_id)
        for part, got, wanted in zip(("key", "score"), tails, expected, strict=True):
            assert_bytes_equal(
                read_buffer(got),
                wanted,
                what=f"{label} {part} tail after {call}",
                call=label,
                signature=signature,
            )


def assert_read_api_matches_reference(
    pool: Any,
    reference: ReferencePool,
    *,
    call: str,
    mla_reads: bool = False,
    expected: PoolBytes | None = None,
    skip_methods: frozenset[str] = frozenset(),
    paged_index_reads: bool = True,
) -> None:
    """Every layer read back through the API attention uses equals the reference, byte for
    byte: ``get_key_buffer``, ``get_value_buffer`` and ``get_kv_buffer`` (global layer ids;
    MLA/DSA value = the first ``kv_lora_rank`` channels of the latent row, on every family), DSA
    ``get_index_k_with_scale_buffer``, and with ``mla_reads`` ``get_mla_kv_buffer`` of
    every slot. A pool that ignores ``start_layer``, reads another layer, or hands out a
    stale copy fails here even when its raw buffers are right. A quantized pool's
    ``get_kv_scale_buffer`` (MXFP8) and ``get_raw_kv_buffer`` (FP4) are read too, and a
    block-16 FP4 pool's reads are its dequantized values; with ``paged_index_reads`` a DSA
    pool's index keys and scales are also read through ``get_index_k_scale_buffer`` and
    a page table. ``skip_methods`` names read methods left unread (a target's declared
    finding).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mha", size=2, page_size=1, layer_num=2, dtype="float16",
        ...                 start_layer=3)
        >>> pool = resolve_target("kvcheck").make_pool(spec, device="cpu")
        >>> assert_read_api_matches_reference(pool, ReferencePool(spec), call="construction")
    """
    __tracebackhide__ = True
    spec = reference.spec
    expected = reference.expected_buffers() if expected is None else expected
    for layer_id in spec.layer_ids:
        for read in _reads(pool, spec, expected, layer_id, reference):
            # get_kv_buffer's second half is get_value_buffer's answer: skipped with it.
            value_half = read.label.endswith(")[1]") and read.method == "get_kv_buffer"
            if read.method in skip_methods or (value_half and "get_value_buffer" in skip_methods):
                continue
            got = read.got
            if (
                isinstance(got, torch.Tensor)
                and read.raw is not None
                and _same_memory(got, read.raw)
            ):
                continue  # the raw buffer was compared already
            signature = FailureSignature(
                check="read_api", call=read.method, kind="bytes differ", family=spec.variant
            )
            if not isinstance(got, torch.Tensor):
                raise fail(
                    got=type(got).__name__,
                    expected="a tensor",
                    call=read.label,
                    detail=f"after {call}",
                    signature=signature,
                )
            assert_bytes_equal(
                read_slot_rows(got, spec),
                read.expected,
                what=f"{read.label} after {call}",
                call=read.label,
                signature=signature,
            )
        local = layer_id - spec.start_layer
        if (
            spec.family == "dsa"
            and not spec.skip_mask[local]
            and "get_index_k_scale_buffer" not in skip_methods
            and paged_index_reads
        ):
            index = expected["index_k_with_scale_buffer"][local]
            _check_paged_index_reads(pool, spec, index, layer_id, call=call)
        if mla_reads:
            latent = expected["kv_buffer"][layer_id - spec.start_layer]
            itemsize = spec.itemsize
            if spec.kv_quant == "fp4":  # read back dequantized, as bf16
                latent, itemsize = reference.expected_dequantized(layer_id), 2
            _check_mla_reads(pool, spec, latent, layer_id, call=call, itemsize=itemsize)


def _check_paged_index_reads(
    pool: Any, spec: Any, index: np.ndarray, layer_id: int, *, call: str
) -> None:
    """DSA ``get_index_k_scale_buffer`` through a page table of two sequences: every index
    page in order, then every page but the first in reverse with one slot of the last (the
    indexer's read of a request's keys and scales, SGLang's ``GetKAndS``)."""
    __tracebackhide__ = True
    pages, page_size = index.shape[0], spec.index_page_size
    key_bytes = index_k_row_bytes(spec.index_head_dim)
    scale_bytes = index_scale_row_bytes(spec.index_head_dim)
    order = [list(range(pages)), list(range(pages - 1, 0, -1)) or [0]]
    lengths = [pages * page_size, (len(order[1]) - 1) * page_size + 1]
    width = max(len(row) for row in order)
    table = [row + [0] * (width - len(row)) for row in order]
    keys, scales = [], []
    for row, length in zip(order, lengths, strict=True):
        for slot in range(length):
            page, offset = row[slot // page_size], slot % page_size
            keys.append(index[page, offset * key_bytes : (offset + 1) * key_bytes])
            start = page_size * key_bytes + offset * scale_bytes
            scales.append(index[page, start : start + scale_bytes])
    device = pool_device(pool)
    got = pool.get_index_k_scale_buffer(
        layer_id,
        torch.tensor(lengths, dtype=torch.int32, device=device),
        torch.tensor(table, dtype=torch.int32, device=device),
        sum(lengths),
        max(lengths),
    )
    read = f"pool.get_index_k_scale_buffer({layer_id}, seq_lens={lengths}, page table {table})"
    signature = FailureSignature(
        check="read_api", call="get_index_k_scale_buffer", kind="bytes differ", family=spec.variant
    )
    for part, tensor, wanted in zip(("keys", "scales"), got, (keys, scales), strict=True):
        assert_bytes_equal(
            read_buffer(tensor).reshape(len(wanted), -1),
            np.stack(wanted),
            what=f"{part} after {call}",
            call=read,
            signature=signature,
        )


def _check_mla_reads(
    pool: Any, spec: Any, latent: np.ndarray, layer_id: int, *, call: str, itemsize: int
) -> None:
    __tracebackhide__ = True
    rank_bytes = spec.kv_lora_rank * itemsize
    loc = torch.arange(spec.num_slots, dtype=torch.int64, device=pool_device(pool))
    read = f"pool.get_mla_kv_buffer(layer_id={layer_id}, loc=all {spec.num_slots} slots)"
    signature = FailureSignature(
        check="read_api", call="get_mla_kv_buffer", kind="bytes differ", family=spec.variant
    )
    if getattr(spec, "quantized", False):
        # A quantized pool's rows come back dequantized, in the dtype the caller names
        # (attention passes the model dtype; sglang's default is the FP4 pool dtype).
        nope, rope = pool.get_mla_kv_buffer(_Layer(layer_id), loc, torch.bfloat16)
    else:
        nope, rope = pool.get_mla_kv_buffer(_Layer(layer_id), loc)
    assert_bytes_equal(
        read_buffer(nope),
        latent[:, :rank_bytes],
        what=f"nope after {call}",
        call=read,
        signature=signature,
    )
    if spec.qk_rope_head_dim:
        assert_bytes_equal(
            read_buffer(rope),
            latent[:, rank_bytes:],
            what=f"rope after {call}",
            call=read,
            signature=signature,
        )


class _Layer:
    """The smallest "layer" the pool API accepts: it reads only ``layer_id``."""

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def pool_device(pool: Any) -> torch.device:
    """The device of a pool's first KV buffer.

    Example:
        >>> from kvcheck.pools import MLATokenToKVPool
        >>> pool_device(MLATokenToKVPool(size=2, page_size=1, dtype=torch.float16,
        ...                              kv_lora_rank=2, qk_rope_head_dim=0, layer_num=1,
        ...                              device="cpu"))
        device(type='cpu')
    """
    for name in KV_BUFFER_ATTRIBUTES:
        buffers = getattr(pool, name, None)
        if buffers:
            return buffers[0].device
    raise ValueError(f"pool={pool!r} has none of the KV buffers {KV_BUFFER_ATTRIBUTES}")


def assert_layer_range(pool: Any, spec: Any, *, call: str = "pool construction") -> None:
    """``start_layer``, ``layer_num`` and ``end_layer`` describe the layers the pool serves
    (``end_layer``: the last one, or one past it, the two conventions SGLang's callers use).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> from kvcheck.targets import resolve_target
        >>> spec = PoolSpec(family="mla", size=2, page_size=1, layer_num=2, dtype="float16",
        ...                 start_layer=5)
        >>> assert_layer_range(resolve_target("kvcheck").make_pool(spec, device="cpu"), spec)
    """
    __tracebackhide__ = True
    last = spec.start_layer + spec.layer_num - 1
    for name, got, allowed in (
        ("start_layer", getattr(pool, "start_layer", None), (spec.start_layer,)),
        ("layer_num", getattr(pool, "layer_num", None), (spec.layer_num,)),
        ("end_layer", getattr(pool, "end_layer", None), (last, last + 1)),
    ):
        if got not in allowed:
            raise fail(
                got=got,
                expected=allowed[0] if len(allowed) == 1 else f"one of {allowed}",
                call=f"pool.{name} after {call}",
                signature=FailureSignature(
                    check="layer_range", call=name, kind="wrong value", family=spec.variant
                ),
            )
