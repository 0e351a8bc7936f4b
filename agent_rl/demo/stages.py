"""The demo's stages as the commands a user would type, and how one runs.

Every stage is its own process (`run_stage`): the command is printed first, a failing stage
raises with its exit code, and a stage the demo interrupts stops as on Ctrl-C (its cleanup
runs: a checkpoint, Ray shut down, the GPU freed) before it is terminated. The command
builders are pure: the pipeline (`agent_rl.demo.pipeline`) and benchmarks/rl_vs_sft build
the same stages from them, on a `Workdir` whose files every stage reads and writes (the
configs name the default layout's files; each command is given the workdir's instead).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAIN_CFG = "configs/train/demo_grpo_cpu.yaml"
"""One config for demonstrations, evaluation and GRPO: the SFT model learns the observations
(topk, lengths, template) it will see in evaluation and RL."""
SFT_CFG = "configs/sft/demo_cpu.yaml"
MODES = ("agent", "rag", "direct")
ROLLOUTS = "rollouts"
"""The GRPO run's sampled rollouts, `<run dir>/rollouts/<step>.jsonl` (trainer.rollout_data_dir at
its defaults: 4 trajectories at step 1 and every 10th step): what `agent-rl-eval show` reads."""

STOP_GRACE_S = 60.0
"""How long an interrupted stage has to clean up before it is terminated."""
_TERMINATED = threading.Event()
"""Set when this process got SIGTERM: its stage, unlike on a terminal's Ctrl-C, got nothing."""


def stop_on_sigterm() -> None:
    """SIGTERM -> KeyboardInterrupt, so `finally` blocks stop the services and the stage started."""
    def handler(*_):
        _TERMINATED.set()
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, handler)


def run_stage(cmd: list, what: str, tag: str = "demo", on_start: Callable[[], None] | None = None) -> float:
    """Print and run `cmd` in ROOT as its own process; returns its wall seconds. Raises
    CalledProcessError when it fails; on KeyboardInterrupt (Ctrl-C, or SIGTERM after
    `stop_on_sigterm`) the stage gets SIGINT where the terminal did not send it one, STOP_GRACE_S
    to clean up, then SIGTERM and SIGKILL."""
    cmd = [str(c) for c in cmd]
    print(f"\n[{tag}] {what}\n$ {' '.join(cmd)}", flush=True)
    if on_start is not None:
        on_start()
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=_interruptible)
    try:
        code = _wait(proc)
    except KeyboardInterrupt:
        if _TERMINATED.is_set() and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            from retriever_server.launch import stop_server

            stop_server(proc)
        raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    return time.time() - t0


