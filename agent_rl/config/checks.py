"""What a loaded config must satisfy, checked once at load (`load_config` calls
`check_settings`): the allowed values of each choice (CHOICES), the ranges of numbers (RANGES:
every timeout and reward term has one), every float setting finite, cross-checks between
settings, the tools, an in-reward KL penalty the estimator must not see (`kl_in_reward_problems`);
and `check_paths` for the commands that need their files before any work."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_prep.hardware import switch_word

KL_KINDS = ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
STRATEGIES = ("auto", "fsdp", "replicas")
ON_OFF_AUTO = ("auto", "true", "false")
WARMUP_STYLES = ("constant", "cosine")
LOAD_FORMATS = ("auto", "dummy")
# Fixed sets (tests/agent_rl/test_config.py checks them against the code that uses them); the
# registered algorithms (adv_estimator, policy_loss: users may register more) are checked by
# agent-rl-train against agent_rl.training.algos before anything starts.
CHOICES: dict[str, tuple] = {
    "actor_rollout_ref.actor.kl_loss_type": KL_KINDS,
    "algorithm.kl_penalty": KL_KINDS,
    "actor_rollout_ref.actor.loss_agg_mode": AGG_MODES,
    "critic.loss_agg_mode": AGG_MODES,
    "actor_rollout_ref.actor.strategy": STRATEGIES,
    "critic.strategy": STRATEGIES,
    "actor_rollout_ref.actor.bf16_autocast": ON_OFF_AUTO,
    "critic.bf16_autocast": ON_OFF_AUTO,
    "actor_rollout_ref.rollout.name": ("vllm",),
    "actor_rollout_ref.rollout.dtype": ("auto", "bfloat16", "float32", "float16"),
    "actor_rollout_ref.rollout.engine_mode": ("inproc", "mp", "hf"),
    "actor_rollout_ref.rollout.protocol": ("search_r1", "hermes"),
    "actor_rollout_ref.rollout.tool_chat_template": ("auto", "model", "fallback"),
    "actor_rollout_ref.model.dtype": ("float32", "bfloat16", "float16"),
    "actor_rollout_ref.model.load_format": LOAD_FORMATS,
    "actor_rollout_ref.rollout.load_format": LOAD_FORMATS,
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "algorithm.filter_metric": ("score", "acc"),
    "reward.kind": ("em", "subem", "f1"), "reward.normalize": ("unicode", "squad"),
    "trainer.resume_mode": ("auto", "disable"),
    "trainer.max_time_counts": ("steps", "all"),
    "trainer.mode": ("sync", "one_step_off", "async"),
    "trainer.staleness_policy": ("wait", "drop"),
    "actor_rollout_ref.actor.optim.warmup_style": WARMUP_STYLES,
    "critic.optim.warmup_style": WARMUP_STYLES,
}
SINKS = ("console", "tensorboard", "jsonl", "wandb")
# (low, high, low inclusive): None is open
RANGES: dict[str, tuple] = {
    "data.train_batch_size": (1, None, True), "data.val_batch_size": (1, None, True),
    "data.max_prompt_length": (1, None, True), "data.max_response_length": (1, None, True),
    "data.max_obs_length": (0, None, True), "data.max_length": (1, None, True),
    "actor_rollout_ref.rollout.n": (1, None, True), "actor_rollout_ref.rollout.temperature": (0, None, False),
    "actor_rollout_ref.rollout.top_p": (0, 1, False), "actor_rollout_ref.rollout.max_tokens_per_turn": (1, None, True),
    "actor_rollout_ref.rollout.max_concurrent_trajectories": (1, None, True),
    "actor_rollout_ref.rollout.max_concurrent_tool_calls": (1, None, True),
    "actor_rollout_ref.rollout.gpu_memory_utilization": (0, 1, False),
    "actor_rollout_ref.actor.optim.lr": (0, None, True), "critic.optim.lr": (0, None, True),
    "actor_rollout_ref.actor.optim.min_lr_ratio": (0, 1, True), "critic.optim.min_lr_ratio": (0, 1, True),
    "actor_rollout_ref.actor.optim.num_cycles": (0, None, False), "critic.optim.num_cycles": (0, None, False),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (1, None, True),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (1, None, True),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (1, None, True),
    "actor_rollout_ref.actor.ppo_epochs": (1, None, True), "critic.ppo_epochs": (1, None, True),
    "actor_rollout_ref.actor.clip_ratio": (0, None, False), "actor_rollout_ref.actor.clip_ratio_c": (1, None, False),
    "actor_rollout_ref.actor.top_entropy_quantile": (0, 1, False),  # 0 would keep no token
    "actor_rollout_ref.actor.grad_clip": (0, None, False), "critic.grad_clip": (0, None, False),
    "algorithm.gamma": (0, 1, True), "algorithm.lam": (0, 1, True), "algorithm.max_filter_rounds": (0, None, True),
    "algorithm.rft_min_acc": (0, 1, False),  # 0 would keep every trajectory, answered or not
    "retriever.topk": (1, None, True), "retriever.timeout_s": (0, None, False), "retriever.max_retries": (0, None, True),
    "retriever.outage_share": (0, 1, True), "max_turns": (0, None, True),
    "trainer.total_epochs": (1, None, True), "trainer.nnodes": (1, None, True),
    "trainer.num_actor_workers": (1, None, True), "trainer.n_gpus_per_node": (0, None, True),
    "trainer.torch_threads": (0, None, True), "trainer.log_freq": (1, None, True),
    "trainer.max_staleness": (1, None, True),
    "trainer.rollout_data_freq": (1, None, True), "trainer.rollout_data_n": (1, None, True),
    # every timeout and wait (0: a call that always times out; a wait of 0 gives up at once)
    "actor_rollout_ref.rollout.tool_timeout_s": (0, None, False), "retriever.outage_wait_s": (0, None, True),
    "trainer.retriever_health_timeout_s": (0, None, True), "trainer.max_time_s": (0, None, True),
    # every reward term: Search-R1's scores lie in [0, 1], and a search cost above 1 would make a
    # right answer worth less than a wrong one
    "reward.format_score": (0, 1, True), "reward.structure_format_score": (0, 1, True),
    "reward.final_format_score": (0, 1, True), "reward.retrieval_score": (0, 1, True),
    "reward.search_cost": (0, 1, True),
}


class ConfigError(ValueError):
    """Settings out of their allowed values, found when the config loads (every one listed)."""


def _get(cfg: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cfg) or not hasattr(cfg, part):
            return False, None
        cfg = getattr(cfg, part)
    return True, cfg


def _settings(cfg: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every setting of the config `cfg`, list items and tool entries
    included (`actor_rollout_ref.actor.optim.betas[1]`, `actor_rollout_ref.rollout.tools[0].timeout_s`)."""
    if not dataclasses.is_dataclass(cfg):
        return
    for f in dataclasses.fields(cfg):
        key, value = f"{prefix}{f.name}", getattr(cfg, f.name)
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
        for k, v in items:
            if dataclasses.is_dataclass(v):
                yield from _settings(v, k + ".")
            else:
                yield k, v


