"""Property tests: nothing a model writes crashes, hangs or is misread by the code that parses
and scores it (`agent_rl.rollout.protocol`, both protocols, and `agent_rl.rollout.reward`).

Texts are built from well-formed pieces (tags, tool calls, answers, retrieved blocks, the
protocols' own feedback) mixed with hostile ones: unterminated, nested and wrong-case tags,
thousands of repeated opening tags, `<answer>` inside `<information>`, many and empty answers,
JSON that is invalid, nested 10^4 deep, holds 4300+ digit integers, is not an object, has
arguments of the wrong type or names an unknown tool, NUL and control characters, lone
surrogates, unicode of every category, texts of 100 KB and more. Checked:

- no exception escapes, and results have the documented types and ranges (an `Action` of one
  of the three kinds; EM and SubEM in {0, 1}, F1 and the Search-R1 reward in [0, 1]);
- results are deterministic;
- on short texts, results equal the regular expressions that define them (Search-R1's
  `<(search|answer)>(.*?)</\\1>`, the last `<answer>(.*?)</answer>` outside `<information>`,
  `<tool_call>(.*?)</tool_call>` read as a search), so a faster reading changes no result;
- round trips and a few values computed by hand;
- every call on a 200 KB adversarial text returns within 2 s (the regular expressions retried
  every unclosed opening tag against the rest of the text: ~20 s for 200 KB, quadratic).
Examples are bounded so the module runs in seconds.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent_rl.rollout import protocol as PR
from agent_rl.rollout import reward as R
from agent_rl.rollout.protocol import FEEDBACK_INVALID, Action, HermesToolCalls, SearchR1Tags

pytestmark = pytest.mark.timed  # each reader is bounded in seconds (tests/conftest.py)

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LONG = settings(FUZZ, max_examples=15)
NAMES = ("search", "calculator")
PROTOCOLS = [SearchR1Tags(), HermesToolCalls()]
SEARCH_R1_WEIGHTS = dict(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
BIG = 200_000

# --------------------------------------------------------------------------- strategies
ANY_CHAR = st.characters(exclude_categories=())  # every category: Cc (NUL), Cs (lone surrogates), Cn ...
any_text = st.text(ANY_CHAR, max_size=30)
TAGS = [f"<{s}{t}>" for t in ("think", "search", "answer", "information", "tool_call", "tool_response")
        for s in ("", "/")]
NEAR_TAGS = ["<ANSWER>", "</Answer>", "<Search>", "</SEARCH>", "<TOOL_CALL>", "</Tool_Call>", "<Information>",
             "<answer", "</answer", "< answer>", "<answer >", "<</answer>>", "<information", "</tool_call",
             "<search/>", "<answer/>", "<", ">", "</", "\\", '"', "{", "}", "[", "]", ":", ","]
WORDS = ["Paris", " the ", "an", " a ", "capital of France", "", " ", "\n", "\t", "\x00", "\x1f", "\x85", "\u2028",
         "\ud800", "\udfff", "\U0010ffff", "é", "İ", "ß", "Doc 1(Title: X) ", "and", "<answer> and </answer>"]
HOSTILE_JSON = [
    "[" * 10_000 + "]" * 10_000, '{"a": ' * 10_000, "[" * 10_000, "9" * 5000, "-" + "9" * 4400,
    '{"name": "search", "arguments": {"query": ' + "1" * 5000 + "}}",
    '{"name": "search", "arguments": "' + "[" * 10_000 + '"}',
    '{"name": "search", "arguments": "' + "9" * 5000 + '"}',
    "1e99999", "NaN", "-Infinity", "[1]", "null", "true", '"search"', '""', "{}", '{"name": 3}', '{"name": null}',
    '{"name": ["search"]}', '{"name": "search", "arguments": "[1]"}', '{"name": "search", "arguments": 7}',
    '{"name": "search", "arguments": null}', '{"name": "search", "arguments": "{\\"query\\": "}',
    '{"name": "search", "arguments": "  "}', '{"name": "rm -rf /", "arguments": {}}',
    '{"name": "search\\u0000", "arguments": {}}', '"\\ud800"', '{"name": "search", "arguments": {"query": "\\udfff"}}',
    '{"name": "search", "arguments": {"query": 1}}', '{"name": "search", "arguments": {"query": ["a"]}}',
    '{"name": "search", "name": "calculator", "arguments": {"expression": "1+1"}}', "\x00", '"\\', "{\"a\": \"\\\"}",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False) | any_text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(any_text, kids, max_size=3), max_leaves=8)
tool_names = st.sampled_from(["search", "calculator", "browse", "", "Search", " search"]) | any_text


@st.composite
def tool_call_text(draw):
    """A `<tool_call>` of a well-formed, a wrong or a hostile body, maybe unclosed."""
    kind = draw(st.sampled_from(["call", "string arguments", "any json", "hostile"]))
    if kind == "hostile":
        body = draw(st.sampled_from(HOSTILE_JSON))
    elif kind == "any json":
        body = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    else:
        args = draw(st.dictionaries(st.sampled_from(["query", "expression", "q"]) | any_text, json_values, max_size=3)
                    | json_values)
        if kind == "string arguments":
            args = json.dumps(args)
        body = json.dumps({"name": draw(tool_names), "arguments": args}, ensure_ascii=draw(st.booleans()))
    cut = draw(st.integers(0, len(body)))
    body = body[:cut] if draw(st.integers(0, 4)) == 0 else body  # sometimes truncated mid-JSON
    pad = draw(st.sampled_from(["", "\n", " \t"]))
    return "<tool_call>" + pad + body + pad + draw(st.sampled_from(["</tool_call>", "</tool_call>", "", "</answer>"]))


def _piece() -> st.SearchStrategy[str]:
    pieces = [st.sampled_from(TAGS), st.sampled_from(NEAR_TAGS), st.sampled_from(WORDS), any_text,
              st.just(FEEDBACK_INVALID), tool_call_text(),
              st.builds(lambda a: f"<answer>{a}</answer>", any_text),
              st.builds(lambda a: f"<information>Doc 1 <answer>{a}</answer> </information>", any_text)]
    return st.one_of(pieces)


def _repeat(piece: str, n: int, limit: int) -> str:
    return piece * min(n, limit // max(len(piece), 1))


def model_text(limit: int) -> st.SearchStrategy[str]:
    """Pieces joined; a piece may repeat up to `limit` characters (thousands of opening tags)."""
    piece = _piece()
    repeated = st.builds(_repeat, piece, st.integers(1, 5000), st.just(limit))
    return st.lists(piece | repeated, max_size=12).map("".join)


short_text = model_text(600)  # few opening tags: the quadratic reference regexes stay fast
long_text = model_text(120_000)
golds = st.lists(st.sampled_from(["Paris", "the Paris", "and", "a", "capital", "Doc", ""]) | any_text,
                 min_size=1, max_size=3)


# --------------------------------------------------------------------------- references
# The definitions the parsers must keep (the regexes they were written with; quadratic in the
# number of unclosed opening tags, so only used on short texts).
def ref_first(text: str, tags: str) -> re.Match | None:
    return re.search(rf"<({tags})>(.*?)</\1>", text, re.DOTALL)


def ref_answer(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", R.strip_information(text), re.DOTALL)
    return found[-1].strip() if found else None


def ref_hide(text: str, tags: tuple[str, ...]) -> str:
    """Model-written reward tags quoted (the protocols' `hide_tags`), by regex."""
    return re.sub("|".join(map(re.escape, tags)), lambda m: m.group(0).replace("<", "&lt;").replace(">", "&gt;"), text)


HERMES_HIDDEN = ("<information>", "</information>", "<search>", "</search>")


def ref_calls_as_search(text: str) -> str:
    return re.sub(r"<tool_call>(.*?)</tool_call>", lambda m: f"<search> {m.group(1).strip()} </search>", text,
                  flags=re.DOTALL)


def ref_hermes_view(text: str) -> str:
    return re.sub(r"(</search>)[^<]*<tool_response>(.*?)(?:</tool_response>[^<]*|\Z)",
                  lambda m: f"{m.group(1)}{PR.OBS_OPEN}{m.group(2).strip()}{PR.OBS_CLOSE}",
                  ref_calls_as_search(ref_hide(text, HERMES_HIDDEN)), flags=re.DOTALL)


def _check_action(p, a: Action) -> None:
    """The documented shape of an Action."""
    assert isinstance(a, Action) and a.kind in ("tool", "answer", "invalid")
    assert a.query is None or isinstance(a.query, str)
    if a.kind == "tool":
        assert a.tool in NAMES and a.error is None
        if isinstance(p, SearchR1Tags):
            assert a.tool == "search" and a.arguments == {"query": a.query} and a.query == a.query.strip()
    elif a.kind == "answer":
        assert isinstance(a.content, str) and a.content == a.content.strip()
        assert (a.tool, a.arguments, a.error) == (None, None, None)
    else:
        assert a.error is None or (isinstance(a.error, str) and a.error)
        assert a.tool is None or isinstance(a.tool, str)
    fb = p.feedback(a)
    assert isinstance(fb, str) and fb
    if a.error:
        assert fb == f"Error: {a.error}."


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("p", PROTOCOLS, ids=lambda p: p.name)
@LONG
@given(text=long_text)
def test_parse_is_total_typed_and_deterministic(p, text):
    a = p.parse(text, NAMES)
    _check_action(p, a)
    assert repr(p.parse(text, NAMES)) == repr(a)  # repr: a NaN argument is not equal to itself


@pytest.mark.parametrize("p", PROTOCOLS, ids=lambda p: p.name)
@FUZZ
@given(text=short_text)
def test_parse_reads_the_first_action_its_regex_defines(p, text):
    a = p.parse(text, NAMES)
    _check_action(p, a)
    m = ref_first(text, "search|answer" if isinstance(p, SearchR1Tags) else "tool_call|answer")
    if m is None:
        assert (a.kind, a.error) == ("invalid", None)
    elif m.group(1) == "answer":
        assert (a.kind, a.content) == ("answer", m.group(2).strip())
    elif m.group(1) == "search":
        assert (a.kind, a.query) == ("tool", m.group(2).strip())
    else:  # a tool call: a call of a known tool, or invalid with its reason
        assert a.kind == "tool" or (a.kind == "invalid" and a.error)
        if a.kind == "tool":
            assert json.loads(m.group(2).strip())["name"] == a.tool


@FUZZ
@given(name=st.sampled_from(NAMES), args=st.dictionaries(any_text, json_values, max_size=4), as_string=st.booleans(),
       ascii=st.booleans())
def test_a_well_formed_call_round_trips(name, args, as_string, ascii):
    body = json.dumps({"name": name, "arguments": json.dumps(args) if as_string else args}, ensure_ascii=ascii)
    assume("</tool_call>" not in body)
    text = f"<think> x </think>\n<tool_call>\n{body}\n</tool_call>"
    assert HermesToolCalls().parse(text, NAMES) == Action("tool", tool=name, arguments=args)
    written = HermesToolCalls().write_call(name, args)
    assume(written.count("</tool_call>") == 1)
    assert HermesToolCalls().parse(written, NAMES) == Action("tool", tool=name, arguments=args)


@FUZZ
@given(q=any_text, answer=any_text)
def test_written_searches_and_answers_round_trip(q, answer):
    assume("</search>" not in q and "</answer>" not in answer and "<information>" not in answer)
    assert PR.SEARCH_R1.parse(PR.SEARCH_R1.write_call("search", {"query": q})).query == q.strip()
    for p in PROTOCOLS:
        assert p.parse(p.write_answer(answer), NAMES) == Action("answer", content=answer.strip())
    text = "<think>t</think>" + PR.SEARCH_R1.write_answer(answer)
    assert R.extract_answer(text) == answer.strip()
    tagged = any(f"<{s}{t}>" in answer for t in PR.REWARD_TAGS for s in ("", "/"))
    assert R.evaluate_response(text, [answer or "x"], **SEARCH_R1_WEIGHTS).valid_format == (not tagged)


@pytest.mark.parametrize("text,search_r1,hermes", [
    ("<answer>" * 3 + " x </answer>", ("answer", "<answer><answer> x"), ("answer", "<answer><answer> x")),
    ("<search> q <answer> a </answer> </search>", ("tool", "q <answer> a </answer>"), ("answer", "a")),
    ("<search>" * 5000 + "<answer>a</answer>", ("answer", "a"), ("answer", "a")),
    ("<answer>a" + "<search>" * 3 + " q </search>", ("tool", "<search><search> q"), ("invalid", None)),
    ("<tool_call>" * 5000 + '{"name": "search", "arguments": {"query": "q"}}</tool_call>',
     ("invalid", None), ("invalid", "malformed JSON in the tool call (Expecting value at character 0)")),
    ('<tool_call>{"name": "search", "arguments": "[1]"}</tool_call>', ("invalid", None), ("tool", [1])),
    ('<tool_call>{"name": "search", "arguments": "[1"}</tool_call>',
     ("invalid", None), ("invalid", "the arguments are not a JSON object")),
    ("<tool_call>" + "9" * 5000 + "</tool_call><answer>a</answer>",
     ("answer", "a"), ("invalid", "malformed JSON in the tool call (Exceeds the limit (4300 digits) for integer "
                                  "string conversion)")),
    ("<ANSWER>a</ANSWER><Search>q</Search>", ("invalid", None), ("invalid", None)),
])
def test_parse_values_by_hand(text, search_r1, hermes):
    def got(a):
        return (a.kind, {"answer": a.content, "tool": a.query if a.tool == "search" and a.query is not None
                         else a.arguments, "invalid": a.error}[a.kind])

    assert got(PR.SEARCH_R1.parse(text)) == search_r1
    assert got(HermesToolCalls().parse(text, NAMES)) == hermes


# --------------------------------------------------------------------------- JSON of tool calls
def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


@FUZZ
@given(v=json_values, wrap=st.integers(0, 110), ascii=st.booleans())
def test_load_json_reads_what_it_can_hold_and_names_the_rest(v, wrap, ascii):
    for _ in range(wrap):
        v = [v]
    text = json.dumps(v, ensure_ascii=ascii)
    assert PR._json_depth(text) == _depth(v)
    expected = (v, None) if _depth(v) <= PR.MAX_JSON_DEPTH else (None, "nested too deeply")
    assert PR._load_json(text) == expected


@FUZZ
@given(text=st.sampled_from(HOSTILE_JSON) | any_text
       | st.builds(str.__mul__, st.sampled_from(["[", "{", '"', "\\", "9", '{"a":']), st.integers(1, 20_000)))
def test_load_json_never_raises(text):
    value, why = PR._load_json(text)
    assert why is None or (isinstance(why, str) and why and value is None)


@FUZZ
@given(q=any_text, earlier=st.lists(any_text, max_size=4))
def test_repeated_is_a_plain_comparison(q, earlier):
    assert isinstance(PR.repeated(q, earlier), bool)
    assert PR.repeated(q, [*earlier, q]) and not PR.repeated(q, [])
    assert PR.repeated(q, ["  " + "  ".join(q.split()) + "\n"])


# --------------------------------------------------------------------------- rewards
@LONG
@given(text=long_text, gold=golds)
def test_reward_is_total_in_range_and_deterministic(text, gold):
    valid = R.is_valid_format(text)
    assert valid == (R.format_error(text) is None)
    assert R.format_error(text) is None or isinstance(R.format_error(text), str)
    blocks = R.information_blocks(text)
    assert isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)
    for kind in ("em", "subem", "f1"):
        for weights in ({}, SEARCH_R1_WEIGHTS):
            res = R.evaluate_response(text, gold, kind=kind, **weights)
            assert repr(R.evaluate_response(text, gold, kind=kind, **weights)) == repr(res)
            assert type(res.score) is float and type(res.metric) is float
            assert res.answer is None or isinstance(res.answer, str)
            assert res.valid_format is valid and res.retrieval_hit is R.retrieval_hit(text, gold)
            assert 0.0 <= res.metric <= 1.0 and 0.0 <= res.score <= 1.0
            if kind != "f1":  # a right answer among several <answer> tags counts a quarter (spam)
                assert res.metric in ((0.0, 1.0) if res.answer_tags <= 1 else (0.0, 1 / R.ANSWER_SPAM_DIVISOR))
            if res.answer is None:
                assert res.metric == res.score == 0.0
            if not weights:
                assert res.score == res.metric
            if valid:  # a well-formed response always has its answer read
                assert res.answer is not None
            assert R.score(text, gold, kind=kind, **weights) == res.score


