"""Records of runs, and the documents' tables generated from them (docs/results/README.md).

Every benchmark ends with `keep(...)`: it writes the run's record (`agent_rl.demo.records`:
command, commit, hardware line, settings, headline figures) beside the full JSON and PNGs, into
`--record-dir` (default: the run's own output directory). A record worth quoting is kept in
`docs/results/<experiment>/`, by running the benchmark with `--record-dir` there or by copying:

    python -m benchmarks.records keep runs/rl_vs_sft/kb101 rl_vs_sft_kb101_demos50_best_nbf16
    python -m benchmarks.records index           # docs/results/README.md and every generated table
    python -m benchmarks.records index --check   # exit 1 if a generated table is out of date

`index` rewrites, from the records alone: docs/results/README.md (the index), each record's
README.md (its card), the tables between `<!-- records:begin NAME -->` and
`<!-- records:end NAME -->` in README.md, docs/real_data.md and docs/gpu.md, and the figures
`make demo`'s report quotes (agent_rl/demo/expectations.json, shipped with the package). Which
records and figures README.md's what-to-expect table and the demo's report show, and the
report's sentences, are data: docs/results/expect.yaml (`load_selection`).
Documents quote figures only through these tables (tests/benchmarks/test_records.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from agent_rl.demo.records import (  # noqa: E402
    MINUS, RECORD, Record, command_line, paired, pts, read_record, redact_record, write_record,
)

RESULTS = ROOT / "docs" / "results"
EXPECTATIONS = ROOT / "agent_rl" / "demo" / "expectations.json"
BEGIN, END = "<!-- records:begin {} -->", "<!-- records:end {} -->"


# ----------------------------------------------------------------------------- figures
def em(x: float) -> str:
    return f"{100 * x:.1f}"


def spread(diffs: list[dict], unit: str = "seed") -> str:
    """Over seeds: the range and count, or the one paired difference with its interval."""
    if len(diffs) == 1:
        return f"{paired(diffs[0])} (1 {unit})"
    xs = [d["diff"] for d in diffs]
    return f"{pts(min(xs))} to {pts(max(xs))} ({len(xs)} {unit}s)"


def each(rows: list[dict], get: Callable[[dict], dict]) -> str:
    return "; ".join(f"seed {r['seed']} {paired(get(r))}" for r in rows)


def em_range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return em(lo) if lo == hi else f"{em(lo)}–{em(hi)}"


def rl_vs_sft_headline(result: dict) -> dict[str, str]:
    """benchmarks/rl_vs_sft.py's figures: GRPO against SFT (best checkpoints first where it
    scored them), per seed with the paired interval, and the agent EM of each arm. A result of
    the arm list (#85: rows with their pairs) has its figures from its tables module."""
    if "pairs" in result.get("summary", {}):
        from benchmarks.rl_vs_sft_tables import headline

        return headline(result)
    rows = result["rows"]
    out: dict[str, str] = {}
    if all("best_checkpoints" in r for r in rows):
        best = [r["best_checkpoints"]["grpo_minus_sft"] for r in rows]
        out["GRPO's best − SFT's best"] = spread(best)
        out["GRPO's best − SFT's best, mean"] = pts(statistics.mean(d["diff"] for d in best))
        out["GRPO's best − SFT's best, per seed"] = each(rows, lambda r: r["best_checkpoints"]["grpo_minus_sft"])
        out["SFT's best − start, per seed"] = each(rows, lambda r: r["best_checkpoints"]["sft_minus_start"])
    out["GRPO − SFT more (same minutes, last checkpoints)"] = spread([r["grpo_minus_sft"] for r in rows])
    out["GRPO − SFT more, per seed"] = each(rows, lambda r: r["grpo_minus_sft"])
    if all(r.get("grpo_minus_sft_matched") for r in rows):
        out["GRPO − SFT at GRPO's own minutes"] = spread([r["grpo_minus_sft_matched"] for r in rows])
    out["agent EM: start → SFT more / GRPO"] = (f"{em_range([r['em_start'] for r in rows])} → "
                                               f"{em_range([r['em_sft_more'] for r in rows])} / "
                                               f"{em_range([r['em_grpo'] for r in rows])}")
    out["steps: SFT more / GRPO"] = (f"{'/'.join(str(r['sft_more_steps']) for r in rows)} / "
                                     f"{'/'.join(str(r['grpo_steps']) for r in rows)}")
    return out


def start_curve_headline(result: dict) -> dict[str, str]:
    """rl_vs_sft.py --start-curve: the start chosen and the mean curve it was chosen on."""
    curves = result["curves"]
    steps = sorted({p["step"] for c in curves.values() for p in c})
    mean = {k: statistics.mean(p["em"] for c in curves.values() for p in c if p["step"] == k) for k in steps}
    out = {}
    if "chosen_start_steps" in result:
        out["start chosen (SFT steps)"] = str(result["chosen_start_steps"])
    out["mean agent EM by SFT steps"] = ", ".join(f"{k}: {em(v)}" for k, v in mean.items())
    out["seeds"] = str(len(curves))
    return out


def miss_recovery_headline(result: dict) -> dict[str, str]:
    """benchmarks/miss_recovery.py: after a look-alike's passage, how often a sample searches
    again and how often it finds the passage it missed, against after the right passage."""
    out = {}
    for cond in ("look-alike", "right passage"):
        by_kind = result["after"].get(cond, {})
        n = sum(v["samples"] for v in by_kind.values())
        if not n:
            continue
        again = sum(v["search_again"] * v["samples"] for v in by_kind.values()) / n
        out[f"after the {cond}: searches again"] = f"{100 * again:.1f}% of {n} samples"
        if cond == "look-alike":
            found = sum(v["finds_missed"] * v["samples"] for v in by_kind.values()) / n
            out["after the look-alike: finds the missed passage"] = f"{100 * found:.1f}% of {n} samples"
    return out


def gpu_loop_headline(result: dict) -> dict[str, str]:
    """benchmarks/gpu_loop.py: the demo's pipeline on a GPU, GRPO's speed and its gain."""
    out = {}
    g, d = result.get("grpo", {}), result.get("demo", {})
    if "stage_s" in d:
        out["demo minutes (stages summed)"] = f"{sum(d['stage_s'].values()) / 60:.1f} ({g.get('steps', '?')} GRPO steps)"
    if "steps_per_hour" in g:
        out["GRPO steps per hour"] = f"{g['steps_per_hour']:.0f} (median step {g['step_s_median']:.2f} s)"
    c = d.get("sft_vs_rl")
    if c:
        out["GRPO's own model − its SFT model"] = (f"{pts(c['diff'] / 100)} [{pts(c['ci'][0] / 100)}, "
                                                    f"{pts(c['ci'][1] / 100)}] (1 run, {c['n']} questions)")
        out["agent EM: SFT → SFT+RL"] = f"{c['sft_em']:.1f} → {c['rl_em']:.1f}"
    r = result.get("rollout") or {}
    if r.get("ratio_to_plain") is not None:
        out["interleaved rollout ÷ plain generation"] = f"{r['ratio_to_plain']:.2f}"
    t = result.get("train_after_demo", {}).get("training") or result.get("training") or {}
    if t.get("update_tok_s"):
        out["actor update tokens/s"] = f"{t['update_tok_s']:,.0f}"
    return out


def kb_headroom_headline(result: dict) -> dict[str, str]:
    """Per split: agent EM of the demonstrations' strategy (name only) and of the better one (name
    + attribute), and the gap the bar is on."""
    out = {}
    for split, t in result["splits"].items():
        a = t["all"]
        out[f"{split}: name only → name + attribute (agent EM)"] = (
            f"{a['name only']:.1f} → {a['name + attribute']:.1f} ({a['gap']:+.1f}; bar {result['bar']:.0f})")
    return out


def rl_vs_sft_choice_headline(result: dict) -> dict[str, str]:
    """rl_vs_sft.py --choose: each control arm's chosen settings (its tables module)."""
    from benchmarks.rl_vs_sft_choice import headline

    return headline(result)


def scale_headline(r: dict) -> dict[str, str]:
    """benchmarks/scale.py: the shaped policy's sync, rollout, update, memory and steps per hour."""
    g = r["grpo"]
    return {"policy": f"{r['shape']}, {r['params'] / 1e9:.2f}B parameters (random)",
            "weight sync": f"{r['sync_s']:.2f} s", "rollout ÷ plain generation": f"{r['rollout_ratio_to_plain']:.2f}",
            "update ÷ bare forward+backward": f"{r['update_ratio_to_bare']:.2f}",
            "engine / trainer memory": f"{r['engine_gib']:.1f} / {r['trainer_peak_gib']:.1f} GiB",
            "GRPO steps per hour at Search-R1's shape": f"{g['steps_per_hour']:.1f} ({g['trajectories']} trajectories a step)"}


def generic_headline(result: dict) -> dict[str, str]:
    """Any other benchmark: its top-level figures (the full JSON holds the rest)."""
    out = {k: f"{v:.4g}" for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if isinstance(result.get("rows"), list):
        out["rows"] = f"{len(result['rows'])} (in the JSON)"
    return dict(list(out.items())[:12]) or {"figures": "in the JSON"}


def vs_trl_headline(result: dict) -> dict[str, str]:
    """benchmarks/vs_trl.py's figures: ours ÷ TRL per figure of its table, each side's steps (or
    its error), the agent EM of the start and both final models and the paired differences, the
    better-strategy share of searches (with `--strategy-kb`) and TRL's vLLM colocate probe."""
    sides, ratio, ev = result["sides"], result.get("ratios") or {}, result.get("eval") or {}
    out = {f"ours ÷ TRL, {label}": f"{ratio[key]:.2f}x" for key, label in
           (("steps_per_hour", "GRPO steps per hour"), ("step_s", "seconds per step"),
            ("tokens_per_s", "sampled tokens per second"), ("peak_rss_gib", "peak memory"))
           if ratio.get(key) is not None}
    out["GRPO steps: ours / TRL"] = " / ".join(str(sides[s].get("steps", "error")) for s in ("ours", "trl"))
    if ev.get("em"):
        out[f"agent EM on {ev['n']} questions: start / ours / TRL"] = " / ".join(
            em(ev["em"][k]["em"]) if k in ev["em"] else "not measured" for k in ("start", "ours", "trl"))
    for key, label in (("ours_minus_trl", "ours − TRL, agent EM"), ("ours_minus_start", "ours − start, agent EM"),
                       ("trl_minus_start", "TRL − start, agent EM")):
        if ev.get(key):
            out[label] = paired(ev[key])
    share = (result.get("strategy") or {}).get("better_share") or {}
    if share:
        out["better-strategy share of searches: start / ours / TRL"] = " / ".join(
            "n/a" if share.get(k) is None else f"{100 * share[k]:.1f}%" if k in share else "not measured"
            for k in ("start", "ours", "trl"))
    if result.get("trl_vllm_probe"):
        out["TRL with vLLM colocate on this host"] = result["trl_vllm_probe"]["outcome"]
    return out


HEADLINES: dict[str, Callable[[dict], dict[str, str]]] = {
    "rl_vs_sft": rl_vs_sft_headline, "start_curve": start_curve_headline,
    "miss_recovery": miss_recovery_headline, "gpu_loop": gpu_loop_headline, "kb_headroom": kb_headroom_headline,
    "rl_vs_sft_choice": rl_vs_sft_choice_headline, "scale": scale_headline, "vs_trl": vs_trl_headline,
}
"""A benchmark's headline from its result; generic_headline for the rest."""


# ----------------------------------------------------------------------------- writing
def add_args(ap: argparse.ArgumentParser) -> None:
    """`--record-dir`: where the run's record goes (docs/results/<experiment> to keep it)."""
    ap.add_argument("--record-dir", default=None,
                    help="write the run's record (record.json, the full JSON, PNGs) here; keep one with "
                         "docs/results/<experiment> (default: the run's output directory, or runs/records/<benchmark>)")


def keep(args: argparse.Namespace | None, benchmark: str, result: dict, *, files: list = (),
         default_dir: Path | None = None, title: str | None = None) -> Path:
    """Write `benchmark`'s record for `result` (its full JSON beside it, as `<benchmark>.json`) into
    `args.record_dir`, else `default_dir`, else runs/records/<benchmark>. The settings are the
    command's parsed arguments. A secret the command or settings give (`retriever.api_key=...`)
    is redacted in the record and in the full JSON (`redact_record`)."""
    settings = {k: v for k, v in vars(args or argparse.Namespace()).items() if k != "record_dir"}
    out = Path(getattr(args, "record_dir", None) or default_dir or ROOT / "runs" / "records" / benchmark)
    out.mkdir(parents=True, exist_ok=True)
    full = out / f"{benchmark}.json"
    shown = json.loads(json.dumps(result, default=str))  # what the JSON holds, then without its secrets
    shown = redact_record({"command": command_line(), "settings": settings, "result": shown}, ("result",))["result"]
    full.write_text(json.dumps(shown, indent=1) + "\n")
    host = result.get("host") or result.get("hardware_line") or result.get("hardware")
    return write_record(out, experiment=out.name, title=title or f"benchmarks/{benchmark}.py",
                        benchmark=f"benchmarks/{benchmark}.py",
                        headline=HEADLINES.get(benchmark, generic_headline)(result), settings=settings,
                        files=[full, *[Path(f) for f in files if f and Path(f).is_file()]],
                        host=host if isinstance(host, str) else None)


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
"""An experiment's or a record's file's name: one plain path component (no separator, no `..`)."""


def plain_name(name: str, what: str) -> str:
    """`name` when it names an entry inside its directory, else a ValueError naming it: a record
    from elsewhere may name `../../.bashrc` or `/etc/passwd`, which `keep` would read or write."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{what} {name!r} is not a plain file name (letters, digits, . _ + -; no path, "
                         f"no '..'): a record's names stay inside its directory")
    return name


def no_link(path: Path, what: str) -> Path:
    """`path` unless it is a symbolic link: copying through one reads or writes outside
    docs/results and the run's directory."""
    if path.is_symlink():
        raise ValueError(f"{what} {path} is a symbolic link; a record's files are copied only as plain files")
    return path


def keep_dir(src: Path, experiment: str, results: Path = RESULTS) -> Path:
    """Copy a run's record directory (its record.json and the files it names) to
    docs/results/<experiment>, its settings and command redacted (`redact_record`). Every name is
    checked before anything is copied: the experiment and each file must be a plain name, and no
    source or destination a symbolic link, so nothing outside `src` is read and nothing outside
    `results/<experiment>` written."""
    src = Path(src)
    plain_name(experiment, "experiment")
    rec = read_record(no_link(src / RECORD, "record"))
    names = [plain_name(name, f"{src / RECORD}: file") for name in rec.files]
    dest = no_link(results / experiment, "destination")
    for name in [RECORD, *names]:
        if not no_link(src / name, "source").is_file():
            raise ValueError(f"{src / RECORD} names {name!r}, which is not a file in {src}")
        no_link(dest / name, "destination")
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(src / name, dest / name)
    data = redact_record(json.loads((src / RECORD).read_text()))
    data["experiment"] = experiment
    (dest / RECORD).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return dest


# ----------------------------------------------------------------------------- reading
def load_all(results: Path = RESULTS) -> dict[str, Record]:
    """Every record under docs/results, by experiment (its directory's name)."""
    out = {}
    for p in sorted(results.glob(f"*/{RECORD}")):
        rec = read_record(p)
        if rec.experiment != p.parent.name:
            raise ValueError(f"{p}: experiment {rec.experiment!r} is not its directory's name")
        plain_name(rec.experiment, f"{p}: experiment")
        for name in rec.files:  # the cards link them and the checks open them: inside the record only
            plain_name(name, f"{p}: file")
        out[rec.experiment] = rec
    return out


def cell_text(text: str) -> str:
    """Text from a record as one table cell: `|` escaped, line breaks as spaces, and `<!--` as
    `&lt;!--`, so that a title or label holding `|`, a newline or a `<!-- records:end ... -->`
    marker can neither split a row nor end the block `index` rewrites (which then grew by the
    rest of the old table at every run)."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).replace("|", "\\|").replace("<!--", "&lt;!--")


def link(exp: str, prefix: str) -> str:
    return f"{prefix}{exp}/"


PAIR = re.compile(rf"(.+?) {MINUS} (.+) \((.+)\)")
"""A headline label that compares two arms: "A − B (how)"."""


def main_figure(rec: Record) -> str:
    """The first headline figure, with its label; where it compares one arm with another, also its
    comparisons with the other arms measured the same way ("GRPO − RFT (best checkpoints)" beside
    "GRPO − SFT more (best checkpoints)"), so that an index line never shows one control alone."""
    items = list(rec.headline.items())
    if not items:
        return "(figures in the JSON)"
    shown = items[:1]
    if first := PAIR.fullmatch(items[0][0]):
        shown += [(label, fig) for label, fig in items[1:]
                  if (m := PAIR.fullmatch(label)) and (m[1], m[3]) == (first[1], first[3])]
    return "; ".join(f"{label}: {fig}" for label, fig in shown)


# ----------------------------------------------------------------------------- tables
SELECTION = "expect.yaml"
"""docs/results/expect.yaml: which records and figures the README's what-to-expect table shows and
the sentences `make demo`'s report says them in (data, so a new run is quoted without a code edit)."""

CELL_KEYS = {"record", "figure", "figures"}


def selection_error(path: Path, where: str, why: str) -> ValueError:
    return ValueError(f"{path}: {where}: {why}")


def check_cell(path: Path, where: str, cell) -> None:
    """A table cell names one record and either one headline label (`figure`) or a list (`figures`)."""
    if not isinstance(cell, dict) or not isinstance(cell.get("record"), str) or set(cell) - CELL_KEYS:
        raise selection_error(path, where, f"a cell is {{record, figure | figures}}, not {cell!r}")
    labels = cell.get("figures", [cell.get("figure")])
    if ("figure" in cell) == ("figures" in cell) or not labels or not all(isinstance(x, str) for x in labels):
        raise selection_error(path, where, "name one headline label as `figure` or a list of them as `figures`")


def check_sentences(path: Path, sentences) -> None:
    """The report's sentences: one per case its code chooses, each using only the {names} its case
    fills (report.SENTENCE_FIELDS), so a typo fails here and not in a newcomer's demo."""
    from string import Formatter

    from agent_rl.demo.report import SENTENCE_FIELDS

    if not isinstance(sentences, dict) or set(sentences) != set(SENTENCE_FIELDS):
        raise selection_error(path, "demo_report", f"needs exactly the cases {sorted(SENTENCE_FIELDS)}")
    for case, text in sentences.items():
        names = {name for _, name, _, _ in Formatter().parse(str(text)) if name is not None}
        if not isinstance(text, str) or names - set(SENTENCE_FIELDS[case]):
            raise selection_error(path, f"demo_report.{case}", f"uses {sorted(names - set(SENTENCE_FIELDS[case]))}; "
                                  f"it may use {list(SENTENCE_FIELDS[case])}")


def load_selection(path: Path) -> dict:
    """docs/results/expect.yaml, checked: its columns, table rows (label and cells by column),
    demo quotes (record, figure, where) and the report's sentences. Records and figures are
    checked against the records when rendered (`expect_table`, `expectations`)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or set(data) != {"columns", "expect", "suite", "demo_quotes", "demo_report"}:
        raise selection_error(path, "top level", "needs exactly columns, expect, suite, demo_quotes and demo_report")
    for i, entry in enumerate(data["suite"]):
        if not isinstance(entry, dict) or set(entry) != {"record", "where"}:
            raise selection_error(path, f"suite[{i}]", "an entry is {record, where}")
    kinds = [c.get("kind") for c in data["columns"]]
    for i, row in enumerate(data["expect"]):
        if not isinstance(row.get("label"), str) or not isinstance(row.get("cells"), dict):
            raise selection_error(path, f"expect[{i}]", "a row is {label: text, cells: {column: cell}}")
        for col, cell in row["cells"].items():
            if col not in kinds:
                raise selection_error(path, f"expect[{i}]", f"column {col!r} is not one of {kinds}")
            check_cell(path, f"expect[{i}].{col}", cell)
    for i, quote in enumerate(data["demo_quotes"]):
        if set(quote) != {"record", "figure", "where"} or quote["where"] not in ("kb101", "unseen", "prereg"):
            raise selection_error(path, f"demo_quotes[{i}]", "a quote is {record, figure, where: kb101|unseen|prereg}")
    check_sentences(path, data["demo_report"])
    return data


def headline_figure(records: dict[str, Record], exp: str, label: str, where: str) -> str:
    """A record's headline figure by its label, or an error naming the selection's entry."""
    if exp not in records:
        raise ValueError(f"{SELECTION} {where}: no record {exp!r} in docs/results")
    if label not in records[exp].headline:
        raise ValueError(f"{SELECTION} {where}: record {exp!r} has no headline figure {label!r} "
                         f"(it has {list(records[exp].headline)})")
    return records[exp].headline[label]


GPU = "GPU"
KINDS_OF = {"real_data": lambda r: not r.host_kind.startswith(GPU), "gpu": lambda r: r.host_kind.startswith(GPU)}


def column_of(kind: str) -> str:
    return GPU if kind.startswith(GPU) else kind


def expect_table(records: dict[str, Record], selection: dict) -> str:
    """README's what to expect, as expect.yaml selects it: one row an entry (the README's test
    holds it to four), one figure a cell (or one for each label it names, each said with its
    label), each with its record."""
    columns = selection["columns"]
    lines = ["| | " + " | ".join(c["header"] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for i, row in enumerate(selection["expect"]):
        out = []
        for col in (c["kind"] for c in columns):
            cell = row["cells"].get(col)
            if cell is None:
                out.append("")
                continue
            exp, where = cell["record"], f"expect[{i}].{col}"
            figure = (headline_figure(records, exp, cell["figure"], where) if "figure" in cell
                      else "; ".join(f"{label}: {headline_figure(records, exp, label, where)}"
                                     for label in cell["figures"]))
            if column_of(records[exp].host_kind) != col:
                raise ValueError(f"{exp}: host kind {records[exp].host_kind!r} is not the column {col!r}")
            out.append(f"{cell_text(figure)} ([record](docs/results/{exp}/))")
        lines.append(f"| {row['label']} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def suite_line(records: dict[str, Record], selection: dict) -> str:
    """README's line of the suite's minutes: each `suite` record of expect.yaml, where it ran."""
    parts = [f"{cell_text(headline_figure(records, e['record'], 'minutes', f'suite[{i}]'))} {e['where']} "
             f"([record](docs/results/{e['record']}/))" for i, e in enumerate(selection["suite"])]
    return f"`make test` takes {'; '.join(parts)}, plus set-up."


def records_table(records: dict[str, Record], keep_it: Callable[[Record], bool], prefix: str) -> str:
    """One row a record: what it measured, its host kind, its main figure, its link."""
    lines = ["| record | what it measured | host kind | main figure |", "|---|---|---|---|"]
    for exp, rec in records.items():
        if keep_it(rec):
            lines.append(f"| [{exp}]({link(exp, prefix)}) | {cell_text(rec.title)} | {cell_text(rec.host_kind)} | "
                         f"{cell_text(main_figure(rec))} |")
    return "\n".join(lines)


def index_markdown(records: dict[str, Record]) -> str:
    """docs/results/README.md: every record, by benchmark."""
    text = ["# Records of runs", "",
            "Each directory is one run's record: `record.json` (command, commit, hardware line, settings, headline",
            "figures), the run's full JSON and its PNGs, and a README.md card. The documents quote figures only",
            "from these records, through tables that `python -m benchmarks.records index` writes (this file",
            "included). A benchmark writes its record with `--record-dir docs/results/<experiment>`; an earlier",
            "run's is copied here with `python -m benchmarks.records keep <its dir> <experiment>`. For the records",
            "made from the earlier flat files, `commit` is the commit that recorded the run's JSON (the run's code",
            "is at or before it); a record whose figures only a document kept says so in its note.", ""]
    by_bench: dict[str, list[Record]] = {}
    for rec in records.values():
        by_bench.setdefault(rec.benchmark, []).append(rec)
    for bench, recs in sorted(by_bench.items()):
        text += [f"## `{cell_text(bench)}`", "", "| record | what it measured | host kind | commit | main figure |",
                 "|---|---|---|---|---|"]
        text += [f"| [{r.experiment}]({r.experiment}/) | {cell_text(r.title)} | {cell_text(r.host_kind)} | "
                 f"{cell_text(r.commit)} | {cell_text(main_figure(r))} |" for r in recs]
        text.append("")
    return "\n".join(text).rstrip("\n") + "\n"


def card(rec: Record) -> str:
    """A record's README.md, so that browsing its directory shows what it holds."""
    lines = [f"# {rec.experiment}", "", cell_text(rec.title), "", "```", rec.command, rec.host, "```", "",
             f"Commit {rec.commit}, recorded {rec.date}; host kind: {rec.host_kind}.", ""]
    if rec.note:
        lines += [rec.note, ""]
    lines += ["| figure | value |", "|---|---|",
              *[f"| {cell_text(k)} | {cell_text(v)} |" for k, v in rec.headline.items()], ""]
    lines += ["Settings: " + ", ".join(f"`{k}={v}`" for k, v in rec.settings.items()) + ".", ""]
    lines += [f"![{f}]({f})" if f.endswith(".png") else f"- [{f}]({f})" for f in rec.files]
    return "\n".join(lines) + "\n"


def expectations(records: dict[str, Record], selection: dict) -> dict:
    """What `make demo`'s report quotes, by host kind, and the sentences it says them in, as
    expect.yaml selects them (agent_rl/demo/expectations.json)."""
    quotes = []
    for i, q in enumerate(selection["demo_quotes"]):
        exp, label = q["record"], q["figure"]
        figure = headline_figure(records, exp, label, f"demo_quotes[{i}]")
        quotes.append({"record": f"docs/results/{exp}", "host_kind": records[exp].host_kind, "where": q["where"],
                       "command": records[exp].command, "label": label, "figure": figure})
    return {"generated_by": "python -m benchmarks.records index", "quotes": quotes,
            "sentences": selection["demo_report"]}


BLOCKS: dict[tuple[str, str], Callable[[dict[str, Record], dict], str]] = {
    ("README.md", "expect"): expect_table,
    ("README.md", "suite"): suite_line,
    ("docs/real_data.md", "records"): lambda r, _: records_table(r, KINDS_OF["real_data"], "results/"),
    ("docs/gpu.md", "records"): lambda r, _: records_table(r, KINDS_OF["gpu"], "results/"),
}
"""(document, block name) -> the text between its markers, from the records and expect.yaml."""


def fill(text: str, name: str, body: str, doc: str) -> str:
    begin, end = BEGIN.format(name), END.format(name)
    if begin not in text or end not in text:
        raise ValueError(f"{doc}: no {begin} ... {end} block")
    if text.count(begin) > 1 or text.count(end) > 1 or text.index(end) < text.index(begin):
        raise ValueError(f"{doc}: its {begin} ... {end} block is not one block (a marker written into "
                         f"it, or out of order); mend it by hand to one begin and one end, then run index")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file's new text, from the records under root/docs/results."""
    records = load_all(root / "docs" / "results")
    selection = load_selection(root / "docs" / "results" / SELECTION)
    out: dict[Path, str] = {root / "docs" / "results" / "README.md": index_markdown(records),
                            root / "agent_rl" / "demo" / "expectations.json":
                                json.dumps(expectations(records, selection), indent=1, ensure_ascii=False) + "\n"}
    for exp, rec in records.items():
        out[root / "docs" / "results" / exp / "README.md"] = card(rec)
    docs: dict[Path, str] = {}
    for (doc, name), make in BLOCKS.items():
        path = root / doc
        docs[path] = fill(docs.get(path, path.read_text()), name, make(records, selection), doc)
    return {**out, **docs}


def numbers(text: str) -> list[float]:
    """The numbers in a text, signs included (a true minus too): what a quoted figure holds."""
    return [float(m.replace(MINUS, "-")) for m in re.findall(rf"[+\-{MINUS}]?\d+(?:\.\d+)?", text.replace(",", ""))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ix = sub.add_parser("index", help="regenerate docs/results/README.md and the documents' tables")
    ix.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated file is out of date")
    kp = sub.add_parser("keep", help="copy a run's record directory to docs/results/<experiment>")
    kp.add_argument("src", type=Path)
    kp.add_argument("experiment")
    args = ap.parse_args(argv)
    if args.cmd == "keep":
        try:
            print(keep_dir(args.src, args.experiment))
        except (ValueError, OSError) as e:  # a record from elsewhere: say why, copy nothing
            print(f"records keep: {e}", file=sys.stderr)
            return 2
        return 0
    stale = []
    for path, text in render().items():
        if not path.is_file() or path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    n = len(load_all())
    rel = [str(p.relative_to(ROOT)) for p in stale]
    if args.check:
        print(f"{n} records; out of date: {', '.join(rel) or 'nothing'}")
        return 1 if stale else 0
    print(f"{n} records; rewrote: {', '.join(rel) or 'nothing (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
