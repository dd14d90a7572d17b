"""Reusable checks of the premise behind the no-op pool.

Each ``check_*`` function builds its tensors from a ``VarlenBatch`` (and a
``PagedLayout`` where pages are involved), runs the paths it compares and raises
:class:`kvcheck.properties.PropertyFailure` (an ``AssertionError``) with a
``got ... but should be ... [context]`` message and a
:class:`~kvcheck.failures.FailureSignature` (``check="attention"``) when
they disagree. The implementations under comparison are parameters, so kvcheck's own
tests can hand in deliberately broken ones and see each check fail.

The checks that involve pools get them from a target (:mod:`kvcheck.targets`): through
``make_pool`` (:func:`check_paged_matches_raw`) or the target itself
(:func:`check_noop_pool_matches_full_pool`, which also asks ``select_pool_family``);
kvcheck's own target when none is given. A pool is written with ``set_kv_buffer`` and
read back only through its read API (``get_key_buffer``/``get_value_buffer`` and
``get_kv_buffer``, global layer ids), with decoy data in the layers on either side of the
one attended over, so a read of the wrong layer changes the output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvcheck.attention.batch import PagedLayout, VarlenBatch
from kvcheck.attention.padding import append_padding_segment
from kvcheck.attention.paged import (
    READ_APIS,
    ReadApi,
    paged_attention,
    write_kv_by_page,
)
from kvcheck.attention.prefill import prefill_attention, uses_raw_kv
from kvcheck.attention.tolerances import assert_outputs_close
from kvcheck.attention.varlen import Backend, varlen_attention
from kvcheck.failures import FailureSignature, PropertyFailure
from kvcheck.serving import ServerArgs
from kvcheck.specs import DTYPE_ITEMSIZE, PoolSpec
from kvcheck.targets.builtin import KVCheckTarget
from kvcheck.validation import check_valid_integer
from kvcheck.vocabulary import MINIMAL_VALID_FLAGS, ModelConfig

AttentionFn = Callable[..., torch.Tensor]
#: Builds the pool a ``PoolSpec`` describes (``lambda spec: target.make_pool(spec, device=d)``).
PoolFactory = Callable[[PoolSpec], Any]

#: The local layer whose K/V the checks attend over; the pool's layers on either side hold
#: decoy data, so a read from the layer below or above (an off-by-one, a read that ignores
#: ``start_layer``) shows up as a wrong output.
CHECKED_LAYER = 1
POOL_LAYERS = 3
#: The ``check`` of every failure signature raised here.
CHECK = "attention"


def _context(**items: object) -> str:
    return "[" + ", ".join(f"{name}={value!r}" for name, value in items.items()) + "]"


def _signature(call: str, kind: str, family: str) -> FailureSignature:
    return FailureSignature(check=CHECK, call=call, kind=kind, family=family)


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(f"dtype={dtype} must be one of torch.{sorted(DTYPE_ITEMSIZE)}")
    return name


def _check_start_layer(start_layer: object) -> int:
    return check_valid_integer(start_layer, "start_layer", min_value=0, error=ValueError)


def attention_pool_spec(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    family: str = "mha",
    start_layer: int = 0,
) -> PoolSpec:
    """The ``PoolSpec`` of a pool that holds ``layout``'s pages for ``batch``'s K/V heads.

    ``POOL_LAYERS`` layers from global layer ``start_layer``; ``family`` is "mha" or
    "noop".

    Example:
        >>> batch = VarlenBatch(seq_lens=(3,), num_heads=2, num_kv_heads=1, head_dim=8)
        >>> spec = attention_pool_spec(batch, PagedLayout(page_size=2, num_pages=2,
        ...     page_tables=((1, 2),)), dtype=torch.float32, start_layer=2)
        >>> spec.size, spec.page_size, spec.dtype, list(spec.layer_ids)
        (4, 2, 'float32', [2, 3, 4])
    """
    if family not in ("mha", "noop"):
        raise ValueError(f"family={family!r} must be 'mha' or 'noop'")
    return PoolSpec(
        family="mha" if family == "mha" else "noop",
        size=layout.pool_size,
        page_size=layout.page_size,
        layer_num=POOL_LAYERS,
        dtype=_dtype_name(dtype),
        start_layer=_check_start_layer(start_layer),
        head_num=batch.num_kv_heads,
        head_dim=batch.head_dim,
        v_head_dim=batch.v_head_dim,
    )


def target_pool_factory(target: Any, *, device: torch.device | str) -> PoolFactory:
    """``make_pool`` of ``target`` on ``device``, as the ``make_pool`` the checks take.

    Example:
        >>> from kvcheck.targets import resolve_target
        >>> make_pool = target_pool_factory(resolve_target("kvcheck"), device="cpu")
        >>> batch = VarlenBatch(seq_lens=(1,), num_heads=1, num_kv_heads=1, head_dim=8)
        >>> layout = PagedLayout(page_size=1, num_pages=1, page_tables=((1,),))
        >>> type(make_pool(attention_pool_spec(batch, layout, dtype=torch.float32))).__name__
        'MHATokenToKVPool'
    """
    device_name = str(device)
    return lambda spec: target.make_pool(spec, device=device_name)


@dataclass(frozen=True)
class PagedCase:
    """A pool laid out for a batch and its pages, and the batch's tensors on its device."""

    pool: Any
    spec: PoolSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens: torch.Tensor
    page_table: torch.Tensor


