"""The kvcheck pytest plugin (kvcheck.runner.plugin) and its device rules (kvcheck.runner.devices).

Most checks run pytest in-process through ``pytester``; the xdist check runs a subprocess.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from kvcheck.runner import devices

pytest_plugins = ["pytester"]

_FAKE_TARGET = """
    from types import MappingProxyType
    from kvcheck.targets.builtin import KVCheckTarget

    class FakeTarget(KVCheckTarget):
        name = "fake"
        version = "1.2"
        unsupported = MappingProxyType({"move": "no move kernel"})

    target = FakeTarget()
"""
_HAS_CUDA = torch.cuda.is_available()


#: Settings of the outer run that must not reach inner runs (an outer xdist worker's
#: PYTEST_XDIST_* would make inner runs think they are xdist workers too).
_LEAKY_PREFIXES = ("KVCHECK_", "PYTEST_XDIST_")


@pytest.fixture(autouse=True)
def isolated_plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No KVCHECK_*/CI/xdist variables leak in; the Hypothesis profile registry is restored."""
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in ("CI", "GITHUB_ACTIONS"):
            monkeypatch.delenv(name)
    # Hypothesis offers no public way to unregister a profile, hence the private registry.
    saved = dict(settings._profiles)
    current = settings.get_current_profile_name()
    # Inner runs start as in a fresh process, not under the outer run's kvcheck profile.
    settings.load_profile("default")
    yield
    settings._profiles.clear()
    settings._profiles.update(saved)
    settings.load_profile(current)


@pytest.fixture
def fake_target(pytester: pytest.Pytester) -> str:
    """A third-party target module importable by the inner pytest run."""
    pytester.makepyfile(fake_target=_FAKE_TARGET)
    pytester.syspathinsert()
    return "fake_target:target"


# --- options, header, fixtures ---------------------------------------------------------------


def test_help_lists_options(pytester: pytest.Pytester) -> None:
    """pytest --help shows the three kvcheck options and their env variables."""
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    for option in ("--kvcheck-target", "--kvcheck-device", "--kvcheck-profile"):
        assert option in text
    assert "KVCHECK_TARGET" in text and "KVCHECK_DEVICE" in text


