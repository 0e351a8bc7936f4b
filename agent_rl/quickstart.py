"""The README's main job: the whole pipeline on the embedded default, offline, on a CPU.

prepare model + knowledge base -> build index -> start retriever -> show retrieval
-> grounded demonstrations -> cold-start SFT -> evaluate base and SFT (agent / rag / direct)
-> GRPO from the SFT model -> evaluate SFT+RL -> report (markdown table + PNG curves).

Every stage is a real command a user could type (printed before it runs), is skipped when
its artifact already exists, and the services the demo starts are stopped on exit, Ctrl-C
or SIGTERM. Wall time and peak memory (whole process tree) are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# One config for demonstrations, evaluation and GRPO: the SFT model learns the observations
# (topk, lengths, template) it will see in evaluation and RL.
TRAIN_CFG = "configs/train/demo_grpo_cpu.yaml"


class PeakMemory:
    """Samples the summed RSS of this process and all its descendants (psutil)."""

    def __init__(self, every_s: float = 0.5):
        import psutil

        self._psutil = psutil
        self.peak = 0
        self.stage_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        me = self._psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except self._psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.stage_peak = max(self.stage_peak, total)
            self._stop.wait(every_s)

    def new_stage(self) -> int:
        """The peak since the last call (or the start), and start a new stage."""
        peak, self.stage_peak = self.stage_peak, 0
        return peak

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- sizing
# Work per unit, used with the calibrated speeds to fit the stages into the budget. Measured on
# the demo's own data (KB demonstrations and evaluations, configs/train/demo_grpo_cpu.yaml):
SFT_TOKENS_PER_STEP = 8 * 500
"""One SFT step: 8 demonstrations of ~500 tokens (prompt + response; ~4.0k tokens measured)."""
SFT_OVERHEAD_S = 40
"""SFT process start, model load and the final save."""
EVAL_TOKENS_PER_QUESTION = 250
"""Decode-equivalent tokens per question over the three modes: the base model generated 190
(151 agent, 19 rag, 19 direct) and prefilled 440 prompt tokens (prefill ~2.4x faster)."""
RL_TOKENS_PER_STEP = 8 * 250
"""One GRPO step's sampled tokens: 2 prompts x 4 samples."""
RL_UPDATE_TOKENS_PER_STEP = 8 * 450 * 5 // 3
"""Old and reference log-prob passes (a forward each: ~1/3 of forward+backward) + the update."""
RL_OVERHEAD_S = 45
"""Ray start, workers and model loads, weight sync, checkpoint; the engine load comes on top."""


@dataclass
class Plan:
    """What the demo will run, sized to the host's calibrated speed and the budget."""

    demos: int
    sft_steps: int
    sft_minutes: float
    eval_limit: int
    rl_steps: int
    estimate_s: dict[str, float]
    calibration: dict = field(default_factory=dict)
    """The calibrated speeds the plan came from (`python -m agent_rl.calibrate`)."""

    def describe(self) -> str:
        est = ", ".join(f"{k} {v / 60:.1f}" for k, v in self.estimate_s.items())
        return (f"{self.demos} demonstrations, SFT {self.sft_steps} steps ({self.sft_minutes:.1f} min), "
                f"evaluation on {self.eval_limit} questions, {self.rl_steps} GRPO steps; "
                f"estimated minutes: {est}, total {sum(self.estimate_s.values()) / 60:.1f}")


