"""A run's record (docs/results/README.md): the report card a benchmark or `make demo` writes
beside its output, so that every figure a document quotes can be traced to the command, commit,
host and settings that made it (STYLE habit 16; nanochat's report.py builds its report the
same way from what each stage wrote).

A record is a directory holding `record.json` and the files it names (the full JSON of the run,
its PNGs). `write_record` writes one; `read_record` reads one; `host_kind` is the words every
table groups figures by; `redact_record` keeps secrets out of one (the config loader's
`redacted`, imported where it is used). The demo's report and `benchmarks/records.py` (which
indexes records and regenerates the docs' tables) both use it.
"""

from __future__ import annotations

import json
import os
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


SECRET_ENV = {"RETRIEVER_API_KEY": "retriever.api_key"}
"""Environment variables that hold a secret, by the setting they stand for
(`agent_rl.rollout.retrieval_client.API_KEY_ENV`): a command written with its environment
switches first may show one."""


def secrets_in(command: str, settings: object) -> dict[str, list[str]]:
    """The secrets (config SECRETS) that a command line or settings give, by setting: an override
    `retriever.api_key=KEY` (a word of the command, or a text in the settings), a config's own
    section (`{"retriever": {"api_key": KEY}}` anywhere in the settings), `RETRIEVER_API_KEY=KEY`
    before the command, and that variable's value in this process's environment."""
    from agent_rl.config import REDACTED, SECRETS

    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: split where the shell would at least split
        words = command.split()
    found: dict[str, list[str]] = {key: [] for key in SECRETS}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in SECRETS:  # a config (`to_dict`) or a section of one, at any depth
                *sections, name = key.split(".")
                sub: object = node
                for section in sections:
                    sub = sub.get(section) if isinstance(sub, dict) else None
                if isinstance(sub, dict) and isinstance(sub.get(name), str):
                    found[key].append(sub[name])
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)
        elif isinstance(node, str) and "=" in node:
            name, value = node.split("=", 1)
            if name.lstrip("+") in SECRETS:
                found[name.lstrip("+")].append(value)
            elif name in SECRET_ENV:
                found[SECRET_ENV[name]].append(value)

    walk([*words, settings])
    for env, key in SECRET_ENV.items():
        found[key] += [os.environ[env]] if os.environ.get(env) else []
    return {key: [v for v in dict.fromkeys(values) if v and v != REDACTED] for key, values in found.items()}


SHOWN = ("command", "settings", "title", "note")
"""A record's fields that may repeat what was typed (the figures and names are left alone: a
short key's text would otherwise be replaced inside a figure)."""


def redact_record(data: dict, fields: tuple[str, ...] = SHOWN) -> dict:
    """`data` (a record's fields, `asdict(Record)`) with every secret its command or settings give
    (`secrets_in`) replaced by "<redacted>" in `fields`, by the one function that redacts a config
    for loggers and checkpoints (`agent_rl.config.redacted`): a record is kept in the repository."""
    from agent_rl.config import redacted

    shown = {k: data[k] for k in fields if k in data}
    for key, values in secrets_in(data.get("command", ""), data.get("settings", {})).items():
        for value in values:
            *sections, name = key.split(".")
            tree: dict = {"record": shown}
            node = tree
            for section in sections:
                node = node.setdefault(section, {})
            node[name] = value
            shown = redacted(tree)["record"]  # the value, wherever it shows in `shown`, becomes REDACTED
    return {**data, **shown}


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
    data = redact_record(json.loads(json.dumps(asdict(rec), default=str)))
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    print(f"[record] {path}: {data['title']}; " + "; ".join(f"{k}: {v}" for k, v in list(rec.headline.items())[:2]),
          file=sys.stderr)
    return path


def read_record(path: Path) -> Record:
    """A record from its directory or its record.json."""
    path = Path(path)
    data = json.loads((path / RECORD if path.is_dir() else path).read_text())
    return Record(**data)
