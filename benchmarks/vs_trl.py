"""Our GRPO beside TRL's `GRPOTrainer` on the same task, side by side in one run (issue 98).

    python benchmarks/vs_trl.py --sft DIR [--minutes 10] [--kb DIR] [--index DIR] [--eval-n 200]
                                [--trl-generation auto|transformers|vllm] [--probe-trl-vllm]
                                [--strategy-kb DIR] [--json PATH] [key=value ...]
    python benchmarks/vs_trl.py --make-sft-steps 40 [--sft-demos 200] ...   # the SFT start made here

From one SFT start (`--sft`, a model SFT-trained on hermes demonstrations; `--make-sft-steps K`
makes one: `agent-rl-prep demos` with `actor_rollout_ref.rollout.protocol=hermes` on the KB's
training questions (`--sft-demos`, default 200), then K steps of `agent-rl-sft`
(configs/sft/demo_cpu.yaml) from `--base-model`, the embedded policy by default), each side
trains GRPO for `--minutes` of wall clock on the same KB, against the same retriever process
(a real `agent-rl-retriever` on `--index`, built when missing), with the same reward, and then
both final models are evaluated by our `agent-rl-eval` (greedy, agent mode) on the same seeded
`--eval-n` held-out questions, with the SFT start beside them (`--no-start-eval` leaves it out):

- **ours**: `agent-rl-train` (configs/train/demo_grpo_cpu.yaml, `protocol=hermes`, its chat
  template's Hermes fallback: the embedded SmolLM2 template has no tool role, so the tools go
  in a system message in Qwen2.5's wording and a tool result is a user message in
  `<tool_response>`, agent_rl/rollout/protocol.py `FALLBACK_TOOLS_SYSTEM`);
- **TRL**: `GRPOTrainer(tools=[search])` driving the multi-turn loop itself (its own tool-call
  parsing, `_tool_call_loop`, tool-response masking and loss). Its tokenizer gets TRL's own
  Qwen2.5 template (trl/chat_templates/qwen2_5.jinja, unchanged, so TRL's response parser and
  training template apply as for any Qwen2.5 user), its prompts a system message "You are a
  helpful assistant." (the fallback's first sentence): the first-turn prompt is then ours token
  for token (checked at start, `first_prompt_equal` in the JSON; tests/benchmarks/test_vs_trl.py).
  The tool is a plain synchronous function that POSTs to the retriever's `/retrieve` and
  returns our passage text (`observation.format_passages`, cut like ours to
  `data.max_obs_length` by `observation.tool_observation`); an HTTP error is returned as our
  outage text, never raised. It carries our search tool's JSON schema (a function's schema from
  its docstring lacks `additionalProperties`, which ours shows the model).

The same on both sides (each TRL setting derived from the one loaded config, trailing
`key=value` overrides included, docs/vs_trl.md's table): the training questions and their
order (ours' loader, `data.seed` / `data.balance_by`, taken once and given to TRL in that order
with `shuffle_dataset=False`), the batch (`data.train_batch_size` questions x
`rollout.n` samples, one optimizer step a batch: TRL's `steps_per_generation` =
`gradient_accumulation_steps`), lr, AdamW betas and weight decay, constant schedule, grad
clip, temperature, top_p, no KL (`beta=0`), token-mean (`loss_type="dapo"`), the group std
(`scale_rewards`), clip epsilons and dual clip (`delta` = `clip_ratio_c`), turns
(`max_tool_calling_iterations` = `max_turns`: both make at most max_turns tool calls and
max_turns + 1 generations), the tokens of one turn (`max_new_tokens` / vLLM `max_tokens` =
`max_tokens_per_turn`) and of the whole response (`max_completion_length` =
`data.max_response_length`), bf16 autocast or fp32 as our actor chooses
(`data_prep.hardware`), no gradient checkpointing. The reward: exact match with our
normalisation, through our reward module (`score_trajectory` of the response's reward view,
`protocol.reward_view` of TRL's decoded completion), format terms off on both sides.

Could not be made equal, and why:

- **Where a turn stops.** Ours stops a turn at `</tool_call>` or `</answer>` (vLLM stop
  strings). TRL's transformers generation takes no stop strings (GenerationConfig.stop_strings
  needs the tokenizer passed to `generate`, which TRL does not), and a vLLM stop string would
  end the turn before the `<|im_end|>` that TRL's tool suffix follows; so TRL's turns end at the
  template's `<|im_end|>` or the per-turn limit, and whatever the model writes after
  `</tool_call>` or `</answer>` is sampled, kept and trained (ours: the frame's `<|im_end|>` is
  context). The SFT start learns to write `<|im_end|>` right after the tag: hermes
  demonstrations end each model turn with it (`protocol.turn_end_ids`), as a chat-format SFT
  does.
- **Turns.** TRL ends a trajectory at the first turn without a tool call; ours answers an
  invalid turn with feedback and goes on (max_turns counts both the same otherwise).
- **Tool-response framing.** The same text (Qwen2.5's `<|im_start|>user\\n<tool_response>\\n..
  \\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n` is our fallback's frame), but ours
  cuts the passages to `max_obs_length` tokens with the frame counted and to what is left of
  the response; TRL's tool returns the text cut the same way, and TRL drops a tool result that
  would pass `max_completion_length` (the trajectory ends there) where ours cuts it.
- **Tool calls in a batch.** TRL calls a sync tool one sample at a time; ours sends each turn's
  searches concurrently (one batcher in the retriever). That is each trainer's design.
- **Generation backend.** Ours: vLLM (the CPU build here, `engine_mode=hf` in the test); TRL:
  its default transformers `generate` on the CPU (`use_cpu=True`), vLLM colocate
  (`use_vllm=True, vllm_mode="colocate"`) where `--trl-generation vllm` or on a GPU (`auto`).
  Importance sampling between engine and trainer: ours `actor.tis_cap` per token; TRL
  `vllm_importance_sampling_mode="token_truncate"` with the same cap, only with vLLM (its
  transformers path samples with the trainer's own weights). TRL's vLLM on a CPU gets our
  engine's KV cache (`rollout.kv_cache_space_gb`) and thread binding; TRL pushes its weights
  into vLLM at the start of its generation, ours at the end of the update.
- **Micro-batches.** Ours packs micro-batches by tokens (`ppo_max_token_len_per_gpu`); TRL
  pads micro-batches of `--trl-micro-batch` completions (8, TRL's default). The gradient is the
  same up to summation order; speed and memory differ, which the table measures.
- **Processes.** Ours runs on Ray (driver, actor worker, engine); TRL in one process. Peak
  memory is the RSS summed over each side's process tree, sampled every 0.25 s (shared pages
  count once per process that maps them).

The clock: each side gets `--minutes` counted as ours counts `trainer.max_time_counts=all`:
every second from the first step's start (the generation, update, logging and anything else
between steps), start-up (imports, model load, Ray, the engine) and the final save not
counted; a step is not started when it would end past the budget, judged by the mean step and
the longest step so far (`agent_rl.training.run.out_of_time`). TRL's clock is a
`TrainerCallback` doing exactly that (`BudgetClock`). Each side's whole process wall time is
in the table too. The sides run one after another (`--order`), never together.

Printed: one table with the hardware line: seconds per step (generation, update = the rest;
generation is our `timing/gen`, TRL's `_generate_and_score_completions`: the rollout with its
tool calls and rewards, and with vLLM the old log-probs TRL's importance sampling reads), GRPO
steps per hour, sampled tokens per second of generation, peak memory, each with ours ÷ TRL;
agent EM of the start and of both final models, and ours − TRL paired over the same
questions with its 95% interval. A PNG of reward and EM per step of both sides goes beside the
JSON. `--probe-trl-vllm` first tries one TRL step with vLLM colocate on this host and records
the outcome (its error in one line). `--strategy-kb DIR` (a lookalike KB: `agent-rl-prep
synthetic --kind lookalike --seed 7`) adds each side's better-strategy share of searches
(benchmarks/strategy.py) before and after, on its test questions (when it is `--kb` itself, read
from the main evaluation's trajectories).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks import records  # noqa: E402

PY = sys.executable
SCRIPT = str(Path(__file__).resolve())
SIDES = ("ours", "trl")
TRAIN_CFG = ROOT / "configs" / "train" / "demo_grpo_cpu.yaml"
SFT_CFG = ROOT / "configs" / "sft" / "demo_cpu.yaml"
EM_ONLY = ["reward.kind=em", "reward.format_score=0", "reward.structure_format_score=0",
           "reward.final_format_score=0", "reward.retrieval_score=0", "reward.search_cost=0"]
"""The reward of both sides: exact match alone (TRL's trajectories have no invalid-turn feedback,
so the format terms would not read the same grammar on both sides)."""
HERMES = ["actor_rollout_ref.rollout.protocol=hermes", "actor_rollout_ref.rollout.chat_template=true"]


# ----------------------------------------------------------------------------- settings
def run_overrides(sft: Path, url: str, run_dir: Path, minutes: float, kb: Path, user: list[str]) -> list[str]:
    """The config overrides of both sides (TRL's settings are read from the same config): the
    SFT start, the KB's questions, the retriever, hermes, EM, the clock counting every second
    from the first step, no checkpoints between steps nor validations; where torch sees a GPU,
    our engine and trainer on it (the demo's placement); the command's last."""
    from agent_rl.demo.stages import device_overrides

    return [*device_overrides(), f"actor_rollout_ref.model.path={sft}", f"data.train_files=[{kb / 'train.parquet'}]",
            f"data.val_files=[{kb / 'test.parquet'}]", f"retriever.url=[{url}/retrieve]", *HERMES, *EM_ONLY,
            f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=disable",
            "trainer.total_training_steps=1000000", f"trainer.max_time_s={60 * minutes}",
            "trainer.max_time_counts=all", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", *user]


def load_cfg(config: Path, overrides: list[str]):
    from agent_rl.config import TrainConfig, load_config

    return load_config(TrainConfig, config, overrides)


def trl_settings(cfg, out_dir: Path, generation: str, max_steps: int, micro_batch: int, device: str) -> dict:
    """`GRPOConfig`'s keyword arguments for our config `cfg` (docs/vs_trl.md's table), pure.
    One optimizer step per `ppo_mini_batch_size` questions, as ours; micro-batches of
    `micro_batch` completions (fewer where a step has fewer)."""
    from data_prep.hardware import resolve_autocast

    actor, rollout, data = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.data
    per_step = actor.ppo_mini_batch_size * rollout.n  # completions per optimizer step
    micro = math.gcd(per_step, max(1, micro_batch))
    accum = per_step // micro
    per_batch = data.train_batch_size * rollout.n
    if per_batch % per_step:
        raise ValueError(f"data.train_batch_size {data.train_batch_size} is not a multiple of "
                         f"actor.ppo_mini_batch_size {actor.ppo_mini_batch_size}")
    low = actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio
    high = actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio
    vllm = generation == "vllm"
    turn = {"max_tokens" if vllm else "max_new_tokens": rollout.max_tokens_per_turn}
    out = {
        "output_dir": str(out_dir), "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "disable_tqdm": True, "seed": data.seed, "use_cpu": device == "cpu", "max_steps": max_steps,
        "bf16": resolve_autocast(actor.bf16_autocast, device)[0], "fp16": False, "gradient_checkpointing": False,
        "learning_rate": actor.optim.lr, "lr_scheduler_type": "constant",
        "warmup_steps": max(0, actor.optim.lr_warmup_steps), "weight_decay": actor.optim.weight_decay,
        "adam_beta1": actor.optim.betas[0], "adam_beta2": actor.optim.betas[1], "max_grad_norm": actor.grad_clip,
        "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum,
        "steps_per_generation": per_batch // micro, "num_generations": rollout.n, "num_iterations": actor.ppo_epochs,
        "shuffle_dataset": False, "temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": 0,
        "beta": 0.0, "loss_type": "dapo", "scale_rewards": "group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
        "epsilon": low, "epsilon_high": high, "delta": actor.clip_ratio_c,
        "max_completion_length": data.max_response_length, "max_tool_calling_iterations": cfg.max_turns,
        "generation_kwargs": turn, "use_vllm": vllm, "mask_truncated_completions": False,
    }
    if vllm:
        out |= {"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
                "vllm_importance_sampling_correction": actor.tis_cap is not None,
                "vllm_importance_sampling_mode": "token_truncate",
                "vllm_importance_sampling_clip_max": actor.tis_cap or 3.0}
    return out


# ----------------------------------------------------------------------------- TRL's pieces
def trl_system() -> str:
    """The system message of TRL's prompts: our fallback's own first sentence, which the Qwen2.5
    template puts where our fallback puts it (before "# Tools")."""
    from agent_rl.rollout.protocol import FALLBACK_TOOLS_SYSTEM

    return FALLBACK_TOOLS_SYSTEM.split("\n\n# Tools")[0]


def trl_tokenizer(model_dir: str | Path):
    """The model's tokenizer with TRL's Qwen2.5 chat template (TRL then sets its response parser)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.chat_template = qwen2_5_chat_template
    return tok


def trl_prompt(protocol, tokenizer, question: str) -> list[dict]:
    """A question as TRL's conversational prompt: the system sentence, then our instruction
    and question (special-token texts quoted, as `prompt_ids` does)."""
    from agent_rl.rollout.protocol import plain_text

    q, _ = plain_text(tokenizer, question)
    return [{"role": "system", "content": trl_system()}, {"role": "user", "content": protocol.prompt_text(q)}]


class SearchTool(dict):
    """TRL's search tool: a plain synchronous `search(query)` that POSTs to the retriever and
    returns passages as ours reads them. It is its own JSON schema (our search tool's: TRL calls
    a tool by `__name__`, transformers renders a dict tool as given). Never raises: an HTTP
    error, a timeout or a bad body gives our outage text, a refused query our rejection text."""

    def __init__(self, url: str, topk: int, tokenizer, max_obs_length: int, frame: tuple[str, str],
                 timeout_s: float = 60.0):
        from agent_rl.rollout.tools import builtin_tool

        super().__init__(builtin_tool("search").schema())
        self.__name__ = "search"
        self.url, self.topk, self.tokenizer = url, topk, tokenizer
        self.max_obs_length, self.frame = max_obs_length, frame
        self.timeout_s = timeout_s
        self.calls = self.failures = 0
        self._client = None

    def __call__(self, query: str = "") -> str:
        from agent_rl.rollout import observation

        self.calls += 1
        text = self.fetch(query if isinstance(query, str) else json.dumps(query))
        return observation.tool_observation(self.tokenizer, text, self.max_obs_length, self.frame).text

    def fetch(self, query: str) -> str:
        import httpx

        from agent_rl.rollout import observation

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        try:
            resp = self._client.post(f"{self.url}/retrieve", json={"queries": [query], "topk": self.topk})
            if resp.status_code in (413, 422):
                detail = resp.json().get("detail", resp.text) if resp.headers.get("content-type", "").startswith(
                    "application/json") else resp.text
                return observation.rejected_query_text(str(detail))
            resp.raise_for_status()
            return observation.format_passages(resp.json()["result"][0])
        except Exception:  # noqa: BLE001 - the tool's outage is the model's observation, never the batch's end
            self.failures += 1
            return observation.SEARCH_ERROR_TEXT


def score_text(text: str, golden_answers, protocol, reward_cfg):
    """Our reward of a decoded response (special tokens skipped): `score_trajectory` of its
    protocol's reward view, as our evaluation reads saved text."""
    from agent_rl.rollout.reward import score_trajectory

    return score_trajectory(SimpleNamespace(reward_text=None, response_text=text), list(golden_answers),
                            reward_cfg, protocol)


class EMReward:
    """TRL's reward function: our reward (`score_text`) of each decoded completion; logs the
    batch's EM as TRL's metric `em` and keeps each call's means (the per-step curve)."""

    __name__ = "em_reward"

    def __init__(self, tokenizer, protocol, reward_cfg):
        self.tokenizer, self.protocol, self.reward_cfg = tokenizer, protocol, reward_cfg
        self.batches: list[dict] = []

    def __call__(self, prompts=None, completions=None, completion_ids=None, golden_answers=None, log_metric=None,
                 **_: Any) -> list[float]:
        results = [score_text(self.tokenizer.decode(ids, skip_special_tokens=True), golds, self.protocol,
                              self.reward_cfg) for ids, golds in zip(completion_ids, golden_answers)]
        n = max(1, len(results))
        self.batches.append({"reward": sum(r.score for r in results) / n, "em": sum(r.metric for r in results) / n})
        if log_metric is not None:
            log_metric("em", self.batches[-1]["em"])
        return [r.score for r in results]


class BudgetClock:
    """Our `trainer.max_time_counts=all` clock for TRL: a step counts from the previous step's
    end (the first from its own start); after each step, stop when the next one would end past
    the budget at the mean or the longest step (`run.out_of_time`)."""

    def __init__(self, budget_s: float, clock=time.monotonic):
        self.budget_s, self.clock = budget_s, clock
        self.steps, self.trained_s, self.longest_s = 0, 0.0, 0.0
        self.step_s: list[float] = []
        self._start: float | None = None
        self._last_end: float | None = None

    def begin(self) -> None:
        self._start = self._last_end if self._last_end is not None else self.clock()

    def end(self) -> bool:
        """Count the step; True when the run stops here."""
        from agent_rl.training.run import out_of_time

        now = self.clock()
        dt = now - self._start
        self._last_end = now
        self.steps += 1
        self.trained_s += dt
        self.step_s.append(dt)
        self.longest_s = max(self.longest_s, dt)
        return out_of_time(self.trained_s, self.steps, self.budget_s, self.longest_s)


def budget_callback(clock: BudgetClock):
    """The `TrainerCallback` that runs `clock` (transformers imported only here)."""
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.begin()
            return control

        def on_step_end(self, args, state, control, **kwargs):
            if clock.end():
                control.should_training_stop = True
            return control

    return TimeBudget()


def trl_rows(cfg, protocol, tokenizer, steps: int) -> list[dict]:
    """TRL's dataset: our loader's questions in our order (the same seed, balance and filter),
    `steps` batches of them."""
    from agent_rl.training.data import PromptLoader, load_train_prompts

    loader = PromptLoader(load_train_prompts(cfg), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed,
                          balanced=cfg.data.balance_by is not None)
    return [{"prompt": trl_prompt(protocol, tokenizer, p.question), "golden_answers": list(p.golden_answers),
             "question": p.question} for p in loader.take(steps * cfg.data.train_batch_size)]


def same_cpu_engine(rollout_cfg) -> None:
    """TRL's vLLM on a CPU with our engine's KV cache and thread binding (`engine.configure_vllm_env`,
    before vLLM is imported), its multiprocessing left as TRL's colocate mode has it."""
    import os

    from agent_rl.rollout.engine import configure_vllm_env

    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    configure_vllm_env(rollout_cfg)
    if before is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def run_trl_side(spec: dict) -> int:
    """TRL's side in this process (`--trl-side SPEC`): the trainer, its clock, the first prompt's
    check against ours, the training, the final model (our tokenizer files beside it, so our
    evaluation renders it as it renders ours), and `side.json` with the per-step rows."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agent_rl.rollout.protocol import protocol_for

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_cfg(Path(spec["config"]), spec["overrides"])
    if spec["generation"] == "vllm" and spec["device"] == "cpu":
        same_cpu_engine(cfg.actor_rollout_ref.rollout)
    sft = cfg.actor_rollout_ref.model.path
    ours_tok = AutoTokenizer.from_pretrained(sft)
    protocol = protocol_for(cfg.actor_rollout_ref.rollout, ours_tok)
    tok = trl_tokenizer(sft)
    rows = trl_rows(cfg, protocol, tok, spec["max_steps"])
    tool = SearchTool(cfg.retriever.url[0].removesuffix("/retrieve"), cfg.retriever.topk, ours_tok,
                      cfg.data.max_obs_length, protocol.observation_frame())
    reward = EMReward(ours_tok, protocol, cfg.reward)
    clock = BudgetClock(spec["budget_s"])
    settings = trl_settings(cfg, out / "trainer", spec["generation"], spec["max_steps"], spec["micro_batch"],
                            spec["device"])
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**settings),
                          train_dataset=Dataset.from_list(rows), processing_class=tok, tools=[tool],
                          callbacks=[budget_callback(clock)])
    gen_s: list[float] = []
    logs: dict[int, dict] = {}
    generate = trainer._generate_and_score_completions  # timed only: its work is TRL's own

    def timed(inputs):
        t0 = time.monotonic()
        try:
            return generate(inputs)
        finally:
            gen_s.append(time.monotonic() - t0)

    trainer._generate_and_score_completions = timed
    trainer.add_callback(_log_collector(logs))
    trl_ids = [list(ids) for ids in trainer._tokenize_prompts([r["prompt"] for r in rows[:3]])[0]]
    first_equal = trl_ids == [protocol.prompt_ids(ours_tok, r["question"], "chat") for r in rows[:3]]
    print(f"[vs_trl] trl: first prompts equal to ours token for token: {first_equal}", flush=True)
    trainer.train()
    model_dir = out / "model"
    trainer.model.save_pretrained(model_dir)
    ours_tok.save_pretrained(model_dir)  # our template: the evaluation renders both models alike
    if (Path(sft) / "generation_config.json").is_file():
        shutil.copy2(Path(sft) / "generation_config.json", model_dir / "generation_config.json")
    # a generation serves steps_per_generation / gradient_accumulation_steps optimizer steps (1 here:
    # one step a batch); its seconds, tokens and rewards are shared among them
    per_gen = max(1, settings["steps_per_generation"] // settings["gradient_accumulation_steps"])
    completions = settings["steps_per_generation"] * settings["per_device_train_batch_size"]
    steps = []
    for i, dt in enumerate(clock.step_s):
        g = i // per_gen
        batch = reward.batches[g] if g < len(reward.batches) else {}
        logged = logs.get(g * per_gen + 1, {})
        length = logged.get("completions/mean_length", 0.0)
        # the share of completions cut at the length limit (TRL's own figure): a side whose
        # samples are cut is paid less for the same policy (the EM gap's first suspect)
        steps.append({"step": i + 1, "step_s": dt, "gen_s": gen_s[g] / per_gen if g < len(gen_s) else 0.0,
                      "reward": batch.get("reward"), "em": batch.get("em"),
                      "sampled_tokens": length * completions / per_gen,
                      "clipped_ratio": logged.get("completions/clipped_ratio")})
    (out / "side.json").write_text(json.dumps({
        "steps": steps, "train_s": clock.trained_s, "first_prompt_equal": first_equal, "model": str(model_dir),
        "generation": spec["generation"], "tool_calls": tool.calls, "tool_failures": tool.failures,
        "settings": settings}, indent=1, default=str) + "\n")
    return 0


def _log_collector(store: dict):
    """A callback keeping TRL's logged metrics by step."""
    from transformers import TrainerCallback

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            store.setdefault(state.global_step, {}).update(logs or {})
            return control

    return Logs()


# ----------------------------------------------------------------------------- running a side
def run_side(cmd: list, log: Path) -> dict:
    """`cmd` in its own process, its output to `log` and ours: exit code, wall seconds, peak RSS."""
    from agent_rl.demo.pipeline import PeakMemory

    print(f"[vs_trl] $ {' '.join(map(str, cmd))}", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")

        def pump() -> None:  # on a thread: a grandchild left holding the pipe cannot hold up the benchmark
            for line in proc.stdout:
                f.write(line)
                sys.stdout.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        with PeakMemory(every_s=0.25, pid=proc.pid) as rss:
            rc = proc.wait()
        wall_s = time.monotonic() - t0
        reader.join(timeout=30)
    return {"rc": rc, "wall_s": wall_s, "peak_rss": rss.peak}


def error_line(log: Path) -> str:
    """The last line of a failed side's log that names an error (else its last line)."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()] if log.is_file() else []
    named = [x for x in lines if "Error" in x or "error:" in x or "Exception" in x]
    return (named or lines or ["(no output)"])[-1][:400]


def ours_rows(run_dir: Path) -> tuple[list[dict], float]:
    """Our run's steps as (rows of step, step_s, gen_s, reward, em, sampled_tokens; training seconds)."""
    from agent_rl.training.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir) if r.get("step", 0) > 0 and "timing/step" in r]
    out = [{"step": int(r["step"]), "step_s": float(r["timing/step"]), "gen_s": float(r.get("timing/gen", 0.0)),
            "reward": r.get("reward/mean"), "em": r.get("reward/em"),
            "sampled_tokens": float(r.get("rollout/gen_tokens", 0.0))} for r in rows]
    return out, float(rows[-1].get("training/elapsed_s", sum(x["step_s"] for x in out))) if rows else 0.0


