"""The target protocol: what the property suite needs from an implementation under test.

A target adapts one implementation (kvcheck's own pools, the installed ``sglang``, or a
user's package) to a small, fixed surface. The suite never imports pool code directly;
it asks the target. What a target cannot do is declared in ``unsupported`` with a
reason, and the suite turns each such capability into a skip that quotes the reason.

Example:
    >>> from kvcheck.targets import resolve_target
    >>> target = resolve_target("kvcheck")
    >>> spec = PoolSpec(family="mla", size=4, page_size=2, layer_num=1, dtype="bfloat16")
    >>> pool = target.make_pool(spec, device="cpu")
    >>> type(pool).__name__
    'MLATokenToKVPool'
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvcheck.specs import PoolSpec, SWAPoolSpec

# Two tiers of contract
# ---------------------
# **Core invariants** hold on valid input for every target; declaring a capability away
# only skips the checks that need that capability's methods:
#
# - after every step of a random operation sequence every buffer equals the reference
#   byte for byte, read raw (``k_buffer``/``v_buffer``/``kv_buffer``/
#   ``index_k_with_scale_buffer``) and through the read API attention uses
#   (``get_key_buffer``, ``get_value_buffer``, ``get_kv_buffer``,
#   ``get_index_k_with_scale_buffer``, ``get_mla_kv_buffer``) with global layer ids;
# - no call changes a tensor the caller passed in (locations, payloads, host copies);
# - ``start_layer``, ``layer_num`` and ``end_layer`` describe the layers served;
# - skip layers hold zero bytes; accounting (``get_kv_size_bytes``, ``mem_usage``,
#   ``get_state_buf_infos``, ``get_contiguous_buf_infos``) equals the bytes held;
# - every write to the no-op pool raises ``RuntimeError`` naming the pool and a flag;
# - pools sized by the configurator fit their budget.
#
# **Hardening** (capability ``input_validation``): bad input (locations outside
# ``[0, size + page_size)``, repeated write targets, wrong shapes, dtypes or lengths, a
# layer the pool does not serve, an index-K write to a skip layer) raises ``ValueError``
# and leaves the pool and the caller's tensors unchanged. Declaring it unsupported skips
# exactly those checks; the core invariants above still run.
#
# A known discrepancy is declared as a ``Finding`` (``findings``), never as a missing
# capability: the suite steers around its own failure and keeps checking the rest.

# CAPABILITIES (the capability names) live in kvcheck.declaration, below the strategies,
# which read a target's declaration too.

#: Separates a capability from a pool family in a per-family ``unsupported`` key:
#: ``"meta_device:mha"`` means "pools of family mha cannot be built on meta", while MLA
#: and DSA pools can. A plain ``"meta_device"`` key covers every family.
FAMILY_SEPARATOR = ":"

#: Optional members a target may add to the protocol below; the suite uses each only
#: when present, so a target written before they existed keeps working.
#:
#: ``prepare()``
#:     One-time setup (heavy imports, say) that the pytest plugin runs once per test
#:     process, right after resolving the target and before any test, so that a test
#:     never pays for it or sees its side effects (a changed recursion limit inside a
#:     Hypothesis test is an error). An exception stops the run, naming the target. A
#:     target may read what it builds from the implementation here: its ``surface`` and
#:     ``unsupported`` may narrow once prepared (the xdist controller, which runs no test,
#:     does not prepare; the results take a worker's surface).
#: ``surface: kvcheck.surface.Surface``
#:     What the target builds: the pool families, and per family the variants it takes
#:     beyond the baseline (MHA's head-major layout, DSA's scaled latent row and index
#:     kpool, MLA/DSA decode context parallel: :data:`kvcheck.surface.AXES`) and the values
#:     it accepts for other fields (sglang's DSA pool: 64-token index pages). The suite draws
#:     specs inside it (:mod:`kvcheck.strategies.limits`) and skips a family it leaves out;
#:     ``kvcheck verify`` prints it. Default: every family, baseline variants only, so a
#:     target written before a variant existed is never given one. A subclass inherits its
#:     parent's. (Targets written before surfaces may still declare ``pool_spec_limits``,
#:     ``kv_layouts``, ``latent_layouts``, ``index_kpools`` and ``dcp_sizes``; they are
#:     read into a surface by :func:`kvcheck.surface.surface_of`.)
#: ``declaration: kvcheck.declaration.Declaration``
#:     What the target builds (and how), refuses (and on which releases) or cannot reach, one
#:     typed row per variant, tier, capability or upstream code range, with its findings
#:     (:mod:`kvcheck.declaration`). Its refused variants narrow the surface, its host-tier
#:     rows the host layouts of a variant, its unreached rows explain reach's gaps. Default:
#:     the rows the target's surface implies (:func:`kvcheck.declaration.declaration_of`).
#: ``describe() -> str``
#:     A short note on the installed version, printed after the target's name and version in
#:     the run's header and summary (sglang: whether kvcheck is checked against the installed
#:     release). A target that follows the release it finds says so here, once, instead of
#:     warning.
#: ``unavailable: str | None``
#:     Why the target cannot run on this machine (a package it drives is not installed);
#:     the resolver refuses it for a run, quoting this, but still hands it out for what
#:     needs only its declarations (reproduction scripts, the reach table).
#: ``identity_parameters: Mapping[str, object]``
#:     The parameters that change what the target builds (a target class that serves
#:     several pools, one per instance: ``{"family": "mha", "pool": MoveIgnoresV}``). With
#:     its class's module and qualified name they make the target's identity
#:     (:func:`kvcheck.targets.target_identity`), which keys its stored examples, however
#:     ``--target`` spelled it. Default: none (the class alone), or the instance's ``name``
#:     when it set one that differs from its class's.
#: ``script_recipe(spec, ops) -> ScriptRecipe | None``
#:     How a standalone reproduction script builds the target's pool without kvcheck
#:     (:class:`ScriptRecipe`); ``None`` (or no member): the script calls ``make_pool``.
#: ``pd_registration(pool) -> Mapping[str, tuple[ptrs, lens, item_lens]]``
#:     What PD disaggregation registers for ``pool`` with its transfer engine: the KV
#:     component (``"kv"``) and each state component, by name. The census checks that it
#:     covers every state tensor once
#:     (:func:`kvcheck.properties.census.assert_registration_covers_census`); no member:
#:     that check is skipped, quoting why.
#: ``hicache_assembly(pool, req_to_token_pool=None) -> list[str]``
#:     What the target's HiCache (its hierarchical host cache) fails to assemble for a
#:     composed ``pool`` (a linear hybrid's with its ``req_to_token_pool``): one line per
#:     host pool the pool or a sub-pool declares that the assembled group leaves out
#:     (empty: whole); an error the assembly raises propagates. The census's
#:     ``test_*_hicache_assembly`` tests read it; no member: they are skipped, quoting why.
#: ``make_qsa_hybrid(spec: LinearHybridSpec, *, device) -> (kv_pool, req_to_token_pool)``
#:     A linear-attention hybrid with a QSA index cache (compressed keys, one row per group
#:     of token slots; a pending ring of rows per request). Only the census runs on it
#:     (``test_qsa_hybrid_census``); no member: that test is skipped, quoting why.
#: ``reach_table: str``
#:     The module (``PACKAGE``, ``SCOPES``; see ``tools/reach.py``) that says which of
#:     the target's code ``python tools/reach.py`` measures; why each unreached range
#:     stays unreached is in the target's declaration (``Unreached`` rows of upstream
#:     code, :meth:`kvcheck.declaration.Declaration.unreached_code`).
#: ``classes() -> list[kvcheck.targets.discovery.ClassEntry]``
#:     Every pool class the upstream package defines, each built (how) or not (why), from
#:     the package itself and the target's declaration (:mod:`kvcheck.targets.discovery`):
#:     a class the declaration does not know reads ``not built: new in <release>``.
#:     ``kvcheck classes`` lists them; the run's summary gives the counts.
#: ``expected_failures: Mapping[str, str]``
#:     pytest node-id pattern -> reason. Tests of the suite that match (see
#:     :func:`kvcheck.targets.expected_failure_reason`) run as strict expected failures:
#:     a failure is reported as XFAIL with the reason, and a pass fails the run (XPASS
#:     strict), so a fixed discrepancy cannot go unnoticed.
#: ``findings: Sequence[kvcheck.targets.findings.Finding]``
#:     Known discrepancies, each matched by the failure it causes (property, call, kind
#:     of difference, family), never by test id: the suite steers around them and any
#:     other failure still fails the run; each is pinned by its own tests, which must
#:     fail with exactly that failure (see :mod:`kvcheck.targets.findings`). Prefer this
#:     to ``expected_failures``, which marks whole tests and so hides any other bug in them.
#: ``unsized_kv_cache_dtypes: Mapping[str, str]``
#:     Quantized ``--kv-cache-dtype`` choices (``mxfp8``, ``nvfp4``, ``fp4_mx_block16``)
#:     the target's configurator does not size -> why. The quantized configurator property
#:     draws only the others (it is skipped where none is left). Default: every one sized.
OPTIONAL_MEMBERS: tuple[str, ...] = (
    "prepare",
    "describe",
    "unavailable",
    "identity_parameters",
    "surface",
    "declaration",
    "script_recipe",
    "reach_table",
    "classes",
    "expected_failures",
    "findings",
    "unsized_kv_cache_dtypes",
    "pd_registration",
    "hicache_assembly",
    "make_qsa_hybrid",
)


@dataclass(frozen=True)
class PoolArguments:
    """How a target builds the pool a spec describes: the class, by import path, and the
    keyword arguments of its constructor (plain values and torch dtypes, whose ``repr``
    is the source that names them).

    A target's ``pool_arguments(spec, device=...)`` is the one place that maps a
    :class:`~kvcheck.specs.PoolSpec` to a constructor call: its ``make_pool``, the
    reproduction scripts (which print the call) and kvcheck's broken twins all go through it.

    Example:
        >>> arguments = PoolArguments("fractions:Fraction", {"numerator": 1, "denominator": 2})
        >>> arguments.build()
        Fraction(1, 2)
        >>> print(arguments.call_source("pool"))
        pool = Fraction(
            numerator=1,
            denominator=2,
        )
    """

    pool_class: str
    kwargs: Mapping[str, Any]

    def __post_init__(self) -> None:
        module, _, name = self.pool_class.partition(":")
        if not module or not name:
            raise ValueError(f"pool_class={self.pool_class!r} must be 'module:ClassName'")

    @property
    def module(self) -> str:
        """The module that defines the pool class."""
        return self.pool_class.partition(":")[0]

    @property
    def class_name(self) -> str:
        """The pool class's name inside :attr:`module`."""
        return self.pool_class.partition(":")[2]

    def resolve(self) -> Any:
        """The pool class (importing its module)."""
        target: Any = importlib.import_module(self.module)
        for part in self.class_name.split("."):
            target = getattr(target, part)
        return target

    def build(self, cls: Any = None) -> Any:
        """``cls(**kwargs)``; ``cls`` defaults to :meth:`resolve` (a twin passes its own)."""
        return (self.resolve() if cls is None else cls)(**self.kwargs)

    def call_source(self, variable: str, *, qualifier: str = "") -> str:
        """The constructor call as source, one argument a line: ``variable = ClassName(``
        (``qualifier.ClassName`` when the class is reached through a module name)."""
        name = f"{qualifier}.{self.class_name}" if qualifier else self.class_name
        arguments = "".join(f"\n    {key}={value!r}," for key, value in self.kwargs.items())
        return f"{variable} = {name}({arguments}\n)"


