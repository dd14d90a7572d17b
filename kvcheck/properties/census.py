"""Whole-pool operations checked against the pool's census, with no model of its class.

Each check takes a census (:func:`kvcheck.census.take_census`) of the pool and asks one
whole-pool operation to cover every tensor the census found:

* accounting: ``get_kv_size_bytes()`` (and ``mem_usage``) equal the bytes the census finds;
* host copies: ``get_cpu_copy`` then ``load_cpu_copy`` restores every slot and page tensor
  at the copied tokens (and a request copy's request row) and changes nothing else; the
  copy shares no memory with the pool;
* moves: ``move_kv_cache`` carries every slot and page tensor from source to target and
  changes nothing else;
* descriptions: every ``get_*buf_infos`` the pool offers, together, cover every state
  tensor's bytes exactly once, each with one page (or one row) as its item length;
* PD registration: what PD registers for the pool (a target's ``pd_registration``) covers
  them the same way on its own;
* reset: ``clear()`` brings back the pool's availability and its 1-D integer bookkeeping
  (free lists, slot states).

Tokens are drawn as whole pages, so that a page-indexed tensor (index keys, interleaved
scales) has a row per drawn page. A failure is a :class:`kvcheck.failures.PropertyFailure`
naming the tensor's path, the operation and the first differing index; its signature's
kind starts with the tensor's attribute name (``"kv_scale_buffer differs at slot 3"``), so a
target's declared finding about that buffer matches it.

Example:
    >>> import torch
    >>> from kvcheck.pools import MHATokenToKVPool
    >>> pool = MHATokenToKVPool(size=8, page_size=2, dtype=torch.float16, head_num=1,
    ...                         head_dim=2, layer_num=1, device="cpu")
    >>> assert_move_carries_census(pool, tgt_pages=(2,), src_pages=(1,))  # tensors checked
    2
    >>> assert_descriptions_cover_census(pool)
    ('get_contiguous_buf_infos',)
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kvcheck.census import Census, IndexSpace, TensorEntry, take_census
from kvcheck.census.descriptions import description_methods
from kvcheck.census.walk import walk_tensors
from kvcheck.failures import FailureSignature, PropertyFailure

__all__ = [
    "CENSUS_PROPERTIES",
    "assert_accounting_covers_census",
    "assert_clear_resets_census",
    "assert_descriptions_cover_census",
    "assert_hicache_assembly_whole",
    "assert_host_copy_restores_census",
    "assert_move_carries_census",
    "assert_registration_covers_census",
    "description_methods",
    "page_tokens",
]

#: The census properties, by the name a failure's signature carries as its check.
CENSUS_PROPERTIES = ("accounting", "host_copy", "move", "descriptions", "reset")
_GIB = 1 << 30


def _attribute(path: str) -> str:
    """The attribute a path ends in, without indices (``a.kv_scale_buffer[3]``:
    ``kv_scale_buffer``)."""
    return re.sub(r"\[[^\]]*\]", "", path).rsplit(".", 1)[-1]


def _fail(
    message: str, census: Census, *, check: str, call: str, kind: str, family: str
) -> PropertyFailure:
    error = PropertyFailure(
        f"{message} [{call}]",
        signature=FailureSignature(check=check, call=call, kind=kind, family=family),
    )
    error.add_note(census.describe())
    return error


def _census(pool: object, census: Census | None) -> Census:
    return take_census(pool) if census is None else census


def page_tokens(pages: Sequence[int], page_size: int) -> list[int]:
    """The token ids of ``pages``, page by page, in order.

    Example:
        >>> page_tokens((2, 0), 3)
        [6, 7, 8, 0, 1, 2]
    """
    return [page * page_size + offset for page in pages for offset in range(page_size)]


# --- bytes of a tensor, row by row --------------------------------------------------------


def _rows(entry: TensorEntry, tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The entry's bytes as ``[extent, row_bytes]`` uint8 (a copy)."""
    t = (entry.tensor if tensor is None else tensor).detach()
    if entry.dim:
        t = t.movedim(entry.dim, 0)
    flat = t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)
    return flat.reshape(max(entry.extent, 1), -1).clone() if t.numel() else flat.clone()


