"""Cold-start SFT: the loss mask is the RL mask, the loss falls, the checkpoint loads, resume.

Demonstrations come from the tiny knowledge base and a real retriever server; training runs
on the real model truncated to 2 blocks (real weights and tokenizer) to stay fast on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent_rl.coldstart import demo_file as DF
from agent_rl.coldstart import demos as D
from agent_rl.coldstart import sft
from agent_rl.config import SFTConfig, TrainConfig, load_config
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers.actor import ActorWorker

ROOT_CFG = str(Path(__file__).resolve().parents[2] / "configs" / "sft" / "demo_cpu.yaml")


def _rl_cfg() -> TrainConfig:
    cfg = TrainConfig()
    cfg.max_turns, cfg.retriever.topk = 2, 1
    cfg.data.max_obs_length, cfg.data.max_response_length = 256, 640
    # the demo config's turn length: a comparison's answer turn is up to 81 tokens
    demo = load_config(TrainConfig, Path(__file__).resolve().parents[2] / "configs/train/demo_grpo_cpu.yaml")
    cfg.actor_rollout_ref.rollout.max_tokens_per_turn = demo.actor_rollout_ref.rollout.max_tokens_per_turn
    return cfg


@pytest.fixture(scope="module")
def demo_file(aio, tiny_kb, retriever_url, tokenizer, model_dir, tmp_path_factory):
    """40 grounded demonstrations of the tiny KB's train questions, as `agent-rl-prep demos` writes them."""
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from data_prep.qa import read_qa

    rows = read_qa(tiny_kb / "train.parquet").to_dict("records")[:48]
    cfg = _rl_cfg()

    async def run():
        async with RetrieverClient(retriever_url) as client:
            return await D.build_demos(rows, client.search, tokenizer, cfg, max_searches=2, seed=0)

    res = aio(run())
    assert len(res.rows) >= 40, res.dropped
    path = tmp_path_factory.mktemp("demos") / "demos.parquet"
    DF.write_demos(res.rows[:40], path, DF.settings_of(cfg, str(model_dir)))
    return path


def _sft_cfg(policy, demo_file, run_dir, *extra: str) -> SFTConfig:
    return load_config(SFTConfig, ROOT_CFG, [
        f"actor_rollout_ref.model.path={policy}", f"data.train_files=[{demo_file}]",
        f"trainer.default_local_dir={run_dir}", "data.train_batch_size=2", "trainer.logger=[jsonl]",
        "trainer.log_freq=1",
        "trainer.max_time_s=null", "actor_rollout_ref.actor.optim.lr_warmup_steps=0", *extra,
    ])


def test_sft_loss_mask_is_the_rl_loss_mask(aio, demo_file, retriever_url, tokenizer, tiny_policy):
    """The same demonstrations produced by the RL rollout path (manager + scripted engine +
    HTTP retriever) and read by SFT give identical ids and masks; the SFT loss is the NLL of
    exactly those mask-1 tokens."""
    import pyarrow.parquet as pq

    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from agent_rl.training.data import Prompt
    from agent_rl.training.workers.actor import ActorWorker

    rows = pq.read_table(demo_file).to_pylist()[:4]
    cfg = _rl_cfg()

    async def rollouts():
        out = []
        async with RetrieverClient(retriever_url) as client:
            for r in rows:
                eng = D.ScriptedEngine(tokenizer, r["segments"], 2048)
                mgr = RolloutManager(eng, client, cfg, tokenizer=tokenizer)
                (t,), _ = await mgr.rollout([Prompt(r["id"], r["question"], r["golden_answers"])], n=1, greedy=True)
                out.append(t)
        return out

    rl = TokenBatch.from_trajectories(aio(rollouts()))
    demos, _ = sft.load_demos([str(demo_file)], max_length=4096)
    sb = TokenBatch.from_trajectories(demos[:4])
    assert torch.equal(sb.input_ids, rl.input_ids) and torch.equal(sb.prompt_lens, rl.prompt_lens)
    assert torch.equal(sb.mask(True), rl.mask(True))
    assert 0 < float(sb.mask(True).sum()) < float(sb.response_valid_mask().sum())  # observations are masked

    scfg = _sft_cfg(tiny_policy, demo_file, "unused", "actor_rollout_ref.actor.bf16_autocast=false")
    worker = ActorWorker(scfg.actor_rollout_ref, total_steps=1)
    logp = worker.compute_log_probs(sb)
    masked = float(-(logp * rl.loss_mask).sum() / rl.loss_mask.sum())
    everything = float(-(logp * sb.response_valid_mask()).sum() / sb.response_valid_mask().sum())
    loss = worker.update_sft(sb)["sft/loss"]
    assert loss == pytest.approx(masked, rel=1e-4)
    assert abs(loss - everything) > 0.05


