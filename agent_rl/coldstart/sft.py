"""Cold-start supervised fine-tuning (`agent-rl-sft`, parsed in `agent_rl.coldstart.cli`).

Trains the policy on demonstration trajectories (`agent-rl-prep demos`) through the RL actor
worker: the same `TokenBatch`, micro-batching, LoRA or full fine-tuning, bf16 autocast and
optimizer, and the loss only on loss-mask tokens (the model's own turns; the prompt and the
`<information>` blocks are masked exactly as in RL). The ids are used as stored: nothing is
re-tokenised. The result, `<run_dir>/model`, is an HF directory (the actor's checkpoint
format) that vLLM and transformers load; start RL from it with
`actor_rollout_ref.model.path=<run_dir>/model`. It is written into `model.tmp/`, marked
complete (`.complete`, written last), fsynced and renamed, so a kill or a power loss never
leaves a half-written model that a re-run would take as finished.

    agent-rl-sft --config configs/sft/demo_cpu.yaml trainer.max_time_s=300

Metrics: `sft/loss`, `sft/grad_norm`, `sft/lr`, `sft/tokens_per_s`, `sft/epoch`,
`sft/val_loss`, `timing/step` (console, TensorBoard, jsonl in the run directory).
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from agent_rl.config import SFTConfig, to_dict
from agent_rl.types import Trajectory
from data_prep.atomic import COMPLETE, replace_dir


# ----------------------------------------------------------------------------- data
def load_demos(files: list[str], max_length: int, max_rows: int | None = None) -> tuple[list[Trajectory], int]:
    """Demonstrations of all `files` (first `max_rows`), and how many were skipped for
    exceeding `max_length` prompt + response tokens."""
    from agent_rl.coldstart.demo_file import read_demos

    trajs = [t for f in files for t in read_demos(f)]
    if max_rows is not None:
        trajs = trajs[:max_rows]
    kept = [t for t in trajs if len(t.prompt_ids) + len(t.response_ids) <= max_length]
    return kept, len(trajs) - len(kept)


def check_tokenizer(files: list[str], model_path: str) -> None:
    """Demonstrations store token ids: refuse ids made by another tokenizer than the model's
    (decoding a stored prompt must give back its stored text)."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    for f in files:
        rows = pq.read_table(f, columns=["prompt_ids", "prompt_text"]).slice(0, 1).to_pylist()
        if rows and tok.decode(rows[0]["prompt_ids"], skip_special_tokens=False) != rows[0]["prompt_text"]:
            raise ValueError(f"{f} was built with a different tokenizer than {model_path}'s; "
                             "rebuild it with `agent-rl-prep demos --model <this model>`")


def epoch_order(n: int, epoch: int, shuffle: bool, seed: int) -> list[int]:
    """The demonstration order of `epoch` (a function of the step alone: resumes exactly)."""
    import numpy as np

    return np.random.default_rng(seed + epoch).permutation(n).tolist() if shuffle else list(range(n))


# ----------------------------------------------------------------------------- workers
class LocalActor:
    """One `ActorWorker` in this process behind the calls the Ray `WorkerGroup` offers."""

    def __init__(self, worker: Any):
        self.worker = worker

    def update(self, method: Callable[..., Any], batch: Any) -> dict[str, float]:
        return method(self.worker, batch)

    def per_token(self, method: Callable[..., Any], batch: Any) -> Any:
        return method(self.worker, batch)

    def call_all(self, method: Callable[..., Any], *args: Any) -> list[Any]:
        return [method(self.worker, *args)]

    def shutdown(self) -> None:
        self.worker = None


def make_actor(cfg: SFTConfig, total_steps: int) -> Any:
    """The actor in this process (one worker) or a Ray data-parallel group (several)."""
    from agent_rl.training.workers.actor import ActorWorker

    factory = functools.partial(ActorWorker, cfg.actor_rollout_ref, total_steps)
    if cfg.trainer.num_actor_workers <= 1:
        return LocalActor(factory())
    from agent_rl.training.ray_workers import WorkerGroup, init_ray

    init_ray(cfg.trainer.ray_address)
    # WorkerGroup reads the run fields (trainer.torch_threads, n_gpus_per_node, nnodes): RunConfig
    return WorkerGroup(cfg, factory, cfg.trainer.num_actor_workers)


