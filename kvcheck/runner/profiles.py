"""kvcheck's Hypothesis settings profiles.

=====================  ===================================================================
``kvcheck-dev``        local runs: 100 examples per property, fresh randomness each run.
``kvcheck-ci``         CI: like dev; failures go to the shared database for replay.
``kvcheck-thorough``   nightly / GPU runners: 2000 examples, longer state-machine runs.
``kvcheck-smoke``      a quick pass (a quarter of dev's examples): CI's older sglang
                       releases, whose newest sibling runs the full profile.
``kvcheck-campaign``   ``kvcheck campaign``'s shards: 1000 examples, state-machine runs of
                       20 steps, one bug per property (each shard also has its own seed).
``kvcheck-replay``     only the explicit and stored examples (``kvcheck replay``).
=====================  ===================================================================

All keep ``deadline=None`` (device warm-up and shared CI cores make per-example timing
meaningless), ``print_blob=True`` (every failure prints its ``@reproduce_failure``) and the
example database named by ``KVCHECK_DB``.

Searching profiles leave out Hypothesis's explain phase, which re-runs the shrunk example
hundreds of times only to add an "always run by failing" note: on a state machine it took
most of the time to a report (docs/development.md). ``KVCHECK_EXPLAIN=1`` (or
``explain=True``) puts it back. ``kvcheck-dev``, ``kvcheck-ci`` and ``kvcheck-campaign``
also report one bug per property (``report_multiple_bugs=False``): the first failure is
shrunk, allowed to slip to any smaller failure, and reported, instead of each distinct
failure being shrunk in turn; ``kvcheck-thorough`` still reports them all.

Hypothesis turns the database *off* in its own ``ci`` profile, which it loads whenever
``CI`` is set; ``kvcheck-ci`` keeps it on so that a failure found by a runner can be
replayed elsewhere.

The profile in effect is ``--kvcheck-profile``, else ``KVCHECK_PROFILE``, else
``kvcheck-ci`` when ``CI`` is set and ``kvcheck-dev`` otherwise.

Example:
    >>> register_profiles()
    >>> from hypothesis import settings
    >>> settings.get_profile(DEV).max_examples
    100
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import ExampleDatabase

from kvcheck.runner.db import (
    DATABASE_ENV_VAR,
    RecordingDatabase,
    TargetDatabase,
    database_from_env,
)

__all__ = [
    "CAMPAIGN",
    "CI",
    "DEV",
    "EXPLAIN_ENV_VAR",
    "KNOWN_ENV_VARS",
    "PROFILE_ENV_VAR",
    "PROFILE_NAMES",
    "REPLAY",
    "SMOKE",
    "THOROUGH",
    "choose_profile_to_load",
    "default_profile_name",
    "explain_requested",
    "profile_options",
    "register_profiles",
    "unknown_env_warnings",
]

DEV = "kvcheck-dev"
CI = "kvcheck-ci"
THOROUGH = "kvcheck-thorough"
REPLAY = "kvcheck-replay"
CAMPAIGN = "kvcheck-campaign"
SMOKE = "kvcheck-smoke"
PROFILE_NAMES: tuple[str, ...] = (DEV, CI, THOROUGH, REPLAY, CAMPAIGN, SMOKE)
PROFILE_ENV_VAR = "KVCHECK_PROFILE"
#: Set to 1/true/yes/on to run Hypothesis's explain phase in the searching profiles.
EXPLAIN_ENV_VAR = "KVCHECK_EXPLAIN"
#: Every ``KVCHECK_*`` variable kvcheck, its scripts or its CI read; any other one is most
#: likely a typo (``tests/test_profiles_db.py`` finds the ones they read and checks this list).
KNOWN_ENV_VARS: tuple[str, ...] = (
    "KVCHECK_TARGET",
    "KVCHECK_DEVICE",
    PROFILE_ENV_VAR,
    DATABASE_ENV_VAR,
    EXPLAIN_ENV_VAR,
    "KVCHECK_SGLANG_VERSION",  # scripts/install_sglang.sh (docs/sglang-releases.md sets it)
    "KVCHECK_TORCH_PIN",  # scripts/install_sglang.sh
    "KVCHECK_CI_SCRATCH",  # .ci/run
    "KVCHECK_GPU_CHECK_PROBE",  # scripts/gpu_check.py, to its own pytest runs
    "KVCHECK_BENCH_T0",  # scripts/bench_time_to_report.py, to its own pytest runs
    "KVCHECK_BENCH_CLOCK",  # scripts/bench_time_to_report.py, to its own pytest runs
)

#: Hypothesis's built-in profiles: loaded without anyone choosing them.
_HYPOTHESIS_DEFAULT_PROFILES = ("default", "ci")

_COMMON: dict[str, Any] = {
    "deadline": None,
    "print_blob": True,
    # Example generation is timed on shared CI cores next to torch work; "too slow" there
    # says nothing about the strategies.
    "suppress_health_check": (HealthCheck.too_slow,),
}
#: Every phase but explain (see the module docstring); explain is opt-in.
_SEARCH_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_OPTIONS: dict[str, dict[str, Any]] = {
    DEV: {"max_examples": 100, "stateful_step_count": 10, "report_multiple_bugs": False},
    # Not derandomized: Hypothesis forbids a database with derandomize=True, and the
    # database is what lets a CI failure be replayed on another machine.
    CI: {"max_examples": 100, "stateful_step_count": 10, "report_multiple_bugs": False},
    THOROUGH: {"max_examples": 2000, "stateful_step_count": 100},
    REPLAY: {"phases": (Phase.explicit, Phase.reuse)},
    # Deeper than a default run: ten times the examples, twice the steps per example.
    CAMPAIGN: {"max_examples": 1000, "stateful_step_count": 20, "report_multiple_bugs": False},
    # Checks that every property still runs and holds on a sibling configuration (an older
    # release) whose full search runs elsewhere; not a verdict on new code.
    SMOKE: {"max_examples": 25, "stateful_step_count": 10, "report_multiple_bugs": False},
}
_TRUE = frozenset({"1", "true", "yes", "on"})


def explain_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KVCHECK_EXPLAIN`` asks for Hypothesis's explain phase (1/true/yes/on).

    Example:
        >>> explain_requested({"KVCHECK_EXPLAIN": "1"}), explain_requested({})
        (True, False)
    """
    env = os.environ if environ is None else environ
    return env.get(EXPLAIN_ENV_VAR, "").strip().lower() in _TRUE


