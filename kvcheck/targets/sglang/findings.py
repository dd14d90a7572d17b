"""The discrepancies between sglang and kvcheck's contracts that the suite finds, and the
sglang releases each holds for.

:data:`SGLANG_FINDINGS` declares each one, one row per finding, under the id it has in
``docs/sglang-findings.md`` (the index; bugs and preconditions have an issue file in
``docs/sglang-findings/``, the rest an entry in ``docs/sglang-findings-appendix.md``): its
class, the releases it holds for, its summary and, as a
:class:`~kvcheck.targets.findings.Finding`, the failure it causes (the property, the
method, the kind of difference), never a test id; :data:`FINDINGS`, :data:`CLASSES` and
:data:`RELEASES` are views of it. While the suite runs on sglang,
a matching failure is steered around and the property keeps checking everything else;
any other failure fails the run. Every finding is pinned by the tests it names, in the
shipped suite where one exists (``test_each_rule_alone_rejects[backend-triton]``) and
otherwise in the repository's ``tests/targets/test_sglang_findings.py``: those run as
strict expected failures that must fail with exactly that finding, so a fix shows as
XPASS(strict) until the finding is removed.

Whether a release has a bug is not something the target can read from it: each row
says the releases it holds for (checked on each of
:data:`~.release.KNOWN_RELEASES`; a range open at the end holds for newer releases until a
run shows otherwise). The target declares only the findings (:func:`findings_for`) and
expected failures (:func:`expected_failures_for`) that hold for the installed release: on
a release where a finding is fixed, its pinned tests run as plain tests and must pass.

Example:
    >>> sorted(f.id for f in findings_for("0.5.21") if f.id not in [g.id for g in
    ...        findings_for("0.5.23")])
    ['B4', 'D21', 'PV1', 'PV1.cpu_fp8', 'PV1.fp4_mx_block16', 'X1']
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kvcheck.steering import Steer
from kvcheck.targets.findings import Finding
from kvcheck.targets.sglang.release import Releases
from kvcheck.variants import variant_names

FINDINGS_DOC = "docs/sglang-findings.md"
#: Where the issue file of a bug or precondition lives (``<id>`` lower-case).
ISSUE_FILE = "docs/sglang-findings/{id}.md"

#: Every release checked.
_ALL = Releases()

#: The classes of docs/sglang-findings.md, most severe first.
CLASS_ORDER: tuple[str, ...] = ("serving bug", "latent bug", "precondition", "contract difference")


def _pinned(*patterns: str) -> tuple[str, ...]:
    return tuple(f"test_sglang_findings.py::{pattern}" for pattern in patterns)


#: Severity, releases and summary of each finding declared so far, for its parts.
_DECLARED: dict[str, Finding] = {}


def _finding(
    finding_id: str,
    severity: str,
    releases: Releases,
    summary: str,
    pinned: tuple[str, ...] = (),
    **signature: Any,
) -> Finding:
    """The finding ``finding_id``: its class (:data:`CLASS_ORDER`), the releases it holds
    for, its summary and, where a suite test meets it, the failure it causes, pinned by
    ``pinned`` or else by its own tests (``test_<id>_*`` in the findings test file)."""
    if severity not in CLASS_ORDER:
        raise ValueError(f"finding {finding_id}: severity={severity!r} not in {CLASS_ORDER}")
    signed = any(signature.get(name) for name in ("check", "call", "kind", "family"))
    finding = Finding(
        finding_id,
        summary,
        severity=severity,
        releases=releases,
        pinned=pinned or (_pinned(f"test_{finding_id.lower()}_*") if signed else ()),
        **signature,
    )
    _DECLARED[finding_id] = finding
    return finding


def _part(parent_id: str, part_id: str, **signature: Any) -> Finding:
    """Another failure of finding ``parent_id`` (declared just before), on another variant
    or path, with its own signature and pins."""
    parent = _DECLARED[parent_id]
    return Finding(
        part_id, parent.summary, severity=parent.severity, releases=parent.releases, **signature
    )


#: Every finding kvcheck makes on some checked sglang release, one row each: its id (as in
#: docs/sglang-findings.md), its class, the releases it holds for (checked on each of
#: :data:`~.release.KNOWN_RELEASES` with ``python tools/across.py``; whether a release has a
#: bug is read from running it, recorded here), its summary and, where a suite test meets
#: it, the failure it causes (``Q16``, ``G1`` and ``G2`` only show in their scripts).
#: Classes are checked against sglang 0.5.23's source: a bug is "serving" where a served
#: configuration reaches it (read from the source where no server was run). The suite
#: steers around them (``steer``, :class:`kvcheck.steering.Steer` values, or by rejecting the
#: example) and keeps checking the rest; each is pinned by the tests named in ``pinned``,
#: which must fail with exactly it.
SGLANG_FINDINGS: tuple[Finding, ...] = (
    _finding(
        "N1",
        "contract difference",
        _ALL,
        "the no-op pool's load_cpu_copy is MHA's: no RuntimeError",
        check="raises",
        call="load_cpu_copy",
        family="noop",
        steer=frozenset({Steer.step("host_reload", "noop")}),
    ),
    _finding(
        "N3",
        "contract difference",
        _ALL,
        "the no-op pool's get_cpu_copy indexes its one-page placeholders",
        check="raises",
        call="get_cpu_copy",
        family="noop",
        steer=frozenset({Steer.step("host_copy", "noop")}),
    ),
    _finding(
        "L1",
        "precondition",
        _ALL,
        "HND MHA pools (SGLANG_USE_HND_KVCACHE) refuse get_cpu_copy and load_cpu_copy with "
        "AssertionError",
        check="raises",
        call="*_cpu_copy",
        kind="AssertionError*",
        family="*:hnd",  # mha:hnd and mha:fp8_scaled:hnd
        steer=frozenset(
            Steer.step(kind, variant)
            for variant in ("mha:hnd", "mha:fp8_scaled:hnd")
            for kind in ("host_copy", "host_reload")
        ),
    ),
    _finding(
        "L2",
        "contract difference",
        _ALL,
        "HND MHA pools refuse get_contiguous_buf_infos with AssertionError",
        check="contiguous_buf_infos",
        call="get_contiguous_buf_infos",
        kind="raises AssertionError",
        family="*:hnd",
        steer=frozenset(
            Steer("contiguous_buf_infos", variant) for variant in ("mha:hnd", "mha:fp8_scaled:hnd")
        ),
    ),
    _finding(
        "N4",
        "latent bug",
        _ALL,
        "the no-op pool's get_contiguous_buf_infos raises AttributeError",
        check="contiguous_buf_infos",
        call="get_contiguous_buf_infos",
        kind="raises*",
        family="noop",
        steer=frozenset({Steer("contiguous_buf_infos", "noop")}),
    ),
    _finding(
        "N5",
        "contract difference",
        _ALL,
        "the no-op pool inherits set_kv_buffer_prefix_valid: no RuntimeError when nothing is "
        "committed (on CUDA its kernel would write through the placeholders)",
        check="raises",
        call="set_kv_buffer_prefix_valid",
        family="noop",
        steer=frozenset({Steer.step("write_prefix_valid", "noop")}),
    ),
    _finding(
        "W1",
        "serving bug",
        _ALL,
        "set_kv_buffer divides the caller's tensor in place by k_scale / v_scale",
        check="caller_tensors",
        call="set_kv_buffer",
        kind="data changed",
        steer=frozenset({Steer("cast_write:scales")}),
    ),
    _finding(
        # M1, Q13: slot 0 is sglang's padding slot, whose contents nothing reads. I (I1-I10):
        # caller errors, I10 (an index-K write to a skip layer) included.
        "M1",
        "contract difference",
        _ALL,
        "set_mla_kv_buffer drops every write to slot 0",
        check="bytes",
        call="set_mla_kv_buffer",
        kind="kv_buffer differs at row 0",
        steer=frozenset({Steer("write_mla:slot0")}),
    ),
    _finding(
        "H1",
        "precondition",
        _ALL,
        "DSA host copies move index-K by whole pages: a partial last page's other tokens are "
        "overwritten, and a second request's pages can be missed",
        check="bytes",
        call="load_cpu_copy",
        kind="index_k_with_scale_buffer differs*",
        family="dsa",
        steer=frozenset({Steer("host_copy:partial_pages", "dsa")}),
    ),
    _finding(
        "V2",
        "contract difference",
        _ALL,
        "the FA-backend rejection names no backend flag",
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
        "latent bug",
        _ALL,
        "a draft MHA worker under the flag gets the no-op pool",
        check="selection",
        call="select_pool_family",
        kind="built noop instead of mha for a draft worker",
        pinned=("test_serving_selection.py::test_named_models[qwen3-embedding-8b-flag-on-draft]",),
    ),
    _finding(
        "K1",
        "contract difference",
        _ALL,
        "a skip-topk field <= 0 raises AssertionError, not ValueError",
        check="skip_rule",
        call="dsa_layer_skips_topk",
        kind="AssertionError instead of ValueError",
    ),
    _finding(
        # 0.5.23 allocates fused K/V halves padded to whole pages; earlier releases pad nothing.
        "A1",
        "latent bug",
        Releases(first="0.5.23"),
        "MHA get_kv_size_bytes and mem_usage leave out the page padding of the fused K/V "
        "allocation (a size that is not whole pages)",
        check="accounting",
        kind="fused K/V page padding unreported",
        family="mha*",  # the plain pool and the fp8 one with per-tensor scales (same code)
    ),
    _finding(
        "C3",
        "serving bug",
        _ALL,
        "max_total_num_tokens ignores the padding page, so its pools overshoot the budget",
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
        "contract difference",
        _ALL,
        "fp8 DSA sizing asserts kv_lora_rank % 128 == 0",
        kind="raised AssertionError (dsa float8_e4m3fn*",
    ),
    # T1 before I and X1: its error also reads as "instead of ValueError" (0.5.23: an
    # AssertionError; 0.5.22: X1's IndexError, after the latent rows moved all the same).
    _finding(
        # 0.5.21 and 0.5.22 fail the kpool move with X1's IndexError after the latent rows
        # moved, 0.5.23 asserts.
        "T1",
        "serving bug",
        _ALL,
        "move_kv_cache on a DSA pool with index_kpool > 1 moves the latent rows, then fails on "
        "the index keys (0.5.23: an assert; 0.5.22: an IndexError): half a move done",
        check="raises",
        call="move_kv_cache",
        kind="*instead of ValueError",
        family="*kpool*",
        steer=frozenset(
            Steer.step("move", variant) for variant in variant_names() if "kpool" in variant
        ),
    ),
    _finding(
        # 0.5.21's pool has them too (its scripts show it), though the target builds no
        # kpool pool there (it keeps a key per token): their pins skip on it, saying why.
        "T2",
        "serving bug",
        _ALL,
        "DSA get_kv_size_bytes and mem_usage leave out the kpool compress tails",
        check="accounting",
        kind="compress tails unreported",
        family="*kpool*",
        steer=frozenset({Steer("accounting:compress_tails", "dsa")}),
    ),
    _finding(
        "T3",
        "latent bug",
        _ALL,
        "on a CPU pool, get_cpu_copy hands out views of a request's compress tails (.to('cpu') "
        "does not copy there): later tail writes change the saved copy",
        check="host_copy",
        call="get_cpu_copy",
        kind="copy shares memory with _compress_tail_*",
        family="*kpool*",
        steer=frozenset({Steer("host_copy:request", "dsa")}),
    ),
    _finding(
        "R1",
        "contract difference",
        _ALL,
        "under decode context parallel, MLA/DSA set_kv_buffer is refused by an assert "
        "(AssertionError, and no refusal at all under python -O), not an error",
        check="raises",
        call="set_kv_buffer",
        kind="AssertionError instead of RuntimeError",
        family="*dcp",
        # set_kv_buffer is drawn on raw latent rows only (a scaled row refuses it anyway).
        steer=frozenset(
            Steer.step(kind, variant)
            for variant in variant_names()
            if variant.endswith(":dcp") and "scaled" not in variant
            for kind in ("write_kv", "cast_write_kv")
        ),
    ),
    # Any failure of a move on a DCP pool: treating widened ids as rows shows as an
    # IndexError (an id past the rows) or as the wrong rows moved (a bytes difference).
    _finding(
        "R2",
        "serving bug",
        _ALL,
        "under decode context parallel, move_kv_cache takes physical rows while writes and host"
        " copies take widened ids (its speculative-decoding callers pass widened ids)",
        call="move_kv_cache",
        family="*dcp",
        # DCP pools with a kpool refuse moves (T1 steers those).
        steer=frozenset(
            Steer.step("move", variant)
            for variant in variant_names()
            if variant.endswith(":dcp") and "kpool" not in variant
        ),
    ),
    # X1 after T1 and R2: on a release with X1, their own failures are theirs.
    _finding(
        # Fixed in 0.5.23 (the move copies each token's key and scale bytes).
        "X1",
        "serving bug",
        Releases(last="0.5.22"),
        "DSA move_kv_cache moves index-K page rows addressed by token ids: a whole page of keys"
        " lands on another page, or IndexError after the latent rows moved",
        call="move_kv_cache",
        family="dsa*",
        steer=frozenset(
            Steer.step("move", variant) for variant in variant_names() if variant.startswith("dsa")
        ),
    ),
    _finding(
        # Fixed in 0.5.22 (the conversion moved after the non-CUDA branch).
        "PV1",
        "serving bug",
        Releases(last="0.5.21"),
        "on a platform without CUDA, set_kv_buffer_prefix_valid on an fp8 pool converts the "
        "rows to fp8 twice (0.5 is stored as 48.0); on a quant-method pool (cpu_fp8_e4m3, "
        "fp4_mx_block16) the early conversion makes the write raise",
        pinned=_pinned("test_pv1_fp8_*"),
        check="bytes",
        call="set_kv_buffer_prefix_valid",
        family="mha*",
    ),
    # The same early conversion on the quant-method pools: their quantizers are handed rows
    # already in the pool dtype, which torch cannot divide (fp8) or copy (fp4) on CPU.
    *(
        _part(
            "PV1",
            f"PV1.{variant}",
            pinned=_pinned(f"test_pv1_quantized_*[{variant}]"),
            check="raises",
            call="set_kv_buffer_prefix_valid",
            kind="NotImplementedError instead of no exception",
            family=f"mha:{variant}",
            steer=frozenset({Steer.step("write_prefix_valid", f"mha:{variant}")}),
        )
        for variant in ("cpu_fp8", "fp4_mx_block16")
    ),
    _finding(
        # Fixed in 0.5.22 (the default is (size + page_size) * dcp_size - page_size).
        "D21",
        "serving bug",
        Releases(last="0.5.21"),
        "under decode context parallel the default DSA index-K buffer holds a key per physical "
        "token while writes carry widened ids: keys past its end",
        check="bytes",
        kind="index_k_with_scale_buffer differs",
        family="*dcp*",
    ),
    _finding(
        # The suite checks the paged allocator and the SWA one above page size 1 from 0.5.22
        # on (0.5.21's paged allocator is Triton-only), where S1 holds, as s1.py shows; S2
        # is at page size 1, which 0.5.21 builds too. The host pools are built on every
        # release, through its adapter (declaration.HOST_POOL_ADAPTERS): B1-B3 hold on all
        # three (b2.py drives 0.5.23's host-pool API).
        # S1: the scheduler's check_decode_capacity asks available_size(), the smaller side,
        # first; a refusal that still happens is "Decode out of memory".
        "S1",
        "latent bug",
        Releases(first="0.5.22"),
        "a refused SWA alloc_decode keeps the page the other side handed out",
        check="refusal",
        call="alloc_decode",
        kind="refusal changed the allocator",
        family="allocator:swa",
        steer=frozenset({Steer("allocator:one_side_refused", "swa")}),
    ),
    _finding(
        "S2",
        "precondition",
        _ALL,
        "at page size 1, SWA free after free_swa frees the padding slot 0 on the sliding-window"
        " side",
        check="available_size",
        call="free",
        family="allocator:swa",
        steer=frozenset({Steer("allocator:free_dead_window", "swa")}),
    ),
    _finding(
        # M2: sglang's admission asks ensure_mamba_capacity (evicting for slots) and the
        # PrefillAdder's mamba budget first; a refusal that still happens is an assert the
        # scheduler does not survive, so no caller goes on with the row it leaks.
        "M2",
        "latent bug",
        _ALL,
        "a HybridReqToTokenPool.alloc refused for want of a mamba slot keeps the request row "
        "it took first",
        check="linear_hybrid",
        call="req_to_token_pool.alloc",
        kind="refusal changed the pool",
        family="linear_hybrid",
        steer=frozenset({Steer("linear_hybrid:refused_alloc")}),
    ),
    _finding(
        # Every example of the guard meets it (every allocator kind inherits the base
        # class's loop), so the guard's suite test is its pin; no other test frees segments
        # that share a page.
        "F1",
        "latent bug",
        _ALL,
        "free_segments and free_full_segments free each segment before the page-sharing "
        "assert checks the next: a refused call has freed the segments before the one "
        "that shares a page",
        pinned=("test_tier_guards.py::test_allocator_guard_holds[segments_share_page-*]",),
        check="guard",
        call="*segments",
        kind="refusal changed the free space",
    ),
    _finding(
        "B1",
        "contract difference",
        _ALL,
        "the DSA index-K host pool holds one index page per layer more than it declares",
        check="buffer_infos",
        call="get_size_per_token",
        kind="bytes held differ",
        family="host:dsa*",
        steer=frozenset({Steer("host:indexer_bytes_held", "dsa")}),
    ),
    _finding(
        "B2",
        "latent bug",
        # 0.5.21's and 0.5.22's host pools (built through their adapters) fail to build the
        # same way: MHA page_first_direct with fewer host pages than layers.
        _ALL,
        "MLA host pools outside layer_first build their per-layer views from pages or token "
        "rows: get_contiguous_buf_infos describes the wrong bytes, and page_first_direct (MHA: "
        "page_head) with fewer host pages than layers fails to build",
        pinned=_pinned("test_b2_*[mla]"),
        check="buffer_infos",
        call="get_contiguous_buf_infos",
        kind="regions differ",
        family="host:mla:page_first*",
        steer=frozenset(
            {
                Steer("host:few_pages", "page_major"),
                Steer("host:contiguous_buf_infos", "latent"),
            }
        ),
    ),
    _part(
        "B2",
        "B2.dsa",
        pinned=_pinned("test_b2_*[dsa]"),
        check="buffer_infos",
        call="get_contiguous_buf_infos",
        kind="regions differ",
        family="host:dsa*",
        steer=frozenset({Steer("host:contiguous_buf_infos", "latent")}),
    ),
    _finding(
        "B3",
        "contract difference",
        _ALL,
        "the DSA index-K host pool refuses get_page_buffer_meta in layer_first (ValueError), "
        "where its MLA anchor describes its pages",
        check="buffer_infos",
        call="get_page_buffer_meta",
        kind="raises ValueError",
        family="host:dsa*",
        steer=frozenset({Steer("host:indexer_layer_first_page_meta", "dsa")}),
    ),
    _finding(
        # Fixed in 0.5.22 (make_dsa_indexer_pool_decl: shared-topk layers get no host layer
        # and reach no transfer). Latent on 0.5.21: its configurator gives the pool skip
        # layers only without HiCache (_should_elide_dsa_index_k), so no served host tier
        # meets one.
        "B4",
        "latent bug",
        Releases(last="0.5.21"),
        "the DSA index-K host pool keeps a host layer for every device layer, skip-topk layers "
        "(zero-row index buffers) included: its size per token counts them, and backup and "
        "load address their empty device buffers",
        check="buffer_infos",
        call="get_size_per_token",
        kind="size differs",
        family="host:dsa*",
        steer=frozenset({Steer("host:indexer_skip_layers", "dsa")}),
    ),
    _finding(
        # q2-q4.py show Q2-Q4 on 0.5.21 and 0.5.22 as on 0.5.23 (the MLA FP4 pool and its
        # scale buffer are the same); the suite builds the pool where the release has the
        # pieces it needs (release.NEEDS).
        "Q2",
        "serving bug",
        _ALL,
        "MLA FP4 move_kv_cache, get_cpu_copy and load_cpu_copy carry the payload and not "
        "kv_scale_buffer: moved or reloaded tokens keep the target slot's old scales",
        check="bytes",
        kind="kv_scale_buffer differs*",
        family="mla:fp4",
        steer=frozenset(
            Steer.step(kind, "mla:fp4") for kind in ("move", "host_copy", "host_reload")
        ),
    ),
    _finding(
        "Q3",
        "serving bug",
        _ALL,
        "MLA FP4 get_kv_size_bytes and mem_usage leave out kv_scale_buffer (1/9 of the pool), "
        "which the configurator's cell size counts",
        check="accounting",
        kind="scale buffers unreported",
        family="mla:fp4",
        steer=frozenset({Steer("accounting:scales", "mla:fp4")}),
    ),
    _finding(
        "Q4",
        "serving bug",
        _ALL,
        "FP4 pools (MLA FP4, MHA fp4_mx_block16 and nvfp4's linear scales) describe only their "
        "payload for transfer: no scale-buffer descriptor, so a PD decode side receives the "
        "payload without its scales",
        pinned=_pinned("test_q4_mla_*"),
        check="scale_buf_infos",
        call="get_kv_scale_buf_infos",
        family="mla:fp4",
        steer=frozenset({Steer("scale_buf_infos", "mla:fp4")}),
    ),
    _part(
        "Q4",
        "Q4.mha",
        pinned=_pinned("test_q4_mha_*"),
        check="scale_buf_infos",
        call="get_kv_scale_buf_infos",
        family="mha:fp4_mx_block16",
        steer=frozenset({Steer("scale_buf_infos", "mha:fp4_mx_block16")}),
    ),
    # Q4 seen through PD's own registration (setup_state_kv_args registers the payload's
    # description and no scale component for FP4 pools): the census meets it per variant.
    _part(
        "Q4",
        "Q4.pd",
        pinned=_pinned("test_q4_pd_mla_*"),
        check="descriptions",
        call="setup_state_kv_args",
        kind="kv_scale_buffer undescribed",
        family="mla:fp4",
    ),
    _part(
        "Q4",
        "Q4.pd.mha",
        pinned=_pinned("test_q4_pd_mha_*"),
        check="descriptions",
        call="setup_state_kv_args",
        kind="*scale_buffer undescribed",
        family="mha:fp4_mx_block16",
    ),
    _finding(
        # The index keys live in full_kv_pool.index_key_cache.buffer (kind "buffer ...").
        # pd1.py shows it on each release (_build_hybrid_mla_swa_kv_pool, setup_state_kv_args
        # are the same there).
        "PD1",
        "serving bug",
        _ALL,
        "a DSA model's sliding-window hybrid (SWAKVPool, DSA full side) describes and PD "
        "registers no index keys: setup_state_kv_args registers the window side alone, so "
        "the decode side's indexer reads keys the prefill side never sent",
        pinned=_pinned("test_pd1_registration_*"),
        check="descriptions",
        call="setup_state_kv_args",
        kind="buffer undescribed",
        family="swa:dsa",
    ),
    # The same omission in the hybrid's own descriptions (get_contiguous_buf_infos forwards
    # to the full side's latent rows, get_state_buf_infos is the window side's).
    _part(
        "PD1",
        "PD1.descriptions",
        pinned=_pinned("test_pd1_descriptions_*"),
        check="descriptions",
        call="get_*buf_infos",
        kind="buffer undescribed",
        family="swa:dsa",
    ),
    _finding(
        # qs1.py shows it on each release (QSATokenToKVPool inherits HybridLinearKVPool's
        # copies there too). The census meets the ring first (its entries' order).
        "QS1",
        "serving bug",
        _ALL,
        "QSA's hybrid pool inherits the linear hybrid's get_cpu_copy/load_cpu_copy, which "
        "carry the full KV only: a retracted request resumes without its compressed index "
        "keys, pending key ring and RoPE positions",
        check="bytes",
        call="load_cpu_copy",
        kind="qsa_*",
        family="qsa",
    ),
    _finding(
        # hs1.py shows it on each release (_SwaStrategy passes use_mla=False there too).
        # Built with MLA host pools, a DSA full side's indexer would still be left out:
        # the census then fails as "host pool unassembled", a finding of its own.
        "HS1",
        "serving bug",
        _ALL,
        "HiCache for an MLA model with sliding-window layers (SWAKVPool with MLA or DSA "
        "sides, as the configurator builds them) cannot start: the SWA stack strategy builds "
        "MHA host pools for them (use_mla=False) and raises AttributeError",
        pinned=_pinned("test_hs1_*[mla]"),
        check="raises",
        call="hicache_assembly",
        kind="raises AttributeError",
        family="swa:mla",
    ),
    _part(
        "HS1",
        "HS1.dsa",
        pinned=_pinned("test_hs1_*[dsa]"),
        check="raises",
        call="hicache_assembly",
        kind="raises AttributeError",
        family="swa:dsa",
    ),
    # One entry per variant: a V shape that differs on another MHA variant is another bug.
    # The exact kind is a shape difference (a byte difference adds " at row N").
    _finding(
        # q5.py shows Q5 on each release (the quant methods' create_buffers are the same).
        "Q5",
        "serving bug",
        _ALL,
        "MHA pools with a quant method (cpu_fp8_e4m3, fp4_mx_block16) shape V and its scales by"
        " head_dim and ignore v_head_dim, which get_v_head_dim still reports: a V row of "
        "v_head_dim cannot be written",
        pinned=_pinned("test_q5_*[cpu_fp8]"),
        check="bytes",
        kind="v_buffer differs",
        family="mha:cpu_fp8",
        steer=frozenset({Steer("v_head_dim", "mha:cpu_fp8")}),
    ),
    _part(
        "Q5",
        "Q5.fp4",
        pinned=_pinned("test_q5_*[fp4_mx_block16]"),
        check="bytes",
        kind="v_buffer differs",
        family="mha:fp4_mx_block16",
        steer=frozenset({Steer("v_head_dim", "mha:fp4_mx_block16")}),
    ),
    _finding(
        # q6.py shows Q6 on each release (MHATokenToKVPool's host copies are the same).
        "Q6",
        "serving bug",
        _ALL,
        "MHA fp4_mx_block16 get_cpu_copy and load_cpu_copy carry the payload and not "
        "k_scale_buffer/v_scale_buffer (its move_kv_cache carries them): reloaded tokens keep "
        "the target slot's old scales",
        check="bytes",
        kind="*_scale_buffer differs*",
        family="mha:fp4_mx_block16",
        steer=frozenset(
            Steer.step(kind, "mha:fp4_mx_block16") for kind in ("host_copy", "host_reload")
        ),
    ),
    _finding(
        "Q11",
        "contract difference",
        _ALL,
        "MLA FP4 get_value_buffer returns the layer's whole packed FP4 row ([rows, 1, (R+P)/2]:"
        " nope and rope codes, no scales), not the dequantized latent get_key_buffer returns",
        check="read_api",
        call="get_value_buffer",
        family="mla:fp4",
        steer=frozenset({Steer("read:get_value_buffer", "mla:fp4")}),
    ),
    # MHATokenToKVPoolMXFP8 (both layouts, built on CPU through mxfp8_kernels).
    _finding(
        # MHATokenToKVPoolMXFP8: q13-q16.py and the pins show them on each release (the
        # pool's code is the same; 0.5.21 and 0.5.22 keep its kernels in another module).
        "Q13",
        "contract difference",
        _ALL,
        "the MXFP8 pool's writes skip slot 0 (the padding sink), while its moves and reloads "
        "copy slot 0's fp8 payload and skip its interleaved scales: a move or reload into slot "
        "0 leaves the payload beside the old scales",
        check="bytes",
        # Row 0 of a payload buffer is slot 0; of an interleaved scale buffer, page 0.
        kind="*_buffer differs at row 0",
        family="mha:mxfp8*",
        steer=frozenset({Steer("slot0", "mha:mxfp8"), Steer("slot0", "mha:mxfp8:flat")}),
    ),
    _finding(
        "Q14",
        "serving bug",
        _ALL,
        "MXFP8 pools off 128-token pages (flat scales) refuse every set_kv_buffer "
        "(AssertionError: 'requires the page_size=128 interleaved scale layout'), though sglang"
        " builds them, and their moves, reloads and descriptors serve the flat layout",
        check="raises",
        call="set_kv_buffer",
        kind="AssertionError*",
        family="mha:mxfp8:flat",
        steer=frozenset({Steer.step("write_kv", "mha:mxfp8:flat")}),
    ),
    _finding(
        # Q16 has no pin: the target moves on the torch path, where Q15 raises first.
        "Q15",
        "precondition",
        _ALL,
        "flat-scale MXFP8 moves and reloads store the scales by index_put on float8_e8m0fnu, "
        "which a CPU torch lacks: NotImplementedError after the fp8 payload has moved (moves on"
        " sglang's torch move path; its default Triton move asserts without a speculative "
        "algorithm, and raises Q16's AttributeError with one)",
        check="raises",
        kind="NotImplementedError*",
        family="mha:mxfp8:flat",
        steer=frozenset(Steer.step(kind, "mha:mxfp8:flat") for kind in ("move", "host_reload")),
    ),
    _finding(
        "Q12",
        "contract difference",
        _ALL,
        "MLA FP4 set_kv_buffer and set_mla_kv_buffer take no layer_id_override, which their "
        "parent's writes declare and SWAKVPool passes to every MLA pool",
        check="raises",
        kind="TypeError instead of no exception",
        family="mla:fp4",
        steer=frozenset({Steer("layer_id_override", "mla:fp4")}),
    ),
    _finding(
        "I",
        "contract difference",
        _ALL,
        "pool calls do not validate input: no ValueError for bad locations, layers, shapes or "
        "lengths (I1-I10)",
        check="raises",
        kind="*instead of ValueError",
        pinned=_pinned("test_i_bad_operation_is_rejected[*]", "test_i9_*"),
    ),
    # Findings no suite test meets (shown by their scripts only): no signature, no pins.
    _finding(
        # Preconditions found through the CPU stand-ins (no declared Finding: no suite test
        # fails on them; docs/sglang-repros/g1.py, g2.py). Before 0.5.22 set_mla_kv_buffer had
        # no torch path either: writes and reads both needed Triton.
        "G1",
        "precondition",
        Releases(first="0.5.22"),
        "get_mla_kv_buffer needs Triton, while set_mla_kv_buffer has a torch path",
    ),
    _finding(
        "G2",
        "precondition",
        _ALL,
        "DSA host copies call torch.cuda.synchronize() whatever the device",
    ),
    _finding(
        # Q16: a flat-scale MXFP8 pool cannot be written (Q14), so its moves carry nothing.
        "Q16",
        "latent bug",
        _ALL,
        "flat-scale MXFP8 moves raise AttributeError (native_k_scale_buffer, which the MXFP8 "
        "pool never sets) after the fp8 payload has moved: the base move's "
        "_move_native_fp4_scales reads it on every path (shown on the default Triton copy)",
    ),
)


#: Finding id (without a part's suffix) -> its summary, class and releases: views of
#: :data:`SGLANG_FINDINGS` for the findings document and its tests.
FINDINGS: Mapping[str, str] = MappingProxyType(
    {f.id: f.summary for f in SGLANG_FINDINGS if "." not in f.id}
)
CLASSES: Mapping[str, str] = MappingProxyType(
    {f.id: f.severity for f in SGLANG_FINDINGS if "." not in f.id}
)
RELEASES: Mapping[str, Releases] = MappingProxyType(
    {
        f.id: f.releases
        for f in SGLANG_FINDINGS
        if isinstance(f.releases, Releases) and "." not in f.id
    }
)


#: Tests the target expects to fail as a whole (node-id pattern -> reason, releases). Only
#: C3's are left: it shows in every example of the capacity properties (every budget meets
#: the missing padding page), so no example is left to steer to; the finding is pinned by
#: its own tests like the rest. Every other test keeps checking on sglang.
EXPECTED_FAILURES: Mapping[str, tuple[str, Releases]] = MappingProxyType(
    {
        "test_serving_configurator.py::test_capacity_fits_its_budget": (
            "C3: max_total_num_tokens ignores the padding page, so its pools overshoot the "
            f"budget in every example (also C4; see {ISSUE_FILE.format(id='c3')})",
            RELEASES["C3"],
        ),
        # The same property for a quantized --kv-cache-dtype (mxfp8: the dtype the target
        # sizes), and the same missing page in every example.
        "test_serving_configurator.py::test_quantized_capacity_fits_its_budget": (
            "C3: max_total_num_tokens ignores the padding page, so the MXFP8 pools overshoot "
            f"the budget in every example too (see {ISSUE_FILE.format(id='c3')})",
            RELEASES["C3"],
        ),
    }
)


def findings_for(release: str, *, documented: bool = False) -> tuple[Finding, ...]:
    """The findings a suite test meets that hold for sglang ``release`` (their ``releases``),
    in declaration order (which decides the match when several could); ``documented``:
    those only their scripts show too.

    Example:
        >>> "A1" in [finding.id for finding in findings_for("0.5.22")]
        False
        >>> [f.id for f in findings_for("0.5.23", documented=True) if not f.signed]
        ['G1', 'G2', 'Q16']
    """
    return tuple(
        finding
        for finding in SGLANG_FINDINGS
        if (documented or finding.signed)
        and (finding.releases is None or release in finding.releases)
    )


def expected_failures_for(release: str) -> Mapping[str, str]:
    """The expected failures (node-id pattern -> reason) that hold for sglang ``release``,
    each reason naming the release.

    Example:
        >>> list(expected_failures_for("0.5.21").values())[0][:16]
        'sglang 0.5.21 C3'
    """
    return MappingProxyType(
        {
            pattern: f"sglang {release} {reason}"
            for pattern, (reason, releases) in EXPECTED_FAILURES.items()
            if release in releases
        }
    )