def plan_stages(remaining_s: float, update_tok_s: float, gen_tok_s: float, engine_load_s: float,
                max_demos: int = 1500, max_eval: int = 100, max_rl_steps: int = 4, min_eval: int = 30) -> Plan:
    """Split the time left into SFT, three evaluations and GRPO, in that order of priority.

    Evaluation of base and SFT gets up to 35% of the time (30..`max_eval` questions: the
    base-vs-SFT comparison is the demo's point), GRPO and its evaluation the steps that fit in
    30% (none if fewer than 2 fit: its evaluation would cost more than it shows), SFT the rest.
    """
    eval_one = lambda n: engine_load_s + 20 + n * EVAL_TOKENS_PER_QUESTION / gen_tok_s  # noqa: E731
    n_eval = max_eval
    while n_eval > min_eval and 2 * eval_one(n_eval) > 0.35 * remaining_s:
        n_eval -= 10
    # a GRPO step decodes 8 sequences, not 32: per-token cost about twice the calibrated one
    rl_step = 2 * RL_TOKENS_PER_STEP / gen_tok_s + RL_UPDATE_TOKENS_PER_STEP / update_tok_s
    rl_fixed = RL_OVERHEAD_S + engine_load_s + eval_one(n_eval)
    rl_steps = max_rl_steps
    while rl_steps > 0 and rl_fixed + rl_steps * rl_step > 0.3 * remaining_s:
        rl_steps -= 1
    if rl_steps < 2:
        rl_steps = 0
    est = {"evaluation": 2 * eval_one(n_eval)}
    if rl_steps:
        est["grpo"] = RL_OVERHEAD_S + engine_load_s + rl_steps * rl_step + eval_one(n_eval)
    sft_train_s = max(60.0, remaining_s - sum(est.values()) - SFT_OVERHEAD_S)
    sft_step = SFT_TOKENS_PER_STEP / update_tok_s
    sft_steps = max(1, int(sft_train_s / sft_step))
    est = {"sft": SFT_OVERHEAD_S + sft_train_s, **est}
    # each demonstration seen about once; more cost little to build (no generation) but show nothing
    demos = min(max_demos, max(200, 2 * 8 * sft_steps))
    return Plan(demos=demos, sft_steps=sft_steps, sft_minutes=sft_train_s / 60, eval_limit=n_eval,
                rl_steps=rl_steps, estimate_s=est)


MEMORY: PeakMemory | None = None
"""The demo's memory sampler (set by main): each stage reports its own peak."""


STAGE_S: dict[str, float] = {}
"""Wall seconds of each stage run (for the report: estimate vs actual)."""


