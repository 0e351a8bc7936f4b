"""`make demo`: the whole pipeline on the embedded default, offline, on a CPU or a GPU.

prepare model + knowledge base -> build index -> start retriever -> show retrieval
-> calibrate and fit the budget -> grounded demonstrations -> cold-start SFT -> evaluate base and
SFT (agent / rag / direct) -> GRPO from the SFT model for the time left -> evaluate SFT+RL
(agent) -> choose the model handed over (GRPO's only where it beats SFT on held-out selection
questions: agent_rl.demo.selection) -> report: SFT vs SFT+RL on the same held-out questions
(paired interval, by question kind), the GRPO curves as PNG, every model and mode as context.

Every stage is a real command a user could type (printed before it runs), reads and writes
the files of `--workdir` only, and is skipped when its artifact already exists; the services
the demo starts are stopped on exit, Ctrl-C or SIGTERM. Wall time and peak memory (whole
process tree) are printed at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from agent_rl.demo import selection, stages
from agent_rl.demo.budget import (SIZES, Budget, Speeds, default_budget_minutes, eval_overrun, fit_budget,
                                  rl_seconds_left, rl_skipped, shape_overrides)
from agent_rl.demo.report import write_report
from agent_rl.demo.stages import ROOT, Workdir
from data_prep.synthetic import kb_finished


class PeakMemory:
    """Samples the summed RSS of a process (`pid`; this one by default) and all its descendants
    (psutil); stops sampling when that process is gone."""

    def __init__(self, every_s: float = 0.5, pid: int | None = None):
        import psutil

        self._psutil = psutil
        self.pid = pid
        self.peak = 0
        self.stage_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            try:
                me = self._psutil.Process(self.pid)
                procs = [me, *me.children(recursive=True)]
            except self._psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
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

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Demo:
    """One demo run: its workdir, its options, the stages' times and peaks."""

    def __init__(self, args: Any, memory: PeakMemory | None = None):
        self.args = args
        # another protocol or wording has its own demonstrations and runs, beside the default's
        variant = ("" if args.protocol == "search_r1" else f"_{args.protocol}") + ("_plain" if args.plain_wording else "")
        self.w = Workdir(ROOT / args.workdir, variant)
        self.memory = memory
        self.stage_s: dict[str, float] = {}
        self.eval_s: dict[str, float] = {}  # each evaluation's wall seconds, by label
        self.proto = [f"actor_rollout_ref.rollout.protocol={args.protocol}"]
        if args.protocol != "search_r1":  # a call's JSON costs ~20 tokens more than <search> q </search>
            self.proto.append(f"actor_rollout_ref.rollout.max_tokens_per_turn={SIZES.native_tokens_per_turn}")

    def run(self, cmd: list, what: str) -> float:
        """Run one stage (agent_rl.demo.stages.run_stage), record and return its wall seconds."""
        start = self.memory.new_stage if self.memory is not None else None
        secs = stages.run_stage(cmd, what, on_start=start)
        self.stage_s[what] = secs
        peak = f", peak memory {self.memory.new_stage() / 2**30:.2f} GiB" if self.memory is not None else ""
        print(f"[demo] {what}: done in {secs:.0f}s{peak}", flush=True)
        return secs

    # ------------------------------------------------------------------ the stages
    def prepare(self) -> None:
        w = self.w
        self.run(stages.prepare_model(w), "prepare the embedded policy")
        if not kb_finished(w.kb):
            self.run(stages.knowledge_base(w), "generate the knowledge base")
        if not (w.index / "meta.json").exists():
            self.run(stages.dense_index(w), "build the dense index")

    def calibrate(self) -> tuple[Speeds, dict]:
        """Update and generation tok/s of this host in the run's dtypes (a few seconds plus an engine load)."""
        self.run(stages.calibration(self.w), "calibrate this host (update and generation speed)")
        cal = json.loads(self.w.calibration.read_text())
        return Speeds(cal["update_tok_s"], cal["gen_tok_s"], cal["engine_load_s"]), cal

    def evaluate(self, label: str, model: Path, url: str, limit: int, modes: tuple[str, ...]) -> Path:
        out = self.w.runs / f"eval_{label.lower().replace('+', '_')}"
        self.eval_s[label] = self.run(
            stages.evaluation(self.w, model, url, self.w.kb / "test.parquet", out, limit, modes, self.proto,
                              max_num_seqs=SIZES.eval_max_num_seqs),
            f"evaluate {label} ({' / '.join(modes)}, {limit} questions)")
        return out

    def train_and_evaluate(self, url: str, t_start: float) -> Path:
        """Calibrate -> budget -> demonstrations -> SFT -> evaluate base and SFT -> GRPO for the
        time left -> evaluate SFT+RL -> report; re-fitted after each stage with the time left.
        Explicit --demos / --sft-minutes / --rl-minutes / --rl-steps / --eval-limit win."""
        args, w = self.args, self.w
        sp, cal = self.calibrate()
        native_bf16 = bool(cal.get("hardware", {}).get("native_bf16"))
        budget_s = 60 * (args.budget_minutes or default_budget_minutes(sp, time.time() - t_start, native_bf16))
        left = lambda: budget_s - (time.time() - t_start)  # noqa: E731
        eval_limit = args.eval_limit or SIZES.eval_limit

        def refit(stage: str, fixed_eval_limit: bool, revises: Budget | None = None) -> Budget:
            b = fit_budget(left(), sp, eval_limit=eval_limit,
                           min_eval_limit=None if fixed_eval_limit or args.eval_limit else 0,
                           demos_built=revises is not None, keep_rl=revises is not None and revises.rl_minutes > 0,
                           shapes=SIZES.shapes if revises is None else (revises.shape,))
            b.calibration, b.budget_minutes = cal, budget_s / 60
            for name in ("demos", "sft_minutes", "rl_minutes"):
                if getattr(args, name) is not None:
                    setattr(b, name, getattr(args, name))
            print(f"\n[demo] budget {stage}, {left() / 60:.1f} of {budget_s / 60:.1f} minutes left on this host: "
                  f"{b.describe()}", flush=True)
            return b

        budget = refit("after calibration", fixed_eval_limit=False)
        eval_limit = budget.eval_limit  # fixed from here: SFT and SFT+RL are compared on the same questions
        if not w.demos.exists():
            extra = (["--plain-wording"] if args.plain_wording else []) + self.proto
            self.run(stages.demonstrations(w, url, budget.demos, extra),
                     "build grounded demonstrations (real retriever observations)")
            budget = refit("after the demonstrations", fixed_eval_limit=True, revises=budget)
        if not (w.sft_dir / "model" / "config.json").exists():
            # an rl_first shape stops SFT at its planned steps: what a faster SFT saves goes to GRPO's steps
            steps = min(SIZES.sft_steps, budget.sft_steps) if budget.shape.rl_first else SIZES.sft_steps
            self.run(stages.sft(w.demos, w.model, w.sft_dir, steps, budget.sft_minutes * 60 * SIZES.sft_clock_slack),
                     f"cold-start SFT ({budget.sft_minutes:.1f} min)")
        evals = {"base": self.evaluate("base", w.model, url, budget.base_eval_limit, stages.MODES)}
        evals["SFT"] = self.evaluate("SFT", w.sft_dir, url, eval_limit, budget.shape.sft_modes)
        # the SFT model's evaluation, not the base's: the same questions and engine as SFT+RL's
        # (the base's 30 questions are mostly start-up, and it writes no format to stop on)
        scale = eval_overrun(self.eval_s["SFT"], budget.estimate_s["evaluate SFT"])
        if scale > 1.0:
            print(f"[demo] the SFT evaluation took {scale:.2f}x its estimate: GRPO's validations and the last "
                  "evaluation are charged as much", flush=True)
        rl_s = 60 * args.rl_minutes if args.rl_minutes is not None else (
            rl_seconds_left(left(), sp, eval_limit, scale, budget.shape) if budget.rl_minutes > 0 else 0.0)
        budget.rl_minutes, budget.rl_steps = rl_s / 60, int(rl_s / sp.step_s(budget.shape))
        chosen, skipped = None, None
        if rl_s >= 60:
            n = selection.write_selection_questions(w.kb / "test.parquet", w.selection, eval_limit,
                                                    budget.shape.select_n)
            print(f"\n[demo] {left() / 60:.1f} minutes left: GRPO gets {rl_s / 60:.1f}, validated on {n} selection "
                  "questions at its start and its last step", flush=True)
            self.run(stages.grpo(w, w.sft_dir / "model", url, rl_s, args.rl_steps,
                                 overrides=self.proto + selection.grpo_overrides(w.selection, n, w.rl_dir)
                                 + [f"trainer.rollout_data_dir={w.rollouts}"] + shape_overrides(budget.shape)
                                 + args.grpo_set),
                     f"GRPO from the SFT model ({rl_s / 60:.1f} min)")
            chosen = selection.choose(w.rl_dir, n, SIZES.select_alpha)
            chosen["model"] = str(w.rl_dir if chosen["chosen"] == "SFT+RL" else w.sft_dir)
            if chosen.get("unvalidated"):
                print(f"[demo] {chosen['unvalidated']}: the demo hands over the SFT model", flush=True)
            else:
                print(f"[demo] selection questions: SFT {100 * chosen['sft_em']:.1f}%, GRPO's last model "
                      f"{100 * chosen['rl_em']:.1f}%, {chosen['wins']} won and {chosen['losses']} lost (McNemar "
                      f"p={chosen['p']:.3f}; GRPO's is kept ahead at p <= {SIZES.select_alpha:g}): the demo hands "
                      f"over the {chosen['chosen']} model", flush=True)
            evals["SFT+RL"] = self.evaluate("SFT+RL", w.rl_dir, url, eval_limit, ("agent",))
        else:
            if args.rl_minutes is not None:
                skipped, hint = {"rl_minutes": args.rl_minutes}, "--rl-minutes N"
            else:
                skipped = rl_skipped(left(), budget_s / 60, sp, eval_limit, scale, budget.shape)
                hint = f"--budget-minutes {skipped['budget_to_run']} runs about {skipped['steps']} steps"
            print(f"\n[demo] GRPO skipped: {rl_s / 60:.1f} minutes left for it on this host ({hint})", flush=True)
        return write_report(w.runs, evals, w.rl_dir if "SFT+RL" in evals else None, budget, w.kb / "test.parquet",
                            self.stage_s, chosen, skipped)


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


def run_demo(args: Any) -> int:
    """The whole demo for `args`, the options of `python -m agent_rl.demo` (agent_rl.demo.cli);
    returns the exit status."""
    from data_prep.hardware import hardware_line

    stages.stop_on_sigterm()
    t_start = time.time()
    print(hardware_line(), flush=True)
    server = None
    with PeakMemory() as mem:
        demo = Demo(args, mem)
        w = demo.w
        try:
            demo.prepare()
            # the retriever in its own process, as `agent-rl-retriever`; it exits if this process dies
            from retriever_server.launch import start_server, stop_server, wait_healthy

            print("\n[demo] start the retriever service", flush=True)
            server, base_url = start_server(w.index, w.kb / "corpus.jsonl", port=args.port or None,
                                            log_path=w.root / "retriever.log")
            wait_healthy(base_url, timeout=300, proc=server)
            print(f"[demo] retriever ready at {base_url}", flush=True)
            show_retrieval(base_url, w.kb / "test.parquet")
            if not args.retrieval_only:
                report = demo.train_and_evaluate(base_url, t_start)
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
