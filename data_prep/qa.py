"""QA sets: convert the formats in use to one parquet layout, and read them back.

Output columns: ``id, question, golden_answers (list[str]), data_source, split`` plus
useful extras (e.g. HotpotQA ``type``, the knowledge base's ``kind`` / ``hop_queries``).

Row formats, recognised per row (so one reader handles jsonl, JSON arrays, parquet and
``datasets`` directories alike):

- FlashRAG: ``{"id", "question", "golden_answers": [...], "metadata"?}``
- NQ-open: ``{"question", "answer": [...]}``; HotpotQA: ``{"_id"?, "question", "answer": str}``
- HotpotQA official (``supporting_facts``, ``context``, ``type``, ``level``) and MuSiQue
  official (``answer_aliases``, ``question_decomposition``, ``paragraphs``, ``answerable``):
  the supporting paragraphs' titles become ``support_titles`` (what a multi-hop
  demonstration can search second); MuSiQue's aliases join the gold answers; an unanswerable
  MuSiQue row is reported.
- verl / Search-R1 training rows: ``{"data_source", "prompt": [{"role","content"}],
  "reward_model": {"ground_truth": {"target": [...]} | str}, "extra_info": {"split","index"}}``.
  The question is the ``question`` field when present, else ``extra_info.question``, else
  taken from the last user message: Search-R1's template ends with ``Question: {q}\\n``.

Text inputs are UTF-8, decoded one line at a time (data_prep.io): a line that is not valid
UTF-8 is one reported row, the rest of the file is kept; a UTF-8 BOM at the start of a file is
dropped and CRLF line ends read as LF. In parquet, arrow and ``datasets`` inputs, a row with
invalid UTF-8 in a string column is one reported row.

Gold answers that normalise to nothing (``"The"``, ``"."``, ``"a"``, ``""``; see
data_prep.normalize) are dropped and noted as ``file:line: gold answer 'The' dropped ...``:
an empty answer would match them exactly, and any text contain them. A row left with no
gold answer is reported and skipped, by `read_qa` for training too (`NoGoldAnswer`).

Ids: the row's ``id`` / ``_id`` when present; verl rows use ``{split}_{extra_info.index}``;
otherwise ``{split}_{n}`` with n the row's 0-based position in the input (FlashRAG's own
convention, e.g. NQ-open dev line 1 -> ``test_0`` when converted with ``--split test``).
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from data_prep.io import (
    DataPrepError,
    Report,
    atomic_path,
    base_suffix,
    iter_arrow_rows,
    iter_json_document,
    iter_jsonl,
    iter_parquet,
    looks_like_jsonl,
)
from data_prep.normalize import normalize_answer

STANDARD = ("id", "question", "golden_answers", "data_source", "split")
# verl plumbing that is rebuilt by our own trainer; not worth carrying into the output.
_DROP = {"prompt", "reward_model", "extra_info", "ability", "answer", "answers", "_id", "metadata"}
_SPLIT_WORDS = {"train": "train", "dev": "dev", "validation": "dev", "val": "dev", "test": "test"}


class RowError(ValueError):
    """A row that cannot be used; the message says why."""


class NoGoldAnswer(RowError):
    """A row whose gold answers are text that all normalise to "" ("The The", "!!!"): it is
    well-formed but can never be scored, so every reader (training's included) reports and
    skips it rather than failing. Blank answers only are a broken row (a plain RowError)."""


# ---------------------------------------------------------------------------------------
# one row -> standard fields


def question_from_prompt(prompt: Any) -> str:
    """The raw question inside a verl ``prompt`` (a list of chat messages or a string).

    Search-R1's template puts the question last, after ``Question: ``; without that marker
    the whole last user message is the question (plain verl QA rows)."""
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, (list, tuple)) and prompt:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise RowError("'prompt' has no user message with string content")
        content = users[-1]["content"]
    else:
        raise RowError("'prompt' must be a list of chat messages or a string")
    _, marker, after = content.rpartition("Question:")
    return (after if marker else content).strip()


def _answers(value: Any, field_name: str, dropped: list[str] | None = None) -> list[str]:
    """The row's gold answers as stripped strings, without those that normalise to "" (each
    appended to `dropped`, for the reader to note); a RowError when none is left."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [str(value)]
    if not isinstance(value, (list, tuple)):
        raise RowError(f"'{field_name}' must be a list of strings, got {type(value).__name__}")
    out = []
    for a in value:
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            a = str(a)
        if not isinstance(a, str):
            raise RowError(f"'{field_name}' contains a {type(a).__name__}, expected strings")
        out.append(a.strip())
    kept, empty = _usable_answers(out)
    if not kept:
        if not any(empty):  # [] or blank strings only: a broken row, as a missing field
            raise RowError(f"'{field_name}' has no non-empty answer")
        raise NoGoldAnswer(f"'{field_name}' has no usable answer: {', '.join(map(repr, empty))} "
                           f"normalise{'s' if len(empty) == 1 else ''} to \"\"")
    if dropped is not None:
        dropped += empty
    return kept