def profile_options(name: str, *, explain: bool | None = None) -> dict[str, Any]:
    """The settings ``name`` sets, database excluded.

    ``explain`` adds Hypothesis's explain phase to a searching profile; ``None`` means
    :func:`explain_requested` (the ``KVCHECK_EXPLAIN`` variable).

    Example:
        >>> profile_options(CI)["deadline"] is None
        True
        >>> Phase.explain in profile_options(CI, explain=False)["phases"]
        False
        >>> Phase.explain in profile_options(CI, explain=True)["phases"]
        True
    """
    if name not in _OPTIONS:
        raise ValueError(f"name={name!r} is not a kvcheck profile; known: {PROFILE_NAMES}")
    if explain not in (None, True, False):
        raise ValueError(f"explain={explain!r} must be True, False or None")
    options = {**_COMMON, **_OPTIONS[name]}
    if "phases" not in options:
        wanted = explain_requested() if explain is None else explain
        options["phases"] = (*_SEARCH_PHASES, Phase.explain) if wanted else _SEARCH_PHASES
    return options


def register_profiles(
    database: ExampleDatabase | None = None, *, explain: bool | None = None
) -> None:
    """Register every kvcheck profile with ``database`` (re-registering replaces them).

    ``None`` builds the target's share (:class:`~kvcheck.runner.db.TargetDatabase`, the
    target ``KVCHECK_TARGET`` names, default ``kvcheck``) of the database ``KVCHECK_DB`` names,
    wrapped in a :class:`~kvcheck.runner.db.RecordingDatabase`. Raises
    :class:`kvcheck.runner.db.DatabaseSpecError` (a ``ValueError``) when ``KVCHECK_DB`` is
    unusable. ``explain`` is passed to :func:`profile_options`.

    Example:
        >>> from hypothesis.database import InMemoryExampleDatabase
        >>> register_profiles(InMemoryExampleDatabase())
    """
    if database is None:
        from kvcheck.targets import target_spec

        database = RecordingDatabase(TargetDatabase(database_from_env(), target_spec()))
    elif not isinstance(database, ExampleDatabase):
        raise ValueError(f"database={database!r} is not a Hypothesis ExampleDatabase")
    for name in PROFILE_NAMES:
        settings.register_profile(name, database=database, **profile_options(name, explain=explain))


