"""Passage store: the corpus jsonl read in place through a byte-offset array.

Passage i is the i-th usable line of the corpus (the order the index was built in, so FAISS
row i is passage i). `offsets` is a uint64 array of the n passage starts plus the file size,
saved as `.npy` beside the index and memory-mapped, and the corpus is memory-mapped too:
start-up reads nothing but the array header, and RAM is 8 bytes per passage plus whatever
pages the OS caches (wiki-18's 21M passages: a 168 MB offset file, not a 30+ GB list of dicts).

A line that is not a passage (not UTF-8, not a JSON object, no string ``contents`` or no
``id``) is reported by `scan_corpus` and gets no row, so one bad line neither stops an index
build nor crashes a search that would have returned it. Passage i ends at the first newline
after its start (a skipped line may follow it).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from data_prep.io import Report, iter_lines, parse_json_line

OFFSETS_FILE = "offsets.npy"
_CHUNK = 1 << 24


def passage_problem(text: str) -> str | None:
    """Why one corpus line cannot be a passage, or None when it can."""
    obj, why = parse_json_line(text)
    if why:
        return why
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    if not isinstance(obj.get("contents"), str):
        return "missing field 'contents'" if "contents" not in obj else "'contents' must be a string"
    pid = obj.get("id")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        return "missing field 'id'" if pid is None else "'id' must be a string or integer"
    return None


def scan_corpus(corpus: str | os.PathLike, report: Report | None = None) -> tuple[np.ndarray, str]:
    """One pass over the corpus: (offsets of its passages + end sentinel, sha256 hex).

    Lines are decoded by data_prep.io (a BOM dropped, CRLF read as LF); a line that is not a
    passage is counted in ``report`` as read and skipped, with its line and why."""
    report = report if report is not None else Report()
    starts = []
    for lineno, text, offset in iter_lines(corpus, report, desc=Path(corpus).name):
        report.read += 1
        why = passage_problem(text)
        if why:
            report.skip(f"{corpus}:{lineno}", why)
            continue
        starts.append(offset)
        report.written += 1
    sha = sha256_file(corpus)
    size = Path(corpus).stat().st_size
    return np.asarray(starts + [size], dtype=np.uint64), sha


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(_CHUNK):
            h.update(buf)
    return h.hexdigest()


class PassageStore:
    """Random access to corpus passages by row: `get(i) -> dict`, `get_many(rows) -> list[dict]`."""

    def __init__(self, corpus: str | os.PathLike, offsets: np.ndarray | str | os.PathLike | None = None):
        self.corpus = Path(corpus)
        size = self.corpus.stat().st_size
        if offsets is None:
            offsets, _ = scan_corpus(self.corpus)
        elif not isinstance(offsets, np.ndarray):
            offsets = np.load(offsets, mmap_mode="r")
        if len(offsets) < 1 or int(offsets[-1]) != size:
            raise ValueError(f"offsets do not match {self.corpus} ({size} bytes; offsets end at "
                             f"{int(offsets[-1]) if len(offsets) else None}): the corpus changed since indexing")
        self.offsets = offsets
        self._file = open(self.corpus, "rb")
        # an empty file cannot be mapped; it has no passages anyway
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise IndexError(f"passage row {i} out of range (store has {len(self)})")
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        end = self._mm.find(b"\n", start, stop)  # a skipped line may sit before the next row
        return self._mm[start:stop if end < 0 else end]

    def get(self, i: int) -> dict:
        return json.loads(self.raw(int(i)))

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[dict]:
        return [self.get(int(i)) for i in rows]

    def iter_contents(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        for i in range(start, len(self) if stop is None else stop):
            yield self.get(i)["contents"]

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()

    def __enter__(self) -> "PassageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
