"""The README's `agent-rl-eval show|report|plot` commands as written, through the installed console
script (issue 101: it used to parse them as an evaluation and stop on "--model required"), and
`show --html`'s page as a browser draws it: the loss-masked spans shaded, in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.evaluation import report
from agent_rl.training.metrics import MetricsLogger
from agent_rl.training.rollout_data import write_rollout_data

CONSOLE = Path(sys.executable).parent / "agent-rl-eval"
"""The script `pip install` made from pyproject.toml's [project.scripts], beside this Python."""
SHADE_RGB = (0xd8, 0xd8, 0xd8)
"""`.ctx`'s background in render_html's CSS (#d8d8d8): the shading of loss-masked text."""
OBS = "<information>Doc 1 (Title: Ada Lovelace) Ada was born in Rome.</information>"


def record() -> dict:
    """One rollout record as agent_rl.training.rollout_data writes it: a search, its observation
    (loss mask 0) alone on its line, the answer."""
    return {"step": 1, "index": 0, "group_id": 0, "question": "Where was Ada born?", "golden_answers": ["Rome"],
            "reward": 1.0, "breakdown": {"answer": "Rome", "metric": 1.0, "valid_format": True, "retrieval_hit": True},
            "num_searches": 1, "num_turns": 2, "finish_reason": "answer", "prompt": "Q?",
            "pieces": [{"sampled": True, "text": "<think>look it up</think><search>Ada birthplace</search>\n\n"},
                       {"sampled": False, "text": OBS},
                       {"sampled": True, "text": "\n\n<think>found</think><answer>Rome</answer>"}]}


def console(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert CONSOLE.is_file(), f"{CONSOLE} missing: run `make setup` (pip install -e .) first"
    return subprocess.run([str(CONSOLE), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_show_through_the_console_script(tmp_path):
    write_rollout_data(tmp_path / "rollouts", 1, [record()])
    r = console("show", "rollouts", "--color", "never", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"[[{OBS}]]" in r.stdout and "Q: Where was Ada born?" in r.stdout


def test_report_through_the_console_script(tmp_path):
    row = {"mode": "agent", "data_source": "nq", "id": "0", "em": 1.0, "subem": 1.0, "f1": 1.0, "searches": 1,
           "turns": 2, "valid_format": True, "prediction": "Rome", "retrieval_hit": True, "tool_failures": 0}
    report.write_summary(report.summarize([row]), tmp_path / "eval" / "base")
    r = console("report", "base=eval/base", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| base | 100.0 [" in r.stdout  # 1 of 1 right: EM 100.0, its Wilson interval after it


def test_plot_through_the_console_script(tmp_path):
    log = MetricsLogger(tmp_path / "run", ["jsonl"])
    for step in (1, 2, 3):
        log.log({"reward/mean": step / 3, "reward/em": step / 6}, step)
    log.close()
    r = console("plot", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluation_and_help_are_unchanged(tmp_path):
    r = console("--help", cwd=tmp_path)
    assert r.returncode == 0 and "--model" in r.stdout and "--retriever-url" in r.stdout  # the evaluation's options
    for name in ("show", "report", "plot"):
        assert f"agent-rl-eval {name}" in r.stdout, name  # and the other commands, named
    r = console("--mode", "direct", cwd=tmp_path)  # still read as an evaluation, which needs its model
    assert r.returncode == 2 and "the following arguments are required: --model" in r.stderr
    r = console("show", "--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: agent-rl-eval show")


# ----------------------------------------------------------------------------- the HTML page in a browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--force-device-scale-factor=1"]
"""Offline and reproducible: no network of its own, no GPU, one pixel per CSS pixel."""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup.sh installs it where apt-get can run)")
def test_show_html_page_shades_the_masked_span_in_a_browser(tmp_path):
    from PIL import Image

    write_rollout_data(tmp_path / "rollouts", 1, [record()])
    r = console("show", "rollouts", "--html", "page.html", "--color", "never", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    png = tmp_path / "show_screenshot.png"
    subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                    "--window-size=1000,600", (tmp_path / "page.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = Image.open(png).convert("RGB")
    data, w = img.tobytes(), img.width
    pixel = lambda x, y: data[3 * (y * w + x):3 * (y * w + x) + 3]  # noqa: E731
    rows = [sum(pixel(x, y) == bytes(SHADE_RGB) for x in range(w)) for y in range(img.height)]
    # A shaded box's rows hold a run of the shade as wide as the span; anti-aliased glyph edges
    # elsewhere hit the exact colour only in ones and twos per row (seen: at most 2).
    band = [y for y, n in enumerate(rows) if n >= 100]
    assert band, "no shaded span on the page"
    # Only the span is shaded: one text line, contiguous, not the <pre> around it (three lines and
    # two blank ones, ~85 px); 30 px allows a line height up to twice the default's (14 px seen).
    assert band == list(range(band[0], band[-1] + 1)) and 8 <= len(band) <= 30, band
    # as wide as the observation's 76 characters at 5 to 10 px each (the page's monospace: 7 px)
    assert 76 * 5 <= max(rows) <= 76 * 10, max(rows)
    assert sum(rows) - sum(rows[y] for y in band) < 100  # the sampled text and the rest of the page: not shaded
    # and the observation's text is drawn on it: dark glyph pixels inside the band
    glyphs = sum(1 for y in band for x in range(w) if sum(pixel(x, y)) < 3 * 0x90)
    assert glyphs >= 200, glyphs
