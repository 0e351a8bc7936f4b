"""`agent-rl-train --config configs/train/X.yaml key=value ...`: RL training (GRPO / PPO / ...).

Loads the config (YAML, then dotted overrides with veRL names), waits for the retriever's
/health, starts a local Ray cluster (or joins one: `trainer.ray_address=auto` or `<head>:<port>`;
`trainer.nnodes` more nodes than it has is refused in one line), and runs
`RayTrainer.fit()` under a progress bar with ETA. Resumes from the run's latest checkpoint
unless `trainer.resume_mode=disable` (which moves an earlier run aside); a run whose checkpoint
has already spent its budget (trainer.max_time_s, trainer.total_training_steps) returns before
anything starts, and one whose checkpoint was saved under other settings (rollout.n,
trainer.mode, the model or its tokenizer) is refused in one line. Ctrl-C stops cleanly (actors
and Ray shut down); the last checkpoint stays usable, as after a save refused for disk space.

    agent-rl-train --config configs/train/demo_grpo_cpu.yaml trainer.total_training_steps=5
    python -m agent_rl.training.cli --config ... (same)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from agent_rl.config import ConfigError, TrainConfig, check_paths, load_config


def wait_for_retriever(rcfg, timeout_s: float) -> None:
    """Block until a retriever of `rcfg.url` answers /health and accepts the API key (or raise
    naming the URLs: RetrieverUnavailable, RetrieverAuthError, ApiKeyFileError)."""
    from agent_rl.rollout.retrieval_client import RetrieverClient

    urls = list(rcfg.url)

    async def wait() -> None:
        client = RetrieverClient.from_config(rcfg)
        try:
            await client.wait_healthy(timeout_s)
        finally:
            await client.aclose()

    t0 = time.time()
    print(f"[train] waiting for the retriever at {', '.join(urls)} (up to {timeout_s:.0f}s)", flush=True)
    asyncio.run(wait())
    print(f"[train] retriever healthy after {time.time() - t0:.1f}s", flush=True)


def check_registered(cfg: TrainConfig) -> None:
    """The algorithm names resolve in agent_rl.training.algos' registries (users may register more)."""
    from agent_rl.training import algos

    problems = [f"{key}={name!r} is not one of {', '.join(registry.names())}"
                for key, name, registry in (("algorithm.adv_estimator", cfg.algorithm.adv_estimator, algos.ADV_ESTIMATORS),
                                            ("actor_rollout_ref.actor.policy_loss",
                                             cfg.actor_rollout_ref.actor.policy_loss, algos.POLICY_LOSSES))
                if name not in registry.names()]
    if not problems:
        try:  # an estimator that brings its own policy loss (rejection_sampling: rft) and another one set
            algos.policy_loss_for(cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.actor.policy_loss)
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="agent-rl-train", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=None, help="YAML config (configs/train/*.yaml); defaults otherwise")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor_rollout_ref.actor.optim.lr=1e-6")
    ap.add_argument("--no-wait-retriever", action="store_true", help="do not wait for the retriever's /health")
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()

    from agent_rl.training.identity import check_resume, train_identity
    from agent_rl.training.ray_workers import check_nnodes
    from agent_rl.training.trainer import finished_run

    try:  # every bad setting in one line, before the retriever, Ray and the engine
        cfg = load_config(TrainConfig, args.config, args.overrides)
        done = finished_run(cfg)
        if done:  # a re-run of a finished run returns at once (its data need not be there any more)
            print(f"[train] nothing to do: {done}; raise the budget to train on", flush=True)
            return 0
        check_paths(cfg)
        check_registered(cfg)
        check_nnodes(cfg)  # workers that do not fill trainer.nnodes alike (the cluster is checked once joined)
        identity = train_identity(cfg)
        check_resume(cfg, identity)  # a checkpoint of other settings, a damaged rollouts.json (once: passed on)
    except (OSError, ValueError) as e:
        print(f"agent-rl-train: error: {e}", file=sys.stderr)
        return 2
    from agent_rl.precision import announce_run
    from agent_rl.training import algos

    announce_run(cfg, critic=algos.needs_critic(cfg.algorithm.adv_estimator))
    if not args.no_wait_retriever:
        from agent_rl.rollout.retrieval_client import ApiKeyFileError, RetrieverAuthError

        try:
            wait_for_retriever(cfg.retriever, cfg.trainer.retriever_health_timeout_s)
        except (RetrieverAuthError, ApiKeyFileError) as e:  # one line, before Ray and the engine start
            print(f"agent-rl-train: error: {e}", file=sys.stderr)
            return 2

    from tqdm import tqdm

    from agent_rl.training.checkpoint import NoSpaceForCheckpoint
    from agent_rl.training.data import TrainDataError
    from agent_rl.training.ray_workers import ClusterTooSmall
    from agent_rl.training.trainer import ray_trainer

    trainer = None
    try:
        with ray_trainer(cfg, identity=identity) as trainer, tqdm(total=trainer.run.expected_steps(), initial=trainer.step,
                                                desc="train", unit="step", dynamic_ncols=True) as bar:
            def on_step(step, metrics):
                bar.total = trainer.run.expected_steps()  # the clock's estimate, once steps are timed
                bar.update(step - bar.n)

            trainer.fit(on_step=on_step)
        print(f"[train] done: {trainer.run_dir}", flush=True)
        return 0
    except KeyboardInterrupt:  # the workers and Ray are down by now
        latest = trainer.run.checkpoints.latest() if trainer is not None else None
        print(f"\n[train] interrupted; last checkpoint: {latest or 'none'} (rerun the same command to resume)", flush=True)
        return 130
    except (ClusterTooSmall, TrainDataError) as e:  # the cluster too small, data that make no batch: before the engine
        print(f"agent-rl-train: error: {e}", file=sys.stderr)
        return 2
    except NoSpaceForCheckpoint as e:  # the message says what to free and that the last checkpoint is intact
        print(f"agent-rl-train: error: {e.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # vLLM starts worker processes with spawn: guard the entry point
    sys.exit(main())
