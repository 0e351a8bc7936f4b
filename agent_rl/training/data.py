"""Training prompts: QA rows read through `data_prep.qa.read_qa` (an RL run's: `load_train_prompts`;
the paths it reads: `run_inputs`), and a resumable loader.

The loader's whole state is its position `(epoch, index)`: the order of epoch `e` is a
permutation drawn from `seed + e`, so a run resumed from a checkpoint consumes exactly the
prompts an uninterrupted run would have (tests/agent_rl/test_data.py, test_trainer.py).

Balanced batches (`data.balance_by`, a QA column such as `data_source` or the knowledge base's
`kind`): the epoch's order is stratified, each stratum shuffled on its own and the strata
interleaved in their shares of the data, so every run of `train_batch_size` prompts holds each
stratum within a prompt or two of its share. A plain shuffle can draw a step of one kind: from
the demo's mix (40% single-hop, 35% bridge, 25% comparison), seed 1's fourth batch of 8 had no
bridge question, and that GRPO step took the bridge questions' agent EM from 70.7 to 58.7.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from data_prep.io import Report

if TYPE_CHECKING:
    from agent_rl.config import TrainConfig


@dataclass(frozen=True)
class Prompt:
    """One training question (a row of the QA parquet)."""

    id: str
    question: str
    golden_answers: list[str] = field(default_factory=list)
    data_source: str = ""
    stratum: str = ""
    """Its value of the `balance_by` column (balanced batches); "" without one."""


def load_prompts(files: list[str], max_rows: int | None = None, report: Report | None = None,
                 balance_by: str | None = None) -> list[Prompt]:
    """Read QA files (any format `data_prep.qa.read_qa` understands, Search-R1's parquet
    included) into `Prompt`s. read_qa rejects malformed rows with an error naming the file,
    unless `report` is given (evaluation): they are then recorded there and skipped.
    `max_rows` keeps the first N (Search-R1 `train_data_num`). `balance_by` names the column
    each prompt's `stratum` comes from (data_source defaults to the file's name)."""
    from data_prep.qa import read_qa  # agent_rl may use data_prep readers (docs/architecture.md)

    prompts: list[Prompt] = []
    for path in files:
        if not Path(path).exists():
            raise FileNotFoundError(f"data file not found: {path}")
        df = read_qa(path, report)
        if balance_by and balance_by != "data_source" and balance_by not in df.columns:
            raise TrainDataError(f"data.balance_by={balance_by!r}: {path} has no such column "
                             f"(columns: {', '.join(map(str, df.columns))}); data.balance_by=null trains "
                             "on a plain shuffle")
        for row in df.to_dict("records"):
            source = str(row.get("data_source") or Path(path).stem)
            prompts.append(
                Prompt(
                    id=str(row["id"]),
                    question=str(row["question"]),
                    golden_answers=[str(a) for a in row["golden_answers"]],
                    data_source=source,
                    stratum=("" if not balance_by else source if balance_by == "data_source" else str(row[balance_by])),
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


def load_train_prompts(cfg: TrainConfig) -> list[Prompt]:
    """Training prompts without those longer than data.max_prompt_length tokens, measured
    with the rollout's own prompt template and tokenizer."""
    from transformers import AutoTokenizer

    from agent_rl.rollout.protocol import protocol_for

    tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    rcfg = cfg.actor_rollout_ref.rollout
    protocol = protocol_for(rcfg, tok)  # MCP tools' schemas are not known here: built-ins only
    prompts = load_prompts(cfg.data.train_files, cfg.data.train_data_num, balance_by=cfg.data.balance_by)
    return drop_overlong(prompts, lambda p: len(protocol.prompt_ids(tok, p.question, rcfg.template)), cfg.data.max_prompt_length)


def run_inputs(cfg: TrainConfig) -> dict[str, str]:
    """The paths an RL run reads (config key -> path): a new run never moves them aside."""
    d = cfg.data
    paths = {"actor_rollout_ref.model.path": cfg.actor_rollout_ref.model.path, "critic.model_path": cfg.critic.model_path}
    paths.update({f"data.train_files[{i}]": f for i, f in enumerate(d.train_files)})
    paths.update({f"data.val_files[{i}]": f for i, f in enumerate(d.val_files)})
    return {k: v for k, v in paths.items() if v}


class TrainDataError(ValueError):
    """The training data cannot make the run's batches (a column data.balance_by names is missing,
    fewer prompts than a batch): the user's data, said in one line by agent-rl-train."""


class TooFewPrompts(TrainDataError):
    """Fewer training prompts than one batch."""


@dataclass
class LoaderPosition:
    """Where the loader is: epoch number and index into that epoch's order."""

    epoch: int = 0
    index: int = 0


def stratified_order(strata: list[str], rng: np.random.Generator | None) -> np.ndarray:
    """A permutation of range(len(strata)) that interleaves the strata in their shares: each
    stratum's indices in random order (`rng`; file order without one), and position t taken
    by the stratum furthest behind its share of the first t + 1, so every prefix holds each
    stratum within one of its share and every window within two."""
    keys = sorted(set(strata))
    members = [np.flatnonzero(np.asarray(strata, dtype=object) == k) for k in keys]
    if rng is not None:
        members = [rng.permutation(m) for m in members]
    n = len(strata)
    taken = [0] * len(keys)
    order = np.empty(n, dtype=np.int64)
    for t in range(n):
        k = max(range(len(keys)), key=lambda j: ((t + 1) * len(members[j]) / n - taken[j], -j))
        order[t] = members[k][taken[k]]
        taken[k] += 1
    return order


class PromptLoader:
    """Endless, seeded, resumable stream of prompts, taken in batches.

    `next_batch()` returns `batch_size` prompts; `take(n)` returns any number (used to
    over-sample when group filtering drops prompts). A batch that crosses an epoch boundary
    continues into the next epoch's order, so no prompt is skipped and batches stay full.
    `balanced`: each epoch's order is `stratified_order` of the prompts' `stratum`.
    """

    def __init__(self, prompts: list[Prompt], batch_size: int, shuffle: bool = True, seed: int = 1,
                 balanced: bool = False):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size > len(prompts):
            raise TooFewPrompts(f"data.train_batch_size {batch_size} exceeds the {len(prompts)} training prompts "
                                "(data.train_files, after overlong and malformed rows): lower it or give more questions")
        self.prompts = prompts
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.balanced = balanced
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
            if self.balanced:
                self._order = stratified_order([p.stratum for p in self.prompts], rng if self.shuffle else None)
            else:
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
        return {**asdict(self.pos), "seed": self.seed, "num_prompts": len(self.prompts), "balanced": self.balanced}

    def load_state_dict(self, state: dict) -> None:
        if (state.get("num_prompts", len(self.prompts)) != len(self.prompts) or state.get("seed", self.seed) != self.seed
                or state.get("balanced", False) != self.balanced):
            # A different dataset, seed or balancing would silently change the order; say so.
            print(
                f"[data] warning: checkpoint loader state was for {state.get('num_prompts')} prompts / "
                f"seed {state.get('seed')} / balanced {state.get('balanced', False)}, now {len(self.prompts)} / "
                f"{self.seed} / {self.balanced}: the data order differs"
            )
        self.pos = LoaderPosition(int(state["epoch"]), int(state["index"]))
