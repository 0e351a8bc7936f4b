"""Sampled rollouts written while training and rendered by `agent-rl-eval show`: the pieces
follow the loss mask exactly, the reward breakdown is the training reward's, and the renderings
shade exactly the loss-masked text. (The trainer writes them in test_trainer's GRPO run.)"""

from __future__ import annotations

import json
from html.parser import HTMLParser

from agent_rl.evaluation.cli import show_main
from agent_rl.rollout.protocol import OBS_CLOSE, OBS_OPEN
from agent_rl.training.rollout_data import (PLAIN_CLOSE, PLAIN_OPEN, pieces, read_rollout_data, render_html,
                                            render_text, rollout_records, write_rollout_data)
from agent_rl.types import Trajectory


class CharTokenizer:
    """One id per character (id = code point): decode is exact, so pieces can be checked by hand."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def traj(sampled1: str, obs: str, sampled2: str, gold: list[str]) -> Trajectory:
    tok = CharTokenizer()
    parts = [(sampled1, 1), (OBS_OPEN + obs + OBS_CLOSE, 0), (sampled2, 1)]
    ids = [i for text, _ in parts for i in tok.encode(text)]
    mask = [m for text, m in parts for _ in text]
    return Trajectory(prompt_ids=tok.encode("Q?"), response_ids=ids, loss_mask=mask, rollout_logprobs=[0.0] * len(ids),
                      reward=1.0, question="where?", golden_answers=gold, num_searches=1, num_turns=2,
                      finish_reason="answer",
                      reward_text=sampled1 + OBS_OPEN + obs + OBS_CLOSE + sampled2)


def test_pieces_are_the_runs_of_the_loss_mask():
    decode = CharTokenizer().decode
    assert pieces([97, 98, 99, 100, 101], [1, 1, 0, 0, 1], decode) == [
        {"sampled": True, "text": "ab"}, {"sampled": False, "text": "cd"}, {"sampled": True, "text": "e"}]
    assert pieces([], [], decode) == []


def test_records_carry_the_breakdown_and_renderings_shade_only_context(tmp_path):
    t = traj("<think>a</think><search>x</search>", "Doc 1 Paris", "<think>b</think><answer>Paris</answer>", ["Paris"])
    recs = rollout_records([t, t, t], CharTokenizer(), None, step=3, n=2)
    assert len(recs) == 2 and all(r["step"] == 3 for r in recs)
    b = recs[0]["breakdown"]
    assert b["answer"] == "Paris" and b["metric"] == 1.0 and b["valid_format"] and b["retrieval_hit"]
    assert [p["sampled"] for p in recs[0]["pieces"]] == [True, False, True]
    text = render_text(recs[:1])
    assert f"{PLAIN_OPEN}{OBS_OPEN}Doc 1 Paris{OBS_CLOSE}{PLAIN_CLOSE}" in text
    assert text.count(PLAIN_OPEN) == 1 and "reward 1.000" in text

    class Spans(HTMLParser):
        shaded, depth = [], 0

        def handle_starttag(self, tag, attrs):
            if tag == "span" and ("class", "ctx") in attrs:
                self.depth += 1

        def handle_endtag(self, tag):
            if tag == "span" and self.depth:
                self.depth -= 1

        def handle_data(self, data):
            if self.depth:
                self.shaded.append(data)

    parser = Spans()
    parser.feed(render_html(recs[:1]))
    assert "".join(parser.shaded) == OBS_OPEN + "Doc 1 Paris" + OBS_CLOSE  # escaped tags read back as text

    path = write_rollout_data(tmp_path / "rollouts", 3, recs)
    assert path.name == "3.jsonl" and read_rollout_data(tmp_path / "rollouts") == json.loads(json.dumps(recs))


def test_show_renders_a_directory_and_refuses_an_empty_one(tmp_path, capsys):
    t = traj("<think>a</think><search>x</search>", "Doc 1 Rome", "<think>b</think><answer>Paris</answer>", ["Paris"])
    d = tmp_path / "rollouts"
    write_rollout_data(d, 1, rollout_records([t], CharTokenizer(), None, step=1, n=4))
    (d / "2.jsonl").write_text("{not json\n")
    html_out = tmp_path / "r.html"
    assert show_main([str(d), "--html", str(html_out), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "retrieval hit False" in out and f"{PLAIN_OPEN}{OBS_OPEN}Doc 1 Rome" in out and "2.jsonl:1" in out
    assert "class='ctx'" in html_out.read_text()
    assert show_main([str(tmp_path / "missing")]) == 2
    assert show_main([str(d), "--step", "7"]) == 2


def test_text_view_shows_terminal_controls_escaped_and_html_as_is(tmp_path, capsys):
    """Issue 100 case 17: a question, a model's text and a tool's output holding terminal control
    sequences (clear screen, set the window title, a carriage return over the line, C1's one-byte
    CSI) reach the terminal as the visible text `\\x1b[2J`..., never as the bytes."""
    from agent_rl.training.rollout_data import SHADE_OFF, SHADE_ON

    t = traj("<think>\x1b[2Ja</think><search>x\rX</search>", "Doc 1 \x1b]0;pwned\x07Paris",
             "<answer>Paris\x9b31m</answer>", ["Paris\x1b[8m"])
    t.question = "where?\x1b[1A"
    (rec,) = rollout_records([t], CharTokenizer(), None, step=1, n=1)
    for color in (False, True):
        text = render_text([rec], color=color)
        if color:
            text = text.replace(SHADE_ON, "").replace(SHADE_OFF, "")  # the shading's own codes are the only ones
        assert not [c for c in text if ord(c) < 0x20 and c not in "\n\t" or 0x7f <= ord(c) <= 0x9f], repr(text)
        for shown in (r"<think>\x1b[2Ja", r"x\x0dX", r"Doc 1 \x1b]0;pwned\x07Paris", r"Paris\x9b31m",
                      r"Q: where?\x1b[1A"):
            assert shown in text, shown
    # the gold answers as the header always showed them (repr escapes them already): not escaped twice
    assert r"gold: ['Paris\x1b[8m']" in render_text([rec])
    # the page is unchanged: the browser shows the text, html-escaped, with its control characters
    assert "Doc 1 \x1b]0;pwned\x07Paris" in render_html([rec])

    d = tmp_path / "rollouts"  # and through `show` itself
    write_rollout_data(d, 1, [rec])
    assert show_main([str(d), "--color", "always"]) == 0
    out = capsys.readouterr().out.replace(SHADE_ON, "").replace(SHADE_OFF, "")
    assert "\x1b" not in out and "\x9b" not in out and "\r" not in out and r"\x1b]0;pwned\x07" in out