def side_summary(rows: list[dict], train_s: float, wall_s: float, peak_rss: int) -> dict:
    """A side's figures from its step rows: seconds per step (training seconds / steps, so what
    passes between steps counts), of which generation (the mean of its steps) and the update
    (the rest), steps per hour, sampled tokens per second of generation, peak memory."""
    steps = len(rows)
    step_s = train_s / steps if steps else None
    gen_s = sum(r["gen_s"] for r in rows) / steps if steps else None
    gen_total = sum(r["gen_s"] for r in rows)
    return {"steps": steps, "train_s": train_s, "wall_s": wall_s, "step_s": step_s, "gen_s": gen_s,
            "update_s": step_s - gen_s if steps else None,
            "steps_per_hour": 3600 * steps / train_s if train_s > 0 else 0.0,
            "tokens_per_s": sum(r["sampled_tokens"] for r in rows) / gen_total if gen_total > 0 else None,
            "peak_rss_gib": peak_rss / 2**30, "rows": rows}


RATIOS = (("step_s", "seconds / step"), ("gen_s", "  generation s / step"), ("update_s", "  update s / step"),
          ("steps_per_hour", "GRPO steps / hour"), ("tokens_per_s", "sampled tokens / s of generation"),
          ("peak_rss_gib", "peak memory GiB (RSS, process tree)"))
