"""The reference models, pinned on examples computed by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvcheck.reference import (
    HISPARSE_INDEX_RATIO,
    PREFILL_ONLY_FLAG_DEFAULTS,
    PREFILL_ONLY_RULES,
    ReferencePool,
    expected_buffer_bytes,
    expected_kv_size_bytes,
    expected_mem_usage,
    expected_num_index_pages,
    expected_state_buf_infos,
    fp8_e4m3fn_byte,
    reference_cell_size_bytes,
    reference_first_violation,
    reference_max_total_num_tokens,
    reference_pool_bytes,
    reference_pool_family,
    reference_skip_mask,
    reference_skips_topk,
    reference_unsupported_family,
    reference_violations,
)
from kvcheck.specs import (
    HostCopy,
    HostReload,
    Move,
    Payload,
    PoolSpec,
    WriteIndexK,
    WriteKV,
    WriteMLA,
    WritePrefixValid,
)

# --- helpers ---------------------------------------------------------------------------------


def mha_spec(**overrides: object) -> PoolSpec:
    """An fp8 MHA pool with one-byte rows, so slot contents are easy to read."""
    fields: dict = {
        "family": "mha",
        "size": 6,
        "page_size": 2,
        "layer_num": 2,
        "dtype": "float8_e4m3fn",
        "head_num": 1,
        "head_dim": 1,
    }
    return PoolSpec(**(fields | overrides))


def dsa_spec(**overrides: object) -> PoolSpec:
    """A DSA pool with page_size=2 and the real index_head_dim=128."""
    fields: dict = {
        "family": "dsa",
        "size": 4,
        "page_size": 2,
        "layer_num": 2,
        "dtype": "float8_e4m3fn",
        "kv_lora_rank": 1,
        "qk_rope_head_dim": 1,
        "index_head_dim": 128,
        "skip_topk_layers": (False, True),
    }
    return PoolSpec(**(fields | overrides))


def write(layer_id: int, slots: dict[int, int]) -> WriteKV:
    """One-byte K rows (V rows = K + 100) for the one-byte MHA spec."""
    return WriteKV(
        layer_id=layer_id,
        locs=tuple(slots),
        k_rows=tuple(bytes([value]) for value in slots.values()),
        v_rows=tuple(bytes([value + 100]) for value in slots.values()),
    )


def k_column(ref: ReferencePool, layer_id: int) -> list[int]:
    return ref.expected_k_buffer(layer_id)[:, 0].tolist()


def index_write(layer_id: int, tokens: dict[int, int]) -> WriteIndexK:
    """Key bytes all equal to the token's value; scale bytes value+1 .. value+4."""
    return WriteIndexK(
        layer_id=layer_id,
        locs=tuple(tokens),
        key_rows=tuple(bytes([value]) * 128 for value in tokens.values()),
        scale_rows=tuple(bytes(range(value + 1, value + 5)) for value in tokens.values()),
    )


# --- MHA state -------------------------------------------------------------------------------


def test_fresh_pool_is_all_zero_with_storage_layout() -> None:
    """A new MHA pool's buffers are zero, [size + page_size, head_num*head_dim*itemsize]."""
    spec = mha_spec(dtype="bfloat16", head_num=2, head_dim=3, v_head_dim=5)
    ref = ReferencePool(spec)
    assert ref.expected_k_buffer(0).shape == (8, 12)
    assert ref.expected_v_buffer(1).shape == (8, 20)
    assert ref.expected_k_buffer(0).dtype == np.uint8
    assert not ref.expected_k_buffer(0).any()


def test_write_sets_only_the_written_slots() -> None:
    """WriteKV puts each row at its slot in the named layer and nowhere else."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(1, {3: 7, 0: 9}))
    assert k_column(ref, 1) == [9, 0, 0, 7, 0, 0, 0, 0]
    assert ref.expected_v_buffer(1)[:, 0].tolist() == [109, 0, 0, 107, 0, 0, 0, 0]
    assert k_column(ref, 0) == [0] * 8


def test_move_swaps_through_gather_then_scatter() -> None:
    """Move(tgt=(1, 2), src=(2, 1)) swaps: every source is read before any target is written."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {1: 11, 2: 22}))
    ref.apply(Move(tgt=(1, 2), src=(2, 1)))
    assert k_column(ref, 0)[:3] == [0, 22, 11]


def test_move_chain_reads_old_values() -> None:
    """Move(tgt=(2, 3), src=(1, 2)) gives slot 3 slot 2's old bytes, not slot 1's."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {1: 11, 2: 22}))
    ref.apply(Move(tgt=(2, 3), src=(1, 2)))
    assert k_column(ref, 0)[:4] == [0, 11, 11, 22]


def test_move_repeated_source_and_every_layer() -> None:
    """A repeated source fans out to each target, in every layer, for K and V."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {1: 5}))
    ref.apply(write(1, {1: 6}))
    ref.apply(Move(tgt=(4, 5), src=(1, 1)))
    assert k_column(ref, 0)[4:6] == [5, 5]
    assert k_column(ref, 1)[4:6] == [6, 6]
    assert ref.expected_v_buffer(1)[4:6, 0].tolist() == [106, 106]


