"""Native tool calls (protocol=hermes), tools beside search (calculator, MCP), the per-turn
protocol metrics, and the two latent bugs the protocol module removed: the reward reading the
invalid-action feedback outside the trainer, and a tool-call limit that did not hold across
concurrent `rollout()` calls (evaluation)."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_rl.config import ToolConfig
from agent_rl.rollout import protocol as PR
from agent_rl.rollout.engine import Sampling
from agent_rl.rollout.manager import RolloutManager, rollout_metrics
from agent_rl.rollout.reward import evaluate_response, score_trajectory
from agent_rl.rollout.tools import (Tool, ToolArgumentError, ToolInputError, ToolResult, builtin_tool, calculate,
                                    calculator_tool, check_arguments)
from rollout_fakes import CountingTokenizer, FakeRetriever, Q, ScriptedEngine, make_cfg

ROOT = Path(__file__).resolve().parents[2]
QWEN_TEMPLATE = ROOT / "tests" / "fixtures" / "qwen2_5_chat_template.jinja"  # Qwen2.5-Instruct's, verbatim
MCP_SERVER = ROOT / "tests" / "agent_rl" / "mcp_test_server.py"


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def qwen_tok(model_dir):
    """The embedded tokenizer (ChatML ids: <|im_start|>, <|im_end|>) with Qwen2.5's chat template,
    which has a tool role and renders tools itself."""
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(model_dir))
    t.chat_template = QWEN_TEMPLATE.read_text()
    return t


def hermes_cfg(tools=("search",), **kw):
    cfg = make_cfg(chat_template=True, protocol="hermes", **kw)
    cfg.actor_rollout_ref.rollout.tools = [type(cfg.actor_rollout_ref.rollout.tools[0])(name=n) for n in tools]
    return cfg


def call(name, **arguments):
    return PR.HermesToolCalls().write_call(name, arguments)


def run(coro):
    return asyncio.run(coro)


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text,kind,tool,args,error", [
    ('<think>x</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "a b"}}\n</tool_call>',
     "tool", "search", {"query": "a b"}, None),
    ('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}</tool_call>', "tool", "search", {"query": "q"}, None),
    ("<answer> Paris </answer>", "answer", None, None, None),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"</tool_call>', "invalid", None, None, "malformed JSON"),
    ('<tool_call>{"name": "browse", "arguments": {}}</tool_call>', "invalid", "browse", None, "unknown tool 'browse'"),
    ('<tool_call>["search"]</tool_call>', "invalid", None, None, "must be a JSON object"),
    ("I think the answer is Paris.", "invalid", None, None, None),
])
def test_hermes_parse(text, kind, tool, args, error):
    a = PR.HermesToolCalls().parse(text, ("search", "calculator"))
    assert (a.kind, a.tool) == (kind, tool)
    if args is not None:
        assert a.arguments == args
    if error is None:
        assert a.error is None
    else:
        assert error in a.error
    if kind == "answer":
        assert a.content == "Paris"


def test_search_r1_protocol_offers_only_search():
    with pytest.raises(ValueError, match="protocol=hermes"):
        PR.SEARCH_R1.check_tools(["search", "calculator"])
    with pytest.raises(ValueError, match="unknown protocol"):
        PR.get_protocol("xml")


# ----------------------------------------------------------------------------- templates
def test_qwen_template_frames_and_prompt(qwen_tok):
    p = PR.HermesToolCalls().bind(qwen_tok, [builtin_tool("search"), builtin_tool("calculator")])
    assert p.native  # the model's own template renders tools and tool messages
    assert p.observation_frame() == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                     "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    prompt = qwen_tok.decode(p.prompt_ids(qwen_tok, "who wrote hamlet", "chat"))
    assert prompt.startswith("<|im_start|>system\nYou are Qwen")
    assert json.dumps(builtin_tool("calculator").schema()) in prompt
    assert prompt.endswith("Question: who wrote hamlet?\n<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="chat template"):
        p.prompt_ids(qwen_tok, "q", "base")


def test_fallback_template_for_a_model_without_a_tool_role(tok):
    assert not PR.template_has_tools(tok)  # the embedded SmolLM2 template
    with pytest.raises(ValueError, match="no tool role"):
        PR.HermesToolCalls("model").bind(tok, [builtin_tool("search")])
    p = PR.HermesToolCalls().bind(tok, [builtin_tool("search")])
    assert not p.native
    prompt = tok.decode(p.prompt_ids(tok, "who wrote hamlet", "chat"))
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '"name": "search"' in prompt and "<tool_call></tool_call> XML tags" in prompt
    # a tool message is a user message holding <tool_response>, as Qwen2.5 renders it
    assert p.observation_frame() == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                     "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_native_rollout_is_the_templates_conversation_token_for_token(qwen_tok):
    """The trajectory's ids are the ids of the conversation the chat template renders: prompt,
    the model's turn, the tool message (from the template, mask 0), the next turn; earlier turns
    are never re-tokenised (the sampled ids stay as the engine split them)."""
    turn1 = '<think> look it up </think>\n|<tool_call>|\n{"name": "search", "arguments": {"query": "hamlet author"}}\n</tool_call>'
    turn2 = "<think> found </think>\n<answer> Shakespeare </answer>"
    eng = ScriptedEngine(qwen_tok, [turn1, turn2])
    mgr = RolloutManager(eng, FakeRetriever(), hermes_cfg(), tokenizer=qwen_tok)
    (t,), m = run(mgr.rollout([Q("who wrote hamlet", ["Shakespeare"])], n=1))
    r = eng.results
    assert t.finish_reason == "answer" and t.num_searches == 1 and t.num_tool_calls == 1 and t.num_invalid == 0
    docs = "".join(f"Doc {i + 1}(Title: \"hamlet author {i}\") Text about hamlet author, part {i}.\n" for i in range(3))
    head, tail = mgr.protocol.observation_frame()
    obs_ids = PR.encode_text(qwen_tok, head) + PR.encode_text(qwen_tok, docs.strip()) + PR.encode_text(qwen_tok, tail)
    assert t.response_ids == r[0].token_ids + obs_ids + r[1].token_ids
    assert t.loss_mask == [1] * len(r[0].token_ids) + [0] * len(obs_ids) + [1] * len(r[1].token_ids)
    # the same conversation, rendered by the template as a whole
    msgs = [{"role": "user", "content": PR.HERMES_INSTRUCTION.format(question="who wrote hamlet?")},
            {"role": "assistant", "content": r[0].text}, {"role": "tool", "content": docs.strip()}]
    whole = mgr.protocol.render(msgs) + r[1].text
    assert qwen_tok.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False) == whole
    # the reward reads Search-R1's grammar: a well-formed search, retrieved text, the answer
    assert "<search>" in t.reward_text and "<information>" in t.reward_text and "<|im_start|>" not in t.reward_text
    res = score_trajectory(t, ["Shakespeare"], None)
    assert res.valid_format and res.answer == "Shakespeare" and res.score == 1.0
    assert evaluate_response(t.reward_text, ["hamlet author 1"]).retrieval_hit
    assert m["tool/search/calls"] == 1 and m["rollout/tool_calls_mean"] == 1


def test_a_turn_that_closes_its_message_has_the_end_token_once(qwen_tok):
    eos = qwen_tok.convert_tokens_to_ids("<|im_end|>")

    class ClosingEngine(ScriptedEngine):  # the model ends its message with <|im_end|> after the call
        async def generate(self, prompt_ids, sampling):
            out = await super().generate(prompt_ids, sampling)
            if out.text.endswith("</tool_call>"):
                out.token_ids.append(eos)
                out.logprobs.append(-0.5)
            return out

    turn1 = '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>'
    eng = ClosingEngine(qwen_tok, [turn1, "<answer> x </answer>"])
    mgr = RolloutManager(eng, FakeRetriever(), hermes_cfg(), tokenizer=qwen_tok)
    (t,), _ = run(mgr.rollout([Q("q")], n=1))
    n0 = len(eng.results[0].token_ids)
    assert eng.results[0].token_ids[-1] == eos
    assert t.response_ids[n0] != eos  # the frame's <|im_end|> was not appended a second time
    assert qwen_tok.decode(t.response_ids[: n0 + 3], skip_special_tokens=False).count("<|im_end|>") == 1


def test_malformed_unknown_and_bad_arguments_get_feedback_and_are_counted(tok):
    turns = ['<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
             '<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>',
             '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
             "no action here",
             "<answer> x </answer>"]
    eng = ScriptedEngine(tok, turns)
    mgr = RolloutManager(eng, FakeRetriever(), hermes_cfg(max_turns=5), tokenizer=tok)
    (t,), m = run(mgr.rollout([Q("q")], n=1))
    text = tok.decode(t.response_ids, skip_special_tokens=False)
    assert "Error: malformed JSON in the tool call" in text
    assert "Error: unknown tool 'browse'; available: search" in text
    assert "Invalid arguments for tool search: missing required argument(s) ['query']" in text
    assert "neither a tool call nor an answer" in text
    assert (t.num_invalid, t.num_bad_tool_calls, t.num_tool_calls, t.finish_reason) == (4, 3, 1, "answer")
    assert m["rollout/bad_tool_calls"] == 3 and m["tool/search/bad_args"] == 1 and m["tool/search/calls"] == 1
    assert abs(m["rollout/invalid_action_rate"] - 4 / 5) < 1e-9
    # the feedback never reaches the reward
    assert "Error" not in t.reward_text and "neither" not in t.reward_text


# ----------------------------------------------------------------------------- calculator
@pytest.mark.parametrize("expr,value", [("(1969 - 1879) * 2", "180"), ("2 ** 10", "1024"), ("7 / 2", "3.5"),
                                        ("sqrt(16) + abs(-3)", "7"), ("max(3, 9, 4) // 2", "4"), ("-2.5 * 4", "-10")])
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "().__class__", "open('x')", "10 ** 100000",
                                  "1 / 0", "x + 1", "lambda: 1", "2 +", "[1, 2]", "a" * 300])
def test_calculator_refuses_everything_else(expr):
    with pytest.raises(ToolInputError):
        calculate(expr)


# Issue 48: inputs whose evaluation was unbounded (10**(10**9) inside round, hours of CPU in a
# synchronous call that no timeout interrupts) or whose result was too large to print (a
# ValueError reported as a tool outage). Run in a child process: on code without the bounds
# the first one never returns, and a big-int operation cannot be interrupted in-process.
CALCULATOR_BOMBS = ["999999 ** 1000", "999999 ** 999 * 999999 ** 999", "(2 ** 1000) ** 1000", "9 ** 9 ** 9",
                    "round(1, 10 ** 9)", "round(1.5, -10 ** 9)", "round(7, 2.5)", "round(1, -10 ** 6)",
                    "round(1, -10 ** 9)"]


def test_calculator_work_is_bounded_and_too_large_is_a_rejection():
    code = ("import json, sys\nfrom agent_rl.rollout.tools import ToolInputError, calculate\nout = {}\n"
            "for e in json.loads(sys.argv[1]):\n"
            "    try:\n        out[e] = 'value ' + calculate(e)[:20]\n"
            "    except ToolInputError as x:\n        out[e] = 'rejected'\n"
            "    except Exception as x:\n        out[e] = type(x).__name__\n"
            "    print(json.dumps({e: out[e]}), flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(CALCULATOR_BOMBS)], capture_output=True,
                              text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the calculator did not return within 30 s; finished: {e.stdout!r}")
    assert done.returncode == 0, done.stderr
    got = {k: v for line in done.stdout.splitlines() for k, v in json.loads(line).items()}
    assert got == {e: "rejected" for e in CALCULATOR_BOMBS}


def test_a_result_too_large_is_the_models_mistake_not_an_outage():
    tool = calculator_tool()
    r = run(tool.invoke({"expression": "999999 ** 1000"}))
    assert r.ok and r.error == "rejected" and "too large" in r.text
    assert (tool.stats.rejected, tool.stats.errors) == (1, 0)
    assert calculate("2 ** 64") == "18446744073709551616" and calculate("round(123456, -3)") == "123000"


def test_tool_arguments_are_checked_against_the_schema():
    schema = calculator_tool().parameters
    assert check_arguments(schema, {"expression": "1"}) == {"expression": "1"}
    for bad, why in [({}, "missing"), ({"expression": 1}, "must be string"), ({"expression": "1", "x": 2}, "unknown"),
                     ("1+1", "JSON object")]:
        with pytest.raises(ValueError, match=why):
            check_arguments(schema, bad)


# Issue 48: schemas as MCP servers may send them. A boolean subschema, a nested type list or
# a malformed `properties`/`required` raised AttributeError/TypeError outside invoke's try.
@pytest.mark.parametrize("schema,arguments,accepted", [
    ({"type": "object", "properties": {"q": True}}, {"q": 1}, True),
    ({"type": "object", "properties": {"q": False}}, {"q": 1}, False),
    ({"type": "object", "properties": {"q": {"type": ["string", ["null"]]}}}, {"q": None}, True),
    ({"type": "object", "properties": {"q": {"type": ["string", "null"]}}}, {"q": 3}, False),
    ({"type": "object", "properties": {"q": {"type": 7}}}, {"q": 1}, True),
    ({"type": "object", "properties": ["q"]}, {"q": 1}, True),
    ({"type": "object", "properties": ["q"], "additionalProperties": False}, {"q": 1}, False),
    ({"type": "object", "required": [{"a": 1}, "q"]}, {"x": 1}, False),
    ({"type": "object", "required": "q"}, {}, True),
    (True, {"q": 1}, True),
    (None, {"q": 1}, True),
])
def test_argument_checking_is_total(schema, arguments, accepted):
    if accepted:
        assert check_arguments(schema, arguments) == arguments
    else:
        with pytest.raises(ToolArgumentError):
            check_arguments(schema, arguments)


def test_a_tool_with_an_odd_schema_is_called_not_raised():
    async def echo(**kw):
        return json.dumps(kw)

    tool = Tool("t", "", {"type": "object", "properties": {"q": True, "n": {"type": ["integer", ["null"]]}}}, echo)
    assert run(tool.invoke({"q": [1], "n": 2})) == ToolResult('{"q": [1], "n": 2}')


@pytest.mark.parametrize("body", ["[" * 1200, '{"name": "search", "arguments": "' + "[" * 1200 + '"}',
                                  '{"name": "search", "arguments": {"query": ' + "1" * 5000 + "}}",
                                  '{"a": ' * 1200])
def test_hermes_parse_is_total(body):
    """Issue 48: deep nesting raised RecursionError, a 5000-digit number ValueError (int
    digits limit), out of `parse` and through the TaskGroup of the whole batch."""
    a = PR.HermesToolCalls().parse(f"<tool_call>{body}</tool_call>", ("search",))
    assert a.kind == "invalid" and a.error


# ----------------------------------------------------------------------------- MCP + calculator
def test_mcp_served_tool_and_calculator_in_one_rollout(tok, tmp_path):
    """A real MCP server process (stdio, started by the manager from the config) and the
    calculator, called by native tool calls in one trajectory; metrics per tool."""
    cfg = hermes_cfg(tools=("search", "calculator"), max_turns=4)
    ToolConfig = type(cfg.actor_rollout_ref.rollout.tools[0])
    server = [sys.executable, str(ROOT / "tests" / "agent_rl" / "mcp_test_server.py"), "stdio"]
    cfg.actor_rollout_ref.rollout.tools.append(ToolConfig(name="geo", mcp_command=server, include=["capital", "add"]))
    turns = [call("capital", country="France"), call("calculator", expression="(1969 - 1879) * 2"),
             call("capital", country="Atlantis"), "<answer> Paris </answer>"]
    eng = ScriptedEngine(tok, turns)
    mgr = RolloutManager(eng, FakeRetriever(), cfg, tokenizer=tok)

    async def go():
        try:
            return await mgr.rollout([Q("capital of France?", ["Paris"])], n=1)
        finally:
            await mgr.aclose()

    (t,), m = run(go())
    assert set(mgr.tools) == {"search", "calculator", "capital", "add"}
    text = tok.decode(t.response_ids, skip_special_tokens=False)
    assert "<tool_response>\nParis\n</tool_response>" in text
    assert "<tool_response>\n180\n</tool_response>" in text
    assert "Atlantis" in text.split("<tool_response>")[3]  # the server's error, shown to the model
    assert (t.num_tool_calls, t.num_searches, t.num_tool_failures, t.finish_reason) == (3, 0, 0, "answer")
    assert m["tool/capital/calls"] == 2 and m["tool/capital/rejected"] == 1 and m["tool/calculator/calls"] == 1
    assert m["tool/capital/latency_mean_s"] > 0 and m["rollout/answered_without_search"] == 1.0
    # the prompt offered every tool, the MCP server's among them
    prompt = tok.decode(t.prompt_ids)
    assert '"name": "capital"' in prompt and '"name": "calculator"' in prompt


# ----------------------------------------------------------------------------- issue 48: no turn stops the batch
def _two_by_two(tok, script, cfg=None, tools=(), tokenizer=None):
    """Two prompts ("bad one", "good one") × 2 samples, one TaskGroup: trajectories in prompt order."""
    eng = ScriptedEngine(tok, script, max_model_len=16384)
    cfg = cfg or hermes_cfg(max_response_length=8192, max_tokens_per_turn=4096)
    mgr = RolloutManager(eng, FakeRetriever(), cfg, tokenizer=tokenizer or tok, tools=tools)
    trajs, m = run(mgr.rollout([Q("bad one"), Q("good one")], n=2))
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert all(t.finish_reason == "answer" for t in trajs)
    return mgr, trajs


def _bad_then_answer(bad_turn):
    """"bad one" first plays `bad_turn`; after any tool message (`<tool_response>`), and for
    "good one", the model answers."""
    return lambda ctx: bad_turn if "bad one" in ctx and "<tool_response>" not in ctx else "<answer> x </answer>"


def test_a_call_nested_too_deeply_is_one_invalid_turn_not_a_dead_batch(tok):
    """`<tool_call>` and a thousand `[` raised RecursionError out of `parse`: the TaskGroup
    cancelled every trajectory of the step."""
    _, trajs = _two_by_two(tok, _bad_then_answer("<tool_call>" + "[" * 1200 + "</tool_call>"))
    for t in trajs[:2]:
        assert (t.num_invalid, t.num_bad_tool_calls, t.num_tool_failures) == (1, 1, 0)
        assert "malformed JSON in the tool call (nested too deeply)" in tok.decode(t.response_ids)
    assert all(t.num_turns == 1 for t in trajs[2:])


def test_nesting_is_bounded_by_the_parser_not_by_the_recursion_limit():
    """A library raised the recursion limit (torch's inductor sets 2000) and 1,200 `[` became a
    syntax error instead of "nested too deeply", depending on which tests ran first. The depth is
    now checked before parsing; brackets inside strings do not count."""
    from agent_rl.rollout import protocol

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)
    try:
        deep = protocol.MAX_JSON_DEPTH + 1
        assert protocol._load_json("[" * deep + "]" * deep) == (None, "nested too deeply")
        assert protocol._load_json("<" + "[" * 1200)[1] == "nested too deeply"  # the batch test's text
    finally:
        sys.setrecursionlimit(limit)
    ok = "[" * protocol.MAX_JSON_DEPTH + "]" * protocol.MAX_JSON_DEPTH
    assert protocol._load_json(ok)[1] is None
    quoted = json.dumps({"name": "search", "arguments": {"query": "[" * 500 + '\\" {{'}})
    assert protocol._json_depth(quoted) == 2 and protocol._load_json(quoted)[0]["arguments"]["query"].startswith("[[")


def test_a_parse_that_raises_anyway_is_an_invalid_turn(tok):
    """The last resort: whatever `parse` raises, the turn is the model's invalid action."""
    eng = ScriptedEngine(tok, _bad_then_answer("<tool_call>boom</tool_call>"), max_model_len=16384)
    mgr = RolloutManager(eng, FakeRetriever(), hermes_cfg(), tokenizer=tok)
    parse = mgr.protocol.parse

    def raising(text, tool_names=None):
        if "boom" in text:
            raise RuntimeError("a parser bug")
        return parse(text, tool_names)

    mgr.protocol.parse = raising
    trajs, _ = run(mgr.rollout([Q("bad one"), Q("good one")], n=2))
    assert all(t.finish_reason == "answer" for t in trajs)
    assert [(t.num_invalid, t.num_bad_tool_calls) for t in trajs] == [(1, 1), (1, 1), (0, 0), (0, 0)]
    assert "Error: the turn could not be read (RuntimeError)." in tok.decode(trajs[0].response_ids)


def _text_tool(name, text):
    async def fn(**kw):
        return text

    return Tool(name, "returns a fixed text", {"type": "object", "properties": {}}, fn)


def test_a_tool_output_the_tokenizer_cannot_read_is_still_an_observation(tok):
    """A lone surrogate (JSON "\\ud800" decodes to one) made the tokenizer raise TypeError out of
    the trajectory; the output is made valid UTF-8 first."""
    _, trajs = _two_by_two(tok, _bad_then_answer(call("weird")), cfg=hermes_cfg(tools=()),
                           tools=[_text_tool("weird", "left \ud800 right")])
    for t in trajs[:2]:
        assert (t.num_tool_calls, t.num_tool_failures) == (1, 0)
        assert "left ? right" in tok.decode(t.response_ids)


class PoisonedTokenizer:
    """The real tokenizer, except that it raises on any text holding "poison"."""

    def __init__(self, tok):
        self._tok = tok

    def encode(self, text, *a, **kw):
        if "poison" in text:
            raise UnicodeError("cannot encode this text")
        return self._tok.encode(text, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_tool_output_handling_that_raises_anyway_is_a_tool_failure(tok):
    """The last resort for the output path: an exception there is this trajectory's tool
    failure (error observation, counted), and the batch goes on."""
    _, trajs = _two_by_two(tok, _bad_then_answer(call("weird")), cfg=hermes_cfg(tools=()),
                           tools=[_text_tool("weird", "poison")], tokenizer=PoisonedTokenizer(tok))
    for t in trajs[:2]:
        assert (t.num_tool_calls, t.num_tool_failures) == (1, 1)
        assert "Tool weird failed: UnicodeError." in tok.decode(t.response_ids)


# ----------------------------------------------------------------------------- issue 48: tool output
def _test_server():
    """tests/agent_rl/mcp_test_server.py as a module (its canned outputs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mcp_test_server", MCP_SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mcp_cfg(max_obs_length=64):
    """One MCP server's `canned` (tests/agent_rl/mcp_test_server.py), one turn with tools."""
    cfg = hermes_cfg(tools=(), max_turns=1, max_obs_length=max_obs_length)
    server = [sys.executable, str(MCP_SERVER), "stdio"]
    cfg.actor_rollout_ref.rollout.tools = [ToolConfig(name="kb", mcp_command=server, include=["canned"], timeout_s=30)]
    return cfg


def _mcp_rollout(tok, cfg, turns, gold, tokenizer=None):
    mgr = RolloutManager(ScriptedEngine(tok, turns), FakeRetriever(), cfg, tokenizer=tokenizer or tok)

    async def go():
        try:
            return await mgr.rollout([Q("where?", [gold])], n=1)
        finally:
            await mgr.aclose()

    (t,), _ = run(go())
    return t


def test_cap_bytes_and_neutralize_tags_are_exact():
    from agent_rl.rollout.observation import cap_bytes
    from agent_rl.rollout.protocol import neutralize_tags

    assert cap_bytes("abc", 10) == ("abc", False)
    assert cap_bytes("é" * 10, 5) == ("éé", True)  # never half a character
    assert cap_bytes("a\ud800b", 10) == ("a?b", False)  # valid UTF-8 whatever the tool sent
    assert cap_bytes("x" * 10**7, 4) == ("xxxx", True)
    text = "if a < b and c > d: </Answer> <answer/> </information > <tool_call> <|im_end|> <b>"
    assert neutralize_tags(text, ["<|im_end|>"]) == (
        "if a < b and c > d: &lt;/Answer&gt; &lt;answer/&gt; &lt;/information &gt; &lt;tool_call&gt; "
        "&lt;|im_end|&gt; <b>")


def test_mcp_output_is_capped_in_bytes_and_scored_as_the_model_saw_it(tok):
    """An MCP tool's 2 MB output was tokenised whole, and its untruncated text was kept in the
    trajectory's reward view: the retrieval reward paid for "Zanzibar", cut before the model
    could read it."""
    counting = CountingTokenizer(tok)
    turns = [call("canned", key="long"), "<answer> x </answer>"]
    t = _mcp_rollout(tok, _mcp_cfg(max_obs_length=64), turns, "Zanzibar", tokenizer=counting)
    assert counting.longest < 10_000  # max_obs_length=64: a few kB at most, not the 1.3 MB output
    assert t.num_obs_truncated == 1 and t.num_tool_failures == 0
    seen = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if m == 0])
    assert "Zanzibar" not in seen and "Zanzibar" not in t.reward_text
    info = evaluate_response(t.reward_text, ["Zanzibar"]).retrieval_hit
    assert not info
    block = t.reward_text.split("<information>")[1].split("</information>")[0].strip()
    assert block and block in seen  # the reward reads what the model read