"""The figures of the table, in order: (key, label); each also as ours ÷ TRL."""


def ratios(ours: dict, trl: dict) -> dict[str, float | None]:
    """Ours ÷ TRL for each figure of RATIOS (None where either is missing or TRL's is 0)."""
    return {k: ours[k] / trl[k] if ours.get(k) is not None and trl.get(k) else None for k, _ in RATIOS}


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    """One table: the hardware line, each figure of both sides and ours ÷ TRL; the evaluation."""
    sides, r = result["sides"], result["ratios"]
    ok = all(s.get("steps") for s in sides.values())
    lines = [result["hardware_line"], "",
             f"| {result['minutes']:g} min a side, from {Path(result['sft']).name} | ours "
             f"| TRL ({result['trl_generation']}) | ours ÷ TRL |", "|---|---|---|---|"]
    if ok:
        for key, label in RATIOS:
            lines.append(f"| {label} | {fmt(sides['ours'][key])} | {fmt(sides['trl'][key])} | {fmt(r[key])} |")
        cells = [f"{s['steps']} ({s['train_s']:.0f}; {s['wall_s']:.0f})" for s in (sides["ours"], sides["trl"])]
        lines.append(f"| steps (training s; process wall s) | {cells[0]} | {cells[1]} | |")
    for side, s in sides.items():
        if s.get("error"):
            lines.append(f"| {side} failed | {s['error']} | | |")
    ev = result.get("eval")
    if ev:
        em = {k: f"{100 * v['em']:.1f}" for k, v in ev["em"].items()}
        lines.append(f"| agent EM % on {ev['n']} held-out questions (start {em.get('start', '-')}) | "
                     f"{em.get('ours', '-')} | {em.get('trl', '-')} | |")
        for name, why in ev.get("errors", {}).items():
            lines.append(f"| evaluation of {name} failed | {why} | | |")
        d = ev.get("ours_minus_trl")
        if d:
            lines.append(f"| ours − TRL, paired 95% CI (points) | **{100 * d['diff']:+.1f}** "
                         f"[{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}] | | |")
    st = result.get("strategy")
    if st:
        share = {k: fmt(v, ".2f") for k, v in st["better_share"].items()}
        lines.append(f"| better-strategy share of searches (lookalike KB; start {share.get('start', '-')}) | "
                     f"{share.get('ours', '-')} | {share.get('trl', '-')} | |")
    probe = result.get("trl_vllm_probe")
    if probe:
        lines.append("")
        lines.append(f"TRL vLLM colocate on this host: {probe['outcome']}")
    lines.append("")
    lines.append(f"first-turn prompt ids equal (TRL's = ours): {result.get('first_prompt_equal')}")
    return "\n".join(lines) + "\n"