def test_move_of_unwritten_slot_clears_target() -> None:
    """Moving a never-written slot writes zeros over the target."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {3: 8}))
    ref.apply(Move(tgt=(3,), src=(4,)))
    assert k_column(ref, 0) == [0] * 8


def test_host_copy_then_reload_restores_positionally() -> None:
    """A reload writes the copied tokens, in order, to the new indices, all layers."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {2: 1, 3: 2}))
    ref.apply(write(1, {2: 3}))
    ref.apply(HostCopy(name="saved", indices=(2, 3)))
    ref.apply(write(0, {2: 9}))
    ref.apply(HostReload(name="saved", indices=(6, 2)))
    assert k_column(ref, 0) == [0, 0, 2, 2, 0, 0, 1, 0]
    assert k_column(ref, 1) == [0, 0, 0, 0, 0, 0, 3, 0]


def test_start_layer_maps_global_ids() -> None:
    """With start_layer=3, layer ids 3 and 4 are served and 2 or 5 are rejected."""
    ref = ReferencePool(mha_spec(start_layer=3))
    ref.apply(write(4, {0: 1}))
    assert k_column(ref, 4)[0] == 1
    assert ref.expected_error(write(2, {0: 1})) is ValueError
    assert ref.expected_error(write(5, {0: 1})) is ValueError
    assert list(ref.expected_buffers()) == ["k_buffer", "v_buffer"]
    assert len(ref.expected_buffers()["k_buffer"]) == 2


def test_rejected_op_changes_nothing() -> None:
    """apply raises the expected error and leaves every buffer as it was."""
    ref = ReferencePool(mha_spec())
    ref.apply(write(0, {1: 4}))
    before = {name: [a.copy() for a in arrays] for name, arrays in ref.expected_buffers().items()}
    with pytest.raises(ValueError, match=r"tgt=\(1, 9\)"):
        ref.apply(Move(tgt=(1, 9), src=(0, 0)))
    for name, arrays in ref.expected_buffers().items():
        for got, was in zip(arrays, before[name], strict=True):
            np.testing.assert_array_equal(got, was)


# --- expected errors -------------------------------------------------------------------------

MHA_ERRORS = [
    pytest.param(write(0, {0: 1}), None, id="valid-write"),
    pytest.param(write(2, {0: 1}), ValueError, id="layer-out-of-range"),
    pytest.param(write(0, {8: 1}), ValueError, id="loc-past-end"),
    pytest.param(write(0, {-1: 1}), ValueError, id="negative-loc"),
    pytest.param(
        WriteKV(layer_id=0, locs=(1, 1), k_rows=(b"a", b"b"), v_rows=(b"c", b"d")),
        ValueError,
        id="repeated-write-loc",
    ),
    pytest.param(
        WriteKV(layer_id=0, locs=(1,), k_rows=(b"ab",), v_rows=(b"c",)),
        ValueError,
        id="k-row-too-long",
    ),
    pytest.param(
        WriteKV(layer_id=0, locs=(1,), k_rows=(b"a",), v_rows=()), ValueError, id="missing-v"
    ),
    pytest.param(Move(tgt=(1, 2), src=(3,)), ValueError, id="move-length-mismatch"),
    pytest.param(Move(tgt=(1, 1), src=(3, 4)), ValueError, id="move-repeated-target"),
    pytest.param(Move(tgt=(1, 2), src=(3, 3)), None, id="move-repeated-source"),
    pytest.param(Move(tgt=(), src=()), None, id="move-empty"),
    pytest.param(HostCopy(name="c", indices=(0, 0, 7)), None, id="copy-any-slots"),
    pytest.param(HostReload(name="never", indices=()), ValueError, id="reload-unknown-name"),
    pytest.param(
        WriteIndexK(layer_id=0, locs=(), key_rows=(), scale_rows=()),
        ValueError,
        id="index-k-on-mha",
    ),
]


@pytest.mark.parametrize(("op", "error"), MHA_ERRORS)
def test_mha_expected_errors(op: object, error: type[Exception] | None) -> None:
    """expected_error follows the contract's ValueError cases on an MHA pool."""
    ref = ReferencePool(mha_spec())
    assert ref.expected_error(op) is error  # type: ignore[arg-type]
    assert ref.rejects(op) is (error is not None)  # type: ignore[arg-type]


def test_reload_length_must_match_copy() -> None:
    """A reload with more or fewer indices than were copied is a ValueError."""
    ref = ReferencePool(mha_spec())
    ref.apply(HostCopy(name="c", indices=(1, 2)))
    assert ref.expected_error(HostReload(name="c", indices=(3,))) is ValueError
    assert ref.expected_error(HostReload(name="c", indices=(3, 3))) is ValueError
    assert ref.expected_error(HostReload(name="c", indices=(3, 4))) is None


NOOP_OPS = [
    pytest.param(write(0, {0: 1}), RuntimeError, id="write"),
    pytest.param(write(99, {-5: 1}), RuntimeError, id="write-with-bad-arguments"),
    pytest.param(
        WriteIndexK(layer_id=0, locs=(), key_rows=(), scale_rows=()), RuntimeError, id="index-k"
    ),
    pytest.param(HostReload(name="c", indices=(0,)), RuntimeError, id="reload"),
    pytest.param(Move(tgt=(1,), src=(3,)), None, id="move"),
    pytest.param(Move(tgt=(1, 1), src=(99,)), ValueError, id="move-of-bad-locations"),
    pytest.param(HostCopy(name="c", indices=(0,)), None, id="copy"),
    pytest.param(HostCopy(name="c", indices=(-1,)), ValueError, id="copy-of-a-bad-slot"),
]


