"""What a resume must find unchanged: a run's identity, recorded in each of its checkpoints.

A checkpoint's state is shaped by its run's settings: the actor's weights and optimizer by the
model; the data loader's position by the prompts the tokenizer kept (data.max_prompt_length);
the token ids of the rollouts in flight by the tokenizer; their groups by rollout.n; and
whether any are in flight at all by trainer.mode. Resumed under others it went wrong late and
quietly: a group of 4 taken as one of 2 hung `take()` or failed mid-step, a sync resume of an
async checkpoint skipped the prompts in flight, another tokenizer would continue token ids
that spell other text. So each checkpoint records `train_identity(cfg)`, and a resume
compares (`problems`).

The model and its tokenizer are known by content, not by path: a model directory moved
elsewhere is the same model, and one prepared again in the same place may not be.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

N = "actor_rollout_ref.rollout.n"
MODE = "trainer.mode"
TOKENIZER = "tokenizer"
MODEL = "model"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
"""The files that decide how text becomes token ids (and the chat template: the prompts' ids)."""
CONFIG_NOISE = ("transformers_version", "_name_or_path", "torch_dtype", "dtype")
"""config.json keys a re-save by another transformers version changes without changing the
model (the dtype shows in the weights' sizes)."""
WEIGHT_SAMPLES, WINDOW = 16, 4096
"""Weights are known by their sizes, their first window (the safetensors header: names, shapes,
dtypes) and 16 windows spread over each file: a fine-tune changes every tensor, and reading
all of a 7B model's 15 GB would add a minute to every start."""


def tokenizer_fingerprint(model_path: str | Path) -> str | None:
    """sha256 of the tokenizer files in `model_path` (None: it has none)."""
    h, found = hashlib.sha256(), False
    for name in TOKENIZER_FILES:
        f = Path(model_path) / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
            found = True
    return h.hexdigest() if found else None


def model_fingerprint(model_path: str | Path) -> str | None:
    """sha256 of the model's config.json (without CONFIG_NOISE) and a sample of its weight
    files (see WEIGHT_SAMPLES); None when `model_path` has no config.json."""
    path = Path(model_path)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    h = hashlib.sha256(json.dumps({k: v for k, v in config.items() if k not in CONFIG_NOISE}, sort_keys=True).encode())
    for f in sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            for i in range(WEIGHT_SAMPLES + 1):
                fh.seek(size * i // (WEIGHT_SAMPLES + 1))
                h.update(fh.read(WINDOW))
    return h.hexdigest()


def train_identity(cfg: Any) -> dict[str, Any]:
    """The identity of an RL run under `cfg` (a TrainConfig)."""
    model = cfg.actor_rollout_ref.model.path
    return {N: cfg.actor_rollout_ref.rollout.n, MODE: cfg.trainer.mode,
            TOKENIZER: tokenizer_fingerprint(model), MODEL: model_fingerprint(model)}


def saved_identity(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's identity, from its trainer state; one saved before identities were
    recorded is known by the settings of its config.yaml (its model and tokenizer not at all)."""
    import yaml

    from agent_rl.training.checkpoint import CheckpointManager

    state = CheckpointManager.read_state(checkpoint)
    if "identity" in state:
        return dict(state["identity"])
    try:
        config = yaml.safe_load((Path(checkpoint) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        config = None
    if not isinstance(config, dict):
        return {}
    return {N: config.get("actor_rollout_ref", {}).get("rollout", {}).get("n"),
            MODE: config.get("trainer", {}).get("mode", "sync")}  # saved before trainer.mode existed: sync


def problems(saved: Mapping[str, Any], current: Mapping[str, Any], model_path: str, in_flight: int) -> list[str]:
    """What differs between a checkpoint's identity and this run's, one phrase each (what one of
    them does not record is not judged). `in_flight`: the prompts the checkpoint holds in flight."""
    out = []
    for key in (N, MODE, TOKENIZER, MODEL):
        old, new = saved.get(key), current.get(key)
        if old is None or new is None or old == new:
            continue
        if key == TOKENIZER:
            out.append(f"the tokenizer of actor_rollout_ref.model.path={model_path} is not the checkpoint's "
                       f"(its files differ)")
        elif key == MODEL:
            out.append(f"actor_rollout_ref.model.path={model_path} is not the model the checkpoint was trained from "
                       f"(its config or weights differ)")
        elif key == MODE and new == "sync" and in_flight:
            out.append(f"trainer.mode=sync, the checkpoint's is {old}: it holds {in_flight} prompts in flight that "
                       f"sync would skip")
        else:
            out.append(f"{key}={new}, the checkpoint's is {old}")
    return out