def test_loss_falls_and_the_model_saves_loadable(demo_file, tiny_policy, tmp_path):
    """A small set (4 demonstrations, 2 per step), 8 steps: the masked NLL must fall."""
    import pyarrow.parquet as pq

    unseen = tmp_path / "val.parquet"
    DF.write_demos(pq.read_table(demo_file).to_pylist()[4:10], unseen, {})
    run_dir = tmp_path / "run"
    cfg = _sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=8", "trainer.total_epochs=4",
                   "data.train_data_num=4", "actor_rollout_ref.actor.optim.lr=1e-3", f"data.val_files=[{unseen}]",
                   "data.shuffle=false")
    model_dir = sft.run_sft(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    losses = [r["sft/loss"] for r in rows]
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    print(f"\nsft loss {first:.3f} -> {last:.3f}; val loss (6 unseen) {rows[-1]['sft/val_loss']:.3f}")
    assert last < 0.6 * first
    assert rows[-1]["sft/val_loss"] < first  # the format carries over to demonstrations it never saw
    assert all(r["sft/tokens_per_s"] > 0 and "sft/grad_norm" in r and "sft/lr" in r for r in rows)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    AutoTokenizer.from_pretrained(model_dir)
    # the saved weights are the trained ones: their NLL on the trained demonstrations is low
    demos, _ = sft.load_demos([str(demo_file)], 4096, max_rows=4)
    b = TokenBatch.from_trajectories(demos)
    nll, n = 0.0, 0.0
    with torch.no_grad():
        for i in range(len(b)):
            ids = b.input_ids[i, : b.seq_lens[i]][None]
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            p, r = int(b.prompt_lens[i]), int(b.response_lens[i])
            m = b.loss_mask[i, :r]
            nll -= float((lp[p - 1 : p - 1 + r] * m).sum())
            n += float(m.sum())
    assert nll / n < 0.6 * first


def test_resume_continues_from_the_checkpoint(demo_file, tiny_policy, tmp_path, capsys):
    run_dir = tmp_path / "run"
    short = ("data.train_batch_size=1", "trainer.save_freq=2")
    sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=3", *short))
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_3"
    sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=5", *short))
    assert "resumed from" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def _logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_time_budget_stops_saves_and_a_rerun_continues_or_finds_it_finished(demo_file, tiny_policy, tmp_path, capsys):
    run_dir = tmp_path / "run"
    budget = ("trainer.total_training_steps=1000", "trainer.max_time_s=0", "data.train_batch_size=1")
    model_dir = sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, *budget))
    assert _logged_steps(run_dir) == [1] and (model_dir / "config.json").is_file()
    # the time stop saved a resumable checkpoint although save_freq is -1, with the time trained
    state = json.loads((run_dir / "checkpoints" / "global_step_1" / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["trained_s"] > 0
    capsys.readouterr()
    # the same command again: the budget is spent, nothing trains (no actor is even built)
    assert sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, *budget)) == model_dir
    assert "nothing to do" in capsys.readouterr().out and _logged_steps(run_dir) == [1]
    # a larger budget continues from the checkpoint, not from the start
    sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=3", "data.train_batch_size=1"))
    assert "resumed from" in capsys.readouterr().out and _logged_steps(run_dir) == [1, 2, 3]
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step_3"


def test_a_model_without_a_checkpoint_is_not_trained_over(demo_file, tiny_policy, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "run"
    one = ("trainer.total_training_steps=1", "data.train_batch_size=1")
    model_dir = sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, *one))
    shutil.rmtree(run_dir / "checkpoints")  # a complete model (.complete), no checkpoint (deleted for space)
    weights = {f.name: f.stat().st_mtime_ns for f in model_dir.iterdir()}
    capsys.readouterr()
    sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=2", "data.train_batch_size=1"))
    assert "nothing to do" in capsys.readouterr().out
    assert {f.name: f.stat().st_mtime_ns for f in model_dir.iterdir()} == weights and _logged_steps(run_dir) == [1]
    sft.run_sft(_sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=2", "data.train_batch_size=1",
                         "trainer.resume_mode=disable"))
    assert "2 steps in" in capsys.readouterr().out