@pytest.mark.parametrize(("op", "error"), NOOP_OPS)
def test_noop_rejects_every_write(op: object, error: type[Exception] | None) -> None:
    """NoOp: writes raise RuntimeError whatever the arguments; moves and copies of valid
    locations are accepted and do nothing, of bad ones are refused."""
    ref = ReferencePool(mha_spec(family="noop"))
    assert ref.expected_error(op) is error  # type: ignore[arg-type]
    if error is None:
        ref.apply(op)  # type: ignore[arg-type]
    else:
        with pytest.raises(error):
            ref.apply(op)  # type: ignore[arg-type]
    assert ref.expected_k_buffer(0).shape == (2, 1)
    assert not ref.expected_k_buffer(0).any()


# --- MLA and DSA ---------------------------------------------------------------------------


def test_mla_latent_write_and_move() -> None:
    """MLA rows are the whole latent entry; v_rows are ignored; moves carry the latent."""
    spec = PoolSpec(
        family="mla",
        size=2,
        page_size=1,
        layer_num=1,
        dtype="float8_e5m2",
        kv_lora_rank=1,
        qk_rope_head_dim=1,
    )
    ref = ReferencePool(spec)
    ref.apply(WriteKV(layer_id=0, locs=(1,), k_rows=(b"\x01\x02",), v_rows=(b"ignored",)))
    ref.apply(Move(tgt=(2, 0), src=(1, 2)))
    assert ref.expected_kv_buffer(0).tolist() == [[0, 0], [1, 2], [1, 2]]
    assert list(ref.expected_buffers()) == ["kv_buffer"]


def test_dsa_page_layout_by_hand() -> None:
    """DSA index-K: token t sits in page t//2 at offset t%2, keys first, then scales."""
    ref = ReferencePool(dsa_spec())
    ref.apply(index_write(0, {1: 10, 2: 20}))
    pages = ref.expected_index_k_buffer(0)
    # num_pages = (4 + 2 + 1) // 2 = 3; a page row holds 2*128 key bytes then 2*4 scales.
    assert pages.shape == (3, 264)
    expected = np.zeros((3, 264), dtype=np.uint8)
    expected[0, 128:256] = 10  # token 1: page 0, offset 1, key bytes
    expected[0, 260:264] = [11, 12, 13, 14]  # token 1: scale bytes after both keys
    expected[1, 0:128] = 20  # token 2: page 1, offset 0
    expected[1, 256:260] = [21, 22, 23, 24]
    np.testing.assert_array_equal(pages, expected)


def test_dsa_skip_layer_has_no_rows_and_rejects_index_writes() -> None:
    """A skip layer's index buffer has zero rows; writing index-K to it is a ValueError."""
    ref = ReferencePool(dsa_spec())
    assert ref.expected_index_k_buffer(1).shape == (0, 264)
    assert ref.expected_error(index_write(1, {0: 1})) is ValueError
    with pytest.raises(ValueError, match="layer_id=1"):
        ref.apply(index_write(1, {0: 1}))


def test_dsa_move_copies_token_bytes_not_pages() -> None:
    """A DSA move copies one token's key and scale inside its page; neighbours keep theirs."""
    ref = ReferencePool(dsa_spec())
    ref.apply(index_write(0, {0: 1, 1: 2, 2: 3}))
    ref.apply(WriteKV(layer_id=1, locs=(0,), k_rows=(b"\x05\x06",)))
    ref.apply(Move(tgt=(3,), src=(0,)))
    pages = ref.expected_index_k_buffer(0)
    assert pages[1, 0:128].tolist() == [3] * 128  # token 2 untouched
    assert pages[1, 128:256].tolist() == [1] * 128  # token 3 <- token 0's key
    assert pages[1, 260:264].tolist() == [2, 3, 4, 5]  # and its scale
    assert pages[0, 128:256].tolist() == [2] * 128  # token 1 untouched
    assert ref.expected_kv_buffer(1)[3].tolist() == [5, 6]  # latent moved in every layer


def test_dsa_host_copy_is_token_granular_and_carries_index_k() -> None:
    """A partial-page copy carries exactly its tokens' latent and index-K bytes; a reload
    writes exactly the listed tokens and leaves the rest of their pages alone."""
    ref = ReferencePool(dsa_spec())
    ref.apply(index_write(0, {2: 7, 3: 8, 4: 1, 5: 2}))
    ref.apply(HostCopy(name="partial", indices=(2,)))  # page 1's first token only
    ref.apply(index_write(0, {2: 0, 3: 0}))
    assert ref.expected_error(HostReload(name="partial", indices=(4, 5))) is ValueError
    ref.apply(HostReload(name="partial", indices=(5,)))
    pages = ref.expected_index_k_buffer(0)
    assert pages[2, 0:128].tolist() == [1] * 128  # token 4 untouched
    assert pages[2, 128:256].tolist() == [7] * 128  # token 5 <- token 2's key
    assert pages[2, 260:264].tolist() == [8, 9, 10, 11]  # and its scale
    assert pages[1, 0:256].tolist() == [0] * 256  # tokens 2 and 3 keep their new bytes


