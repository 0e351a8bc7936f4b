"""A policy of the size users train, without its weights: the project's engine, actor and weight
sync at Qwen2.5-3B's architecture, memory and speed side by side in one run (issue 86, item 1).

    python benchmarks/scale.py [--shape qwen2.5-3b] [--quick] [--json PATH] [--record-dir DIR]

The policy is `--shape`'s architecture (model_io.SHAPES: Qwen2.5-3B's hidden size, layers, query
and KV heads and MLP width; `tiny-qwen2`, the same kind small, is what the test suite runs on the
CPU) with the embedded tokenizer's vocabulary. Its random weights are made where it runs
(`rollout.load_format=dummy` for vLLM, `model.load_format=dummy` for the trainer): only a config
travels. Engine and trainer share the process and, on a GPU, the one GPU, as a user with one GPU
places them. Measured in one run:

- engine: start-up seconds and memory after start-up (GPU: what torch reserved, the KV cache at
  `--gpu-memory-utilization`; CPU: the process's resident memory);
- weight sync: the trainer's weights into the running engine (`load_weights`: validated, reloaded
  in place), seconds; on the CPU through the object_store transport's packing, on a GPU as device
  tensors (the engine is in this process; agent-rl-train's cuda_ipc hands the same tensors to
  another process); then the largest gap between the engine's log-probs of a greedy continuation
  and the trainer's (`compute_log_probs`) on it;
- rollout: the RolloutManager's trajectories against the real retriever (BM25 over a generated KB,
  benchmarks/rollout.py's `interleaved`), sampled tokens/s, and plain generation of the same
  lengths in one batch (the engine's limit, `plain`): their ratio. Random weights write no tags:
  a turn ends at its token budget and gets the invalid-action feedback, so turns interleave with
  feedback, not with searches (the table counts the searches that ran); the cost of tool waits is
  benchmarks/rollout.py's, with a model that searches;
- update: `ActorWorker.update_policy` tokens/s against the bare forward+backward of the same packed
  micro-batches (benchmarks/train.py), `compute_log_probs` tokens/s, the trainer's peak memory
  (GPU: torch's peak allocated above what the engine held; CPU: the peak resident memory above
  the engine's, the rollout's included);
- GRPO steps per hour on one device at Search-R1's batch shape (`SEARCH_R1`), estimated from the
  rates above (`steps_per_hour`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env, proc_status_kib  # noqa: E402

offline_env()

import torch  # noqa: E402

SEARCH_R1 = {"train_batch_size": 512, "n_agent": 5, "n_gpus": 8, "max_turns": 2, "max_response_length": 500,
             "source": "Search-R1's train_grpo.sh (PeterGriffinJin/Search-R1): data.train_batch_size=512, "
                       "rollout.n_agent=5, trainer.n_gpus_per_node=8, max_turns=2, max_response_length=500"}
"""Search-R1's GRPO run for Qwen2.5-3B: 512 prompts x 5 samples a step over 8 GPUs, 320
trajectories a GPU."""


def trajectories_per_device(shape: dict = SEARCH_R1) -> int:
    return shape["train_batch_size"] * shape["n_agent"] // shape["n_gpus"]


def steps_per_hour(r: dict, trajectories: int) -> dict:
    """GRPO steps an hour on one device, `trajectories` a step, each of the measured mean sampled
    tokens (`sampled_per_traj`) and sequence tokens (`tokens_per_traj`, prompt + response): the
    rollout at the measured rollout rate, the update at update_tok_s, the old and the reference
    log-probs at logprob_tok_s each, one weight sync. Rates measured on fewer trajectories than a
    real step holds (a smaller engine batch) make this a lower bound on the engine's side."""
    rollout_s = trajectories * r["sampled_per_traj"] / r["rollout_tok_s"]
    train_s = trajectories * r["tokens_per_traj"] * (1 / r["update_tok_s"] + 2 / r["logprob_tok_s"])
    step_s = rollout_s + train_s + r["sync_s"]
    return {"trajectories": trajectories, "rollout_s": rollout_s, "train_s": train_s, "sync_s": r["sync_s"],
            "step_s": step_s, "steps_per_hour": 3600 / step_s}


def memory_gib(cuda: bool) -> float:
    """GPU: what torch has reserved; CPU: this process's resident memory."""
    if cuda:
        return torch.cuda.memory_reserved() / 2**30
    return proc_status_kib("VmRSS") / 2**20


def peak_gib(cuda: bool) -> float:
    """GPU: torch's peak allocated; CPU: the peak resident memory since `reset_peak`."""
    return torch.cuda.max_memory_allocated() / 2**30 if cuda else proc_status_kib("VmHWM") / 2**20


