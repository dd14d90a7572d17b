"""Properties of a host tier, judged against
:class:`kvcheck.reference.host_pools.ReferenceHostPool`.

``parts`` is what a target's ``make_host_pool`` returns (:mod:`kvcheck.targets.tier_support`):
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

Failures carry the family ``host:<device variant>:<layout>``. The round trip and the
storage checks make their calls on host pools a :class:`~kvcheck.tier_log.TierLog` records:
a failure lists them as Python, and one of a check of the host pools' own answers (slots,
sizes, refusals; not bytes or addresses) carries a reproduction for a standalone script.

Example:
    >>> import torch
    >>> from kvcheck.specs import PoolSpec
    >>> from kvcheck.tiers import HostPoolSpec
    >>> from kvcheck.targets import resolve_target
    >>> from kvcheck.targets.tier_support import build_host_pool
    >>> from kvcheck.reference.host_pools import ReferenceHostPool
    >>> device = PoolSpec(family="mha", size=4, page_size=2, layer_num=2, dtype="float16")
    >>> spec = HostPoolSpec(device=device, layout="page_head", io_backend="kernel", host_pages=2)
    >>> target = resolve_target("kvcheck")
    >>> parts = build_host_pool(target, spec, target.make_pool(device, device="cpu"), device="cpu")
    >>> assert_host_buffer_infos(parts, ReferenceHostPool(spec), spec=spec)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import assert_bytes_equal, failure
from kvcheck.reference.host_pools import ReferenceHostPool, merge_ranges
from kvcheck.steering import Steer, Steering
from kvcheck.tier_log import TierLog, checking, expect, expecting, recorded
from kvcheck.tiers import HOST_IO_BACKENDS, HostPoolSpec

__all__ = [
    "IO_BACKENDS_TRIED",
    "ROUND_TRIP_WRITES",
    "STRIDE_ALIGNMENTS",
    "assert_data_pages",
    "assert_host_buffer_infos",
    "assert_host_bytes",
    "assert_host_slots",
    "assert_key_sizes",
    "assert_split_heads_page_meta",
    "assert_stride_alignment",
    "check_foreign_io_backends_refused",
    "check_host_destroy",
    "check_host_layouts_refused",
    "check_host_round_trip",
    "check_host_slot_reuse",
    "check_host_storage_and_teardown",
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
    with checking(host):
        got, want = int(host.available_size()), reference.available_size()
    expect(host, "available_size", equals=want)
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
    steer: Iterable[Steer] = (),
) -> None:
    """Each host pool's size per token, bytes held, page meta, element size and transfer
    descriptors describe exactly the bytes it holds (``steer``: what a target's findings ask
    to avoid, :class:`kvcheck.steering.Steer` values of the ``host:`` kinds)."""
    __tracebackhide__ = True
    steering = Steering(steer)
    for number, part in enumerate(parts[: len(reference.parts)]):
        names = list(dict.fromkeys(piece.attribute for piece in reference.parts[number]))
        per_token = reference.expected_size_per_token(number)
        with checking(part):
            got = int(part.get_size_per_token())
        expect(part, "get_size_per_token", equals=per_token)
        if got != per_token:
            raise failure(
                f"got {got} but should be {per_token} [host pool {number}: get_size_per_token()]",
                signature=_signature("buffer_infos", "get_size_per_token", "size differs", spec),
            )
        held = sum(getattr(part, name).nbytes for name in names)
        index_part = spec.kind == "dsa" and number > 0
        if index_part and steering.avoids("host:indexer_bytes_held", family=spec.kind):
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
            and steering.avoids("host:indexer_layer_first_page_meta", family=spec.kind)
        ) and storage_pages_checked(spec, steering):
            _assert_page_meta(part, reference, number, names, spec)
        steered = (
            spec.kind in ("mla", "dsa")
            and spec.layout != "layer_first"
            and steering.avoids("host:contiguous_buf_infos", where="latent")
        )
        if callable(getattr(part, "get_contiguous_buf_infos", None)) and not steered:
            _assert_tiling(part, names, spec)


def storage_pages_checked(spec: HostPoolSpec, steer: Iterable[Steer]) -> bool:
    """Whether the flat storage pages (``get_data_page``, ``set_from_flat_data_page``,
    ``get_page_buffer_meta``) of ``spec``'s host tier are checked: not where the target
    steers its device variant off them (``Steer("host:storage_pages", variant)``: its host
    pool has none).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> device = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
        >>> spec = HostPoolSpec(device=device, layout="page_first", io_backend="kernel",
        ...                     host_pages=1)
        >>> storage_pages_checked(spec, {Steer("host:storage_pages", "mla")})
        False
    """
    return not Steering(steer).avoids("host:storage_pages", variant=spec.device.variant)


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
    steer: Iterable[Steer] = (),
) -> None:
    """Fill ``target``'s device pool of ``spec`` with writes of ``write_kinds``, back whole
    pages up to its host tier, load them into other pages, every layer; check every property
    of this module on the way (and, with ``validates``, that one bad host call drawn by
    ``data``, a :class:`hypothesis.strategies.DataObject`, is refused and changes nothing).

    The reference of the device pool judges the load (a host copy of the pages backed up,
    reloaded into the pages loaded into): every device byte, the other slots included.
    A failure lists the calls made on the host pools (:class:`~kvcheck.tier_log.TierLog`).
    """
    log = TierLog("host_pool", spec, device=device)
    with log.attached_to_failures():
        _round_trip(
            log,
            target,
            spec,
            data,
            device=device,
            write_kinds=write_kinds,
            validates=validates,
            steer=steer,
        )


def _recorded_parts(log: TierLog, parts: Sequence[Any], pool: Any) -> tuple[Any, ...]:
    """``parts`` behind ``log``'s recorder, as ``host``, ``host_1``, ...; the device pool
    their calls take is ``device_pool``."""
    log.name(pool, "device_pool")
    names = ["host", *(f"host_{number}" for number in range(1, len(parts)))]
    return tuple(log.wrap(part, name) for name, part in zip(names, parts, strict=True))


def _expect_host_alloc(host: Any, reference: ReferenceHostPool, count: int) -> None:
    """The latest ``alloc(count)`` should have answered ``count`` of the reference's free
    slots, each once (said before the reference records the answer)."""
    rule = {
        "count": count,
        "free_pages": sorted(reference.free_slots),
        "page_size": 1,
        "plan": ["page"] * count,
    }
    expect(host, "alloc", refused=False, slots=rule)


def _round_trip(
    log: TierLog,
    target: Any,
    spec: HostPoolSpec,
    data: Any,
    *,
    device: str,
    write_kinds: Sequence[str],
    validates: bool,
    steer: Iterable[Steer],
) -> None:
    from hypothesis import strategies as st

    from kvcheck.properties.apply import apply_op_like_reference
    from kvcheck.properties.pool_state import assert_pool_matches_reference
    from kvcheck.reference import ReferencePool
    from kvcheck.specs import HostCopy, HostReload, WriteMLA
    from kvcheck.strategies import op_sequences
    from kvcheck.targets.tier_support import build_host_pool

    steering = Steering(steer) | (getattr(target, "host_storage_steer", None) or ())
    pool = target.make_pool(spec.device, device=device)
    reference = ReferencePool(spec.device)
    kinds = tuple(kind for kind in write_kinds if kind in ROUND_TRIP_WRITES)
    if kinds:
        writes = data.draw(op_sequences(spec.device, max_ops=3, kinds=kinds), label="writes")
        for op in writes.ops:
            if isinstance(op, WriteMLA) and 0 in op.locs and steering.avoids("write_mla:slot0"):
                continue  # steered: the target's finding on MLA writes to the padding slot
            apply_op_like_reference(target, pool, reference, op, device=device, copies={})
    parts = _recorded_parts(log, build_host_pool(target, spec, pool, device=device), pool)
    host_reference = ReferenceHostPool(spec)
    with checking(parts[0]):
        assert_host_buffer_infos(parts, host_reference, spec=spec, steer=steering)
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
    _expect_host_alloc(parts[0], host_reference, count * ps)
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
    with checking(parts[0]):
        assert_host_bytes(parts, host_reference, call=call, spec=spec)
        if storage_pages_checked(spec, steering):
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
    if spec.asymmetric or count < 2 or not storage_pages_checked(spec, steering):
        return
    first, second = int(host[0]), int(host[ps])
    for number, part in enumerate(parts[: len(host_reference.parts)]):
        page = part.get_data_page(second, flat=True).clone()
        part.set_from_flat_data_page(first, page)
        host_reference.set_data_page(number, first, raw_bytes(page).tobytes())
    with checking(parts[0]):
        assert_host_bytes(
            parts,
            host_reference,
            call=f"set_from_flat_data_page({first}, page {second})",
            spec=spec,
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
    foreign = next((io for io in ("kernel", "direct") if io != spec.io_backend), "nvme")
    if foreign in HOST_IO_BACKENDS[spec.layout]:
        foreign = "nvme"  # layer_first takes both: a backend no layout takes
    device_ids = torch.arange(ps, 2 * ps)
    bad[f"backup with io_backend={foreign!r}"] = lambda: parts[0].backup_from_device_all_layer(
        pool, held, device_ids, foreign
    )
    bad[f"load with io_backend={foreign!r}"] = lambda: parts[-1].load_to_device_per_layer(
        pool, held, device_ids, 0, foreign
    )
    if free:
        bad["free of a slot not held"] = lambda: parts[0].free(torch.tensor(free[:1]))
    if ps > 1:
        bad["alloc of part of a page"] = lambda: parts[0].alloc(ps - 1)
    return bad


def _free_slots(host: Any, spec: HostPoolSpec) -> list[int]:
    """The host slots not held (an alloc of all of them, given back)."""
    with checking(host):
        slots = host.alloc(host.available_size() // spec.page_size * spec.page_size)
        if slots is None or not len(slots):
            return []
        host.free(slots)
    return sorted(int(x) for x in slots.tolist())


def _host_buffers(part: Any) -> dict[str, np.ndarray]:
    return {
        name: raw_bytes(value).copy()
        for name, value in vars(recorded(part)).items()
        if isinstance(value, torch.Tensor) and name.endswith("buffer")
    }


def _assert_refused(parts: Sequence[Any], call: Any, what: str, spec: HostPoolSpec) -> None:
    """``call()`` raises ``ValueError`` and changes no host byte and no free-slot count."""
    __tracebackhide__ = True
    before = [_host_buffers(part) for part in parts]
    with checking(parts[0]):
        available = int(parts[0].available_size())
    try:
        with expecting(parts[0], raises="ValueError"):
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
    with checking(parts[0]):
        available_after = int(parts[0].available_size())
    expect(parts[0], "available_size", equals=available)
    if not unchanged or available_after != available:
        raise failure(
            f"got a changed host pool after a refused call but should be unchanged [{what}]",
            signature=_signature("raises", what, "refusal changed the host pool", spec),
        )


# --- what a zero-copy storage backend is told, slot reuse and teardown ------------------------

#: ``is_stride_page_aligned`` is asked of these alignments (and of each buffer's page step).
STRIDE_ALIGNMENTS: tuple[int, ...] = (1, 2, 64, 4096)


def _owner(spans: dict[str, tuple[int, int]], ptr: int, size: int) -> str | None:
    for name, (base, length) in spans.items():
        if base <= ptr and ptr + size <= base + length:
            return name
    return None


def assert_key_sizes(
    parts: Sequence[Any], reference: ReferenceHostPool, *, spec: HostPoolSpec
) -> None:
    """Each host pool's ``get_ksize_per_token()`` is its key side's bytes per host slot (MHA:
    K; any other pool: everything), and ``get_hybrid_pool_buffer()`` (where a pool has it)
    names exactly the bytes it holds."""
    __tracebackhide__ = True
    for number, part in enumerate(parts[: len(reference.parts)]):
        with checking(part):
            got = int(part.get_ksize_per_token())
        want = reference.expected_ksize_per_token(number)
        expect(part, "get_ksize_per_token", equals=want)
        if got != want:
            raise failure(
                f"got {got} but should be {want} [host pool {number}: get_ksize_per_token()]",
                signature=_signature("buffer_infos", "get_ksize_per_token", "size differs", spec),
            )
        if not callable(getattr(part, "get_hybrid_pool_buffer", None)):
            continue
        names = list(dict.fromkeys(piece.attribute for piece in reference.parts[number]))
        named = [(t.data_ptr(), t.data_ptr() + t.nbytes) for t in part.get_hybrid_pool_buffer()]
        held = [(b, b + n) for b, n in _attributes(part, names).values()]
        if merge_ranges(named) != merge_ranges(held) or sum(e - s for s, e in named) != sum(
            e - s for s, e in held
        ):
            raise failure(
                f"got tensors spanning {merge_ranges(named)} but should span the host buffers "
                f"{merge_ranges(held)} once [host pool {number}: get_hybrid_pool_buffer()]",
                signature=_signature(
                    "buffer_infos", "get_hybrid_pool_buffer", "regions differ", spec
                ),
            )


def assert_stride_alignment(
    parts: Sequence[Any], reference: ReferenceHostPool, *, spec: HostPoolSpec
) -> None:
    """``is_stride_page_aligned(n)``, for each ``n`` of :data:`STRIDE_ALIGNMENTS` and each
    host pool's first page region, says whether a page-major layout's buffers start and step
    page to page on multiples of ``n`` (``layer_first``: never)."""
    __tracebackhide__ = True
    for number, part in enumerate(parts[: len(reference.parts)]):
        names = list(dict.fromkeys(piece.attribute for piece in reference.parts[number]))
        addresses = {name: base for name, (base, _) in _attributes(part, names).items()}
        steps = {
            piece.row * len(piece.layers) * (spec.page_size if piece.unit == "token" else 1)
            for piece in reference.parts[number]
        }
        for alignment in sorted(set(STRIDE_ALIGNMENTS) | steps):
            got = bool(part.is_stride_page_aligned(alignment))
            want = reference.expected_stride_aligned(number, addresses, alignment)
            if got != want:
                raise failure(
                    f"got {got} but should be {want} (buffers at "
                    f"{ {n: hex(a) for n, a in addresses.items()} }, page steps {sorted(steps)}) "
                    f"[host pool {number}: is_stride_page_aligned({alignment})]",
                    signature=_signature(
                        "buffer_infos", "is_stride_page_aligned", "answer differs", spec
                    ),
                )


def assert_split_heads_page_meta(
    parts: Sequence[Any], reference: ReferenceHostPool, *, spec: HostPoolSpec
) -> None:
    """An MHA ``page_head`` host pool's ``get_split_heads_page_buffer_meta(page, s)``, for
    every ``s`` dividing the head count, names per head group K's bytes of those heads, then
    V's, in group order, and ``get_page_buffer_element_size(s)`` is its first region's size
    (any other host pool: not asked)."""
    __tracebackhide__ = True
    if spec.kind != "mha" or spec.layout != "page_head" or spec.asymmetric:
        return
    part = parts[0]
    names = list(dict.fromkeys(piece.attribute for piece in reference.parts[0]))
    spans = _attributes(part, names)
    heads = spec.device.head_num
    ps = spec.page_size
    for split in (s for s in range(1, heads + 1) if heads % s == 0):
        for start in range(0, spec.host_size, ps):
            call = (
                f"get_split_heads_page_buffer_meta(host slots {start}..{start + ps - 1}, {split})"
            )
            ptrs, sizes = part.get_split_heads_page_buffer_meta(
                torch.arange(start, start + ps, dtype=torch.int64), split
            )
            got: list[tuple[str, list[tuple[int, int]]]] = []
            for ptr, size in zip(ptrs, sizes, strict=True):
                owner = _owner(spans, ptr, size)
                if owner is None:
                    raise failure(
                        f"got a region of {size} bytes at {ptr:#x} outside every host buffer "
                        f"[{call}]",
                        signature=_signature(
                            "buffer_infos",
                            "get_split_heads_page_buffer_meta",
                            "region outside",
                            spec,
                        ),
                    )
                base = spans[owner][0]
                got.append((owner, [(ptr - base, ptr - base + size)]))
            want = reference.expected_split_head_regions(start, split)
            if got != want:
                raise failure(
                    f"got regions {got} but should be {want} (per head group, K then V) [{call}]",
                    signature=_signature(
                        "buffer_infos", "get_split_heads_page_buffer_meta", "regions differ", spec
                    ),
                )
            if start == 0 and part.get_page_buffer_element_size(split) != sizes[0]:
                raise failure(
                    f"got {part.get_page_buffer_element_size(split)} but should be {sizes[0]} "
                    f"[get_page_buffer_element_size({split})]",
                    signature=_signature(
                        "buffer_infos", "get_page_buffer_element_size", "size differs", spec
                    ),
                )


def check_host_slot_reuse(
    host: Any, reference: ReferenceHostPool, held: Sequence[int], *, spec: HostPoolSpec
) -> None:
    """``free`` of no slots frees none and changes nothing; after the ``held`` slots are
    freed, an ``alloc`` of every free slot hands out exactly the reference's free slots,
    the freed ones included, and freeing them all leaves every slot free."""
    __tracebackhide__ = True
    with checking(host):
        available = int(host.available_size())
    freed = host.free(torch.tensor([], dtype=torch.int64))
    expect(host, "free", equals=0)
    with checking(host):
        available_after = int(host.available_size())
    expect(host, "available_size", equals=available)
    if freed != 0 or available_after != available:
        raise failure(
            f"got {freed} freed, available_size() {host.available_size()} but should be 0 "
            f"and {available} [free(no slots)]",
            signature=_signature("host_slots", "free", "empty free changed the pool", spec),
        )
    host.free(torch.tensor(list(held), dtype=torch.int64))
    reference.free(list(held))
    assert_host_slots(host, reference, call=f"free({list(held)})", spec=spec)
    count = reference.available_size()
    want = sorted(reference.free_slots)
    slots = host.alloc(count)
    expect(host, "alloc", sorted=want)
    got = [] if slots is None else sorted(int(x) for x in slots.tolist())
    if got != want:
        raise failure(
            f"got {got} but should be {want} (every free slot) [alloc({count}) after "
            f"free({list(held)})]",
            signature=_signature("host_slots", "alloc", "free slots differ", spec),
        )
    problems = reference.alloc(count, got)
    if problems:  # pragma: no cover - the comparison above already caught it
        raise failure("\n".join(problems), signature=_signature("host_slots", "alloc", "", spec))
    host.free(slots)
    reference.free(got)
    assert_host_slots(host, reference, call=f"free({got})", spec=spec)


def check_host_destroy(parts: Sequence[Any], *, spec: HostPoolSpec) -> None:
    """``destroy()`` of every host pool (the anchor last), twice: the second call does
    nothing, and each pool's ``kv_buffer`` is gone."""
    __tracebackhide__ = True
    for number, part in reversed(list(enumerate(parts))):
        for attempt in ("destroy()", "destroy() again"):
            try:
                part.destroy()
            except Exception as exc:  # teardown must not fail, nor fail twice
                raise failure(
                    f"got {type(exc).__name__}: {exc} but should return [host pool {number}: "
                    f"{attempt}]",
                    signature=_signature(
                        "teardown", "destroy", f"raises {type(exc).__name__}", spec
                    ),
                ) from exc
        if getattr(part, "kv_buffer", None) is not None:
            raise failure(
                f"got a kv_buffer after destroy() but should be None [host pool {number}]",
                signature=_signature("teardown", "destroy", "buffer kept", spec),
            )