def paged_case(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    make_pool: PoolFactory | None = None,
    start_layer: int = 0,
) -> PagedCase:
    """The pool ``make_pool(attention_pool_spec(...))`` (kvcheck's own when None) for
    ``batch`` laid out by ``layout``, with the batch's q, k, v, ``cu_seqlens`` and page
    table. Raises ``ValueError`` when the layout does not fit the batch.

    Example:
        >>> from kvcheck.attention.batch import scrambled_layout
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> case = paged_case(batch, scrambled_layout((3, 2), page_size=2),
        ...                   dtype=torch.float32, device="cpu")
        >>> type(case.pool).__name__, tuple(case.page_table.shape), tuple(case.k.shape)
        ('MHATokenToKVPool', (2, 2), (5, 1, 4))
    """
    layout.check_fits(batch.seq_lens)
    spec = attention_pool_spec(batch, layout, dtype=dtype, start_layer=start_layer)
    if make_pool is None:
        make_pool = target_pool_factory(_builtin_target(), device=device)
    q, k, v, cu, _ = batch.attention_args(dtype=dtype, device=device)
    table = layout.page_table_tensor(device=device)
    return PagedCase(make_pool(spec), spec, q, k, v, cu_seqlens=cu, page_table=table)


def _builtin_target() -> Any:
    return KVCheckTarget()


