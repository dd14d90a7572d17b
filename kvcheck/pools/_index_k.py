"""The byte layout of a DSA index-K page row, and token-granular copies on it.

A page row holds ``page_size`` tokens: first every token's fp8 key (``D = index_head_dim``
bytes each), then every token's fp32 scales (``S = index_head_dim // 128 * 4`` bytes each,
one scale per 128-channel block). Token ``t`` lives in page ``t // page_size`` at offset
``o = t % page_size``::

    columns [o*D, (o+1)*D)                            its key bytes
    columns [page_size*D + o*S, page_size*D + (o+1)*S)  its scale bytes

A DSA pool with an index kpool builds the layout with ``page_size = index_page_size`` and
passes index slots (one per ``index_kpool`` tokens) where this module says tokens.

Locations are token ids, so writes, moves and host copies address one token's key and
scale bytes inside its page; they never copy a whole page row (that would overwrite the
page's other tokens). A *token row* (what :meth:`IndexKPageLayout.read` returns and host
copies hold) is one token's ``D`` key bytes followed by its ``S`` scale bytes.

Example:
    >>> layout = IndexKPageLayout(page_size=2, index_head_dim=128)
    >>> layout.row_bytes, layout.key_columns(1), layout.scale_columns(1)
    (264, range(128, 256), range(260, 264))
    >>> buffer = (torch.arange(264) % 256).to(torch.uint8).repeat(3, 1)
    >>> row = layout.read(buffer, torch.tensor([3]))
    >>> row.shape, row[0, 0].item(), row[0, 128:].tolist()
    (torch.Size([1, 132]), 128, [4, 5, 6, 7])
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

    @property
    def token_bytes(self) -> int:
        """Bytes of one token row: ``D + S``."""
        return self.key_bytes + self.scale_bytes

    def read(self, buffer: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """A new ``[n, D + S]`` uint8 tensor: token ``tokens[i]``'s key bytes, then its
        scale bytes (``tokens`` may repeat)."""
        page, offset = tokens // self.page_size, tokens % self.page_size
        return torch.cat(
            [self._keys(buffer)[page, offset], self._scales(buffer)[page, offset]], dim=1
        )

    def write_rows(self, buffer: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        """Write token rows (``[n, D + S]`` uint8, as :meth:`read` returns) to distinct
        ``tokens``; the pages' other tokens are untouched."""
        self.write(buffer, tokens, rows[:, : self.key_bytes], rows[:, self.key_bytes :])

    def move(self, buffer: torch.Tensor, *, tgt: torch.Tensor, src: torch.Tensor) -> None:
        """Copy token ``src[i]``'s key and scale bytes to token ``tgt[i]``.

        Every source is gathered before any target is written; targets are distinct.
        """
        tgt_page, tgt_offset = tgt // self.page_size, tgt % self.page_size
        src_page, src_offset = src // self.page_size, src % self.page_size
        for part in (self._keys(buffer), self._scales(buffer)):
            part.index_put_((tgt_page, tgt_offset), part[src_page, src_offset])
