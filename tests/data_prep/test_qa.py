"""QA conversion and reading: the real files (cross-checked against FlashRAG's own
conversions of the same sets), Search-R1's training parquet, datasets directories,
malformed fixtures and the train/test overlap check."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

from data_prep.io import DataPrepError, Report
from data_prep.qa import check_overlap, convert_qa, question_from_prompt, read_qa, split_by_id


# Search-R1's prompt (scripts/data_process/nq_search.py, template_type="base").
SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
    "a search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
)


def _frame(path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    df["golden_answers"] = [list(a) for a in df["golden_answers"]]
    return df


# ---------------------------------------------------------------------------------------
# real files


@pytest.mark.shared_data
def test_nq_open_matches_flashrag_conversion(shared_data, tmp_path):
    r = convert_qa(shared_data / "raw" / "NQ-open.dev.jsonl", tmp_path / "nq.parquet", source="nq", split="test")
    # lines 291 ('---') and 364 (')') have no gold answer that normalises to something
    assert (r.read, r.written, r.skipped) == (3610, 3608, 2)
    ours = _frame(tmp_path / "nq.parquet")
    assert list(ours.columns) == ["id", "question", "golden_answers", "data_source", "split"]
    theirs = read_qa(shared_data / "qa" / "nq" / "test.jsonl")
    assert ours[["id", "question", "golden_answers"]].equals(theirs[["id", "question", "golden_answers"]])
    assert set(ours.data_source) == {"nq"} and set(ours.split) == {"test"}


@pytest.mark.shared_data
def test_hotpotqa_json_array_matches_flashrag_conversion(shared_data, tmp_path):
    r = convert_qa(shared_data / "raw" / "hotpot_dev_v1_simplified.json", tmp_path / "h.parquet", source="hotpotqa")
    assert (r.read, r.written, r.skipped) == (7405, 7403, 2)  # the bands 'The The' and '!!!'
    assert "'The The' normalises to \"\"" in r.problems[0]
    ours = _frame(tmp_path / "h.parquet")
    assert set(ours.split) == {"dev"}  # inferred from the file name
    theirs = read_qa(shared_data / "qa" / "hotpotqa" / "dev.jsonl")  # FlashRAG keeps type in metadata
    cols = ["id", "question", "golden_answers", "type"]
    assert ours[cols].equals(theirs[cols])
    assert ours.type.value_counts().to_dict() == {"bridge": 5918, "comparison": 1485}


@pytest.mark.shared_data
def test_verl_rows_match_flashrag_conversion(shared_data, tmp_path):
    """AmbigQA in verl's schema: ground_truth is all answers joined into one string, the
    answer list sits in extra_info; the question is the prompt's user message."""
    r = convert_qa(shared_data / "raw" / "ambigqa_train.jsonl", tmp_path / "a.parquet")
    assert (r.read, r.written, r.skipped) == (10036, 10034, 2)  # two rows answered only 'the'
    ours = _frame(tmp_path / "a.parquet")
    theirs = read_qa(shared_data / "qa" / "ambigqa" / "train.jsonl")
    assert ours[["id", "question", "golden_answers"]].equals(theirs[["id", "question", "golden_answers"]])
    assert set(ours.data_source) == {"sewon/ambig_qa"} and set(ours.split) == {"train"}
    row = ours[ours.golden_answers.map(len) == 3].iloc[0]
    assert row.golden_answers == ["18", "Nebraska ( 19 )", "Mississippi ( 21 )"]


@pytest.mark.shared_data
@pytest.mark.parametrize("rel,rows", [
    # FlashRAG's files, less their rows whose gold answers all normalise to "" (skipped, not fatal)
    ("nq/test.jsonl", 3608), ("hotpotqa/dev.jsonl", 7403), ("hotpotqa_distractor300/dev.jsonl", 300),
    ("ambigqa/train.jsonl", 10034), ("r1searcher_train/train.jsonl", 8148), ("musique/train.jsonl", 19938),
])
def test_every_shared_qa_file_reads(shared_data, rel, rows):
    df = read_qa(shared_data / "qa" / rel)
    assert len(df) == rows
    assert df.id.is_unique and (df.question.str.len() > 0).all()
    assert all(isinstance(a, list) and a and all(isinstance(x, str) for x in a) for a in df.golden_answers)


