"""Does RL teach search? Held-out EM of the SFT model vs the same model after RL (not in CI).

    python benchmarks/learning.py [--minutes 60] [--json PATH] [--sft DIR] [--config YAML]
    python benchmarks/learning.py --real [--minutes 60] [--eval-limit 500]

From the cold-start SFT checkpoint, trains with RL (GRPO by default: configs/train/
demo_grpo_cpu.yaml) on the embedded knowledge base for a wall-clock budget, then evaluates on
the KB's held-out test questions (greedy, `agent-rl-eval`, the same seeded sample for every
model):
- em_sft / em_rl: the SFT and the RL model in agent mode (may search);
- em_rag / em_direct: the paper's baselines with the SFT model (top-k passages in the
  prompt; no retrieval);
- format_rate_sft / format_rate_rl: Search-R1's strict format rule in agent mode;
- searches_sft / searches_rl: searches per question in agent mode.
Each EM comes with its Wilson 95% interval; em_rl - em_sft also with a paired interval (same
questions). The same numbers per data source are under `sets`. The reward / EM curves of the
run go to a PNG; diagnostics from the run's metrics (reward first vs last steps, searches,
valid format, seconds per step) say what limits learning.

`--real`: the real-data recipe's artifacts (scripts/real_data.sh builds them): the wiki_35k
retriever, the SFT model runs/sft/real, configs/train/wiki35k_grpo_cpu.yaml, RL on the
questions of the recipe's demonstrations (artifacts/real/demos_*) and a 1-in-16 sample of the
HotpotQA/2Wiki training questions (artifacts/real/split/rl_hotpot_train_questions.parquet), and
`--eval-limit` (default 500) questions each of NQ test and HotpotQA dev. Test questions that
also occur in a training file of the config (normalised text) are dropped first and counted
(`overlap_dropped`).

Time to gain: during RL the trainer evaluates the running policy every `--val-every` steps
(and before the first) on a fixed held-out subset (the first `--val-n` test questions, greedy,
agent mode: `val/em`); `time_to_gain_min` is the RL training time (validation excluded) until
`val/em` first reaches the step-0 (SFT) value + `--gain` (default 5 points), or null when it
never did. `--compare-ref REF` runs the same RL (same SFT model, overrides, budget and
validation) with the code and config of git REF (e.g. ea14a9d, in a worktree under the
workdir) first, then this checkout's, and prints both arms' time to gain, steps and seconds per
step side by side; each arm's final model is evaluated on the same questions.

`--minutes` is the budget of the RL training loop (`trainer.max_time_s`: the trainer stops
before a step that would end past it and saves; worker start-up and the evaluations come on
top; the JSON has `minutes` trained and `wall_minutes` in all). Everything goes to --workdir
(default runs/learning/<time>); the retriever is started on the flat index (built when
missing) and stopped on exit. RL runs first, then the evaluations (they give the same numbers
however busy the host is). A re-run with the same --workdir reuses a finished RL run
(`rl_finished.json`) and finished evaluations.
Extra positional `key=value` arguments override the training config (veRL names), e.g.
`actor_rollout_ref.rollout.n=8` or `reward.structure_format_score=0.2`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
from benchmarks import records  # noqa: E402

PY = sys.executable
MODES = ("agent", "rag", "direct")


def run(cmd: list[str], what: str) -> None:
    print(f"\n[learning] {what}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"[learning] {what}: {time.time() - t0:.0f}s", flush=True)


TRAINING_ONLY = ("reward.", "trainer.", "algorithm.", "actor_rollout_ref.actor.", "critic.")


def evaluate(model: Path, modes: list[str], url: str, args: argparse.Namespace, out: Path) -> dict:
    """`agent-rl-eval` in its own process (its engine must not share the cores with training);
    resumable: a finished evaluation in `out` is reused."""
    cmd = [PY, "-m", "agent_rl.evaluation.cli", "eval", "--model", str(model), "--retriever-url", url,
           "--data", *map(str, args.test), "--mode", *modes, "--out", str(out), "--limit", str(args.eval_limit),
           "--seed", str(args.seed), "--config", str(args.config), "--no-progress"]
    # training-only knobs (reward shaping, optimiser, loop) do not change what is evaluated:
    # leaving them out lets runs that differ only there share the SFT evaluation
    rollout = [o for o in args.overrides if not o.startswith(TRAINING_ONLY)]
    run(cmd + ["--", *rollout] if rollout else cmd, f"evaluate {model} in {', '.join(modes)}")
    return json.loads((out / "summary.json").read_text())


def rl_overrides(sft: Path, url: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The overrides of an RL arm: the SFT model, the retriever, the clock as the only limit,
    and the running held-out evaluation that `time_to_gain` reads."""
    return [
        f"actor_rollout_ref.model.path={sft}",
        f"retriever.url=[{url}]",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        # no step count: the clock decides. A warm-up given as a ratio of the (unknown) total
        # would never end, so warm-up must be in steps.
        "trainer.total_training_steps=1000000",
        f"trainer.max_time_s={60 * args.minutes}",
        "trainer.save_freq=-1",
        f"data.val_files=[{args.test[0]}]",
        f"data.val_data_num={args.val_n}",
        f"trainer.test_freq={args.val_every}",
        "trainer.val_before_train=true",
        *args.overrides,
    ]


