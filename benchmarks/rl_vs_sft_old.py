"""Does RL beat the simple ways to spend the same minutes? Arms from one start, every second counted (not in CI).

    python benchmarks/rl_vs_sft.py --kb-seed 101 --seeds 1 2 3 [--arms sft_more rft grpo sft_all]
                                   [--kb-kind standard] [--start-steps N] [--minutes 10]
                                   [--sft-lr LR] [--sft-epochs E] [--rft-lr LR] [--eval-limit 200]
                                   [--workdir DIR] [--json PATH] [key=value ...]

On a knowledge base generated with `--kb-seed` and `--kb-kind` (`agent-rl-prep synthetic --seed
--kind`; each kind's dev KB, DEV_KB_SEEDS, is where design decisions are made: report on any
other), for each cell (a KB seed x a run seed: several `--kb-seed` values run every seed on each):

1. start: cold-start SFT for `--start-steps` steps on `--demos` of the KB's grounded
   demonstrations (data order follows the seed; default START_STEPS: 60 on both host kinds);
2. from that model, each arm of `--arms` (default all four), with the same minutes on one clock
   rule (`trainer.max_time_s` with `trainer.max_time_counts=all`: every second from the arm's
   first step, its generation, running evaluations, checkpoints and logging included; start-up,
   the step-0 evaluation of the start and the save after the last step are in no arm's minutes):
   - sft_more: SFT continued on the same demonstrations (another order, same seed family) at
     `--sft-lr` for `--sft-epochs` epochs (defaults: the SFT config's lr, until the clock);
   - rft: rejection sampling fine-tuning, the GRPO arm's run with
     `algorithm.adv_estimator=rejection_sampling` (the samples whose answer is right, trained by
     their NLL) at `--rft-lr` (default: the GRPO config's lr, or the lr of the overrides);
   - grpo: GRPO on the KB's training questions (configs/train/demo_grpo_cpu.yaml; data order and
     sampling follow the seed);
   - sft_all, a reference line: SFT on demonstrations for every training question (what gold
     search chains would give; real data has none) at the SFT config's lr, until the clock;
3. SFT at GRPO's minutes (with sft_more and grpo): each arm's last step ends before the budget
   by up to a step, and GRPO's steps are long, so GRPO may train fewer minutes than the SFT arm.
   The same SFT run (same seed, order and lr: the same steps) is taken again to the last step
   that had ended within GRPO's minutes, by the SFT arm's own step times (the table warns where a
   replayed step's loss differs: then it was not the same run);
4. the start and every trained model are evaluated greedily in agent mode on the same held-out
   questions (a seeded sample of the KB's test questions, the first `--val-n` of which are kept
   apart for the running evaluation): agent EM, searches per question and how often the searches
   follow the better strategy (`query_strategy`: name + attribute, the lookalike kind's headroom
   in benchmarks/kb_headroom.py, against the demonstrations' name only; n/a where no query can be
   told), each by question kind (single / bridge / comparison), with the agent EM of the questions
   searched each way (`em_by_strategy`: does the better strategy pay for this policy); strict
   format; and the paired differences GRPO - SFT more, GRPO - RFT and RFT - SFT more with their
   95% intervals over questions. Over cells: mean, median, worst and best, and a t interval
   across KB x seed (df = cells - 1; n/a with one cell).

Best checkpoints (`--best-of-val`): with few demonstrations an SFT arm's last step can sit past
its best (it overfits), a weak control. Then every arm also keeps a checkpoint (SFT arms every
`--sft-val-every` steps, RL arms every `--val-every`, all at their last step; the saves are on
the clock), every one of them and the start (step 0) is scored by the evaluation command on the
`--val-n` running-evaluation questions, and each arm's best (ties go to fewer steps) is scored on
the report questions: the arms' bests against each other, each chosen on questions the report
does not hold.

Time to gain: `time_to_gain_min` is an RL arm's training minutes until its EM on the `--val-n`
questions first passes the SFT arm's (at the end of its minutes, by the evaluation command) by
`--gain`. With `--best-of-val` the RL arm's EM there is the evaluation command's at each
checkpoint, the scorer of the SFT arm's; without it, the trainer's running evaluation every
`--val-every` steps, whose scores differ from the command's by about a question in 40
(`time_to_gain_by`).

It prints each cell's row and the summary over cells, and writes JSON and a PNG (the KB's workdir,
default runs/rl_vs_sft/kb<K>, <kind>_kb<K> for another kind; with several KB seeds each KB has its
own and the whole run's go to --workdir, default runs/rl_vs_sft/<kind>_kbs<K1>_<K2>...), and for
each cell `seed<S>/per_question.json` in its KB's workdir: every model's EM on each report
question, by id, and every checkpoint's running-evaluation EM. A re-run with the same workdir
reuses every finished stage (an arm added later runs alone), and refuses a workdir made with
other settings (its settings.json). Extra `key=value` arguments override the GRPO config of both
RL arms (veRL names).

Cells run in several sittings (or on several hosts of one kind) count together:

    python benchmarks/rl_vs_sft.py --kb-seed 101 --seeds 3 --with runs/rl_vs_sft/kb101/rl_vs_sft.json

runs seed 3 and reports it beside the rows of the earlier run's JSON; an earlier file made with
other settings (one from before the clock counted every second among them), on another host kind
or holding one of this run's cells is refused before anything runs. Each row keeps its own
hardware line.

Choosing `--start-steps` (a design decision: make it on the dev KB, seed 0):

    python benchmarks/rl_vs_sft.py --kb-seed 0 --seeds 1 2 --start-curve 20 100

trains each seed's start SFT once to 100 steps, saving every 20 (the lr is constant after its
warm-up, so the checkpoint at step k is the k-step start), and evaluates every checkpoint on the
report questions: agent EM by question kind and searches per question against steps
(`start_curve.{md,json,png}`). The fair start is where that curve has stopped rising: more SFT
from there gains nothing, and what RL adds is RL's.

What the start's own searches earn each way (designing a change on the lookalike kind's dev KB):

    python benchmarks/rl_vs_sft.py --kb-kind lookalike --kb-seed 7 --seeds 1 --start-curve 60 60 --demos 50

scores the benchmark's start alone, and on the lookalike kind each point also gives the better
strategy's share of searches and, over all questions and by kind, the agent EM and the retrieval
hit of the questions searched with the attribute against by name only (`strategy_by_kind`).

What GRPO's advantage sees of the strategies (the same design work, with the arms):

    python benchmarks/rl_vs_sft.py --kb-kind lookalike --kb-seed 7 --seeds 1 --arms grpo --log-batches ...

has each RL arm write every step's whole batch (`<arm>/rollouts`, trainer.rollout_data_dir) and
gives per arm the better strategy's share of its trajectories step by step and, in the groups that
sampled both strategies (the only place an outcome reward can move the policy between them), each
strategy's mean reward, EM and GRPO advantage (`group_strategy`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()

from agent_rl.demo import stages  # noqa: E402
from agent_rl.demo.stages import Workdir  # noqa: E402
from benchmarks import rl_vs_sft_choice as choice  # noqa: E402
from benchmarks.rl_vs_sft_tables import (ARMS, PAIRS, RL_ARMS, best_step, curve_plot, curve_table,  # noqa: E402
                                         pair_name, plot, summary, table)

DEV_KB_SEEDS = {"standard": 0, "lookalike": 7}
"""Each KB kind's knowledge base every design decision was tuned on (the lookalike kind's is
benchmarks/kb_headroom.py's DEV_KB_SEED): never report on it."""
DEV_KB_SEED = DEV_KB_SEEDS["standard"]

