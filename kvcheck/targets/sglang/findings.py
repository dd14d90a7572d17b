"""The discrepancies between sglang and kvcheck's contracts that the suite finds, and the
sglang releases each holds for.

:data:`FINDINGS` summarizes each one under the id it has in ``docs/sglang-findings.md``
(the index; bugs and preconditions have an issue file in ``docs/sglang-findings/``, the
rest an entry in ``docs/sglang-findings-appendix.md``), :data:`CLASSES` classes it;
:data:`SGLANG_FINDINGS` declares each as a
:class:`~kvcheck.targets.findings.Finding` matched by the failure it causes (the property,
the method, the kind of difference), never by a test id. While the suite runs on sglang,
a matching failure is steered around and the property keeps checking everything else;
any other failure fails the run. Every finding is pinned by the tests it names, in the
shipped suite where one exists (``test_each_rule_alone_rejects[backend-triton]``) and
otherwise in the repository's ``tests/targets/test_sglang_findings.py``: those run as
strict expected failures that must fail with exactly that finding, so a fix shows as
XPASS(strict) until the finding is removed.

Whether a release has a bug is not something the target can read from it: :data:`RELEASES`
says, per finding, the releases it holds for (checked on each of
:data:`~.release.KNOWN_RELEASES`; a range open at the end holds for newer releases until a
run shows otherwise). The target declares only the findings (:func:`findings_for`) and
expected failures (:func:`expected_failures_for`) that hold for the installed release: on
a release where a finding is fixed, its pinned tests run as plain tests and must pass.

Example:
    >>> sorted(f.id for f in findings_for("0.5.21") if f.id not in [g.id for g in
    ...        findings_for("0.5.23")])
    ['D21', 'PV1', 'PV1.cpu_fp8', 'PV1.fp4_mx_block16', 'X1']
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
        "fails on the index keys (0.5.23: an assert; 0.5.22: an IndexError): half a move done",
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
        "(MHA: page_head) with fewer host pages than layers fails to build",
        "X1": "DSA move_kv_cache moves index-K page rows addressed by token ids: a whole "
        "page of keys lands on another page, or IndexError after the latent rows moved",
        "PV1": "on a platform without CUDA, set_kv_buffer_prefix_valid on an fp8 pool "
        "converts the rows to fp8 twice (0.5 is stored as 48.0); on a quant-method pool "
        "(cpu_fp8_e4m3, fp4_mx_block16) the early conversion makes the write raise",
        "D21": "under decode context parallel the default DSA index-K buffer holds a key per "
        "physical token while writes carry widened ids: keys past its end",
        "Q2": "MLA FP4 move_kv_cache, get_cpu_copy and load_cpu_copy carry the payload and "
        "not kv_scale_buffer: moved or reloaded tokens keep the target slot's old scales",
        "Q3": "MLA FP4 get_kv_size_bytes and mem_usage leave out kv_scale_buffer (1/9 of "
        "the pool), which the configurator's cell size counts",
        "Q4": "FP4 pools (MLA FP4, MHA fp4_mx_block16 and nvfp4's linear scales) describe "
        "only their payload for transfer: no scale-buffer descriptor, so a PD decode side "
        "receives the payload without its scales",
        "Q5": "MHA pools with a quant method (cpu_fp8_e4m3, fp4_mx_block16) shape V and its "
        "scales by head_dim and ignore v_head_dim, which get_v_head_dim still reports: a V "
        "row of v_head_dim cannot be written",
        "Q6": "MHA fp4_mx_block16 get_cpu_copy and load_cpu_copy carry the payload and not "
        "k_scale_buffer/v_scale_buffer (its move_kv_cache carries them): reloaded tokens keep "
        "the target slot's old scales",
        "Q11": "MLA FP4 get_value_buffer returns the layer's whole packed FP4 row "
        "([rows, 1, (R+P)/2]: nope and rope codes, no scales), not the dequantized latent "
        "get_key_buffer returns",
        "Q12": "MLA FP4 set_kv_buffer and set_mla_kv_buffer take no layer_id_override, "
        "which their parent's writes declare and SWAKVPool passes to every MLA pool",
        "Q13": "the MXFP8 pool's writes skip slot 0 (the padding sink), while its moves and "
        "reloads copy slot 0's fp8 payload and skip its interleaved scales: a move or reload "
        "into slot 0 leaves the payload beside the old scales",
        "Q14": "MXFP8 pools off 128-token pages (flat scales) refuse every set_kv_buffer "
        "(AssertionError: 'requires the page_size=128 interleaved scale layout'), though "
        "sglang builds them, and their moves, reloads and descriptors serve the flat layout",
        "Q15": "flat-scale MXFP8 moves and reloads store the scales by index_put on "
        "float8_e8m0fnu, which a CPU torch lacks: NotImplementedError after the fp8 payload "
        "has moved (moves on sglang's torch move path; its default Triton move asserts "
        "without a speculative algorithm, and raises Q16's AttributeError with one)",
        "Q16": "flat-scale MXFP8 moves raise AttributeError (native_k_scale_buffer, which "
        "the MXFP8 pool never sets) after the fp8 payload has moved: the base move's "
        "_move_native_fp4_scales reads it on every path (shown on the default Triton copy)",
    }
)

#: Every release checked.
_ALL = Releases()

#: Finding id -> the sglang releases it holds for (the one per-release table: whether a
#: release has a bug is read from running it, recorded here), for every finding of the
#: document's summary. Checked on each of :data:`~.release.KNOWN_RELEASES` with
#: ``python tools/across.py`` (README, "sglang releases").
RELEASES: Mapping[str, Releases] = MappingProxyType(
    {
        "V2": _ALL,
        "P1": _ALL,
        "K1": _ALL,
        "C3": _ALL,
        "C4": _ALL,
        "L1": _ALL,
        "L2": _ALL,
        "N1": _ALL,
        "N3": _ALL,
        "N4": _ALL,
        "N5": _ALL,
        "W1": _ALL,
        "M1": _ALL,
        "H1": _ALL,
        # 0.5.21's pool has them too (its scripts show it), though the target builds no
        # kpool pool there (it keeps a key per token): their pins skip on it, saying why.
        "T2": _ALL,
        "T3": _ALL,
        "R1": _ALL,
        "R2": _ALL,
        "I": _ALL,
        # 0.5.21 and 0.5.22 fail the kpool move with X1's IndexError after the latent rows
        # moved, 0.5.23 asserts.
        "T1": _ALL,
        # Preconditions found through the CPU stand-ins (no declared Finding: no suite test
        # fails on them; docs/sglang-repros/g1.py, g2.py). Before 0.5.22 set_mla_kv_buffer had
        # no torch path either: writes and reads both needed Triton.
        "G1": Releases(first="0.5.22"),
        "G2": _ALL,
        # 0.5.23 allocates fused K/V halves padded to whole pages; earlier releases pad nothing.
        "A1": Releases(first="0.5.23"),
        # Fixed in 0.5.23 (the move copies each token's key and scale bytes).
        "X1": Releases(last="0.5.22"),
        # Fixed in 0.5.22 (the conversion moved after the non-CUDA branch).
        "PV1": Releases(last="0.5.21"),
        # Fixed in 0.5.22 (the default is (size + page_size) * dcp_size - page_size).
        "D21": Releases(last="0.5.21"),
        # The suite checks the paged and SWA allocators from 0.5.22 on (0.5.21's paged
        # allocator is Triton-only), where S1 and S2 hold, as s1.py and s2.py show; the host
        # pools from 0.5.23 on (the buffer-info API the target builds them from): B1-B3 were
        # checked there only (b2.py drives 0.5.23's host-pool API).
        "S1": Releases(first="0.5.22"),
        "S2": Releases(first="0.5.22"),
        "B1": Releases(first="0.5.23"),
        "B2": Releases(first="0.5.23"),
        "B3": Releases(first="0.5.23"),
        # q2-q4.py show Q2-Q4 on 0.5.21 and 0.5.22 as on 0.5.23 (the MLA FP4 pool and its
        # scale buffer are the same); the suite builds the pool where the release has the
        # pieces it needs (release.NEEDS).
        **{finding: _ALL for finding in ("Q2", "Q3", "Q4", "Q11", "Q12")},
        # q5.py shows Q5 on each release (the quant methods' create_buffers are the same).
        "Q5": _ALL,
        # q6.py shows Q6 on each release (MHATokenToKVPool's host copies are the same).
        "Q6": _ALL,
        # MHATokenToKVPoolMXFP8: q13-q16.py and the pins show them on each release (the
        # pool's code is the same; 0.5.21 and 0.5.22 keep its kernels in another module).
        # Q16 has no pin: the target moves on the torch path, where Q15 raises first.
        **{finding: _ALL for finding in ("Q13", "Q14", "Q15", "Q16")},
    }
)


#: The classes of docs/sglang-findings.md, most severe first.
CLASS_ORDER: tuple[str, ...] = ("serving bug", "latent bug", "precondition", "contract difference")

#: Finding id -> its class (one of :data:`CLASS_ORDER`), for every finding of
#: :data:`RELEASES`. Checked against sglang 0.5.23's source: a bug is "serving" where a
#: served configuration reaches it (read from the source where no server was run).
CLASSES: Mapping[str, str] = MappingProxyType(
    {
        **{
            finding: "serving bug"
            for finding in (
                "W1",
                "C3",
                "T1",
                "R2",
                "T2",
                "X1",
                "PV1",
                "D21",
                "Q2",
                "Q3",
                "Q4",
                "Q5",
                "Q6",
                "Q14",
            )
        },
        # S1: the scheduler's check_decode_capacity asks available_size(), the smaller side,
        # first; a refusal that still happens is "Decode out of memory".
        # Q16: a flat-scale MXFP8 pool cannot be written (Q14), so its moves carry nothing.
        **{finding: "latent bug" for finding in ("P1", "N4", "A1", "T3", "S1", "B2", "Q16")},
        **{finding: "precondition" for finding in ("H1", "L1", "G1", "G2", "Q15", "S2")},
        # M1, Q13: slot 0 is sglang's padding slot, whose contents nothing reads. I (I1-I10):
        # caller errors, I10 (an index-K write to a skip layer) included.
        **{
            finding: "contract difference"
            for finding in (
                "V2",
                "K1",
                "C4",
                "R1",
                "L2",
                "N1",
                "N3",
                "N5",
                "B1",
                "B3",
                "Q11",
                "Q12",
                "M1",
                "Q13",
                "I",
            )
        },
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


#: Every finding the suite makes on some checked sglang release (:data:`RELEASES` says which),
#: each matched by the failure it causes. The suite steers around them (``steer``,
#: :class:`kvcheck.steering.Steer` values, or by rejecting the example) and keeps checking the
#: rest; each is pinned by the tests named in ``pinned``, which must fail with exactly it.
SGLANG_FINDINGS: tuple[Finding, ...] = (
    _finding(
        "N1",
        check="raises",
        call="load_cpu_copy",
        family="noop",
        steer=frozenset({Steer.step("host_reload", "noop")}),
    ),
    _finding(
        "N3",
        check="raises",
        call="get_cpu_copy",
        family="noop",
        steer=frozenset({Steer.step("host_copy", "noop")}),
    ),
    _finding(
        "L1",
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
        check="contiguous_buf_infos",
        call="get_contiguous_buf_infos",
        kind="raises*",
        family="noop",
        steer=frozenset({Steer("contiguous_buf_infos", "noop")}),
    ),
    _finding(
        "N5",
        check="raises",
        call="set_kv_buffer_prefix_valid",
        family="noop",
        steer=frozenset({Steer.step("write_prefix_valid", "noop")}),
    ),
    _finding(
        "W1",
        check="caller_tensors",
        call="set_kv_buffer",
        kind="data changed",
        steer=frozenset({Steer("cast_write:scales")}),
    ),
    _finding(
        "M1",
        check="bytes",
        call="set_mla_kv_buffer",
        kind="kv_buffer differs at row 0",
        steer=frozenset({Steer("write_mla:slot0")}),
    ),
    _finding(
        "H1",
        check="bytes",
        call="load_cpu_copy",
        kind="index_k_with_scale_buffer differs*",
        family="dsa",
        steer=frozenset({Steer("host_copy:partial_pages", "dsa")}),
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
        family="mha*",  # the plain pool and the fp8 one with per-tensor scales (same code)
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
    # T1 before I and X1: its error also reads as "instead of ValueError" (0.5.23: an
    # AssertionError; 0.5.22: X1's IndexError, after the latent rows moved all the same).
    _finding(
        "T1",
        check="raises",
        call="move_kv_cache",
        kind="*instead of ValueError",
        family="*kpool*",
        steer=frozenset(
            Steer.step("move", variant) for variant in variant_names() if "kpool" in variant
        ),
    ),
    _finding(
        "T2",
        check="accounting",
        kind="compress tails unreported",
        family="*kpool*",
        steer=frozenset({Steer("accounting:compress_tails", "dsa")}),
    ),
    _finding(
        "T3",
        check="host_copy",
        call="get_cpu_copy",
        kind="copy shares memory with _compress_tail_*",
        family="*kpool*",
        steer=frozenset({Steer("host_copy:request", "dsa")}),
    ),
    _finding(
        "R1",
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
        "X1",
        call="move_kv_cache",
        family="dsa*",
        steer=frozenset(
            Steer.step("move", variant) for variant in variant_names() if variant.startswith("dsa")
        ),
    ),
    _finding(
        "PV1",
        pinned=_pinned("test_pv1_fp8_*"),
        check="bytes",
        call="set_kv_buffer_prefix_valid",
        family="mha*",
    ),
    # The same early conversion on the quant-method pools: their quantizers are handed rows
    # already in the pool dtype, which torch cannot divide (fp8) or copy (fp4) on CPU.
    *(
        Finding(
            f"PV1.{variant}",
            FINDINGS["PV1"],
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
        "D21",
        check="bytes",
        kind="index_k_with_scale_buffer differs",
        family="*dcp*",
    ),
    _finding(
        "S1",
        check="refusal",
        call="alloc_decode",
        kind="refusal changed the allocator",
        family="allocator:swa",
        steer=frozenset({Steer("allocator:one_side_refused", "swa")}),
    ),
    _finding(
        "S2",
        check="available_size",
        call="free",
        family="allocator:swa",
        steer=frozenset({Steer("allocator:free_dead_window", "swa")}),
    ),
    _finding(
        "B1",
        check="buffer_infos",
        call="get_size_per_token",
        kind="bytes held differ",
        family="host:dsa*",
        steer=frozenset({Steer("host:indexer_bytes_held", "dsa")}),
    ),
    _finding(
        "B2",
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
    Finding(
        "B2.dsa",
        FINDINGS["B2"],
        pinned=_pinned("test_b2_*[dsa]"),
        check="buffer_infos",
        call="get_contiguous_buf_infos",
        kind="regions differ",
        family="host:dsa*",
        steer=frozenset({Steer("host:contiguous_buf_infos", "latent")}),
    ),
    _finding(
        "B3",
        check="buffer_infos",
        call="get_page_buffer_meta",
        kind="raises ValueError",
        family="host:dsa*",
        steer=frozenset({Steer("host:indexer_layer_first_page_meta", "dsa")}),
    ),
    _finding(
        "Q2",
        check="bytes",
        kind="kv_scale_buffer differs*",
        family="mla:fp4",
        steer=frozenset(
            Steer.step(kind, "mla:fp4") for kind in ("move", "host_copy", "host_reload")
        ),
    ),
    _finding(
        "Q3",
        check="accounting",
        kind="scale buffers unreported",
        family="mla:fp4",
        steer=frozenset({Steer("accounting:scales", "mla:fp4")}),
    ),
    _finding(
        "Q4",
        pinned=_pinned("test_q4_mla_*"),
        check="scale_buf_infos",
        call="get_kv_scale_buf_infos",
        family="mla:fp4",
        steer=frozenset({Steer("scale_buf_infos", "mla:fp4")}),
    ),
    Finding(
        "Q4.mha",
        FINDINGS["Q4"],
        pinned=_pinned("test_q4_mha_*"),
        check="scale_buf_infos",
        call="get_kv_scale_buf_infos",
        family="mha:fp4_mx_block16",
        steer=frozenset({Steer("scale_buf_infos", "mha:fp4_mx_block16")}),
    ),
    # One entry per variant: a V shape that differs on another MHA variant is another bug.
    # The exact kind is a shape difference (a byte difference adds " at row N").
    _finding(
        "Q5",
        pinned=_pinned("test_q5_*[cpu_fp8]"),
        check="bytes",
        kind="v_buffer differs",
        family="mha:cpu_fp8",
        steer=frozenset({Steer("v_head_dim", "mha:cpu_fp8")}),
    ),
    Finding(
        "Q5.fp4",
        FINDINGS["Q5"],
        pinned=_pinned("test_q5_*[fp4_mx_block16]"),
        check="bytes",
        kind="v_buffer differs",
        family="mha:fp4_mx_block16",
        steer=frozenset({Steer("v_head_dim", "mha:fp4_mx_block16")}),
    ),
    _finding(
        "Q6",
        check="bytes",
        kind="*_scale_buffer differs*",
        family="mha:fp4_mx_block16",
        steer=frozenset(
            Steer.step(kind, "mha:fp4_mx_block16") for kind in ("host_copy", "host_reload")
        ),
    ),
    _finding(
        "Q11",
        check="read_api",
        call="get_value_buffer",
        family="mla:fp4",
        steer=frozenset({Steer("read:get_value_buffer", "mla:fp4")}),
    ),
    # MHATokenToKVPoolMXFP8 (both layouts, built on CPU through mxfp8_kernels).
    _finding(
        "Q13",
        check="bytes",
        # Row 0 of a payload buffer is slot 0; of an interleaved scale buffer, page 0.
        kind="*_buffer differs at row 0",
        family="mha:mxfp8*",
        steer=frozenset({Steer("slot0", "mha:mxfp8"), Steer("slot0", "mha:mxfp8:flat")}),
    ),
    _finding(
        "Q14",
        check="raises",
        call="set_kv_buffer",
        kind="AssertionError*",
        family="mha:mxfp8:flat",
        steer=frozenset({Steer.step("write_kv", "mha:mxfp8:flat")}),
    ),
    _finding(
        "Q15",
        check="raises",
        kind="NotImplementedError*",
        family="mha:mxfp8:flat",
        steer=frozenset(Steer.step(kind, "mha:mxfp8:flat") for kind in ("move", "host_reload")),
    ),
    _finding(
        "Q12",
        check="raises",
        kind="TypeError instead of no exception",
        family="mla:fp4",
        steer=frozenset({Steer("layer_id_override", "mla:fp4")}),
    ),
    _finding(
        "I",
        check="raises",
        kind="*instead of ValueError",
        pinned=_pinned("test_i_bad_operation_is_rejected[*]", "test_i9_*"),
    ),
)


def findings_for(release: str) -> tuple[Finding, ...]:
    """The findings that hold for sglang ``release`` (:data:`RELEASES`), in declaration
    order (which decides the match when several could).

    Example:
        >>> "A1" in [finding.id for finding in findings_for("0.5.22")]
        False
    """
    return tuple(
        finding for finding in SGLANG_FINDINGS if release in RELEASES[finding.id.split(".")[0]]
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
