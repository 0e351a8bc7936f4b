"""PromptLoader: seeded order, epoch crossing, and resume from a saved position."""

from __future__ import annotations

import pandas as pd
import pytest

from agent_rl.training.data import Prompt, PromptLoader, TrainDataError, drop_overlong, load_prompts


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"q{i}", question=f"question {i}?", golden_answers=[f"a{i}"]) for i in range(n)]


def _ids(batch: list[Prompt]) -> list[str]:
    return [p.id for p in batch]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    loader = PromptLoader(_prompts(10), batch_size=5, shuffle=True, seed=3)
    e0 = _ids(loader.next_batch()) + _ids(loader.next_batch())
    e1 = _ids(loader.next_batch()) + _ids(loader.next_batch())
    assert sorted(e0) == sorted(e1) == sorted(f"q{i}" for i in range(10))
    assert e0 != e1 and e0 != [f"q{i}" for i in range(10)]
    assert loader.pos.epoch == 2 and loader.pos.index == 0


def test_same_seed_same_order_and_no_shuffle_keeps_file_order():
    a = PromptLoader(_prompts(7), 3, seed=5)
    b = PromptLoader(_prompts(7), 3, seed=5)
    assert [_ids(a.next_batch()) for _ in range(5)] == [_ids(b.next_batch()) for _ in range(5)]
    plain = PromptLoader(_prompts(4), 4, shuffle=False)
    assert _ids(plain.next_batch()) == ["q0", "q1", "q2", "q3"]


def test_batch_crossing_an_epoch_continues_into_the_next_order():
    loader = PromptLoader(_prompts(5), batch_size=3, seed=0)
    first, second = loader.next_batch(), loader.next_batch()
    assert len(second) == 3 and loader.pos.epoch == 1 and loader.pos.index == 1
    order0 = PromptLoader(_prompts(5), 5, seed=0).next_batch()
    assert _ids(first) + _ids(second)[:2] == _ids(order0)


def test_resume_from_state_dict_gives_the_same_stream():
    ref = PromptLoader(_prompts(11), 4, seed=9)
    stream = [_ids(ref.next_batch()) for _ in range(8)]
    a = PromptLoader(_prompts(11), 4, seed=9)
    for _ in range(3):
        a.next_batch()
    a.take(2)  # over-sampling for group filtering also moves the position
    state = a.state_dict()
    b = PromptLoader(_prompts(11), 4, seed=9)
    b.load_state_dict(state)
    assert [_ids(b.next_batch()) for _ in range(3)] == [_ids(a.next_batch()) for _ in range(3)]
    # and both continue the uninterrupted stream (3 batches + 2 prompts = 14 = 3.5 batches in)
    flat = [i for batch in stream for i in batch]
    resumed = PromptLoader(_prompts(11), 4, seed=9)
    resumed.load_state_dict(state)
    assert _ids(resumed.take(8)) == flat[14:22]


def test_bad_batch_size_is_rejected():
    with pytest.raises(ValueError, match="exceeds"):
        PromptLoader(_prompts(2), 3)
    with pytest.raises(ValueError, match="positive"):
        PromptLoader(_prompts(2), 0)


def test_load_prompts_reads_qa_files(tmp_path):
    path = tmp_path / "qa.jsonl"
    pd.DataFrame(
        [
            {"id": "1", "question": "Who?", "golden_answers": ["Ann"]},
            {"id": "3", "question": "Where?", "golden_answers": ["Paris", "paris"]},
        ]
    ).to_json(path, orient="records", lines=True)
    prompts = load_prompts([str(path)])
    assert [p.id for p in prompts] == ["1", "3"]
    assert prompts[1].golden_answers == ["Paris", "paris"] and prompts[0].question == "Who?"
    assert [p.id for p in load_prompts([str(path)], max_rows=1)] == ["1"]
    with pytest.raises(FileNotFoundError, match="nope"):
        load_prompts([str(tmp_path / "nope.parquet")])


def test_load_prompts_names_the_file_of_a_malformed_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    pd.DataFrame([{"id": "1", "question": "Who?", "golden_answers": ["Ann"]}, {"id": "2", "question": "", "golden_answers": []}]).to_json(
        path, orient="records", lines=True
    )
    with pytest.raises(Exception, match="bad.jsonl"):  # data_prep.io.DataPrepError
        load_prompts([str(path)])


def test_drop_overlong_keeps_prompts_that_fit():
    prompts = _prompts(5)
    kept = drop_overlong(prompts, lambda p: int(p.id[1:]) * 10, max_len=20)
    assert [p.id for p in kept] == ["q0", "q1", "q2"]
    with pytest.raises(ValueError, match="max_prompt_length=5"):
        drop_overlong(prompts, lambda p: 100, max_len=5)