def first_reaching(points: list[tuple[int, float, float]], bar: float) -> tuple[int, float, float] | None:
    """The first validation point (step, minutes, EM) after step 0, by step, whose EM reaches
    `bar`; None when none does."""
    return next((p for p in sorted(points) if p[0] > 0 and p[2] >= bar - 1e-9), None)


def time_to_gain(run_dir: Path, gain: float) -> dict:
    """From the run's metrics.jsonl: the step-0 val/em (the SFT model), and the RL minutes and
    step at which val/em first reached it + `gain` (None when it never did). RL minutes are the
    trainer's `training/elapsed_s`, which leaves its validations out (a --compare-ref arm of code
    older than that counts them in), unless the run counted every second
    (trainer.max_time_counts=all: benchmarks/rl_vs_sft.py's arms), where the validations and
    saves before a step are in its minutes."""
    from agent_rl.training.metrics import validation_points

    points = validation_points(run_dir)
    if not points or points[0][0] != 0:
        raise ValueError(f"{run_dir}: no step-0 val/em (trainer.val_before_train)")
    base = points[0][2]
    hit = first_reaching(points, base + gain)
    return {"val_em_start": base, "val_em_best": max(p[2] for p in points), "val_em_last": points[-1][2],
            "val_points": points, "time_to_gain_min": None if hit is None else hit[1],
            "steps_to_gain": None if hit is None else hit[0]}


