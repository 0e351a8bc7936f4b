"""Evaluation summaries (markdown + JSON), confidence intervals, and the model x mode table.

`summarize(records)` turns the per-question records of `agent_rl.evaluation.evaluate` into one block of
statistics per mode, overall and per `data_source`; `write_summary` writes it as
`summary.json` and `summary.md`; `comparison(runs)` reads several evaluation directories
(e.g. base / SFT / SFT+RL) into the table the demo's report shows, one row per model and one
column per mode (`agent-rl-eval report`).

Confidence intervals on EM are Wilson score intervals (95%, z = 1.96): EM is a proportion,
and untrained or small models sit near 0 on small samples, where the normal approximation
gives intervals below 0 and far too narrow (Brown, Cai & DasGupta 2001, "Interval Estimation
for a Binomial Proportion", Statistical Science 16(2)). Differences between two models
scored on the same questions use a paired normal interval on the per-question differences.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from data_prep.atomic import atomic_write
from data_prep.io import read_jsonl_rows

Z95 = 1.959963984540054
"""Two-sided 95% standard normal quantile."""

MODES = ("agent", "rag", "direct")
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
ALL = "all"
"""The `data_source` name of the overall row."""


# ----------------------------------------------------------------------------- intervals
def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion successes / n.

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z * sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

    (0, 1) for n = 0 (nothing is known). Example: 8 of 10 -> (0.4902, 0.9433).
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a: Sequence[float], b: Sequence[float], z: float = Z95) -> dict[str, float]:
    """Mean of a_i - b_i over paired scores (same questions) with a normal 95% interval:
    mean +- z * sd / sqrt(n), sd the sample standard deviation (n - 1). Pairing removes the
    question-difficulty variance both models share, so it is much tighter than comparing two
    independent intervals."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} scores vs {len(b)}; pair them by question first")
    n = len(a)
    if n == 0:
        return {"diff": 0.0, "ci_low": -1.0, "ci_high": 1.0, "n": 0}
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = z * sd / math.sqrt(n) if n > 1 else float("inf")
    return {"diff": mean, "ci_low": max(-1.0, mean - half), "ci_high": min(1.0, mean + half), "n": n}


def paired_em_difference(records_a: Iterable[Mapping], records_b: Iterable[Mapping], z: float = Z95) -> dict[str, float]:
    """`paired_difference` of EM between two record sets, paired by (data_source, id); only
    questions present in both count."""
    def by_q(recs: Iterable[Mapping]) -> dict[tuple[str, str], float]:
        return {(str(r["data_source"]), str(r["id"])): float(r["em"]) for r in recs}

    a, b = by_q(records_a), by_q(records_b)
    common = sorted(set(a) & set(b))
    return paired_difference([a[k] for k in common], [b[k] for k in common], z)


# ----------------------------------------------------------------------------- summaries
def stats(records: Sequence[Mapping]) -> dict:
    """Statistics of one group of per-question records (one mode)."""
    n = len(records)

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in records) / n if n else 0.0

    hits = sum(float(r["em"]) for r in records)
    lo, hi = wilson_interval(hits, n)
    ok = [r for r in records if not r.get("tool_failures")]
    return {
        "n": n,
        "em": mean("em"),
        "em_ci_low": lo,
        "em_ci_high": hi,
        "subem": mean("subem"),
        "f1": mean("f1"),
        "searches_mean": mean("searches"),
        "turns_mean": mean("turns"),
        "invalid_format_rate": 1.0 - mean("valid_format") if n else 0.0,
        "answer_rate": sum(r.get("prediction") is not None for r in records) / n if n else 0.0,
        "retrieval_hit_rate": mean("retrieval_hit"),
        "tool_failures": int(sum(int(r.get("tool_failures", 0)) for r in records)),
        "failed_retrieval": n - len(ok),
        "em_retrieval_ok": sum(float(r["em"]) for r in ok) / len(ok) if ok else 0.0,
    }


