"""Outcome rewards: plain functions of (response_text, golden_answers), response only.

Semantics follow Search-R1 (`verl/utils/reward_score/qa_em.py`, `qa_em_format.py`) and the
official SQuAD v1.1 evaluation script, with these deliberate differences:

1. Search-R1 scores prompt + response and therefore needs at least TWO `<answer>` matches
   (the prompt's instructions contain one). We score the response only, so one is enough:
   the answer is the LAST `<answer>...</answer>` of the response.
2. Retrieved text never counts as the model's answer: `<information>...</information>`
   blocks (and an unclosed one cut off by the length limit) are removed before extraction,
   so a passage that happens to contain `<answer>x</answer>` cannot score.
3. Only the environment writes an observation: a rollout is scored on its protocol's
   `reward_text`, where `<information>` blocks are exactly the tool outputs it appended and
   the same tags in the model's own text are quoted; an invalid turn breaks the structure.
   So retrieval and format credit cannot be earned without a search (`score_trajectory`).
4. More than one `<answer>` tag is answer spam: a right answer counts a quarter.
5. Normalisation (`normalize`, `data_prep.normalize`): by default Unicode forms match their
   plain forms (NFKC, typographic quotes and dashes as ASCII, then SQuAD's steps);
   `normalize="squad"` is SQuAD's / Search-R1's bit for bit. In both, a gold answer that
   normalises to "" ("The", ".") matches nothing; Search-R1 matches it with an empty answer
   (em) or with any text (subem, retrieval).

Entry points: `score_trajectory(traj, golden_answers, cfg)`, what the trainer, evaluation and
benchmarks call (it reads the protocol's reward view, never raw response text);
`evaluate_response(reward_text, golden_answers, cfg)` returns the breakdown of such a view, and
`score` its reward alone, with a `RewardConfig` (or keyword overrides).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from agent_rl.rollout.protocol import (ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, INVALID_TURN, REWARD_TAGS, SEARCH_R1,
                                       ActionProtocol, tag_blocks)
from data_prep.normalize import DEFAULT as DEFAULT_NORMALIZE, normalize_answer

# ----------------------------------------------------------------------------- normalisation
# `normalize_answer` (data_prep.normalize) is the one normalisation of the metrics, the QA
# readers and the train/test overlap check. `reward.normalize`: ``unicode`` (default: NFKC,
# typographic quotes and dashes as ASCII, then SQuAD's steps; ASCII text normalises as in
# SQuAD) or ``squad`` (SQuAD v1.1 / Search-R1 bit for bit, to reproduce their scores).


def _golds(golden_answers: str | Iterable[str]) -> list[str]:
    golds = [golden_answers] if isinstance(golden_answers, str) else [str(g) for g in golden_answers]
    if not golds:
        raise ValueError("golden_answers is empty: a QA row needs at least one gold answer")
    return golds


def _gold_forms(golden_answers: str | Iterable[str], normalize: str) -> list[str]:
    """The normalised gold answers, less those that normalise to "": such a gold ("The", ".",
    "") equals an empty answer and is inside any text, so it never matches (the QA readers
    drop them already; this holds for rows built by hand too). None left scores 0."""
    return [form for form in (normalize_answer(g, normalize) for g in _golds(golden_answers)) if form]


# ----------------------------------------------------------------------------- metrics
METRICS: dict[str, Callable[..., float]] = {}


def register_metric(name: str):
    """Decorator: register an outcome metric `fn(prediction, golden_answers, normalize=...) ->
    float in [0,1]` (`normalize`: a `data_prep.normalize` mode)."""

    def decorator(fn):
        METRICS[name] = fn
        return fn

    return decorator


def get_metric(name: str) -> Callable[..., float]:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown reward kind {name!r}; known: {sorted(METRICS)}") from None


@register_metric("em")
def em(prediction: str, golden_answers: str | Iterable[str], normalize: str = DEFAULT_NORMALIZE) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer (never one that
    normalises to "")."""
    return float(normalize_answer(prediction, normalize) in _gold_forms(golden_answers, normalize))


@register_metric("subem")
def subem(prediction: str, golden_answers: str | Iterable[str], normalize: str = DEFAULT_NORMALIZE) -> float:
    """1.0 if a normalised gold answer is a substring of the normalised prediction (never
    one that normalises to "", which every text contains)."""
    pred = normalize_answer(prediction, normalize)
    return float(any(gold in pred for gold in _gold_forms(golden_answers, normalize)))


