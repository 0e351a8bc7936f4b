"""Prompt templates, the action protocol and the one tokenization path for rollouts and demos.

Everything that turns text into ids for a trajectory lives here, so the rollout manager and
the cold-start demonstration builder produce identical ids for identical content:
`build_prompt_ids` (prompt), `encode_text` (feedback and error messages); the observation
block (retrieved passages) is built from these in `agent_rl.rollout.observation`. Texts mirror Search-R1 (PeterGriffinJin/Search-R1:
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


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of a piece of non-sampled text appended to a trajectory (no special tokens)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def parse_action(text: str) -> tuple[str | None, str]:
    """(action, content) of one turn's text: the first `<search>..</search>` or
    `<answer>..</answer>` (Search-R1 `postprocess_predictions`); (None, "") when neither."""
    m = _ACTION_RE.search(text)
    if m is None:
        return None, ""
    return m.group(1), m.group(2).strip()
