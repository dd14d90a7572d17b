"""``NoOpMHATokenToKVPool``: an MHA pool that holds no KV cache at all.

Used by ``--prefill-only-disable-kv-cache``: in embedding mode the FA prefill backend's
``fa_skip_kv_cache`` path attends over the raw K/V of a single forward and never reads or
writes the pool, so the pool keeps the scheduler's capacity view (``size``) and only
one-page placeholders that code dereferencing the buffers can still ``.view()``.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from kvcheck.pools._host_copy import KVHostCopy
from kvcheck.pools.mha import MHATokenToKVPool

#: Why a write to the no-op pool is a bug, and what configuration it requires.
_REQUIRED_CONFIGURATION = (
    "This pool stores no KV cache: it is only valid with --prefill-only-disable-kv-cache,"
    " which requires --is-embedding, --chunked-prefill-size -1, --disable-radix-cache and"
    " an FA prefill backend (fa3 or fa4) whose fa_skip_kv_cache path never touches the"
    " pool. Check that the workload performs no decode and that those flags are set."
)


class NoOpMHATokenToKVPool(MHATokenToKVPool):
    """An MHA pool with placeholders instead of buffers; every write raises ``RuntimeError``.

    Buffers: ``k_buffer[i]`` is ``[page_size, head_num, head_dim]`` and ``v_buffer[i]``
    ``[page_size, head_num, v_head_dim]`` per local layer, zero-filled, in
    ``store_dtype``. ``size`` is kept for admission. ``get_kv_size_bytes()`` is ``(0, 0)``
    and ``mem_usage`` is ``0.0``. Reads return the placeholder tensors themselves (as
    SGLang does: the raw storage, no fp8 view). ``move_kv_cache`` and ``get_cpu_copy``
    validate their arguments as the MHA pool does, then do nothing / return an empty
    copy; ``set_kv_buffer``, ``set_kv_buffer_prefix_valid`` and ``load_cpu_copy`` raise
    ``RuntimeError`` for any arguments. ``get_contiguous_buf_infos`` describes the
    placeholders (one page each), never the scheduler's ``size``.

    Example:
        >>> import torch
        >>> pool = NoOpMHATokenToKVPool(size=1 << 20, page_size=16, dtype=torch.bfloat16,
        ...                             head_num=8, head_dim=128, layer_num=36, device="meta")
        >>> pool.get_key_buffer(0).shape, pool.get_kv_size_bytes(), pool.mem_usage
        (torch.Size([16, 8, 128]), (0, 0), 0.0)
        >>> pool.set_kv_buffer(None, None, None, None)
        Traceback (most recent call last):
        ...
        RuntimeError: NoOpMHATokenToKVPool.set_kv_buffer was called. ...
    """

    def _buffer_rows(self) -> int:
        return self.page_size

    def _refuse(self, method: str) -> NoReturn:
        raise RuntimeError(f"{type(self).__name__}.{method} was called. {_REQUIRED_CONFIGURATION}")

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The ``[page_size, head_num, head_dim]`` placeholder of global layer ``layer_id``."""
        return self.k_buffer[self._local_layer(layer_id, where="get_key_buffer")]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The ``[page_size, head_num, v_head_dim]`` placeholder of global layer ``layer_id``."""
        return self.v_buffer[self._local_layer(layer_id, where="get_value_buffer")]

    def set_kv_buffer(self, *args: object, **kwargs: object) -> NoReturn:  # type: ignore[override]
        """Always raises ``RuntimeError``: nothing may write to the no-op pool."""
        self._refuse("set_kv_buffer")

    def set_kv_buffer_prefix_valid(  # type: ignore[override]
        self, *args: object, **kwargs: object
    ) -> NoReturn:
        """Always raises ``RuntimeError``: nothing may write to the no-op pool."""
        self._refuse("set_kv_buffer_prefix_valid")

    def load_cpu_copy(self, *args: object, **kwargs: object) -> NoReturn:  # type: ignore[override]
        """Always raises ``RuntimeError``: nothing may write to the no-op pool."""
        self._refuse("load_cpu_copy")

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Validate the move as :class:`MHATokenToKVPool` does, then do nothing.

        ``tgt_loc``/``src_loc``: 1-D int32/int64 of equal length, in
        ``[0, size + page_size)`` (the scheduler's slots, not the placeholder's rows),
        targets distinct. There is no KV cache to move, so the placeholders never change.

        Example:
            >>> pool = NoOpMHATokenToKVPool(size=8, page_size=4, dtype=torch.float16,
            ...                             head_num=1, head_dim=2, layer_num=1, device="cpu")
            >>> pool.move_kv_cache(torch.tensor([9]), torch.tensor([2]))
            >>> pool.move_kv_cache("x", 3.5)
            Traceback (most recent call last):
            ...
            ValueError: move_kv_cache: tgt_loc must be a torch.Tensor, got str
        """
        self._move_locations(tgt_loc, src_loc)

    def get_cpu_copy(self, indices: torch.Tensor) -> KVHostCopy:
        """Validate ``indices`` as :class:`MHATokenToKVPool` does (1-D int32/int64 in
        ``[0, size + page_size)``, repeats allowed), then return an empty copy (no tokens,
        no layers): there is no KV cache to copy.

        Example:
            >>> pool = NoOpMHATokenToKVPool(size=8, page_size=4, dtype=torch.float16,
            ...                             head_num=1, head_dim=2, layer_num=1, device="cpu")
            >>> pool.get_cpu_copy(torch.tensor([1, 1])).num_tokens
            0
        """
        self._locations("indices", indices, distinct=False, where="get_cpu_copy")
        return KVHostCopy(source=type(self).__name__, num_tokens=0, parts={})

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Descriptors of the placeholders, K then V: ``data_ptr()`` (0 on ``meta``), the
        placeholder's bytes (one page: ``page_size * head_num * dim * itemsize``) and one
        page's bytes (the same number).

        SGLang's no-op pool inherits MHA's method, which would advertise
        ``(size + page_size)`` rows behind a one-page placeholder (in 0.5.23 it raises
        ``AttributeError`` instead, as the no-op pool never builds its descriptors). This
        pool describes only memory that exists, so a transfer engine that registers these
        spans never reads past a placeholder.

        Example:
            >>> pool = NoOpMHATokenToKVPool(size=1 << 20, page_size=16, dtype=torch.bfloat16,
            ...                             head_num=8, head_dim=128, layer_num=1,
            ...                             device="meta")
            >>> pool.get_contiguous_buf_infos()
            ([0, 0], [32768, 32768], [32768, 32768])
        """
        return super().get_contiguous_buf_infos()

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(0, 0)``: placeholders are not KV cache, so memory accounting sees none."""
        return (0, 0)
