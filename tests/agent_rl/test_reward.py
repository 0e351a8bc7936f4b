"""Rewards: SQuAD normalisation, EM / SubEM / F1, answer extraction, format check, score."""

import pytest

from agent_rl.config import RewardConfig
from agent_rl.rollout.reward import (
    em,
    evaluate_response,
    extract_answer,
    f1,
    format_error,
    get_metric,
    is_valid_format,
    normalize_answer,
    retrieval_hit,
    score,
    subem,
)


# ----------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Cat", "cat"),  # case + leading article
        ("a dog and an apple", "dog and apple"),  # articles anywhere, as whole words only
        ("theater anthem bathe", "theater anthem bathe"),  # "the"/"an"/"a" inside words stay
        ("Hello, World!!", "hello world"),  # punctuation
        ("U.S.A.", "usa"),
        ("rock'n'roll", "rocknroll"),
        ("  lots\tof \n whitespace  ", "lots of whitespace"),
        ("The  Beatles' (band)", "beatles band"),
        ("the-the", "thethe"),  # punctuation removed BEFORE articles, as in the official script
        ("", ""),
    ],
)
def test_normalize_answer_squad_cases(raw, norm):
    assert normalize_answer(raw) == norm


# ----------------------------------------------------------------------------- metrics
def test_em_and_subem():
    assert em("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert em("Eiffel", ["eiffel tower", "tour eiffel"]) == 0.0
    assert em("paris", "Paris") == 1.0  # a single gold string is accepted
    assert subem("It is Paris, France.", ["paris"]) == 1.0
    assert subem("paris", ["paris france"]) == 0.0  # gold must be inside the prediction
    with pytest.raises(ValueError, match="golden_answers is empty"):
        em("x", [])


def test_f1_hand_values():
    # [quick, brown, fox] vs [quick, brown, dog]: 2 common, P = R = 2/3 -> F1 = 2/3
    assert f1("the quick brown fox", ["quick brown dog"]) == pytest.approx(2 / 3)
    # vs "obama": P = 1/2, R = 1 -> 2/3; vs "president barack obama": P = 1, R = 2/3 -> 0.8; max
    assert f1("Barack Obama", ["obama", "president barack obama"]) == pytest.approx(0.8)
    # repeated tokens count once per gold occurrence: common 1, P = 1/2, R = 1 -> 2/3
    assert f1("paris paris", ["Paris"]) == pytest.approx(2 / 3)
    assert f1("london", ["paris"]) == 0.0
    assert f1("", ["paris"]) == 0.0


def test_metric_registry():
    assert get_metric("em") is em and get_metric("subem") is subem and get_metric("f1") is f1
    with pytest.raises(ValueError, match=r"unknown reward kind 'bleu'; known: \['em', 'f1', 'subem'\]"):
        get_metric("bleu")


# ----------------------------------------------------------------------------- extraction
def test_extract_last_answer():
    text = "<think>x</think><answer> first </answer> later <answer>\n Second one \n</answer>"
    assert extract_answer(text) == "Second one"
    assert extract_answer("<think>no answer here</think>") is None
    assert extract_answer("<answer>unclosed") is None


def test_answer_inside_information_does_not_count():
    retrieved = "<information>Doc 1(Title: X) the <answer>Wrong</answer> quote</information>"
    text = f"<think>a</think><search>q</search>\n\n{retrieved}\n\n<think>b</think><answer>Right</answer>"
    assert extract_answer(text) == "Right"
    only_retrieved = f"<think>a</think><search>q</search>{retrieved}"
    assert extract_answer(only_retrieved) is None
    # an observation cut off by the length limit (no closing tag) is still retrieved text
    truncated = "<think>a</think><search>q</search><information>Doc 1 <answer>Wrong</answer> and more"
    assert extract_answer(truncated) is None
    assert score(only_retrieved, ["wrong"]) == 0.0


# ----------------------------------------------------------------------------- format
ONE_TURN = "<think>I know this.</think>\n<answer>Paris</answer>"
TWO_TURNS = (
    "<think>need to look it up</think>\n<search>capital of france</search>\n\n"
    "<information>Doc 1(Title: France) Paris is the capital. <think> stray tag in a passage"
    "</information>\n\n<think>found it</think>\n<answer>Paris</answer>\n"
)


@pytest.mark.parametrize("text", [ONE_TURN, TWO_TURNS])
def test_valid_formats(text):
    assert is_valid_format(text), format_error(text)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<answer>Paris</answer>", "unexpected tag <answer> in state start"),  # no think first
        ("<think>a</think> so <answer>Paris</answer>", "unexpected text 'so'"),
        (ONE_TURN + " trailing", "unexpected text 'trailing' in state end"),
        (ONE_TURN + "<think>again</think><answer>x</answer>", "unexpected tag <think> in state end"),
        ("<think>a</think>", "incomplete: ended in state after_think"),
        ("<think>a <answer>x</answer></think>", "unexpected tag <answer> in state in_think"),
        ("<think>a</think><search>q</search><answer>x</answer>", "unexpected tag <answer> in state after_search"),
        ("<think>a</think><answer>Paris", "incomplete: ended in state in_answer"),
        ("", "incomplete: ended in state start"),
    ],
)
def test_invalid_formats(text, reason):
    assert not is_valid_format(text)
    assert reason in format_error(text)


