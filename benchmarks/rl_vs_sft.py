"""Does RL beat more SFT? GRPO against the same training minutes of continued SFT (not in CI).

    python benchmarks/rl_vs_sft.py --kb-seed 101 --seeds 1 2 3 [--start-steps N] [--minutes 10]
                                   [--eval-limit 200] [--workdir DIR] [--json PATH] [key=value ...]

On a knowledge base generated with `--kb-seed` (`agent-rl-prep synthetic --seed`; the dev KB
on which the demo's recipe is tuned is seed 0, DEV_KB_SEED: report on any other), for each
seed:

1. start: cold-start SFT for `--start-steps` steps on the KB's grounded demonstrations (data
   order follows the seed; default START_STEPS: 60 on both host kinds);
2. from that model, two arms given the same training minutes (`trainer.max_time_s`: the
   time of training steps, without start-up, saves or the running evaluation):
   (a) SFT continued on the same demonstrations (another order, same seed family);
   (b) GRPO on the KB's training questions (configs/train/demo_grpo_cpu.yaml; data order and
       sampling follow the seed);
3. SFT at GRPO's minutes: GRPO's steps are long (minutes on a CPU), so its last step ends
   before the budget by up to a step and it trains fewer minutes than the SFT arm. The same
   SFT run (same seed and order, constant lr: the same steps) is taken again to the last
   step that had ended within GRPO's training seconds, by the SFT arm's own step times:
   GRPO against exactly its own minutes of SFT, beside GRPO against the whole budget's (the
   table warns where a replayed step's loss differs: then it was not the same run);
4. the start and the three trained models are evaluated greedily in agent mode on the same
   held-out questions (a seeded sample of the KB's test questions, the first `--val-n` of which are kept apart
   for the running evaluation): agent EM, the paired difference GRPO - SFT with its 95%
   interval, by question kind (single / bridge / comparison), searches per question, strict
   format.

Best checkpoints (`--best-of-val`): with few demonstrations the SFT arm's last step can sit
past its best (it overfits), a weak control. Then each arm also keeps a checkpoint (the SFT arm
every `--sft-val-every` steps, GRPO every `--val-every`, both at their last step), every one of
them and the start (step 0) is scored by the evaluation command on the `--val-n` running-evaluation
questions, and each arm's best (ties go to fewer steps) is scored on the report questions:
GRPO's best against SFT's best, each chosen on questions the report does not hold.

Time to gain: `time_to_gain_min` is the GRPO training minutes until GRPO's EM on the `--val-n`
questions first passes the SFT arm's (at the end of its minutes, by the evaluation command) by
`--gain`. With `--best-of-val` GRPO's EM there is the evaluation command's at each checkpoint,
the scorer of the SFT arm's; without it, the trainer's running evaluation every `--val-every`
steps, whose scores differ from the command's by about a question in 40 (`time_to_gain_by`).

It prints each seed's row, the mean, the median and the worst seed, and writes JSON and a PNG
into the workdir (default runs/rl_vs_sft/kb<K>), and for each seed `seed<S>/per_question.json`:
every model's EM on each report question, by id, and every checkpoint's running-evaluation EM
(`per_question`). A re-run with the same workdir reuses every finished stage (so it writes those
files for a finished run too), and refuses a workdir made with other settings (its settings.json).
Extra `key=value` arguments override the GRPO config (veRL names).

Seeds run in several sittings (or on several hosts of one kind) count together:

    python benchmarks/rl_vs_sft.py --kb-seed 101 --seeds 3 --with runs/rl_vs_sft/kb101/rl_vs_sft.json

runs seed 3 and reports it beside the rows of the earlier run's JSON; an earlier file made with
other settings, on another host kind or holding one of `--seeds` is refused before anything runs.
Each row keeps its own hardware line.

Choosing `--start-steps` (a design decision: make it on the dev KB, seed 0):

    python benchmarks/rl_vs_sft.py --kb-seed 0 --seeds 1 2 --start-curve 20 100

trains each seed's start SFT once to 100 steps, saving every 20 (the lr is constant after its
warm-up, so the checkpoint at step k is the k-step start), and evaluates every checkpoint on the
report questions: agent EM by question kind and searches per question against steps
(`start_curve.{md,json,png}`). The fair start is where that curve has stopped rising: more SFT
from there gains nothing, and what RL adds is RL's.
"""

