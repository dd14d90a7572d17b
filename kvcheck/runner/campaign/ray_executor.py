"""Shards as Ray tasks: the only module of kvcheck that imports ``ray``.

:class:`RayExecutor` starts a local Ray cluster (``address=None``: this machine, nothing
else needed) or joins a running one (``address``: ``auto``, ``host:port`` or
``ray://host:10001``; a KubeRay or Slurm cluster). Each shard is one Ray task that calls
:func:`kvcheck.runner.campaign.shard.run_shard` on its worker, with one GPU where the
cluster has GPUs (``num_gpus=1``: Ray sets ``CUDA_VISIBLE_DEVICES``, and the suite's
``auto`` device picks it) and one CPU otherwise. The executor runs as many at once as the
cluster has GPUs (else CPUs), or ``workers``.

Shards learn that they must stop from a small actor the driver writes to: every running
task asks it about once a second whether the campaign is stopping, or whether all of its
tests have failed in another shard, and tells it the test cases it has run so far, which
the driver reads for its progress line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvcheck.runner.campaign.driver import ShardLost
from kvcheck.runner.campaign.plan import Shard
from kvcheck.runner.campaign.shard import ShardContext, run_shard

__all__ = ["RAY_MISSING", "RayExecutor", "ray_available"]

#: What to do when Ray is not installed.
RAY_MISSING = (
    "kvcheck campaign needs Ray, which the default install leaves out: "
    "pip install 'kvcheck[campaign]'"
)


def ray_available() -> bool:
    """Whether ``ray`` can be imported (the ``campaign`` extra is installed)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class _Control:
    """The campaign's switches, held by one actor: stop everything, or stop the shards
    whose tests have all failed elsewhere; and the running shards' test cases so far."""

    def __init__(self) -> None:
        self.stopping = False
        self.failed: set[str] = set()
        self.examples: dict[int, int] = {}

    def report(self, number: int, examples: int) -> None:
        self.examples[number] = examples

    def examples_of(self, numbers: list[int]) -> int:
        return sum(self.examples.get(number, 0) for number in numbers)

    def stop_all(self) -> None:
        self.stopping = True

    def fail(self, nodeids: list[str]) -> None:
        self.failed.update(nodeids)

    def should_stop(self, nodeids: list[str]) -> bool:
        return self.stopping or all(nodeid in self.failed for nodeid in nodeids)


def _task(shard: Shard, context: ShardContext, control: Any) -> dict[str, Any]:
    """One shard on its worker; asks ``control`` whether to stop."""
    import ray

    def should_stop() -> bool:
        try:
            return bool(ray.get(control.should_stop.remote(list(shard.nodeids))))
        except ray.exceptions.RayError:  # the driver is gone: stop
            return True

    def on_examples(counts: dict[str, int]) -> None:
        control.report.remote(shard.number, sum(counts.values()))  # no need to wait

    return run_shard(shard, context, should_stop=should_stop, on_examples=on_examples)


class RayExecutor:
    """Runs shards as Ray tasks (see the module docstring); use as a context manager, which
    shuts the connection (and a local cluster) down on exit."""

    def __init__(self, context: ShardContext, *, address: str | None, workers: int | None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers={workers!r} must be None or at least 1")
        import ray

        self._ray = ray
        self.context = context
        self.local = address is None
        options: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": "WARNING",
        }
        if self.local:
            # A cluster of this machine's own, even where another is running here.
            options["address"] = "local"
            options["num_cpus"] = workers or os.cpu_count() or 1
        else:
            options["address"] = address
        ray.init(**options)
        resources = ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        self.cpus = int(resources.get("CPU", 0))
        self.nodes = len([node for node in ray.nodes() if node.get("Alive")])
        available = self.gpus if self.gpus else max(self.cpus, 1)
        self.capacity = min(workers, available) if workers else available
        self._remote = ray.remote(_task).options(
            num_cpus=1, num_gpus=1 if self.gpus else 0, max_retries=0
        )
        self._control: Any = ray.remote(_Control).options(num_cpus=0).remote()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._ray.shutdown()

    def describe(self) -> str:
        """One line: the cluster and how shards use it."""
        where = "a local Ray cluster" if self.local else "the Ray cluster"
        each = "one GPU each" if self.gpus else "CPU only"
        return (
            f"{where} of {self.nodes} node(s), {self.cpus} CPUs, {self.gpus} GPUs: "
            f"{self.capacity} shards at a time, {each}"
        )

    def submit(self, shard: Shard) -> Any:
        return self._remote.remote(shard, self.context, self._control)

    def wait(self, handles: Sequence[Any], timeout: float) -> list[Any]:
        ready, _ = self._ray.wait(list(handles), num_returns=1, timeout=timeout)
        if ready:  # and every other one that is done by now
            ready, _ = self._ray.wait(list(handles), num_returns=len(handles), timeout=0)
        return list(ready)

    def result(self, handle: Any) -> dict[str, Any]:
        try:
            return dict(self._ray.get(handle))
        except self._ray.exceptions.RayError as exc:
            raise ShardLost(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc

    def examples_running(self, shards: Sequence[Shard]) -> int:
        numbers = [shard.number for shard in shards]
        return int(self._ray.get(self._control.examples_of.remote(numbers)))

    def stop(self, nodeids: Sequence[str]) -> None:
        self._ray.get(self._control.fail.remote(list(nodeids)))

    def stop_all(self) -> None:
        self._ray.get(self._control.stop_all.remote())

    def cancel(self, handles: Sequence[Any]) -> None:
        for handle in handles:
            self._ray.cancel(handle, force=True)
