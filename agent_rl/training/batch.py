"""`TokenBatch`: the trainer-side tensor view of a list of trajectories, and how it is split.

Layout (one convention everywhere; B sequences, L = longest prompt+response, R = longest
response):

- `input_ids` (B, L) long: prompt then response ids, right-padded with 0 (padding is never
  computed: the workers pack sequences end to end and read only `seq_lens[i]` ids).
- `prompt_lens`, `seq_lens` (B,) long; response length = seq_len - prompt_len >= 1.
- Response-aligned per-token fields are right-padded (B, R) float32 tensors: column j is
  response token j, i.e. `input_ids[i, prompt_lens[i] + j]`; padding holds 0.
  `loss_mask` (1 = sampled token, 0 = observation or padding) and `rollout_logprobs` always
  exist; `old_logprobs`, `ref_logprobs`, `advantages`, `returns`, `values` are None until the
  driver sets them.
- `rewards` (B,) float32, `acc` (B,) float32 (the task metric alone: `Trajectory.acc`),
  `group_ids` (B,) long, `index` (B,) long: position in the batch built by
  `from_trajectories` (kept through `select`, so results of shards and micro-batches can be
  put back in order).

`split_mini_batches`, `micro_batches` and `shard` return sub-batches (views re-trimmed to their
own L and R); with packing, how sequences are grouped changes memory and balance, never the
numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from agent_rl.types import Trajectory

TOKEN_FIELDS = ("loss_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs", "advantages", "returns", "values")
"""Response-aligned (B, R) fields."""


@dataclass
class TokenBatch:
    """Sequences of one training step as padded tensors (layout in the module docstring)."""

    input_ids: torch.Tensor
    prompt_lens: torch.Tensor
    seq_lens: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    acc: torch.Tensor
    group_ids: torch.Tensor
    index: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_trajectories(cls, trajs: list[Trajectory]) -> TokenBatch:
        """Stack trajectories; ValueError naming the trajectory if one cannot be trained on."""
        if not trajs:
            raise ValueError("TokenBatch.from_trajectories: empty list of trajectories")
        for i, t in enumerate(trajs):
            if not t.prompt_ids or not t.response_ids:
                raise ValueError(
                    f"TokenBatch.from_trajectories: trajectory {i} (group {t.group_id}) has "
                    f"{len(t.prompt_ids)} prompt and {len(t.response_ids)} response tokens; both must be > 0"
                )
        b = len(trajs)
        plen = torch.tensor([len(t.prompt_ids) for t in trajs], dtype=torch.long)
        rlen = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.long)
        slen = plen + rlen
        ids = torch.zeros(b, int(slen.max()), dtype=torch.long)
        mask = torch.zeros(b, int(rlen.max()), dtype=torch.float32)
        rlp = torch.zeros_like(mask)
        for i, t in enumerate(trajs):
            ids[i, : slen[i]] = torch.tensor(t.prompt_ids + t.response_ids, dtype=torch.long)
            mask[i, : rlen[i]] = torch.tensor(t.loss_mask, dtype=torch.float32)
            rlp[i, : rlen[i]] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
        return cls(
            input_ids=ids,
            prompt_lens=plen,
            seq_lens=slen,
            loss_mask=mask,
            rollout_logprobs=rlp,
            rewards=torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32),
            acc=torch.tensor([float(t.acc) for t in trajs], dtype=torch.float32),
            group_ids=torch.tensor([t.group_id for t in trajs], dtype=torch.long),
            index=torch.arange(b),
        )

    # ------------------------------------------------------------------ shape helpers
    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_lens(self) -> torch.Tensor:
        """(B,) response tokens per sequence (sampled + observation)."""
        return self.seq_lens - self.prompt_lens

    @property
    def num_tokens(self) -> int:
        """Prompt + response tokens actually computed (no padding)."""
        return int(self.seq_lens.sum())

    def response_valid_mask(self) -> torch.Tensor:
        """(B, R) float: 1 on every response token (sampled or observation), 0 on padding."""
        r = self.loss_mask.shape[1]
        return (torch.arange(r, device=self.loss_mask.device)[None] < self.response_lens[:, None]).float()

    def mask(self, state_masking: bool = True) -> torch.Tensor:
        """(B, R) float mask used by loss, KL and entropy alike.

        state_masking=True (Search-R1): sampled tokens only; False: all response tokens.
        """
        return self.loss_mask if state_masking else self.response_valid_mask()

    # ------------------------------------------------------------------ selection
    def select(self, idx: torch.Tensor | list[int]) -> TokenBatch:
        """Sub-batch of rows `idx` (in that order), trimmed to its own L and R."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        plen, slen = self.prompt_lens[idx], self.seq_lens[idx]
        width = int(slen.max()) if len(idx) else 0
        rwidth = int((slen - plen).max()) if len(idx) else 0
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif f.name == "input_ids":
                out[f.name] = v[idx, :width]
            elif f.name in TOKEN_FIELDS:
                out[f.name] = v[idx, :rwidth]
            else:
                out[f.name] = v[idx]
        return TokenBatch(**out)

    def to(self, device: torch.device | str) -> TokenBatch:
        """All tensors moved to `device`."""
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                     if getattr(self, f.name) is not None}
        )

    def with_fields(self, **fields: torch.Tensor | None) -> TokenBatch:
        """Copy with response-aligned fields set, each checked to be (B, R)."""
        want = tuple(self.loss_mask.shape)
        for name, v in fields.items():
            if name not in TOKEN_FIELDS:
                raise ValueError(f"TokenBatch.with_fields: {name!r} is not a per-token field {TOKEN_FIELDS}")
            if v is not None and tuple(v.shape) != want:
                raise ValueError(f"TokenBatch.with_fields: {name} has shape {tuple(v.shape)}, expected (B, R) = {want}")
        return dataclasses.replace(self, **{k: (None if v is None else v.float()) for k, v in fields.items()})


