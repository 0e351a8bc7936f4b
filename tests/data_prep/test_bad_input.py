"""Property tests (issue 17): no input makes a reader crash.

Each test builds files from good rows mixed with bad input (bytes that are not UTF-8,
Latin-1 text, arbitrary bytes, truncated lines, JSON of the wrong type, oversized lines,
lone surrogate escapes, 4300+ digit integers, deep nesting, blank lines, a BOM, CRLF) and
checks the reader's promise: no exception escapes, every good row comes out unchanged and
in order, every bad row is reported at its own line, and read = written + skipped.
Examples are bounded so the whole module runs in seconds.
"""

from __future__ import annotations

import csv
import io
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_prep.corpus import convert_corpus, make_contents
from data_prep.io import DataPrepError, Report, iter_jsonl, load_yaml
from data_prep.normalize import normalize_answer
from data_prep.qa import convert_qa, read_qa
from data_prep.store import PassageStore, scan_corpus

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOM = b"\xef\xbb\xbf"

# --------------------------------------------------------------------------- strategies
# Text that stays the same through the readers: stripped, no line breaks (a title is one line).
_chars = st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"))
words = st.text(_chars, min_size=1, max_size=30).map(str.strip).filter(bool)
latin1_words = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_categories=("Cc",)),
                       max_size=20).map(str.strip)


# longer than any read buffer and than csv's default field limit (131072)
oversized_text = st.integers(70_000, 150_000).map(lambda n: "w" * n + " end")


def _no_newline(b: bytes) -> bytes:
    return b.replace(b"\n", b" ")


# Lines that are never a usable row, whatever the reader (JSON lines), by kind. A file draws
# the kind of each bad line first, uniformly, so every kind is tried in every run (drawing
# from one_of would favour the kinds with the most distinct values).
garbage = st.builds(lambda b, i: _no_newline(b[:i] + b"\xff" + b[i:]), st.binary(max_size=120), st.integers(0, 120))
oversized_garbage = st.integers(100_000, 400_000).map(lambda n: b"\xfe" + b"x" * n)
not_an_object = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(_chars, max_size=20), st.none(),
                          st.lists(st.integers(), max_size=3)).map(lambda v: json.dumps(v).encode())
JSON_BAD = {
    "arbitrary bytes": garbage,
    "oversized undecodable line": oversized_garbage,
    "JSON that is not an object": not_an_object,
    "lone surrogate escape": st.just(b'{"id": "s", "contents": "a\\ud800b", "question": "q\\udfff?", "answer": ["x"]}'),
    "4300+ digit integer": st.just(b'{"id": ' + b"9" * 5000 + b', "contents": "x", "question": "q?", "answer": ["a"]}'),
    "deep nesting": st.just(b"[" * 50_000 + b"]" * 50_000),
}


def _latin1(row: dict, field: str) -> st.SearchStrategy[bytes]:
    """`row` as it would be written by a tool using Latin-1: `field` holds an é followed by
    ASCII, which is never valid UTF-8."""
    return latin1_words.map(lambda w: json.dumps({**row, field: w + "é " + w}, ensure_ascii=False).encode("latin-1"))


def _truncated(line: bytes) -> st.SearchStrategy[bytes]:
    """A JSON-object line cut before its closing brace (at any byte, maybe mid-character)."""
    return st.integers(1, len(line) - 1).map(lambda i: line[:i])


@st.composite
def line_file(draw, good_row, bad_line, encode):
    """(file bytes, good rows in order, line numbers of the bad lines)."""
    kinds = draw(st.lists(st.sampled_from(["good", "good", "bad", "blank"]), max_size=14))
    out = bytearray(BOM if draw(st.booleans()) else b"")
    good, bad = [], []
    for lineno, kind in enumerate(kinds, start=1):
        if kind == "good":
            row = draw(good_row(len(good)))
            good.append(row)
            line = encode(row)
        elif kind == "bad":
            bad.append(lineno)
            kinds_of_bad = bad_line(len(bad))
            line = draw(kinds_of_bad[draw(st.sampled_from(sorted(kinds_of_bad)))])
        else:
            line = draw(st.sampled_from([b"", b"  ", b"\t"]))
        end = draw(st.sampled_from([b"\n", b"\r\n"])) if lineno < len(kinds) or draw(st.booleans()) else b""
        out += line + end
    return bytes(out), good, bad


