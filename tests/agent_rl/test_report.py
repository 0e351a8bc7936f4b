"""Summaries, intervals and the model x mode table, against hand-computed values; and the demo's
report (agent_rl/demo/report.py): what it quotes from the records, from an installed package too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent_rl.evaluation import report


def rec(mode="agent", src="nq", qid="0", em=0.0, subem=0.0, f1=0.0, searches=0, turns=1, valid=True,
        pred="x", hit=False, tool_failures=0):
    return {"mode": mode, "data_source": src, "id": qid, "em": em, "subem": subem, "f1": f1,
            "searches": searches, "turns": turns, "valid_format": valid, "prediction": pred,
            "retrieval_hit": hit, "tool_failures": tool_failures}


# ----------------------------------------------------------------------------- intervals
def test_wilson_hand_values():
    # 8/10: p=.8, z^2/n=.384146; centre=(.8+.192073)/1.384146=.716740,
    # half=1.959964*sqrt(.016+.009604)/1.384146=.226580
    lo, hi = report.wilson_interval(8, 10)
    assert lo == pytest.approx(0.490160, abs=1e-5)
    assert hi == pytest.approx(0.943319, abs=1e-5)
    # 0/10: centre = half = .192073/1.384146 = .138767 -> (0, .277533)
    lo, hi = report.wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12)
    assert hi == pytest.approx(0.277533, abs=1e-5)
    # symmetric: 10/10 mirrors 0/10
    lo, hi = report.wilson_interval(10, 10)
    assert (lo, hi) == pytest.approx((1 - 0.277533, 1.0), abs=1e-5)


def test_wilson_edges_and_errors():
    assert report.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes <= n"):
        report.wilson_interval(3, 2)
    # large n approaches the normal interval p +- z sqrt(p(1-p)/n)
    lo, hi = report.wilson_interval(5000, 10000)
    assert hi - lo == pytest.approx(2 * report.Z95 * math.sqrt(0.25 / 10000), rel=1e-3)


def test_paired_difference_hand_value():
    # d = [1, 0, 0, 1]: mean .5, sd = sqrt(1/3) = .577350, se = .288675, half = .565796
    out = report.paired_difference([1, 1, 0, 1], [0, 1, 0, 0])
    assert out["diff"] == pytest.approx(0.5)
    assert out["ci_low"] == pytest.approx(0.5 - 0.565796, abs=1e-5)
    assert out["ci_high"] == pytest.approx(1.0)  # 1.0658 clipped to the possible range
    assert out["n"] == 4
    with pytest.raises(ValueError, match="pair them"):
        report.paired_difference([1], [1, 0])


def test_paired_em_difference_pairs_by_question():
    a = [rec(qid="1", em=1), rec(qid="2", em=1), rec(src="hq", qid="1", em=0), rec(qid="9", em=1)]
    b = [rec(src="hq", qid="1", em=1), rec(qid="2", em=1), rec(qid="1", em=0)]  # other order, no q9
    out = report.paired_em_difference(a, b)
    assert out["n"] == 3
    assert out["diff"] == pytest.approx((1 + 0 - 1) / 3)


# ----------------------------------------------------------------------------- summaries
def test_summarize_per_source_and_overall():
    recs = [
        rec(qid="1", em=1, subem=1, f1=1.0, searches=2, turns=3),
        rec(qid="2", em=0, subem=1, f1=0.5, searches=0, turns=1, valid=False, pred=None),
        rec(src="hq", qid="1", em=1, subem=1, f1=1.0, searches=1, turns=2, hit=True, tool_failures=2),
        rec(mode="direct", qid="1", em=0, f1=0.25),
    ]
    s = report.summarize(recs)
    assert list(s["modes"]) == ["agent", "direct"]  # agent, rag, direct order
    agent = s["modes"]["agent"]
    assert list(agent) == ["all", "hq", "nq"]
    a = agent["all"]
    assert a["n"] == 3
    assert a["em"] == pytest.approx(2 / 3)
    assert a["subem"] == pytest.approx(1.0)
    assert a["f1"] == pytest.approx(2.5 / 3)
    assert a["searches_mean"] == pytest.approx(1.0)
    assert a["turns_mean"] == pytest.approx(2.0)
    assert a["invalid_format_rate"] == pytest.approx(1 / 3)
    assert a["answer_rate"] == pytest.approx(2 / 3)
    assert a["retrieval_hit_rate"] == pytest.approx(1 / 3)
    assert a["tool_failures"] == 2
    assert (a["em_ci_low"], a["em_ci_high"]) == pytest.approx(report.wilson_interval(2, 3))
    nq = agent["nq"]
    assert nq["n"] == 2 and nq["em"] == pytest.approx(0.5) and nq["f1"] == pytest.approx(0.75)
    assert s["modes"]["direct"]["all"]["f1"] == pytest.approx(0.25)


def test_markdown_and_files(tmp_path):
    recs = [rec(qid=str(i), em=float(i < 8)) for i in range(10)]
    s = report.summarize(recs)
    md = report.summary_markdown(s, title="t")
    # 8/10 with the Wilson interval of the hand test, in percent
    assert "| agent | all | 10 | 80.0 [49.0, 94.3] |" in md
    assert "| agent | nq |" not in md  # one source: the overall row says it all
    j, m = report.write_summary(s, tmp_path / "ev")
    assert json.loads(j.read_text()) == s
    assert m.read_text() == report.summary_markdown(s)
    assert report.read_summary(tmp_path / "ev") == s
    with pytest.raises(FileNotFoundError, match="agent-rl-eval"):
        report.read_summary(tmp_path / "nothing")


def test_comparison_table(tmp_path):
    dirs = {}
    for name, hits in (("base", 0), ("sft", 5), ("rl", 8)):
        recs = [rec(qid=str(i), em=float(i < hits)) for i in range(10)]
        if name != "base":  # base was only evaluated in agent mode
            recs += [rec(mode="rag", qid=str(i), em=float(i < 3)) for i in range(10)]
        report.write_summary(report.summarize(recs), tmp_path / name)
        dirs[name] = tmp_path / name
    table = report.comparison([("base", dirs["base"]), ("SFT", dirs["sft"]), ("SFT+RL", dirs["rl"])])
    assert [r["model"] for r in table["rows"]] == ["base", "SFT", "SFT+RL"]
    assert table["rows"][0]["cells"]["rag"] is None
    assert table["rows"][2]["cells"]["agent"]["em"] == pytest.approx(0.8)
    md = report.comparison_markdown(table)
    assert md.splitlines()[2] == "| model | agent | rag | direct |"
    assert "| SFT+RL | 80.0 [49.0, 94.3] (n=10, 0.0 searches) | 30.0 [" in md
    assert "| base | 0.0 [0.0, 27.8] (n=10, 0.0 searches) | — | — |" in md


def test_report_cli(tmp_path, capsys):
    from agent_rl.evaluation.cli import report_main

    report.write_summary(report.summarize([rec(em=1.0)]), tmp_path / "a")
    assert report_main([f"A={tmp_path / 'a'}", "--json", str(tmp_path / "t.json")]) == 0
    assert "| A | 100.0 [" in capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_text())["rows"][0]["model"] == "A"
    assert report_main(["nolabel"]) == 2
    assert report_main([f"B={tmp_path / 'missing'}"]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_paired_comparison_by_group_hand_computed(tmp_path):
    """SFT vs SFT+RL on the same 4 questions, by kind. Differences b - a: [0, 1, 0, 0] overall:
    mean 0.25, sd 0.5, half-width 1.96 * 0.5 / 2 = 0.49; bridge [0, 1]: mean 0.5, sd 0.7071,
    half 1.96 * 0.7071 / sqrt(2) = 0.98 (capped at 1); single [0, 0]: 0 +- 0. A question only
    one model answered does not count."""
    from agent_rl.evaluation.report import ALL, paired_comparison, paired_comparison_markdown

    def write(d, ems, extra=()):
        d.mkdir()
        rows = [{"mode": "agent", "data_source": "kb", "id": f"q{i}", "em": e, "subem": e, "f1": e, "searches": 1 + e,
                 "turns": 2, "valid_format": True, "retrieval_hit": 1.0, "prediction": "x"} for i, e in enumerate(ems)]
        rows += [dict(rows[0], mode="rag")] + list(extra)
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(tmp_path / "sft", [1, 0, 0, 1])
    write(tmp_path / "rl", [1, 1, 0, 1], extra=[{"mode": "agent", "data_source": "kb", "id": "q9", "em": 1.0,
                                                 "subem": 1, "f1": 1, "searches": 1, "turns": 1, "valid_format": True,
                                                 "retrieval_hit": 1.0}])
    kinds = {"q0": "bridge", "q1": "bridge", "q2": "single", "q3": "single"}
    cmp = paired_comparison(tmp_path / "sft", tmp_path / "rl", group_of=kinds)
    assert cmp["n"] == 4 and cmp["groups"] == [ALL, "bridge", "single"]
    assert cmp["a"][ALL]["em"] == 0.5 and cmp["b"][ALL]["em"] == 0.75
    d = cmp["diff"]
    assert d[ALL]["diff"] == pytest.approx(0.25) and d[ALL]["ci_low"] == pytest.approx(0.25 - 0.49, abs=1e-3)
    assert d[ALL]["ci_high"] == pytest.approx(0.25 + 0.49, abs=1e-3)
    assert d["bridge"]["diff"] == 0.5 and d["bridge"]["ci_low"] == pytest.approx(-0.48, abs=1e-3)
    assert d["bridge"]["ci_high"] == 1.0 and d["single"] == {"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 2}
    md = paired_comparison_markdown(cmp)
    assert "| SFT+RL − SFT, paired 95% CI | **+25.0** [-24.0, +74.0]" in md and "bridge (n=2)" in md


def test_read_records_skips_a_partial_last_line(tmp_path, capsys):
    """An evaluation killed mid-write leaves half a record: the report reads the others."""
    rows = [rec(qid="0"), rec(qid="1", mode="rag"), rec(qid="2")]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "predictions.jsonl").write_text(text + text.splitlines()[0][:25])
    assert [r["id"] for r in report.read_records(tmp_path, "agent")] == ["0", "2"]
    assert f"{tmp_path / 'predictions.jsonl'}:4: invalid JSON" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the demo's report
FP32, BF16 = {"native_bf16": False, "gpu": None}, {"native_bf16": True, "gpu": None}
SENTENCES = json.loads((Path(__file__).resolve().parents[2] / "agent_rl" / "demo" / "expectations.json").read_text())[
    "sentences"]  # the report's sentences are data (docs/results/expect.yaml); these quotes are the test's own
QUOTES = {"sentences": SENTENCES, "quotes": [
    {"record": "docs/results/a", "host_kind": "native bf16", "where": "kb101", "command": "python benchmarks/rl_vs_sft.py",
     "label": "GRPO's best − SFT's best", "figure": "+4.0 to +9.0 (3 seeds)"},
    {"record": "docs/results/b", "host_kind": "native bf16", "where": "unseen", "command": "python benchmarks/rl_vs_sft.py",
     "label": "GRPO's best − SFT's best", "figure": "−5.0 [−10.2, +0.2] (1 seed)"},
    {"record": "docs/results/c", "host_kind": "native bf16", "where": "prereg", "command": "python benchmarks/rl_vs_sft.py",
     "label": "GRPO − RFT (best checkpoints)", "figure": "median −0.5, range −2.5 to +1.0"},
    {"record": "docs/results/c", "host_kind": "native bf16", "where": "prereg", "command": "python benchmarks/rl_vs_sft.py",
     "label": "GRPO − SFT more (best checkpoints)", "figure": "median +1.5, range −3.0 to +2.5"}]}


def test_the_demo_report_says_what_the_records_say_for_its_host_kind():
    """For its host kind the benchmark on KB 101, said to be the KB its settings were chosen on;
    for every kind the unseen KB's figure beside it; and what one demo run can show."""
    from agent_rl.demo.report import expectations

    native = expectations(BF16, QUOTES)
    assert "On this host kind (native bf16)" in native and "KB 101, the knowledge base its settings were chosen on" in native
    assert "+4.0 to +9.0 (3 seeds) (docs/results/a)" in native
    assert "never saw (native bf16), the same benchmark gave GRPO's best − SFT's best −5.0 [−10.2, +0.2] (1 seed)" in native
    assert "no claim that GRPO beats SFT" in native and "one run of a few GRPO steps" in native
    assert ("Pre-registered, on knowledge bases no choice saw (native bf16, the kind with room above imitation"
            in native) and ("GRPO − RFT (best checkpoints) median −0.5, range −2.5 to +1.0; GRPO − SFT more (best "
                            "checkpoints) median +1.5, range −3.0 to +2.5 (docs/results/c)") in native
    fp32 = expectations(FP32, QUOTES)
    assert fp32.startswith("No record of `benchmarks/rl_vs_sft` on this host kind (no native bf16 (fp32))")
    assert "+4.0 to +9.0" not in fp32 and "−5.0 [−10.2, +0.2]" in fp32 and "median −0.5" in fp32
    # a GPU is its own kind: the CPU's native bf16 beside it does not make a CPU figure its own
    assert expectations({"native_bf16": True, "gpu": "NVIDIA H200 x1"}, QUOTES).startswith(
        "No record of `benchmarks/rl_vs_sft` on this host kind (GPU (NVIDIA H200 x1))")