def validation_loss(actor: Any, trajs: list[Trajectory], batch_size: int) -> float:
    """Token-mean NLL of the loss-mask tokens of `trajs` under the current policy."""
    from agent_rl.training.batch import TokenBatch
    from agent_rl.training.workers.actor import ActorWorker

    nll, tokens = 0.0, 0.0
    for i in range(0, len(trajs), batch_size):
        batch = TokenBatch.from_trajectories(trajs[i : i + batch_size])
        logp = actor.per_token(ActorWorker.compute_log_probs, batch)
        nll -= float((logp * batch.loss_mask).sum())
        tokens += float(batch.loss_mask.sum())
    return nll / max(tokens, 1.0)


# ----------------------------------------------------------------------------- the final model
def model_finished(model_dir: Path) -> bool:
    """Whether `model_dir` is a final model a run completed (its marker, written last)."""
    return (model_dir / COMPLETE).is_file()


def clear_partial_model(model_dir: Path) -> None:
    """Remove `model.tmp/`, the half-written final model of a run killed while saving it."""
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    if tmp.exists():
        print(f"[sft] removing {tmp}, left by a run stopped while saving its model", flush=True)
        shutil.rmtree(tmp)


def save_final_model(save: Callable[[str], Any], model_dir: Path, info: dict) -> None:
    """`save(dir)` writes the model into `model.tmp/`; the marker (with `info`) goes in last,
    then everything is fsynced and renamed to `model_dir` (an older model is replaced whole)."""
    clear_partial_model(model_dir)
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    save(str(tmp))
    (tmp / COMPLETE).write_text(json.dumps(info) + "\n")
    replace_dir(tmp, model_dir)


