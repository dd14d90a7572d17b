"""Properties of a host tier, judged against
:class:`kvcheck.reference.host_pools.ReferenceHostPool`.

``parts`` is what a target's ``make_host_pool`` returns (:mod:`kvcheck.targets.tiers`):
the host pool of the device pool's main rows, then any host pool of its other buffers.

- every host buffer holds exactly the bytes the reference places there for the layout
  (:func:`assert_host_bytes`: a page at the wrong offset, a layer left out, shows here even
  when a load would read it back);
- the data-page accessors give the layout's page (:func:`assert_data_pages`);
- the buffer infos equal the bytes held (:func:`assert_host_buffer_infos`):
  ``get_size_per_token()`` and ``size * get_size_per_token()`` the bytes of its buffers,
  ``get_page_buffer_meta`` exactly the bytes of the pages named,
  ``get_page_buffer_element_size()`` its first region, ``get_contiguous_buf_infos`` (where a
  pool has it) regions that tile its buffer;
- host slots: ``available_size()`` equals the reference (:func:`assert_host_slots`);
- all of these on one backup and load of whole pages, the device bytes judged by the device
  pool's reference, with a bad host call refused (:func:`check_host_round_trip`).

Failures carry the family ``host:<device variant>:<layout>``.

Example:
    >>> import torch
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.tiers import HostPoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> from kvcheck.targets.tiers import build_host_pool
    >>> from kvcheck.reference.host_pools import ReferenceHostPool
    >>> device = PoolSpec(family="mha", size=4, page_size=2, layer_num=2, dtype="float16")
    >>> spec = HostPoolSpec(device=device, layout="page_head", io_backend="kernel", host_pages=2)
    >>> target = resolve_target("kvcheck")
    >>> parts = build_host_pool(target, spec, target.make_pool(device, device="cpu"), device="cpu")
    >>> assert_host_buffer_infos(parts, ReferenceHostPool(spec), spec=spec)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import assert_bytes_equal, failure
from kvcheck.reference.host_pools import ReferenceHostPool, merge_ranges
from kvcheck.tiers import HostPoolSpec

__all__ = [
    "ROUND_TRIP_WRITES",
    "assert_data_pages",
    "assert_host_buffer_infos",
    "assert_host_bytes",
    "assert_host_slots",
    "check_host_round_trip",
    "host_family",
    "raw_bytes",
    "storage_pages_checked",
]


def host_family(spec: HostPoolSpec) -> str:
    """The signature family of ``spec``'s failures.

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> device = PoolSpec(family="dsa", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> host_family(HostPoolSpec(device=device, layout="page_first", io_backend="kernel",
        ...                          host_pages=1))
        'host:dsa:page_first'
    """
    return f"host:{spec.device.variant}:{spec.layout}"


def _signature(check: str, call: str, kind: str, spec: HostPoolSpec) -> FailureSignature:
    return FailureSignature(check=check, call=call, kind=kind, family=host_family(spec))


def raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    """Every byte of ``tensor``, flat, in its logical order."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).cpu().numpy() if flat.numel() else np.zeros(0, np.uint8)


def _pages(reference: ReferenceHostPool, part: int, parts: Sequence[Any]) -> dict[str, int]:
    """Page counts of page-row attributes as the pool holds them (it may hold more)."""
    pages = {}
    for piece in reference.parts[part]:
        if piece.unit == "page":
            held = getattr(parts[part], piece.attribute)
            pages[piece.attribute] = held.nbytes // (len(piece.layers) * piece.row)
    return pages


def assert_host_bytes(
    parts: Sequence[Any], reference: ReferenceHostPool, *, call: str, spec: HostPoolSpec
) -> None:
    """Every host attribute the reference models holds the bytes it places there."""
    __tracebackhide__ = True
    for number in range(len(reference.parts)):
        if number >= len(parts):
            raise failure(
                f"got {len(parts)} host pools but should be {len(reference.parts)} "
                f"(one per kind of mirrored buffer) [{call}]",
                signature=_signature("host_bytes", call, "host pool missing", spec),
            )
        expected = reference.expected_buffers(number, pages=_pages(reference, number, parts))
        for attribute, want in expected.items():
            got = raw_bytes(getattr(parts[number], attribute))
            assert_bytes_equal(
                got,
                want,
                call=call,
                what=f"host {attribute}",
                signature=_signature("host_bytes", call.split("(")[0], "bytes differ", spec),
            )


def assert_data_pages(
    parts: Sequence[Any], reference: ReferenceHostPool, *, call: str, spec: HostPoolSpec
) -> None:
    """``get_data_page(i)`` of every host page is the layout's page, and
    ``get_dummy_flat_data_page()`` is as long (not for an MHA pool with a V head dim of its
    own, which has no flat pages)."""
    __tracebackhide__ = True
    for number, part in enumerate(parts[: len(reference.parts)]):
        if number == 0 and spec.asymmetric:
            continue
        for index in range(0, spec.host_size, spec.page_size):
            got = raw_bytes(part.get_data_page(index, flat=True))
            want = np.frombuffer(reference.expected_data_page(number, index), np.uint8)
            assert_bytes_equal(
                got,
                want,
                call=f"get_data_page({index}) after {call}",
                what="flat data page",
                signature=_signature("data_page", "get_data_page", "bytes differ", spec),
            )
        dummy = part.get_dummy_flat_data_page()
        if raw_bytes(dummy).size != want.size:
            raise failure(
                f"got a dummy page of {raw_bytes(dummy).size} bytes but should be {want.size}"
                " [get_dummy_flat_data_page()]",
                signature=_signature("data_page", "get_dummy_flat_data_page", "size differs", spec),
            )


def assert_host_slots(
    host: Any, reference: ReferenceHostPool, *, call: str, spec: HostPoolSpec
) -> None:
    """The host pool's ``available_size()`` equals the reference."""
    __tracebackhide__ = True
    got, want = int(host.available_size()), reference.available_size()
    if got != want:
        raise failure(
            f"got {got} but should be {want} [host available_size() after {call}]",
            signature=_signature("host_slots", call.split("(")[0], "size differs", spec),
        )


def _attributes(part: Any, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    spans = {}
    for name in names:
        tensor = getattr(part, name)
        spans[name] = (tensor.data_ptr(), tensor.nbytes)
    return spans


def assert_host_buffer_infos(
    parts: Sequence[Any],
    reference: ReferenceHostPool,
    *,
    spec: HostPoolSpec,
    steer: Collection[str] = (),
) -> None:
    """Each host pool's size per token, bytes held, page meta, element size and transfer
    descriptors describe exactly the bytes it holds (``steer``: tags of
    :data:`kvcheck.tiers.HOST_STEER_TAGS` a target's findings ask to avoid)."""
    __tracebackhide__ = True
    for number, part in enumerate(parts[: len(reference.parts)]):
        names = list(dict.fromkeys(piece.attribute for piece in reference.parts[number]))
        per_token = reference.expected_size_per_token(number)
        got = int(part.get_size_per_token())
        if got != per_token:
            raise failure(
                f"got {got} but should be {per_token} [host pool {number}: get_size_per_token()]",
                signature=_signature("buffer_infos", "get_size_per_token", "size differs", spec),
            )
        held = sum(getattr(part, name).nbytes for name in names)
        index_part = spec.kind == "dsa" and number > 0
        if index_part and "host:dsa:indexer_bytes_held" in steer:
            held = spec.host_size * per_token  # steered: the target's finding
        if held != spec.host_size * per_token:
            raise failure(
                f"got {held} bytes held but should be {spec.host_size * per_token} = host size "
                f"{spec.host_size} * get_size_per_token() {per_token} [host pool {number}: "
                f"{', '.join(names)}]",
                signature=_signature(
                    "buffer_infos", "get_size_per_token", "bytes held differ", spec
                ),
            )
        if not (
            index_part
            and spec.layout == "layer_first"
            and "host:dsa:indexer_layer_first_page_meta" in steer
        ) and storage_pages_checked(spec, steer):
            _assert_page_meta(part, reference, number, names, spec)
        steered = (
            "host:latent:contiguous_buf_infos" in steer
            and spec.kind in ("mla", "dsa")
            and spec.layout != "layer_first"
        )
        if callable(getattr(part, "get_contiguous_buf_infos", None)) and not steered:
            _assert_tiling(part, names, spec)


def storage_pages_checked(spec: HostPoolSpec, steer: Collection[str]) -> bool:
    """Whether the flat storage pages (``get_data_page``, ``set_from_flat_data_page``,
    ``get_page_buffer_meta``) of ``spec``'s host tier are checked: not where the target
    declares ``host:<device variant>:storage_pages`` (its host pool has none).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> device = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> spec = HostPoolSpec(device=device, layout="page_first", io_backend="kernel",
        ...                     host_pages=1)
        >>> storage_pages_checked(spec, {"host:mla:storage_pages"})
        False
    """
    return f"host:{spec.device.variant}:storage_pages" not in steer


def _assert_page_meta(
    part: Any, reference: ReferenceHostPool, number: int, names: list[str], spec: HostPoolSpec
) -> None:
    ps = spec.page_size
    spans = _attributes(part, names)
    for start in range(0, spec.host_size, ps):
        call = f"get_page_buffer_meta(host slots {start}..{start + ps - 1})"
        try:
            ptrs, sizes = part.get_page_buffer_meta(
                torch.arange(start, start + ps, dtype=torch.int64)
            )
        except Exception as exc:  # a host pool describes every page it holds
            raise failure(
                f"got {type(exc).__name__}: {exc} but should be the page's regions "
                f"[host pool {number}: {call}]",
                signature=_signature(
                    "buffer_infos", "get_page_buffer_meta", f"raises {type(exc).__name__}", spec
                ),
            ) from exc
        named: dict[str, list[tuple[int, int]]] = {}
        for ptr, size in zip(ptrs, sizes, strict=True):
            owner = next(
                (n for n, (base, length) in spans.items() if base <= ptr < base + length), None
            )
            if owner is None or ptr + size > spans[owner][0] + spans[owner][1]:
                raise failure(
                    f"got a region of {size} bytes at {ptr:#x} outside every host buffer [{call}]",
                    signature=_signature(
                        "buffer_infos", "get_page_buffer_meta", "region outside", spec
                    ),
                )
            base = spans[owner][0]
            named.setdefault(owner, []).append((ptr - base, ptr - base + size))
        got = {name: merge_ranges(ranges) for name, ranges in named.items()}
        want = reference.expected_page_ranges(number, [start])
        if got != want:
            raise failure(
                f"got regions {got} but should be {want} (the bytes of that page) [{call}]",
                signature=_signature(
                    "buffer_infos", "get_page_buffer_meta", "regions differ", spec
                ),
            )
        if start == 0:
            element = part.get_page_buffer_element_size()
            if element != sizes[0]:
                raise failure(
                    f"got {element} but should be {sizes[0]} [get_page_buffer_element_size()]",
                    signature=_signature(
                        "buffer_infos", "get_page_buffer_element_size", "size differs", spec
                    ),
                )


def _assert_tiling(part: Any, names: list[str], spec: HostPoolSpec) -> None:
    ptrs, lens, items = part.get_contiguous_buf_infos()
    spans = _attributes(part, names)
    covered = merge_ranges([(ptr, ptr + length) for ptr, length in zip(ptrs, lens, strict=True)])
    want = merge_ranges([(base, base + length) for base, length in spans.values()])
    overlap = sum(lens) != sum(end - start for start, end in covered)
    misfit = any(item <= 0 or length % item for length, item in zip(lens, items, strict=True))
    if covered != want or overlap or misfit:
        described = [(hex(p), n, i) for p, n, i in zip(ptrs, lens, items, strict=True)]
        raise failure(
            f"got regions {described} but should tile the host buffers "
            f"{[(hex(b), n) for b, n in spans.values()]} exactly, each a whole number of items "
            "[get_contiguous_buf_infos()]",
            signature=_signature(
                "buffer_infos", "get_contiguous_buf_infos", "regions differ", spec
            ),
        )


# --- one round trip, end to end --------------------------------------------------------------

#: Write kinds a round trip puts in the device pool first (those the variant and target take).
ROUND_TRIP_WRITES: tuple[str, ...] = ("write_kv", "write_mla", "write_index_k", "cast_write_kv")


def check_host_round_trip(
    target: Any,
    spec: HostPoolSpec,
    data: Any,
    *,
    device: str,
    write_kinds: Sequence[str],
    validates: bool,
    steer: Collection[str] = (),
) -> None:
    """Fill ``target``'s device pool of ``spec`` with writes of ``write_kinds``, back whole
    pages up to its host tier, load them into other pages, every layer; check every property
    of this module on the way (and, with ``validates``, that one bad host call drawn by
    ``data``, a :class:`hypothesis.strategies.DataObject`, is refused and changes nothing).

    The reference of the device pool judges the load (a host copy of the pages backed up,
    reloaded into the pages loaded into): every device byte, the other slots included.
    """
    from hypothesis import strategies as st

    from kvcheck.properties.ops import apply_op_like_reference
    from kvcheck.properties.pool_state import assert_pool_matches_reference
    from kvcheck.reference import ReferencePool
    from kvcheck.specs import HostCopy, HostReload, WriteMLA
    from kvcheck.strategies import op_sequences
    from kvcheck.targets.tiers import build_host_pool

    steer = {*steer, *(getattr(target, "host_storage_steer", None) or ())}
    pool = target.make_pool(spec.device, device=device)
    reference = ReferencePool(spec.device)
    kinds = tuple(kind for kind in write_kinds if kind in ROUND_TRIP_WRITES)
    if kinds:
        writes = data.draw(op_sequences(spec.device, max_ops=3, kinds=kinds), label="writes")
        for op in writes.ops:
            if "write_mla:slot0" in steer and isinstance(op, WriteMLA) and 0 in op.locs:
                continue  # steered: the target's finding on MLA writes to the padding slot
            apply_op_like_reference(target, pool, reference, op, device=device, copies={})
    parts = build_host_pool(target, spec, pool, device=device)
    host_reference = ReferenceHostPool(spec)
    assert_host_buffer_infos(parts, host_reference, spec=spec, steer=steer)
    ps = spec.page_size
    device_pages = spec.device.size // ps
    if not device_pages:
        return
    count = data.draw(st.integers(1, min(spec.host_pages, device_pages)), label="pages")

    def pages(label: str) -> list[int]:
        chosen = data.draw(
            st.lists(st.integers(1, device_pages), unique=True, min_size=count, max_size=count),
            label=label,
        )
        return [page * ps + offset for page in chosen for offset in range(ps)]

    source = pages("device pages backed up")
    host = parts[0].alloc(count * ps)
    if host is None:
        raise failure(
            f"got None but should be {count * ps} host slots [alloc({count * ps})]",
            signature=_signature("host_slots", "alloc", "refused", spec),
        )
    problems = host_reference.alloc(count * ps, [int(x) for x in host.tolist()])
    if problems:
        raise failure(
            "\n".join(problems),
            signature=_signature("host_slots", "alloc", "slot handed out twice", spec),
        )
    assert_host_slots(parts[0], host_reference, call=f"alloc({count * ps})", spec=spec)
    for part in parts:
        part.backup_from_device_all_layer(pool, host, torch.tensor(source), spec.io_backend)
    reference.apply(HostCopy(name="pages", indices=tuple(source)))
    host_reference.backup(reference, host.tolist(), source)
    call = f"backup_from_device_all_layer(host_indices={host.tolist()}, device_indices={source})"
    assert_host_bytes(parts, host_reference, call=call, spec=spec)
    if storage_pages_checked(spec, steer):
        assert_data_pages(parts, host_reference, call=call, spec=spec)
    loaded = pages("device pages loaded into")
    for layer in range(spec.device.layer_num):
        for part in parts:
            part.load_to_device_per_layer(pool, host, torch.tensor(loaded), layer, spec.io_backend)
    reference.apply(HostReload(name="pages", indices=tuple(loaded)))
    assert_pool_matches_reference(
        pool,
        reference,
        call=f"load_to_device_per_layer(host_indices={host.tolist()}, device_indices={loaded},"
        " every layer)",
        method="load_to_device_per_layer",
    )
    if validates:
        bad = _bad_host_calls(parts, pool, spec)
        what = data.draw(st.sampled_from(sorted(bad)), label="bad host call")
        _assert_refused(parts, bad[what], what, spec)
    if spec.asymmetric or count < 2 or not storage_pages_checked(spec, steer):
        return
    first, second = int(host[0]), int(host[ps])
    for number, part in enumerate(parts[: len(host_reference.parts)]):
        page = part.get_data_page(second, flat=True).clone()
        part.set_from_flat_data_page(first, page)
        host_reference.set_data_page(number, first, raw_bytes(page).tobytes())
    assert_host_bytes(
        parts, host_reference, call=f"set_from_flat_data_page({first}, page {second})", spec=spec
    )


def _bad_host_calls(parts: Sequence[Any], pool: Any, spec: HostPoolSpec) -> dict[str, Any]:
    """Bad calls on a host tier holding at least one page, by what is wrong with each."""
    ps = spec.page_size
    free = _free_slots(parts[0], spec)
    held = torch.tensor(sorted(set(range(spec.host_size)) - set(free))[:ps], dtype=torch.int64)
    bad = {
        "free of a slot listed twice": lambda: parts[0].free(torch.cat([held[:1], held[:1]])),
        "free of a slot out of range": lambda: parts[0].free(torch.tensor([spec.host_size])),
        "free of a negative slot": lambda: parts[0].free(torch.tensor([-1])),
        "alloc of a negative size": lambda: parts[0].alloc(-ps),
        "backup of mismatched index lists": lambda: parts[0].backup_from_device_all_layer(
            pool, held, torch.arange(ps, 2 * ps)[:-1], spec.io_backend
        ),
    }
    if free:
        bad["free of a slot not held"] = lambda: parts[0].free(torch.tensor(free[:1]))
    if ps > 1:
        bad["alloc of part of a page"] = lambda: parts[0].alloc(ps - 1)
    return bad


def _free_slots(host: Any, spec: HostPoolSpec) -> list[int]:
    """The host slots not held (an alloc of all of them, given back)."""
    slots = host.alloc(host.available_size() // spec.page_size * spec.page_size)
    if slots is None or not len(slots):
        return []
    host.free(slots)
    return sorted(int(x) for x in slots.tolist())


def _host_buffers(part: Any) -> dict[str, np.ndarray]:
    return {
        name: raw_bytes(value).copy()
        for name, value in vars(part).items()
        if isinstance(value, torch.Tensor) and name.endswith("buffer")
    }


def _assert_refused(parts: Sequence[Any], call: Any, what: str, spec: HostPoolSpec) -> None:
    """``call()`` raises ``ValueError`` and changes no host byte and no free-slot count."""
    __tracebackhide__ = True
    before = [_host_buffers(part) for part in parts]
    available = int(parts[0].available_size())
    try:
        call()
    except ValueError:
        pass
    except Exception as exc:  # any other exception is the wrong refusal
        raise failure(
            f"got {type(exc).__name__}: {exc} but should be ValueError [{what}]",
            signature=_signature(
                "raises", what, f"{type(exc).__name__} instead of ValueError", spec
            ),
        ) from exc
    else:
        raise failure(
            f"got no exception but should be ValueError [{what}]",
            signature=_signature("raises", what, "no exception instead of ValueError", spec),
        )
    after = [_host_buffers(part) for part in parts]
    unchanged = all(
        np.array_equal(old[name], new[name])
        for old, new in zip(before, after, strict=True)
        for name in old
    )
    if not unchanged or int(parts[0].available_size()) != available:
        raise failure(
            f"got a changed host pool after a refused call but should be unchanged [{what}]",
            signature=_signature("raises", what, "refusal changed the host pool", spec),
        )
