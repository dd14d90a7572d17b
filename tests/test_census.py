"""The census itself (kvcheck.census): the walk, the geometry, the classification and the
report of what it cannot classify, on hand-built objects and kvcheck's own pools."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvcheck.census import (
    KNOWN_ROLES,
    CensusGeometry,
    IndexSpace,
    Role,
    classify,
    geometry_of,
    take_census,
    walk_tensors,
)
from kvcheck.pools import DSATokenToKVPool, MHATokenToKVPool, NoOpMHATokenToKVPool


def test_walk_reaches_attributes_lists_dicts_and_sub_objects_once_despite_cycles() -> None:
    """Every tensor once, by dotted path; a cycle back to the pool ends the walk; modules,
    functions and classes are not entered."""
    pool = SimpleNamespace(size=4, page_size=1)
    pool.layers = [torch.zeros(5, 2), (torch.zeros(5, 3),)]
    pool.by_name = {"scale": torch.zeros(5)}
    pool.sub = SimpleNamespace(parent=pool, state=SimpleNamespace(conv=[torch.zeros(2, 5, 1)]))
    pool.helper, pool.kind, pool.module = print, SimpleNamespace, torch
    paths = [found.path for found in walk_tensors(pool)]
    assert paths == ["layers[0]", "layers[1][0]", "by_name['scale']", "sub.state.conv[0]"]


def test_views_of_one_storage_are_noted_and_counted_once() -> None:
    """K and V halves of one fused tensor: two entries, the second a view of the first's
    storage, and the storage's bytes (padding included) counted once."""
    fused = torch.zeros(2, 6, 4)  # K and V halves of one layer, size + page_size rows each
    pool = SimpleNamespace(size=3, page_size=3, layer_num=1, k=[fused[0]], v=[fused[1]])
    census = take_census(pool)
    assert [e.view_of for e in census.entries] == [None, "k[0]"]
    assert census.held_bytes() == fused.nbytes


def test_sub_pools_are_measured_by_their_own_geometry() -> None:
    """An SWA-like pool: the sub-pool's buffers have its own size, and classify as slots."""
    full = SimpleNamespace(size=8, k=[torch.zeros(10, 4)])
    swa = SimpleNamespace(size=4, k=[torch.zeros(6, 4)])
    pool = SimpleNamespace(size=8, page_size=2, layer_num=2, full_kv_pool=full, swa_kv_pool=swa)
    census = take_census(pool)
    assert [(e.path, e.space, e.geometry.size) for e in census.entries] == [
        ("full_kv_pool.k[0]", IndexSpace.SLOT, 8),
        ("swa_kv_pool.k[0]", IndexSpace.SLOT, 4),
    ]
    assert census.state_entries(own_geometry_only=True)[0].path == "full_kv_pool.k[0]"


def test_what_no_rule_classifies_is_reported_by_name() -> None:
    """An odd tensor stays in the census, unclassified, with the extents it missed."""
    pool = SimpleNamespace(size=8, page_size=4, layer_num=2, kv=[torch.zeros(12, 2)])
    pool.odd = torch.zeros(7, 3)
    census = take_census(pool)
    assert census.unclassified == ("odd",)
    assert "matches no slot (12, 9)" in census.entry("odd").why
    assert "odd: (7, 3) torch.float32, 84 bytes, unclassified" in census.describe()


@pytest.mark.parametrize(
    ("shape", "dtype", "space", "dim"),
    [
        ((12, 2), torch.bfloat16, IndexSpace.SLOT, 0),
        ((3, 64), torch.uint8, IndexSpace.PAGE, 0),
        ((9, 1), torch.float32, IndexSpace.SLOT, 0),  # size + 1
        ((6,), torch.int64, IndexSpace.LAYER, 0),  # pointer table, 3 per layer
        ((2, 12, 4), torch.float32, IndexSpace.SLOT, 1),  # stacked by layer
        ((0, 132), torch.uint8, IndexSpace.PLACEHOLDER, None),
        ((4, 1, 2), torch.bfloat16, IndexSpace.PLACEHOLDER, None),  # one page, no slot buffers
        ((8, 4), torch.float32, IndexSpace.ROW, 0),  # a row per unit of capacity
        ((5, 5), torch.float32, IndexSpace.UNCLASSIFIED, None),
    ],
    ids=str,
)
def test_classification_rules(
    shape: tuple[int, ...], dtype: torch.dtype, space: IndexSpace, dim: int | None
) -> None:
    """One shape per rule of kvcheck.census.classify, at size 8, page 4, two layers."""
    found = classify(torch.zeros(shape, dtype=dtype), CensusGeometry(size=8, page_size=4, layers=2))
    assert (found.space, found.dim) == (space, dim)