def test_header_names_target_device_profile_database_and_env(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The header shows target+version, device, profile, database and every KVCHECK_* var."""
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "db"))
    monkeypatch.setenv("KVCHECK_SOMETHING", "typo?")
    monkeypatch.setenv("KVCHECK_DEVICE", "cpu")  # an option would apply the profile everywhere
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        [
            "kvcheck target: kvcheck 0.1.0 ('kvcheck', default*",
            "kvcheck device: cpu (requested cpu)",
            "kvcheck hypothesis profile: kvcheck-dev for tests that use kvcheck*",
            f"kvcheck database: directory {tmp_path / 'db'} (examples keyed by the target "
            "each test uses; default 'kvcheck')",
            "kvcheck env: KVCHECK_DB=*, KVCHECK_DEVICE='cpu', KVCHECK_SOMETHING='typo?'",
            "kvcheck WARNING: unknown variable KVCHECK_SOMETHING='typo?' is ignored (kvcheck*",
        ]
    )
    assert result.ret == 0


@pytest.mark.parametrize("how", ["option", "env"])
def test_target_reaches_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_target: str, how: str
) -> None:
    """--kvcheck-target and KVCHECK_TARGET both choose the kvcheck_target fixture's target."""
    pytester.makepyfile(
        """
        def test_target(kvcheck_target):
            assert (kvcheck_target.name, kvcheck_target.version) == ("fake", "1.2")
        """
    )
    args = [f"--kvcheck-target={fake_target}"] if how == "option" else []
    if how == "env":
        monkeypatch.setenv("KVCHECK_TARGET", fake_target)
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"kvcheck target: fake 1.2 ('{fake_target}', from *"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kvcheck-target=nope"], "*unknown target 'nope'*valid targets*"),
        (["--kvcheck-target=no_such_module_x:t"], "*No module named 'no_such_module_x'*"),
        (["--kvcheck-device=gpu"], "*device='gpu' is not a kvcheck device*"),
        (["--kvcheck-profile=fast"], "*profile 'fast' is not registered*kvcheck-dev*"),
        (
            ["--kvcheck-profile=kvcheck-ci", "--hypothesis-profile=default"],
            "*give one of --kvcheck-profile*",
        ),
    ],
    ids=["unknown-target", "import-error", "bad-device", "bad-profile", "two-profiles"],
)
def test_bad_settings_stop_the_run(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    """A bad target, device or profile is a usage error that says what was tried."""
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_database_stops_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unusable KVCHECK_DB is a usage error naming the setting."""
    monkeypatch.setenv("KVCHECK_DB", "s3://bucket")
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*KVCHECK_DB='s3://bucket'*unsupported URL scheme*"])


@pytest.mark.skipif(_HAS_CUDA, reason="checks the error on a machine without CUDA")
def test_cuda_without_gpu_stops_the_run(pytester: pytest.Pytester) -> None:
    """--kvcheck-device cuda on a CPU-only machine stops the run saying CUDA is unavailable."""
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest("--kvcheck-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*needs CUDA, but torch.cuda.is_available() is False*"])


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--kvcheck-device=cpu"], None, "cpu"),
        ([], "cpu", "cpu"),
        ([], None, "cuda:0" if _HAS_CUDA else "cpu"),
    ],
    ids=["option", "env", "auto"],
)
def test_device_fixture(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: str | None,
    expected: str,
) -> None:
    """kvcheck_device is the resolved device string from the option, env or auto."""
    if env is not None:
        monkeypatch.setenv("KVCHECK_DEVICE", env)
    pytester.makepyfile(
        f"""
        def test_device(kvcheck_device):
            assert kvcheck_device == {expected!r}
        """
    )
    pytester.runpytest(*args).assert_outcomes(passed=1)


# --- markers ------------------------------------------------------------------------------------


def test_kvcheck_needs_skips_with_the_target_reason(
    pytester: pytest.Pytester, fake_target: str
) -> None:
    """A test needing a capability the target lacks is skipped quoting the target's reason."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kvcheck_needs("move")
        def test_move(kvcheck_target):
            raise AssertionError("must not run")

        @pytest.mark.kvcheck_needs("mha_pool")
        def test_mha(kvcheck_target):
            assert kvcheck_target.name == "fake"
        """
    )
    result = pytester.runpytest(f"--kvcheck-target={fake_target}", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED * test_*.py:3: target 'fake' does not support move (no move kernel)"]
    )


def test_unknown_capability_fails_the_test(pytester: pytest.Pytester) -> None:
    """A misspelled capability fails the test instead of skipping or passing it."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kvcheck_needs("hostcopy")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*kvcheck_needs on *test_typo*'hostcopy'*not kvcheck capab*"])


@pytest.mark.skipif(_HAS_CUDA, reason="the skip only happens without CUDA")
def test_gpu_marker_skips_on_cpu(pytester: pytest.Pytester) -> None:
    """@pytest.mark.gpu is skipped on CPU with a reason saying a CUDA device is needed."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device, but the kvcheck device is 'cpu'*"])


# --- profiles ----------------------------------------------------------------------------------


_PROFILE_PROBE = """
    from hypothesis import settings

    def test_profile(kvcheck_target):
        assert settings.get_current_profile_name() == {expected!r}
        assert settings.default.database is not None
"""


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, "kvcheck-dev"),
        ([], {"CI": "true"}, "kvcheck-ci"),
        (["--kvcheck-profile=kvcheck-thorough"], {"CI": "true"}, "kvcheck-thorough"),
        ([], {"KVCHECK_PROFILE": "kvcheck-replay"}, "kvcheck-replay"),
        (["--hypothesis-profile=kvcheck-thorough"], {}, "kvcheck-thorough"),
    ],
    ids=["local", "ci", "option", "env", "hypothesis-option"],
)
def test_profile_selection(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    expected: str,
) -> None:
    """The profile in effect follows option, env and CI, and keeps a database under CI."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(_PROFILE_PROBE.format(expected=expected))
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)


def test_project_profile_is_left_alone(pytester: pytest.Pytester) -> None:
    """A profile the project loads in its conftest is not replaced by kvcheck's default."""
    pytester.makeconftest(
        """
        from hypothesis import settings
        settings.register_profile("project", max_examples=7)
        settings.load_profile("project")
        """
    )
    pytester.makepyfile(_PROFILE_PROBE.format(expected="project"))
    pytester.runpytest().assert_outcomes(passed=1)