def _where_lines(problems: list[str], path) -> list[int]:
    """The line of each problem (``path:line: ...`` or ``path:line (item N): ...``)."""
    return [int(p.removeprefix(f"{path}:").split(":")[0].split(" ")[0]) for p in problems]


# --------------------------------------------------------------------------- corpus jsonl
def corpus_row(k: int):
    return st.builds(lambda t, x: {"id": f"g{k}", "contents": make_contents(t, x)},
                     words.filter(lambda w: '"' not in w), st.one_of(words, oversized_text))


_CORPUS_WRONG_TYPES = [
    {"id": "w", "contents": 5}, {"id": "w", "contents": None}, {"id": "w", "contents": ["a"]},
    {"id": "w", "title": "T"}, {"id": "w", "title": 5, "text": "x"}, {"id": 1.5, "contents": "x"},
    {"id": True, "contents": "x"}, {"id": [1], "contents": "x"}, {"id": "w", "contents": "   "},
    {}, {"id": "w", "text": ""},
]


def corpus_bad(k: int, wrong_types=_CORPUS_WRONG_TYPES) -> dict:
    good = {"id": f"b{k}", "contents": '"T"\ntext'}
    return {**JSON_BAD, "Latin-1 text": _latin1(good, "contents"), "truncated line": _truncated(json.dumps(good).encode()),
            "wrong JSON types": st.sampled_from(wrong_types).map(lambda r: json.dumps(r).encode())}


@FUZZ
@given(line_file(corpus_row, corpus_bad, lambda r: json.dumps(r, ensure_ascii=False).encode()))
def test_corpus_jsonl_keeps_good_rows_and_reports_each_bad_line(tmp_path_factory, case):
    data, good, bad = case
    d = tmp_path_factory.mktemp("corpus")
    src, out = d / "c.jsonl", d / "out.jsonl"
    src.write_bytes(data)
    r = convert_corpus([src], out, dedup=False)
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == good
    assert _where_lines(r.problems, src) == bad
    assert r.read == r.written + r.skipped and r.written == len(good)


# --------------------------------------------------------------------------- corpus tsv
# One line per passage; tabs and quotes in the text are csv-quoted (as DPR writes them).
tsv_text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), whitelist_characters='\t"'),
                   min_size=1, max_size=40).map(str.strip).filter(bool)
tsv_title = words.filter(lambda w: '"' not in w)


def _tsv_line(fields: list[str]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="").writerow(fields)
    return buf.getvalue().encode()


def tsv_row(k: int):
    return st.builds(lambda x, t: {"id": f"g{k}", "text": x, "title": t}, st.one_of(tsv_text, oversized_text), tsv_title)


def tsv_bad(k: int):
    line = _tsv_line([f"b{k}", "some text", "Title"])
    return {
        "arbitrary bytes": garbage, "oversized undecodable line": oversized_garbage,
        # cut before the last separator: a field is missing
        "truncated line": st.integers(1, line.rindex(b"\t")).map(lambda i: line[:i]),
        # a quote left open swallows the rest of its line, never the next one
        "wrong field count": st.sampled_from([_tsv_line([f"b{k}", "only two"]), _tsv_line([f"b{k}", "a", "b", "four"]),
                                              f'b{k}\t"open quote\tT'.encode()]),
        "empty text": st.just(_tsv_line([f"b{k}", "   ", "Empty"])),
        "Latin-1 text": latin1_words.map(lambda w: _tsv_line([f"b{k}", w + "é " + w, "T"]).decode().encode("latin-1")),
    }


@FUZZ
@given(line_file(tsv_row, tsv_bad, lambda r: _tsv_line([r["id"], r["text"], r["title"]])))
def test_corpus_tsv_keeps_good_rows_and_reports_each_bad_line(tmp_path_factory, case):
    data, good, bad = case
    d = tmp_path_factory.mktemp("tsv")
    src, out = d / "p.tsv", d / "out.jsonl"
    src.write_bytes((BOM if data.startswith(BOM) else b"") + b"id\ttext\ttitle\r\n" + data.removeprefix(BOM))
    bad = [n + 1 for n in bad]  # after the header
    r = convert_corpus([src], out, dedup=False)
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == [
        {"id": g["id"], "contents": make_contents(g["title"], g["text"])} for g in good]
    assert _where_lines(r.problems, src) == bad
    assert r.read == r.written + r.skipped