def test_a_page_count_equal_to_the_page_size_is_a_page_beside_slot_buffers() -> None:
    """size=2, page=2: an index buffer of 2 page rows beside slot buffers is a page
    buffer; the same length in a pool without slot buffers is a placeholder."""
    geometry = CensusGeometry(size=2, page_size=2, layers=1)
    rows = torch.zeros(2, 132, dtype=torch.uint8)
    assert classify(rows, geometry, has_slot_buffers=True).space is IndexSpace.PAGE
    assert classify(rows, geometry).space is IndexSpace.PLACEHOLDER


def test_geometry_reads_the_pool_and_takes_overrides() -> None:
    """Sizes come from the pool's attributes; an override wins; a bad field is named."""
    pool = SimpleNamespace(size=16, page_size=4, layer_num=3, start_layer=5, max_batch_size=2)
    assert geometry_of(pool) == CensusGeometry(
        size=16, page_size=4, layers=3, start_layer=5, rows=(2,)
    )
    assert geometry_of(pool, override={"token_stride": 2}).page_extents == (10, 11)
    with pytest.raises(ValueError, match=r"override: \['pages'\] are not CensusGeometry fields"):
        geometry_of(pool, override={"pages": 3})


def test_take_census_refuses_what_is_not_a_pool() -> None:
    """A tensor or a number is not a pool: the message names the argument."""
    with pytest.raises(ValueError, match=r"pool=.* must be a pool object"):
        take_census(torch.zeros(3))


def test_declared_roles_name_their_reason() -> None:
    """A declared workspace keeps its bytes but holds no state; a role needs a reason."""
    pool = SimpleNamespace(
        size=2, page_size=1, layer_num=1, kv=[torch.zeros(3, 2)], dq_k_buffer=torch.zeros(3, 2)
    )
    entry = take_census(pool, declared=KNOWN_ROLES).entry("dq_k_buffer")
    assert entry.space is IndexSpace.WORKSPACE and "dequant workspace" in entry.why
    assert not entry.holds_state
    with pytest.raises(ValueError, match=r"reason='' must say why"):
        Role(IndexSpace.WORKSPACE, "")


@pytest.mark.parametrize(
    ("pool", "spaces"),
    [
        (
            MHATokenToKVPool(
                size=6,
                page_size=4,
                dtype=torch.bfloat16,
                head_num=1,
                head_dim=2,
                layer_num=1,
                device="cpu",
            ),
            ["slot", "slot"],
        ),
        (
            NoOpMHATokenToKVPool(
                size=6,
                page_size=2,
                dtype=torch.bfloat16,
                head_num=1,
                head_dim=2,
                layer_num=1,
                device="cpu",
            ),
            ["placeholder", "placeholder"],
        ),
        (
            DSATokenToKVPool(
                size=8,
                page_size=2,
                kv_lora_rank=4,
                dtype=torch.bfloat16,
                qk_rope_head_dim=2,
                layer_num=2,
                device="meta",
                index_head_dim=128,
                skip_topk_layers=[False, True],
            ),
            ["slot", "slot", "page", "placeholder"],
        ),
    ],
    ids=["mha-padded-halves", "noop", "dsa-meta-with-skip"],
)
def test_kvcheck_pools_classify_fully(pool: object, spaces: list[str]) -> None:
    """kvcheck's own pools (fused padded K/V halves, no-op placeholders, a DSA skip layer's
    zero-row buffer, on meta too) leave nothing unclassified."""
    census = take_census(pool)
    assert [e.space.value for e in census.entries] == spaces
    assert census.unclassified == ()