def test_mla_write_stores_nope_then_rope() -> None:
    """set_mla_kv_buffer's two parts make one latent row; other families refuse it."""
    spec = PoolSpec(
        family="mla",
        size=2,
        page_size=1,
        layer_num=1,
        dtype="float8_e5m2",
        kv_lora_rank=2,
        qk_rope_head_dim=1,
    )
    ref = ReferencePool(spec)
    ref.apply(WriteMLA(layer_id=0, locs=(1,), nope_rows=(b"\x01\x02",), rope_rows=(b"\x03",)))
    assert ref.expected_kv_buffer(0)[1].tolist() == [1, 2, 3]
    bad = WriteMLA(layer_id=0, locs=(1,), nope_rows=(b"\x01",), rope_rows=(b"\x03",))
    assert ref.expected_error(bad) is ValueError
    mha = ReferencePool(mha_spec())
    assert mha.expected_error(WriteMLA(layer_id=0, locs=(), nope_rows=(), rope_rows=())) is (
        ValueError
    )


def test_prefix_valid_write_commits_row_prefixes_only() -> None:
    """Only each row's first commit_lens cells are written; the rest may even repeat."""
    ref = ReferencePool(mha_spec())
    op = WritePrefixValid(
        layer_id=0,
        loc_grid=((1, 2), (3, 1)),
        commit_lens=(1, 1),
        k_rows=(b"\x01", b"\x02", b"\x03", b"\x04"),
        v_rows=(b"\x05", b"\x06", b"\x07", b"\x08"),
    )
    ref.apply(op)
    assert ref.expected_k_buffer(0)[:, 0].tolist()[:4] == [0, 1, 0, 3]
    assert ref.expected_v_buffer(0)[:, 0].tolist()[:4] == [0, 5, 0, 7]
    too_long = WritePrefixValid(
        layer_id=0, loc_grid=((1,),), commit_lens=(2,), k_rows=(b"\x01",), v_rows=(b"\x01",)
    )
    assert ref.expected_error(too_long) is ValueError


def test_write_with_a_payload_stores_the_converted_rows() -> None:
    """A payload in another dtype is checked for its value count; the stored rows win."""
    ref = ReferencePool(mha_spec(dtype="bfloat16"))
    payload = Payload(dtype="float32", k_rows=(b"\x00\x00\x80?",), v_rows=(b"\x00\x00\x80?",))
    op = WriteKV(layer_id=0, locs=(2,), k_rows=(b"\x80?",), v_rows=(b"\x80?",), payload=payload)
    ref.apply(op)
    assert ref.expected_k_buffer(0)[2].tolist() == [128, 63]
    short = Payload(dtype="float32", k_rows=(b"\x00\x00",), v_rows=(b"\x00\x00\x80?",))
    bad = WriteKV(layer_id=0, locs=(2,), k_rows=(b"\x80?",), v_rows=(b"\x80?",), payload=short)
    assert ref.expected_error(bad) is ValueError


def test_dsa_extra_index_pages() -> None:
    """index_buf_size larger than size adds pages: (index_buf_size + page_size + 1) // page_size."""
    spec = dsa_spec(index_buf_size=8)
    assert expected_num_index_pages(spec) == 5
    assert ReferencePool(spec).expected_index_k_buffer(0).shape == (5, 264)


def test_dsa_spec_with_wrong_mask_length_is_refused() -> None:
    """A skip mask whose length differs from layer_num is a ValueError."""
    with pytest.raises(ValueError, match="layer_num=2"):
        ReferencePool(dsa_spec(skip_topk_layers=(False,)))


# --- byte accounting ---------------------------------------------------------------------------


def test_byte_accounting_by_family() -> None:
    """get_kv_size_bytes, buffer bytes and mem_usage follow the per-family formulas."""
    mha = mha_spec(dtype="bfloat16", head_num=2, head_dim=3, v_head_dim=5)
    assert expected_kv_size_bytes(mha) == (2 * 8 * 12, 2 * 8 * 20)
    assert expected_buffer_bytes(mha) == 2 * 8 * 32
    noop = mha_spec(family="noop", dtype="bfloat16", head_num=2, head_dim=3, v_head_dim=5)
    assert expected_kv_size_bytes(noop) == (0, 0)
    assert expected_buffer_bytes(noop) == 2 * 2 * 32  # placeholders of page_size rows
    assert expected_mem_usage(noop) == 0.0
    dsa = dsa_spec()
    latent = 2 * 6 * 2
    assert expected_kv_size_bytes(dsa) == latent + 3 * 264  # one indexed layer of 3 pages
    assert expected_mem_usage(dsa) == (latent + 3 * 264) / (1 << 30)
    assert expected_state_buf_infos(dsa) == ([792, 0], [264, 0])


def test_state_buf_infos_only_for_dsa() -> None:
    """Only DSA pools have state buffer infos."""
    with pytest.raises(ValueError, match="family='mha'"):
        expected_state_buf_infos(mha_spec())


# --- serving rules -----------------------------------------------------------------------------

VALID_MINIMAL = {
    "prefill_only_disable_kv_cache": True,
    "is_embedding": True,
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
    "attention_backend": "fa3",
}