@register_metric("f1")
def f1(prediction: str, golden_answers: str | Iterable[str], normalize: str = DEFAULT_NORMALIZE) -> float:
    """SQuAD v1.1 token F1 between normalised prediction and gold, max over gold answers."""
    pred = normalize_answer(prediction, normalize).split()
    best = 0.0
    for gold in _gold_forms(golden_answers, normalize):
        ref = gold.split()
        same = sum((Counter(pred) & Counter(ref)).values())
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(ref)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ----------------------------------------------------------------------------- parsing
ANSWER_SPAM_DIVISOR = 4.0
"""A right answer among several `<answer>` tags is worth 1/4 (veRL search_r1_like_qa_em)."""
_INFO_BLOCK = re.compile(f"{INFO_OPEN}(.*?)(?:{INFO_CLOSE}|\\Z)", re.DOTALL)
_TAG = re.compile(f"(</?(?:{'|'.join(REWARD_TAGS)})>|{re.escape(INVALID_TURN)})")


def strip_information(response_text: str) -> str:
    """The response without its `<information>` blocks (an unclosed one runs to the end)."""
    return _INFO_BLOCK.sub(" ", response_text)


def information_blocks(response_text: str) -> list[str]:
    """Texts of the `<information>` blocks (retrieved passages) in the response."""
    return [b.strip() for b in _INFO_BLOCK.findall(response_text)]


def extract_answer(response_text: str) -> str | None:
    """The last `<answer>...</answer>` outside `<information>` blocks, stripped; None if none."""
    answers = [inner for _, inner in tag_blocks(strip_information(response_text), "answer")]
    return answers[-1].strip() if answers else None


# Allowed tag transitions of a well-formed response (state, tag) -> next state.
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("after_information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "after_information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}


def format_error(response_text: str) -> str | None:
    """Why the response is not well-formed, or None if it is.

    Rule (Search-R1 v0.3 `is_valid_sequence`, applied to the response only):
        response := ( <think>..</think> <search>..</search> <information>..</information> )*
                    <think>..</think> <answer>..</answer>
    with only whitespace between blocks and after the final `</answer>`, and no nested
    tags. Difference: inside `<information>` everything up to `</information>` is opaque
    retrieved text, so tags quoted in a passage cannot break (or fake) the structure. A
    rollout's view marks an invalid turn with `protocol.INVALID_TURN`, a tag no state accepts.
    """
    state = "start"
    for part in _TAG.split(response_text):
        if not part:
            continue
        is_tag = _TAG.fullmatch(part) is not None
        if state == "in_information" and part != "</information>":
            continue
        if is_tag:
            nxt = _TRANSITIONS.get((state, part))
            if nxt is None:
                return f"unexpected tag {part} in state {state}"
            state = nxt
        elif part.strip() and not state.startswith("in_"):
            return f"unexpected text {part.strip()[:40]!r} in state {state}"
    return None if state == "end" else f"incomplete: ended in state {state}"


def is_valid_format(response_text: str) -> bool:
    """True iff `format_error(response_text)` finds nothing (see its rule)."""
    return format_error(response_text) is None


def retrieval_hit(response_text: str, golden_answers: str | Iterable[str], normalize: str = DEFAULT_NORMALIZE) -> bool:
    """A normalised gold answer occurs in a normalised `<information>` block (Search-R1's
    `is_retrieval_correct`)."""
    golds = _gold_forms(golden_answers, normalize)
    return any(g in normalize_answer(block, normalize) for block in information_blocks(response_text) for g in golds)


# ----------------------------------------------------------------------------- score
@dataclass
class RewardResult:
    score: float
    """The reward."""
    metric: float
    """Outcome metric (em / subem / f1) of the extracted answer; 0 without an answer."""
    answer: str | None
    """Extracted answer (None: no `<answer>` outside `<information>`)."""
    valid_format: bool
    """`is_valid_format` of the response."""
    retrieval_hit: bool
    """A gold answer appears in the retrieved text."""
    answer_tags: int = 0
    """`<answer>` tags the model wrote (outside `<information>`); more than one is spam."""


_SETTINGS = {
    "kind": "em",
    "format_score": 0.0,
    "structure_format_score": 0.0,
    "final_format_score": 0.0,
    "retrieval_score": 0.0,
    "search_cost": 0.0,
    "normalize": DEFAULT_NORMALIZE,
}