def plot(sides: dict, out: Path) -> Path:
    """Reward and EM per step of both sides, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("reward", "em")):
        for side, s in sides.items():
            pts = [(r["step"], r[key]) for r in s.get("rows", []) if r.get(key) is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="ours" if side == "ours" else "TRL")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(f"batch {key} (mean over its samples)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- the SFT start, evaluations
def make_sft(args, url: str, work: Path) -> Path:
    """Hermes demonstrations from the KB's training questions, then `--make-sft-steps` steps of
    our SFT from `--base-model`; returns the SFT model directory."""
    from agent_rl.evaluation.evaluate import resolve_model_dir

    base = Path(args.base_model) if args.base_model else None
    if base is None:
        from data_prep.model import prepare_model

        base = prepare_model(ROOT / "artifacts" / "model")
    demos, out = work / "sft" / "demos.parquet", work / "sft" / "run"
    out.parent.mkdir(parents=True, exist_ok=True)
    kb = Path(args.kb)
    subprocess.run([PY, "-m", "data_prep", "demos", "--qa", kb / "train.parquet", "--retriever-url", url,
                    "--out", demos, "--config", args.config, "--limit", str(args.sft_demos),
                    f"actor_rollout_ref.model.path={base}", f"data.train_files=[{kb / 'train.parquet'}]", *HERMES,
                    *rollout_overrides(args.overrides)],  # the run's lengths and turns: demonstrations that fit them
                   cwd=ROOT, check=True)
    subprocess.run([PY, "-m", "agent_rl.coldstart.cli", "sft", "--config", SFT_CFG, f"data.train_files=[{demos}]",
                    f"actor_rollout_ref.model.path={base}", f"trainer.total_training_steps={args.make_sft_steps}",
                    "trainer.max_time_s=1000000", f"trainer.default_local_dir={out}", "trainer.resume_mode=disable"],
                   cwd=ROOT, check=True)
    return resolve_model_dir(out)


def evaluate(models: dict[str, Path], url: str, kb: Path, args, rollout: list[str], out: Path, n: int) -> dict:
    """`agent-rl-eval` of each model on the same seeded `n` test questions of `kb`; each side's
    EM, ours − TRL and each side − start paired by question (report.paired_comparison)."""
    from agent_rl.evaluation import report
    from benchmarks.learning import evaluate as eval_one

    ev_args = argparse.Namespace(test=[kb / "test.parquet"], eval_limit=n, seed=args.seed, config=args.config,
                                 overrides=rollout)
    dirs, errors = {}, {}
    for name, model in models.items():
        try:
            eval_one(model, ["agent"], url, ev_args, out / name)
            dirs[name] = out / name
        except subprocess.CalledProcessError as e:  # the other evaluations and the training figures stand
            errors[name] = f"agent-rl-eval exit {e.returncode} (its output above)"
    res: dict = {"n": n, "em": {}, "dirs": {k: str(v) for k, v in dirs.items()}, "errors": errors}
    for name in dirs:
        res["em"][name] = report.read_summary(dirs[name])["modes"]["agent"][report.ALL]
    pairs = {"ours_minus_trl": ("trl", "ours"), "ours_minus_start": ("start", "ours"),
             "trl_minus_start": ("start", "trl")}
    for key, (a, b) in pairs.items():
        if a in dirs and b in dirs:
            cmp = report.paired_comparison(dirs[a], dirs[b])
            res[key] = cmp["diff"][report.ALL]
            res["n"] = cmp["n"]
    return res


def hermes_queries(text: str) -> list[str]:
    """The search queries of a hermes trajectory's text: each `<tool_call>` whose JSON calls
    `search` with a string query (a malformed call is skipped)."""
    from agent_rl.rollout.protocol import tag_blocks

    out = []
    for _, inner in tag_blocks(text, "tool_call"):
        try:
            call = json.loads(inner.strip())
        except ValueError:
            continue
        args = call.get("arguments") if isinstance(call, dict) and call.get("name") == "search" else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if isinstance(args, dict) and isinstance(args.get("query"), str):
            out.append(args["query"])
    return out


def strategy_share(eval_dir: Path, questions: dict[str, dict]) -> dict:
    """Searches of an evaluation's agent trajectories by strategy (benchmarks/strategy.py), and
    the better strategy's share of those told apart."""
    from agent_rl.evaluation import report
    from benchmarks.strategy import better_share, query_strategy

    counts: dict[str, int] = {}
    for (_, qid), rec in report.records_by_question(eval_dir).items():
        for q in hermes_queries(rec.get("trajectory") or ""):
            said = query_strategy(q, questions.get(str(qid), {})) or "unknown"
            counts[said] = counts.get(said, 0) + 1
    return {"counts": counts, "share": better_share(counts)}


