"""The transformers backend (`rollout.engine_mode=hf`) on the 2-block `tiny_policy`: vLLM's
contract without vLLM. Logprobs against a plain fp32 forward (greedy: raw; sampled: tempered;
top-p: renormalised over the nucleus), seeds, stop strings cut inside a token, EOS and length
finishes, weight loads, concurrent calls on one event loop that stays free. Tests that start
the engine are marked slow (a rollout engine, tests/helpers/heavy.py), though it starts in seconds."""

from __future__ import annotations

import asyncio
import math
import sys
import time

import pytest
import torch

from agent_rl.rollout.engine import Sampling

pytestmark = pytest.mark.timed  # its longest pause is measured against the run (tests/conftest.py)

PROMPT = "The history of the city of Paris began"
# Incremental decoding with the KV cache and one full forward of the same fp32 weights differ
# only in summation order (attention over the cache, matmul shapes): ~1e-6 here; 1e-4 leaves
# room for other BLAS kernels while a wrong distribution (temperature, token off by one) is
# off by > 0.05.
TOL = 1e-4


@pytest.fixture(scope="module")
def hf_engine(aio, tiny_policy):
    from agent_rl.config import RolloutConfig
    from agent_rl.rollout.engine import RolloutEngine

    eng = aio(RolloutEngine.create(str(tiny_policy), RolloutConfig(dtype="float32", engine_mode="hf", seed=0),
                                   max_model_len=1024))
    yield eng
    aio(eng.shutdown())


@pytest.fixture(scope="module")
def ref_model(tiny_policy):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_policy), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt(hf_engine):
    return hf_engine.get_tokenizer().encode(PROMPT)


def _diffs(a: list[float], b: list[float]) -> list[float]:
    assert len(a) == len(b) and a
    return [abs(x - y) for x, y in zip(a, b)]


@pytest.mark.slow
def test_greedy_takes_the_argmax_and_reports_raw_logprobs(aio, hf_engine, ref_model, prompt, hf_logprobs):
    out = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=24, stop=())))
    assert len(out.token_ids) == len(out.logprobs) == 24
    assert max(_diffs(out.logprobs, hf_logprobs(ref_model, prompt, out.token_ids))) < TOL
    with torch.no_grad():  # each token is the argmax of the full forward at its position
        logits = ref_model(torch.tensor([prompt + out.token_ids])).logits[0]
    assert out.token_ids == logits[len(prompt) - 1:-1].argmax(-1).tolist()


@pytest.mark.slow
def test_sampled_logprobs_are_of_the_tempered_distribution(aio, hf_engine, ref_model, prompt, hf_logprobs):
    out = aio(hf_engine.generate(prompt, Sampling(temperature=0.7, max_tokens=32, stop=(), seed=3)))
    assert max(_diffs(out.logprobs, hf_logprobs(ref_model, prompt, out.token_ids, temperature=0.7))) < TOL
    raw = _diffs(out.logprobs, hf_logprobs(ref_model, prompt, out.token_ids))
    assert sum(raw) / len(raw) > 0.05  # the raw model's log-probs are another thing


def test_top_p_keeps_the_nucleus_renormalised():
    """p = (.5, .3, .2): top_p .7 keeps the first two (the mass before the third is .8 >= .7),
    renormalised to (.5/.8, .3/.8); top_p .5 keeps the first alone (.5 before the second)."""
    from agent_rl.rollout.hf_engine import processed_logprobs

    logits = torch.tensor([0.5, 0.3, 0.2]).log() + 1.0  # a shift changes nothing
    kept = processed_logprobs(logits, 1.0, 0.7)
    assert kept[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert kept[2] == float("-inf")
    assert processed_logprobs(logits, 1.0, 0.5).tolist() == [0.0, float("-inf"), float("-inf")]
    hot = processed_logprobs(logits, 2.0, 1.0).exp()  # temperature 2: p ~ sqrt(p)
    assert hot.tolist() == pytest.approx([x / sum(math.sqrt(y) for y in (0.5, 0.3, 0.2)) for x in
                                          (math.sqrt(0.5), math.sqrt(0.3), math.sqrt(0.2))], abs=1e-6)
    assert processed_logprobs(logits, 0.0, 0.5).exp().tolist() == pytest.approx([0.5, 0.3, 0.2], abs=1e-6)


@pytest.mark.slow
def test_a_seed_fixes_the_tokens(aio, hf_engine, prompt):
    def sample(seed):
        return aio(hf_engine.generate(prompt, Sampling(temperature=1.0, max_tokens=16, stop=(), seed=seed))).token_ids

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


@pytest.mark.slow
def test_a_stop_string_ending_inside_a_token_cuts_the_text_and_keeps_the_token(aio, hf_engine, prompt):
    """The stop string is the greedy text up to the first character of a later token: the
    turn ends on that token, the text is cut right after the stop string, the ids keep the
    whole token (as vLLM: `GenerateResult`)."""
    tok = hf_engine.get_tokenizer()
    free = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=16, stop=())))
    k = next(i for i in range(2, 16) if len(tok.decode(free.token_ids[i:i + 1])) >= 2)  # a token of 2+ characters
    stop = tok.decode(free.token_ids[:k]) + tok.decode(free.token_ids[k:k + 1])[0]
    out = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=16, stop=("<never>", stop))))
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, stop)
    assert out.token_ids == free.token_ids[:k + 1] and out.logprobs == pytest.approx(free.logprobs[:k + 1])
    assert tok.decode(out.token_ids).startswith(stop) and len(tok.decode(out.token_ids)) > len(stop)