def _pool_call(
    method: str,
    call: str,
    family: str,
    context: str,
    fn: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``, a valid call of the target's ``method`` (shown as ``call``):
    any exception it raises is the target's failure."""
    __tracebackhide__ = True
    try:
        return fn(*args, **kwargs)
    except PropertyFailure:
        raise
    except Exception as exc:
        raise PropertyFailure(
            f"got {type(exc).__name__}: {exc} but should be no exception [{call}] {context}",
            signature=_signature(method, f"raised {type(exc).__name__}", family),
        ) from exc


def _write_layer(family: str, context: str, **write: Any) -> None:
    """``write_kv_by_page(**write)``; any exception it raises is the target's failure."""
    __tracebackhide__ = True
    call = f"set_kv_buffer(layer_id={write['layer_id']})"
    _pool_call("set_kv_buffer", call, family, context, write_kv_by_page, **write)


def _fill_decoy_layers(
    pool: Any,
    batch: VarlenBatch,
    layout: PagedLayout,
    spec: PoolSpec,
    *,
    dtype: torch.dtype,
    device: Any,
    context: str,
) -> None:
    """Write unrelated K/V at the same slots of every layer but the checked one."""
    pages = {"cu_seqlens": batch.cu_seqlens_tensor(device=device)}
    pages["page_table"] = layout.page_table_tensor(device=device)
    checked = spec.start_layer + CHECKED_LAYER
    for layer_id in spec.layer_ids:
        if layer_id != checked:
            # A different draw per layer: a read of either neighbour is told apart.
            _, k, v = batch.make_qkv(dtype=dtype, device=device, salt=7 + layer_id)
            _write_layer(spec.family, context, pool=pool, layer_id=layer_id, k=k, v=v, **pages)


def check_paged_matches_raw(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    paged_fn: AttentionFn = paged_attention,
    make_pool: PoolFactory | None = None,
    start_layer: int = 0,
) -> None:
    """Attention on raw K/V equals attention on K/V written to a pool and read by page.

    The pool is ``make_pool(attention_pool_spec(...))`` (kvcheck's own MHA pool when
    ``make_pool`` is None), serving ``POOL_LAYERS`` layers from global layer
    ``start_layer``. Decoy K/V go to every layer but ``start_layer + CHECKED_LAYER``;
    ``batch``'s K/V go there with one ``set_kv_buffer``, and are read back through each
    read API in :data:`kvcheck.attention.paged.READ_APIS` in turn. Exact for fp32 on the
    CPU; within ``tolerances.TOLERANCES["paged_vs_raw", ...]`` otherwise. ``paged_fn``
    has ``paged_attention``'s signature (tests pass broken ones).

    Example:
        >>> from kvcheck.attention import scrambled_layout
        >>> check_paged_matches_raw(VarlenBatch(seq_lens=(3,), num_heads=2, num_kv_heads=1,
        ...                                     head_dim=8),
        ...                         scrambled_layout((3,), page_size=2),
        ...                         dtype=torch.float32, device="cpu", start_layer=1)
    """
    case = paged_case(
        batch, layout, dtype=dtype, device=device, make_pool=make_pool, start_layer=start_layer
    )
    pool, spec, q, k, v = case.pool, case.spec, case.q, case.k, case.v
    cu, table = case.cu_seqlens, case.page_table
    options = batch.attention_options
    raw = varlen_attention(q, k, v, cu, batch.max_seqlen, backend=backend, **options)

    context = _context(
        batch=batch, layout=layout, dtype=dtype, start_layer=start_layer, backend=backend
    )
    _fill_decoy_layers(pool, batch, layout, spec, dtype=dtype, device=device, context=context)
    layer_id = start_layer + CHECKED_LAYER
    pages = {"cu_seqlens": cu, "page_table": table}
    _write_layer(spec.family, context, pool=pool, layer_id=layer_id, k=k, v=v, **pages)
    args = (q, pool, cu, batch.max_seqlen)
    paged_options = {**options, "layer_id": layer_id, "page_table": table, "backend": backend}
    read: ReadApi
    for read in ("split", "kv"):
        call = f"{READ_APIS[read]}(layer_id={layer_id})"
        paged = _pool_call(
            READ_APIS[read], call, spec.family, context, paged_fn, *args, read=read, **paged_options
        )
        assert_outputs_close(
            paged,
            raw,
            comparison="paged_vs_raw",
            context=f"{context} [read through {call}]",
            signature=_signature(READ_APIS[read], "outputs differ", spec.variant),
        )


def serving_model_config(batch: VarlenBatch, *, num_hidden_layers: int = POOL_LAYERS) -> Any:
    """A plain-MHA ``kvcheck.vocabulary.ModelConfig`` with ``batch``'s heads and dims.

    Example:
        >>> batch = VarlenBatch(seq_lens=(3,), num_heads=4, num_kv_heads=2, head_dim=8)
        >>> serving_model_config(batch).num_key_value_heads
        2
    """
    return ModelConfig(
        name="varlen-mha",
        attention_arch="mha",
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=batch.num_heads,
        num_key_value_heads=batch.num_kv_heads,
        head_dim=batch.head_dim,
        v_head_dim=batch.effective_v_head_dim,
    )


def embedding_flags(*, prefill_only_disable_kv_cache: bool) -> dict[str, Any]:
    """``ServerArgs`` flags of an embedding prefill-only server, with the flag on or off.

    Everything the flag requires is set either way (embedding mode, unchunked prefill, no
    radix cache, the fa3 backend), so the two configurations differ only in the flag.
    Plain field names, as ``Target.select_pool_family`` takes them.

    Example:
        >>> embedding_flags(prefill_only_disable_kv_cache=True)["chunked_prefill_size"]
        -1
    """
    return {**MINIMAL_VALID_FLAGS, "prefill_only_disable_kv_cache": prefill_only_disable_kv_cache}


def embedding_server_args(*, prefill_only_disable_kv_cache: bool, device: str) -> Any:
    """kvcheck's ``ServerArgs`` built from :func:`embedding_flags` on ``device``.

    Example:
        >>> embedding_server_args(prefill_only_disable_kv_cache=True,
        ...                       device="cpu").disable_radix_cache
        True
    """
    flags = embedding_flags(prefill_only_disable_kv_cache=prefill_only_disable_kv_cache)
    return ServerArgs(**flags, device=device)


def _selected_family(
    target: Any, flags: Mapping[str, Any], model: Any, *, expected: str, context: str
) -> None:
    """Raise unless ``target`` builds an ``expected``-family pool for a worker under ``flags``."""
    __tracebackhide__ = True
    call = (
        "select_pool_family(prefill_only_disable_kv_cache="
        f"{flags['prefill_only_disable_kv_cache']}, is_draft=False)"
    )
    family = _pool_call(
        "select_pool_family",
        call,
        expected,
        context,
        target.select_pool_family,
        flags,
        model,
        is_draft=False,
    )
    if family != expected:
        raise PropertyFailure(
            f"got {family!r} but should be {expected!r} [{call}] {context}",
            signature=_signature("select_pool_family", "wrong family", expected),
        )


def _assert_write_refused(
    pool: Any, *, layer_id: int, k: torch.Tensor, v: torch.Tensor, cu: Any, table: Any, context: str
) -> None:
    """The no-op pool raises ``RuntimeError`` on a valid write (a paged prefill's first step)."""
    __tracebackhide__ = True
    call = f"set_kv_buffer(layer_id={layer_id}) on the no-op pool"
    try:
        write_kv_by_page(pool, layer_id=layer_id, k=k, v=v, cu_seqlens=cu, page_table=table)
    except RuntimeError:
        return
    except Exception as exc:
        raise PropertyFailure(
            f"got {type(exc).__name__}: {exc} but should be RuntimeError [{call}] {context}",
            signature=_signature("set_kv_buffer", "wrong exception", "noop"),
        ) from exc
    raise PropertyFailure(
        f"got no exception but should be RuntimeError (the no-op pool must refuse writes) "
        f"[{call}] {context}",
        signature=_signature("set_kv_buffer", "no exception", "noop"),
    )


def check_noop_pool_matches_full_pool(
    batch: VarlenBatch,
    layout: PagedLayout,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend = "auto",
    prefill_fn: AttentionFn = prefill_attention,
    target: Any = None,
    start_layer: int = 0,
) -> None:
    """With ``--prefill-only-disable-kv-cache`` the target's pool gives the full pool's outputs.

    ``target`` (kvcheck's own when None) must pick the "noop" family for a plain-MHA
    worker with the flag and its required settings (:func:`embedding_flags`), and "mha"
    without the flag (``select_pool_family``). Both pools come from ``target.make_pool``
    (``POOL_LAYERS`` layers from ``start_layer``). The no-op pool must refuse a paged
    prefill's write with ``RuntimeError``, so the backend takes the raw-K/V path; the
    full pool, with decoys in the other layers, is written and read by page. The outputs
    must agree exactly for fp32 on the CPU (``paged_vs_raw`` tolerances otherwise).
    ``prefill_fn`` has ``prefill_attention``'s signature.

    Example:
        >>> from kvcheck.attention import scrambled_layout
        >>> check_noop_pool_matches_full_pool(VarlenBatch(seq_lens=(2, 3), num_heads=2,
        ...                                               num_kv_heads=1, head_dim=8),
        ...                                   scrambled_layout((2, 3), page_size=2),
        ...                                   dtype=torch.float32, device="cpu")
    """
    layout.check_fits(batch.seq_lens)
    if target is None:
        target = _builtin_target()
    flag_on = embedding_flags(prefill_only_disable_kv_cache=True)
    flag_off = embedding_flags(prefill_only_disable_kv_cache=False)
    model = serving_model_config(batch, num_hidden_layers=start_layer + POOL_LAYERS)
    context = _context(
        batch=batch, layout=layout, dtype=dtype, start_layer=start_layer, backend=backend
    )
    _selected_family(target, flag_on, model, expected="noop", context=context)
    _selected_family(target, flag_off, model, expected="mha", context=context)
    if not uses_raw_kv(SimpleNamespace(**flag_on), model):
        raise PropertyFailure(
            f"got the paged path but should be raw K/V [uses_raw_kv({flag_on})] {context}",
            signature=_signature("uses_raw_kv", "wrong path", "noop"),
        )

    specs = {
        family: attention_pool_spec(
            batch, layout, dtype=dtype, family=family, start_layer=start_layer
        )
        for family in ("noop", "mha")
    }
    make_pool = target_pool_factory(target, device=device)
    noop_pool, full_pool = make_pool(specs["noop"]), make_pool(specs["mha"])
    args = batch.attention_args(dtype=dtype, device=device)
    _, k, v, cu, _ = args
    table = layout.page_table_tensor(device=device)
    layer_id = start_layer + CHECKED_LAYER
    _assert_write_refused(
        noop_pool, layer_id=layer_id, k=k, v=v, cu=cu, table=table, context=context
    )
    options = {**batch.attention_options, "layer_id": layer_id, "page_table": table}
    options["backend"] = backend
    skipped = prefill_fn(*args, pool=noop_pool, skip_kv_cache=True, **options)
    _fill_decoy_layers(
        full_pool, batch, layout, specs["mha"], dtype=dtype, device=device, context=context
    )
    call = f"prefill_attention(layer_id={layer_id}) through the full pool"
    full = {"pool": full_pool, "skip_kv_cache": False}
    paged = _pool_call(
        "prefill_attention", call, "mha", context, prefill_fn, *args, **full, **options
    )
    # The raw-K/V path is kvcheck's own attention, the paged one runs the target's pool:
    # the raw outputs are what the pool's should be.
    assert_outputs_close(
        paged,
        skipped,
        comparison="paged_vs_raw",
        context=context,
        signature=_signature("prefill_attention", "outputs differ", "mha"),
    )


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
        >>> import torch
        >>> from kvcheck.attention.batch import VarlenBatch
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> check_padding_segment_isolates_real_tokens(batch, pad_tokens=5,
        ...     dtype=torch.float32, device="cpu")
    """
    args = batch.attention_args(dtype=dtype, device=device)
    options = {**batch.attention_options, "backend": backend}
    unpadded = attention_fn(*args, **options)

    *_, cu, max_seqlen = args
    qp, kp, vp = padded_batch_tensors(batch, pad_tokens=pad_tokens, dtype=dtype, device=device)
    cu_padded, max_padded = pad_fn(cu, max_seqlen, num_tokens=qp.shape[0])
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

    Example (on CPU, with the torch reference standing in for flash-attn):
        >>> import torch
        >>> from kvcheck.attention.batch import VarlenBatch
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> from kvcheck.attention.varlen import varlen_attention
        >>> def torch_fn(*args, **kwargs):
        ...     return varlen_attention(*args, backend="torch", **kwargs)
        >>> check_flash_matches_reference(batch, dtype=torch.bfloat16, device="cpu",
        ...                               flash_fn=torch_fn)
    """
    args = batch.attention_args(dtype=dtype, device=device)
    options = batch.attention_options
    expected = varlen_attention(*args, backend="torch", **options)
    if flash_fn is None:
        actual = varlen_attention(*args, backend="flash", **options)
    else:
        actual = flash_fn(*args, **options)
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
        >>> import torch
        >>> from kvcheck.attention.batch import VarlenBatch
        >>> batch = VarlenBatch(seq_lens=(3, 2), num_heads=2, num_kv_heads=1, head_dim=4)
        >>> check_causal_suffix_matches_full(batch, (1, 2), dtype=torch.float32,
        ...                                  device="cpu")
    """
    if len(query_lens) != len(batch.seq_lens):
        raise ValueError(
            f"query_lens={tuple(query_lens)} must have one entry per sequence "
            f"({len(batch.seq_lens)})"
        )
    for s, (m, n) in enumerate(zip(query_lens, batch.seq_lens, strict=True)):
        if not 0 <= m <= n:
            raise ValueError(f"query_lens[{s}]={m} not in [0, seq_lens[{s}]={n}]")
    args = batch.attention_args(dtype=dtype, device=device)
    q, k, v, cu, _ = args
    options = {**batch.attention_options, "backend": backend}
    full = attention_fn(*args, **options)

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