def strategy(models: dict[str, Path], args, rollout: list[str], work: Path, main_eval: dict | None = None) -> dict:
    """Each model's better-strategy share on the lookalike KB `--strategy-kb` (its own retriever).
    When that is the training KB (`--kb`) at `--eval-n` questions, the shares are read from the
    main evaluation `main_eval` (the same greedy runs on the same questions), not evaluated twice."""
    import pandas as pd

    from benchmarks.kb_server import serve_index

    kb = Path(args.strategy_kb)
    rows = pd.read_parquet(kb / "test.parquet").to_dict("records")
    questions = {str(r["id"]): r for r in rows}
    same = main_eval is not None and kb.resolve() == Path(args.kb).resolve() and args.strategy_n == args.eval_n
    if same:
        ev = main_eval
    else:
        index = kb.with_name(f"{kb.name}_index_flat")  # beside its KB, as benchmarks/kb_headroom.py keeps it
        with serve_index(index, kb / "corpus.jsonl", log_path=work / "strategy_retriever.log") as url:
            ev = evaluate(models, url, kb, args, rollout, work / "strategy_eval", args.strategy_n)
    per = {name: strategy_share(Path(d), questions) for name, d in ev["dirs"].items()}
    return {"kb": str(kb), "n": ev["n"], "better_share": {k: v["share"] for k, v in per.items()},
            "counts": {k: v["counts"] for k, v in per.items()}, "em": {k: v["em"] for k, v in ev["em"].items()}}