def train_at_ref(ref: str, sft: Path, url: str, args: argparse.Namespace, run_dir: Path) -> tuple[int, float]:
    """The same RL arm with the code and config of git `ref` (a worktree under the workdir),
    through its own `agent-rl-train`; returns (steps, training seconds) from its metrics."""
    from agent_rl.training.metrics import read_jsonl

    src = run_dir.parent / f"src-{ref}"
    if not (src / "agent_rl").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(src), ref], cwd=ROOT, check=True)
    if not (src / "artifacts").exists():  # the config's relative data paths, as in this checkout
        (src / "artifacts").symlink_to(ROOT / "artifacts", target_is_directory=True)
    config = src / Path(args.config).resolve().relative_to(ROOT)
    cmd = [PY, "-m", "agent_rl.training.cli", "--config", str(config), *rl_overrides(sft, url, args, run_dir)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    print(f"\n[learning] RL with the code of {ref}\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=src, env=env, check=True)  # `python -m` imports from the working directory
    rows = [r for r in read_jsonl(run_dir) if r.get("step", 0) > 0 and "training/elapsed_s" in r]
    return (rows[-1]["step"], rows[-1]["training/elapsed_s"]) if rows else (0, 0.0)


def train(sft: Path, url: str, args: argparse.Namespace, run_dir: Path) -> tuple[int, float]:
    """RL from `sft` until `trainer.max_time_s` is spent; returns (steps, training seconds).
    The trainer runs in this process (Ray actors for the workers)."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.trainer import ray_trainer

    cfg = load_config(TrainConfig, args.config, rl_overrides(sft, url, args, run_dir))
    if cfg.actor_rollout_ref.actor.optim.lr_warmup_steps < 0:
        cfg.actor_rollout_ref.actor.optim.lr_warmup_steps = 0
    t_setup = time.monotonic()
    with ray_trainer(cfg, run_dir) as trainer:
        # the budget is for training steps; worker start-up (engine, actor, Ray) is reported apart
        print(f"[learning] trainer ready in {time.monotonic() - t_setup:.0f}s", flush=True)
        trainer.fit(on_step=lambda step, m: print(f"[learning] step {step}: {m['training/elapsed_s']:.0f}s of "
                                                  f"{60 * args.minutes:.0f}s", flush=True))
        return trainer.step, trainer.run.trained_s


def diagnostics(run_dir: Path, window: int = 5) -> dict:
    """What the curves say, in numbers: first vs last `window` steps of the run."""
    from agent_rl.training.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir) if r.get("step", 0) > 0]
    out: dict = {"steps_logged": len(rows)}
    for key in ("reward/mean", "reward/em", "reward/valid_format", "rollout/searches_mean", "actor/entropy",
                "actor/pg_clipfrac", "timing/step"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            name, w = key.replace("/", "_"), max(1, min(window, len(vals) // 2))  # halves never overlap
            out[f"{name}_first"] = sum(vals[:w]) / w
            out[f"{name}_last"] = sum(vals[-w:]) / w
    return out


def numbers(sft: dict, rl: dict, sft_records: list[dict], rl_records: list[dict], source: str) -> dict:
    """The benchmark's keys for one data source (`report.ALL`: every source) from the SFT
    evaluation (three modes), the RL evaluation (agent) and their per-question records."""
    from agent_rl.evaluation import report

    if source != report.ALL:
        sft_records = [r for r in sft_records if r["data_source"] == source]
        rl_records = [r for r in rl_records if r["data_source"] == source]
    paired = report.paired_em_difference(rl_records, sft_records)
    cells = {"em_sft": sft["agent"][source], "em_rl": rl["agent"][source], "em_rag": sft["rag"][source],
             "em_direct": sft["direct"][source]}
    out: dict = {k: c["em"] for k, c in cells.items()}
    out.update(
        n_eval=cells["em_sft"]["n"],
        format_rate_sft=1.0 - cells["em_sft"]["invalid_format_rate"],
        format_rate_rl=1.0 - cells["em_rl"]["invalid_format_rate"],
        searches_sft=cells["em_sft"]["searches_mean"],
        searches_rl=cells["em_rl"]["searches_mean"],
    )
    out["ci"] = {k: [c["em_ci_low"], c["em_ci_high"]] for k, c in cells.items()}
    out["ci"]["em_rl_minus_sft"] = [paired["ci_low"], paired["ci_high"]]
    return out


def assemble(work: Path, steps: int, seconds: float) -> dict:
    """The benchmark's numbers from what the run left on disk: eval_sft/ (three modes),
    eval_rl/ (agent), rl/ (metrics.jsonl)."""
    from agent_rl.evaluation import report

    sft, rl = report.read_summary(work / "eval_sft")["modes"], report.read_summary(work / "eval_rl")["modes"]
    sft_records, rl_records = report.read_records(work / "eval_sft", "agent"), report.read_records(work / "eval_rl", "agent")
    result = numbers(sft, rl, sft_records, rl_records, report.ALL)
    result.update(minutes=seconds / 60, steps=steps)
    result["sets"] = {src: numbers(sft, rl, sft_records, rl_records, src) for src in sft["agent"] if src != report.ALL}
    # the searches of the earlier JSON layout, kept for readers of old results
    result["searches"] = {"sft": result["searches_sft"], "rl": result["searches_rl"]}
    result["goal_met"] = bool(result["em_rl"] - result["em_sft"] >= 0.10 and result["em_rl"] > result["em_rag"])
    result["diagnostics"] = diagnostics(work / "rl")
    try:
        from agent_rl.evaluation.plot import plot_run

        result["curves_png"] = str(plot_run(work / "rl", work / "curves.png"))
    except (OSError, ValueError) as e:  # no metrics (budget hit inside step 1): keep the numbers
        result["curves_png"] = None
        print(f"[learning] no curves: {e}", file=sys.stderr)
    result["workdir"] = str(work)
    return result


def held_out(tests: list[Path], config: Path, overrides: list[str], work: Path) -> tuple[list[Path], dict]:
    """Test files without the questions that also occur in a training file of the config
    (normalised text, as `agent-rl-prep overlap`); returns the filtered copies and the number
    dropped per test file."""
    from agent_rl.config import TrainConfig, load_config
    from data_prep.qa import drop_questions, questions_of

    seen = questions_of(load_config(TrainConfig, config, overrides).data.train_files)
    out = [work / "held_out" / f"{t.stem}.parquet" for t in tests]
    dropped = {t.stem: drop_questions(t, seen, o)[1] for t, o in zip(tests, out)}  # atomic_path makes the folder
    return out, dropped


def time_to_gain_markdown(arms: dict, args: argparse.Namespace, em_sft: float) -> str:
    """One row per arm: minutes and steps of RL until the running held-out EM first passed SFT +
    gain, seconds per step, and the final model's agent EM."""
    from data_prep.hardware import hardware_line

    lines = [hardware_line(), "",
             f"| code | RL minutes to SFT + {100 * args.gain:.0f} points (steps) | steps in {args.minutes:g} min "
             f"(validations excluded) | s / step | running EM (first {args.val_n}): start -> best -> last | "
             f"agent EM after RL (SFT {100 * em_sft:.1f}) |",
             "|---|---|---|---|---|---|"]
    for name, a in arms.items():
        ttg = "not reached" if a["time_to_gain_min"] is None else f"{a['time_to_gain_min']:.1f} ({a['steps_to_gain']})"
        per_step = a["rl_seconds"] / a["steps"] if a["steps"] else float("nan")
        lines.append(f"| {name} | {ttg} | {a['steps']} | {per_step:.1f} | {100 * a['val_em_start']:.1f} -> "
                     f"{100 * a['val_em_best']:.1f} -> {100 * a['val_em_last']:.1f} | {100 * a['em_rl']:.1f} |")
    return "\n".join(lines) + "\n"


REAL_TRAIN_SETS = ("nq_train", "hotpot_train", "musique_train", "musique_official", "hotpot_official")
"""scripts/real_data.sh's TRAIN_SETS: RL trains on the questions of their demonstrations
(`demos_*`; the config's group filter drops those whose samples agree on EM)."""
REAL_EXTRA_RL_FILES = ("artifacts/real/split/rl_hotpot_train_questions.parquet",)
"""...and on 1 in 16 HotpotQA/2Wiki training questions, demonstration or not."""
REAL = {  # --real: what scripts/real_data.sh leaves (OUT=artifacts/real)
    "train_files": [f"artifacts/real/demos_{name}.parquet" for name in REAL_TRAIN_SETS] + list(REAL_EXTRA_RL_FILES),
    "sft": "runs/sft/real",
    "config": "configs/train/wiki35k_grpo_cpu.yaml",
    "index": "artifacts/wiki35k_flat",
    "tests": ["artifacts/real/nq_test.parquet", "artifacts/real/hotpotqa_dev.parquet"],
    "eval_limit": 500,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="RL training budget in minutes (default 60)")
    ap.add_argument("--json", default=None, help="write the result here too")
    ap.add_argument("--real", action="store_true",
                    help="real data: wiki_35k, NQ test + HotpotQA dev, the SFT model of scripts/real_data.sh "
                         f"(defaults: {', '.join(f'{k}={v}' for k, v in REAL.items())})")
    ap.add_argument("--sft", default=None,
                    help="SFT model: HF dir or agent-rl-sft run dir (default runs/sft/demo_cpu, configs/sft/demo_cpu.yaml)")
    ap.add_argument("--config", default=None, help="training config (default configs/train/demo_grpo_cpu.yaml)")
    ap.add_argument("--kb", default=str(ROOT / "artifacts/kb"), help="knowledge base dir (corpus.jsonl, test.parquet)")
    ap.add_argument("--index", default=None, help="flat index of the corpus (built when missing; default artifacts/kb_index_flat)")
    ap.add_argument("--corpus", default=None, help="corpus jsonl (default: the KB's; --real: ../shared/data/corpus/wiki_35k.jsonl)")
    ap.add_argument("--test", nargs="+", default=None, help="held-out QA files (default: the KB's test.parquet)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out questions per test file (seeded sample; default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the evaluation sample")
    ap.add_argument("--workdir", default=None, help="default runs/learning/<time>")
    ap.add_argument("--val-every", type=int, default=4, help="steps between running held-out evaluations (default 4)")
    ap.add_argument("--val-n", type=int, default=100, help="held-out questions of the running evaluation (default 100)")
    ap.add_argument("--gain", type=float, default=0.05, help="the EM gain over SFT that time_to_gain waits for (0.05)")
    ap.add_argument("--compare-ref", default=None, metavar="REF",
                    help="also run RL with the code and config of git REF (e.g. ea14a9d), first, and compare")
    ap.add_argument("overrides", nargs="*", help="training config overrides, key=value")
    records.add_args(ap)
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()

    from agent_rl.evaluation import report
    from agent_rl.evaluation.evaluate import EvalInputError, resolve_model_dir
    from benchmarks.kb_server import serve_index

    kb = Path(args.kb)
    if args.real:
        shared = Path(os.environ.get("AGENT_RL_SHARED_DATA") or ROOT.parent / "shared" / "data")
        defaults = {**REAL, "corpus": shared / "corpus" / "wiki_35k.jsonl"}
    else:
        defaults = {"sft": "runs/sft/demo_cpu", "config": "configs/train/demo_grpo_cpu.yaml",
                    "index": "artifacts/kb_index_flat", "tests": [kb / "test.parquet"], "eval_limit": 200,
                    "corpus": kb / "corpus.jsonl"}
    if args.real and not any(o.startswith("data.train_files=") for o in args.overrides):
        # the config names artifacts/real/train.parquet; the recipe trains RL on the questions of
        # its demonstrations
        args.overrides.insert(0, f"data.train_files=[{','.join(str(ROOT / f) for f in REAL['train_files'])}]")
    args.sft = args.sft or str(ROOT / defaults["sft"])
    args.config = Path(args.config or ROOT / defaults["config"])
    index, corpus = Path(args.index or ROOT / defaults["index"]), Path(args.corpus or defaults["corpus"])
    tests = [Path(t) if Path(t).is_absolute() else ROOT / t for t in (args.test or defaults["tests"])]
    args.eval_limit = args.eval_limit or defaults["eval_limit"]
    work = Path(args.workdir or ROOT / "runs" / "learning" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    try:
        sft = resolve_model_dir(args.sft)
    except EvalInputError as e:
        how = ("bash scripts/real_data.sh" if args.real else
               "agent-rl-prep demos, then agent-rl-sft --config configs/sft/demo_cpu.yaml")
        print(f"learning: --sft {args.sft}: no SFT model ({e})\n  (train the cold-start model first: {how})", file=sys.stderr)
        return 2
    missing = [str(p) for p in (*tests, corpus) if not p.is_file()]
    if missing:
        how = "bash scripts/real_data.sh" if args.real else f"agent-rl-prep synthetic --out {kb}"
        print(f"learning: missing {', '.join(missing)} ({how})", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    args.test, dropped = held_out(tests, args.config, args.overrides, work)
    print(f"[learning] test questions also in a training file, dropped: {dropped}", flush=True)
    t_start = time.time()
    try:
        with serve_index(index, corpus, log_path=work / "retriever.log") as url:
            # RL first, on a quiet host (its step count depends on the cores it gets); the
            # evaluations after it give the same numbers however slowly they run
            arms = ([(args.compare_ref, work / f"rl_{args.compare_ref}")] if args.compare_ref else []) + [(None, work / "rl")]
            done_arms = {}
            for ref, rl_dir in arms:  # the reference first: both arms on the same (quiet) host
                finished = rl_dir.parent / f"{rl_dir.name}_finished.json"
                if finished.is_file():  # a re-run: the RL model of the finished training is evaluated
                    done_arms[rl_dir.name] = json.loads(finished.read_text())
                    t_start -= done_arms[rl_dir.name].get("wall_s", 0.0)  # wall_minutes counts the RL runs too
                    continue
                if rl_dir.exists():  # an earlier, interrupted attempt: RL restarts from the SFT model
                    stamp = time.strftime("%Y%m%d-%H%M%S")
                    for old in (rl_dir.name, f"eval_{rl_dir.name}"):
                        if (work / old).exists():
                            (work / old).rename(work / f"{old}.{stamp}.old")
                t_arm = time.time()
                steps, seconds = (train_at_ref(ref, sft, url, args, rl_dir) if ref else train(sft, url, args, rl_dir))
                done_arms[rl_dir.name] = {"steps": steps, "seconds": seconds, "wall_s": time.time() - t_arm}
                finished.write_text(json.dumps(done_arms[rl_dir.name]))
            steps, seconds = done_arms["rl"]["steps"], done_arms["rl"]["seconds"]
            rl_model = resolve_model_dir(work / "rl")
            evaluate(sft, list(MODES), url, args, work / "eval_sft")
            evaluate(rl_model, ["agent"], url, args, work / "eval_rl")
            if args.compare_ref:
                ref_dir = work / f"rl_{args.compare_ref}"
                evaluate(resolve_model_dir(ref_dir), ["agent"], url, args, work / f"eval_{ref_dir.name}")
    except KeyboardInterrupt:
        print("\n[learning] interrupted", file=sys.stderr)
        return 130

    result = assemble(work, steps, seconds)
    from data_prep.hardware import hardware_info

    result["time_to_gain"] = {"now": {**time_to_gain(work / "rl", args.gain), **done_arms["rl"]}}
    for arm in result["time_to_gain"].values():  # the trainer's clock includes its validations
        arm["rl_seconds"] = 60 * arm["val_points"][-1][1]
    if args.compare_ref:
        ref_name = f"rl_{args.compare_ref}"
        ref_rl = report.read_summary(work / f"eval_{ref_name}")["modes"]["agent"][report.ALL]
        ref_arm = {**time_to_gain(work / ref_name, args.gain), **done_arms[ref_name], "em_rl": ref_rl["em"]}
        ref_arm["rl_seconds"] = 60 * ref_arm["val_points"][-1][1]
        result["time_to_gain"][args.compare_ref] = ref_arm
    result["time_to_gain"]["now"]["em_rl"] = result["em_rl"]
    result.update(hardware=hardware_info(), budget_minutes=args.minutes, wall_minutes=(time.time() - t_start) / 60,
                  config=str(args.config), overrides=args.overrides, sft_model=str(sft), rl_model=str(rl_model),
                  overlap_dropped=dropped)
    sets = result["sets"] if len(result["sets"]) > 1 else {}  # one source: its numbers are the overall ones
    for src in sets or [report.ALL]:
        table = report.comparison([("SFT", work / "eval_sft"), ("SFT+RL", work / "eval_rl")], source=src)
        print("\n" + report.comparison_markdown(table, title=f"Learning benchmark ({src}): {steps} RL steps in "
                                                           f"{seconds / 60:.1f} min"))
    for src, r in {report.ALL: result, **sets}.items():
        lo, hi = r["ci"]["em_rl_minus_sft"]
        print(f"{src}: em_rl - em_sft = {r['em_rl'] - r['em_sft']:+.3f} (paired 95% CI [{lo:+.3f}, {hi:+.3f}], "
              f"n={r['n_eval']}); em_rag {r['em_rag']:.3f}; strict format {r['format_rate_sft']:.2f} -> "
              f"{r['format_rate_rl']:.2f}; searches {r['searches_sft']:.2f} -> {r['searches_rl']:.2f}")
    print(time_to_gain_markdown(result["time_to_gain"], args, result["em_sft"]))
    print(json.dumps(result, indent=1))
    (work / "learning.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "learning", result, default_dir=work)
    return 0


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
