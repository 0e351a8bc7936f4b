"""Training prompts: QA rows read through `data_prep.qa.read_qa`, and a resumable loader.

The loader's whole state is its position `(epoch, index)`: the order of epoch `e` is a
permutation drawn from `seed + e`, so a run resumed from a checkpoint consumes exactly the
prompts an uninterrupted run would have (tests/agent_rl/test_data.py, test_trainer.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from data_prep.io import Report


@dataclass(frozen=True)
class Prompt:
    """One training question (a row of the QA parquet)."""

    id: str
    question: str
    golden_answers: list[str] = field(default_factory=list)
    data_source: str = ""


def load_prompts(files: list[str], max_rows: int | None = None, report: Report | None = None) -> list[Prompt]:
    """Read QA files (any format `data_prep.qa.read_qa` understands, Search-R1's parquet
    included) into `Prompt`s. read_qa rejects malformed rows with an error naming the file,
    unless `report` is given (evaluation): they are then recorded there and skipped.
    `max_rows` keeps the first N (Search-R1 `train_data_num`)."""
    from data_prep.qa import read_qa  # agent_rl may use data_prep readers (docs/architecture.md)

    prompts: list[Prompt] = []
    for path in files:
        if not Path(path).exists():
            raise FileNotFoundError(f"data file not found: {path}")
        for row in read_qa(path, report).to_dict("records"):
            prompts.append(
                Prompt(
                    id=str(row["id"]),
                    question=str(row["question"]),
                    golden_answers=[str(a) for a in row["golden_answers"]],
                    data_source=str(row.get("data_source") or Path(path).stem),
                )
            )
    if max_rows is not None:
        prompts = prompts[:max_rows]
    if not prompts:
        raise ValueError(f"no QA rows in {files}")
    return prompts


def drop_overlong(prompts: list[Prompt], length: Callable[[Prompt], int], max_len: int) -> list[Prompt]:
    """Prompts whose token length (`length(p)`, the rollout's own template) fits `max_len`
    (`data.max_prompt_length`, veRL's filter_overlong_prompts); says how many were dropped."""
    kept = [p for p in prompts if length(p) <= max_len]
    if len(kept) < len(prompts):
        print(f"[data] dropped {len(prompts) - len(kept)} of {len(prompts)} prompts longer than {max_len} tokens")
    if not kept:
        raise ValueError(f"every prompt is longer than data.max_prompt_length={max_len} tokens")
    return kept


@dataclass
class LoaderPosition:
    """Where the loader is: epoch number and index into that epoch's order."""

    epoch: int = 0
    index: int = 0


class PromptLoader:
    """Endless, seeded, resumable stream of prompts, taken in batches.

    `next_batch()` returns `batch_size` prompts; `take(n)` returns any number (used to
    over-sample when group filtering drops prompts). A batch that crosses an epoch boundary
    continues into the next epoch's order, so no prompt is skipped and batches stay full.
    """

    def __init__(self, prompts: list[Prompt], batch_size: int, shuffle: bool = True, seed: int = 1):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size > len(prompts):
            raise ValueError(f"batch_size {batch_size} exceeds the {len(prompts)} training prompts")
        self.prompts = prompts
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pos = LoaderPosition()
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(len(prompts))

    @property
    def steps_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            n = len(self.prompts)
            rng = np.random.default_rng(self.seed + epoch)
            self._order = rng.permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def take(self, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        while len(out) < n:
            order = self._epoch_order(self.pos.epoch)
            k = min(n - len(out), len(order) - self.pos.index)
            out.extend(self.prompts[i] for i in order[self.pos.index : self.pos.index + k])
            self.pos.index += k
            if self.pos.index >= len(order):
                self.pos = LoaderPosition(self.pos.epoch + 1, 0)
        return out

    def next_batch(self) -> list[Prompt]:
        return self.take(self.batch_size)

    def state_dict(self) -> dict:
        return {**asdict(self.pos), "seed": self.seed, "num_prompts": len(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts", len(self.prompts)) != len(self.prompts) or state.get("seed", self.seed) != self.seed:
            # A different dataset or seed would silently change the order; say so.
            print(
                f"[data] warning: checkpoint loader state was for {state.get('num_prompts')} prompts / "
                f"seed {state.get('seed')}, now {len(self.prompts)} / {self.seed}: the data order differs"
            )
        self.pos = LoaderPosition(int(state["epoch"]), int(state["index"]))
