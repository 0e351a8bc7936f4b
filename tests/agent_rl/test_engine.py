"""The vLLM engine wrapper on the embedded model: ids in/out, logprobs vs transformers, stop
strings that end inside a token, weight loading into the running engine."""

from __future__ import annotations

import statistics

import pytest
import torch

from agent_rl.rollout.engine import Sampling

pytestmark = pytest.mark.slow

PROMPT = "The history of the city of Paris began"  # greedy decoding runs > 30 tokens without EOS


def _diffs(a: list[float], b: list[float]) -> list[float]:
    assert len(a) == len(b) and a
    return [abs(x - y) for x, y in zip(a, b)]


def test_generate_ids_and_fp32_logprobs_match_transformers(aio, engine, hf_model, tokenizer, hf_logprobs):
    prompt = tokenizer.encode(PROMPT)
    outs = aio(_gather(engine, [prompt] * 4, Sampling(temperature=1.0, max_tokens=48, stop=(), seed=7)))
    diffs = []
    for out in outs:
        assert len(out.token_ids) == len(out.logprobs) == 48 and out.finish_reason == "length"
        diffs += _diffs(out.logprobs, hf_logprobs(hf_model, prompt, out.token_ids))
    print(f"\nfp32 engine vs fp32 transformers: mean |d|={statistics.mean(diffs):.2e} max |d|={max(diffs):.2e}")
    assert max(diffs) < 2e-4


def test_logprobs_are_of_the_tempered_distribution(aio, engine, hf_model, tokenizer, hf_logprobs):
    """At temperature 0.6 the engine reports each sampled token's log-prob under
    softmax(logits / 0.6), the distribution it sampled from and the one the trainer computes
    (actor log-probs at the rollout temperature), not the raw model's."""
    prompt = tokenizer.encode(PROMPT)
    outs = aio(_gather(engine, [prompt] * 4, Sampling(temperature=0.6, max_tokens=32, stop=(), seed=5)))
    tempered, raw = [], []
    for out in outs:
        tempered += _diffs(out.logprobs, hf_logprobs(hf_model, prompt, out.token_ids, temperature=0.6))
        raw += _diffs(out.logprobs, hf_logprobs(hf_model, prompt, out.token_ids))
    assert max(tempered) < 2e-4, max(tempered)
    assert max(raw) > 0.05  # the raw model's log-probs are another thing


def test_bf16_engine_logprobs_close_to_fp32_reference(aio, engine_bf16, hf_model, tokenizer, hf_logprobs):
    prompt = tokenizer.encode(PROMPT)
    outs = aio(_gather(engine_bf16, [prompt] * 4, Sampling(temperature=1.0, max_tokens=64, stop=(), seed=3)))
    diffs = []
    for out in outs:
        diffs += _diffs(out.logprobs, hf_logprobs(hf_model, prompt, out.token_ids))
    frac = sum(d > 0.2 for d in diffs) / len(diffs)
    print(
        f"\nbf16 engine vs fp32 transformers ({len(diffs)} tokens): mean |d|={statistics.mean(diffs):.4f} "
        f"max |d|={max(diffs):.4f} frac>0.2={frac:.3f}"
    )
    assert statistics.mean(diffs) < 0.1


async def _gather(engine, prompts, sampling):
    import asyncio

    return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))


def test_stop_string_ending_inside_a_token_keeps_the_token(aio, engine, tokenizer):
    # The pattern makes greedy decoding write ` g </search>.` where `>.` is one token: vLLM
    # stops (the stop string is complete inside that token) and cuts `text` after
    # `</search>`, but the ids keep the whole token, so decode(ids) = text + ".".
    # (vLLM looks for stop strings in the generated text only, never in the prompt.)
    prompt = tokenizer.encode(" ".join(f"{w} </search>." for w in "abcdef"))
    dot = tokenizer.convert_tokens_to_ids(">.")
    out = aio(engine.generate(prompt, Sampling(temperature=0.0, max_tokens=8)))
    assert out.finish_reason == "stop" and out.stop_reason == "</search>", out
    assert out.token_ids[-1] == dot, (out.token_ids, out.text)
    assert out.text == " g </search>"  # cut right after the stop string
    assert tokenizer.decode(out.token_ids) == out.text + "."
    assert len(out.logprobs) == len(out.token_ids)
    # Re-encoding the text (what a text-based loop would do) loses the sampled token.
    assert tokenizer.encode(out.text, add_special_tokens=False) != out.token_ids


