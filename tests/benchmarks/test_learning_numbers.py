"""benchmarks/learning.py's numbers, per data source, from evaluation directories written by
hand (the real runs take an hour: not in CI): EM per mode, strict-format rate and searches
before / after RL, and the paired RL - SFT interval; the held-out filter drops and counts
test questions that a training file also has."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_rl.evaluation import report  # noqa: E402
from benchmarks import learning  # noqa: E402


def _rec(mode: str, src: str, qid: str, em: float, valid: bool = True, searches: int = 1) -> dict:
    return {"id": qid, "mode": mode, "data_source": src, "em": em, "subem": em, "f1": em, "valid_format": valid,
            "searches": searches, "turns": searches + 1, "prediction": "x", "retrieval_hit": False}


def _write(d: Path, records: list[dict]) -> None:
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report.write_summary(report.summarize(records), d)


def test_numbers_per_set_from_the_evaluations(tmp_path):
    # nq: 4 questions, SFT right on q0 only; RL right on q0, q1, q2; hotpotqa: 2 questions, both 0 -> 1 of 2
    sft = [_rec("agent", "nq", f"q{i}", float(i == 0), valid=i != 3) for i in range(4)]
    sft += [_rec("agent", "hotpotqa", f"h{i}", 0.0, valid=False, searches=2) for i in range(2)]
    sft += [_rec("rag", "nq", f"q{i}", float(i < 2), searches=0) for i in range(4)]
    sft += [_rec("rag", "hotpotqa", f"h{i}", 0.0, searches=0) for i in range(2)]
    sft += [_rec("direct", s, q, 0.0, searches=0) for s, q in [("nq", "q0"), ("nq", "q1"), ("nq", "q2"), ("nq", "q3"),
                                                                ("hotpotqa", "h0"), ("hotpotqa", "h1")]]
    rl = [_rec("agent", "nq", f"q{i}", float(i < 3), searches=2) for i in range(4)]
    rl += [_rec("agent", "hotpotqa", "h0", 1.0, searches=2), _rec("agent", "hotpotqa", "h1", 0.0, searches=2)]
    _write(tmp_path / "eval_sft", sft)
    _write(tmp_path / "eval_rl", rl)
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": r, "reward/em": r, "timing/step": 30.0}) + "\n"
        for s, r in [(1, 0.1), (2, 0.2), (3, 0.5)]))

    res = learning.assemble(tmp_path, steps=7, seconds=600.0)
    assert res["steps"] == 7 and res["minutes"] == pytest.approx(10.0)
    nq, hp = res["sets"]["nq"], res["sets"]["hotpotqa"]
    assert (nq["em_sft"], nq["em_rl"], nq["em_rag"], nq["em_direct"]) == (0.25, 0.75, 0.5, 0.0)
    assert (nq["format_rate_sft"], nq["format_rate_rl"]) == (0.75, 1.0)
    assert (nq["searches_sft"], nq["searches_rl"]) == (1.0, 2.0)
    assert (hp["em_sft"], hp["em_rl"], hp["format_rate_sft"], hp["searches_sft"]) == (0.0, 0.5, 0.0, 2.0)
    assert res["em_sft"] == pytest.approx(1 / 6) and res["em_rl"] == pytest.approx(4 / 6)
    # nq differences 0, 1, 1, 0: mean 0.5, sd sqrt(1/3), half width 1.96 * sd / 2 (the top clipped at 1)
    half = report.Z95 * (1 / 3) ** 0.5 / 2
    assert nq["ci"]["em_rl_minus_sft"] == pytest.approx([0.5 - half, 1.0])
    assert nq["n_eval"] == 4 and hp["n_eval"] == 2
    assert res["searches"] == {"sft": res["searches_sft"], "rl": res["searches_rl"]}
    d = res["diagnostics"]  # window 1 of 3 steps: first vs last
    assert (d["reward_mean_first"], d["reward_mean_last"], d["steps_logged"]) == (0.1, 0.5, 3)
    assert Path(res["curves_png"]).stat().st_size > 0


def test_held_out_drops_and_counts_training_questions(tmp_path):
    train = tmp_path / "train.parquet"
    pd.DataFrame({"id": ["t0", "t1"], "question": ["Who wrote Hamlet?", "Where is Paris?"],
                  "golden_answers": [["Shakespeare"], ["France"]], "data_source": "nq", "split": "train"}).to_parquet(train)
    test = tmp_path / "nq_test.parquet"
    pd.DataFrame({"id": ["a", "b", "c"], "question": ["who wrote hamlet", "When was the Eiffel Tower built?",
                                                      "Where is  Paris"],
                  "golden_answers": [["Shakespeare"], ["1889"], ["France"]], "data_source": "nq",
                  "split": "test"}).to_parquet(test)
    cfg = ROOT / "configs/train/demo_grpo_cpu.yaml"
    (kept,), dropped = learning.held_out([test], cfg, [f"data.train_files=[{train}]"], tmp_path / "work")
    assert dropped == {"nq_test": 2}
    assert list(pd.read_parquet(kept)["id"]) == ["b"]


def test_real_mode_trains_on_what_the_recipe_trains_rl_on():
    """--real must train on (and hold out the test questions of) what scripts/real_data.sh
    trains RL on: the demonstrations' questions and a sample of HotpotQA/2Wiki's."""
    import re

    script = (ROOT / "scripts" / "real_data.sh").read_text()
    sets = re.search(r'^TRAIN_SETS="([^"]+)"', script, re.M).group(1).split()
    assert tuple(sets) == learning.REAL_TRAIN_SETS
    assert 'RL_FILES="$RL_FILES,$OUT/demos_$qa.parquet"' in script  # the files RL trains on
    assert '"data.train_files=[${RL_FILES#,}]"' in script and '"data.train_files=[${SFT_FILES#,}]"' in script
    assert re.search(r'^OUT=\$\{OUT:-artifacts/real\}', script, re.M)
    assert 'RL_FILES="$RL_FILES,$OUT/split/rl_hotpot_train_questions.parquet"' in script
    assert list(learning.REAL["train_files"]) == [f"artifacts/real/demos_{s}.parquet" for s in sets] + [
        "artifacts/real/split/rl_hotpot_train_questions.parquet"]


def test_time_to_gain_reads_the_running_evaluation(tmp_path):
    """val/em at step 0 is the SFT model (0.60); the first later evaluation at >= 0.65 is step 8,
    after 240 s of training on the trainer's clock (its validations are not on it): 4.0 minutes
    of RL. A run that never gains reports None."""
    rows = [{"step": 0, "val/em": 0.60}, {"step": 4, "val/em": 0.62, "training/elapsed_s": 120.0,
                                           "timing/validate": 30.0},
            {"step": 6, "reward/mean": 0.5, "training/elapsed_s": 180.0},
            {"step": 8, "val/em": 0.65, "training/elapsed_s": 240.0, "timing/validate": 30.0},
            {"step": 12, "val/em": 0.70, "training/elapsed_s": 360.0, "timing/validate": 30.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = learning.time_to_gain(tmp_path, 0.05)
    assert (t["time_to_gain_min"], t["steps_to_gain"]) == (4.0, 8)
    assert (t["val_em_start"], t["val_em_best"], t["val_em_last"]) == (0.60, 0.70, 0.70)
    assert learning.time_to_gain(tmp_path, 0.20)["time_to_gain_min"] is None
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(ValueError, match="no step-0 val/em"):
        learning.time_to_gain(tmp_path, 0.05)


def test_time_to_gain_under_every_second_counts_the_validations_in_the_minutes(tmp_path):
    """trainer.max_time_counts=all (benchmarks/rl_vs_sft's arms): each step's
    training/elapsed_s holds the validations (30 s each) and checkpoints (10 s each, every 4
    steps) before it. Steps of 30 s, validated every 4: step 4 ends at 120 s, step 8 at 120 +
    30 + 10 + 120 = 280 s; the gain (0.60 -> 0.65) at step 8 is 280 s of wall time, 4.67 minutes,
    where the steps alone (trainer.max_time_counts=steps) would say 4.0."""
    rows = [{"step": 0, "val/em": 0.60}, {"step": 4, "val/em": 0.62, "training/elapsed_s": 120.0},
            {"step": 8, "val/em": 0.65, "training/elapsed_s": 280.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = learning.time_to_gain(tmp_path, 0.05)
    assert (t["steps_to_gain"], t["time_to_gain_min"]) == (8, pytest.approx(280.0 / 60))
    assert t["val_points"] == [(0, 0.0, 0.60), (4, 2.0, 0.62), (8, pytest.approx(280.0 / 60), 0.65)]
