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
class Shape:
    """How big a GRPO step and the evaluations are (configs/demo.yaml `shapes`, each field explained there)."""

    name: str
    rl_prompts: int
    base_eval_limit: int
    select_n: int
    sft_modes: tuple
    min_eval_limit: int
    rl_first: bool

    @property
    def sft_eval(self) -> str:
        """The SFT evaluation's key in eval_tokens_per_question: "rl" (agent mode alone) where it runs only that."""
        return "sft" if tuple(self.sft_modes) != ("agent",) else "rl"


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
    shapes: tuple
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
        raw["shapes"] = tuple(Shape(name=k, **{**v, "sft_modes": tuple(v["sft_modes"])}) for k, v in raw["shapes"].items())
        return cls(**raw)


SIZES = Sizes.load()
STANDARD = SIZES.shapes[0]
"""The shape configs/train/demo_grpo_cpu.yaml runs (its train_batch_size), tried first."""


@dataclass(frozen=True)
class Speeds:
    """Calibrated speeds: update and generation tokens/s, engine load seconds."""

    update_tok_s: float
    gen_tok_s: float
    engine_load_s: float

    def eval_s(self, n: int, which: str) -> float:
        return self.engine_load_s + SIZES.eval_overhead_s + n * SIZES.eval_tokens_per_question[which] / self.gen_tok_s

    def select_s(self, select_n: int = STANDARD.select_n) -> float:
        """The GRPO run's two validations on `select_n` selection questions (step 0 and its last step), agent mode."""
        return 2 * select_n * SIZES.eval_tokens_per_question["rl"] / self.gen_tok_s

    @property
    def sft_step_s(self) -> float:
        return SIZES.sft_tokens_per_step / self.update_tok_s

    @property
    def rl_step_s(self) -> float:
        """A GRPO step of the standard shape (configs/train/demo_grpo_cpu.yaml's batch)."""
        return SIZES.rl_tokens_per_step / self.gen_tok_s + SIZES.rl_update_tokens_per_step / self.update_tok_s

    def step_s(self, shape: Shape) -> float:
        """A GRPO step of `shape`: its tokens scale with its prompts."""
        return self.rl_step_s * shape.rl_prompts / STANDARD.rl_prompts


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
    shape: Shape = STANDARD
    """The GRPO step's and the evaluations' size (configs/demo.yaml `shapes`)."""

    def describe(self) -> str:
        est = ", ".join(f"{k} {v / 60:.1f}" for k, v in self.estimate_s.items())
        small = ("" if self.shape == STANDARD else
                 f"; the {self.shape.name} shape, as this host is too slow for GRPO in the standard one: GRPO steps of "
                 f"{self.shape.rl_prompts} prompts instead of {STANDARD.rl_prompts}, {self.shape.select_n} selection "
                 f"questions instead of {STANDARD.select_n}, the SFT model evaluated in {'/'.join(self.shape.sft_modes)}"
                 f" mode only")
        return (f"{self.demos} demonstrations, SFT {self.sft_minutes:.1f} min (~{self.sft_steps} steps), GRPO "
                f"{self.rl_minutes:.1f} min (~{self.rl_steps} steps), SFT and SFT+RL evaluated on {self.eval_limit} "
                f"held-out questions (base on {self.base_eval_limit}){small}; estimated minutes: {est}, total "
                f"{sum(self.estimate_s.values()) / 60:.1f}")


def needed_s(sp: Speeds, eval_limit: int = SIZES.eval_limit, shape: Shape = STANDARD) -> float:
    """The least time the stages after calibration need on this host in `shape`: the
    evaluations, min_sft_steps of SFT and min_rl_steps of GRPO with their overheads."""
    evals = sp.eval_s(shape.base_eval_limit, "base") + sp.eval_s(eval_limit, shape.sft_eval)
    return (SIZES.demos_s + SIZES.sft_overhead_s + evals + SIZES.min_sft_steps * sp.sft_step_s
            + _rl_fixed_s(sp, eval_limit, shape=shape) + SIZES.min_rl_steps * sp.step_s(shape))


def default_budget_minutes(sp: Speeds, spent_s: float, native_bf16: bool = False) -> float:
    """budget_minutes[0] on a host with native bf16 or where the least budget fits, else as much
    as it needs up to budget_minutes[1] (where the standard shape does not fit that, fit_budget
    tries the small one)."""
    lo, hi = SIZES.budget_minutes
    if native_bf16:
        return lo
    return min(hi, max(lo, (spent_s + needed_s(sp)) / 60 + 0.5))


