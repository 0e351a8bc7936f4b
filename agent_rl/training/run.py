"""One run lifecycle for RL (`agent-rl-train`) and SFT (`agent-rl-sft`).

A `Run` knows where the run lives (`trainer.default_local_dir`), which checkpoint it resumes
(`trainer.resume_mode`, `trainer.resume_from_path`) and whether that run has finished, the
time budget (`trainer.max_time_s`, summed over resumed attempts), the timing of each step, and
when to checkpoint (`trainer.save_freq`, and always when the run stops: its last step or the
budget). The RL trainer and SFT each add only what their checkpoints hold and what a step does.

A resume continues the checkpoint's run: each checkpoint records the run's `identity` (what
its state is shaped by: the model, the tokenizer, rollout.n, trainer.mode;
agent_rl.training.identity), and a resume under another one is refused in one line before
anything starts (agent_rl.training.trainer.check_resume).

The time budget: the next step is not started when it would end past the budget, judged by
the run's mean step time or by the longest step of this attempt if longer (GRPO's steps vary
with the group filter's rounds: 60-175 s on real data, where the mean alone let a run end 22 s
past a 60-minute budget).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent_rl.training.checkpoint import CheckpointManager


def out_of_time(trained_s: float, step: int, budget: float | None, longest_step_s: float = 0.0) -> bool:
    """True when the next step, at the run's mean step time or at `longest_step_s` if longer,
    would end past `budget` (or the budget is spent: a re-run of a finished run does nothing)."""
    mean_step = trained_s / step if step else 0.0
    return budget is not None and trained_s + max(mean_step, longest_step_s) > budget


def resume_checkpoint(tr: Any, checkpoints: CheckpointManager) -> Path | None:
    """The checkpoint a run resumes from (`tr`: the trainer section): trainer.resume_from_path,
    else the newest in `checkpoints`; None with trainer.resume_mode=disable or none saved."""
    if tr.resume_mode == "disable":
        return None
    if tr.resume_mode != "auto":
        raise ValueError(f"trainer.resume_mode must be auto or disable, got {tr.resume_mode!r}")
    return Path(tr.resume_from_path) if tr.resume_from_path else checkpoints.latest()


def finished_reason(state: dict, tr: Any, total_steps: int | None) -> str | None:
    """Why a run whose latest checkpoint holds `state` has nothing left to do, or None."""
    step, trained = int(state.get("step", 0)), float(state.get("trained_s", 0.0))
    if total_steps is not None and step >= total_steps:
        return f"step {step} of trainer.total_training_steps={total_steps}"
    if out_of_time(trained, step, tr.max_time_s):
        return f"trained {trained:.0f}s of trainer.max_time_s={tr.max_time_s:g}"
    return None


class Run:
    """The lifecycle state of one run: step, time trained, checkpoints. `name` prefixes its
    messages ("train", "sft")."""

    def __init__(self, tr: Any, run_dir: str | Path, total_steps: int, name: str,
                 identity: Mapping[str, Any] | None = None):
        """`identity`: what a resume must find unchanged, saved in every checkpoint
        (agent_rl.training.identity)."""
        self.tr, self.run_dir, self.total_steps, self.name = tr, Path(run_dir), total_steps, name
        self.identity = dict(identity or {})
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", tr.max_ckpt_to_keep)
        self.step = 0
        self.trained_s = 0.0
        """Wall seconds of training steps, summed over resumed attempts."""
        self.longest_step_s = 0.0
        """Of this attempt: how long the next step may take (the time budget)."""
        self._t0: float | None = None

    # ------------------------------------------------------------------ resume
    def resume_path(self) -> Path | None:
        return resume_checkpoint(self.tr, self.checkpoints)

    def finished(self, state: dict) -> str | None:
        return finished_reason(state, self.tr, self.total_steps)

    def restore(self, path: Path) -> dict:
        """Load the run's state from checkpoint `path` (step, time trained) and return it, with
        what the caller saved beside it."""
        state = self.checkpoints.load(path)
        self.step = int(state["step"])
        self.trained_s = float(state.get("trained_s", 0.0))  # checkpoints from before the time budget: 0
        return state

    # ------------------------------------------------------------------ steps
    def out_of_time(self, extra_s: float = 0.0) -> bool:
        return out_of_time(self.trained_s + extra_s, self.step, self.tr.max_time_s, self.longest_step_s)

    def running(self) -> bool:
        """Whether another step is started."""
        return self.step < self.total_steps and not self.out_of_time()

    def begin_step(self) -> int:
        self._t0 = time.monotonic()
        self.step += 1
        return self.step

    def elapsed(self) -> float:
        """Seconds since `begin_step`."""
        assert self._t0 is not None, "elapsed without begin_step"
        return time.monotonic() - self._t0

    def end_step(self) -> float:
        """Counts the step's wall time into the run's; returns it."""
        assert self._t0 is not None, "end_step without begin_step"
        dt = time.monotonic() - self._t0
        self._t0 = None
        self.longest_step_s = max(self.longest_step_s, dt)
        self.trained_s += dt
        return dt

    def stopping(self, extra_s: float = 0.0) -> bool:
        """After a step: whether it was the run's last (its last step, or the budget)."""
        return self.step >= self.total_steps or self.out_of_time(extra_s)

    def save_due(self) -> bool:
        """A checkpoint every trainer.save_freq steps and whenever the run stops: a re-run
        continues it (a larger budget or more steps) or finds it finished."""
        freq = self.tr.save_freq
        return (freq > 0 and self.step % freq == 0) or self.stopping()

    def save(self, state: dict, config: dict, save_workers: Callable[[Path], None] | None,
             expected_bytes: int = 0) -> Path:
        """A checkpoint of this step: `state` with the time trained and the run's identity;
        `expected_bytes`: about what `save_workers` writes (the free-space check)."""
        return self.checkpoints.save(self.step, {**state, "trained_s": self.trained_s, "identity": self.identity},
                                     config, save_workers, expected_bytes)

    def stop_message(self) -> str | None:
        """What to print when the clock stopped the run before its last step."""
        if self.step >= self.total_steps:
            return None
        return (f"[{self.name}] time budget trainer.max_time_s={self.tr.max_time_s:g}: stopping at step "
                f"{self.step}/{self.total_steps} after {self.trained_s:.0f}s of training (another step takes "
                f"~{self.trained_s / max(1, self.step):.0f}s, the longest {self.longest_step_s:.0f}s)")