# --------------------------------------------------------------------------- QA jsonl
def qa_row(k: int):
    return st.builds(lambda q, a: {"id": f"q{k}", "question": q, "golden_answers": a},
                     st.one_of(words, oversized_text.map(lambda t: t + "?")),
                     st.lists(words.filter(normalize_answer), min_size=1, max_size=3))  # "." is no answer


_QA_WRONG_TYPES = [
    {"question": 5, "answer": ["a"]}, {"question": "", "answer": ["a"]}, {"question": "   ", "answer": ["a"]},
    {"question": "q?"}, {"question": "q?", "golden_answers": {"a": 1}}, {"question": "q?", "golden_answers": []},
    {"question": "q?", "golden_answers": [["nested"]]}, {"question": "q?", "golden_answers": [True]},
    {"question": "q?", "golden_answers": ["x"], "id": 1.5}, {"question": None, "answer": ["a"]},
    {"prompt": 5, "reward_model": {}}, {"question": "q?", "golden_answers": ["  "]},
]


def qa_bad(k: int) -> dict:
    good = {"id": f"b{k}", "question": "who?", "golden_answers": ["x"]}
    return {**JSON_BAD, "Latin-1 text": _latin1(good, "question"), "truncated line": _truncated(json.dumps(good).encode()),
            "wrong JSON types": st.sampled_from(_QA_WRONG_TYPES).map(lambda r: json.dumps(r).encode())}


def _qa_rows(path) -> list[dict]:
    df = pd.read_parquet(path)
    return [{"id": i, "question": q, "golden_answers": list(a)}
            for i, q, a in zip(df["id"], df["question"], df["golden_answers"])]


@FUZZ
@given(line_file(qa_row, qa_bad, lambda r: json.dumps(r, ensure_ascii=False).encode()))
def test_qa_jsonl_keeps_good_rows_and_reports_each_bad_line(tmp_path_factory, case):
    data, good, bad = case
    d = tmp_path_factory.mktemp("qa")
    src, out = d / "q.jsonl", d / "out.parquet"
    src.write_bytes(data)
    r = convert_qa(src, out)
    assert _qa_rows(out) == good
    assert _where_lines(r.problems, src) == bad
    assert r.read == r.written + r.skipped
    # read_qa (training) refuses the same file while it has bad rows; with a Report it keeps the rest
    if bad:
        with pytest.raises(DataPrepError, match="malformed QA rows"):
            read_qa(src)
    lenient = Report()
    df = read_qa(src, lenient)
    assert list(df["id"]) == [g["id"] for g in good] and lenient.problems == r.problems


# --------------------------------------------------------------------------- every kind, by example
# The property tests draw kinds at random; this table makes sure each kind (and each wrong-type
# template) is tried on every JSON-lines reader in every run.
_EVERY_KIND = [
    b"\x00\xff\x10abc", b"\xfe" + b"x" * 200_000, b"[1, 2]", b'"text"', b"null", b"3.5",
    b'{"id": "s", "contents": "a\\ud800b", "question": "q\\udfff?", "answer": ["x"]}',
    b'{"id": ' + b"9" * 5000 + b', "contents": "x", "question": "q?", "answer": ["a"]}', b"[" * 50_000 + b"]" * 50_000,
    b'{"id": "b", "contents": "caf\xe9 au lait", "question": "caf\xe9?", "answer": ["x"]}', b'{"id": "b", "conte',
]
_READERS = {
    "corpus": (_CORPUS_WRONG_TYPES, lambda src, d: convert_corpus([src], d / "out.jsonl", dedup=False),
               {"id": "g", "contents": '"T"\ntext'}),
    "qa": (_QA_WRONG_TYPES, lambda src, d: convert_qa(src, d / "out.parquet"),
           {"id": "g", "question": "q?", "golden_answers": ["x"]}),
    "store": ([r for r in _CORPUS_WRONG_TYPES if r.get("contents") != "   "],
              lambda src, d: scan_corpus(src, r := Report()) and r, {"id": "g", "contents": '"T"\ntext'}),
}