def _usable_answers(answers: list[str]) -> tuple[list[str], list[str]]:
    """(answers that normalise to something, the others). One that normalises to "" would be
    matched by an empty prediction (em) or by any text (subem, retrieval): issue 83."""
    kept, empty = [], []
    for a in answers:
        (kept if normalize_answer(a) else empty).append(a)
    return kept, empty


def _verl_answers(row: dict, dropped: list[str] | None = None) -> list[str]:
    """Gold answers of a verl row: ground_truth.target (Search-R1), else the answer list in
    extra_info (AmbigQA-style rows, whose ground_truth is all answers joined into one
    string), else ground_truth itself."""
    rm = row.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if isinstance(gt, dict) and "target" in gt:
        return _answers(gt["target"], "reward_model.ground_truth.target", dropped)
    info = row.get("extra_info")
    if isinstance(info, dict) and isinstance(info.get("answer"), (list, tuple)):
        return _answers(info["answer"], "extra_info.answer", dropped)
    if gt is None:
        raise RowError("missing 'reward_model.ground_truth'")
    return _answers(gt, "reward_model.ground_truth", dropped)


def normalize_row(row: dict, position: int, split: str | None = None, source: str | None = None,
                  default_split: str = "unknown", default_source: str = "unknown",
                  dropped: list[str] | None = None) -> dict:
    """Map one input row of any supported format to the standard fields (+ extras).

    `split` / `source` given by the caller override the row's own; the defaults apply when
    the row has none. `position` is the row's 0-based index in its input, used for ids when
    the row has none. Gold answers that normalise to "" are left out and appended to
    `dropped`."""
    is_verl = "reward_model" in row or ("prompt" in row and "question" not in row)
    info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}

    if row.get("question") is not None:
        question = row["question"]
    elif is_verl and isinstance(info.get("question"), str):
        question = info["question"]
    elif "prompt" in row:
        question = question_from_prompt(row["prompt"])
    else:
        raise RowError("missing field 'question'")
    if not isinstance(question, str):
        raise RowError(f"'question' must be a string, got {type(question).__name__}")
    question = question.strip()
    if not question:
        raise RowError("empty question")

    for name in ("golden_answers", "answer", "answers"):
        if name in row and row[name] is not None:
            answers = _answers(row[name], name, dropped)
            break
    else:
        if not is_verl:
            raise RowError("missing field 'golden_answers' (or 'answer')")
        answers = _verl_answers(row, dropped)

    multihop, aliases = _official_multihop(row)
    if aliases:  # other rows keep their answer lists exactly as given
        aliases, empty = _usable_answers(aliases)
        answers = list(dict.fromkeys(answers + aliases))
        if dropped is not None:
            dropped += empty
    split = str(split or row.get("split") or info.get("split") or default_split)
    rid = row.get("id", row.get("_id"))
    if rid is None and is_verl and info.get("index") is not None:
        rid = f"{split}_{info['index']}"
    if rid is None:
        rid = f"{split}_{position}"
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise RowError(f"'id' must be a string or integer, got {type(rid).__name__}")
    src = str(source or row.get("data_source") or default_source)

    out = {"id": str(rid), "question": question, "golden_answers": answers,
           "data_source": src, "split": split}
    meta = row.get("metadata")
    extras = {**(meta if isinstance(meta, dict) else {}), **row, **multihop}
    for k, v in extras.items():
        if k not in STANDARD and k not in _DROP and k not in out:
            out[k] = v
    return out


