"""What a demonstration searches and says: query plans from a QA row, grounding checks, and
the wording of the scripted model turns.

Queries: the data's own decomposition when it has one (`hop_queries`, the knowledge base's
hops: a bridge question searches hop 1, then hop 2 with the intermediate answer; a
comparison searches both entities; or MuSiQue's `question_decomposition`, with `#k` replaced
by the k-th answer), else the question itself. A candidate that cannot become a grounded
demonstration raises `Drop` with one of `DROP_REASONS`.

Search chains (`chain_candidates`): when the question's own search does not retrieve a gold
answer, a second search can start from what the first one showed: the row's supporting
titles (HotpotQA's `supporting_facts`, MuSiQue's supporting paragraphs, as `support_titles`)
and the names the first observation mentions that the question does not. The demonstration
builder keeps a chain only when a gold answer first appears in the second observation.

Wording (`write_segments`): the first think says what the question asks for where the data
names it (the knowledge base's relation), the first query, and how many searches that takes;
each think after an observation says what it found and "That was search i of n" right before
searching on or answering. So the one choice a demonstration teaches, one search or two, is one
token of the opening, next to the two phrases it compares: a choice a few GRPO steps can move.
That phrasing is the knowledge base's: `kb_phrasing=False` (`agent-rl-prep demos
--plain-wording`) leaves out what the question asks for, the count and "That was search i of
n", for plain Search-R1 think / search / answer turns.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_rl.rollout.reward import normalize_answer
from agent_rl.rollout.protocol import SEARCH_R1, ActionProtocol

DROP_REASONS = {
    "no_query": "the row gives no usable search query",
    "too_many_searches": "the decomposition needs more searches than --max-searches",
    "prompt_too_long": "the prompt exceeds data.max_prompt_length",
    "retriever_rejected": "the retriever rejected a query (4xx)",
    "hop_answer_not_retrieved": "a hop's observation does not contain that hop's answer",
    "answer_not_retrieved": "no observation contains a gold answer",
    "no_chain": "no observation contains a gold answer, nor that of a second search from the first one",
    "turn_too_long": "a model turn exceeds rollout.max_tokens_per_turn",
    "too_long": "the trajectory exceeds data.max_response_length",
}



# ----------------------------------------------------------------------------- queries
@dataclass
class Plan:
    """What one QA row's demonstration will search: queries and, when known, hop answers."""

    queries: list[str]
    hop_answers: list[str | None]
    comparison: bool = False
    chain: bool = False
    """A search chain: the second query is a name the first observation mentions."""
    asks: str | None = None
    """What the question asks for, where the data says (the knowledge base's relation: "birth
    year" for "When was the founder of X born?", as for "When was X born?")."""


class Drop(Exception):
    """A candidate that cannot become a grounded demonstration; `reason` is a DROP_REASONS key."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in DROP_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):  # ragged columns may arrive as JSON text (data_prep.qa)
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else []


def _musique_hops(decomposition: list) -> tuple[list[str], list[str | None]]:
    """MuSiQue sub-questions with `#k` replaced by the k-th sub-answer (1-based)."""
    queries, answers = [], []
    for step in decomposition:
        if not isinstance(step, dict) or not str(step.get("question") or "").strip():
            return [], []
        q = re.sub(r"#(\d+)", lambda m: str(answers[int(m.group(1)) - 1]) if 0 < int(m.group(1)) <= len(answers)
                   else m.group(0), str(step["question"]))
        queries.append(q.strip())
        answers.append(str(step["answer"]).strip() if step.get("answer") else None)
    return queries, answers


def row_kind(row: dict) -> str:
    """A QA row's question kind (`kind`, else HotpotQA's `type`); "" where the data names none."""
    return str(row.get("kind") or row.get("type") or "")


def plan_queries(row: dict, max_searches: int) -> Plan:
    """The searches of `row`'s demonstration (see the module docstring); raises Drop."""
    queries = [str(q).strip() for q in _as_list(row.get("hop_queries"))]
    answers: list[str | None] = [str(a).strip() for a in _as_list(row.get("hop_answers"))]
    if not queries and row.get("question_decomposition") is not None:
        queries, answers = _musique_hops(_as_list(row.get("question_decomposition")))
    if not queries:
        queries, answers = [str(row.get("question") or "").strip()], [None]
    if len(answers) != len(queries):
        answers = [None] * len(queries)
    if not all(queries):
        raise Drop("no_query", "empty query")
    if len(queries) > max_searches:
        raise Drop("too_many_searches", f"{len(queries)} > {max_searches}")
    kind = row_kind(row)
    relation = str(row.get("relation") or "").strip()
    asks = relation.split(">")[-1].replace("_", " ") if relation and kind != "comparison" else None
    return Plan(queries, answers, comparison=kind == "comparison", asks=asks)


