"""The README's main job: the whole pipeline on the embedded default, offline, on a CPU.

prepare model + knowledge base -> build index -> start retriever -> show retrieval
-> calibrate and plan -> grounded demonstrations -> cold-start SFT -> evaluate base and SFT
(agent / rag / direct) -> GRPO from the SFT model for the time left -> evaluate SFT+RL (agent)
-> report: SFT vs SFT+RL on the same held-out questions (paired interval, by question kind),
the GRPO curves as PNG, every model and mode as context.

Every stage is a real command a user could type (printed before it runs), reads and writes
the files of `--workdir` only, and is skipped when its artifact already exists; the services
the demo starts are stopped on exit, Ctrl-C or SIGTERM. Wall time and peak memory (whole process tree) are printed at the end.
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
MODES = ("agent", "rag", "direct")


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
SFT_TOKENS_PER_STEP = 8 * 570
"""One SFT step at the calibrated update speed: 8 demonstrations of ~490 tokens (prompt +
response), and the first step's warm-up spread over the rest: 19 steps took 364 s of training
(the first 38 s, the others 16-21 s) at 237 tok/s calibrated, AVX-512 EPYC, bf16. (At 8 x 500 the
plan gave SFT 321 s, and a demo stopped at 17 of its 19 steps.)"""
SFT_CLOCK_SLACK = 1.15
"""SFT stops after SFT_STEPS; its clock (trainer.max_time_s) is the planned minutes times this,
a guard against a slow host rather than the stop: GRPO is re-planned after SFT with what is left."""
SFT_OVERHEAD_S = 40
"""SFT process start, model load and the final save."""
DEMOS_S = 30
"""Building the demonstrations: retrieval and tokenization, no generation (15 s for 1,500)."""
EVAL_TOKENS_PER_QUESTION = {"base": 250, "sft": 130, "rl": 100}
"""Decode-equivalent tokens per question (at the calibrated batch-16 speed) over the modes each
evaluation runs: the base model in agent / rag / direct generated 190 (151 agent, 19 rag, 19
direct) and prefilled 440 prompt tokens (prefill ~2.4x faster); an SFT model's agent mode took
~100 s for 200 questions at 190 tok/s calibrated (AVX-512 EPYC, bf16); SFT+RL is evaluated in
agent mode only."""
EVAL_MAX_NUM_SEQS = 128
"""The evaluation engine's batch: every question in flight decodes together (the RL config's 32
leaves the engine's step overhead unshared: 200 SFT questions 145 s at 32, 124 s at 128 on the
AVX-512 EPYC, bf16)."""
EVAL_OVERHEAD_S = 20
"""An evaluation's process start and retriever check (the engine load comes on top)."""
GRPO_PROMPTS = 8
"""Prompts per GRPO step in the demo's config (data.train_batch_size; x rollout.n = 4
samples), for the plan's estimate. Not fewer: at
6 a step took 19-60 s, 8 steps fitted, and they moved every kind of question to one search
(agent EM 60.0 -> 51.0, bridge -18.7, comparison -24.0). At 8, with the demonstrations that
say what the question asks for and count their searches, and the config's balanced batches
at lr 7e-6, from a 19-step SFT model at 51.0: 72.5 after 3 steps, 77.0 after 4, 75.5 after 5,
73.0 after 6 (docs/real_data.md, ninth look; at lr 1e-5 with a plain shuffle, 63.5-76.5 after
2-4 steps)."""
RL_TOKENS_PER_STEP = GRPO_PROMPTS * 4 * 170
"""Decode-equivalent tokens of one GRPO step's generation: GRPO_PROMPTS x 4 samples, two turns
(measured at 8 prompts: 17-25 s a step at 205-228 tok/s calibrated, AVX-512 EPYC, bf16)."""
RL_UPDATE_TOKENS_PER_STEP = GRPO_PROMPTS * 4 * 450
"""Tokens through forward + backward in one GRPO step: sequences of ~500 (prompt ~150, two
searches' response ~345), less those with all-zero advantages, which skip the update (no
reference pass: the demo runs without KL). Measured at 8 prompts: 79-120 s a step at 205-229
tok/s calibrated, AVX-512 EPYC, bf16."""
RL_OVERHEAD_S = 45
"""Ray start, workers and model loads, weight sync, checkpoint; the engine load comes on top."""
EVAL_LIMIT = 200
"""Held-out questions on which SFT and SFT+RL are compared (paired, the same questions)."""
BASE_EVAL_LIMIT = 30
"""The base model is context (it does not follow the format: EM ~0), on fewer questions."""
RL_SHARE = 0.4
"""GRPO's share of the training minutes (the rest is SFT)."""
MIN_SFT_STEPS, MIN_RL_STEPS = 12, 3
"""The least of each that shows something: SFT that follows the format, GRPO with a trend (3
steps of GRPO_PROMPTS x 4 trajectories)."""
SFT_STEPS = 19
"""SFT stops here and GRPO gets every minute after it. More SFT does not buy more on the demo's
demonstrations (agent EM on the 200 held-out questions after 19 / 25 / 30 / 35 steps: 60.0 / 59.5
/ 48.0 / 62.5, with an earlier wording); GRPO does (GRPO_PROMPTS' figures). Fewer
SFT steps are not the way to more GRPO: a demo run stopped at 16 had 40 of 200 answers still
searching a third time (51.5)."""
BUDGET_MINUTES = (19.5, 33.0)
"""The default budget: the first on a host with native bf16 (README: the demo ends within 20
minutes there; a slower such host compares on fewer questions before it drops GRPO) and on any
host fast enough; up to the second where a host without native bf16 needs that long."""