def probe_trl_vllm(args, spec: dict, work: Path) -> dict:
    """One TRL step with vLLM colocate on this host (its own process, `--probe-timeout`): "ok in N s"
    or the error in one line."""
    probe = dict(spec, generation="vllm", budget_s=0.0, max_steps=1, out=str(work / "trl_vllm_probe"))
    path = work / "trl_vllm_probe.json"
    path.write_text(json.dumps(probe) + "\n")
    log = work / "trl_vllm_probe.log"
    t0 = time.monotonic()
    try:
        with open(log, "w") as f:
            rc = subprocess.run([PY, SCRIPT, "--trl-side", str(path)], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                timeout=args.probe_timeout).returncode
        outcome = f"ok: one step in {time.monotonic() - t0:.0f} s" if rc == 0 else f"failed: {error_line(log)}"
    except subprocess.TimeoutExpired:
        outcome = f"failed: no step within --probe-timeout {args.probe_timeout} s"
    print(f"[vs_trl] TRL vLLM colocate probe: {outcome}", flush=True)
    return {"outcome": outcome, "log": str(log)}


# ----------------------------------------------------------------------------- the command
def rollout_overrides(overrides: list[str]) -> list[str]:
    """What the evaluations take of the run's overrides: all but the training-only knobs."""
    from benchmarks.learning import TRAINING_ONLY

    return [o for o in overrides if not o.startswith(TRAINING_ONLY)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="training wall clock per side (default 10)")
    ap.add_argument("--sft", default=None, help="the SFT start: HF dir or agent-rl-sft run dir (hermes-trained)")
    ap.add_argument("--make-sft-steps", type=int, default=None,
                    help="make the SFT start here: K SFT steps on hermes demonstrations")
    ap.add_argument("--sft-demos", type=int, default=200, help="training questions of --make-sft-steps' demos (200)")
    ap.add_argument("--base-model", default=None, help="--make-sft-steps' base (default: the embedded policy)")
    ap.add_argument("--config", default=str(TRAIN_CFG))
    ap.add_argument("--kb", default=str(ROOT / "artifacts/kb"))
    ap.add_argument("--index", default=str(ROOT / "artifacts/kb_index_flat"), help="built there when missing")
    ap.add_argument("--eval-n", type=int, default=200, help="held-out questions of the final evaluation (200)")
    ap.add_argument("--no-start-eval", action="store_true", help="evaluate the final models only")
    ap.add_argument("--seed", type=int, default=0, help="the evaluation's question sample (0)")
    ap.add_argument("--order", default="ours,trl", help="which side trains first (default ours,trl)")
    ap.add_argument("--trl-generation", default="auto", choices=("auto", "transformers", "vllm"),
                    help="TRL's generation: auto (vLLM colocate on a GPU, transformers on the CPU)")
    ap.add_argument("--trl-micro-batch", type=int, default=8, help="TRL's per_device_train_batch_size (8)")
    ap.add_argument("--probe-trl-vllm", action="store_true", help="first try one TRL step with vLLM colocate here")
    ap.add_argument("--probe-timeout", type=int, default=600)
    ap.add_argument("--strategy-kb", default=None, help="a lookalike KB: each side's better-strategy share")
    ap.add_argument("--strategy-n", type=int, default=200)
    ap.add_argument("--workdir", default=None, help="default runs/vs_trl/<time>")
    ap.add_argument("--json", default=None)
    ap.add_argument("--trl-side", default=None, help=argparse.SUPPRESS)  # TRL's side, in its own process
    ap.add_argument("overrides", nargs="*", help="training config overrides for both sides, key=value (they win)")
    records.add_args(ap)
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()
    if args.trl_side:
        return run_trl_side(json.loads(Path(args.trl_side).read_text()))
    if not args.sft and args.make_sft_steps is None:
        ap.error("--sft DIR or --make-sft-steps K")
    if sorted(args.order.split(",")) != sorted(SIDES):
        ap.error(f"--order names each of {', '.join(SIDES)} once, got {args.order!r}")
    from agent_rl.evaluation.evaluate import resolve_model_dir
    from benchmarks.kb_server import serve_index
    from data_prep.hardware import default_device, hardware_info, hardware_line

    device = default_device()
    generation = {"auto": "vllm" if device == "cuda" else "transformers"}.get(args.trl_generation, args.trl_generation)
    kb = Path(args.kb).resolve()
    work = Path(args.workdir or ROOT / "runs" / "vs_trl" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    host = hardware_line()
    print(host, flush=True)
    sides: dict[str, dict] = {}
    with serve_index(Path(args.index), kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
        sft = make_sft(args, url, work) if args.make_sft_steps is not None else resolve_model_dir(args.sft)
        overrides = {side: run_overrides(sft, url, work / side, args.minutes, kb, args.overrides) for side in SIDES}
        spec = {"config": str(args.config), "overrides": overrides["trl"], "out": str(work / "trl"),
                "budget_s": 60 * args.minutes, "generation": generation, "micro_batch": args.trl_micro_batch,
                "device": device, "max_steps": max(1, int(60 * args.minutes))}
        probe = probe_trl_vllm(args, spec, work) if args.probe_trl_vllm else None
        (work / "trl_spec.json").write_text(json.dumps(spec, indent=1) + "\n")
        cmds = {"ours": [PY, "-m", "agent_rl.training.cli", "--config", args.config, *overrides["ours"]],
                "trl": [PY, SCRIPT, "--trl-side", work / "trl_spec.json"]}
        models: dict[str, Path] = {} if args.no_start_eval else {"start": sft}
        first_equal = None
        for side in args.order.split(","):
            ran = run_side(cmds[side], work / f"{side}.log")
            print(f"[vs_trl] {side}: exit {ran['rc']} after {ran['wall_s']:.0f} s", flush=True)
            if ran["rc"] != 0:
                sides[side] = {"error": error_line(work / f"{side}.log"), "wall_s": ran["wall_s"]}
                continue
            if side == "ours":
                rows, train_s = ours_rows(work / "ours")
                models["ours"] = work / "ours"
            else:
                got = json.loads((work / "trl" / "side.json").read_text())
                rows, train_s, first_equal = got["steps"], got["train_s"], got["first_prompt_equal"]
                models["trl"] = Path(got["model"])
            sides[side] = side_summary(rows, train_s, ran["wall_s"], ran["peak_rss"])
        rollout = rollout_overrides([*HERMES, *EM_ONLY, *args.overrides])
        ev = evaluate(models, url, kb, args, rollout, work / "eval", args.eval_n) if len(models) > 1 else None
    strat = strategy(models, args, rollout, work, ev) if args.strategy_kb and len(models) > 1 else None
    sides = {s: sides.get(s, {"error": "not run"}) for s in SIDES}
    result = {"hardware": hardware_info(), "hardware_line": host, "minutes": args.minutes, "sft": str(sft),
              "trl_generation": generation, "first_prompt_equal": first_equal, "sides": sides,
              "ratios": ratios(sides["ours"], sides["trl"]) if all(s.get("steps") for s in sides.values()) else {},
              "eval": ev, "strategy": strat, "trl_vllm_probe": probe, "overrides": args.overrides}
    for key, _ in RATIOS:  # the record's headline (records.generic_headline: top-level figures)
        if result["ratios"].get(key) is not None:
            result[f"ours_over_trl_{key}"] = result["ratios"][key]
    if ev and ev.get("ours_minus_trl"):
        result["ours_minus_trl_em"] = ev["ours_minus_trl"]["diff"]
    result["table"] = table(result)
    print("\n" + result["table"])
    png = plot(sides, work / "reward_em.png")
    result["png"] = str(png)
    (work / "vs_trl.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    records.keep(args, "vs_trl", result, files=[png], default_dir=work)
    return 0 if all(not s.get("error") for s in sides.values()) else 1


if __name__ == "__main__":  # vLLM and Ray start processes with spawn
    sys.exit(main())
