"""Corpus conversion: every input format on the real files, malformed fixtures, ids, chunking."""

from __future__ import annotations

import csv
import json

import pytest

from data_prep.corpus import chunk_text, content_hash, convert_corpus, make_contents, split_contents
from data_prep.io import DataPrepError



def _read(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------------------
# real files


@pytest.mark.shared_data
def test_flashrag_jsonl_ids_kept_titles_quoted(shared_data, tmp_path):
    src = shared_data / "raw" / "flashrag_wiki18_sample.jsonl"
    r = convert_corpus([src], tmp_path / "c.jsonl")
    assert (r.read, r.written, r.skipped, r.duplicates) == (1000, 1000, 0, 0)
    out, rows = _read(tmp_path / "c.jsonl"), _read(src)
    assert [p["id"] for p in out] == [p["id"] for p in rows]
    # 121 rows of FlashRAG's sample have an unquoted title line ("Absalon\n..."); they get
    # Search-R1's quotes, every other passage is unchanged
    changed = [(a, b) for a, b in zip(rows, out) if a != b]
    assert len(changed) == 121 and "121 passages had an unquoted title line" in r.notes[0]
    a, b = changed[0]
    assert a["contents"].startswith("Absalon\n") and b["contents"] == '"Absalon"\n' + a["contents"][len("Absalon\n"):]
    assert all(p["contents"].startswith('"') for p in out)


@pytest.mark.shared_data
def test_hipporag_title_to_sentences(shared_data, tmp_path):
    r = convert_corpus([shared_data / "raw" / "hipporag_hotpotqa_train_corpus.json"], tmp_path / "c.jsonl")
    assert (r.read, r.written, r.skipped) == (994, 994, 0)
    rows = _read(tmp_path / "c.jsonl")
    assert all(p["id"].startswith("h") and len(p["id"]) == 17 for p in rows)  # content-hash ids
    assert len({p["id"] for p in rows}) == 994
    demon = next(p for p in rows if p["contents"].startswith('"Demon Dice"\n'))
    # sentences are re-joined with single spaces
    assert "created by Lester Smith (designer of the better-known Dragon Dice) and Tim Brown. In it, each player" in demon["contents"]
    # ids depend on contents only: a second run gives the same ids
    convert_corpus([shared_data / "raw" / "hipporag_hotpotqa_train_corpus.json"], tmp_path / "d.jsonl")
    assert _read(tmp_path / "d.jsonl") == rows


@pytest.mark.shared_data
def test_hipporag_chunked_to_100_words(shared_data, tmp_path):
    src = shared_data / "raw" / "hipporag_hotpotqa_train_corpus.json"
    convert_corpus([src], tmp_path / "w.jsonl")
    whole = dict(split_contents(p["contents"]) for p in _read(tmp_path / "w.jsonl"))
    r = convert_corpus([src], tmp_path / "c.jsonl", chunk_words=100)
    assert r.read == 994 and r.skipped == 0 and r.expanded > 0
    assert r.written == r.read + r.expanded - r.duplicates
    rows = _read(tmp_path / "c.jsonl")
    by_title: dict[str, list[str]] = {}
    for p in rows:
        title, body = split_contents(p["contents"])
        assert len(body.split()) <= 150
        by_title.setdefault(title, []).append(body)
    # the chunks of a document, in order, are exactly its words; chunk ids are <id>_<k>
    for title, chunks in by_title.items():
        assert " ".join(chunks).split() == whole[title].split()
    assert len(by_title) == 994 and len({p["id"] for p in rows}) == len(rows)


@pytest.mark.shared_data
def test_search_r1_corpus_dedup_and_two_files(shared_data, tmp_path):
    src = shared_data / "raw" / "flashrag_wiki18_sample.jsonl"
    r = convert_corpus([src, src], tmp_path / "c.jsonl")
    assert (r.read, r.written, r.duplicates) == (2000, 1000, 1000)
    r = convert_corpus([src, src], tmp_path / "d.jsonl", dedup=False)
    assert (r.read, r.written, r.duplicates) == (2000, 2000, 0)
    ids = [p["id"] for p in _read(tmp_path / "d.jsonl")]
    assert len(set(ids)) == 2000 and ids[:1000] == [str(i) for i in range(1000)]
    assert all(i.startswith("h") for i in ids[1000:])  # repeated source ids are replaced
    assert any("1000 passages had no id or a repeated id" in n for n in r.notes)


@pytest.mark.shared_data
def test_wiki35k_near_duplicates_found(shared_data, tmp_path):
    r = convert_corpus([shared_data / "corpus" / "wiki_35k.jsonl"], tmp_path / "c.jsonl")
    # The corpus is de-duplicated on exact text; of the 4 pairs found here two differ only
    # in whitespace, two only in the title's quotes (1561 titles are unquoted; 17 with stray
    # quotes are left as they are).
    assert (r.read, r.written, r.skipped, r.duplicates) == (35100, 35096, 0, 4)
    assert "1561 passages had an unquoted title line" in r.notes[0]


@pytest.mark.shared_data
def test_dpr_tsv_and_parquet_round_trip(shared_data, tmp_path):
    """The same real passages written as DPR psgs_w100.tsv (csv-quoted, header row) and as
    parquet convert back to exactly the Search-R1 jsonl they came from."""
    import pandas as pd

    src = shared_data / "raw" / "flashrag_wiki18_sample.jsonl"
    convert_corpus([src], tmp_path / "ref.jsonl")  # titles quoted
    rows = _read(tmp_path / "ref.jsonl")
    tsv = tmp_path / "psgs_w100.tsv"
    with open(tsv, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["id", "text", "title"])
        for p in rows:
            title, text = split_contents(p["contents"])
            w.writerow([p["id"], text, title])
    r = convert_corpus([tsv], tmp_path / "from_tsv.jsonl")
    assert (r.read, r.written, r.skipped) == (1000, 1000, 0)
    assert _read(tmp_path / "from_tsv.jsonl") == rows

    pq_path = tmp_path / "c.parquet"
    pd.DataFrame(rows).to_parquet(pq_path)
    r = convert_corpus([pq_path], tmp_path / "from_parquet.jsonl")
    assert (r.read, r.written) == (1000, 1000)
    assert _read(tmp_path / "from_parquet.jsonl") == rows

    titled = tmp_path / "titled.jsonl"
    titled.write_text("".join(json.dumps({"id": p["id"], "title": split_contents(p["contents"])[0],
                                          "text": split_contents(p["contents"])[1]}) + "\n" for p in rows))
    convert_corpus([titled], tmp_path / "from_titled.jsonl")
    assert _read(tmp_path / "from_titled.jsonl") == rows


# ---------------------------------------------------------------------------------------
# malformed input


def test_malformed_jsonl_rows_reported_good_rows_kept(tmp_path):
    src = tmp_path / "bad.jsonl"
    lines = [
        json.dumps({"id": "a", "contents": '"A"\nfirst good passage'}),  # 1
        '{"id": "b", "contents": ',  # 2 bad JSON
        json.dumps({"id": "c"}),  # 3 no contents
        json.dumps({"id": "d", "contents": 42}),  # 4 wrong type
        json.dumps({"id": "e", "title": "E", "text": "   "}),  # 5 empty text
        json.dumps({"id": ["f"], "contents": "x"}),  # 6 id of a wrong type
        json.dumps(["not", "an", "object"]),  # 7
        "",  # 8 blank: not a row
        json.dumps({"id": 9, "title": "Nine", "text": "second good passage", "extra": 1}),  # 9
    ]
    src.write_text("\n".join(lines) + "\n")
    r = convert_corpus([src], tmp_path / "c.jsonl")
    assert (r.read, r.written, r.skipped) == (8, 2, 6)
    assert r.problems == [
        f"{src}:2: invalid JSON (Expecting value at column 25)",
        f"{src}:3: missing field 'contents' (or 'text' with 'title')",
        f"{src}:4: 'contents' must be a string, got int",
        f"{src}:5: empty passage text",
        f"{src}:6: 'id' must be a string or integer, got list",
        f"{src}:7: expected a JSON object, got list",
    ]
    assert _read(tmp_path / "c.jsonl") == [
        {"id": "a", "contents": '"A"\nfirst good passage'},
        {"id": "9", "contents": '"Nine"\nsecond good passage', "extra": 1},  # extra fields kept
    ]


def test_malformed_json_and_tsv_items(tmp_path):
    hippo = tmp_path / "hippo.json"
    hippo.write_text('{\n "Good": ["One.", " Two."],\n "Bad": 7,\n "Mixed": ["ok", 3]\n}\n')
    r = convert_corpus([hippo], tmp_path / "h.jsonl")
    assert (r.read, r.written, r.skipped) == (3, 1, 2)
    assert r.problems[0] == f"{hippo}:3 (item 1): value of 'Bad' must be a list of sentences or a string"
    assert r.problems[1].startswith(f"{hippo}:4 (item 2): ")
    assert _read(tmp_path / "h.jsonl")[0]["contents"] == '"Good"\nOne. Two.'

    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"title": "T", "text": "body"}, "junk", {"title": "U"}], indent=1))
    r = convert_corpus([listed], tmp_path / "l.jsonl")
    assert (r.read, r.written, r.skipped) == (3, 1, 2)
    assert "expected an object with title and text, got str" in r.problems[0]

    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tgood text\tGood\n2\tonly two fields\n3\t\tEmpty\n")
    r = convert_corpus([tsv], tmp_path / "t.jsonl")
    assert (r.read, r.written, r.skipped) == (3, 1, 2)
    assert r.problems == [f"{tsv}:3: expected 3 tab-separated fields, got 2", f"{tsv}:4: empty passage text"]