@pytest.mark.parametrize("reader", sorted(_READERS))
def test_every_kind_of_bad_line_is_one_reported_row(tmp_path, reader):
    wrong_types, read, good = _READERS[reader]
    for i, line in enumerate(_EVERY_KIND + [json.dumps(w).encode() for w in wrong_types]):
        d = tmp_path / str(i)
        d.mkdir()
        src = d / "in.jsonl"
        src.write_bytes(json.dumps({**good, "id": "g1"}).encode() + b"\n" + line + b"\r\n"
                        + json.dumps({**good, "id": "g2"}).encode())
        r = read(src, d)
        assert (r.read, r.written, r.skipped) == (3, 2, 1), (reader, line[:60], r)
        assert r.problems[0].startswith(f"{src}:2: "), (reader, line[:60], r.problems)


# --------------------------------------------------------------------------- iter_jsonl itself
@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=60), *JSON_BAD.values(), st.sampled_from([b"{}", b'{"a": 1}'])), max_size=12),
       st.booleans())
def test_iter_jsonl_never_raises_on_arbitrary_bytes(tmp_path_factory, lines, crlf):
    p = tmp_path_factory.mktemp("raw") / "x.jsonl"
    p.write_bytes((b"\r\n" if crlf else b"\n").join(lines))
    r = Report()
    rows = list(iter_jsonl(p, r))
    assert all(isinstance(o, dict) for _, o in rows)
    assert r.read == len(rows) + r.skipped


# --------------------------------------------------------------------------- JSON documents
def _doc(items: list[bytes], crlf: bool, bom: bool) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    return (BOM if bom else b"") + b"[" + nl + (b"," + nl).join(items) + nl + b"]" + nl


@FUZZ
@given(st.lists(st.one_of(
    st.tuples(st.just("good"), st.builds(lambda t, x: {"title": t, "text": x}, words, words)),
    st.tuples(st.just("bad"), st.one_of(
        latin1_words.map(lambda w: json.dumps({"title": "T", "text": w + "é " + w}, ensure_ascii=False).encode("latin-1")),
        st.just(b'{"title": "T", "text": "a\\ud800"}'),
        not_an_object,
        st.sampled_from([{"title": "T"}, {"title": 5, "text": "x"}, {"text": "  "}]).map(lambda r: json.dumps(r).encode()),
    ))), max_size=10), st.booleans(), st.booleans())
def test_corpus_json_document_reports_bad_items(tmp_path_factory, items, crlf, bom):
    d = tmp_path_factory.mktemp("doc")
    src, out = d / "c.json", d / "out.jsonl"
    encoded = [json.dumps(v, ensure_ascii=False).encode() if kind == "good" else v for kind, v in items]
    src.write_bytes(_doc(encoded, crlf, bom))
    r = convert_corpus([src], out, dedup=False)
    good = [make_contents(v["title"], v["text"]) for kind, v in items if kind == "good"]
    assert [json.loads(line)["contents"] for line in out.read_text(encoding="utf-8").splitlines()] == good
    # each item sits on its own line, after the "[" line
    assert _where_lines(r.problems, src) == [i + 2 for i, (kind, _) in enumerate(items) if kind == "bad"]
    assert r.read == r.written + r.skipped


@FUZZ
@given(st.lists(st.builds(lambda t, x: {"question": t, "answer": x}, words, words), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=4)), min_size=1, max_size=3))
def test_damaged_json_document_is_a_reported_error_never_a_crash(tmp_path_factory, rows, damage):
    """Syntax damage cannot be skipped inside one JSON document: either the damage was
    harmless (inside a string) or the command stops with a DataPrepError naming the place."""
    d = tmp_path_factory.mktemp("doc")
    src = d / "q.json"
    data = bytearray(json.dumps(rows, indent=1, ensure_ascii=False).encode())
    for pos, b in damage:
        pos %= len(data)
        data[pos:pos + len(b)] = b
    src.write_bytes(bytes(data))
    try:
        r = convert_qa(src, d / "out.parquet")
    except DataPrepError as e:
        assert str(e).startswith(str(src))
        assert not (d / "out.parquet").exists()  # atomic: nothing half-written
    else:
        assert r.read == r.written + r.skipped


# --------------------------------------------------------------------------- parquet
def _strings(values: list[bytes | None]) -> pa.Array:
    # Arrow stores string bytes unchecked; other tools do write invalid UTF-8 this way
    return pa.array(values, pa.binary()).view(pa.string())


@FUZZ
@given(st.lists(st.one_of(
    st.tuples(st.just("good"), words.map(str.encode), words.map(str.encode)),
    st.tuples(st.just("bad"), st.sampled_from([b"T", None]), st.one_of(
        st.none(), st.just(b"   "), latin1_words.map(lambda w: (w + "\xe9 " + w).encode("latin-1"))))), max_size=25),
    st.integers(1, 8))