def reset_peak(cuda: bool) -> None:
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident size restarts from now


async def sync_gap(engine, worker, prompt: list[int], n: int) -> float:
    """The largest |engine - trainer| log-prob over a greedy continuation of `prompt`."""
    from agent_rl.rollout.engine import Sampling
    from agent_rl.training.batch import TokenBatch
    from agent_rl.types import Trajectory

    out = await engine.generate(prompt, Sampling(temperature=0.0, max_tokens=n, ignore_eos=True))
    t = Trajectory(prompt_ids=prompt, response_ids=list(out.token_ids), loss_mask=[1] * len(out.token_ids),
                   rollout_logprobs=list(out.logprobs))
    mine = worker.compute_log_probs(TokenBatch.from_trajectories([t]))[0, : len(out.token_ids)].cpu()
    return float((mine - torch.tensor(out.logprobs)).abs().max())


async def run(args, policy: Path, work: Path, url: str) -> dict:
    import pandas as pd

    from agent_rl.config import TrainConfig
    from agent_rl.rollout.engine import RolloutEngine
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from agent_rl.training.weight_sync import get_transport
    from agent_rl.training.workers.actor import ActorWorker
    from benchmarks.rollout import build_items, interleaved, plain
    from benchmarks.train import bare_step, make_batch, make_cfg, measure, rl_fields

    cuda = torch.cuda.is_available()
    out: dict = {"cuda": cuda}
    cfg = TrainConfig()
    cfg.max_turns = SEARCH_R1["max_turns"]
    cfg.data.max_response_length = 2 * args.tokens_per_turn + 256
    r = cfg.actor_rollout_ref.rollout
    r.load_format, r.max_tokens_per_turn, r.chat_template = "dummy", args.tokens_per_turn, True
    r.gpu_memory_utilization, r.kv_cache_space_gb, r.dtype = args.gpu_memory_utilization, 1.0, args.dtype
    r.max_num_seqs = max(8, args.trajectories)

    base = memory_gib(cuda)
    t0 = time.perf_counter()
    engine = await RolloutEngine.create(str(policy), r, max_model_len=4096)
    out.update(engine_start_s=time.perf_counter() - t0, engine_gib=memory_gib(cuda) - base, engine_dtype=engine.cfg.dtype)

    n = args.update_sequences
    acfg = make_cfg(str(policy), n, bf16={"auto": "auto", "float32": False, "bfloat16": True}[args.dtype])
    acfg.model.load_format = "dummy"
    if cuda:  # one worker, no process group: strategy auto keeps the model whole, as agent-rl-train does on one GPU
        acfg.actor.ppo_max_token_len_per_gpu = 16384
    reset_peak(cuda)
    before = torch.cuda.memory_allocated() / 2**30 if cuda else memory_gib(cuda)
    worker = ActorWorker(acfg, total_steps=1000)
    out["params"] = sum(p.numel() for p in worker.model.parameters())
    out["trainer_dtype"] = "bf16 autocast" if worker.autocast is not None else "fp32"

    t0 = time.perf_counter()
    if cuda:  # the engine runs in this process: its device tensors as they are (a process cannot open its own IPC handles)
        await engine.load_weights(worker.device_named_weights())
        out["sync_how"] = "device tensors, in process"
    else:
        transport = get_transport("object_store")
        await engine.load_weights(transport.load(transport.export(worker)))
        out["sync_how"] = "object_store (packed, unpacked)"
    out["sync_s"] = time.perf_counter() - t0
    tok = engine.get_tokenizer()
    df = pd.read_parquet(work / "kb" / "train.parquet")
    rows = [(q, list(g), s) for q, g, s in zip(df.question, df.golden_answers, df.data_source)][: args.trajectories]
    items = build_items(tok, rows, "chat")
    out["sync_logprob_gap"] = await sync_gap(engine, worker, items[0].prompt_ids, 16)

    client = RetrieverClient(url, timeout=30.0)
    await interleaved(engine, client, 0, 0, cfg, tok, items[: max(1, len(items) // 4)], seed=99)  # warm-up
    trajs, metrics, ret, secs = await interleaved(engine, client, 0, 0, cfg, tok, items, seed=0)
    counts = [sum(t.loss_mask) for t in trajs]
    sampled, plain_s = await plain(engine, [it.prompt_ids for it in items], counts)
    await client.aclose()
    out.update(trajectories=len(trajs), rollout_tok_s=sum(counts) / secs, plain_tok_s=sampled / plain_s,
               searches=ret.queries, turns_mean=metrics["rollout/turns_mean"],
               sampled_per_traj=sum(counts) / len(trajs),
               tokens_per_traj=sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs) / len(trajs))
    out["rollout_ratio_to_plain"] = out["rollout_tok_s"] / out["plain_tok_s"]

    batch = make_batch(n, *args.update_lengths)
    warm = make_batch(2, (20, 40), (30, 60), seed=5)
    batch, warm = rl_fields(worker, batch), rl_fields(worker, warm)
    secs = measure({"update": worker.update_policy, "bare": lambda b: bare_step(worker, b),
                    "logprob": worker.compute_log_probs}, warm, batch, args.reps)
    out.update({f"{k}_tok_s": batch.num_tokens / v for k, v in secs.items()}, update_tokens=batch.num_tokens)
    out["update_ratio_to_bare"] = secs["bare"] / secs["update"]
    out["trainer_peak_gib"] = peak_gib(cuda) - before
    out["grpo"] = steps_per_hour(out, trajectories_per_device())
    await engine.shutdown()
    return out


def table(r: dict, host: str, shape: str) -> str:
    g = r["grpo"]
    lines = [f"# {shape}-shaped policy ({r['params'] / 1e9:.2f}B parameters, random weights), one device", "", host, "",
             "| figure | value |", "|---|---|",
             f"| engine ({r['engine_dtype']}): start-up, memory | {r['engine_start_s']:.1f} s, {r['engine_gib']:.2f} GiB |",
             f"| trainer ({r['trainer_dtype']}): peak memory | {r['trainer_peak_gib']:.2f} GiB |",
             f"| weight sync ({r['sync_how']}): seconds; engine − trainer log-prob gap after it | "
             f"{r['sync_s']:.2f} s; {r['sync_logprob_gap']:.2e} |",
             f"| rollout ({r['trajectories']} trajectories, {r['turns_mean']:.1f} turns, {r['searches']} searches): "
             f"tokens/s, ÷ plain generation | {r['rollout_tok_s']:.0f}; {r['rollout_ratio_to_plain']:.2f} |",
             f"| update: tokens/s, ÷ bare forward+backward | {r['update_tok_s']:.0f}; {r['update_ratio_to_bare']:.2f} |",
             f"| log-probs: tokens/s | {r['logprob_tok_s']:.0f} |",
             f"| GRPO at Search-R1's shape ({g['trajectories']} trajectories a device): step | {g['step_s']:.0f} s "
             f"(rollout {g['rollout_s']:.0f}, train {g['train_s']:.0f}, sync {g['sync_s']:.1f}) |",
             f"| GRPO steps per hour | {g['steps_per_hour']:.1f} |", "",
             f"Search-R1's shape: {SEARCH_R1['source']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from agent_rl.training.workers import model_io
    from benchmarks.kb_server import kb_retriever
    from data_prep.hardware import hardware_line
    from data_prep.model import prepare_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-3b", choices=sorted(model_io.SHAPES), help="the policy's architecture")
    ap.add_argument("--quick", action="store_true",
                    help="8 trajectories of short turns, 4 short update sequences, 1 rep (a rehearsal)")
    ap.add_argument("--trajectories", type=int, default=64, help="rollout trajectories (one engine batch)")
    ap.add_argument("--tokens-per-turn", type=int, default=256, help="a turn's token budget")
    ap.add_argument("--update-sequences", type=int, default=32, help="sequences of the update batch")
    ap.add_argument("--reps", type=int, default=3, help="timed rounds of the update (median)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="the engine's share of the GPU")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="the engine's dtype and the trainer's autocast (auto: bf16 where the hardware runs it natively)")
    ap.add_argument("--json", help="write the result here too")
    records.add_args(ap)
    args = ap.parse_args(argv)
    # update sequences: prompt and response lengths drawn from these ranges (Search-R1-shaped)
    args.update_lengths = ((150, 350), (200, 600))
    if args.quick:
        args.trajectories, args.tokens_per_turn, args.update_sequences, args.reps = 8, 32, 4, 1
        args.update_lengths = ((30, 60), (40, 120))
    host = hardware_line()
    with kb_retriever("bench-scale-") as (work, url):
        policy = model_io.shaped_copy(prepare_model(ROOT / "artifacts" / "model"), work / "policy", args.shape)
        result = asyncio.run(run(args, policy, work, url))
    result.update(shape=args.shape, host=host, search_r1=SEARCH_R1, dtype=args.dtype)
    text = table(result, host, args.shape)
    print("\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "scale", result, title=f"The project's engine, actor and weight sync at {args.shape}'s shape, "
                                               "random weights")
    return 0


if __name__ == "__main__":  # vLLM starts processes with spawn: guard the entry point
    sys.exit(main())