def test_eos_and_length_finish_reasons(aio, engine, tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(chat, add_special_tokens=False)
    out = aio(engine.generate(prompt, Sampling(temperature=0.0, max_tokens=200, stop=())))
    assert out.finish_reason == "stop" and out.stop_reason is None
    assert out.token_ids[-1] == tokenizer.eos_token_id  # EOS is kept: it was sampled, it has a logprob
    assert len(out.logprobs) == len(out.token_ids)
    short = aio(engine.generate(prompt, Sampling(temperature=0.0, max_tokens=3, stop=())))
    assert short.finish_reason == "length" and short.token_ids == out.token_ids[:3]


def test_generate_rejects_bad_requests(aio, engine):
    with pytest.raises(ValueError, match="empty prompt_ids"):
        aio(engine.generate([], Sampling()))
    with pytest.raises(ValueError, match="max_model_len"):
        aio(engine.generate([1] * 10, Sampling(max_tokens=engine.max_model_len)))


def _state_dict(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_load_weights_updates_running_engine(aio, engine, hf_model, tokenizer, hf_logprobs):
    """After load_weights, engine logprobs equal an fp32 forward pass of the NEW weights (and
    differ from the old ones). Covers the silent pitfalls: the embedding is perturbed, so a
    stale packed lm_head would show; the prompt is cached before the load, so a stale prefix
    cache would show."""
    from transformers import AutoModelForCausalLM

    # > 2 KV blocks, so the prefix cache really holds (and would reuse) old-weight KV
    context = " ".join(f"In the year {1200 + 7 * i} the town built bridge number {i}." for i in range(30))
    prompt = tokenizer.encode(context + "\n" + PROMPT)
    assert len(prompt) > 400
    greedy = Sampling(temperature=0.0, max_tokens=24, stop=())
    before = aio(engine.generate(prompt, greedy))  # fills the prefix cache with old-weight KV
    assert len(before.token_ids) == 24
    old = _state_dict(hf_model)
    new = {k: v.clone() for k, v in old.items()}
    gen = torch.Generator().manual_seed(0)
    new["model.layers.5.mlp.down_proj.weight"] *= 1.5
    new["model.embed_tokens.weight"] += 0.02 * torch.randn(new["model.embed_tokens.weight"].shape, generator=gen)
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied, as a trainer's state_dict has it
    ref_new = AutoModelForCausalLM.from_config(hf_model.config, dtype=torch.float32)
    ref_new.load_state_dict(new)
    ref_new.eval()
    try:
        secs = aio(engine.load_weights(new.items()))
        after = aio(engine.generate(prompt, greedy))
        d_new = _diffs(after.logprobs, hf_logprobs(ref_new, prompt, after.token_ids))
        d_old = _diffs(after.logprobs, hf_logprobs(hf_model, prompt, after.token_ids))
        print(f"\nload_weights {secs:.2f}s; vs new weights max |d|={max(d_new):.2e}; vs old mean |d|={statistics.mean(d_old):.3f}")
        assert max(d_new) < 2e-4
        assert statistics.mean(d_old) > 1e-2  # the engine really runs the new weights
    finally:
        aio(engine.load_weights(old.items()))
    restored = aio(engine.generate(prompt, greedy))
    assert restored.token_ids == before.token_ids
    assert max(_diffs(restored.logprobs, before.logprobs)) < 2e-4


def test_load_weights_rejects_bad_state_dicts_and_engine_survives(aio, engine, hf_model, tokenizer, hf_logprobs):
    good = _state_dict(hf_model)
    k = "model.layers.0.self_attn.q_proj.weight"
    bad_shape = dict(good, **{k: good[k][:-1]})
    unknown = dict(good, **{"model.layers.99.mlp.up_proj.weight": good[k]})
    missing = {n: t for n, t in good.items() if n != k}
    nan = dict(good, **{k: good[k].clone().fill_(float("nan"))})
    untied = dict(good, **{"lm_head.weight": good["model.embed_tokens.weight"] + 1})
    for sd, msg in [(bad_shape, "shape"), (unknown, "not a parameter"), (missing, "missing"),
                    (nan, "non-finite"), (untied, "differs")]:
        with pytest.raises(ValueError, match=msg):
            aio(engine.load_weights(sd.items()))
    out = aio(engine.generate(tokenizer.encode(PROMPT), Sampling(temperature=0.0, max_tokens=4, stop=())))
    assert len(out.token_ids) == 4 and all(lp <= 0 for lp in out.logprobs)


def test_kernel_scan_guard_hides_modules_vllm_cannot_scan():
    """vLLM's start-up scan calls vars(obj).get(...) on module globals; llvmlite's ffi.lib (via
    numba, via bm25s) breaks it. The guard hides such modules during start-up only."""
    import sys
    import types

    from agent_rl.rollout.engine import _kernel_scan_guard

    class Weird:  # like llvmlite's _lib_wrapper: __dict__ resolves to a non-mapping
        __slots__ = ()

        def __getattr__(self, name):
            return object()

    mod = types.ModuleType("fake_llvmlite_ffi")
    mod.lib = Weird()
    sys.modules["fake_llvmlite_ffi"] = mod
    try:
        with pytest.raises(AttributeError):
            vars(mod.lib).get("kernel")  # what vLLM does
        with _kernel_scan_guard():
            assert "fake_llvmlite_ffi" not in sys.modules
            assert "agent_rl.rollout.engine" in sys.modules  # ordinary modules stay
        assert sys.modules["fake_llvmlite_ffi"] is mod
    finally:
        sys.modules.pop("fake_llvmlite_ffi", None)


def test_multiprocess_engine_mode(aio, tiny_policy, tokenizer, hf_logprobs):
    """engine_mode="mp" (vLLM AsyncLLM, core in a child process): same generate contract, and
    load_weights through /dev/shm + collective_rpc reaches the child's model. On the 2-block copy
    of the embedded policy: the subject is the child process's contract, not the model."""
    from transformers import AutoModelForCausalLM

    from agent_rl.config import RolloutConfig
    from agent_rl.rollout.engine import RolloutEngine

    hf_model = AutoModelForCausalLM.from_pretrained(str(tiny_policy), dtype=torch.float32).eval()
    cfg = RolloutConfig(dtype="float32", max_num_seqs=8, kv_cache_space_gb=1, engine_mode="mp")
    eng = aio(RolloutEngine.create(str(tiny_policy), cfg, max_model_len=1024), timeout=600)
    try:
        prompt = tokenizer.encode(PROMPT)
        greedy = Sampling(temperature=0.0, max_tokens=16, stop=())
        out = aio(eng.generate(prompt, greedy))
        assert len(out.token_ids) == 16
        assert max(_diffs(out.logprobs, hf_logprobs(hf_model, prompt, out.token_ids))) < 2e-4
        sd = _state_dict(hf_model)
        sd["model.layers.1.mlp.down_proj.weight"] *= 2.0
        aio(eng.load_weights(sd.items()))
        after = aio(eng.generate(prompt, greedy))
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_config(hf_model.config, dtype=torch.float32)
        ref.load_state_dict(sd)
        ref.eval()
        assert max(_diffs(after.logprobs, hf_logprobs(ref, prompt, after.token_ids))) < 2e-4
        assert max(_diffs(after.logprobs, hf_logprobs(hf_model, prompt, after.token_ids))) > 1e-2
    finally:
        aio(eng.shutdown())