@dataclass
class Plan:
    """What the demo will run, sized to the host's calibrated speed and the budget."""

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
    """The calibrated speeds the plan came from (`python -m agent_rl.calibrate`)."""

    def describe(self) -> str:
        est = ", ".join(f"{k} {v / 60:.1f}" for k, v in self.estimate_s.items())
        return (f"{self.demos} demonstrations, SFT {self.sft_minutes:.1f} min (~{self.sft_steps} steps), GRPO "
                f"{self.rl_minutes:.1f} min (~{self.rl_steps} steps), SFT and SFT+RL evaluated on {self.eval_limit} "
                f"held-out questions (base on {self.base_eval_limit}); estimated minutes: {est}, total "
                f"{sum(self.estimate_s.values()) / 60:.1f}")


@dataclass(frozen=True)
class Speeds:
    """Calibrated speeds: update and generation tokens/s, engine load seconds."""

    update_tok_s: float
    gen_tok_s: float
    engine_load_s: float

    def eval_s(self, n: int, which: str) -> float:
        return self.engine_load_s + EVAL_OVERHEAD_S + n * EVAL_TOKENS_PER_QUESTION[which] / self.gen_tok_s

    @property
    def sft_step_s(self) -> float:
        return SFT_TOKENS_PER_STEP / self.update_tok_s

    @property
    def rl_step_s(self) -> float:
        return RL_TOKENS_PER_STEP / self.gen_tok_s + RL_UPDATE_TOKENS_PER_STEP / self.update_tok_s


def needed_s(sp: Speeds, eval_limit: int = EVAL_LIMIT, base_eval_limit: int = BASE_EVAL_LIMIT) -> float:
    """The least time the stages after calibration need on this host: the evaluations,
    MIN_SFT_STEPS of SFT and MIN_RL_STEPS of GRPO with their overheads."""
    evals = sp.eval_s(base_eval_limit, "base") + sp.eval_s(eval_limit, "sft") + sp.eval_s(eval_limit, "rl")
    return (DEMOS_S + SFT_OVERHEAD_S + RL_OVERHEAD_S + sp.engine_load_s + evals
            + MIN_SFT_STEPS * sp.sft_step_s + MIN_RL_STEPS * sp.rl_step_s)


def default_budget_minutes(sp: Speeds, spent_s: float, native_bf16: bool = False) -> float:
    """BUDGET_MINUTES[0] on a host with native bf16 or where the minimal plan fits, else as much
    as it needs up to BUDGET_MINUTES[1]."""
    lo, hi = BUDGET_MINUTES
    if native_bf16:
        return lo
    return min(hi, max(lo, (spent_s + needed_s(sp)) / 60 + 0.5))