_WORD = r"[A-Z](?:[\w'&-]|\.(?=\w))*"  # a capitalised word; inner dots only ("U.S")
_NAME = re.compile(rf"{_WORD}(?: +(?:(?:of|the|de|and|for|in|on|von|van|la|le|du|del|da) +)*{_WORD})*")
_NOT_NAMES = {"the", "a", "an", "in", "on", "at", "he", "she", "it", "they", "his", "her", "its", "their", "this",
              "that", "there", "these", "those", "after", "before", "during", "when", "while", "however", "doc",
              "title", "as", "by", "for", "from", "with", "of", "to", "and", "but", "or", "if", "i", "we", "you",
              "each", "every", "some", "many", "most", "other", "one", "two", "three", "both", "all", "also", "since",
              "although", "following", "later", "early", "until", "according", "between", "among", "despite",
              "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
              "november", "december", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}


def support_titles(row: dict) -> list[str]:
    """The row's supporting-paragraph titles (`data_prep.qa` keeps them from HotpotQA's and
    MuSiQue's official schemas), in order."""
    return [str(t).strip() for t in _as_list(row.get("support_titles")) if str(t).strip()]


def chain_candidates(question: str, observation: str, titles: Sequence[str] = (), limit: int = 4) -> list[str]:
    """Second-search queries for a chain: the supporting `titles`, then the capitalised names
    in `observation` (in order of appearance) that are neither in the question nor titles of
    the observed passages, nor common words (a one-word name must not also occur in lower
    case: "Each", "Summer"); at most `limit`, no repeats."""
    seen_q = _words(question)
    shown = {_words(t) for t in re.findall(r"\(Title: ([^)]*)\)", observation)}
    body = re.sub(r"Doc \d+\(Title: [^)]*\)", " ", observation)
    lower = set(re.findall(r"\b[a-z][a-z'-]*\b", body))
    out: list[str] = []
    keys: set[str] = set()
    for cand in [*titles, *(m.group(0).rstrip(".-'") for m in _NAME.finditer(body))]:
        key = _words(cand)
        if not key or key in keys or key in _NOT_NAMES or key == _words(question):
            continue
        if cand not in titles and (key in shown or f" {key} " in f" {seen_q} " or len(key) < 3
                                   or (" " not in key and key in lower)):
            continue
        keys.add(key)
        out.append(cand)
        if len(out) == limit:
            break
    return out


# ----------------------------------------------------------------------------- grounding
def _words(text: str) -> str:
    # SQuAD normalisation keeps non-ASCII punctuation ("(1940–1999)"): split on it too (the
    # reward's default, unicode, would map the dash to "-" and drop it, joining the years)
    return " ".join(re.sub(r"[^\w\s]", " ", normalize_answer(text, "squad")).split())


def contains(text: str, answer: str) -> bool:
    """`answer` occurs in `text` as whole words after SQuAD normalisation (so "1850" does not
    match inside "18503", nor "Ann" inside "Annette"; it does inside "(1850–1901)")."""
    a = _words(answer)
    return bool(a) and f" {a} " in f" {_words(text)} "


def grounded_answer(golden_answers: Sequence[str], observations: Sequence[str]) -> str | None:
    """The first gold answer (in the data's order: canonical first) found in an observation."""
    for g in golden_answers:
        if any(contains(o, g) for o in observations):
            return str(g).strip()
    return None