def _official_multihop(row: dict) -> tuple[dict, list[str]]:
    """(`{"support_titles": [...]}`, MuSiQue's answer aliases) from HotpotQA's or MuSiQue's
    official schema; ({}, []) for other rows. Titles are an aid: a hop or fact that names no
    titled paragraph adds none."""
    if "question_decomposition" in row and isinstance(row.get("paragraphs"), list):  # MuSiQue
        if row.get("answerable") is False:
            raise RowError("unanswerable MuSiQue question (answerable: false)")
        paragraphs = {p.get("idx"): p for p in row["paragraphs"] if isinstance(p, dict)}
        hops = row["question_decomposition"] if isinstance(row["question_decomposition"], list) else []
        found = [paragraphs.get(h.get("paragraph_support_idx")) for h in hops if isinstance(h, dict)]
        titles = [str(p.get("title") or "").strip() for p in found if p is not None]
        aliases = row.get("answer_aliases") if isinstance(row.get("answer_aliases"), list) else []  # often empty
        return ({"support_titles": list(dict.fromkeys(t for t in titles if t))},
                [str(a).strip() for a in aliases if str(a).strip()])
    facts = row.get("supporting_facts")
    if isinstance(facts, list) and "context" in row:  # HotpotQA
        titles = [str(f[0]).strip() for f in facts if isinstance(f, (list, tuple)) and f]
        return {"support_titles": list(dict.fromkeys(t for t in titles if t))}, []
    return {}, []


# ---------------------------------------------------------------------------------------
# readers


def _iter_rows(path: Path, report: Report) -> Iterator[tuple[str, dict]]:
    """(where, row dict) for every record of a QA input; malformed records are reported."""
    if path.is_dir():
        yield from _iter_datasets_dir(path, report)
        return
    suffix = base_suffix(path)
    if suffix == ".parquet":
        yield from iter_parquet(path, report)
    elif suffix == ".jsonl" or (suffix == ".json" and looks_like_jsonl(path)):
        for lineno, obj in iter_jsonl(path, report):
            yield f"{path}:{lineno}", obj
    elif suffix == ".json":
        for where, key, value in iter_json_document(path, report):
            if key is not None:
                raise DataPrepError(f"{path}: expected a JSON array of question objects, got an object")
            if not isinstance(value, dict):
                report.skip(where, f"expected a JSON object, got {type(value).__name__}")
                continue
            yield where, value
    elif suffix == ".arrow":
        yield from _iter_arrow_files([path], report)
    else:
        raise DataPrepError(
            f"{path}: unknown QA format (suffix {path.suffix!r}); expected .jsonl, .json, "
            ".parquet, .arrow or a `datasets` directory saved with save_to_disk"
        )


def _iter_datasets_dir(path: Path, report: Report) -> Iterator[tuple[str, dict]]:
    """A directory written by ``datasets.save_to_disk`` (a Dataset or a DatasetDict).

    Read with `datasets` when installed; otherwise the arrow files are read directly with
    pyarrow (save_to_disk writes Arrow IPC streams listed in state.json)."""
    if not (path / "state.json").exists() and not (path / "dataset_dict.json").exists():
        raise DataPrepError(
            f"{path}: a directory, but not a `datasets` save_to_disk directory "
            "(no state.json / dataset_dict.json)"
        )
    try:
        import datasets  # noqa: F401
    except ImportError:
        yield from _iter_datasets_dir_pyarrow(path, report)
        return
    ds = datasets.load_from_disk(str(path))
    parts = ds.items() if isinstance(ds, datasets.DatasetDict) else [(None, ds)]
    for split_name, part in parts:
        # Arrow batches, converted by the shared reader: a row with invalid UTF-8 is then
        # one reported row (datasets' own row iterator would raise on it)
        batches = part.with_format("arrow").iter(batch_size=4096)
        for where, row in iter_arrow_rows(batches, f"{path}{'/' + split_name if split_name else ''}", report):
            if split_name is not None and "split" not in row:
                row = {**row, "split": split_name}
            yield where, row


