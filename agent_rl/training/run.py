"""One run lifecycle for RL (`agent-rl-train`) and SFT (`agent-rl-sft`).

A `Run` knows where the run lives (`trainer.default_local_dir`), which checkpoint it resumes
(`trainer.resume_mode`, `trainer.resume_from_path`) and whether that run has finished, the
time budget (`trainer.max_time_s`, summed over resumed attempts), the timing of each step, and
when to checkpoint (`trainer.save_freq`, and always when the run stops: its last step or the
budget). The RL trainer and SFT each add only what their checkpoints hold and what a step does.

A resume continues the checkpoint's run: each checkpoint records the run's `identity` (what
its state is shaped by: the model, the tokenizer, the train files' content, the settings that
make a batch, rollout.n, trainer.mode; agent_rl.training.identity), and a resume under another
one is refused in one line before anything starts (agent_rl.training.identity.check_resume). A
new run never rewrites an earlier one: with trainer.resume_mode=disable an earlier run in the
directory is moved aside whole (`set_aside`), its metrics, TensorBoard events and checkpoints
kept as they were. Nor does a resume lose a branch: one from an earlier checkpoint
(trainer.resume_from_path at step 10 of a run that saved 15 and 20) first moves the later
steps aside the same way (`set_branch_aside`), so the run's checkpoints and metrics tell one
story, and neither keep=N pruning nor the next automatic resume meets the old branch.

The time budget: the next step is not started when it would end past the budget, judged by
the run's mean step time or by the longest step of this attempt if longer (GRPO's steps vary
with the group filter's rounds: 60-175 s on real data, where the mean alone let a run end 22 s
past a 60-minute budget). What the budget counts is trainer.max_time_counts: the steps alone,
or every second from the first step's start (`all`: a step then counts from the previous
step's end, so the validation, checkpoint and logging between them are in the next step's
time, and the budget check before a step weighs them through the mean and the longest step).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent_rl.training.checkpoint import CheckpointManager
from data_prep.atomic import fsync, fsync_tree


def out_of_time(trained_s: float, step: int, budget: float | None, longest_step_s: float = 0.0) -> bool:
    """True when the next step, at the run's mean step time or at `longest_step_s` if longer,
    would end past `budget` (or the budget is spent: a re-run of a finished run does nothing)."""
    mean_step = trained_s / step if step else 0.0
    return budget is not None and trained_s + max(mean_step, longest_step_s) > budget


def resume_checkpoint(run_cfg: Any, checkpoints: CheckpointManager) -> Path | None:
    """The checkpoint a run resumes from (`run_cfg`: the trainer section): trainer.resume_from_path,
    else the newest in `checkpoints`; None with trainer.resume_mode=disable or none saved."""
    if run_cfg.resume_mode == "disable":
        return None
    if run_cfg.resume_mode != "auto":
        raise ValueError(f"trainer.resume_mode must be auto or disable, got {run_cfg.resume_mode!r}")
    return Path(run_cfg.resume_from_path) if run_cfg.resume_from_path else checkpoints.latest()


def finished_reason(state: dict, run_cfg: Any, total_steps: int | None) -> str | None:
    """Why a run whose latest checkpoint holds `state` has nothing left to do, or None."""
    step, trained = int(state.get("step", 0)), float(state.get("trained_s", 0.0))
    if total_steps is not None and step >= total_steps:
        return f"step {step} of trainer.total_training_steps={total_steps}"
    if out_of_time(trained, step, run_cfg.max_time_s):
        return f"trained {trained:.0f}s of trainer.max_time_s={run_cfg.max_time_s:g}"
    return None


HISTORY = ("checkpoints", "metrics.jsonl", "tensorboard", "model")
"""What a run leaves in its directory (SFT's final model in `model/`): any of them there means
an earlier run."""


def set_aside(run_dir: Path, inputs: Mapping[str, str] | None = None) -> Path | None:
    """Move an earlier run in `run_dir` to `<run_dir>.prev-<YYYYmmdd-HHMMSS>` (a sibling, one
    rename: nothing is copied or deleted) so a new run starts in an empty directory; returns
    where it went, None when `run_dir` holds no run. Refused (ValueError) when the directory
    holds the current directory or one of `inputs` (config key -> path: e.g. the model of a
    new run started from the earlier run's checkpoint), which the move would take away."""
    if not run_dir.is_dir() or not any((run_dir / name).exists() for name in HISTORY):
        return None
    here = run_dir.resolve()
    held = [f"{key} {path}" for key, path in (inputs or {}).items() if path and Path(path).resolve().is_relative_to(here)]
    if Path.cwd().resolve().is_relative_to(here):
        held.append("the current directory")
    if held:
        raise ValueError(f"trainer.resume_mode=disable would move the earlier run in {run_dir} aside, but "
                         f"{', '.join(held)} is inside it: choose another trainer.default_local_dir")
    aside = aside_name(run_dir)
    os.replace(run_dir, aside)
    fsync(run_dir.parent)
    return aside


def aside_name(run_dir: Path) -> Path:
    """A free `<run_dir>.prev-<YYYYmmdd-HHMMSS>` (`-1`, `-2`, ... after it when taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.prev-{stamp}")
    n = 1
    while aside.exists():
        aside, n = run_dir.with_name(f"{run_dir.name}.prev-{stamp}-{n}"), n + 1
    return aside


def set_branch_aside(run_dir: Path, checkpoints: CheckpointManager, step: int, validation_dir: str | None = None,
                     inputs: Mapping[str, str] | None = None) -> Path | None:
    """Before a resume from `step` in a run that went past it and saved there (a
    trainer.resume_from_path to an earlier checkpoint): move that later branch to
    `<run_dir>.prev-<YYYYmmdd-HHMMSS>`, laid out as a run directory: its checkpoints past
    `step` and SFT's final `model/` (renamed), the validations past `step` in `validation_dir`
    (`<aside>/validation/` when that is outside the run), and a copy of the run's
    metrics.jsonl and TensorBoard events whole, from step 1 (the resumed run cuts its own at
    `step`). Left in place, the branch's checkpoints outlived the branch point (keep=N pruned
    it first) and the next automatic resume took the old branch's last step under the new
    branch's metrics. Returns where the branch went; None when no checkpoint is past `step`
    (a killed run's logged steps past its last checkpoint are cut as on any resume). Refused
    (ValueError) when one of `inputs` (config key -> path) is inside what would move."""
    later = checkpoints.after(step)
    if not later:
        return None
    inputs = [(key, Path(path).resolve()) for key, path in (inputs or {}).items() if path]
    model = run_dir / "model"  # SFT's final model; an RL run's model kept there is its input, not history
    if not model.exists() or any(path.is_relative_to(model.resolve()) for _, path in inputs):
        model = None
    validations = []
    if validation_dir is not None and Path(validation_dir).is_dir():
        validations = [p for p in Path(validation_dir).glob("*.jsonl") if p.stem.isdigit() and int(p.stem) > step]
    held = [f"{key} {path}" for key, path in inputs if any(path.is_relative_to(p.resolve()) for p in later + validations)]
    if held:
        raise ValueError(f"resuming from step {step} would move the later steps of {run_dir} aside, but "
                         f"{', '.join(held)} is among them: resume from another checkpoint or copy it elsewhere first")
    aside = aside_name(run_dir)
    aside.mkdir()
    # the copies first: a kill before the moves leaves the run as it was, beside a partial copy
    for name in ("metrics.jsonl", "tensorboard"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, aside / name)
        elif (run_dir / name).is_dir():
            shutil.copytree(run_dir / name, aside / name)
    fsync_tree(aside)
    checkpoints.move_after(step, aside / "checkpoints")
    if model is not None:
        os.replace(model, aside / "model")
    if validations:
        here = Path(validation_dir).resolve()
        dest = aside / (here.relative_to(run_dir.resolve()) if here.is_relative_to(run_dir.resolve()) else "validation")
        dest.mkdir(parents=True, exist_ok=True)
        for p in validations:
            os.replace(p, dest / p.name)
        fsync(dest)
        fsync(here)
    fsync(aside)
    fsync(run_dir)
    return aside


class Run:
    """The lifecycle state of one run: step, time trained, checkpoints. `name` prefixes its
    messages ("train", "sft")."""

    def __init__(self, run_cfg: Any, run_dir: str | Path, total_steps: int, name: str,
                 identity: Mapping[str, Any] | None = None, inputs: Mapping[str, str] | None = None):
        """`identity`: what a resume must find unchanged, saved in every checkpoint
        (agent_rl.training.identity); `inputs`: config key -> path this run reads (never moved
        aside with an earlier run)."""
        self.run_cfg, self.run_dir, self.total_steps, self.name = run_cfg, Path(run_dir), total_steps, name
        self.identity = dict(identity or {})
        self.inputs = dict(inputs or {})
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", run_cfg.max_ckpt_to_keep)
        self.step = 0
        self.trained_s = 0.0
        """Wall seconds of training steps, summed over resumed attempts."""
        self.longest_step_s = 0.0
        """Of this attempt: how long the next step may take (the time budget)."""
        self._t0: float | None = None
        self._last_end: float | None = None
        """When this attempt's previous step ended (trainer.max_time_counts=all counts from there)."""

    # ------------------------------------------------------------------ resume
    def start(self) -> Path | None:
        """The checkpoint this run resumes, or None: it starts from scratch. With
        trainer.resume_mode=disable an earlier run in the directory is moved aside first; with
        trainer.resume_from_path at a step the run went past and saved after, that later branch
        is (`set_branch_aside`); either move said in one line."""
        if self.run_cfg.resume_mode == "disable":
            aside = set_aside(self.run_dir, self.inputs)
            if aside is not None:
                print(f"[{self.name}] trainer.resume_mode=disable: moved the earlier run in {self.run_dir} to {aside} "
                      f"(its metrics, TensorBoard events and checkpoints, unchanged)", flush=True)
        path = resume_checkpoint(self.run_cfg, self.checkpoints)
        if path is not None and self.run_cfg.resume_from_path:
            step = int(self.checkpoints.read_state(path)["step"])
            aside = set_branch_aside(self.run_dir, self.checkpoints, step,
                                     getattr(self.run_cfg, "validation_data_dir", None), self.inputs)
            if aside is not None:
                print(f"[{self.name}] resuming from {path} at step {step}: moved the run's later steps in "
                      f"{self.run_dir} to {aside} (their checkpoints, and its metrics and TensorBoard events whole)",
                      flush=True)
        return path

    def finished(self, state: dict) -> str | None:
        return finished_reason(state, self.run_cfg, self.total_steps)

    def restore(self, path: Path) -> dict:
        """Load the run's state from checkpoint `path` (step, time trained) and return it, with
        what the caller saved beside it."""
        state = self.checkpoints.load(path)
        self.step = int(state["step"])
        self.trained_s = float(state.get("trained_s", 0.0))  # checkpoints from before the time budget: 0
        return state

    # ------------------------------------------------------------------ steps
    def out_of_time(self, extra_s: float = 0.0) -> bool:
        return out_of_time(self.trained_s + extra_s, self.step, self.run_cfg.max_time_s, self.longest_step_s)

    def running(self) -> bool:
        """Whether another step is started."""
        return self.step < self.total_steps and not self.out_of_time()

    def expected_steps(self) -> int | None:
        """How many steps the run will have taken when it stops, for its progress bar:
        trainer.total_training_steps, or fewer where the time budget (trainer.max_time_s) ends
        it first at the mean step time so far; None while that is not known (a budget and no
        step timed yet), so a bar shows no total rather than a limit the clock will never reach."""
        budget = self.run_cfg.max_time_s
        if budget is None:
            return self.total_steps
        if self.step == 0 or self.trained_s <= 0:
            return None
        left = max(0.0, budget - self.trained_s)
        return min(self.total_steps, self.step + int(left // (self.trained_s / self.step)))

    def begin_step(self) -> int:
        now = time.monotonic()
        counts_all = self.run_cfg.max_time_counts == "all"
        self._t0 = self._last_end if counts_all and self._last_end is not None else now
        self.step += 1
        return self.step

    def elapsed(self) -> float:
        """Seconds since `begin_step`."""
        assert self._t0 is not None, "elapsed without begin_step"
        return time.monotonic() - self._t0

    def end_step(self) -> float:
        """Counts the step's wall time into the run's; returns it."""
        assert self._t0 is not None, "end_step without begin_step"
        now = time.monotonic()
        dt = now - self._t0
        self._t0, self._last_end = None, now
        self.longest_step_s = max(self.longest_step_s, dt)
        self.trained_s += dt
        return dt

    def stopping(self, extra_s: float = 0.0) -> bool:
        """After a step: whether it was the run's last (its last step, or the budget)."""
        return self.step >= self.total_steps or self.out_of_time(extra_s)

    def save_due(self) -> bool:
        """A checkpoint every trainer.save_freq steps and whenever the run stops: a re-run
        continues it (a larger budget or more steps) or finds it finished."""
        freq = self.run_cfg.save_freq
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
        return (f"[{self.name}] time budget trainer.max_time_s={self.run_cfg.max_time_s:g}: stopping at step "
                f"{self.step}/{self.total_steps} after {self.trained_s:.0f}s of training (another step takes "
                f"~{self.trained_s / max(1, self.step):.0f}s, the longest {self.longest_step_s:.0f}s)")
