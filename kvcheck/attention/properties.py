"""Reusable checks of the premise behind the no-op pool.

Each ``check_*`` function builds its tensors from a ``VarlenBatch`` (and a
``PagedLayout`` where pages are involved), runs the paths it compares and raises
``AssertionError`` with a ``got ... but should be ... [context]`` message when they
disagree. The implementations under comparison are parameters, so kvcheck's own tests
can hand in deliberately broken ones and see each check fail.

Pools and the serving layer are imported when a check needs them, so the attention
code itself imports without them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvcheck.attention.batch import PagedLayout, VarlenBatch
from kvcheck.attention.padding import append_padding_segment
from kvcheck.attention.paged import LayerRef, paged_attention, write_kv_by_page
from kvcheck.attention.prefill import prefill_attention, uses_raw_kv
from kvcheck.attention.tolerances import assert_outputs_close
from kvcheck.attention.varlen import Backend, varlen_attention

AttentionFn = Callable[..., torch.Tensor]

#: The layer whose K/V the checks attend over; the pool's other layer holds decoy data,
#: so a read from the wrong layer shows up as a wrong output.
CHECKED_LAYER = 1
POOL_LAYERS = 2


def _context(**items: object) -> str:
    return "[" + ", ".join(f"{name}={value!r}" for name, value in items.items()) + "]"


def build_mha_pool(
    batch: VarlenBatch, layout: PagedLayout, *, dtype: torch.dtype, device: torch.device | str
) -> Any:
    """A ``kvcheck.pools.MHATokenToKVPool`` sized for ``layout`` with ``batch``'s heads.

    Example:
        >>> pool = build_mha_pool(batch, layout, dtype=torch.float32,
        ...                       device="cpu")   # doctest: +SKIP
    """
    from kvcheck.pools import MHATokenToKVPool

    return MHATokenToKVPool(
        size=layout.pool_size,
        page_size=layout.page_size,
        dtype=dtype,
        head_num=batch.num_kv_heads,
        head_dim=batch.head_dim,
        layer_num=POOL_LAYERS,
        device=device,
        v_head_dim=batch.effective_v_head_dim,
    )


def _fill_decoy_layers(
    pool: Any, batch: VarlenBatch, layout: PagedLayout, *, dtype: torch.dtype, device: Any
) -> None:
    """Write unrelated K/V at the same slots of every layer but the checked one."""
    slots = torch.tensor(layout.token_slots(batch.seq_lens), dtype=torch.int64, device=device)
    _, k, v = batch.make_qkv(dtype=dtype, device=device, salt=7)
    for layer_id in range(POOL_LAYERS):
        if layer_id != CHECKED_LAYER:
            pool.set_kv_buffer(LayerRef(layer_id), slots, k, v)


def check_paged_matches_raw(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    paged_fn: AttentionFn = paged_attention,
) -> None:
    """Attention on raw K/V equals attention on K/V written to a pool and read by page.

    Exact for fp32 on the CPU; within ``tolerances.TOLERANCES["paged_vs_raw", ...]``
    otherwise. ``paged_fn`` has ``paged_attention``'s signature (tests pass broken ones).

    Example:
        >>> check_paged_matches_raw(VarlenBatch(seq_lens=(3,), num_heads=2, num_kv_heads=1,
        ...                                     head_dim=8),
        ...                         scrambled_layout((3,), page_size=2),
        ...                         dtype=torch.float32, device="cpu")   # doctest: +SKIP
    """
    layout.check_fits(batch.seq_lens)
    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    cu = batch.cu_seqlens_tensor(device=device)
    table = layout.page_table_tensor(device=device)
    options = batch.attention_options
    raw = varlen_attention(q, k, v, cu, batch.max_seqlen, backend=backend, **options)

    pool = build_mha_pool(batch, layout, dtype=dtype, device=device)
    _fill_decoy_layers(pool, batch, layout, dtype=dtype, device=device)
    write_kv_by_page(pool, layer_id=CHECKED_LAYER, k=k, v=v, cu_seqlens=cu, page_table=table)
    paged = paged_fn(
        q,
        pool,
        cu,
        batch.max_seqlen,
        layer_id=CHECKED_LAYER,
        page_table=table,
        backend=backend,
        **options,
    )
    assert_outputs_close(
        paged,
        raw,
        comparison="paged_vs_raw",
        context=_context(batch=batch, layout=layout, dtype=dtype, backend=backend),
    )


def serving_model_config(batch: VarlenBatch) -> Any:
    """A plain-MHA ``kvcheck.serving.ModelConfig`` with ``batch``'s heads and dims."""
    from kvcheck.serving import ModelConfig

    return ModelConfig(
        name="varlen-mha",
        attention_arch="mha",
        num_hidden_layers=POOL_LAYERS,
        num_attention_heads=batch.num_heads,
        num_key_value_heads=batch.num_kv_heads,
        head_dim=batch.head_dim,
        v_head_dim=batch.effective_v_head_dim,
    )


