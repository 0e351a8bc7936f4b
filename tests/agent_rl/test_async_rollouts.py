"""Rollouts ahead of the trainer (trainer.mode one_step_off | async), the pure parts: the
policy gate (weight swaps between turns, a version per sampled token), the stream's snapshot
of trajectories in flight and their continuation after a restart, and the loss of a
trajectory sampled under two policy versions against a hand computation. The end-to-end runs
(real Ray, vLLM, retriever; a SIGKILL mid-step) are in test_trainer.py."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from agent_rl.config import ActorConfig, ConfigError, TrainConfig, load_config
from agent_rl.rollout.manager import RolloutManager
from agent_rl.rollout.stream import RolloutStream, SavedGroup
from agent_rl.training.algos import ppo_policy_loss
from agent_rl.training.batch import TokenBatch
from agent_rl.training.data import Prompt
from agent_rl.types import Trajectory
from rollout_fakes import FakeRetriever, Q, ScriptedEngine, make_cfg


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def hops(context: str) -> str:
    """Two searches, then an answer (a function of the context: any restart point works)."""
    if "<search> second </search>" in context:
        return "<answer> x </answer>"
    return "<search> second </search>" if "<search> first </search>" in context else "<search> first </search>"


def test_a_weight_swap_waits_for_the_turn_being_generated_and_later_turns_use_the_new_version(tok):
    eng = ScriptedEngine(tok, hops, delay=0.05)
    mgr = RolloutManager(eng, FakeRetriever(), make_cfg(max_turns=3), tokenizer=tok)
    seen_in_flight = []

    async def load():
        seen_in_flight.append(eng.in_flight)

    async def main():
        task = asyncio.create_task(mgr.rollout([Q("q")], n=1))
        while eng.in_flight == 0:  # the first turn is being generated
            await asyncio.sleep(0.001)
        await mgr.gate.swap(load, version=7)
        return await task

    (t,), _ = asyncio.run(main())
    assert seen_in_flight == [0]  # the load ran only once the first turn was done
    turns = [[v for v, m in zip(t.policy_versions, t.loss_mask) if m] for _ in range(1)][0]
    first = len(eng.results[0].token_ids)
    assert set(turns[:first]) == {0} and set(turns[first:]) == {7}
    assert all(v == -1 for v, m in zip(t.policy_versions, t.loss_mask) if not m)
    assert t.staleness(7) == 7 and t.staleness(9) == 9
    assert len(t.policy_versions) == len(t.response_ids) and t.finish_reason == "answer"


def test_a_snapshot_in_flight_is_continued_after_a_restart_not_regenerated(tok):
    cfg = make_cfg(max_turns=3, n=2)
    eng = ScriptedEngine(tok, hops, delay=0.05)
    mgr = RolloutManager(eng, FakeRetriever(), cfg, tokenizer=tok)
    prompt = Prompt("p1", "who?", ["x"], "kb")

    async def first_run():
        stream = RolloutStream(mgr, 2)
        await stream.submit(0, prompt)
        while len(eng.calls) < 3:  # both did their first turn, one is in its second
            await asyncio.sleep(0.001)
        snap = await stream.snapshot()
        await stream.aclose()
        return snap

    (saved,) = asyncio.run(first_run())
    assert saved.key == 0 and not saved.done and len(saved.live) == 2 and saved.pending == 0
    assert all(s.turns >= 1 and sum(s.loss_mask) > 0 for s in saved.live)
    # through the checkpoint's JSON, into a new process's manager and engine
    saved = SavedGroup.from_dict(json.loads(json.dumps(saved.to_dict())), lambda p: Prompt(**p), 2)
    eng2 = ScriptedEngine(tok, hops)
    mgr2 = RolloutManager(eng2, FakeRetriever(), cfg, tokenizer=tok)

    async def resumed():
        stream = RolloutStream(mgr2, 2)
        await stream.submit(0, saved.prompt, saved)
        return await stream.take([0])

    (group,), metrics = asyncio.run(resumed())
    assert group.prompt == prompt
    for tr, st in zip(group.trajectories, saved.live):
        assert tr.response_ids[: len(st.response_ids)] == st.response_ids  # what was sampled is kept
        assert tr.rollout_logprobs[: len(st.logprobs)] == st.logprobs
        assert tr.num_turns == 3 and tr.num_searches == 2 and tr.finish_reason == "answer"
    # the new engine generated only the turns that were left, from where they stopped
    left = sum(3 - s.turns for s in saved.live)
    assert len(eng2.calls) == left
    starts = sorted(len(ids) for ids, _ in eng2.calls)
    assert min(starts) == min(len(s.prompt_ids) + len(s.response_ids) for s in saved.live)
    assert metrics["tool/search/calls"] == sum(2 - s.searches for s in saved.live)


def test_take_in_finish_order_and_a_failed_group_raises_its_error(tok):
    order = {"slow": 0.3, "fast": 0.0}

    class Engine(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            text = self.tok.decode(prompt_ids)
            if "boom" in text:
                raise RuntimeError("engine died")
            await asyncio.sleep(order["slow" if "slow" in text else "fast"])
            return await super().generate(prompt_ids, sampling)

    mgr = RolloutManager(Engine(tok, lambda c: "<answer> x </answer>"), FakeRetriever(), make_cfg(), tokenizer=tok)

    async def main():
        stream = RolloutStream(mgr, 1)
        await stream.submit(0, Prompt("a", "slow one"))
        await stream.submit(1, Prompt("b", "fast one"))
        first, _ = await stream.take(None, 1)
        second, _ = await stream.take(None, 1)
        await stream.submit(2, Prompt("c", "boom"))
        with pytest.raises(RuntimeError, match="engine died"):
            await stream.take([2])
        with pytest.raises(KeyError, match="never submitted"):
            await stream.take([5])
        return first[0].key, second[0].key

    assert asyncio.run(main()) == (1, 0)


def test_the_loss_of_a_trajectory_sampled_under_two_versions_equals_the_hand_computation():
    # response: 2 tokens sampled by version 0, an observation, 2 tokens sampled by version 1
    b0, b1 = [-1.0, -2.0], [-0.5, -3.0]
    tr = Trajectory([1, 2], [10, 11, 12, 13, 14], [1, 1, 0, 1, 1], [*b0, 0.0, *b1], policy_versions=[0, 0, -1, 1, 1])
    assert tr.staleness(2) == 2
    batch = TokenBatch.from_trajectories([tr])
    mask = batch.mask(True)
    # the trainer's policy now (version 2), which is also the proximal one on the first pass
    now = torch.tensor([[-1.5, -1.0, 0.0, -0.5, -2.0]])
    pos = mask.bool()[0]
    logp = torch.zeros_like(batch.rollout_logprobs)
    logp[0, pos.nonzero().flatten()] = now[0, [0, 1, 3, 4]]
    logp.requires_grad_(True)
    old = logp.detach()
    rollout = torch.where(batch.loss_mask.bool(), batch.rollout_logprobs, old)  # as ActorWorker._ppo_loss
    adv = torch.where(mask.bool(), torch.tensor(1.0), torch.tensor(0.0))
    cfg = ActorConfig(tis_cap=2.0)
    loss, m = ppo_policy_loss(logp, old, adv, mask, cfg, rollout_logp=rollout)
    # by hand: weight = min(exp(now - behaviour), 2) per sampled token, its own version's behaviour
    w = [min(math.exp(-1.5 - -1.0), 2), min(math.exp(-1.0 - -2.0), 2), min(math.exp(-0.5 - -0.5), 2),
         min(math.exp(-2.0 - -3.0), 2)]
    assert w == pytest.approx([math.exp(-0.5), 2.0, 1.0, 2.0])
    assert loss.item() == pytest.approx(-sum(w) / 4)
    assert m["tis_capfrac"] == pytest.approx(2 / 4)
    loss.backward()
    grad = logp.grad[0, pos.nonzero().flatten()]
    assert torch.allclose(grad, -torch.tensor(w) / 4)


def test_off_policy_modes_need_tis_and_bad_mode_values_are_named():
    with pytest.raises(ConfigError, match="trainer.mode=async needs actor_rollout_ref.actor.tis_cap"):
        load_config(TrainConfig, None, ["trainer.mode=async"])
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["trainer.mode=overlap", "trainer.staleness_policy=keep", "trainer.max_staleness=0"])
    for key in ("trainer.mode", "trainer.staleness_policy", "trainer.max_staleness"):
        assert key in str(e.value)
    cfg = load_config(TrainConfig, None, ["trainer.mode=one_step_off", "actor_rollout_ref.actor.tis_cap=2.0"])
    assert cfg.trainer.mode == "one_step_off"


# ----------------------------------------------------------------------------- the driver's side
class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeStreamWorker:
    """The RolloutWorker's stream methods, in order of finishing given by `finish_rank(key)`;
    each group's trajectories were sampled at `version_of(key)` (answers from `answers(key)`)."""

    def __init__(self, version_of, finish_rank=lambda k: k, answers=lambda k: ["x", "y"]):
        self.version_of, self.finish_rank, self.answers = version_of, finish_rank, answers
        self.submitted: dict[int, Prompt] = {}
        self.max_outstanding = 0
        self.stream_submit = _Remote(self._submit)
        self.stream_take = _Remote(self._take)

    def _submit(self, items):
        for key, prompt, _ in items:
            self.submitted[key] = prompt
        self.max_outstanding = max(self.max_outstanding, len(self.submitted))

    def _group(self, key):
        from agent_rl.rollout.stream import FinishedGroup

        v = self.version_of(key)
        trajs = [Trajectory([1], [5, 6], [1, 1], [-0.1, -0.2], policy_versions=[v, v], response_text=f"<answer>{a}</answer>",
                            golden_answers=["x"]) for a in self.answers(key)]
        return FinishedGroup(key, self.submitted.pop(key), trajs)

    def _take(self, keys, count):
        if not keys:
            keys = sorted(self.submitted, key=self.finish_rank)[:count]
        return [self._group(k) for k in keys], {"async/engine_idle_s": 0.0}