class FakeActor:
    """Stands in for the actor worker (fast tests of the run's files): counts updates and
    writes a small HF-like directory on save; `die_in_final_save` stops the process (as a
    kill would) while the final model is half written."""

    def __init__(self, die_in_final_save: bool = False):
        self.die_in_final_save, self.updates, self.loaded = die_in_final_save, 0, []

    def update(self, method, batch) -> dict[str, float]:
        self.updates += 1
        return {"sft/loss": 1.0}

    def call_all(self, method, *args):
        if method is ActorWorker.state_bytes:  # the free-space check before a checkpoint
            return [64]
        path = Path(args[0])
        if method is ActorWorker.load:
            self.loaded.append(path)
        elif method is ActorWorker.save:
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text("{}")
            if self.die_in_final_save and "checkpoints" not in path.parts:
                raise KeyboardInterrupt  # killed before the weights were written
            (path / "model.safetensors").write_bytes(b"w" * 64)
        return [None]

    def shutdown(self) -> None:
        pass


def _fake_sft(monkeypatch, tmp_path, actor: FakeActor, steps: int = 2) -> Path:
    """run_sft with the actor, the demonstrations and the tokenizer check faked (no model)."""
    from agent_rl.types import Trajectory

    demos = [Trajectory([1, 2], [3, 4], [1, 1], [0.0, 0.0]) for _ in range(4)]
    monkeypatch.setattr(sft, "check_tokenizer", lambda files, path: None)
    monkeypatch.setattr(sft, "load_demos", lambda files, max_length, max_rows=None: (demos, 0))
    monkeypatch.setattr(sft, "make_actor", lambda cfg, total: actor)
    cfg = load_config(SFTConfig, None, ["data.train_files=[unused.parquet]", f"trainer.default_local_dir={tmp_path}",
                                        "trainer.logger=[jsonl]", f"trainer.total_training_steps={steps}",
                                        "data.train_batch_size=1", "trainer.max_time_s=null"])
    return sft.run_sft(cfg)


def test_a_run_killed_while_saving_its_model_saves_it_on_the_next_run(monkeypatch, tmp_path, capsys):
    """The final model used to be written in place and judged finished by config.json alone:
    a kill mid-save left a model without weights that every re-run took as finished."""
    with pytest.raises(KeyboardInterrupt):
        _fake_sft(monkeypatch, tmp_path, FakeActor(die_in_final_save=True))
    assert (tmp_path / "checkpoints" / "global_step_2").is_dir()  # the training itself was saved
    capsys.readouterr()
    actor = FakeActor()
    model_dir = _fake_sft(monkeypatch, tmp_path, actor)
    assert actor.updates == 0 and actor.loaded == [tmp_path / "checkpoints" / "global_step_2" / "actor"]
    assert (model_dir / "model.safetensors").is_file() and sft.model_finished(model_dir)
    assert "nothing to do" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "metrics.jsonl", "model"]
    # and now it is finished: a re-run builds no actor
    monkeypatch.setattr(sft, "make_actor", lambda cfg, total: pytest.fail("a finished run built its actor"))
    assert _fake_sft(monkeypatch, tmp_path, FakeActor()) == model_dir
    assert "nothing to do" in capsys.readouterr().out