# ----------------------------------------------------------------------------- the loop
def run_sft(cfg: SFTConfig, run_dir: str | Path | None = None,
            on_step: Callable[[int, dict[str, float]], None] | None = None) -> Path:
    """Train; returns the final HF model directory (`<run_dir>/model`)."""
    import torch

    from agent_rl.training.batch import TokenBatch
    from agent_rl.training.metrics import MetricsLogger
    from agent_rl.training.run import Run
    from agent_rl.training.workers.actor import ActorWorker

    d, trainer_cfg = cfg.data, cfg.trainer
    run_dir = Path(run_dir or trainer_cfg.default_local_dir)
    if trainer_cfg.torch_threads:
        torch.set_num_threads(trainer_cfg.torch_threads)
    torch.manual_seed(d.seed)
    check_tokenizer(d.train_files + d.val_files, cfg.actor_rollout_ref.model.path)
    train, skipped = load_demos(d.train_files, d.max_length, d.train_data_num)
    val, _ = load_demos(d.val_files, d.max_length) if d.val_files else ([], 0)
    if not train:
        raise ValueError(f"no demonstrations of at most data.max_length={d.max_length} tokens in {d.train_files}")
    bs = min(d.train_batch_size, len(train))
    steps_per_epoch = math.ceil(len(train) / bs)
    total = trainer_cfg.total_training_steps or trainer_cfg.total_epochs * steps_per_epoch
    print(f"[sft] {len(train)} demonstrations ({skipped} longer than {d.max_length} tokens skipped), "
          f"{len(val)} for validation; {total} steps of {bs}", flush=True)

    inputs = {"actor_rollout_ref.model.path": cfg.actor_rollout_ref.model.path,
              **{f"data.train_files[{i}]": f for i, f in enumerate(d.train_files)},
              **{f"data.val_files[{i}]": f for i, f in enumerate(d.val_files)}}
    run = Run(trainer_cfg, run_dir, total, "sft", inputs=inputs)
    latest = run.start()  # resume_mode=disable: an earlier run here is moved aside
    model_dir = run_dir / "model"
    clear_partial_model(model_dir)
    if latest is not None:
        reason = run.finished(run.checkpoints.read_state(latest))
        if reason is not None and model_finished(model_dir):
            print(f"[sft] {latest} has finished ({reason}): nothing to do; model: {model_dir}", flush=True)
            return model_dir
    elif trainer_cfg.resume_mode == "auto" and model_finished(model_dir):
        # a model saved by a run without checkpoints: training again would overwrite it
        print(f"[sft] {model_dir} exists and {run_dir / 'checkpoints'} has no checkpoint to continue from: "
              f"nothing to do (trainer.resume_mode=disable trains again from the start)", flush=True)
        return model_dir
    if model_dir.exists() and not model_finished(model_dir):
        print(f"[sft] {model_dir} is not marked complete ({COMPLETE}): it will be replaced by this run's model",
              flush=True)
    actor = make_actor(cfg, total)
    if latest is not None:
        run.restore(latest)
        actor.call_all(ActorWorker.load, str(latest / "actor"))
        print(f"[sft] resumed from {latest} at step {run.step} ({run.trained_s:.0f}s trained)", flush=True)
    console = "console" in trainer_cfg.logger
    logger = MetricsLogger(run_dir, [s for s in trainer_cfg.logger if s != "console"], to_dict(cfg), trainer_cfg.project_name,
                           trainer_cfg.experiment_name, resume_step=run.step)

    from tqdm import tqdm

    t_start, first_step = time.perf_counter(), run.step
    try:
        with tqdm(total=run.expected_steps(), initial=run.step, desc="sft", unit="step", dynamic_ncols=True) as bar:
            while run.running():
                epoch, i = divmod(run.step, steps_per_epoch)
                step = run.begin_step()
                order = epoch_order(len(train), epoch, d.shuffle, d.seed)
                batch = TokenBatch.from_trajectories([train[j] for j in order[i * bs : (i + 1) * bs]])
                t0 = time.perf_counter()
                metrics = actor.update(ActorWorker.update_sft, batch)
                dt = time.perf_counter() - t0
                metrics.update({
                    "sft/tokens_per_s": batch.num_tokens / dt,
                    "sft/sampled_tokens": float(batch.loss_mask.sum()),
                    "sft/epoch": step / steps_per_epoch,
                    "timing/step": dt,
                })
                # validation at the run's last step counts in its time (the budget is the run's)
                if val and ((trainer_cfg.test_freq > 0 and step % trainer_cfg.test_freq == 0) or run.stopping(extra_s=run.elapsed())):
                    metrics["sft/val_loss"] = validation_loss(actor, val, bs)
                run.end_step()
                metrics["training/elapsed_s"] = run.trained_s
                if step % trainer_cfg.log_freq == 0 or run.stopping():
                    logger.log(metrics, step)
                    if console:
                        bar.write(f"step {step} | " + " | ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
                bar.set_postfix(loss=f"{metrics['sft/loss']:.3f}", tok_s=f"{metrics['sft/tokens_per_s']:.0f}")
                bar.total = run.expected_steps()
                bar.update(1)
                if on_step is not None:
                    on_step(step, metrics)
                if run.save_due():
                    run.save({}, to_dict(cfg), lambda p: actor.call_all(ActorWorker.save, str(p / "actor")),
                             actor.call_all(ActorWorker.state_bytes)[0])
        if (msg := run.stop_message()) is not None:
            print("\n" + msg, flush=True)
        save_final_model(lambda d: actor.call_all(ActorWorker.save, d), model_dir, {"step": run.step, "trained_s": run.trained_s})
    finally:
        logger.close()
        actor.shutdown()
    print(f"[sft] {run.step - first_step} steps in {time.perf_counter() - t_start:.0f}s; model: {model_dir}\n"
          f"[sft] start RL from it with actor_rollout_ref.model.path={model_dir}", flush=True)
    return model_dir
