"""Each arm's command from a cell's start, all on one clock, and SFT at GRPO's minutes (the SFT
arm's own run again, to its last step that ended within GRPO's minutes)."""

from __future__ import annotations

import json
from pathlib import Path

from agent_rl.demo import stages
from agent_rl.demo.stages import Workdir
from benchmarks.rl_vs_sft.runs import keep_every, run, step_times, trained
from benchmarks.rl_vs_sft.settings import Settings
from benchmarks.rl_vs_sft_tables import RL_ARMS

CLOCK_OVERRIDE = "trainer.max_time_counts=all"
"""settings.CLOCK in every arm's command, SFT's and RL's (agent_rl/training/run.py)."""


def sft_lr(s: Settings) -> list[str]:
    """The sft_more arm's lr (also its replay at GRPO's minutes: the same steps)."""
    return [] if s.sft_lr is None else [f"actor_rollout_ref.actor.optim.lr={s.sft_lr}"]


def arm_settings(arm: str, s: Settings) -> list[str]:
    """What an arm's command adds after its stage's own (and, for RL arms, after the user's
    overrides, so no override changes one arm alone): the clock, then the arm's settings."""
    if arm == "sft_more":
        epochs = ["trainer.total_training_steps=null", f"trainer.total_epochs={s.sft_epochs}"] if s.sft_epochs else []
        return [CLOCK_OVERRIDE, *sft_lr(s), *epochs]
    if arm == "rft":
        lr = [] if s.rft_lr is None else [f"actor_rollout_ref.actor.optim.lr={s.rft_lr}"]
        return [CLOCK_OVERRIDE, "algorithm.adv_estimator=rejection_sampling", *lr]
    return [CLOCK_OVERRIDE]


def batch_log(out: Path) -> list[str]:
    """`--log-batches`: an RL arm writes every step's whole batch to `out`/rollouts (veRL's
    trainer.rollout_data_dir; `group_strategy` reads it)."""
    return [f"trainer.rollout_data_dir={out / 'rollouts'}", "trainer.rollout_data_freq=1",
            "trainer.rollout_data_n=1000000"]


def arm_stage(w: Workdir, arm: str, start: Path, val: Path, url: str, d: Path, seed: int, s: Settings,
              demos_all: Path | None = None, name: str | None = None) -> tuple[list, Path, Path]:
    """An arm's command from the cell's start, the file that says it finished, and what its
    evaluation reads (a model, or an RL run directory: its newest checkpoint). The SFT arms train
    with seed 1000 + seed (another order than the start's; SFT at GRPO's minutes replays it).
    `name`: the arm's folder in `d` (default the arm's name)."""
    out = d / (name or arm)
    budget = 60 * s.minutes
    if arm in RL_ARMS:
        over = [f"data.val_files=[{val}]", f"data.val_data_num={s.val_n}", f"data.seed={seed}",
                f"actor_rollout_ref.rollout.seed={seed}", f"trainer.test_freq={s.val_every}",
                "trainer.val_before_train=true", *(keep_every(s.val_every) if s.best_of_val else []),
                *s.overrides, *(batch_log(out) if s.log_batches else []), *arm_settings(arm, s)]
        return stages.grpo(w, start, url, budget, run_dir=out, overrides=over), out / "finished.json", out
    keep = keep_every(s.sft_val_every) if s.best_of_val else []
    demos = demos_all if arm == "sft_all" else w.demos
    cmd = stages.sft(demos, start, out, 1_000_000, budget, seed=1000 + seed) + keep + arm_settings(arm, s)
    return cmd, out / "model" / "config.json", out / "model"


def run_arm(w: Workdir, arm: str, start: Path, val: Path, url: str, d: Path, seed: int, s: Settings,
            demos_all: Path | None = None, name: str | None = None) -> Path:
    """Train an arm (unless it finished earlier) into `d`/`name` (default the arm's name);
    returns what its evaluation reads."""
    cmd, done, model = arm_stage(w, arm, start, val, url, d, seed, s, demos_all, name)
    run(cmd, f"{arm} -> {d.name}/{name or arm} ({s.minutes:g} min)", done=done)
    if arm in RL_ARMS:
        done.write_text(json.dumps({"minutes": s.minutes}) + "\n")
    return model


def matched_ran(arms) -> bool:
    """Whether a cell has SFT at GRPO's minutes (it replays the SFT arm to GRPO's minutes)."""
    return "sft_more" in arms and "grpo" in arms


def matched_steps(sft_dir: Path, grpo_dir: Path) -> tuple[int, float]:
    """(k, minutes): the SFT arm's last step that had ended within GRPO's training seconds, by
    the SFT arm's own step times (0 when not even its first had)."""
    budget = trained(grpo_dir)[1]
    return max(((k, m) for k, m in step_times(sft_dir).items() if m <= budget), default=(0, 0.0))


def same_steps_gap(a: Path, b: Path, k: int) -> float:
    """The largest |loss| difference over steps 1..k of two SFT runs: 0 when `b` repeats `a`'s
    first k steps (the premise of SFT at GRPO's minutes); inf when either lacks one of them."""
    from agent_rl.training.metrics import read_jsonl

    if k == 0:  # no SFT run: the start model is SFT at GRPO's minutes
        return 0.0
    la, lb = ({r["step"]: r["sft/loss"] for r in read_jsonl(d) if "sft/loss" in r} for d in (a, b))
    return max((abs(la[i] - lb[i]) if i in la and i in lb else float("inf") for i in range(1, k + 1)), default=0.0)
