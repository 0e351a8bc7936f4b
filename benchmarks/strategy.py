"""The two search strategies the lookalike kind tells apart, and which one a search followed.

- **name only**: the entity's name and what is asked ("Orla Venn birth year"): what the
  demonstrations search, what a user would script;
- **name + attribute**: the same with the attribute the question gives to tell the person from
  namesakes ("Orla Venn Varnholt birth year"): the better one on the lookalike kind.

benchmarks/kb_headroom.py scripts both (from a KB row's query columns); benchmarks/rl_vs_sft
tells which one a policy's own searches followed (from the queries and the question's
attributes). Pure: it reads text and KB rows, and runs nothing.
"""

from __future__ import annotations

NAME_ONLY = "name only"
WITH_ATTRIBUTE = "name + attribute"
STRATEGIES = (NAME_ONLY, WITH_ATTRIBUTE)
"""The strategies in the tables' order: the demonstrations' first."""
BETTER = WITH_ATTRIBUTE
"""The strategy that tells namesakes apart (the lookalike kind's headroom above imitation)."""
QUERY_COLUMNS = {NAME_ONLY: "hop_queries", WITH_ATTRIBUTE: "attribute_queries"}
"""Strategy -> the KB row's column its scripted queries come from (benchmarks/kb_headroom.py)."""


def query_strategy(query: str, question: dict) -> str | None:
    """The strategy (STRATEGIES) a search `query` follows on a KB question (its row of the KB's
    test.parquet): "name + attribute" when it holds one of the attributes the question gives to
    tell namesakes apart (the lookalike kind's `hop_attributes`, any case), "name only" when it
    holds none; None where the row has none (the standard kind): n/a in the tables."""
    given = question.get("hop_attributes")  # a list, or the numpy array of a parquet row
    attributes = [a.lower() for a in (list(given) if given is not None else []) if isinstance(a, str) and a]
    if not attributes:
        return None
    q = query.lower()
    return BETTER if any(a in q for a in attributes) else NAME_ONLY


def search_queries(trajectory: str) -> list[str]:
    """The queries an agent trajectory's text searched (Search-R1's <search> blocks: the benchmark's
    protocol; tags inside an observation are neutralised, so only the model's own count)."""
    from agent_rl.rollout.protocol import tag_blocks

    return [q.strip() for _, q in tag_blocks(trajectory, "search")]


def trajectory_strategy(trajectory: str, question: dict) -> str | None:
    """A trajectory's strategy on its question: the better one when any of its searches held the
    question's attribute, "name only" when every search that can be told held none, None when
    none can be told (no search, or the standard kind)."""
    said = {query_strategy(q, question) for q in search_queries(trajectory)}
    return BETTER if BETTER in said else NAME_ONLY if NAME_ONLY in said else None


def better_share(counts: dict[str, int]) -> float | None:
    """The share of the searches told apart that follow the better strategy; None (n/a) when none was."""
    told = sum(counts.get(s, 0) for s in STRATEGIES)
    return counts.get(BETTER, 0) / told if told else None
