"""The discrepancies between sglang 0.5.23 and kvcheck's contracts that the suite finds.

:data:`FINDINGS` summarizes each one under the id its section has in
``docs/sglang-findings.md``; :data:`EXPECTED_FAILURES` names the tests that fail because
of them (node-id patterns, see :func:`kvcheck.targets.expected_failure_reason`). The
plugin runs those tests as strict expected failures: if sglang changes so that one passes,
the run fails (XPASS strict) until the entry is removed.

Entries stay narrow. Every finding has a pinned test of its minimal reproduction, in the
shipped suite where one exists (``test_each_rule_alone_rejects[kv-fp4_e2m1]``) and
otherwise in the repository's ``tests/targets/test_sglang_findings.py``. A Hypothesis
property is listed only where a finding makes the property itself fail, and its reason
names every finding seen to fail it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FINDINGS_DOC = "docs/sglang-findings.md"

#: Finding id -> one-line summary (details, reproductions and class in FINDINGS_DOC).
FINDINGS: Mapping[str, str] = MappingProxyType(
    {
        "V1": "--kv-cache-dtype=fp4_e2m1 is accepted with --prefill-only-disable-kv-cache",
        "V2": "the FA-backend rejection names no backend flag",
        "P1": "a draft MHA worker under the flag gets the no-op pool",
        "P2": "a checkpoint's NVFP4 KV cache does not make the flag refuse the FP4 MHA pool",
        "K1": "a skip-topk field <= 0 raises AssertionError, not ValueError",
        "C1": "fp8 DSA cells are sized for the scaled FP8 latent layout (656 bytes, not 576)",
        "C2": "HiSparse multiplies the indexer bytes by its host-to-device ratio",
        "C3": "max_total_num_tokens ignores the padding page, so its pools overshoot the budget",
        "C4": "fp8 DSA sizing asserts kv_lora_rank % 128 == 0",
        "N1": "the no-op pool's load_cpu_copy is MHA's: no RuntimeError",
        "N2": "the no-op pool's move_kv_cache requires (tgt_loc, src_loc)",
        "N3": "the no-op pool's get_cpu_copy indexes its one-page placeholders",
        "I": "pool calls do not validate input: no ValueError for bad locations, layers, "
        "shapes or lengths (I1-I10)",
    }
)

#: Suite test patterns and the findings that make them fail on sglang 0.5.23.
_FAILING_TESTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # --- flag validation
    ("test_serving_validation.py::test_validation_agrees_with_the_rules", ("V1", "V2")),
    ("test_serving_validation.py::test_each_broken_rule_raises_its_error", ("V1", "V2")),
    ("test_serving_validation.py::test_first_violated_rule_wins", ("V1", "V2")),
    ("test_serving_validation.py::test_each_rule_alone_rejects[kv-fp4_e2m1]", ("V1",)),
    ("test_serving_validation.py::test_each_rule_alone_rejects[backend-triton]", ("V2",)),
    (
        "test_serving_validation.py::test_each_rule_alone_rejects[prefill-backend-flashinfer]",
        ("V2",),
    ),
    (
        "test_serving_validation.py::test_each_rule_alone_rejects"
        "[fa3-with-fp8_e5m2-becomes-triton]",
        ("V2",),
    ),
    ("test_serving_validation.py::test_each_rule_alone_rejects[default-backend-sm100]", ("V2",)),
    ("test_serving_validation.py::test_each_rule_alone_rejects[default-backend-cpu]", ("V2",)),
    (
        "test_serving_validation.py::test_named_models_with_the_default_backend[deepseek-v3.2]",
        ("V2",),
    ),
    (
        "test_serving_validation.py::test_named_models_with_the_default_backend[glm-5.2-like]",
        ("V2",),
    ),
    # --- pool selection
    (
        "test_serving_selection.py::test_pool_selection_refuses_exactly_the_unsupported_families",
        ("P1", "P2"),
    ),
    ("test_serving_selection.py::test_draft_worker_keeps_its_normal_pool", ("P1",)),
    ("test_serving_selection.py::test_named_models[qwen3-embedding-8b-flag-on-draft]", ("P1",)),
    ("test_sglang_findings.py::test_p2_*", ("P2",)),
    # --- skip rule
    ("test_serving_skip_rule.py::test_skip_rule_matches_reference", ("K1",)),
    ("test_sglang_findings.py::test_k1_*", ("K1",)),
    # --- configurator
    ("test_serving_configurator.py::test_cell_size_matches_formula", ("C1", "C2", "C4")),
    ("test_serving_configurator.py::test_capacity_fits_its_budget", ("C1", "C2", "C3", "C4")),
    ("test_serving_configurator.py::test_more_skip_layers_never_lower_capacity", ("C4",)),
    ("test_serving_configurator.py::test_named_cell_sizes[deepseek-v3.2-fp8]", ("C1",)),
    ("test_serving_configurator.py::test_named_capacities_fit[*-60gib-bf16]", ("C3",)),
    ("test_serving_configurator.py::test_named_capacities_fit[glm-5.2-like-1gib-fp8]", ("C1",)),
    ("test_sglang_findings.py::test_c1_*", ("C1",)),
    ("test_sglang_findings.py::test_c2_*", ("C2",)),
    ("test_sglang_findings.py::test_c3_*", ("C3",)),
    ("test_sglang_findings.py::test_c4_*", ("C4",)),
    # --- no-op pool
    ("test_noop.py::test_noop_write_raises_whatever_the_arguments", ("N1",)),
    ("test_noop.py::test_noop_move_changes_nothing", ("N2",)),
    ("test_sglang_findings.py::test_n1_*", ("N1",)),
    ("test_sglang_findings.py::test_n2_*", ("N2",)),
    ("test_sglang_findings.py::test_n3_*", ("N3",)),
    # --- input validation: declared unsupported (sglang.UNSUPPORTED), so the machines run
    # valid operations only; the findings are pinned here
    ("test_pool_machines.py::test_pool_matches_reference_after_every_step[noop]", ("N1", "N3")),
    ("test_sglang_findings.py::test_i_bad_operation_is_rejected[*]", ("I",)),
    ("test_sglang_findings.py::test_i9_*", ("I",)),
)


def _reason(finding_ids: tuple[str, ...]) -> str:
    parts = [f"{fid}: {FINDINGS[fid]}" for fid in finding_ids]
    anchors = ", ".join(f"{FINDINGS_DOC}#{fid.lower()}" for fid in finding_ids)
    return f"sglang 0.5.23 {'; '.join(parts)} (see {anchors})"


#: Suite node-id pattern -> why it fails on sglang 0.5.23.
EXPECTED_FAILURES: Mapping[str, str] = MappingProxyType(
    {pattern: _reason(finding_ids) for pattern, finding_ids in _FAILING_TESTS}
)
