"""``KVCache``: the state and the checks every pool family shares.

A pool serves the global layers ``start_layer .. start_layer + layer_num - 1`` and keeps
one buffer per *local* layer (``layer_id - start_layer``). Token buffers have
``size + page_size`` slots: the first page is SGLang's padding page, which absorbs writes
from padded tokens, so valid locations are ``[0, size + page_size)``.

Every public entry point validates all its arguments before it touches a buffer, so a
``ValueError`` leaves the pool exactly as it was, and no entry point writes to a tensor
the caller passed in. On ``device="meta"`` buffers have shapes but no data: construction
and byte accounting work, data operations check shapes and dtypes (location *values*
cannot be read) and then do nothing.

Example:
    >>> from kvcheck.pools import MHATokenToKVPool
    >>> pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float16, head_num=1,
    ...                         head_dim=2, layer_num=2, device="cpu", start_layer=10)
    >>> pool.num_slots, pool.layer_ids
    (12, range(10, 12))
    >>> pool.get_key_buffer(12)
    Traceback (most recent call last):
    ...
    ValueError: get_key_buffer: layer_id=12 not in [10, 12) (layers served by this pool)
"""

from __future__ import annotations

import abc
import operator
from typing import Any

import torch

from kvcheck.pools._dtypes import (
    SUPPORTED_DTYPES,
    accepted_payload_dtypes,
    as_storage,
    check_pool_dtype,
    convert_payload,
    is_native,
    payload_dtypes,
    storage_dtype,
)
from kvcheck.pools._refusals import (
    check_locations,
    check_payload,
    check_same_length,
    require_bool,
    require_int,
    resolve_device,
)

#: Bytes per GiB, the unit of ``mem_usage`` (SGLang's ``GB``).
GIB = 1 << 30


def _check_end_layer(end_layer: object, start_layer: int, layer_num: int) -> int:
    """``end_layer`` as given if it is ``start + layer_num - 1`` or ``start + layer_num``."""
    inclusive, exclusive = start_layer + layer_num - 1, start_layer + layer_num
    if end_layer is None:
        return inclusive
    value = require_int("end_layer", end_layer, minimum=0)
    if value not in (inclusive, exclusive):
        raise ValueError(
            f"end_layer={end_layer!r} must be start_layer + layer_num - 1 = {inclusive}"
            f" (inclusive) or start_layer + layer_num = {exclusive} (exclusive)"
            f" for start_layer={start_layer}, layer_num={layer_num}"
        )
    return value