_NEIGHBOUR_SUITE = """
    import os

    from hypothesis import given, settings, strategies as st

    CALLS = []
    FIRST_RUN = "REPLAYING" not in os.environ

    @given(st.integers(0, 100))
    def test_plain_fails(x):
        if FIRST_RUN:
            assert settings.get_current_profile_name() == "default"
        assert x < 10

    @given(st.integers(0, 100))
    def test_kvcheck_fails(kvcheck_target, x):
        if FIRST_RUN:
            assert settings.get_current_profile_name() == "kvcheck-dev"
        assert x < 10

    @settings(max_examples=7)
    @given(st.integers())
    def test_kvcheck_own_settings(kvcheck_target, x):
        CALLS.append(x)

    def test_own_settings_kept_and_profile_put_back():
        if FIRST_RUN:
            assert len(CALLS) == 7
            assert settings.get_current_profile_name() == "default"
"""


def test_profile_applies_only_to_tests_that_use_kvcheck(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plain @given test keeps Hypothesis's profile and database; a kvcheck test gets
    kvcheck's profile and database, with its own @settings kept; the profile is put back."""
    monkeypatch.setenv("KVCHECK_DB", str(tmp_path / "kvcheck-db"))
    pytester.makepyfile(_NEIGHBOUR_SUITE)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=2)
    assert "AssertionError: assert 'default'" not in result.stdout.str()
    # Replaying kvcheck's database everywhere: only the kvcheck test had saved its example.
    monkeypatch.setenv("REPLAYING", "1")
    replay = pytester.runpytest("-p", "no:randomly", "--kvcheck-profile=kvcheck-replay")
    replay.assert_outcomes(passed=1, skipped=2, failed=1)  # nothing stored: skipped
    replay.stdout.fnmatch_lines(["FAILED *::test_kvcheck_fails*"])


def test_the_readme_downstream_snippet_takes_a_kvcheck_fixture_in_every_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's "In your own tests" snippet runs under kvcheck's profile: each of its
    tests asks pytest for a kvcheck fixture (so the plugin loads the profile around it, as
    the test above pins) and for nothing else (Hypothesis fills the rest)."""
    import inspect
    import re
    import sys
    import types

    from kvcheck.runner.plugin import _KVCHECK_FIXTURES
    from kvcheck.targets.builtin import KVCheckTarget

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("**In your own tests**", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert snippet is not None
    stub = types.ModuleType("my_kv")  # the README's target module (examples/own_pool/my_kv.py)
    stub.target = KVCheckTarget()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_kv", stub)
    namespace: dict[str, object] = {}
    exec(compile(snippet.group(1), "README.md", "exec"), namespace)
    tests = {name: value for name, value in namespace.items() if name.startswith("test_")}
    assert len(tests) == 2
    for name, test in tests.items():
        asked = set(inspect.signature(test).parameters)  # type: ignore[arg-type]
        assert asked and asked <= _KVCHECK_FIXTURES, (name, asked)


def test_fresh_process_of_an_unrelated_project_keeps_hypothesis_defaults(
    pytester: pytest.Pytester,
) -> None:
    """In its own process, a project with nothing of kvcheck runs under Hypothesis's own
    profile: default deadline, no kvcheck database."""
    pytester.makepyfile(
        """
        from hypothesis import given, settings, strategies as st

        @given(st.integers())
        def test_plain(x):
            assert settings.get_current_profile_name() == "default"
            assert settings.default.deadline is not None
            assert "Recording" not in type(settings.default.database).__name__
        """
    )
    pytester.runpytest_subprocess("-p", "no:randomly").assert_outcomes(passed=1)


@pytest.mark.parametrize("how", ["env", "addopts"])
def test_profile_everywhere_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """KVCHECK_PROFILE, or a kvcheck option in the project's addopts, applies kvcheck's
    profile to every test."""
    if how == "env":
        monkeypatch.setenv("KVCHECK_PROFILE", "kvcheck-dev")
    else:
        pytester.makeini("[pytest]\naddopts = --kvcheck-target=kvcheck\n")
    pytester.makepyfile(
        """
        from hypothesis import settings

        def test_plain():
            assert settings.get_current_profile_name() == "kvcheck-dev"
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_unknown_kvcheck_variable_warns_without_failing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelled KVCHECK_* variable is a warning with a did-you-mean, even under -W error."""
    monkeypatch.setenv("KVCHECK_TARGE", "sglang")
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    # A fresh process: in-process, pytest may warn that kvcheck (imported by this run) cannot
    # be rewritten, and -W error would turn pytest's own warning into the failure.
    result = pytester.runpytest_subprocess("-W", "error")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "kvcheck WARNING: unknown variable KVCHECK_TARGE='sglang' is ignored (did you mean "
            "KVCHECK_TARGET?)"
        ]
        * 2
    )


def test_unwritable_database_stops_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A KVCHECK_DB that cannot be created is a usage error naming the directory."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KVCHECK_DB", str(blocker / "db"))
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*KVCHECK_DB: cannot write failing examples to '{blocker / 'db'}'*"]
    )


def test_failed_save_is_reported_naming_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_target: str
) -> None:
    """A save that fails during the run is a warning naming the test, and in the results."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    def refuse(self: object, key: bytes, value: bytes) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(DirectoryBasedExampleDatabase, "save", refuse)
    pytester.makepyfile(_RESULTS_SUITE)
    result = pytester.runpytest(
        f"--kvcheck-target={fake_target}", "--kvcheck-results=results.json", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "kvcheck WARNING: * failing example(s) could not be saved*",
            "  *test_fails: PermissionError: *Permission denied*",
        ]
    )
    tests = {
        t["nodeid"].split("::")[-1]: t
        for t in json.loads((pytester.path / "results.json").read_text())["tests"]
    }
    assert tests["test_fails"]["save_errors"]
    assert not tests["test_passes"]["save_errors"]


