"""How a step gets its groups, in every `trainer.mode`: the two collectors side by side.

`make_collector` is the one place that reads trainer.mode. Both collectors have one interface
(`collect`, `before_push`, `state`, `restore`), so `fit()` reads the same in every mode, and
both hand every group to the same steps (agent_rl.training.groups: scoring, the failed-search
rule, group filtering, the counts, renumbering) and run the outage rule (`OutageRule`) on what
they collect.

sync (`SyncCollector`): each step generates its own groups when it asks for them
(`collect_groups`: a batch of prompts per round, more rounds while the filter leaves too few).

one_step_off | async (`AheadCollector`): rollouts submitted ahead of the trainer. The loader's
prompts are submitted to the rollout worker's stream (`agent_rl.rollout.stream`) with keys in
submission order, up to `ahead` batches beyond the one being trained (one_step_off: 1; async:
trainer.max_staleness). A step takes `train_batch_size` groups:

- in submission order (one_step_off, and async with staleness_policy=wait): a group submitted
  at policy version v is trained by version v + ahead at the latest, so its staleness is
  within the bound by construction;
- in the order they finish (async, staleness_policy=drop): a slow group (three searches, one
  slow tool) does not hold the step; a group whose oldest token lags the trainer by more than
  trainer.max_staleness versions is dropped and counted.

A dropped or filtered group is replaced by the next one. A checkpoint holds `state()`
(`ROLLOUTS`): the next key and every group submitted and not trained, with its trajectories
in flight (`SavedGroup`); `restore` submits them again first, so a resumed run trains each
prompt once and continues, not regenerates, what was sampled.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from agent_rl.rollout.manager import rollout_metrics
from agent_rl.training.data import Prompt, PromptLoader
from agent_rl.training.groups import GroupRules, Tally, batch_of, group_trajectories, score_trajectories, sift
from agent_rl.training.metrics import StepTimer, reward_metrics
from agent_rl.types import Trajectory

log = logging.getLogger(__name__)

ROLLOUTS = "rollouts.json"
"""In an ahead mode's checkpoint: the groups submitted and not trained (`AheadCollector.state`)."""

OUTAGE_ATTEMPTS = 3
"""Collections of one step, each after a wait for the retriever's /health, before giving up."""

Outage = Callable[[int, dict[str, float], StepTimer], list[str]]
"""The outage rule as the collectors call it: (step, the collection's metrics, timer) -> the tools down."""


def make_collector(worker: Any, loader: PromptLoader, cfg: Any, total_steps: int, outage: Outage | None = None,
                   get: Any = None) -> SyncCollector | AheadCollector:
    """The one place that reads trainer.mode: sync generates each step's groups when the step
    asks; one_step_off submits one batch ahead, takes groups in submission order and lets the
    batch in flight finish before each weight push; async submits up to trainer.max_staleness
    batches ahead and takes groups in order (staleness_policy=wait) or as they finish (drop).
    `outage`: the outage rule run on what they collect (`OutageRule`; none in tests); `get`:
    how an ahead collector awaits a call (ray.get; tests pass the identity)."""
    mode = cfg.trainer.mode
    if mode == "sync":
        return SyncCollector(worker, loader, cfg, outage)
    one_step_off = mode == "one_step_off"
    return AheadCollector(worker, loader, cfg, total_steps, ahead=1 if one_step_off else cfg.trainer.max_staleness,
                          fifo=one_step_off or cfg.trainer.staleness_policy == "wait", drain=one_step_off, get=get,
                          outage=outage)