def test_tsv_unbalanced_quote_and_latin1_cost_one_row_each(tmp_path):
    """A quote left open used to make csv read the following lines into one field; the
    reader now parses line by line. A Latin-1 line is reported, not a UnicodeDecodeError."""
    tsv = tmp_path / "p.tsv"
    tsv.write_bytes(b'id\ttext\ttitle\r\n1\t"open quote\tA\r\n2\t"quoted ""x"" text"\tB\r\n'
                    b"3\tcaf\xe9 au lait\tC\r\n4\tlast\tD")
    r = convert_corpus([tsv], tmp_path / "t.jsonl")
    assert _read(tmp_path / "t.jsonl") == [{"id": "2", "contents": '"B"\nquoted "x" text'},
                                          {"id": "4", "contents": '"D"\nlast'}]
    assert r.problems == [f"{tsv}:2: expected 3 tab-separated fields, got 2",
                          f"{tsv}:4: invalid UTF-8 at byte 6 (0xe9)"]


def test_unknown_format_and_missing_file_are_clear_errors(tmp_path):
    out = tmp_path / "c.jsonl"
    with pytest.raises(DataPrepError, match="no such file"):
        convert_corpus([tmp_path / "nope.jsonl"], out)
    odd = tmp_path / "corpus.xml"
    odd.write_text("<doc/>")
    with pytest.raises(DataPrepError, match="unknown corpus format"):
        convert_corpus([odd], out)
    tsv = tmp_path / "noheader.tsv"
    tsv.write_text("a\tb\n")
    with pytest.raises(DataPrepError, match="expected a DPR header row"):
        convert_corpus([tsv], out)
    assert not out.exists()


