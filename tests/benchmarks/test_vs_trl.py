"""benchmarks/vs_trl.py (issue 98): our GRPO beside TRL's GRPOTrainer. The table's arithmetic by
hand; TRL's reward is our EM on tricky text; TRL's first-turn prompt and tool-response frame are
ours token for token; TRL's clock stops as ours does; TRL's settings are read from our config;
and one run of the real command on a 2-block policy and a tiny knowledge base."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import vs_trl  # noqa: E402


def _rows(n: int, gen_s: float, tokens: float) -> list[dict]:
    return [{"step": i + 1, "step_s": 0.0, "gen_s": gen_s, "reward": 0.5, "em": 0.5, "sampled_tokens": tokens}
            for i in range(n)]


def test_the_table_puts_ours_over_trls_figures():
    """Ours: 3 steps in 300 s (100 s a step, 60 of them generating: 40 updating; 36 steps an
    hour), 18,000 tokens in 180 s of generation (100/s), 4 GiB. TRL: 2 steps in 300 s (150 a step,
    120 generating, 30 updating; 24 an hour), 9,600 tokens in 240 s (40/s), 2 GiB. Ours ÷ TRL:
    0.67, 0.50, 1.33, 1.50, 2.50, 2.00."""
    ours = vs_trl.side_summary(_rows(3, 60.0, 6000.0), 300.0, 330.0, 4 * 2**30)
    trl = vs_trl.side_summary(_rows(2, 120.0, 4800.0), 300.0, 320.0, 2 * 2**30)
    assert (ours["step_s"], ours["gen_s"], ours["update_s"], ours["steps_per_hour"], ours["tokens_per_s"]) == \
        (100.0, 60.0, 40.0, 36.0, 100.0)
    assert (trl["step_s"], trl["gen_s"], trl["update_s"], trl["steps_per_hour"], trl["tokens_per_s"]) == \
        (150.0, 120.0, 30.0, 24.0, 40.0)
    r = vs_trl.ratios(ours, trl)
    assert {k: round(v, 4) for k, v in r.items()} == {"step_s": 0.6667, "gen_s": 0.5, "update_s": 1.3333,
                                                       "steps_per_hour": 1.5, "tokens_per_s": 2.5, "peak_rss_gib": 2.0}
    diff = {"diff": 0.05, "ci_low": -0.01, "ci_high": 0.11, "n": 200}
    result = {"hardware_line": "[hardware] cpu='x'", "minutes": 10.0, "sft": "/x/sft", "trl_generation": "transformers",
              "sides": {"ours": ours, "trl": trl}, "ratios": r, "first_prompt_equal": True,
              "eval": {"n": 200, "em": {"start": {"em": 0.4}, "ours": {"em": 0.5}, "trl": {"em": 0.45}},
                       "ours_minus_trl": diff},
              "trl_vllm_probe": {"outcome": "failed: RuntimeError: no CUDA"}}
    text = vs_trl.table(result)
    rows = {r.split(" | ")[0].strip("| ").strip(): r.split(" | ")[1:] for r in text.splitlines() if r.startswith("|")}
    assert rows["seconds / step"] == ["100.00", "150.00", "0.67 |"]
    assert rows["generation s / step"] == ["60.00", "120.00", "0.50 |"]
    assert rows["update s / step"] == ["40.00", "30.00", "1.33 |"]
    assert rows["GRPO steps / hour"] == ["36.00", "24.00", "1.50 |"]
    assert rows["sampled tokens / s of generation"] == ["100.00", "40.00", "2.50 |"]
    assert rows["peak memory GiB (RSS, process tree)"] == ["4.00", "2.00", "2.00 |"]
    assert rows["agent EM % on 200 held-out questions (start 40.0)"][:2] == ["50.0", "45.0"]
    assert "**+5.0** [-1.0, +11.0]" in text and "failed: RuntimeError: no CUDA" in text
    assert text.startswith("[hardware]")


def test_a_failed_side_is_a_row_of_the_table_not_a_crash():
    result = {"hardware_line": "[hardware]", "minutes": 1.0, "sft": "/s", "trl_generation": "vllm",
              "sides": {"ours": vs_trl.side_summary(_rows(1, 1.0, 10.0), 2.0, 3.0, 1),
                        "trl": {"error": "ValueError: boom"}}, "ratios": {}, "first_prompt_equal": None}
    text = vs_trl.table(result)
    assert "| trl failed | ValueError: boom |" in text and "seconds / step" not in text


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def hermes(tok):
    from agent_rl.rollout.protocol import get_protocol
    from agent_rl.rollout.tools import builtin_tool

    return get_protocol("hermes").bind(tok, [builtin_tool("search")])


CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Orla Venn birth year"}}\n</tool_call><|im_end|>'
RESULT = "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
CASES = [  # (TRL's completion as sampled, with the template's special tokens; golds; our reward)
    ("<think>x</think>\n<answer> The Eiffel Tower! </answer><|im_end|>", ["eiffel tower"], 1.0),
    ("<answer>\u201cRock \u2019n\u2019 roll\u201d</answer><|im_end|>", ["rock 'n' roll"], 1.0),  # typographic forms
    ("<answer>\uff11\uff19\uff18\uff14</answer><|im_end|>", ["1984"], 1.0),  # full-width digits: NFKC
    # an answer inside the retrieved text is not the model's
    (CALL + RESULT.format("Doc 1(Title: Paris) <answer> Paris </answer>") + "<think>?</think><|im_end|>",
     ["Paris"], 0.0),
    (CALL + RESULT.format("Doc 1(Title: Orla Venn) born 1911") + "<answer> 1911 </answer><|im_end|>", ["1911"], 1.0),
    ("<answer> Paris </answer> <answer> Paris </answer><|im_end|>", ["Paris"], 0.25),  # answer spam: a quarter
    ("<answer> The </answer><|im_end|>", ["The"], 0.0),  # a gold that normalises to "" matches nothing
    ("<answer> Paris", ["Paris"], 0.0),  # cut by the length limit: no answer
    ("</answer> Paris <answer>", ["Paris"], 0.0),
]


def test_trls_reward_is_our_em_on_tricky_text(tok, hermes):
    """TRL's reward function decodes the completion ids as TRL hands them (special tokens
    skipped) and scores our protocol's reward view with our reward module: the same value as
    our `score` of that view, and the value the rules give by hand."""
    from agent_rl.config import RewardConfig
    from agent_rl.rollout.reward import score

    cfg = RewardConfig()
    reward = vs_trl.EMReward(tok, hermes, cfg)
    ids = [tok.encode(text, add_special_tokens=False) for text, _, _ in CASES]
    logged = []
    got = reward(completion_ids=ids, golden_answers=[g for _, g, _ in CASES],
                 log_metric=lambda k, v: logged.append((k, v)))
    assert got == [want for _, _, want in CASES]
    for (text, golds, want), i in zip(CASES, ids):
        view = hermes.reward_view(tok.decode(i, skip_special_tokens=True))
        assert score(view, golds, cfg) == want, text
    assert logged == [("em", pytest.approx(4.25 / len(CASES)))] and reward.batches[0]["em"] == logged[0][1]


def test_trls_first_turn_prompt_and_tool_frame_are_ours_token_for_token(tok, hermes, model_dir):
    """The question rendered by GRPOTrainer's own `_tokenize_prompts` (TRL's Qwen2.5 template,
    the template TRL trains with, our search tool's schema) equals our hermes prompt; and a tool
    result as TRL appends it (`_get_tool_suffix_ids`, after the turn's `<|im_end|>`) equals our
    observation frame around the same text."""
    from trl import GRPOTrainer
    from trl.chat_template_utils import (add_response_schema, get_training_chat_template,
                                         is_chat_template_prefix_preserving, supports_tool_calling)

    trl_tok = vs_trl.trl_tokenizer(model_dir)
    assert supports_tool_calling(trl_tok)
    add_response_schema(trl_tok)  # as GRPOTrainer.__init__ does for tools
    template = None if is_chat_template_prefix_preserving(trl_tok) else get_training_chat_template(trl_tok)
    tool = vs_trl.SearchTool("http://127.0.0.1:9", 1, tok, 256, hermes.observation_frame())
    trainer = SimpleNamespace(processing_class=trl_tok, _tokenizer=trl_tok, tools=[tool], chat_template=template,
                              chat_template_kwargs={}, environment_factories=None, _is_vlm=False)
    for question in ("Who founded Varnholt Mills", "What year was <|im_start|>Orla Venn born?"):
        (trl_ids,), _, _ = GRPOTrainer._tokenize_prompts(trainer, [vs_trl.trl_prompt(hermes, tok, question)])
        assert list(trl_ids) == hermes.prompt_ids(tok, question, "chat"), question
    content = "Doc 1(Title: Orla Venn) Orla Venn was born in 1911."
    suffix = GRPOTrainer._get_tool_suffix_ids(trainer, [{"role": "tool", "name": "search", "content": content}])
    head, tail = hermes.observation_frame()
    assert [tok.eos_token_id, *suffix] == tok.encode(head + content + tail, add_special_tokens=False)


def test_trls_search_tool_answers_an_outage_with_our_text_and_never_raises(tok, hermes):
    from agent_rl.rollout.observation import SEARCH_ERROR_TEXT

    tool = vs_trl.SearchTool("http://127.0.0.1:9", 1, tok, 256, hermes.observation_frame(), timeout_s=2.0)
    assert tool("anything") == SEARCH_ERROR_TEXT and tool(query={"not": "text"}) == SEARCH_ERROR_TEXT
    assert (tool.calls, tool.failures) == (2, 2) and tool["function"]["name"] == tool.__name__ == "search"


def test_trls_clock_counts_every_second_from_the_first_step_and_stops_as_ours():
    """Budget 100 s: steps of 30 s, the second starting 5 s after the first ended (counted: the
    clock runs from the first step's start). After 35 + 30 = 65 s the next would end at 100:
    not past it; after the third (95 s) it would: stop. The callback sets TRL's stop flag."""
    from transformers import TrainerControl

    from agent_rl.training.run import out_of_time

    now = [0.0]
    clock = vs_trl.BudgetClock(100.0, clock=lambda: now[0])
    callback, control = vs_trl.budget_callback(clock), TrainerControl()
    stops = []
    for start, end in ((0.0, 30.0), (35.0, 65.0), (65.0, 95.0)):
        now[0] = start
        callback.on_step_begin(None, None, control)
        now[0] = end
        stops.append(callback.on_step_end(None, None, control).should_training_stop)
    assert stops == [False, False, True]
    assert clock.step_s == [30.0, 35.0, 30.0] and clock.trained_s == 95.0
    assert out_of_time(65.0, 2, 100.0, 35.0) is False and out_of_time(95.0, 3, 100.0, 35.0) is True


def test_trls_settings_are_read_from_our_config():
    """One optimizer step a batch of 8 questions x 4 samples, micro-batches of 8, our lr,
    temperature, turns and lengths, no KL, token-mean, dual clip; the command's overrides win."""
    cfg = vs_trl.load_cfg(vs_trl.TRAIN_CFG, [*vs_trl.HERMES, "actor_rollout_ref.actor.optim.lr=2e-6"])
    s = vs_trl.trl_settings(cfg, Path("/tmp/x"), "transformers", 50, 8, "cpu")
    assert s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] == 32
    assert s["steps_per_generation"] == s["gradient_accumulation_steps"] == 4 and s["num_generations"] == 4
    assert (s["learning_rate"], s["beta"], s["loss_type"], s["scale_rewards"]) == (2e-6, 0.0, "dapo", "group")
    assert (s["temperature"], s["top_p"]) == (1.0, 1.0)
    assert (s["max_tool_calling_iterations"], s["max_completion_length"]) == (2, 512)
    assert s["generation_kwargs"] == {"max_new_tokens": 96} and s["use_cpu"] and not s["use_vllm"]
    assert (s["epsilon"], s["epsilon_high"], s["delta"], s["lr_scheduler_type"]) == (0.2, 0.2, 3.0, "constant")
    assert not s["shuffle_dataset"] and not s["gradient_checkpointing"]
    v = vs_trl.trl_settings(cfg, Path("/tmp/x"), "vllm", 50, 8, "cpu")
    assert v["generation_kwargs"] == {"max_tokens": 96} and v["vllm_mode"] == "colocate"
    assert (v["vllm_importance_sampling_mode"], v["vllm_importance_sampling_clip_max"]) == ("token_truncate", 2.0)


def test_the_strategy_reads_hermes_search_queries():
    text = ('<tool_call>\n{"name": "search", "arguments": {"query": "Orla Venn Varnholt birth year"}}\n</tool_call>'
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"Orla Venn\\"}"}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"query": "1+1"}}</tool_call><tool_call>{bad</tool_call>')
    assert vs_trl.hermes_queries(text) == ["Orla Venn Varnholt birth year", "Orla Venn"]



def test_the_strategy_on_the_training_kb_reads_the_main_evaluation(tmp_path, monkeypatch):
    """--strategy-kb equal to --kb at --eval-n questions: the shares come from the main
    evaluation's directories (no second retriever, no second evaluation); another n evaluates."""
    import pandas as pd

    import benchmarks.kb_server

    kb = tmp_path / "kb"
    kb.mkdir()
    pd.DataFrame([{"id": "1", "hop_attributes": ["Varnholt"]}]).to_parquet(kb / "test.parquet")

    def no_server(*a, **k):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(benchmarks.kb_server, "serve_index", no_server)
    monkeypatch.setattr(vs_trl, "strategy_share", lambda d, q: {"counts": {"d": str(d)}, "share": 0.25})
    main = {"n": 200, "dirs": {"start": "e/start", "ours": "e/ours"}, "em": {"start": {"em": 0.3}, "ours": {"em": 0.4}}}
    args = SimpleNamespace(strategy_kb=str(kb), kb=str(kb), strategy_n=200, eval_n=200)
    got = vs_trl.strategy({"start": Path("s"), "ours": Path("o")}, args, [], tmp_path, main)
    assert got["better_share"] == {"start": 0.25, "ours": 0.25} and got["n"] == 200
    assert got["counts"]["ours"] == {"d": "e/ours"} and got["em"] == {"start": 0.3, "ours": 0.4}
    with pytest.raises(AssertionError, match="evaluated again"):
        vs_trl.strategy({}, SimpleNamespace(**{**vars(args), "strategy_n": 50}), [], tmp_path, main)

TINY = ["data.train_batch_size=2", "data.max_response_length=64", "data.max_obs_length=48",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.max_tokens_per_turn=32",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.kv_cache_space_gb=0.25",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "max_turns=1",
        # our side on the transformers backend: faster to start on a CPU than vLLM
        "actor_rollout_ref.rollout.engine_mode=hf"]


@pytest.mark.ray  # our side is agent-rl-train
def test_both_sides_train_from_one_start_and_land_in_one_table(tiny_policy, tiny_kb, tiny_bm25, tmp_path):
    """The real command on a 2-block policy and a 60-entity KB: a retriever process on a real
    index, our agent-rl-train and TRL's GRPOTrainer a step each, both final models evaluated by
    agent-rl-eval on the same questions; the JSON, the table, the PNG and the record."""
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--minutes", "0.01",
                           "--sft", str(tiny_policy), "--kb", str(tiny_kb), "--index", str(tiny_bm25),
                           "--eval-n", "2", "--no-start-eval", "--workdir", str(tmp_path / "work"), "--json", str(out),
                           *TINY], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["first_prompt_equal"] is True and res["trl_generation"] == "transformers"
    for side in ("ours", "trl"):
        s = res["sides"][side]
        assert s["steps"] == 1 and s["steps_per_hour"] > 0 and s["peak_rss_gib"] > 0.1, (side, s)
        assert s["gen_s"] > 0 and s["tokens_per_s"] > 0 and s["rows"][0]["em"] is not None, (side, s)
    assert 0.0 <= res["sides"]["trl"]["rows"][0]["clipped_ratio"] <= 1.0  # TRL's own cut-at-the-limit share
    assert set(res["ratios"]) == {"step_s", "gen_s", "update_s", "steps_per_hour", "tokens_per_s", "peak_rss_gib"}
    ev = res["eval"]
    assert set(ev["em"]) == {"ours", "trl"} and ev["ours_minus_trl"]["n"] == ev["n"] == 2
    assert "| GRPO steps / hour |" in res["table"] and "ours − TRL, paired 95% CI" in res["table"]
    assert Path(res["png"]).stat().st_size > 1000 and (tmp_path / "work" / "record.json").is_file()