def _iter_datasets_dir_pyarrow(path: Path, report: Report) -> Iterator[tuple[str, dict]]:
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        for s in splits:
            for where, row in _iter_datasets_dir_pyarrow(path / s, report):
                yield where, ({**row, "split": s} if "split" not in row else row)
        return
    state = json.loads((path / "state.json").read_text())
    files = [path / f["filename"] for f in state.get("_data_files", [])]
    yield from _iter_arrow_files(files, report)


def _iter_arrow_files(files: list[Path], report: Report) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa

    for f in files:
        with pa.memory_map(str(f)) as src:
            try:
                reader = pa.ipc.open_stream(src)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(src)
            table = reader.read_all()
        yield from iter_arrow_rows(table.to_batches(), str(f), report)


def _infer_split(path: Path) -> str | None:
    for word in re.split(r"[^a-z]+", path.stem.lower()):
        if word in _SPLIT_WORDS:
            return _SPLIT_WORDS[word]
    return None


def _load(path: str | Path, report: Report, split: str | None,
          source: str | None) -> tuple[list[dict], list[int], list[str]]:
    """The usable rows, the position of each among the input's records (0-based), and the
    problems of the rows skipped for having no gold answer left (`NoGoldAnswer`)."""
    p = Path(path)
    if not p.exists():
        raise DataPrepError(f"{p}: no such file or directory")
    rows, positions, first_seen, unscoreable = [], [], {}, []
    start = report.read  # the report may already count rows of other files
    defaults = {"default_split": _infer_split(p) or "unknown", "default_source": p.stem}
    for where, row in _iter_rows(p, report):
        try:
            # position among all input records, malformed ones included, so that a
            # positional id names the same row whatever else in the file is broken
            position = report.read - start - 1
            dropped: list[str] = []
            out = normalize_row(row, position, split, source, **defaults, dropped=dropped)
        except RowError as e:
            report.skip(where, str(e))
            if isinstance(e, NoGoldAnswer):
                unscoreable.append(report.problems[-1])
            continue
        if out["id"] in first_seen:
            report.skip(where, f"duplicate id {out['id']!r} (first at {first_seen[out['id']]})")
            continue
        report.notes += [f"{where}: gold answer {a!r} dropped: it normalises to \"\", no answer could match it"
                         for a in dropped]
        first_seen[out["id"]] = where
        rows.append(out)
        positions.append(position)
    return rows, positions, unscoreable


def _to_frame(rows: list[dict]):
    """DataFrame with the standard columns first. An extra column parquet cannot store as
    it is (mixed types, or ragged nesting like HotpotQA's ``context`` = [[title, [sentences]]])
    is kept as JSON strings."""
    import pandas as pd
    import pyarrow as pa

    df = pd.DataFrame(rows, columns=list(STANDARD) + sorted({k for r in rows for k in r} - set(STANDARD)))
    for col in df.columns[len(STANDARD):]:
        try:
            pa.array(df[col].tolist())
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            df[col] = [None if v is None else json.dumps(v, ensure_ascii=False, default=str) for v in df[col]]
    return df


# ---------------------------------------------------------------------------------------
# public API