@dataclass(frozen=True)
class ScriptRecipe:
    """How a standalone reproduction script builds a target's pool (kvcheck's runner writes
    the rest: the calls, the expected bytes, the checks).

    A target offers one through ``script_recipe(spec, ops)``; without one (or when it returns
    ``None``) the script imports the target and calls its ``make_pool``.

    Example:
        >>> recipe = ScriptRecipe(needs="torch and mypkg", imports=("from mypkg import Pool",),
        ...                       build=("pool = Pool(size=8)",))
        >>> recipe.index_k_write
        'pool.set_index_k_scale_buffer'
    """

    #: What the script needs to run, for its header ("torch and sglang ...").
    needs: str
    #: Import lines, run first (a failure makes the script exit CANNOT RUN).
    imports: tuple[str, ...]
    #: Lines that bind ``pool``.
    build: tuple[str, ...]
    #: Imports of the target's own module, run once the directory kvcheck imported it from
    #: is on ``sys.path`` (after ``imports``, so that a folder there named like an installed
    #: package cannot shadow it).
    target_imports: tuple[str, ...] = ()
    #: Standard-library modules the setup uses, imported with the script's own.
    modules: tuple[str, ...] = ()
    #: Source run after the imports, before the pool is built: what a launched server
    #: would have provided (a failure makes the script exit CANNOT RUN).
    setup: str = ""
    #: How the script writes DSA index keys: a pool method, or a target's ``write_index_k``
    #: (``"target.write_index_k"``, which takes the pool first).
    index_k_write: str = "pool.set_index_k_scale_buffer"


