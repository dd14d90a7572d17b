"""The byte layout of a DSA index-K page row, and token-granular copies on it.

A page row holds ``page_size`` tokens: first every token's fp8 key (``D = index_head_dim``
bytes each), then every token's fp32 scales (``S = index_head_dim // 128 * 4`` bytes each,
one scale per 128-channel block). Token ``t`` lives in page ``t // page_size`` at offset
``o = t % page_size``::

    columns [o*D, (o+1)*D)                            its key bytes
    columns [page_size*D + o*S, page_size*D + (o+1)*S)  its scale bytes

Locations are token ids, so copies address one token's key and scale bytes inside its
page; they never copy a whole page row (that would overwrite the page's other tokens).

Example:
    >>> layout = IndexKPageLayout(page_size=2, index_head_dim=128)
    >>> layout.row_bytes, layout.key_columns(1), layout.scale_columns(1)
    (264, range(128, 256), range(260, 264))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Channels that share one fp32 scale.
QUANT_BLOCK = 128
_SCALE_ITEMSIZE = torch.tensor([], dtype=torch.float32).element_size()


@dataclass(frozen=True)
class IndexKPageLayout:
    """Where each token's key and scale bytes sit inside a ``uint8`` page row."""

    page_size: int
    index_head_dim: int

    @property
    def key_bytes(self) -> int:
        """``D``: fp8 key bytes per token."""
        return self.index_head_dim

    @property
    def scale_count(self) -> int:
        """fp32 scales per token (one per 128-channel block)."""
        return self.index_head_dim // QUANT_BLOCK

    @property
    def scale_bytes(self) -> int:
        """``S``: scale bytes per token."""
        return self.scale_count * _SCALE_ITEMSIZE

    @property
    def row_bytes(self) -> int:
        """Bytes of one page row: ``page_size * (D + S)``."""
        return self.page_size * (self.key_bytes + self.scale_bytes)

    def key_columns(self, offset: int) -> range:
        """Columns holding the key of the token at ``offset`` in its page."""
        start = offset * self.key_bytes
        return range(start, start + self.key_bytes)

    def scale_columns(self, offset: int) -> range:
        """Columns holding the scales of the token at ``offset`` in its page."""
        start = self.page_size * self.key_bytes + offset * self.scale_bytes
        return range(start, start + self.scale_bytes)

    def _keys(self, buffer: torch.Tensor) -> torch.Tensor:
        # [pages, page_size, D] view: splitting the contiguous key columns needs no copy.
        keys = buffer[:, : self.page_size * self.key_bytes]
        return keys.view(buffer.shape[0], self.page_size, self.key_bytes)

    def _scales(self, buffer: torch.Tensor) -> torch.Tensor:
        scales = buffer[:, self.page_size * self.key_bytes :]
        return scales.view(buffer.shape[0], self.page_size, self.scale_bytes)

    def write(
        self,
        buffer: torch.Tensor,
        tokens: torch.Tensor,
        key_bytes: torch.Tensor,
        scale_bytes: torch.Tensor,
    ) -> None:
        """Write ``key_bytes[i]`` (``[n, D]`` uint8) and ``scale_bytes[i]`` (``[n, S]``
        uint8) as token ``tokens[i]``'s key and scales; ``tokens`` are distinct."""
        page, offset = tokens // self.page_size, tokens % self.page_size
        self._keys(buffer).index_put_((page, offset), key_bytes)
        self._scales(buffer).index_put_((page, offset), scale_bytes)

    def move(self, buffer: torch.Tensor, *, tgt: torch.Tensor, src: torch.Tensor) -> None:
        """Copy token ``src[i]``'s key and scale bytes to token ``tgt[i]``.

        Every source is gathered before any target is written; targets are distinct.
        """
        tgt_page, tgt_offset = tgt // self.page_size, tgt % self.page_size
        src_page, src_offset = src // self.page_size, src % self.page_size
        for part in (self._keys(buffer), self._scales(buffer)):
            part.index_put_((tgt_page, tgt_offset), part[src_page, src_offset])


def whole_page_ids(indices: torch.Tensor, page_size: int, *, name: str, where: str) -> torch.Tensor:
    """Page ids of ``indices`` if they are whole pages, else raise ``ValueError``.

    Whole pages: ``len(indices) % page_size == 0`` and each consecutive group of
    ``page_size`` entries is one page's slots in order, ``p*page_size + 0 .. page_size-1``.
    Values of a ``meta`` tensor cannot be read, so only the length is checked there.

    Example:
        >>> whole_page_ids(torch.tensor([4, 5, 0, 1]), 2, name="indices", where="w").tolist()
        [2, 0]
    """
    n = indices.numel()
    if n % page_size != 0:
        raise ValueError(
            f"{where}: {name} must be whole pages, but len({name})={n} is not a multiple of"
            f" page_size={page_size}"
        )
    if indices.device.type == "meta":
        # Shape only: arithmetic on meta tensors is slow to set up and yields no values.
        return torch.empty((n // page_size,), dtype=torch.int64, device=indices.device)
    groups = indices.view(-1, page_size)
    if n > 0:
        first = groups[:, 0]
        expected = first[:, None] + torch.arange(page_size, device=indices.device)
        bad = (first % page_size != 0) | (groups != expected).any(dim=1)
        if bool(bad.any()):
            g = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{where}: {name}[{g * page_size}:{(g + 1) * page_size}]="
                f"{groups[g].tolist()} is not one page's slots in order"
                f" (p*{page_size} + 0..{page_size - 1}); {name} must be whole pages"
            )
    return groups[:, 0] // page_size