class KVCache(abc.ABC):
    """Abstract KV-cache pool: shared attributes, layer mapping and argument checks.

    Attributes:
        size: token capacity the scheduler sees (buffers hold ``size + page_size`` slots).
        page_size: tokens per page (``>= 1``).
        dtype: the cache dtype callers read; ``store_dtype`` is what tensors hold
            (``uint8`` for fp8 dtypes).
        layer_num, start_layer, end_layer: the global layers served. ``end_layer``
            defaults to ``start_layer + layer_num - 1`` (inclusive); the only other value
            accepted is ``start_layer + layer_num`` (the exclusive bound SGLang's
            configurator passes). It is stored as given; layer mapping uses only
            ``start_layer`` and ``layer_num``.
        device: the device as a string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"meta"``).

    Subclasses create their buffers and implement the data operations with the
    ``_local_layer``, ``_write_layer``, ``_locations``, ``_move_locations``,
    ``_cache_payload`` and ``_check_pair_dtypes`` checks; ``_stored_rows`` turns a
    validated payload into storage rows.
    """

    #: The cache dtypes the pool takes (the quantized pools take their own).
    _POOL_DTYPES: tuple[torch.dtype, ...] = SUPPORTED_DTYPES

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
    ) -> None:
        self.size = require_int("size", size, minimum=1)
        self.page_size = require_int("page_size", page_size, minimum=1)
        self.dtype = check_pool_dtype(dtype, self._POOL_DTYPES)
        self.store_dtype = storage_dtype(self.dtype)
        self.layer_num = require_int("layer_num", layer_num, minimum=1)
        self.start_layer = (
            0 if start_layer is None else require_int("start_layer", start_layer, minimum=0)
        )
        self.end_layer = _check_end_layer(end_layer, self.start_layer, self.layer_num)
        # Accepted for SGLang's signature; there is no memory saver to drive here.
        self.enable_memory_saver = require_bool("enable_memory_saver", enable_memory_saver)
        self._torch_device = resolve_device(device)
        self.device = str(torch.device(device))

    # --- shared facts --------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        """Rows in each per-layer token buffer: capacity plus the padding page."""
        return self.size + self.page_size

    @property
    def layer_ids(self) -> range:
        """Global ids of the layers this pool serves."""
        return range(self.start_layer, self.start_layer + self.layer_num)

    @property
    def is_meta(self) -> bool:
        """True when buffers live on the ``meta`` device (shapes only, no data)."""
        return self._torch_device.type == "meta"

    @property
    def mem_usage(self) -> float:
        """GiB held by the pool's buffers: ``get_kv_size_bytes()`` (summed) / 2**30."""
        size_bytes = self.get_kv_size_bytes()
        total = sum(size_bytes) if isinstance(size_bytes, tuple) else size_bytes
        return total / GIB

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype or self.store_dtype, device=self._torch_device)

    def _as_read_dtype(self, buffer: torch.Tensor) -> torch.Tensor:
        """``buffer`` as callers read it: an fp8 view of ``uint8`` storage, else itself."""
        return buffer if self.store_dtype == self.dtype else buffer.view(self.dtype)

    def _to_host(self, rows: torch.Tensor) -> torch.Tensor:
        """Host copy of freshly gathered rows (meta rows stay meta: they hold no data)."""
        return rows if self.is_meta else rows.to("cpu")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, page_size={self.page_size},"
            f" dtype={self.dtype}, layer_num={self.layer_num},"
            f" start_layer={self.start_layer}, device={self.device!r})"
        )

    # --- argument checks shared by the families ------------------------------------------

    def _local_layer(self, layer_id: object, *, where: str, name: str = "layer_id") -> int:
        """Map a global layer id to its local buffer index, or raise ``ValueError``."""
        valid = self.layer_ids
        if isinstance(layer_id, bool):
            raise ValueError(f"{where}: {name}={layer_id!r} must be an integer layer id")
        try:
            global_id = operator.index(layer_id)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(f"{where}: {name}={layer_id!r} must be an integer layer id") from None
        if global_id not in valid:
            raise ValueError(
                f"{where}: {name}={global_id} not in [{valid.start}, {valid.stop})"
                " (layers served by this pool)"
            )
        return global_id - self.start_layer

    def _layer_of(self, layer: object, *, where: str) -> int:
        """Local index of ``layer.layer_id`` (a global id), or raise ``ValueError``."""
        if not hasattr(layer, "layer_id"):
            raise ValueError(
                f"{where}: layer must have a .layer_id attribute (its global layer id),"
                f" got {type(layer).__name__}"
            )
        return self._local_layer(layer.layer_id, where=where, name="layer.layer_id")

    def _write_layer(
        self, layer: object, layer_id_override: object, *, where: str, reads_layer: bool
    ) -> int:
        """Local index of the layer a write targets: ``layer_id_override`` when given
        (a global id, validated like ``layer.layer_id``), else ``layer.layer_id``.

        With an override, ``layer``'s id is not used; ``reads_layer`` (MHA, whose SGLang
        write still reads ``layer.layer_id`` unless ``layer`` is ``None``) requires
        ``layer`` to be ``None`` or to have a ``.layer_id``.
        """
        if layer_id_override is None:
            return self._layer_of(layer, where=where)
        if reads_layer and layer is not None and not hasattr(layer, "layer_id"):
            raise ValueError(
                f"{where}: layer must be None or have a .layer_id attribute when"
                f" layer_id_override is given, got {type(layer).__name__}"
            )
        return self._local_layer(layer_id_override, where=where, name="layer_id_override")

    def _locations(
        self,
        name: str,
        loc: object,
        *,
        distinct: bool,
        where: str,
        limit: int | None = None,
        limit_reason: str = "",
    ) -> torch.Tensor:
        """Validate token locations in ``[0, limit)`` (default ``num_slots``).

        Returns them as ``int64`` on the pool's device.
        """
        return check_locations(
            name,
            loc,
            limit=self.num_slots if limit is None else limit,
            device=self._torch_device,
            distinct=distinct,
            where=where,
            limit_reason=limit_reason,
        )

    def _move_locations(
        self,
        tgt_loc: object,
        src_loc: object,
        *,
        where: str = "move_kv_cache",
        limit: int | None = None,
        limit_reason: str = "",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate a move: same lengths, all in range, targets distinct (sources may repeat)."""
        tgt = self._locations(
            "tgt_loc", tgt_loc, distinct=True, where=where, limit=limit, limit_reason=limit_reason
        )
        src = self._locations(
            "src_loc", src_loc, distinct=False, where=where, limit=limit, limit_reason=limit_reason
        )
        check_same_length(("tgt_loc", "src_loc"), (tgt, src), where=where)
        return tgt, src

    def _cache_payload(
        self, name: str, value: object, shape: tuple[int, ...], *, where: str
    ) -> torch.Tensor:
        """Validate a cache payload in any accepted dtype (native or converted on write);
        returns it unchanged (see :meth:`_stored_rows`)."""
        return check_payload(
            name,
            value,
            shape=shape,
            dtypes=accepted_payload_dtypes(self.dtype),
            device=self._torch_device,
            where=where,
        )

    def _check_pair_dtypes(
        self, first: tuple[str, torch.Tensor], second: tuple[str, torch.Tensor], *, where: str
    ) -> None:
        """``second`` converts together with ``first`` (as SGLang converts cache_v when
        cache_k is not in the pool's dtype): both native, or both in ``first``'s dtype."""
        (a, ta), (b, tb) = first, second
        if is_native(ta.dtype, self.dtype):
            if not is_native(tb.dtype, self.dtype):
                native = " or ".join(str(d) for d in payload_dtypes(self.dtype))
                raise ValueError(
                    f"{where}: {b} has dtype {tb.dtype} but {a} has the pool's dtype"
                    f" {ta.dtype}; {b} must then be {native} too ({b} is converted only"
                    f" together with {a})"
                )
        elif tb.dtype != ta.dtype:
            raise ValueError(
                f"{where}: {b} has dtype {tb.dtype} but {a} has dtype {ta.dtype};"
                f" a payload converted to the pool's dtype {self.dtype} must come as"
                f" {a} and {b} of one dtype"
            )

    def _stored_rows(self, tensor: torch.Tensor, scale: float | None) -> torch.Tensor:
        """A validated payload as storage rows: native payloads bit for bit (scale
        ignored, as SGLang does), others through :func:`convert_payload`."""
        if not is_native(tensor.dtype, self.dtype):
            tensor = convert_payload(tensor, self.dtype, scale)
        return as_storage(tensor, self.store_dtype)

    @staticmethod
    def _invariant(condition: bool, message: str) -> None:
        # Raised explicitly so check_valid still checks under ``python -O``.
        if not condition:
            raise AssertionError(message)

    def _check_common_invariants(self, buffers: dict[str, list[torch.Tensor]]) -> None:
        """Every buffer group has one tensor per local layer, on the device, in ``store_dtype``."""
        for name, layers in buffers.items():
            self._invariant(
                len(layers) == self.layer_num,
                f"{name} has {len(layers)} layers, expected layer_num={self.layer_num}",
            )
            for i, buffer in enumerate(layers):
                self._invariant(
                    buffer.device == self._torch_device,
                    f"{name}[{i}] is on {buffer.device}, expected {self._torch_device}",
                )

    # --- the API every family implements -------------------------------------------------

    @abc.abstractmethod
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Key buffer of global layer ``layer_id``, viewed in ``dtype``."""

    @abc.abstractmethod
    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Value buffer of global layer ``layer_id``, viewed in ``dtype``."""

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer(layer_id), get_value_buffer(layer_id))``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    @abc.abstractmethod
    def set_kv_buffer(
        self,
        layer: Any,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: Any,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Write one layer's cache rows at token locations ``loc``."""

    @abc.abstractmethod
    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy every layer's data from ``src_loc`` to ``tgt_loc`` (gather, then scatter)."""

    @abc.abstractmethod
    def get_cpu_copy(self, indices: torch.Tensor) -> Any:
        """Copy the tokens at ``indices`` of every layer to host memory."""

    @abc.abstractmethod
    def load_cpu_copy(self, kv_cache_cpu: Any, indices: torch.Tensor) -> None:
        """Write a host copy back, token ``i`` of the copy to slot ``indices[i]``."""

    @abc.abstractmethod
    def get_kv_size_bytes(self) -> int | tuple[int, int]:
        """Bytes held by the cache buffers (the per-family docstring says which)."""

    @abc.abstractmethod
    def check_valid(self) -> None:
        """Raise ``AssertionError`` if a buffer breaks the pool's invariants."""
