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


MEMORY: PeakMemory | None = None
"""The demo's memory sampler (set by main): each stage reports its own peak."""


def run(cmd: list[str], what: str) -> None:
    print(f"\n[demo] {what}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    if MEMORY is not None:
        MEMORY.new_stage()
    subprocess.run(cmd, check=True, cwd=ROOT)
    peak = f", peak memory {MEMORY.new_stage() / 2**30:.2f} GiB" if MEMORY is not None else ""
    print(f"[demo] {what}: done in {time.time() - t0:.0f}s{peak}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="artifacts", help="where artifacts go (default: artifacts/)")
    ap.add_argument("--port", type=int, default=0, help="retriever port (0: a free port)")
    ap.add_argument("--demos", type=int, default=1500, help="training questions to build demonstrations from")
    ap.add_argument("--sft-minutes", type=float, default=4.0, help="SFT time budget")
    ap.add_argument("--rl-steps", type=int, default=4, help="GRPO steps after SFT")
    ap.add_argument("--eval-limit", type=int, default=100, help="held-out questions per evaluation")
    ap.add_argument("--retrieval-only", action="store_true", help="stop after showing retrieval")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    work = ROOT / args.workdir
    model, kb, index = work / "model", work / "kb", work / "kb_index_flat"
    # SIGTERM -> KeyboardInterrupt, so the `finally` below stops the services we started.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t_start = time.time()
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
            from retriever_server.launch import start_server, stop_server, wait_healthy

            print("\n[demo] start the retriever service", flush=True)
            server, base_url = start_server(index, kb / "corpus.jsonl", port=args.port or None,
                                            log_path=work / "retriever.log")
            wait_healthy(base_url, timeout=300)
            print(f"[demo] retriever ready at {base_url}", flush=True)
            show_retrieval(base_url, kb / "test.parquet")
            if not args.retrieval_only:
                report = train_and_evaluate(args, work, base_url)
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


def train_and_evaluate(args: argparse.Namespace, work: Path, base_url: str) -> Path:
    """Demonstrations -> SFT -> eval -> GRPO -> eval -> report; returns the report's path."""
    kb, runs = work / "kb", work / "demo_runs"
    demos, sft_dir, rl_dir = work / "demos" / "kb_train.parquet", runs / "sft", runs / "grpo"
    if not demos.exists():
        run([PY, "-m", "data_prep", "demos", "--qa", str(kb / "train.parquet"), "--retriever-url", base_url,
             "--out", str(demos), "--config", TRAIN_CFG, "--limit", str(args.demos)],
            "build grounded demonstrations (real retriever observations)")
    if not (sft_dir / "model" / "config.json").exists():
        run([PY, "-m", "agent_rl.sft", "--config", "configs/sft/demo_cpu.yaml", f"data.train_files=[{demos}]",
             f"trainer.max_time_s={int(args.sft_minutes * 60)}", f"trainer.default_local_dir={sft_dir}"],
            "cold-start SFT")
    evals = {}
    for label, model in [("base", work / "model"), ("SFT", sft_dir)]:
        evals[label] = evaluate(label, model, base_url, kb, runs, args.eval_limit)
    run([PY, "-m", "agent_rl.train_cli", "--config", TRAIN_CFG, f"actor_rollout_ref.model.path={sft_dir / 'model'}",
         f"retriever.url=[{base_url}/retrieve]", f"trainer.total_training_steps={args.rl_steps}",
         f"trainer.save_freq={args.rl_steps}", f"trainer.default_local_dir={rl_dir}", "trainer.resume_mode=disable"],
        f"GRPO for {args.rl_steps} steps from the SFT model")
    evals["SFT+RL"] = evaluate("SFT+RL", rl_dir, base_url, kb, runs, args.eval_limit)
    return write_report(runs, evals, rl_dir)


def evaluate(label: str, model: Path, base_url: str, kb: Path, runs: Path, limit: int) -> Path:
    """Greedy evaluation with the RL run's settings (template, lengths, topk) in the three modes."""
    out = runs / f"eval_{label.lower().replace('+', '_')}"
    run([PY, "-m", "agent_rl.evaluate", "--model", str(model), "--config", TRAIN_CFG, "--retriever-url", base_url,
         "--data", str(kb / "test.parquet"), "--mode", "agent", "rag", "direct", "--limit", str(limit),
         "--out", str(out), "--no-progress"], f"evaluate {label} (agent / rag / direct, {limit} questions)")
    return out


def write_report(runs: Path, evals: dict[str, Path], rl_dir: Path) -> Path:
    """Markdown with the model x mode table and the GRPO reward curve as PNG."""
    from agent_rl.plot import plot_run
    from agent_rl.report import comparison, comparison_markdown

    table = comparison(list(evals.items()))
    png = plot_run(rl_dir, runs / "grpo_curves.png")
    md = runs / "report.md"
    md.write_text("# Demo report\n\n" + comparison_markdown(table) + f"\n![GRPO curves]({png.name})\n")
    print("\n" + comparison_markdown(table))
    return md


def show_retrieval(base_url: str, qa_path: Path, n: int = 3) -> None:
    """Retrieve for a few held-out questions over HTTP, as the rollout will."""
    from agent_rl.retrieval_client import SyncRetrieverClient, format_passages
    from data_prep.qa import read_qa

    rows = read_qa(qa_path).head(n)
    client = SyncRetrieverClient([base_url])
    results = client.search(list(rows.question), topk=3)
    for (_, row), docs in zip(rows.iterrows(), results):
        print(f"\nQ: {row.question}   gold: {list(row.golden_answers)}")
        print(format_passages(docs))


if __name__ == "__main__":
    sys.exit(main())
