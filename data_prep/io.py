"""Shared helpers for the converters: row accounting, lenient readers (atomic output is
`data_prep.atomic`, re-exported here).

Every converter follows one rule (issue 2): bad input loses nothing silently. A row that
cannot be used is *reported* (``file:line: reason``) and counted, the good rows are kept,
and the counts reconcile: ``read + expanded == written + skipped + duplicates + limited``.

Decoding (issue 17): text files are read as bytes and decoded as UTF-8 one line at a time, so
a line that is not valid UTF-8 (a Latin-1 ``é`` from an old dump) is one reported row
(``invalid UTF-8 at byte N``, N counted from 1 within the line), never a crash that loses the
file. A UTF-8 byte-order mark at the start of a file is dropped silently; line ends are LF or
CRLF (the CR is dropped); a lone CR is not a line end and stays in the line. A string that
JSON spells with a lone surrogate escape (``"\\ud800"``) has no UTF-8 form and could not be
written back out, so its row is reported too.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, NamedTuple

from data_prep.atomic import atomic_path, atomic_write  # noqa: F401  (the converters import them from here)


class DataPrepError(Exception):
    """A user-facing error (missing file, unknown format, unusable document).

    The CLI prints its message without a traceback and exits non-zero."""


# ---------------------------------------------------------------------------------------
# accounting


@dataclass
class Report:
    """Row accounting for one conversion.

    `read` counts input records (non-blank lines, array items, table rows); `expanded` counts
    the extra output records created by splitting one record into several (chunking).
    `skipped` rows were malformed and each has an entry in `problems`; `duplicates` and
    `limited` (left out by --limit sampling) are deliberate drops counted separately.
    """

    read: int = 0
    written: int = 0
    skipped: int = 0
    duplicates: int = 0
    limited: int = 0
    expanded: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def skip(self, where: str, reason: str, rows: int = 1) -> None:
        """Count `rows` unusable rows (one, except for a damaged block) and remember why
        (``where`` is ``file:line``)."""
        self.skipped += rows
        self.problems.append(f"{where}: {reason}")

    @property
    def balanced(self) -> bool:
        return self.read + self.expanded == (
            self.written + self.skipped + self.duplicates + self.limited
        )

    def summary(self) -> str:
        """One line: ``read N, written M, skipped K`` (+ the other counters when non-zero)."""
        s = f"read {self.read}, written {self.written}, skipped {self.skipped}"
        extra = [
            f"{name} {n}"
            for name, n in (
                ("duplicates", self.duplicates),
                ("not sampled", self.limited),
                ("added by chunking", self.expanded),
            )
            if n
        ]
        return s + (f" ({', '.join(extra)})" if extra else "")

    def check(self) -> None:
        """Raise if the counts do not reconcile (a converter bug, never a data problem)."""
        if not self.balanced:
            raise AssertionError(f"row accounting does not reconcile: {self.summary()}")

    def print_problems(self, stream: IO | None = None, limit: int = 20) -> None:
        stream = stream or sys.stderr  # looked up now: a default bound at import misses redirection
        for p in self.problems[:limit]:
            print(f"  {p}", file=stream)
        if len(self.problems) > limit:
            print(f"  ... and {len(self.problems) - limit} more problems", file=stream)


# ---------------------------------------------------------------------------------------
# reading


def require_file(path: str | Path) -> Path:
    """Return `path` as a Path, or raise a DataPrepError that names it."""
    p = Path(path)
    if not p.exists():
        raise DataPrepError(f"{p}: no such file")
    if p.is_dir():
        raise DataPrepError(f"{p}: is a directory, expected a file")
    return p


def read_key_file(path: str | Path, what: str) -> str:
    """The first line of a file holding a secret (an API key): a ValueError naming `what` and
    the path when it cannot be read or is empty."""
    try:
        lines = Path(path).expanduser().read_text().strip().splitlines()
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror or e}") from None
    if not lines or not lines[0].strip():
        raise ValueError(f"{what} {path}: the file is empty")
    return lines[0].strip()


def base_suffix(path: str | Path) -> str:
    """The format suffix, looking through a trailing ``.gz`` (``a.jsonl.gz`` -> ``.jsonl``)."""
    p = Path(path)
    if p.suffix.lower() == ".gz":
        p = p.with_suffix("")
    return p.suffix.lower()


_BOM = b"\xef\xbb\xbf"
# what a damaged .gz raises part-way through; the lines read before it are kept
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
# a JSON \u escape of a UTF-16 surrogate: the only way valid UTF-8 input yields a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# what surrogateescape turns an undecodable byte into (JSON documents are decoded whole)
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def progress(iterable: Iterable, desc: str, total: int | None = None, unit: str = "rows"):
    """A tqdm bar on stderr when it is a terminal; a plain pass-through otherwise."""
    from tqdm.auto import tqdm

    return tqdm(
        iterable, desc=desc, total=total, unit=unit, disable=not sys.stderr.isatty(),
        dynamic_ncols=True, mininterval=0.5,
    )


MAX_ROW_BYTES = 16 << 20
"""Bytes one line (one row) of a text input may hold, counted after decompression: a longer
line is reported by its number and skipped, read and dropped in pieces, so a .gz of a few KiB
whose one line inflates to gigabytes costs at most this much memory (a passage or a question
is far shorter: Wikipedia's longest article is about 1 MiB)."""
MAX_GZ_RATIO = 100
"""A compressed JSON document (read whole, not by line) may inflate to at most this many times
its size on disk, or MAX_ROW_BYTES if more: text compresses 3-20x, a decompression bomb 1000x."""
_PIECE = 1 << 20


def bounded_lines(f: IO[bytes], limit: int = MAX_ROW_BYTES) -> Iterator[tuple[bytes | None, int]]:
    """(line, its length in bytes) for each line of the binary file `f`, its end kept; the line is
    None when it holds more than `limit` bytes before its end, and those bytes were read in
    pieces of at most 1 MiB and dropped, so no more than `limit` bytes are held at once."""
    while raw := f.readline(limit + 1):
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw, len(raw)
            continue
        size, raw = len(raw), b""
        while piece := f.readline(_PIECE):
            size += len(piece)
            if piece.endswith(b"\n"):
                break
        yield None, size


def too_long(size: int, limit: int = MAX_ROW_BYTES) -> str:
    """The reason reported for a line over the row bound."""
    return f"line of {size} bytes (decompressed) is longer than {limit} (io.MAX_ROW_BYTES); skipped unread"


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a file for reading bytes, transparently gunzipping ``*.gz``."""
    p = Path(path)
    if p.suffix.lower() == ".gz":
        return gzip.open(p, "rb")
    return open(p, "rb")


def invalid_utf8(raw: bytes, start: int) -> str:
    """The reason reported for undecodable text: ``invalid UTF-8 at byte N (0xXX)``, with
    `start` the offset of the first bad byte in `raw` (a line, or one value), N from 1."""
    return f"invalid UTF-8 at byte {start + 1} (0x{raw[start]:02x})"


def unencodable(value: Any) -> str | None:
    """Why a parsed JSON value cannot be written out as UTF-8 (a lone surrogate from a
    ``\\ud800``-style escape), or None when it can."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return f"lone surrogate \\u{ord(e.object[e.start]):04x} in a string (no UTF-8 form)"
    return None


def load_yaml(path: str | Path) -> Any:
    """A YAML file (a config), decoded as UTF-8 with the BOM dropped and CRLF read as LF.

    A config is one unit (one with a line left out would be another config), so bad input
    raises rather than being skipped: a ValueError, the type config loaders already report,
    naming ``file:line`` and the first undecodable byte, or ``file:line:column`` and the
    YAML problem."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    raw = p.read_bytes().removeprefix(_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        lineno = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{p}:{lineno}: {invalid_utf8(raw[line_start:], e.start - line_start)}") from None
    text = text.replace("\r\n", "\n")
    try:
        return yaml.safe_load(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, most controls)
        line = text.count("\n", 0, e.position) + 1
        col = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        raise ValueError(f"{p}:{line}:{col}: invalid YAML (character #x{char:04x} is not allowed)") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        raise ValueError(f"{where}: invalid YAML ({e.problem or e.context})") from None
    except RecursionError:
        raise ValueError(f"{p}: invalid YAML (nested too deeply)") from None


class Line(NamedTuple):
    """One decoded line of a text file."""

    lineno: int
    """1-based line number."""
    text: str
    """The line without its LF / CRLF end (and without the BOM on line 1)."""
    offset: int
    """Byte offset of `text` in the (uncompressed) file: the passage store maps lines by it."""


def iter_lines(path: str | Path, report: Report, desc: str | None = None) -> Iterator[Line]:
    """Yield a `Line` for each non-blank line that is valid UTF-8.

    The one decoding path of every line-based reader (see the module docstring for the BOM
    and line-end rules). A line that is not valid UTF-8 is counted in ``report.read`` and
    reported and skipped here; the caller counts the lines it receives. Blank lines are not
    rows. A damaged ``.gz`` stream ends the file with one reported problem standing for the
    unread rest, so the rows before it are kept.
    """
    p = require_file(path)
    lineno = offset = 0
    with open_binary(p) as f:
        try:
            for lineno, (raw, size) in enumerate(progress(bounded_lines(f), desc or p.name, unit="lines"), start=1):
                start, offset = offset, offset + size
                if raw is None:
                    report.read += 1
                    report.skip(f"{p}:{lineno}", too_long(size))
                    continue
                if lineno == 1 and raw.startswith(_BOM):
                    raw, start = raw[len(_BOM):], start + len(_BOM)
                raw = raw.removesuffix(b"\n").removesuffix(b"\r")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    report.read += 1
                    report.skip(f"{p}:{lineno}", invalid_utf8(raw, e.start))
                    continue
                if text.strip():
                    yield Line(lineno, text, start)
        except _GZIP_ERRORS as e:
            report.read += 1
            report.skip(f"{p}:{lineno + 1}", f"damaged gzip stream, the rest of the file is unreadable ({e})")


def _json_limit(e: ValueError | RecursionError) -> str:
    if isinstance(e, RecursionError):
        return "invalid JSON (nested too deeply)"
    return f"invalid JSON ({str(e).split(':')[0]})"  # "Exceeds the limit (4300 digits) for integer ..."


def parse_json_line(line: str) -> tuple[Any, str | None]:
    """``(value, None)`` for a line holding one JSON value, else ``(None, reason)``.

    Besides syntax errors, json.loads raises a plain ValueError for an integer of more than
    4300 digits and RecursionError for very deep nesting; both are one bad row too."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at column {e.colno})"
    except (ValueError, RecursionError) as e:
        return None, _json_limit(e)
    if _SURROGATE_ESCAPE.search(line):
        why = unencodable(value)
        if why:
            return None, why
    return value, None


def iter_jsonl(path: str | Path, report: Report, desc: str | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(lineno, object)`` for every JSON-object line of a JSON-lines file.

    Counts every non-blank line in ``report.read``; a line that is not valid UTF-8, not
    valid JSON or not a JSON object is reported and skipped instead of aborting the file.
    """
    p = require_file(path)
    for lineno, line, _ in iter_lines(p, report, desc):
        report.read += 1
        obj, why = parse_json_line(line)
        if why is None and not isinstance(obj, dict):
            why = f"expected a JSON object, got {type(obj).__name__}"
        if why:
            report.skip(f"{p}:{lineno}", why)
            continue
        yield lineno, obj


def read_jsonl_rows(path: str | Path) -> list[dict]:
    """Every JSON-object line of a jsonl file a run appends to (metrics, predictions).

    A line that cannot be read is skipped with a warning ``file:line: reason`` on stderr
    instead of failing the whole file: a kill or a full disk mid-write leaves a partial last
    line, and a resume, a plot or a report must still read the rows before it."""
    report = Report()
    rows = [obj for _, obj in iter_jsonl(path, report)]
    for problem in report.problems:
        print(f"warning: {problem}; skipped (a partial line from an interrupted write?)", file=sys.stderr)
    return rows


_WS = re.compile(r"[ \t\n\r]*")


def iter_json_document(path: str | Path, report: Report) -> Iterator[tuple[str, Any, Any]]:
    """Yield ``(where, key, value)`` for each item of a JSON document's top-level container.

    For an array, ``key`` is None; for an object, ``key`` is the member name. ``where`` is
    ``file:line (item N)`` with the line on which the item starts, so problems found later
    in a value still point at the right place. Each item counts in ``report.read``. An item
    with bytes that are not UTF-8 (inside its strings) or a lone surrogate escape is reported
    and skipped. A syntax error cannot be skipped inside one JSON document, so it raises a
    DataPrepError with its line and column. A UTF-8 BOM at the start is dropped.
    """
    p = require_file(path)
    # read whole: a compressed one is read no further than it may inflate (MAX_GZ_RATIO)
    limit = max(MAX_ROW_BYTES, MAX_GZ_RATIO * p.stat().st_size) if p.suffix.lower() == ".gz" else -1
    with open_binary(p) as f:
        try:
            raw = f.read(limit + 1 if limit >= 0 else -1).removeprefix(_BOM)
        except _GZIP_ERRORS as e:
            raise DataPrepError(f"{p}: damaged gzip stream ({e})") from None
    if limit >= 0 and len(raw) > limit:
        raise DataPrepError(f"{p}: inflates to more than {limit} bytes ({MAX_GZ_RATIO}x its size on disk, "
                            f"io.MAX_GZ_RATIO), and a JSON document is read whole; decompress it, or write "
                            f"JSON lines (one row each, bounded by io.MAX_ROW_BYTES)")
    # undecodable bytes become lone surrogates here; an item holding one is reported below
    text = raw.decode("utf-8", "surrogateescape")
    dec = json.JSONDecoder()

    def fail(pos: int, msg: str) -> DataPrepError:
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return DataPrepError(f"{p}:{line}:{col}: {msg}")

    def value_at(pos: int) -> tuple[Any, int]:
        try:
            return dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise fail(e.pos, f"invalid JSON ({e.msg}); cannot recover inside one JSON document") from None
        except (ValueError, RecursionError) as e:
            raise fail(pos, f"{_json_limit(e)}; cannot recover inside one JSON document") from None

    def bad_item(start: int, end: int, key: Any, value: Any) -> str | None:
        m = _ESCAPED_BYTE.search(text, start, end)
        if m:
            line_start = text.rfind("\n", 0, m.start()) + 1
            byte = len(text[line_start:m.start()].encode("utf-8", "surrogateescape")) + 1
            return (f"invalid UTF-8 at line {text.count(chr(10), 0, m.start()) + 1}, byte {byte} "
                    f"(0x{ord(m.group()) - 0xDC00:02x})")
        if _SURROGATE_ESCAPE.search(text, start, end):
            return unencodable([key, value])
        return None

    pos = _WS.match(text, 0).end()
    if pos >= len(text) or text[pos] not in "[{":
        raise fail(pos, "expected a JSON array or object at the top level")
    closer = "]" if text[pos] == "[" else "}"
    is_obj = closer == "}"
    pos = _WS.match(text, pos + 1).end()
    line, last, idx = 1 + text.count("\n", 0, pos), pos, 0
    if pos < len(text) and text[pos] == closer:
        return
    while True:
        line += text.count("\n", last, pos)
        last = pos
        key = None
        if is_obj:
            key, pos = value_at(pos)
            if not isinstance(key, str):
                raise fail(last, "expected a member name")
            pos = _WS.match(text, pos).end()
            if text[pos : pos + 1] != ":":
                raise fail(pos, "expected ':' after member name")
            pos = _WS.match(text, pos + 1).end()
        value, pos = value_at(pos)
        report.read += 1
        where = f"{p}:{line} (item {idx})"
        why = bad_item(last, pos, key, value)
        if why:
            report.skip(where, why)
        else:
            yield where, key, value
        idx += 1
        pos = _WS.match(text, pos).end()
        ch = text[pos : pos + 1]
        if ch == ",":
            pos = _WS.match(text, pos + 1).end()
        elif ch == closer:
            break
        else:
            raise fail(pos, f"expected ',' or '{closer}'")
    if _WS.match(text, pos + 1).end() != len(text):
        raise fail(pos + 1, "extra data after the top-level JSON value")


def looks_like_jsonl(path: str | Path) -> bool:
    """True when the file's first non-blank line is a complete JSON object by itself.

    Tells JSON lines saved under a ``.json`` name apart from a pretty-printed JSON document
    (whose first line is just ``{`` or ``[``) or a one-line array. Undecodable bytes do not
    change the answer (the JSON-lines reader then reports that line); neither does a damaged
    ``.gz``, which is left to the JSON-lines reader to report. A first line over MAX_ROW_BYTES is
    read no further and taken for a document written on one line (as `json.dump` writes one)."""
    with open_binary(path) as f:
        try:
            for n, (raw, _) in enumerate(bounded_lines(f)):
                if raw is None:
                    return False
                raw = raw.removeprefix(_BOM) if n == 0 else raw
                if raw.strip():
                    obj, why = parse_json_line(raw.decode("utf-8", "surrogateescape"))
                    return why is None and isinstance(obj, dict)
        except _GZIP_ERRORS:
            return True
    return False


def _table_rows(batch) -> Iterator[tuple[dict | None, str | None]]:
    """``(row, None)`` per row of an Arrow batch or table, or ``(None, reason)`` for a row
    whose strings are not valid UTF-8: Arrow stores them unchecked, and Python conversion
    of the whole batch fails on the first one, so a failing batch is converted row by row."""
    try:
        rows = batch.to_pylist()
    except UnicodeDecodeError:
        rows = None
    if rows is not None:
        for row in rows:
            yield row, None
        return
    for i in range(batch.num_rows):
        row = {}
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                row[name] = column[i].as_py()
            except UnicodeDecodeError as e:
                yield None, f"column {name!r}: {invalid_utf8(e.object, e.start)}"
                break
        else:
            yield row, None


def iter_arrow_rows(batches: Iterable, where: str, report: Report, start: int = 0) -> Iterator[tuple[str, dict]]:
    """``(f"{where}:row N", row)`` for the rows of Arrow record batches, N counted from
    ``start + 1``; rows that do not convert to Python are reported and skipped. Each row
    counts in ``report.read``."""
    n = start
    for batch in batches:
        for row, why in _table_rows(batch):
            n += 1
            report.read += 1
            if why:
                report.skip(f"{where}:row {n}", why)
            else:
                yield f"{where}:row {n}", row


def iter_parquet(path: str | Path, report: Report, batch_size: int = 4096,
                 columns: list[str] | None = None) -> Iterator[tuple[str, dict]]:
    """Yield ``(where, row)`` with plain Python values (lists, dicts) for each parquet row
    (only `columns` when given).

    A row with invalid UTF-8 in a string column is reported and skipped. A row group whose
    pages cannot be decoded (a damaged file) loses its unread rows, reported as one
    problem counting them all; the other row groups are still read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = require_file(path)
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise DataPrepError(f"{p}: not a readable parquet file ({e})") from None
    bar = progress(None, p.name, total=pf.metadata.num_rows)

    def group(g: int, first: int) -> Iterator:
        size, done = pf.metadata.row_group(g).num_rows, 0
        batches = pf.iter_batches(batch_size=batch_size, row_groups=[g], columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError, ValueError) as e:
                lost = max(size - done, 0)
                report.read += lost
                report.skip(f"{p}:rows {first + done + 1}-{first + size}", f"damaged row group {g}, unreadable ({e})",
                            rows=lost)
                return
            if batch is None:
                return
            yield batch
            done += batch.num_rows
            bar.update(batch.num_rows)

    first = 0
    for g in range(pf.num_row_groups):
        yield from iter_arrow_rows(group(g, first), str(p), report, start=first)
        first += pf.metadata.row_group(g).num_rows
    bar.close()


def write_jsonl(rows: Iterable[dict], out: str | Path) -> int:
    """Write rows as JSON lines atomically; return how many were written."""
    n = 0
    with atomic_write(out) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n