# --- a target's reach table (see tools/reach.py) ----------------------------------------


@dataclass(frozen=True)
class Scope:
    """Part of one source file to measure.

    ``file`` is relative to the target's package directory (``srt/mem_cache/x.py``);
    ``names`` are top-level class or function names in it, or a class's method
    (``"Class.method"``) (``None``: the whole file);
    ``headline`` says whether its lines count towards the headline figure.
    """

    file: str
    names: tuple[str, ...] | None = None
    headline: bool = False


@runtime_checkable
class Target(Protocol):
    """Something the suite can check.

    Pools returned by ``make_pool`` must follow SGLang's pool API (``k_buffer``,
    ``set_kv_buffer``, ``move_kv_cache``, ...). Serving-side methods take plain values:
    ``flags`` is a dict of ``ServerArgs`` field names to values, ``model`` a
    :class:`kvcheck.vocabulary.ModelConfig`.
    """

    name: str
    version: str
    #: capability, or "capability:family", -> reason it is unavailable (empty when the
    #: target can do everything). See :data:`FAMILY_SEPARATOR` and :data:`OPTIONAL_MEMBERS`
    #: for the optional members (``prepare``, ``surface``, ``expected_failures``, ``findings``).
    unsupported: Mapping[str, str]

    def make_pool(self, spec: PoolSpec, *, device: str) -> Any:
        """Build the pool ``spec`` describes on ``device``.

        A target that can say how (kvcheck's and sglang's do) also has
        ``pool_arguments(spec, *, device) -> PoolArguments``, which ``make_pool`` builds from
        and the reproduction scripts print.
        """
        ...

    def write_index_k(
        self, pool: Any, layer_id: int, loc: Any, index_k: Any, index_k_scale: Any
    ) -> None:
        """DSA index-K write (``set_index_k_scale_buffer`` or an equivalent)."""
        ...

    def validate_server_args(self, flags: Mapping[str, Any]) -> None:
        """Build and validate server arguments; raise ``ValueError`` on a rejected combination."""
        ...

    def select_pool_family(self, flags: Mapping[str, Any], model: Any, *, is_draft: bool) -> str:
        """Return the family of the pool that would be built ("mha", "noop", "mla", "dsa").

        Raise ``RuntimeError`` where the flags and the model cannot be served.
        """
        ...

    def cell_size_bytes(
        self, model: Any, *, dtype: str, is_draft: bool, enable_hisparse: bool
    ) -> int:
        """Bytes one token costs across all layers."""
        ...

    def max_total_num_tokens(
        self,
        model: Any,
        *,
        budget_bytes: int,
        dtype: str,
        page_size: int,
        is_draft: bool,
        enable_hisparse: bool,
    ) -> int:
        """Page-aligned token capacity for a memory budget."""
        ...

    def dsa_layer_skips_topk(self, model: Any, layer_id: int) -> bool:
        """Whether DSA layer ``layer_id`` reuses the previous layer's top-k."""
        ...

    def skip_topk_layers(self, model: Any) -> Sequence[bool]:
        """The per-layer skip mask a DSA pool for ``model`` is built with."""
        ...