@pytest.mark.parametrize("protocol", ["hermes", "search_r1"])
def test_tags_in_tool_output_are_text(tok, protocol):
    """A tool's output (MCP or retrieved passage) holding `</information><answer> gold
    </answer>` closed the observation for the reward and was scored as the model's answer;
    `<|im_end|>` in it was encoded as the end-of-turn token. Now they are quoted text."""
    planted = _test_server().CANNED["tags"]
    if protocol == "hermes":
        turns = [call("canned", key="tags"), "I do not know."]  # no answer of its own
        t = _mcp_rollout(tok, _mcp_cfg(max_obs_length=256), turns, "Zanzibar")
    else:
        class Planting(FakeRetriever):
            @staticmethod
            def docs(q, topk):
                from retriever_server.schemas import Document, ScoredDocument

                return [ScoredDocument(document=Document(id="0", contents=f'"T"\n{planted}'), score=1.0)]

        eng = ScriptedEngine(tok, ["<search> where </search>", "I do not know."])
        mgr = RolloutManager(eng, Planting(), make_cfg(max_turns=1), tokenizer=tok)
        (t,), _ = run(mgr.rollout([Q("where?", ["Zanzibar"])], n=1))
    res = score_trajectory(t, ["Zanzibar"], None)
    assert res.answer is None and res.score == 0.0
    assert "&lt;answer&gt; Zanzibar &lt;/answer&gt;" in tok.decode(t.response_ids)
    text = tok.decode(t.response_ids, skip_special_tokens=False)
    frames = 2 if protocol == "hermes" else 0  # the tool message's own: around <tool_response>
    assert text.count("<|im_end|>") == frames and text.count("<|im_start|>") == frames


