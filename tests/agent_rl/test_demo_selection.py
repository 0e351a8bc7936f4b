"""The model `make demo` hands over (agent_rl.demo.selection): the selection questions are
held-out test questions outside the compared sample; GRPO's model is kept only where its last
validation leads step 0's (the SFT model) by more than chance, question by question (the exact
McNemar test at `select_alpha`); the report says which and why."""

from __future__ import annotations

import json
from fractions import Fraction

import pandas as pd
import pytest

from agent_rl.demo.selection import choose, grpo_overrides, mcnemar_p, selection_markdown, write_selection_questions
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


def _run(run_dir, sft_right: set, rl_right: set, n: int = 40):
    """A GRPO run validated at step 0 and step 3 on questions q0..q{n-1}, with these right."""
    from agent_rl.training.metrics import write_validation

    for step, right in ((0, sft_right), (3, rl_right)):
        write_validation(run_dir / "validation", step, [{"id": f"q{i}", "metric": float(i in right)} for i in range(n)])
    return _metrics(run_dir, [{"step": 0, "val/em": len(sft_right) / n}, {"step": 1, "reward/mean": 0.1},
                              {"step": 3, "val/em": len(rl_right) / n}])


def test_mcnemar_p_against_the_binomial_counted_by_hand():
    # two-sided: twice the chance of a split at least this uneven, n disagreements each a fair coin
    assert mcnemar_p(6, 0) == Fraction(2, 2**6) and mcnemar_p(0, 6) == Fraction(2, 2**6)
    assert mcnemar_p(5, 0) == Fraction(2, 2**5)
    assert mcnemar_p(8, 1) == Fraction(2 * (1 + 9), 2**9)  # 8 of 9 or 9 of 9
    assert mcnemar_p(7, 1) == Fraction(2 * (1 + 8), 2**8)
    assert mcnemar_p(0, 0) == mcnemar_p(3, 3) == 1.0  # capped at 1


# (wins, losses) over 40 questions, the SFT model right on q0..q19 (50%): wins are questions
# from q20 on that GRPO's answered, losses questions under q20 it missed
@pytest.mark.parametrize("wins, losses, chosen", [
    (6, 0, "SFT+RL"),  # p = 0.031
    (5, 0, "SFT"),  # p = 0.062: a five-question lead is never enough on 40
    (8, 1, "SFT+RL"),  # 0.039
    (7, 1, "SFT"),  # 0.070: the same six-question lead as 6-0, more disagreement
    (0, 6, "SFT"),  # significant, the wrong way
    (0, 0, "SFT"),
    (2, 3, "SFT"),
])
def test_grpo_is_kept_only_where_its_lead_is_more_than_chance_question_by_question(tmp_path, wins, losses, chosen):
    sft = set(range(20))
    rl = (sft - set(range(losses))) | set(range(20, 20 + wins))
    sel = choose(_run(tmp_path / "grpo", sft, rl), 40, 0.05)
    assert sel == {"n": 40, "alpha": 0.05, "sft_em": 0.5, "rl_em": len(rl) / 40, "rl_step": 3, "wins": wins,
                   "losses": losses, "p": mcnemar_p(wins, losses), "chosen": chosen}


def test_the_demo_asks_for_a_lead_beyond_chance_at_five_percent_on_forty_questions():
    from agent_rl.demo.budget import SIZES, STANDARD

    assert (STANDARD.select_n, SIZES.select_alpha) == (40, 0.05)


def test_validation_files_are_written_only_where_asked_and_may_name_the_run_directory(tmp_path):
    from agent_rl.config import TrainConfig, load_config

    assert TrainConfig().trainer.validation_data_dir is None  # veRL's default: none written
    cfg = load_config(TrainConfig, "configs/train/demo_grpo_cpu.yaml",
                      [f"trainer.default_local_dir={tmp_path}/r", "trainer.validation_data_dir=${trainer.default_local_dir}/v"])
    assert cfg.trainer.validation_data_dir == f"{tmp_path}/r/v"  # a reference to a value that holds one
    with pytest.raises(ValueError, match="refers to itself"):
        load_config(TrainConfig, None, ["trainer.experiment_name=${trainer.default_local_dir}"])


@pytest.mark.parametrize("damage, why", [
    ("missing", "no validation of step 3"),
    ("other questions", "different questions at step 0 (40) and step 3 (39)"),
    ("no id", "row 2 needs a text id and a numeric metric"),
    ("twice", "question 'q0' comes twice"),
])
def test_validations_that_cannot_be_compared_one_by_one_keep_the_sft_model_and_say_why(tmp_path, damage, why):
    run = _run(tmp_path / "grpo", set(range(20)), set(range(30)))
    last = run / "validation" / "3.jsonl"
    rows = last.read_text().splitlines()
    if damage == "missing":
        last.unlink()
    elif damage == "other questions":
        last.write_text("\n".join(rows[1:]) + "\n")
    elif damage == "no id":
        last.write_text("\n".join([rows[0], json.dumps({"metric": 1.0}), *rows[2:]]) + "\n")
    else:
        last.write_text("\n".join([rows[0], rows[0], *rows[2:]]) + "\n")
    sel = choose(run, 40, 0.05)
    assert sel["chosen"] == "SFT" and why in sel["unvalidated"] and sel["rl_em"] == 0.75


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

    cfg = load_config(TrainConfig, "configs/train/demo_grpo_cpu.yaml",
                      grpo_overrides(tmp_path / "sel.parquet", 40, tmp_path / "grpo"))
    assert cfg.data.val_files == [str(tmp_path / "sel.parquet")] and cfg.data.val_batch_size == 40
    assert cfg.trainer.validation_data_dir == str(tmp_path / "grpo" / "validation")  # where choose() reads
    assert cfg.trainer.val_before_train and cfg.trainer.test_freq >= 1_000_000 and cfg.data.val_data_num is None


def test_the_section_names_the_model_handed_over_and_grpos_own_difference():
    base = {"n": 40, "alpha": 0.05, "sft_em": 0.5, "rl_step": 8}
    kept = selection_markdown({**base, "rl_em": 0.6, "wins": 5, "losses": 1, "p": 0.219, "chosen": "SFT+RL",
                               "model": "w/grpo"}, 0.125)
    assert "hands over: SFT+RL" in kept and "60.0%" in kept and "50.0%" in kept and "**+12.5**" in kept
    assert "`w/grpo`" in kept and "answered 5 that SFT's missed and missed 1" in kept and "0.219" in kept
    kept_sft = selection_markdown({**base, "rl_em": 0.45, "wins": 1, "losses": 3, "p": 0.625, "chosen": "SFT"}, -0.1)
    assert "hands over: the SFT model" in kept_sft and "**+0.0**" in kept_sft and "-10.0" in kept_sft
    assert "GRPO's did not lead, so" in kept_sft
    short = selection_markdown({**base, "rl_em": 0.625, "wins": 5, "losses": 0, "p": 0.0625, "chosen": "SFT"}, 0.03)
    assert "0.062 (exact McNemar test); more than 0.05: the lead may be chance" in short and "62.5%" in short and "+3.0" in short