def embedding_server_args(*, prefill_only_disable_kv_cache: bool, device: str) -> Any:
    """``ServerArgs`` for an embedding prefill-only server, with the flag on or off.

    Everything the flag requires is set either way, so the two pools differ only in
    the flag.
    """
    from kvcheck.serving import ServerArgs

    return ServerArgs(
        is_embedding=True,
        prefill_only_disable_kv_cache=prefill_only_disable_kv_cache,
        chunked_prefill_size=-1,
        disable_radix_cache=True,
        prefill_attention_backend="fa3",
        device=device,
    )


def check_noop_pool_matches_full_pool(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    prefill_fn: AttentionFn = prefill_attention,
) -> None:
    """With ``--prefill-only-disable-kv-cache`` the serving layer's pool gives the same outputs.

    Through ``kvcheck.serving.select_kv_pool``: the flag on yields the no-op pool, which
    refuses writes (``RuntimeError``), so the backend takes the raw-K/V path; the flag
    off yields a full pool, written and read by page. The outputs must agree exactly
    for fp32 on the CPU (``paged_vs_raw`` tolerances otherwise). ``prefill_fn`` has
    ``prefill_attention``'s signature.

    Example:
        >>> check_noop_pool_matches_full_pool(batch, layout, dtype=torch.float32,
        ...                                   device="cpu")   # doctest: +SKIP
    """
    from kvcheck.pools import NoOpMHATokenToKVPool
    from kvcheck.serving import select_kv_pool

    layout.check_fits(batch.seq_lens)
    device_name = str(device)
    model = serving_model_config(batch)
    pools = {}
    for flag in (True, False):
        args = embedding_server_args(prefill_only_disable_kv_cache=flag, device=device_name)
        pools[flag] = select_kv_pool(
            args,
            model,
            max_total_num_tokens=layout.pool_size,
            page_size=layout.page_size,
            dtype=dtype,
            device=device,
        )
    noop_pool, full_pool = pools[True], pools[False]
    context = _context(batch=batch, layout=layout, dtype=dtype, backend=backend)
    if not isinstance(noop_pool, NoOpMHATokenToKVPool):
        raise AssertionError(
            f"got {type(noop_pool).__name__} but should be NoOpMHATokenToKVPool "
            f"[select_kv_pool with --prefill-only-disable-kv-cache] {context}"
        )
    if isinstance(full_pool, NoOpMHATokenToKVPool):
        raise AssertionError(f"got the no-op pool without the flag {context}")
    on_args = embedding_server_args(prefill_only_disable_kv_cache=True, device=device_name)
    if not uses_raw_kv(on_args, model):
        raise AssertionError(f"the flag's required settings do not select raw K/V {context}")

    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    cu = batch.cu_seqlens_tensor(device=device)
    table = layout.page_table_tensor(device=device)
    options = {**batch.attention_options, "layer_id": CHECKED_LAYER, "page_table": table}
    try:
        prefill_fn(
            q,
            k,
            v,
            cu,
            batch.max_seqlen,
            pool=noop_pool,
            skip_kv_cache=False,
            backend=backend,
            **options,
        )
    except RuntimeError:
        pass
    else:
        raise AssertionError(
            f"got a paged prefill through the no-op pool but should be a RuntimeError "
            f"(the no-op pool must refuse writes) {context}"
        )
    skipped = prefill_fn(
        q,
        k,
        v,
        cu,
        batch.max_seqlen,
        pool=noop_pool,
        skip_kv_cache=True,
        backend=backend,
        **options,
    )
    _fill_decoy_layers(full_pool, batch, layout, dtype=dtype, device=device)
    paged = prefill_fn(
        q,
        k,
        v,
        cu,
        batch.max_seqlen,
        pool=full_pool,
        skip_kv_cache=False,
        backend=backend,
        **options,
    )
    assert_outputs_close(skipped, paged, comparison="paged_vs_raw", context=context)