START_STEPS = 60
"""The start SFT's steps (`--start-steps` overrides): on each host kind's start curve on the dev
KB, two seeds, the smallest checkpoint after which the mean EM rises by no more than 2 points
(docs/real_data.md); both kinds' curves gave 60."""

CLOCK = "every second"
"""What an arm's minutes count (settings.json's `clock`): every second from its first step."""
CLOCK_OVERRIDE = "trainer.max_time_counts=all"
"""CLOCK in every arm's command, SFT's and RL's (agent_rl/training/run.py)."""

SETTINGS = {"shared": ("kb_seed", "kb_kind", "demos", "demo_args", "eval_limit", "val_n"),
            "arms": ("start_steps", "minutes", "clock", "val_every", "overrides", "best_of_val", "sft_val_every",
                     "sft_lr", "sft_epochs", "rft_lr", "log_batches"),
            "curve": ("start_curve",),
            "choice": ("start_steps", "minutes", "clock", "val_every", "overrides", "sft_val_every")}
"""What a workdir's finished stages depend on, by mode: a re-run may reuse them only under the same.
Which arms run is not among them: an arm's stages do not depend on the others'."""
LEGACY = {"kb_kind": "standard", "clock": "training steps", "sft_lr": None, "sft_epochs": None, "rft_lr": None,
          "log_batches": False}
"""What a workdir or JSON written before a setting existed ran with (the clock then counted the
training steps only): compared as if it had recorded it."""

MERGED = tuple(k for k in SETTINGS["shared"] + SETTINGS["arms"] if k != "kb_seed")
"""The settings an earlier run's rows must share to count with this run's (`--with`): those its
arms depend on but the KB seed (cells of other KBs count together), each checked where the file
records it or its group (LEGACY; older files lack demos, val_n, val_every)."""


def recorded(before: dict, keys: tuple[str, ...]) -> dict:
    """The values of `keys` a settings file (or a run's JSON) records: what it holds, and where it
    holds a setting of a group (SETTINGS) written before another of it existed, that one's LEGACY."""
    out = {}
    for group in SETTINGS.values():
        if any(k in before for k in group):
            out.update({k: before.get(k, LEGACY.get(k)) for k in group if k in before or k in LEGACY})
    return {k: v for k, v in out.items() if k in keys}


def host_kind_of(host: str) -> str:
    """report.host_kind's words for a hardware line (`data_prep.hardware.hardware_line`)."""
    from agent_rl.demo.report import host_kind

    gpu = host.split(" gpu=", 1)[1].split(" native_bf16=", 1)[0] if " gpu=" in host else "none"
    return host_kind({"gpu": None if gpu == "none" else gpu, "native_bf16": " native_bf16=yes" in host})


def earlier_rows(paths: list[str], args, kind: str) -> list[dict]:
    """The rows of earlier runs' JSON (`--with`), each with its KB seed and the hardware line it ran
    under: only from runs of the same settings (MERGED) on this host kind, and none of a cell (KB
    seed, seed) given twice; otherwise a SystemExit naming what differs, before anything runs."""
    rows: list[dict] = []
    seen = {(k, s) for k in args.kb_seed for s in args.seeds}
    for p in paths:
        e = json.loads(Path(p).read_text())
        differ = [f"{k} {v!r} there, {getattr(args, k)!r} here" for k, v in recorded(e, MERGED).items()
                  if v != getattr(args, k)]
        if host_kind_of(e["host"]) != kind:
            differ.append(f"host kind {host_kind_of(e['host'])!r} there, {kind!r} here")
        if differ:
            raise SystemExit(f"rl_vs_sft: --with {p} was made with other settings ({', '.join(differ)})")
        for r in e["rows"]:
            cell = (r.get("kb_seed", e.get("kb_seed")), r["seed"])
            if cell in seen:
                raise SystemExit(f"rl_vs_sft: KB {cell[0]} seed {cell[1]} of --with {p} is counted twice "
                                 "(in this run's cells or in another --with file)")
            seen.add(cell)
            rows.append({**r, "kb_seed": cell[0], "host": r.get("host", e["host"])})
    return rows


def check_settings(work: Path, args) -> None:
    """A re-run reuses every finished stage, so it must ask for what made them: a workdir made
    with other settings (another start, other minutes, another KB, another clock) is refused,
    naming them, before anything runs; its files are left as they are. The first run records its
    settings. `args.kb_seed`: the workdir's one KB seed."""
    keys = SETTINGS["shared"] + SETTINGS["curve" if args.start_curve else "choice" if getattr(args, "choose", False) else "arms"]
    now = {k: getattr(args, k) for k in keys}
    f = work / "settings.json"
    before = json.loads(f.read_text()) if f.exists() else {}
    differ = {k: (v, now[k]) for k, v in recorded(before, keys).items() if v != now[k]}
    if differ:
        said = ", ".join(f"{k} {a!r} there, {b!r} asked" for k, (a, b) in differ.items())
        raise SystemExit(f"rl_vs_sft: {work} holds stages made with other settings ({said}); "
                         "give another --workdir (or the same settings to go on)")
    work.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({**before, **now}, indent=1) + "\n")


def kb_workdir(args, kb_seed: int) -> Path:
    """KB `kb_seed`'s workdir (its model, KB, index, demonstrations, cells): `--workdir` itself
    with one KB seed, `--workdir`/<name> with several, else runs/rl_vs_sft/<name>; the name is
    kb<K>, or <kind>_kb<K> for a kind other than standard."""
    name = f"kb{kb_seed}" if args.kb_kind == "standard" else f"{args.kb_kind}_kb{kb_seed}"
    if args.workdir is None:
        return (ROOT / "runs" / "rl_vs_sft" / name).resolve()
    return Path(args.workdir).resolve() / ("" if len(args.kb_seed) == 1 else name)


def out_dir(args) -> Path:
    """Where the run's table, JSON, plot and record go: its one KB's workdir, or with several KB
    seeds `--workdir` (default runs/rl_vs_sft/<kind>_kbs<K1>_<K2>...)."""
    if len(args.kb_seed) == 1:
        return kb_workdir(args, args.kb_seed[0])
    name = f"{args.kb_kind}_kbs" + "_".join(map(str, args.kb_seed))
    return Path(args.workdir).resolve() if args.workdir else (ROOT / "runs" / "rl_vs_sft" / name).resolve()


def run(cmd: list | Callable[[], list], what: str, done: Path) -> None:
    """A stage of the benchmark, unless `done` exists (a finished stage of an earlier attempt).
    `cmd` may be a function building the command, called only when the stage runs."""
    if done.exists():
        print(f"[rl_vs_sft] {what}: done earlier ({done})", flush=True)
        return
    secs = stages.run_stage(cmd() if callable(cmd) else cmd, what, tag="rl_vs_sft")
    print(f"[rl_vs_sft] {what}: {secs:.0f}s", flush=True)