from __future__ import annotations

import argparse
import json
import re
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
from benchmarks.rl_vs_sft_tables import curve_plot, curve_table, plot, summary, table  # noqa: E402

DEV_KB_SEED = 0
"""The knowledge base every design decision of the demo's recipe was tuned on: never report on it."""

START_STEPS = {True: 60, False: 60}
"""The start SFT's steps by whether bf16 is native (`--start-steps` overrides), each chosen on the
dev KB from its host kind's start curve, two seeds: the smallest checkpoint after which the mean
EM rises by no more than 2 points (docs/real_data.md). fp32 used 44 before its curve ran."""

SETTINGS = {"shared": ("kb_seed", "demos", "demo_args", "eval_limit", "val_n"),
            "arms": ("start_steps", "minutes", "val_every", "overrides", "best_of_val", "sft_val_every"),
            "curve": ("start_curve",)}
"""What a workdir's finished stages depend on, by mode: a re-run may reuse them only under the same."""


MERGED = SETTINGS["shared"] + SETTINGS["arms"]
"""The settings an earlier run's rows must share to count with this run's (`--with`): those its
arms depend on, each checked where the file records it (older files lack demos, val_n, val_every)."""


def host_kind_of(host: str) -> str:
    """report.host_kind's words for a hardware line (`data_prep.hardware.hardware_line`)."""
    from agent_rl.demo.report import host_kind

    gpu = host.split(" gpu=", 1)[1].split(" native_bf16=", 1)[0] if " gpu=" in host else "none"
    return host_kind({"gpu": None if gpu == "none" else gpu, "native_bf16": " native_bf16=yes" in host})


def earlier_rows(paths: list[str], args, kind: str) -> list[dict]:
    """The rows of earlier runs' JSON (`--with`), each with the hardware line it ran under: only
    from runs of the same settings (MERGED) on this host kind, and none of a seed given twice;
    otherwise a SystemExit naming what differs, before anything runs."""
    rows: list[dict] = []
    seen = set(args.seeds)
    for p in paths:
        e = json.loads(Path(p).read_text())
        differ = [f"{k} {e[k]!r} there, {getattr(args, k)!r} here" for k in MERGED
                  if k in e and e[k] != getattr(args, k)]
        if host_kind_of(e["host"]) != kind:
            differ.append(f"host kind {host_kind_of(e['host'])!r} there, {kind!r} here")
        if differ:
            raise SystemExit(f"rl_vs_sft: --with {p} was made with other settings ({', '.join(differ)})")
        for r in e["rows"]:
            if r["seed"] in seen:
                raise SystemExit(f"rl_vs_sft: seed {r['seed']} of --with {p} is counted twice "
                                 "(in --seeds or in another --with file)")
            seen.add(r["seed"])
            rows.append({**r, "host": r.get("host", e["host"])})
    return rows


def default_start_steps() -> int:
    from data_prep.hardware import default_device, native_bf16

    return START_STEPS[native_bf16(default_device())[0]]


def check_settings(work: Path, args) -> None:
    """A re-run reuses every finished stage, so it must ask for what made them: a workdir made
    with other settings (another start, other minutes, another KB) is refused, naming them,
    before anything runs; its files are left as they are. The first run records its settings."""
    keys = SETTINGS["shared"] + SETTINGS["curve" if args.start_curve else "arms"]
    now = {k: getattr(args, k) for k in keys}
    f = work / "settings.json"
    before = json.loads(f.read_text()) if f.exists() else {}
    differ = {k: (before[k], v) for k, v in now.items() if k in before and before[k] != v}
    if differ:
        said = ", ".join(f"{k} {a!r} there, {b!r} asked" for k, (a, b) in differ.items())
        raise SystemExit(f"rl_vs_sft: {work} holds stages made with other settings ({said}); "
                         "give another --workdir (or the same settings to go on)")
    work.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({**before, **now}, indent=1) + "\n")


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