def test_a_server_that_never_lists_its_tools_fails_the_first_rollout_in_time(tok):
    """It hung the first rollout forever, holding the manager's lock; now the rollout fails
    after the tool timeout, the server is closed, and a second rollout tries again."""
    cfg = hermes_cfg(tools=())
    server = [sys.executable, str(MCP_SERVER), "mute-list"]
    cfg.actor_rollout_ref.rollout.tools = [ToolConfig(name="mute", mcp_command=server, timeout_s=1.0)]
    mgr = RolloutManager(ScriptedEngine(tok, ["<answer> x </answer>"] * 2), FakeRetriever(), cfg, tokenizer=tok)

    async def go():
        for _ in range(2):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="tools/list"):
                await asyncio.wait_for(mgr.rollout([Q("q")], n=1), 30)
            assert time.monotonic() - t0 < 20
            assert mgr._mcp_servers == [] and set(mgr.tools) == set()

    run(go())


# ----------------------------------------------------------------------------- metrics
def test_repeated_queries_and_answers_without_search_are_counted(tok):
    turns = ["<search> Paris </search>", "<search>  paris </search>", "<search> Lyon </search>", "<answer> x </answer>",
             "<answer> y </answer>"]
    eng = ScriptedEngine(tok, turns)
    mgr = RolloutManager(eng, FakeRetriever(), make_cfg(max_turns=4), tokenizer=tok)
    (a,), _ = run(mgr.rollout([Q("q")], n=1))
    (b,), _ = run(mgr.rollout([Q("q")], n=1))
    assert (a.num_searches, a.num_repeated_queries, b.num_searches) == (3, 1, 0)
    m = rollout_metrics([a, b], 1.0)
    assert abs(m["rollout/repeated_query_rate"] - 1 / 3) < 1e-9
    assert m["rollout/answered_without_search"] == 0.5


