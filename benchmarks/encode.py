"""Index-building encoder: batches sorted by characters (before) vs by tokens (now), side by side.

    python benchmarks/encode.py [--passages 1024] [--corpus C.jsonl] [--backend onnx --precision auto] [--json PATH]

The same Encoder encodes the same passages (wiki_35k's first N when ../shared/data is
present, else the generated knowledge base's) in batches of 256, twice:
- by characters: the passages sorted longest-first by character count, cut into batches of
  256, each batch encoded as one call (what `Encoder.encode_passages` did before);
- by tokens: one `encode_passages` call, which now sorts by token count.
It prints passages/s of each, the ratio, the padding of each batching (padded slots / real
tokens) on these passages and on a whole index shard (16,384 passages, `--shard`; tokenizer only), and
the largest difference between the two sets of vectors (batch shapes change the arithmetic
order only). Run it on quiet cores: nothing else may compute beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads

BATCH = 256
SHARD = 16384  # data_prep.indexing's default shard: the pool each index batch is sorted within
WIKI = ROOT.parent / "shared" / "data" / "corpus" / "wiki_35k.jsonl"


def batches(keys) -> list[list[int]]:
    """Indices sorted longest-first by `keys`, cut into batches of BATCH (what the index does)."""
    order = sorted(range(len(keys)), key=lambda i: -keys[i])
    return [order[s:s + BATCH] for s in range(0, len(order), BATCH)]


def padding(batches: list[list[int]], lengths: np.ndarray) -> float:
    """Padded slots / real tokens (1.0: no padding)."""
    return sum(len(b) * int(lengths[b].max()) for b in batches) / float(lengths.sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=1024, help="passages encoded by each batching (default 1024)")
    ap.add_argument("--corpus", help=f"corpus jsonl (default: {WIKI} when present, else the generated KB)")
    ap.add_argument("--backend", choices=("torch", "onnx"), default=None, help="encoder backend (default: the index default)")
    ap.add_argument("--precision", default=None, help="encoder precision (default: auto)")
    ap.add_argument("--shard", type=int, default=SHARD,
                    help=f"passages of the shard whose padding is computed, tokenizer only (default {SHARD:,}: the index's)")
    ap.add_argument("--json", help="write the results here")
    records.add_args(ap)
    args = ap.parse_args(argv)

    from data_prep.encoder import Encoder
    from data_prep.hardware import hardware_info, hardware_line
    from data_prep.store import PassageStore

    if args.corpus:
        corpus = Path(args.corpus)
    elif WIKI.is_file():
        corpus = WIKI
    else:  # the demo's corpus, generated here
        import tempfile

        from data_prep.synthetic import generate_kb

        tmp = Path(tempfile.mkdtemp(prefix="bench_encode_"))
        generate_kb(tmp / "kb", seed=0, n_entities=2000)
        corpus = tmp / "kb" / "corpus.jsonl"
    enc = Encoder("minilm", backend=args.backend, precision=args.precision)
    print(hardware_line(encoder=f"{enc.backend}/{enc.precision}"), flush=True)
    with PassageStore(corpus) as store:  # the strings the index build encodes, read once
        head = list(store.iter_contents(0, min(len(store), max(args.passages, args.shard))))
    texts, shard = head[:args.passages], head[:args.shard]
    lengths, shard_lengths = enc.tokenize.lengths(texts), enc.tokenize.lengths(shard)
    enc.encode_passages(texts[:BATCH // 4], progress=False)  # warm-up (ONNX session, allocator)

    t = time.perf_counter()
    by_chars = np.empty((len(texts), enc.dim), dtype=np.float32)
    for b in batches([len(x) for x in texts]):
        by_chars[b] = enc.encode_passages([texts[i] for i in b], batch_size=BATCH, progress=False)
    chars_s = time.perf_counter() - t
    t = time.perf_counter()
    by_tokens = enc.encode_passages(texts, batch_size=BATCH, progress=False)
    tokens_s = time.perf_counter() - t

    res = {
        "corpus": str(corpus), "passages": len(texts), "encoder": f"{enc.backend}/{enc.precision}",
        "mean_tokens": float(lengths.mean()),
        "psg_per_s_by_chars": len(texts) / chars_s, "psg_per_s_by_tokens": len(texts) / tokens_s,
        "speedup": chars_s / tokens_s,
        "padding_by_chars": padding(batches([len(x) for x in texts]), lengths),
        "padding_by_tokens": padding(batches(lengths), lengths),
        "shard_padding_by_chars": padding(batches([len(x) for x in shard]), shard_lengths),
        "shard_padding_by_tokens": padding(batches(shard_lengths), shard_lengths), "shard": len(shard),
        "max_abs_diff": float(np.abs(by_chars - by_tokens).max()),
    }
    print(f"\n{len(texts)} passages of {corpus.name} (mean {res['mean_tokens']:.0f} tokens), batches of {BATCH}")
    print(f"| batching | passages/s | padded / real tokens | on a {len(shard):,}-passage shard |")
    print("|---|---|---|---|")
    print(f"| by characters (before) | {res['psg_per_s_by_chars']:.1f} | {res['padding_by_chars']:.2f} | "
          f"{res['shard_padding_by_chars']:.2f} |")
    print(f"| by tokens (now) | {res['psg_per_s_by_tokens']:.1f} | {res['padding_by_tokens']:.2f} | "
          f"{res['shard_padding_by_tokens']:.2f} |")
    print(f"speed-up {res['speedup']:.2f}x; largest vector difference {res['max_abs_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": hardware_info(), **res}, indent=1) + "\n")
    records.keep(args, "encode", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