def sft(w: Workdir, out: Path, seed: int, steps: int, max_time_s: float, model: Path, save_every: int = 0) -> Path:
    """`save_every` > 0: a checkpoint every that many steps, all kept (the start curve)."""
    keep = [f"trainer.save_freq={save_every}", "trainer.max_ckpt_to_keep=null"] if save_every else []
    run(stages.sft(w.demos, model, out, steps, max_time_s, seed=seed) + keep, f"SFT -> {out.parent.name}/{out.name}",
        done=out / "model" / "config.json")
    return out / "model"


def start_curve(w: Workdir, d: Path, seed: int, every: int, steps: int, rep: Path, url: str, limit: int,
                kinds: dict[str, str]) -> list[dict]:
    """One start SFT to `steps`, its checkpoint every `every` steps evaluated on the report
    questions: [{step, em, by_kind, searches, strict_format}]."""
    from agent_rl.evaluation import report

    run_dir = d / "start_curve"
    sft(w, run_dir, seed, steps, 24 * 3600, w.model, save_every=every)
    points = []
    for k in range(every, steps + 1, every):
        out = evaluate(w, run_dir / "checkpoints" / f"global_step_{k}", rep, url, d / f"eval_curve_{k}", limit)
        st = report.grouped_stats(out, "agent", kinds)
        a = st.pop(report.ALL)
        points.append({"step": k, "n": a["n"], "em": a["em"], "searches": a["searches_mean"],
                       "strict_format": 1 - a["invalid_format_rate"],
                       "by_kind": {g: st[g]["em"] for g in sorted(st)}})
    return points


def grpo(w: Workdir, start: Path, val: Path, url: str, out: Path, seed: int, args) -> Path:
    """The GRPO arm; returns its run directory (evaluated from its newest checkpoint)."""
    over = [f"data.val_files=[{val}]", f"data.val_data_num={args.val_n}", f"data.seed={seed}",
            f"actor_rollout_ref.rollout.seed={seed}", f"trainer.test_freq={args.val_every}",
            "trainer.val_before_train=true",
            *([f"trainer.save_freq={args.val_every}", "trainer.max_ckpt_to_keep=null"] if args.best_of_val else []),
            *args.overrides]
    done = out / "finished.json"
    run(stages.grpo(w, start, url, 60 * args.minutes, run_dir=out, overrides=over),
        f"GRPO -> {out.parent.name}/{out.name} ({args.minutes:g} min)", done=done)
    done.write_text(json.dumps({"minutes": args.minutes}) + "\n")
    return out


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