def test_unrelated_project_gets_no_properties(pytester: pytest.Pytester) -> None:
    """Tests that use no kvcheck fixture or marker run as before: no junit properties added."""
    pytester.makepyfile(
        """
        from hypothesis import given, strategies as st

        @given(st.integers())
        def test_plain(x):
            assert isinstance(x, int)
        """
    )
    result = pytester.runpytest("--junit-xml=out.xml")
    result.assert_outcomes(passed=1)
    assert "kvcheck_statistics" not in (pytester.path / "out.xml").read_text()


# --- results for the kvcheck command -------------------------------------------------------------


_RESULTS_SUITE = """
    import pytest
    from hypothesis import given, strategies as st

    @given(st.integers())
    def test_passes(kvcheck_target, x):
        assert isinstance(x, int)

    @given(st.integers(0, 1000))
    def test_fails(x):
        assert x < 50

    @pytest.mark.kvcheck_needs("move")
    def test_skipped(kvcheck_target):
        pass
"""


def _assert_results(path: Path) -> dict:
    results = json.loads(path.read_text())
    tests = {test["nodeid"].split("::")[-1]: test for test in results["tests"]}
    assert tests["test_passes"]["outcome"] == "passed"
    assert tests["test_passes"]["statistics"]["examples"] == 100
    failing = tests["test_fails"]
    assert failing["outcome"] == "failed"
    assert failing["failures"][0]["reproduction"].startswith("Minimal example: test_fails(")
    assert failing["failures"][0]["example"].startswith("test_fails(")
    assert "x=50" in failing["failures"][0]["reproduction"]
    assert failing["failures"][0]["blob"].startswith("@reproduce_failure(")
    assert tests["test_skipped"]["outcome"] == "skipped"
    assert "no move kernel" in tests["test_skipped"]["skip_reason"]
    assert results["target"]["name"] == "fake"
    assert results["exit_status"] == 1
    return results


def test_results_file_records_statistics_and_reproductions(
    pytester: pytest.Pytester, fake_target: str
) -> None:
    """--kvcheck-results writes outcomes, example counts, skip reasons and failure blobs."""
    pytester.makepyfile(_RESULTS_SUITE)
    result = pytester.runpytest(
        f"--kvcheck-target={fake_target}", "--kvcheck-results=results.json", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    _assert_results(pytester.path / "results.json")


def test_progress_hands_over_a_failing_test_as_soon_as_it_ends(
    pytester: pytest.Pytester, fake_target: str
) -> None:
    """The progress stream (the kvcheck command's) carries a failing test's whole record in
    its own event, before the tests after it, so the command can report it at once."""
    pytester.makepyfile(_RESULTS_SUITE)
    with (pytester.path / "progress.jsonl").open("w") as progress:
        pytester.runpytest(
            f"--kvcheck-target={fake_target}",
            f"--kvcheck-progress-fd={progress.fileno()}",
            "--kvcheck-results=results.json",
            "-p",
            "no:randomly",
        )
    lines = (pytester.path / "progress.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    finished = [(event["nodeid"].split("::")[-1], event) for event in events[1:]]
    assert [name for name, _ in finished] == ["test_passes", "test_fails", "test_skipped"]
    assert [("record" in event) for _, event in finished] == [False, True, False]
    record = finished[1][1]["record"]
    assert record["outcome"] == "failed" and record["statistics"]["shrinks"] > 0
    assert record["failures"][0]["reproduction"].startswith("Minimal example: test_fails(")


def test_plugin_under_xdist_two_workers(pytester: pytest.Pytester, fake_target: str) -> None:
    """Under -n 2 the workers get the fixtures and their statistics reach the controller."""
    pytester.makepyfile(_RESULTS_SUITE)
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        f"--kvcheck-target={fake_target}",
        "--kvcheck-device=cpu",
        "--kvcheck-results=results.json",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["kvcheck target: fake 1.2*", "kvcheck device: cpu*"])
    results = _assert_results(pytester.path / "results.json")
    assert {test["device"] for test in results["tests"] if test["device"]} <= {"cpu"}


# --- device rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(None, "auto"), ("", "auto"), ("CPU", "cpu"), (" cuda ", "cuda"), ("cuda:3", "cuda:3")],
    ids=["none", "empty", "upper", "spaces", "index"],
)
def test_parse_device_spec(spec: str | None, expected: str) -> None:
    """Device specs are normalized; None and empty mean auto."""
    assert devices.parse_device_spec(spec) == expected


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "meta", "cuda:0:1"])
def test_parse_device_spec_rejects(spec: str) -> None:
    """Anything but auto/cpu/cuda/cuda:N is a ValueError listing the accepted forms."""
    with pytest.raises(ValueError, match=r"auto, cpu, cuda, cuda:N"):
        devices.parse_device_spec(spec)


