"""A row's size is bounded in memory (issue 100, case 18): a compressed input whose one line
inflates far past `io.MAX_ROW_BYTES` is reported by its line and skipped, read in pieces, so
every reader that takes .gz (corpus and QA, JSON lines, TSV, and JSON lines under a .json
name) holds at most about one bound's worth of it; a compressed JSON document, read whole, is
refused once it inflates past `io.MAX_GZ_RATIO` times its size on disk."""

from __future__ import annotations

import gzip
import io as pyio
import tracemalloc
from pathlib import Path

import pytest

from data_prep import io
from data_prep.corpus import read_documents
from data_prep.qa import read_qa

BOMB = 96 << 20
"""The inflated line: 6x the bound, a few hundred KiB compressed."""
PEAK = 3 * io.MAX_ROW_BYTES
"""Peak memory allowed while reading: one line buffer of the bound, the decompressor's own and
the rows kept; the old readers held the 96 MiB line, its decoded text and its parse (>200 MiB)."""


def gz(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(gzip.compress(b"".join(lines), compresslevel=1))
    return path


def bomb_line(kind: str) -> bytes:
    """One 96 MiB row, as JSON (a passage or question) or a TSV line."""
    filler = b"a" * BOMB
    if kind == "tsv":
        return b"9\t" + filler + b"\tTitle\n"
    return b'{"id": "9", "contents": "' + filler + b'", "question": "q", "golden_answers": ["a"]}\n'


def peak_of(read) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = read()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


GOOD = {"jsonl": [b'{"id": "1", "contents": "\\"A\\"\\nfirst", "question": "who is A?", "golden_answers": ["x"]}\n',
                  b'{"id": "2", "contents": "\\"B\\"\\nsecond", "question": "who is B?", "golden_answers": ["y"]}\n'],
        "tsv": [b"1\tfirst\tA\n", b"2\tsecond\tB\n"]}


@pytest.mark.parametrize("name,kind", [("c.jsonl.gz", "jsonl"), ("c.json.gz", "jsonl"), ("c.tsv.gz", "tsv")])
def test_a_corpus_row_that_inflates_past_the_bound_is_skipped_in_bounded_memory(tmp_path, name, kind):
    head = [b"id\ttext\ttitle\n"] if kind == "tsv" else []
    good = GOOD[kind]
    path = gz(tmp_path / name, [*head, good[0], bomb_line(kind), good[1]])
    report = io.Report()
    docs, peak = peak_of(lambda: list(read_documents(path, report)))
    assert [d.id for d in docs] == ["1", "2"]  # the rows around it are kept
    assert report.problems == [f"{path}:{len(head) + 2}: {io.too_long(len(bomb_line(kind)))}"]
    assert report.read == 3 and report.skipped == 1
    assert peak < PEAK, f"peak {peak >> 20} MiB"


@pytest.mark.parametrize("name", ["q.jsonl.gz", "q.json.gz"])
def test_a_qa_row_that_inflates_past_the_bound_is_skipped_in_bounded_memory(tmp_path, name):
    read_qa(gz(tmp_path / f"warm_{name}", GOOD["jsonl"]))  # its first call imports pandas: not the row's memory
    path = gz(tmp_path / name, [GOOD["jsonl"][0], bomb_line("jsonl"), GOOD["jsonl"][1]])
    report = io.Report()
    df, peak = peak_of(lambda: read_qa(path, report))
    assert list(df["question"]) == ["who is A?", "who is B?"]
    assert any(p.startswith(f"{path}:2: line of {len(bomb_line('jsonl'))} bytes") for p in report.problems)
    assert peak < PEAK, f"peak {peak >> 20} MiB"


def test_a_compressed_json_document_that_inflates_past_its_ratio_is_refused(tmp_path):
    """A JSON document is read whole: a .gz one is read no further than MAX_GZ_RATIO times its
    size on disk (at least MAX_ROW_BYTES), and then refused, naming the file and the bound."""
    path = gz(tmp_path / "c.json.gz", [b"[\n", bomb_line("jsonl").rstrip(), b"\n]\n"])
    limit = max(io.MAX_ROW_BYTES, io.MAX_GZ_RATIO * path.stat().st_size)
    assert limit < BOMB  # the test's file is a bomb by the rule
    tracemalloc.start()
    try:
        with pytest.raises(io.DataPrepError, match=rf"{path}: inflates to more than {limit} bytes"):
            list(read_documents(path, io.Report()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * limit + PEAK, f"peak {peak >> 20} MiB"  # what was read (limit + 1), not the whole


def test_bounded_lines_keeps_a_line_at_the_bound_and_drops_one_past_it():
    """Hand-counted with a bound of 8: the line end does not count; a dropped line's bytes do,
    so the offsets of the lines after it stay right (the passage store maps lines by them)."""
    data = b"12345678\n123456789\r\nok\n" + b"x" * 20
    got = list(io.bounded_lines(pyio.BytesIO(data), limit=8))
    assert got == [(b"12345678\n", 9), (None, 11), (b"ok\n", 3), (None, 20)]


def test_lines_after_a_skipped_one_keep_their_offsets(tmp_path):
    big = b"b" * (io.MAX_ROW_BYTES + 5) + b"\n"
    path = gz(tmp_path / "c.jsonl.gz", [b"first\n", big, b"third\n"])
    report = io.Report()
    lines = list(io.iter_lines(path, report))
    assert [(ln.lineno, ln.text, ln.offset) for ln in lines] == [(1, "first", 0), (3, "third", 6 + len(big))]
    assert report.problems == [f"{path}:2: {io.too_long(len(big))}"]