# ----------------------------------------------------------------------------- balanced batches
def _mixed(n: int = 200) -> list[Prompt]:
    """The demo's knowledge-base mix: 40% single, 35% bridge, 25% comparison, in file order
    blocks (as the generator writes them)."""
    kinds = ["single"] * (n * 40 // 100) + ["bridge"] * (n * 35 // 100) + ["comparison"] * (n * 25 // 100)
    return [Prompt(id=f"q{i}", question=f"question {i}?", golden_answers=["a"], stratum=k) for i, k in enumerate(kinds)]


def test_balanced_batches_hold_every_kind_in_its_share():
    prompts = _mixed()
    kind = {p.id: p.stratum for p in prompts}
    share = {"single": 0.40, "bridge": 0.35, "comparison": 0.25}
    loader = PromptLoader(prompts, 8, seed=1, balanced=True)
    epoch = []
    for _ in range(len(prompts) // 8):
        batch = loader.next_batch()
        epoch += _ids(batch)
        for k, f in share.items():
            count = sum(kind[i] == k for i in _ids(batch))
            assert abs(count - 8 * f) < 2, (k, count, _ids(batch))
    assert sorted(epoch) == sorted(p.id for p in prompts)  # still one pass over every prompt
    # a plain shuffle of the same prompts does draw batches far from the mix
    plain = PromptLoader(prompts, 8, seed=1)
    worst = max(abs(sum(kind[i] == k for i in _ids(plain.next_batch())) - 8 * f)
                for _ in range(len(prompts) // 8) for k, f in share.items())
    assert worst >= 2
    # seeded: the same order again, another seed another order, each stratum shuffled
    again = PromptLoader(prompts, 8, seed=1, balanced=True)
    assert [i for _ in range(25) for i in _ids(again.next_batch())] == epoch
    other = PromptLoader(prompts, 8, seed=2, balanced=True)
    assert [i for _ in range(25) for i in _ids(other.next_batch())] != epoch
    singles = [i for i in epoch if kind[i] == "single"]
    assert singles != sorted(singles, key=lambda i: int(i[1:]))


def test_balanced_loader_resumes_where_it_stopped():
    ref = PromptLoader(_mixed(), 8, seed=4, balanced=True)
    stream = [i for _ in range(10) for i in _ids(ref.next_batch())]
    a = PromptLoader(_mixed(), 8, seed=4, balanced=True)
    for _ in range(3):
        a.next_batch()
    b = PromptLoader(_mixed(), 8, seed=4, balanced=True)
    b.load_state_dict(a.state_dict())
    assert _ids(b.take(16)) == stream[24:40]


def test_balance_by_reads_the_column_or_names_what_is_missing(tmp_path):
    path = tmp_path / "qa.parquet"
    pd.DataFrame({"id": ["a", "b"], "question": ["q1?", "q2?"], "golden_answers": [["x"], ["y"]],
                  "data_source": ["kb", "kb"], "kind": ["single", "bridge"]}).to_parquet(path)
    assert [p.stratum for p in load_prompts([str(path)], balance_by="kind")] == ["single", "bridge"]
    assert [p.stratum for p in load_prompts([str(path)], balance_by="data_source")] == ["kb", "kb"]
    assert [p.stratum for p in load_prompts([str(path)])] == ["", ""]
    with pytest.raises(TrainDataError, match="data.balance_by='level'.*no such column"):
        load_prompts([str(path)], balance_by="level")


def test_load_prompts_drops_golds_that_normalise_to_nothing(tmp_path, capsys):
    """Training and evaluation read no gold answer that normalises to "" (issue 83, case 2):
    an empty `<answer></answer>` would match it exactly, and any text contain it. A row left
    without one is skipped with a warning naming it, in training too."""
    from data_prep.io import Report
    from data_prep.normalize import normalize_answer

    path = tmp_path / "qa.parquet"
    pd.DataFrame({"id": ["1", "2", "3"], "question": ["Who?", "Which band?", "Where?"],
                  "golden_answers": [["Ann", "an"], [".", "The"], ["Paris", "", "Rome"]],
                  "data_source": ["nq"] * 3, "split": ["train"] * 3}).to_parquet(path)
    for report in (None, Report()):  # training, evaluation
        prompts = load_prompts([str(path)], report=report)
        assert [(p.id, p.golden_answers) for p in prompts] == [("1", ["Ann"]), ("3", ["Paris", "Rome"])]
        assert all(normalize_answer(g) for p in prompts for g in p.golden_answers)
    assert f"{path}:row 2: 'golden_answers' has no usable answer: '.', 'The' normalise to" in capsys.readouterr().err
    assert report.skipped == 1 and len(report.notes) == 2