def test_corpus_parquet_reports_bad_rows(tmp_path_factory, rows, group):
    d = tmp_path_factory.mktemp("pq")
    src, out = d / "c.parquet", d / "out.jsonl"
    table = pa.table({"id": [f"r{i}" for i in range(len(rows))], "title": _strings([t for _, t, _ in rows]),
                      "text": _strings([x for _, _, x in rows])})
    pq.write_table(table, src, row_group_size=group)
    r = convert_corpus([src], out, dedup=False)
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == [
        {"id": f"r{i}", "contents": make_contents(t.decode(), x.decode())}
        for i, (kind, t, x) in enumerate(rows) if kind == "good"]
    assert [p.split(":")[1] for p in r.problems] == [f"row {i + 1}" for i, (k, _, _) in enumerate(rows) if k == "bad"]
    assert r.read == r.written + r.skipped


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)), min_size=1, max_size=4))
def test_damaged_parquet_loses_only_what_it_must(tmp_path_factory, damage):
    """Random byte damage to a parquet file: rows that still decode are kept, the rest are
    reported (a whole row group at most), or the file is refused as unreadable; never a crash."""
    d = tmp_path_factory.mktemp("pqd")
    src = d / "q.parquet"
    n = 300
    table = pa.table({"id": [f"q{i}" for i in range(n)], "question": [f"question number {i}?" for i in range(n)],
                      "golden_answers": [[f"answer {i}"] for i in range(n)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=100, compression="NONE")
    data = bytearray(buf.getvalue())
    for pos, b in damage:
        pos = 4 + pos % (len(data) - 8)  # keep the magic bytes: a file that still claims to be parquet
        data[pos:pos + len(b)] = b
    src.write_bytes(bytes(data))
    try:
        r = convert_qa(src, d / "out.parquet")
    except DataPrepError as e:
        assert "not a readable parquet file" in str(e)
    else:
        assert r.read == r.written + r.skipped
        assert len(_qa_rows(d / "out.parquet")) == r.written
    try:  # what a long job (demos, evaluation) does with the same file
        read_qa(src, Report())
    except DataPrepError as e:
        assert str(e).startswith(str(src))


# --------------------------------------------------------------------------- whole-file readers
@FUZZ
@given(st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode)), st.booleans(), st.booleans())
def test_yaml_config_loads_or_names_the_line(tmp_path_factory, data, bom, crlf):
    """A config is one unit: bad bytes or bad YAML raise a ValueError naming the file and the
    line (the undecodable one, found again here), never another exception."""
    import yaml

    p = tmp_path_factory.mktemp("yaml") / "c.yaml"
    text = data.replace(b"\n", b"\r\n") if crlf else data
    p.write_bytes((BOM if bom else b"") + text)
    try:
        value = load_yaml(p)
    except ValueError as e:
        where, _, reason = str(e).removeprefix(f"{p}:").partition(": ")
        if reason.startswith("invalid UTF-8"):
            line = data.removeprefix(BOM if bom else b"").split(b"\n")[int(where) - 1]
            with pytest.raises(UnicodeDecodeError):
                line.decode("utf-8")
        else:
            assert reason.startswith("invalid YAML")
    else:
        assert value == yaml.safe_load(data.removeprefix(b"" if bom else BOM).decode("utf-8"))


# --------------------------------------------------------------------------- passage store (index builds)
# an empty passage is the converter's concern (it drops it); the store indexes it
_STORE_WRONG_TYPES = [r for r in _CORPUS_WRONG_TYPES if r.get("contents") != "   "]


@FUZZ
@given(line_file(corpus_row, lambda k: corpus_bad(k, _STORE_WRONG_TYPES), lambda r: json.dumps(r, ensure_ascii=False).encode()))
def test_passage_store_rows_are_the_good_lines(tmp_path_factory, case):
    """What an index build sees: row i of the store is the i-th good line; bad lines midway
    are reported at their line and get no row."""
    data, good, bad = case
    path = tmp_path_factory.mktemp("store") / "corpus.jsonl"
    path.write_bytes(data)
    r = Report()
    offsets, _ = scan_corpus(path, r)
    with PassageStore(path, offsets) as store:
        assert [store.get(i) for i in range(len(store))] == good
    assert _where_lines(r.problems, path) == bad and r.read == r.written + r.skipped
