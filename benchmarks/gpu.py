"""GPU figures in one run: what scripts/gpu_check.sh prints and docs/gpu.md records.

python benchmarks/gpu.py [--json PATH] [--quick] [--policy DIR] [--encoder DIR]

Needs a CUDA GPU. Measured side by side in one process:
- encoder: passages/s of the query/passage encoder (torch) in fp32, bf16 and fp16 on the GPU
  and fp32 on the CPU cores, batch 256, on a slice of the Wikipedia corpus; cosine of each
  GPU variant's vectors to the CPU fp32 ones (min and mean);
- search: FAISS flat inner-product search (faiss-cpu) over synthetic 384-d unit vectors,
  batches of 64 queries; and the real retriever server with the CUDA encoder, driven by
  C concurrent 1-query requests (QPS, p50, p99);
- actor: `update_policy` (one PPO step, bf16 autocast, FSDP2 over a group of one GPU) on the
  full-size policy architecture, against the bare forward+backward of the same micro-batches
  (the limit), `compute_log_probs`, peak GPU memory, MFU against a bf16 matmul probe;
  `update_sft`; the critic's `update_critic`;
- weight export: seconds to hand the policy to the engine (GPU -> CPU tensors for CPU
  engines; CUDA IPC handles for a CUDA engine);
- two NCCL ranks on one GPU: whether FSDP2 with world size 2 can run there.

The policy defaults to `.gpu/policy_skeleton` with random weights (the real ones are too large
to travel): throughput and memory depend on the shapes, not on the weights.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.train import bare_step, make_batch, make_cfg, measure, rl_fields  # noqa: E402

CARRY = ROOT / ".gpu"


def timed(fn, reps: int = 3) -> float:
    """Median seconds of `fn()` after one warm-up, synchronising the GPU around each call."""
    fn()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


# ----------------------------------------------------------------------------- retrieval
def passages(n: int) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from conftest import read_passages  # the GPU tests' data, one definition

    return read_passages(n)


def encoder_figures(encoder: str, texts: list[str]) -> dict:
    from data_prep.encoder import Encoder

    cpu_enc = Encoder(encoder, backend="torch", precision="fp32", device="cpu")
    out = {}
    t = time.perf_counter()
    ref = cpu_enc.encode_passages(texts, batch_size=256, progress=False)
    out["cpu_fp32"] = {"passages_s": len(texts) / (time.perf_counter() - t), "threads": torch.get_num_threads()}
    del cpu_enc
    for precision in ("fp32", "bf16", "fp16"):
        enc = Encoder(encoder, backend="torch", precision=precision, device="cuda")
        vec = enc.encode_passages(texts, batch_size=256, progress=False)
        secs = timed(lambda: enc.encode_passages(texts, batch_size=256, progress=False), reps=3)
        cos = (vec * ref).sum(1)
        out[f"cuda_{precision}"] = {"passages_s": len(texts) / secs, "cos_min": float(cos.min()),
                                    "cos_mean": float(cos.mean())}
        del enc
    return out


def faiss_figures(n: int, dim: int = 384) -> dict:
    import faiss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(x)
    q = x[rng.integers(0, n, 512)] + 0.05 * rng.standard_normal((512, dim), dtype=np.float32)
    index.search(q[:64], 10)
    t = time.perf_counter()
    for s in range(0, len(q), 64):
        index.search(q[s : s + 64], 10)
    return {"vectors": n, "dim": dim, "qps_batch64": len(q) / (time.perf_counter() - t),
            "threads": faiss.omp_get_max_threads(), "gpus_seen_by_faiss": getattr(faiss, "get_num_gpus", lambda: 0)()}


async def _drive(url: str, queries: list[str], concurrency: int) -> dict:
    import httpx

    lat: list[float] = []
    it = iter(queries)

    async def worker(client):
        for q in it:
            t = time.perf_counter()
            r = await client.post(f"{url}/retrieve", json={"queries": [q], "topk": 3})
            r.raise_for_status()
            lat.append(time.perf_counter() - t)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        t = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t
    return {"qps": len(lat) / wall, "p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "p99_ms": 1e3 * float(np.percentile(lat, 99))}


def server_figures(encoder: str, rows: list[dict], work: Path, n_queries: int) -> dict:
    from data_prep.encoder import Encoder
    from data_prep.indexing import build_index
    from retriever_server.launch import start_server, stop_server, wait_healthy

    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = time.perf_counter()
    build_index(corpus, work / "flat", kind="flat", encoder=Encoder(encoder, device="cuda"), batch_size=256,
                progress=False)
    out = {"index_build_s": time.perf_counter() - t, "passages": len(rows)}
    queries = [r["contents"].split("\n")[0].strip('"') + " facts" for r in rows]
    queries = (queries * (n_queries // len(queries) + 1))[:n_queries]
    proc, url = start_server(work / "flat", corpus, extra_args=["--encoder", encoder, "--log-level", "warning"])
    try:
        wait_healthy(url, timeout=300, proc=proc)
        asyncio.run(_drive(url, queries[:64], 8))  # warm-up
        for c in (1, 16, 64):
            out[f"C{c}"] = asyncio.run(_drive(url, queries if c > 1 else queries[:200], c))
    finally:
        stop_server(proc)
    return out


# ----------------------------------------------------------------------------- training
def training_figures(policy: str, quick: bool) -> dict:
    from agent_rl.config import TrainConfig
    from agent_rl.training.workers import dist as wdist
    from agent_rl.training.workers.actor import ActorWorker
    from agent_rl.training.workers.critic import CriticWorker
    from data_prep.hardware import matmul_flops

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{wdist.free_port()}",
                                             rank=0, world_size=1, device_id=torch.device("cuda", 0))
    n = 8 if quick else 64
    batch = make_batch(n, (150, 350), (200, 600))
    warm = make_batch(4, (20, 40), (30, 60), seed=5)
    cfg = make_cfg(policy, n, bf16=True)
    cfg.actor.strategy = "fsdp"
    cfg.actor.ppo_max_token_len_per_gpu = 16384
    torch.cuda.reset_peak_memory_stats()
    w = ActorWorker(cfg, total_steps=1000)
    batch, warm = rl_fields(w, batch), rl_fields(w, warm)
    reps = 1 if quick else 3
    secs = measure({
        "update": lambda b: w.update_policy(b),
        "bare": lambda b: (bare_step(w, b), torch.cuda.synchronize()),
        "old_logprob": lambda b: w.compute_log_probs(b),
        "sft": lambda b: w.update_sft(b),
    }, warm, batch, reps)
    params = sum(p.numel() for p in w.model.parameters())
    out = {f"{k}_tok_s": batch.num_tokens / v for k, v in secs.items()}
    out.update(params=params, sequences=n, tokens=batch.num_tokens, fsdp=w.fsdp,
               peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30, ratio_to_bare=secs["bare"] / secs["update"])
    probe = matmul_flops("bfloat16", n=8192, seconds=1.0, device="cuda")
    out["mfu"] = 6 * params * out["update_tok_s"] / probe
    out["matmul_probe_tflops"] = probe / 1e12

    from agent_rl.training.weight_sync import get_transport

    out["export_cpu_s"] = timed(lambda: w.named_weights_for_sync())
    out["export_cuda_ipc_s"] = timed(lambda: get_transport("cuda_ipc").export(w))
    del w
    torch.cuda.empty_cache()

    tc = TrainConfig()
    tc.actor_rollout_ref.model.path = policy
    tc.actor_rollout_ref.rollout.n = 1
    tc.critic.bf16_autocast = True
    tc.critic.strategy = "fsdp"
    tc.critic.ppo_mini_batch_size = n
    tc.critic.ppo_max_token_len_per_gpu = 16384
    c = CriticWorker(tc, total_steps=1000)
    vals = c.compute_values(batch)
    cb = batch.with_fields(values=vals, returns=torch.randn_like(vals) * batch.response_valid_mask())
    out["critic_update_tok_s"] = batch.num_tokens / timed(lambda: c.update_critic(cb), reps=reps)
    del c
    torch.cuda.empty_cache()
    return out


def _nccl_rank(rank: int, policy: str, port: int, q) -> None:
    try:
        from agent_rl.training.batch import shard
        from agent_rl.training.workers.actor import ActorWorker

        cfg = make_cfg(policy, 4, bf16=True)
        cfg.actor.strategy = "fsdp"
        w = ActorWorker(cfg, total_steps=2, rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
        m = w.update_sft(shard(make_batch(4, (10, 20), (20, 40)), rank, 2))
        q.put((rank, f"ok: FSDP2 world size 2 SFT step, loss {m['sft/loss']:.3f}"))
        torch.distributed.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the probe reports whatever stops it
        q.put((rank, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"))


def nccl_two_ranks(policy: str) -> str:
    """Two processes, one GPU, NCCL: does FSDP2 with world size 2 run? (NCCL refuses two ranks
    on one device unless it lets them share it.)"""
    import torch.multiprocessing as mp

    from agent_rl.training.workers import dist as wdist

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = wdist.free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(r, policy, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    answers = {}
    deadline = time.time() + 180
    while len(answers) < 2 and time.time() < deadline:
        try:
            r, msg = q.get(timeout=5)
            answers[r] = msg
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return answers.get(0) or answers.get(1) or f"failed: no answer (exit codes {[p.exitcode for p in procs]})"


# ----------------------------------------------------------------------------- main
STEPS = ("encoder", "faiss", "server", "training", "nccl_two_ranks")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--policy", help="HF policy dir (default: .gpu/policy_skeleton with random weights)")
    ap.add_argument("--encoder", help="encoder dir (default: .gpu/encoder, else the embedded MiniLM)")
    ap.add_argument("--only", nargs="+", choices=STEPS, help="run these parts only (default: all)")
    records.add_args(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA GPU")
    from agent_rl.training.workers import model_io
    from data_prep.hardware import announce, hardware_info

    announce()
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    policy = args.policy or str(model_io.random_copy(CARRY / "policy_skeleton", work / "policy", seed=0))
    encoder = args.encoder or (str(CARRY / "encoder") if (CARRY / "encoder").is_dir() else "minilm")
    rows = passages(2000 if not args.quick else 300)
    result: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
                    "policy": policy, "policy_weights": "random" if not args.policy else "given"}
    steps = [
        ("encoder", lambda: encoder_figures(encoder, [r["contents"] for r in rows])),
        ("faiss", lambda: faiss_figures(20_000 if args.quick else 1_000_000)),
        ("server", lambda: server_figures(encoder, rows, work, 400 if args.quick else 2000)),
        ("training", lambda: training_figures(policy, args.quick)),
        ("nccl_two_ranks", lambda: nccl_two_ranks(policy)),
    ]
    steps = [(name, fn) for name, fn in steps if not args.only or name in args.only]
    for name, fn in steps:  # one failing part is reported, the others still run
        t = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(f"[{name}] {time.perf_counter() - t:.1f} s", flush=True)
    result["hardware"] = hardware_info(actor="bf16 autocast (FSDP2)", encoder="torch fp16 (auto on CUDA)")
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    records.keep(args, "gpu", result)


def print_table(r: dict) -> None:
    print(f"\n{r['gpu']}, torch {r['torch']} (CUDA {r['cuda']}), policy weights: {r['policy_weights']}")
    enc = r.get("encoder", {})
    if enc and "error" not in enc:
        print(f"{'encoder':18} {'passages/s':>11} {'cos min':>9} {'cos mean':>9}")
        for k, v in enc.items():
            print(f"{k:18} {v['passages_s']:11.0f} {v.get('cos_min', 1.0):9.5f} {v.get('cos_mean', 1.0):9.5f}")
    f = r.get("faiss", {})
    if f and "error" not in f:
        print(f"faiss-cpu flat IP, {f['vectors']} x {f['dim']}: {f['qps_batch64']:.0f} q/s in batches of 64 "
              f"({f['threads']} threads; faiss GPUs: {f['gpus_seen_by_faiss']})")
    s = r.get("server", {})
    if s and "error" not in s:
        print("server (CUDA encoder, faiss-cpu flat): " + ", ".join(
            f"C={c[1:]} {v['qps']:.0f} q/s p50 {v['p50_ms']:.1f} ms p99 {v['p99_ms']:.1f} ms"
            for c, v in s.items() if c.startswith("C")))
    t = r.get("training", {})
    if t and "error" not in t:
        print(f"actor ({t['params'] / 1e6:.0f}M params, {t['sequences']} seqs, {t['tokens']} tokens, FSDP2={t['fsdp']}, "
              f"bf16): update {t['update_tok_s']:.0f} tok/s, bare fwd+bwd {t['bare_tok_s']:.0f} "
              f"(ratio {t['ratio_to_bare']:.2f}), log-probs {t['old_logprob_tok_s']:.0f}, SFT {t['sft_tok_s']:.0f}, "
              f"critic {t['critic_update_tok_s']:.0f} tok/s")
        print(f"peak GPU memory {t['peak_mem_gib']:.2f} GiB; mfu {t['mfu']:.3f} (probe {t['matmul_probe_tflops']:.0f} "
              f"TFLOP/s bf16); weight export: CPU tensors {t['export_cpu_s']:.3f} s, CUDA IPC {t['export_cuda_ipc_s']:.3f} s")
    print(f"NCCL, two ranks on one GPU: {r.get('nccl_two_ranks')}")
    for name in ("encoder", "faiss", "server", "training"):
        if isinstance(r.get(name), dict) and "error" in r[name]:
            print(f"{name}: FAILED {r[name]['error']}")


if __name__ == "__main__":
    main()