def test_fatal_error_mid_write_leaves_no_output(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"id": "1", "contents": '"T"\ntext'}) + "\n")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"title": "A", "text": "fine"}, {"title": ]')
    out = tmp_path / "c.jsonl"
    with pytest.raises(DataPrepError, match=r"broken\.json:1:\d+: invalid JSON"):
        convert_corpus([good, broken], out)  # the good file was already being written out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json", "good.jsonl"]


# ---------------------------------------------------------------------------------------
# pure helpers


def test_chunk_text_near_equal_pieces():
    words = [f"w{i}" for i in range(150)]
    pieces = chunk_text(" ".join(words), 100)
    assert [len(p.split()) for p in pieces] == [75, 75]
    assert " ".join(pieces).split() == words
    assert chunk_text(" ".join(words[:120]), 100) == [" ".join(words[:120])]  # no 20-word stub
    assert [len(p.split()) for p in chunk_text(" ".join(["x"] * 554), 100)] == [92, 93, 92, 92, 93, 92]


def test_contents_layout_round_trip():
    c = make_contents(" Title ", " body text ")
    assert c == '"Title"\nbody text'
    assert split_contents(c) == ("Title", "body text")
    assert split_contents("Bare title\nbody") == ("Bare title", "body")
    assert split_contents("no title line") == (None, "no title line")
    broken = '"Kevin (Probably\nSaves the World") Kevin'  # a real wiki-18 title split by the newline
    assert split_contents(broken) == (None, broken)