SINGLE_VIOLATIONS = [
    ("is_embedding", {"is_embedding": False}),
    ("fp4_kv_cache_dtype", {"kv_cache_dtype": "nvfp4"}),
    ("fp4_kv_cache_dtype", {"kv_cache_dtype": "fp4_mx_block16"}),
    ("mxfp8_kv_cache_dtype", {"kv_cache_dtype": "mxfp8"}),
    ("chunked_prefill_size", {"chunked_prefill_size": None}),
    ("chunked_prefill_size", {"chunked_prefill_size": 8192}),
    ("disable_radix_cache", {"disable_radix_cache": False}),
    ("attn_cp_size", {"attn_cp_size": 2}),
    ("prefill_context_parallel", {"enable_prefill_context_parallel": True}),
    ("hisparse", {"enable_hisparse": True}),
    ("fa_prefill_backend", {"attention_backend": "triton"}),
    ("fa_prefill_backend", {"attention_backend": None}),
    ("fa_prefill_backend", {"prefill_attention_backend": "flashinfer"}),
]


def test_rule_table_order() -> None:
    """The rule table lists the nine rules in serving_contract.md's order, with their flags."""
    assert [(rule.rule_id, rule.conflicting_flag) for rule in PREFILL_ONLY_RULES] == [
        ("is_embedding", "--is-embedding"),
        ("fp4_kv_cache_dtype", "--kv-cache-dtype"),
        ("mxfp8_kv_cache_dtype", "--kv-cache-dtype"),
        ("chunked_prefill_size", "--chunked-prefill-size"),
        ("disable_radix_cache", "--disable-radix-cache"),
        ("attn_cp_size", "--attn-cp-size"),
        ("prefill_context_parallel", "--enable-prefill-context-parallel"),
        ("hisparse", "--enable-hisparse"),
        ("fa_prefill_backend", "--attention-backend"),
    ]


def test_valid_minimal_combination_is_accepted() -> None:
    """The documented minimal combination violates nothing; fa4 and split backends too."""
    assert reference_first_violation(VALID_MINIMAL) is None
    assert reference_first_violation(VALID_MINIMAL | {"attention_backend": "fa4"}) is None
    split = {"attention_backend": "triton", "prefill_attention_backend": "fa3"}
    assert reference_first_violation(VALID_MINIMAL | split) is None


@pytest.mark.parametrize(
    ("rule_id", "change"),
    SINGLE_VIOLATIONS,
    ids=[f"{rule}-{next(iter(change.values()))}" for rule, change in SINGLE_VIOLATIONS],
)
def test_each_rule_alone(rule_id: str, change: dict) -> None:
    """Breaking one rule of the minimal combination reports exactly that rule."""
    assert reference_violations(VALID_MINIMAL | change) == (rule_id,)
    assert reference_first_violation(VALID_MINIMAL | change) == rule_id


def test_first_violation_follows_precedence() -> None:
    """With several rules broken the earliest in the table wins; all are listed in order."""
    flags = VALID_MINIMAL | {
        "enable_hisparse": True,
        "attn_cp_size": 4,
        "kv_cache_dtype": "mxfp8",
        "attention_backend": "triton",
    }
    assert reference_violations(flags) == (
        "mxfp8_kv_cache_dtype",
        "attn_cp_size",
        "hisparse",
        "fa_prefill_backend",
    )
    assert reference_first_violation(flags) == "mxfp8_kv_cache_dtype"
    assert reference_first_violation(flags | {"is_embedding": False}) == "is_embedding"


def test_flag_off_accepts_anything() -> None:
    """Without --prefill-only-disable-kv-cache no rule applies, and defaults alone pass."""
    everything_wrong = {"enable_hisparse": True, "kv_cache_dtype": "nvfp4", "attn_cp_size": 8}
    assert reference_first_violation(everything_wrong) is None
    assert reference_first_violation({}) is None
    defaults_with_flag = dict(PREFILL_ONLY_FLAG_DEFAULTS, prefill_only_disable_kv_cache=True)
    assert reference_first_violation(defaults_with_flag) == "is_embedding"


# --- skip-topk rule --------------------------------------------------------------------------


def dsa_config(**fields: object) -> SimpleNamespace:
    base: dict = {
        "attention_arch": "dsa",
        "num_hidden_layers": 8,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
    }
    return SimpleNamespace(**(base | fields))


GLM_5_2_LIKE = dsa_config(num_hidden_layers=78, index_topk_freq=4, index_skip_topk_offset=3)


def test_glm_like_has_21_indexer_layers() -> None:
    """freq=4, offset=3 over 78 layers: layers 0, 1, 2, then every 4th from 6 keep an indexer."""
    mask = reference_skip_mask(GLM_5_2_LIKE)
    indexed = [layer for layer, skip in enumerate(mask) if not skip]
    assert indexed == [0, 1, 2, *range(6, 78, 4)]
    assert len(indexed) == 21


def test_freq_without_offset() -> None:
    """Without an offset, layer i skips when max(i - 1, 0) % freq != 0."""
    config = dsa_config(index_topk_freq=3)
    assert reference_skip_mask(config) == (False, False, True, True, False, True, True, False)


def test_default_indexes_every_layer() -> None:
    """No skip field set: every layer computes its own top-k."""
    assert not any(reference_skip_mask(dsa_config()))


