"""The demo's time budget: how many demonstrations, SFT and GRPO minutes and held-out
questions fit into the minutes left, at this host's calibrated speed.

A host without native bf16 runs the same job several times slower, so fixed stage sizes would
either overrun the budget there or waste it elsewhere. The work per unit (tokens of an SFT or a
GRPO step, of an evaluated question; fixed overheads) is in configs/demo.yaml (`SIZES`); the
host's speeds come from `agent_rl.demo.calibrate` (`Speeds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SIZES_FILE = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@dataclass(frozen=True)
class Sizes:
    """configs/demo.yaml: one field per entry, each explained there."""

    sft_tokens_per_step: float
    sft_clock_slack: float
    sft_overhead_s: float
    demos_s: float
    eval_tokens_per_question: dict
    eval_max_num_seqs: int
    eval_overhead_s: float
    rl_tokens_per_step: float
    rl_update_tokens_per_step: float
    rl_overhead_s: float
    eval_limit: int
    base_eval_limit: int
    select_n: int
    select_alpha: float
    rl_share: float
    min_sft_steps: int
    min_rl_steps: int
    sft_steps: int
    budget_minutes: tuple
    native_tokens_per_turn: int
    max_demos: int

    @classmethod
    def load(cls, path: Path = SIZES_FILE) -> Sizes:
        raw = yaml.safe_load(path.read_text())
        missing, unknown = set(cls.__dataclass_fields__) - set(raw), set(raw) - set(cls.__dataclass_fields__)
        if missing or unknown:
            raise ValueError(f"{path}: missing {sorted(missing)}, unknown {sorted(unknown)}")
        raw["budget_minutes"] = tuple(raw["budget_minutes"])
        return cls(**raw)


SIZES = Sizes.load()


@dataclass(frozen=True)
class Speeds:
    """Calibrated speeds: update and generation tokens/s, engine load seconds."""

    update_tok_s: float
    gen_tok_s: float
    engine_load_s: float

    def eval_s(self, n: int, which: str) -> float:
        return self.engine_load_s + SIZES.eval_overhead_s + n * SIZES.eval_tokens_per_question[which] / self.gen_tok_s

    @property
    def select_s(self) -> float:
        """The GRPO run's two validations on the selection questions (step 0 and its last step), agent mode."""
        return 2 * SIZES.select_n * SIZES.eval_tokens_per_question["rl"] / self.gen_tok_s

    @property
    def sft_step_s(self) -> float:
        return SIZES.sft_tokens_per_step / self.update_tok_s

    @property
    def rl_step_s(self) -> float:
        return SIZES.rl_tokens_per_step / self.gen_tok_s + SIZES.rl_update_tokens_per_step / self.update_tok_s


@dataclass
class Budget:
    """What the demo will run, sized to the host's calibrated speed and the minutes left."""

    demos: int
    sft_minutes: float
    rl_minutes: float
    eval_limit: int
    base_eval_limit: int
    estimate_s: dict[str, float]
    budget_minutes: float = 0.0
    sft_steps: int = 0
    """Expected SFT steps (the clock decides: trainer.max_time_s)."""
    rl_steps: int = 0
    """Expected GRPO steps (the clock decides: trainer.max_time_s)."""
    calibration: dict = field(default_factory=dict)
    """The calibrated speeds the budget came from."""

    def describe(self) -> str:
        est = ", ".join(f"{k} {v / 60:.1f}" for k, v in self.estimate_s.items())
        return (f"{self.demos} demonstrations, SFT {self.sft_minutes:.1f} min (~{self.sft_steps} steps), GRPO "
                f"{self.rl_minutes:.1f} min (~{self.rl_steps} steps), SFT and SFT+RL evaluated on {self.eval_limit} "
                f"held-out questions (base on {self.base_eval_limit}); estimated minutes: {est}, total "
                f"{sum(self.estimate_s.values()) / 60:.1f}")


def needed_s(sp: Speeds, eval_limit: int = SIZES.eval_limit, base_eval_limit: int = SIZES.base_eval_limit) -> float:
    """The least time the stages after calibration need on this host: the evaluations,
    min_sft_steps of SFT and min_rl_steps of GRPO with their overheads."""
    evals = sp.eval_s(base_eval_limit, "base") + sp.eval_s(eval_limit, "sft")
    return (SIZES.demos_s + SIZES.sft_overhead_s + evals + SIZES.min_sft_steps * sp.sft_step_s
            + _rl_fixed_s(sp, eval_limit) + SIZES.min_rl_steps * sp.rl_step_s)


def default_budget_minutes(sp: Speeds, spent_s: float, native_bf16: bool = False) -> float:
    """budget_minutes[0] on a host with native bf16 or where the least budget fits, else as much
    as it needs up to budget_minutes[1]."""
    lo, hi = SIZES.budget_minutes
    if native_bf16:
        return lo
    return min(hi, max(lo, (spent_s + needed_s(sp)) / 60 + 0.5))


