"""Training workers: plain classes the driver wraps in Ray actors (one per data-parallel rank).

- `actor.ActorWorker`: policy log-probs, reference log-probs (LoRA: adapters off), PPO/GRPO
  updates, SFT steps, weights for the rollout engine, save/load as an HF directory.
- `critic.CriticWorker`: value head on the policy architecture, values and value updates.
- `forward`: packed (block-diagonal) forward and chunked response log-probs.
- `model_io`: load / LoRA-wrap / export merged weights / save an HF directory.
- `step`: AdamW + warm-up, exact gradient accumulation, metric reduction.
- `dist`: torch.distributed (gloo on CPU, NCCL + FSDP2 on GPUs).

Inputs are `agent_rl.training.batch.TokenBatch`; per-token outputs are (B, R) float32 tensors aligned
with the responses; metrics are flat dicts of floats.
"""