def split_test(kb: Path, val_n: int) -> tuple[Path, Path]:
    """The KB's test questions as two files: the first `val_n` for the running evaluation, the
    rest for the report (no question is in both)."""
    import pandas as pd

    val, rep = kb / "val.parquet", kb / "report.parquet"
    if not (val.exists() and rep.exists()):
        df = pd.read_parquet(kb / "test.parquet")
        df.iloc[:val_n].to_parquet(val)
        df.iloc[val_n:].to_parquet(rep)
    return val, rep


def evaluate(w: Workdir, model: Path, data: Path, url: str, out: Path, limit: int) -> Path:
    """Greedy, agent mode, the same seeded sample (seed 0) for every model. `model` is a model
    or run directory, resolved only when the evaluation has not run yet: a finished seed's GRPO
    checkpoints (2 GiB each) can be deleted and the command rerun with more seeds."""
    from agent_rl.evaluation.evaluate import resolve_model_dir

    run(lambda: stages.evaluation(w, resolve_model_dir(model), url, data, out, limit, seed=0),
        f"evaluate {out.parent.name}/{out.name} ({limit} questions)", done=out / "summary.json")
    return out


def sft(w: Workdir, out: Path, seed: int, steps: int, max_time_s: float, model: Path, save_every: int = 0,
        demos: Path | None = None, extra: list[str] = ()) -> Path:
    """SFT from `model` on `demos` (default the workdir's); `save_every` > 0: a checkpoint every
    that many steps, all kept (the start curve, best checkpoints); `extra`: overrides after the
    stage's own (an arm's clock, lr, epochs)."""
    keep = [f"trainer.save_freq={save_every}", "trainer.max_ckpt_to_keep=null"] if save_every else []
    run(stages.sft(demos or w.demos, model, out, steps, max_time_s, seed=seed) + keep + list(extra),
        f"SFT -> {out.parent.name}/{out.name}", done=out / "model" / "config.json")
    return out / "model"


def start_curve(w: Workdir, d: Path, seed: int, every: int, steps: int, rep: Path, url: str, limit: int,
                kinds: dict[str, str], questions: dict[str, dict] | None = None) -> list[dict]:
    """One start SFT to `steps`, its checkpoint every `every` steps evaluated on the report
    questions: [{step, em, by_kind, searches, strict_format}], and where the KB's questions tell the
    strategies apart (the lookalike kind) the better strategy's share of searches and
    `strategy_by_kind` (what the start policy's searches each way earn, before any arm runs)."""
    from agent_rl.evaluation import report

    run_dir = d / "start_curve"
    sft(w, run_dir, seed, steps, 24 * 3600, w.model, save_every=every)
    told = any(query_strategy("", q) is not None for q in (questions or {}).values())  # strategies told apart
    points = []
    for k in range(every, steps + 1, every):
        out = evaluate(w, run_dir / "checkpoints" / f"global_step_{k}", rep, url, d / f"eval_curve_{k}", limit)
        st = report.grouped_stats(out, "agent", kinds)
        a = st.pop(report.ALL)
        points.append({"step": k, "n": a["n"], "em": a["em"], "searches": a["searches_mean"],
                       "strict_format": 1 - a["invalid_format_rate"],
                       "by_kind": {g: st[g]["em"] for g in sorted(st)}})
        if told:
            points[-1]["better_strategy"] = better_share(strategy_counts(out, questions, kinds)[report.ALL])
            points[-1]["em_by_strategy"] = strategy_by_kind(out, questions, kinds)
    return points


# ----------------------------------------------------------------------------- the arms
def sft_lr(args) -> list[str]:
    """The sft_more arm's lr (also its replay at GRPO's minutes: the same steps)."""
    return [] if args.sft_lr is None else [f"actor_rollout_ref.actor.optim.lr={args.sft_lr}"]


def arm_settings(arm: str, args) -> list[str]:
    """What an arm's command adds after its stage's own (and, for RL arms, after the user's
    overrides, so no override changes one arm alone): the clock, then the arm's settings."""
    if arm == "sft_more":
        epochs = ["trainer.total_training_steps=null", f"trainer.total_epochs={args.sft_epochs}"] if args.sft_epochs else []
        return [CLOCK_OVERRIDE, *sft_lr(args), *epochs]
    if arm == "rft":
        lr = [] if args.rft_lr is None else [f"actor_rollout_ref.actor.optim.lr={args.rft_lr}"]
        return [CLOCK_OVERRIDE, "algorithm.adv_estimator=rejection_sampling", *lr]
    return [CLOCK_OVERRIDE]


def batch_log(out: Path) -> list[str]:
    """`--log-batches`: an RL arm writes every step's whole batch to `out`/rollouts (veRL's
    trainer.rollout_data_dir; `group_strategy` reads it)."""
    return [f"trainer.rollout_data_dir={out / 'rollouts'}", "trainer.rollout_data_freq=1",
            "trainer.rollout_data_n=1000000"]


def arm_stage(w: Workdir, arm: str, start: Path, val: Path, url: str, d: Path, seed: int, args,
              demos_all: Path | None = None, name: str | None = None) -> tuple[list, Path, Path]:
    """An arm's command from the cell's start, the file that says it finished, and what its
    evaluation reads (a model, or an RL run directory: its newest checkpoint). The SFT arms train
    with seed 1000 + seed (another order than the start's; SFT at GRPO's minutes replays it).
    `name`: the arm's folder in `d` (default the arm's name)."""
    out = d / (name or arm)
    budget = 60 * args.minutes
    if arm in RL_ARMS:
        over = [f"data.val_files=[{val}]", f"data.val_data_num={args.val_n}", f"data.seed={seed}",
                f"actor_rollout_ref.rollout.seed={seed}", f"trainer.test_freq={args.val_every}",
                "trainer.val_before_train=true",
                *([f"trainer.save_freq={args.val_every}", "trainer.max_ckpt_to_keep=null"] if args.best_of_val else []),
                *args.overrides, *(batch_log(out) if getattr(args, "log_batches", False) else []),
                *arm_settings(arm, args)]
        return stages.grpo(w, start, url, budget, run_dir=out, overrides=over), out / "finished.json", out
    keep = [f"trainer.save_freq={args.sft_val_every}", "trainer.max_ckpt_to_keep=null"] if args.best_of_val else []
    demos = demos_all if arm == "sft_all" else w.demos
    cmd = stages.sft(demos, start, out, 1_000_000, budget, seed=1000 + seed) + keep + arm_settings(arm, args)
    return cmd, out / "model" / "config.json", out / "model"


def run_arm(w: Workdir, arm: str, start: Path, val: Path, url: str, d: Path, seed: int, args,
            demos_all: Path | None = None, name: str | None = None) -> Path:
    """Train an arm (unless it finished earlier) into `d`/`name` (default the arm's name);
    returns what its evaluation reads."""
    cmd, done, model = arm_stage(w, arm, start, val, url, d, seed, args, demos_all, name)
    run(cmd, f"{arm} -> {d.name}/{name or arm} ({args.minutes:g} min)", done=done)
    if arm in RL_ARMS:
        done.write_text(json.dumps({"minutes": args.minutes}) + "\n")
    return model


