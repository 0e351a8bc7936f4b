"""The encoder's precisions side by side: speed, batch independence and recall, in one run.

    python benchmarks/encoder_precision.py [--quick] [--precisions fp32,int8,bf16] [--duration S] [--json PATH]

For each precision the CPU encoder offers (fp32 and int8 on ONNX Runtime, bf16 on torch; fp16
needs CUDA), on HotpotQA distractor-300 (its 300 questions and their own 2,972 paragraphs, from
../shared/data; --quick: a small generated corpus):
- passages/s: a flat index built from the corpus with that precision (encoding time only);
- the real server on that index (cache off), 1-query requests from C=1 and C=64 closed-loop
  clients for --duration seconds each: p50 latency and queries/s;
- recall@3: a question counts when a gold answer string is in its top-3 passages; the change
  against fp32 (each precision searches its own index with its own query vectors);
- batch independence: 64 questions encoded alone and as one batch, the largest |difference|.
The precision `auto` picks on this host is marked. Run on quiet cores: nothing else beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads
from data_prep.hardware import passive_threads  # noqa: E402

passive_threads()

from benchmarks.retriever import drive, quick_corpus, read_qa, recall_at_3  # noqa: E402

DISTRACTOR = ROOT.parent / "shared" / "data" / "qa" / "hotpotqa_distractor300"
BACKEND = {"fp32": "onnx", "int8": "onnx", "bf16": "torch"}


def measure(precision: str, corpus: Path, qa: list[dict], work: Path, duration: float) -> dict:
    from data_prep.encoder import Encoder
    from data_prep.indexing import build_index, load_searcher
    from retriever_server.launch import start_server, stop_server, wait_healthy

    enc = Encoder(backend=BACKEND[precision], precision=precision)
    questions = [r["question"] for r in qa]
    index = work / f"flat-{precision}"
    meta = build_index(corpus, index, kind="flat", encoder=enc, progress=False)
    row = {"precision": precision, "backend": enc.backend, "passages": meta["num_passages"],
           "passages_per_s": meta["num_passages"] / meta["encode_seconds"]}
    sample = questions[:64]
    alone = np.concatenate([enc.encode_queries([q]) for q in sample])
    row["batch_max_abs_diff"] = float(np.abs(enc.encode_queries(sample, batch_size=len(sample)) - alone).max())
    searcher = load_searcher(index, corpus, encoder=enc)
    row["recall@3"] = recall_at_3(searcher, qa)
    searcher.store.close()
    del searcher, enc

    proc, url = start_server(index, corpus, extra_args=[
        "--cache-size", "0", "--log-level", "warning", "--encoder-backend", BACKEND[precision],
        "--encoder-precision", precision])
    try:
        wait_healthy(url, timeout=600, proc=proc)
        asyncio.run(drive(url, questions, 4, 1, 0.5))  # warm-up
        for c in (1, 64):
            r = asyncio.run(drive(url, questions, c, 1, duration))
            row[f"c{c}_p50_ms"], row[f"c{c}_qps"], row[f"c{c}_errors"] = r["p50_ms"], r["qps"], r["errors"]
    finally:
        stop_server(proc)
    print(f"  {precision}: {row['passages_per_s']:.1f} passages/s, C=1 p50 {row['c1_p50_ms']:.1f} ms, "
          f"C=64 {row['c64_qps']:.0f} q/s, recall@3 {100 * row['recall@3']:.1f}", flush=True)
    return row


def main(argv=None) -> int:
    from data_prep.hardware import hardware_info, hardware_line, native_bf16, resolve_encoder_precision

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small generated corpus and short runs (smoke test)")
    ap.add_argument("--precisions", default="fp32,int8,bf16", help="comma-separated, from fp32,int8,bf16")
    ap.add_argument("--duration", type=float, help="seconds per load level (default 8, quick 1)")
    ap.add_argument("--json", help="write the results here")
    records.add_args(ap)
    args = ap.parse_args(argv)
    precisions = [p for p in args.precisions.split(",") if p]
    if unknown := [p for p in precisions if p not in BACKEND]:
        ap.error(f"unknown precision(s) {unknown}; choose from {sorted(BACKEND)}")
    if "fp32" not in precisions:
        precisions.insert(0, "fp32")  # the reference for recall
    duration = args.duration or (1.0 if args.quick else 8.0)

    work = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    try:
        if args.quick or not (DISTRACTOR / "corpus.jsonl").is_file():
            corpus, qa = quick_corpus(work, n=200)
            qa, name = qa[:100], "generated (quick)"
        else:
            corpus, qa, name = DISTRACTOR / "corpus.jsonl", read_qa(DISTRACTOR / "dev.jsonl", 300), \
                "HotpotQA distractor-300"
        auto = resolve_encoder_precision("auto", "onnx")[0]
        hw = hardware_line(encoder_auto=auto)
        print(hw, flush=True)
        rows = [measure(p, corpus, qa, work, duration) for p in precisions]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = next(r for r in rows if r["precision"] == "fp32")["recall@3"]
    print(f"\n{hw}\nencoder all-MiniLM-L6-v2 on {name} ({rows[0]['passages']} passages, {len(qa)} questions); "
          f"server cache off, 1-query requests, {duration:.0f} s per level; auto = {auto}"
          f"{'' if native_bf16()[0] else ' (bf16 is emulated on this host)'}")
    print("| precision | passages/s | C=1 p50 ms | C=64 q/s | C=64 p50 ms | recall@3 | vs fp32 | alone vs batch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        r["recall@3_change"] = r["recall@3"] - ref
        mark = " (auto)" if r["precision"] == auto else ""
        print(f"| {r['backend']} {r['precision']}{mark} | {r['passages_per_s']:.1f} | {r['c1_p50_ms']:.1f} | "
              f"{r['c64_qps']:.0f} | {r['c64_p50_ms']:.1f} | {100 * r['recall@3']:.1f} | "
              f"{100 * r['recall@3_change']:+.1f} | {r['batch_max_abs_diff']:.0e} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": hardware_info(encoder_auto=auto), "hardware_line": hw,
                                               "dataset": name, "auto": auto, "duration_s": duration,
                                               "rows": rows}, indent=1) + "\n")
    records.keep(args, "encoder_precision", {"hardware_line": hw, "dataset": name, "auto": auto, "rows": rows})
    return 0 if all(r["c1_errors"] == 0 and r["c64_errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