# ----------------------------------------------------------------------------- the latent bugs
def test_the_tool_call_limit_holds_across_concurrent_rollouts(tok):
    """Evaluation calls rollout([question]) concurrently; max_concurrent_tool_calls must bound
    the retriever calls of all of them (the limit was made per rollout() call)."""
    ret = FakeRetriever(delay=0.05)
    eng = ScriptedEngine(tok, lambda ctx: "<answer> x </answer>" if "Doc 1(Title" in ctx else "<search> q </search>")
    mgr = RolloutManager(eng, ret, make_cfg(max_concurrent_tool_calls=2), tokenizer=tok)

    async def one(i):  # questions start one after another, as evaluation's workers pick them up
        await asyncio.sleep(0.02 * i)
        return await mgr.rollout([Q(f"q{i}")], n=1, greedy=True)

    async def go():
        return await asyncio.gather(*(one(i) for i in range(8)))

    out = run(go())
    assert len(ret.queries) == 8 and all(t.finish_reason == "answer" for (t,), _ in out)
    assert ret.max_in_flight == 2


def test_every_reward_goes_through_the_protocols_view():
    """Rewards read `score_trajectory` (the protocol's view, feedback removed), never raw
    response text: only reward.py calls evaluate_response (benchmarks/cold_start scored raw
    text, reading Search-R1's feedback as the answer "and")."""
    callers = []
    for p in [*ROOT.glob("agent_rl/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")]:
        if p.name == "reward.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "evaluate_response":
                callers.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert callers == []