def matched_ran(arms) -> bool:
    """Whether a cell has SFT at GRPO's minutes (it replays the SFT arm to GRPO's minutes)."""
    return "sft_more" in arms and "grpo" in arms


def step_times(run_dir: Path) -> dict[int, float]:
    """{step: training minutes at its end} from a run's metrics.jsonl (steps 1 on)."""
    from agent_rl.training.metrics import read_jsonl

    return {r["step"]: r["training/elapsed_s"] / 60 for r in read_jsonl(run_dir)
            if r.get("step", 0) > 0 and "training/elapsed_s" in r}


def trained(run_dir: Path) -> tuple[int, float]:
    """(steps, training minutes) of a run: its last step's."""
    return max(step_times(run_dir).items(), default=(0, 0.0))


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


def minutes_to(points: list[tuple[int, float, float]], bar: float) -> float | None:
    """The training minutes of `learning.first_reaching`'s point (step, minutes, EM); None when
    no point after step 0 reaches `bar`."""
    from benchmarks.learning import first_reaching

    hit = first_reaching(points, bar)
    return None if hit is None else hit[1]


def checkpoint_time_to_gain(run_dir: Path, val_points: list[tuple[int, float]], bar: float) -> float | None:
    """`minutes_to` by the evaluation command's scores of a run's checkpoints (`best_checkpoint`'s
    (step, EM) points), each at its step's training minutes."""
    times = step_times(run_dir)
    return minutes_to([(k, times.get(k, 0.0), em) for k, em in val_points], bar)