def test_the_packaged_figures_are_the_records_figures():
    """The report reads agent_rl/demo/expectations.json (generated from docs/results by
    `python -m benchmarks.records index`), not a path in the source tree: each quote is its
    record's headline figure, and each CPU kind finds its own."""
    from agent_rl.demo.records import read_record
    from agent_rl.demo.report import expectations, packaged_expectations

    root = Path(__file__).resolve().parents[2]
    quotes = packaged_expectations()["quotes"]
    assert {q["where"] for q in quotes} == {"kb101", "unseen", "prereg"}
    for q in quotes:
        rec = read_record(root / q["record"])
        assert rec.headline[q["label"]] == q["figure"] and rec.host_kind == q["host_kind"]
    for kind in (BF16, FP32):
        assert expectations(kind).startswith("On this host kind")


@pytest.mark.slow
def test_the_report_quotes_its_figures_from_an_installed_package(tmp_path):
    """`pip install` the project into a directory of its own and run the report's quoting from
    there, in a process that cannot see the source tree: the figures travel as package data."""
    import subprocess
    import sys

    import shutil

    root = Path(__file__).resolve().parents[2]
    src, target = tmp_path / "src", tmp_path / "site"  # built from a copy: no build/ left in the checkout
    for name in ("agent_rl", "data_prep", "retriever_server"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--quiet", "--target", str(target), str(src)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-3000:]
    assert (target / "agent_rl" / "demo" / "expectations.json").is_file()
    code = ("import agent_rl.demo.report as r, json; "
            "print(json.dumps({'file': r.__file__, 'text': r.expectations({'native_bf16': True, 'gpu': None})}))")
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(target))
    figure = json.loads((root / "agent_rl" / "demo" / "expectations.json").read_text())["quotes"][0]["figure"]
    assert out["text"].startswith("On this host kind (native bf16)") and figure in out["text"]
