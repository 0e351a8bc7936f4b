"""What a resume must find unchanged: a run's identity, recorded in each of its checkpoints.

A checkpoint's state is shaped by its run's settings: the actor's weights and optimizer by the
model; the data loader's position by the training rows and their order (the train files'
content, data.train_data_num, data.shuffle, data.seed, data.balance_by) and by the prompts the
tokenizer, the protocol and the template kept (data.max_prompt_length); each batch by
data.train_batch_size and rollout.n; the token ids of the rollouts in flight by the tokenizer
and the protocol; their groups by rollout.n; and whether any are in flight at all by
trainer.mode. Resumed under others it went wrong late and quietly: a group of 4 taken as one
of 2 hung `take()` or failed mid-step, a sync resume of an async checkpoint skipped the
prompts in flight, another tokenizer would continue token ids that spell other text, another
train file of the same size or another max_prompt_length went on from a position in other
prompts. So each checkpoint records `train_identity(cfg)`, and a resume compares
(`problems`): `check_resume` refuses a checkpoint of another identity in one line.

The model, its tokenizer and the train files are known by content, not by path: a directory
moved elsewhere holds the same data, and one prepared again in the same place may not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GROUP_SIZE = "actor_rollout_ref.rollout.n"
"""The samples per prompt: a group's size."""
MODE = "trainer.mode"
TOKENIZER = "tokenizer"
MODEL = "model"
DATA = "data.train_files"
SETTINGS = (GROUP_SIZE, MODE, "actor_rollout_ref.rollout.protocol", "actor_rollout_ref.rollout.chat_template",
            "data.train_batch_size", "data.max_prompt_length", "data.train_data_num", "data.shuffle", "data.seed",
            "data.balance_by")
"""The settings a checkpoint's state depends on (module docstring), compared as values: None
(data.train_data_num: all rows) is a value like any other."""
FINGERPRINTS = (TOKENIZER, MODEL, DATA)
"""Contents known by a hash: None (nothing to hash there) is not judged."""
CHUNK = 1 << 20

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


def data_fingerprint(paths: list[str]) -> str | None:
    """sha256 of the bytes of the files `paths` name, in their order (a directory: its files by
    relative name), read in 1 MiB chunks: a 1 GB parquet costs about a second and no memory. The
    names of the paths are not hashed (moved files are the same data); None when one is missing."""
    h = hashlib.sha256()
    for path in map(Path, paths):
        if not path.exists():
            return None
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        h.update(f"{len(files)}\0".encode())
        for f in files:
            h.update(f"{f.relative_to(path).as_posix() if path.is_dir() else ''}\0{f.stat().st_size}\0".encode())
            with f.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
    return h.hexdigest()


def _setting(tree: Any, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted setting in a config object or its plain dict."""
    for part in dotted.split("."):
        if isinstance(tree, Mapping):
            if part not in tree:
                return False, None
            tree = tree[part]
        elif hasattr(tree, part):
            tree = getattr(tree, part)
        else:
            return False, None
    return True, tree


def train_identity(cfg: Any) -> dict[str, Any]:
    """The identity of an RL run under `cfg` (a TrainConfig)."""
    model = cfg.actor_rollout_ref.model.path
    return {**{key: _setting(cfg, key)[1] for key in SETTINGS}, TOKENIZER: tokenizer_fingerprint(model),
            MODEL: model_fingerprint(model), DATA: data_fingerprint(cfg.data.train_files)}


def saved_identity(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's identity, from its trainer state; what that does not record (a checkpoint
    saved before identities, or before the data and the batch settings were part of one) is
    known by the settings of its config.yaml (its model, tokenizer and data not at all)."""
    import yaml

    from agent_rl.training.checkpoint import CheckpointManager

    state = CheckpointManager.read_state(checkpoint)
    try:
        config = yaml.safe_load((Path(checkpoint) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        config = None
    settings: dict[str, Any] = {}
    if isinstance(config, dict):
        settings = {key: value for key in SETTINGS for found, value in [_setting(config, key)] if found}
        settings.setdefault(MODE, "sync")  # saved before trainer.mode existed: sync
    return {**settings, **dict(state.get("identity") or {})}


def problems(saved: Mapping[str, Any], current: Mapping[str, Any], model_path: str, in_flight: int) -> list[str]:
    """What differs between a checkpoint's identity and this run's, one phrase each (what one of
    them does not record is not judged). `in_flight`: the prompts the checkpoint holds in flight."""
    out = []
    for key in (*SETTINGS, *FINGERPRINTS):
        if key not in saved or key not in current:
            continue
        old, new = saved[key], current[key]
        if old == new or (key in FINGERPRINTS and (old is None or new is None)):
            continue
        if key == DATA:
            out.append("data.train_files do not hold the rows the checkpoint was trained on (their content differs)")
        elif key == TOKENIZER:
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


class ResumeMismatch(ValueError):
    """The checkpoint a run would resume was saved under settings its state depends on that
    the config changed (`problems`)."""


def check_resume(cfg: Any, identity: dict | None = None, run_dir: str | Path | None = None) -> None:
    """Raise, in one line, when the checkpoint `cfg` (a TrainConfig) would resume (in `run_dir`,
    default trainer.default_local_dir) cannot continue under `cfg`: ResumeMismatch naming each
    setting that differs from the checkpoint's (rollout.n, trainer.mode, the model, its
    tokenizer, the train files' content, the settings that make a batch; train_identity(cfg)
    unless `identity` is given), or a ValueError naming the file and field of a bad
    rollouts.json. agent-rl-train calls it before the retriever, Ray and the engine start;
    RayTrainer again (runs started in-process)."""
    from agent_rl.training.checkpoint import STATE, CheckpointManager
    from agent_rl.training.collect import ROLLOUTS, read_rollouts
    from agent_rl.training.run import resume_checkpoint

    trainer_cfg = cfg.trainer
    path = resume_checkpoint(trainer_cfg, CheckpointManager(Path(run_dir or trainer_cfg.default_local_dir) / "checkpoints"))
    if path is None or not (path / STATE).is_file():
        return
    saved = saved_identity(path)
    current = identity if identity is not None else train_identity(cfg)
    n = saved.get(GROUP_SIZE) or current[GROUP_SIZE]
    groups = read_rollouts(path / ROLLOUTS, n)["groups"] if (path / ROLLOUTS).is_file() else []
    found = problems(saved, current, cfg.actor_rollout_ref.model.path, len(groups))
    if found:
        raise ResumeMismatch(f"cannot resume {path}: {'; '.join(found)}. Resume with the checkpoint's settings, or "
                             f"start a new run (another trainer.default_local_dir, or trainer.resume_mode=disable, "
                             f"which moves this run aside)")
