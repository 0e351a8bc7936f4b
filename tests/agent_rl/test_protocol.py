"""The action protocols: prompts, parsing, feedback, framing, reward views (tokenizer only, fast)."""

from __future__ import annotations

import pytest

from agent_rl.rollout import observation as O
from agent_rl.rollout import protocol as PR
from agent_rl.rollout.protocol import SEARCH_R1 as P


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def test_base_template_is_search_r1_make_prefix_verbatim():
    # Search-R1 scripts/data_process/nq_search.py make_prefix(template_type="base"), with the
    # question preprocessed as its process_fn does (strip, add "?").
    expected = (
        "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
        "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
        "by <search> query </search> and it will return the top searched results between <information> and "
        "</information>. You can search as many times as your want. If you find no further external knowledge "
        "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
        "illustrations. For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
    )
    assert P.prompt_text("  who wrote hamlet ") == expected


def test_build_prompt_ids_base_and_chat(tok):
    base = P.prompt_ids(tok, "who wrote hamlet", template="base")
    assert tok.decode(base) == P.prompt_text("who wrote hamlet")
    chat = P.prompt_ids(tok, "who wrote hamlet", template="chat")
    text = tok.decode(chat)
    assert P.prompt_text("who wrote hamlet") in text
    assert text.endswith("<|im_start|>assistant\n")  # add_generation_prompt=True
    assert chat.count(tok.convert_tokens_to_ids("<|im_start|>")) >= 2  # special tokens, not text
    ref = tok.apply_chat_template(
        [{"role": "user", "content": P.prompt_text("who wrote hamlet")}], add_generation_prompt=True, tokenize=False
    )
    assert chat == tok.encode(ref, add_special_tokens=False)


def test_modes_and_bad_arguments(tok):
    assert "<search>" not in P.prompt_text("q", mode="direct")
    rag = P.prompt_text("q", mode="rag", docs_text="Doc 1(Title: X) y\n")
    assert "Doc 1(Title: X) y" in rag and "<search>" not in rag
    with pytest.raises(ValueError, match="docs_text"):
        P.prompt_text("q", mode="rag")
    with pytest.raises(ValueError, match="rollout mode must be one of"):
        P.prompt_text("q", mode="cot")
    with pytest.raises(ValueError, match="unknown template"):
        P.prompt_ids(tok, "q", template="llama")
    with pytest.raises(ValueError, match="empty question"):
        P.prompt_text("   ")


def test_observation_format_and_token_truncation(tok):
    docs = "Doc 1(Title: Kradholt) Kradholt is a city.\nDoc 2(Title: B) text\n"
    assert O.format_observation(docs) == (
        "\n\n<information>Doc 1(Title: Kradholt) Kradholt is a city.\nDoc 2(Title: B) text</information>\n\n"
    )
    ids, cut = O.encode_observation(tok, docs, max_obs_length=1000)
    assert not cut and tok.decode(ids) == O.format_observation(docs)
    assert ids == tok.encode(O.format_observation(docs), add_special_tokens=False)  # no BOS/EOS
    head = tok.encode("\n\n<information>", add_special_tokens=False)
    tail = tok.encode("</information>\n\n", add_special_tokens=False)
    body = tok.encode(docs.strip(), add_special_tokens=False)
    n = len(head) + 3 + len(tail)
    short, cut = O.encode_observation(tok, docs, max_obs_length=n)
    # cut in tokens, not characters, and inside the block: the closing tag always survives
    assert cut and short == head + body[:3] + tail and len(short) == n
    text = tok.decode(short)
    assert text.startswith("\n\n<information>Doc") and text.endswith("</information>\n\n")
    assert text.count("</information>") == 1
    assert O.encode_observation(tok, docs, max_obs_length=len(ids)) == (ids, False)  # exactly fits: untouched
    empty, cut = O.encode_observation(tok, docs, max_obs_length=len(head) + len(tail))  # the frame alone: still closed
    assert cut and empty == head + tail
    tiny, cut = O.encode_observation(tok, docs, max_obs_length=len(head) + len(tail) - 1)  # no room: the block is cut
    assert cut and tiny == ids[: len(head) + len(tail) - 1]


def test_feedback_text_is_search_r1s():
    assert PR.FEEDBACK_INVALID == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
        "Let me try again.\n"
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<think>x</think> <search> capital of X </search>", ("search", "capital of X")),
        ("<answer> Paris </answer>", ("answer", "Paris")),
        ("<answer> a <search> q </search>", ("search", "q")),  # unclosed answer: the search counts
        ("<search>\nmulti\nline</search>", ("search", "multi\nline")),
        ("no tags at all", (None, "")),
        ("<search> q </answer>", (None, "")),  # mismatched tags are invalid
    ],
)
def test_parse_action(text, expected):
    a = P.parse(text)
    got = {"tool": ("search", a.query), "answer": ("answer", a.content), "invalid": (None, "")}[a.kind]
    assert got == expected


def test_reward_never_reads_the_invalid_action_feedback_as_an_answer():
    from agent_rl.rollout.protocol import FEEDBACK_INVALID
    from agent_rl.rollout.reward import evaluate_response

    reward_view = P.reward_view

    # A model that never answers: only the environment's feedback mentions <answer>.
    text = "<think>hmm</think> I am not sure." + FEEDBACK_INVALID + "still not sure"
    assert evaluate_response(text, ["and"]).answer == "and"  # the trap reward_view avoids
    res = evaluate_response(reward_view(text), ["and"], format_score=0.2)
    assert res.answer is None and res.score == 0.0
    # The model's own answer after the feedback is still read.
    res = evaluate_response(reward_view(text + "<answer>Paris</answer>"), ["Paris"])
    assert res.answer == "Paris" and res.score == 1.0
