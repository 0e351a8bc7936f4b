"""Measure, in a few seconds, how fast this host updates and generates with a given model.

`python -m agent_rl.demo.calibrate --model DIR --config configs/train/demo_grpo_cpu.yaml --out cal.json`

The demo sizes its stages from these two numbers (agent_rl/demo/budget.py). Both use the precisions the run itself will use (`auto` resolved here):
- update tok/s: forward + backward of the policy on packed random token rows, the trainer's
  dominant cost (optimizer step excluded: <5% for a 135M model);
- generation tok/s: the real vLLM engine, `--batch` sequences of `--gen-tokens` tokens each,
  decoded together (ignore_eos), engine start-up excluded (reported apart as `engine_load_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path


def update_tokens_per_s(model_dir: str, autocast: str, seq_len: int = 512, rows: int = 1, steps: int = 1) -> dict:
    import torch

    from agent_rl.training.workers import dist, model_io

    device = dist.device_for(0)
    ac = dist.autocast_dtype(autocast, device)
    model = model_io.load_policy(model_dir).to(device).train()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq_len), generator=g).to(device)

    def step(ids=ids) -> None:
        with torch.autocast(device.type, dtype=ac or torch.bfloat16, enabled=ac is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    step(ids[:, : seq_len // 2])  # warm-up: allocation and kernel selection, at half the cost
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    return {"update_tok_s": rows * seq_len * steps / dt, "update_dtype": "bf16 autocast" if ac else "fp32"}


async def _generation(model_dir: str, rollout_cfg, batch: int, tokens: int) -> dict:
    from agent_rl.rollout.engine import RolloutEngine, Sampling

    t0 = time.perf_counter()
    engine = await RolloutEngine.create(model_dir, rollout_cfg, max_model_len=512)
    load_s = time.perf_counter() - t0
    try:
        prompt = [1] + list(range(100, 132))
        sampling = Sampling(max_tokens=tokens, stop=(), ignore_eos=True, temperature=1.0)
        await engine.generate(prompt, Sampling(max_tokens=4, stop=(), ignore_eos=True))  # warm-up
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(prompt[:-1] + [200 + i], sampling) for i in range(batch)))
        dt = time.perf_counter() - t0
        return {"gen_tok_s": sum(len(o.token_ids) for o in outs) / dt, "engine_load_s": load_s,
                "engine_dtype": engine.cfg.dtype}
    finally:
        await engine.shutdown()


def calibrate(model_dir: str, cfg, batch: int = 32, gen_tokens: int = 32) -> dict:
    from agent_rl.precision import chosen_precisions
    from data_prep.hardware import hardware_info

    out = {"model": str(model_dir)}
    out.update(update_tokens_per_s(model_dir, cfg.actor_rollout_ref.actor.bf16_autocast))
    out.update(asyncio.run(_generation(model_dir, cfg.actor_rollout_ref.rollout, batch, gen_tokens)))
    out["hardware"] = hardware_info(**chosen_precisions(cfg))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent_rl.demo.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--config", default=None, help="train config whose precisions and engine settings to use")
    ap.add_argument("--batch", type=int, default=32, help="sequences decoded together")
    ap.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per sequence")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env(engine=True)  # calibration runs a vLLM engine here
    from agent_rl.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, args.config, args.overrides)
    res = calibrate(args.model, cfg, args.batch, args.gen_tokens)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"[calibrate] update {res['update_tok_s']:.0f} tok/s ({res['update_dtype']}), generation "
          f"{res['gen_tok_s']:.0f} tok/s ({res['engine_dtype']}, batch {args.batch}), engine load {res['engine_load_s']:.0f}s",
          flush=True)
    return 0


if __name__ == "__main__":  # vLLM may start worker processes with spawn
    sys.exit(main())
