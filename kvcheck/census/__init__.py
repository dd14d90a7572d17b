"""A state census of any pool object: every tensor it holds, by path, with its index space.

The census needs no model of the pool's class. It walks the object (attributes, lists,
dicts, nested sub-pools), reads the pool's geometry from its own attributes (``size``,
``page_size``, ``layer_num``, ...; a sub-pool's from its own) and classifies each tensor
by its shape: token slot, page, request row, per-layer, placeholder, or unclassified,
which it reports by name. The properties in :mod:`kvcheck.properties.census` check a
pool's whole-pool operations against it.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> pool = SimpleNamespace(size=6, page_size=2, layer_num=1,
    ...                        kv=[torch.zeros(8, 4)], odd=torch.zeros(10, 5))
    >>> census = take_census(pool)
    >>> [(e.path, e.space.value) for e in census.entries], census.unclassified
    ([('kv[0]', 'slot'), ('odd', 'unclassified')], ('odd',))
"""

from __future__ import annotations

from kvcheck.census.census import Census, TensorEntry, storage_key, take_census
from kvcheck.census.classify import Classification, IndexSpace, classify
from kvcheck.census.declared import KNOWN_ROLES, Role, role_of
from kvcheck.census.geometry import CensusGeometry, geometry_of
from kvcheck.census.walk import FoundTensor, walk_tensors

__all__ = [
    "KNOWN_ROLES",
    "Census",
    "CensusGeometry",
    "Classification",
    "FoundTensor",
    "IndexSpace",
    "Role",
    "TensorEntry",
    "classify",
    "geometry_of",
    "role_of",
    "storage_key",
    "take_census",
    "walk_tensors",
]