def fit_budget(remaining_s: float, sp: Speeds, eval_limit: int = SIZES.eval_limit, min_eval_limit: int | None = 100,
               base_eval_limit: int = SIZES.base_eval_limit, rl_share: float = SIZES.rl_share,
               max_demos: int = SIZES.max_demos, demos_built: bool = False, keep_rl: bool = False) -> Budget:
    """Split the time left (after calibration) into demonstrations, SFT, the evaluations and
    GRPO: the evaluations and overheads first, then the training minutes, `rl_share` of them to
    GRPO, and to GRPO too what SFT would spend past sft_steps. SFT keeps at least one minute.
    Where fewer than min_rl_steps / 2 GRPO steps fit (its curve would show nothing), the
    comparison uses fewer questions, down to `min_eval_limit` (None: keep `eval_limit`), and if
    that is not enough GRPO is left out and SFT gets its minutes.

    A re-fit passes `demos_built` (the demonstrations are not charged again) and `keep_rl`
    when the budget it revises runs GRPO: GRPO then stays while one step fits, so that a stage
    that ran a few seconds over its estimate cannot tip a budget at the min_rl_steps / 2 edge
    into dropping GRPO and giving SFT all the minutes."""
    for n in range(eval_limit, (min_eval_limit or eval_limit) - 1, -20):
        b = _fit(remaining_s, sp, n, base_eval_limit, rl_share, max_demos, demos_built, keep_rl)
        if b.rl_minutes > 0:
            return b
    return _fit(remaining_s, sp, eval_limit, base_eval_limit, rl_share, max_demos, demos_built, keep_rl)


def _fit(remaining_s: float, sp: Speeds, eval_limit: int, base_eval_limit: int, rl_share: float,
         max_demos: int, demos_built: bool = False, keep_rl: bool = False) -> Budget:
    est = {"demonstrations": 0.0 if demos_built else float(SIZES.demos_s), "sft": float(SIZES.sft_overhead_s),
           "evaluate base": sp.eval_s(base_eval_limit, "base"), "evaluate SFT": sp.eval_s(eval_limit, "sft")}
    rl_fixed = {"grpo": SIZES.rl_overhead_s + sp.engine_load_s + sp.select_s, "evaluate SFT+RL": sp.eval_s(eval_limit, "rl")}
    train_s = remaining_s - sum(est.values()) - sum(rl_fixed.values())
    rl_s = rl_share * train_s
    if rl_s < (1 if keep_rl else SIZES.min_rl_steps / 2) * sp.rl_step_s:
        rl_s, rl_fixed = 0.0, {}
        train_s = remaining_s - sum(est.values())
    sft_s = max(60.0, train_s - rl_s)
    if rl_s:  # sft_steps at most: the rest of the training minutes go to GRPO
        sft_s = min(sft_s, max(60.0, SIZES.sft_steps * sp.sft_step_s))
        rl_s = train_s - sft_s
    est["sft"] += sft_s
    est.update(rl_fixed)
    if rl_s:
        est["grpo"] += rl_s
    # every demonstration there is (building them costs no generation), not just the expected
    # steps' worth: SFT stops on the clock, and where it runs faster than calibrated it would
    # otherwise repeat them
    return Budget(demos=max_demos, sft_minutes=sft_s / 60, rl_minutes=rl_s / 60, eval_limit=eval_limit,
                  base_eval_limit=base_eval_limit, estimate_s=est, sft_steps=max(1, int(sft_s / sp.sft_step_s)),
                  rl_steps=int(rl_s / sp.rl_step_s))


def eval_overrun(measured_s: float, estimated_s: float) -> float:
    """How many times its estimate an evaluation took, 1.0 where it took no longer.
    Generation on a host can run slower than its calibration said (fp32 on an emulated ISA: an
    evaluation 20-50% over), and what is estimated after it runs the same engine."""
    return max(1.0, measured_s / estimated_s) if estimated_s > 0 else 1.0


def rl_seconds_left(remaining_s: float, sp: Speeds, eval_limit: int, eval_scale: float = 1.0) -> float:
    """Re-fitted after SFT and its evaluations: GRPO gets what is left but its own start-up, its
    validations on the selection questions and the evaluation of its model, the last two charged
    `eval_scale` times their estimate (eval_overrun of the SFT model's evaluation)."""
    return max(0.0, remaining_s - _rl_fixed_s(sp, eval_limit, eval_scale))


def _rl_fixed_s(sp: Speeds, eval_limit: int, eval_scale: float = 1.0) -> float:
    """GRPO's time besides its steps: start-up, engine load, its validations and its model's
    evaluation (the last two `eval_scale` times their estimate)."""
    return SIZES.rl_overhead_s + sp.engine_load_s + eval_scale * (sp.select_s + sp.eval_s(eval_limit, "rl"))


def rl_skipped(remaining_s: float, budget_minutes: float, sp: Speeds, eval_limit: int,
               eval_scale: float = 1.0) -> dict:
    """Why GRPO did not run and the budget that would run it: min_rl_steps steps with GRPO's
    start-up, validations and its model's evaluation (rl_seconds_left's charges) against the
    `remaining_s` there were after SFT and its evaluation."""
    need_s = _rl_fixed_s(sp, eval_limit, eval_scale) + max(60.0, SIZES.min_rl_steps * sp.rl_step_s)
    return {"minutes_left": remaining_s / 60, "minutes_needed": need_s / 60, "steps": SIZES.min_rl_steps,
            "budget_minutes": budget_minutes, "budget_to_run": math.ceil(budget_minutes + (need_s - remaining_s) / 60)}