@pytest.mark.shared_data
def test_limit_samples_deterministically(shared_data, tmp_path):
    src = shared_data / "qa" / "musique" / "train.jsonl"
    r = convert_qa(src, tmp_path / "a.parquet", source="musique", limit=1000, seed=3)
    assert (r.read, r.written, r.limited, r.skipped) == (19938, 1000, 18938, 0)
    convert_qa(src, tmp_path / "b.parquet", source="musique", limit=1000, seed=3)
    convert_qa(src, tmp_path / "c.parquet", source="musique", limit=1000, seed=4)
    a, b, c = (pd.read_parquet(tmp_path / f"{x}.parquet").id.tolist() for x in "abc")
    assert a == b and a != c
    ids = [int(i.split("_")[1]) for i in a]
    assert ids == sorted(ids)  # input order kept


@pytest.mark.shared_data
def test_overlap_real_files(shared_data):
    n, examples = check_overlap(shared_data / "qa" / "ambigqa" / "train.jsonl", shared_data / "qa" / "nq" / "test.jsonl")
    assert n == 5 and "when did one child policy end in china" in examples
    n_self, _ = check_overlap(shared_data / "qa" / "nq" / "test.jsonl", shared_data / "raw" / "NQ-open.dev.jsonl")
    assert n_self == 3608


# ---------------------------------------------------------------------------------------
# Search-R1's own training parquet


def _search_r1_rows(n: int = 3) -> list[dict]:
    qs = [("who wrote the song hallelujah", ["Leonard Cohen"]),
          ("Question: what is in a name?", ["a rose"]),  # a question that itself says "Question:"
          ("when was the eiffel tower built", ["1887", "1889"])][:n]
    rows = []
    for i, (q, answers) in enumerate(qs):
        question = q.strip() + ("" if q.endswith("?") else "?")  # Search-R1 appends "?"
        rows.append({
            "data_source": "nq",
            "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX + question + "\n"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "train", "index": i},
        })
    return rows


def test_read_qa_accepts_search_r1_parquet_as_is(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame(_search_r1_rows()).to_parquet(path)
    df = read_qa(path)
    assert df.id.tolist() == ["train_0", "train_1", "train_2"]
    assert df.question.tolist() == ["who wrote the song hallelujah?", "what is in a name?",
                                    "when was the eiffel tower built?"]
    assert df.golden_answers.tolist() == [["Leonard Cohen"], ["a rose"], ["1887", "1889"]]
    assert set(df.data_source) == {"nq"} and set(df.split) == {"train"}
    assert "prompt" in df.columns and "reward_model" in df.columns  # Search-R1's columns kept

    r = convert_qa(path, tmp_path / "ours.parquet")
    assert (r.read, r.written) == (3, 3)
    ours = read_qa(tmp_path / "ours.parquet")
    assert ours[["id", "question", "golden_answers"]].equals(df[["id", "question", "golden_answers"]])
    assert "prompt" not in ours.columns

    # Search-R1's HF `map` keeps the source columns (id, question, golden_answers): used as they are
    kept = [{**row, "id": f"nq_{i}", "question": f"raw question {i}", "golden_answers": [f"gold {i}"]}
            for i, row in enumerate(_search_r1_rows())]
    pd.DataFrame(kept).to_parquet(tmp_path / "kept.parquet")
    df = read_qa(tmp_path / "kept.parquet")
    assert df.id.tolist() == ["nq_0", "nq_1", "nq_2"] and df.question[2] == "raw question 2"
    assert df.golden_answers.tolist() == [["gold 0"], ["gold 1"], ["gold 2"]] and set(df.split) == {"train"}


def test_question_from_prompt_variants():
    assert question_from_prompt([{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "Plain question?"}]) == "Plain question?"
    assert question_from_prompt("Answer it. Question: Why?\n") == "Why?"
    with pytest.raises(ValueError, match="no user message"):
        question_from_prompt([{"role": "assistant", "content": "hi"}])


def test_datasets_directory_with_and_without_datasets(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = [{"question": "q one", "answer": ["a1"]}, {"question": "q two", "answer": ["a2", "b2"]}]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                               "test": datasets.Dataset.from_list(rows[:1])})
    dd.save_to_disk(str(tmp_path / "dd"))
    r = convert_qa(tmp_path / "dd", tmp_path / "a.parquet", source="toy")
    assert (r.read, r.written) == (3, 3)
    got = _frame(tmp_path / "a.parquet")
    assert got.split.tolist() == ["train", "train", "test"]
    assert got.golden_answers.tolist() == [["a1"], ["a2", "b2"], ["a1"]]
    assert got.id.tolist() == ["train_0", "train_1", "test_2"]

    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails: the pyarrow reader
    r = convert_qa(tmp_path / "dd", tmp_path / "b.parquet", source="toy")
    assert (r.read, r.written) == (3, 3)
    assert _frame(tmp_path / "b.parquet").equals(got)

    monkeypatch.undo()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "single"))
    assert len(read_qa(tmp_path / "single")) == 2
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataPrepError, match="not a `datasets` save_to_disk directory"):
        convert_qa(tmp_path / "plain", tmp_path / "c.parquet")