SKIP_PRECEDENCE = [
    pytest.param(
        {"indexer_types": ("full", "shared", "full"), "cli_factor": 4, "index_topk_freq": 2},
        [False, True, False, False, False],
        id="indexer-types-first-past-end-fresh",
    ),
    pytest.param(
        {"cli_factor": 2, "index_topk_pattern": "FFFFF"},
        [False, True, False, True, False],
        id="cli-factor-over-pattern",
    ),
    pytest.param(
        {"cli_factor": 1, "index_topk_pattern": "FSS"},
        [False, True, True, False, False],
        id="cli-factor-1-falls-through",
    ),
    pytest.param(
        {"index_topk_pattern": "FS", "index_topk_freq": 1},
        [False, True, False, False, False],
        id="pattern-over-freq",
    ),
    pytest.param(
        {"index_topk_freq": 2, "index_skip_topk_offset": 1},
        [False, True, False, True, False],
        id="freq-with-offset-1",
    ),
]


@pytest.mark.parametrize(("fields", "expected"), SKIP_PRECEDENCE)
def test_skip_rule_precedence(fields: dict, expected: list[bool]) -> None:
    """indexer_types, then cli_factor > 1, then the pattern, then freq/offset decide."""
    config = dsa_config(num_hidden_layers=5, **fields)
    assert [reference_skips_topk(config, layer) for layer in range(5)] == expected


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"cli_factor": 0}, "cli_factor=0"),
        ({"index_topk_freq": -1}, "index_topk_freq=-1"),
        ({"index_topk_freq": 2, "index_skip_topk_offset": 0}, "index_skip_topk_offset=0"),
    ],
    ids=["cli-factor-0", "freq-negative", "offset-0"],
)
def test_invalid_skip_fields_raise(fields: dict, name: str) -> None:
    """Non-positive cli_factor, freq or offset raise ValueError naming the field."""
    with pytest.raises(ValueError, match=name):
        reference_skips_topk(dsa_config(**fields), 1)


def test_skip_rule_needs_dsa() -> None:
    """The skip rule refuses a non-DSA config."""
    with pytest.raises(ValueError, match="attention_arch='mla'"):
        reference_skips_topk(dsa_config(attention_arch="mla"), 0)


def test_skip_mask_for_draft_hisparse_and_window() -> None:
    """Draft workers and HiSparse skip nothing; start_layer/layer_num pick a window."""
    assert not any(reference_skip_mask(GLM_5_2_LIKE, is_draft_worker=True))
    assert not any(reference_skip_mask(GLM_5_2_LIKE, enable_hisparse=True))
    assert reference_skip_mask(GLM_5_2_LIKE, start_layer=5, layer_num=3) == (True, False, True)


# --- cell size and pool bytes ----------------------------------------------------------------

MHA_EMBEDDING = SimpleNamespace(
    attention_arch="mha", num_hidden_layers=36, num_key_value_heads=8, head_dim=128, v_head_dim=None
)


def test_cell_sizes_by_hand() -> None:
    """Per-token bytes: MHA K+V; DSA latent plus only the indexer layers' 132 bytes."""
    assert reference_cell_size_bytes(MHA_EMBEDDING, dtype="bfloat16") == 36 * 8 * 256 * 2
    assert reference_cell_size_bytes(GLM_5_2_LIKE, dtype="float8_e5m2") == 78 * 576 + 21 * 132
    everything = 78 * 576 + 78 * 132
    assert (
        reference_cell_size_bytes(GLM_5_2_LIKE, dtype="float8_e5m2", is_draft_worker=True)
        == everything
    )
    mla = dsa_config(attention_arch="mla", num_hidden_layers=2)
    assert reference_cell_size_bytes(mla, dtype="bfloat16") == 2 * 576 * 2


def test_fp8_dsa_cells_use_the_scaled_latent_row() -> None:
    """An fp8 e4m3 DSA row is SGLang's scaled one: 512 fp8 + 4 fp32 scales + 64 bf16 = 656
    bytes; e5m2 and MLA keep the raw 576."""
    assert reference_cell_size_bytes(GLM_5_2_LIKE, dtype="float8_e4m3fn") == 78 * 656 + 21 * 132
    mla = dsa_config(attention_arch="mla", num_hidden_layers=2)
    assert reference_cell_size_bytes(mla, dtype="float8_e4m3fn") == 2 * 576


def test_fp8_dsa_with_a_narrow_latent_has_no_row() -> None:
    """The scaled row needs kv_lora_rank a multiple of 128: otherwise a ValueError naming it."""
    narrow = dsa_config(num_hidden_layers=1, kv_lora_rank=64)
    with pytest.raises(ValueError, match="kv_lora_rank=64"):
        reference_cell_size_bytes(narrow, dtype="float8_e4m3fn")
    assert reference_cell_size_bytes(narrow, dtype="bfloat16") == (64 + 64) * 2 + 132


def test_hisparse_index_buffers_span_the_host_ratio() -> None:
    """With HiSparse every layer holds an indexer, with HISPARSE_INDEX_RATIO slots a token."""
    assert HISPARSE_INDEX_RATIO == 2
    every_layer = 78 * 576 + 78 * 132 * 2
    assert (
        reference_cell_size_bytes(GLM_5_2_LIKE, dtype="float8_e5m2", enable_hisparse=True)
        == every_layer
    )
    config = dsa_config(num_hidden_layers=1, kv_lora_rank=4, qk_rope_head_dim=4)
    # latent: (6 + 2) rows * 8 bytes; index: (12 + 2 + 1) // 2 = 7 pages of 2 * 132 bytes
    hisparse = reference_pool_bytes(
        config, num_tokens=6, dtype="float8_e5m2", page_size=2, enable_hisparse=True
    )
    assert hisparse == 8 * 8 + 7 * 2 * 132