def check_settings(cfg: Any) -> None:
    """Raise ConfigError naming every setting with a value outside its allowed set or range
    (CHOICES, RANGES, trainer.logger's sinks), or a number that is NaN or infinite, before
    anything is started."""
    # NaN passes every comparison-based range check (each comparison is false) and inf every
    # open one: lr=nan or search_cost=inf made the rewards or the weights nan. Every float
    # setting, ranged or not, must be finite.
    non_finite = {key: value for key, value in _settings(cfg) if isinstance(value, float) and not math.isfinite(value)}
    problems = [f"{key}={value!r} is not a finite number" for key, value in non_finite.items()]
    for key, allowed in CHOICES.items():
        found, value = _get(cfg, key)
        # true/false/auto switches are read as data_prep.hardware reads them (YAML's True, "False", 1)
        shown = switch_word(value) if allowed is ON_OFF_AUTO else value
        if found and shown not in allowed:
            problems.append(f"{key}={value!r} is not one of {', '.join(map(str, allowed))}")
    for key, (lo, hi, lo_inclusive) in RANGES.items():
        found, value = _get(cfg, key)
        if not found or value is None or key in non_finite:
            continue
        # written as "inside" so that a value no comparison holds for (NaN) is outside
        inside = (lo is None or (value >= lo if lo_inclusive else value > lo)) and (hi is None or value <= hi)
        if not inside:
            left, right = "[" if lo_inclusive else "(", "]"
            problems.append(f"{key}={value!r} is out of range {left}{lo}, {'inf' if hi is None else hi}{right}")
    found, sinks = _get(cfg, "trainer.logger")
    if found and set(sinks) - set(SINKS):
        problems.append(f"trainer.logger has unknown sink(s) {sorted(set(sinks) - set(SINKS))}; allowed: {', '.join(SINKS)}")
    problems += tool_problems(cfg)
    found, mode = _get(cfg, "trainer.mode")
    if found and mode in ("one_step_off", "async") and _get(cfg, "actor_rollout_ref.actor.tis_cap")[1] is None:
        problems.append(f"trainer.mode={mode} needs actor_rollout_ref.actor.tis_cap (e.g. 2.0): the loss reweights "
                        "tokens sampled by an older policy version with it")
    found, rollout_load = _get(cfg, "actor_rollout_ref.rollout.load_format")
    if found and _get(cfg, "actor_rollout_ref.model.load_format")[1] == "dummy" != rollout_load:
        problems.append("actor_rollout_ref.model.load_format=dummy needs actor_rollout_ref.rollout.load_format=dummy: "
                        "the engine would look for weights the directory does not hold")
    problems += kl_in_reward_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))