def _fill(entries: Sequence[TensorEntry], generator: torch.Generator) -> None:
    """Random bytes into every entry, written through the tensor itself (views too)."""
    for entry in entries:
        t = entry.tensor
        if t.numel() == 0 or t.device.type == "meta":
            continue
        noise = torch.randint(
            0, 256, (t.numel() * t.element_size(),), dtype=torch.uint8, generator=generator
        )
        t.copy_(noise.view(t.dtype).reshape(t.shape).to(t.device))


def _expect_rows(
    before: torch.Tensor, source: torch.Tensor, targets: Sequence[int], sources: Sequence[int]
) -> torch.Tensor:
    expected = before.clone()
    if targets:
        expected[list(targets)] = source[list(sources)]
    return expected


def _first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    row = int((got != expected).reshape(got.shape[0], -1).any(dim=1).nonzero()[0, 0])
    return f"{row}"


def _mapped(
    entry: TensorEntry, tokens: Sequence[int], page_size: int, request: int | None = None
) -> list[int]:
    """The entry's rows that ``tokens`` (whole pages) occupy, in order; a request-row
    tensor's row ``request`` when the operation names one (rows of a grouped entry: a
    compressed slot row per ``group`` tokens, ``group`` ring rows per request)."""
    group = entry.group
    if entry.space is IndexSpace.PAGE:
        return list(dict.fromkeys(token // page_size for token in tokens))
    if entry.space is IndexSpace.SLOT and group == 1:
        return list(tokens)
    if entry.space is IndexSpace.SLOT:
        return list(dict.fromkeys(token // group for token in tokens))
    if entry.space is IndexSpace.ROW and request is not None:
        return list(range(request * group, (request + 1) * group))
    return []


def _compare(
    census: Census,
    entries: Sequence[TensorEntry],
    expected: Mapping[str, torch.Tensor],
    *,
    call: str,
    check: str,
    family: str,
    what: str,
) -> None:
    __tracebackhide__ = True
    for entry in entries:
        got = _rows(entry)
        want = expected[entry.path]
        if got.shape == want.shape and torch.equal(got, want):
            continue
        where = _first_difference(got, want)
        space = entry.space.value
        raise _fail(
            f"{entry.path} differs at {space} {where} after {call} ({what})",
            census,
            check=check,
            call=call,
            kind=f"{_attribute(entry.path)} differs at {space} {where}",
            family=family,
        )


def _checked_entries(census: Census) -> tuple[list[TensorEntry], list[TensorEntry]]:
    """(state entries in the pool's own ids, every other entry with bytes that must stay
    unchanged). State in a sub-pool's own ids (an SWA window pool's slots) is in neither:
    which of its rows a token maps to needs a model of the pool."""
    own = list(census.state_entries(own_geometry_only=True))
    foreign = [e for e in census.state_entries() if e not in own]
    # A mirror changes with the state it mirrors; a per-layer table is the kernels'.
    rest = [
        e
        for e in census.entries
        if e not in own
        and e not in foreign
        and e.nbytes > 0
        and e.space not in (IndexSpace.LAYER, IndexSpace.MIRROR)
    ]
    return own, rest


# --- the properties -----------------------------------------------------------------------


def assert_accounting_covers_census(
    pool: Any,
    *,
    census: Census | None = None,
    exempt: Mapping[str, str] | None = None,
    family: str = "",
) -> int:
    """``get_kv_size_bytes()`` (summed when it is a tuple) equals the bytes the census
    finds (:meth:`Census.held_bytes`), and ``mem_usage`` (GiB), where the pool has it,
    says the same. ``exempt`` maps path globs the pool's accounting leaves out on purpose
    to the reason (quoted in a failure). Returns the bytes counted."""
    __tracebackhide__ = True
    census = _census(pool, census)
    exempt = dict(exempt or {})
    counted = census.held_bytes(exempt=tuple(exempt))
    reported = pool.get_kv_size_bytes()
    total = int(sum(reported)) if isinstance(reported, (tuple, list)) else int(reported)
    note = "".join(f"; {glob} left out: {why}" for glob, why in exempt.items())
    if total != counted:
        missing = counted - total
        scale_bytes = sum(
            e.tensor.untyped_storage().nbytes()
            for e in census.state_entries()
            if "scale" in _attribute(e.path)
            and e.path not in {x.path for x in census.matching(tuple(exempt))}
        )
        tail_bytes = sum(
            e.tensor.untyped_storage().nbytes()
            for e in census.state_entries()
            if "compress_tail" in _attribute(e.path)
        )
        kind = (
            "scale buffers unreported"
            if missing > 0 and missing == scale_bytes
            else "compress tails unreported"
            if missing > 0 and missing == tail_bytes
            else (
                f"{missing} bytes unreported" if missing > 0 else f"{-missing} bytes over-reported"
            )
        )
        raise _fail(
            f"get_kv_size_bytes() reports {total} bytes but the census finds {counted}{note}",
            census,
            check="accounting",
            call="get_kv_size_bytes",
            kind=kind,
            family=family,
        )
    usage = getattr(type(pool), "mem_usage", None)
    if usage is not None or "mem_usage" in vars(pool):
        gib = float(pool.mem_usage)
        if not math.isclose(gib * _GIB, counted, rel_tol=1e-6, abs_tol=1.0):
            raise _fail(
                f"mem_usage says {gib!r} GiB ({gib * _GIB:.0f} bytes) but the census finds"
                f" {counted} bytes{note}",
                census,
                check="accounting",
                call="mem_usage",
                kind="mem_usage differs",
                family=family,
            )
    return counted


def assert_host_copy_restores_census(
    pool: Any,
    pages: Sequence[int],
    *,
    census: Census | None = None,
    seed: int = 0,
    family: str = "",
    req_pool_index: int | None = None,
) -> int:
    """Random bytes everywhere (state A), ``copy = get_cpu_copy(tokens of pages)``, random
    bytes again (state B), ``load_cpu_copy(copy, tokens)``: every slot and page tensor
    holds A at those tokens and B elsewhere, and every other tensor holds B. A request
    copy (``req_pool_index``, passed to both calls: a retracted request's own state, as
    sglang's retraction offloads it) also restores that row of every request-row tensor,
    and no other row. Returns the number of tensors checked."""
    __tracebackhide__ = True
    if req_pool_index is not None and (
        not isinstance(req_pool_index, int)
        or isinstance(req_pool_index, bool)
        or req_pool_index < 0
    ):
        raise ValueError(f"req_pool_index={req_pool_index!r} must be None or an int >= 0")
    census = _census(pool, census)
    own, rest = _checked_entries(census)
    page_size = census.geometry.page_size
    tokens = page_tokens(pages, page_size)
    device = own[0].tensor.device if own else "cpu"
    indices = torch.tensor(tokens, dtype=torch.int64, device=device)
    generator = torch.Generator().manual_seed(seed)
    _fill(own, generator)
    first = {e.path: _rows(e) for e in own}
    request = {} if req_pool_index is None else {"req_pool_index": req_pool_index}
    copy = pool.get_cpu_copy(indices, **request)
    _assert_copy_owns_its_memory(copy, census, family=family)
    _fill(own, generator)
    second = {e.path: _rows(e) for e in own + rest}
    pool.load_cpu_copy(copy, indices, **request)
    expected = dict(second)
    for entry in own:
        rows = _mapped(entry, tokens, page_size, req_pool_index)
        expected[entry.path] = _expect_rows(second[entry.path], first[entry.path], rows, rows)
    what = f"tokens {tokens} copied, overwritten, loaded back" + (
        f" (request row {req_pool_index})" if request else ""
    )
    for call, entries in (("load_cpu_copy", own), ("load_cpu_copy", rest)):
        _compare(census, entries, expected, call=call, check="bytes", family=family, what=what)
    return len(own)


def _assert_copy_owns_its_memory(copy: object, census: Census, *, family: str) -> None:
    """A host copy is a snapshot: no tensor of it may share storage with the pool (a
    ``.to("cpu")`` of a CPU tensor is the tensor itself), or later writes to the pool
    change what was saved."""
    __tracebackhide__ = True
    pool_storage: dict[int, str] = {}
    for entry in census.entries:
        if entry.nbytes > 0 and entry.tensor.device.type != "meta":
            # Tensors sharing one storage (fused K and V) are named by the first.
            pool_storage.setdefault(entry.tensor.untyped_storage().data_ptr(), entry.path)
    held = [copy] if isinstance(copy, torch.Tensor) else [f.tensor for f in walk_tensors(copy)]
    for tensor in held:
        if tensor.numel() == 0 or tensor.device.type == "meta":
            continue
        path = pool_storage.get(tensor.untyped_storage().data_ptr())
        if path is not None:
            raise _fail(
                f"the copy get_cpu_copy returned shares memory with {path}: a later write to"
                " the pool changes the saved copy",
                census,
                check="host_copy",
                call="get_cpu_copy",
                kind=f"copy shares memory with {_attribute(path)}",
                family=family,
            )


def assert_move_carries_census(
    pool: Any,
    *,
    tgt_pages: Sequence[int],
    src_pages: Sequence[int],
    census: Census | None = None,
    seed: int = 0,
    family: str = "",
) -> int:
    """Random bytes everywhere, then ``move_kv_cache(tgt tokens, src tokens)`` (page by
    page, token by token): every slot and page tensor holds at each target what it held
    at its source, and nothing else changes. Returns the number of tensors checked."""
    __tracebackhide__ = True
    if len(tgt_pages) != len(src_pages):
        raise ValueError(
            f"tgt_pages={tgt_pages!r} and src_pages={src_pages!r} must have one length"
        )
    census = _census(pool, census)
    own, rest = _checked_entries(census)
    page_size = census.geometry.page_size
    tgt, src = page_tokens(tgt_pages, page_size), page_tokens(src_pages, page_size)
    device = own[0].tensor.device if own else "cpu"
    _fill(own, torch.Generator().manual_seed(seed))
    before = {e.path: _rows(e) for e in own + rest}
    pool.move_kv_cache(
        torch.tensor(tgt, dtype=torch.int64, device=device),
        torch.tensor(src, dtype=torch.int64, device=device),
    )
    expected = dict(before)
    for entry in own:
        old = before[entry.path]
        expected[entry.path] = _expect_rows(
            old, old, _mapped(entry, tgt, page_size), _mapped(entry, src, page_size)
        )
    what = f"tokens {src} moved to {tgt}"
    _compare(
        census, own + rest, expected, call="move_kv_cache", check="bytes", family=family, what=what
    )
    return len(own)


Description = tuple[Sequence[int], Sequence[int], Sequence[int]]


def assert_descriptions_cover_census(
    pool: Any, *, census: Census | None = None, family: str = ""
) -> tuple[str, ...]:
    """Every transfer description the pool offers (:func:`description_methods`), taken
    together, covers each state tensor's bytes exactly once: no two described ranges
    overlap, each described range lies in a tensor of the census, every state tensor is
    covered whole, and a range that starts a tensor has one page (slot tensors) or one row
    (page and row tensors) as its item length. A method that raises ``AttributeError``
    for a ``*buf_infos`` name (a composed pool forwarding to a sub-pool that lacks that
    description) is not offered by this configuration. Returns the methods read."""
    __tracebackhide__ = True
    census = _census(pool, census)
    described: dict[str, Description] = {}
    for name in description_methods(pool):
        try:
            described[name] = getattr(pool, name)()
        except TypeError:
            continue  # a description that needs arguments (a request's) is not whole-pool
        except AttributeError as error:
            if not str(error.name or "").endswith("buf_infos"):
                raise
            # A composed pool forwarding to a sub-pool that lacks the method (an SWA
            # pool's scale descriptors over unquantized sides): this configuration does
            # not offer it, and callers ask only the configurations that do.
            continue
    _assert_described_once(described, census, family=family, call="get_*buf_infos")
    return tuple(described)


def assert_hicache_assembly_whole(
    assemble: Callable[[Any], Sequence[str]], pool: Any, *, family: str = ""
) -> None:
    """The HiCache host pool group a target assembles for ``pool`` (``assemble``: its
    ``hicache_assembly`` member, which answers what the group leaves out) is built, and
    leaves out no host pool the pool or a sub-pool declares: a side left out is never
    offloaded to host memory nor loaded back. A raise fails as ``raises <error>``.

    Example:
        >>> assert_hicache_assembly_whole(lambda pool: [], object(), family="swa:mha")
        >>> try:
        ...     assert_hicache_assembly_whole(lambda pool: ["full_kv_pool: indexer"], object())
        ... except AssertionError as failure:
        ...     print(failure)
        the HiCache host pool group leaves out full_kv_pool: indexer [hicache_assembly]
    """
    __tracebackhide__ = True
    call = "hicache_assembly"
    try:
        missing = list(assemble(pool))
    except Exception as error:
        raise PropertyFailure(
            f"the HiCache assembly raised {type(error).__name__}: {error} [{call}]",
            signature=FailureSignature(
                check="raises", call=call, kind=f"raises {type(error).__name__}", family=family
            ),
        ) from error
    if missing:
        raise PropertyFailure(
            f"the HiCache host pool group leaves out {', '.join(missing)} [{call}]",
            signature=FailureSignature(
                check="descriptions", call=call, kind="host pool unassembled", family=family
            ),
        )


def assert_registration_covers_census(
    registration: Mapping[str, Description],
    *,
    pool: Any = None,
    census: Census | None = None,
    family: str = "",
    call: str = "setup_state_kv_args",
) -> tuple[str, ...]:
    """What PD registers for a pool with its transfer engine (``registration``: the KV
    component and each state component, by name, as a target's ``pd_registration`` gives
    them) covers each state tensor of the pool's census exactly once, with the item
    lengths :func:`assert_descriptions_cover_census` asks for: a tensor the registration
    leaves out is never sent to the decode side. Returns the component names.

    Example:
        >>> import torch
        >>> from kvcheck.pools import MHATokenToKVPool
        >>> pool = MHATokenToKVPool(size=8, page_size=2, dtype=torch.float16, head_num=1,
        ...                         head_dim=2, layer_num=1, device="cpu")
        >>> assert_registration_covers_census({"kv": pool.get_contiguous_buf_infos()}, pool=pool)
        ('kv',)
    """
    __tracebackhide__ = True
    if census is None and pool is None:
        raise ValueError("pass pool= or census= (the pool whose registration this is)")
    census = _census(pool, census)
    _assert_described_once(dict(registration), census, family=family, call=call)
    return tuple(registration)


def _assert_described_once(
    described: Mapping[str, Description], census: Census, *, family: str, call: str
) -> None:
    """The ranges of ``described`` (name -> pointers, lengths, item lengths) cover every
    state tensor of ``census`` exactly once, each from a tensor's start with one page or
    row per item; ``call`` is named when a tensor is left out."""
    __tracebackhide__ = True
    read = list(described)
    ranges: list[tuple[int, int, int, str]] = []
    for name, (ptrs, lens, items) in described.items():
        for ptr, length, item in zip(ptrs, lens, items, strict=True):
            if int(length):
                ranges.append((int(ptr), int(ptr) + int(length), int(item), name))
    ranges.sort()
    for (_, a1, _, first), (b0, _, _, second) in itertools.pairwise(ranges):
        if b0 < a1:
            raise _fail(
                f"{first} and {second} both describe bytes [{b0}, {min(a1, b0)}+)",
                census,
                check="descriptions",
                call=second,
                kind="described twice",
                family=family,
            )
    entries = [e for e in census.entries if e.nbytes > 0 and e.space is not IndexSpace.LAYER]
    spans = {e.path: (e.tensor.data_ptr(), e.tensor.data_ptr() + e.nbytes) for e in entries}
    for start, end, item, name in ranges:
        home = next(
            (e for e in entries if spans[e.path][0] <= start and end <= spans[e.path][1]), None
        )
        if home is None:
            raise _fail(
                f"{name} describes bytes [{start}, {end}) that no tensor of the census holds",
                census,
                check="descriptions",
                call=name,
                kind="foreign bytes",
                family=family,
            )
        if start == spans[home.path][0] and home.holds_state:
            page = home.geometry.page_size
            # One page of slots (a grouped slot entry: its rows of one page; single-slot
            # pages, size + 1 rows: one slot, as a mamba pool's), one request.
            single = home.extent == (home.geometry.size or 0) + 1 != home.geometry.num_slots
            if home.space is IndexSpace.SLOT:
                per_item = home.row_bytes * (1 if single else page // home.group)
            else:
                per_item = home.row_bytes * home.group
            # A length that is both a slot and a page count (pages * stride == slots)
            # leaves the shape ambiguous: one row or one page of rows is one item.
            ambiguous = home.extent in home.geometry.page_extents
            allowed = {per_item, home.row_bytes, home.row_bytes * page} if ambiguous else {per_item}
            if item not in allowed:
                raise _fail(
                    f"{name} gives {home.path} item length {item}, expected {per_item}"
                    f" (one {'page' if home.space is IndexSpace.SLOT else home.space.value})",
                    census,
                    check="descriptions",
                    call=name,
                    kind=f"{_attribute(home.path)} item length",
                    family=family,
                )
    for entry in census.state_entries():
        lo, hi = spans[entry.path]
        covered = sum(max(0, min(hi, end) - max(lo, start)) for start, end, _, _ in ranges)
        if covered != hi - lo:
            scale = "scale" in _attribute(entry.path)
            whole_pool = call == "get_*buf_infos"
            raise _fail(
                f"{entry.path}: {covered} of its {hi - lo} bytes are described by"
                f" {', '.join(read) or 'nothing'}",
                census,
                check="scale_buf_infos" if scale and whole_pool else "descriptions",
                call="get_kv_scale_buf_infos" if scale and whole_pool else call,
                kind=f"{_attribute(entry.path)} undescribed",
                family=family,
            )


def _bookkeeping(census: Census) -> list[TensorEntry]:
    return [
        e
        for e in census.entries
        if e.tensor.dim() == 1
        and not e.tensor.dtype.is_floating_point
        and e.space is not IndexSpace.LAYER
        and e.nbytes
    ]


def assert_clear_resets_census(
    pool: Any, *, census: Census | None = None, seed: int = 0, family: str = ""
) -> int:
    """Taken on a fresh pool: after an allocation (``alloc(1)``, where the pool has one)
    and random bytes in its 1-D integer bookkeeping (free lists, slot states),
    ``clear()`` gives back the initial ``available_size()`` and bookkeeping. Returns the
    number of bookkeeping tensors checked."""
    __tracebackhide__ = True
    census = _census(pool, census)
    books = _bookkeeping(census)
    initial = {e.path: _rows(e) for e in books}
    available = getattr(pool, "available_size", None)
    size_before = available() if callable(available) else None
    alloc = getattr(pool, "alloc", None)
    if callable(alloc):
        # An alloc that wants requests, not a count, is left to a scheduler machine.
        with contextlib.suppress(TypeError):
            alloc(1)
    _fill(books, torch.Generator().manual_seed(seed))
    pool.clear()
    # clear() may put new tensors in place of the old ones: compare by path.
    after = {e.path: e for e in take_census(pool).entries}
    if size_before is not None and callable(available) and available() != size_before:
        raise _fail(
            f"available_size() is {available()} after clear(), {size_before} when built",
            census,
            check="reset",
            call="clear",
            kind="available_size differs",
            family=family,
        )
    missing = [e.path for e in books if e.path not in after]
    if missing:
        raise _fail(
            f"clear() removed {missing}",
            census,
            check="reset",
            call="clear",
            kind="tensor removed",
            family=family,
        )
    now = [after[e.path] for e in books]
    _compare(
        census,
        now,
        initial,
        call="clear",
        check="reset",
        family=family,
        what="bookkeeping after clear() vs when built",
    )
    return len(books)
