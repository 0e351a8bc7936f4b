"""Normalise retrieval corpora to Search-R1 / FlashRAG jsonl: ``{"id", "contents"}``.

``contents`` is ``"\\"Title\\"\\ntext"``: the first line is the title in double quotes,
exactly what Search-R1's retriever and answer formatting expect.

Inputs (detected by suffix, ``.gz`` allowed, or forced with ``fmt``):

- ``.jsonl``: ``{"id", "contents"}`` (Search-R1 / FlashRAG) or ``{"id", "title", "text"}``;
  extra fields are kept.
- ``.tsv``: DPR ``psgs_w100.tsv`` (``id, text, title`` with a header row; CSV quoting).
- ``.json``: HippoRAG ``{title: [sentence, ...]}`` (or ``{title: text}``), or a list of
  ``{"title", "text"}`` / ``{"id", "contents"}`` objects; JSON lines named ``.json`` too.
- ``.parquet``: columns ``contents`` or ``title`` + ``text`` (``id`` optional).

Extra fields are written as they are, except values strict JSON cannot hold, which are kept
as text (one note counts them): a timestamp, date or time in ISO 8601, bytes decoded as UTF-8
(other bytes as ``\\xNN``), a decimal exactly as written, NaN and infinities as ``nan`` /
``inf``. One odd value in one row of a parquet column never stops the conversion.

Text inputs are UTF-8, decoded one line at a time (data_prep.io): a line that is not valid
UTF-8 is one reported row, the rest of the file is kept. A UTF-8 BOM at the start of a file
is dropped; CRLF line ends read as LF. In a parquet file, a row with invalid UTF-8 in a
string column is one reported row.

Ids: a source id is kept when present and not already used by an earlier row. Rows without
an id, or whose id repeats, get a deterministic content-hash id ``h<16 hex digits>``
(blake2b of the normalised contents), so re-running on the same data gives the same ids
regardless of row order. A chunked document gets ``<id>_<k>`` per chunk.

De-duplication drops a passage whose normalised contents (NFKC, lower case, collapsed
whitespace) equal an earlier one's. It keeps a 64-bit hash per passage rather than the text
(21M wiki-18 passages fit in memory; the chance of any false collision there is ~1e-5).
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import math
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from data_prep.io import (
    DataPrepError,
    Report,
    atomic_write,
    base_suffix,
    iter_json_document,
    iter_jsonl,
    iter_lines,
    iter_parquet,
    looks_like_jsonl,
    require_file,
)

FORMATS = ("jsonl", "tsv", "json", "parquet")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".tsv": "tsv", ".json": "json", ".parquet": "parquet"}
_WS = re.compile(r"\s+")


def make_contents(title: str, text: str) -> str:
    """Search-R1's passage layout: the title in double quotes on the first line."""
    return f'"{title.strip()}"\n{text.strip()}'


def split_contents(contents: str) -> tuple[str | None, str]:
    """Inverse of make_contents: ``(title, text)``.

    The first line is the title, quoted or not (FlashRAG's own wiki-18 sample has ~12% of
    titles unquoted). No title (None) for a single-line ``contents`` or a first line with
    stray quotes: wiki-18 has titles broken across the newline (``"Kevin (Probably\nSaves
    the World") ...``), which are left exactly as they are."""
    head, sep, body = contents.partition("\n")
    head = head.strip()
    if not sep:
        return None, contents
    if len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], body
    if '"' in head:
        return None, contents
    return head, body


def _has_quoted_title(contents: str) -> bool:
    head = contents.partition("\n")[0].strip()
    return len(head) >= 2 and head.startswith('"') and head.endswith('"')


