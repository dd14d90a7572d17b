"""The discrepancies between sglang 0.5.23 and kvcheck's contracts that the suite finds.

:data:`FINDINGS` summarizes each one under the id its section has in
``docs/sglang-findings.md``; :data:`SGLANG_FINDINGS` declares each as a
:class:`~kvcheck.targets.findings.Finding` matched by the failure it causes (the property,
the method, the kind of difference), never by a test id. While the suite runs on sglang,
a matching failure is steered around and the property keeps checking everything else;
any other failure fails the run. Every finding is pinned by the tests it names, in the
shipped suite where one exists (``test_each_rule_alone_rejects[backend-triton]``) and
otherwise in the repository's ``tests/targets/test_sglang_findings.py``: those run as
strict expected failures that must fail with exactly that finding, so a fix shows as
XPASS(strict) until the finding is removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kvcheck.specs import POOL_VARIANTS
from kvcheck.targets.findings import Finding

FINDINGS_DOC = "docs/sglang-findings.md"

#: Finding id -> one-line summary (details, reproductions and class in FINDINGS_DOC).
FINDINGS: Mapping[str, str] = MappingProxyType(
    {
        "V2": "the FA-backend rejection names no backend flag",
        "P1": "a draft MHA worker under the flag gets the no-op pool",
        "K1": "a skip-topk field <= 0 raises AssertionError, not ValueError",
        "C3": "max_total_num_tokens ignores the padding page, so its pools overshoot the budget",
        "C4": "fp8 DSA sizing asserts kv_lora_rank % 128 == 0",
        "A1": "MHA get_kv_size_bytes and mem_usage leave out the page padding of the fused "
        "K/V allocation (a size that is not whole pages)",
        "L1": "HND MHA pools (SGLANG_USE_HND_KVCACHE) refuse get_cpu_copy and load_cpu_copy "
        "with AssertionError",
        "L2": "HND MHA pools refuse get_contiguous_buf_infos with AssertionError",
        "N1": "the no-op pool's load_cpu_copy is MHA's: no RuntimeError",
        "N3": "the no-op pool's get_cpu_copy indexes its one-page placeholders",
        "N4": "the no-op pool's get_contiguous_buf_infos raises AttributeError",
        "N5": "the no-op pool inherits set_kv_buffer_prefix_valid: no RuntimeError when "
        "nothing is committed (on CUDA its kernel would write through the placeholders)",
        "W1": "set_kv_buffer divides the caller's tensor in place by k_scale / v_scale",
        "M1": "set_mla_kv_buffer drops every write to slot 0",
        "H1": "DSA host copies move index-K by whole pages: a partial last page's other "
        "tokens are overwritten, and a second request's pages can be missed",
        "T1": "move_kv_cache on a DSA pool with index_kpool > 1 moves the latent rows, then "
        "fails an assert on the index keys: AssertionError with half a move done",
        "T2": "DSA get_kv_size_bytes and mem_usage leave out the kpool compress tails",
        "T3": "on a CPU pool, get_cpu_copy hands out views of a request's compress tails "
        "(.to('cpu') does not copy there): later tail writes change the saved copy",
        "R1": "under decode context parallel, MLA/DSA set_kv_buffer is refused by an assert "
        "(AssertionError, and no refusal at all under python -O), not an error",
        "R2": "under decode context parallel, move_kv_cache takes physical rows while writes "
        "and host copies take widened ids (its speculative-decoding callers pass widened ids)",
        "I": "pool calls do not validate input: no ValueError for bad locations, layers, "
        "shapes or lengths (I1-I10)",
        "S1": "a refused SWA alloc_decode keeps the page the other side handed out",
        "S2": "at page size 1, SWA free after free_swa frees the padding slot 0 on the "
        "sliding-window side",
        "B1": "the DSA index-K host pool holds one index page per layer more than it declares",
        "B3": "the DSA index-K host pool refuses get_page_buffer_meta in layer_first "
        "(ValueError), where its MLA anchor describes its pages",
        "B2": "MLA host pools outside layer_first build their per-layer views from pages or "
        "token rows: get_contiguous_buf_infos describes the wrong bytes, and page_first_direct "
        "with fewer host pages than layers fails to build",
    }
)


#: Suite test patterns and the findings that make them fail on sglang 0.5.23.
#: Tests the target expects to fail as a whole (node-id pattern -> reason). Only one is
#: left: C3 shows in every example of the capacity property (every budget meets the
#: missing padding page), so no example is left to steer to; the finding is pinned by
#: its own tests like the rest. Every other test keeps checking on sglang.
EXPECTED_FAILURES: Mapping[str, str] = MappingProxyType(
    {
        "test_serving_configurator.py::test_capacity_fits_its_budget": (
            "sglang 0.5.23 C3: max_total_num_tokens ignores the padding page, so its pools "
            "overshoot the budget in every example (also C4; see "
            f"{FINDINGS_DOC}#c3)"
        ),
    }
)


def _pinned(*patterns: str) -> tuple[str, ...]:
    return tuple(f"test_sglang_findings.py::{pattern}" for pattern in patterns)


def _finding(finding_id: str, pinned: tuple[str, ...] = (), **signature: Any) -> Finding:
    """The finding ``finding_id`` with its summary from :data:`FINDINGS`, pinned by
    ``pinned`` or else by its own tests (``test_<id>_*`` in the findings test file)."""
    return Finding(
        finding_id,
        FINDINGS[finding_id],
        pinned=pinned or _pinned(f"test_{finding_id.lower()}_*"),
        **signature,
    )


#: Every finding the suite makes on sglang 0.5.23, each matched by the failure it causes. The
#: suite steers around them (``steer`` tags, :data:`kvcheck.machines.STEER_TAGS`, or by
#: rejecting the example) and keeps checking the rest; each is pinned by the tests named
#: in ``pinned``, which must fail with exactly it.
SGLANG_FINDINGS: tuple[Finding, ...] = (
    _finding(
        "N1",
        check="raises",
        call="load_cpu_copy",
        family="noop",
        steer=frozenset({"noop:host_reload"}),
    ),
    _finding(
        "N3",
        check="raises",
        call="get_cpu_copy",
        family="noop",
        steer=frozenset({"noop:host_copy"}),
    ),
    _finding(
        "L1",
        check="raises",
        call="*_cpu_copy",
        kind="AssertionError*",
        family="mha:hnd",
        steer=frozenset({"mha:hnd:host_copy", "mha:hnd:host_reload"}),
    ),
    _finding(
        "L2",
        check="contiguous_buf_infos",
        call="get_contiguous_buf_infos",
        kind="raises AssertionError",
        family="mha:hnd",
        steer=frozenset({"mha:hnd:contiguous_buf_infos"}),
    ),
    _finding(
        "N4",
        check="contiguous_buf_infos",
        call="get_contiguous_buf_infos",
        kind="raises*",
        family="noop",
        steer=frozenset({"noop:contiguous_buf_infos"}),
    ),
    _finding(
        "N5",
        check="raises",
        call="set_kv_buffer_prefix_valid",
        family="noop",
        steer=frozenset({"noop:write_prefix_valid"}),
    ),
    _finding(
        "W1",
        check="caller_tensors",
        call="set_kv_buffer",
        kind="data changed",
        steer=frozenset({"cast_write:scales"}),
    ),
    _finding(
        "M1",
        check="bytes",
        call="set_mla_kv_buffer",
        kind="kv_buffer differs at row 0",
        steer=frozenset({"write_mla:slot0"}),
    ),
    _finding(
        "H1",
        check="bytes",
        call="load_cpu_copy",
        kind="index_k_with_scale_buffer differs*",
        family="dsa",
        steer=frozenset({"dsa:host_copy:partial_pages"}),
    ),
    _finding(
        "V2",
        check="validation",
        call="validate_server_args",
        kind="an error naming rules () instead of rule fa_prefill_backend",
        pinned=tuple(
            f"test_serving_validation.py::{case}"
            for case in (
                "test_each_rule_alone_rejects[backend-triton]",
                "test_each_rule_alone_rejects[prefill-backend-flashinfer]",
                "test_each_rule_alone_rejects[fa3-with-fp8_e5m2-becomes-triton]",
                "test_each_rule_alone_rejects[default-backend-sm100]",
                "test_each_rule_alone_rejects[default-backend-cpu]",
                "test_named_models_with_the_default_backend[deepseek-v3.2]",
                "test_named_models_with_the_default_backend[glm-5.2-like]",
            )
        ),
    ),
    _finding(
        "P1",
        check="selection",
        call="select_pool_family",
        kind="built noop instead of mha for a draft worker",
        pinned=("test_serving_selection.py::test_named_models[qwen3-embedding-8b-flag-on-draft]",),
    ),
    _finding(
        "K1",
        check="skip_rule",
        call="dsa_layer_skips_topk",
        kind="AssertionError instead of ValueError",
    ),
    _finding(
        "A1",
        check="accounting",
        kind="fused K/V page padding unreported",
        family="mha",
    ),
    _finding(
        "C3",
        check="capacity",
        kind="over the budget by less than a page*",
        pinned=(
            *_pinned("test_c3_*"),
            # every named budget, the 1 GiB fp8 one included now that kvcheck sizes the
            # scaled fp8 DSA row as sglang does (C1, retired)
            "test_serving_configurator.py::test_named_capacities_fit[*]",
        ),
    ),
    _finding(
        "C4",
        kind="raised AssertionError (dsa float8_e4m3fn*",
    ),
    # T1 before I: its AssertionError also reads as "instead of ValueError".
    _finding(
        "T1",
        check="raises",
        call="move_kv_cache",
        kind="AssertionError instead of ValueError",
        family="*kpool*",
        steer=frozenset(f"{variant}:move" for variant in POOL_VARIANTS if "kpool" in variant),
    ),
    _finding(
        "T2",
        check="accounting",
        kind="compress tails unreported",
        family="*kpool*",
        steer=frozenset({"dsa:accounting:compress_tails"}),
    ),
    _finding(
        "T3",
        check="host_copy",
        call="get_cpu_copy",
        kind="copy shares memory with _compress_tail_*",
        family="*kpool*",
        steer=frozenset({"dsa:host_copy:request"}),
    ),
    _finding(
        "R1",
        check="raises",
        call="set_kv_buffer",
        kind="AssertionError instead of RuntimeError",
        family="*dcp",
        # set_kv_buffer is drawn on raw latent rows only (a scaled row refuses it anyway).
        steer=frozenset(
            f"{variant}:{kind}"
            for variant in POOL_VARIANTS
            if variant.endswith(":dcp") and "scaled" not in variant
            for kind in ("write_kv", "cast_write_kv")
        ),
    ),
    # Any failure of a move on a DCP pool: treating widened ids as rows shows as an
    # IndexError (an id past the rows) or as the wrong rows moved (a bytes difference).
    _finding(
        "R2",
        call="move_kv_cache",
        family="*dcp",
        # DCP pools with a kpool refuse moves (T1 steers those).
        steer=frozenset(
            f"{variant}:move"
            for variant in POOL_VARIANTS
            if variant.endswith(":dcp") and "kpool" not in variant
        ),
    ),
    _finding(
        "S1",
        check="refusal",
        call="alloc_decode",
        kind="refusal changed the allocator",
        family="allocator:swa",
        steer=frozenset({"allocator:swa:one_side_refused"}),
    ),
    _finding(
        "S2",
        check="available_size",
        call="free",
        family="allocator:swa",
        steer=frozenset({"allocator:swa:free_dead_window"}),
    ),
    _finding(
        "B1",
        check="buffer_infos",
        call="get_size_per_token",
        kind="bytes held differ",
        family="host:dsa*",
        steer=frozenset({"host:dsa:indexer_bytes_held"}),
    ),
    _finding(
        "B2",
        pinned=_pinned("test_b2_*[mla]"),
        check="buffer_infos",
        call="get_contiguous_buf_infos",
        kind="regions differ",
        family="host:mla:page_first*",
        steer=frozenset(
            {"host:latent:page_first_direct:few_pages", "host:latent:contiguous_buf_infos"}
        ),
    ),
    Finding(
        "B2.dsa",
        FINDINGS["B2"],
        pinned=_pinned("test_b2_*[dsa]"),
        check="buffer_infos",
        call="get_contiguous_buf_infos",
        kind="regions differ",
        family="host:dsa*",
        steer=frozenset({"host:latent:contiguous_buf_infos"}),
    ),
    _finding(
        "B3",
        check="buffer_infos",
        call="get_page_buffer_meta",
        kind="raises ValueError",
        family="host:dsa*",
        steer=frozenset({"host:dsa:indexer_layer_first_page_meta"}),
    ),
    _finding(
        "I",
        check="raises",
        kind="*instead of ValueError",
        pinned=_pinned("test_i_bad_operation_is_rejected[*]", "test_i9_*"),
    ),
)