# ---------------------------------------------------------------------------------------
# malformed input


def _undecodable_table():
    import pyarrow as pa

    # Arrow keeps string bytes unchecked; a Latin-1 question stored that way is invalid UTF-8
    question = pa.array([b"who wrote hamlet?", b"caf\xe9?", b"capital of france?"], pa.binary()).view(pa.string())
    return pa.table({"id": ["q0", "q1", "q2"], "question": question,
                     "golden_answers": [["Shakespeare"], ["x"], ["Paris"]],
                     "data_source": ["nq"] * 3, "split": ["test"] * 3})


@pytest.mark.parametrize("layout", ["parquet", "datasets", "datasets-without-datasets"])
def test_undecodable_string_in_a_table_is_one_reported_row(tmp_path, monkeypatch, layout):
    table = _undecodable_table()
    if layout == "parquet":
        import pyarrow.parquet as pq

        src = tmp_path / "qa.parquet"
        pq.write_table(table, src)
        where = f"{src}:row 2"
    else:
        datasets = pytest.importorskip("datasets")
        src = tmp_path / "dd"
        datasets.Dataset(table).save_to_disk(str(src))
        if layout == "datasets":
            where = f"{src}:row 2"
        else:
            monkeypatch.setitem(sys.modules, "datasets", None)
            where = f"{next(src.glob('*.arrow'))}:row 2"
    r = convert_qa(src, tmp_path / "out.parquet")
    assert r.problems == [f"{where}: column 'question': invalid UTF-8 at byte 4 (0xe9)"]
    assert _frame(tmp_path / "out.parquet").id.tolist() == ["q0", "q2"]
    # training refuses the file, naming the row; a long job given a Report keeps the rest
    with pytest.raises(DataPrepError, match="invalid UTF-8"):
        read_qa(src)
    report = Report()
    assert read_qa(src, report).id.tolist() == ["q0", "q2"] and report.problems == r.problems


def test_malformed_rows_reported_good_rows_kept(tmp_path):
    src = tmp_path / "toy.jsonl"
    lines = [
        json.dumps({"id": "1", "question": "good one?", "golden_answers": ["yes"]}),  # 1
        '{"id": "2", "question": "broken',  # 2
        json.dumps({"id": "3", "golden_answers": ["a"]}),  # 3
        json.dumps({"id": "4", "question": 42, "golden_answers": ["a"]}),  # 4
        json.dumps({"id": "5", "question": "   ", "golden_answers": ["a"]}),  # 5
        json.dumps({"id": "6", "question": "q?", "golden_answers": {"a": 1}}),  # 6
        json.dumps({"id": "7", "question": "q?", "golden_answers": []}),  # 7
        json.dumps({"id": "1", "question": "dup id?", "golden_answers": ["z"]}),  # 8
        json.dumps({"id": "9", "question": "q?", "golden_answers": [["nested"]]}),  # 9
        json.dumps({"question": "nq style?", "answer": ["x", 1974]}),  # 10
        json.dumps({"data_source": "nq", "prompt": "Question: verl?", "reward_model": {"style": "rule"}}),  # 11
    ]
    src.write_text("\n".join(lines) + "\n")
    r = convert_qa(src, tmp_path / "out.parquet", source="toy")
    assert (r.read, r.written, r.skipped) == (11, 2, 9)
    assert r.problems == [
        f"{src}:2: invalid JSON (Unterminated string starting at at column 25)",
        f"{src}:3: missing field 'question'",
        f"{src}:4: 'question' must be a string, got int",
        f"{src}:5: empty question",
        f"{src}:6: 'golden_answers' must be a list of strings, got dict",
        f"{src}:7: 'golden_answers' has no non-empty answer",
        f"{src}:8: duplicate id '1' (first at {src}:1)",
        f"{src}:9: 'golden_answers' contains a list, expected strings",
        f"{src}:11: missing 'reward_model.ground_truth'",
    ]
    df = _frame(tmp_path / "out.parquet")
    assert df.to_dict("records") == [
        {"id": "1", "question": "good one?", "golden_answers": ["yes"], "data_source": "toy", "split": "unknown"},
        # positional id: 0-based index among all input rows, broken ones included
        {"id": "unknown_9", "question": "nq style?", "golden_answers": ["x", "1974"], "data_source": "toy",
         "split": "unknown"},
    ]
    with pytest.raises(DataPrepError, match="9 malformed QA rows"):
        read_qa(src)  # training must not silently lose rows