def summarize(records: Iterable[Mapping]) -> dict:
    """`{"modes": {mode: {"all": stats, <data_source>: stats, ...}}}` over the records.

    Modes keep the order agent, rag, direct; data sources are sorted, "all" first."""
    groups: dict[str, dict[str, list[Mapping]]] = {}
    for r in records:
        groups.setdefault(str(r["mode"]), {}).setdefault(str(r["data_source"]), []).append(r)
    order = sorted(groups, key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))
    out: dict = {"modes": {}}
    for mode in order:
        by_source = groups[mode]
        block = {ALL: stats([r for recs in by_source.values() for r in recs])}
        for src in sorted(by_source):
            block[src] = stats(by_source[src])
        out["modes"][mode] = block
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def em_cell(s: Mapping) -> str:
    """EM with its interval, in percent: `12.5 [8.1, 18.7]`."""
    return f"{_pct(s['em'])} [{_pct(s['em_ci_low'])}, {_pct(s['em_ci_high'])}]"


def summary_markdown(summary: Mapping, title: str | None = None) -> str:
    """One table: a row per (mode, data_source), the overall row first in each mode."""
    lines = [f"## {title}", ""] if title else []
    lines += [
        "| mode | data source | n | EM % [95% CI] | SubEM % | F1 % | searches | turns | answered % | invalid format % |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, block in summary["modes"].items():
        sources = list(block)
        if len(sources) == 2:  # one data source: its row equals the overall row
            sources = [ALL]
        for src in sources:
            s = block[src]
            lines.append(
                f"| {mode} | {src} | {s['n']} | {em_cell(s)} | {_pct(s['subem'])} | {_pct(s['f1'])} "
                f"| {s['searches_mean']:.2f} | {s['turns_mean']:.2f} | {_pct(s['answer_rate'])} "
                f"| {_pct(s['invalid_format_rate'])} |"
            )
    failed = [(mode, block[ALL]) for mode, block in summary["modes"].items() if block[ALL].get("failed_retrieval")]
    for mode, s in failed:
        lines += ["", f"**{s['failed_retrieval']} of {s['n']} {mode} questions saw a failed retrieval** (scored "
                      f"as they ended; EM on the other {s['n'] - s['failed_retrieval']}: {_pct(s['em_retrieval_ok'])}). "
                      "Rerun the same command to retry them."]
    lines += ["", "EM interval: Wilson score, 95%. Answered: an `<answer>` was extracted (unanswered "
              "questions score 0). Invalid format: the response breaks the mode's "
              "tag structure (agent: Search-R1's think/search/information/answer rule; rag and direct: "
              "the same rule with the think block optional)."]
    return "\n".join(lines) + "\n"


def write_summary(summary: Mapping, out_dir: str | Path, title: str | None = None) -> tuple[Path, Path]:
    """Write `summary.json` and `summary.md` into `out_dir` (atomically); return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / SUMMARY_JSON, out / SUMMARY_MD)
    for path, text in zip(paths, (json.dumps(summary, indent=1) + "\n", summary_markdown(summary, title))):
        with atomic_write(path) as f:
            f.write(text)
    return paths


def read_summary(eval_dir: str | Path) -> dict:
    """The `summary.json` of an evaluation directory (clear error when it is missing)."""
    path = Path(eval_dir) / SUMMARY_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{eval_dir}: no {SUMMARY_JSON} (run agent-rl-eval with --out {eval_dir} first)")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- comparison
def comparison(runs: Sequence[tuple[str, str | Path]] | Mapping[str, str | Path],
               modes: Sequence[str] = MODES, source: str = ALL) -> dict:
    """The model x mode table from evaluation directories.

    `runs`: (label, eval dir) pairs in row order, e.g. [("base", d0), ("SFT", d1),
    ("SFT+RL", d2)]. Returns `{"modes": [...], "source": source, "rows": [{"model": label,
    "dir": str, "cells": {mode: stats or None}}]}`; a mode a run did not evaluate is None."""
    items = list(runs.items()) if isinstance(runs, Mapping) else list(runs)
    rows = []
    for label, d in items:
        summary = read_summary(d)
        cells = {m: summary["modes"].get(m, {}).get(source) for m in modes}
        rows.append({"model": label, "dir": str(d), "cells": cells})
    return {"modes": list(modes), "source": source, "rows": rows}


def comparison_markdown(table: Mapping, title: str | None = "EM by model and mode") -> str:
    """Markdown of `comparison(...)`: EM % [95% CI] per cell, n and mean searches below."""
    modes = table["modes"]
    lines = [f"## {title}", ""] if title else []
    lines.append("| model | " + " | ".join(modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    for row in table["rows"]:
        cells = []
        for m in modes:
            s = row["cells"][m]
            cells.append("—" if s is None else f"{em_cell(s)} (n={s['n']}, {s['searches_mean']:.1f} searches)")
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    src = table.get("source", ALL)
    lines += ["", f"EM in percent on {'all data sources' if src == ALL else src}, Wilson 95% interval; "
              "agent: the model may search; rag: top-k passages for the question in the prompt, "
              "one answer; direct: no retrieval."]
    return "\n".join(lines) + "\n"


def read_records(eval_dir: str | Path, mode: str) -> list[dict]:
    """The per-question records of one mode in an evaluation directory (predictions.jsonl;
    a partial last line from an evaluation killed mid-write is skipped with a warning)."""
    path = Path(eval_dir) / "predictions.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no predictions.jsonl in {eval_dir}")
    return [r for r in read_jsonl_rows(path) if r.get("mode") == mode]


def records_by_question(eval_dir: str | Path, mode: str = "agent") -> dict[tuple, dict]:
    """`read_records` keyed by question, (data_source, id): how evaluations are paired."""
    return {(r["data_source"], r["id"]): r for r in read_records(eval_dir, mode)}


def _grouped(keys: Sequence[tuple], group_of: Mapping[str, str] | None) -> dict[str, list[tuple]]:
    """{ALL: keys, group: its keys} for (data_source, id) keys; ids `group_of` lacks are in ALL only."""
    keyed = {ALL: list(keys)}
    for k in keys if group_of else ():
        g = group_of.get(str(k[1]))
        if g is not None:
            keyed.setdefault(str(g), []).append(k)
    return keyed


def grouped_stats(eval_dir: str | Path, mode: str = "agent", group_of: Mapping[str, str] | None = None) -> dict:
    """One evaluation's `stats` overall (ALL) and per group (`group_of`: question id -> group)."""
    recs = records_by_question(eval_dir, mode)
    return {g: stats([recs[k] for k in keys]) for g, keys in _grouped(sorted(recs), group_of).items()}


def paired_comparison(a_dir: str | Path, b_dir: str | Path, mode: str = "agent",
                      group_of: Mapping[str, str] | None = None) -> dict:
    """Model b against model a on the questions both answered in `mode`: each model's `stats`
    overall and per group (`group_of`: question id -> group, e.g. the KB's question kind), and
    the paired EM difference b - a with its 95% interval, overall and per group.

    Returns {"n", "groups": [...], "a": {group: stats}, "b": {...}, "diff": {group: paired}};
    the overall group is ALL."""
    a, b = records_by_question(a_dir, mode), records_by_question(b_dir, mode)
    common = sorted(set(a) & set(b))
    keyed = _grouped(common, group_of)
    out: dict = {"n": len(common), "groups": list(keyed), "a": {}, "b": {}, "diff": {}}
    for g, keys in keyed.items():
        out["a"][g] = stats([a[k] for k in keys])
        out["b"][g] = stats([b[k] for k in keys])
        out["diff"][g] = paired_difference([float(b[k]["em"]) for k in keys], [float(a[k]["em"]) for k in keys])
    return out


def paired_comparison_markdown(cmp: Mapping, labels: tuple[str, str] = ("SFT", "SFT+RL")) -> str:
    """A row per model and one for the paired difference; a column per group (n in the header)."""
    groups = cmp["groups"]
    head = ["all" if g == ALL else g for g in groups]
    lines = ["| | " + " | ".join(f"{h} (n={cmp['a'][g]['n']})" for h, g in zip(head, groups))
             + " | searches / question | strict format |",
             "|---|" + "---|" * (len(groups) + 2)]
    for label, side in zip(labels, ("a", "b")):
        st = cmp[side]
        lines.append(f"| {label} agent EM % | " + " | ".join(em_cell(st[g]) for g in groups)
                     + f" | {st[ALL]['searches_mean']:.2f} | {_pct(1 - st[ALL]['invalid_format_rate'])} |")
    diffs = []
    for g in groups:
        d = cmp["diff"][g]
        diffs.append(f"**{100 * d['diff']:+.1f}** [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]")
    lines.append(f"| {labels[1]} − {labels[0]}, paired 95% CI | " + " | ".join(diffs) + " | | |")
    return "\n".join(lines) + "\n"