def test_chunked_documents_get_numbered_ids(tmp_path):
    src = tmp_path / "long.jsonl"
    body = " ".join(f"w{i}" for i in range(250))
    src.write_text(json.dumps({"id": "doc7", "title": "Long", "text": body}) + "\n"
                   + json.dumps({"id": "doc8", "title": "Short", "text": "a few words"}) + "\n")
    r = convert_corpus([src], tmp_path / "c.jsonl", chunk_words=100)
    assert (r.read, r.expanded, r.written) == (2, 1, 3)
    rows = _read(tmp_path / "c.jsonl")
    assert [p["id"] for p in rows] == ["doc7_0", "doc7_1", "doc8"]
    assert rows[1]["contents"].startswith('"Long"\nw125 ')


def test_repeated_ids_across_files_get_content_hash_ids(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"id": "1", "contents": '"A"\nalpha'}) + "\n")
    b.write_text(json.dumps({"id": "1", "contents": '"B"\nbeta'}) + "\n")
    convert_corpus([a, b], tmp_path / "ab.jsonl")
    convert_corpus([b, a], tmp_path / "ba.jsonl")
    ab = {p["contents"]: p["id"] for p in _read(tmp_path / "ab.jsonl")}
    ba = {p["contents"]: p["id"] for p in _read(tmp_path / "ba.jsonl")}
    # the first file keeps its id; the passage repeating it gets its content-hash id
    assert ab == {'"A"\nalpha': "1", '"B"\nbeta': "h" + content_hash('"B"\nbeta')}
    assert ba == {'"B"\nbeta': "1", '"A"\nalpha': "h" + content_hash('"A"\nalpha')}


# ---------------------------------------------------------------------------------------
# odd values in extra parquet columns (issue 83, case 10)


def _no_nan(token: str):
    raise ValueError(f"{token} is not JSON")


@pytest.mark.parametrize("kind", ["timestamp", "bytes", "decimal", "nan", "dates in a list"])
def test_one_odd_parquet_value_in_1000_rows_is_kept_as_text(tmp_path, kind):
    """One value strict JSON cannot hold, in one row of an extra column of a 1,000-row parquet
    (it made `agent-rl-prep corpus` die with a TypeError and no output): every passage is
    written, the odd value as text, and every line is strict JSON."""
    import datetime
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow_type, odd, as_text = {
        "timestamp": (pa.timestamp("us", tz="UTC"),
                      datetime.datetime(2021, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), "2021-03-04T05:06:07+00:00"),
        "bytes": (pa.binary(), b"caf\xc3\xa9 \xff", "café \\xff"),
        "decimal": (pa.decimal128(6, 3), Decimal("12.500"), "12.500"),
        "nan": (pa.float64(), float("nan"), "nan"),
        "dates in a list": (pa.list_(pa.date32()), [datetime.date(2020, 1, 2)], ["2020-01-02"]),
    }[kind]
    n, bad = 1000, 617
    src = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(n)],
                             "contents": [f'"T{i}"\npassage number {i}' for i in range(n)],
                             "extra": pa.array([odd if i == bad else None for i in range(n)], arrow_type)}), src)
    r = convert_corpus([src], tmp_path / "c.jsonl")
    assert (r.read, r.written, r.skipped) == (n, n, 0)
    lines = (tmp_path / "c.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line, parse_constant=_no_nan) for line in lines]
    assert [p["id"] for p in rows] == [f"d{i}" for i in range(n)]
    assert rows[bad]["extra"] == as_text and rows[0]["extra"] is None
    assert r.notes == [f"1 passages had extra-field values JSON cannot hold (a timestamp, bytes, a decimal, NaN); "
                       f"written as text (first at {src}:row {bad + 1})"]
