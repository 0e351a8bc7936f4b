"""The reward's answer normalisation (issue 83): a gold answer that normalises to "" never
matches (case 2); Unicode forms of an answer match their plain forms by default, and
`reward.normalize=squad` keeps Search-R1's scores bit for bit (case 15)."""

from __future__ import annotations

import re
import string
import unicodedata

import pytest

from agent_rl.config.schema import RewardConfig
from agent_rl.rollout import reward as R

SEARCH_R1_WEIGHTS = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.1}


# --------------------------------------------------------------------------- case 2
@pytest.mark.parametrize("gold", ["", "The", ".", "a", "an"])
def test_an_empty_answer_scores_nothing_against_a_gold_that_normalises_to_nothing(gold):
    """The issue's probe: `<answer></answer>` against [""] or ["The"] scored EM 1.0, and any
    answer scored subem 1.0."""
    assert R.score("<think>x</think><answer></answer>", [gold]) == 0.0
    assert R.em("", [gold]) == R.subem("any text", [gold]) == R.f1("", [gold]) == 0.0


@pytest.mark.parametrize("gold", ["", "The", ".", "a", "an", " the ", "A."])
@pytest.mark.parametrize("normalize", ["unicode", "squad"])
def test_a_gold_that_normalises_to_nothing_never_matches(gold, normalize):
    for kind in ("em", "subem", "f1"):
        metric = R.get_metric(kind)
        assert metric("", [gold], normalize=normalize) == 0.0
        assert metric("anything at all", [gold], normalize=normalize) == 0.0
        for response in ("<think>x</think><answer></answer>", "<think>x</think><answer>The</answer>"):
            res = R.evaluate_response(response, [gold], kind=kind, normalize=normalize)
            assert res.metric == res.score == 0.0
    # "" is inside every passage: it is no retrieval hit either
    searched = "<think>x</think><search>q</search><information>Doc 1 text</information><think>y</think><answer></answer>"
    assert not R.retrieval_hit(searched, [gold], normalize=normalize)
    assert R.score(searched, [gold], **SEARCH_R1_WEIGHTS) == 0.2  # well-formed, wrong: no retrieval bonus


def test_the_other_golds_of_the_row_still_match():
    assert R.em("Paris", ["The", "Paris"]) == 1.0 and R.em("", ["The", "Paris"]) == 0.0
    assert R.subem("it is paris", [".", "paris"]) == 1.0 and R.subem("it is rome", [".", "paris"]) == 0.0
    assert R.f1("paris france", ["", "Paris"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="golden_answers is empty"):
        R.em("x", [])  # no gold at all is still a caller's error


# --------------------------------------------------------------------------- case 15
UNICODE_PAIRS = [  # (as a model or a dataset may write it, the plain form)
    (unicodedata.normalize("NFD", "Beyoncé"), "Beyoncé"),
    ("Guns N’ Roses", "Guns N' Roses"),
    ("\uff30\uff41\uff52\uff49\uff53", "Paris"),  # full-width letters
    ("“The Hobbit”", '"The Hobbit"'),
    ("Jay–Z", "Jay-Z"),
    ("1914–1918", "1914-1918"),
    ("co\u00adoperation", "cooperation"),  # soft hyphen
]


@pytest.mark.parametrize("written,plain", UNICODE_PAIRS)
def test_unicode_forms_match_their_plain_forms_by_default(written, plain):
    assert R.score(f"<think>x</think><answer>{written}</answer>", [plain]) == 1.0
    assert R.normalize_answer(written) == R.normalize_answer(plain)
    for kind in ("em", "subem", "f1"):
        assert R.get_metric(kind)(written, [plain]) == 1.0 and R.get_metric(kind)(plain, [written]) == 1.0
    info = f"<think>x</think><search>q</search><information>Doc 1 ({written}) text</information><think>y</think>"
    assert R.retrieval_hit(info + "<answer>no</answer>", [plain])
    assert RewardConfig().normalize == "unicode"
    assert R.evaluate_response(f"<think>x</think><answer>{written}</answer>", [plain], RewardConfig()).score == 1.0


# Search-R1 verl/utils/reward_score/qa_em.py (= SQuAD v1.1's evaluate-v1.1.py), verbatim in substance
def _search_r1_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _search_r1_em_check(prediction, golden_answers):
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    normalized_prediction = _search_r1_normalize_answer(prediction)
    score = 0
    for golden_answer in golden_answers:
        golden_answer = _search_r1_normalize_answer(golden_answer)
        if golden_answer == normalized_prediction:
            score = 1
            break
    return score


def _search_r1_subem_check(prediction, golden_answers):
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    normalized_prediction = _search_r1_normalize_answer(prediction)
    score = 0
    for golden_answer in golden_answers:
        golden_answer = _search_r1_normalize_answer(golden_answer)
        if golden_answer in normalized_prediction:
            score = 1
            break
    return score


TEXTS = ["Paris", "the Eiffel Tower!", "  An  apple. ", "Beyoncé", unicodedata.normalize("NFD", "Beyoncé"),
         "Guns N’ Roses", "Guns N' Roses", "\uff30\uff41\uff52\uff49\uff53", "“Paris”", "Jay–Z", "Jay-Z",
         "İstanbul", "STRASSE", "Straße", "1,000", "U.S.A.", "a.n", "théâtre", "ﬁsh", "fish"]


@pytest.mark.parametrize("text", TEXTS)
def test_squad_mode_is_search_r1_bit_for_bit(text):
    assert R.normalize_answer(text, "squad") == _search_r1_normalize_answer(text)
    if text.isascii():  # the default differs only where Unicode does
        assert R.normalize_answer(text) == _search_r1_normalize_answer(text)
    cfg = RewardConfig(normalize="squad")
    # on every gold that normalises to something: one that normalises to "" ("a.n") is the
    # one deliberate difference (case 2; Search-R1 matches it with any subem prediction)
    golds = [g for g in (text, "Rome") if _search_r1_normalize_answer(g)]
    for pred in TEXTS:
        assert R.em(pred, golds, normalize="squad") == _search_r1_em_check(pred, golds)
        assert R.subem(pred, golds, normalize="squad") == _search_r1_subem_check(pred, golds)
        assert R.evaluate_response(f"<think>x</think><answer>{pred}</answer>", golds, cfg).metric == \
            _search_r1_em_check(pred, golds)


def test_squad_mode_keeps_the_unicode_misses_search_r1_has():
    assert _search_r1_subem_check("Paris", ["a.n"]) == 1 and R.subem("Paris", ["a.n"], normalize="squad") == 0.0
    nfd = unicodedata.normalize("NFD", "Beyoncé")
    assert R.em(nfd, ["Beyoncé"], normalize="squad") == 0.0 and R.em(nfd, ["Beyoncé"]) == 1.0
    assert R.score("<think>x</think><answer>Guns N’ Roses</answer>", ["Guns N' Roses"], normalize="squad") == 0.0
    with pytest.raises(ValueError, match="unknown normalisation 'nfc'"):
        R.em("x", ["x"], normalize="nfc")
