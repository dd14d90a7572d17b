"""Properties of a token-to-KV allocator, judged against
:class:`kvcheck.reference.allocators.ReferenceAllocator`.

- no slot is handed out twice, and extend/decode answers are page-aligned
  (:func:`assert_answer`: the reference's verdict on what the allocator returned);
- ``available_size()`` (and a sliding-window allocator's two sides and its full-to-window
  mapping) equals the truth after every step, and each side's census of its free pages
  (``get_all_free_pages()``, where the allocator has one) lists every free page once and
  nothing else: a freed slot comes back exactly once (:func:`assert_allocator_state`);
- an allocation is refused exactly when the free pages do not cover it, and a refused one
  changes nothing, on either side (:func:`assert_refusal`);
- what the scheduler's hooks are told equals the truth: the capacities (``size_full``, and
  a sliding-window allocator's ``size_swa`` and ``size``), ``check_decode_capacity`` (an
  allocation of ``num_tokens`` fits exactly when the free slots cover it),
  ``verify_byte_accounting()`` (no violation) and the transfer ids
  (``translate_kv_indices_for_transfer``: the slots; ``translate_swa_indices_for_transfer``:
  their window peers) (:func:`assert_reported_capacity`, :func:`assert_hook_answer`);
- bad input (a double free, a foreign slot, an id out of range, a size that is not whole
  pages) raises ``ValueError`` and changes nothing (:func:`assert_bad_call_refused`,
  capability ``input_validation``).

Failures carry a :class:`~kvcheck.failures.FailureSignature` whose family is
``allocator:<kind>``, so a target's findings can match them. Each check says what it
expected of the allocator's answers (:func:`kvcheck.tier_log.expect`), which a failure's
standalone script checks again when the allocator is one a :class:`~kvcheck.tier_log.TierLog`
records (nothing changes for any other).

Example:
    >>> import torch
    >>> from kvcheck.allocators import TokenToKVPoolAllocator
    >>> from kvcheck.reference.allocators import ReferenceAllocator
    >>> from kvcheck.tiers import AllocatorSpec
    >>> spec = AllocatorSpec(kind="token", size=4, page_size=1)
    >>> allocator = TokenToKVPoolAllocator(4, torch.bfloat16, "cpu", None, False)
    >>> reference = ReferenceAllocator(spec)
    >>> assert_answer(reference.alloc(2, allocator.alloc(2).tolist()), call="alloc(2)", spec=spec)
    >>> assert_allocator_state(allocator, reference, call="alloc(2)")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcheck.failures import FailureSignature
from kvcheck.properties.assertions import failure
from kvcheck.reference.allocators import ReferenceAllocator
from kvcheck.tier_log import checking, expect, expecting
from kvcheck.tiers import AllocatorSpec

__all__ = [
    "allocator_family",
    "allocator_sizes",
    "assert_allocator_state",
    "assert_answer",
    "assert_bad_call_refused",
    "assert_free_pages",
    "assert_hook_answer",
    "assert_refusal",
    "assert_reported_capacity",
]


#: Kinds with a full and a sliding-window side (one pool serving as both, for ``pure_swa``).
_TWO_SIDED = ("swa", "pure_swa")


def allocator_family(spec: AllocatorSpec) -> str:
    """The signature family of ``spec``'s failures: ``allocator:<kind>``.

    Example:
        >>> allocator_family(AllocatorSpec(kind="swa", size=2, page_size=1, size_swa=2))
        'allocator:swa'
    """
    return f"allocator:{spec.kind}"


def _signature(check: str, call: str, kind: str, spec: AllocatorSpec) -> FailureSignature:
    method = call.split("(")[0]
    return FailureSignature(check=check, call=method, kind=kind, family=allocator_family(spec))


def assert_answer(problems: list[str], *, call: str, spec: AllocatorSpec) -> None:
    """Fail with the reference's objections to an allocation's answer (none: it holds)."""
    __tracebackhide__ = True
    if not problems:
        return
    twice = any("held" in p or "twice" in p or "padding" in p for p in problems)
    kind = "slot handed out twice" if twice else "page alignment"
    raise failure(
        f"allocator answer breaks the contract [{call}]\n" + "\n".join(problems[:6]),
        signature=_signature("allocation", call, kind, spec),
    )


def allocator_sizes(allocator: Any, spec: AllocatorSpec) -> dict[str, int]:
    """What the allocator reports: ``available_size()`` (and, for SWA, each side's)."""
    with checking(allocator):
        sizes = {"available_size()": int(allocator.available_size())}
        if spec.kind in _TWO_SIDED:
            sizes["full_available_size()"] = int(allocator.full_available_size())
            sizes["swa_available_size()"] = int(allocator.swa_available_size())
    return sizes


def _expect_sizes(allocator: Any, sizes: dict[str, int]) -> None:
    """The latest size calls (:func:`allocator_sizes`) should have answered ``sizes``."""
    for name, value in sizes.items():
        expect(allocator, name.removesuffix("()"), equals=value)


def _expected_sizes(reference: ReferenceAllocator) -> dict[str, int]:
    sizes = {"available_size()": reference.available_size()}
    if reference.spec.kind in _TWO_SIDED:
        window = reference.swa or reference.full
        sizes["full_available_size()"] = reference.full.available_size()
        sizes["swa_available_size()"] = window.available_size()
    return sizes


def _censuses(allocator: Any, reference: ReferenceAllocator) -> list[tuple[str, Any, Any]]:
    """(name, the allocator's side, the reference's side) for each side that takes a census."""
    kind = reference.spec.kind
    if kind == "swa":
        assert reference.swa is not None
        pairs = [
            ("full side", getattr(allocator, "full_attn_allocator", None), reference.full),
            ("window side", getattr(allocator, "swa_attn_allocator", None), reference.swa),
        ]
    elif kind == "pure_swa":
        pairs = [("pool", getattr(allocator, "swa_attn_allocator", None), reference.full)]
    else:
        pairs = [("allocator", allocator, reference.full)]
    return [
        (name, side, ref_side)
        for name, side, ref_side in pairs
        if callable(getattr(side, "get_all_free_pages", None))
    ]


def assert_free_pages(allocator: Any, reference: ReferenceAllocator, *, call: str) -> None:
    """Each side's ``get_all_free_pages()`` lists every free page once and no held page."""
    __tracebackhide__ = True
    for name, side, ref_side in _censuses(allocator, reference):
        with checking(side):
            pages = side.get_all_free_pages()
        expect(side, "get_all_free_pages", sorted=sorted(ref_side.free))
        listed = [] if pages is None else [int(x) for x in pages.tolist()]
        problems = reference.free_pages_problems(ref_side, listed, f"{name} get_all_free_pages()")
        if problems:
            twice = any("twice" in p for p in problems)
            raise failure(
                f"free-page census breaks the contract [after {call}]\n" + "\n".join(problems[:6]),
                signature=_signature(
                    "free_pages",
                    call,
                    "page free twice" if twice else "census differs",
                    reference.spec,
                ),
            )


def assert_allocator_state(allocator: Any, reference: ReferenceAllocator, *, call: str) -> None:
    """``available_size()`` (SWA: both sides, and every full-side slot's window peer) equals
    the reference after ``call``."""
    __tracebackhide__ = True
    spec = reference.spec
    got, expected = allocator_sizes(allocator, spec), _expected_sizes(reference)
    _expect_sizes(allocator, expected)
    if got != expected:
        raise failure(
            f"got {got} but should be {expected} [after {call}]",
            signature=_signature("available_size", call, "size differs", spec),
        )
    assert_free_pages(allocator, reference, call=call)
    if spec.kind not in _TWO_SIDED:
        return
    import torch

    slots = list(range(spec.size + spec.page_size))
    with checking(allocator):
        peers = allocator.translate_loc_from_full_to_swa(torch.tensor(slots, dtype=torch.int64))
    got_map = [int(x) for x in peers.tolist()]
    want_map = reference.expected_mapping(slots)
    expect(allocator, "translate_loc_from_full_to_swa", equals=want_map)
    if got_map != want_map:
        first = next(i for i, (a, b) in enumerate(zip(got_map, want_map, strict=True)) if a != b)
        raise failure(
            f"got window peer {got_map[first]} of full slot {first} but should be "
            f"{want_map[first]} [after {call}]",
            signature=_signature("swa_mapping", call, "mapping differs", spec),
        )


def assert_refusal(
    refused: bool,
    should_refuse: bool,
    *,
    before: dict[str, int],
    allocator: Any,
    call: str,
    spec: AllocatorSpec,
) -> None:
    """An allocation returned None exactly when the reference refuses it, and a refused one
    left every size as it was (``before``: :func:`allocator_sizes` before the call)."""
    __tracebackhide__ = True
    expect(allocator, call.split("(")[0], refused=should_refuse)
    if refused != should_refuse:
        got = "None" if refused else "slots"
        want = "None (the free pages do not cover it)" if should_refuse else "slots"
        raise failure(
            f"got {got} but should be {want} [{call}]",
            signature=_signature("refusal", call, "refused" if refused else "not refused", spec),
        )
    if refused:
        after = allocator_sizes(allocator, spec)
        _expect_sizes(allocator, before)
        if after != before:
            raise failure(
                f"got {after} after a refused allocation but should be {before} [{call}]",
                signature=_signature("refusal", call, "refusal changed the allocator", spec),
            )


def assert_bad_call_refused(
    run: Callable[[], Any], *, allocator: Any, call: str, spec: AllocatorSpec, why: str
) -> None:
    """``run()`` (a call with bad input: ``why``) raises ``ValueError`` and changes no size."""
    __tracebackhide__ = True
    before = allocator_sizes(allocator, spec)
    try:
        with expecting(allocator, raises="ValueError"):
            run()
    except ValueError:
        pass
    except Exception as exc:  # any other exception is the wrong kind of refusal
        raise failure(
            f"got {type(exc).__name__}: {exc} but should be ValueError [{call}: {why}]",
            signature=_signature(
                "raises", call, f"{type(exc).__name__} instead of ValueError", spec
            ),
        ) from exc
    else:
        raise failure(
            f"got no exception but should be ValueError [{call}: {why}]",
            signature=_signature("raises", call, "no exception instead of ValueError", spec),
        )
    after = allocator_sizes(allocator, spec)
    _expect_sizes(allocator, before)
    if after != before:
        raise failure(
            f"got {after} after a refused call but should be {before} [{call}: {why}]",
            signature=_signature("raises", call, "refusal changed the allocator", spec),
        )


def _expected_capacity(spec: AllocatorSpec) -> dict[str, int]:
    sizes = {"size_full": spec.size}
    if spec.kind == "swa":
        sizes["size_swa"] = spec.size_swa
        sizes["size"] = min(spec.size, spec.size_swa)
    elif spec.kind == "pure_swa":
        sizes["size_swa"] = sizes["size"] = spec.size
    return sizes


def assert_reported_capacity(allocator: Any, spec: AllocatorSpec, *, call: str) -> None:
    """The capacities the allocator reports equal the spec's, and
    ``verify_byte_accounting()`` (where it has one) finds no violation."""
    __tracebackhide__ = True
    expected = _expected_capacity(spec)
    with checking(allocator):
        got = {name: int(getattr(allocator, name)) for name in expected}
    for name, value in expected.items():
        expect(allocator, name, equals=value)
    if got != expected:
        raise failure(
            f"got {got} but should be {expected} [after {call}]",
            signature=_signature("capacity", call, "capacity differs", spec),
        )
    verify = getattr(allocator, "verify_byte_accounting", None)
    if callable(verify):
        with checking(allocator):
            answer = verify()
        if isinstance(answer, list | tuple):  # anything else is no answer a script compares
            expect(allocator, "verify_byte_accounting", equals=[])
        problems = list(answer)
        if problems:
            raise failure(
                f"got verify_byte_accounting() = {problems[:6]} but should be [] [after {call}]",
                signature=_signature("capacity", call, "accounting violation", spec),
            )


def assert_hook_answer(got: object, expected: object, *, call: str, spec: AllocatorSpec) -> None:
    """A scheduler hook's answer (``call``) equals the truth."""
    __tracebackhide__ = True
    if got != expected:
        raise failure(
            f"got {got!r} but should be {expected!r} [{call}]",
            signature=_signature("hook", call, "answer differs", spec),
        )
