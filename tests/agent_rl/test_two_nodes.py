"""Two Ray nodes on this one machine, started as a user starts them on two hosts (`ray start
--head`, then `ray start --address=<head>`, each node with its own CPU), and `agent-rl-train`
joining them with trainer.ray_address:

- trainer.nnodes=2 on the head alone is refused in one line, before the engine starts;
- with the second node, the 2 actor ranks sit on different nodes (STRICT_SPREAD) and train over
  gloo across them: 2 GRPO steps with their checkpoints, then a second invocation resumes from
  step 2 and trains step 3, again on both nodes.

The cluster is this module's own: its temp dir (not /tmp/ray, so no other `ray.init()` on the
machine finds it), ports, and token mode (off: a worker node only gets the head's token mode
from RAY_AUTH_MODE). It is stopped by terminating its two `ray start --block` processes, which
take their raylets and workers down with them; `ray stop` would stop every Ray on the machine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent_rl.training.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_memory_usage_threshold": "0.99", "RAY_AUTH_MODE": "disabled",
       "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}
ENV.pop("RAY_ADDRESS", None)


def _trainer_overrides():
    """test_trainer.overrides: the tiny GRPO settings of the trainer's own end-to-end tests, on
    its transformers backend (HF_ENGINE): the subject is where the ranks run and what they
    train, not vLLM, which test_trainer's GRPO and PPO runs keep."""
    spec = importlib.util.spec_from_file_location("trainer_tests", Path(__file__).with_name("test_trainer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda *args: [*module.overrides(*args), module.HF_ENGINE]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Cluster:
    """Ray nodes started by `ray start --block` in one temp dir; `stop()` ends them all."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="r2n", dir="/tmp"))  # short: Ray's socket paths live in it
        self.procs: list[subprocess.Popen] = []
        self.address = ""

    def start_node(self, *args: str) -> None:
        """One node with 1 CPU and a small object store; waits until it says it runs."""
        log = self.dir / f"node{len(self.procs)}.log"
        cmd = [RAY, "start", "--block", "--num-cpus=1", "--object-store-memory=400000000", f"--temp-dir={self.dir}",
               f"--dashboard-agent-listen-port={_free_port()}", *args]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
        self.procs.append(proc)
        deadline = time.time() + 300
        while "Ray runtime started" not in log.read_text():
            assert proc.poll() is None, f"ray start exited:\n{log.read_text()[-3000:]}"
            assert time.time() < deadline, f"ray start did not finish in 300 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)

    def start(self) -> None:
        self.start_node("--head", f"--port={_free_port()}", "--include-dashboard=false", "--disable-usage-stats")
        self.address = (self.dir / "ray_current_cluster").read_text().strip()  # ip:port, as `ray start` prints it

    def add_node(self) -> None:
        self.start_node(f"--address={self.address}")

    def node_ids(self, count: int) -> list[str]:
        """The alive nodes' ids, once there are `count` (a driver of its own: this process
        may be connected to another test's cluster)."""
        code = ("import sys, time, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
                "t = time.time()\nwhile len(n := [x['NodeID'] for x in ray.nodes() if x['Alive']]) < int(sys.argv[2]):\n"
                "    assert time.time() - t < 120, n\n    time.sleep(0.5)\nprint(' '.join(n))\n")
        out = subprocess.run([sys.executable, "-c", code, self.address, str(count)], env=ENV, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.split()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the node drains, then stops its raylet and workers
        for proc in self.procs:
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: only this node's processes
                proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def retriever(retriever_url):
    from retriever_server.launch import wait_healthy

    wait_healthy(retriever_url, timeout=300)
    return retriever_url


def train(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agent_rl.training.cli", "--config", "configs/train/demo_grpo_cpu.yaml", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)


def _ranks(stdout: str) -> dict[int, str]:
    """rank -> node (8 hex digits) from the actor group's placement line."""
    line = re.search(r"\[workers\] actor ranks over trainer.nnodes=2 nodes \(rank@node\): (.*)", stdout)
    assert line, stdout[-3000:]
    print(line.group(0))
    return {int(r): n for r, n in (item.split("@") for item in line.group(1).split())}


@pytest.mark.slow
def test_more_nodes_than_the_cluster_has_are_refused_before_the_engine(cluster, tiny_kb, retriever, tiny_policy,
                                                                      tmp_path):
    """The head alone (the second node joins in the next test): one line, exit 2, no worker."""
    nodes = len(cluster.node_ids(1))
    t0 = time.time()
    out = train([*_trainer_overrides()(tiny_kb, retriever, tmp_path / "run", "grpo", tiny_policy),
                 f"trainer.ray_address={cluster.address}", f"trainer.nnodes={nodes + 1}",
                 f"trainer.num_actor_workers={nodes + 1}"])
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith(f"agent-rl-train: error: trainer.nnodes={nodes + 1}, but the Ray cluster at {cluster.address}")
    assert f"has {nodes} node(s) with CPUs" in error and "ray start --address" in error
    assert "[workers]" not in out.stdout and not (tmp_path / "run").exists()  # no trainer, engine or worker
    print(f"refused after {time.time() - t0:.0f} s (config, the retriever's /health, Ray's connect)")


@pytest.mark.slow
def test_actor_ranks_on_two_nodes_train_checkpoint_and_resume(cluster, tiny_kb, retriever, tiny_policy, tmp_path):
    cluster.add_node()
    nodes = cluster.node_ids(2)
    run_dir = tmp_path / "run"
    args = [*_trainer_overrides()(tiny_kb, retriever, run_dir, "grpo", tiny_policy),
            f"trainer.ray_address={cluster.address}", "trainer.nnodes=2", "trainer.num_actor_workers=2"]

    first = train(args)  # 2 steps, a checkpoint after each (save_freq=1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ranks = _ranks(first.stdout)
    assert sorted(ranks) == [0, 1] and ranks[0] != ranks[1]  # one rank per node ...
    assert {n for n in ranks.values()} == {n[:8] for n in nodes}  # ... on the cluster's two
    engine = re.search(r"\[workers\] engine on node (\w+)", first.stdout)
    assert engine and engine.group(1) in ranks.values()
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_2"
    assert [r["step"] for r in read_jsonl(run_dir)] == [1, 2]

    second = train([*args, "trainer.total_training_steps=3"])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "global_step_2 at step 2" in second.stdout
    again = _ranks(second.stdout)
    assert again[0] != again[1] and set(again.values()) == set(ranks.values())
    rows = read_jsonl(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["actor/grad_norm"] > 0 for r in rows)  # gradients summed over both nodes' ranks
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_3"


@pytest.mark.parametrize("workers", [1, 3])
def test_cpu_workers_that_do_not_fill_every_node_alike_are_refused_from_the_config(workers):
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.ray_workers import check_nnodes

    cfg = load_config(TrainConfig, None, ["trainer.nnodes=2", f"trainer.num_actor_workers={workers}"])
    with pytest.raises(ValueError, match=f"num_actor_workers={workers} does not spread over trainer.nnodes=2"):
        check_nnodes(cfg)
    check_nnodes(load_config(TrainConfig, None, ["trainer.nnodes=2", "trainer.num_actor_workers=4"]))
    check_nnodes(load_config(TrainConfig, None, ["trainer.nnodes=2", "trainer.n_gpus_per_node=8"]))  # GPUs: veRL's