def test_malformed_json_array_items(tmp_path):
    src = tmp_path / "hotpot_dev.json"
    src.write_text(json.dumps([{"_id": "h1", "question": "Q?", "answer": "A1", "type": "bridge"},
                               {"question": "no answer?"}, 5], indent=1))
    r = convert_qa(src, tmp_path / "o.parquet", source="hotpotqa")
    assert (r.read, r.written, r.skipped) == (3, 1, 2)
    assert r.problems == [f"{src}:8 (item 1): missing field 'golden_answers' (or 'answer')",
                          f"{src}:11 (item 2): expected a JSON object, got int"]
    assert _frame(tmp_path / "o.parquet").to_dict("records") == [
        {"id": "h1", "question": "Q?", "golden_answers": ["A1"], "data_source": "hotpotqa", "split": "dev",
         "type": "bridge"}]
    obj = tmp_path / "obj.json"
    obj.write_text('{\n "a": {"question": "q?"}\n}\n')  # an object, not an array
    with pytest.raises(DataPrepError, match="expected a JSON array"):
        convert_qa(obj, tmp_path / "x.parquet")


def test_ragged_extra_columns_kept_as_json(tmp_path):
    """Full HotpotQA rows carry context = [[title, [sentences]]], which parquet cannot type."""
    src = tmp_path / "hotpot_train.json"
    rows = [{"_id": "a", "question": "Q?", "answer": "A1", "level": "easy",
             "context": [["T", ["s1", "s2"]]], "supporting_facts": [["T", 0]]},
            {"_id": "b", "question": "R?", "answer": "B", "level": 3, "context": [], "supporting_facts": []}]
    src.write_text(json.dumps(rows))
    r = convert_qa(src, tmp_path / "o.parquet", source="hotpotqa")
    assert (r.read, r.written) == (2, 2)
    df = pd.read_parquet(tmp_path / "o.parquet")
    assert json.loads(df.context[0]) == [["T", ["s1", "s2"]]]
    assert df.level.tolist() == ['"easy"', "3"]  # mixed types: JSON text
    assert df.split.tolist() == ["train", "train"]


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(DataPrepError, match="no such file"):
        convert_qa(tmp_path / "missing.jsonl", tmp_path / "o.parquet")
    csv = tmp_path / "qa.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(DataPrepError, match="unknown QA format"):
        convert_qa(csv, tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists()


def test_overlap_uses_normalised_text(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(json.dumps({"id": "a", "question": "Who wrote The Hobbit?", "golden_answers": ["x"]}) + "\n")
    test.write_text(json.dumps({"id": "b", "question": "who wrote hobbit", "golden_answers": ["x"]}) + "\n"
                    + json.dumps({"id": "c", "question": "Who wrote Dune?", "golden_answers": ["y"]}) + "\n")
    assert check_overlap(train, test) == (1, ["who wrote hobbit"])


@pytest.mark.shared_data
def test_official_multihop_schemas_give_support_titles(shared_data, tmp_path):
    """MuSiQue's and HotpotQA's official train rows: aliases join the gold answers, the
    supporting paragraphs' titles come out in hop order, decompositions are kept."""
    mh = shared_data / "qa" / "multihop_train"
    r = convert_qa(mh / "musique_train_100.json", tmp_path / "m.parquet", source="musique", split="train")
    assert (r.read, r.written, r.skipped) == (100, 100, 0)
    m = read_qa(tmp_path / "m.parquet").set_index("id")
    first = m.loc["2hop__150763_14904"]
    assert list(first.golden_answers) == ["G. Stanley Hall", "Stanley Hall"]
    assert list(first.support_titles) == ["Journal of Psychotherapy Integration", "Adolescence"]
    assert all(1 <= len(t) <= 4 for t in m.support_titles)
    r = convert_qa(mh / "hotpotqa_train_100.json", tmp_path / "h.parquet", source="hotpotqa", split="train")
    assert (r.read, r.written, r.skipped) == (100, 100, 0)
    h = read_qa(tmp_path / "h.parquet").set_index("id")
    assert list(h.loc["5a77ec115542992a6e59dff7"].support_titles) == ["Alû", "Lilu (mythology)"]
    assert set(h.type) == {"bridge", "comparison"}


def test_official_musique_rows_reported_when_unanswerable(tmp_path):
    src = tmp_path / "musique_official.jsonl"
    hop = {"question": "Q1", "answer": "A1", "paragraph_support_idx": 0}
    good = {"id": "g", "question": "Q?", "answer": "A1", "answer_aliases": [], "answerable": True,
            "question_decomposition": [hop, {**hop, "paragraph_support_idx": 7}],
            "paragraphs": [{"idx": 0, "title": "T0", "paragraph_text": "x"}]}
    src.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "u", "answerable": False}) + "\n")
    r = convert_qa(src, tmp_path / "o.parquet")
    assert (r.read, r.written) == (2, 1) and "answerable: false" in r.problems[0] and ":2" in r.problems[0]
    row = read_qa(tmp_path / "o.parquet").iloc[0]
    assert list(row.golden_answers) == ["A1"] and list(row.support_titles) == ["T0"]  # idx 7 names no paragraph


