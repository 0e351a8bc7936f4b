"""A run's record (docs/results/README.md): the report card a benchmark or `make demo` writes
beside its output, so that every figure a document quotes can be traced to the command, commit,
host and settings that made it (STYLE habit 16; nanochat's report.py builds its report the
same way from what each stage wrote).

A record is a directory holding `record.json` and the files it names (the full JSON of the run,
its PNGs). `write_record` writes one; `read_record` reads one; `host_kind` is the words every
table groups figures by. Standard library only: the demo's report and `benchmarks/records.py`
(which indexes records and regenerates the docs' tables) both use it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORD = "record.json"
"""The file that makes a directory a record."""
MINUS = "\u2212"
"""Figures carry a true minus, as the documents print them."""


def pts(x: float) -> str:
    """A fraction as signed points: 0.04 -> +4.0, -0.05 -> \u22125.0."""
    return f"{100 * x:+.1f}".replace("-", MINUS)


def paired(d: dict) -> str:
    """A paired difference (`agent_rl.evaluation.report.paired_difference`) with its 95% interval,
    in points: +4.0 [\u22121.0, +9.0]."""
    return f"{pts(d['diff'])} [{pts(d['ci_low'])}, {pts(d['ci_high'])}]"


@dataclass
class Record:
    """What a run says about itself. Figures are strings as the docs show them (`+4.0 to +9.0
    (3 seeds)`), so a table quotes them verbatim and a test can find every quoted number here."""

    experiment: str
    """The record's name: its directory under docs/results once kept."""
    title: str
    """One line: what was measured."""
    benchmark: str
    """What ran: `benchmarks/<name>.py`, `make demo`, `scripts/real_data.sh`."""
    command: str
    """The command line that made it (environment switches first)."""
    commit: str
    """`git rev-parse --short HEAD` where it ran (with `-dirty` for uncommitted changes)."""
    host: str
    """The hardware line (`data_prep.hardware.hardware_line`)."""
    host_kind: str
    """`host_kind(host)`: native bf16, no native bf16 (fp32), or GPU (its name)."""
    headline: dict[str, str]
    """The figures a document may quote, by label; the first is the record's main figure."""
    settings: dict = field(default_factory=dict)
    """The settings the figures depend on (the command's arguments, the KB seed...)."""
    files: list[str] = field(default_factory=list)
    """The full JSON and PNGs beside record.json (names relative to its directory)."""
    date: str = ""
    """When the record was written (UTC, YYYY-MM-DD)."""
    note: str = ""
    """Anything a reader needs to weigh the figures (e.g. where a transcribed figure came from)."""


def host_kind(host: str) -> str:
    """The kind of host a figure holds for, from a hardware line: a GPU (by name; its CPU's bf16
    does not matter there), else a CPU with or without native bf16. The two CPU kinds train
    different numerics, so their figures are never pooled."""
    gpu = host.split(" gpu=", 1)[1].split(" native_bf16=", 1)[0] if " gpu=" in host else "none"
    if gpu != "none":
        return f"GPU ({gpu})"
    return "native bf16" if " native_bf16=yes" in host else "no native bf16 (fp32)"


def current_commit(cwd: Path | None = None) -> str:
    """The short commit of the checkout the run came from, `-dirty` when it had uncommitted
    changes to tracked files, or "unknown" outside a git checkout (an installed package)."""
    where = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: `python <script> <args>` (the module form for `-m` runs)."""
    argv = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec, file = getattr(main, "__spec__", None), getattr(main, "__file__", None)
    by_module = spec is not None and spec.name and file and argv and Path(argv[0]).resolve() == Path(file).resolve()
    head = ["python", "-m", spec.name.removesuffix(".__main__")] if by_module else ["python", argv[0]]
    return shlex.join(head + argv[1:])


def write_record(out_dir: Path, *, experiment: str, title: str, benchmark: str, headline: dict[str, str], settings: dict,
                 files: list[Path] = (), command: str | None = None, host: str | None = None,
                 commit: str | None = None, note: str = "") -> Path:
    """Write `out_dir/record.json`, copying each of `files` (the run's full JSON, its PNGs) into
    `out_dir` unless it is already there. The command, host and commit default to this process's.
    Returns the record's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for f in map(Path, files):
        if f.resolve().parent != out_dir.resolve():
            shutil.copy2(f, out_dir / f.name)
        names.append(f.name)
    if host is None:
        from data_prep.hardware import hardware_line

        host = hardware_line()
    rec = Record(experiment=experiment, title=title, benchmark=benchmark, command=command or command_line(),
                 commit=commit or current_commit(), host=host, host_kind=host_kind(host),
                 headline=dict(headline), settings=settings, files=names,
                 date=time.strftime("%Y-%m-%d", time.gmtime()), note=note)
    path = out_dir / RECORD
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(rec), indent=1, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    print(f"[record] {path}: {title}; " + "; ".join(f"{k}: {v}" for k, v in list(rec.headline.items())[:2]),
          file=sys.stderr)
    return path


def read_record(path: Path) -> Record:
    """A record from its directory or its record.json."""
    path = Path(path)
    data = json.loads((path / RECORD if path.is_dir() else path).read_text())
    return Record(**data)
