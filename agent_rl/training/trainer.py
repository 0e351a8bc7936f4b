"""The RL driver: `RayTrainer.fit()` runs GRPO / PPO / RLOO / REINFORCE++ steps, top to bottom.

One step: prompts -> rollout (n samples each; optional group filtering with over-sampling)
-> outcome reward -> old / reference log-probs and values -> advantages -> critic and actor
updates -> weight sync into the engine -> metrics -> checkpoint. Branching lives in the
helpers; `fit()` only reads in order.

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
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from agent_rl.config import ActorRolloutRefConfig, TrainConfig, to_dict
from agent_rl.training import algos
from agent_rl.training.batch import TokenBatch
from agent_rl.training.checkpoint import STATE, CheckpointManager
from agent_rl.training.data import Prompt, PromptLoader, drop_overlong, load_prompts
from agent_rl.training.groups import GroupRules, Tally, batch_of, group_trajectories, score_trajectories, sift
from agent_rl.training.identity import N, problems, saved_identity, train_identity
from agent_rl.training.metrics import MetricsLogger, RisingRate, reward_metrics, write_validation
from agent_rl.training.rollout_data import RolloutDataWriter
from agent_rl.training.run import Run, finished_reason, resume_checkpoint
from agent_rl.types import Trajectory

if TYPE_CHECKING:
    from agent_rl.training.collect import AheadCollector

log = logging.getLogger(__name__)

ROLLOUTS = "rollouts.json"
"""In an ahead mode's checkpoint: the groups submitted and not trained (agent_rl.training.collect)."""

OUTAGE_ATTEMPTS = 3
"""Collections of one step, each after a wait for the retriever's /health, before giving up."""