def check_host_storage_and_teardown(
    target: Any,
    spec: HostPoolSpec,
    data: Any,
    *,
    device: str,
    write_kinds: Sequence[str],
    steer: Iterable[Steer] = (),
) -> None:
    """Build ``target``'s host tier of ``spec`` over a written device pool and check what a
    zero-copy storage backend is told (:func:`assert_key_sizes`,
    :func:`assert_stride_alignment`, :func:`assert_split_heads_page_meta`); back up and load
    back whole pages through the controller's hooks (``prepare_transfer_indices``,
    ``*_physical``), judged as the round trip judges them; refuse transfers with io backends
    the layout does not take (:func:`check_foreign_io_backends_refused`: whatever else a
    target validates, SGLang's host pools refuse those); then slot reuse
    (:func:`check_host_slot_reuse`) and teardown (:func:`check_host_destroy`). A failure
    lists the calls made on the host pools (:class:`~kvcheck.tier_log.TierLog`)."""
    log = TierLog("host_pool", spec, device=device)
    with log.attached_to_failures():
        _storage_and_teardown(
            log, target, spec, data, device=device, write_kinds=write_kinds, steer=steer
        )


def _storage_and_teardown(
    log: TierLog,
    target: Any,
    spec: HostPoolSpec,
    data: Any,
    *,
    device: str,
    write_kinds: Sequence[str],
    steer: Iterable[Steer],
) -> None:
    from hypothesis import strategies as st

    from kvcheck.properties.apply import apply_op_like_reference
    from kvcheck.properties.pool_state import assert_pool_matches_reference
    from kvcheck.reference import ReferencePool
    from kvcheck.specs import HostCopy, HostReload, WriteMLA
    from kvcheck.strategies import op_sequences
    from kvcheck.targets.tier_support import build_host_pool

    steering = Steering(steer)
    pool = target.make_pool(spec.device, device=device)
    reference = ReferencePool(spec.device)
    kinds = tuple(kind for kind in write_kinds if kind in ROUND_TRIP_WRITES)
    if kinds:
        writes = data.draw(op_sequences(spec.device, max_ops=2, kinds=kinds), label="writes")
        for op in writes.ops:
            if isinstance(op, WriteMLA) and 0 in op.locs and steering.avoids("write_mla:slot0"):
                continue  # steered: the target's finding on MLA writes to the padding slot
            apply_op_like_reference(target, pool, reference, op, device=device, copies={})
    parts = _recorded_parts(log, build_host_pool(target, spec, pool, device=device), pool)
    host_reference = ReferenceHostPool(spec)
    with checking(parts[0]):
        assert_key_sizes(parts, host_reference, spec=spec)
        assert_stride_alignment(parts, host_reference, spec=spec)
        assert_split_heads_page_meta(parts, host_reference, spec=spec)
    ps = spec.page_size
    device_pages = spec.device.size // ps
    held: list[int] = []
    if device_pages:
        page, other = data.draw(
            st.lists(st.integers(1, device_pages), unique=True, min_size=2, max_size=2)
            if device_pages > 1
            else st.just([1, 1]),
            label="device page backed up, device page loaded into",
        )
        host = parts[0].alloc(ps)
        expect(parts[0], "alloc", refused=False)
        if host is None:
            raise failure(
                f"got None but should be {ps} host slots [alloc({ps})]",
                signature=_signature("host_slots", "alloc", "refused", spec),
            )
        held = [int(x) for x in host.tolist()]
        host_reference.alloc(ps, held)
        source = torch.arange(page * ps, page * ps + ps)
        host_ids, device_ids = parts[0].prepare_transfer_indices(host, source, spec.io_backend)
        for part in parts:
            part.backup_from_device_all_layer_physical(pool, host_ids, device_ids, spec.io_backend)
        reference.apply(HostCopy(name="page", indices=tuple(source.tolist())))
        host_reference.backup(reference, held, source.tolist())
        call = f"backup_from_device_all_layer_physical(host_indices={held}, device page {page})"
        with checking(parts[0]):
            assert_host_bytes(parts, host_reference, call=call, spec=spec)
        loaded = torch.arange(other * ps, other * ps + ps)
        host_ids, device_ids = parts[0].prepare_transfer_indices(host, loaded, spec.io_backend)
        for layer in range(spec.device.layer_num):
            for part in parts:
                part.load_to_device_per_layer_physical(
                    pool, host_ids, device_ids, layer, spec.io_backend
                )
        reference.apply(HostReload(name="page", indices=tuple(loaded.tolist())))
        assert_pool_matches_reference(
            pool,
            reference,
            call=f"load_to_device_per_layer_physical(host_indices={held}, device page {other},"
            " every layer)",
            method="load_to_device_per_layer_physical",
        )
        check_empty_transfers(parts, pool, reference, host_reference, spec=spec)
        check_data_page_copy(parts, host_reference, held, spec=spec)
        check_foreign_io_backends_refused(parts, pool, host, spec=spec)
    check_host_slot_reuse(parts[0], host_reference, held, spec=spec)
    check_host_destroy(parts, spec=spec)