# ----------------------------------------------------------------------------- wording
# Several phrasings per step (chosen per row), so SFT teaches the format and the use of the
# retrieved text, not one string. `{q}` is a hop query, `{a}` its answer.
_FIRST = [  # a search chain: how many searches it takes shows only in the first observation
    "I need to find {q}.",
    "To answer this, I should look up {q}.",
    "I do not know {q} yet, so I will search for it.",
    "Let me search for {q}.",
    "The question asks about {q}. I will search for it.",
    "First I need {q}.",
]
# The openings name the first search, then say how many searches the question takes. A
# one-search and a many-search opening differ only in the count, which follows the query:
# so the decision, answer after one observation or search again, is taken where the model
# has read the question and written the query ("author of The Zocond Bridge" needs a second
# search, "Buskstead country" does not), not at the opening's first word. (When the two
# lists had different phrasings, an SFT model picked one phrasing for every question, and
# with it one count.)
_OPENINGS = [
    "I need to find {q}.",
    "Let me look up {q}.",
    "The question asks about {q}.",
    "I will search for {q}.",
]
_ASKS = "The question asks for the {asks}."
"""Before the opening, where the data names it: the count that follows is then whether the query
just written names what the question asks for ("birth year" in "Ann Lee birth year": 1 search;
not in "founder of X": 2). SFT learns the phrase quickly and the comparison slowly: that
comparison is what GRPO has to teach."""
_SEARCHES = "This needs {n} search{s}."
"""After the opening's query: "This needs 1 search." / "This needs 2 searches." (a digit, which
the count after each observation copies)."""
_FACTS = [  # after an observation: what it said, before the count
    "The results show {q}: {a}.",
    "According to the documents, {q} is {a}.",
    "I found {q}: {a}.",
    "So {q} is {a}.",
    "The information says {q}: {a}.",
    "The documents say {q}: {a}.",
]
_FACT_UNKNOWN = "The documents help with the first part."
_DONE = "That was search {i} of {n}."
"""Said after each observation, right where the model chooses between searching again and
answering: the count copies the opening's ("This needs 2 searches" -> "search 1 of 2"), and the
choice follows the count. Without it the count is idle: a model can open with one count and
choose otherwise after the first observation. With it the choice is one token of the opening,
where GRPO's credit lands."""
_THEN_SEARCH = [
    "Next I need {q2}.",
    "Now I will search for {q2}.",
    "I still need {q2}.",
    "Now I need {q2}.",
]
_THEN_ANSWER = [
    "So the answer is {ans}.",
    "The answer is {ans}.",
]
_CHAIN_NEXT = [
    "The documents mention {e}, but not the answer. I will search for {e}.",
    "{e} may lead to the answer. Let me search for it.",
    "I need to know more about {e}.",
    "The results point to {e}. Next I will look up {e}.",
]
_FINAL_COMPARE = [  # short: the answer turn must fit rollout.max_tokens_per_turn
    "{q0} is {a0} and {q} is {a}. The answer is {ans}.",
    "Comparing {a0} with {a}, the answer is {ans}.",
    "So it is {a0} against {a}. The answer is {ans}.",
    "{q}: {a}, the other {a0}. The answer is {ans}.",
]
_YEAR_PAIRS = [  # two years, each before its entity; then _EARLIER
    "{a0} for {e0}, {a1} for {e1}.",
    "{a0} for {e0} and {a1} for {e1}.",
    "{a0} for {e0}; {a1} for {e1}.",
]
_EARLIER = "The earlier year is {lo} for {ans}."
""""{year} for {entity}" twice: the answer is the words that followed the earlier year the
first time, a copy a small model makes (it named the wrong entity after "1788 is before 1831"
when the two years stood apart from their entities). One phrase before the earlier year: with
short ones ("So", "Earlier:") an SFT model went on listing year-entity pairs until the turn's
64 tokens ran out."""
_FINAL_UNKNOWN = [
    "The documents mention {ans}. So the answer is {ans}.",
    "Based on the retrieved information, the answer is {ans}.",
    "The search results say {ans}, which answers the question.",
    "The information points to {ans}.",
]


