"""Runs of other settings and of older versions: a workdir's finished stages are reused and an
earlier run's rows counted (`--with`) only under the settings that made them, each compared as
recorded, or where a file predates a setting, as that version ran (LEGACY)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.rl_vs_sft.settings import Settings

SETTINGS = {"shared": ("kb_seed", "kb_kind", "demos", "demo_args", "eval_limit", "val_n"),
            "arms": ("start_steps", "start_rule", "start_every", "minutes", "clock", "val_every", "overrides",
                     "best_of_val", "sft_val_every", "sft_lr", "sft_epochs", "rft_lr", "log_batches"),
            "curve": ("start_curve",),
            "choice": ("start_steps", "start_rule", "start_every", "minutes", "clock", "val_every", "overrides",
                       "sft_val_every")}
"""What a workdir's finished stages depend on, by mode: a re-run may reuse them only under the same.
Which arms run is not among them: an arm's stages do not depend on the others'."""
LEGACY = {"kb_kind": "standard", "clock": "training steps", "sft_lr": None, "sft_epochs": None, "rft_lr": None,
          "log_batches": False, "start_rule": "steps", "start_every": 10}
"""What a workdir or JSON written before a setting existed ran with (the clock then counted the
training steps only): compared as if it had recorded it."""

MERGED = tuple(k for k in SETTINGS["shared"] + SETTINGS["arms"] if k != "kb_seed")
"""The settings an earlier run's rows must share to count with this run's (`--with`): those its
arms depend on but the KB seed (cells of other KBs count together), each checked where the file
records it or its group (LEGACY; older files lack demos, val_n, val_every)."""


def recorded(before: dict, keys: tuple[str, ...]) -> dict:
    """The values of `keys` a settings file (or a run's JSON) records: what it holds, and where it
    holds a setting of a group (SETTINGS) written before another of it existed, that one's LEGACY."""
    out = {}
    for group in SETTINGS.values():
        if any(k in before for k in group):
            out.update({k: before.get(k, LEGACY.get(k)) for k in group if k in before or k in LEGACY})
    return {k: v for k, v in out.items() if k in keys}


def host_kind_of(host: str) -> str:
    """report.host_kind's words for a hardware line (`data_prep.hardware.hardware_line`)."""
    from agent_rl.demo.report import host_kind

    gpu = host.split(" gpu=", 1)[1].split(" native_bf16=", 1)[0] if " gpu=" in host else "none"
    return host_kind({"gpu": None if gpu == "none" else gpu, "native_bf16": " native_bf16=yes" in host})


def earlier_rows(paths: list[str], s: Settings, kind: str) -> list[dict]:
    """The rows of earlier runs' JSON (`--with`), each with its KB seed and the hardware line it ran
    under: only from runs of the same settings (MERGED) on this host kind, and none of a cell (KB
    seed, seed) given twice; otherwise a SystemExit naming what differs, before anything runs."""
    rows: list[dict] = []
    seen = {(k, seed) for k in s.kb_seed for seed in s.seeds}
    for p in paths:
        e = json.loads(Path(p).read_text())
        differ = [f"{k} {v!r} there, {getattr(s, k)!r} here" for k, v in recorded(e, MERGED).items()
                  if v != getattr(s, k)]
        if host_kind_of(e["host"]) != kind:
            differ.append(f"host kind {host_kind_of(e['host'])!r} there, {kind!r} here")
        if differ:
            raise SystemExit(f"rl_vs_sft: --with {p} was made with other settings ({', '.join(differ)})")
        for r in e["rows"]:
            cell = (r.get("kb_seed", e.get("kb_seed")), r["seed"])  # a file of one KB kept its seed once
            if cell in seen:
                raise SystemExit(f"rl_vs_sft: KB {cell[0]} seed {cell[1]} of --with {p} is counted twice "
                                 "(in this run's cells or in another --with file)")
            seen.add(cell)
            rows.append({**r, "kb_seed": cell[0], "host": r.get("host", e["host"])})
    return rows


def workdir_settings(s: Settings, kb_seed: int) -> dict:
    """What KB `kb_seed`'s workdir records in its settings.json for this command's mode: the
    settings its stages depend on (SETTINGS), its one KB seed among them."""
    return {k: kb_seed if k == "kb_seed" else getattr(s, k) for k in SETTINGS["shared"] + SETTINGS[s.mode]}


def check_settings(work: Path, s: Settings, kb_seed: int) -> None:
    """A re-run reuses every finished stage, so it must ask for what made them: a workdir made
    with other settings (another start, other minutes, another KB, another clock) is refused,
    naming them, before anything runs; its files are left as they are. The first run records its
    settings (`workdir_settings`: `kb_seed`, the workdir's one KB)."""
    now = workdir_settings(s, kb_seed)
    f = work / "settings.json"
    before = json.loads(f.read_text()) if f.exists() else {}
    differ = {k: (v, now[k]) for k, v in recorded(before, tuple(now)).items() if v != now[k]}
    if differ:
        said = ", ".join(f"{k} {a!r} there, {b!r} asked" for k, (a, b) in differ.items())
        raise SystemExit(f"rl_vs_sft: {work} holds stages made with other settings ({said}); "
                         "give another --workdir (or the same settings to go on)")
    work.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({**before, **now}, indent=1) + "\n")
