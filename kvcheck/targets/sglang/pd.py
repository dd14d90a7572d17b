"""What sglang's PD disaggregation registers for a pool with its transfer engine.

A prefill or decode worker describes its KV memory once, at start: the KV buffers
(``get_kv_transfer_buf_infos``) and one state component per kind of extra state
(``setup_state_kv_args``: DSA index keys and tails, SWA window KV, mamba state, MXFP8
block scales, ...). Only what is registered is ever sent to the decode side, so a pool
tensor that no component covers arrives as whatever the decode side held before. This
module calls sglang's own two functions on a pool built by the target and returns their
answer as named components; :func:`kvcheck.properties.census.assert_registration_covers_census`
judges it against the pool's census.

The ``KVArgs`` it fills is sglang's own class, built empty (the fields sglang's
function sets are its answer; the transfer engine's other fields are not read).

Example, where sglang is installed::

    components = pd_registration(pool)   # {"kv": (ptrs, lens, items), "state:DSA": ...}
"""

from __future__ import annotations

from typing import Any

from kvcheck.targets.sglang import env

__all__ = ["pd_registration"]


def pd_registration(pool: Any) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """The KV component (``"kv"``) and each state component (``"state:<StateType>"``, a
    second of one type numbered) that sglang's PD registers for ``pool``."""
    with env.torchvision_stand_in():
        from sglang.srt.disaggregation.base.conn import KVArgs
        from sglang.srt.disaggregation.utils import (
            get_kv_transfer_buf_infos,
            setup_state_kv_args,
        )

    kv_ptrs, kv_lens, kv_items = get_kv_transfer_buf_infos(pool)
    components: dict[str, tuple[list[int], list[int], list[int]]] = {
        "kv": (list(kv_ptrs), list(kv_lens), list(kv_items))
    }
    kv_args = KVArgs()
    with env.torchvision_stand_in():
        setup_state_kv_args(kv_args, pool)
    for state_type, ptrs, lens, items in zip(
        kv_args.state_types,
        kv_args.state_data_ptrs,
        kv_args.state_data_lens,
        kv_args.state_item_lens,
        strict=True,
    ):
        base = f"state:{getattr(state_type, 'name', state_type)}"
        name, number = base, 2
        while name in components:
            name, number = f"{base}#{number}", number + 1
        components[name] = (list(ptrs), list(lens), list(items))
    return components
