"""The test process's own Ray node, started on first use and left up for the session's other
tests (the `ray` lane runs them all in one worker, so two clusters never run at once).

Commands a test starts join it with `trainer.ray_address=<ray_address()>` instead of starting
a node of their own, where their own start is not what the test checks (a node's start costs
its processes ~10 s of CPU on a 2-core host; tests/agent_rl/test_ray_workers.py checks the
node agent-rl-train starts itself, and the benchmark commands of test_vs_trl start theirs)."""

from __future__ import annotations

from typing import Any


def ray_up() -> Any:
    """The `ray` module, connected to this process's node (2 CPUs, no dashboard)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False)
    return ray


def ray_address() -> str:
    """The node's GCS address, as trainer.ray_address takes it."""
    return ray_up().get_runtime_context().gcs_address