def fit_budget(remaining_s: float, sp: Speeds, eval_limit: int = SIZES.eval_limit, min_eval_limit: int | None = 0,
               rl_share: float = SIZES.rl_share, max_demos: int = SIZES.max_demos, demos_built: bool = False,
               keep_rl: bool = False, shapes: tuple = SIZES.shapes) -> Budget:
    """Split the time left (after calibration) into demonstrations, SFT, the evaluations and
    GRPO: the evaluations and overheads first, then the training minutes, `rl_share` of them to
    GRPO, and to GRPO too what SFT would spend past sft_steps. SFT keeps at least one minute.

    The plan taken is the first that runs min_rl_steps of GRPO (fewer show no trend), trying
    each of `shapes` in turn (configs/demo.yaml: the standard one, then smaller GRPO steps and
    evaluations, where GRPO gets min_rl_steps before SFT's share as long as SFT keeps
    min_sft_steps), each on `eval_limit` questions and then fewer, down to the shape's
    min_eval_limit (`min_eval_limit` None: keep `eval_limit`; a number: at least that). Where
    none does, the plan with the most GRPO steps (at least min_rl_steps / 2); where there is
    none, GRPO is left out and SFT gets its minutes, in the first shape.

    A re-fit passes `demos_built` (the demonstrations are not charged again) and `keep_rl`
    when the budget it revises runs GRPO, with that budget's shape alone: GRPO then stays while
    one step fits, so that a stage that ran a few seconds over its estimate cannot tip a budget
    at the min_rl_steps / 2 edge into dropping GRPO and giving SFT all the minutes."""
    some_rl = None
    for shape in shapes:
        floor = eval_limit if min_eval_limit is None else max(min_eval_limit, shape.min_eval_limit)
        for n in range(eval_limit, min(floor, eval_limit) - 1, -20):
            b = _fit(remaining_s, sp, n, shape, rl_share, max_demos, demos_built, keep_rl)
            if b.rl_minutes > 0 and (keep_rl or b.rl_steps >= SIZES.min_rl_steps):
                return b
            if b.rl_minutes > 0 and (some_rl is None or b.rl_steps > some_rl.rl_steps):
                some_rl = b
    # no shape fit min_rl_steps in the small one: the plan with the most GRPO steps, else none
    return some_rl or _fit(remaining_s, sp, eval_limit, shapes[0], rl_share, max_demos, demos_built, keep_rl)


def _fit(remaining_s: float, sp: Speeds, eval_limit: int, shape: Shape, rl_share: float,
         max_demos: int, demos_built: bool = False, keep_rl: bool = False) -> Budget:
    est = {"demonstrations": 0.0 if demos_built else float(SIZES.demos_s), "sft": float(SIZES.sft_overhead_s),
           "evaluate base": sp.eval_s(shape.base_eval_limit, "base"),
           "evaluate SFT": sp.eval_s(eval_limit, shape.sft_eval)}
    rl_fixed = {"grpo": SIZES.rl_overhead_s + sp.engine_load_s + sp.select_s(shape.select_n),
                "evaluate SFT+RL": sp.eval_s(eval_limit, "rl")}
    step_s = sp.step_s(shape)
    train_s = remaining_s - sum(est.values()) - sum(rl_fixed.values())
    rl_s = rl_share * train_s
    if shape.rl_first:  # a shape there to run GRPO: its least steps before SFT's share
        rl_s = max(rl_s, min(SIZES.min_rl_steps * step_s, train_s - SIZES.min_sft_steps * sp.sft_step_s))
    if rl_s < (1 if keep_rl else SIZES.min_rl_steps / 2) * step_s:
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
                  base_eval_limit=shape.base_eval_limit, estimate_s=est, sft_steps=max(1, int(sft_s / sp.sft_step_s)),
                  rl_steps=int(rl_s / step_s), shape=shape)


def shape_overrides(shape: Shape) -> list[str]:
    """The GRPO run's overrides for `shape`: none for the standard one (the config's batch)."""
    if shape.rl_prompts == STANDARD.rl_prompts:
        return []
    return [f"data.train_batch_size={shape.rl_prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={shape.rl_prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={shape.rl_prompts}"]


def eval_overrun(measured_s: float, estimated_s: float) -> float:
    """How many times its estimate an evaluation took, 1.0 where it took no longer.
    Generation on a host can run slower than its calibration said (fp32 on an emulated ISA: an
    evaluation 20-50% over), and what is estimated after it runs the same engine."""
    return max(1.0, measured_s / estimated_s) if estimated_s > 0 else 1.0


def rl_seconds_left(remaining_s: float, sp: Speeds, eval_limit: int, eval_scale: float = 1.0,
                    shape: Shape = STANDARD) -> float:
    """Re-fitted after SFT and its evaluations: GRPO gets what is left but its own start-up, its
    validations on the selection questions and the evaluation of its model, the last two charged
    `eval_scale` times their estimate (eval_overrun of the SFT model's evaluation)."""
    return max(0.0, remaining_s - _rl_fixed_s(sp, eval_limit, eval_scale, shape))


def _rl_fixed_s(sp: Speeds, eval_limit: int, eval_scale: float = 1.0, shape: Shape = STANDARD) -> float:
    """GRPO's time besides its steps: start-up, engine load, its validations and its model's
    evaluation (the last two `eval_scale` times their estimate)."""
    return (SIZES.rl_overhead_s + sp.engine_load_s
            + eval_scale * (sp.select_s(shape.select_n) + sp.eval_s(eval_limit, "rl")))


def rl_skipped(remaining_s: float, budget_minutes: float, sp: Speeds, eval_limit: int,
               eval_scale: float = 1.0, shape: Shape = STANDARD) -> dict:
    """Why GRPO did not run and the budget that would run it: min_rl_steps steps with GRPO's
    start-up, validations and its model's evaluation (rl_seconds_left's charges) against the
    `remaining_s` there were after SFT and its evaluation."""
    need_s = _rl_fixed_s(sp, eval_limit, eval_scale, shape) + max(60.0, SIZES.min_rl_steps * sp.step_s(shape))
    return {"minutes_left": remaining_s / 60, "minutes_needed": need_s / 60, "steps": SIZES.min_rl_steps,
            "budget_minutes": budget_minutes, "budget_to_run": math.ceil(budget_minutes + (need_s - remaining_s) / 60)}