@FUZZ
@given(text=short_text)
def test_the_answer_is_the_last_outside_information_as_its_regex_defines(text):
    assert R.extract_answer(text) == ref_answer(text)


@FUZZ
@given(pred=any_text | st.sampled_from(WORDS), gold=golds)
def test_metrics_are_bounded_and_consistent(pred, gold):
    e, s, f = R.em(pred, gold), R.subem(pred, gold), R.f1(pred, gold)
    assert e in (0.0, 1.0) and s in (0.0, 1.0) and 0.0 <= f <= 1.0
    assert e <= s  # equal normalised strings contain each other
    n = R.normalize_answer(pred)
    assert R.em(pred, [pred]) == (1.0 if n else 0.0)  # a gold that normalises to "" never matches
    assert isinstance(n, str) and R.normalize_answer(n) == n
    assert R.f1(pred, [pred]) == (1.0 if n else 0.0)
    assert R.f1(pred, gold[:1]) == pytest.approx(R.f1(gold[0], [pred]))  # token F1 is symmetric


# --------------------------------------------------------------------------- reward views
@FUZZ
@given(text=short_text, segments=st.lists(st.tuples(st.sampled_from(["sampled", "observation", "feedback"]),
                                                     short_text), max_size=4))
def test_reward_views_are_what_their_regexes_define(text, segments):
    assert PR.SEARCH_R1.reward_view(text) == text.replace(FEEDBACK_INVALID, PR.INVALID_TURN)
    h = HermesToolCalls()
    view = h.reward_view(text)
    assert isinstance(view, str) and h.reward_view(text) == view
    assert view == ref_hermes_view(text)
    if "<tool_response>" not in text:
        assert view == ref_calls_as_search(ref_hide(text, HERMES_HIDDEN))

    def ref_view(sampled):
        return "".join(sampled(t) if k == "sampled" else f"{PR.OBS_OPEN}{t.strip()}{PR.OBS_CLOSE}"
                       if k == "observation" else PR.INVALID_TURN for k, t in segments)

    assert h.reward_text(text, segments) == ref_view(lambda t: ref_calls_as_search(ref_hide(t, HERMES_HIDDEN)))
    assert PR.SEARCH_R1.reward_text(text, segments) == ref_view(lambda t: ref_hide(t, HERMES_HIDDEN[:2]))
    # who wrote what: every <information> of a rollout's view opens an observation segment (whose
    # text, unlike this fuzz's, the rollout has neutralised)
    from_env = sum(1 + t.count("<information>") for k, t in segments if k == "observation")
    for p in (h, PR.SEARCH_R1):
        assert p.reward_text(text, segments).count("<information>") == from_env


