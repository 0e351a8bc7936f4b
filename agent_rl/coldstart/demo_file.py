"""The demonstration file: parquet rows of token ids + loss mask (what `agent-rl-sft` reads),
with the settings they were built with in the file's metadata (checked by SFT).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_rl.config import TrainConfig
from agent_rl.types import Trajectory
from data_prep.atomic import atomic_path
from data_prep.io import Report, iter_parquet

META_KEY = b"agent_rl.demos"
"""Parquet metadata key holding the settings the demonstrations were built with (JSON)."""


def settings_of(cfg: TrainConfig, tokenizer_path: str, **extra: Any) -> dict:
    """What a demonstration file depends on (stored in its metadata; SFT checks it)."""
    r = cfg.actor_rollout_ref.rollout
    return {
        "tokenizer": str(tokenizer_path),
        "template": r.template,
        "max_prompt_length": cfg.data.max_prompt_length,
        "max_response_length": cfg.data.max_response_length,
        "max_obs_length": cfg.data.max_obs_length,
        "max_tokens_per_turn": r.max_tokens_per_turn,
        "topk": cfg.retriever.topk,
        "max_turns": cfg.max_turns,
        "protocol": r.protocol,
        "tools": [t.name for t in r.tools],
        **extra,
    }


def write_demos(rows: list[dict], path: str | Path, settings: dict) -> None:
    """Parquet with the settings in its metadata, written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.string()), ("question", pa.string()), ("golden_answers", pa.list_(pa.string())),
        ("data_source", pa.string()), ("kind", pa.string()), ("answer", pa.string()),
        ("queries", pa.list_(pa.string())), ("segments", pa.list_(pa.string())), ("num_searches", pa.int32()),
        ("num_obs_truncated", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())), ("prompt_text", pa.string()), ("response_text", pa.string()),
    ], metadata={META_KEY: json.dumps(settings).encode()})
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_settings(path: str | Path) -> dict:
    """The `agent_rl.coldstart.demos` metadata of a demonstration file ({} if absent)."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[META_KEY]) if META_KEY in meta else {}


def read_demos(path: str | Path, report: Report | None = None) -> list[Trajectory]:
    """Demonstrations as `Trajectory` records (ids and mask as stored: no re-tokenisation).

    A row that cannot be used (empty ids, a bad mask, text that is not UTF-8) is recorded in
    `report` (``file:row N (id X): reason``) and left out; without a report such rows raise
    a ValueError naming them (SFT, like training, drops nothing silently)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demonstration file not found: {path}")
    cols = ("id", "prompt_ids", "response_ids", "loss_mask", "response_text", "golden_answers",
            "data_source", "question", "num_searches")
    schema = pq.read_schema(path)
    missing = [c for c in cols if c not in schema.names]
    if missing:
        raise ValueError(f"{path}: not a demonstration file (missing columns {missing}; build it with "
                         "`agent-rl-prep demos`)")
    found = report if report is not None else Report()
    out = []
    for where, r in iter_parquet(path, found, columns=list(cols)):
        n = len(r["response_ids"] or [])
        mask = r["loss_mask"] or []
        why = None
        if not r["prompt_ids"] or not n:
            why = "empty prompt_ids or response_ids"
        elif len(mask) != n or any(m not in (0, 1) for m in mask) or not any(mask):
            why = f"loss_mask must be 0/1, as long as response_ids ({n}), with a 1"
        if why:
            found.skip(f"{where} (id {r['id']})", why)
            continue
        out.append(Trajectory(
            prompt_ids=list(r["prompt_ids"]), response_ids=list(r["response_ids"]), loss_mask=list(mask),
            rollout_logprobs=[0.0] * n, finish_reason="answer", response_text=r["response_text"] or "",
            data_source=r["data_source"] or "", golden_answers=list(r["golden_answers"] or []),
            question=r["question"] or "", num_searches=int(r["num_searches"] or 0),
            num_turns=int(r["num_searches"] or 0) + 1,
        ))
    if report is None and found.problems:
        raise ValueError(f"{path}: {found.skipped} unusable demonstration rows:\n  " + "\n  ".join(found.problems[:5]))
    return out


