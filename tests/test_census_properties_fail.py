"""Every census property fails on a pool that hides one tensor from its operation, names
the tensor and the call, and Hypothesis shrinks the drawn pages to one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from broken_census import (
    AccountingHidesV,
    ClearKeepsFreeList,
    DescriptionHidesLastV,
    GroupedStatePool,
    HiddenSideBuffer,
    HostCopyHidesLastV,
    MoveHidesLastK,
    ReloadForgetsCompressedKeys,
    ReloadForgetsTheRing,
    RowPool,
)
from hypothesis import find, settings
from hypothesis import strategies as st

from kvcheck.census import IndexSpace, take_census
from kvcheck.failures import PropertyFailure
from kvcheck.pools import MHATokenToKVPool
from kvcheck.properties.census import (
    assert_accounting_covers_census,
    assert_clear_resets_census,
    assert_descriptions_cover_census,
    assert_hicache_assembly_whole,
    assert_host_copy_restores_census,
    assert_move_carries_census,
    assert_registration_covers_census,
)

_PAGES = st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True)


def _pool(cls: type = MHATokenToKVPool) -> Any:
    return cls(
        size=6, page_size=2, dtype=torch.bfloat16, head_num=1, head_dim=4, layer_num=2, device="cpu"
    )


def _fails(check: Any) -> bool:
    try:
        check()
    except PropertyFailure:
        return True
    return False


def test_the_plain_pool_passes_every_census_property() -> None:
    """kvcheck's MHA pool holds every census property (the twins below differ by one bug)."""
    pool = _pool()
    assert assert_accounting_covers_census(pool) == 2 * 2 * 8 * 4 * 2
    assert assert_host_copy_restores_census(pool, (1, 3)) == 4
    assert assert_move_carries_census(pool, tgt_pages=(1,), src_pages=(2,)) == 4
    assert assert_descriptions_cover_census(pool) == ("get_contiguous_buf_infos",)


def test_accounting_fails_when_v_is_unreported() -> None:
    """Accounting names the call and the byte counts."""
    with pytest.raises(PropertyFailure, match=r"reports 128 bytes but the census finds 256"):
        assert_accounting_covers_census(_pool(AccountingHidesV))


def test_accounting_exemption_carries_its_reason() -> None:
    """A declared exception leaves the tensors out and is quoted in a failure."""
    pool = _pool(HiddenSideBuffer)
    assert assert_accounting_covers_census(pool, exempt={"side_buffer*": "scratch"}) == 256
    with pytest.raises(PropertyFailure, match=r"v_buffer\* left out: why") as info:
        assert_accounting_covers_census(pool, exempt={"v_buffer*": "why"})
    assert info.value.signature.check == "accounting"


def test_host_copy_fails_on_the_hidden_v_and_shrinks_to_one_page() -> None:
    """The failure names v_buffer[1] and load_cpu_copy; the smallest failing draw is one page."""
    pool = _pool(HostCopyHidesLastV)
    with pytest.raises(
        PropertyFailure, match=r"v_buffer\[1\] differs at slot \d+ after load_cpu_copy"
    ):
        assert_host_copy_restores_census(pool, (2,))
    smallest = find(
        _PAGES,
        lambda p: _fails(lambda: assert_host_copy_restores_census(pool, p)),
        settings=settings(database=None),
    )
    assert smallest == [1]


def test_move_fails_on_the_hidden_k_and_shrinks_to_one_page() -> None:
    """The failure names k_buffer[1] and move_kv_cache; one page moved is the smallest case."""
    pool = _pool(MoveHidesLastK)
    with pytest.raises(
        PropertyFailure, match=r"k_buffer\[1\] differs at slot 2 after move_kv_cache"
    ) as info:
        assert_move_carries_census(pool, tgt_pages=(1,), src_pages=(3,))
    assert info.value.signature.call == "move_kv_cache"
    smallest = find(
        _PAGES,
        lambda p: _fails(
            lambda: assert_move_carries_census(pool, tgt_pages=p, src_pages=[3] * len(p))
        ),
        settings=settings(database=None),
    )
    assert smallest == [1]


def test_descriptions_fail_on_the_hidden_v() -> None:
    """A state tensor no description covers is named, with the methods read."""
    with pytest.raises(PropertyFailure, match=r"v_buffer\[1\]: 0 of its 64 bytes are described"):
        assert_descriptions_cover_census(_pool(DescriptionHidesLastV))


def test_every_property_names_a_side_buffer_no_operation_knows() -> None:
    """One tensor hidden from every operation fails each of the four, each naming it."""
    pool = _pool(HiddenSideBuffer)
    checks = [
        lambda: assert_accounting_covers_census(pool),
        lambda: assert_host_copy_restores_census(pool, (1,)),
        lambda: assert_move_carries_census(pool, tgt_pages=(1,), src_pages=(2,)),
        lambda: assert_descriptions_cover_census(pool),
    ]
    messages = []
    for check in checks:
        with pytest.raises(PropertyFailure) as info:
            check()
        messages.append(str(info.value))
    assert all("side_buffer" in m or "census finds 384" in m for m in messages)


def test_reset_passes_on_a_row_pool_and_fails_when_clear_forgets_the_free_list() -> None:
    """clear() must bring back the free-list tensor, not only the count."""
    assert assert_clear_resets_census(RowPool(8)) == 1
    with pytest.raises(PropertyFailure, match=r"free_slots differs at row \d+ after clear"):
        assert_clear_resets_census(ClearKeepsFreeList(8))


