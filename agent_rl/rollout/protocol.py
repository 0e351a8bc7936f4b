"""What the model may say, in one place: the action protocol of a rollout.

A protocol says how the policy calls a tool and gives its answer, where generation stops, what
it reads back, the feedback for a turn that is neither, and the view of a response that the
reward scores. The rollout manager, the demonstration builder, evaluation, the trainer and the
benchmarks all read it from here (`get_protocol(name)`), chosen by
`actor_rollout_ref.rollout.protocol`:

- `search_r1` (`SearchR1Tags`, the default): Search-R1's tags. `<search> q </search>`, results
  in `<information> .. </information>` inside the same assistant turn, `<answer> a </answer>`.
  Texts verbatim from Search-R1 (scripts/data_process/nq_search.py `make_prefix`,
  search_r1/llm_agent/generation.py). Only the search tool exists in this protocol.
- `hermes` (`HermesToolCalls`): native tool calls as Qwen2.5/Qwen3, Hermes and most instruct
  models emit them, `<tool_call>{"name": .., "arguments": {..}}</tool_call>`; results come back
  as tool messages rendered by the model's own chat template (or, for a template without a
  tool role, `FALLBACK` below), and the answer is `<answer> a </answer>` as in Search-R1, so the
  same rewards apply. Any tool of the config may be called (veRL: `multi_turn.format=hermes`).

The prompt modes `agent | rag | direct` are a separate axis (`MODES`): whether tools are
offered, and whether the question's passages are retrieved once into the prompt.

Standard library only; tokenizers are used through their methods (`encode`, `decode`,
`apply_chat_template`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

# ----------------------------------------------------------------------------- prompt modes


@dataclass(frozen=True)
class Mode:
    """How a question is put to the model: `tools` offered (multi-turn agent) or not (one turn),
    and whether passages for the question are retrieved once into the prompt (rag)."""

    name: str
    tools: bool
    retrieve_first: bool


MODES: dict[str, Mode] = {
    "agent": Mode("agent", tools=True, retrieve_first=False),
    "rag": Mode("rag", tools=False, retrieve_first=True),
    "direct": Mode("direct", tools=False, retrieve_first=False),
}


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"rollout mode must be one of {tuple(MODES)}, got {name!r}") from None


# ----------------------------------------------------------------------------- shared texts
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
REWARD_TAGS = ("think", "search", "information", "answer")
"""The tags of the view a reward reads (agent_rl.rollout.reward's grammar)."""

OBS_OPEN, OBS_CLOSE = "\n\n" + INFO_OPEN, INFO_CLOSE + "\n\n"
"""Search-R1's observation block framing (generation.py: `.strip()` of the passages, then tags)."""
INVALID_TURN = "<invalid_turn/>"
"""What a reward view shows where the environment answered an invalid turn: a tag the reward
grammar has no transition for, so a trajectory with an invalid turn is never well-formed (in
Search-R1 the feedback's own quoted tags break `is_valid_sequence` the same way), and the turns
on either side of it can never be read as one."""

# Evaluation baselines (no tools): the same answer format, so the same reward applies.
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


def normalize_question(question: str) -> str:
    """Search-R1's preprocessing: strip, and end with a question mark."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    return q if q.endswith("?") else q + "?"


@dataclass
class Action:
    """One turn's action: `kind` is "tool" (`tool`, `arguments`), "answer" (`content`) or
    "invalid" (`error` says why: None for a turn with neither action)."""

    kind: str
    tool: str | None = None
    arguments: Any = None
    content: str = ""
    error: str | None = None

    @property
    def query(self) -> str | None:
        """The search query of a search call (for repeated-query counting)."""
        if self.kind == "tool" and self.tool == "search" and isinstance(self.arguments, dict):
            q = self.arguments.get("query")
            return q if isinstance(q, str) else None
        return None


Segment = tuple[str, str]
"""(kind, text) of a piece of a response in order: kind "sampled" (a model turn's text, cut at
its stop string), "observation" (a tool's output as the model reads it, unframed) or
"feedback" (the protocol's message for an invalid turn)."""


# ----------------------------------------------------------------------------- base
class ActionProtocol:
    """The interface; subclasses fill it in. An instance may be bound to a tokenizer
    (`bind`), which template-derived protocols need for their framing."""

    name: str = ""
    stop: tuple[str, ...] = ()

    def bind(self, tokenizer: Any, tools: Sequence[Any] = ()) -> "ActionProtocol":
        return self

    def check_tools(self, names: Iterable[str]) -> None:
        """Raise ValueError if this protocol cannot offer these tools."""

    # prompts
    def instruction(self, mode: Mode) -> str:
        raise NotImplementedError

    def prompt_text(self, question: str, mode: str = "agent", docs_text: str | None = None) -> str:
        """Instruction + question (rag needs `docs_text`, the retrieved passages)."""
        m = get_mode(mode)
        if m.retrieve_first and docs_text is None:
            raise ValueError("mode='rag' needs docs_text (the retrieved passages)")
        return self.instruction(m).format(question=normalize_question(question), docs=(docs_text or "").strip())

    def prompt_ids(self, tokenizer: Any, question: str, template: str = "chat", mode: str = "agent",
                   docs_text: str | None = None) -> list[int]:
        raise NotImplementedError

    # turns
    def parse(self, text: str, tool_names: Iterable[str] = ("search",)) -> Action:
        raise NotImplementedError

    def write_call(self, tool: str, arguments: dict) -> str:
        """The text of a turn's tool call (demonstrations)."""
        raise NotImplementedError

    def write_answer(self, answer: str) -> str:
        return f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"

    def turn_end_ids(self) -> list[int]:
        """The ids a model writes to close its turn in the chat format (demonstrations end each
        model turn with them, so a cold-started model can end its turns where no stop string
        does: a chat server, TRL's tool loop). None here: Search-R1's turns end at their tags."""
        return []

    def feedback(self, action: Action) -> str:
        """The message the policy reads after an invalid turn."""
        raise NotImplementedError

    def observation_frame(self) -> tuple[str, str]:
        """Text before and after a tool's output (never truncated)."""
        raise NotImplementedError

    def feedback_frame(self, action: Action) -> tuple[str, str]:
        """Text before and after the invalid-turn feedback."""
        return "", ""

    # rewards
    model_hidden_tags: tuple[str, ...] = (INFO_OPEN, INFO_CLOSE)
    """Reward tags only the environment writes: in the model's own text they are quoted."""

    def reward_view(self, response_text: str) -> str:
        """A saved, decoded response as rewards read it. Saved text cannot tell who wrote an
        `<information>` block: rollouts score `reward_text`, which can."""
        raise NotImplementedError

    def reward_text(self, response_text: str, segments: Sequence[Segment]) -> str:
        """The view of a finished rollout that rewards score, built from its segments (who
        wrote each piece), in Search-R1's tag grammar (`<think>`, `<search>`, `<information>`,
        `<answer>`).

        The rule (the reward contract, docs/architecture.md): only the environment writes an
        observation. An `<information>` block of the view is exactly one tool output the
        rollout appended (loss mask 0); the same tags in text the model sampled are quoted
        (`hide_tags`), so they are neither a retrieval hit nor structure, and a trajectory with
        no tool call can be well-formed only as `<think>..</think><answer>..</answer>`, the
        protocol's "no search". An invalid turn's feedback becomes `INVALID_TURN`, which no
        well-formed view holds, so turns cannot be glued into a grammar none of them wrote."""
        out = []
        for kind, text in segments:
            if kind == "sampled":
                out.append(self.sampled_view(hide_tags(text, self.model_hidden_tags)))
            elif kind == "observation":
                out.append(f"{OBS_OPEN}{text.strip()}{OBS_CLOSE}")
            else:
                out.append(INVALID_TURN)
        return "".join(out)

    def sampled_view(self, text: str) -> str:
        """One model turn in the reward grammar (its hidden tags already quoted)."""
        return text


def hide_tags(text: str, tags: Iterable[str]) -> str:
    """`text` with each of `tags` (exact, as the reward grammar reads them) written with
    `&lt;`/`&gt;`: quoted text, not a tag."""
    for tag in tags:
        if tag in text:
            text = text.replace(tag, tag.replace("<", "&lt;").replace(">", "&gt;"))
    return text


# ----------------------------------------------------------------------------- Search-R1 tags
SEARCH_R1_INSTRUCTION = (  # verbatim, including "as many times as your want"
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
FEEDBACK_INVALID = (  # Search-R1's feedback for a turn with neither a search nor an answer
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def tag_blocks(text: str, tag: str) -> Iterator[tuple[int, str]]:
    """(start, inner text) of each `<tag>..</tag>` in order, as `re.finditer(r"<tag>(.*?)</tag>",
    text, re.DOTALL)` finds them, in linear time. Once an opening tag has no closing tag after it,
    no later one has either; the regex tried each against the rest of the text, so a model
    writing 200 KB of unclosed `<answer>` held every parse and reward ~20 s (quadratic)."""
    head, tail = f"<{tag}>", f"</{tag}>"
    i = 0
    while (a := text.find(head, i)) >= 0:
        b = text.find(tail, a + len(head))
        if b < 0:
            return
        yield a, text[a + len(head): b]
        i = b + len(tail)


def _first_block(text: str, tags: Sequence[str]) -> tuple[str, str] | None:
    """(tag, inner text) of the first `<tag>..</tag>` of any of `tags` (the one opened first),
    as `re.search(r"<(a|b)>(.*?)</\\1>", text, re.DOTALL)` finds it; None if there is none."""
    found = []
    for tag in tags:
        block = next(tag_blocks(text, tag), None)
        if block is not None:
            found.append((block[0], tag, block[1]))
    return min(found)[1:] if found else None


# ----------------------------------------------------------------------------- text the model did not write
TOOL_TAGS = (*REWARD_TAGS, "tool_call", "tool_response")
"""Tags the protocols and the reward read; inside a tool's output or a question they are text."""


@functools.lru_cache(maxsize=16)
def _tag_pattern(specials: tuple[str, ...], tags: bool = True) -> re.Pattern:
    """The protocol tags (unless `tags` is False) and the `specials` texts, any case."""
    tag = r"</?\s*(?:" + "|".join(TOOL_TAGS) + r")\s*/?>"
    return re.compile("|".join([*([tag] if tags else []), *map(re.escape, specials)]), re.IGNORECASE)


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special and added tokens written with `<` (`<|im_end|>`, `</s>`,
    `<jupyter_code>`, ...): in a text it encodes them as their ids, so a tool's output holding
    one would end the tool message or open a turn."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        texts.add(str(getattr(t, "content", t)))
    return tuple(sorted((t for t in texts if "<" in t), key=lambda t: (-len(t), t)))


def neutralize_tags(text: str, specials: Sequence[str] = (), tags: bool = True) -> str:
    """`text` with every protocol tag (`TOOL_TAGS`, any case) and every `specials` text
    written with `&lt;`/`&gt;`: a passage or a tool's output that holds `</information>`,
    `<answer>`, `<tool_call>` or `<|im_end|>` would otherwise close the observation, be scored
    as the model's answer, or fake a turn. The model reads them as quoted text. Passages and tool
    output (`observation.tool_observation`), questions (`prompt_ids`) and the demonstrations'
    questions and gold answers (`coldstart.demos`) all pass through it; it changes no text twice.
    `tags=False`: the `specials` alone (a question in a prompt: `plain_text`)."""
    pattern = _tag_pattern(tuple(specials), tags)
    return pattern.sub(lambda m: m.group(0).replace("<", "&lt;").replace(">", "&gt;"), text)



def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of a piece of non-sampled text appended to a trajectory (no special tokens added)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def plain_text(tokenizer: Any, question: str, docs_text: str | None = None) -> tuple[str, str | None]:
    """(question, passages) with the tokenizer's special-token texts quoted: a question holding
    `<|im_start|>` encoded as that token and opened a turn inside the prompt. A question's
    protocol tags stay as written: in the prompt they earn nothing (rewards read the response's
    view) and a few-shot question shows the model real `<search>` examples. The passages are
    neutralised whole already (a no-op here)."""
    specials = special_texts(tokenizer)
    if specials:
        question = neutralize_tags(question, specials, tags=False)
    return question, None if docs_text is None else neutralize_tags(docs_text, specials)


def render_chat(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None,
                add_generation_prompt: bool = True) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("a chat template is needed (template='chat'), but the tokenizer has none; use template='base'")
    kw = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kw)


class SearchR1Tags(ActionProtocol):
    """Search-R1's protocol (module docstring)."""

    name = "search_r1"
    stop = (SEARCH_CLOSE, ANSWER_CLOSE)
    INSTRUCTIONS = {"agent": SEARCH_R1_INSTRUCTION, "direct": DIRECT_INSTRUCTION, "rag": RAG_INSTRUCTION}

    def check_tools(self, names: Iterable[str]) -> None:
        extra = sorted(set(names) - {"search"})
        if extra:
            raise ValueError(f"protocol search_r1 has only the search tool (<search> tags); {extra} need "
                             f"actor_rollout_ref.rollout.protocol=hermes")

    def instruction(self, mode: Mode) -> str:
        return self.INSTRUCTIONS[mode.name]

    def prompt_ids(self, tokenizer: Any, question: str, template: str = "chat", mode: str = "agent",
                   docs_text: str | None = None) -> list[int]:
        """template="base": the instruction text as is (Search-R1's base-model template), with the
        tokenizer's special tokens (BOS where the model uses one). template="chat": one user
        message through the model's chat template with the generation prompt; the rendered text
        has its special tokens already, so it is encoded with add_special_tokens=False. The
        question and passages are plain text (`plain_text`)."""
        question, docs_text = plain_text(tokenizer, question, docs_text)
        text = self.prompt_text(question, mode, docs_text)
        if template == "base":
            return list(tokenizer.encode(text, add_special_tokens=True))
        if template == "chat":
            return encode_text(tokenizer, render_chat(tokenizer, [{"role": "user", "content": text}]))
        raise ValueError(f"unknown template {template!r}; expected 'base' or 'chat'")

    def parse(self, text: str, tool_names: Iterable[str] = ("search",)) -> Action:
        """The first `<search>..</search>` or `<answer>..</answer>` (Search-R1
        `postprocess_predictions`)."""
        found = _first_block(text, ("search", "answer"))
        if found is None:
            return Action("invalid")
        tag, inner = found
        if tag == "answer":
            return Action("answer", content=inner.strip())
        return Action("tool", tool="search", arguments={"query": inner.strip()})

    def write_call(self, tool: str, arguments: dict) -> str:
        if tool != "search":
            raise ValueError(f"protocol search_r1 has only the search tool, not {tool!r}")
        return f"{SEARCH_OPEN} {arguments['query']} {SEARCH_CLOSE}"

    def feedback(self, action: Action) -> str:
        return FEEDBACK_INVALID

    def observation_frame(self) -> tuple[str, str]:
        return OBS_OPEN, OBS_CLOSE

    def reward_view(self, response_text: str) -> str:
        """The feedback replaced by `INVALID_TURN`: its text quotes `<answer> and </answer>`,
        which the reward would read as the model's answer ("and"). `<information>` blocks are
        removed by the reward itself."""
        return response_text.replace(FEEDBACK_INVALID, INVALID_TURN)


# ----------------------------------------------------------------------------- native tool calls
HERMES_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a tool; its results are "
    "returned to you. You can call tools as many times as you want, one call per turn. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
HERMES_FEEDBACK = (
    "Your previous turn had neither a tool call nor an answer. To call a tool, write "
    '<tool_call>\n{{"name": <tool name>, "arguments": <arguments object>}}\n</tool_call>; to give '
    "the final answer, put it between <answer> and </answer>. Tools: {tools}."
)
# The fallback for chat templates without a tool role (e.g. the embedded SmolLM2): tools are
# described in a system message in the Hermes / Qwen2.5 wording, and a tool message is a user
# message holding `<tool_response>` .. `</tool_response>`, as Qwen2.5's own template renders it.
FALLBACK_TOOLS_SYSTEM = (
    "You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the "
    "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"
_SENTINEL_A, _SENTINEL_B = "\x1fASSISTANT\x1f", "\x1fRESULT\x1f"
TEMPLATE_CHOICES = ("auto", "model", "fallback")


def template_has_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders tool messages itself."""
    t = getattr(tokenizer, "chat_template", None) or ""
    t = t if isinstance(t, str) else json.dumps(t)
    return "tool" in t and ("tool_call" in t or "tools" in t)


class HermesToolCalls(ActionProtocol):
    """Native tool calls (module docstring). `bind(tokenizer, tools)` renders the frames from
    the chat template: what follows the assistant's turn up to the tool's output, and what
    follows the output up to the next assistant turn; a tool's output is truncated between
    them, so its ids are the template's ids. One tool call per turn (generation stops at
    `</tool_call>`); a turn that ends in the template's end-of-turn token has that token
    counted once (`turn_end_ids`)."""

    name = "hermes"
    stop = (TOOL_CALL_CLOSE, ANSWER_CLOSE)

    def __init__(self, chat_template: str = "auto"):
        if chat_template not in TEMPLATE_CHOICES:
            raise ValueError(f"tool chat template must be one of {TEMPLATE_CHOICES}, got {chat_template!r}")
        self.chat_template = chat_template
        self.tokenizer: Any = None
        self.tool_schemas: list[dict] = []
        self.tool_names: tuple[str, ...] = ()
        self.native = False
        self._frames: dict[str, tuple[str, str]] = {}

    def bind(self, tokenizer: Any, tools: Sequence[Any] = ()) -> "HermesToolCalls":
        out = HermesToolCalls(self.chat_template)
        out.tokenizer = tokenizer
        out.tool_schemas = [t.schema() if hasattr(t, "schema") else t for t in tools]
        out.tool_names = tuple(s["function"]["name"] for s in out.tool_schemas)
        has = template_has_tools(tokenizer)
        if self.chat_template == "model" and not has:
            raise ValueError("actor_rollout_ref.rollout.tool_chat_template=model, but the model's chat template "
                             "has no tool role; use auto or fallback")
        out.native = has and self.chat_template != "fallback"
        out._frames = {"tool": out._frame("tool"), "user": out._frame("user")}
        return out

    # -- template rendering
    def _messages(self, messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
        """Messages and tools as passed to the template: the model's own, or the fallback's."""
        if self.native:
            return messages, self.tool_schemas or None
        out = []
        if self.tool_schemas and not (messages and messages[0]["role"] == "system"):
            tools = "".join("\n" + json.dumps(s) for s in self.tool_schemas)
            out.append({"role": "system", "content": FALLBACK_TOOLS_SYSTEM.format(tools=tools)})
        for m in messages:
            if m["role"] == "tool":
                m = {"role": "user", "content": TOOL_RESPONSE_OPEN + m["content"] + TOOL_RESPONSE_CLOSE}
            out.append(m)
        return out, None

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        msgs, tools = self._messages(messages)
        return render_chat(self.tokenizer, msgs, tools, add_generation_prompt)

    def _frame(self, role: str) -> tuple[str, str]:
        """(head, tail) around a `role` message after an assistant turn, from the template."""
        if self.tokenizer is None:
            raise RuntimeError("HermesToolCalls must be bound to a tokenizer (bind) first")
        text = self.render([{"role": "user", "content": "Q"}, {"role": "assistant", "content": _SENTINEL_A},
                            {"role": role, "content": _SENTINEL_B}])
        a, b = text.find(_SENTINEL_A), text.find(_SENTINEL_B)
        if a < 0 or b < a:
            raise ValueError(f"the chat template does not render a {role} message after an assistant turn")
        return text[a + len(_SENTINEL_A): b], text[b + len(_SENTINEL_B):]

    # -- prompts
    def instruction(self, mode: Mode) -> str:
        return {"agent": HERMES_INSTRUCTION, "direct": DIRECT_INSTRUCTION, "rag": RAG_INSTRUCTION}[mode.name]

    def prompt_ids(self, tokenizer: Any, question: str, template: str = "chat", mode: str = "agent",
                   docs_text: str | None = None) -> list[int]:
        if template != "chat":
            raise ValueError("protocol hermes needs the chat template (actor_rollout_ref.rollout.chat_template=true)")
        question, docs_text = plain_text(tokenizer, question, docs_text)
        text = self.prompt_text(question, mode, docs_text)
        msgs = [{"role": "user", "content": text}]
        if get_mode(mode).tools:
            rendered = self.render(msgs)
        else:  # no tools offered: the plain chat prompt
            rendered = render_chat(tokenizer, msgs)
        return encode_text(tokenizer, rendered)

    # -- turns
    def parse(self, text: str, tool_names: Iterable[str] | None = None) -> Action:
        """The first `<tool_call>{json}</tool_call>` or `<answer>..</answer>`. A call is invalid
        (with its reason) when the JSON does not parse, is not an object with a string "name",
        or names an unknown tool; arguments given as a JSON string are accepted, and arguments
        that are not an object are the tool's to refuse (`tools.check_arguments`: bad_args)."""
        names = tuple(tool_names) if tool_names is not None else self.tool_names
        found = _first_block(text, ("tool_call", "answer"))
        if found is None:
            return Action("invalid")
        tag, inner = found
        if tag == "answer":
            return Action("answer", content=inner.strip())
        call, why = _load_json(inner.strip())
        if why:
            return Action("invalid", error=f"malformed JSON in the tool call ({why})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Action("invalid", error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
        args = call.get("arguments", {})
        if isinstance(args, str):
            args, why = _load_json(args) if args.strip() else ({}, None)
            if why:
                return Action("invalid", tool=call["name"], error="the arguments are not a JSON object")
        if call["name"] not in names:
            return Action("invalid", tool=call["name"],
                          error=f"unknown tool {call['name']!r}; available: {', '.join(names) or 'none'}")
        return Action("tool", tool=call["name"], arguments=args)

    def write_call(self, tool: str, arguments: dict) -> str:
        return f'{TOOL_CALL_OPEN}\n{json.dumps({"name": tool, "arguments": arguments}, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}'

    def feedback(self, action: Action) -> str:
        if action.error:
            return f"Error: {action.error}."
        return HERMES_FEEDBACK.format(tools=", ".join(self.tool_names) or "none")

    def observation_frame(self) -> tuple[str, str]:
        return self._frames["tool"]

    def turn_end_ids(self) -> list[int]:
        """The template's end-of-turn token (Qwen2.5's `<|im_end|>`): the special token that
        opens what the template renders after an assistant message. Our rollouts stop at
        `stop` before it and the frame supplies it as context; a turn that already ends in it
        is not given a second (RolloutManager `_without_repeated_end`)."""
        if self.tokenizer is None:
            raise RuntimeError("HermesToolCalls must be bound to a tokenizer (bind) first")
        ids = encode_text(self.tokenizer, self._frames["tool"][0])
        return ids[:1] if ids and ids[0] in set(getattr(self.tokenizer, "all_special_ids", ())) else []

    def feedback_frame(self, action: Action) -> tuple[str, str]:
        """A malformed call is answered as its tool's result would be; a turn without any
        action gets a user message."""
        return self._frames["tool"] if action.error else self._frames["user"]

    # -- rewards
    model_hidden_tags = (INFO_OPEN, INFO_CLOSE, SEARCH_OPEN, SEARCH_CLOSE)
    """Here `<search>` is not the model's to write either: only its tool calls become one."""

    def sampled_view(self, text: str) -> str:
        """A model turn's tool call becomes `<search> {json} </search>` (`reward_text`: the
        template's framing never reaches the reward)."""
        return _calls_as_search(text)

    def reward_view(self, response_text: str) -> str:
        """A decoded response (special tokens skipped) read as the reward grammar: tool calls
        as `<search>`, `<tool_response>` blocks as `<information>`, and the role words of the
        template between them dropped; `<information>` and `<search>` the model wrote itself
        are quoted (no tool output holds them: `observation.neutralize_tags`). Rollouts use
        `reward_text` (exact); this reads saved text."""
        text = _calls_as_search(hide_tags(response_text, self.model_hidden_tags))
        text = re.sub(r"(</search>)[^<]*<tool_response>(.*?)(?:</tool_response>[^<]*|\Z)",
                      lambda m: f"{m.group(1)}{OBS_OPEN}{m.group(2).strip()}{OBS_CLOSE}", text, flags=re.DOTALL)
        return text


MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects a tool call may have (a real call needs 2-3). Checked
before parsing: the parser's own limit is the interpreter's recursion limit, which libraries
raise at run time (torch's inductor sets 2000), so the same text parsed or failed by test order."""


def _json_depth(text: str) -> int:
    """The deepest nesting of [ and { outside JSON strings."""
    depth = deepest = 0
    in_str = escaped = False
    for c in text:
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _load_json(text: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) for text that is not JSON the parser can hold: besides
    syntax errors, nesting deeper than MAX_JSON_DEPTH (or the recursion limit: RecursionError)
    and integers past Python's digit limit (ValueError) are the model's malformed call, never an
    exception."""
    if _json_depth(text) > MAX_JSON_DEPTH:
        return None, "nested too deeply"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"{e.msg} at character {e.pos}"
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as e:
        return None, str(e).split(":")[0]


def _calls_as_search(text: str) -> str:
    """Each `<tool_call> x </tool_call>` of a model turn as `<search> x </search>`."""
    out, i = [], 0
    for start, inner in tag_blocks(text, "tool_call"):
        out += [text[i:start], f"{SEARCH_OPEN} {inner.strip()} {SEARCH_CLOSE}"]
        i = start + len(TOOL_CALL_OPEN) + len(inner) + len(TOOL_CALL_CLOSE)
    return "".join(out) + text[i:]


# ----------------------------------------------------------------------------- registry, scoring
PROTOCOLS: dict[str, type[ActionProtocol]] = {"search_r1": SearchR1Tags, "hermes": HermesToolCalls}
SEARCH_R1 = SearchR1Tags()


def get_protocol(name: str = "search_r1", chat_template: str = "auto") -> ActionProtocol:
    """The protocol `actor_rollout_ref.rollout.protocol` names (unbound)."""
    if name == "hermes":
        return HermesToolCalls(chat_template)
    try:
        return PROTOCOLS[name]()
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; expected one of {tuple(PROTOCOLS)}") from None


def repeated(query: str, earlier: Iterable[str]) -> bool:
    """A search query the trajectory already made (compared case- and space-insensitively)."""
    key = " ".join(query.lower().split())
    return any(key == " ".join(q.lower().split()) for q in earlier)


def protocol_for(rcfg: Any, tokenizer: Any) -> ActionProtocol:
    """The protocol of a rollout config (`actor_rollout_ref.rollout`), bound to `tokenizer` with
    the config's built-in tools, in config order, as the rollout manager offers them (MCP
    servers' tools are known only once connected: the manager binds again then)."""
    from agent_rl.rollout.tools import builtin_tool

    tools = [builtin_tool(t.name) for t in rcfg.tools if not t.is_mcp]
    return get_protocol(rcfg.protocol, rcfg.tool_chat_template).bind(tokenizer, tools)