def test_pool_bytes_by_hand() -> None:
    """Pool bytes count the padding page and whole index pages."""
    config = dsa_config(num_hidden_layers=2, kv_lora_rank=4, qk_rope_head_dim=4, cli_factor=2)
    # latent: 2 layers * (6 + 2) rows * 8 bytes; index: 1 layer * 4 pages * 2 * 132 bytes
    expected = 2 * 8 * 8 + 1 * ((6 + 2 + 1) // 2) * 2 * 132
    assert reference_pool_bytes(config, num_tokens=6, dtype="float8_e5m2", page_size=2) == expected


def test_max_total_num_tokens_is_the_largest_fit() -> None:
    """The token count fits the budget, one more page does not, and it is page-aligned."""
    budget = 10_000_000
    fp8 = {"dtype": "float8_e4m3fn", "page_size": 64}
    tokens = reference_max_total_num_tokens(GLM_5_2_LIKE, budget_bytes=budget, **fp8)
    assert tokens % 64 == 0 and tokens > 0
    assert reference_pool_bytes(GLM_5_2_LIKE, num_tokens=tokens, **fp8) <= budget
    assert reference_pool_bytes(GLM_5_2_LIKE, num_tokens=tokens + 64, **fp8) > budget
    assert (
        reference_max_total_num_tokens(MHA_EMBEDDING, budget_bytes=1, dtype="bfloat16", page_size=1)
        == 0
    )


# --- pool families -------------------------------------------------------------------------


def family_config(arch: str = "mha", **markers: object) -> SimpleNamespace:
    base = {
        "attention_arch": arch,
        "sliding_window": None,
        "is_hybrid_linear": False,
        "kv_cache_quant_algo": None,
    }
    return SimpleNamespace(**(base | markers))


FLAG_ON = {"prefill_only_disable_kv_cache": True}

UNSUPPORTED = [
    pytest.param(family_config(), {}, None, id="plain-mha"),
    pytest.param(
        family_config("mla", sliding_window=128), {}, "hybrid DSA/MLA-SWA KV pool", id="mla-swa"
    ),
    pytest.param(family_config("dsa", is_hybrid_linear=True), {}, "DSA/MLA KV pool", id="dsa"),
    pytest.param(family_config("mla"), {}, "MLA KV pool", id="mla"),
    pytest.param(
        family_config("mla", is_hybrid_linear=True),
        {},
        "hybrid linear/Mamba KV pool",
        id="mla-mamba",
    ),
    pytest.param(
        family_config(sliding_window=4096, is_hybrid_linear=True), {}, "SWA KV pool", id="swa"
    ),
    pytest.param(
        family_config(is_hybrid_linear=True), {}, "hybrid linear/Mamba KV pool", id="mamba"
    ),
    # "auto" never selects FP4 from a checkpoint (SGLang 0.5.23 configure_kv_cache_dtype).
    pytest.param(family_config(kv_cache_quant_algo="NVFP4"), {}, None, id="fp4-ckpt-stays-mha"),
    pytest.param(
        family_config(kv_cache_quant_algo="NVFP4"),
        {"kv_cache_dtype": "bfloat16"},
        None,
        id="explicit-dtype-overrides-ckpt",
    ),
    pytest.param(family_config(), {"kv_cache_dtype": "nvfp4"}, "FP4 MHA KV pool", id="fp4-flag"),
]


@pytest.mark.parametrize(("config", "extra_flags", "family"), UNSUPPORTED)
def test_unsupported_family_precedence(
    config: object, extra_flags: dict, family: str | None
) -> None:
    """With the flag on, the first unsupported family in SGLang's order is named."""
    flags = FLAG_ON | extra_flags
    assert reference_unsupported_family(flags, config) == family
    assert reference_unsupported_family(flags, config, is_draft_worker=True) is None
    assert reference_unsupported_family(extra_flags, config) is None


def test_pool_family_selection() -> None:
    """The flag turns plain MHA into the NoOp pool; drafts and flag-off keep the model's pool."""
    assert reference_pool_family(FLAG_ON, family_config()) == "noop"
    assert reference_pool_family({}, family_config()) == "mha"
    assert reference_pool_family(FLAG_ON, family_config(), is_draft_worker=True) == "mha"
    assert reference_pool_family(FLAG_ON, family_config("dsa"), is_draft_worker=True) == "dsa"
    with pytest.raises(RuntimeError, match="DSA/MLA KV pool"):
        reference_pool_family(FLAG_ON, family_config("dsa"))


# --- the scaled fp8 latent layout -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"family": "mla"}, "needs family='dsa'"),
        ({"dtype": "float8_e5m2"}, "dtype='float8_e4m3fn'"),
        ({"kv_lora_rank": 96}, "kv_lora_rank a positive multiple of 128"),
        ({"latent_layout": "packed"}, r"not in \('raw', 'scaled'\)"),
    ],
    ids=["mla", "e5m2", "rank-96", "unknown"],
)
def test_scaled_spec_combinations_are_refused(fields: dict, message: str) -> None:
    """A scaled latent layout is for float8_e4m3fn DSA specs with whole 128-blocks only."""
    base = {
        "family": "dsa",
        "size": 2,
        "page_size": 1,
        "layer_num": 1,
        "dtype": "float8_e4m3fn",
        "kv_lora_rank": 128,
        "latent_layout": "scaled",
    }
    with pytest.raises(ValueError, match=message):
        PoolSpec(**{**base, **fields})