def convert_qa(
    input: str | Path,
    out: str | Path,
    source: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Report:
    """Convert one QA file (or `datasets` directory) to our parquet layout at `out`.

    Args:
        input: FlashRAG / NQ-open jsonl, HotpotQA JSON array, verl rows (jsonl or parquet),
            a ``.arrow`` file or a ``datasets`` directory.
        out: output ``.parquet``, written atomically.
        source: ``data_source`` for every row; None keeps a row's own (verl rows) and
            falls back to the input's file name.
        split: ``split`` for every row; None keeps the row's own, else infers it from the
            file name (train / dev / validation / test), else ``unknown``.
        limit: keep a random sample of this many good rows (order preserved), drawn with
            `seed`; the rest count as ``not sampled``.
    """
    report = Report()
    rows, _, _ = _load(input, report, split, source)
    if limit is not None and limit < len(rows):
        keep = sorted(random.Random(seed).sample(range(len(rows)), max(limit, 0)))
        report.limited = len(rows) - len(keep)
        rows = [rows[i] for i in keep]
    df = _to_frame(rows)
    with atomic_path(out) as tmp:
        df.to_parquet(tmp, index=False)
    report.written = len(df)
    report.check()
    return report


def _usable_as_is(df) -> bool:
    """True when every row of a parquet with the standard columns is what convert_qa writes
    (string id, non-empty question, string answers that normalise to something), so it needs
    no row-by-row pass."""
    import numpy as np

    def answers_ok(a) -> bool:
        if isinstance(a, str):
            return bool(normalize_answer(a))
        return (isinstance(a, (list, np.ndarray)) and len(a) > 0
                and all(isinstance(x, str) and normalize_answer(x) for x in a))

    return all(
        isinstance(i, str) and isinstance(q, str) and q.strip() and answers_ok(a)
        and isinstance(d, str) and isinstance(s, str)
        for i, q, a, d, s in zip(*(df[c] for c in STANDARD))
    )


def read_qa(path: str | Path, report: Report | None = None):
    """Read a QA set for training or evaluation; returns a pandas DataFrame.

    Accepts our parquet, FlashRAG jsonl (and every other format convert_qa reads), and
    Search-R1's training parquet as it is (question recovered from the prompt, answers
    from ``reward_model.ground_truth.target``); their other columns are kept. Guarantees
    ``id, question, golden_answers (list[str]), data_source, split``.

    Without `report`, a malformed row is an error (training must not silently drop data):
    convert with ``agent-rl-prep qa`` to keep the good rows and get a report. With one,
    malformed rows are recorded there and left out (long jobs such as building
    demonstrations or evaluating, which say what they skipped and go on). Gold answers that
    normalise to "" are left out with a warning on stderr (``file:line: gold answer 'The'
    dropped ...``; with `report`, a note there too); a row with none left is skipped, a
    warning without `report`, one of its problems with it, never an error: the row is
    well-formed, only unscoreable.
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    if base_suffix(p) == ".parquet" and p.is_file():
        try:
            df = pd.read_parquet(p)
            as_is = set(STANDARD) <= set(df.columns) and _usable_as_is(df)
        except (pa.ArrowException, OSError, ValueError):  # UnicodeDecodeError is a ValueError
            as_is = False  # invalid UTF-8 or a damaged row group: the row-by-row reader reports it
        if as_is:
            # parquet hands back numpy arrays; the contract is list[str] (and plain lists
            # for the KB's support_ids / hop_queries / hop_answers too)
            df["golden_answers"] = [[a] if isinstance(a, str) else [str(x) for x in a]
                                    for a in df["golden_answers"]]
            for col in df.columns:
                if df[col].dtype == object and any(isinstance(v, np.ndarray) for v in df[col].head(1)):
                    df[col] = [v.tolist() if isinstance(v, np.ndarray) else v for v in df[col]]
            if report is not None:
                report.read += len(df)
            return df
    own = report if report is not None else Report()
    first_note = len(own.notes)
    rows, positions, unscoreable = _load(p, own, None, None)
    for line in own.notes[first_note:] + (unscoreable if report is None else []):
        print(f"warning: {line}", file=sys.stderr)
    skipped_unscoreable = set(unscoreable)
    malformed = [problem for problem in own.problems if problem not in skipped_unscoreable]
    if report is None and malformed:
        shown = "\n  ".join(malformed[:5])
        raise DataPrepError(
            f"{p}: {own.skipped - len(unscoreable)} malformed QA rows (convert with `agent-rl-prep qa` to "
            f"skip them):\n  {shown}"
        )
    if base_suffix(p) == ".parquet":
        # Search-R1's own parquet: keep its columns (prompt, reward_model, ...) beside ours,
        # taken only for the rows kept (a skipped row's bytes may not even decode)
        extra = [c for c in pq.read_schema(p).names if c not in STANDARD]
        try:
            raw = pq.read_table(p, columns=extra).take(positions).to_pandas()
        except (pa.ArrowException, OSError) as e:
            raise DataPrepError(f"{p}: cannot read the columns {extra} ({e})") from None
        df = pd.DataFrame(rows, columns=list(STANDARD))
        for col in raw.columns:
            df[col] = raw[col].values
        return df
    return _to_frame(rows)


def normalize_question(q: str) -> str:
    """The overlap check's key: the EM reward's default normalisation (data_prep.normalize,
    ``unicode``: NFKC, typographic quotes and dashes as ASCII, then SQuAD's lower case, no
    punctuation / articles / extra spaces), so an NFD or curly-quoted copy of a question is
    the same question."""
    return normalize_answer(q)


def check_overlap(train_path: str | Path, test_path: str | Path, max_examples: int = 5) -> tuple[int, list[str]]:
    """Questions of the test file whose normalised text also occurs in the train file.

    Returns ``(n_shared, examples)``: the number of test rows with a shared question and up
    to `max_examples` of those questions as written in the test file."""
    train = {normalize_question(q) for q in read_qa(train_path)["question"]}
    shared = [q for q in read_qa(test_path)["question"] if normalize_question(q) in train]
    return len(shared), shared[:max_examples]


def questions_of(paths) -> set[str]:
    """The normalised questions of QA files (`normalize_question`)."""
    return {normalize_question(q) for p in paths for q in read_qa(p)["question"]}


def drop_questions(path: str | Path, questions: set[str], out: str | Path) -> tuple[int, int]:
    """Write the QA file `path` without the rows whose normalised question is in `questions`
    (parquet, atomically). Returns ``(n_rows, n_dropped)``."""
    df = read_qa(path)
    keep = [normalize_question(q) not in questions for q in df["question"]]
    with atomic_path(out) as tmp:
        df[keep].reset_index(drop=True).to_parquet(tmp, index=False)
    return len(df), len(df) - sum(keep)


def split_by_id(path: str | Path, every: int, out_rest: str | Path, out_held: str | Path) -> tuple[int, int]:
    """Split a parquet file with an `id` column (QA rows, demonstrations: every column kept) in
    two: the rows whose id's SHA-1 is divisible by `every` go to `out_held`, the others to
    `out_rest` (atomically). The split depends on the ids only, so it is the same on every run
    and machine. Returns ``(n_rest, n_held)``."""
    import hashlib

    import pandas as pd

    if every < 2:
        raise ValueError(f"split_by_id: every must be >= 2, got {every}")
    df = pd.read_parquet(path)
    if "id" not in df.columns:
        raise ValueError(f"{path}: no 'id' column to split by (columns: {', '.join(map(str, df.columns))})")
    held = df["id"].astype(str).map(lambda s: int(hashlib.sha1(s.encode()).hexdigest(), 16) % every == 0)
    for out, part in ((out_rest, df[~held]), (out_held, df[held])):
        with atomic_path(out) as tmp:
            part.reset_index(drop=True).to_parquet(tmp, index=False)
    return int((~held).sum()), int(held.sum())


def drop_overlap(train_path: str | Path, test_path: str | Path, out: str | Path) -> tuple[int, int]:
    """Write the train file without the rows whose normalised question occurs in the test
    file (parquet, atomically), so a test question is never trained on. Returns
    ``(n_train_rows, n_dropped)``."""
    return drop_questions(train_path, questions_of([test_path]), out)