# --------------------------------------------------------------------------- time
def _readers():
    h = HermesToolCalls()
    return {
        "SearchR1Tags.parse": lambda t: PR.SEARCH_R1.parse(t),
        "SearchR1Tags.reward_view": PR.SEARCH_R1.reward_view,
        "HermesToolCalls.parse": lambda t: h.parse(t, NAMES),
        "HermesToolCalls.reward_view": h.reward_view,
        "HermesToolCalls.reward_text": lambda t: h.reward_text(t, [("sampled", t), ("observation", t)]),
        "extract_answer": R.extract_answer,
        "format_error": R.format_error,
        "information_blocks": R.information_blocks,
        "evaluate_response": lambda t: R.evaluate_response(t, ["Paris", t[-300:]], kind="f1", search_cost=0.01,
                                                           **SEARCH_R1_WEIGHTS),
    }


def _assert_fast(text: str, limit_s: float = 2.0) -> None:
    slow = {}
    for name, read in _readers().items():
        t0 = time.perf_counter()
        read(text)
        took = time.perf_counter() - t0
        if took >= limit_s:
            slow[name] = round(took, 1)
    assert not slow, f"seconds on {len(text)} characters ({text[:40]!r}...): {slow}"


ADVERSARIAL = {
    "unclosed <search>": "<search>" * (BIG // 8),
    "unclosed <answer>": "<answer>" * (BIG // 8),
    "unclosed <tool_call>": "<tool_call>" * (BIG // 11),
    "unclosed <search> then an answer": "<search>" * (BIG // 16) + "x" * (BIG // 2) + "<answer>a</answer>",
    "unclosed <answer> then a search": "<answer>" * (BIG // 8) + "<search>q</search>",
    "unclosed <tool_call> then an answer": "<tool_call>" * (BIG // 11) + "<answer>a</answer>",
    "unclosed <information>": "<information>" * (BIG // 13),
    "answers inside information": "<information><answer>x</answer>" * (BIG // 31),
    "</search> runs": "</search>" * (BIG // 18) + "<tool_response>" * (BIG // 30),
    "deep JSON": "<tool_call>" + "[" * BIG + "</tool_call>",
    "deep JSON in a string": '<tool_call>{"name": "search", "arguments": "' + "{" * BIG + '"}</tool_call>',
    "huge integer": "<tool_call>" + "9" * BIG + "</tool_call>",
    "huge float": '<tool_call>{"name": "search", "arguments": {"query": ' + "1" * BIG + '.5}}</tool_call>',
    "escapes": '<tool_call>"' + "\\" * BIG + "</tool_call>",
    "tags": "<think></think><search>" * (BIG // 23),
    "angle brackets": "<" * BIG,
    "NUL and surrogates": "\x00\ud800\udfff" * (BIG // 3),
    "long answer": "<think>x</think><answer>" + "the a an Paris, " * (BIG // 16) + "</answer>",
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_a_200_kb_adversarial_text_is_read_in_linear_time(name):
    """Regression: `<(search|answer)>(.*?)</\\1>` (and the `<answer>`, `<tool_call>` regexes)
    retried every unclosed opening tag against the rest of the text: ~20 s for 200 KB of
    `<answer>`, in parse (every turn) and in the reward (every response)."""
    _assert_fast(ADVERSARIAL[name])


@settings(LONG, max_examples=8)
@given(piece=_piece())
def test_any_piece_repeated_to_200_kb_is_read_in_linear_time(piece):
    _assert_fast(_repeat(piece, BIG, BIG) + piece)