def _collector(worker, policy="wait", steps=3, batch=2, n_prompts=6, max_staleness=1):
    from agent_rl.training.collect import make_collector
    from agent_rl.training.data import PromptLoader
    from agent_rl.training.groups import score_trajectories
    from agent_rl.training.metrics import StepTimer

    cfg = load_config(TrainConfig, None, ["trainer.mode=async", "actor_rollout_ref.actor.tis_cap=2",
                                          f"trainer.staleness_policy={policy}", f"trainer.max_staleness={max_staleness}",
                                          f"data.train_batch_size={batch}", "data.shuffle=false"])
    loader = PromptLoader([Prompt(f"p{i}", f"q{i}", ["x"]) for i in range(n_prompts)], batch, shuffle=False)
    col = make_collector(worker, loader, cfg, steps, get=lambda x: x)
    score = lambda trajs, prompts: score_trajectories(trajs, prompts, cfg.reward)  # noqa: E731
    return col, (lambda step: col.collect(step, StepTimer(), score))


def test_fifo_trains_in_submission_order_ahead_by_one_batch_and_never_past_the_epoch():
    worker = FakeStreamWorker(version_of=lambda k: k // 2)  # batch b sampled by version b (the best case)
    col, collect = _collector(worker)
    consumed = [collect(step)[1] for step in (1, 2, 3)]
    assert consumed == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]
    assert worker.max_outstanding == 4 and not worker.submitted  # one batch ahead; nothing of a 4th batch
    assert col.loader.pos.epoch == 1 and col.loader.pos.index == 0