def test_split_by_id_is_disjoint_stable_and_keeps_every_column(tmp_path):
    import hashlib

    ids = [f"q{i}" for i in range(40)]
    src = tmp_path / "demos.parquet"
    pd.DataFrame({"id": ids, "question": [f"question {i}" for i in range(40)],
                  "response_ids": [[i, i + 1] for i in range(40)]}).to_parquet(src)
    rest, held = tmp_path / "rest.parquet", tmp_path / "held.parquet"
    want_held = [i for i in ids if int(hashlib.sha1(i.encode()).hexdigest(), 16) % 5 == 0]
    assert split_by_id(src, 5, rest, held) == (40 - len(want_held), len(want_held))
    r, h = pd.read_parquet(rest), pd.read_parquet(held)
    assert list(h["id"]) == want_held and want_held  # the hand rule, in file order, non-empty
    assert sorted(r["id"].tolist() + h["id"].tolist()) == sorted(ids) and not set(r["id"]) & set(h["id"])
    assert list(h.columns) == ["id", "question", "response_ids"] and list(h["response_ids"].iloc[0]) == [
        int(want_held[0][1:]), int(want_held[0][1:]) + 1]
    assert split_by_id(src, 5, tmp_path / "r2.parquet", tmp_path / "h2.parquet") == (len(r), len(h))
    assert pd.read_parquet(tmp_path / "h2.parquet")["id"].tolist() == want_held  # same split on a re-run
    with pytest.raises(ValueError, match="no 'id' column"):
        pd.DataFrame({"question": ["a"]}).to_parquet(tmp_path / "noid.parquet")
        split_by_id(tmp_path / "noid.parquet", 5, rest, held)


# ---------------------------------------------------------------------------------------
# gold answers that normalise to nothing (issue 83, case 2); Unicode in the overlap check (case 15)

_DROPPED = "normalises to \"\", no answer could match it"