def test_resolve_cpu_needs_no_gpu() -> None:
    """cpu resolves to cpu everywhere."""
    assert devices.resolve_device("cpu") == "cpu"


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [
        (None, 3, ["0", "1", "2"]),
        ("2,3", 8, ["2", "3"]),
        ("", 8, []),
        ("1,-1,2", 8, ["1"]),
        ("GPU-aa, GPU-bb", 0, ["GPU-aa", "GPU-bb"]),
    ],
    ids=["unset", "listed", "empty", "stops-at-invalid", "uuids"],
)
def test_visible_device_entries(visible: str | None, count: int, expected: list[str]) -> None:
    """Visible GPUs come from CUDA_VISIBLE_DEVICES when set, else from the GPU count."""
    assert devices.visible_device_entries(visible, count) == expected


@pytest.mark.parametrize(
    ("worker", "spec", "visible", "count", "initialized", "expected"),
    [
        ("gw0", "auto", None, 4, False, "0"),
        ("gw5", "auto", None, 4, False, "1"),
        ("gw1", "cuda", "4,6", 8, False, "6"),
        ("gw2", "cuda", "4,6", 8, False, "4"),
        (None, "auto", None, 4, False, None),
        ("gw1", "cpu", None, 4, False, None),
        ("gw1", "cuda:2", None, 4, False, None),
        ("gw1", "auto", None, 1, False, None),
        ("gw1", "auto", None, 0, False, None),
        ("gw1", "auto", None, 4, True, None),
    ],
    ids=[
        "first-worker",
        "wraps-round",
        "within-visible",
        "wraps-visible",
        "not-xdist",
        "cpu",
        "explicit-index",
        "one-gpu",
        "no-gpu",
        "cuda-initialized",
    ],
)
def test_worker_visible_devices(
    worker: str | None,
    spec: str,
    visible: str | None,
    count: int,
    initialized: bool,
    expected: str | None,
) -> None:
    """Workers take visible GPUs round-robin; nothing changes where that would be wrong."""
    chosen = devices.worker_visible_devices(
        worker_id=worker,
        device_spec=spec,
        visible_devices=visible,
        gpu_count=count,
        cuda_initialized=initialized,
    )
    assert chosen == expected


def test_worker_visible_devices_rejects_bad_worker_id() -> None:
    """A worker id that is not gwN is a ValueError naming it."""
    with pytest.raises(ValueError, match="worker_id='w1'"):
        devices.worker_visible_devices(
            worker_id="w1",
            device_spec="auto",
            visible_devices=None,
            gpu_count=2,
            cuda_initialized=False,
        )


def test_assign_worker_gpu_sets_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a 4-GPU machine worker gw6 narrows CUDA_VISIBLE_DEVICES to GPU 2."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "count_gpus", lambda: 4)
    monkeypatch.setattr(devices, "cuda_initialized", lambda: False)
    assert devices.assign_worker_gpu("gw6", "auto") == "2"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_assign_worker_gpu_changes_nothing_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without GPUs a worker keeps its environment as it is."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "count_gpus", lambda: 0)
    assert devices.assign_worker_gpu("gw1", "auto") is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
