"""Atomic output, row accounting and the lenient readers shared by the converters."""

from __future__ import annotations

import json

import pytest

from data_prep.io import (
    DataPrepError,
    Report,
    atomic_write,
    iter_json_document,
    iter_jsonl,
    looks_like_jsonl,
)


def _leftovers(directory, name):
    return [p.name for p in directory.iterdir() if p.name != name]


def test_atomic_write_failure_leaves_no_file(tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with atomic_write(out) as f:
            f.write("half a row")
            raise RuntimeError("interrupted mid-write")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_atomic_write_failure_keeps_previous_file(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("old complete file\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(out) as f:
            f.write("new partial")
            raise KeyboardInterrupt
    assert out.read_text() == "old complete file\n"
    assert _leftovers(tmp_path, "out.jsonl") == []


def test_atomic_write_success(tmp_path):
    out = tmp_path / "sub" / "out.txt"
    with atomic_write(out) as f:
        f.write("done\n")
    assert out.read_text() == "done\n"
    assert _leftovers(out.parent, "out.txt") == []


def test_report_summary_and_balance():
    r = Report(read=10, written=6, duplicates=2, limited=1)
    r.skip("f.jsonl:3", "bad")
    assert r.summary() == "read 10, written 6, skipped 1 (duplicates 2, not sampled 1)"
    assert r.balanced
    r.check()
    r.written += 1
    with pytest.raises(AssertionError):
        r.check()
    chunked = Report(read=2, written=5, expanded=3)
    assert chunked.balanced and "added by chunking 3" in chunked.summary()


def test_iter_jsonl_reports_bad_lines(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{broken\n[1, 2]\n{"a": 2}\n')
    r = Report()
    rows = list(iter_jsonl(p, r))
    assert [(n, o["a"]) for n, o in rows] == [(1, 1), (5, 2)]
    assert r.read == 4  # the blank line is not a row
    assert r.skipped == 2
    assert r.problems[0].startswith(f"{p}:3: invalid JSON")
    assert r.problems[1] == f"{p}:4: expected a JSON object, got list"


def test_iter_json_document_lines_and_keys(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{\n  "A": ["s1", "s2"],\n  "B":\n    "text"\n}\n')
    r = Report()
    items = list(iter_json_document(p, r))
    assert [(w, k, v) for w, k, v in items] == [
        (f"{p}:2 (item 0)", "A", ["s1", "s2"]),
        (f"{p}:3 (item 1)", "B", "text"),
    ]
    assert r.read == 2
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"q": 1}, {"q": 2}]))
    assert [v for _, _, v in iter_json_document(arr, Report())] == [{"q": 1}, {"q": 2}]
    empty = tmp_path / "e.json"
    empty.write_text("[ ]")
    assert list(iter_json_document(empty, Report())) == []


def test_iter_json_document_syntax_error_names_line_and_column(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('[\n {"q": 1},\n {"q": 2,,}\n]')
    with pytest.raises(DataPrepError, match=r"x\.json:3:10: invalid JSON"):
        list(iter_json_document(p, Report()))
    trailing = tmp_path / "t.json"
    trailing.write_text('[{"q": 1}] [2]')
    with pytest.raises(DataPrepError, match="extra data"):
        list(iter_json_document(trailing, Report()))


def test_looks_like_jsonl(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text('{"q": 1}\n{"q": 2}\n')
    b.write_text('{\n "t": ["x"]\n}\n')
    c.write_text('[{"q": 1}]\n')
    assert looks_like_jsonl(a) and not looks_like_jsonl(b) and not looks_like_jsonl(c)


def test_undecodable_line_is_one_reported_row(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n{"a": 3}\n')
    r = Report()
    assert [o["a"] for _, o in iter_jsonl(p, r)] == [1, 3]
    assert r.problems == [f"{p}:2: invalid UTF-8 at byte 11 (0xe9)"] and r.read == 3


def test_bom_and_crlf_read_like_plain_lf(tmp_path):
    plain, windows = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plain.write_bytes(b'{"a": "x"}\n\n{"a": "y\\r"}\n')
    windows.write_bytes(b'\xef\xbb\xbf{"a": "x"}\r\n\r\n{"a": "y\\r"}\r\n')
    ra, rb = Report(), Report()
    assert list(iter_jsonl(plain, ra)) == list(iter_jsonl(windows, rb)) == [(1, {"a": "x"}), (3, {"a": "y\r"})]
    assert ra == rb == Report(read=2)
    assert looks_like_jsonl(windows.rename(tmp_path / "b.json"))


def test_json_values_python_refuses_are_reported(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"n": ' + b"9" * 5000 + b'}\n' + b"[" * 5000 + b"]" * 5000 + b'\n{"s": "\\ud800"}\n'
                  + b'{"s": "\\ud83d\\ude00"}\n')
    r = Report()
    assert [o for _, o in iter_jsonl(p, r)] == [{"s": "\U0001F600"}]  # a surrogate pair is one character
    assert [x.split(": ", 1)[1] for x in r.problems] == [
        "invalid JSON (Exceeds the limit (4300 digits) for integer string conversion)",
        "invalid JSON (nested too deeply)",
        "lone surrogate \\ud800 in a string (no UTF-8 form)",
    ]


def test_damaged_gzip_keeps_the_rows_before_it(tmp_path):
    import gzip

    p = tmp_path / "x.jsonl.gz"
    whole = gzip.compress(b"".join(b'{"a": %d}\n' % i for i in range(2000)))
    p.write_bytes(whole[: len(whole) // 2])
    r = Report()
    rows = list(iter_jsonl(p, r))
    assert 0 < len(rows) < 2000 and [o["a"] for _, o in rows] == list(range(len(rows)))
    assert len(r.problems) == 1 and "damaged gzip stream" in r.problems[0]
    assert r.problems[0].startswith(f"{p}:{len(rows) + 1}: ") and r.read == len(rows) + 1


def test_json_document_item_with_undecodable_bytes(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b'\xef\xbb\xbf[\r\n {"q": "ok"},\r\n {"q":\r\n  "caf\xe9"},\r\n {"q": "ok2"}\r\n]')
    r = Report()
    assert [v for _, _, v in iter_json_document(p, r)] == [{"q": "ok"}, {"q": "ok2"}]
    assert r.problems == [f"{p}:3 (item 1): invalid UTF-8 at line 4, byte 7 (0xe9)"]


def test_load_yaml_names_the_undecodable_line_and_the_yaml_problem(tmp_path):
    from data_prep.io import load_yaml

    p = tmp_path / "c.yaml"
    p.write_bytes(b"\xef\xbb\xbfa: 1\r\nb: caf\xe9\r\n")
    with pytest.raises(ValueError, match=r"c\.yaml:2: invalid UTF-8 at byte 7 \(0xe9\)$"):
        load_yaml(p)
    p.write_bytes(b"\xef\xbb\xbfa: 1\r\nb: caf\xc3\xa9\r\n")
    assert load_yaml(p) == {"a": 1, "b": "café"}
    p.write_bytes(b"a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ValueError, match=r"c\.yaml:3:2: invalid YAML \(expected ',' or '\]', but got ':'\)"):
        load_yaml(p)
    p.write_bytes(b"a: " + b"[" * 5000)
    with pytest.raises(ValueError, match=r"c\.yaml: invalid YAML \(nested too deeply\)"):
        load_yaml(p)
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_yaml(tmp_path / "nope.yaml")
