"""The scheduler driver's per-release spelling (`kvcheck.targets.sglang.scheduler_api`) is
read off what a release defines, not its version (no sglang needed: the releases are
stood in for by namespaces that define what each spells)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.targets.sglang.scheduler_api import (
    LastNodePins,
    LockReceipts,
    missing_for_every_api,
    scheduler_api,
)


def _release_with_checkpoint(req: Any, tree_cache: Any, *, checkpoint: bool) -> None:
    """Stands in for 0.5.22's release_kv_cache (only its signature is read)."""


def _release_with_is_insert(req: Any, tree_cache: Any, is_insert: bool = True) -> None:
    """Stands in for 0.5.21's release_kv_cache (only its signature is read)."""


def _release(*, radix: tuple[str, ...], common: tuple[str, ...], release: Any) -> Any:
    module = SimpleNamespace(release_kv_cache=release, **{name: object() for name in common})
    return SimpleNamespace(RadixCache=type("RadixCache", (), dict.fromkeys(radix)), common=module)


RECEIPTS = _release(
    radix=("lock", "unlock"), common=("checkpoint_kv_cache",), release=_release_with_checkpoint
)
PINS = _release(
    radix=("inc_lock_ref", "dec_lock_ref", "unpin", "cache_unfinished_req"),
    common=("maybe_cache_unfinished_req",),
    release=_release_with_is_insert,
)


@pytest.mark.parametrize(
    ("release", "spelling"),
    [(RECEIPTS, LockReceipts), (PINS, LastNodePins)],
    ids=["lock-receipts", "last-node-pins"],
)
def test_the_spelling_is_read_off_the_release(release: Any, spelling: type) -> None:
    """A release defining lock/unlock and checkpoint_kv_cache gets the receipt spelling;
    one defining inc_lock_ref/unpin and maybe_cache_unfinished_req the pin spelling."""
    api = scheduler_api(release)
    assert type(api) is spelling


def test_a_release_fitting_no_spelling_is_named_with_what_it_lacks() -> None:
    """A release with the receipt names but release_kv_cache(is_insert=) fits neither, and
    the reason names what each spelling misses."""
    mixed = _release(
        radix=("lock", "unlock"), common=("checkpoint_kv_cache",), release=_release_with_is_insert
    )
    assert scheduler_api(mixed) is None
    reason = missing_for_every_api(mixed)
    assert "release_kv_cache(checkpoint=)" in reason
    assert "RadixCache.inc_lock_ref" in reason
