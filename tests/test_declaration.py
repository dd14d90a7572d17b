"""A target's declaration (kvcheck.declaration): typed rows, one per key, read by the surface,
the host tiers, the capabilities and reach."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvcheck.declaration import (
    Builds,
    Declaration,
    Key,
    Reason,
    Refuses,
    Row,
    Unreached,
    declaration_of,
)
from kvcheck.surface import Surface
from kvcheck.targets import check_target
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.tiers import ALLOCATOR_KINDS
from kvcheck.variants import VARIANTS


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Key.variant("mha:fp9"), "variant 'mha:fp9' is not one of"),
        (lambda: Key.tier("disk", "mha"), "tier='disk' not in"),
        (lambda: Key.tier("allocator", "buddy"), "allocator kind 'buddy' not in"),
        (lambda: Key.tier("host", "mha:fp9"), "variant 'mha:fp9' is not one of"),
        (lambda: Key.capability("teleport"), "capability='teleport' not in"),
        (lambda: Key.upstream("no_colon"), "is not 'module:qualified.name'"),
    ],
)
def test_a_key_names_only_what_exists(make: object, words: str) -> None:
    """Keys are checked on construction, each message naming the value and what is allowed."""
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        make()  # type: ignore[operator]


def test_a_declaration_takes_one_row_per_key_and_typed_statuses() -> None:
    key = Key.variant("mla:fp4")
    with pytest.raises(ValueError, match="two rows for variant mla:fp4"):
        Declaration(rows=(Row(key, Builds("a")), Row(key, Refuses("b"))))
    with pytest.raises(ValueError, match="is not a Row with a status"):
        Declaration(rows=(Row(key, "built"),))  # type: ignore[arg-type]


def test_a_refusal_holds_on_its_releases_and_names_the_release() -> None:
    row = Row(Key.capability("input_validation"), Refuses("{release} checks nothing", {"1.0"}))
    declaration = Declaration(rows=(row,))
    assert dict(declaration.unsupported("1.0")) == {"input_validation": "1.0 checks nothing"}
    assert dict(declaration.unsupported("2.0")) == {}


def test_choices_that_are_not_families_are_not_unsupported_capabilities() -> None:
    declaration = Declaration(
        rows=(
            Row(Key.capability("quantized_configurator", "nvfp4"), Refuses("GPU only")),
            Row(Key.capability("quantized_configurator", "mla"), Refuses("no MLA MXFP8")),
        )
    )
    assert dict(declaration.unsupported()) == {"quantized_configurator:mla": "no MLA MXFP8"}
    assert dict(declaration.refused_choices("quantized_configurator")) == {"nvfp4": "GPU only"}


def test_refused_variants_narrow_the_surface_only_where_no_built_variant_needs_the_value() -> None:
    """Refusing ``mha:hnd`` keeps ``hnd`` while ``mha:fp8_scaled:hnd`` is built; refusing
    both drops it, with both reasons in the note."""
    one = Declaration(rows=(Row(Key.variant("mha:hnd"), Refuses("a")),))
    assert one.surface(Surface.everything()).values("mha", "kv_layout") == ("nhd", "hnd")
    both = Declaration(
        rows=(
            Row(Key.variant("mha:hnd"), Refuses("no HND")),
            Row(Key.variant("mha:fp8_scaled:hnd"), Refuses("no fp8 HND")),
        )
    )
    surface = both.surface(Surface.everything())
    assert surface.values("mha", "kv_layout") == ("nhd",)
    assert surface.note("mha", "kv_layout") == "hnd: no HND; fp8_scaled:hnd: no fp8 HND"


def test_host_tier_rows_say_the_layouts_of_a_variant() -> None:
    declaration = Declaration(
        rows=(
            Row(Key.tier("host", "mha:mxfp8"), Builds("page_first", only=("page_first",))),
            Row(Key.tier("host", "mla:fp4"), Refuses("no FP4 host tier")),
        )
    )
    assert dict(declaration.host_variant_layouts()) == {
        "mha:mxfp8": (("page_first",), "page_first"),
        "mla:fp4": ((), "no FP4 host tier"),
    }


def test_allocator_rows_say_the_page_sizes_of_a_kind_and_drop_refused_kinds() -> None:
    """An allocator row narrows its kind's page sizes or refuses the kind; the surface then
    leaves a refused kind out, noted with why."""
    declaration = Declaration(
        rows=(
            Row(Key.tier("allocator", "swa"), Builds("token sides", only=(1,))),
            Row(Key.tier("allocator", "paged"), Refuses("Triton only")),
            Row(Key.tier("allocator", "token"), Builds("every page size it takes")),
        )
    )
    assert dict(declaration.allocator_page_sizes()) == {
        "swa": ((1,), "token sides"),
        "paged": ((), "Triton only"),
    }
    surface = declaration.surface(Surface.everything().with_tiers(allocators=ALLOCATOR_KINDS))
    assert surface.allocators == ("token", "swa", "pure_swa")
    assert surface.notes["allocators.paged"] == "Triton only"


def test_unreached_code_round_trips_through_its_row() -> None:
    reason = Reason("srt/pool.py", "Pool.write", "GPU only", pattern=r"cuda")
    assert reason.row.status == Unreached("GPU only")
    assert Declaration(rows=(reason.row,)).unreached_code() == (reason,)


def test_a_target_without_a_declaration_gets_its_surface_rows() -> None:
    """kvcheck's own target builds every variant; a narrower surface refuses the rest,
    quoting its note."""
    builtin = declaration_of(KVCheckTarget())
    assert all(isinstance(builtin.status(Key.variant(v.name)), Builds) for v in VARIANTS)
    surface = Surface.baseline().with_notes({"dsa.index_kpool": "my kernels take one key"})
    narrow = declaration_of(SimpleNamespace(name="t", surface=surface))
    assert narrow.why_not(Key.variant("dsa:kpool")) == "my kernels take one key"


def test_a_declaration_of_the_wrong_type_is_a_target_problem() -> None:
    target = SimpleNamespace(name="t", version="1", unsupported={}, declaration={"mha": "x"})
    problems = check_target(target)
    assert any("declaration=" in problem for problem in problems), problems