def _interruptible() -> None:
    """In the stage's process before it starts: SIGINT back to its default. A demo started in the
    background by a non-interactive shell (`nohup make demo &`, CI) inherits SIGINT ignored, and so
    would its stages, which then could not clean up when asked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait(proc: subprocess.Popen) -> int:
    """proc.wait() that returns to Python at least every second: a signal that the kernel hands to
    another thread of this process does not interrupt a blocking waitpid in the main thread, so its
    handler (stop_on_sigterm's) would run only when the stage ends."""
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class Workdir:
    """Every file the demo reads or writes, under one folder (`--workdir`)."""

    root: Path
    variant: str = ""
    """Suffix of a run beside the default's, with its own demonstrations and runs ("_hermes", "_plain")."""

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def kb(self) -> Path:
        return self.root / "kb"

    @property
    def index(self) -> Path:
        return self.root / "kb_index_flat"

    @property
    def calibration(self) -> Path:
        return self.root / "demo_runs" / "calibration.json"

    @property
    def runs(self) -> Path:
        return self.root / f"demo_runs{self.variant}"

    @property
    def rollouts(self) -> Path:
        return self.rl_dir / ROLLOUTS

    @property
    def demos(self) -> Path:
        return self.root / "demos" / f"kb_train{self.variant}.parquet"

    @property
    def selection(self) -> Path:
        """The selection questions (agent_rl.demo.selection): held-out, outside the compared ones."""
        return self.runs / "selection_questions.parquet"

    @property
    def sft_dir(self) -> Path:
        return self.runs / "sft"

    @property
    def rl_dir(self) -> Path:
        return self.runs / "grpo"

    def train_overrides(self, model: Path | None = None, run_dir: Path | None = None) -> list[str]:
        """TRAIN_CFG's paths pointed into this workdir: its QA files, the policy (default: the
        prepared model) and the GRPO run directory."""
        return [f"data.train_files=[{self.kb / 'train.parquet'}]", f"data.val_files=[{self.kb / 'test.parquet'}]",
                f"actor_rollout_ref.model.path={model or self.model}",
                f"trainer.default_local_dir={run_dir or self.rl_dir}"]


# ----------------------------------------------------------------------------- the commands
def prepare_model(w: Workdir) -> list:
    return [PY, "-m", "data_prep", "model", "--out", w.model]


def knowledge_base(w: Workdir, seed: int | None = None) -> list:
    return [PY, "-m", "data_prep", "synthetic", "--out", w.kb, *(["--seed", seed] if seed is not None else [])]


def dense_index(w: Workdir) -> list:
    return [PY, "-m", "data_prep", "index", "--corpus", w.kb / "corpus.jsonl", "--out", w.index, "--kind", "flat"]


def calibration(w: Workdir) -> list:
    return [PY, "-m", "agent_rl.demo", "calibrate", "--model", w.model, "--config", TRAIN_CFG, "--batch", 16,
            "--gen-tokens", 16, "--out", w.calibration, *w.train_overrides()]


def demonstrations(w: Workdir, url: str, limit: int, extra: list = ()) -> list:
    """`extra`: the demos command's options with their values (`--plain-wording`, `--kinds single,comparison`)
    and config overrides (`key=value`: the protocol's), in any order."""
    over = [e for e in extra if "=" in str(e) and not str(e).startswith("-")]
    opts = [e for e in extra if e not in over]
    return [PY, "-m", "data_prep", "demos", "--qa", w.kb / "train.parquet", "--retriever-url", url, "--out", w.demos,
            "--config", TRAIN_CFG, "--limit", limit, *opts, *w.train_overrides(), *over]


def sft(demos: Path, model: Path, out: Path, steps: int, max_time_s: float, seed: int | None = None) -> list:
    return [PY, "-m", "agent_rl.coldstart.cli", "sft", "--config", SFT_CFG, f"data.train_files=[{demos}]",
            f"actor_rollout_ref.model.path={model}", *([f"data.seed={seed}"] if seed is not None else []),
            f"trainer.total_training_steps={steps}", f"trainer.max_time_s={int(max_time_s)}",
            f"trainer.default_local_dir={out}"]


def evaluation(w: Workdir, model: Path, url: str, data: Path, out: Path, limit: int, modes=("agent",),
               overrides: list = (), seed: int | None = None, max_num_seqs: int = 128) -> list:
    """Greedy evaluation with the RL run's settings (template, lengths, topk, protocol); the same
    seeded sample of held-out questions for every model, so differences can be paired."""
    return [PY, "-m", "agent_rl.evaluation.cli", "eval", "--model", model, "--config", TRAIN_CFG, "--retriever-url", url,
            "--data", data, "--mode", *modes, "--limit", limit, *(["--seed", seed] if seed is not None else []),
            "--out", out, "--no-progress", f"actor_rollout_ref.rollout.max_num_seqs={max_num_seqs}",
            *w.train_overrides(model), *overrides]


def grpo(w: Workdir, model: Path, url: str, max_time_s: float, steps: int | None = None, run_dir: Path | None = None,
         overrides: list = ()) -> list:
    """GRPO from `model` on the workdir's training questions until `steps` or the clock."""
    return [PY, "-m", "agent_rl.training.cli", "--config", TRAIN_CFG, *w.train_overrides(model, run_dir),
            f"retriever.url=[{url}/retrieve]", f"trainer.total_training_steps={steps or 1_000_000}",
            f"trainer.max_time_s={int(max_time_s)}", "trainer.save_freq=-1", "trainer.resume_mode=disable",
            *overrides, *device_overrides()]


def device_overrides() -> list[str]:
    """Where torch sees a GPU, the trainer places its workers and the engine on it (Ray's
    placement: `trainer.n_gpus_per_node`); calibration, SFT and evaluation run in one process
    and take the GPU by themselves (`data_prep.hardware.default_device`)."""
    from data_prep.hardware import default_device

    return ["trainer.n_gpus_per_node=1"] if default_device() == "cuda" else []