def check_empty_transfers(
    parts: Sequence[Any],
    pool: Any,
    reference: Any,
    host_reference: ReferenceHostPool,
    *,
    spec: HostPoolSpec,
) -> None:
    """A backup and a load of no indices change no host byte and no device byte."""
    __tracebackhide__ = True
    none = torch.tensor([], dtype=torch.int64)
    for part in parts:
        part.backup_from_device_all_layer(pool, none, none, spec.io_backend)
        part.load_to_device_per_layer(pool, none, none, 0, spec.io_backend)
    call = "backup_from_device_all_layer and load_to_device_per_layer of no indices"
    with checking(parts[0]):
        assert_host_bytes(parts, host_reference, call=call, spec=spec)
    from kvcheck.properties.pool_state import assert_pool_matches_reference

    assert_pool_matches_reference(pool, reference, call=call, method="load_to_device_per_layer")


def check_data_page_copy(
    parts: Sequence[Any],
    host_reference: ReferenceHostPool,
    held: Sequence[int],
    *,
    spec: HostPoolSpec,
) -> None:
    """The held page's flat data page, set into another host page, lands where the layout
    says (a pool with V's head dim of its own has no flat pages: ``NotImplementedError``
    from the page accessors and from split-heads page meta)."""
    __tracebackhide__ = True
    ps = spec.page_size
    if spec.asymmetric:
        calls = {
            "get_data_page": lambda: parts[0].get_data_page(held[0], flat=True),
            "get_dummy_flat_data_page": parts[0].get_dummy_flat_data_page,
            "set_from_flat_data_page": lambda: parts[0].set_from_flat_data_page(
                held[0], torch.zeros(1)
            ),
            "get_split_heads_page_buffer_meta": lambda: parts[0].get_split_heads_page_buffer_meta(
                torch.tensor(held), 1
            ),
        }
        for name, call in calls.items():
            try:
                with expecting(parts[0], raises="NotImplementedError"):
                    call()
            except NotImplementedError:
                continue
            except Exception as exc:  # any other exception is the wrong answer
                raise failure(
                    f"got {type(exc).__name__}: {exc} but should be NotImplementedError "
                    f"[{name} with head_dim != v_head_dim]",
                    signature=_signature("data_page", name, type(exc).__name__, spec),
                ) from exc
            raise failure(
                f"got an answer but should be NotImplementedError [{name} with head_dim != "
                "v_head_dim]",
                signature=_signature("data_page", name, "answered", spec),
            )
        return
    others = [start for start in range(0, spec.host_size, ps) if start not in held]
    if not others:
        return
    for number, part in enumerate(parts[: len(host_reference.parts)]):
        page = part.get_data_page(held[0], flat=True).clone()
        part.set_from_flat_data_page(others[0], page)
        host_reference.set_data_page(number, others[0], raw_bytes(page).tobytes())
    with checking(parts[0]):
        assert_host_bytes(
            parts,
            host_reference,
            call=f"set_from_flat_data_page({others[0]}, page {held[0]})",
            spec=spec,
        )