def default_profile_name(environ: Mapping[str, str] | None = None) -> str:
    """``KVCHECK_PROFILE`` if set, else ``kvcheck-ci`` when ``CI`` is set, else ``kvcheck-dev``.

    Example:
        >>> default_profile_name({"CI": "true"})
        'kvcheck-ci'
        >>> default_profile_name({})
        'kvcheck-dev'
    """
    env = os.environ if environ is None else environ
    chosen = env.get(PROFILE_ENV_VAR, "").strip()
    if chosen:
        return chosen
    # Any value counts, as for Hypothesis, which treats CI=false as CI too.
    return CI if "CI" in env else DEV


def choose_profile_to_load(
    *,
    kvcheck_option: str | None,
    hypothesis_option: str | None,
    current: str,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Which profile the pytest plugin loads, or ``None`` to leave the current one alone.

    In order: ``--kvcheck-profile``; nothing when ``--hypothesis-profile`` was given
    (Hypothesis loads it); ``KVCHECK_PROFILE``; the kvcheck default when
    the current profile is one nobody chose (Hypothesis's ``default``, or its ``ci``
    profile, which would turn the database off), or a kvcheck profile from an earlier
    session in the same process; otherwise nothing, because the project loaded a profile
    of its own.

    Example:
        >>> choose_profile_to_load(kvcheck_option=None, hypothesis_option=None,
        ...                        current="ci", environ={"CI": "1"})
        'kvcheck-ci'
        >>> choose_profile_to_load(kvcheck_option=None, hypothesis_option=None,
        ...                        current="my-project", environ={}) is None
        True
    """
    env = os.environ if environ is None else environ
    if kvcheck_option:
        return kvcheck_option
    if hypothesis_option:
        return None
    if env.get(PROFILE_ENV_VAR, "").strip():
        return default_profile_name(env)
    if current in _HYPOTHESIS_DEFAULT_PROFILES or current in PROFILE_NAMES:
        if current == "ci":
            return CI  # Hypothesis detected a CI it knows, perhaps without CI itself set
        return default_profile_name(env)
    return None


def unknown_env_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``KVCHECK_*`` variable kvcheck does not read, with a did-you-mean.

    Example:
        >>> unknown_env_warnings({"KVCHECK_TARGE": "sglang", "KVCHECK_DB": "db"})
        ["unknown variable KVCHECK_TARGE='sglang' is ignored (did you mean KVCHECK_TARGET?)"]
    """
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    for name in sorted(env):
        if not name.startswith("KVCHECK_") or name in KNOWN_ENV_VARS:
            continue
        # Compare what follows the prefix: the shared "KVCHECK_" makes everything "close".
        suffixes = {known.removeprefix("KVCHECK_"): known for known in KNOWN_ENV_VARS}
        close = difflib.get_close_matches(name.removeprefix("KVCHECK_"), suffixes, n=1)
        hint = (
            f"did you mean {suffixes[close[0]]}?"
            if close
            else f"kvcheck reads {', '.join(KNOWN_ENV_VARS)}"
        )
        warnings.append(f"unknown variable {name}={env[name]!r} is ignored ({hint})")
    return warnings