def normalize_text(text: str) -> str:
    """The key for de-duplication: NFKC, lower case, whitespace collapsed."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip().lower()


def content_hash(contents: str, n_hex: int = 16) -> str:
    return hashlib.blake2b(normalize_text(contents).encode(), digest_size=n_hex // 2).hexdigest()


def chunk_text(text: str, size: int) -> list[str]:
    """Split `text` into about-`size`-word pieces of near-equal length.

    ``n = max(1, round(words / size))`` pieces, so no tiny tail chunk is left over: 150
    words with size 100 give two 75-word passages, 120 words stay one passage (DPR's
    wiki-18 passages are 100-word blocks; this keeps them ~100 words without stubs).
    """
    words = text.split()
    n = max(1, round(len(words) / size))
    if n == 1:
        return [" ".join(words)]
    bounds = [round(i * len(words) / n) for i in range(n + 1)]
    return [" ".join(words[a:b]) for a, b in zip(bounds, bounds[1:])]


def detect_format(path: str | Path) -> str:
    """Guess the input format from the file name; raise on an unknown suffix."""
    fmt = _SUFFIX_FORMAT.get(base_suffix(path))
    if fmt is None:
        raise DataPrepError(
            f"{path}: unknown corpus format (suffix {Path(path).suffix!r}); expected one of "
            ".jsonl, .tsv, .json, .parquet (optionally .gz), or pass --format"
        )
    return fmt


# ---------------------------------------------------------------------------------------
# readers: each yields (where, id or None, title or None, text or contents, extra fields)
# and reports rows it cannot use.

class Doc(NamedTuple):
    where: str
    id: str | None
    title: str | None
    text: str
    extra: dict
    requoted: bool = False  # the input's title line lacked Search-R1's quotes


def _as_id(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"'id' must be a string or integer, got {type(value).__name__}")
    value = str(value).strip()
    return value or None


def _row_to_doc(where: str, row: dict, report: Report) -> Doc | None:
    """One record with ``contents`` or ``title``/``text``; None (reported) if unusable."""
    try:
        doc_id = _as_id(row.get("id", row.get("_id")))
    except ValueError as e:
        report.skip(where, str(e))
        return None
    extra = {k: v for k, v in row.items() if k not in ("id", "_id", "contents", "title", "text")}
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            report.skip(where, f"'contents' must be a string, got {type(contents).__name__}")
            return None
        title, text = split_contents(contents)
        requoted = title is not None and not _has_quoted_title(contents)
    elif "text" in row:
        title, text = row.get("title"), row["text"]
        if title is not None and not isinstance(title, str):
            report.skip(where, f"'title' must be a string, got {type(title).__name__}")
            return None
        if not isinstance(text, str):
            report.skip(where, f"'text' must be a string, got {type(text).__name__}")
            return None
        requoted = False
    else:
        report.skip(where, "missing field 'contents' (or 'text' with 'title')")
        return None
    if not text.strip():
        report.skip(where, "empty passage text")
        return None
    return Doc(where, doc_id, title, text, extra, requoted)


def _read_jsonl(path: Path, report: Report) -> Iterator[Doc]:
    for lineno, obj in iter_jsonl(path, report):
        doc = _row_to_doc(f"{path}:{lineno}", obj, report)
        if doc:
            yield doc


def _tsv_fields(line: str) -> list[str]:
    # DPR quotes a field only when it holds a quote; most lines need no csv parsing
    if '"' not in line:
        return line.split("\t")
    return next(csv.reader([line], delimiter="\t"))


def _read_tsv(path: Path, report: Report) -> Iterator[Doc]:
    """DPR psgs_w100.tsv: ``id<TAB>text<TAB>title`` with a header row; the text column uses
    CSV quoting (``"..."`` with doubled quotes inside), which csv.reader undoes.

    One passage per line, parsed line by line: a quoted field cannot span lines (DPR's never
    do), so a line with an unbalanced quote costs that one row (its field count is off)
    instead of swallowing the lines after it into one field."""
    csv.field_size_limit(sys.maxsize)
    lines = iter_lines(path, report)
    first = next(lines, None)
    if first is None:
        return
    header = _tsv_fields(first.text)
    cols = [h.strip().lower() for h in header]
    if {"id", "text", "title"} <= set(cols):
        i_id, i_text, i_title = cols.index("id"), cols.index("text"), cols.index("title")
    elif {"text", "title"} <= set(cols):
        i_id, i_text, i_title = None, cols.index("text"), cols.index("title")
    else:
        raise DataPrepError(
            f"{path}:{first.lineno}: expected a DPR header row with columns id, text, title; got {header[:5]}"
        )
    width = len(cols)
    for lineno, line, _ in lines:
        fields = _tsv_fields(line)
        if not any(x.strip() for x in fields):
            continue
        report.read += 1
        where = f"{path}:{lineno}"
        if len(fields) != width:
            report.skip(where, f"expected {width} tab-separated fields, got {len(fields)}")
            continue
        row = {"text": fields[i_text], "title": fields[i_title]}
        if i_id is not None:
            row["id"] = fields[i_id]
        doc = _row_to_doc(where, row, report)
        if doc:
            yield doc


def _read_json(path: Path, report: Report) -> Iterator[Doc]:
    if looks_like_jsonl(path):
        yield from _read_jsonl(path, report)
        return
    for where, key, value in iter_json_document(path, report):
        if key is not None:  # HippoRAG: {title: [sentence, ...]} or {title: text}
            if isinstance(value, list) and all(isinstance(s, str) for s in value):
                # HotpotQA sentences carry their own leading spaces; strip and re-join
                # so sentence lists without them are not glued together.
                text = " ".join(s.strip() for s in value if s.strip())
            elif isinstance(value, str):
                text = value
            else:
                report.skip(where, f"value of {key!r} must be a list of sentences or a string")
                continue
            doc = _row_to_doc(where, {"title": key, "text": text}, report)
        elif isinstance(value, dict):
            doc = _row_to_doc(where, value, report)
        else:
            report.skip(where, f"expected an object with title and text, got {type(value).__name__}")
            continue
        if doc:
            yield doc


def _read_parquet(path: Path, report: Report) -> Iterator[Doc]:
    for where, row in iter_parquet(path, report):
        doc = _row_to_doc(where, row, report)
        if doc:
            yield doc


_READERS = {"jsonl": _read_jsonl, "tsv": _read_tsv, "json": _read_json, "parquet": _read_parquet}


def read_documents(path: str | Path, report: Report, fmt: str | None = None) -> Iterator[Doc]:
    """Yield usable documents from one input file (format detected unless `fmt` is given)."""
    p = require_file(path)
    fmt = fmt or detect_format(p)
    if fmt not in _READERS:
        raise DataPrepError(f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return _READERS[fmt](p, report)


def _as_json(value: Any) -> Any:
    """`value` with what strict JSON cannot hold written as text (module docstring): parquet
    columns bring timestamps, bytes, decimals and NaN, which json.dumps refuses or writes as
    the invalid token ``NaN``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, (datetime.date, datetime.time)):  # datetime and pandas' Timestamp too
        return value.isoformat()
    return str(value)  # Decimal (exact), timedelta, anything else