def swa_pool_arguments(
    full: PoolArguments, swa: PoolArguments, spec: SWAPoolSpec, *, device: str
) -> dict[str, Any]:
    """The keyword arguments of an SGLang-style ``SWAKVPool`` for ``spec``, whose sides are
    built as ``full`` and ``swa`` describe (their classes and arguments, less the size,
    dtype and layer count the hybrid passes to each side itself).

    Example:
        >>> from kvcheck.specs import PoolSpec
        >>> sub = PoolSpec(family="mha", size=4, page_size=1, layer_num=2,
        ...                dtype="bfloat16", head_num=1, head_dim=2)
        >>> spec = SWAPoolSpec(sub, size_swa=2, swa_layers=(False, True))
        >>> side = PoolArguments("kvcheck.pools.mha:MHATokenToKVPool", {"dtype": "bf16"})
        >>> kwargs = swa_pool_arguments(side, side, spec, device="cpu")
        >>> kwargs["size_swa"], kwargs["swa_attention_layer_ids"], kwargs["full_kv_pool_kwargs"]
        (2, [1], {})
    """
    own = ("size", "dtype", "layer_num")
    return {
        "size": spec.sub.size,
        "size_swa": spec.size_swa,
        "page_size": spec.sub.page_size,
        "dtype": full.kwargs["dtype"],
        "head_num": spec.sub.head_num,
        "head_dim": spec.sub.head_dim,
        "swa_attention_layer_ids": list(spec.swa_layer_ids),
        "full_attention_layer_ids": list(spec.full_layer_ids),
        "device": device,
        "full_kv_pool_class": full.resolve(),
        "swa_kv_pool_class": swa.resolve(),
        "full_kv_pool_kwargs": {k: v for k, v in full.kwargs.items() if k not in own},
        "swa_kv_pool_kwargs": {k: v for k, v in swa.kwargs.items() if k not in own},
    }
