"""Training benchmark: policy-update throughput of the actor worker vs its limits.

python benchmarks/train.py [--quick] [--json PATH] [--model DIR] [--reps N]

On the embedded model (artifacts/model) and one synthetic Search-R1-shaped batch (prompts,
responses with observation spans masked out of the loss), measured side by side in one run,
interleaved, median of --reps after a warm-up:

- update_tok_s: `ActorWorker.update_policy` (one PPO step: packing, bf16 autocast, chunked
  log-probs, PPO + KL loss, gradient clipping, AdamW), prompt+response tokens per second;
- bare_tok_s: the limit, a bare forward+backward loop of the same model, precision and
  packed micro-batches (loss = sum of response log-probs; no PPO loss, no optimizer);
- naive_tok_s: plain fp32 transformers forward + log_softmax + backward + AdamW on the same
  batch padded to its longest sequence; speedup_vs_naive = update_tok_s / naive_tok_s;
- update_fp32_tok_s: the worker without bf16 autocast (packing only), to split the speedup;
- bare_padded_tok_s: the bare loop on the batch padded to its longest sequence (one forward
  with an attention mask) instead of packed: what packing saves;
- old_logprob_tok_s: `compute_log_probs` (the pass skipped when old log-probs are reused);
- the same for LoRA (rank 16 on all linear layers), plus ref_logprob_tok_s (adapters off);
- shared_prefix: the demo's GRPO and SFT shapes with real Search-R1 prompts (the template's
  ~145 tokens, then a question), `update_policy` and `update_sft` with each micro-batch's common
  prompt head packed once (the workers' default with SDPA attention) and packed whole, at
  micro-batches of 1024 and 2048 tokens: seconds, speed-up and peak RSS per setting; on CUDA
  also each with one SDPA call per sequence instead of one varlen kernel call per layer
  (`forward.VARLEN_KERNEL`), loop ÷ kernel.

Phases (bf16 worker, fp32 worker, naive, LoRA) run one after another so that only one set
of models is in memory; inside a phase the variants are interleaved.

`weight_sync_s` and `step_timing` come from real GRPO runs (`agent-rl-train` with
configs/train/demo_grpo_cpu.yaml, full fine-tuning and LoRA r16, --rl-steps steps each, Ray
workers and the vLLM engine, a retriever over a generated knowledge base): the median over the
steps after the first of each `timing/*` metric the trainer logs (generation, reference,
old log-probs, values, advantages, actor update, weight push into vLLM). Absolute numbers drift on a
shared machine: read the ratios, and run it on a quiet one. With other processes on the
cores, OpenMP's spinning threads can slow every parallel region several-fold (measured: a
bf16 linear forward+backward 4x slower with 2 threads than 1); OMP_WAIT_POLICY=PASSIVE
(set before Python starts) avoids that at a small cost on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads

import torch  # noqa: E402

from agent_rl.config import ActorRolloutRefConfig  # noqa: E402
from agent_rl.training.batch import TokenBatch, micro_batches  # noqa: E402
from agent_rl.training.workers import forward as fw  # noqa: E402
from agent_rl.training.workers.actor import ActorWorker  # noqa: E402
from agent_rl.training.workers.forward import pack  # noqa: E402
from agent_rl.types import Trajectory  # noqa: E402


# ----------------------------------------------------------------------------- data
def make_batch(n: int, prompt_len: tuple[int, int], response_len: tuple[int, int], seed: int = 0) -> TokenBatch:
    """Search-R1-shaped: varied lengths, ~1/3 of each response an observation (mask 0)."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        p = int(torch.randint(*prompt_len, (1,), generator=g))
        r = int(torch.randint(*response_len, (1,), generator=g))
        mask = [1] * r
        start = r // 3
        for j in range(start, start + r // 3):
            mask[j] = 0
        ids = torch.randint(3, 49000, (p + r,), generator=g).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask,
                                rollout_logprobs=[0.0] * r, reward=float(i % 2), group_id=i // 4))
    return TokenBatch.from_trajectories(trajs)


def search_r1_batch(model: str, groups: int, n: int, response_len: tuple[int, int], seed: int = 0) -> TokenBatch:
    """`groups` x `n` sequences shaped like the demo's: the real Search-R1 prompt (template and
    chat format from the model's tokenizer) around a random question, one prompt per group, and
    responses with ~1/3 observation (mask 0)."""
    from transformers import AutoTokenizer

    from agent_rl.rollout.protocol import SEARCH_R1

    tok = AutoTokenizer.from_pretrained(model)
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for k in range(groups):
        words = " ".join(f"W{int(x)}" for x in torch.randint(100, 999, (int(torch.randint(4, 9, (1,), generator=g)),),
                                                              generator=g))
        prompt = SEARCH_R1.prompt_ids(tok, f"When was the founder of {words} born?")
        for i in range(n):
            r = int(torch.randint(*response_len, (1,), generator=g))
            mask = [1] * r
            for j in range(r // 3, 2 * r // 3):
                mask[j] = 0
            resp = torch.randint(3, 49000, (r,), generator=g).tolist()
            trajs.append(Trajectory(prompt_ids=list(prompt), response_ids=resp, loss_mask=mask,
                                    rollout_logprobs=[0.0] * r, reward=float(i % 2), group_id=k))
    return TokenBatch.from_trajectories(trajs)


def shared_prefix_bench(model: str, reps: int, quick: bool) -> dict:
    """update_policy / update_sft with the common prompt head packed once vs packed whole, on
    the demo's shapes (GRPO: 4 prompts x 4 samples, half the demo's step; SFT: 8
    demonstrations), per micro-batch size."""
    import resource

    groups, n = (2, 2) if quick else (4, 4)
    rl = search_r1_batch(model, groups, n, (150, 450) if not quick else (30, 60))
    sft = search_r1_batch(model, 8 if not quick else 2, 1, (250, 450) if not quick else (30, 60), seed=1)
    warm = search_r1_batch(model, 1, 2, (10, 20), seed=5)
    out: dict = {"rl_tokens": rl.num_tokens, "sft_tokens": sft.num_tokens, "by_micro_batch": {}}
    for max_len in ((1024,) if quick else (1024, 2048)):
        w = ActorWorker(make_cfg(model, len(rl)), total_steps=1000)
        w.cfg.actor.ppo_max_token_len_per_gpu = max_len
        w.loop.max_token_len = max_len
        rl_b, warm_b = rl_fields(w, rl), rl_fields(w, warm)

        def with_sharing(on: bool, fn, kernel: bool = True):
            def run(b):
                w.share_prefix, was = on, fw.VARLEN_KERNEL
                fw.VARLEN_KERNEL = kernel and was  # AGENT_RL_VARLEN_KERNEL=0 keeps the loop throughout
                try:
                    return fn(b)
                finally:
                    fw.VARLEN_KERNEL = was
            return run

        # on CUDA the attention is one varlen kernel call per layer; "_loop": one SDPA call per sequence
        loops = ("", "_loop") if w.device.type == "cuda" else ("",)
        secs = measure({f"rl_{how}{lp}": with_sharing(how == "shared", w.update_policy, not lp)
                        for lp in loops for how in ("shared", "whole")}, warm_b, rl_b, reps)
        secs.update(measure({f"sft_{how}{lp}": with_sharing(how == "shared", w.update_sft, not lp)
                             for lp in loops for how in ("shared", "whole")}, warm, sft, reps))
        out["by_micro_batch"][max_len] = {**secs, "rl_speedup": secs["rl_whole"] / secs["rl_shared"],
                                          "sft_speedup": secs["sft_whole"] / secs["sft_shared"],
                                          "rl_micro_batches": len(micro_batches(rl_b, True, max_len, 0)),
                                          "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
        del w
    return out


def rl_fields(worker: ActorWorker, batch: TokenBatch) -> TokenBatch:
    g = torch.Generator().manual_seed(1)
    valid = batch.response_valid_mask()
    old = worker.compute_log_probs(batch)
    adv = torch.randn(len(batch), 1, generator=g).expand_as(valid) * valid
    return batch.with_fields(advantages=adv.contiguous(), old_logprobs=old, ref_logprobs=old.clone(),
                             rollout_logprobs=old * batch.loss_mask)


def make_cfg(model: str, n: int, lora_rank: int = 0, bf16: bool | str = "auto") -> ActorRolloutRefConfig:
    cfg = ActorRolloutRefConfig()
    cfg.model.path = model
    cfg.model.lora_rank = lora_rank
    cfg.model.lora_alpha = 2 * lora_rank if lora_rank else 32
    cfg.rollout.n = 1
    cfg.actor.ppo_mini_batch_size = n  # the whole batch: one optimizer step
    cfg.actor.bf16_autocast = bf16
    cfg.actor.use_kl_loss = True
    cfg.actor.optim.lr = 1e-6
    return cfg


# ----------------------------------------------------------------------------- timed steps
def naive_step(model, opt, batch: TokenBatch) -> None:
    """fp32 transformers on the padded batch: what a first implementation does."""
    b, length = batch.input_ids.shape
    attn = (torch.arange(length)[None] < batch.seq_lens[:, None]).long()
    logits = model(input_ids=batch.input_ids, attention_mask=attn).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(2, batch.input_ids[:, 1:, None]).squeeze(2)
    mask = torch.zeros(b, length - 1)
    adv = torch.zeros(b, length - 1)
    for i in range(b):
        p, n = int(batch.prompt_lens[i]), int(batch.seq_lens[i])
        mask[i, p - 1 : n - 1] = batch.loss_mask[i, : n - p]
        adv[i, p - 1 : n - 1] = batch.advantages[i, : n - p]
    loss = -(adv * logp * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def bare_step(worker: ActorWorker, batch: TokenBatch) -> None:
    """Forward + backward only, same packed micro-batches and precision as the update."""
    a = worker.cfg.actor
    for mb in micro_batches(batch, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.ppo_micro_batch_size_per_gpu):
        logp, _ = worker.policy(pack(mb.input_ids.to(worker.device), mb.seq_lens, mb.prompt_lens), False)
        logp.sum().backward()
    worker.optim.optimizer.zero_grad(set_to_none=True)


def bare_padded_step(worker: ActorWorker, batch: TokenBatch) -> None:
    """`bare_step` on the padded (B, L) batch with an attention mask: the cost of padding."""
    from agent_rl.training.workers import model_io
    from agent_rl.training.workers.forward import token_logprobs

    lm = worker.model
    length = batch.input_ids.shape[1]
    attn = (torch.arange(length)[None] < batch.seq_lens[:, None]).long()
    ac = worker.autocast
    with torch.autocast("cpu", dtype=ac or torch.bfloat16, enabled=ac is not None):
        hidden = model_io.decoder(lm)(input_ids=batch.input_ids, attention_mask=attn, use_cache=False).last_hidden_state
    rows = torch.cat([torch.full((int(r),), i) for i, r in enumerate(batch.response_lens)])
    cols = torch.cat([torch.arange(int(p) - 1, int(n) - 1) for p, n in zip(batch.prompt_lens, batch.seq_lens)])
    targets = batch.input_ids[rows, cols + 1]
    logp, _ = token_logprobs(hidden[rows, cols], model_io.lm_head_weight(lm), targets, ac or torch.float32, False)
    logp.sum().backward()
    worker.optim.optimizer.zero_grad(set_to_none=True)


def measure(variants: dict, warm: TokenBatch, batch: TokenBatch, reps: int) -> dict[str, float]:
    """Median seconds per variant on `batch`: warm-up on the small `warm` batch (kernel
    selection, optimizer state), then `reps` rounds, interleaved so drift hits all alike."""
    for fn in variants.values():
        fn(warm)
    times = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            t = time.perf_counter()
            fn(batch)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench(model: str, batch: TokenBatch, warm: TokenBatch, reps: int) -> tuple[dict, dict]:
    """Full fine-tuning and LoRA figures. Phases run one after another, each freeing its
    models, to bound memory (the naive fp32 step alone peaks at several GB)."""
    n = len(batch)
    w = ActorWorker(make_cfg(model, n), total_steps=1000)
    batch, warm = rl_fields(w, batch), rl_fields(w, warm)
    secs = measure({
        "update": lambda b: w.update_policy(b),
        "bare": lambda b: bare_step(w, b),
        "bare_padded": lambda b: bare_padded_step(w, b),
        "old_logprob": lambda b: w.compute_log_probs(b),
    }, warm, batch, reps)
    autocast = w.autocast
    params = sum(p.numel() for p in w.model.parameters())
    del w
    if autocast is not None:  # auto chose bf16: the fp32 update splits the speed-up
        w = ActorWorker(make_cfg(model, n, bf16=False), total_steps=1000)
        secs.update(measure({"update_fp32": lambda b: w.update_policy(b)}, warm, batch, reps))
        del w
    from transformers import AutoModelForCausalLM

    naive = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).train()
    opt = torch.optim.AdamW(naive.parameters(), lr=1e-6)
    secs.update(measure({"naive": lambda b: naive_step(naive, opt, b)}, warm, batch, reps))
    del naive, opt
    w = ActorWorker(make_cfg(model, n, lora_rank=16), total_steps=1000)
    lora_secs = measure({
        "update": lambda b: w.update_policy(b),
        "bare": lambda b: bare_step(w, b),
        "old_logprob": lambda b: w.compute_log_probs(b),
        "ref_logprob": lambda b: w.compute_ref_log_probs(b),
    }, warm, batch, reps)
    del w

    def summary(s: dict[str, float]) -> dict:
        out = {f"{k}_tok_s": batch.num_tokens / v for k, v in s.items()}
        out["ratio_to_bare"] = s["bare"] / s["update"]
        out["speedup_vs_naive"] = secs["naive"] / s["update"]
        # the actor's share of a step as the driver runs it: old log-probs reused or recomputed
        out["actor_step_reuse_s"] = s["update"]
        out["actor_step_recompute_s"] = s["update"] + s["old_logprob"]
        return out

    full = summary(secs)
    # model FLOP utilisation: 6 * parameters * tokens/s over a matmul probe in the same dtype
    from data_prep.hardware import matmul_flops

    probe = matmul_flops("bfloat16" if autocast is not None else "float32", n=1024, seconds=1.0)
    full["mfu"] = 6 * params * full["update_tok_s"] / probe
    full["matmul_probe_flops"] = probe
    full["params"] = params
    full["update_dtype"] = "bf16 autocast" if autocast is not None else "fp32"
    return full, summary(lora_secs)


def grpo_step_split(model: str, steps: int, lora_rank: int, work: Path, url: str) -> dict[str, float]:
    """Median per-phase seconds of GRPO steps 2..`steps` of a real `agent-rl-train` run."""
    import subprocess

    from agent_rl.training.metrics import read_jsonl

    run_dir = work / f"grpo_lora{lora_rank}"
    cmd = [sys.executable, "-m", "agent_rl.training.cli", "--config", str(ROOT / "configs/train/demo_grpo_cpu.yaml"),
           f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.model.lora_rank={lora_rank}",
           f"data.train_files=[{work / 'kb' / 'train.parquet'}]", "data.val_files=[]",
           f"retriever.url=[{url}/retrieve]", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
           f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=disable", "trainer.logger=[jsonl]"]
    print(f"GRPO {steps} steps, lora_rank={lora_rank} ...", flush=True)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"agent-rl-train failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    rows = read_jsonl(run_dir)
    rows = [r for r in rows if r.get("step", 0) >= 2] or rows
    keys = sorted({k for r in rows for k in r if k.startswith("timing/")})
    return {k.removeprefix("timing/"): statistics.median(r[k] for r in rows if k in r) for k in keys}


def rl_timings(model: str, steps: int) -> dict[str, dict[str, float]]:
    """GRPO step splits for full fine-tuning and LoRA, on a retriever over a generated KB."""
    from benchmarks.kb_server import kb_retriever

    with kb_retriever("bench-train-") as (work, url):
        return {name: grpo_step_split(model, steps, rank, work, url) for name, rank in (("full_ft", 0), ("lora", 16))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small batch, one repetition (smoke test)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--model", default=str(ROOT / "artifacts" / "model"))
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--rl-model", default=None,
                    help="policy of the GRPO step runs (default --model; an SFT checkpoint gives realistic turns)")
    ap.add_argument("--rl-steps", type=int, default=None, help="GRPO steps per run (default 4, quick 2)")
    ap.add_argument("--shared-prefix-only", action="store_true",
                    help="only the shared-prefix packing comparison (update and SFT step, packed once vs whole)")
    records.add_args(ap)
    args = ap.parse_args()
    from data_prep.hardware import announce, hardware_info

    announce()
    if args.quick:
        batch, reps = make_batch(4, (20, 40), (30, 60)), args.reps or 1
    else:  # the 8 x 512 tokens, with Search-R1-like variation
        batch, reps = make_batch(8, (150, 250), (150, 450)), args.reps or 3
    warm = make_batch(2, (10, 20), (10, 20), seed=5)
    padded = batch.input_ids.numel()
    print(f"batch: {len(batch)} sequences, {batch.num_tokens} tokens ({padded} padded), "
          f"threads {torch.get_num_threads()}, reps {reps}", flush=True)
    if args.shared_prefix_only:
        shared = shared_prefix_bench(args.model, reps, args.quick)
        report_shared_prefix(shared, args.json)
        records.keep(args, "train", shared)
        return
    steps = args.rl_steps or (2 if args.quick else 4)
    timing = rl_timings(args.rl_model or args.model, steps)
    full, lora = bench(args.model, batch, warm, reps)
    result = {
        **{k: full[k] for k in ("update_tok_s", "bare_tok_s", "ratio_to_bare", "speedup_vs_naive", "mfu")},
        "hardware": hardware_info(actor=full["update_dtype"]),
        "full_ft": full,
        "lora": lora,
        "batch": {"sequences": len(batch), "tokens": batch.num_tokens, "padded_tokens": padded},
        "threads": torch.get_num_threads(),
        "weight_sync_s": timing["full_ft"].get("sync"),
        "weight_sync_s_lora": timing["lora"].get("sync"),
        "step_timing": timing["full_ft"],
        "step_timing_lora": timing["lora"],
        "rl_steps": steps,
    }
    print(f"{'':10} {'update tok/s':>12} {'bare tok/s':>11} {'ratio':>6} {'naive tok/s':>12} {'speedup':>8} "
          f"{'fp32 upd':>9} {'padded bare':>11} {'logprob tok/s':>13}")
    nan = float("nan")
    for name, r in (("full FT", full), ("LoRA r16", lora)):
        print(f"{name:10} {r['update_tok_s']:12.0f} {r['bare_tok_s']:11.0f} {r['ratio_to_bare']:6.2f} "
              f"{full['naive_tok_s']:12.0f} {r['speedup_vs_naive']:8.2f} "
              f"{r.get('update_fp32_tok_s', nan):9.0f} {r.get('bare_padded_tok_s', nan):11.0f} "
              f"{r['old_logprob_tok_s']:13.0f}")
    phases = list(timing["full_ft"])
    print(f"\nGRPO step split (s, median of steps 2..{steps}; configs/train/demo_grpo_cpu.yaml, policy "
          f"{args.rl_model or args.model})")
    print(f"{'':10} " + " ".join(f"{p:>12}" for p in phases))
    for name in ("full_ft", "lora"):
        print(f"{name:10} " + " ".join(f"{timing[name].get(p, nan):12.2f}" for p in phases))
    print(f"weight_sync_s: {result['weight_sync_s']:.2f} (full), {result['weight_sync_s_lora']:.2f} (LoRA, merged weights)")
    print(f"mfu {full['mfu']:.3f}: 6 x {full['params'] / 1e6:.0f}M params x {full['update_tok_s']:.0f} tok/s / "
          f"{full['matmul_probe_flops'] / 1e9:.1f} GFLOP/s matmul probe ({full['update_dtype']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    records.keep(args, "train", result)


def report_shared_prefix(r: dict, json_path: Path | None) -> None:
    from data_prep.hardware import hardware_info

    r["hardware"] = hardware_info()
    print(f"\nshared prompt head packed once vs packed whole (GRPO batch {r['rl_tokens']} tokens, "
          f"SFT batch {r['sft_tokens']} tokens; median seconds of a step)")
    print(f"{'micro-batch':>11} {'GRPO once':>10} {'GRPO whole':>11} {'speed-up':>9} {'SFT once':>9} "
          f"{'SFT whole':>10} {'speed-up':>9} {'peak RSS so far, GiB':>21}")
    for max_len, m in r["by_micro_batch"].items():
        print(f"{max_len:>11} {m['rl_shared']:10.2f} {m['rl_whole']:11.2f} {m['rl_speedup']:9.2f} "
              f"{m['sft_shared']:9.2f} {m['sft_whole']:10.2f} {m['sft_speedup']:9.2f} {m['peak_rss_gib']:21.2f}")
    loops = {k: m for k, m in r["by_micro_batch"].items() if "rl_shared_loop" in m}
    if loops:
        print("\nthe same with one SDPA call per sequence instead of one varlen kernel call per layer "
              "(AGENT_RL_VARLEN_KERNEL=0); loop ÷ kernel")
        print(f"{'micro-batch':>11} {'GRPO once':>10} {'GRPO whole':>11} {'SFT once':>9} {'SFT whole':>10}")
        for max_len, m in loops.items():
            print(f"{max_len:>11} " + " ".join(f"{m[k + '_loop']:6.2f} {m[k + '_loop'] / m[k]:4.1f}x"
                                               for k in ("rl_shared", "rl_whole", "sft_shared", "sft_whole")))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