class StepTimer:
    """`with timer("gen"): ...` accumulates seconds per name; `.metrics()` -> timing/*."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.seconds.items()}


class RayTrainer:
    """Owns the workers, the data stream, checkpoints and metrics of one run."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path | None = None, retriever=None):
        """`retriever`: optional in-process `async search(queries, topk)` object instead of
        the HTTP client for `retriever.url` (tests without a server)."""
        from agent_rl.training.ray_workers import WorkerGroup, make_rollout_worker
        from agent_rl.training.weight_sync import WeightSync
        from agent_rl.training.workers.actor import ActorWorker

        self.cfg = cfg
        self.run_dir = Path(run_dir or cfg.trainer.default_local_dir)
        identity = train_identity(cfg)
        check_resume(cfg, identity, self.run_dir)  # agent-rl-train checked before the retriever and Ray
        self.loader = PromptLoader(load_train_prompts(cfg), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed,
                                   balanced=cfg.data.balance_by is not None)
        self.total_steps = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * self.loader.steps_per_epoch
        self.run = Run(cfg.trainer, self.run_dir, self.total_steps, "train", identity, run_inputs(cfg))
        resume_from = self.run.start()  # before the workers start: a refused move aside costs nothing
        self.checkpoints = self.run.checkpoints
        self.invalid_watch = RisingRate("rollout/invalid_action_rate")
        self.adv_fn = algos.get_adv_estimator(cfg.algorithm.adv_estimator)
        self.rollout_data = RolloutDataWriter(cfg)
        GroupRules.from_config(cfg)  # checks algorithm.filter_metric before the engine starts
        self.kl_ctrl = algos.make_kl_controller(cfg.algorithm.kl_ctrl)
        self.use_critic = algos.needs_critic(cfg.algorithm.adv_estimator)
        self.use_ref = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        torch.manual_seed(cfg.data.seed)

        self.rollout = make_rollout_worker(cfg, retriever)
        n_workers = cfg.trainer.num_actor_workers
        actor_factory = functools.partial(ActorWorker, actor_settings(cfg), self.total_steps)
        self.actor = WorkerGroup(cfg, actor_factory, n_workers)
        self.critic = None
        if self.use_critic:
            from agent_rl.training.workers.critic import CriticWorker

            self.critic = WorkerGroup(cfg, functools.partial(CriticWorker, cfg, self.total_steps), n_workers, "critic")
        self.sync = WeightSync(self.actor, self.rollout, "cuda_ipc" if cfg.trainer.n_gpus_per_node > 0 else "object_store")
        self.collector = self._collector(cfg)
        self._maybe_resume(resume_from)
        self.metrics = MetricsLogger(
            self.run_dir,
            cfg.trainer.logger,
            to_dict(cfg),
            cfg.trainer.project_name,
            cfg.trainer.experiment_name,
            resume_step=self.step,
        )

    def _collector(self, cfg: TrainConfig) -> SyncCollector | AheadCollector:
        """The one place the loop reads trainer.mode: sync generates each step's groups when the
        step asks; one_step_off | async submit them ahead of the trainer. Both run the outage
        rule on what they collect (the groups generating wait for a retriever that is down)."""
        if cfg.trainer.mode == "sync":
            return SyncCollector(self.rollout, self.loader, cfg, self._outage_rule)
        from agent_rl.training.collect import AheadCollector

        return AheadCollector(self.rollout, self.loader, cfg, self.total_steps, outage=self._outage_rule)

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
                batch = TokenBatch.from_trajectories(trajs)
                mask = batch.mask(cfg.actor_rollout_ref.actor.state_masking)
                # 2. log-probs of the policy that sampled (recomputed), the reference, values
                if self._needs_old_log_probs(len(batch)):
                    with t("old_log_prob"):
                        batch = batch.with_fields(old_logprobs=self.actor.per_token("compute_log_probs", batch))
                if self.use_ref:
                    with t("ref"):
                        batch = batch.with_fields(ref_logprobs=self.actor.per_token("compute_ref_log_probs", batch))
                if self.critic is not None:
                    with t("values"):
                        batch = batch.with_fields(values=self.critic.per_token("compute_values", batch))
                # 3. advantages (outcome reward on the last sampled token, optional KL in reward)
                with t("adv"):
                    batch, adv_metrics = self._advantages(batch, mask)
                # 4. updates, then push the new policy into the engine
                if self.critic is not None:
                    with t("update_critic"):
                        metrics.update(self.critic.update("update_critic", batch))
                with t("update_actor"):
                    metrics.update(self.actor.update("update_policy", batch))
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
        return self.cfg.algorithm.use_kl_in_reward or self.actor.rank0("needs_old_log_probs", num_sequences)

    def _outage_rule(self, metrics: dict[str, float], t: StepTimer) -> list[str]:
        """The outage rule per tool on a collection's metrics: tools failing in more than
        retriever.outage_share of their calls are named (their trajectories were left out with
        retriever.skip_failed_searches); when that many trajectories had a failed search, wait
        for the retriever's /health (only the retriever has one). Returns the tools down."""
        import ray

        r = self.cfg.retriever
        shares = tool_error_shares(metrics)
        metrics.update({f"tool/{name}/error_share": v for name, v in shares.items()})
        down = sorted(name for name, v in shares.items() if v > r.outage_share)
        for name in down:
            if name != "search":
                log.warning("step %d: tool %s failed in %.0f%% of its calls (> retriever.outage_share=%g); its "
                            "trajectories are left out", self.step, name, 100 * shares[name], r.outage_share)
        if metrics.get("rollout/failed_search_share", 0.0) > r.outage_share and ("search" in down or not shares):
            log.warning("step %d: %.0f%% of the trajectories had a failed search; waiting up to %.0f s for "
                        "the retriever's /health", self.step, 100 * metrics["rollout/failed_search_share"],
                        r.outage_wait_s)
            with t("retriever_wait"):
                ray.get(self.rollout.wait_retriever.remote(r.outage_wait_s))
        return down

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
            self.actor.call_all("save", str(d / "actor"))
            if self.critic is not None:
                self.critic.call_all("save", str(d / "critic"))
            rollouts = self.collector.state()  # ahead modes: the groups not trained yet, with their trajectories in flight
            if rollouts is not None:
                (d / ROLLOUTS).write_text(json.dumps(rollouts))

        expected = self.actor.rank0("state_bytes") + (self.critic.rank0("state_bytes") if self.critic else 0)
        return self.run.save({"data": self.loader.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict()},
                             to_dict(self.cfg), save_workers, expected)

    def _maybe_resume(self, path: Path | None) -> None:
        if path is None:
            return
        state = self.run.restore(path)
        self.actor.call_all("load", str(path / "actor"))
        if self.critic is not None:
            self.critic.call_all("load", str(path / "critic"))
        self.loader.load_state_dict(state["data"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.sync.push(self.step)  # the engine started from the base model
        if (path / ROLLOUTS).is_file():
            from agent_rl.training.collect import read_rollouts

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
def ray_trainer(cfg: TrainConfig, run_dir: str | Path | None = None, retriever: Any = None) -> Iterator[RayTrainer]:
    """`with ray_trainer(cfg) as trainer: trainer.fit()`: a RayTrainer in a Ray session. Ray
    is started (or joined: trainer.ray_address) unless this process is connected already. On
    any exit, an error and Ctrl-C included, the trainer's workers are shut down, then Ray if
    it was started here: a failed run must not leave actors holding the engine's memory, and
    a caller's own Ray session stays the caller's."""
    import ray

    from agent_rl.training.ray_workers import init_ray

    started = init_ray(cfg.trainer.ray_address)
    trainer = None
    try:
        trainer = RayTrainer(cfg, run_dir, retriever)
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
    tr = cfg.trainer
    path = resume_checkpoint(tr, CheckpointManager(Path(tr.default_local_dir) / "checkpoints"))
    if path is None or not (path / STATE).is_file():
        return None
    reason = finished_reason(CheckpointManager.read_state(path), tr, tr.total_training_steps)
    return None if reason is None else f"{path}: {reason} (another step would end past it)"


class ResumeMismatch(ValueError):
    """The checkpoint a run would resume was saved under settings its state depends on that
    the config changed (agent_rl.training.identity)."""


def check_resume(cfg: TrainConfig, identity: dict | None = None, run_dir: str | Path | None = None) -> None:
    """Raise, in one line, when the checkpoint `cfg` would resume (in `run_dir`, default
    trainer.default_local_dir) cannot continue under `cfg`: ResumeMismatch naming each setting
    that differs from the checkpoint's (rollout.n, trainer.mode, the model, its tokenizer, the
    train files' content, the settings that make a batch: agent_rl.training.identity;
    train_identity(cfg) unless `identity` is given), or a ValueError naming the file and field
    of a bad rollouts.json. agent-rl-train calls it before the retriever, Ray and the engine
    start; RayTrainer again (runs started in-process)."""
    from agent_rl.training.collect import read_rollouts

    tr = cfg.trainer
    path = resume_checkpoint(tr, CheckpointManager(Path(run_dir or tr.default_local_dir) / "checkpoints"))
    if path is None or not (path / STATE).is_file():
        return
    saved = saved_identity(path)
    current = identity if identity is not None else train_identity(cfg)
    n = saved.get(N) or current[N]
    groups = read_rollouts(path / ROLLOUTS, n)["groups"] if (path / ROLLOUTS).is_file() else []
    found = problems(saved, current, cfg.actor_rollout_ref.model.path, len(groups))
    if found:
        raise ResumeMismatch(f"cannot resume {path}: {'; '.join(found)}. Resume with the checkpoint's settings, or "
                             f"start a new run (another trainer.default_local_dir, or trainer.resume_mode=disable, "
                             f"which moves this run aside)")


def run_inputs(cfg: TrainConfig) -> dict[str, str]:
    """The paths an RL run reads (config key -> path): a new run never moves them aside."""
    d = cfg.data
    paths = {"actor_rollout_ref.model.path": cfg.actor_rollout_ref.model.path, "critic.model_path": cfg.critic.model_path}
    paths.update({f"data.train_files[{i}]": f for i, f in enumerate(d.train_files)})
    paths.update({f"data.val_files[{i}]": f for i, f in enumerate(d.val_files)})
    return {k: v for k, v in paths.items() if v}


def load_train_prompts(cfg: TrainConfig) -> list[Prompt]:
    """Training prompts without those longer than data.max_prompt_length tokens, measured
    with the rollout's own prompt template and tokenizer."""
    from transformers import AutoTokenizer

    from agent_rl.rollout.protocol import protocol_for

    tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    rcfg = cfg.actor_rollout_ref.rollout
    protocol = protocol_for(rcfg, tok)  # MCP tools' schemas are not known here: built-ins only
    prompts = load_prompts(cfg.data.train_files, cfg.data.train_data_num, balance_by=cfg.data.balance_by)
    return drop_overlong(prompts, lambda p: len(protocol.prompt_ids(tok, p.question, rcfg.template)), cfg.data.max_prompt_length)


class SyncCollector:
    """trainer.mode=sync: each step generates its own groups when it asks for them
    (`collect_groups`). When every trajectory was left out for a failed search, it waits for
    the retriever (`outage`: the trainer's outage rule) and collects again, up to
    OUTAGE_ATTEMPTS times. The interface is `AheadCollector`'s, so `fit()` reads the same in
    every mode."""

    def __init__(self, worker: Any, loader: PromptLoader, cfg: TrainConfig,
                 outage: Callable[[dict[str, float], StepTimer], list[str]]) -> None:
        self.worker, self.loader, self.cfg, self.outage = worker, loader, cfg, outage

    def collect(self, step: int, t: StepTimer) -> tuple[list[Trajectory], list[str], dict[str, float]]:
        import ray

        cfg, a = self.cfg, self.cfg.algorithm

        def rollout(prompts: list[Prompt]) -> tuple[list[Trajectory], dict[str, float]]:
            return ray.get(self.worker.rollout.remote(prompts, cfg.actor_rollout_ref.rollout.n))

        drop = GroupRules.from_config(cfg).drop_failed
        consumed: list[str] = []
        lost = dict.fromkeys(("rollout/failed_search_trajectories", "rollout/dropped_for_failed_search"), 0.0)
        for attempt in range(1, OUTAGE_ATTEMPTS + 1):
            trajs, ids, metrics = collect_groups(self.loader, rollout, cfg.reward, cfg.data.train_batch_size,
                                                 a.filter_groups, a.max_filter_rounds if a.filter_groups else 0, t,
                                                 drop_failed=drop, filter_metric=a.filter_metric)
            consumed += ids
            for k in lost:  # counted over every collection of the step, the failed ones too
                lost[k] += metrics.get(k, 0.0)
            down = self.outage(metrics, t)
            if trajs:
                if drop:
                    metrics.update(lost)
                metrics["rollout/collect_attempts"] = float(attempt)
                return trajs, consumed, metrics
        raise RuntimeError(f"step {step}: every trajectory of {OUTAGE_ATTEMPTS} collections had a failed tool "
                           f"call (tools failing in more than retriever.outage_share of their calls: "
                           f"{', '.join(down) or 'none'}; the retriever answered /health in between: {cfg.retriever.url})")

    def before_push(self, t: StepTimer) -> None:
        """Nothing generates during the update: the weights can go at once."""

    def state(self) -> None:
        """Nothing is in flight between steps: a checkpoint keeps no rollouts."""

    def restore(self, state: dict) -> None:
        """check_resume refused a checkpoint with prompts in flight; one without has nothing to continue."""


def collect_groups(
    loader: PromptLoader,
    rollout: Callable[[list[Prompt]], tuple[list[Trajectory], dict[str, float]]],
    reward_cfg,
    want: int,
    filter_on: bool,
    max_extra_rounds: int,
    t: StepTimer,
    drop_failed: str | None = None,
    filter_metric: str = "score",
) -> tuple[list[Trajectory], list[str], dict[str, float]]:
    """Rollout and score `want` prompts (one group of n samples each); each round's groups go
    through `groups.sift` (`drop_failed` "group" | "trajectory" | None: the failed-search
    rule; with `filter_on`, groups whose `filter_metric` ("score": the reward, "acc": the task
    metric alone) agrees carry no signal and are dropped, DAPO dynamic sampling). While fewer
    than `want` groups are kept, extra prompts are drawn, sized by the keep rate so far (4x the
    batch while none is kept), for up to `max_extra_rounds` rounds. Returns (trajectories with
    group ids 0..G-1, ids of every prompt consumed, rollout/* reward/* filter/* metrics of the
    first round, failure counts (tool_failures, rejected_queries, `groups.Tally`'s) over every
    round, and batch/groups/<data_source>: the kept groups per source); no trajectories when
    every one was left out for a failed search."""
    rules = GroupRules(filter_on, filter_metric, drop_failed)
    kept: list[list[Trajectory]] = []
    consumed: list[str] = []
    metrics: dict[str, float] = {}
    tools = dict.fromkeys(("rollout/tool_failures", "rollout/rejected_queries"), 0.0)
    tally = Tally()
    prompts = loader.next_batch()
    for round_ in range(1 + max_extra_rounds):
        consumed += [p.id for p in prompts]
        with t("gen"):
            trajs, gen_metrics = rollout(prompts)
        groups = group_trajectories(trajs)
        with t("reward"):
            results = score_trajectories([tr for g in groups for tr in g], prompts, reward_cfg)
        sifted = sift(groups, results, rules)
        if round_ == 0:
            metrics.update(gen_metrics)
            metrics.update(reward_metrics(results, reward_cfg.kind))
            metrics.update(sifted.filter_metrics)
        for k in tools:
            tools[k] += gen_metrics.get(k, 0.0)
        tally.add(sifted.tally)
        kept += sifted.kept[: want - len(kept)]
        if len(kept) >= want or not filter_on:
            break
        rate = len(kept) / len(consumed)  # over-sample by the keep rate so far; none kept yet: the most
        prompts = loader.take(4 * want if rate == 0 else min(math.ceil((want - len(kept)) / rate), 4 * want))
    metrics.update(tools)  # every round's, not the first one's alone
    metrics.update(tally.metrics(rules))
    if filter_on:
        metrics["filter/rounds"] = float(round_ + 1)
        metrics["filter/batch_groups"] = float(len(kept))
    trajs, per_source = batch_of(kept)
    metrics.update(per_source)
    if not kept and tally.failed > 0:
        return [], consumed, metrics  # the caller waits for the retriever and collects again
    if not kept:
        raise RuntimeError(
            f"every group's {'rewards' if filter_metric == 'score' else reward_cfg.kind} agreed in {round_ + 1} "
            "round(s): nothing to learn from (raise algorithm.max_filter_rounds or disable algorithm.filter_groups)"
        )
    return trajs, consumed, metrics


def tool_error_shares(metrics: dict[str, float]) -> dict[str, float]:
    """errors / calls of each tool called in a rollout (from its `tool/<name>/*` metrics)."""
    out = {}
    for key, calls in metrics.items():
        if key.startswith("tool/") and key.endswith("/calls") and calls > 0:
            name = key[len("tool/"):-len("/calls")]
            out[name] = metrics.get(f"tool/{name}/errors", 0.0) / calls
    return out


def actor_settings(cfg: TrainConfig) -> ActorRolloutRefConfig:
    """cfg.actor_rollout_ref with the policy loss the run trains with: the estimator's own where
    it was registered with one (rejection_sampling: rft), else actor.policy_loss."""
    arr = cfg.actor_rollout_ref
    loss = algos.policy_loss_for(cfg.algorithm.adv_estimator, arr.actor.policy_loss)
    return dataclasses.replace(arr, actor=dataclasses.replace(arr.actor, policy_loss=loss))


def batch_metrics(batch: TokenBatch, mask: torch.Tensor) -> dict[str, float]:
    """Data statistics of the trained batch (veRL's compute_data_metrics, our names)."""
    m = mask.bool()
    adv = batch.advantages[m]
    out = {
        "batch/num_sequences": float(len(batch)),
        "batch/num_tokens": float(batch.num_tokens),
        "batch/sampled_tokens": float(m.sum()),
        "batch/response_length": batch.response_lens.float().mean().item(),
        "adv/mean": adv.mean().item() if adv.numel() else 0.0,
        "adv/abs_max": adv.abs().max().item() if adv.numel() else 0.0,
        # sequences with a nonzero advantage (the others add no policy gradient): rejection sampling's kept share
        "adv/nonzero_frac": (torch.where(m, batch.advantages, 0.0) != 0).any(dim=1).float().mean().item(),
    }
    if batch.old_logprobs is not None and m.any():  # bf16 engine vs trainer: what TIS corrects
        out["rollout/logprob_abs_diff"] = (batch.old_logprobs - batch.rollout_logprobs)[m].abs().mean().item()
    if batch.values is not None:
        out["critic/values_mean"] = batch.values[m].mean().item()
        out["critic/returns_mean"] = batch.returns[m].mean().item()
    return out
