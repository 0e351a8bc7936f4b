"""Does RL teach search? Held-out EM of the SFT model vs the same model after RL (not in CI).

    python benchmarks/learning.py [--minutes 60] [--json PATH] [--sft DIR] [--config YAML]

From the cold-start SFT checkpoint, trains with RL (GRPO by default: configs/train/
demo_grpo_cpu.yaml) on the embedded knowledge base for a wall-clock budget, then evaluates on
the KB's held-out test questions (greedy, `agent-rl-eval`, the same seeded sample for every
model):
- em_sft / em_rl: the SFT and the RL model in agent mode (may search);
- em_rag / em_direct: the paper's baselines with the SFT model (top-k passages in the
  prompt; no retrieval).
Each EM comes with its Wilson 95% interval; em_rl - em_sft also with a paired interval (same
questions). The reward / EM curves of the run go to a PNG; diagnostics from the run's
metrics (reward first vs last steps, searches, valid format, seconds per step) say what
limits learning when the goal (em_rl - em_sft >= 0.10 and em_rl > em_rag) is missed.

`--minutes` is the budget of the RL training loop (worker start-up and the evaluations come
on top; the JSON has `minutes` trained and `wall_minutes` in all).
The step in flight when the budget ends is finished, then the policy is saved. Everything
goes to --workdir (default runs/learning/<time>); the retriever is started on the KB's flat
index (built when missing) and stopped on exit. Extra positional `key=value` arguments
override the training config (veRL names), e.g. `actor_rollout_ref.rollout.n=8`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

PY = sys.executable
MODES = ("agent", "rag", "direct")


class BudgetReached(Exception):
    """Raised from the trainer's step callback when the time budget is spent."""