def run(cmd: list[str], what: str) -> None:
    print(f"\n[demo] {what}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    if MEMORY is not None:
        MEMORY.new_stage()
    subprocess.run(cmd, check=True, cwd=ROOT)
    STAGE_S[what] = time.time() - t0
    peak = f", peak memory {MEMORY.new_stage() / 2**30:.2f} GiB" if MEMORY is not None else ""
    print(f"[demo] {what}: done in {time.time() - t0:.0f}s{peak}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="artifacts", help="where artifacts go (default: artifacts/)")
    ap.add_argument("--port", type=int, default=0, help="retriever port (0: a free port)")
    ap.add_argument("--budget-minutes", type=float, default=15.0,
                    help="wall-time budget of the whole demo: after a short calibration the stages below are "
                         "sized to end inside it on this host (default 15)")
    ap.add_argument("--demos", type=int, default=None, help="training questions to build demonstrations from (default: planned)")
    ap.add_argument("--sft-minutes", type=float, default=None, help="SFT time budget (default: planned)")
    ap.add_argument("--rl-steps", type=int, default=None, help="GRPO steps after SFT; 0 skips GRPO (default: planned)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out questions per evaluation (default: planned)")
    ap.add_argument("--retrieval-only", action="store_true", help="stop after showing retrieval")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    work = ROOT / args.workdir
    model, kb, index = work / "model", work / "kb", work / "kb_index_flat"
    # SIGTERM -> KeyboardInterrupt, so the `finally` below stops the services we started.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t_start = time.time()
    from data_prep.hardware import hardware_line

    print(hardware_line(), flush=True)
    server = None
    global MEMORY
    with PeakMemory() as mem:
        MEMORY = mem
        try:
            run([PY, "-m", "data_prep", "model", "--out", str(model)], "prepare the embedded policy")
            if not (kb / "test.parquet").exists():
                run([PY, "-m", "data_prep", "synthetic", "--out", str(kb)], "generate the knowledge base")
            if not (index / "meta.json").exists():
                run(
                    [PY, "-m", "data_prep", "index", "--corpus", str(kb / "corpus.jsonl"),
                     "--out", str(index), "--kind", "flat"],
                    "build the dense index",
                )
            # the retriever in its own process, as `agent-rl-retriever`; it exits if this process dies
            from retriever_server.launch import start_server, stop_server, wait_healthy

            print("\n[demo] start the retriever service", flush=True)
            server, base_url = start_server(index, kb / "corpus.jsonl", port=args.port or None,
                                            log_path=work / "retriever.log")
            wait_healthy(base_url, timeout=300, proc=server)
            print(f"[demo] retriever ready at {base_url}", flush=True)
            show_retrieval(base_url, kb / "test.parquet")
            if not args.retrieval_only:
                plan = make_plan(args, work, budget_s=args.budget_minutes * 60 - (time.time() - t_start))
                report = train_and_evaluate(plan, work, base_url)
                print(f"\n[demo] report: {report}")
        except KeyboardInterrupt:
            print("\n[demo] interrupted", flush=True)
            return 130
        finally:
            if server is not None:
                stop_server(server)
                print("[demo] retriever stopped", flush=True)
    print(f"\n[demo] wall time {time.time() - t_start:.0f}s, peak memory {mem.peak / 2**30:.2f} GiB")
    return 0


def make_plan(args: argparse.Namespace, work: Path, budget_s: float) -> Plan:
    """Calibrate (update and generation tok/s, a few seconds plus an engine load), then size
    the stages to the time left; explicit --demos/--sft-minutes/--rl-steps/--eval-limit win."""
    import json

    cal_path = work / "demo_runs" / "calibration.json"
    t0 = time.time()
    run([PY, "-m", "agent_rl.calibrate", "--model", str(work / "model"), "--config", TRAIN_CFG,
         "--batch", "16", "--gen-tokens", "16", "--out", str(cal_path)], "calibrate this host (update and generation speed)")
    cal = json.loads(cal_path.read_text())
    plan = plan_stages(budget_s - (time.time() - t0), cal["update_tok_s"], cal["gen_tok_s"], cal["engine_load_s"])
    plan.calibration = cal
    if args.demos is not None:
        plan.demos = args.demos
    if args.sft_minutes is not None:
        plan.sft_minutes = args.sft_minutes
    if args.rl_steps is not None:
        plan.rl_steps = args.rl_steps
    if args.eval_limit is not None:
        plan.eval_limit = args.eval_limit
    print(f"\n[demo] plan for {budget_s / 60:.1f} minutes left on this host: {plan.describe()}", flush=True)
    return plan


def train_and_evaluate(plan: Plan, work: Path, base_url: str) -> Path:
    """Demonstrations -> SFT -> eval -> GRPO -> eval -> report; returns the report's path."""
    kb, runs = work / "kb", work / "demo_runs"
    demos, sft_dir, rl_dir = work / "demos" / "kb_train.parquet", runs / "sft", runs / "grpo"
    if not demos.exists():
        run([PY, "-m", "data_prep", "demos", "--qa", str(kb / "train.parquet"), "--retriever-url", base_url,
             "--out", str(demos), "--config", TRAIN_CFG, "--limit", str(plan.demos)],
            "build grounded demonstrations (real retriever observations)")
    if not (sft_dir / "model" / "config.json").exists():
        run([PY, "-m", "agent_rl.coldstart.sft", "--config", "configs/sft/demo_cpu.yaml", f"data.train_files=[{demos}]",
             f"trainer.max_time_s={int(plan.sft_minutes * 60)}", f"trainer.default_local_dir={sft_dir}"],
            "cold-start SFT")
    evals = {}
    for label, model in [("base", work / "model"), ("SFT", sft_dir)]:
        evals[label] = evaluate(label, model, base_url, kb, runs, plan.eval_limit)
    if plan.rl_steps > 0:
        run([PY, "-m", "agent_rl.training.cli", "--config", TRAIN_CFG, f"actor_rollout_ref.model.path={sft_dir / 'model'}",
             f"retriever.url=[{base_url}/retrieve]", f"trainer.total_training_steps={plan.rl_steps}",
             f"trainer.save_freq={plan.rl_steps}", f"trainer.default_local_dir={rl_dir}", "trainer.resume_mode=disable"],
            f"GRPO for {plan.rl_steps} steps from the SFT model")
        evals["SFT+RL"] = evaluate("SFT+RL", rl_dir, base_url, kb, runs, plan.eval_limit)
    else:
        print("\n[demo] GRPO skipped: fewer than 2 steps fit the budget on this host (--rl-steps N to force)", flush=True)
    return write_report(runs, evals, rl_dir if plan.rl_steps > 0 else None, plan)


def evaluate(label: str, model: Path, base_url: str, kb: Path, runs: Path, limit: int) -> Path:
    """Greedy evaluation with the RL run's settings (template, lengths, topk) in the three modes."""
    out = runs / f"eval_{label.lower().replace('+', '_')}"
    run([PY, "-m", "agent_rl.evaluation.evaluate", "--model", str(model), "--config", TRAIN_CFG, "--retriever-url", base_url,
         "--data", str(kb / "test.parquet"), "--mode", "agent", "rag", "direct", "--limit", str(limit),
         "--out", str(out), "--no-progress"], f"evaluate {label} (agent / rag / direct, {limit} questions)")
    return out


def write_report(runs: Path, evals: dict[str, Path], rl_dir: Path | None, plan: Plan | None = None) -> Path:
    """Markdown with the hardware line, the plan, stage times, the model x mode table and the
    GRPO reward curve as PNG (when GRPO ran)."""
    import json

    from agent_rl.evaluation.plot import plot_run
    from agent_rl.evaluation.report import comparison, comparison_markdown
    from data_prep.hardware import hardware_line

    table = comparison(list(evals.items()))
    text = f"# Demo report\n\n`{hardware_line()}`\n\n"
    if plan is not None:
        cal = plan.calibration
        text += (f"Calibration: update {cal.get('update_tok_s', 0):.0f} tok/s ({cal.get('update_dtype')}), "
                 f"generation {cal.get('gen_tok_s', 0):.0f} tok/s ({cal.get('engine_dtype')}).\n\n"
                 f"Plan: {plan.describe()}.\n\n")
        (runs / "plan.json").write_text(json.dumps({"plan": asdict(plan), "stage_s": STAGE_S}, indent=2))
    text += "Stage times: " + ", ".join(f"{k}: {v / 60:.1f} min" for k, v in STAGE_S.items()) + "\n\n"
    text += comparison_markdown(table)
    if rl_dir is not None:
        png = plot_run(rl_dir, runs / "grpo_curves.png")
        text += f"\n![GRPO curves]({png.name})\n"
    md = runs / "report.md"
    md.write_text(text)
    print("\n" + comparison_markdown(table))
    return md


def show_retrieval(base_url: str, qa_path: Path, n: int = 3) -> None:
    """Retrieve for a few held-out questions over HTTP, as the rollout will."""
    from agent_rl.rollout.observation import format_passages
    from agent_rl.rollout.retrieval_client import SyncRetrieverClient
    from data_prep.qa import read_qa

    rows = read_qa(qa_path).head(n)
    client = SyncRetrieverClient([base_url])
    results = client.search(list(rows.question), topk=3)
    for (_, row), docs in zip(rows.iterrows(), results):
        print(f"\nQ: {row.question}   gold: {list(row.golden_answers)}")
        print(format_passages(docs))


if __name__ == "__main__":
    sys.exit(main())
