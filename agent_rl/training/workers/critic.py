"""The critic worker (PPO with GAE): the policy's architecture with a value head.

V(s_j) for response token j is read from the hidden state that predicts token j (position
prompt_len + j - 1), the same positions as the policy's log-probs, so values are (B, R)
aligned with the responses like every other per-token field (veRL does the same).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from agent_rl.config import TrainConfig
from agent_rl.training.algos import value_loss
from agent_rl.training.checkpoint import safe_torch_load
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers import dist, model_io
from agent_rl.training.workers.forward import pack, packed_hidden, shares_prefixes, unpack_responses
from agent_rl.training.workers.step import Normalizers, Optim, UpdateLoop, UpdateLoopWorker

STATE_FILE = "critic_state.pt"
"""Optimizer, scheduler and update counter of a saved critic."""
WEIGHTS_FILE = "critic.safetensors"
"""Trunk + value head weights of a saved critic (trunk names as in the HF checkpoint)."""


class ValueModel(nn.Module):
    """HF decoder trunk (under `autocast` when set) + `value_head` Linear(hidden, 1) in fp32."""

    def __init__(self, trunk: nn.Module, hidden_size: int, init_std: float, autocast: torch.dtype | None):
        super().__init__()
        self.trunk = trunk
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=init_std)
        nn.init.zeros_(self.value_head.bias)
        self.autocast = autocast

    def forward(self, pk) -> torch.Tensor:
        """Values (N,) at the packed row's response-predicting positions."""
        device = pk.input_ids.device.type
        with torch.autocast(device, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            hidden = packed_hidden(self.trunk, pk)[0]
        # the head in fp32: bf16 would round values to ~3 significant digits
        return self.value_head(hidden[pk.pred_index].float()).squeeze(-1)


class CriticWorker(UpdateLoopWorker):
    """Value function of one data-parallel rank. Built from the whole `TrainConfig`: its
    `critic` section, the model path (critic.model_path or the policy's), rollout.n."""

    def __init__(self, cfg: TrainConfig, total_steps: int, rank: int = 0, world_size: int = 1,
                 init_method: str | None = None):
        self.cfg = cfg.critic
        self.n = cfg.actor_rollout_ref.rollout.n
        self.state_masking = cfg.actor_rollout_ref.actor.state_masking
        self.model_path = self.cfg.model_path or cfg.actor_rollout_ref.model.path
        self.rank, self.world_size = rank, world_size
        dist.init(rank, world_size, init_method)
        self.device = dist.device_for(rank)
        self.fsdp = dist.use_fsdp(self.cfg.strategy)
        same = self.cfg.model_path is None  # the policy's directory: loaded as the policy is
        lm = model_io.load_policy(self.model_path, cfg.actor_rollout_ref.model.dtype,
                                  load_format=cfg.actor_rollout_ref.model.load_format if same else "auto")
        trunk = lm.get_decoder()
        autocast = dist.autocast_dtype(self.cfg.bf16_autocast, self.device)
        # seeded so every rank starts from the same head (replicas must agree)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.model = ValueModel(trunk, lm.config.hidden_size, lm.config.initializer_range, autocast)
        self.model.to(self.device)
        del lm
        if self.fsdp:
            dist.wrap_fsdp(self.model, dist.decoder_layer_types(self.model.trunk), autocast,
                           fp32_modules=(self.model.value_head,))
        self.share_prefix = shares_prefixes(trunk)
        """Pack a micro-batch's common prompt prefix once (forward.py; SDPA attention only)."""
        self.optim = Optim(list(self.model.parameters()), self.cfg.optim, total_steps, self.cfg.grad_clip, fsdp=self.fsdp)
        c = self.cfg
        self.loop = UpdateLoop(self.model, self.optim, fsdp=self.fsdp, world_size=world_size,
                               state_masking=self.state_masking, use_dynamic_bsz=c.use_dynamic_bsz,
                               max_token_len=c.ppo_max_token_len_per_gpu, micro_batch_size=c.ppo_micro_batch_size_per_gpu)

    def _values(self, mb: TokenBatch) -> torch.Tensor:
        pk = pack(mb.input_ids.to(self.device), mb.seq_lens, mb.prompt_lens, self.share_prefix)
        return unpack_responses(self.model(pk), pk.resp_lens, mb.loss_mask.shape[1])

    def compute_values(self, batch: TokenBatch) -> torch.Tensor:
        """(B, R) float32 values of every response position (0 in padding)."""
        self.model.eval()
        return self.loop.per_token(batch, self._values, self.cfg.forward_max_token_len_per_gpu,
                                   self.cfg.ppo_micro_batch_size_per_gpu)

    def update_critic(self, batch: TokenBatch) -> dict[str, float]:
        """Clipped value regression to `returns` (needs `values` = old values, `returns`);
        epochs x mini-batches like the actor (`UpdateLoop`). Returns `critic/*` metrics of the
        whole batch."""
        if batch.values is None or batch.returns is None:
            raise ValueError("update_critic: batch.values (old values) and batch.returns must be set")
        c = self.cfg
        return self.loop.epochs(batch, self._value_loss, "critic", epochs=c.ppo_epochs,
                                mini_size=c.ppo_mini_batch_size * self.n, shuffle=c.shuffle)

    def _value_loss(self, mb: TokenBatch, norm: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        # the value loss covers the tokens the advantages were computed on (state masking:
        # observation tokens are not the policy's decisions)
        c = self.cfg
        values = self._values(mb)
        mbd = mb.to(self.device)
        return value_loss(values, mbd.values, mbd.returns, mbd.mask(self.state_masking), c.cliprange_value,
                          c.loss_agg_mode, global_tokens=norm.tokens, global_seqs=norm.seqs)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str) -> None:
        """`critic.safetensors` (trunk + head) and `critic_state.pt` (optimizer by parameter
        name, scheduler, update counter). Every rank calls; rank 0 writes."""
        from safetensors.torch import save_file

        path_ = Path(path)
        weights, optim_state = dist.full_state(self.model, self.optim.optimizer)
        if self.rank == 0:
            path_.mkdir(parents=True, exist_ok=True)
            save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, path_ / WEIGHTS_FILE)
            (path_ / "critic.json").write_text(json.dumps({"model_path": self.model_path}) + "\n")
            torch.save({"optimizer": optim_state, "scheduler": self.optim.scheduler.state_dict(),
                        "num_updates": self.num_updates}, path_ / STATE_FILE)
        dist.barrier()

    def load(self, path: str) -> None:
        from safetensors.torch import load_file

        path_ = Path(path)
        weights = load_file(path_ / WEIGHTS_FILE)
        state = safe_torch_load(path_ / STATE_FILE)
        dist.load_full_state(self.model, self.optim.optimizer, weights, state["optimizer"])
        self.optim.scheduler.load_state_dict(state["scheduler"])
        self.num_updates = int(state["num_updates"])