def _settings(cfg, overrides: dict) -> dict:
    unknown = set(overrides) - set(_SETTINGS)
    if unknown:
        raise ValueError(f"unknown reward setting(s) {sorted(unknown)}; known: {sorted(_SETTINGS)}")
    out = {k: getattr(cfg, k, d) if cfg is not None else d for k, d in _SETTINGS.items()}
    out.update(overrides)
    return out


def evaluate_response(response_text: str, golden_answers: str | Iterable[str], cfg=None, **overrides) -> RewardResult:
    """Reward and its breakdown. `cfg` is a `RewardConfig`; keyword overrides win.

    Plain outcome reward (all format weights 0): the metric of the extracted answer, 0
    without one; `format_score` > 0 gives an extracted but wrong answer at least that much
    (Search-R1 `qa_em.compute_score_em`).

    Search-R1 v0.3 format reward (any of structure_format_score, final_format_score,
    retrieval_score > 0; `qa_em_format.compute_score_em`), with s the metric:
        well-formed:                 max(s, structure_format_score + retrieval_score * hit)
        malformed, answer, s > 0:    max(s - structure_format_score, final_format_score)
        malformed, answer, s = 0:    final_format_score
        malformed, no answer:        0
    For em / subem (s in {0, 1}) this is exactly Search-R1's table (1; 0.2 or 0.3; 0.8; 0.1;
    0 with its weights 0.2 / 0.1 / 0.1); the max() only matters for partial f1 scores.
    `format_score` is ignored in this mode, as in Search-R1.

    `search_cost` (not Search-R1's; 0 leaves its reward as above): a right answer (s > 0)
    loses search_cost for each `<information>` block (search) in the response.

    Who wrote what: `response_text` is a reward view (`score_trajectory`), in which every
    `<information>` block is a real tool output, so `retrieval_hit` and the structure can only
    be earned by searching. Answer spam: the rollout stops at the first `</answer>`, so an
    honest response holds one `<answer>` tag; with more (hedged, nested or unclosed answers) s
    counts a quarter (veRL's `search_r1_like_qa_em` factor, which it applies past 10 tags
    because it has no stop string).
    """
    st = _settings(cfg, overrides)
    metric_fn = get_metric(st["kind"])
    golds = _golds(golden_answers)
    answer = extract_answer(response_text)
    s = metric_fn(answer, golds, normalize=st["normalize"]) if answer is not None else 0.0
    answer_tags = strip_information(response_text).count(ANSWER_OPEN)
    if answer_tags > 1:
        s /= ANSWER_SPAM_DIVISOR
    valid = is_valid_format(response_text)
    hit = retrieval_hit(response_text, golds, st["normalize"])

    sfs, ffs, rs = st["structure_format_score"], st["final_format_score"], st["retrieval_score"]
    if not (sfs or ffs or rs):
        reward = 0.0 if answer is None else max(s, float(st["format_score"]))
    elif valid:
        reward = max(s, sfs + (rs if hit else 0.0))
    elif answer is None:
        reward = 0.0
    else:
        reward = max(s - sfs, ffs) if s > 0 else ffs
    if st["search_cost"] and s > 0:
        reward -= st["search_cost"] * len(information_blocks(response_text))
    return RewardResult(score=float(reward), metric=s, answer=answer, valid_format=valid, retrieval_hit=hit,
                        answer_tags=answer_tags)


def score(response_text: str, golden_answers: str | Iterable[str], cfg=None, **overrides) -> float:
    """The reward of one response (see `evaluate_response` for the rules)."""
    return evaluate_response(response_text, golden_answers, cfg, **overrides).score


def score_trajectory(traj: Any, golden_answers: Sequence[str] | None = None, reward_cfg: Any = None,
                     protocol: ActionProtocol = SEARCH_R1) -> RewardResult:
    """The reward of a trajectory, read from the view its protocol made (`traj.reward_text`,
    set by the rollout) or, for a trajectory without one, from
    `protocol.reward_view(traj.response_text)`: never from raw response text, where Search-R1's
    feedback could be read as an answer. Only `reward_text` knows who wrote each piece (module
    docstring, 3): every rollout sets it; saved text without one is read as best it can be.
    Trainer, evaluation and benchmarks call this."""
    text = getattr(traj, "reward_text", None)
    if text is None:
        text = protocol.reward_view(traj.response_text)
    golds = golden_answers if golden_answers is not None else traj.golden_answers
    return evaluate_response(text, golds, reward_cfg)