class OutageRule:
    """The outage rule per tool on a collection's metrics: tools failing in more than
    retriever.outage_share of their calls are named (their trajectories were left out with
    retriever.skip_failed_searches); when that many trajectories had a failed search, wait
    for the retriever's /health (only the retriever has one) through `worker`, the
    RolloutWorker actor. A call returns the tools down."""

    def __init__(self, worker: Any, retriever_cfg: Any) -> None:
        self.worker, self.retriever_cfg = worker, retriever_cfg

    def __call__(self, step: int, metrics: dict[str, float], t: StepTimer) -> list[str]:
        import ray

        r = self.retriever_cfg
        shares = tool_error_shares(metrics)
        metrics.update({f"tool/{name}/error_share": v for name, v in shares.items()})
        down = sorted(name for name, v in shares.items() if v > r.outage_share)
        for name in down:
            if name != "search":
                log.warning("step %d: tool %s failed in %.0f%% of its calls (> retriever.outage_share=%g); its "
                            "trajectories are left out", step, name, 100 * shares[name], r.outage_share)
        if metrics.get("rollout/failed_search_share", 0.0) > r.outage_share and ("search" in down or not shares):
            log.warning("step %d: %.0f%% of the trajectories had a failed search; waiting up to %.0f s for "
                        "the retriever's /health", step, 100 * metrics["rollout/failed_search_share"],
                        r.outage_wait_s)
            with t("retriever_wait"):
                ray.get(self.worker.wait_retriever.remote(r.outage_wait_s))
        return down


def tool_error_shares(metrics: dict[str, float]) -> dict[str, float]:
    """errors / calls of each tool called in a rollout (from its `tool/<name>/*` metrics)."""
    out = {}
    for key, calls in metrics.items():
        if key.startswith("tool/") and key.endswith("/calls") and calls > 0:
            name = key[len("tool/"):-len("/calls")]
            out[name] = metrics.get(f"tool/{name}/errors", 0.0) / calls
    return out


class SyncCollector:
    """trainer.mode=sync: each step generates its own groups when it asks for them
    (`collect_groups`). When every trajectory was left out for a failed search, it waits for
    the retriever (`outage`: the outage rule) and collects again, up to OUTAGE_ATTEMPTS
    times."""

    def __init__(self, worker: Any, loader: PromptLoader, cfg: Any, outage: Outage | None = None) -> None:
        self.worker, self.loader, self.cfg, self.outage = worker, loader, cfg, outage

    def collect(self, step: int, t: StepTimer) -> tuple[list[Trajectory], list[str], dict[str, float]]:
        import ray

        cfg, a = self.cfg, self.cfg.algorithm

        def rollout(prompts: list[Prompt]) -> tuple[list[Trajectory], dict[str, float]]:
            return ray.get(self.worker.rollout.remote(prompts, cfg.actor_rollout_ref.rollout.n))

        rules = GroupRules.from_config(cfg)
        consumed: list[str] = []
        lost = dict.fromkeys(("rollout/failed_search_trajectories", "rollout/dropped_for_failed_search"), 0.0)
        for attempt in range(1, OUTAGE_ATTEMPTS + 1):
            trajs, ids, metrics = collect_groups(self.loader, rollout, cfg.reward, cfg.data.train_batch_size,
                                                 rules.filter_on, a.max_filter_rounds, t,
                                                 drop_failed=rules.drop_failed, filter_metric=rules.filter_metric)
            consumed += ids
            for k in lost:  # counted over every collection of the step, the failed ones too
                lost[k] += metrics.get(k, 0.0)
            down = self.outage(step, metrics, t) if self.outage is not None else []
            if trajs:
                if rules.drop_failed:
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


