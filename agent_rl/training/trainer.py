"""The RL driver: `RayTrainer.fit()` runs GRPO / PPO / RLOO / REINFORCE++ steps, top to bottom.

One step: prompts -> rollout (n samples each; optional group filtering with over-sampling)
-> outcome reward -> old / reference log-probs and values -> advantages -> critic and actor
updates -> weight sync into the engine -> metrics -> checkpoint. Branching lives in the
parts it calls; `fit()` only reads in order. The parts: `collect` (each step's groups, in every
trainer.mode), `identity` (the resume check), `data` (the prompts), `run` (resume, time budget,
checkpoints), `metrics`, the workers (`ray_workers`, `weight_sync`).

Token-level conventions (agent_rl/training/batch.py): response tokens include observation tokens in
the middle with loss_mask 0. The outcome reward sits on the last sampled token; KL (in the
reward or in the loss), advantages and the loss all use the same mask
(`TokenBatch.mask(state_masking)`). Old log-probs are always recomputed by the trainer (the
engine may sample in bf16); the engine's own log-probs travel along as `rollout_logprobs`
for truncated importance sampling (`actor.tis_cap`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from agent_rl.config import ActorRolloutRefConfig, TrainConfig, to_dict
from agent_rl.training import algos, explore
from agent_rl.training.batch import TokenBatch
from agent_rl.training.checkpoint import STATE, CheckpointManager
from agent_rl.training.collect import ROLLOUTS, OutageRule, make_collector, read_rollouts
from agent_rl.training.data import PromptLoader, load_prompts, load_train_prompts, run_inputs
from agent_rl.training.groups import GroupRules, score_trajectories
from agent_rl.training.identity import check_resume, train_identity
from agent_rl.training.metrics import MetricsLogger, RisingRate, StepTimer, batch_metrics, write_validation
from agent_rl.training.rollout_data import RolloutDataWriter
from agent_rl.training.run import Run, finished_reason, resume_checkpoint
from agent_rl.training.workers.actor import ActorWorker
from agent_rl.training.workers.critic import CriticWorker

log = logging.getLogger(__name__)


class RayTrainer:
    """Owns the workers, the data stream, checkpoints and metrics of one run."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path | None = None, retriever=None,
                 identity: dict | None = None):
        """The parts in the order they are needed: the run (a checkpoint of other settings
        refused, an earlier run moved aside), what each step uses (the advantage estimator,
        the KL controller), the workers, the collector, then the state resumed and the
        metrics. `retriever`: optional in-process `async search(queries, topk)` object instead
        of the HTTP client for `retriever.url` (tests without a server). `identity`: the run's
        train_identity(cfg) from a caller that already passed it to check_resume
        (agent-rl-train, before the retriever and Ray), so neither is done twice."""
        from agent_rl.training.ray_workers import WorkerGroup, make_rollout_worker
        from agent_rl.training.weight_sync import WeightSync

        self.cfg = cfg
        self.run_dir = Path(run_dir or cfg.trainer.default_local_dir)
        if identity is None:  # runs started in-process; agent-rl-train checked before the retriever and Ray
            identity = train_identity(cfg)
            check_resume(cfg, identity, self.run_dir)
        self.loader = PromptLoader(load_train_prompts(cfg), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed,
                                   balanced=cfg.data.balance_by is not None)
        self.total_steps = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * self.loader.steps_per_epoch
        self.run = Run(cfg.trainer, self.run_dir, self.total_steps, "train", identity, run_inputs(cfg))
        resume_from = self.run.start()  # before the workers start: a refused move aside costs nothing
        self.invalid_watch = RisingRate("rollout/invalid_action_rate")
        self.rollout_data = RolloutDataWriter(cfg)
        self.adv_fn = algos.get_adv_estimator(cfg.algorithm.adv_estimator)
        GroupRules.from_config(cfg)  # checks algorithm.filter_metric before the engine starts
        self.kl_ctrl = algos.make_kl_controller(cfg.algorithm.kl_ctrl)
        self.use_ref = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        torch.manual_seed(cfg.data.seed)

        n_workers = cfg.trainer.num_actor_workers
        self.rollout = make_rollout_worker(cfg, retriever)
        self.actor = WorkerGroup(cfg, functools.partial(ActorWorker, actor_settings(cfg), self.total_steps), n_workers)
        self.critic = None
        if algos.needs_critic(cfg.algorithm.adv_estimator):
            self.critic = WorkerGroup(cfg, functools.partial(CriticWorker, cfg, self.total_steps), n_workers, "critic")
        self.sync = WeightSync(self.actor, self.rollout, "cuda_ipc" if cfg.trainer.n_gpus_per_node > 0 else "object_store")
        self.collector = make_collector(self.rollout, self.loader, cfg, self.total_steps,
                                        OutageRule(self.rollout, cfg.retriever))
        self._maybe_resume(resume_from)
        self.metrics = MetricsLogger(self.run_dir, cfg.trainer.logger, to_dict(cfg), cfg.trainer.project_name,
                                     cfg.trainer.experiment_name, resume_step=self.step)

    # ------------------------------------------------------------------ the loop
    @property
    def step(self) -> int:
        return self.run.step

    def fit(self, on_step: Callable[[int, dict], None] | None = None) -> None:
        cfg = self.cfg
        if cfg.trainer.val_before_train and self.step == 0:
            self.metrics.log(self.validate(), step=0)
        while self.run.running():
            self.run.begin_step()
            t = StepTimer()
            with t("step"):
                # 1. rollout + reward (group filtering may draw extra prompts); one_step_off |
                #    async: groups generated ahead, during the updates before
                trajs, prompt_ids, metrics = self.collector.collect(self.step, t)
                metrics.update(explore.first_batch(self.step, trajs, metrics, cfg, self.loader.prompts))  # step 1
                batch = TokenBatch.from_trajectories(trajs)
                mask = batch.mask(cfg.actor_rollout_ref.actor.state_masking)
                # 2. log-probs of the policy that sampled (recomputed), the reference, values
                if self._needs_old_log_probs(len(batch)):
                    with t("old_log_prob"):
                        batch = batch.with_fields(old_logprobs=self.actor.per_token(ActorWorker.compute_log_probs, batch))
                if self.use_ref:
                    with t("ref"):
                        batch = batch.with_fields(ref_logprobs=self.actor.per_token(ActorWorker.compute_ref_log_probs, batch))
                if self.critic is not None:
                    with t("values"):
                        batch = batch.with_fields(values=self.critic.per_token(CriticWorker.compute_values, batch))
                # 3. advantages (outcome reward on the last sampled token, optional KL in reward)
                with t("adv"):
                    batch, adv_metrics = self._advantages(batch, mask)
                # 4. updates, then push the new policy into the engine
                if self.critic is not None:
                    with t("update_critic"):
                        metrics.update(self.critic.update(CriticWorker.update_critic, batch))
                with t("update_actor"):
                    metrics.update(self.actor.update(ActorWorker.update_policy, batch))
                self.collector.before_push(t)  # one_step_off: the batch generating finishes on its weights
                with t("sync"):
                    self.sync.push(self.step)
            self.run.end_step()
            # validation is not training: outside "step" (perf/tokens_per_s) and outside the
            # time budget (trainer.max_time_s; training/elapsed_s), so a run's training minutes
            # do not depend on how often it is evaluated. The step a run stops at is validated
            # too, whether its step count or the clock stops it (veRL validates its last step)
            if cfg.trainer.test_freq > 0 and (self.step % cfg.trainer.test_freq == 0 or self.run.stopping()):
                with t("validate"):
                    metrics.update(self.validate())
            metrics.update(adv_metrics)
            metrics.update(batch_metrics(batch, mask))
            metrics.update(t.metrics())
            metrics["perf/tokens_per_s"] = batch.num_tokens / t.seconds["step"]
            metrics["training/epoch"] = float(self.loader.pos.epoch)
            metrics["training/elapsed_s"] = self.run.trained_s
            warning = self.invalid_watch.update(metrics, self.step)
            if warning:
                log.warning(warning)
                print(f"[train] warning: {warning}", flush=True)
            # 5. log before the checkpoint: a run killed after checkpoint K has logged K
            self.metrics.log(metrics, self.step, extra={"prompt_ids": prompt_ids})
            self.rollout_data.maybe_write(self.step, trajs)
            if self.run.save_due():
                self.save()
            if on_step is not None:
                on_step(self.step, metrics)
        if (msg := self.run.stop_message()) is not None:  # stopped by the clock
            print(msg, flush=True)

    # ------------------------------------------------------------------ step pieces
    def _needs_old_log_probs(self, num_sequences: int) -> bool:
        """Old log-probs are always the trainer's, never the engine's. A single on-policy
        update (one epoch, one mini-batch) takes them from its own forward pass (ratio = 1
        exactly, as veRL), saving a pass; the in-reward KL needs them before the update."""
        return self.cfg.algorithm.use_kl_in_reward or self.actor.rank0(ActorWorker.needs_old_log_probs, num_sequences)

    def _advantages(self, batch: TokenBatch, mask: torch.Tensor) -> tuple[TokenBatch, dict[str, float]]:
        """Token rewards -> (optional in-reward KL) -> advantages and returns, all on `mask`."""
        cfg = self.cfg.algorithm
        metrics: dict[str, float] = {}
        # the reward, or the task metric alone for an estimator registered to read it (rejection sampling)
        outcome = {"score": batch.rewards, "acc": batch.acc}[algos.outcome_of(cfg.adv_estimator)]
        token_rewards = algos.place_outcome_reward(outcome, mask)
        if cfg.use_kl_in_reward:
            token_rewards, kl_metrics = algos.apply_kl_penalty(
                token_rewards, batch.old_logprobs, batch.ref_logprobs, mask, self.kl_ctrl.value, cfg.kl_penalty
            )
            self.kl_ctrl.update(kl_metrics["kl"], n_steps=len(batch))
            metrics = {"actor/reward_kl_penalty": kl_metrics["kl"], "actor/reward_kl_penalty_coeff": kl_metrics["kl_coef"]}
        adv, returns = self.adv_fn(token_rewards, mask, batch.group_ids, batch.values, cfg)
        return batch.with_fields(advantages=adv, returns=returns), metrics

    def validate(self) -> dict[str, float]:
        """Greedy rollouts on the validation prompts: val/<em|f1> overall and per data_source."""
        import ray

        cfg = self.cfg
        prompts = load_prompts(cfg.data.val_files, cfg.data.val_data_num)
        per_source: dict[str, list[float]] = {}
        rewards: list[float] = []
        rows: list[dict] = []
        failed = 0
        for i in range(0, len(prompts), cfg.data.val_batch_size):
            chunk = prompts[i : i + cfg.data.val_batch_size]
            trajs, _ = ray.get(self.rollout.rollout.remote(chunk, 1, True))
            failed += sum(tr.num_tool_failures > 0 for tr in trajs)
            for tr, r in zip(trajs, score_trajectories(trajs, chunk, cfg.reward)):
                per_source.setdefault(tr.data_source or "all", []).append(r.metric)
                rewards.append(r.score)
                rows.append({"id": chunk[tr.group_id].id, "data_source": tr.data_source, "metric": r.metric,
                             "score": r.score, "answer": r.answer, "searches": tr.num_searches,
                             "finish_reason": tr.finish_reason, "response": tr.response_text})
        if cfg.trainer.validation_data_dir:
            write_validation(cfg.trainer.validation_data_dir, self.step, rows)
        every = [x for v in per_source.values() for x in v]
        out = {f"val/{cfg.reward.kind}/{src}": sum(v) / len(v) for src, v in per_source.items()}
        out[f"val/{cfg.reward.kind}"] = sum(every) / max(1, len(every))
        out["val/reward"] = sum(rewards) / max(1, len(rewards))
        out["val/failed_search_trajectories"] = float(failed)
        if failed:  # the score counts them as the model's failures: say so
            log.warning("validation at step %d: %d of %d questions had a failed search (scored as they ended)",
                        self.step, failed, len(every))
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        def save_workers(d: Path) -> None:
            self.actor.call_all(ActorWorker.save, str(d / "actor"))
            if self.critic is not None:
                self.critic.call_all(CriticWorker.save, str(d / "critic"))
            rollouts = self.collector.state()  # ahead modes: the groups not trained yet, with their trajectories in flight
            if rollouts is not None:
                (d / ROLLOUTS).write_text(json.dumps(rollouts))

        expected = self.actor.rank0(ActorWorker.state_bytes) + (self.critic.rank0(CriticWorker.state_bytes) if self.critic else 0)
        return self.run.save({"data": self.loader.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict()},
                             to_dict(self.cfg), save_workers, expected)

    def _maybe_resume(self, path: Path | None) -> None:
        if path is None:
            return
        state = self.run.restore(path)
        self.actor.call_all(ActorWorker.load, str(path / "actor"))
        if self.critic is not None:
            self.critic.call_all(CriticWorker.load, str(path / "critic"))
        self.loader.load_state_dict(state["data"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.sync.push(self.step)  # the engine started from the base model
        if (path / ROLLOUTS).is_file():
            self.collector.restore(read_rollouts(path / ROLLOUTS, self.cfg.actor_rollout_ref.rollout.n))
        print(f"[train] resumed from {path} at step {self.step}", flush=True)

    def shutdown(self) -> None:
        import ray

        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        try:
            ray.get(self.rollout.shutdown.remote(), timeout=60)
        except Exception as e:  # the engine may already be gone (Ctrl-C); nothing to recover
            print(f"[train] rollout worker shutdown: {e!r}")
        for group in (self.actor, self.critic):
            if group is not None:
                group.shutdown()


@contextmanager
def ray_trainer(cfg: TrainConfig, run_dir: str | Path | None = None, retriever: Any = None,
                identity: dict | None = None) -> Iterator[RayTrainer]:
    """`with ray_trainer(cfg) as trainer: trainer.fit()`: a RayTrainer in a Ray session. Ray
    is started (or joined: trainer.ray_address) unless this process is connected already. On
    any exit, an error and Ctrl-C included, the trainer's workers are shut down, then Ray if
    it was started here: a failed run must not leave actors holding the engine's memory, and
    a caller's own Ray session stays the caller's. `identity`: see RayTrainer."""
    import ray

    from agent_rl.training.ray_workers import check_cluster, init_ray

    started = init_ray(cfg.trainer.ray_address)
    trainer = None
    try:
        check_cluster(cfg)  # trainer.nnodes against the cluster's nodes, before the engine starts
        trainer = RayTrainer(cfg, run_dir, retriever, identity)
        yield trainer
    finally:
        try:
            if trainer is not None:
                trainer.shutdown()
        finally:
            if started:
                ray.shutdown()


# ----------------------------------------------------------------------------- helpers
def finished_run(cfg: TrainConfig) -> str | None:
    """Why the run that `cfg` would resume has nothing left to do (its latest checkpoint has
    spent trainer.max_time_s or reached trainer.total_training_steps), or None. Read from the
    checkpoint's trainer_state.json alone, so a finished run is known before Ray and the
    engine start."""
    trainer_cfg = cfg.trainer
    path = resume_checkpoint(trainer_cfg, CheckpointManager(Path(trainer_cfg.default_local_dir) / "checkpoints"))
    if path is None or not (path / STATE).is_file():
        return None
    reason = finished_reason(CheckpointManager.read_state(path), trainer_cfg, trainer_cfg.total_training_steps)
    return None if reason is None else f"{path}: {reason} (another step would end past it)"


def actor_settings(cfg: TrainConfig) -> ActorRolloutRefConfig:
    """cfg.actor_rollout_ref with the policy loss the run trains with: the estimator's own where
    it was registered with one (rejection_sampling: rft), else actor.policy_loss."""
    arr = cfg.actor_rollout_ref
    loss = algos.policy_loss_for(cfg.algorithm.adv_estimator, arr.actor.policy_loss)
    return dataclasses.replace(arr, actor=dataclasses.replace(arr.actor, policy_loss=loss))