def test_fp8_encoder_matches_torch_on_a_grid_and_at_ties() -> None:
    """The reference's own e4m3 encoder equals torch's cast on every multiple of 1/64 in
    [-448, 448], on the subnormals and on halfway values (ties to even)."""
    import torch

    grid = torch.cat(
        [
            torch.arange(-448 * 64, 448 * 64 + 1) / 64,
            torch.arange(0, 17) * 2.0**-10,  # subnormal steps and the halves between them
            torch.tensor([-0.0, 17.0, 19.0, 9.25, 416.0 + 8.0]),
        ]
    )
    expected = grid.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert [fp8_e4m3fn_byte(v) for v in grid.tolist()] == expected


def test_scaled_write_quantizes_each_block_and_keeps_the_rope_bytes() -> None:
    """Two blocks get their own scales; a zero stays zero; rope bytes pass unchanged;
    set_kv_buffer and writes in another dtype are refused."""
    spec = PoolSpec(
        family="dsa",
        size=2,
        page_size=1,
        layer_num=1,
        dtype="float8_e4m3fn",
        kv_lora_rank=256,
        qk_rope_head_dim=1,
        latent_layout="scaled",
    )
    # Three 266-byte latent rows (256 + 8 + 2) and four index-K pages of 132 bytes.
    assert spec.variant == "dsa:scaled" and expected_kv_size_bytes(spec) == 3 * 266 + 4 * 132
    one, four, zero = b"\x80\x3f", b"\x80\x40", b"\x00\x00"
    nope = one * 127 + zero + four * 128
    ref = ReferencePool(spec)
    write = WriteMLA(layer_id=0, locs=(1,), nope_rows=(nope,), rope_rows=(b"\x12\x34",))
    assert ref.expected_error(write) is ValueError  # bf16 parts must say so
    ref.apply(WriteMLA(**{**write.__dict__, "dtype": "bfloat16"}))
    row = ref.expected_kv_buffer(0)[1]
    assert set(row[:127]) == {0x7E} and row[127] == 0 and set(row[128:256]) == {0x7E}
    scales = np.frombuffer(row[256:264].tobytes(), "<f4")
    assert scales.tolist() == [np.float32(1) / np.float32(448), np.float32(4) / np.float32(448)]
    assert row[264:].tolist() == [0x12, 0x34]
    assert ref.expected_error(WriteKV(layer_id=0, locs=(1,), k_rows=(bytes(266),))) is ValueError


# --- decode context parallel ---------------------------------------------------------------

#: Rank 1 of 2: widened ids 0..11, the odd ones at rows 0..5; raw fp8 rows of 2 bytes.
DCP = PoolSpec(
    family="dsa",
    size=4,
    page_size=2,
    layer_num=1,
    dtype="float8_e5m2",
    kv_lora_rank=1,
    qk_rope_head_dim=1,
    dcp_size=2,
    dcp_rank=1,
)


def test_dcp_write_keeps_the_ranks_own_ids_at_their_rows() -> None:
    """Widened id 3 lands in row 1; id 2 (rank 0's) is dropped; id 12 is out of range."""
    ref = ReferencePool(DCP)
    ref.apply(WriteMLA(layer_id=0, locs=(2, 3), nope_rows=(b"a", b"b"), rope_rows=(b"x", b"y")))
    assert ref.expected_kv_buffer(0)[:, 0].tolist() == [0, ord("b"), 0, 0, 0, 0]
    assert ref.rejects(WriteMLA(layer_id=0, locs=(12,), nope_rows=(b"a",), rope_rows=(b"x",)))


def test_dcp_refuses_set_kv_buffer_and_cross_rank_moves_and_misaligned_copies() -> None:
    """set_kv_buffer: RuntimeError; a move across ranks and a copy whose position 0 is not
    rank 0's: ValueError; a same-rank move and an aligned copy are accepted."""
    ref = ReferencePool(DCP)
    assert ref.expected_error(WriteKV(layer_id=0, locs=(1,), k_rows=(b"ab",))) is RuntimeError
    assert ref.expected_error(Move(tgt=(4,), src=(3,))) is ValueError
    assert ref.expected_error(Move(tgt=(5,), src=(3,))) is None
    assert ref.expected_error(HostCopy(name="a", indices=(1, 2))) is ValueError
    assert ref.expected_error(HostCopy(name="a", indices=(4, 5, 6))) is None


def test_dcp_index_keys_cover_every_widened_id() -> None:
    """Index keys are not split: (4 + 2) * 2 - 2 = 10 ids of index_buf_size, so 6 pages
    of 2 (every widened id), and a move of rank 0's ids moves the key on rank 1 too."""
    ref = ReferencePool(DCP)
    assert DCP.effective_index_buf_size == 10 and expected_num_index_pages(DCP) == 6
    key, scale = bytes(range(128)), bytes(4)
    ref.apply(WriteIndexK(layer_id=0, locs=(11,), key_rows=(key,), scale_rows=(scale,)))
    ref.apply(Move(tgt=(2,), src=(0,)))
    ref.apply(Move(tgt=(9,), src=(11,)))
    pages = ref.expected_index_k_buffer(0)
    assert pages[4, 128:256].tolist() == list(key) and pages[5, 128:256].tolist() == list(key)