def _passage_line(record: dict) -> tuple[str, bool]:
    """The record as one strict JSON line, and whether an extra field had to become text."""
    try:
        return json.dumps(record, ensure_ascii=False, allow_nan=False), False
    except (TypeError, ValueError):  # a type JSON has no form for; NaN / inf
        return json.dumps(_as_json(record), ensure_ascii=False, allow_nan=False), True


# ---------------------------------------------------------------------------------------


def convert_corpus(
    inputs: list[str | Path],
    out: str | Path,
    chunk_words: int | None = None,
    dedup: bool = True,
    fmt: str | None = None,
) -> Report:
    """Convert one or more corpus files into one Search-R1 jsonl corpus at `out`.

    Args:
        inputs: corpus files (see the module docstring for formats).
        out: output ``.jsonl``; written atomically (nothing appears on failure).
        chunk_words: split passages longer than ~1.5x this many words into ~this-size chunks
            (wiki-18 uses 100); None keeps documents whole.
        dedup: drop passages whose normalised contents repeat an earlier passage.
        fmt: force the input format for every input (jsonl|tsv|json|parquet).

    Returns the Report (its counts reconcile; see data_prep.io.Report).
    """
    if not inputs:
        raise DataPrepError("no input files given")
    if chunk_words is not None and chunk_words < 1:
        raise DataPrepError(f"chunk_words must be positive, got {chunk_words}")
    paths = [require_file(p) for p in inputs]  # fail before writing anything
    formats = [fmt or detect_format(p) for p in paths]
    report = Report()
    seen_hashes: set[int] = set()
    used_ids: set[str] = set()
    reassigned = requoted = retexted = 0
    first_retexted = ""

    with atomic_write(out) as f:
        for path, pfmt in zip(paths, formats):
            for where, doc_id, title, text, extra, fixed in read_documents(path, report, pfmt):
                requoted += fixed
                pieces = chunk_text(text, chunk_words) if chunk_words else [text.strip()]
                report.expanded += len(pieces) - 1
                for k, piece in enumerate(pieces):
                    contents = make_contents(title, piece) if title is not None else piece
                    key = int(content_hash(contents), 16)
                    if dedup and key in seen_hashes:
                        report.duplicates += 1
                        continue
                    seen_hashes.add(key)
                    pid = doc_id if len(pieces) == 1 or doc_id is None else f"{doc_id}_{k}"
                    if pid is None or pid in used_ids:
                        base = pid = "h" + content_hash(contents)
                        n = 1
                        while pid in used_ids:  # identical contents kept with dedup=False
                            n += 1
                            pid = f"{base}-{n}"
                        reassigned += 1
                    used_ids.add(pid)
                    line, as_text = _passage_line({"id": pid, "contents": contents, **extra})
                    if as_text:
                        retexted += 1
                        first_retexted = first_retexted or where
                    f.write(line + "\n")
                    report.written += 1
    if requoted:
        report.notes.append(f"{requoted} passages had an unquoted title line; written quoted (Search-R1 layout)")
    if retexted:
        report.notes.append(f"{retexted} passages had extra-field values JSON cannot hold (a timestamp, bytes, "
                            f"a decimal, NaN); written as text (first at {first_retexted})")
    if reassigned:
        report.notes.append(
            f"{reassigned} passages had no id or a repeated id and got content-hash ids (h...)"
        )
    report.check()
    return report

