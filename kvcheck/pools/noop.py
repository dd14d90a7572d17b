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
    SGLang does: the raw storage, no fp8 view). ``move_kv_cache`` accepts anything and
    does nothing; ``get_cpu_copy`` returns an empty copy; ``set_kv_buffer`` and
    ``load_cpu_copy`` raise ``RuntimeError``.

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

    def load_cpu_copy(self, *args: object, **kwargs: object) -> NoReturn:  # type: ignore[override]
        """Always raises ``RuntimeError``: nothing may write to the no-op pool."""
        self._refuse("load_cpu_copy")

    def move_kv_cache(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        """No-op: there is no KV cache to move."""

    def get_cpu_copy(self, *args: object, **kwargs: object) -> KVHostCopy:  # type: ignore[override]
        """An empty copy (no tokens, no layers): there is no KV cache to copy."""
        return KVHostCopy(source=type(self).__name__, num_tokens=0, parts={})

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(0, 0)``: placeholders are not KV cache, so memory accounting sees none."""
        return (0, 0)