class AheadCollector:
    """trainer.mode one_step_off | async (built by `make_collector`). `worker`: the
    RolloutWorker actor handle; `ahead`: the batches submitted beyond the one being trained;
    `fifo`: groups taken in submission order, else as they finish; `drain`: the batch in flight
    finishes before each weight push; `get`: how a call's result is awaited (ray.get; tests
    pass a plain worker object and the identity); `outage(step, metrics, t)`: the outage rule,
    run on each step's metrics (none in tests)."""

    def __init__(self, worker: Any, loader: PromptLoader, cfg: Any, total_steps: int, ahead: int, fifo: bool,
                 drain: bool, get: Any = None, outage: Outage | None = None) -> None:
        self.worker, self.loader, self.cfg, self.total_steps = worker, loader, cfg, total_steps
        self.outage = outage
        if get is None:
            import ray

            get = ray.get
        self.get = get
        self.ahead, self.fifo, self.drain = ahead, fifo, drain
        self.batch = cfg.data.train_batch_size
        self.next_key = 0
        self.outstanding: list[tuple[int, Any]] = []
        """(key, prompt) submitted and not taken, in submission order."""
        self._resumed_keys: dict[int, int] = {}
        """Continued groups not trained yet -> their sampled tokens from the checkpoint (logged once trained)."""

    # ------------------------------------------------------------------ submission
    def _cap(self, step: int, kept: int) -> int:
        """Groups that may be outstanding: `ahead` batches beyond the current one, and no more
        than the run still trains (the last steps do not run into the next epoch; a dropped or
        filtered group frees its place for the next prompt)."""
        return min(self.batch * (1 + self.ahead), (self.total_steps - step + 1) * self.batch - kept)

    def top_up(self, step: int, kept: int = 0) -> None:
        need = self._cap(step, kept) - len(self.outstanding)
        if need <= 0:
            return
        items = []
        for p in self.loader.take(need):
            items.append((self.next_key, p, None))
            self.outstanding.append((self.next_key, p))
            self.next_key += 1
        self.get(self.worker.stream_submit.remote(items))

    # ------------------------------------------------------------------ one step's groups
    def collect(self, step: int, t: StepTimer, score: Any = None) -> tuple[list[Trajectory], list[str], dict[str, float]]:
        """Groups for step `step` (the engine holds version step-1). `score(trajs, prompts)`
        sets rewards and returns the RewardResults (default: `groups.score_trajectories` with
        the config's reward). Returns (trajectories with group ids 0..G-1, ids of every prompt
        consumed, metrics)."""
        cfg, a = self.cfg, self.cfg.algorithm
        score = score or functools.partial(score_trajectories, reward_cfg=cfg.reward)
        rules = GroupRules.from_config(cfg)
        version = step - 1
        kept: list[list[Trajectory]] = []
        consumed: list[str] = []
        metrics: dict[str, float] = {}
        tally = Tally()
        dropped_stale = 0
        results_all: list[Any] = []
        seen: list[Trajectory] = []
        rounds = 0
        wait_s = 0.0
        resumed_tokens = 0
        max_rounds = 1 + (a.max_filter_rounds if rules.filter_on else 0) + 4 * self.ahead
        while len(kept) < self.batch:
            rounds += 1
            if rounds > max_rounds:
                break
            self.top_up(step, len(kept))
            want = self.batch - len(kept)
            t0 = time.perf_counter()
            with t("gen"):
                if self.fifo:
                    keys = [k for k, _ in self.outstanding[:want]]
                    groups, tool_m = self.get(self.worker.stream_take.remote(keys, 0))
                else:
                    groups, tool_m = self.get(self.worker.stream_take.remote(None, min(want, len(self.outstanding))))
            wait_s += time.perf_counter() - t0
            for k, v in tool_m.items():
                metrics[k] = metrics.get(k, 0.0) + v
            taken = {g.key for g in groups}
            self.outstanding = [(k, p) for k, p in self.outstanding if k not in taken]
            fresh: list[list[Trajectory]] = []
            results: list[Any] = []
            for g in groups:
                consumed.append(g.prompt.id)
                resumed_tokens += self._resumed_keys.pop(g.key, 0)
                if max(tr.staleness(version) for tr in g.trajectories) > self.ahead:
                    dropped_stale += 1
                    continue
                fresh.append(g.trajectories)
                with t("reward"):
                    results += score(g.trajectories, [g.prompt])
            sifted = sift(fresh, results, rules)
            tally.add(sifted.tally)
            results_all += results
            seen += [tr for g in fresh for tr in g]
            kept += sifted.kept
        if not kept:
            raise RuntimeError(f"step {step}: no group to train on after {rounds - 1} takes (dropped for staleness: "
                               f"{dropped_stale}, filtered: {tally.filtered}, failed searches: {tally.dropped})")
        trained, per_source = batch_of(kept)
        staleness = [tr.staleness(version) for tr in trained]
        metrics.update(rollout_metrics(seen, wait_s))
        metrics.update(reward_metrics(results_all, cfg.reward.kind))
        metrics.update(tally.metrics(rules))
        metrics["async/dropped_stale"] = float(dropped_stale)
        metrics["async/trainer_wait_s"] = wait_s
        metrics["async/policy_version"] = float(version)
        metrics["async/staleness_mean"] = sum(staleness) / len(staleness)
        metrics["async/staleness_max"] = float(max(staleness))
        for lag, n in Counter(staleness).items():
            metrics[f"async/staleness/{lag}"] = float(n)
        metrics["async/partial_trajectories"] = float(sum(len({v for v in tr.policy_versions if v >= 0}) > 1
                                                          for tr in trained))
        metrics["async/resumed_sampled_tokens"] = float(resumed_tokens)
        metrics.update(per_source)
        if self.outage is not None:  # the groups generating now wait for a retriever that is down
            self.outage(step, metrics, t)
        return trained, consumed, metrics

    def before_push(self, t: StepTimer) -> None:
        """one_step_off: the batch generated during the update finishes on the weights it
        started with, then the swap; async swaps at once (between turns: partial rollouts)."""
        with t("drain"):
            if self.drain:
                self.get(self.worker.stream_drain.remote())

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """What a checkpoint keeps (JSON): the next key and the groups not trained, with
        their trajectories in flight."""
        saved = self.get(self.worker.stream_snapshot.remote())
        return {"next_key": self.next_key, "groups": [g.to_dict() for g in saved]}

    def restore(self, state: dict) -> None:
        """Submit the checkpoint's groups again, in their order, continuing what they sampled."""
        from agent_rl.rollout.stream import SavedGroup

        self.next_key = int(state["next_key"])
        n = self.cfg.actor_rollout_ref.rollout.n
        groups = [SavedGroup.from_dict(d, lambda p: Prompt(**p), n) for d in state["groups"]]
        self.outstanding = [(g.key, g.prompt) for g in groups]
        self._resumed_keys = {g.key: g.sampled_tokens for g in groups}
        if groups:
            self.get(self.worker.stream_submit.remote([(g.key, g.prompt, g) for g in groups]))
        live = sum(len(g.live) for g in groups)
        done = sum(len(g.done) for g in groups)
        print(f"[train] continuing {len(groups)} groups from the checkpoint: {done} trajectories finished, {live} in "
              f"flight, {sum(self._resumed_keys.values())} sampled tokens kept", flush=True)