def test_drop_policy_takes_groups_as_they_finish_and_drops_those_past_the_bound():
    # key 1 finishes last and was sampled by version 0: at step 3 (version 2) it lags 2 > 1
    worker = FakeStreamWorker(version_of=lambda k: 0 if k == 1 else max(0, k // 2 - 1),
                              finish_rank=lambda k: 100 if k == 1 else k)
    col, collect = _collector(worker, policy="drop", steps=3, n_prompts=8)
    trained = []
    for step in (1, 2, 3):
        trajs, ids, m = collect(step)
        trained.append(ids)
        assert m["async/staleness_max"] <= 1
    assert trained[0] == ["p0", "p2"]  # p1 is slow: p2 overtakes it
    assert "p1" in trained[2] and trained[2].count("p1") == 1
    assert m["async/dropped_stale"] == 1 and len(trajs) == 4  # p1 dropped, the batch still full


def test_groups_that_agree_are_filtered_and_replaced_when_filtering_is_on():
    worker = FakeStreamWorker(version_of=lambda k: 0, answers=lambda k: ["x", "x"] if k == 0 else ["x", "y"])
    col, collect = _collector(worker)
    col.cfg.algorithm.filter_groups = True
    trajs, ids, m = collect(1)
    assert ids == ["p0", "p1", "p2"] and m["filter/dropped_groups"] == 1 and len(trajs) == 4
    assert {t.group_id for t in trajs} == {0, 1}
