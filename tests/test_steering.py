"""Steering (kvcheck.steering): a finding's steers are typed values, refused when malformed,
and ask the generators to avoid exactly what they name."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

import kvcheck
from kvcheck.machines import _STEP_KINDS
from kvcheck.specs import POOL_FAMILIES
from kvcheck.steering import STEER_KINDS, STEP_KINDS, Steer, Steering
from kvcheck.strategies.ops import OP_KINDS
from kvcheck.targets.findings import Finding, finding_problems, steered_tags
from kvcheck.targets.sglang.findings import SGLANG_FINDINGS
from kvcheck.tiers import ALLOCATOR_KINDS, HOST_FAMILIES
from kvcheck.variants import variant_names

# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Steer("moves"), "what='moves' is not a steer kind: one of ('write_kv', 'move',"),
        (lambda: Steer(3), "what=3 is not a steer kind"),  # type: ignore[arg-type]
        (
            lambda: Steer("move", "dsa:kpol"),
            "where='dsa:kpol' is not where a 'move' steer applies: a pool variant or family",
        ),
        (
            lambda: Steer("host_copy:request", "dsa:kpool"),
            "where='dsa:kpool' is not where a 'host_copy:request' steer applies: a pool family,"
            " or '' for every pool: one of ('', 'mha', 'noop', 'mla', 'dsa')",
        ),
        (
            lambda: Steer("cast_write:scales", "mha"),
            "where='mha' is not where a 'cast_write:scales' steer applies: every pool: one of "
            "('',)",
        ),
        (
            lambda: Steer("allocator:one_side_refused"),
            "where='' is not where a 'allocator:one_side_refused' steer applies: the allocator "
            "kind with two sides: one of ('swa',)",
        ),
        (lambda: Steer("move", None), "where=None is not where"),  # type: ignore[arg-type]
        (lambda: Steer.step("slot0", "mha"), "kind='slot0' is not a step kind: one of"),
        (
            lambda: Steering({"noop:host_reload"}),  # type: ignore[arg-type]
            "steering: 'noop:host_reload' is not a kvcheck.steering.Steer (the tag "
            "'noop:host_reload' is Steer(what='host_reload', where='noop'))",
        ),
        (
            lambda: Steering({"noop:nothing"}),  # type: ignore[arg-type]
            "steering: 'noop:nothing' is not a kvcheck.steering.Steer",
        ),
        (
            lambda: Steering("noop:move"),  # type: ignore[arg-type]
            "steering: 'noop:move' is not a collection of kvcheck.steering.Steer",
        ),
        (lambda: Steering().avoids("moves"), "what='moves' is not a steer kind"),
        (lambda: Steering().mentions("slot_0"), "what='slot_0' is not a steer kind"),
    ],
)
def test_bad_steers_are_refused_saying_why(make: object, message: str) -> None:
    """A kind, a where or an element that is not a Steer raises ValueError naming the
    argument and what it takes."""
    with pytest.raises(ValueError) as raised:
        make()  # type: ignore[operator]
    assert str(raised.value).startswith(message), str(raised.value)


def test_a_finding_with_string_tags_is_a_declaration_problem() -> None:
    """finding_problems names the finding and the Steer each old tag stands for."""
    finding = Finding("N1", "n", call="load_cpu_copy", steer=frozenset({"noop:host_reload"}))  # type: ignore[arg-type]
    assert finding_problems([finding]) == [
        "findings[0] (N1): steer: 'noop:host_reload' is not a kvcheck.steering.Steer (the tag "
        "'noop:host_reload' is Steer(what='host_reload', where='noop'))"
    ]
    with pytest.raises(ValueError, match=r"is not a kvcheck\.steering\.Steer"):
        steered_tags(SimpleNamespace(findings=(finding,)))


def test_the_sglang_findings_declare_typed_steers() -> None:
    assert finding_problems([f for f in SGLANG_FINDINGS if f.signed]) == []
    assert all(isinstance(steer, Steer) for f in SGLANG_FINDINGS for steer in f.steer)


# --- matching ----------------------------------------------------------------------------


def test_a_family_steer_applies_to_every_variant_of_it() -> None:
    steering = Steering({Steer.step("move", "dsa")})
    assert all(
        steering.avoids("move", variant=name) == name.startswith("dsa") for name in variant_names()
    )
    assert steering.avoids("move", family="dsa")
    assert not steering.avoids("host_copy", family="dsa")


def test_a_variant_steer_applies_to_that_variant_only() -> None:
    """No prefix matching: ``mha:mxfp8`` is not ``mha:mxfp8:flat``; an asker that names only
    the family (what a whole family's test draws) is not steered by one variant's steer."""
    steering = Steering({Steer("slot0", "mha:mxfp8"), Steer.step("write_kv", "mha:hnd")})
    assert steering.avoids("slot0", variant="mha:mxfp8")
    assert not steering.avoids("slot0", variant="mha:mxfp8:flat")
    assert not steering.avoids("slot0", variant="mha")
    assert steering.avoids("write_kv", variant="mha:hnd")
    assert not steering.avoids("write_kv", family="mha")


def test_a_global_steer_applies_everywhere() -> None:
    steering = Steering({Steer("cast_write:scales"), Steer.step("invalid")})
    assert steering.avoids("cast_write:scales")
    assert steering.avoids("cast_write:scales", variant="mla:fp4")
    assert steering.avoids("invalid", family="noop") and steering.avoids("invalid", variant="dsa")
    assert not steering.avoids("write_mla:slot0")


def test_a_tier_steer_applies_where_the_asker_says_its_selector_does() -> None:
    steering = Steering(
        {
            Steer("allocator:one_side_refused", "swa"),
            Steer("host:contiguous_buf_infos", "latent"),
            Steer("host:indexer_bytes_held", "dsa"),
            Steer("host:storage_pages", "mha:mxfp8"),
        }
    )
    assert steering.avoids("allocator:one_side_refused", where="swa")
    assert not steering.avoids("allocator:one_side_refused", where="pure_swa")
    assert not steering.avoids("allocator:one_side_refused")
    assert steering.avoids("host:contiguous_buf_infos", where="latent")
    assert steering.avoids("host:indexer_bytes_held", family="dsa")
    assert not steering.avoids("host:indexer_bytes_held", family="mla")
    assert steering.avoids("host:storage_pages", variant="mha:mxfp8")
    assert not steering.avoids("host:storage_pages", variant="mha:mxfp8:flat")
    assert not steering.avoids("allocator:free_dead_window", where="swa")


def test_mentions_says_whether_any_steer_of_a_kind_is_there() -> None:
    steering = Steering({Steer("v_head_dim", "mha:cpu_fp8")})
    assert steering.mentions("v_head_dim") and not steering.mentions("slot0")


# --- the values ----------------------------------------------------------------------------


def test_str_is_the_tag_text_and_tells_every_steer_apart() -> None:
    """``str(steer)`` is the tag the docs quote; no two steers share one."""
    assert [
        str(steer)
        for steer in (
            Steer.step("move", "dsa:kpool"),
            Steer("read:get_value_buffer", "mla:fp4"),
            Steer("accounting:compress_tails", "dsa"),
            Steer("cast_write:scales"),
            Steer("allocator:free_dead_window", "swa"),
            Steer("host:few_pages", "page_major"),
            Steer("host:storage_pages", "mha:mxfp8"),
        )
    ] == [
        "dsa:kpool:move",
        "mla:fp4:read:get_value_buffer",
        "dsa:accounting:compress_tails",
        "cast_write:scales",
        "allocator:swa:free_dead_window",
        "host:page_major:few_pages",
        "host:mha:mxfp8:storage_pages",
    ]
    every = [Steer(what, where) for what, kind in STEER_KINDS.items() for where in kind.wheres]
    assert len({str(steer) for steer in every}) == len(every)


def test_steering_is_a_frozenset_of_steers() -> None:
    """Equal to the frozenset of its steers, its unions are Steerings, and it pickles."""
    a, b = Steer.step("move", "dsa"), Steer("slot0", "mha:mxfp8")
    steering = Steering({a})
    assert steering == frozenset({a}) and hash(steering) == hash(frozenset({a}))
    for union in (steering | {b}, frozenset({b}) | steering):
        assert type(union) is Steering and union.avoids("slot0", variant="mha:mxfp8")
    assert Steering(steering) is steering
    again = pickle.loads(pickle.dumps(steering))
    assert again == steering and again.avoids("move", variant="dsa:kpool")
    assert repr(Steering()) == "Steering()"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.where = "mla"  # type: ignore[misc]


def test_steered_tags_gathers_every_findings_steers() -> None:
    first = Finding("A", "a", call="x", steer=frozenset({Steer.step("move", "dsa")}))
    second = Finding("B", "b", call="y", steer=frozenset({Steer("cast_write:scales")}))
    steering = steered_tags(SimpleNamespace(findings=(first, second)))
    assert type(steering) is Steering and steering == first.steer | second.steer


# --- the kinds -----------------------------------------------------------------------------


def test_the_step_kinds_are_the_machines_steps() -> None:
    assert tuple(kind for kind, _ in _STEP_KINDS if kind != "pause") == STEP_KINDS
    assert set(OP_KINDS) <= set(STEP_KINDS)


def test_every_kind_says_where_it_applies_and_what_it_avoids() -> None:
    families = set(POOL_FAMILIES)
    for what, kind in STEER_KINDS.items():
        assert kind.wheres and kind.where and kind.means, what
        assert set(kind.wheres) <= {"", *variant_names(), "swa", "latent", "page_major"}, what
    assert set(STEER_KINDS["host_copy:request"].wheres) == {"", *families}
    assert set(STEER_KINDS["allocator:one_side_refused"].wheres) <= set(ALLOCATOR_KINDS)
    assert set(STEER_KINDS["host:indexer_bytes_held"].wheres) <= set(HOST_FAMILIES)


def _asked_kinds() -> list[tuple[str, int, str]]:
    """Every literal kind the package asks ``avoids`` or ``mentions`` about."""
    asked = []
    package = Path(kvcheck.__file__).parent
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("avoids", "mentions")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                asked.append((str(path.relative_to(package)), node.lineno, node.args[0].value))
    return asked


def test_every_kind_the_package_asks_about_is_a_steer_kind() -> None:
    """A misspelt kind would never be steered: the code asks only about kinds that exist
    (and every kind is asked about somewhere)."""
    asked = _asked_kinds()
    assert len(asked) > 10
    assert [entry for entry in asked if entry[2] not in STEER_KINDS] == []
    unasked = set(STEER_KINDS) - set(STEP_KINDS) - {what for _, _, what in asked}
    assert unasked == set()