def read_rollouts(path: Path, n: int) -> dict:
    """A checkpoint's rollouts.json (`AheadCollector.state`), every group checked against
    rollout.n = `n` and every per-token array against its trajectory's length
    (agent_rl.rollout.stream.check_saved_group), then built as `restore` builds it, and every
    key an integer held by one group, below next_key (the stream keeps one group per key: a
    collision loses one): a bad file is named with the field at fault when it is loaded,
    before anything starts, not when its trajectory ends mid-step or `restore` runs."""
    from agent_rl.rollout.stream import SavedGroup, check_saved_group

    try:
        state = json.loads(path.read_text())
    except ValueError as e:  # UnicodeDecodeError is one
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("groups"), list) or "next_key" not in state:
        raise ValueError(f"{path}: expected an object with next_key and a list of groups")
    if not _is_int(state["next_key"]):
        raise ValueError(f"{path}: next_key is not an integer: {state['next_key']!r}")
    keys: dict[int, int] = {}
    for i, group in enumerate(state["groups"]):
        where = f"groups[{i}]"
        try:
            check_saved_group(group, n, where)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if not _is_int(group["key"]):
            raise ValueError(f"{path}: {where}.key is not an integer: {group['key']!r}")
        if group["key"] in keys:
            raise ValueError(f"{path}: {where}.key {group['key']} is also groups[{keys[group['key']]}]'s")
        keys[group["key"]] = i
        if state["next_key"] <= group["key"]:
            raise ValueError(f"{path}: next_key {state['next_key']} is not past {where}.key {group['key']}")
        try:
            Prompt(**group["prompt"])
        except TypeError as e:
            raise ValueError(f"{path}: {where}.prompt is not a prompt ({e})") from None
        try:
            SavedGroup.from_dict(group, lambda p: Prompt(**p), n).sampled_tokens
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: {where} cannot be restored ({type(e).__name__}: {e})") from None
    return state


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