def concat_rows(parts: list[torch.Tensor], index: list[torch.Tensor], total: int) -> torch.Tensor:
    """Put per-part (b_k, R_k) rows back at positions `index` of a zero (total, max R_k) tensor."""
    width = max((p.shape[1] for p in parts), default=0)
    out = torch.zeros(total, width, dtype=parts[0].dtype if parts else torch.float32)
    for p, ix in zip(parts, index):
        out[ix, : p.shape[1]] = p
    return out


# ----------------------------------------------------------------------------- splitting
def split_mini_batches(
    batch: TokenBatch,
    ppo_mini_batch_size_in_sequences: int,
    shuffle: bool = False,
    seed: int = 0,
    num_mini_batches: int | None = None,
) -> list[TokenBatch]:
    """Mini-batches (one optimizer step each) of about `ppo_mini_batch_size_in_sequences`.

    The number of mini-batches is ceil(B / size) and sizes differ by at most one, so a
    remainder never becomes a tiny, noisy optimizer step of its own. A data-parallel rank
    splitting its shard passes `num_mini_batches` computed from the whole batch, so all
    ranks take the same number of optimizer steps (parts may then be empty).
    """
    size = ppo_mini_batch_size_in_sequences
    if size < 1:
        raise ValueError(f"split_mini_batches: mini-batch size must be >= 1, got {size}")
    b = len(batch)
    order = torch.randperm(b, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(b)
    n = num_mini_batches if num_mini_batches is not None else max(1, -(-b // size))
    return [batch.select(part) for part in torch.tensor_split(order, n)]


def micro_batches(
    batch: TokenBatch, use_dynamic_bsz: bool, max_token_len: int, micro_batch_size: int
) -> list[TokenBatch]:
    """Micro-batches for one forward/backward each (gradients accumulate over them).

    use_dynamic_bsz: bins of at most `max_token_len` prompt+response tokens, filled
    first-fit-decreasing (fewest bins; a sequence longer than the budget gets a bin of its
    own). Otherwise chunks of `micro_batch_size` sequences, longest first so neighbours have
    similar lengths. Sequences are packed, so this decides memory, not results.
    """
    if len(batch) == 0:
        return []
    lens = batch.seq_lens.tolist()
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    if not use_dynamic_bsz:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batches: micro_batch_size must be >= 1, got {micro_batch_size}")
        return [batch.select(order[i : i + micro_batch_size]) for i in range(0, len(order), micro_batch_size)]
    if max_token_len < 1:
        raise ValueError(f"micro_batches: max_token_len must be >= 1, got {max_token_len}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for k, free in enumerate(room):
            if lens[i] <= free:
                bins[k].append(i)
                room[k] -= lens[i]
                break
        else:
            bins.append([i])
            room.append(max_token_len - lens[i])
    return [batch.select(b) for b in bins]


def shard_indices(seq_lens: list[int], rank: int, world_size: int) -> list[int]:
    """Rows for `rank`: longest-first greedy onto the rank with the fewest tokens.

    Deterministic (every rank computes the same assignment); token counts differ by at most
    one sequence's length. Sorted, so a shard keeps the batch order.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} outside world of size {world_size}")
    load = [0] * world_size
    mine = []
    for i in sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        load[r] += seq_lens[i]
        if r == rank:
            mine.append(i)
    return sorted(mine)


def shard(batch: TokenBatch, rank: int, world_size: int) -> TokenBatch:
    """This rank's part of `batch` for data parallelism, balanced by token count."""
    return batch.select(shard_indices(batch.seq_lens.tolist(), rank, world_size))
