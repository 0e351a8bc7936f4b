"""The driver: group collection with filtering (unit, fake rollouts), then end to end on the
embedded setup: real retriever server (BM25 over a tiny generated KB), real Ray local
cluster, real rollout engine and actor/critic workers on the 135M model. Tiny batches (2
prompts x 2 samples for GRPO, x 1 for PPO; 64 response tokens; 2 turns) keep a step short.

- a 2-step GRPO run and a 2-step PPO run (with LoRA merged into the pushed weights) change
  the weights and log finite, namespaced metrics to jsonl and TensorBoard: on vLLM, which
  keeps the real engine honest end to end;
- the lifecycle runs (a run killed with SIGKILL right after its step-1 checkpoint resumes
  from it on the uninterrupted run's prompt order; the time budget; one_step_off; an async run
  killed mid-step) are about the trainer, not the engine: they sample the tiny policy on the
  transformers backend (`HF_ENGINE`), which starts in seconds. The retriever outage runs the
  full model on long few-shot prompts, where vLLM's batching and prefix cache are faster.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_rl.training.metrics import read_jsonl
from local_ray import ray_address, ray_up

ROOT = Path(__file__).resolve().parents[2]
PARAM = "model.layers.0.self_attn.q_proj.weight"

EXPECTED = {
    "grpo": ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss", "actor/grad_norm"],
    "ppo": ["actor/pg_loss", "actor/entropy", "critic/vf_loss", "critic/values_mean", "actor/reward_kl_penalty"],
}
COMMON = ["reward/mean", "reward/em", "rollout/num_trajectories", "rollout/response_length_mean", "timing/gen",
          "timing/update_actor", "timing/sync", "timing/step", "batch/num_tokens"]


def overrides(kb: Path, url: str, run_dir: Path, est: str, model: Path) -> list[str]:
    """Tiny, fast settings on top of configs/train/demo_<est>_cpu.yaml, training `model` (the
    2-block `tiny_policy` where the test is about the run, not about what the model does)."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files=[{kb / 'train.parquet'}]",
        f"data.val_files=[{kb / 'test.parquet'}]",
        "data.train_batch_size=2",
        "data.max_response_length=64",
        "data.max_obs_length=48",
        f"actor_rollout_ref.rollout.n={2 if est == 'grpo' else 1}",  # PPO: one sample, as Search-R1's
        "actor_rollout_ref.rollout.max_tokens_per_turn=32",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.kv_cache_space_gb=0.25",
        # PPO trains LoRA adapters (merged weights are pushed): smaller processes, and the
        # LoRA path of the driver is exercised too
        f"actor_rollout_ref.model.lora_rank={8 if est == 'ppo' else 0}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        # An untrained 135M model almost never answers correctly, so GRPO advantages are
        # usually 0; the entropy bonus guarantees a gradient, so "weights change" cannot
        # pass by luck or fail by bad luck.
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        # the KL-in-loss path (the demo's config leaves it off)
        *(["actor_rollout_ref.actor.use_kl_loss=true"] if est == "grpo" else []),
        f"retriever.url=[{url.rstrip('/')}/retrieve]",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.logger=[console,tensorboard,jsonl]",
        f"trainer.default_local_dir={run_dir}",
        "max_turns=2",
    ]


HF_ENGINE = "actor_rollout_ref.rollout.engine_mode=hf"
"""The transformers backend (agent_rl/rollout/hf_engine.py: vLLM's contract, no vLLM) for runs
whose subject is the trainer's lifecycle; the GRPO and PPO runs above keep vLLM."""


def _weights(path: Path):
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return f.get_tensor(PARAM)


def run_in_process(est: str, kb: Path, url: str, run_dir: Path, model: Path, extra: list[str] | None = None) -> Path:
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.trainer import RayTrainer

    ray_up()
    args = [*overrides(kb, url, run_dir, est, model), *(extra or [])]
    cfg = load_config(TrainConfig, ROOT / f"configs/train/demo_{est}_cpu.yaml", args)
    trainer = RayTrainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return run_dir


@pytest.fixture(scope="module")
def retriever(retriever_url):
    """The session's retriever server, once it answers /health (the CLI waits the same way)."""
    from retriever_server.launch import wait_healthy

    wait_healthy(retriever_url, timeout=300)
    return retriever_url