def plan_stages(remaining_s: float, sp: Speeds, eval_limit: int = EVAL_LIMIT, min_eval_limit: int | None = 100,
                base_eval_limit: int = BASE_EVAL_LIMIT, rl_share: float = RL_SHARE, max_demos: int = 1500,
                demos_built: bool = False, keep_rl: bool = False) -> Plan:
    """Split the time left (after calibration) into demonstrations, SFT, the evaluations and
    GRPO: the evaluations and overheads first, then the training minutes, `rl_share` of them to
    GRPO, and to GRPO too what SFT would spend past SFT_STEPS. SFT keeps at least one minute.
    Where fewer than MIN_RL_STEPS / 2 GRPO steps fit (its curve would show nothing), the
    comparison uses fewer questions, down to `min_eval_limit` (None: keep `eval_limit`), and if
    that is not enough GRPO is left out and SFT gets its minutes.

    A re-plan passes `demos_built` (the demonstrations are not charged again) and `keep_rl`
    when the plan it revises runs GRPO: GRPO then stays while one step fits, so that a stage
    that ran a few seconds over its estimate cannot tip a plan at the MIN_RL_STEPS / 2 edge into
    dropping GRPO and giving SFT all the minutes (seen: a plan of 3 GRPO steps, 15 s later 0)."""
    for n in range(eval_limit, (min_eval_limit or eval_limit) - 1, -20):
        plan = _plan(remaining_s, sp, n, base_eval_limit, rl_share, max_demos, demos_built, keep_rl)
        if plan.rl_minutes > 0:
            return plan
    return _plan(remaining_s, sp, eval_limit, base_eval_limit, rl_share, max_demos, demos_built, keep_rl)


def _plan(remaining_s: float, sp: Speeds, eval_limit: int, base_eval_limit: int, rl_share: float,
          max_demos: int, demos_built: bool = False, keep_rl: bool = False) -> Plan:
    est = {"demonstrations": 0.0 if demos_built else float(DEMOS_S), "sft": float(SFT_OVERHEAD_S),
           "evaluate base": sp.eval_s(base_eval_limit, "base"), "evaluate SFT": sp.eval_s(eval_limit, "sft")}
    rl_fixed = {"grpo": RL_OVERHEAD_S + sp.engine_load_s, "evaluate SFT+RL": sp.eval_s(eval_limit, "rl")}
    train_s = remaining_s - sum(est.values()) - sum(rl_fixed.values())
    rl_s = rl_share * train_s
    if rl_s < (1 if keep_rl else MIN_RL_STEPS / 2) * sp.rl_step_s:
        rl_s, rl_fixed = 0.0, {}
        train_s = remaining_s - sum(est.values())
    sft_s = max(60.0, train_s - rl_s)
    if rl_s:  # SFT_STEPS at most: the rest of the training minutes go to GRPO
        sft_s = min(sft_s, max(60.0, SFT_STEPS * sp.sft_step_s))
        rl_s = train_s - sft_s
    est["sft"] += sft_s
    est.update(rl_fixed)
    if rl_s:
        est["grpo"] += rl_s
    sft_steps = max(1, int(sft_s / sp.sft_step_s))
    # Every demonstration it has (building costs no generation: ~15 s for 1,500), not just the
    # planned steps' worth: SFT stops on the clock, and when it runs faster than the calibration
    # said it would otherwise repeat them (200 demonstrations for "~7 steps" that were 29: agent EM
    # 43.0, where 29 steps over 1,403 demonstrations reach 72.5; docs/real_data.md)
    demos = max_demos
    return Plan(demos=demos, sft_minutes=sft_s / 60, rl_minutes=rl_s / 60, eval_limit=eval_limit,
                base_eval_limit=base_eval_limit, estimate_s=est, sft_steps=sft_steps,
                rl_steps=int(rl_s / sp.rl_step_s))