def kl_in_reward_problems(cfg: Any) -> list[str]:
    """algorithm.use_kl_in_reward beside an estimator registered to read its outcome unchanged
    (rejection_sampling's keep test: outcome >= rft_min_acc). The registry says which, so the
    algorithms are imported here, and only when the penalty is on; an unknown estimator is
    agent-rl-train's check_registered's to report."""
    found, on = _get(cfg, "algorithm.use_kl_in_reward")
    estimator = _get(cfg, "algorithm.adv_estimator")[1]
    if not found or not on:
        return []
    from agent_rl.training import algos

    if estimator not in algos.ADV_ESTIMATORS.names():
        return []
    try:
        algos.check_kl_in_reward(estimator, True)
    except ValueError as e:
        return [str(e)]
    return []


BUILTIN_TOOLS = ("search", "calculator")


def tool_problems(cfg: Any) -> list[str]:
    """What is wrong with `actor_rollout_ref.rollout.tools` (names, MCP fields, the protocol's tools)."""
    found, rcfg = _get(cfg, "actor_rollout_ref.rollout")
    if not found or not hasattr(rcfg, "tools"):
        return []
    problems, names = [], []
    for i, t in enumerate(rcfg.tools):
        key = f"actor_rollout_ref.rollout.tools[{i}]"
        if t.mcp_command is not None and t.mcp_url is not None:
            problems.append(f"{key}: give mcp_command or mcp_url, not both")
        elif not t.is_mcp and t.name not in BUILTIN_TOOLS:
            problems.append(f"{key}.name={t.name!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}); "
                            f"an MCP server needs mcp_command or mcp_url")
        elif not t.is_mcp and t.include is not None:
            problems.append(f"{key}.include is for MCP servers only")
        if t.timeout_s is not None and t.timeout_s <= 0:  # NaN and inf: check_settings' finite check
            problems.append(f"{key}.timeout_s={t.timeout_s!r} is out of range (0, inf]")
        if t.max_concurrency is not None and t.max_concurrency < 1:
            problems.append(f"{key}.max_concurrency={t.max_concurrency!r} is out of range [1, inf]")
        names.append(t.name)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"actor_rollout_ref.rollout.tools names {dup} more than once")
    if rcfg.protocol == "search_r1" and (set(names) - {"search"} or any(t.is_mcp for t in rcfg.tools)):
        problems.append("actor_rollout_ref.rollout.protocol=search_r1 offers only the search tool (<search> tags); "
                        "other tools need protocol=hermes")
    if rcfg.protocol == "hermes" and not rcfg.chat_template:
        problems.append("actor_rollout_ref.rollout.protocol=hermes needs actor_rollout_ref.rollout.chat_template=true")
    return problems


def check_paths(cfg: Any, keys: tuple[str, ...] = ("actor_rollout_ref.model.path", "data.train_files",
                                                 "data.val_files")) -> None:
    """Raise ConfigError naming each configured path that does not exist (a missing model
    directory otherwise surfaces as a hub error about repo ids, after Ray started)."""
    problems = []
    for key in keys:
        found, value = _get(cfg, key)
        for path in ([value] if isinstance(value, str) else list(value or []) if found else []):
            if path and not Path(path).exists():
                problems.append(f"{key}: {path} does not exist")
    if problems:
        raise ConfigError("; ".join(problems))