def test_pd_registration_fails_when_a_state_component_is_left_out() -> None:
    """A DSA pool registered with its KV description alone leaves its index keys out (named,
    with the call); the built-in target's registration, which adds them, passes."""
    from kvcheck.pools import DSATokenToKVPool
    from kvcheck.targets.builtin import KVCheckTarget

    pool = DSATokenToKVPool(
        size=64, page_size=64, dtype=torch.bfloat16, kv_lora_rank=4, qk_rope_head_dim=2,
        layer_num=1, device="cpu", index_head_dim=128,
    )  # fmt: skip
    whole = KVCheckTarget().pd_registration(pool)
    assert "kv" in assert_registration_covers_census(whole, pool=pool)
    with pytest.raises(PropertyFailure, match=r"index_k.*described by kv \[setup_state_kv_args\]"):
        assert_registration_covers_census({"kv": whole["kv"]}, pool=pool)


def test_pd_registration_fails_when_two_components_describe_one_range() -> None:
    """The same bytes registered twice (KV and again as a state component) are named."""
    pool = _pool()
    kv = pool.get_contiguous_buf_infos()
    with pytest.raises(PropertyFailure, match=r"both describe bytes"):
        assert_registration_covers_census({"kv": kv, "state:again": kv}, pool=pool)


def _compress_pool(cls: Any) -> Any:
    return cls(
        size=8, page_size=2, dtype=torch.bfloat16, kv_lora_rank=4, qk_rope_head_dim=2,
        layer_num=1, device="cpu", index_head_dim=128, index_kpool=2,
        index_kpool_compress=True, max_running_requests=2,
    )  # fmt: skip


def test_request_copies_restore_the_row_and_fail_when_load_forgets_it() -> None:
    """A request copy restores that request's tail row: kvcheck's DSA pool does, a twin
    whose reload drops the request does not, and the row is named."""
    from kvcheck.pools import DSATokenToKVPool

    class ReloadForgetsTheRequest(DSATokenToKVPool):  # type: ignore[misc]
        def load_cpu_copy(
            self, kv_cache_cpu: Any, indices: Any, req_pool_index: Any = None
        ) -> None:
            super().load_cpu_copy(kv_cache_cpu, indices)

    assert assert_host_copy_restores_census(
        _compress_pool(DSATokenToKVPool), (1,), req_pool_index=1
    )
    with pytest.raises(PropertyFailure, match=r"_compress_tail.* differs at row 1"):
        assert_host_copy_restores_census(
            _compress_pool(ReloadForgetsTheRequest), (1,), req_pool_index=1
        )


def test_host_copies_fail_when_the_copy_is_a_view_of_the_pool() -> None:
    """A copy that shares the pool's memory (a CPU ``.to("cpu")``) is named at once."""

    class CopyIsAView(MHATokenToKVPool):  # type: ignore[misc]
        def get_cpu_copy(self, indices: Any) -> Any:
            copy = super().get_cpu_copy(indices)
            parts = dict(copy.parts)
            first = next(iter(parts))
            parts[first] = (self.k_buffer[0], *parts[first][1:])
            return dataclasses.replace(copy, parts=parts)

    with pytest.raises(PropertyFailure, match=r"shares memory with k_buffer\[0\]"):
        assert_host_copy_restores_census(_pool(CopyIsAView), (1,))


def test_grouped_state_is_restored_by_group_and_named_when_a_reload_forgets_it() -> None:
    """Compressed keys (a row per two slots) and a pending ring (two rows per request) are
    classified as grouped slots and rows; a request copy of page 1 restores compressed rows
    2-3 and ring rows 2-3, and a twin that forgets either is named at the first of them."""
    census = take_census(GroupedStatePool())
    assert [(e.path, e.space, e.group) for e in census.entries] == [
        ("kv", IndexSpace.SLOT, 1),
        ("compressed_k", IndexSpace.SLOT, 2),
        ("ring", IndexSpace.ROW, 2),
    ]
    assert assert_host_copy_restores_census(GroupedStatePool(), (1,), req_pool_index=1) == 3
    with pytest.raises(PropertyFailure, match=r"compressed_k differs at slot 2"):
        assert_host_copy_restores_census(ReloadForgetsCompressedKeys(), (1,), req_pool_index=1)
    with pytest.raises(PropertyFailure, match=r"ring differs at row 2"):
        assert_host_copy_restores_census(ReloadForgetsTheRing(), (1,), req_pool_index=1)


def _assembly_raising(pool: Any) -> list[str]:
    raise AttributeError("'MLABufferInfo' object has no attribute 'head_dim'")


@pytest.mark.parametrize(
    ("assemble", "check", "kind"),
    [
        (
            lambda pool: ["full_kv_pool (DSATokenToKVPool): indexer"],
            "descriptions",
            "host pool unassembled",
        ),
        (_assembly_raising, "raises", "raises AttributeError"),
    ],
    ids=["a-side-left-out", "the-assembly-raises"],
)
def test_the_hicache_assembly_fails_when_it_leaves_a_pool_out_or_raises(
    assemble: Any, check: str, kind: str
) -> None:
    """A host pool group that leaves a declared pool out, or an assembly that raises, fails
    with the call and what went wrong; a whole group passes."""
    with pytest.raises(PropertyFailure) as failed:
        assert_hicache_assembly_whole(assemble, object(), family="swa:dsa")
    signature = failed.value.signature
    assert (signature.check, signature.call, signature.kind) == (check, "hicache_assembly", kind)
    assert "[hicache_assembly]" in str(failed.value)
    assert_hicache_assembly_whole(lambda pool: [], object(), family="swa:dsa")