@pytest.fixture(scope="module")
def grpo_run(tiny_kb, retriever, tiny_policy, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("grpo")
    rollouts = [f"trainer.rollout_data_dir={run_dir / 'rollouts'}", "trainer.rollout_data_freq=2", "trainer.rollout_data_n=3"]
    return run_in_process("grpo", tiny_kb, retriever, run_dir, tiny_policy, rollouts)


def _check_run(run_dir: Path, est: str, model_dir: Path) -> None:
    rows = [r for r in read_jsonl(run_dir) if r["step"] > 0]  # step 0: validation before training
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in EXPECTED[est] + COMMON:
            assert key in r, f"{key} missing from step {r['step']}: {sorted(r)}"
        bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"non-finite metrics at step {r['step']}: {bad}"
        assert all("/" in k for k in r if k not in ("step", "prompt_ids"))
        assert len(r["prompt_ids"]) == 2
    split = {k.split("/", 1)[1]: round(v, 1) for k, v in rows[-1].items() if k.startswith("timing/")}
    print(f"\n[{est}] step timing split (s): {split}")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(EXPECTED[est] + COMMON) <= tags
    assert [e.step for e in acc.Scalars("timing/step")] == [1, 2]

    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "global_step_2"
    before, after = _weights(model_dir), _weights(ckpt / "global_step_2" / "actor")
    assert (after - before).abs().max() > 0, "the policy weights did not change in 2 steps"
    state = json.loads((ckpt / "global_step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["data"]["index"] == 4


@pytest.mark.slow
def test_grpo_two_steps_change_weights_and_log_finite_metrics(grpo_run, tiny_policy):
    _check_run(grpo_run, "grpo", tiny_policy)


def test_the_run_writes_sampled_rollouts_with_their_loss_mask_and_reward(grpo_run, capsys):
    """trainer.rollout_data_dir: steps 1 and 2 (freq 2), 3 of the batch's 4 trajectories each;
    the pieces alternate with the loss mask, their text is the response, and the breakdown's
    answer is the reward's; `agent-rl-eval show` renders them with the context marked."""
    from agent_rl.evaluation.cli import show_main
    from agent_rl.training.rollout_data import PLAIN_OPEN, read_rollout_data

    d = grpo_run / "rollouts"
    assert sorted(p.name for p in d.iterdir()) == ["1.jsonl", "2.jsonl"]
    recs = read_rollout_data(d)
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2]
    for r in recs:
        flags = [p["sampled"] for p in r["pieces"]]
        assert flags and flags[0] and all(a != b for a, b in zip(flags, flags[1:]))
        assert set(r["breakdown"]) >= {"answer", "metric", "valid_format", "retrieval_hit"}
    assert show_main([str(d), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 1 #") == 3 and (PLAIN_OPEN in out) == any(not p["sampled"] for r in recs for p in r["pieces"])


@pytest.mark.ray
def test_ppo_two_steps_change_weights_and_log_finite_metrics(tiny_kb, retriever, tmp_path, tiny_policy):
    # also validates once before training: greedy rollouts on 2 held-out questions
    val = ["trainer.val_before_train=true", "data.val_data_num=2", f"trainer.validation_data_dir={tmp_path}/ppo/validation"]
    run_dir = run_in_process("ppo", tiny_kb, retriever, tmp_path / "ppo", tiny_policy, val)
    _check_run(run_dir, "ppo", tiny_policy)
    first = read_jsonl(run_dir)[0]
    assert first["step"] == 0 and 0.0 <= first["val/em"] <= 1.0 and "val/reward" in first
    # each question's result (trainer.validation_data_dir): the two validation questions, whose
    # metrics average to val/em
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.data import load_prompts
    from agent_rl.training.metrics import validation_rows

    cfg_val = load_config(TrainConfig, ROOT / "configs/train/demo_ppo_cpu.yaml",
                          overrides(tiny_kb, retriever, run_dir, "ppo", tiny_policy))
    per_question = validation_rows(run_dir / "validation", 0)
    assert list(per_question) == [p.id for p in load_prompts(cfg_val.data.val_files, 2)]
    assert sum(per_question.values()) / 2 == pytest.approx(first["val/em"])
    assert not (run_dir / "validation" / "1.jsonl").exists()  # test_freq: validated before training only
    assert (run_dir / "checkpoints" / "global_step_2" / "critic").is_dir()


def kill_after_first_checkpoint(cmd: list[str], run_dir: Path, log: Path) -> dict:
    """Run the trainer CLI `cmd` and SIGKILL it as soon as its step-1 checkpoint is complete
    (the next step is under way); returns the environment to run it again with."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 600
            pointer = run_dir / "checkpoints" / "latest"
            while not (pointer.exists() and pointer.read_text() == "global_step_1"):
                assert proc.poll() is None, f"trainer exited early:\n{log.read_text()[-3000:]}"
                assert time.time() < deadline, "no step-1 checkpoint within 10 minutes"
                time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    return env


@pytest.mark.ray
def test_killed_run_resumes_from_its_checkpoint_on_the_same_data_order(grpo_run, tiny_kb, retriever, tiny_policy,
                                                                      tmp_path):
    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "agent_rl.training.cli", "--config", "configs/train/demo_grpo_cpu.yaml",
           *overrides(tiny_kb, retriever, run_dir, "grpo", tiny_policy), HF_ENGINE,
           f"trainer.ray_address={ray_address()}"]  # join the test's cluster
    env = kill_after_first_checkpoint(cmd, run_dir, tmp_path / "first.log")
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_1"
    before = read_jsonl(run_dir)
    assert [r["step"] for r in before] == [1]  # killed during step 2

    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resumed from" in out.stdout and "global_step_1 at step 1" in out.stdout
    after = read_jsonl(run_dir)
    assert [r["step"] for r in after] == [1, 2]
    assert after[0] == before[0]  # step 1 was not run again
    reference = read_jsonl(grpo_run)
    assert [r["prompt_ids"] for r in after] == [r["prompt_ids"] for r in reference]
    assert after[0]["prompt_ids"] != after[1]["prompt_ids"]


@pytest.mark.ray
def test_time_budget_stops_with_a_checkpoint_and_a_rerun_continues_the_clock(tiny_kb, retriever, tiny_policy, tmp_path):
    run_dir = tmp_path / "budget"
    # 1 s: step 1 runs (nothing measured yet), then the next step would end past the budget
    run_in_process("grpo", tiny_kb, retriever, run_dir, tiny_policy,
                   ["trainer.total_training_steps=3", "trainer.max_time_s=1", "trainer.save_freq=-1",
                    "trainer.test_freq=5", "data.val_data_num=4", HF_ENGINE])
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "global_step_1"  # saved although save_freq=-1 and 3 steps were asked
    first = read_jsonl(run_dir)
    assert [r["step"] for r in first] == [1]
    # the step the clock stopped at is validated, though test_freq=5 does not fall on it
    assert 0.0 <= first[0]["val/em"] <= 1.0 and first[0]["timing/validate"] > 0
    state = json.loads((ckpt / "global_step_1" / "trainer_state.json").read_text())
    assert state["trained_s"] == pytest.approx(first[0]["training/elapsed_s"]) and state["trained_s"] > 1
    # a larger budget: the clock goes on from the checkpoint's, not from 0; a validation after
    # step 2 is not on it (a run's training minutes do not depend on how often it validates)
    run_in_process("grpo", tiny_kb, retriever, run_dir, tiny_policy,
                   ["trainer.total_training_steps=2", "trainer.max_time_s=100000", "trainer.test_freq=1",
                    "data.val_data_num=4", HF_ENGINE])
    rows = read_jsonl(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    step_s, validate_s = rows[1]["timing/step"], rows[1]["timing/validate"]
    assert validate_s > 0
    assert step_s * 0.99 < rows[1]["training/elapsed_s"] - rows[0]["training/elapsed_s"] < step_s + 0.5 * validate_s


def _budget(trained_s: float, step: int, budget: float | None, longest: float = 0.0):
    from agent_rl.training.run import out_of_time

    return out_of_time(trained_s, step, budget, longest)


def test_time_budget_judges_the_next_step_by_the_mean_or_the_longest_step_time():
    assert not _budget(0.0, 0, 1.0)  # nothing measured: the first step always runs
    assert not _budget(1e9, 5, None)  # no budget
    assert not _budget(60.0, 3, 80.0)  # 60 + 20 = 80: the next step ends on the budget
    assert _budget(60.0, 3, 79.0)  # ... one second past it
    assert _budget(100.0, 4, 100.0)  # spent: a re-run does nothing
    # the fifth real-data run: step 30 ended at 3477 s (mean 116 s, longest 173 s) and step 31
    # took 145 s: with the mean it ran to 3622 s of a 3600 s budget; with the longest it stops
    assert not _budget(3477.0, 30, 3600.0)
    assert _budget(3477.0, 30, 3600.0, longest=173.0)
    assert not _budget(60.0, 3, 80.0, longest=15.0)  # a longest step below the mean: the mean


def test_the_progress_bar_counts_the_steps_the_clock_will_allow_not_a_step_limit_it_never_reaches(tmp_path):
    """Run.expected_steps, the total of SFT's and GRPO's progress bars: a time-budgeted run
    (the demo and the benchmarks pass trainer.total_training_steps=1000000) shows the steps its
    budget holds at the mean step time so far, never more than the step limit, and no total
    before a step is timed."""
    from agent_rl.config import TrainerConfig
    from agent_rl.training.run import Run

    def run(total, budget, step=0, trained_s=0.0):
        r = Run(TrainerConfig(max_time_s=budget), tmp_path, total, "sft")
        r.step, r.trained_s = step, trained_s
        return r.expected_steps()

    assert run(1_000_000, 600.0) is None  # nothing timed yet: no total rather than 1000000
    assert run(1_000_000, 600.0, step=4, trained_s=52.0) == 46  # 13 s a step: 4 + 548 // 13 = 4 + 42
    assert run(20, 600.0, step=4, trained_s=52.0) == 20  # the step limit comes first
    assert run(1_000_000, 600.0, step=46, trained_s=598.0) == 46  # the budget is spent
    assert run(1_000_000, 600.0, step=40, trained_s=640.0) == 40  # past it (a longer last step)
    assert run(20, None) == run(20, None, step=4, trained_s=52.0) == 20  # no budget: the step limit


def test_a_finished_run_is_known_from_its_checkpoint_before_anything_starts(tmp_path):
    """finished_run reads the latest checkpoint's trainer_state.json: spent time budget or step
    count -> a reason (the CLI returns before Ray); budget left, no checkpoint, resume
    disabled -> None. The CLI's early return is checked end to end (no retriever, no Ray)."""
    import json

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.cli import main
    from agent_rl.training.trainer import finished_run

    def cfg(*overrides):
        return load_config(TrainConfig, None, [f"trainer.default_local_dir={tmp_path}", *overrides])

    assert finished_run(cfg("trainer.max_time_s=100")) is None  # no checkpoint yet
    ckpt = tmp_path / "checkpoints" / "global_step_4"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 4, "trained_s": 80.0}))
    assert finished_run(cfg("trainer.max_time_s=101", "trainer.total_training_steps=10")) is None  # 80 + 20 <= 101
    assert "trained 80s of trainer.max_time_s=99" in finished_run(cfg("trainer.max_time_s=99"))
    assert "step 4 of trainer.total_training_steps=4" in finished_run(cfg("trainer.total_training_steps=4"))
    assert finished_run(cfg("trainer.max_time_s=99", "trainer.resume_mode=disable")) is None
    # the CLI: no retriever listens on this port, so getting past the check would fail or hang
    assert main([f"trainer.default_local_dir={tmp_path}", "trainer.max_time_s=99",
                 "retriever.url=[http://127.0.0.1:9/retrieve]", "trainer.retriever_health_timeout_s=1"]) == 0


# ----------------------------------------------------------------------------- unit: ray_trainer
@pytest.mark.parametrize("fails,ray_running", [("fit", False), ("init", False), ("shutdown", False), ("fit", True)])
def test_ray_trainer_shuts_down_the_workers_and_its_own_ray_on_any_exit(monkeypatch, fails, ray_running):
    """A run stopped by an error or Ctrl-C must not leave actors holding the engine's memory:
    the trainer's workers go, then Ray if ray_trainer started it (a caller's session stays)."""
    import ray

    from agent_rl.config import TrainConfig
    from agent_rl.training import ray_workers, trainer

    events: list[str] = []

    class FakeTrainer:
        def __init__(self, cfg, run_dir=None, retriever=None, identity=None):
            if fails == "init":
                raise ValueError("engine did not start")
            events.append("trainer")

        def fit(self):
            raise KeyboardInterrupt

        def shutdown(self):
            events.append("trainer down")
            if fails == "shutdown":
                raise RuntimeError("rollout worker gone")

    monkeypatch.setattr(trainer, "RayTrainer", FakeTrainer)
    monkeypatch.setattr(ray_workers, "init_ray", lambda address: events.append("ray") or not ray_running)
    monkeypatch.setattr(ray, "shutdown", lambda: events.append("ray down"))
    raised = {"fit": KeyboardInterrupt, "init": ValueError, "shutdown": RuntimeError}[fails]
    with pytest.raises(raised):
        with trainer.ray_trainer(TrainConfig()) as t:
            t.fit()
    expected = ["ray", "trainer", "trainer down", "ray down"]
    if fails == "init":
        expected = ["ray", "ray down"]
    if ray_running:
        expected.remove("ray down")
    assert events == expected


# ----------------------------------------------------------------------------- unit: collect_groups
def _fake_rollout(answers_by_prompt: dict[str, list[str]], n: int):
    """A rollout returning, for prompt p, n trajectories answering answers_by_prompt[p.id]."""
    from agent_rl.types import Trajectory

    calls: list[list[str]] = []

    def rollout(prompts):
        calls.append([p.id for p in prompts])
        trajs = [
            Trajectory([1], [2, 3], [1, 1], [-0.1, -0.2], group_id=g, response_text=f"<answer>{a}</answer>",
                       golden_answers=p.golden_answers, data_source=p.data_source)
            for g, p in enumerate(prompts)
            for a in answers_by_prompt[p.id][:n]
        ]
        return trajs, {"rollout/num_trajectories": float(len(trajs))}

    return rollout, calls


def _loader(k: int, sources: tuple[str, ...] = ("",)):
    from agent_rl.training.data import Prompt, PromptLoader

    prompts = [Prompt(f"q{i}", f"question {i}", [f"a{i}"], sources[i % len(sources)]) for i in range(k)]
    return PromptLoader(prompts, batch_size=2, shuffle=False)


def test_collect_without_filtering_scores_and_keeps_every_group():
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    rollout, calls = _fake_rollout({"q0": ["a0", "zz"], "q1": ["zz", "zz"]}, n=2)
    trajs, consumed, metrics = collect_groups(_loader(4), rollout, RewardConfig(), 2, False, 0, StepTimer())
    assert consumed == ["q0", "q1"] and calls == [["q0", "q1"]]
    assert [t.reward for t in trajs] == [1.0, 0.0, 0.0, 0.0] and [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert metrics["reward/mean"] == 0.25 and metrics["reward/em"] == 0.25 and "filter/rounds" not in metrics


def test_collect_with_filtering_drops_agreeing_groups_and_over_samples():
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    answers = {"q0": ["a0", "zz"], "q1": ["zz", "zz"], "q2": ["a2", "a2"], "q3": ["zz", "a3"],
               "q4": ["a4", "x"], "q5": ["x", "a5"]}
    rollout, calls = _fake_rollout(answers, n=2)
    loader = _loader(6)
    t = StepTimer()
    trajs, consumed, metrics = collect_groups(loader, rollout, RewardConfig(), 2, True, 3, t)
    # round 1: q0 kept, q1 dropped (all 0); keep rate 1/2 -> draw 2 more: q2 dropped (all 1), q3 kept
    assert calls == [["q0", "q1"], ["q2", "q3"]] and consumed == ["q0", "q1", "q2", "q3"]
    assert [(t.response_text, t.group_id) for t in trajs] == [
        ("<answer>a0</answer>", 0), ("<answer>zz</answer>", 0), ("<answer>zz</answer>", 1), ("<answer>a3</answer>", 1)]
    assert metrics["filter/frac_groups_kept"] == 0.5 and metrics["filter/rounds"] == 2.0
    assert loader.pos.index == 4 and t.seconds["gen"] >= 0


def test_collect_counts_the_kept_groups_per_data_source():
    """batch/groups/<source>: what the update learns from, after the filter (first round: q0 nq
    kept, q1 hotpotqa dropped; second: q2 nq dropped, q3 hotpotqa kept; q4 and q5 never drawn)."""
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    answers = {"q0": ["a0", "zz"], "q1": ["zz", "zz"], "q2": ["a2", "a2"], "q3": ["zz", "a3"], "q4": ["a4", "x"],
               "q5": ["x", "a5"]}
    rollout, _ = _fake_rollout(answers, n=2)
    _, _, metrics = collect_groups(_loader(6, ("nq", "hotpotqa")), rollout, RewardConfig(), 2, True, 3, StepTimer())
    assert {k: v for k, v in metrics.items() if k.startswith("batch/groups/")} == {
        "batch/groups/nq": 1.0, "batch/groups/hotpotqa": 1.0}
    rollout, _ = _fake_rollout(answers, n=2)
    _, _, metrics = collect_groups(_loader(6), rollout, RewardConfig(), 2, False, 0, StepTimer())
    assert metrics["batch/groups/unknown"] == 2.0  # no filter: every group drawn is kept


def test_collect_filters_on_the_task_metric_when_asked():
    """With format-aware rewards, a group of wrong answers in mixed formats disagrees on the
    reward (0.1 for a malformed answer, 0 for none) but not on EM: `score` keeps it, `acc`
    drops it and draws more prompts."""
    from agent_rl.config import RewardConfig
    from agent_rl.training.groups import check_filter_metric
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer
    from agent_rl.types import Trajectory

    texts = {"q0": ["<answer>zz</answer>", "no answer"], "q1": ["<answer>zz</answer>", "<answer>zz</answer>"],
             "q2": ["<answer>a2</answer>", "<answer>zz</answer>"], "q3": ["no answer", "no answer"]}

    def rollout(prompts):
        return [Trajectory([1], [2, 3], [1, 1], [-0.1, -0.2], group_id=g, response_text=x, golden_answers=p.golden_answers)
                for g, p in enumerate(prompts) for x in texts[p.id]], {}

    reward = RewardConfig(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    by_score, consumed, _ = collect_groups(_loader(4), rollout, reward, 1, True, 3, StepTimer())
    assert consumed == ["q0", "q1"] and [t.reward for t in by_score] == [0.1, 0.0]  # q0: rewards disagree
    by_acc, consumed, m = collect_groups(_loader(4), rollout, reward, 1, True, 3, StepTimer(), filter_metric="acc")
    # q0 and q1 agree on EM (all 0); nothing kept yet -> draw 4x the 1 group wanted (the loader wraps
    # around); q2 kept (a right but malformed answer scores 1 - 0.2, Search-R1 v0.3), the rest agree
    assert consumed == ["q0", "q1", "q2", "q3", "q0", "q1"] and [t.reward for t in by_acc] == [0.8, 0.1] and m["filter/rounds"] == 2.0
    with pytest.raises(ValueError, match="filter_metric must be score or acc"):
        check_filter_metric("em")


def test_collect_raises_when_no_group_has_signal():
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    rollout, _ = _fake_rollout({f"q{i}": ["zz", "zz"] for i in range(4)}, n=2)
    with pytest.raises(RuntimeError, match="nothing to learn"):
        collect_groups(_loader(4), rollout, RewardConfig(), 2, True, 1, StepTimer())


# ----------------------------------------------------------------------------- failed searches
def _rollout_with_failures(failed: set[tuple[str, int]]):
    """2 samples per prompt; sample k of prompt p had a failed search when (p, k) in `failed`."""
    from agent_rl.types import Trajectory

    def rollout(prompts):
        trajs = [Trajectory([1], [2, 3], [1, 1], [-0.1, -0.2], group_id=g, golden_answers=p.golden_answers,
                            response_text=f"<answer>{p.golden_answers[0] if k == 0 else 'zz'}</answer>",
                            num_tool_failures=int((p.id, k) in failed))
                 for g, p in enumerate(prompts) for k in range(2)]
        return trajs, {"rollout/num_trajectories": float(len(trajs))}

    return rollout


@pytest.mark.parametrize("drop,kept", [("group", [("q1", 0), ("q1", 1)]),
                                        ("trajectory", [("q0", 1), ("q1", 0), ("q1", 1)])])
def test_trajectories_with_a_failed_search_are_left_out(drop, kept):
    """A retriever outage must not teach the policy: a trajectory with a failed search is not
    trained on, and for group estimators neither is its group (its mates' advantages were
    computed against it)."""
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    rollout = _rollout_with_failures({("q0", 0)})
    trajs, _, metrics = collect_groups(_loader(2), rollout, RewardConfig(), 2, False, 0, StepTimer(), drop_failed=drop)
    answer = {("q0", 0): "a0", ("q1", 0): "a1"}
    assert [t.response_text for t in trajs] == [f"<answer>{answer.get(k, 'zz')}</answer>" for k in kept]
    assert all(t.num_tool_failures == 0 for t in trajs)
    assert sorted({t.group_id for t in trajs}) == list(range(len({k[0] for k in kept})))  # renumbered 0..G-1
    assert metrics["rollout/failed_search_trajectories"] == 1.0 and metrics["rollout/failed_search_share"] == 0.25
    assert metrics["rollout/dropped_for_failed_search"] == 4 - len(kept)


def test_failed_searches_are_counted_in_every_filter_round():
    """Issue 33: the failure counts came from the first round only, so a step whose refill
    rounds hit an outage reported none (and the outage rule never saw it)."""
    from agent_rl.config import RewardConfig
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer
    from agent_rl.types import Trajectory

    def rollout(prompts):  # round 1 (q0, q1): every group agrees, no failure; later rounds: sample 1 failed
        later = prompts[0].id not in ("q0",)
        trajs = [Trajectory([1], [2, 3], [1, 1], [-0.1, -0.2], group_id=g, golden_answers=p.golden_answers,
                            response_text=f"<answer>{p.golden_answers[0] if k == 0 and later else 'zz'}</answer>",
                            num_tool_failures=int(later and k == 1))
                 for g, p in enumerate(prompts) for k in range(2)]
        return trajs, {"rollout/tool_failures": float(sum(t.num_tool_failures for t in trajs))}

    trajs, consumed, m = collect_groups(_loader(12), rollout, RewardConfig(), 2, True, 1, StepTimer(),
                                        drop_failed="trajectory")
    # round 1: q0, q1 (4 trajectories, none failed, all agree); round 2: 8 prompts (16 trajectories, 8 failed)
    assert len(consumed) == 10 and m["filter/rounds"] == 2.0
    assert m["rollout/failed_search_trajectories"] == 8.0 and m["rollout/tool_failures"] == 8.0
    assert m["rollout/dropped_for_failed_search"] == 8.0 and m["rollout/failed_search_share"] == 8 / 20


def test_a_step_whose_every_search_failed_returns_nothing_to_train_on():
    from agent_rl.config import RewardConfig
    from agent_rl.training import algos
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    assert algos.uses_groups("grpo") and algos.uses_groups("rloo") and not algos.uses_groups("gae")
    rollout = _rollout_with_failures({(f"q{i}", k) for i in range(2) for k in range(2)})
    trajs, consumed, metrics = collect_groups(_loader(2), rollout, RewardConfig(), 2, False, 0, StepTimer(),
                                              drop_failed="group")
    assert trajs == [] and consumed == ["q0", "q1"] and metrics["rollout/failed_search_share"] == 1.0


def test_the_sync_collector_waits_out_an_outage_and_collects_again(monkeypatch):
    """Every search of the first collection failed: the outage rule runs (it waits for the
    retriever), the step collects new prompts, and the losses of both attempts are logged."""
    from types import SimpleNamespace

    import ray

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.collect import SyncCollector
    from agent_rl.training.metrics import StepTimer

    attempts = []

    def rollout(prompts, n):  # the retriever is down for the first collection only
        attempts.append([p.id for p in prompts])
        down = len(attempts) == 1
        return _rollout_with_failures({(p.id, k) for p in prompts for k in range(2)} if down else set())(prompts)

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    worker = SimpleNamespace(rollout=SimpleNamespace(remote=rollout))  # worker.rollout.remote(...): a Ray actor
    cfg = load_config(TrainConfig, None, ["data.train_batch_size=2", "retriever.skip_failed_searches=true"])
    waits = []
    collector = SyncCollector(worker, _loader(4), cfg, lambda step, metrics, t: waits.append(dict(metrics)) or [])
    trajs, consumed, m = collector.collect(1, StepTimer())
    assert attempts == [["q0", "q1"], ["q2", "q3"]] and consumed == ["q0", "q1", "q2", "q3"]
    assert len(trajs) == 4 and len(waits) == 2 and waits[0]["rollout/failed_search_share"] == 1.0
    assert m["rollout/collect_attempts"] == 2.0 and m["rollout/failed_search_trajectories"] == 4.0
    assert m["rollout/dropped_for_failed_search"] == 4.0 and m["rollout/failed_search_share"] == 0.0


@pytest.mark.ray
def test_a_retriever_killed_mid_run_does_not_teach_the_policy(tiny_kb, tiny_bm25, searching_policy, tmp_path):
    """A real GRPO run whose retriever (its own server process) is killed after step 1 and
    started again on the same port once the trainer waits for its /health: step 2's failed
    searches are counted and left out of the update, the trainer waits for /health, and step 3
    searches again. The policy searches on every prompt (searching_policy)."""
    import socket
    import threading

    import pandas as pd

    from retriever_server.launch import free_port, start_server, stop_server, wait_healthy

    qa = tmp_path / "four.parquet"
    pd.read_parquet(tiny_kb / "test.parquet").head(4).to_parquet(qa)
    index = tiny_bm25
    port = free_port()
    procs = [start_server(index, tiny_kb / "corpus.jsonl", port=port)[0]]
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, timeout=300, proc=procs[0])

    def restart():
        # A listener on the dead server's port closes every connection unanswered (failed
        # searches) until the trainer's outage rule asks for /health; then the real server
        # starts again. The outage lasts exactly until the trainer waits, however long step 2
        # takes on a loaded host (a fixed delay let the server come back too soon, a listener
        # that closed only the first connection left too few failures for the outage rule).
        deadline = time.monotonic() + 300
        with socket.create_server(("127.0.0.1", port)) as dead:
            while time.monotonic() < deadline:  # past it (no /health came) the assertions below say so
                dead.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    conn = dead.accept()[0]
                except TimeoutError:
                    break
                with conn:
                    conn.settimeout(5)
                    try:
                        head = conn.recv(64)
                    except OSError:
                        head = b""
                if head.startswith(b"GET /health"):
                    break
        procs.append(start_server(index, tiny_kb / "corpus.jsonl", port=port)[0])

    def on_step(step: int, metrics: dict) -> None:
        if step == 1:
            procs[0].kill()
            procs[0].wait(30)
            threading.Thread(target=restart, daemon=True).start()

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.trainer import RayTrainer

    ray_up()
    run_dir = tmp_path / "run"
    cfg = load_config(TrainConfig, ROOT / "configs/train/demo_grpo_cpu.yaml", [
        *overrides(tiny_kb, url, run_dir, "grpo", searching_policy), HF_ENGINE, f"data.train_files=[{qa}]",
        f"data.val_files=[{qa}]", "trainer.total_training_steps=3", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false",
        "retriever.max_retries=1", "retriever.timeout_s=5", "retriever.outage_wait_s=120",
        # the subject is what reaches the update, not the update: without the entropy bonus and
        # the KL loss a group whose rewards are equal is skipped
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.use_kl_loss=false"])
    trainer = RayTrainer(cfg)
    try:
        trainer.fit(on_step)
    finally:
        trainer.shutdown()
        for p in procs:
            stop_server(p)
    rows = {r["step"]: r for r in read_jsonl(run_dir)}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["rollout/searches_mean"] > 0, "the policy did not search"
    two = rows[2]
    assert two["rollout/failed_search_trajectories"] > 0, "no search reached the dead retriever"
    assert two["rollout/dropped_for_failed_search"] >= two["rollout/failed_search_trajectories"]
    assert two["timing/retriever_wait"] > 0
    # what step 2 trained on is what was kept: no trajectory with a failed search
    if two["rollout/collect_attempts"] == 1:
        assert two["batch/num_sequences"] == two["rollout/num_trajectories"] - two["rollout/dropped_for_failed_search"]
    assert rows[3]["rollout/failed_search_trajectories"] == 0 and rows[3]["rollout/tool_failures"] == 0


# ----------------------------------------------------------------------------- rollouts ahead
AHEAD = ["actor_rollout_ref.actor.tis_cap=2.0", "trainer.max_staleness=1"]


@pytest.mark.ray
def test_one_step_off_trains_step_k_on_the_batch_generated_during_update_k_minus_1(tiny_kb, retriever, tiny_policy,
                                                                                  tmp_path):
    run_dir = run_in_process("grpo", tiny_kb, retriever, tmp_path / "one_step_off", tiny_policy,
                             ["trainer.mode=one_step_off", *AHEAD, HF_ENGINE])
    rows = [r for r in read_jsonl(run_dir) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    # step 1 trains what version 0 sampled; step 2 the batch version 0 sampled during update 1
    assert (rows[0]["async/staleness_max"], rows[1]["async/staleness_mean"], rows[1]["async/staleness_max"]) == (0, 1, 1)
    assert rows[1]["async/staleness/1"] == rows[1]["batch/num_sequences"]
    assert rows[0]["async/partial_trajectories"] == rows[1]["async/partial_trajectories"] == 0  # swaps wait for the batch
    assert all("timing/drain" in r and "actor/tis_weight_mean" in r and "async/engine_idle_s" in r for r in rows)
    assert rows[0]["prompt_ids"] != rows[1]["prompt_ids"]
    assert (_weights(run_dir / "checkpoints" / "global_step_2" / "actor") - _weights(tiny_policy)).abs().max() > 0


@pytest.mark.ray
def test_async_run_killed_mid_step_continues_its_trajectories_and_trains_every_prompt_once(tiny_kb, retriever,
                                                                                           tiny_policy, tmp_path):
    """trainer.mode=async, 6 prompts, 3 steps of 2: killed with SIGKILL during step 2 (after
    step 1's checkpoint), started again: the groups the checkpoint held in flight are
    continued (their sampled tokens are trained, not regenerated) and every prompt of the
    epoch is trained exactly once."""
    run_dir = tmp_path / "async"
    cmd = [sys.executable, "-m", "agent_rl.training.cli", "--config", "configs/train/demo_grpo_cpu.yaml",
           *overrides(tiny_kb, retriever, run_dir, "grpo", tiny_policy), "trainer.mode=async", *AHEAD, HF_ENGINE,
           "data.train_data_num=6", "trainer.total_training_steps=null", "trainer.total_epochs=1",
           f"trainer.ray_address={ray_address()}"]
    env = kill_after_first_checkpoint(cmd, run_dir, tmp_path / "first.log")
    before = read_jsonl(run_dir)
    assert [r["step"] for r in before] == [1]
    saved = json.loads((run_dir / "checkpoints" / "global_step_1" / "rollouts.json").read_text())["groups"]
    assert len(saved) == 2  # the next batch, generating during update 1
    kept_tokens = sum(sum(t["loss_mask"]) for g in saved for t in g["done"] + g["live"])
    assert kept_tokens > 0

    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "continuing 2 groups from the checkpoint" in out.stdout and f"{kept_tokens} sampled tokens kept" in out.stdout
    rows = read_jsonl(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0] == before[0]
    assert rows[1]["async/resumed_sampled_tokens"] == kept_tokens
    assert rows[1]["prompt_ids"] == [g["prompt"]["id"] for g in saved]
    trained = [p for r in rows for p in r["prompt_ids"]]
    assert len(trained) == 6 and len(set(trained)) == 6  # each prompt of the epoch once
    assert all(r["async/staleness_max"] <= 1 for r in rows)