def run(cmd: list[str], what: str) -> None:
    print(f"\n[learning] {what}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"[learning] {what}: {time.time() - t0:.0f}s", flush=True)


def evaluate(model: Path, modes: list[str], url: str, args: argparse.Namespace, out: Path) -> dict:
    """`agent-rl-eval` in its own process (its engine must not share the cores with training)."""
    cmd = [PY, "-m", "agent_rl.evaluation.evaluate", "--model", str(model), "--retriever-url", url,
           "--data", str(args.test), "--mode", *modes, "--out", str(out), "--limit", str(args.eval_limit),
           "--seed", str(args.seed), "--config", str(args.config), "--no-progress"]
    run(cmd + ["--", *args.overrides] if args.overrides else cmd, f"evaluate {model} in {', '.join(modes)}")
    return json.loads((out / "summary.json").read_text())


def train(sft: Path, url: str, args: argparse.Namespace, run_dir: Path) -> tuple[int, float]:
    """RL from `sft` until the budget is spent; returns (steps, training seconds). The
    trainer runs in this process (Ray actors for the workers), stopped between steps."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.ray_workers import init_ray
    from agent_rl.training.trainer import RayTrainer

    overrides = [
        f"actor_rollout_ref.model.path={sft}",
        f"retriever.url=[{url}]",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        # no step count: the clock decides. A warm-up given as a ratio of the (unknown) total
        # would never end, so warm-up must be in steps.
        "trainer.total_training_steps=1000000",
        "trainer.save_freq=-1",
        *args.overrides,
    ]
    cfg = load_config(TrainConfig, args.config, overrides)
    if cfg.actor_rollout_ref.actor.optim.lr_warmup_steps < 0:
        cfg.actor_rollout_ref.actor.optim.lr_warmup_steps = 0
    import ray

    init_ray(cfg.trainer.ray_address)
    trainer = None
    t_setup = time.monotonic()

    def on_step(step: int, metrics: dict) -> None:
        print(f"[learning] step {step}: {time.monotonic() - t0:.0f}s of {60 * args.minutes:.0f}s", flush=True)
        if time.monotonic() >= t0 + 60 * args.minutes:
            raise BudgetReached

    try:
        trainer = RayTrainer(cfg, run_dir)
        # the budget is for training steps; worker start-up (engine, actor, Ray) is reported apart
        t0 = time.monotonic()
        print(f"[learning] trainer ready in {t0 - t_setup:.0f}s", flush=True)
        try:
            trainer.fit(on_step=on_step)
        except BudgetReached:
            pass
        seconds = time.monotonic() - t0
        trainer.save()
        return trainer.step, seconds
    finally:
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()


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


def assemble(work: Path, steps: int, seconds: float) -> dict:
    """The benchmark's numbers from what the run left on disk: eval_sft/ (three modes),
    eval_rl/ (agent), rl/ (metrics.jsonl)."""
    from agent_rl.evaluation import report

    sft, rl = report.read_summary(work / "eval_sft")["modes"], report.read_summary(work / "eval_rl")["modes"]

    def agent_records(d: Path) -> list[dict]:
        rows = [json.loads(x) for x in (d / "predictions.jsonl").read_text().splitlines() if x.strip()]
        return [r for r in rows if r["mode"] == "agent"]

    paired = report.paired_em_difference(agent_records(work / "eval_rl"), agent_records(work / "eval_sft"))
    cells = {"em_sft": sft["agent"]["all"], "em_rl": rl["agent"]["all"], "em_rag": sft["rag"]["all"],
             "em_direct": sft["direct"]["all"]}
    result = {k: c["em"] for k, c in cells.items()}
    result.update(minutes=seconds / 60, steps=steps, n_eval=cells["em_sft"]["n"])
    result["ci"] = {k: [c["em_ci_low"], c["em_ci_high"]] for k, c in cells.items()}
    result["ci"]["em_rl_minus_sft"] = [paired["ci_low"], paired["ci_high"]]
    result["searches"] = {"sft": cells["em_sft"]["searches_mean"], "rl": cells["em_rl"]["searches_mean"]}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="RL training budget in minutes (default 60)")
    ap.add_argument("--json", default=None, help="write the result here too")
    ap.add_argument("--sft", default=str(ROOT / "runs/sft/demo_cpu"),
                    help="SFT model: HF dir or agent-rl-sft run dir (default runs/sft/demo_cpu, configs/sft/demo_cpu.yaml)")
    ap.add_argument("--config", default=str(ROOT / "configs/train/demo_grpo_cpu.yaml"), help="training config")
    ap.add_argument("--kb", default=str(ROOT / "artifacts/kb"), help="knowledge base dir (corpus.jsonl, test.parquet)")
    ap.add_argument("--index", default=str(ROOT / "artifacts/kb_index_flat"), help="flat index of the KB (built when missing)")
    ap.add_argument("--eval-limit", type=int, default=200, help="held-out questions per evaluation (seeded sample)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the evaluation sample")
    ap.add_argument("--workdir", default=None, help="default runs/learning/<time>")
    ap.add_argument("overrides", nargs="*", help="training config overrides, key=value")
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()

    from agent_rl.evaluation import report
    from agent_rl.evaluation.evaluate import EvalInputError, resolve_model_dir
    from benchmarks.kb_server import serve_index

    kb, index = Path(args.kb), Path(args.index)
    args.test = kb / "test.parquet"
    work = Path(args.workdir or ROOT / "runs" / "learning" / time.strftime("%Y%m%d-%H%M%S"))
    try:
        sft = resolve_model_dir(args.sft)
    except EvalInputError as e:
        print(f"learning: --sft {args.sft}: no SFT model ({e})\n  (train the cold-start model first: agent-rl-prep demos, then agent-rl-sft --config configs/sft/demo_cpu.yaml)", file=sys.stderr)
        return 2
    if not args.test.is_file():
        print(f"learning: {args.test} missing (agent-rl-prep synthetic --out {kb})", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    try:
        with serve_index(index, kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
            evaluate(sft, list(MODES), url, args, work / "eval_sft")
            if (work / "rl").exists():  # an earlier, interrupted attempt: RL restarts from the SFT model
                (work / "rl").rename(work / f"rl.{time.strftime('%Y%m%d-%H%M%S')}.old")
            steps, seconds = train(sft, url, args, work / "rl")
            rl_model = resolve_model_dir(work / "rl")
            evaluate(rl_model, ["agent"], url, args, work / "eval_rl")
    except KeyboardInterrupt:
        print("\n[learning] interrupted", file=sys.stderr)
        return 130

    result = assemble(work, steps, seconds)
    from data_prep.hardware import hardware_info

    result.update(hardware=hardware_info(), budget_minutes=args.minutes, wall_minutes=(time.time() - t_start) / 60, config=str(args.config),
                  overrides=args.overrides, sft_model=str(sft), rl_model=str(rl_model))
    table = report.comparison([("SFT", work / "eval_sft"), ("SFT+RL", work / "eval_rl")])
    print("\n" + report.comparison_markdown(table, title=f"Learning benchmark: {steps} RL steps in {seconds / 60:.1f} min"))
    lo, hi = result["ci"]["em_rl_minus_sft"]
    print(f"em_rl - em_sft = {result['em_rl'] - result['em_sft']:+.3f} (paired 95% CI [{lo:+.3f}, {hi:+.3f}], "
          f"n={result['n_eval']}); goal (>= +0.10 and em_rl > em_rag={result['em_rag']:.3f}): "
          f"{'met' if result['goal_met'] else 'not met'}")
    print(json.dumps(result, indent=1))
    (work / "learning.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # vLLM and Ray start processes with spawn: guard the entry point
    sys.exit(main())