def test_score_trajectory_never_reads_the_feedback_as_an_answer(tok):
    eng = ScriptedEngine(tok, ["I am not sure.", "still not sure", "nope"])
    mgr = RolloutManager(eng, FakeRetriever(), make_cfg(max_turns=2), tokenizer=tok)
    (t,), _ = run(mgr.rollout([Q("q", ["and"])], n=1))
    assert PR.FEEDBACK_INVALID.strip() in t.response_text
    assert evaluate_response(t.response_text, ["and"]).answer == "and"  # the trap
    assert score_trajectory(t, ["and"], None).score == 0.0


def test_sampling_stops_at_the_protocols_action_ends(tok):
    eng = ScriptedEngine(tok, ["<answer> x </answer>"])
    run(RolloutManager(eng, FakeRetriever(), hermes_cfg(), tokenizer=tok).rollout([Q("q")], n=1))
    assert eng.calls[0][1].stop == ("</tool_call>", "</answer>")
    eng = ScriptedEngine(tok, ["<answer> x </answer>"])
    run(RolloutManager(eng, FakeRetriever(), make_cfg(), tokenizer=tok).rollout([Q("q")], n=1))
    assert eng.calls[0][1].stop == ("</search>", "</answer>") == Sampling().stop


def test_the_outage_rule_reads_each_tools_error_share():
    from agent_rl.training.collect import tool_error_shares

    m = {"tool/search/calls": 8.0, "tool/search/errors": 2.0, "tool/kb/calls": 4.0, "tool/kb/errors": 4.0,
         "tool/calculator/calls": 0.0, "tool/calculator/errors": 0.0, "rollout/tool_failures": 6.0}
    assert tool_error_shares(m) == {"search": 0.25, "kb": 1.0}  # a tool not called has no share


def test_hermes_reward_view_reads_a_saved_decoded_response():
    """A response saved as text (special tokens skipped: the template's role words remain) is
    read as the same grammar `reward_text` gives a live rollout."""
    text = ('<think> look </think>\n<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>\nuser\n'
            "<tool_response>\nDoc 1(Title: X) Paris is the capital.\n</tool_response>\nassistant\n"
            "<think> found </think>\n<answer> Paris </answer>")
    view = PR.HermesToolCalls().reward_view(text)
    assert "user" not in view and "assistant" not in view
    res = evaluate_response(view, ["Paris"], structure_format_score=0.2)
    assert res.valid_format and res.retrieval_hit and res.answer == "Paris"