def best_step(points: list[tuple[int, float]]) -> tuple[int, float]:
    """(step, EM): the highest running-evaluation EM; a tie goes to the fewest steps (the least
    training that reached it: the start, step 0, before any)."""
    return max(points, key=lambda p: (p[1], -p[0]))


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's checkpoints (`checkpoints/global_step_K`; not a killed save's `.tmp`), ascending."""
    found = (re.fullmatch(r"global_step_(\d+)", p.name) for p in (run_dir / "checkpoints").glob("global_step_*"))
    return sorted(int(m.group(1)) for m in found if m)


def best_checkpoint(w: Workdir, d: Path, arm: str, val: Path, rep: Path, url: str, args,
                    known: dict[int, tuple[Path | None, Path | None]]) -> dict:
    """The arm's (`sft_more` or `grpo`) checkpoints and the start (step 0) scored on the running-
    evaluation questions, the best (`best_step`) on the report questions. `known`: step ->
    (its evaluation on the val questions, on the report questions) already made, either None."""
    run_dir = d / arm
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise SystemExit(f"rl_vs_sft: {run_dir} kept no checkpoints (trained without --best-of-val); "
                         "give another --workdir")

    def ckpt(k: int) -> Path:
        return run_dir / "checkpoints" / f"global_step_{k}"

    val_dirs = {k: known.get(k, (None, None))[0]
                or evaluate(w, ckpt(k), val, url, d / f"val_{arm}_{k}", args.val_n) for k in [0, *steps]}
    points = [(k, agent_em(v)) for k, v in val_dirs.items()]
    k, em = best_step(points)
    rep_dir = known.get(k, (None, None))[1] or evaluate(w, ckpt(k), rep, url, d / f"eval_{arm}_{k}", args.eval_limit)
    return {"step": k, "minutes": step_times(run_dir).get(k, 0.0), "val_em": em, "val_points": points, "eval": str(rep_dir)}


def best_row(d: Path, kinds: dict[str, str], sft: dict, grpo: dict) -> dict:
    """Each arm's best checkpoint (`best_checkpoint`) and the paired differences on the report
    questions: GRPO's best - SFT's best, and each from the start."""
    from agent_rl.evaluation import report

    A = report.ALL
    vs = report.paired_comparison(sft["eval"], grpo["eval"], group_of=kinds)
    return {"sft": {**sft, "em": vs["a"][A]["em"]}, "grpo": {**grpo, "em": vs["b"][A]["em"]},
            "grpo_minus_sft": vs["diff"][A],
            "sft_minus_start": report.paired_comparison(d / "eval_start", sft["eval"], group_of=kinds)["diff"][A],
            "grpo_minus_start": report.paired_comparison(d / "eval_start", grpo["eval"], group_of=kinds)["diff"][A]}


EVALS = ("eval_start", "eval_sft_more", "eval_sft_matched", "eval_grpo")
"""A seed's four evaluation folders: the start, SFT more, SFT at GRPO's minutes, GRPO."""


def headroom(d: Path) -> dict:
    """What any arm could reach on this seed's report questions: the share that at least one of
    the four models (start, both SFT arms, GRPO) answered right, and the share where no model's
    searches brought a gold answer into its context (Search-R1's retrieval hit), with those
    questions' ids: the JSON keeps them, so their trajectories can be found (or rerun on the
    KB regenerated from its seed) after the workdir is gone. A lead of GRPO over the SFT arm
    beyond `any_right - em_sft_more` needs questions no model has answered."""
    from agent_rl.evaluation import report

    recs = [report.records_by_question(d / e) for e in EVALS]
    common = set.intersection(*(set(r) for r in recs))
    n = max(len(common), 1)
    missed = sorted(k for k in common if not any(r[k].get("retrieval_hit") for r in recs))
    return {"any_right": sum(any(float(r[k]["em"]) > 0 for r in recs) for k in common) / n,
            "never_retrieved": len(missed) / n, "never_retrieved_ids": [str(i) for _, i in missed]}


def per_question(d: Path, kinds: dict[str, str], row: dict) -> dict:
    """A seed's models question by question on the report questions (the benchmark's JSON keeps
    only their summaries): each model's agent EM and searches per question overall, EM by question
    kind and each question's EM by id; with `--best-of-val` also each arm's best checkpoint and
    every checkpoint's running-evaluation EM (the evaluation command's, and GRPO's trainer's),
    so a reader can see which questions moved and how the checkpoints were chosen. EM in points."""
    from agent_rl.evaluation import report

    models = dict(zip(("start", "sft_more", "sft_matched", "grpo"), (d / e for e in EVALS)))
    best = row.get("best_checkpoints")
    if best:
        models[f"sft_best_step_{best['sft']['step']}"] = Path(best["sft"]["eval"])
        models[f"grpo_best_step_{best['grpo']['step']}"] = Path(best["grpo"]["eval"])

    def scored(e: Path) -> dict:
        g = report.grouped_stats(e, group_of=kinds)
        return {"em": round(100 * g[report.ALL]["em"], 1), "searches": round(g[report.ALL]["searches_mean"], 2),
                "by_kind": {k: round(100 * v["em"], 1) for k, v in sorted(g.items()) if k != report.ALL},
                "em_by_id": {str(i): float(r["em"]) for (_, i), r in report.records_by_question(e).items()}}

    running = {"grpo_trainer_validation": {str(k): em for k, _, em in row["val_points"]}}
    if best:
        running = {"sft_more": {str(k): em for k, em in best["sft"]["val_points"]},
                   "grpo": {str(k): em for k, em in best["grpo"]["val_points"]}, **running}
    return {"seed": row["seed"], "running_evaluation": running, "models": {m: scored(e) for m, e in models.items()}}


def seed_row(s: int, d: Path, kinds: dict[str, str], gain: float) -> dict:
    """One seed's numbers from what its stages left in `d`."""
    from agent_rl.evaluation import report
    from benchmarks.learning import time_to_gain

    start, more, matched, rl = (d / e for e in EVALS)
    vs_sft = report.paired_comparison(more, rl, group_of=kinds)
    vs_matched = report.paired_comparison(matched, rl, group_of=kinds)
    vs_start = report.paired_comparison(start, rl, group_of=kinds)
    sft_gain = report.paired_comparison(start, more, group_of=kinds)
    A = report.ALL
    val_sft_more = agent_em(d / "val_sft_more")
    ttg = time_to_gain(d / "grpo", 0.0)
    (sft_steps, sft_min), (rl_steps, rl_min) = trained(d / "sft_more"), trained(d / "grpo")
    k, k_min = matched_steps(d / "sft_more", d / "grpo")
    return {
        "seed": s, "n": vs_sft["n"],
        "em_start": vs_start["a"][A]["em"], "em_sft_more": vs_sft["a"][A]["em"], "em_grpo": vs_sft["b"][A]["em"],
        "grpo_minus_sft": vs_sft["diff"][A], "grpo_minus_start": vs_start["diff"][A], "sft_more_minus_start": sft_gain["diff"][A],
        "by_kind": {g: {"start": vs_start["a"][g]["em"], "sft_more": vs_sft["a"][g]["em"], "grpo": vs_sft["b"][g]["em"],
                        "n": vs_sft["a"][g]["n"]} for g in vs_sft["groups"] if g != A},
        "searches": {"start": vs_start["a"][A]["searches_mean"], "sft_more": vs_sft["a"][A]["searches_mean"],
                     "grpo": vs_sft["b"][A]["searches_mean"]},
        "strict_format": {"start": 1 - vs_start["a"][A]["invalid_format_rate"],
                          "sft_more": 1 - vs_sft["a"][A]["invalid_format_rate"],
                          "grpo": 1 - vs_sft["b"][A]["invalid_format_rate"]},
        "sft_more_steps": sft_steps, "sft_more_minutes": sft_min, "grpo_steps": rl_steps, "grpo_minutes": rl_min,
        "em_sft_matched": vs_matched["a"][A]["em"], "grpo_minus_sft_matched": vs_matched["diff"][A],
        "sft_matched_steps": k, "sft_matched_minutes": k_min,
        "sft_matched_loss_gap": same_steps_gap(d / "sft_more", d / "sft_matched", k),
        "val_em_sft_more": val_sft_more, "val_points": ttg["val_points"],
        "time_to_gain_min": minutes_to(ttg["val_points"], val_sft_more + gain),
        "time_to_gain_by": "trainer validation",
        "headroom": headroom(d),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-seed", type=int, default=101, help="knowledge base seed (not DEV_KB_SEED=0; default 101)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="SFT, data order and sampling seeds")
    ap.add_argument("--start-steps", type=int, default=None,
                    help="steps of the start SFT (default 60 on both host kinds, chosen per kind on the dev KB; START_STEPS)")
    ap.add_argument("--minutes", type=float, default=10.0, help="training minutes of each arm (default 10)")
    ap.add_argument("--demos", type=int, default=1500, help="training questions to build demonstrations from")
    ap.add_argument("--eval-limit", type=int, default=200, help="held-out questions of the report (seeded sample)")
    ap.add_argument("--val-n", type=int, default=50, help="held-out questions of the running evaluation (kept apart)")
    ap.add_argument("--val-every", type=int, default=2, help="GRPO steps between running evaluations")
    ap.add_argument("--best-of-val", action="store_true",
                    help="also compare each arm's best checkpoint by the running-evaluation questions")
    ap.add_argument("--sft-val-every", type=int, default=10,
                    help="with --best-of-val: SFT arm steps between its checkpoints (default 10)")
    ap.add_argument("--gain", type=float, default=0.05, help="the lead over the SFT arm that time to gain waits for")
    ap.add_argument("--demo-args", default="", help="extra arguments of `agent-rl-prep demos` (quoted), e.g. the wording")
    ap.add_argument("--workdir", default=None, help="default runs/rl_vs_sft/kb<K>")
    ap.add_argument("--json", default=None, help="write the result here too")
    ap.add_argument("--start-curve", type=int, nargs=2, metavar=("EVERY", "STEPS"), default=None,
                    help="instead of the arms: each seed's start SFT to STEPS, evaluated every EVERY steps "
                         "(choose --start-steps with it, on the dev KB)")
    ap.add_argument("--with", dest="with_json", nargs="+", default=[], metavar="JSON",
                    help="count the rows of earlier runs' rl_vs_sft.json too (other seeds, same settings "
                         "and host kind)")
    ap.add_argument("overrides", nargs="*", help="GRPO config overrides, key=value")
    records.add_args(ap)
    args = ap.parse_args(argv)
    if args.start_steps is None:
        args.start_steps = default_start_steps()
    if args.start_curve and (args.start_curve[0] < 1 or args.start_curve[1] < args.start_curve[0]):
        ap.error("--start-curve EVERY STEPS: 1 <= EVERY <= STEPS")
    if args.sft_val_every < 1:
        ap.error("--sft-val-every: at least 1")
    if args.start_curve and args.with_json:
        ap.error("--with counts earlier arms' rows; the start curve has none")
    if args.kb_seed == DEV_KB_SEED and not args.start_curve:
        print(f"rl_vs_sft: KB seed {DEV_KB_SEED} is the dev KB the recipe was tuned on; report on another "
              "(its numbers would not be a result)", file=sys.stderr)
    from benchmarks.kb_server import serve_index
    from data_prep.hardware import hardware_line

    host = hardware_line()
    earlier = earlier_rows(args.with_json, args, host_kind_of(host))
    stages.stop_on_sigterm()

    work = Path(args.workdir or ROOT / "runs" / "rl_vs_sft" / f"kb{args.kb_seed}").resolve()
    check_settings(work, args)
    w = Workdir(work)
    t0 = time.time()
    run(stages.prepare_model(w), "prepare the embedded policy", done=w.model / ".complete")
    run(stages.knowledge_base(w, args.kb_seed), f"knowledge base seed {args.kb_seed}", done=w.kb / "test.parquet")
    val, rep = split_test(w.kb, args.val_n)
    import pandas as pd

    kb_test = pd.read_parquet(w.kb / "test.parquet", columns=["id", "kind"])
    kinds = dict(zip(kb_test["id"].astype(str), kb_test["kind"].astype(str)))
    rows = []
    try:
        with serve_index(w.index, w.kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
            run(stages.demonstrations(w, url, args.demos, args.demo_args.split()), "grounded demonstrations",
                done=w.demos)
            if args.start_curve:
                return curves(w, work, args, rep, url, kinds)
            for s in args.seeds:
                d = work / f"seed{s}"
                start = sft(w, d / "start", s, args.start_steps, 24 * 3600, w.model)
                evaluate(w, start, rep, url, d / "eval_start", args.eval_limit)
                more_seed = 1000 + s  # the SFT arm and its replay at GRPO's minutes: one run
                more = sft(w, d / "sft_more", more_seed, 1_000_000, 60 * args.minutes, start,
                           save_every=args.sft_val_every if args.best_of_val else 0)
                evaluate(w, more, rep, url, d / "eval_sft_more", args.eval_limit)
                evaluate(w, more, val, url, d / "val_sft_more", args.val_n)
                rl = grpo(w, start, val, url, d / "grpo", s, args)
                evaluate(w, rl, rep, url, d / "eval_grpo", args.eval_limit)
                k, _ = matched_steps(d / "sft_more", d / "grpo")  # the same SFT run, k steps: by count, not clock
                matched = sft(w, d / "sft_matched", more_seed, k, 24 * 3600, start) if k else start
                evaluate(w, matched, rep, url, d / "eval_sft_matched", args.eval_limit)
                row = seed_row(s, d, kinds, args.gain)
                if args.best_of_val:
                    evaluate(w, start, val, url, d / "val_start", args.val_n)
                    first = {0: (d / "val_start", d / "eval_start")}
                    sft_best = best_checkpoint(w, d, "sft_more", val, rep, url, args,
                                               {**first, row["sft_more_steps"]: (d / "val_sft_more", d / "eval_sft_more")})
                    grpo_best = best_checkpoint(w, d, "grpo", val, rep, url, args,
                                                {**first, row["grpo_steps"]: (None, d / "eval_grpo")})
                    row["best_checkpoints"] = best_row(d, kinds, sft_best, grpo_best)
                    row["time_to_gain_min"] = checkpoint_time_to_gain(d / "grpo", grpo_best["val_points"],
                                                                      row["val_em_sft_more"] + args.gain)
                    row["time_to_gain_by"] = "evaluation command"
                (d / "per_question.json").write_text(json.dumps({"kb_seed": args.kb_seed, "host": host,
                                                                  **per_question(d, kinds, row)}, indent=1) + "\n")
                rows.append({**row, "host": host})
    except KeyboardInterrupt:
        print("\n[rl_vs_sft] interrupted (a re-run with the same --workdir goes on)", file=sys.stderr)
        return 130
    rows = sorted(earlier + rows, key=lambda r: r["seed"])
    summ = summary(rows)
    text = table(rows, summ, host, args)
    print("\n" + text)
    result = {"kb_seed": args.kb_seed, "dev_kb_seed": DEV_KB_SEED, "rows": rows, "summary": summ, "host": host,
              **{k: getattr(args, k) for k in MERGED}, "with": args.with_json, "wall_minutes": (time.time() - t0) / 60,
              "png": str(plot(rows, work / "rl_vs_sft.png"))}
    (work / "rl_vs_sft.md").write_text(text)
    (work / "rl_vs_sft.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "rl_vs_sft", result, files=[result["png"]], default_dir=work,
                 title=f"GRPO against the same minutes of SFT, KB {args.kb_seed}, {args.demos} demonstrations, "
                       f"{args.minutes:g}-minute arms" + (", best checkpoints" if args.best_of_val else ""))
    return 0


def curves(w: Workdir, work: Path, args, rep: Path, url: str, kinds: dict[str, str]) -> int:
    from data_prep.hardware import hardware_line

    every, steps = args.start_curve
    by_seed = {s: start_curve(w, work / f"seed{s}", s, every, steps, rep, url, args.eval_limit, kinds) for s in args.seeds}
    host = hardware_line()
    text = curve_table(by_seed, host, args)
    print("\n" + text)
    result = {"kb_seed": args.kb_seed, "dev_kb_seed": DEV_KB_SEED, "every": every, "steps": steps,
              "eval_limit": args.eval_limit, "curves": {str(s): c for s, c in by_seed.items()}, "host": host,
              "png": str(curve_plot(by_seed, work / "start_curve.png"))}
    (work / "start_curve.md").write_text(text)
    (work / "start_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "start_curve", result, files=[result["png"]], default_dir=work,
                 title=f"Where SFT stops improving, KB {args.kb_seed}: the start the benchmark uses")
    return 0


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
