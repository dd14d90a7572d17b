"""A census of a pool's state: every tensor it holds, with its index space and bytes.

Example:
    >>> from kvcheck.pools import MHATokenToKVPool
    >>> pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float16, head_num=1,
    ...                         head_dim=2, layer_num=2, device="cpu")
    >>> census = take_census(pool)
    >>> [(entry.path, entry.space.value) for entry in census.entries][:3]
    [('k_buffer[0]', 'slot'), ('k_buffer[1]', 'slot'), ('v_buffer[0]', 'slot')]
    >>> census.held_bytes(), census.unclassified
    (192, ())
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvcheck.census.classify import Classification, IndexSpace, classify
from kvcheck.census.declared import Role, role_of
from kvcheck.census.geometry import CensusGeometry, geometry_of
from kvcheck.census.walk import walk_tensors

__all__ = ["Census", "TensorEntry", "take_census"]


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    """What identifies the memory a tensor views: its storage's address, or on ``meta``
    (where every address is 0) the tensor it was sliced from."""
    if tensor.device.type != "meta":
        address = tensor.untyped_storage().data_ptr()
        if address:
            return (str(tensor.device), address)
    base = tensor._base if tensor._base is not None else tensor
    return ("object", id(base))


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the census: its path, index space (and the dimension that runs over
    it), the geometry it was measured against, and the entry whose storage it shares."""

    path: str
    tensor: torch.Tensor = dataclasses.field(repr=False, compare=False)
    space: IndexSpace
    dim: int | None
    why: str
    geometry: CensusGeometry
    aliases: tuple[str, ...] = ()
    view_of: str | None = None
    #: Token slots (a slot entry) or rows per request (a row entry) one row groups.
    group: int = 1

    @property
    def nbytes(self) -> int:
        """Bytes of the view (not of the storage it may share)."""
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def extent(self) -> int:
        """Rows along the indexed dimension (0 when it has none)."""
        return 0 if self.dim is None else int(self.tensor.shape[self.dim])

    @property
    def row_bytes(self) -> int:
        """Bytes of one row along the indexed dimension (one slot, page or request)."""
        return self.nbytes // self.extent if self.extent else 0

    @property
    def holds_state(self) -> bool:
        """Whether the entry holds cache state (slot, page or request rows, with bytes)."""
        return self.space.holds_state and self.nbytes > 0


@dataclass(frozen=True)
class Census:
    """Every tensor one pool holds (:attr:`entries`) and the pool's own geometry."""

    pool_type: str
    geometry: CensusGeometry
    entries: tuple[TensorEntry, ...]

    @property
    def unclassified(self) -> tuple[str, ...]:
        """The paths of the tensors no rule classified."""
        return tuple(e.path for e in self.entries if e.space is IndexSpace.UNCLASSIFIED)

    def entry(self, path: str) -> TensorEntry:
        """The entry at ``path`` (or one of its aliases); ``KeyError`` naming the paths."""
        for entry in self.entries:
            if path == entry.path or path in entry.aliases:
                return entry
        raise KeyError(f"no tensor at {path!r}; the census has {[e.path for e in self.entries]}")

    def matching(self, patterns: Mapping[str, str] | tuple[str, ...]) -> tuple[TensorEntry, ...]:
        """The entries whose path matches one of ``patterns`` (``fnmatch`` globs)."""
        return tuple(
            e for e in self.entries if any(fnmatch.fnmatchcase(e.path, p) for p in patterns)
        )

    def state_entries(self, *, own_geometry_only: bool = False) -> tuple[TensorEntry, ...]:
        """Entries that hold cache state; with ``own_geometry_only``, those whose ids are
        the pool's own (:meth:`CensusGeometry.same_ids`; not a sub-pool with ids of its
        own, such as an SWA window pool)."""
        return tuple(
            e
            for e in self.entries
            if e.holds_state and (not own_geometry_only or e.geometry.same_ids(self.geometry))
        )

    def held_bytes(self, *, exempt: Mapping[str, str] | tuple[str, ...] = ()) -> int:
        """Bytes of the storages behind every entry that is not a placeholder or a
        per-layer table (each storage once, padding included), leaving out the entries
        whose path matches ``exempt``."""
        left_out = {e.path for e in self.matching(exempt)}
        storages: dict[tuple[str, int], int] = {}
        for e in self.entries:
            if e.space in (IndexSpace.PLACEHOLDER, IndexSpace.LAYER) or e.path in left_out:
                continue
            storages[storage_key(e.tensor)] = e.tensor.untyped_storage().nbytes()
        return sum(storages.values())

    def describe(self) -> str:
        """One line per entry: path, shape, dtype, bytes, space and why."""
        lines = [f"census of {self.pool_type} ({self.geometry})"]
        for e in self.entries:
            shared = f", views {e.view_of}'s storage" if e.view_of else ""
            lines.append(
                f"  {e.path}: {tuple(e.tensor.shape)} {e.tensor.dtype}, {e.nbytes} bytes,"
                f" {e.space.value} ({e.why}{shared})"
            )
        return "\n".join(lines)


def take_census(
    pool: object,
    *,
    geometry: Mapping[str, Any] | None = None,
    declared: Mapping[str, Role] | None = None,
) -> Census:
    """The census of ``pool``: every tensor it holds (attributes, lists, tuples, dicts,
    nested sub-pools), each classified against the geometry of the object that holds it
    (:func:`kvcheck.census.geometry_of`: the pool's own attributes; a sub-pool's own
    numbers for its tensors). ``geometry`` overrides the pool's (CensusGeometry field ->
    value: ``{"token_stride": 2}`` for a decode-context-parallel rank, say); ``declared``
    maps path globs to the :class:`kvcheck.census.declared.Role` of tensors whose shape
    does not tell it (a workspace, a mirror of other state), each with its reason.

    A tensor no rule classifies is kept, as :class:`IndexSpace.UNCLASSIFIED`, and named by
    :attr:`Census.unclassified`. Tensors reached twice are one entry with aliases; a
    tensor sharing another's storage names it in ``view_of``.
    """
    if pool is None or isinstance(pool, (int, float, str, bytes, torch.Tensor)):
        raise ValueError(f"pool={pool!r} must be a pool object (one that holds tensors)")
    own = geometry_of(pool, override=geometry)

    def enter(value: object, held_in: CensusGeometry) -> CensusGeometry:
        return geometry_of(value, parent=held_in)

    found_tensors = walk_tensors(pool, context=own, enter=enter)
    # A pool that holds token-slot buffers keeps no one-page placeholders: a buffer of
    # page_size rows beside them is a page buffer (its page count equals the page size).
    with_slots = [
        f.context for f in found_tensors if classify(f.tensor, f.context).space is IndexSpace.SLOT
    ]
    entries: list[TensorEntry] = []
    first_path: dict[tuple[str, int], str] = {}
    for found in found_tensors:
        kind = classify(found.tensor, found.context, has_slot_buffers=found.context in with_slots)
        role = role_of(found.path, declared or {})
        if role is not None:
            kind = Classification(role.space, kind.dim, f"declared: {role.reason}")
        key = storage_key(found.tensor)
        entries.append(
            TensorEntry(
                path=found.path,
                tensor=found.tensor,
                space=kind.space,
                dim=kind.dim,
                why=kind.why,
                geometry=found.context,
                aliases=found.aliases,
                view_of=first_path.get(key),
                group=kind.group,
            )
        )
        first_path.setdefault(key, found.path)
    return Census(type(pool).__qualname__, own, tuple(entries))
