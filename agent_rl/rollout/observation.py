"""The observation path, whole: retrieved passages -> observation text -> observation token ids.

`format_passages` (Search-R1's passage formatting), `format_observation` (the protocol's
framing: `<information>` tags, or the chat template's tool message), `encode_observation` (ids,
truncated to `data.max_obs_length` with the closing frame kept). The rollout manager, the demonstration builder and the benchmarks all
call these, so an observation has the same ids wherever it is built.
"""

from __future__ import annotations

from typing import Any, Sequence

from agent_rl.rollout.protocol import OBS_CLOSE, OBS_OPEN, encode_text
from retriever_server.schemas import ScoredDocument

# Shown (inside <information>) when the retriever fails after its retries; not in Search-R1,
# which has no failure path (its requests.post would raise and kill the whole batch).
SEARCH_ERROR_TEXT = "Search failed: the search engine is unavailable. No results."


def rejected_query_text(detail: str) -> str:
    """Shown when the retriever refused the policy's own query (e.g. longer than its
    max_query_chars): the policy's mistake, scored like any other turn, not an outage."""
    return f"Search failed: the search engine rejected the query ({detail[:200]}). No results."


def split_passage(item: ScoredDocument | dict) -> tuple[str, str]:
    """(title, text) of one search result: the first line of its contents as is (Search-R1
    keeps the corpus' quotes), and the remaining lines."""
    doc = item.document if isinstance(item, ScoredDocument) else item["document"]
    content = doc.contents if hasattr(doc, "contents") else doc["contents"]
    title, _, text = content.partition("\n")
    return title, text


def format_passages(docs: Sequence[ScoredDocument | dict]) -> str:
    """Search-R1's `_passages2string` (search_r1/llm_agent/generation.py): title = first line of
    contents as is, text = the remaining lines (`split_passage`)."""
    out = ""
    for i, item in enumerate(docs):
        title, text = split_passage(item)
        out += f"Doc {i + 1}(Title: {title}) {text}\n"
    return out


def format_observation(docs_text: str, frame: tuple[str, str] = (OBS_OPEN, OBS_CLOSE)) -> str:
    """The observation block: `.strip()` of the tool's output inside the protocol's frame
    (Search-R1's `<information>` tags by default; a chat template's tool message for native
    tool calls, `protocol.HermesToolCalls.observation_frame`)."""
    return f"{frame[0]}{docs_text.strip()}{frame[1]}"


def encode_observation(tokenizer: Any, docs_text: str, max_obs_length: int,
                       frame: tuple[str, str] = (OBS_OPEN, OBS_CLOSE)) -> tuple[list[int], bool]:
    """Ids of the observation block for `docs_text` in `frame`, at most `max_obs_length`
    tokens; the boolean says whether the passages were cut.

    Truncation is in tokens, as Search-R1's `_process_next_obs`, but the cut falls on the
    passages, not on the block: the ids are those of `OBS_OPEN`, the first passage tokens
    that fit, then `OBS_CLOSE`. Search-R1 cuts the whole block, which drops the closing
    `</information>`: the model then reads an unclosed block, writes its next turn inside it,
    and its answer there counts as retrieved text (no `<answer>` outside `<information>`).
    Only when `max_obs_length` cannot hold the two tags is the block itself cut.
    """
    if max_obs_length < 0:
        raise ValueError(f"max_obs_length must be >= 0, got {max_obs_length}")
    ids = encode_text(tokenizer, format_observation(docs_text, frame))
    if len(ids) <= max_obs_length:
        return ids, False
    head, tail = encode_text(tokenizer, frame[0]), encode_text(tokenizer, frame[1])
    room = max_obs_length - len(head) - len(tail)
    if room <= 0:
        return ids[:max_obs_length], True
    return head + encode_text(tokenizer, docs_text.strip())[:room] + tail, True