def test_a_leftover_model_tmp_is_removed_and_a_failed_save_keeps_the_previous_model(tmp_path, capsys):
    model_dir = tmp_path / "model"
    (tmp_path / "model.tmp").mkdir()
    (tmp_path / "model.tmp" / "config.json").write_text("{}")  # a killed save's half model
    assert not sft.model_finished(tmp_path / "model.tmp")
    sft.save_final_model(lambda d: FakeActor().call_all(ActorWorker.save, d), model_dir, {"step": 1})
    assert "removing" in capsys.readouterr().out and not (tmp_path / "model.tmp").exists()
    assert sft.model_finished(model_dir) and json.loads((model_dir / ".complete").read_text()) == {"step": 1}
    with pytest.raises(KeyboardInterrupt):
        sft.save_final_model(lambda d: FakeActor(die_in_final_save=True).call_all(ActorWorker.save, d), model_dir, {"step": 2})
    assert sft.model_finished(model_dir) and json.loads((model_dir / ".complete").read_text()) == {"step": 1}
    assert (model_dir / "model.safetensors").is_file()
    (model_dir / ".complete").unlink()  # config.json alone is not a finished model
    assert (model_dir / "config.json").is_file() and not sft.model_finished(model_dir)


def test_demos_from_another_tokenizer_are_refused(demo_file, tiny_policy, tmp_path):
    import pyarrow.parquet as pq

    rows = pq.read_table(demo_file).to_pylist()
    rows[0]["prompt_text"] = rows[0]["prompt_text"].replace("Answer", "Reply")
    DF.write_demos(rows, tmp_path / "other.parquet", {})
    with pytest.raises(ValueError, match="different tokenizer"):
        sft.check_tokenizer([str(tmp_path / "other.parquet")], str(tiny_policy))


def test_sft_config_file_loads_with_overrides():
    cfg = load_config(SFTConfig, ROOT_CFG, ["actor_rollout_ref.model.lora_rank=16"])
    assert cfg.actor_rollout_ref.model.lora_rank == 16 and cfg.trainer.max_time_s is not None
    assert cfg.actor_rollout_ref.actor.state_masking
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(SFTConfig, ROOT_CFG, ["trainer.epochs=2"])


@pytest.mark.ray
def test_sft_with_two_ray_workers_matches_one_worker(demo_file, tiny_policy, tmp_path):
    """SFT data-parallel over 2 Ray workers (gloo, CPU) runs through the same run lifecycle as
    RL (trainer.nnodes and the other run fields are RL's: RunConfig) and takes the same steps
    as one worker: step 1's loss and gradient norm are the whole batch's, and so is step 2's
    loss after the first update. fp32, so only summation order differs."""
    import ray

    was_up = ray.is_initialized()  # an earlier test's cluster is used, and left up

    def train(workers: int) -> list[dict]:
        run_dir = tmp_path / f"run{workers}"
        cfg = _sft_cfg(tiny_policy, demo_file, run_dir, "trainer.total_training_steps=2", "data.train_data_num=8",
                       "data.train_batch_size=4", "data.shuffle=false", "actor_rollout_ref.actor.bf16_autocast=false",
                       "actor_rollout_ref.actor.optim.lr=1e-4", f"trainer.num_actor_workers={workers}")
        try:
            model_dir = sft.run_sft(cfg)
        finally:
            if workers > 1 and not was_up:
                ray.shutdown()
        assert (model_dir / "model.safetensors").is_file() and sft.model_finished(model_dir)
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    one, two = train(1), train(2)
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-4)
        assert b["sft/sampled_tokens"] == a["sft/sampled_tokens"]
    # step 2's loss is measured after the first update: equal only if that update was
    assert two[0]["sft/grad_norm"] == pytest.approx(one[0]["sft/grad_norm"], rel=1e-4)
    assert two[1]["sft/grad_norm"] == pytest.approx(one[1]["sft/grad_norm"], rel=1e-3)


def test_every_run_field_the_workers_read_exists_in_sft():
    """WorkerGroup, placement and the run lifecycle read `cfg.trainer.<field>` of whichever
    config they get; SFT passes its own (a missing field, like trainer.nnodes on ea14a9d, would
    fail only on GPUs, where the placement reads it)."""
    import ast
    import dataclasses

    from agent_rl.config import RunConfig, SFTTrainerConfig

    root = Path(__file__).resolve().parents[2] / "agent_rl" / "training"
    read = set()
    for p in (root / "ray_workers.py", root / "run.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "trainer"):
                read.add(node.attr)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tr":
                read.add(node.attr)
    sft_fields = {f.name for f in dataclasses.fields(SFTTrainerConfig)}
    assert {"nnodes", "n_gpus_per_node", "torch_threads"} <= read
    assert read <= sft_fields, read - sft_fields
    assert {f.name for f in dataclasses.fields(RunConfig)} <= sft_fields