@pytest.mark.slow
def test_length_and_eos_finishes(aio, hf_engine, prompt):
    out = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=5, stop=())))
    assert (out.finish_reason, out.stop_reason, len(out.token_ids)) == ("length", None, 5)
    # the 2-block model never says EOS on its own: make a later greedy token (its first
    # occurrence) the EOS id
    k = next(i for i in range(1, 5) if out.token_ids[i] not in out.token_ids[:i])
    eos = hf_engine._eos
    hf_engine._eos = out.token_ids[k]
    try:
        ended = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=5, stop=())))
        ignored = aio(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=5, stop=(), ignore_eos=True)))
    finally:
        hf_engine._eos = eos
    assert (ended.finish_reason, ended.stop_reason) == ("stop", None)
    assert ended.token_ids == out.token_ids[:k + 1]  # EOS kept: it was sampled, it has a logprob
    assert ended.text == hf_engine.get_tokenizer().decode(out.token_ids[:k], skip_special_tokens=True)
    assert ignored.token_ids == out.token_ids and ignored.finish_reason == "length"


@pytest.mark.slow
def test_load_weights_changes_outputs_to_the_new_models(aio, hf_engine, ref_model, prompt, hf_logprobs):
    """The embedding is perturbed (the model ties lm_head to it: a stale head would show) and
    one block's MLP scaled; the engine's log-probs then equal the new model's forward."""
    from transformers import AutoModelForCausalLM

    assert hf_engine.tie_word_embeddings
    old = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    new = {k: v.clone() for k, v in old.items()}
    gen = torch.Generator().manual_seed(0)
    new["model.layers.1.mlp.down_proj.weight"] *= 1.5
    new["model.embed_tokens.weight"] += 0.02 * torch.randn(new["model.embed_tokens.weight"].shape, generator=gen)
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied, as a trainer's state_dict has it
    ref_new = AutoModelForCausalLM.from_config(ref_model.config, dtype=torch.float32).eval()
    ref_new.load_state_dict(new)
    greedy = Sampling(temperature=0.0, max_tokens=16, stop=())
    before = aio(hf_engine.generate(prompt, greedy))
    try:
        aio(hf_engine.load_weights(new.items()))
        after = aio(hf_engine.generate(prompt, greedy))
        assert max(_diffs(after.logprobs, hf_logprobs(ref_new, prompt, after.token_ids))) < TOL
        d_old = _diffs(after.logprobs, hf_logprobs(ref_model, prompt, after.token_ids))
        assert sum(d_old) / len(d_old) > 1e-2  # the engine really runs the new weights
    finally:
        aio(hf_engine.load_weights(old.items()))
    restored = aio(hf_engine.generate(prompt, greedy))
    assert restored.token_ids == before.token_ids and max(_diffs(restored.logprobs, before.logprobs)) < TOL
    with pytest.raises(ValueError, match="shape"):  # the shared validation runs first
        aio(hf_engine.load_weights({**old, "model.norm.weight": old["model.norm.weight"][:-1]}.items()))


@pytest.mark.slow
def test_concurrent_calls_all_complete_while_the_loop_stays_free(aio, hf_engine, prompt):
    """Four calls from one asyncio.gather: each gets what it would get alone (they are
    serialised, none sees another's state), and a ticker on the same loop keeps ticking."""
    samplings = [Sampling(temperature=1.0, max_tokens=24, stop=(), seed=s, ignore_eos=True) for s in range(4)]
    alone = [aio(hf_engine.generate(prompt, s)).token_ids for s in samplings]

    async def run():
        gaps, done = [], asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(hf_engine.generate(prompt, s) for s in samplings))
        took = time.perf_counter() - t0
        done.set()
        await tick
        return outs, took, max(gaps)

    outs, took, longest_gap = aio(run())
    assert [o.token_ids for o in outs] == alone
    # Generation on the loop thread would stall it for a whole call (a quarter of `took`);
    # off it, a tick waits at most a token's worth of the GIL (ms). An eighth leaves room
    # for a loaded host.
    assert longest_gap < took / 8, (longest_gap, took)


@pytest.mark.slow
def test_load_weights_refuses_while_a_request_is_in_flight(aio, hf_engine, ref_model, prompt):
    async def run():
        task = asyncio.create_task(hf_engine.generate(prompt, Sampling(temperature=0.0, max_tokens=64, stop=())))
        await asyncio.sleep(0.05)
        try:
            with pytest.raises(RuntimeError, match="in flight"):
                await hf_engine.load_weights(ref_model.state_dict().items())
        finally:
            await task

    aio(run())


@pytest.mark.slow
def test_hf_mode_starts_without_vllm(aio, tiny_policy, monkeypatch):
    """engine_mode=hf imports no vLLM (every vllm module made unimportable here, whether or not
    other tests loaded it) and sets none of its environment."""
    import os

    from agent_rl.config import RolloutConfig
    from agent_rl.rollout.engine import RolloutEngine

    for name in ["vllm", *(m for m in list(sys.modules) if m.startswith("vllm."))]:
        monkeypatch.setitem(sys.modules, name, None)  # `import vllm...` now raises ImportError
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with pytest.raises(ImportError):
        import vllm  # noqa: F401  (the block works)
    eng = aio(RolloutEngine.create(str(tiny_policy), RolloutConfig(dtype="float32", engine_mode="hf"), 256))
    try:
        out = aio(eng.generate(eng.get_tokenizer().encode("Paris"), Sampling(temperature=0.0, max_tokens=2, stop=())))
        assert len(out.token_ids) == 2
    finally:
        aio(eng.shutdown())
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ


def test_every_backend_is_an_allowed_engine_mode():
    from agent_rl.config import CHOICES
    from agent_rl.rollout.engine import RolloutEngine

    assert CHOICES["actor_rollout_ref.rollout.engine_mode"] == tuple(RolloutEngine.BACKENDS)