def _numbers(*texts: str) -> list[int] | None:
    """The texts as integers (years), or None when one is not a whole number."""
    return [int(t) for t in texts] if all(str(t).strip().isdigit() for t in texts) else None


def _entities(queries: Sequence[str]) -> list[str]:
    """The queries without the words they all end with ("Ann Lee birth year", "Bo Li birth
    year" -> "Ann Lee", "Bo Li"); the queries themselves when that would leave one empty."""
    words = [q.split() for q in queries]
    k = min(len(os.path.commonprefix([w[::-1] for w in words])), min(map(len, words)) - 1)
    return [" ".join(w[:len(w) - k]) for w in words]


def _turn(think: str, action: str) -> str:
    return f"<think> {think} </think>\n{action}"


def write_segments(plan: Plan, answer: str, rng: random.Random, protocol: ActionProtocol = SEARCH_R1,
                   kb_phrasing: bool = True) -> list[str]:
    """The model turns of a demonstration: one per search, then the answer turn, each action
    written in `protocol`'s form (`<search> q </search>`, or a native tool call).

    `kb_phrasing`: say what the question asks for (`_ASKS`, where the data names it), how many
    searches it needs (`_SEARCHES`) and which search each observation answered (`_DONE`), the
    phrasing made for the knowledge base's questions. False: none of them, plain Search-R1
    think / search / answer turns with the same phrasings otherwise (the same `rng` draws)."""
    qs, ans = plan.queries, plan.hop_answers
    n = len(qs)

    def done(i: int) -> list[str]:  # a chain says no count: how many searches shows in its first observation
        return [_DONE.format(i=i, n=n)] if kb_phrasing and not plan.chain else []

    if plan.chain:
        first = rng.choice(_FIRST).format(q=qs[0])
    else:
        first = rng.choice(_OPENINGS).format(q=qs[0])
        if kb_phrasing:
            first = f"{first} {_SEARCHES.format(n=n, s='es' if n > 1 else '')}"
            if plan.asks:
                first = f"{_ASKS.format(asks=plan.asks)} {first}"
    segments = [_turn(first, protocol.write_call("search", {"query": qs[0]}))]
    for i in range(1, n):
        if plan.chain:
            think = rng.choice(_CHAIN_NEXT).format(e=qs[i])
        else:
            fact = _FACT_UNKNOWN if ans[i - 1] is None else rng.choice(_FACTS).format(q=qs[i - 1], a=ans[i - 1])
            think = " ".join([fact, *done(i), rng.choice(_THEN_SEARCH).format(q2=qs[i])])
        segments.append(_turn(think, protocol.write_call("search", {"query": qs[i]})))
    last_q, last_a = qs[-1], ans[-1]
    if last_a is None:
        said = [*done(n), rng.choice(_FINAL_UNKNOWN).format(ans=answer)]
    elif plan.comparison and n >= 2 and ans[-2] is not None:
        years = _numbers(ans[-2], last_a)
        if years:
            e0, e1 = _entities(qs[-2:])
            lo = ans[-2] if years[0] <= years[1] else last_a
            said = [*done(n), rng.choice(_YEAR_PAIRS).format(a0=ans[-2], e0=e0, a1=last_a, e1=e1),
                    _EARLIER.format(lo=lo, ans=answer)]
        else:
            said = [*done(n), rng.choice(_FINAL_COMPARE).format(q=last_q, a=last_a, q0=qs[-2], a0=ans[-2], ans=answer)]
    else:
        said = [rng.choice(_FACTS).format(q=last_q, a=last_a), *done(n), rng.choice(_THEN_ANSWER).format(ans=answer)]
    think = " ".join(said)
    segments.append(_turn(think, protocol.write_answer(answer)))
    for s in segments:  # the engine would have stopped at the first closing action tag
        closes = [m.start() for m in re.finditer("|".join(map(re.escape, protocol.stop)), s)]
        if len(closes) != 1 or not s.endswith(">"):
            raise ValueError(f"demonstration turn must close exactly one action, at its end: {s!r}")
    return segments


# ----------------------------------------------------------------------------- scripted rollout
