"""The observation path, whole: a tool's output -> observation text -> observation token ids.

`format_passages` (Search-R1's passage formatting), `format_observation` (the protocol's
framing: `<information>` tags, or the chat template's tool message), `encode_observation` (ids,
truncated to `data.max_obs_length` with the closing frame kept), and `tool_observation`, the one
way a tool's output (search passages, the calculator, MCP servers, a user's tool) becomes ids:
tags neutralised, capped in bytes before tokenising, cut in tokens, and the text kept is the
text the policy read. The rollout manager, the demonstration builder and the benchmarks all
call these, so an observation has the same ids wherever it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agent_rl.rollout.protocol import OBS_CLOSE, OBS_OPEN, encode_text, neutralize_tags, special_texts
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


@dataclass
class Observation:
    """A tool's output as the policy read it: `ids` (framed, at most max_obs_length), `text`
    (the output inside the frame as those ids hold it: what rewards score and checkpoints
    keep), `truncated` (the output was cut, in bytes or tokens)."""

    ids: list[int]
    text: str
    truncated: bool


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
    obs = _cut(tokenizer, docs_text.strip(), max_obs_length, frame)
    return obs.ids, obs.truncated


def _cut(tokenizer: Any, text: str, max_obs_length: int, frame: tuple[str, str]) -> Observation:
    """`encode_observation`'s cut, with the text its ids hold (`text` is stripped)."""
    if max_obs_length < 0:
        raise ValueError(f"max_obs_length must be >= 0, got {max_obs_length}")
    ids = encode_text(tokenizer, format_observation(text, frame))
    if len(ids) <= max_obs_length:
        return Observation(ids, text, False)
    head, tail = encode_text(tokenizer, frame[0]), encode_text(tokenizer, frame[1])
    room = max_obs_length - len(head) - len(tail)
    if room < 0:  # room == 0: the frame alone still fits, and the block stays closed
        return Observation(ids[:max_obs_length], "", True)
    body = encode_text(tokenizer, text)[:room]
    return Observation(head + body + tail, tokenizer.decode(body), True)


# ----------------------------------------------------------------------------- tool output
BYTES_PER_TOKEN = 32
"""Bytes of tool output tokenised per observation token allowed: far more than any text needs
(English ~4, CJK ~3-6), so the byte cap only binds on output that would be cut anyway."""


def cap_bytes(text: str, limit: int) -> tuple[str, bool]:
    """(the longest prefix of `text` of at most `limit` UTF-8 bytes, whether it was cut). Only
    the first `limit` characters are encoded (a character is at least a byte), so the work is
    bounded whatever the output's size; what cannot be encoded (a lone surrogate) becomes "?"."""
    data = text[:limit].encode("utf-8", "replace")
    return data[:limit].decode("utf-8", "ignore"), len(text) > limit or len(data) > limit


def tool_observation(tokenizer: Any, output: str, max_obs_length: int,
                     frame: tuple[str, str] = (OBS_OPEN, OBS_CLOSE)) -> Observation:
    """A tool's output in `frame` as the policy reads it: its tags neutralised (`neutralize_tags`,
    with the tokenizer's special tokens), at most `max_obs_length * BYTES_PER_TOKEN` bytes
    tokenised (an MCP server's output has no size limit of its own), cut to `max_obs_length`
    tokens with the closing frame kept (`encode_observation`); `.text` is the part the ids
    hold, so the reward can only pay for text the model saw."""
    limit = max(1, max_obs_length) * BYTES_PER_TOKEN
    text, cut = cap_bytes(output, limit)
    # the escapes lengthen the text: capped again
    text, cut_escaped = cap_bytes(neutralize_tags(text, special_texts(tokenizer)).strip(), limit)
    obs = _cut(tokenizer, text, max_obs_length, frame)
    obs.truncated = obs.truncated or cut or cut_escaped
    return obs