def rl_seconds_left(remaining_s: float, sp: Speeds, eval_limit: int) -> float:
    """Re-planned after SFT and its evaluations: GRPO gets what is left but its own start-up and
    the evaluation of its model."""
    return max(0.0, remaining_s - RL_OVERHEAD_S - sp.engine_load_s - sp.eval_s(eval_limit, "rl"))


MEMORY: PeakMemory | None = None
"""The demo's memory sampler (set by main): each stage reports its own peak."""


STAGE_S: dict[str, float] = {}
"""Wall seconds of each stage run (for the report: estimate vs actual)."""


STOP_GRACE_S = 60.0
"""How long a stage stopped by the demo has to clean up (a checkpoint, Ray shut down, the GPU
freed) before it is terminated."""
_TERMINATED = threading.Event()
"""Set when the demo itself got SIGTERM: its stage, unlike on a terminal's Ctrl-C, got nothing."""


def stop_on_sigterm() -> None:
    """SIGTERM -> KeyboardInterrupt, so `finally` blocks stop the services and the stage we started."""
    def handler(*_):
        _TERMINATED.set()
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, handler)


def run(cmd: list[str], what: str) -> None:
    print(f"\n[demo] {what}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    if MEMORY is not None:
        MEMORY.new_stage()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # The stage stops as on Ctrl-C (KeyboardInterrupt: its own cleanup runs); a killed one
        # would leave its Ray workers holding the GPU. A terminal's Ctrl-C reached it already.
        if _TERMINATED.is_set() and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            from retriever_server.launch import stop_server

            stop_server(proc)
        raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    STAGE_S[what] = time.time() - t0
    peak = f", peak memory {MEMORY.new_stage() / 2**30:.2f} GiB" if MEMORY is not None else ""
    print(f"[demo] {what}: done in {time.time() - t0:.0f}s{peak}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="artifacts", help="where artifacts go (default: artifacts/)")
    ap.add_argument("--port", type=int, default=0, help="retriever port (0: a free port)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="wall-time budget of the whole demo: after a short calibration the stages below are sized "
                         f"to end inside it on this host (default: {BUDGET_MINUTES[0]:g}; on a host without native "
                         f"bf16 up to {BUDGET_MINUTES[1]:g} where it needs that long for {MIN_SFT_STEPS} SFT and "
                         f"{MIN_RL_STEPS} GRPO steps)")
    ap.add_argument("--demos", type=int, default=None, help="training questions to build demonstrations from (default: planned)")
    ap.add_argument("--sft-minutes", type=float, default=None, help="SFT time budget (default: planned)")
    ap.add_argument("--rl-minutes", type=float, default=None,
                    help="GRPO time budget after SFT; 0 skips GRPO (default: what is left before the last evaluation)")
    ap.add_argument("--rl-steps", type=int, default=None, help="at most this many GRPO steps (default: the clock decides)")
    ap.add_argument("--eval-limit", type=int, default=None,
                    help=f"held-out questions on which SFT and SFT+RL are compared (default {EVAL_LIMIT})")
    ap.add_argument("--retrieval-only", action="store_true", help="stop after showing retrieval")
    ap.add_argument("--protocol", default="search_r1", choices=("search_r1", "hermes"),
                    help="how the model acts: search_r1 (<search> tags, default) or hermes (native <tool_call> JSON, "
                         "results as tool messages); demonstrations, SFT, GRPO and evaluation all use it")
    ap.add_argument("--plain-wording", action="store_true",
                    help="demonstrations in plain Search-R1 wording, without the knowledge base's phrasing (what the "
                         "question asks for, \"This needs N searches\", \"That was search i of n\"): what that "
                         "phrasing adds; its own demonstrations and runs, beside the default's")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # another protocol or wording has its own demonstrations and runs, beside the default's
    variant = ("" if args.protocol == "search_r1" else f"_{args.protocol}") + ("_plain" if args.plain_wording else "")
    w = Workdir(ROOT / args.workdir, variant)
    model, kb, index = w.model, w.kb, w.index
    stop_on_sigterm()
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
                                            log_path=w.root / "retriever.log")
            wait_healthy(base_url, timeout=300, proc=server)
            print(f"[demo] retriever ready at {base_url}", flush=True)
            show_retrieval(base_url, kb / "test.parquet")
            if not args.retrieval_only:
                report = train_and_evaluate(args, w, base_url, t_start)
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


@dataclass(frozen=True)
class Workdir:
    """Every file the demo reads or writes, under `--workdir`. The configs name the default
    layout's files (artifacts/kb, artifacts/model, runs/): every stage is given this workdir's
    paths instead (`train_overrides` where it loads TRAIN_CFG), so none reads another
    workdir's knowledge base or model."""

    root: Path
    variant: str = ""
    """Suffix of a run beside the default's, with its own demonstrations and runs ("_hermes", "_plain")."""

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def kb(self) -> Path:
        return self.root / "kb"

    @property
    def index(self) -> Path:
        return self.root / "kb_index_flat"

    @property
    def calibration(self) -> Path:
        return self.root / "demo_runs" / "calibration.json"

    @property
    def runs(self) -> Path:
        return self.root / f"demo_runs{self.variant}"

    @property
    def demos(self) -> Path:
        return self.root / "demos" / f"kb_train{self.variant}.parquet"

    @property
    def sft_dir(self) -> Path:
        return self.runs / "sft"

    @property
    def rl_dir(self) -> Path:
        return self.runs / "grpo"

    def train_overrides(self, model: Path | None = None) -> list[str]:
        """TRAIN_CFG's paths pointed into this workdir: its QA files, the policy (default: the
        prepared model) and the GRPO run directory."""
        return [f"data.train_files=[{self.kb / 'train.parquet'}]", f"data.val_files=[{self.kb / 'test.parquet'}]",
                f"actor_rollout_ref.model.path={model or self.model}", f"trainer.default_local_dir={self.rl_dir}"]


def calibrate(w: Workdir) -> tuple[Speeds, dict]:
    """Update and generation tok/s of this host in the run's dtypes (a few seconds plus an engine load)."""
    import json

    cal_path = w.calibration
    run([PY, "-m", "agent_rl.calibrate", "--model", str(w.model), "--config", TRAIN_CFG, "--batch", "16",
         "--gen-tokens", "16", "--out", str(cal_path), *w.train_overrides()],
        "calibrate this host (update and generation speed)")
    cal = json.loads(cal_path.read_text())
    return Speeds(cal["update_tok_s"], cal["gen_tok_s"], cal["engine_load_s"]), cal


def train_and_evaluate(args: argparse.Namespace, w: Workdir, base_url: str, t_start: float) -> Path:
    """Calibrate -> plan -> demonstrations -> SFT -> evaluate base and SFT -> GRPO for the time
    left -> evaluate SFT+RL -> report; re-planned after each stage with the time left. Explicit
    --demos / --sft-minutes / --rl-minutes / --rl-steps / --eval-limit win. Returns the report."""
    kb, runs, demos, sft_dir, rl_dir = w.kb, w.runs, w.demos, w.sft_dir, w.rl_dir
    proto = [f"actor_rollout_ref.rollout.protocol={args.protocol}"]
    if args.protocol != "search_r1":  # a call's JSON costs ~20 tokens more than <search> q </search>: the same turns must fit
        proto.append(f"actor_rollout_ref.rollout.max_tokens_per_turn={NATIVE_TOKENS_PER_TURN}")
    sp, cal = calibrate(w)
    native_bf16 = bool(cal.get("hardware", {}).get("native_bf16"))
    budget_s = 60 * (args.budget_minutes or default_budget_minutes(sp, time.time() - t_start, native_bf16))
    left = lambda: budget_s - (time.time() - t_start)  # noqa: E731
    eval_limit = args.eval_limit or EVAL_LIMIT

    def replan(stage: str, fixed_eval_limit: bool, revises: Plan | None = None) -> Plan:
        plan = plan_stages(left(), sp, eval_limit=eval_limit,
                           min_eval_limit=None if fixed_eval_limit or args.eval_limit else 100,
                           demos_built=revises is not None, keep_rl=revises is not None and revises.rl_minutes > 0)
        plan.calibration, plan.budget_minutes = cal, budget_s / 60
        if args.demos is not None:
            plan.demos = args.demos
        if args.sft_minutes is not None:
            plan.sft_minutes = args.sft_minutes
        if args.rl_minutes is not None:
            plan.rl_minutes = args.rl_minutes
        print(f"\n[demo] plan {stage}, {left() / 60:.1f} of {budget_s / 60:.1f} minutes left on this host: "
              f"{plan.describe()}", flush=True)
        return plan

    plan = replan("after calibration", fixed_eval_limit=False)
    eval_limit = plan.eval_limit  # fixed from here: SFT and SFT+RL are compared on the same questions
    if not demos.exists():
        run([PY, "-m", "data_prep", "demos", "--qa", str(kb / "train.parquet"), "--retriever-url", base_url,
             "--out", str(demos), "--config", TRAIN_CFG, "--limit", str(plan.demos),
             *(["--plain-wording"] if args.plain_wording else []), *w.train_overrides(), *proto],
            "build grounded demonstrations (real retriever observations)")
        plan = replan("after the demonstrations", fixed_eval_limit=True, revises=plan)
    if not (sft_dir / "model" / "config.json").exists():
        run([PY, "-m", "agent_rl.coldstart.sft", "--config", "configs/sft/demo_cpu.yaml", f"data.train_files=[{demos}]",
             f"actor_rollout_ref.model.path={w.model}",
             f"trainer.total_training_steps={SFT_STEPS}", f"trainer.max_time_s={int(plan.sft_minutes * 60 * SFT_CLOCK_SLACK)}",
             f"trainer.default_local_dir={sft_dir}"],
            f"cold-start SFT ({plan.sft_minutes:.1f} min)")
    evals = {"base": evaluate("base", w.model, base_url, w, plan.base_eval_limit, MODES, proto),
             "SFT": evaluate("SFT", sft_dir, base_url, w, eval_limit, MODES, proto)}
    rl_s = 60 * args.rl_minutes if args.rl_minutes is not None else (
        rl_seconds_left(left(), sp, eval_limit) if plan.rl_minutes > 0 else 0.0)
    plan.rl_minutes, plan.rl_steps = rl_s / 60, int(rl_s / sp.rl_step_s)
    if rl_s >= 60:
        print(f"\n[demo] {left() / 60:.1f} minutes left: GRPO gets {rl_s / 60:.1f}", flush=True)
        steps = [f"trainer.total_training_steps={args.rl_steps}"] if args.rl_steps else [
            "trainer.total_training_steps=100000"]
        run([PY, "-m", "agent_rl.training.cli", "--config", TRAIN_CFG, *w.train_overrides(sft_dir / "model"),
             f"retriever.url=[{base_url}/retrieve]", *steps, f"trainer.max_time_s={int(rl_s)}", "trainer.save_freq=-1",
             "trainer.resume_mode=disable", *proto, *device_overrides()],
            f"GRPO from the SFT model ({rl_s / 60:.1f} min)")
        evals["SFT+RL"] = evaluate("SFT+RL", rl_dir, base_url, w, eval_limit, ("agent",), proto)
    else:
        print(f"\n[demo] GRPO skipped: {rl_s / 60:.1f} minutes left for it on this host "
              "(--rl-minutes N or a larger --budget-minutes to run it)", flush=True)
    return write_report(runs, evals, rl_dir if "SFT+RL" in evals else None, plan, kb / "test.parquet")


def device_overrides() -> list[str]:
    """Where torch sees a GPU, the trainer places its workers and the engine on it (Ray's
    placement: `trainer.n_gpus_per_node`); calibration, SFT and evaluation run in one process
    and take the GPU by themselves (`data_prep.hardware.default_device`)."""
    from data_prep.hardware import default_device

    return ["trainer.n_gpus_per_node=1"] if default_device() == "cuda" else []


NATIVE_TOKENS_PER_TURN = 96
"""max_tokens_per_turn of the demo's native tool-call runs (the KB's longest native turn, a
comparison's answer, is 77 tokens; the tag protocol's config has 96 too)."""


def evaluate(label: str, model: Path, base_url: str, w: Workdir, limit: int, modes: tuple[str, ...],
             overrides: list[str] = ()) -> Path:
    """Greedy evaluation with the RL run's settings (template, lengths, topk, protocol); the same
    seeded sample of held-out questions for every model, so differences can be paired."""
    out = w.runs / f"eval_{label.lower().replace('+', '_')}"
    run([PY, "-m", "agent_rl.evaluation.evaluate", "--model", str(model), "--config", TRAIN_CFG, "--retriever-url", base_url,
         "--data", str(w.kb / "test.parquet"), "--mode", *modes, "--limit", str(limit), "--out", str(out),
         "--no-progress", f"actor_rollout_ref.rollout.max_num_seqs={EVAL_MAX_NUM_SEQS}", *w.train_overrides(model),
         *overrides],
        f"evaluate {label} ({' / '.join(modes)}, {limit} questions)")
    return out


def question_kinds(test_parquet: Path) -> dict[str, str]:
    """Question id -> kind (single / bridge / comparison) of the generated knowledge base."""
    import pandas as pd

    df = pd.read_parquet(test_parquet, columns=["id", "kind"])
    return dict(zip(df["id"].astype(str), df["kind"].astype(str)))


def write_report(runs: Path, evals: dict[str, Path], rl_dir: Path | None, plan: Plan | None = None,
                 test_parquet: Path | None = None) -> Path:
    """Markdown led by SFT vs SFT+RL (agent EM on the same held-out questions, the paired 95%
    interval of the difference, by question kind, searches per question, the GRPO curves as
    PNG), then every model x mode as context, the hardware line, the plan and stage times."""
    import json

    from agent_rl.evaluation.plot import plot_run
    from agent_rl.evaluation.report import (comparison, comparison_markdown, paired_comparison,
                                            paired_comparison_markdown)
    from data_prep.hardware import hardware_line

    text = "# Demo report\n\n"
    summary: dict = {}
    if rl_dir is not None and "SFT" in evals and "SFT+RL" in evals:
        kinds = question_kinds(test_parquet) if test_parquet is not None else None
        cmp = paired_comparison(evals["SFT"], evals["SFT+RL"], group_of=kinds)
        summary["sft_vs_rl"] = cmp
        text += (f"## What GRPO adds to cold-start SFT\n\nAgent mode (the model searches), greedy, on the same "
                 f"{cmp['n']} held-out questions:\n\n" + paired_comparison_markdown(cmp) + "\n")
        png = plot_run(rl_dir, runs / "grpo_curves.png",
                       keys=["reward/mean", "reward/em", "reward/valid_format", "rollout/searches_mean",
                             "rollout/invalid_action_rate", "rollout/repeated_query_rate"])
        text += (f"![GRPO training curves: reward, EM, valid format, searches per trajectory, invalid-action and "
                 f"repeated-query rates]({png.name})\n\n")
    table = comparison(list(evals.items()))
    text += comparison_markdown(table, title="Every model and mode (context)") + "\n"
    text += f"`{hardware_line()}`\n\n"
    if plan is not None:
        cal = plan.calibration
        text += (f"Calibration: update {cal.get('update_tok_s', 0):.0f} tok/s ({cal.get('update_dtype')}), "
                 f"generation {cal.get('gen_tok_s', 0):.0f} tok/s ({cal.get('engine_dtype')}).\n\n"
                 f"Plan ({plan.budget_minutes:.1f}-minute budget; GRPO as re-planned after SFT): "
                 f"{plan.describe()}.\n\n")
        summary["plan"] = asdict(plan)
    text += "Stage times: " + ", ".join(f"{k}: {v / 60:.1f} min" for k, v in STAGE_S.items()) + "\n"
    summary["stage_s"] = STAGE_S
    (runs / "plan.json").write_text(json.dumps(summary, indent=2))
    md = runs / "report.md"
    md.write_text(text)
    print("\n" + text)
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
