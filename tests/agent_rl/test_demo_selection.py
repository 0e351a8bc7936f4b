"""The model `make demo` hands over (agent_rl.demo.selection): the selection questions are
held-out test questions outside the compared sample; GRPO's model is kept only where its last
validation leads step 0's (the SFT model) by `select_lead` questions; the report says which and why."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from agent_rl.demo.selection import choose, grpo_overrides, selection_markdown, write_selection_questions
from agent_rl.evaluation.evaluate import load_questions


def test_selection_questions_never_include_a_compared_question(tiny_kb, tmp_path):
    test = tiny_kb / "test.parquet"
    every = [p.id for p in load_questions([str(test)])]
    compared = {p.id for p in load_questions([str(test)], 8)}  # the evaluation's --limit 8 sample
    n = write_selection_questions(test, tmp_path / "sel.parquet", 8, 5)
    sel = pd.read_parquet(tmp_path / "sel.parquet")
    assert n == len(sel) == 5 and not set(sel["id"]) & compared and set(sel["id"]) <= set(every)
    assert list(sel["id"]) == [i for i in every if i in set(sel["id"])]  # file order
    assert list(sel.columns) == list(pd.read_parquet(test).columns)  # the rows as they are
    # the same draw again; and when the rest is smaller than asked, all of the rest
    write_selection_questions(test, tmp_path / "again.parquet", 8, 5)
    assert list(pd.read_parquet(tmp_path / "again.parquet")["id"]) == list(sel["id"])
    assert write_selection_questions(test, tmp_path / "all.parquet", 8, 10_000) == len(every) - 8


def _metrics(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


# 40 questions: 0.55 is 22 right against the SFT model's 20, 0.525 one more; floats as the metrics hold them
@pytest.mark.parametrize("last, lead, chosen", [(0.55, 2, "SFT+RL"), (0.525, 2, "SFT"), (21 / 40, 1, "SFT+RL"),
                                                (0.50, 2, "SFT"), (0.50, 0, "SFT+RL"), (0.40, 2, "SFT"),
                                                (0.575, 3, "SFT+RL"), (0.55, 3, "SFT")])
def test_grpo_is_kept_only_where_its_last_validation_leads_the_sft_model_by_the_lead(tmp_path, last, lead, chosen):
    run = _metrics(tmp_path / "grpo", [{"step": 0, "val/em": 0.5}, {"step": 1, "reward/mean": 0.1},
                                       {"step": 2, "val/em": 0.9, "reward/mean": 0.2}, {"step": 3, "val/em": last}])
    assert choose(run, 40, lead) == {"n": 40, "lead": lead, "sft_em": 0.5, "rl_em": last, "rl_step": 3,
                                     "chosen": chosen}


def test_the_demo_asks_for_a_lead_of_two_selection_questions():
    from agent_rl.demo.budget import SIZES

    assert (SIZES.select_n, SIZES.select_lead) == (40, 2)


@pytest.mark.parametrize("rows, sft_em", [([{"step": 1, "val/em": 0.6}], None),
                                          ([{"step": 0, "val/em": 0.6}, {"step": 1}], 0.6)])
def test_a_run_without_both_validations_keeps_the_sft_model_and_says_why(tmp_path, rows, sft_em):
    # say `--grpo-set trainer.test_freq=-1`: the demo still ends with a model and a report
    sel = choose(_metrics(tmp_path / "grpo", rows), 40, 2)
    assert sel["chosen"] == "SFT" and sel["sft_em"] == sft_em and sel["rl_em"] is None
    assert "no validation at step 0 and after a step" in sel["unvalidated"]
    md = selection_markdown({**sel, "model": "w/sft"}, 0.05)
    assert "hands over: the SFT model" in md and sel["unvalidated"] in md and "**+0.0**" in md and "+5.0" in md


def test_the_overrides_validate_on_the_selection_questions_at_the_ends_only(tmp_path):
    from agent_rl.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, "configs/train/demo_grpo_cpu.yaml", grpo_overrides(tmp_path / "sel.parquet", 40))
    assert cfg.data.val_files == [str(tmp_path / "sel.parquet")] and cfg.data.val_batch_size == 40
    assert cfg.trainer.val_before_train and cfg.trainer.test_freq >= 1_000_000 and cfg.data.val_data_num is None


def test_the_section_names_the_model_handed_over_and_grpos_own_difference():
    kept = selection_markdown({"n": 40, "sft_em": 0.5, "rl_em": 0.6, "rl_step": 8, "chosen": "SFT+RL",
                               "model": "w/grpo"}, 0.125)
    assert "hands over: SFT+RL" in kept and "60.0%" in kept and "50.0%" in kept and "**+12.5**" in kept
    assert "`w/grpo`" in kept
    kept_sft = selection_markdown({"n": 40, "lead": 2, "sft_em": 0.5, "rl_em": 0.45, "rl_step": 8, "chosen": "SFT"},
                                  -0.1)
    assert "hands over: the SFT model" in kept_sft and "**+0.0**" in kept_sft and "-10.0" in kept_sft
    short = selection_markdown({"n": 40, "lead": 2, "sft_em": 0.5, "rl_em": 0.525, "rl_step": 8, "chosen": "SFT"}, 0.03)
    assert "did not beat it there by 2 questions or more" in short and "52.5%" in short and "+3.0" in short
