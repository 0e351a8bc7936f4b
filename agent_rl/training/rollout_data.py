"""A look at sampled rollouts while training (veRL's `trainer.rollout_data_dir`; tinker's habit
of reading samples, not only curves).

Every `trainer.rollout_data_freq` steps, `trainer.rollout_data_n` trajectories drawn from the
step's batch go to `<rollout_data_dir>/<step>.jsonl`, one record each: the question and gold
answers, the reward and its breakdown (`reward.score_trajectory`, the reward training used), and
the response as pieces in order, each marked `sampled` (loss mask 1: what the update trains on)
or not (observations, feedback and template text: loss mask 0). `agent-rl-eval show <dir>`
renders them as text (context shaded on a terminal, in `[[...]]` otherwise) or as one HTML page.
"""

from __future__ import annotations

import html
import json
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from data_prep.atomic import atomic_write

SHADE_ON, SHADE_OFF = "\x1b[48;5;238m\x1b[37m", "\x1b[0m"
"""ANSI grey background for loss-masked text on a terminal."""
PLAIN_OPEN, PLAIN_CLOSE = "[[", "]]"
"""Loss-masked text in plain text (no terminal)."""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Characters a terminal may act on (C0 but newline and tab, DEL, C1 such as the one-byte CSI
\\x9b): in model text, questions or tool output they could move the cursor, rewrite earlier lines
or set the window title, so the text view shows them as `\\x1b`."""


def visible(text: str) -> str:
    """`text` with each CONTROL character written out as its escape (ESC -> the four characters `\\x1b`)."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def pieces(response_ids: Sequence[int], loss_mask: Sequence[int],
           decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """The response as runs of equal loss mask, in order: `{"sampled": bool, "text": str}`,
    each run decoded on its own (special tokens kept, so the template's are visible)."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(response_ids) + 1):
        if i == len(response_ids) or loss_mask[i] != loss_mask[start]:
            out.append({"sampled": bool(loss_mask[start]), "text": decode(list(response_ids[start:i]))})
            start = i
    return out


def rollout_records(trajs: Sequence[Any], tokenizer: Any, reward_cfg: Any, step: int, n: int) -> list[dict]:
    """`n` trajectories of the batch (a draw seeded by the step, in batch order) as records."""
    from agent_rl.rollout.reward import score_trajectory

    picked = sorted(random.Random(step).sample(range(len(trajs)), min(n, len(trajs))))
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    out = []
    for i in picked:
        t = trajs[i]
        res = score_trajectory(t, t.golden_answers, reward_cfg)
        out.append({
            "step": step, "index": i, "group_id": t.group_id, "question": t.question,
            "golden_answers": list(t.golden_answers), "reward": t.reward, "breakdown": asdict(res),
            "num_searches": t.num_searches, "num_turns": t.num_turns, "finish_reason": t.finish_reason,
            "prompt": decode(list(t.prompt_ids)), "pieces": pieces(t.response_ids, t.loss_mask, decode),
        })
    return out


def write_rollout_data(directory: str | Path, step: int, records: Sequence[dict]) -> Path:
    """`<directory>/<step>.jsonl`, written whole (fsync + rename)."""
    path = Path(directory) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def read_rollout_data(path: str | Path, step: int | None = None) -> list[dict]:
    """The records of one file, or of a directory's files (its `<step>.jsonl`, in step order;
    `step`: only that one). A line that does not parse is skipped with a warning."""
    p = Path(path)
    files = [p] if p.is_file() else sorted((f for f in p.glob("*.jsonl") if f.stem.isdigit()), key=lambda f: int(f.stem))
    if step is not None:
        files = [f for f in files if f.stem == str(step)]
    out = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"[show] warning: {f}:{n}: not a JSON record, skipped")
    return out


def _header(r: dict) -> str:
    b = r.get("breakdown", {})
    return (f"step {r['step']} #{r['index']} (group {r['group_id']}) reward {r['reward']:.3f}: "
            f"answer {b.get('answer')!r}, metric {b.get('metric')}, well-formed {b.get('valid_format')}, "
            f"retrieval hit {b.get('retrieval_hit')}; {r['num_searches']} searches, {r['num_turns']} turns, "
            f"ended by {r['finish_reason']}\nQ: {r['question']}  gold: {r['golden_answers']}")


def render_text(records: Sequence[dict], color: bool = False) -> str:
    """Each record's header and response; loss-masked pieces shaded (`color`) or in `[[...]]`.
    Every piece of record text goes through `visible`: only the shading's own codes reach the terminal."""
    on, off = (SHADE_ON, SHADE_OFF) if color else (PLAIN_OPEN, PLAIN_CLOSE)
    blocks = []
    for r in records:
        body = "".join(visible(p["text"]) if p["sampled"] else f"{on}{visible(p['text'])}{off}" for p in r["pieces"])
        blocks.append(f"{visible(_header(r))}\n{body}")
    return ("\n" + "-" * 80 + "\n").join(blocks) + "\n"


def render_html(records: Sequence[dict], title: str = "rollouts") -> str:
    """One static page: a section per record, loss-masked pieces in `<span class="ctx">`."""
    css = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}pre{white-space:pre-wrap;"
           "font-size:.9em;border:1px solid #ccc;padding:.6em}.ctx{background:#d8d8d8;color:#444}"
           "h2{font-size:1em}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
             "<p>Shaded: context the update does not train on (observations, feedback, template; loss mask 0).</p>"]
    for r in records:
        head, question = _header(r).split("\n", 1)
        body = "".join(html.escape(p["text"]) if p["sampled"] else f"<span class='ctx'>{html.escape(p['text'])}</span>"
                       for p in r["pieces"])
        parts.append(f"<section><h2>{html.escape(head)}</h2><p>{html.escape(question)}</p><pre>{body}</pre></section>")
    return "".join(parts) + "</body></html>\n"


class RolloutDataWriter:
    """The trainer's writer: at step 1 and every `trainer.rollout_data_freq` steps, when
    `trainer.rollout_data_dir` is set (the tokenizer is loaded the first time)."""

    def __init__(self, cfg: Any) -> None:
        trainer_cfg = cfg.trainer
        self.dir = trainer_cfg.rollout_data_dir
        self.freq, self.n = trainer_cfg.rollout_data_freq, trainer_cfg.rollout_data_n
        self.model_path, self.reward_cfg = cfg.actor_rollout_ref.model.path, cfg.reward
        self._tokenizer: Any = None

    def maybe_write(self, step: int, trajs: Sequence[Any]) -> Path | None:
        if not self.dir or not trajs or not (step == 1 or step % self.freq == 0):
            return None
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return write_rollout_data(self.dir, step, rollout_records(trajs, self._tokenizer, self.reward_cfg, step, self.n))