#: io backends a transfer may be handed: SGLang's two, and one no host pool takes.
IO_BACKENDS_TRIED: tuple[str, ...] = ("kernel", "direct", "nvme")


def check_foreign_io_backends_refused(
    parts: Sequence[Any], pool: Any, host: torch.Tensor, *, spec: HostPoolSpec
) -> None:
    """Every host pool refuses (``ValueError``, nothing changed) a backup and a load of the
    held page ``host`` with each io backend of :data:`IO_BACKENDS_TRIED` its layout does not
    transfer with."""
    __tracebackhide__ = True
    device_ids = torch.arange(spec.page_size, 2 * spec.page_size)
    for io_backend in IO_BACKENDS_TRIED:
        if io_backend in HOST_IO_BACKENDS[spec.layout]:
            continue
        for part in parts:

            def backup(part: Any = part, io: str = io_backend) -> None:
                part.backup_from_device_all_layer(pool, host, device_ids, io)

            def load(part: Any = part, io: str = io_backend) -> None:
                part.load_to_device_per_layer(pool, host, device_ids, 0, io)

            _assert_refused(parts, backup, f"backup with io_backend={io_backend!r}", spec)
            _assert_refused(parts, load, f"load with io_backend={io_backend!r}", spec)


def check_host_layouts_refused(target: Any, spec: HostPoolSpec, *, device: str) -> None:
    """``target.make_host_pool`` refuses (``ValueError``) a host pool mirroring ``spec``'s
    device pool in each layout of :func:`kvcheck.tiers.host_layouts_refused`."""
    __tracebackhide__ = True
    from kvcheck.tiers import host_layouts_refused, unchecked_host_pool_spec

    pool = target.make_pool(spec.device, device=device)
    for layout in host_layouts_refused(spec.device):
        bad = unchecked_host_pool_spec(spec.device, layout, "kernel", spec.host_pages)
        what = f"make_host_pool(layout={layout!r})"
        try:
            target.make_host_pool(bad, pool, device=device)
        except ValueError:
            continue
        except Exception as exc:  # any other exception is the wrong refusal
            raise failure(
                f"got {type(exc).__name__}: {exc} but should be ValueError [{what}]",
                signature=_signature(
                    "raises", "make_host_pool", f"{type(exc).__name__} instead of ValueError", spec
                ),
            ) from exc
        raise failure(
            f"got a host pool but should be ValueError [{what}]",
            signature=_signature(
                "raises", "make_host_pool", "no exception instead of ValueError", spec
            ),
        )