def test_retrieval_hit():
    assert retrieval_hit(TWO_TURNS, ["The Paris"])
    assert not retrieval_hit(TWO_TURNS, ["Lyon"])
    assert not retrieval_hit(ONE_TURN, ["Paris"])  # the answer itself is not retrieved text


# ----------------------------------------------------------------------------- score
def test_plain_outcome_scores():
    assert score(ONE_TURN, ["paris"]) == 1.0
    assert score(ONE_TURN, ["lyon"]) == 0.0
    assert score("<think>hmm</think>", ["paris"]) == 0.0
    assert score("no tags, just Paris", ["paris"]) == 0.0  # no <answer>: nothing to score
    assert score("<answer>Paris</answer>", ["paris"]) == 1.0  # malformed, but no format weights
    # qa_em's format_score: an extracted but wrong answer earns it; no answer still 0
    assert score(ONE_TURN, ["lyon"], format_score=0.1) == 0.1
    assert score("<think>hmm</think>", ["paris"], format_score=0.1) == 0.0
    assert score(ONE_TURN.replace("Paris", "Paris France"), ["paris"], RewardConfig(kind="subem")) == 1.0
    assert score(ONE_TURN.replace("Paris", "Paris France"), ["paris"], kind="f1") == pytest.approx(2 / 3)


def test_search_r1_v03_format_reward_table():
    w = RewardConfig(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    malformed_right = "<answer>Paris</answer>"
    malformed_wrong = "<answer>Lyon</answer>"
    # The values Search-R1's qa_em_format.compute_score_em comments give for weights 0.2/0.1/0.1:
    assert score(ONE_TURN, ["paris"], w) == 1.0  # well-formed, right
    assert score(ONE_TURN, ["lyon"], w) == pytest.approx(0.2)  # well-formed, wrong
    assert score(TWO_TURNS.replace("<answer>Paris", "<answer>Lyon"), ["capital"], w) == pytest.approx(0.3)
    assert score(malformed_right, ["paris"], w) == pytest.approx(0.8)  # right answer, bad format
    assert score(malformed_wrong, ["paris"], w) == pytest.approx(0.1)  # wrong answer, bad format
    assert score("<think>no answer", ["paris"], w) == 0.0
    # retrieval bonus only for well-formed responses
    assert score(TWO_TURNS.replace("<think>found", "found <think>"), ["lyon", "capital"], w) == pytest.approx(0.1)


def test_search_cost_charges_right_answers_per_search():
    w = dict(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    three = TWO_TURNS.replace("<think>found it", "<think>once more</think>\n<search>again</search>\n\n<information>Doc 1(Title: X) y"
                              "</information>\n\n<think>found it")
    assert is_valid_format(three)
    # right: 1 minus 0.05 a search (0, 1, 2 searches)
    assert score(ONE_TURN, ["paris"], search_cost=0.05, **w) == pytest.approx(1.0)
    assert score(TWO_TURNS, ["paris"], search_cost=0.05, **w) == pytest.approx(0.95)
    assert score(three, ["paris"], search_cost=0.05, **w) == pytest.approx(0.90)
    # malformed right answer: 0.8 minus the searches; f1's partial credit pays the same per search
    assert score("<information>a</information><answer>Paris</answer>", ["paris"], search_cost=0.05, **w) == pytest.approx(0.75)
    assert score(TWO_TURNS.replace("<answer>Paris", "<answer>Paris France"), ["paris"], kind="f1",
                 search_cost=0.05) == pytest.approx(2 / 3 - 0.05)
    # wrong answers pay nothing: 0.3 with the gold in the retrieved text, 0.2 without, 0.1 malformed
    assert score(TWO_TURNS.replace("<answer>Paris", "<answer>Lyon"), ["capital"], search_cost=0.05, **w) == pytest.approx(0.3)
    assert score(three.replace("<answer>Paris", "<answer>Lyon"), ["rome"], search_cost=0.05, **w) == pytest.approx(0.2)
    assert score("<information>a</information><answer>Lyon</answer>", ["paris"], search_cost=0.05, **w) == pytest.approx(0.1)
    assert score(TWO_TURNS, ["paris"], RewardConfig(search_cost=0.05)) == pytest.approx(0.95)  # read from the config


def test_evaluate_response_breakdown_and_bad_settings():
    res = evaluate_response(TWO_TURNS, ["paris"], RewardConfig())
    assert (res.score, res.metric, res.answer, res.valid_format, res.retrieval_hit) == (1.0, 1.0, "Paris", True, True)
    with pytest.raises(ValueError, match="unknown reward setting"):
        score(ONE_TURN, ["paris"], formatscore=0.1)
    with pytest.raises(ValueError, match="unknown reward kind"):
        score(ONE_TURN, ["paris"], kind="exact")
