"""Prompt templates, the action protocol and the one tokenization path for rollouts and demos.

Everything that turns text into ids for a trajectory lives here, so the rollout manager and
the cold-start demonstration builder produce identical ids for identical content:
`build_prompt_ids` (prompt), `encode_observation` (retrieved passages), `encode_text` (feedback
and error messages). Texts mirror Search-R1 (PeterGriffinJin/Search-R1:
scripts/data_process/nq_search.py `make_prefix`, search_r1/llm_agent/generation.py
`execute_predictions` / `postprocess_predictions`).
"""

from __future__ import annotations

import re
from typing import Any

# Search-R1's base-model instruction, verbatim (including "as many times as your want").
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

# Evaluation baselines (no search action): same answer format so the same reward applies.
DIRECT_INSTRUCTION = (
    "Answer the given question. "
    "Provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
RAG_INSTRUCTION = (
    "Answer the given question using the retrieved documents below. "
    "Provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>.\n"
    "Documents:\n{docs}\n"
    "Question: {question}\n"
)
INSTRUCTIONS = {"agent": SEARCH_R1_INSTRUCTION, "direct": DIRECT_INSTRUCTION, "rag": RAG_INSTRUCTION}

# Search-R1's feedback for a turn with neither a search nor an answer (mask 0).
FEEDBACK_INVALID = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def reward_view(response_text: str) -> str:
    """The response as rewards see it: the invalid-action feedback removed. Its text quotes
    `<answer> and </answer>`, which the reward would otherwise read as the model's answer
    ("and"). Retrieved <information> blocks are removed by the reward itself."""
    return response_text.replace(FEEDBACK_INVALID, "\n")


# Shown (inside <information>) when the retriever fails after its retries; not in Search-R1,
# which has no failure path (its requests.post would raise and kill the whole batch).
SEARCH_ERROR_TEXT = "Search failed: the search engine is unavailable. No results."

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def normalize_question(question: str) -> str:
    """Search-R1's preprocessing: strip, and end with a question mark."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    return q if q.endswith("?") else q + "?"


def prompt_text(question: str, mode: str = "agent", docs_text: str | None = None) -> str:
    """Instruction + question for `mode` in {"agent", "direct", "rag"} (rag needs docs_text)."""
    if mode not in INSTRUCTIONS:
        raise ValueError(f"unknown prompt mode {mode!r}; expected one of {sorted(INSTRUCTIONS)}")
    if mode == "rag" and docs_text is None:
        raise ValueError("mode='rag' needs docs_text (the retrieved passages)")
    return INSTRUCTIONS[mode].format(question=normalize_question(question), docs=(docs_text or "").strip())


def build_prompt_ids(
    tokenizer: Any,
    question: str,
    template: str = "chat",
    mode: str = "agent",
    docs_text: str | None = None,
) -> list[int]:
    """Token ids of the prompt.

    template="base": the instruction text as is (Search-R1's base-model template), tokenized
    with the tokenizer's special tokens (BOS where the model uses one).
    template="chat": one user message holding the same text, through the tokenizer's chat
    template with add_generation_prompt=True (instruct models); the rendered text already has
    its special tokens, so it is encoded with add_special_tokens=False.
    """
    text = prompt_text(question, mode, docs_text)
    if template == "base":
        return list(tokenizer.encode(text, add_special_tokens=True))
    if template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("template='chat' but the tokenizer has no chat template; use template='base'")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(rendered, add_special_tokens=False))
    raise ValueError(f"unknown template {template!r}; expected 'base' or 'chat'")


OBS_OPEN, OBS_CLOSE = "\n\n<information>", "</information>\n\n"
"""The observation block's framing (`format_observation`)."""


def format_observation(docs_text: str) -> str:
    """Search-R1's observation block (generation.py: `.strip()` of the passages, then tags)."""
    return f"{OBS_OPEN}{docs_text.strip()}{OBS_CLOSE}"


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of a piece of non-sampled text appended to a trajectory (no special tokens)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_observation(tokenizer: Any, docs_text: str, max_obs_length: int) -> tuple[list[int], bool]:
    """Ids of the observation block for `docs_text`, at most `max_obs_length` tokens; the
    boolean says whether the passages were cut.

    Truncation is in tokens, as Search-R1's `_process_next_obs`, but the cut falls on the
    passages, not on the block: the ids are those of `OBS_OPEN`, the first passage tokens
    that fit, then `OBS_CLOSE`. Search-R1 cuts the whole block, which drops the closing
    `</information>`: the model then reads an unclosed block, writes its next turn inside it,
    and its answer there counts as retrieved text (no `<answer>` outside `<information>`).
    Only when `max_obs_length` cannot hold the two tags is the block itself cut.
    """
    if max_obs_length < 0:
        raise ValueError(f"max_obs_length must be >= 0, got {max_obs_length}")
    ids = encode_text(tokenizer, format_observation(docs_text))
    if len(ids) <= max_obs_length:
        return ids, False
    head, tail = encode_text(tokenizer, OBS_OPEN), encode_text(tokenizer, OBS_CLOSE)
    room = max_obs_length - len(head) - len(tail)
    if room <= 0:
        return ids[:max_obs_length], True
    return head + encode_text(tokenizer, docs_text.strip())[:room] + tail, True


def parse_action(text: str) -> tuple[str | None, str]:
    """(action, content) of one turn's text: the first `<search>..</search>` or
    `<answer>..</answer>` (Search-R1 `postprocess_predictions`); (None, "") when neither."""
    m = _ACTION_RE.search(text)
    if m is None:
        return None, ""
    return m.group(1), m.group(2).strip()