def padded_batch_tensors(
    batch: VarlenBatch,
    *,
    pad_tokens: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of ``batch`` followed by ``pad_tokens`` rows of unrelated values."""
    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    generator = torch.Generator().manual_seed(batch.seed + 12345)

    def pad(x: torch.Tensor) -> torch.Tensor:
        # Large, arbitrary values: whatever a graph bucket's stale rows hold.
        rows = 10 * torch.randn((pad_tokens, *x.shape[1:]), generator=generator)
        return torch.cat([x, rows.to(dtype=dtype, device=device)])

    return pad(q), pad(k), pad(v)


def check_padding_segment_isolates_real_tokens(
    batch: VarlenBatch,
    *,
    pad_tokens: int,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    attention_fn: AttentionFn = varlen_attention,
    pad_fn: Callable[..., tuple[torch.Tensor, int]] = append_padding_segment,
) -> None:
    """Padding the token dimension as a segment of its own leaves real outputs unchanged.

    Pads ``pad_tokens`` rows after the batch (as a captured CUDA-graph bucket does),
    extends ``cu_seqlens`` with ``pad_fn`` and checks that no output is NaN and the real
    tokens' outputs equal the unpadded call's exactly.

    Example:
        >>> check_padding_segment_isolates_real_tokens(batch, pad_tokens=5,
        ...     dtype=torch.float32, device="cpu")   # doctest: +SKIP
    """
    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    cu = batch.cu_seqlens_tensor(device=device)
    options = {**batch.attention_options, "backend": backend}
    unpadded = attention_fn(q, k, v, cu, batch.max_seqlen, **options)

    qp, kp, vp = padded_batch_tensors(batch, pad_tokens=pad_tokens, dtype=dtype, device=device)
    cu_padded, max_padded = pad_fn(cu, batch.max_seqlen, num_tokens=qp.shape[0])
    padded = attention_fn(qp, kp, vp, cu_padded, max_padded, **options)
    context = _context(batch=batch, pad_tokens=pad_tokens, dtype=dtype, backend=backend)
    nan_rows = padded.isnan().flatten(1).any(dim=1).nonzero().flatten().tolist()
    if nan_rows:
        raise AssertionError(
            f"got NaN outputs at token rows {nan_rows} but should be none {context}"
        )
    assert_outputs_close(
        padded[: batch.total_tokens], unpadded, comparison="padding", context=context
    )


def check_flash_matches_reference(
    batch: VarlenBatch,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cuda",
    flash_fn: AttentionFn | None = None,
) -> None:
    """flash-attn's ``flash_attn_varlen_func`` agrees with the torch reference.

    Within ``TOLERANCES["flash_vs_torch", ...]``. ``flash_fn`` defaults to
    ``varlen_attention(backend="flash")``.

    Example:
        >>> check_flash_matches_reference(batch, dtype=torch.bfloat16)   # doctest: +SKIP
    """
    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    cu = batch.cu_seqlens_tensor(device=device)
    options = batch.attention_options
    expected = varlen_attention(q, k, v, cu, batch.max_seqlen, backend="torch", **options)
    if flash_fn is None:
        actual = varlen_attention(q, k, v, cu, batch.max_seqlen, backend="flash", **options)
    else:
        actual = flash_fn(q, k, v, cu, batch.max_seqlen, **options)
    assert_outputs_close(
        actual,
        expected,
        comparison="flash_vs_torch",
        context=_context(batch=batch, dtype=dtype),
    )


def check_causal_suffix_matches_full(
    batch: VarlenBatch,
    query_lens: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    attention_fn: AttentionFn = varlen_attention,
) -> None:
    """The mask is aligned bottom-right: a query suffix sees what it sees in full attention.

    For each sequence of ``n`` tokens, its last ``query_lens[s]`` queries attending over
    all ``n`` keys (``seqlen_q < seqlen_k``, as in chunked prefill or decode) must give
    the last ``query_lens[s]`` rows of full self-attention, masks and windows included.
    A top-left-aligned mask fails this.

    Example:
        >>> check_causal_suffix_matches_full(batch, (1, 2), dtype=torch.float32,
        ...                                  device="cpu")   # doctest: +SKIP
    """
    if len(query_lens) != len(batch.seq_lens):
        raise ValueError(
            f"query_lens={tuple(query_lens)} must have one entry per sequence "
            f"({len(batch.seq_lens)})"
        )
    for s, (m, n) in enumerate(zip(query_lens, batch.seq_lens, strict=True)):
        if not 0 <= m <= n:
            raise ValueError(f"query_lens[{s}]={m} not in [0, seq_lens[{s}]={n}]")
    q, k, v = batch.make_qkv(dtype=dtype, device=device)
    cu = batch.cu_seqlens_tensor(device=device)
    options = {**batch.attention_options, "backend": backend}
    full = attention_fn(q, k, v, cu, batch.max_seqlen, **options)

    rows = torch.cat(
        [
            torch.arange(end - m, end)
            for m, end in zip(query_lens, batch.cu_seqlens[1:], strict=True)
        ]
    ).to(device)
    cu_q = torch.tensor(
        [0, *torch.tensor(list(query_lens)).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    suffix = attention_fn(
        q[rows],
        k,
        v,
        cu_q,
        max(query_lens),
        cu_seqlens_k=cu,
        max_seqlen_k=batch.max_seqlen,
        **options,
    )
    assert_outputs_close(
        suffix,
        full[rows],
        comparison="suffix_vs_full",
        context=_context(batch=batch, query_lens=tuple(query_lens), dtype=dtype),
    )