def agent_em(eval_dir: Path) -> float:
    """An evaluation's agent-mode EM over all its questions (its summary.json)."""
    from agent_rl.evaluation import report

    return report.read_summary(eval_dir)["modes"]["agent"][report.ALL]["em"]


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's checkpoints (`checkpoints/global_step_K`; not a killed save's `.tmp`), ascending."""
    found = (re.fullmatch(r"global_step_(\d+)", p.name) for p in (run_dir / "checkpoints").glob("global_step_*"))
    return sorted(int(m.group(1)) for m in found if m)


def best_checkpoint(w: Workdir, d: Path, arm: str, val: Path, rep: Path, url: str, args,
                    known: dict[int, tuple[Path | None, Path | None]]) -> dict:
    """The arm's checkpoints and the start (step 0) scored on the running-evaluation questions,
    the best (`best_step`) on the report questions. `known`: step -> (its evaluation on the val
    questions, on the report questions) already made, either None."""
    run_dir = d / arm
    points = val_points(w, d, arm, val, url, args, {k: v for k, (v, _) in known.items() if v})
    k, em = best_step(points)
    rep_dir = known.get(k, (None, None))[1] or evaluate(w, checkpoint(run_dir, k), rep, url, d / f"eval_{arm}_{k}",
                                                        args.eval_limit)
    return {"step": k, "minutes": step_times(run_dir).get(k, 0.0), "val_em": em, "val_points": points, "eval": str(rep_dir)}


def checkpoint(run_dir: Path, k: int) -> Path:
    return run_dir / "checkpoints" / f"global_step_{k}"


def val_points(w: Workdir, d: Path, name: str, val: Path, url: str, args, known: dict[int, Path]) -> list[tuple[int, float]]:
    """[(step, agent EM)] of run `d`/`name`'s checkpoints and the start (step 0) on the
    running-evaluation questions, each scored into `d`/val_<name>_<step> by the evaluation command
    unless `known` (step -> an evaluation already made) has it."""
    run_dir = d / name
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise SystemExit(f"rl_vs_sft: {run_dir} kept no checkpoints (trained without --best-of-val); "
                         "give another --workdir")
    dirs = {k: known.get(k) or evaluate(w, checkpoint(run_dir, k), val, url, d / f"val_{name}_{k}", args.val_n)
            for k in [0, *steps]}
    return [(k, agent_em(v)) for k, v in dirs.items()]


def pairs_of(evals: dict[str, Path], kinds: dict[str, str]) -> tuple[dict, dict]:
    """(the PAIRS differences between the arms in `evals`, each arm's difference from the start):
    paired over the report questions, first minus second."""
    from agent_rl.evaluation import report

    def minus(a: str, b: str) -> dict:
        return report.paired_comparison(evals[b], evals[a], group_of=kinds)["diff"][report.ALL]

    return ({pair_name(a, b): minus(a, b) for a, b in PAIRS if a in evals and b in evals},
            {arm: minus(arm, "start") for arm in evals if arm != "start"})


def best_row(d: Path, kinds: dict[str, str], best: dict[str, dict]) -> dict:
    """Each arm's best checkpoint (`best_checkpoint`) with its agent EM on the report questions,
    and the paired differences between them (PAIRS) and from the start."""
    pairs, minus_start = pairs_of({"start": d / "eval_start", **{a: Path(b["eval"]) for a, b in best.items()}}, kinds)
    return {"arms": {a: {**b, "em": agent_em(Path(b["eval"]))} for a, b in best.items()},
            "pairs": pairs, "minus_start": minus_start}


# ----------------------------------------------------------------------------- the better strategy
STRATEGIES = ("name only", "name + attribute")
"""benchmarks/kb_headroom.py's scripted search strategies: the demonstrations' (the entity's name
and what is asked) and the better one of the lookalike kind (with the attribute the question
gives, which tells namesakes apart)."""
BETTER = STRATEGIES[1]


def query_strategy(query: str, question: dict) -> str | None:
    """The strategy (STRATEGIES) a search `query` follows on a KB question (its row of the KB's
    test.parquet): "name + attribute" when it holds one of the attributes the question gives to
    tell namesakes apart (the lookalike kind's `hop_attributes`, any case), "name only" when it
    holds none; None where the row has none (the standard kind): n/a in the tables."""
    given = question.get("hop_attributes")  # a list, or the numpy array of a parquet row
    attributes = [a.lower() for a in (list(given) if given is not None else []) if isinstance(a, str) and a]
    if not attributes:
        return None
    q = query.lower()
    return BETTER if any(a in q for a in attributes) else STRATEGIES[0]


def search_queries(trajectory: str) -> list[str]:
    """The queries an agent trajectory's text searched (Search-R1's <search> blocks: the benchmark's
    protocol; tags inside an observation are neutralised, so only the model's own count)."""
    from agent_rl.rollout.protocol import tag_blocks

    return [q.strip() for _, q in tag_blocks(trajectory, "search")]


def trajectory_strategy(trajectory: str, question: dict) -> str | None:
    """A trajectory's strategy on its question: the better one when any of its searches held the
    question's attribute, "name only" when every search that can be told held none, None when
    none can be told (no search, or the standard kind)."""
    said = {query_strategy(q, question) for q in search_queries(trajectory)}
    return BETTER if BETTER in said else STRATEGIES[0] if STRATEGIES[0] in said else None


def strategy_counts(eval_dir: Path, questions: dict[str, dict], kinds: dict[str, str]) -> dict[str, dict[str, int]]:
    """{question kind and "all": {strategy, or "unknown": searches}} over an evaluation's agent
    trajectories (their queries, `query_strategy` on each)."""
    from agent_rl.evaluation import report

    out: dict[str, dict[str, int]] = {}
    for (_, qid), rec in sorted(report.records_by_question(eval_dir).items()):
        for query in search_queries(rec.get("trajectory") or ""):
            said = query_strategy(query, questions.get(str(qid), {})) or "unknown"
            for g in (report.ALL, kinds.get(str(qid))):
                if g is not None:
                    out.setdefault(g, {})
                    out[g][said] = out[g].get(said, 0) + 1
    return out


def em_by_strategy(eval_dir: Path, questions: dict[str, dict], ids: set[str] | None = None) -> dict[str, dict]:
    """Does the better strategy pay for this policy? Agent EM of an evaluation's questions grouped by
    the strategy their trajectory searched with: "name + attribute" when any of its searches held the
    question's attribute, "name only" when every search it made that can be told held none (questions
    with no such search are left out); `ids`: only those questions (one kind's). {strategy: {"n":
    questions, "em": share right, "hit": share whose retrieved text held a gold answer (the reward's
    retrieval_hit), None when n is 0}}. Outcome rewards can favour the better strategy only where its
    questions are answered more often; a retrieval term, where its searches find the answer more often."""
    from agent_rl.evaluation import report

    return _by_strategy(report.records_by_question(eval_dir), questions, ids)


def _by_strategy(records: dict, questions: dict[str, dict], ids: set[str] | None) -> dict[str, dict]:
    """em_by_strategy over records already read (`report.records_by_question`)."""
    tally = {s: [0, 0.0, 0] for s in STRATEGIES}
    for (_, qid), rec in records.items():
        if ids is not None and str(qid) not in ids:
            continue
        strategy = trajectory_strategy(rec.get("trajectory") or "", questions.get(str(qid), {}))
        if strategy is not None:
            tally[strategy][0] += 1
            tally[strategy][1] += float(rec["em"])
            tally[strategy][2] += bool(rec.get("retrieval_hit"))
    return {s: {"n": n, "em": right / n if n else None, "hit": hit / n if n else None}
            for s, (n, right, hit) in tally.items()}


def strategy_by_kind(eval_dir: Path, questions: dict[str, dict], kinds: dict[str, str]) -> dict[str, dict]:
    """`em_by_strategy` over all questions ("all") and over each question kind's, so that a gap between
    the strategies is not only which kinds of question each was used on (the evaluation read once)."""
    from agent_rl.evaluation import report

    records = report.records_by_question(eval_dir)
    groups = {report.ALL: None, **{g: {q for q, k in kinds.items() if k == g} for g in sorted(set(kinds.values()))}}
    return {g: _by_strategy(records, questions, ids) for g, ids in groups.items()}


def group_strategy(batches: list[dict], questions: dict[str, dict]) -> dict:
    """What GRPO's advantage saw of the strategies, from an RL arm's sampled batches (`--log-batches`:
    every step's whole batch, agent_rl.training.rollout_data's records): each trajectory's strategy
    as in `em_by_strategy` (the better one when any of its searches held the question's attribute)
    and its advantage as GRPO computes it from its group's rewards (one question's samples at one
    step; agent_rl.training.algos.advantages.grpo). `questions`: the KB's training rows by question
    text. {"by_step": [{"step", "trajectories", "better": the better strategy's share of the
    trajectories told apart}], "groups", "mixed": groups that sampled both strategies, and per
    strategy over the mixed groups' trajectories {"n", "reward", "em", "advantage": means}}. Only in
    a mixed group can an outcome reward move the policy from one strategy to the other: the sign
    of the better strategy's mean advantage there is the way GRPO pushed."""
    import torch

    from agent_rl.training.algos.advantages import grpo

    groups: dict[tuple, list[tuple[str | None, float, float]]] = {}
    steps: dict[int, list[str | None]] = {}
    for r in batches:
        text = "".join(p["text"] for p in r.get("pieces", []) if p.get("sampled"))  # the model's own searches
        strategy = trajectory_strategy(text, questions.get(r["question"], {}))
        groups.setdefault((r["step"], r["group_id"]), []).append(
            (strategy, float(r["reward"]), float(r.get("breakdown", {}).get("metric") or 0.0)))
        steps.setdefault(r["step"], []).append(strategy)
    tally = {s: {"n": 0, "reward": 0.0, "em": 0.0, "advantage": 0.0} for s in STRATEGIES}
    mixed = 0
    for members in groups.values():
        if not all(s in {m[0] for m in members} for s in STRATEGIES):
            continue
        mixed += 1
        scores = torch.tensor([m[1] for m in members], dtype=torch.float64)
        adv, _ = grpo(scores[:, None], torch.ones(len(members), 1), group_ids=[0] * len(members))
        for (s, reward, em), a in zip(members, adv[:, 0].tolist()):
            if s is not None:
                t = tally[s]
                t["n"] += 1
                t["reward"], t["em"], t["advantage"] = t["reward"] + reward, t["em"] + em, t["advantage"] + a
    by_step = [{"step": k, "trajectories": len(ss), "better": better_share(
        {s: sum(x == s for x in ss) for s in STRATEGIES})} for k, ss in sorted(steps.items())]
    return {"by_step": by_step, "groups": len(groups), "mixed": mixed,
            **{s: {"n": t["n"], **{k: (t[k] / t["n"] if t["n"] else None) for k in ("reward", "em", "advantage")}}
               for s, t in tally.items()}}


def better_share(counts: dict[str, int]) -> float | None:
    """The share of the searches told apart that follow the better strategy; None (n/a) when none was."""
    told = sum(counts.get(s, 0) for s in STRATEGIES)
    return counts.get(BETTER, 0) / told if told else None


# ----------------------------------------------------------------------------- a cell's numbers
def models_of(d: Path, arms) -> dict[str, Path]:
    """A cell's evaluations on the report questions by model: the start, each arm, and SFT at
    GRPO's minutes where it ran."""
    return {m: d / f"eval_{m}" for m in ("start", *arms, *(["sft_matched"] if matched_ran(arms) else []))}


def headroom(evals: list[Path]) -> dict:
    """What any arm could reach on a cell's report questions: the share that at least one of the
    models evaluated answered right, and the share where no model's searches brought a gold answer
    into its context (Search-R1's retrieval hit), with those questions' ids: the JSON keeps them,
    so their trajectories can be found (or rerun on the KB regenerated from its seed) after the
    workdir is gone. A lead of one arm over another beyond `any_right` minus the other's EM needs
    questions no model has answered."""
    from agent_rl.evaluation import report

    recs = [report.records_by_question(e) for e in evals]
    common = set.intersection(*(set(r) for r in recs))
    n = max(len(common), 1)
    missed = sorted(k for k in common if not any(r[k].get("retrieval_hit") for r in recs))
    return {"any_right": sum(any(float(r[k]["em"]) > 0 for r in recs) for k in common) / n,
            "never_retrieved": len(missed) / n, "never_retrieved_ids": [str(i) for _, i in missed]}


def per_question(d: Path, kinds: dict[str, str], row: dict) -> dict:
    """A cell's models question by question on the report questions (the benchmark's JSON keeps
    only their summaries): each model's agent EM and searches per question overall, EM by question
    kind and each question's EM by id; with `--best-of-val` also each arm's best checkpoint and
    every checkpoint's running-evaluation EM (the evaluation command's, and the RL arms' trainer's),
    so a reader can see which questions moved and how the checkpoints were chosen. EM in points."""
    from agent_rl.evaluation import report

    models = models_of(d, row["arms"])
    best = row.get("best_checkpoints", {}).get("arms", {})
    models.update({f"{arm}_best_step_{b['step']}": Path(b["eval"]) for arm, b in best.items()})

    def scored(e: Path) -> dict:
        g = report.grouped_stats(e, group_of=kinds)
        return {"em": round(100 * g[report.ALL]["em"], 1), "searches": round(g[report.ALL]["searches_mean"], 2),
                "by_kind": {k: round(100 * v["em"], 1) for k, v in sorted(g.items()) if k != report.ALL},
                "em_by_id": {str(i): float(r["em"]) for (_, i), r in report.records_by_question(e).items()}}

    running = {f"{arm}_trainer_validation": {str(k): em for k, _, em in points}
               for arm, points in row.get("val_points", {}).items()}
    running = {**{arm: {str(k): em for k, em in b["val_points"]} for arm, b in best.items()}, **running}
    return {"kb_seed": row["kb_seed"], "seed": row["seed"], "running_evaluation": running,
            "models": {m: scored(e) for m, e in models.items()}}


def seed_row(kb_seed: int, s: int, d: Path, arms, kinds: dict[str, str], questions: dict[str, dict],
             gain: float) -> dict:
    """One cell's numbers from what its stages left in `d`: per model (the start, each arm, SFT
    at GRPO's minutes) agent EM, searches per question and the better strategy's share, overall and
    by question kind, the EM of the questions searched each way, and strict format; per arm its
    steps and minutes; the paired differences (PAIRS) and each arm's from the start; SFT at GRPO's
    minutes; each RL arm's running evaluation and time to gain over the SFT arm; the headroom."""
    from agent_rl.evaluation import report
    from benchmarks.learning import time_to_gain

    A = report.ALL
    evals = models_of(d, arms)
    st = {m: report.grouped_stats(e, "agent", kinds) for m, e in evals.items()}
    shares = {m: {g: better_share(c) for g, c in strategy_counts(e, questions, kinds).items()} for m, e in evals.items()}
    pairs, minus_start = pairs_of({m: e for m, e in evals.items() if m != "sft_matched"}, kinds)
    row = {
        "kb_seed": kb_seed, "seed": s, "n": st["start"][A]["n"], "arms": list(arms),
        "em": {m: x[A]["em"] for m, x in st.items()},
        "searches": {m: x[A]["searches_mean"] for m, x in st.items()},
        "strict_format": {m: 1 - x[A]["invalid_format_rate"] for m, x in st.items()},
        "better_strategy": shares,
        "em_by_strategy": {m: em_by_strategy(e, questions) for m, e in evals.items()},
        "by_kind": {g: {"n": st["start"][g]["n"], "em": {m: x[g]["em"] for m, x in st.items() if g in x},
                        "searches": {m: x[g]["searches_mean"] for m, x in st.items() if g in x}}
                    for g in sorted(st["start"]) if g != A},
        "steps": {}, "minutes": {}, "pairs": pairs, "minus_start": minus_start,
        "headroom": headroom(list(evals.values())),
    }
    for arm in arms:
        row["steps"][arm], row["minutes"][arm] = trained(d / arm)
    if matched_ran(arms):
        k, k_min = matched_steps(d / "sft_more", d / "grpo")
        row["sft_matched"] = {"steps": k, "minutes": k_min, "loss_gap": same_steps_gap(d / "sft_more", d / "sft_matched", k),
                              "grpo_minus": report.paired_comparison(evals["sft_matched"], evals["grpo"],
                                                                     group_of=kinds)["diff"][A]}
    rl = [a for a in arms if a in RL_ARMS]
    row["val_points"] = {a: time_to_gain(d / a, 0.0)["val_points"] for a in rl}
    if "sft_more" in arms:
        row["val_em_sft_more"] = agent_em(d / "val_sft_more")
        row["time_to_gain_min"] = {a: minutes_to(row["val_points"][a], row["val_em_sft_more"] + gain) for a in rl}
        row["time_to_gain_by"] = "trainer validation"
    return row


def run_cell(w: Workdir, d: Path, kb_seed: int, s: int, val: Path, rep: Path, url: str, kinds: dict[str, str],
             questions: dict[str, dict], args, demos_all: Path | None, host: str) -> dict:
    """One cell (KB `kb_seed`, seed `s`): its start, every arm from it, their evaluations; its row
    (and `d`/per_question.json), with the hardware line it ran under."""
    start = sft(w, d / "start", s, args.start_steps, 24 * 3600, w.model)
    evaluate(w, start, rep, url, d / "eval_start", args.eval_limit)
    for arm in args.arms:
        model = run_arm(w, arm, start, val, url, d, s, args, demos_all)
        evaluate(w, model, rep, url, d / f"eval_{arm}", args.eval_limit)
    if "sft_more" in args.arms:
        evaluate(w, d / "sft_more" / "model", val, url, d / "val_sft_more", args.val_n)
    if matched_ran(args.arms):
        k, _ = matched_steps(d / "sft_more", d / "grpo")  # the same SFT run, k steps: by count, not clock
        matched = sft(w, d / "sft_matched", 1000 + s, k, 24 * 3600, start, extra=sft_lr(args)) if k else start
        evaluate(w, matched, rep, url, d / "eval_sft_matched", args.eval_limit)
    row = seed_row(kb_seed, s, d, args.arms, kinds, questions, args.gain)
    if args.best_of_val:
        evaluate(w, start, val, url, d / "val_start", args.val_n)
        first = {0: (d / "val_start", d / "eval_start")}
        best = {arm: best_checkpoint(w, d, arm, val, rep, url, args, {
            **first, row["steps"][arm]: (d / "val_sft_more" if arm == "sft_more" else None, d / f"eval_{arm}")})
            for arm in args.arms}
        row["best_checkpoints"] = best_row(d, kinds, best)
        if "sft_more" in args.arms:
            row["time_to_gain_min"] = {arm: checkpoint_time_to_gain(d / arm, best[arm]["val_points"],
                                                                    row["val_em_sft_more"] + args.gain)
                                       for arm in args.arms if arm in RL_ARMS}
            row["time_to_gain_by"] = "evaluation command"
    if args.log_batches:
        import pandas as pd

        from agent_rl.training.rollout_data import read_rollout_data

        train = {str(r["question"]): r for r in pd.read_parquet(w.kb / "train.parquet").to_dict("records")}
        row["group_strategy"] = {arm: group_strategy(read_rollout_data(d / arm / "rollouts"), train)
                                 for arm in args.arms if arm in RL_ARMS}
    (d / "per_question.json").write_text(json.dumps({"host": host, **per_question(d, kinds, row)}, indent=1) + "\n")
    return {**row, "host": host}


def run_choice(w: Workdir, d: Path, s: int, val: Path, url: str, args) -> dict[str, dict]:
    """The pre-registered choice of the control arms' settings (`--choose`, benchmarks/rl_vs_sft_choice.py):
    the cell's start, then every grid point as its arm from it (same minutes, clock and checkpoints as
    a reported run with --best-of-val) in `d`/choice/<name>, each checkpoint and the start scored on
    the running-evaluation questions. A point's scores go to its file (`point_file`), with the
    start's fingerprint, then its checkpoints (GiBs each) are deleted: a re-run reads the scores,
    also in another checkout that carried them (the choice takes hours on a CPU) once it has made
    the same start again. Returns {name: {arm, settings, steps, minutes, points, start}}."""
    from agent_rl.training.identity import model_fingerprint

    start = sft(w, d / "start", s, args.start_steps, 24 * 3600, w.model)
    start_id = model_fingerprint(start)
    start_val = evaluate(w, start, val, url, d / "val_start", args.val_n)
    scored = {}
    for arm, name, settings in choice.candidates():
        one = argparse.Namespace(**{**vars(args), **settings, "best_of_val": True})  # main refused any given
        out, kept = d / "choice" / name, point_file(d, name, args)
        if not kept.exists():
            run_arm(w, arm, start, val, url, d / "choice", s, one, name=name)
            points = val_points(w, d / "choice", name, val, url, one, {0: start_val})
            steps, minutes = trained(out)
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps({"arm": arm, "settings": settings, "steps": steps, "minutes": minutes,
                                        "points": points, "start": start_id}) + "\n")
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
        c = json.loads(kept.read_text())
        if c.get("start") != start_id:
            raise SystemExit(f"rl_vs_sft: {kept} was scored from another start than {start} (made on another host "
                             "kind or with other settings): its scores do not join this choice; move it away "
                             "to score that point again")
        scored[name] = {**c, "points": [tuple(p) for p in c["points"]]}
    return scored


def point_file(d: Path, name: str, args) -> Path:
    """Where a grid point's scores are kept: <--record-dir>/points/<name>.json when the record is
    kept (docs/results carries them to another checkout), else beside the point's run."""
    if args.record_dir:
        return Path(args.record_dir) / "points" / f"{name}.json"
    return d / "choice" / name / "points.json"


def run_kb(kb_seed: int, args, host: str) -> list[dict]:
    """Every cell of one KB (its workdir's settings checked): the workdir's model, KB,
    demonstrations (and every training question's with sft_all), then each seed's cell."""
    import pandas as pd

    from benchmarks.kb_server import serve_index

    work = kb_workdir(args, kb_seed)
    w = Workdir(work)
    run(stages.prepare_model(w), "prepare the embedded policy", done=w.model / ".complete")
    kind = [] if args.kb_kind == "standard" else ["--kind", args.kb_kind]
    run(stages.knowledge_base(w, kb_seed) + kind, f"knowledge base seed {kb_seed} ({args.kb_kind})",
        done=w.kb / "test.parquet")
    val, rep = split_test(w.kb, args.val_n)
    kb_test = pd.read_parquet(w.kb / "test.parquet")
    kinds = dict(zip(kb_test["id"].astype(str), kb_test["kind"].astype(str)))
    questions = {str(r["id"]): r for r in kb_test.to_dict("records")}
    rows = []
    with serve_index(w.index, w.kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
        run(stages.demonstrations(w, url, args.demos, args.demo_args.split()), "grounded demonstrations", done=w.demos)
        if args.start_curve:
            curves(w, work, args, kb_seed, rep, url, kinds, questions, host)
            return []
        if args.choose:
            chosen(w, work, args, kb_seed, val, url, host)
            return []
        w_all = Workdir(work, variant="_all")  # demonstrations of every training question: demos/kb_train_all.parquet
        if "sft_all" in args.arms:
            n_train = len(pd.read_parquet(w.kb / "train.parquet", columns=["id"]))
            run(stages.demonstrations(w_all, url, n_train, args.demo_args.split()),
                f"grounded demonstrations of all {n_train} training questions", done=w_all.demos)
        for s in args.seeds:
            rows.append(run_cell(w, work / f"seed{s}", kb_seed, s, val, rep, url, kinds, questions, args,
                                 w_all.demos, host))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-seed", type=int, nargs="+", default=[101],
                    help="knowledge base seed(s); every --seeds runs on each (cells = KB x seed); not the kind's "
                         "dev KB (DEV_KB_SEEDS); default 101")
    ap.add_argument("--kb-kind", default="standard",
                    help="knowledge base kind, passed to `agent-rl-prep synthetic --kind` (default standard; "
                         "lookalike: the kind with room above imitation, benchmarks/kb_headroom.py)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="SFT, data order and sampling seeds")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                    help="the arms each cell runs from its start (default all: sft_more rft grpo sft_all)")
    ap.add_argument("--start-steps", type=int, default=None,
                    help="steps of the start SFT (default 60 on both host kinds, chosen per kind on the dev KB; START_STEPS)")
    ap.add_argument("--minutes", type=float, default=10.0,
                    help="minutes of each arm, every second from its first step counted (default 10)")
    ap.add_argument("--sft-lr", type=float, default=None,
                    help="the sft_more arm's learning rate (default: the SFT config's, configs/sft/demo_cpu.yaml)")
    ap.add_argument("--sft-epochs", type=int, default=None,
                    help="the sft_more arm's epochs over the demonstrations (default: until its minutes end)")
    ap.add_argument("--rft-lr", type=float, default=None,
                    help="the rft arm's learning rate (default: the GRPO config's, or the lr of the key=value overrides)")
    ap.add_argument("--demos", type=int, default=1500, help="training questions to build demonstrations from")
    ap.add_argument("--eval-limit", type=int, default=200, help="held-out questions of the report (seeded sample)")
    ap.add_argument("--val-n", type=int, default=50, help="held-out questions of the running evaluation (kept apart)")
    ap.add_argument("--val-every", type=int, default=2, help="RL arms' steps between running evaluations")
    ap.add_argument("--best-of-val", action="store_true",
                    help="also compare each arm's best checkpoint by the running-evaluation questions")
    ap.add_argument("--sft-val-every", type=int, default=10,
                    help="with --best-of-val: SFT arms' steps between their checkpoints (default 10)")
    ap.add_argument("--log-batches", action="store_true",
                    help="the RL arms write every step's whole batch (<arm>/rollouts) and the row says, within "
                         "GRPO's groups, what each search strategy earned and the advantage it got (group_strategy)")
    ap.add_argument("--gain", type=float, default=0.05, help="the lead over the SFT arm that time to gain waits for")
    ap.add_argument("--demo-args", default="", help="extra arguments of `agent-rl-prep demos` (quoted), e.g. the wording")
    ap.add_argument("--workdir", default=None,
                    help="the KB's workdir (default runs/rl_vs_sft/kb<K>); with several KB seeds, the folder of "
                         "theirs and of the run's results")
    ap.add_argument("--json", default=None, help="write the result here too")
    ap.add_argument("--start-curve", type=int, nargs=2, metavar=("EVERY", "STEPS"), default=None,
                    help="instead of the arms: each seed's start SFT to STEPS, evaluated every EVERY steps "
                         "(choose --start-steps with it, on the dev KB; on the lookalike kind also what the "
                         "start's searches earn by strategy)")
    ap.add_argument("--choose", action="store_true",
                    help="instead of the arms: the pre-registered choice of --sft-lr, --sft-epochs and --rft-lr "
                         "on the kind's dev KB (one --kb-seed, the dev one; one seed): every grid point of "
                         "benchmarks/rl_vs_sft_choice.py as its arm, its best checkpoint on the --val-n questions")
    ap.add_argument("--with", dest="with_json", nargs="+", default=[], metavar="JSON",
                    help="count the rows of earlier runs' rl_vs_sft.json too (other cells, same settings "
                         "and host kind)")
    ap.add_argument("overrides", nargs="*", help="GRPO config overrides of both RL arms, key=value")
    records.add_args(ap)
    args = ap.parse_args(argv)
    if args.start_steps is None:
        args.start_steps = START_STEPS
    if args.start_curve and (args.start_curve[0] < 1 or args.start_curve[1] < args.start_curve[0]):
        ap.error("--start-curve EVERY STEPS: 1 <= EVERY <= STEPS")
    if args.start_curve and len(args.kb_seed) > 1:
        ap.error("--start-curve runs on one --kb-seed (the dev KB)")
    if args.sft_val_every < 1:
        ap.error("--sft-val-every: at least 1")
    if args.sft_epochs is not None and args.sft_epochs < 1:
        ap.error("--sft-epochs: at least 1")
    if args.choose and (args.start_curve or args.with_json):
        ap.error("--choose runs alone (no --start-curve, no --with)")
    if args.choose and (args.kb_seed != [DEV_KB_SEEDS.get(args.kb_kind)] or len(args.seeds) != 1):
        ap.error(f"--choose chooses on the {args.kb_kind} kind's dev KB only: --kb-seed "
                 f"{DEV_KB_SEEDS.get(args.kb_kind)} and one --seeds")
    if args.choose and any(v is not None for v in (args.sft_lr, args.sft_epochs, args.rft_lr)):
        ap.error("--choose chooses --sft-lr, --sft-epochs and --rft-lr: give none of them")
    if args.choose:
        from data_prep.hardware import default_device, native_bf16

        native, why = native_bf16("cpu")
        if default_device() != "cpu":
            native, why = False, "a GPU"
        if not native:  # the arms' minutes hold another number of steps there
            ap.error("--choose chooses on a CPU of the native-bf16 kind, where the reported CPU cells run "
                     f"(docs/preregistration/rl_beyond_imitation.md); this host has {why}")
    if args.start_curve and args.with_json:
        ap.error("--with counts earlier arms' rows; the start curve has none")
    args.arms = [a for a in ARMS if a in args.arms]
    args.kb_seed = list(dict.fromkeys(args.kb_seed))
    args.clock = CLOCK
    dev = DEV_KB_SEEDS.get(args.kb_kind)
    if dev in args.kb_seed and not (args.start_curve or args.choose):
        print(f"rl_vs_sft: KB seed {dev} is the {args.kb_kind} kind's dev KB the recipe was tuned on; report on "
              "another (its numbers would not be a result)", file=sys.stderr)
    from data_prep.hardware import hardware_line

    host = hardware_line()
    earlier = earlier_rows(args.with_json, args, host_kind_of(host))
    for k in args.kb_seed:  # every KB's workdir before anything runs
        check_settings(kb_workdir(args, k), argparse.Namespace(**{**vars(args), "kb_seed": k}))
    stages.stop_on_sigterm()
    t0 = time.time()
    rows = []
    try:
        for k in args.kb_seed:
            rows += run_kb(k, args, host)
    except KeyboardInterrupt:
        print("\n[rl_vs_sft] interrupted (a re-run with the same --workdir goes on)", file=sys.stderr)
        return 130
    if args.start_curve or args.choose:
        return 0
    rows = sorted(earlier + rows, key=lambda r: (r["kb_seed"], r["seed"]))
    out = out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    summ = summary(rows)
    text = table(rows, summ, host, args)
    print("\n" + text)
    result = {"kb_seeds": args.kb_seed, "dev_kb_seeds": DEV_KB_SEEDS, "arms": args.arms, "rows": rows, "summary": summ,
              "host": host, **{k: getattr(args, k) for k in MERGED}, "with": args.with_json,
              "wall_minutes": (time.time() - t0) / 60, "png": str(plot(rows, out / "rl_vs_sft.png"))}
    (out / "rl_vs_sft.md").write_text(text)
    (out / "rl_vs_sft.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    kbs, best = ", ".join(map(str, args.kb_seed)), ", best checkpoints" if args.best_of_val else ""
    records.keep(args, "rl_vs_sft", result, files=[result["png"]], default_dir=out,
                 title=f"{', '.join(args.arms)} from one start, {args.minutes:g} minutes an arm (every second), "
                       f"{args.kb_kind} KB {kbs}, {args.demos} demonstrations{best}")
    return 0


def curves(w: Workdir, work: Path, args, kb_seed: int, rep: Path, url: str, kinds: dict[str, str],
           questions: dict[str, dict], host: str) -> None:
    every, steps = args.start_curve
    by_seed = {s: start_curve(w, work / f"seed{s}", s, every, steps, rep, url, args.eval_limit, kinds,
                                 questions) for s in args.seeds}
    one = argparse.Namespace(**{**vars(args), "kb_seed": kb_seed})
    text = curve_table(by_seed, host, one)
    print("\n" + text)
    result = {"kb_seed": kb_seed, "kb_kind": args.kb_kind, "dev_kb_seeds": DEV_KB_SEEDS, "every": every, "steps": steps,
              "eval_limit": args.eval_limit, "curves": {str(s): c for s, c in by_seed.items()}, "host": host,
              "png": str(curve_plot(by_seed, work / "start_curve.png"))}
    (work / "start_curve.md").write_text(text)
    (work / "start_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "start_curve", result, files=[result["png"]], default_dir=work,
                 title=f"Where SFT stops improving, KB {kb_seed}: the start the benchmark uses")


def chosen(w: Workdir, work: Path, args, kb_seed: int, val: Path, url: str, host: str) -> None:
    """`--choose`: every grid point scored (run_choice), the rule's choice, its table, JSON and record."""
    s = args.seeds[0]
    scored = run_choice(w, work / f"seed{s}", s, val, url, args)
    picked = choice.choose(scored)
    text = choice.table(scored, picked, host, args)
    print("\n" + text)
    result = {"kb_seed": kb_seed, "kb_kind": args.kb_kind, "seed": s, "grid": choice.GRID, "candidates": scored,
              "chosen": picked, "host": host, **{k: getattr(args, k) for k in SETTINGS["choice"] + SETTINGS["shared"]}}
    (work / "choice.md").write_text(text)
    (work / "choice.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "rl_vs_sft_choice", result, default_dir=work,
                 title=f"The control arms' settings, chosen on the {args.kb_kind} kind's dev KB {kb_seed}")


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
