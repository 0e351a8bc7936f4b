"""The policy worker: log-probs, reference log-probs, PPO/GRPO updates, SFT steps, weights.

A plain class; the driver wraps it in a Ray actor, one per data-parallel rank, and gives each
rank its token-balanced shard of the batch (`agent_rl.training.batch.shard`). Per-token results are
(B, R) float32 tensors aligned with the shard's responses (agent_rl/training/batch.py layout).

Speed on CPU (benchmarks/train.py): sequences are packed into one row with block-diagonal
attention (no padding is ever computed), forward/backward run under bf16 autocast with fp32
master weights, log-probs come from a chunked lm_head + log-softmax that never holds a (T, V)
fp32 tensor, and when the update is a single on-policy step (one epoch, one mini-batch) the
old log-probs are the detached log-probs of the update's own forward (the ratio is exactly 1
there, as veRL does), so the driver can skip `compute_log_probs` (`needs_old_log_probs`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from agent_rl.config import ActorRolloutRefConfig
from agent_rl.training.algos import agg_loss, entropy_mask, get_policy_loss, kl_loss
from agent_rl.training.algos.masked import masked_mean
from agent_rl.training.checkpoint import safe_torch_load
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers import dist, model_io
from agent_rl.training.workers.forward import pack, packed_hidden, shares_prefixes, token_logprobs, unpack_responses
from agent_rl.training.workers.step import LossFn, Normalizers, Optim, UpdateLoop, UpdateLoopWorker

STATE_FILE = "actor_state.pt"
"""Optimizer, scheduler and update counter, beside the HF weights of a saved actor."""


class LogProbModel(torch.nn.Module):
    """Trunk + chunked lm_head log-probs as one module: FSDP's root hooks then cover the
    whole pass (the tied lm_head is used outside the HF forward)."""

    def __init__(self, lm: torch.nn.Module, autocast: torch.dtype | None):
        super().__init__()
        self.lm = lm
        self.autocast = autocast

    def forward(self, pk, with_entropy: bool, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (N,) log-probs and entropies of the packed row's response tokens under
        softmax(logits / temperature): the distribution the engine sampled from (veRL divides
        the actor's logits by the rollout temperature the same way)."""
        device = pk.input_ids.device.type
        with torch.autocast(device, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            hidden = packed_hidden(model_io.decoder(self.lm), pk)[0]
        head = model_io.lm_head_weight(self.lm)
        hidden = hidden[pk.pred_index]
        if temperature != 1.0:  # (h / T) W^T = z / T, and the gradient flows through the scaling
            hidden = hidden / temperature
        # The lm_head runs in the autocast dtype too. Measured on real text (900 tokens): mean
        # |logp - logp_fp32| = 0.019 nats with a bf16 trunk, 0.034 with the bf16 head as well
        # (the bf16 engine's own error is ~0.04); old, new and reference log-probs all take this
        # same path, and an fp32 head would cost ~25% more step time on this CPU.
        return token_logprobs(hidden, head, pk.targets, self.autocast or head.dtype, with_entropy)


class ActorWorker(UpdateLoopWorker):
    """Policy (and reference policy) of one data-parallel rank.

    `cfg.model` picks the weights and LoRA, `cfg.actor` the update, `cfg.rollout.n` turns
    `ppo_mini_batch_size` (prompts, veRL meaning) into sequences. `total_steps` sizes the
    lr warm-up. Ranks > 1 join torch.distributed through `init_method` (default env://, with
    MASTER_ADDR / MASTER_PORT set by the launcher).
    """

    def __init__(self, cfg: ActorRolloutRefConfig, total_steps: int, rank: int = 0, world_size: int = 1,
                 init_method: str | None = None):
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        dist.init(rank, world_size, init_method)
        self.device = dist.device_for(rank)
        m, a = cfg.model, cfg.actor
        self.lora = m.lora_rank > 0
        self.fsdp = dist.use_fsdp(a.strategy)
        if self.fsdp and self.lora:
            raise NotImplementedError("actor: LoRA with FSDP is not supported; use strategy=replicas or full fine-tuning")
        model = model_io.load_policy(m.path, m.dtype, m.lora_rank, m.lora_alpha, m.target_modules,
                                     m.enable_gradient_checkpointing, m.load_format)
        self.model = model.to(self.device)
        self.autocast = dist.autocast_dtype(a.bf16_autocast, self.device)
        self.policy = LogProbModel(self.model, self.autocast)
        self.share_prefix = shares_prefixes(self.model)
        """Pack a micro-batch's common prompt prefix once (forward.py; SDPA attention only)."""
        if self.fsdp:
            dist.wrap_fsdp(self.policy, dist.decoder_layer_types(self.model), self.autocast)
        self._ref_policy: LogProbModel | None = self.policy if self.lora else None
        self.optim = Optim([p for p in self.model.parameters() if p.requires_grad], a.optim, total_steps,
                           a.grad_clip, fsdp=self.fsdp)
        self.policy_loss = get_policy_loss(a.policy_loss)
        self.loop = UpdateLoop(self.model, self.optim, fsdp=self.fsdp, world_size=world_size,
                               state_masking=a.state_masking, use_dynamic_bsz=a.use_dynamic_bsz,
                               max_token_len=a.ppo_max_token_len_per_gpu, micro_batch_size=a.ppo_micro_batch_size_per_gpu)

    # ------------------------------------------------------------------ forward
    def _forward(self, model: torch.nn.Module, mb: TokenBatch, with_entropy: bool,
                 temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) (b, R) float32 of a micro-batch's response tokens (0 in padding).
        `model` is `self.policy` or `self.ref_policy`; `temperature` None is the rollout's
        (old, new and reference log-probs of RL: the policy that sampled), SFT passes 1."""
        pk = pack(mb.input_ids.to(self.device), mb.seq_lens, mb.prompt_lens, self.share_prefix)
        t = self.cfg.rollout.temperature if temperature is None else temperature
        logp, ent = model(pk, with_entropy, t)
        width = mb.loss_mask.shape[1]
        return unpack_responses(logp, pk.resp_lens, width), unpack_responses(ent, pk.resp_lens, width)

    def _log_probs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        r = self.cfg.ref
        return self.loop.per_token(batch, lambda mb: self._forward(model, mb, with_entropy=False)[0],
                                   r.log_prob_max_token_len_per_gpu, r.log_prob_micro_batch_size_per_gpu)

    def compute_log_probs(self, batch: TokenBatch) -> torch.Tensor:
        """(B, R) float32 log-probs of every response token under the current policy."""
        self.model.eval()
        return self._log_probs(self.policy, batch)

    @property
    def ref_policy(self) -> LogProbModel:
        """The reference (initial) policy. With LoRA: the policy itself, used with adapters
        off. Otherwise a frozen copy loaded from `cfg.model.path` on first use (so a run
        without KL never holds it, and a resumed run still gets the initial weights), with
        Linear weights in the autocast dtype: autocast rounds the policy's to exactly these
        values, so it costs no accuracy and half the memory."""
        if self._ref_policy is None:
            m = self.cfg.model
            ref = model_io.load_reference(m.path, m.dtype, self.autocast or getattr(torch, m.dtype),
                                          m.load_format).to(self.device)
            self._ref_policy = LogProbModel(ref, self.autocast)
            if self.fsdp:
                dist.wrap_fsdp(self._ref_policy, dist.decoder_layer_types(ref), self.autocast)
        return self._ref_policy

    def compute_ref_log_probs(self, batch: TokenBatch) -> torch.Tensor:
        """(B, R) float32 log-probs under the reference (initial) policy."""
        if self.lora:
            self.model.eval()
            with self.model.disable_adapter():
                return self._log_probs(self.policy, batch)
        return self._log_probs(self.ref_policy, batch)

    def needs_old_log_probs(self, num_sequences: int) -> bool:
        """False when `update_policy` on `num_sequences` (whole batch, all ranks) is one
        on-policy step, so the old log-probs equal the update's own and need no extra pass."""
        a = self.cfg.actor
        return not (a.ppo_epochs == 1 and num_sequences <= a.ppo_mini_batch_size * self.cfg.rollout.n)

    # ------------------------------------------------------------------ updates
    def update_policy(self, batch: TokenBatch) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's shard; one optimizer step per mini-batch.

        Needs `advantages`; `ref_logprobs` when use_kl_loss; `old_logprobs` unless the update
        is one on-policy step (then they are taken from the update's forward, or computed here
        if missing otherwise). Returns `actor/*` metrics of the whole batch (all ranks).
        """
        a = self.cfg.actor
        if batch.advantages is None:
            raise ValueError("update_policy: batch.advantages is None (the driver sets them before the update)")
        if a.use_kl_loss and batch.ref_logprobs is None:
            raise ValueError("update_policy: use_kl_loss is on but batch.ref_logprobs is None")
        (total,) = dist.all_reduce_sum([float(len(batch))])
        reuse_old = batch.old_logprobs is None and not self.needs_old_log_probs(int(total))
        if batch.old_logprobs is None and not reuse_old:
            batch = batch.with_fields(old_logprobs=self.compute_log_probs(batch))
        loss_fn = functools.partial(self._ppo_loss, reuse_old=reuse_old)
        # A sequence whose advantages are all 0 adds exactly nothing to a PPO-style policy
        # gradient (every term is advantage-weighted), so without a KL or entropy term it needs
        # no forward or backward: the mini-batch's normalisers still count its tokens, so the
        # gradient is the same. GRPO groups whose samples all got the same reward are such
        # sequences (on the demo's KB, a third to a half of them once SFT answers well).
        skip_zero_adv = a.entropy_coeff == 0 and not a.use_kl_loss
        active = (lambda mini: (mini.advantages * mini.mask(a.state_masking)).abs().sum(dim=1) > 0) if skip_zero_adv else None
        return self.loop.epochs(batch, loss_fn, "actor", epochs=a.ppo_epochs,
                                mini_size=a.ppo_mini_batch_size * self.cfg.rollout.n, shuffle=a.shuffle, active=active)

    def _ppo_loss(self, mb: TokenBatch, norm: Normalizers, reuse_old: bool) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.cfg.actor
        logp, ent = self._forward(self.policy, mb, with_entropy=True)
        mb = mb.to(self.device)
        mask = mb.mask(a.state_masking)
        old = logp.detach() if reuse_old else mb.old_logprobs
        g = dict(global_tokens=norm.tokens, global_seqs=norm.seqs)
        # the engine sampled only loss-mask tokens; elsewhere (state_masking off) there is
        # nothing to correct, so TIS sees rollout = old there (weight 1)
        rollout = torch.where(mb.loss_mask.bool(), mb.rollout_logprobs, old.detach())
        advantages, forking = mb.advantages, None
        if a.top_entropy_quantile < 1.0:
            # Forking tokens (algos.entropy_mask): the others get advantage 0, so they add 0 to the
            # policy loss and its gradient while still counting in its normalisers, as TRL multiplies
            # its per-token loss by the mask (a narrowed `mask` would change seq-mean's 1/L_i).
            # The KL and entropy terms below keep every sampled token.
            forking = entropy_mask(ent.detach(), mask, a.top_entropy_quantile)
            advantages = torch.where(forking, advantages, torch.zeros_like(advantages))
        loss, metrics = self.policy_loss(logp, old, advantages, mask, a, rollout_logp=rollout, **g)
        metrics["entropy"] = masked_mean(ent.detach(), mask).item()
        if forking is not None:
            metrics["pg_token_frac"] = masked_mean(forking.float(), mask).item()
        if a.entropy_coeff != 0:
            loss = loss - a.entropy_coeff * agg_loss(ent, mask, a.loss_agg_mode, **g)
        if a.use_kl_loss:
            kl, kl_metrics = kl_loss(logp, mb.ref_logprobs, mask, a.kl_loss_type, a.loss_agg_mode, **g)
            loss = loss + a.kl_loss_coef * kl
            metrics.update(kl_metrics)
        return loss, metrics

    def update_sft(self, batch: TokenBatch) -> dict[str, float]:
        """One optimizer step of supervised fine-tuning: NLL of the sampled (loss-mask) tokens,
        aggregated with actor.loss_agg_mode. Same batching and checkpoints as RL. `sft/*`."""
        return self.train_step(batch, self._sft_loss, "sft")

    def _sft_loss(self, mb: TokenBatch, norm: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        logp, _ = self._forward(self.policy, mb, with_entropy=False, temperature=1.0)
        mask = mb.to(self.device).mask(self.cfg.actor.state_masking)
        nll = agg_loss(-logp, mask, self.cfg.actor.loss_agg_mode, global_tokens=norm.tokens, global_seqs=norm.seqs)
        return nll, {"loss": nll.item()}

    def train_step(self, batch: TokenBatch, loss_fn: LossFn, prefix: str) -> dict[str, float]:
        """One optimizer step on this rank's `batch` with any loss (the pluggable part).

        `loss_fn(micro_batch, normalizers) -> (loss, metrics)` runs the forward itself
        (`self._forward`) and aggregates with the given mini-batch normalisers.
        """
        return self.loop.end([self.loop.mini_batch(batch, loss_fn, prefix)], prefix)

    def _backward(self, mini: TokenBatch, loss_fn: LossFn,
                  active: torch.Tensor | None = None) -> list[tuple[float, dict[str, float]]]:
        """This rank's share of the mini-batch gradient (`UpdateLoop.backward`)."""
        return self.loop.backward(mini, loss_fn, active)

    # ------------------------------------------------------------------ weights
    def named_weights_for_sync(self) -> list[tuple[str, torch.Tensor]]:
        """(HF name, tensor) of the current policy as in its checkpoint (LoRA merged, tied
        lm_head omitted), what the rollout engine loads. Under FSDP call it on every rank."""
        return [(k, v.detach().cpu()) for k, v in model_io.named_weights(self.model)]

    def device_named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """As `named_weights_for_sync`, left on the worker's device (the cuda_ipc transport
        shares this memory with the engine instead of copying it; under FSDP these are freshly
        gathered tensors, kept allocated after they go out of scope here by torch's CUDA IPC
        reference counting until the engine has released them)."""
        return list(model_io.named_weights(self.model))

    def join_weight_gather(self) -> None:
        """What ranks > 0 do while rank 0 exports the weights: under FSDP every full tensor is
        gathered collectively, so they take part in the same gathers (no-op otherwise)."""
        if self.fsdp:
            for _ in model_io.named_weights(self.model):
                pass

    def save(self, path: str, include_optimizer: bool = True) -> None:
        """HF directory (transformers / vLLM load it; LoRA: merged + `adapter/`) and
        `actor_state.pt` (optimizer by parameter name unless `include_optimizer` is False,
        e.g. for a final model; scheduler; update counter), the same for every strategy.
        Call on every rank (gathering FSDP shards is collective); rank 0 writes."""
        path_ = Path(path)
        model_state, optim_state = dist.full_state(self.model, self.optim.optimizer)
        if not include_optimizer:
            optim_state = None
        weights = None
        if self.fsdp:  # the gathered tensors; replicas export their own parameters
            skip = model_io.tied_head_names(self.model)
            weights = {k: v for k, v in model_state.items() if k not in skip}
        if self.rank == 0:
            model_io.save_hf(self.model, path_, self.cfg.model.path, weights)
            torch.save({"optimizer": optim_state, "scheduler": self.optim.scheduler.state_dict(),
                        "num_updates": self.num_updates, "lora": self.lora}, path_ / STATE_FILE)
        dist.barrier()

    def load(self, path: str) -> None:
        """Restore what `save` wrote, whatever strategy wrote it (every rank reads the files)."""
        path_ = Path(path)
        state = safe_torch_load(path_ / STATE_FILE)
        if state["lora"] != self.lora:
            raise ValueError(f"actor.load: {path} was saved with lora={state['lora']}, this worker has lora={self.lora}")
        if self.lora:  # the adapter; the frozen base stays cfg.model.path
            model_io.load_hf_weights(self.model, path_)
            model_state = None
        else:
            model_state = model_io.read_hf_weights(path_)
            embed = model_io.causal_lm(self.model).get_input_embeddings()
            embed_name = next(n for n, m in self.model.named_modules() if m is embed) + ".weight"
            model_state.update({k: model_state[embed_name] for k in model_io.tied_head_names(self.model)})
        dist.load_full_state(self.model, self.optim.optimizer, model_state, state["optimizer"])
        self.optim.scheduler.load_state_dict(state["scheduler"])
        self.num_updates = int(state["num_updates"])