def test_golds_that_normalise_to_nothing_are_dropped_by_each_text_reader(tmp_path):
    """FlashRAG, NQ-open and verl rows (jsonl) and a HotpotQA array: a gold "The", ".", "a",
    "an" or "" is dropped and noted by line; a row left with none is reported and skipped."""
    src = tmp_path / "qa.jsonl"
    rows = [
        {"id": "1", "question": "q1?", "golden_answers": ["The", "Paris"]},  # 1: flashrag
        {"id": "2", "question": "q2?", "golden_answers": [".", " a "]},  # 2: none left
        {"id": "3", "question": "q3?", "golden_answers": ["Rome", ""]},  # 3
        {"question": "q4?", "answer": ["an", "Oslo"]},  # 4: NQ-open
        {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: q5?"}],  # 5: verl
         "reward_model": {"ground_truth": {"target": ["the", "Lisbon"]}}, "extra_info": {"index": 5}},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = convert_qa(src, tmp_path / "o.parquet")
    assert (r.read, r.written, r.skipped) == (5, 4, 1)
    assert r.problems == [f"{src}:2: 'golden_answers' has no usable answer: '.', 'a' normalise to \"\""]
    assert r.notes == [f"{src}:1: gold answer 'The' dropped: it {_DROPPED}", f"{src}:3: gold answer '' dropped: it {_DROPPED}",
                       f"{src}:4: gold answer 'an' dropped: it {_DROPPED}", f"{src}:5: gold answer 'the' dropped: it {_DROPPED}"]
    assert _frame(tmp_path / "o.parquet").golden_answers.tolist() == [["Paris"], ["Rome"], ["Oslo"], ["Lisbon"]]

    hotpot = tmp_path / "hotpot_dev.json"
    hotpot.write_text(json.dumps([{"_id": "h1", "question": "Which band?", "answer": "The The"},
                                  {"_id": "h2", "question": "Which city?", "answer": "Paris"}], indent=1))
    r = convert_qa(hotpot, tmp_path / "h.parquet")
    assert (r.read, r.written) == (2, 1)
    assert r.problems == [f"{hotpot}:2 (item 0): 'answer' has no usable answer: 'The The' normalises to \"\""]


def test_our_parquet_with_empty_normalising_golds_is_read_without_them(tmp_path, capsys):
    """A parquet in our own layout went through read_qa's fast path as it was, [""] and
    ["The"] included, so `<answer></answer>` scored EM 1.0 against them."""
    src = tmp_path / "qa.parquet"
    pd.DataFrame({"id": ["a", "b", "c"], "question": ["qa?", "qb?", "qc?"],
                  "golden_answers": [["The", "Paris"], ["the"], ["Rome"]],
                  "data_source": ["x"] * 3, "split": ["test"] * 3, "kind": ["k1", "k2", "k3"]}).to_parquet(src)
    df = read_qa(src)  # training: the unscoreable row is skipped with a warning, not an error
    assert df.id.tolist() == ["a", "c"] and df.golden_answers.tolist() == [["Paris"], ["Rome"]]
    assert df.kind.tolist() == ["k1", "k3"]  # the extra columns stay with their rows
    err = capsys.readouterr().err
    assert f"warning: {src}:row 1: gold answer 'The' dropped" in err
    assert f"warning: {src}:row 2: 'golden_answers' has no usable answer: 'the' normalises to \"\"" in err
    report = Report()
    assert read_qa(src, report).id.tolist() == ["a", "c"]
    assert report.problems == [f"{src}:row 2: 'golden_answers' has no usable answer: 'the' normalises to \"\""]
    assert report.notes == [f"{src}:row 1: gold answer 'The' dropped: it {_DROPPED}"]

    blank = tmp_path / "blank.parquet"  # [""]: no answer at all, a malformed row as in jsonl
    pd.DataFrame({"id": ["a", "b"], "question": ["qa?", "qb?"], "golden_answers": [[""], ["Rome"]],
                  "data_source": ["x"] * 2, "split": ["test"] * 2}).to_parquet(blank)
    with pytest.raises(DataPrepError, match="1 malformed QA rows"):
        read_qa(blank)
    assert read_qa(blank, Report()).golden_answers.tolist() == [["Rome"]]


def test_overlap_finds_unicode_variants_of_a_question(tmp_path):
    """NFD accents, curly apostrophes and full-width letters are the same question."""
    import unicodedata

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": ["x"]}) + "\n" for i, q in
                             [("a", "Who is Beyoncé's husband?"), ("b", "Who sang in Guns N' Roses?"),
                              ("c", "What is PARIS?")]))
    variants = [unicodedata.normalize("NFD", "who is beyoncé’s husband"), "Who sang in Guns N’ Roses?",
                "What is \uff30\uff21\uff32\uff29\uff33?", "Who wrote Dune?"]
    test.write_text("".join(json.dumps({"id": f"t{i}", "question": q, "golden_answers": ["y"]}) + "\n"
                            for i, q in enumerate(variants)))
    assert check_overlap(train, test) == (3, variants[:3])
